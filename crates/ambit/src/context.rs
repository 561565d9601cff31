//! Which local cluster `ambit status|apply|delete|down|restart|stop|start` act on.
//!
//! As kubectl keeps a current context, `ambit up` remembers the cluster it brings up: its run
//! directory and tag, in one small file (`/run/ambit-up.context`, root's own, mode 0600;
//! `AMBIT_UP_CONTEXT` names another). The other commands use it when they are given neither
//! `--run-dir` nor `--tag`; a flag (or its environment variable) always wins. `ambit down` of
//! that cluster forgets it. Every command line a hint shows names the cluster the same way the
//! user must type it: with `--run-dir` and `--tag` whenever they are not the defaults.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ambit_cluster::state::{ClusterState, StateError};
use serde::{Deserialize, Serialize};

/// Where the last cluster brought up is remembered, unless `AMBIT_UP_CONTEXT` says otherwise.
pub const CONTEXT_FILE: &str = "/run/ambit-up.context";
/// Where a cluster's files are by default.
pub const RUN_DIR: &str = "/run/ambit-up";
/// The namespaces' prefix by default (`ambit-node1`, `ambit-control`, …).
pub const TAG: &str = "ambit";
/// Largest context file read.
const MAX_CONTEXT: u64 = 64 * 1024;

/// The context file's path.
pub fn context_path() -> PathBuf {
    match std::env::var_os("AMBIT_UP_CONTEXT") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(CONTEXT_FILE),
    }
}

/// The cluster a context names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remembered {
    /// Its run directory (absolute).
    pub run_dir: PathBuf,
    /// Its tag.
    pub tag: String,
}

/// Remembers `r` as the current cluster: written to a temporary file created 0600, then renamed.
pub fn remember(r: &Remembered) -> Result<(), String> {
    let path = context_path();
    let tmp = path.with_extension("context.tmp");
    let fail = |e: std::io::Error| format!("cannot remember the cluster in {}: {e}", path.display());
    let _ = std::fs::remove_file(&tmp);
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(fail)?;
    let mut text = serde_json::to_string_pretty(r).unwrap_or_default();
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(fail)?;
    std::fs::rename(&tmp, &path).map_err(fail)
}

/// The remembered cluster, if any. A file this user does not own, that others may write, or
/// that does not parse is an error (it is not trusted to name what `ambit down` removes); one
/// this user may not read is no context.
pub fn recall() -> Result<Option<Remembered>, String> {
    use std::io::Read;
    let path = context_path();
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => {
            return Ok(None);
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let meta = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not trusted (owner uid {}, mode {:o}; want uid {me} and no write access for others): remove it, or name the cluster with --run-dir and --tag",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    file.take(MAX_CONTEXT).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map(Some).map_err(|e| {
        format!(
            "{} is not a context this ambit understands ({e}): remove it, or name the cluster with --run-dir and --tag",
            path.display()
        )
    })
}

/// Forgets the remembered cluster if it is the one of `run_dir`.
pub fn forget(run_dir: &Path) {
    if let Ok(Some(r)) = recall()
        && r.run_dir == run_dir
    {
        let _ = std::fs::remove_file(context_path());
    }
}

/// The cluster a command acts on, and how it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The run directory (absolute).
    pub run_dir: PathBuf,
    /// The tag.
    pub tag: String,
    /// Found through the context (neither flag given).
    pub remembered: bool,
}

impl Target {
    /// `--run-dir D --tag T`, each only when it is not the default, with a leading space; empty
    /// for the default cluster.
    pub fn flags(&self) -> String {
        let mut out = String::new();
        if self.run_dir != Path::new(RUN_DIR) {
            out += &format!(" --run-dir {}", shell_word(&self.run_dir.display().to_string()));
        }
        if self.tag != TAG {
            out += &format!(" --tag {}", shell_word(&self.tag));
        }
        out
    }

    /// `ambit <sub>` for this cluster, as the user must type it.
    pub fn command(&self, sub: &str) -> String {
        format!("ambit {sub}{}", self.flags())
    }

    /// The cluster's record; when the context named a cluster that is no longer there, an error
    /// that says so plainly.
    pub fn load(&self) -> Result<ClusterState, String> {
        match ClusterState::load(&self.run_dir) {
            Ok(s) => Ok(s),
            Err(StateError::Missing(_)) if self.remembered => Err(format!(
                "the last cluster brought up (run dir {}, tag {}) is gone: {} holds no cluster; `ambit up` starts one",
                self.run_dir.display(),
                self.tag,
                self.run_dir.display()
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// `s` as one shell word: as it is when it needs no quoting, else in single quotes.
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b));
    if plain { s.to_owned() } else { format!("'{}'", s.replace('\'', r"'\''")) }
}

/// `p` made absolute against the current directory (not resolved through symlinks).
pub fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_owned())
}

/// Resolves the cluster of a command given `run_dir` and `tag` flags (either may be absent):
/// - both absent: the remembered cluster, else the defaults;
/// - a run directory: its record's tag, unless `--tag` is given (else the remembered tag if the
///   context names that directory, else the default);
/// - only a tag: the remembered run directory if the context names that tag, else the default.
pub fn resolve(run_dir: Option<&Path>, tag: Option<&str>) -> Result<Target, String> {
    let run_dir = run_dir.filter(|p| !p.as_os_str().is_empty()).map(absolute);
    let tag = tag.filter(|t| !t.is_empty()).map(str::to_owned);
    let remembered = if run_dir.is_some() && tag.is_some() { None } else { recall()? };
    Ok(match (run_dir, tag) {
        (Some(run_dir), Some(tag)) => Target { run_dir, tag, remembered: false },
        (Some(run_dir), None) => {
            let tag = match ClusterState::load(&run_dir) {
                Ok(s) => s.network.tag,
                Err(_) => match remembered {
                    Some(r) if r.run_dir == run_dir => r.tag,
                    _ => TAG.to_owned(),
                },
            };
            Target { run_dir, tag, remembered: false }
        }
        (None, Some(tag)) => {
            let run_dir = match remembered {
                Some(r) if r.tag == tag => r.run_dir,
                _ => PathBuf::from(RUN_DIR),
            };
            Target { run_dir, tag, remembered: false }
        }
        (None, None) => match remembered {
            Some(r) => Target { run_dir: r.run_dir, tag: r.tag, remembered: true },
            None => Target { run_dir: PathBuf::from(RUN_DIR), tag: TAG.to_owned(), remembered: false },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_cluster_only_when_it_is_not_the_default() {
        let t = |d: &str, tag: &str| Target { run_dir: d.into(), tag: tag.into(), remembered: false };
        assert_eq!(t(RUN_DIR, TAG).command("status"), "ambit status");
        assert_eq!(t("/tmp/c1", TAG).command("down"), "ambit down --run-dir /tmp/c1");
        assert_eq!(t(RUN_DIR, "lab").command("down"), "ambit down --tag lab");
        assert_eq!(
            t("/tmp/my cluster", "lab").command("apply -f FILE"),
            "ambit apply -f FILE --run-dir '/tmp/my cluster' --tag lab"
        );
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_context_is_written_0600_and_read_back() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("ctx");
        // SAFETY of the test: no other test of this binary reads AMBIT_UP_CONTEXT.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("AMBIT_UP_CONTEXT", &path);
        }
        assert_eq!(recall(), Ok(None));
        let r = Remembered { run_dir: "/tmp/c1".into(), tag: "lab".into() };
        remember(&r).expect("remember");
        assert_eq!(std::fs::metadata(&path).expect("meta").mode() & 0o777, 0o600);
        assert_eq!(recall(), Ok(Some(r.clone())));
        let found = resolve(None, None).expect("resolve");
        assert_eq!(found, Target { run_dir: "/tmp/c1".into(), tag: "lab".into(), remembered: true });
        let by_tag = resolve(None, Some("lab")).expect("resolve");
        assert_eq!(by_tag.run_dir, Path::new("/tmp/c1"), "the tag's remembered run dir");
        let other = resolve(None, Some("other")).expect("resolve");
        assert_eq!(other.run_dir, Path::new(RUN_DIR), "another tag: the default run dir");
        let flags = resolve(Some(Path::new("/tmp/c2")), Some("x")).expect("resolve");
        assert_eq!(flags, Target { run_dir: "/tmp/c2".into(), tag: "x".into(), remembered: false });
        assert_eq!(
            found.load().expect_err("gone"),
            "the last cluster brought up (run dir /tmp/c1, tag lab) is gone: /tmp/c1 holds no cluster; `ambit up` starts one"
        );
        forget(Path::new("/tmp/other"));
        assert!(path.exists(), "another cluster's down keeps the context");
        forget(Path::new("/tmp/c1"));
        assert!(!path.exists());
        std::fs::write(&path, "{}").expect("write");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).expect("chmod");
        let e = recall().expect_err("world-writable");
        assert!(e.contains("is not trusted") && e.contains("mode 666"), "{e}");
    }
}
