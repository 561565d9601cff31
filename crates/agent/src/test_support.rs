//! Helpers for this crate's unit tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace other than the test's: a `sleep` in a fresh netns (`unshare --net`, or
/// with a user namespace when not root), killed on drop.
pub struct OtherNetns {
    child: Child,
}

impl OtherNetns {
    /// Starts the holder process and waits until it is in its own namespace.
    pub fn new() -> OtherNetns {
        let own = std::fs::read_link("/proc/self/ns/net").expect("own netns link");
        for args in [&["--net"][..], &["--user", "--map-root-user", "--net"]] {
            let Ok(child) = Command::new("unshare")
                .args(args)
                .args(["--", "sleep", "600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            else {
                continue;
            };
            let mut ns = OtherNetns { child };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if ns.child.try_wait().ok().flatten().is_some() {
                    break; // unshare failed (no privilege): try the next way
                }
                if std::fs::read_link(ns.path()).is_ok_and(|l| l != own) {
                    return ns;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        panic!("cannot create a network namespace with unshare (needs root or user namespaces)");
    }

    /// `/proc/PID/ns/net` of the holder.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.child.id()))
    }
}

impl Drop for OtherNetns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
