//! Network namespaces, one implementation for every Ambit component: open a namespace and
//! verify that it is one, identify it by `(dev, inode)`, tell the process's own and the host's
//! namespace apart from a pod's, and run code inside one ("enter, create, leave").
//!
//! Two ways to run inside a namespace:
//! - [`Netns::run`] switches the *current* thread in, runs a synchronous closure and switches
//!   back before anything else runs on the thread (the proxy creates a pod's sockets this way;
//!   a socket stays in the namespace it was created in). Nothing may await inside.
//! - [`run_in_thread`] runs the closure on a fresh thread that enters the namespace and then
//!   ends, so no later work can run in the wrong namespace; processes it spawns inherit the
//!   namespace (the agent's capture backends).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::sched::{CloneFlags, setns};

/// Identity of a network namespace: two fds name the same namespace iff their ids are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct NetnsId {
    /// Device of the nsfs inode.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
}

/// An open network namespace, verified to be one, with its identity.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    id: NetnsId,
}

/// Why a namespace could not be opened, verified or entered.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The path could not be opened.
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is not a network namespace.
    #[error("{what} is not a network namespace ({detail})")]
    NotANetns {
        /// The path or fd that was checked.
        what: String,
        /// What it is instead.
        detail: String,
    },
    /// `fstat` on the namespace failed.
    #[error("cannot stat network namespace {what}: {source}")]
    Stat {
        /// The path or fd.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `setns(CLONE_NEWNET)` failed.
    #[error(
        "cannot enter the network namespace (setns): {0}; does the process have CAP_SYS_ADMIN, and is \
         the namespace still alive?"
    )]
    Enter(nix::Error),
    /// The process's own namespace could not be opened (to return to it).
    #[error("cannot open this process's own network namespace: {0}")]
    Home(String),
    /// The helper thread could not be started.
    #[error("cannot start a thread to enter the network namespace: {0}")]
    Thread(io::Error),
    /// Work running inside the namespace panicked (a bug, reported rather than propagated).
    #[error("the network namespace worker thread panicked")]
    WorkerPanicked,
}

impl From<NetnsError> for io::Error {
    fn from(e: NetnsError) -> io::Error {
        let kind = match &e {
            NetnsError::Open { source, .. } | NetnsError::Stat { source, .. } => source.kind(),
            NetnsError::NotANetns { .. } => io::ErrorKind::InvalidInput,
            NetnsError::Enter(errno) => io::Error::from(*errno).kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

impl NetnsId {
    /// The id of a namespace fd (it is not checked to be a namespace; see [`check`]).
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<NetnsId> {
        let stat = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
        Ok(NetnsId { dev: stat.st_dev, ino: stat.st_ino })
    }

    /// The id of the namespace at `path` (e.g. `/proc/PID/ns/net`), following symlinks.
    pub fn of_path(path: &Path) -> io::Result<NetnsId> {
        let stat = nix::sys::stat::stat(path).map_err(io::Error::from)?;
        Ok(NetnsId { dev: stat.st_dev, ino: stat.st_ino })
    }
}

impl std::fmt::Display for NetnsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.dev, self.ino)
    }
}

impl Netns {
    /// Opens the namespace at `path` (e.g. `/var/run/netns/NAME` or `/proc/PID/ns/net`),
    /// close-on-exec, and verifies that it is a network namespace.
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        let file = File::open(path).map_err(|source| NetnsError::Open { path: path.to_owned(), source })?;
        Netns::verified(OwnedFd::from(file), || path.display().to_string())
    }

    /// Takes ownership of an fd (e.g. received over ZDS) after verifying it is a network namespace.
    pub fn from_fd(fd: OwnedFd) -> Result<Netns, NetnsError> {
        Netns::verified(fd, || "the file descriptor".to_owned())
    }

    /// The namespace this process started in (where [`Netns::run`] returns threads to), opened anew.
    pub fn own() -> Result<Netns, NetnsError> {
        Netns::open(Path::new("/proc/self/ns/net"))
    }

    fn verified(fd: OwnedFd, what: impl Fn() -> String) -> Result<Netns, NetnsError> {
        check(fd.as_fd()).map_err(|detail| NetnsError::NotANetns { what: what(), detail })?;
        let id = NetnsId::of(fd.as_fd()).map_err(|source| NetnsError::Stat { what: what(), source })?;
        Ok(Netns { fd, id })
    }

    /// The namespace's identity.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// Whether this is the namespace the process started in.
    pub fn is_own(&self) -> bool {
        own_id().is_ok_and(|own| own == self.id)
    }

    /// Runs `f` with the current thread inside this namespace, then switches back.
    ///
    /// If switching back fails the thread would keep running in this namespace, which would
    /// silently put later sockets in the wrong place; the process aborts instead.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, NetnsError> {
        let home = home()?;
        setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(NetnsError::Enter)?;
        let out = f();
        if let Err(e) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
            tracing::error!(error = %e, "cannot switch a thread back to the process's netns; aborting");
            // Log lines may be buffered by a writer thread that an abort does not wait for.
            eprintln!("cannot switch a thread back to the process's netns ({e}); aborting");
            std::process::abort();
        }
        Ok(out)
    }

    /// Runs `f` on a fresh thread inside this namespace (see [`run_in_thread`]).
    pub fn run_in_thread<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
        run_in_thread(self.fd.as_fd(), f)
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<Netns> for OwnedFd {
    fn from(ns: Netns) -> OwnedFd {
        ns.fd
    }
}

/// Runs `work` on a fresh thread that first enters `netns` (a network namespace fd); the thread
/// ends afterwards, so no other work ever runs in the wrong namespace. Processes spawned by
/// `work` inherit the namespace.
pub fn run_in_thread<T: Send>(
    netns: BorrowedFd<'_>,
    work: impl FnOnce() -> T + Send,
) -> Result<T, NetnsError> {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("ambit-netns".into())
            .spawn_scoped(scope, move || {
                setns(netns, CloneFlags::CLONE_NEWNET).map_err(NetnsError::Enter)?;
                Ok(work())
            })
            .map_err(NetnsError::Thread)?;
        worker.join().map_err(|_| NetnsError::WorkerPanicked)?
    })
}

/// The id of the namespace this process started in.
pub fn own_id() -> Result<NetnsId, NetnsError> {
    let home = home()?;
    NetnsId::of(home.as_fd()).map_err(|source| NetnsError::Stat { what: "/proc/self/ns/net".into(), source })
}

/// The id of the host's network namespace: that of pid 1 under `proc_root` (the host's `/proc`).
pub fn host_id(proc_root: &Path) -> io::Result<NetnsId> {
    NetnsId::of_path(&proc_root.join("1/ns/net"))
}

/// Whether an fd is a network namespace.
pub fn is_netns(fd: BorrowedFd<'_>) -> bool {
    check(fd).is_ok()
}

/// `Ok` if `fd` is a network namespace, else a short description of what it is instead.
///
/// An nsfs file reached through `/proc/PID/ns/net` reads back as `net:[INODE]`; one reached
/// through a bind mount (`/var/run/netns/NAME`, as container runtimes make them) may read back as
/// the mount path, so the filesystem type (nsfs) is what tells it is a namespace. The kind of a
/// bind-mounted namespace is confirmed by `setns(CLONE_NEWNET)` on entry, which fails with EINVAL
/// for any other kind.
pub fn check(fd: BorrowedFd<'_>) -> Result<(), String> {
    let link = Path::new("/proc/self/fd").join(fd.as_raw_fd().to_string());
    let target = match std::fs::read_link(&link) {
        Ok(t) => t.to_string_lossy().into_owned(),
        Err(e) => return Err(format!("cannot read {}: {e}", link.display())),
    };
    if target.starts_with("net:[") {
        return Ok(());
    }
    if target.contains(":[") && !target.starts_with('/') {
        return Err(format!("it is another kind of namespace ({target})"));
    }
    match nix::sys::statfs::fstatfs(fd) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC => Ok(()),
        Ok(_) => Err(format!("it refers to {target}")),
        Err(e) => Err(format!("cannot fstatfs it ({e}); it refers to {target}")),
    }
}

/// The namespace this process started in, where every thread returns to. Opened once: the
/// main thread never leaves it.
fn home() -> Result<&'static OwnedFd, NetnsError> {
    static HOME: OnceLock<Result<OwnedFd, String>> = OnceLock::new();
    match HOME.get_or_init(|| File::open("/proc/self/ns/net").map(OwnedFd::from).map_err(|e| e.to_string())) {
        Ok(fd) => Ok(fd),
        Err(e) => Err(NetnsError::Home(e.clone())),
    }
}

#[cfg(test)]
mod tests;
