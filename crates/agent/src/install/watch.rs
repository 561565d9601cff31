//! The watch-and-repair loop: polls the conf dir and the installed binaries, re-validates on any
//! change, repairs, and throttles fights with other components.
//!
//! The loop is synchronous on one blocking thread: every step is a few `stat`s or small file
//! reads, and a plain loop is easier to reason about than the same steps split across awaits.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::fsio::{self, Stamp};
use super::{InstallError, InstallOutcome, Installer, Problem, conf};

/// How often the conf dir and the binaries are looked at.
pub(super) const POLL: Duration = Duration::from_millis(200);
/// Repairs closer together than this are one fight.
const FIGHT_WINDOW: Duration = Duration::from_secs(5);
/// Repairs in a fight that run at once.
const FREE_REPAIRS: u32 = 3;
/// Wait before the first throttled repair; doubles up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_millis(250);
/// Longest wait before a repair (our entry is missing meanwhile, so keep it short).
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Repairs in a fight before warning.
const WARN_AFTER: u32 = 5;
/// Least time between two fight warnings.
const WARN_EVERY: Duration = Duration::from_secs(30);
/// Wait after a failed repair.
const ERROR_RETRY: Duration = Duration::from_secs(1);

/// Everything the loop watches, as cheap metadata.
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint {
    conf: Vec<(String, Option<Stamp>)>,
    bins: Vec<Option<Stamp>>,
    /// [`Installer::set_entry`] changes.
    generation: u64,
}

/// Spaces out repairs that keep following each other.
#[derive(Debug, Default)]
pub(super) struct Throttle {
    last: Option<Instant>,
    burst: u32,
    warned: Option<Instant>,
}

impl Installer {
    /// First pass, then watch and repair until `stop` is cancelled (see the module docs).
    ///
    /// Returns an error only when the first pass fails.
    pub async fn run(self, stop: CancellationToken) -> Result<(), InstallError> {
        match tokio::task::spawn_blocking(move || self.run_blocking(&stop)).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down.
            Err(_) => Ok(()),
        }
    }

    fn run_blocking(&self, stop: &CancellationToken) -> Result<(), InstallError> {
        let mut throttle = Throttle::default();
        let mut installed = false;
        let mut waiting_logged = false;
        let mut valid_generation = None;
        while !stop.is_cancelled() {
            let before = self.fingerprint();
            let validation = self.validate();
            if validation.is_valid() {
                if !self.inner.ready.swap(true, Ordering::Relaxed) {
                    tracing::info!("CNI plugin installed; watching the CNI config and binaries");
                }
                installed = true;
                waiting_logged = false;
                valid_generation = Some(before.generation);
                self.wait_change(&before, stop);
                continue;
            }
            // Our own new entry is an update, not a repair of someone else's change.
            let update = valid_generation.is_some_and(|g| g != before.generation)
                && validation
                    .problems()
                    .iter()
                    .all(|p| matches!(p, Problem::StaleEntry(_) | Problem::Standalone(_)));
            if !update {
                self.inner.ready.store(false, Ordering::Relaxed);
            }
            if installed && update {
                tracing::info!("updating the plugin entry in the CNI config");
            } else if installed {
                tracing::info!(problems = %validation, "repairing the CNI installation");
                let (delay, warn) = throttle.repair(Instant::now());
                if warn {
                    tracing::warn!(problems = %validation,
                        "another component keeps rewriting the CNI config or binaries, and the \
                         installer keeps repairing them; find it and make it leave other plugins' \
                         entries in place (Cilium: cni.exclusive=false)");
                }
                if !delay.is_zero() && sleep(delay, stop) {
                    break;
                }
            }
            match self.install() {
                Ok(InstallOutcome::Installed { changed: true, .. }) => {
                    if installed && !update {
                        self.inner.repairs.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Nothing to write yet something is off (e.g. a file changed under us): look again
                // on the next change.
                Ok(InstallOutcome::Installed { changed: false, .. }) => {
                    self.wait_change(&before, stop);
                }
                Ok(InstallOutcome::WaitingForPrimary) => {
                    if !waiting_logged {
                        tracing::info!(dir = %self.inner.cfg.conf_dir.display(),
                            "waiting for the primary CNI plugin to write its config");
                        waiting_logged = true;
                    }
                    self.wait_change(&before, stop);
                }
                Err(e) if !installed => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "repairing the CNI installation failed; retrying");
                    sleep(ERROR_RETRY, stop);
                }
            }
        }
        self.inner.ready.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Polls until the fingerprint differs from `before` or `stop` is cancelled.
    fn wait_change(&self, before: &Fingerprint, stop: &CancellationToken) {
        while !sleep(POLL, stop) {
            if self.fingerprint() != *before {
                return;
            }
        }
    }

    fn fingerprint(&self) -> Fingerprint {
        let cfg = &self.inner.cfg;
        let mut conf = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&cfg.conf_dir) {
            for entry in entries.flatten() {
                if let Ok(name) = entry.file_name().into_string()
                    && conf::Kind::of(&name).is_some()
                {
                    conf.push((name, fsio::stamp(&entry.path())));
                }
            }
        }
        conf.sort_by(|a, b| a.0.cmp(&b.0));
        let bins = cfg.cni_bin_dirs.iter().map(|d| fsio::stamp(&d.join(&cfg.plugin_name))).collect();
        Fingerprint { conf, bins, generation: self.inner.generation.load(Ordering::Acquire) }
    }
}

impl Throttle {
    /// Registers a repair at `now`: how long to wait before it, and whether to warn of a fight.
    pub(super) fn repair(&mut self, now: Instant) -> (Duration, bool) {
        self.burst = match self.last {
            Some(last) if now.saturating_duration_since(last) < FIGHT_WINDOW => self.burst + 1,
            _ => {
                // A new fight warns afresh.
                self.warned = None;
                0
            }
        };
        let delay = match self.burst.checked_sub(FREE_REPAIRS) {
            None => Duration::ZERO,
            Some(n) => FIRST_DELAY.saturating_mul(1 << n.min(8)).min(MAX_DELAY),
        };
        // The repair happens after the wait: measure the next gap from then.
        self.last = Some(now + delay);
        let warn = self.burst >= WARN_AFTER
            && self.warned.is_none_or(|w| now.saturating_duration_since(w) >= WARN_EVERY);
        if warn {
            self.warned = Some(now);
        }
        (delay, warn)
    }
}

/// Sleeps `total` in slices; true if `stop` was cancelled.
fn sleep(total: Duration, stop: &CancellationToken) -> bool {
    let end = Instant::now() + total;
    loop {
        if stop.is_cancelled() {
            return true;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests;
