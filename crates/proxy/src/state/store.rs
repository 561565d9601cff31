//! Lock-free publication of state snapshots, change notification and the local-file watcher.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::{Applied, Delta, LocalConfig, LocalConfigError, State};
use crate::name::Name;

/// Lock-free publisher of snapshots (arc-swap), with change notification.
#[derive(Clone)]
pub struct StateStore {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<State>,
    changes: watch::Sender<u64>,
    policy_changes: watch::Sender<u64>,
    /// Serialises writers (each reads the current snapshot and publishes the next); readers
    /// never take it.
    writer: Mutex<()>,
}

impl StateStore {
    /// A store holding `initial`.
    pub fn new(initial: State) -> Self {
        StateStore {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(initial),
                changes: watch::Sender::new(0),
                policy_changes: watch::Sender::new(0),
                writer: Mutex::new(()),
            }),
        }
    }

    /// The current snapshot (wait-free; take one per connection).
    pub fn current(&self) -> Arc<State> {
        self.inner.current.load_full()
    }

    /// Replaces the snapshot wholesale (tests; every source goes through [`StateStore::update`]);
    /// bumps watchers, and the policy watcher only if something authorization reads differs
    /// ([`State::authorization_differs`], O(n)).
    #[cfg(test)]
    pub fn publish(&self, s: State) {
        let _writer = self.inner.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let new = Arc::new(s);
        let old = self.inner.current.swap(new.clone());
        self.notify(old.authorization_differs(&new));
    }

    /// Makes the next snapshot from the current one with `f` (typically [`State::apply`]) and
    /// publishes it if `f` says something changed; bumps the policy watcher only when
    /// [`Applied::authorization_changed`]. Writers are serialised, so no update is lost; readers
    /// never wait. `f`'s error publishes nothing and is returned.
    pub fn update<E>(&self, f: impl FnOnce(&State) -> Result<(State, Applied), E>) -> Result<Applied, E> {
        let _writer = self.inner.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.inner.current.load_full();
        let (next, applied) = f(&current)?;
        if applied.changed {
            self.inner.current.store(Arc::new(next));
            self.notify(applied.authorization_changed);
        }
        Ok(applied)
    }

    /// Applies `delta` to the current snapshot and publishes the result ([`StateStore::update`]):
    /// the good resources apply, the rejected ones are returned in [`Applied::rejected`].
    pub fn apply(&self, delta: Delta) -> Applied {
        match self.update(|s| Ok::<_, Infallible>(s.apply(delta))) {
            Ok(applied) => applied,
            Err(never) => match never {},
        }
    }

    fn notify(&self, authorization_changed: bool) {
        self.inner.changes.send_modify(|v| *v = v.wrapping_add(1));
        if authorization_changed {
            self.inner.policy_changes.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Notified on any change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Notified when something authorization decisions read changes (see
    /// [`Applied::authorization_changed`]).
    pub fn subscribe_policies(&self) -> watch::Receiver<u64> {
        self.inner.policy_changes.subscribe()
    }
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore").field("version", &*self.inner.changes.borrow()).finish()
    }
}

/// Reloads LOCAL_XDS_PATH when it changes (poll mtime+size+content hash every `interval`, e.g. 500ms;
/// a bad file is rejected with a clear error logged via tracing and the previous state kept).
///
/// A change is applied as a [`Delta`]: everything in the file as updates (unchanged resources
/// are no-ops) and what left the file as removals, so resources from xDS, when `XDS_ADDRESS` is
/// set too, are kept.
///
/// Reading, hashing, parsing, building and publishing run on a blocking-pool thread (so does
/// dropping the replaced snapshot): a file of a few hundred thousand workloads takes seconds to
/// parse, and the task's runtime (the control runtime: ZDS, admin, readiness) keeps answering.
///
/// `loaded` is the file as [`load_local_file`] built the initial state from it; without it the
/// file as it is when the watcher starts is taken as already loaded (read and parsed once more
/// to learn its names), so start the watcher right after building the initial state.
pub async fn watch_local_file(
    store: StateStore,
    path: PathBuf,
    interval: Duration,
    loaded: Option<LoadedFile>,
) {
    let mut seen = match loaded {
        Some(LoadedFile(fp)) => Some(fp),
        None => {
            let path = path.clone();
            tokio::task::spawn_blocking(move || Fingerprint::read(&path)).await.ok().flatten()
        }
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported_missing = false;
    loop {
        ticker.tick().await;
        let meta = match tokio::fs::metadata(&path).await {
            Ok(m) => m,
            Err(e) => {
                if !reported_missing {
                    tracing::warn!(file = %path.display(), error = %e,
                        "cannot stat local config; keeping the current state");
                    reported_missing = true;
                }
                continue;
            }
        };
        reported_missing = false;
        let (mtime, len) = (meta.modified().ok(), meta.len());
        // Metadata alone is trusted only once the mtime is old enough that a same-size rewrite
        // could not share it (coarse filesystem timestamps); otherwise compare content.
        let settled = mtime
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age > MTIME_GRANULARITY);
        if settled && seen.as_ref().is_some_and(|s| s.mtime == mtime && s.len == len) {
            continue;
        }
        let job = {
            let (store, path) = (store.clone(), path.clone());
            let previous = seen.take();
            tokio::task::spawn_blocking(move || {
                let kept = reload(&store, &path, mtime, previous.as_ref());
                kept.or(previous)
            })
        };
        match job.await {
            Ok(fp) => seen = fp,
            Err(e) => tracing::error!(file = %path.display(), error = %e,
                "the local config reload failed; keeping the current state"),
        }
    }
}

/// Upper bound on filesystem timestamp granularity.
const MTIME_GRANULARITY: Duration = Duration::from_secs(2);

/// Reads the file; unless its content hash is `previous`'s, parses it and applies the change or
/// logs why it was rejected. Returns the fingerprint of what is loaded now (`None` if the file
/// could not be read: the previous one stays).
fn reload(
    store: &StateStore,
    path: &Path,
    mtime: Option<SystemTime>,
    previous: Option<&Fingerprint>,
) -> Option<Fingerprint> {
    let text = match super::config::read(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e,
                "cannot read local config; keeping the current state");
            return None;
        }
    };
    let hash = hash(&text);
    if let Some(p) = previous
        && p.hash == hash
    {
        return Some(Fingerprint { mtime, len: text.len() as u64, hash, names: p.names.clone() });
    }
    let started = Instant::now();
    let len = text.len() as u64;
    match apply_file(store, &text, previous) {
        Ok((applied, names)) => {
            tracing::info!(file = %path.display(), workloads = names.workloads, changed = applied.changed,
                took = ?started.elapsed(), "local config reloaded");
            Some(Fingerprint { mtime, len, hash, names })
        }
        Err(e) => {
            let position = e.position();
            tracing::error!(file = %path.display(), line = position.map(|p| p.line),
                column = position.map(|p| p.column), error = %e,
                "rejected local config change; keeping the previous state");
            // Remember the content so the same bad file is not reported again, but keep the
            // names of what is still loaded.
            previous.map(|p| Fingerprint { mtime, len, hash, names: p.names.clone() })
        }
    }
}

/// Applies the file's text to the store as one change, whole or not at all: everything in it as
/// updates and what left it since `previous` as removals. A resource the state refuses is the
/// error and nothing is published. (Whether a resource applies does not depend on the state it
/// applies to, so this refuses what building a state from the file alone would.)
fn apply_file(
    store: &StateStore,
    text: &str,
    previous: Option<&Fingerprint>,
) -> Result<(Applied, FileNames), LocalConfigError> {
    let cfg = LocalConfig::parse(text)?;
    let names = FileNames::of(&cfg);
    let mut delta = Delta::from(cfg);
    if let Some(p) = previous {
        delta.removed_addresses =
            p.names.addresses.difference(&names.addresses).map(|a| a.to_string()).collect();
        delta.removed_policies = p.names.policies.difference(&names.policies).cloned().collect();
    }
    let applied = store.update(|current| {
        let (next, applied) = current.apply(delta);
        match applied.rejected.first() {
            Some(r) => Err(r.clone().into_config_error()),
            None => Ok((next, applied)),
        }
    })?;
    Ok((applied, names))
}

/// A local config file as [`load_local_file`] loaded it: what [`watch_local_file`] compares the
/// file with, so that it need not read and parse it again when it starts.
pub struct LoadedFile(Fingerprint);

/// Reads the local config file and builds a state from it ([`State::from_config`]), with what
/// the watcher needs to know of the file. The file is read and parsed once.
pub fn load_local_file(
    path: &Path,
    node_name: Option<&str>,
) -> Result<(State, LoadedFile), LocalConfigError> {
    // The time before the read: a write racing with it makes the watcher look again.
    let mtime = std::fs::metadata(path).ok().and_then(|m| m.modified().ok());
    let text = super::config::read(path)?;
    let (len, hash) = (text.len() as u64, hash(&text));
    let cfg = LocalConfig::parse(&text)?;
    drop(text);
    let names = FileNames::of(&cfg);
    let state = State::from_config(cfg, node_name)?;
    Ok((state, LoadedFile(Fingerprint { mtime, len, hash, names })))
}

/// xDS responses whose payloads add up to at least this are followed by [`release_freed`].
pub(crate) const RELEASE_AFTER: usize = 4 << 20;

/// Returns to the system the heap pages that applying a large xDS response freed. glibc keeps
/// freed pages of its heap for later allocations: after the initial sync of 100 000 workloads
/// (`bench_xds`) 33 MiB of the proxy's 190 MiB were pages the decoding had used and freed, which
/// the proxy would not need again (BENCHMARKS.md). The local file's load leaves none (its
/// parse threads' memory goes back as they end; measured: 93 MiB either way), so it is not
/// called there. A no-op where the allocator is not glibc's (musl, or the `jemalloc`
/// feature's allocator, which returns pages itself).
pub(crate) fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim takes no pointer and only releases memory glibc holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

struct Fingerprint {
    mtime: Option<SystemTime>,
    len: u64,
    hash: u64,
    names: FileNames,
}

/// The names of what a loaded file holds (to remove what leaves it).
#[derive(Clone, Default)]
struct FileNames {
    /// Workload uids and service `ns/hostname`s (shared with the state: no copy).
    addresses: BTreeSet<Arc<str>>,
    /// Policy `ns/name`s.
    policies: BTreeSet<String>,
    workloads: usize,
}

impl FileNames {
    fn of(cfg: &LocalConfig) -> FileNames {
        FileNames {
            addresses: cfg
                .workloads
                .iter()
                .map(|w| w.uid.clone())
                .chain(cfg.services.iter().map(|s| Name::from(s.key()).shared()))
                .collect(),
            policies: cfg.policies.iter().map(|p| p.key()).collect(),
            workloads: cfg.workloads.len(),
        }
    }
}

impl Fingerprint {
    /// The file as it is now, taken as already loaded.
    fn read(path: &Path) -> Option<Self> {
        let mtime = std::fs::metadata(path).ok()?.modified().ok();
        let text = super::config::read(path).ok()?;
        let names = LocalConfig::parse(&text).map(|c| FileNames::of(&c)).unwrap_or_default();
        Some(Fingerprint { mtime, len: text.len() as u64, hash: hash(&text), names })
    }
}

/// The file's fingerprint (whether it changed). XXH64: 67 MB in a few ms, where SipHash took
/// ~50 ms of a 100 000-workload file's time to ready; the file is the node's own, so a keyed
/// hash buys nothing.
fn hash(text: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(text.as_bytes(), 0)
}
