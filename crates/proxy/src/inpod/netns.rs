//! Pod network namespaces: hold the fd, and create sockets inside the namespace.
//!
//! "Enter, create, leave": the current thread switches into the pod's namespace, creates the
//! socket synchronously, and switches back before anything else runs on it. A socket stays in
//! the namespace it was created in, so it can then be used from any thread. Nothing awaits
//! while the thread is switched.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

use nix::sched::{CloneFlags, setns};

/// A pod's network namespace, identified by `(dev, inode)`.
#[derive(Debug)]
pub struct InpodNetns {
    fd: OwnedFd,
    id: NetnsId,
}

/// Identity of a network namespace: two fds name the same namespace iff their ids are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct NetnsId {
    /// Device of the nsfs inode.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
}

/// The namespace this process started in, where every thread returns to.
fn home() -> io::Result<&'static OwnedFd> {
    static HOME: OnceLock<Result<OwnedFd, String>> = OnceLock::new();
    match HOME.get_or_init(|| File::open("/proc/self/ns/net").map(OwnedFd::from).map_err(|e| e.to_string())) {
        Ok(fd) => Ok(fd),
        Err(e) => Err(io::Error::other(format!("cannot open the proxy's own netns: {e}"))),
    }
}

impl InpodNetns {
    /// Takes ownership of a netns fd (as received over ZDS).
    pub fn new(fd: OwnedFd) -> io::Result<InpodNetns> {
        let id = netns_id(fd.as_fd())?;
        Ok(InpodNetns { fd, id })
    }

    /// The namespace's identity.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// Runs `f` with the current thread inside the pod namespace, then switches back.
    ///
    /// If switching back fails the thread would keep running in the pod's namespace, which
    /// would silently put later sockets in the wrong place; the process aborts instead.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        let home = home()?;
        setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
        let out = f();
        if let Err(e) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
            tracing::error!(error = %e, "cannot switch a thread back to the proxy's netns; aborting");
            std::process::abort();
        }
        Ok(out)
    }
}

/// `(dev, inode)` of a namespace fd.
pub fn netns_id(fd: BorrowedFd<'_>) -> io::Result<NetnsId> {
    let file = File::from(fd.try_clone_to_owned()?);
    let meta = file.metadata()?;
    Ok(NetnsId { dev: meta.dev(), ino: meta.ino() })
}

/// Checks at startup that this process may switch namespaces (CAP_SYS_ADMIN) and mark
/// sockets (CAP_NET_ADMIN), as shared mode needs both.
pub fn check_capabilities(mark: Option<u32>) -> io::Result<()> {
    let home = home()?;
    setns(home.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
        io::Error::other(format!("setns into our own netns failed ({e}); shared mode needs CAP_SYS_ADMIN"))
    })?;
    if let Some(mark) = mark {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_mark(mark).map_err(|e| {
            io::Error::other(format!("SO_MARK failed ({e}); shared mode needs CAP_NET_ADMIN"))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_round_trip() {
        let own = File::open("/proc/self/ns/net").map(OwnedFd::from).expect("open own netns");
        let ns = InpodNetns::new(own).expect("netns");
        let again = netns_id(File::open("/proc/self/ns/net").expect("open").as_fd()).expect("id");
        assert_eq!(ns.id(), again);
        // Entering our own namespace needs CAP_SYS_ADMIN; without it `run` must fail cleanly.
        match ns.run(|| 7) {
            Ok(v) => assert_eq!(v, 7),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        }
    }
}
