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
//! Container runtimes give an unprivileged container a read-only `/proc/sys` (Ambit's chart and
//! Istio's `cni` chart both run the agent unprivileged, with CAP_SYS_ADMIN for setns). There the
//! thread that writes the sysctl first mounts a procfs of its own over `/proc`, in a mount
//! namespace only it has: the thread is the fresh one [`crate::in_netns`] runs the capture on,
//! and it ends with the capture, so nothing else sees that mount. Found by running the chart's
//! agent in a container (tests/up_containers.rs), where the sysctl was silently left unset.
//!
//! A kernel without the sysctl (older than 5.14) does not fail the capture: the pod is still
//! captured and served, only an upgrade may reset queued connections. Nor does a read-only
//! `/proc/sys` where no procfs can be mounted (no CAP_SYS_ADMIN): the sysctl is then left as it
//! is and not checked. [`tcp_migrate_req_supported`] lets the agent say which case it is in, once
//! at start.

use std::io::{self, Read, Write};
use std::path::Path;

use crate::RedirectError;

/// The sysctl as `sysctl(8)` names it.
pub const TCP_MIGRATE_REQ: &str = "net.ipv4.tcp_migrate_req";

/// Its file in the current thread's network namespace.
const PATH: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Whether the sysctl can be set here: the kernel has it (Linux ≥ 5.14; the same in every
/// network namespace) and this process can write it, through its `/proc/sys` or a procfs of the
/// writing thread's own.
pub fn tcp_migrate_req_supported() -> bool {
    Path::new(PATH).exists() && access() != Access::Neither
}

/// How this process writes the sysctl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Its `/proc/sys` is writable.
    Direct,
    /// Its `/proc/sys` is read-only, but the writing thread can mount a procfs of its own.
    OwnProc,
    /// Neither.
    Neither,
}

/// Found once: opening the file for writing (which writes nothing), and where that is refused
/// as read-only, the same on a throwaway thread with a procfs of its own.
fn access() -> Access {
    static ACCESS: std::sync::OnceLock<Access> = std::sync::OnceLock::new();
    *ACCESS.get_or_init(|| {
        let open = || std::fs::OpenOptions::new().write(true).open(PATH);
        match open() {
            Err(e) if is_read_only(&e) => {
                let own = std::thread::scope(|s| s.spawn(|| own_proc().is_ok() && open().is_ok()).join());
                if own.unwrap_or(false) { Access::OwnProc } else { Access::Neither }
            }
            _ => Access::Direct,
        }
    })
}

/// Gives the current thread a mount namespace of its own (private: nothing propagates to the
/// process's) with a fresh procfs over `/proc`, whose `/proc/sys` is writable. Needs
/// CAP_SYS_ADMIN; only for threads that end after their work (see the module doc).
fn own_proc() -> nix::Result<()> {
    use nix::mount::{MsFlags, mount};
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if DONE.get() {
        return Ok(());
    }
    // CLONE_NEWNS implies CLONE_FS: this thread's root and working directory become its own.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>)?;
    DONE.set(true);
    Ok(())
}

fn is_read_only(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ReadOnlyFilesystem
}

/// Sets the sysctl to 1 in the current thread's netns (nothing to do on a kernel without it).
pub(crate) fn apply() -> Result<(), RedirectError> {
    write_here("1")
}

/// The difference from what the capture needs, if any, in the current thread's netns (none
/// where the sysctl cannot be set).
pub(crate) fn verify() -> Result<Option<String>, RedirectError> {
    if access() == Access::Neither {
        return Ok(None);
    }
    verify_at(Path::new(PATH))
}

/// Restores the kernel default (0), leaving the pod's namespace as the capture found it.
pub(crate) fn remove() -> Result<(), RedirectError> {
    write_here("0")
}

/// Writes the sysctl of the current thread's netns, through a procfs of the thread's own where
/// the process's `/proc/sys` is read-only.
fn write_here(value: &'static str) -> Result<(), RedirectError> {
    if access() == Access::OwnProc {
        own_proc().map_err(|e| RedirectError::Sysctl {
            name: TCP_MIGRATE_REQ,
            value,
            path: "a procfs of the thread's own over /proc".into(),
            source: e.into(),
        })?;
    }
    write_at(Path::new(PATH), value)
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
        // A read-only /proc/sys where no procfs could be mounted: left as it is (module doc).
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

    /// A container's read-only `/proc/sys` (made here on a thread of its own) refuses the write;
    /// after `own_proc` the same thread writes it, and the process's mounts are unchanged.
    #[test]
    fn a_procfs_of_the_thread_s_own_writes_past_a_read_only_proc_sys() {
        use nix::mount::{MsFlags, mount};
        if !ambit_cluster::testing::require_root() || !Path::new(PATH).exists() {
            return;
        }
        let mounts = || std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let before = mounts();
        let open = || std::fs::OpenOptions::new().write(true).open(PATH);
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare");
                let none = None::<&str>;
                mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).expect("private");
                mount(Some("/proc/sys"), "/proc/sys", none, MsFlags::MS_BIND, none).expect("bind");
                let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
                mount(none, "/proc/sys", none, ro, none).expect("read-only");
                let refused = open().expect_err("a read-only /proc/sys refuses the write");
                assert!(is_read_only(&refused), "{refused}");
                own_proc().expect("a procfs of the thread's own");
                open().expect("writable through the thread's own procfs");
                own_proc().expect("a second call does nothing");
            })
            .join()
            .expect("thread");
        });
        assert_eq!(mounts(), before, "the process's mounts changed");
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
