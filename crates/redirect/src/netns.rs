//! "Enter, run, leave": synchronous work inside a network namespace on a dedicated thread.

use std::os::fd::BorrowedFd;

use nix::sched::{CloneFlags, setns};

use crate::RedirectError;

/// Runs `work` on a fresh thread that first `setns`es into `netns` (a network namespace fd);
/// the thread ends afterwards, so no other work ever runs in the wrong namespace. Processes
/// spawned by `work` inherit the namespace.
pub fn in_netns<T: Send>(
    netns: BorrowedFd<'_>,
    work: impl FnOnce() -> Result<T, RedirectError> + Send,
) -> Result<T, RedirectError> {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("ambit-netns".into())
            .spawn_scoped(scope, move || {
                setns(netns, CloneFlags::CLONE_NEWNET).map_err(RedirectError::Setns)?;
                work()
            })
            .map_err(RedirectError::Thread)?;
        worker.join().map_err(|_| RedirectError::WorkerPanicked)?
    })
}
