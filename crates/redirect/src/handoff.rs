//! `net.ipv4.tcp_migrate_req=1` in the pod netns, applied, verified and removed with the capture
//! rules by both backends.
//!
//! A node proxy upgrade binds the new proxy's listeners beside the old ones (`SO_REUSEPORT`);
//! the old proxy then closes its own. With the kernel default (0), connections that completed
//! the handshake but were not accepted yet, and handshakes in progress, sit in the closing
//! listener's queue and are reset. With 1 the kernel moves them to another listener of the same
//! group: the new proxy's. The setting is per network namespace (Linux ≥ 5.14), and only the
//! pod's listeners (15001, 15006, 15008 inside the pod netns) are replaced in an upgrade, so
//! it belongs with the pod's capture: set where the rules are set, on the same thread inside the
//! pod netns, checked where they are checked. `/proc/sys/net` shows the namespace of the thread
//! that opens it.
//!
//! A kernel without the sysctl (older than 5.14) does not fail the capture: the pod is still
//! captured and served, only an upgrade may reset queued connections. Nor does a read-only
//! `/proc/sys`, which is what container runtimes give an unprivileged container (Ambit's chart
//! and Istio's `cni` chart both run the agent unprivileged): the sysctl is then left as it is
//! and not checked. [`tcp_migrate_req_supported`] lets the agent say which case it is in, once
//! at start.

use std::io::{self, Read, Write};
use std::path::Path;

use crate::RedirectError;

/// The sysctl as `sysctl(8)` names it.
pub const TCP_MIGRATE_REQ: &str = "net.ipv4.tcp_migrate_req";

/// Its file in the current thread's network namespace.
const PATH: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Whether the sysctl can be set here: the kernel has it (Linux ≥ 5.14; the same in every
/// network namespace) and this process's `/proc/sys` is writable (a property of its mounts).
pub fn tcp_migrate_req_supported() -> bool {
    Path::new(PATH).exists() && !read_only()
}

/// Whether `/proc/sys` is mounted read-only for this process, found once by opening the file for
/// writing (which writes nothing).
fn read_only() -> bool {
    static READ_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READ_ONLY
        .get_or_init(|| std::fs::OpenOptions::new().write(true).open(PATH).is_err_and(|e| is_read_only(&e)))
}

fn is_read_only(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ReadOnlyFilesystem
}

/// Sets the sysctl to 1 in the current thread's netns (nothing to do on a kernel without it).
pub(crate) fn apply() -> Result<(), RedirectError> {
    write_at(Path::new(PATH), "1")
}

/// The difference from what the capture needs, if any, in the current thread's netns (none
/// where the sysctl cannot be set).
pub(crate) fn verify() -> Result<Option<String>, RedirectError> {
    if read_only() {
        return Ok(None);
    }
    verify_at(Path::new(PATH))
}

/// Restores the kernel default (0), leaving the pod's namespace as the capture found it.
pub(crate) fn remove() -> Result<(), RedirectError> {
    write_at(Path::new(PATH), "0")
}

fn write_at(path: &Path, value: &'static str) -> Result<(), RedirectError> {
    // No O_CREAT: a kernel without the sysctl has no such file, and that is not an error.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| file.write_all(value.as_bytes()));
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        // A read-only /proc/sys (an unprivileged container): left as it is, see the module doc.
        Err(e) if is_read_only(&e) => Ok(()),
        Err(source) => Err(RedirectError::Sysctl {
            name: TCP_MIGRATE_REQ,
            value,
            path: path.display().to_string().into_boxed_str(),
            source,
        }),
    }
}

fn verify_at(path: &Path) -> Result<Option<String>, RedirectError> {
    let mut text = String::new();
    let read = std::fs::File::open(path).and_then(|mut file| file.read_to_string(&mut text));
    match read {
        Ok(_) if text.trim() == "1" => Ok(None),
        Ok(_) => Ok(Some(format!(
            "sysctl {TCP_MIGRATE_REQ} is {}, want 1 (a node proxy upgrade would reset queued connections)",
            text.trim()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RedirectError::Io { path: path.display().to_string(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_checks_and_restores_the_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tcp_migrate_req");
        std::fs::write(&path, "0\n").expect("write");
        let drift = verify_at(&path).expect("verify").expect("0 is drift");
        assert_eq!(
            drift,
            "sysctl net.ipv4.tcp_migrate_req is 0, want 1 (a node proxy upgrade would reset queued connections)"
        );
        write_at(&path, "1").expect("apply");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "1");
        assert_eq!(verify_at(&path).expect("verify"), None);
        write_at(&path, "0").expect("remove");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "0");
    }

    /// A kernel older than 5.14 has no such file: capture goes on, nothing is created.
    #[test]
    fn a_kernel_without_the_sysctl_does_not_fail_capture() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tcp_migrate_req");
        write_at(&path, "1").expect("apply on an old kernel");
        assert_eq!(verify_at(&path).expect("verify on an old kernel"), None);
        write_at(&path, "0").expect("remove on an old kernel");
        assert!(!path.exists(), "the sysctl file must not be created");
    }

    /// A read-only /proc/sys (an unprivileged container) is recognised as such and skipped.
    #[test]
    fn a_read_only_proc_sys_is_recognised() {
        assert!(is_read_only(&io::Error::from_raw_os_error(30)), "EROFS");
        assert!(!is_read_only(&io::Error::from_raw_os_error(13)), "EACCES is an error, not read-only");
        assert!(!is_read_only(&io::Error::from(io::ErrorKind::NotFound)));
    }

    /// Any other failure is an error that names the sysctl, the value and the file.
    #[test]
    fn other_write_failures_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A directory cannot be opened for writing: EISDIR.
        let err = write_at(dir.path(), "1").expect_err("writing a directory fails");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "cannot set {TCP_MIGRATE_REQ}=1 in the pod network namespace ({})",
                dir.path().display()
            )),
            "{text}"
        );
        assert!(text.contains("writable /proc/sys"), "{text}");
    }
}
