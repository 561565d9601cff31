//! Recognising, opening and identifying network-namespace file descriptors.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// Whether an fd is a network namespace (its `/proc/self/fd` link reads `net:[INODE]`).
pub fn is_netns(fd: BorrowedFd<'_>) -> bool {
    check_netns(fd).is_ok()
}

/// Opens a netns by path (e.g. `/var/run/netns/NAME` or `/proc/PID/ns/net`), close-on-exec.
pub fn open_netns(path: &Path) -> io::Result<OwnedFd> {
    let file = File::open(path).map_err(|e| {
        io::Error::new(e.kind(), format!("cannot open network namespace {}: {e}", path.display()))
    })?;
    let fd = OwnedFd::from(file);
    if let Err(detail) = check_netns(fd.as_fd()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a network namespace ({detail})", path.display()),
        ));
    }
    Ok(fd)
}

/// The `(dev, inode)` pair that identifies a namespace: two fds with equal ids are the same netns.
pub fn netns_id(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let stat = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// `Ok` if `fd` is a netns, else a short description of what it is instead.
///
/// An nsfs file reached through `/proc/PID/ns/net` reads back as `net:[INODE]`; one reached
/// through a bind mount (`/var/run/netns/NAME`, as container runtimes make them) reads back as
/// the mount path, so the filesystem type (nsfs) is what tells it is a namespace. The kind of
/// namespace of a bind-mounted one is confirmed by `setns(CLONE_NEWNET)` when the proxy
/// enters it (which fails with EINVAL for any other kind).
pub(crate) fn check_netns(fd: BorrowedFd<'_>) -> Result<(), String> {
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
