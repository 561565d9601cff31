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
/// The kernel names every nsfs dentry `TYPE:[INODE]` however the file was reached (a bind
/// mount under `/var/run/netns` included), while a regular file's link is an absolute path,
/// so the prefix `net:[` cannot be forged by naming a file.
pub(crate) fn check_netns(fd: BorrowedFd<'_>) -> Result<(), String> {
    let link = Path::new("/proc/self/fd").join(fd.as_raw_fd().to_string());
    match std::fs::read_link(&link) {
        Ok(target) => {
            let target = target.to_string_lossy();
            if target.starts_with("net:[") { Ok(()) } else { Err(format!("it refers to {target}")) }
        }
        Err(e) => Err(format!("cannot read {}: {e}", link.display())),
    }
}
