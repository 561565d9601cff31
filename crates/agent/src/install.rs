//! The CNI installer: puts `ambit-cni` into the node's CNI chain and keeps it there.
//!
//! # What a pass does
//! 1. Copies the plugin binary into every CNI bin dir (temp file, fsync, rename; mode 0755),
//!    after deleting leftover `<name>.tmp.*` files of an interrupted copy. An identical binary
//!    is left alone.
//! 2. Chained mode (the default): finds the primary config the way kubelet does (the
//!    lexicographically first `.conf`/`.conflist` in the conf dir that kubelet can load; broken
//!    files are skipped with a warning naming the file and the problem), or the file named by
//!    `conf_name` (or its `.conf`/`.conflist` sibling). Our entry goes last into its `plugins`,
//!    replacing any earlier entry of our type. With no primary config yet, the pass writes
//!    nothing and reports [`InstallOutcome::WaitingForPrimary`]: we never write a config that
//!    lacks the primary plugin, since that would leave new pods without a network.
//! 3. Standalone mode: writes our own `.conf` (`conf_name`, default `YYY-<plugin>.conf`).
//!
//! Writes are atomic (temp file, fsync, rename, fsync dir), keep the existing file's mode and
//! owner, and happen only when the content must change, so a second pass is a no-op. Output is
//! 2-space pretty JSON with sorted keys and a trailing newline. New files get 0600 (0640 with
//! `conf_mode_group_read`). A config that is a symlink is written through to its target.
//!
//! Like istio-cni (and kubelet's own CNI loader), only `.conf` and `.conflist` files count.
//! containerd and CRI-O also load `.json` files (as `.conf`); a `.json` file that sorts before
//! the primary config would win there without our entry. We leave that case alone rather than
//! rewrite a format istio-cni never touches; operators should not mix the two.
//!
//! # Turning a `.conf` into a `.conflist`
//! A `.conf` holds one plugin and cannot chain, so `X.conf` becomes `X.conflist` =
//! `{"cniVersion": <X's>, "name": <X's>, "plugins": [<X minus cniVersion>, <ours>]}` with X's
//! mode, then `X.conf` is removed. This is safe for kubelet and the runtime: libcni loads a
//! `.conf` as a one-plugin list with the conf's own name and cniVersion, so the network keeps its
//! name (the runtime's cached results, keyed by it, still serve DEL of existing pods) and the
//! primary plugin sees the same config. The new file is written before the old one is removed,
//! and `X.conf` sorts before `X.conflist`, so at every moment kubelet sees either the old config
//! or the new chain, never nothing. The `.conf` must go: it would otherwise keep winning.
//!
//! The list carries the top-level key `"ambit_converted_from_conf": true` (libcni and the
//! runtimes ignore unknown top-level keys). Unlike upstream, which leaves a converted `.conf`
//! as a `.conflist` forever, [`Installer::uninstall`] uses that key to give back `X.conf`, so
//! the primary CNI's own tooling finds its file again. If the owner has since added plugins to
//! the list, or `X.conf` exists again, only our entry is removed and the list stays.
//!
//! # Watching and repair
//! [`Installer::run`] makes a first pass, then polls every 200 ms: the listing of the conf dir
//! with each config's (inode, size, mtime, ctime, mode), and the same for each installed binary.
//! When anything changes it re-validates ([`Installer::validate`]) and repairs: our entry
//! removed, the file replaced, a binary deleted or changed, a new higher-priority config dropped
//! in by another CNI (our entry goes into the new first file; the old file keeps its entry,
//! which is harmless and removed on uninstall). Polling instead of inotify: the watched set is a
//! handful of small directories, a stat per file every 200 ms costs nothing, it needs no new
//! dependency, and it cannot miss events on overlay or bind-mounted host paths, or when a
//! watched file is replaced by rename (inotify watches would need re-arming).
//!
//! Repairs that follow each other within 5 s are a fight with another component (typically a
//! CNI that regenerates its config, e.g. Cilium without `cni.exclusive=false`): after 3 such
//! repairs each one waits 250 ms, doubling up to 1 s, and a warning names the file. The wait
//! stays short because while our entry is missing new pods start unmeshed.
//!
//! The entry can change while the agent runs ([`Installer::set_entry`]: the node's own pods it
//! learns); the loop then rewrites the config at once, without counting it as a repair.
//!
//! [`Installer::ready`] is true after a pass that validated, false from the moment a check
//! fails until the repair validated. [`Installer::repairs`] counts repairs for metrics. An
//! error in the first pass ends [`Installer::run`] (the caller exits, the DaemonSet restarts
//! it, as upstream does); later errors are logged and retried, since the agent is then serving
//! pods that do not depend on the installer.
//!
//! # Uninstall contract
//! [`Installer::uninstall`] is for a real uninstall only: it removes our entry from every
//! conflist in the conf dir, gives back converted `.conf` files, deletes our standalone conf
//! file and the binary in every bin dir. A restart for an upgrade must NOT call it: the plugin
//! must stay in the chain, so that new pods in the mesh fail sandbox creation (the plugin cannot
//! reach the agent and fails closed) until the new agent is up, instead of starting unmeshed.
//! The caller decides which case it is (spec §2.12) and stops [`Installer::run`] first.

mod conf;
mod fsio;
mod uninstall;
mod watch;

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::{Map, Value};

pub use conf::ConfError;
use conf::{Chained, ConfFile, Kind};
use fsio::Compared;

/// The source binary is refused above this size (the plugin is a few MiB).
const MAX_BINARY_BYTES: u64 = 256 << 20;
/// cniVersion of the standalone conf file when the entry names none (every runtime knows it).
const STANDALONE_CNI_VERSION: &str = "0.3.1";

/// What to install and where.
#[derive(Clone, Debug)]
pub struct InstallConfig {
    /// CNI bin dirs to copy the plugin into (created if missing).
    pub cni_bin_dirs: Vec<PathBuf>,
    /// The CNI conf dir kubelet reads (`/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// `CNI_CONF_NAME`: use this primary file (chained) or our file name (standalone).
    pub conf_name: Option<String>,
    /// Chain after the primary plugin (`true`) or write our own conf file.
    pub chained: bool,
    /// The plugin binary to copy.
    pub plugin_binary: PathBuf,
    /// Installed binary name and plugin `type` (`ambit-cni`).
    pub plugin_name: String,
    /// Our config entry; `type` is set to `plugin_name`, `name` defaults to it.
    pub plugin_entry: Map<String, Value>,
    /// New config files get mode 0640 instead of 0600.
    pub conf_mode_group_read: bool,
}

/// Installs the plugin and keeps it installed; cheap to clone (clones share state).
#[derive(Clone, Debug)]
pub struct Installer {
    inner: Arc<Inner>,
}

/// Result of one install pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstallOutcome {
    /// The chain (or standalone file) is in place in `config`; `changed` if this pass wrote.
    Installed {
        /// The config file kubelet will use.
        config: PathBuf,
        /// Whether this pass wrote a binary or a config file.
        changed: bool,
    },
    /// No primary config exists yet; binaries are installed, no config was written.
    WaitingForPrimary,
}

/// What [`Installer::validate`] found; valid when there are no problems.
#[derive(Debug, Default)]
pub struct Validation {
    problems: Vec<Problem>,
}

/// One way the installation differs from what it should be.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// No config kubelet can load exists yet.
    #[error("no usable CNI config in {0} yet; waiting for the primary CNI plugin to write one")]
    NoPrimaryConfig(PathBuf),
    /// The primary config does not contain our entry.
    #[error("{0} does not chain the plugin")]
    NotChained(PathBuf),
    /// Our entry differs from the desired one or appears more than once.
    #[error("{0} has an outdated or duplicated plugin entry")]
    StaleEntry(PathBuf),
    /// Our standalone file is missing or not what we would write.
    #[error("standalone CNI config {0} is missing or differs")]
    Standalone(PathBuf),
    /// A binary is missing from a bin dir.
    #[error("plugin binary {0} is missing")]
    BinaryMissing(PathBuf),
    /// A binary differs from the source.
    #[error("plugin binary {0} differs from the one this agent ships")]
    BinaryDiffers(PathBuf),
    /// Something could not be checked.
    #[error("{0}")]
    Failed(#[from] InstallError),
}

/// Why installing or uninstalling failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The installer configuration itself is wrong.
    #[error("invalid CNI installer configuration: {0}")]
    Config(String),
    /// The plugin binary shipped with the agent cannot be read.
    #[error("cannot read the CNI plugin binary {path}: {source}; is the agent image complete?")]
    Source {
        /// The source path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Copying or checking a binary in a bin dir failed.
    #[error("cannot install the CNI plugin as {path}: {source}{hint}", hint = hint(source))]
    Binary {
        /// The target path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The conf dir cannot be listed.
    #[error("cannot list the CNI conf dir {path}: {source}")]
    ConfDir {
        /// The dir.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The configured primary file (`conf_name`) cannot be used.
    #[error("CNI config {path} cannot be used: {source}; fix the file or the configured CNI conf name")]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ConfError,
    },
    /// Writing or removing a config file failed.
    #[error("cannot write CNI config {path}: {source}{hint}", hint = hint(source))]
    WriteConfig {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Converting `X.conf` would overwrite an `X.conflist` that is not ours.
    #[error(
        "cannot turn {conf} into a .conflist: {conflist} already exists and was not written by \
         the installer; remove one of the two files"
    )]
    ConflistExists {
        /// The `.conf` to convert.
        conf: PathBuf,
        /// The existing list.
        conflist: PathBuf,
    },
}

#[derive(Debug)]
struct Inner {
    cfg: InstallConfig,
    entries: RwLock<Entries>,
    /// Bumped by every [`Installer::set_entry`] that changed the entry.
    generation: AtomicU64,
    ready: AtomicBool,
    repairs: AtomicU64,
    /// The config that preempts the configured `conf_name`, last warned about.
    preempted: Mutex<Option<PathBuf>>,
}

/// What we write, derived from the configured entry.
#[derive(Clone, Debug)]
struct Entries {
    /// Our entry as it goes into a list (no `cniVersion`: the list's applies).
    entry: Map<String, Value>,
    /// Our standalone conf file's content.
    standalone: Map<String, Value>,
}

impl Installer {
    /// Checks the configuration and builds the installer.
    pub fn new(cfg: InstallConfig) -> Result<Self, InstallError> {
        if !plain_name(&cfg.plugin_name) {
            return Err(InstallError::Config(format!(
                "plugin name {:?} must be a plain file name",
                cfg.plugin_name
            )));
        }
        if cfg.cni_bin_dirs.is_empty() {
            return Err(InstallError::Config("no CNI bin dir given".into()));
        }
        if let Some(name) = &cfg.conf_name
            && (!plain_name(name) || Kind::of(name).is_none())
        {
            return Err(InstallError::Config(format!(
                "CNI conf name {name:?} must be a file name ending in .conf or .conflist"
            )));
        }
        if !cfg.chained && cfg.conf_name.as_deref().is_some_and(|n| Kind::of(n) != Some(Kind::Conf)) {
            return Err(InstallError::Config(
                "the standalone CNI conf name must end in .conf (it holds a single plugin)".into(),
            ));
        }
        let entries = Entries::of(&cfg.plugin_entry, &cfg.plugin_name)?;
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                entries: RwLock::new(entries),
                generation: AtomicU64::new(0),
                ready: AtomicBool::new(false),
                repairs: AtomicU64::new(0),
                preempted: Mutex::new(None),
            }),
        })
    }

    /// Replaces our entry (same rules as `plugin_entry`); [`Installer::run`] writes it at once.
    /// Returns whether it changed.
    pub fn set_entry(&self, entry: &Map<String, Value>) -> Result<bool, InstallError> {
        let new = Entries::of(entry, &self.inner.cfg.plugin_name)?;
        let mut entries = self.inner.entries.write().unwrap_or_else(|p| p.into_inner());
        if entries.entry == new.entry && entries.standalone == new.standalone {
            return Ok(false);
        }
        *entries = new;
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Our entry as the config kubelet uses holds it now (chained mode), if it is there once.
    pub fn installed_entry(&self) -> Option<Map<String, Value>> {
        let ours = &self.inner.cfg.plugin_name;
        if !self.inner.cfg.chained {
            return conf::load(&self.standalone_path(), Kind::Conf).ok().map(|f| f.doc);
        }
        let file = self.primary().ok()??;
        let plugins = file.doc.get("plugins")?.as_array()?;
        let mut mine = plugins
            .iter()
            .filter_map(Value::as_object)
            .filter(|p| p.get("type") == Some(&Value::String(ours.clone())));
        let entry = mine.next()?.clone();
        mine.next().is_none().then_some(entry)
    }

    fn entries(&self) -> Entries {
        self.inner.entries.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the last check found everything installed.
    pub fn ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// How many times the watch loop repaired an external change.
    pub fn repairs(&self) -> u64 {
        self.inner.repairs.load(Ordering::Relaxed)
    }

    /// One install pass: binaries, then the config (see the module docs).
    pub fn install(&self) -> Result<InstallOutcome, InstallError> {
        let cfg = &self.inner.cfg;
        let source = self.source()?;
        let entries = self.entries();
        let mut changed = self.install_binaries(&source)?;
        if !cfg.chained {
            let path = self.standalone_path();
            let bytes = render(&path, &entries.standalone)?;
            fs::create_dir_all(&cfg.conf_dir)
                .map_err(|source| InstallError::WriteConfig { path: cfg.conf_dir.clone(), source })?;
            // Size first: never open (and block on) a FIFO someone left in our place.
            let same = fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
                && fs::read(&path).ok().as_deref() == Some(&bytes[..]);
            if !same {
                self.write_conf(&path, &bytes, &path)?;
                changed = true;
            }
            return Ok(InstallOutcome::Installed { config: path, changed });
        }
        let Some(primary) = self.primary()? else {
            return Ok(InstallOutcome::WaitingForPrimary);
        };
        let ours = &cfg.plugin_name;
        if primary.chained(ours, &entries.entry) == Chained::Yes {
            return Ok(InstallOutcome::Installed { config: primary.path, changed });
        }
        let stem = stem(&primary.path);
        let doc = conf::chain(&primary, ours, &entries.entry, &stem);
        let target = match primary.kind {
            Kind::ConfList => primary.path.clone(),
            Kind::Conf => primary.path.with_file_name(format!("{stem}.conflist")),
        };
        let bytes = render(&target, &doc)?;
        if primary.kind == Kind::Conf {
            if target.exists() && !converted_by_us(&target) {
                return Err(InstallError::ConflistExists { conf: primary.path, conflist: target });
            }
            self.write_conf(&target, &bytes, &primary.path)?;
            fsio::remove(&primary.path)
                .map_err(|source| InstallError::WriteConfig { path: primary.path.clone(), source })?;
            tracing::info!(conf = %primary.path.display(), conflist = %target.display(),
                "turned the primary CNI config into a list to chain the plugin");
        } else {
            self.write_conf(&target, &bytes, &primary.path)?;
            tracing::info!(config = %target.display(), "chained the plugin into the primary CNI config");
        }
        Ok(InstallOutcome::Installed { config: target, changed: true })
    }

    /// Checks the installation: the config kubelet uses chains our current entry (or our
    /// standalone file is in place) and every bin dir holds the same bytes as the source.
    pub fn validate(&self) -> Validation {
        let cfg = &self.inner.cfg;
        let entries = self.entries();
        let mut problems = Vec::new();
        if cfg.chained {
            match self.primary() {
                Ok(None) => problems.push(Problem::NoPrimaryConfig(cfg.conf_dir.clone())),
                Ok(Some(f)) => match f.chained(&cfg.plugin_name, &entries.entry) {
                    Chained::Yes => {}
                    Chained::Missing => problems.push(Problem::NotChained(f.path)),
                    Chained::Stale => problems.push(Problem::StaleEntry(f.path)),
                },
                Err(e) => problems.push(e.into()),
            }
        } else {
            let path = self.standalone_path();
            match conf::load(&path, Kind::Conf) {
                Ok(f) if f.doc == entries.standalone => {}
                _ => problems.push(Problem::Standalone(path)),
            }
        }
        match self.source() {
            Ok(source) => {
                for dir in &cfg.cni_bin_dirs {
                    let path = dir.join(&cfg.plugin_name);
                    match fsio::compare(&path, &source) {
                        Ok(Compared::Same) => {}
                        Ok(Compared::Missing) => problems.push(Problem::BinaryMissing(path)),
                        Ok(Compared::Differs) => problems.push(Problem::BinaryDiffers(path)),
                        Err(source) => problems.push(InstallError::Binary { path, source }.into()),
                    }
                }
            }
            Err(e) => problems.push(e.into()),
        }
        Validation { problems }
    }

    /// The config kubelet uses (chained mode), or `None` while there is none.
    fn primary(&self) -> Result<Option<ConfFile>, InstallError> {
        let cfg = &self.inner.cfg;
        let ours = &cfg.plugin_name;
        let scan = || {
            conf::scan(&cfg.conf_dir)
                .map_err(|source| InstallError::ConfDir { path: cfg.conf_dir.clone(), source })
        };
        let first = |found: Vec<conf::Found>| {
            found.into_iter().find_map(|f| match f.parsed {
                Err(e) => {
                    tracing::warn!(path = %f.path.display(), error = %e,
                        "skipping a CNI config file kubelet cannot load");
                    None
                }
                Ok(file) if file.only(ours) => {
                    tracing::warn!(path = %file.path.display(),
                        "skipping a CNI config that holds only our plugin; it is no primary config");
                    None
                }
                Ok(file) => Some(file),
            })
        };
        let Some(name) = &cfg.conf_name else {
            return Ok(first(scan()?));
        };
        let named = cfg.conf_dir.join(name);
        let sibling = match Kind::of(name) {
            Some(Kind::Conf) => cfg.conf_dir.join(format!("{name}list")),
            _ => cfg.conf_dir.join(name.strip_suffix("list").unwrap_or(name)),
        };
        let Some(path) = [named, sibling].into_iter().find(|p| p.exists()) else {
            return Ok(None);
        };
        let kind = Kind::of(&path.to_string_lossy()).unwrap_or(Kind::Conf);
        let file = conf::load(&path, kind)
            .map_err(|source| InstallError::BadConfig { path: path.clone(), source })?;
        // Kubelet uses the first file, not ours: say so once per preempting file.
        let preempting = first(scan()?).map(|f| f.path).filter(|p| *p != path);
        let mut warned = self.inner.preempted.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = &preempting
            && warned.as_ref() != Some(p)
        {
            tracing::warn!(configured = %path.display(), used = %p.display(),
                "kubelet uses another CNI config than the configured one; the plugin is not in its chain");
        }
        *warned = preempting;
        Ok(Some(file))
    }

    fn standalone_path(&self) -> PathBuf {
        let cfg = &self.inner.cfg;
        let name = cfg.conf_name.clone().unwrap_or_else(|| format!("YYY-{}.conf", cfg.plugin_name));
        cfg.conf_dir.join(name)
    }

    fn source(&self) -> Result<Vec<u8>, InstallError> {
        let path = &self.inner.cfg.plugin_binary;
        let err = |source| InstallError::Source { path: path.clone(), source };
        let len = fs::metadata(path).map_err(err)?.len();
        if len > MAX_BINARY_BYTES {
            return Err(err(io::Error::other(format!("larger than {MAX_BINARY_BYTES} bytes"))));
        }
        fs::read(path).map_err(err)
    }

    /// Copies the binary where it is missing or differs; true if any copy was made.
    fn install_binaries(&self, source: &[u8]) -> Result<bool, InstallError> {
        let name = &self.inner.cfg.plugin_name;
        let mut changed = false;
        for dir in &self.inner.cfg.cni_bin_dirs {
            let path = dir.join(name);
            let err = |source| InstallError::Binary { path: path.clone(), source };
            fs::create_dir_all(dir).map_err(err)?;
            fsio::remove_stale(dir, &binary_tmp_prefix(name)).map_err(err)?;
            if fsio::compare(&path, source).map_err(err)? == Compared::Same {
                continue;
            }
            fsio::write_atomic(&path, source, 0o755, None, &binary_tmp_prefix(name)).map_err(err)?;
            tracing::info!(path = %path.display(), "installed the CNI plugin binary");
            changed = true;
        }
        Ok(changed)
    }

    /// Atomically writes a config file with the mode and owner of `like` (or the new-file mode).
    fn write_conf(&self, path: &Path, bytes: &[u8], like: &Path) -> Result<(), InstallError> {
        let err = |source| InstallError::WriteConfig { path: path.to_owned(), source };
        // Write through a symlink to its target, so the link its owner set up survives.
        let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        let real = if is_link { fs::canonicalize(path).map_err(err)? } else { path.to_owned() };
        let (mode, owner) = match fs::metadata(like) {
            Ok(m) => (m.mode() & 0o7777, Some((m.uid(), m.gid()))),
            Err(_) if self.inner.cfg.conf_mode_group_read => (0o640, None),
            Err(_) => (0o600, None),
        };
        let prefix = conf_tmp_prefix(&real);
        if let Some(dir) = real.parent() {
            fsio::remove_stale(dir, &prefix).map_err(err)?;
        }
        fsio::write_atomic(&real, bytes, mode, owner, &prefix).map_err(err)
    }
}

impl Entries {
    fn of(configured: &Map<String, Value>, plugin_name: &str) -> Result<Entries, InstallError> {
        let mut entry = configured.clone();
        match entry.get("type") {
            None => {}
            Some(Value::String(t)) if t == plugin_name => {}
            Some(other) => {
                return Err(InstallError::Config(format!(
                    "plugin entry type {other} differs from the plugin name {plugin_name:?}"
                )));
            }
        }
        entry.insert("type".into(), Value::String(plugin_name.to_owned()));
        entry.entry("name").or_insert_with(|| Value::String(plugin_name.to_owned()));
        let version =
            entry.remove("cniVersion").unwrap_or_else(|| Value::String(STANDALONE_CNI_VERSION.into()));
        let mut standalone = entry.clone();
        standalone.insert("cniVersion".into(), version);
        Ok(Entries { entry, standalone })
    }
}

impl Validation {
    /// True when nothing needs repair.
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// What needs repair.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }
}

impl std::fmt::Display for Validation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.problems.is_empty() {
            return f.write_str("CNI plugin installed");
        }
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

fn render(path: &Path, doc: &Map<String, Value>) -> Result<Vec<u8>, InstallError> {
    conf::render(doc)
        .map_err(|e| InstallError::WriteConfig { path: path.to_owned(), source: io::Error::other(e) })
}

fn converted_by_us(path: &Path) -> bool {
    conf::load(path, Kind::ConfList)
        .is_ok_and(|f| f.doc.get(conf::CONVERTED_MARKER) == Some(&Value::Bool(true)))
}

/// The file name without `.conf`/`.conflist`.
fn stem(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = name.strip_suffix(".conflist").or_else(|| name.strip_suffix(".conf")).unwrap_or(&name);
    stem.to_owned()
}

fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

fn binary_tmp_prefix(name: &str) -> String {
    format!("{name}.tmp.")
}

/// Hidden, and not ending in `.conf`/`.conflist`, so kubelet never loads a half-written file.
fn conf_tmp_prefix(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!(".{name}.ambit-tmp.")
}

/// An operator hint for common write failures.
fn hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::ReadOnlyFilesystem => {
            "; the host path is mounted read-only: mount the CNI dirs read-write into the agent"
        }
        io::ErrorKind::PermissionDenied => "; the agent needs root (or write access) on the CNI dirs",
        _ => "",
    }
}

#[cfg(test)]
mod tests;
