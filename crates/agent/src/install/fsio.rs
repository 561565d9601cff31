//! Filesystem primitives: atomic writes that keep a file's mode and owner, comparing installed
//! binaries with the source, and cheap change stamps for polling.

use std::fs::{self, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes temp files of concurrent writes within this process.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Metadata that changes whenever a file is written, replaced, chmod-ed or deleted.
///
/// `ctime` cannot be set from user space, so an in-place rewrite that restores size and mtime
/// still shows up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// What an installed binary looks like next to the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Compared {
    /// Same size and bytes.
    Same,
    /// Present but different.
    Differs,
    /// Not there.
    Missing,
}

/// The stamp of `path` (through symlinks), or `None` when it does not exist or is unreadable.
pub(super) fn stamp(path: &Path) -> Option<Stamp> {
    let m = fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mode: m.mode(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

/// Replaces `path` with `bytes` atomically: a temp file next to it (named `<tmp_prefix><pid>.<n>`),
/// written, given `mode` (and `owner`, best effort), fsynced, renamed over, then the dir fsynced.
///
/// A reader (kubelet, the runtime) sees the old file or the new one, never a partial one.
pub(super) fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
    tmp_prefix: &str,
) -> io::Result<()> {
    let dir = parent(path);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!("{tmp_prefix}{}.{seq}", std::process::id()));
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.write_all(bytes)?;
        // `open` applied the umask; set the exact mode.
        file.set_permissions(Permissions::from_mode(mode))?;
        if let Some((uid, gid)) = owner {
            let m = file.metadata()?;
            if (m.uid(), m.gid()) != (uid, gid) {
                // Only root can give a file away; a non-root agent keeps its own ownership.
                if let Err(e) = std::os::unix::fs::fchown(&file, Some(uid), Some(gid)) {
                    tracing::debug!(path = %path.display(), error = %e, "cannot keep the file's owner");
                }
            }
        }
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes files in `dir` whose names start with `prefix` (temp files of an interrupted write).
pub(super) fn remove_stale(dir: &Path, prefix: &str) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let stale = entry.file_name().to_str().is_some_and(|n| n.starts_with(prefix));
        if stale && !entry.file_type().is_ok_and(|t| t.is_dir()) {
            tracing::info!(path = %entry.path().display(), "removing a leftover temp file");
            match fs::remove_file(entry.path()) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Compares the file at `path` with `expected`: size first, then the bytes.
pub(super) fn compare(path: &Path, expected: &[u8]) -> io::Result<Compared> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Compared::Missing),
        Err(e) => return Err(e),
    };
    // Checked before opening: opening a FIFO would block.
    if !meta.is_file() || meta.len() != expected.len() as u64 {
        return Ok(Compared::Differs);
    }
    let file = fs::File::open(path)?;
    let mut reader = io::BufReader::with_capacity(64 * 1024, file);
    let mut buf = vec![0u8; 64 * 1024];
    let mut offset = 0;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let end = offset + n;
        if end > expected.len() || buf[..n] != expected[offset..end] {
            return Ok(Compared::Differs);
        }
        offset = end;
    }
    Ok(if offset == expected.len() { Compared::Same } else { Compared::Differs })
}

/// Deletes `path`; a file that is already gone is fine.
pub(super) fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => sync_dir(parent(path)),
    }
}

/// Makes a rename or unlink in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}
