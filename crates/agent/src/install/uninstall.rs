//! Uninstall: takes our entry out of every conflist, gives back converted `.conf` files, and
//! deletes our standalone file and binaries (contract in the parent module docs).

use std::path::Path;

use super::conf::{self, ConfFile, Kind, Unchained};
use super::{InstallError, Installer, binary_tmp_prefix, fsio, render, stem};

impl Installer {
    /// Removes everything installed (real uninstall only; see the module docs).
    ///
    /// Every step is attempted; the first error is returned after all ran.
    pub fn uninstall(&self) -> Result<(), InstallError> {
        let cfg = &self.inner.cfg;
        let ours = cfg.plugin_name.as_str();
        let mut result = Ok(());
        let mut note = |r: Result<(), InstallError>| {
            if let Err(e) = r {
                tracing::warn!(error = %e, "CNI uninstall step failed");
                if result.is_ok() {
                    result = Err(e);
                }
            }
        };
        match conf::scan(&cfg.conf_dir) {
            Ok(found) => {
                for f in found {
                    match f.parsed {
                        Ok(file) => note(self.uninstall_conf(&file, ours)),
                        Err(e) => tracing::warn!(path = %f.path.display(), error = %e,
                            "skipping a CNI config file that cannot be loaded"),
                    }
                }
            }
            Err(source) => note(Err(InstallError::ConfDir { path: cfg.conf_dir.clone(), source })),
        }
        for dir in &cfg.cni_bin_dirs {
            let path = dir.join(ours);
            let removed =
                fsio::remove(&path).and_then(|()| fsio::remove_stale(dir, &binary_tmp_prefix(ours)));
            note(removed.map_err(|source| InstallError::Binary { path, source }));
        }
        result
    }

    fn uninstall_conf(&self, file: &ConfFile, ours: &str) -> Result<(), InstallError> {
        let write_err = |path: &Path| {
            let path = path.to_owned();
            move |source| InstallError::WriteConfig { path, source }
        };
        if file.kind == Kind::Conf {
            if file.types() == [ours] {
                fsio::remove(&file.path).map_err(write_err(&file.path))?;
                tracing::info!(path = %file.path.display(), "removed the standalone CNI config");
            }
            return Ok(());
        }
        let conf_path = file.path.with_file_name(format!("{}.conf", stem(&file.path)));
        let restore = !conf_path.exists();
        match conf::unchain(&file.doc, ours, restore) {
            Unchained::Untouched => {}
            Unchained::Empty => {
                fsio::remove(&file.path).map_err(write_err(&file.path))?;
                tracing::info!(path = %file.path.display(), "removed a CNI config holding only the plugin");
            }
            Unchained::Conf(doc) => {
                let bytes = render(&conf_path, &doc)?;
                self.write_conf(&conf_path, &bytes, &file.path)?;
                fsio::remove(&file.path).map_err(write_err(&file.path))?;
                tracing::info!(conf = %conf_path.display(), "gave back the primary CNI config's .conf form");
            }
            Unchained::List(doc) => {
                let bytes = render(&file.path, &doc)?;
                self.write_conf(&file.path, &bytes, &file.path)?;
                tracing::info!(path = %file.path.display(), "removed the plugin from the CNI config");
            }
        }
        Ok(())
    }
}
