//! Lock-free publication of state snapshots, change notification and the local-file watcher.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::{LocalConfig, LocalConfigError, State};

/// Lock-free publisher of snapshots (arc-swap), with change notification.
#[derive(Clone)]
pub struct StateStore {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<State>,
    changes: watch::Sender<u64>,
    policy_changes: watch::Sender<u64>,
}

impl StateStore {
    /// A store holding `initial`.
    pub fn new(initial: State) -> Self {
        StateStore {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(initial),
                changes: watch::Sender::new(0),
                policy_changes: watch::Sender::new(0),
            }),
        }
    }

    /// The current snapshot (wait-free; take one per connection).
    pub fn current(&self) -> Arc<State> {
        self.inner.current.load_full()
    }

    /// Replaces the snapshot; bumps watchers, and the policy watcher only if the policy set changed.
    pub fn publish(&self, s: State) {
        let new = Arc::new(s);
        let old = self.inner.current.swap(new.clone());
        let policies_changed = !old.same_policies(&new);
        self.inner.changes.send_modify(|v| *v = v.wrapping_add(1));
        if policies_changed {
            self.inner.policy_changes.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Notified on any change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Notified when the policy set changes.
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
/// The file as it is when the watcher starts is taken as already loaded; start the watcher
/// right after building the initial state from it.
pub async fn watch_local_file(
    store: StateStore,
    path: PathBuf,
    node_name: Option<String>,
    interval: Duration,
) {
    let mut seen = Fingerprint::read(&path).await.ok();
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
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e,
                    "cannot read local config; keeping the current state");
                continue;
            }
        };
        let fp = Fingerprint { mtime, len, hash: hash(&text) };
        let unchanged = seen.as_ref().is_some_and(|s| s.hash == fp.hash);
        seen = Some(fp);
        if unchanged {
            continue;
        }
        match build(&text, node_name.as_deref()) {
            Ok(state) => {
                tracing::info!(file = %path.display(), "local config reloaded");
                store.publish(state);
            }
            Err(e) => {
                let (line, column) = match &e {
                    LocalConfigError::Yaml { line, column, .. } => (*line, *column),
                    _ => (None, None),
                };
                tracing::error!(file = %path.display(), line, column, error = %e,
                    "rejected local config change; keeping the previous state");
            }
        }
    }
}

/// Upper bound on filesystem timestamp granularity.
const MTIME_GRANULARITY: Duration = Duration::from_secs(2);

fn build(text: &str, node_name: Option<&str>) -> Result<State, LocalConfigError> {
    State::from_config(LocalConfig::parse(text)?, node_name)
}

struct Fingerprint {
    mtime: Option<SystemTime>,
    len: u64,
    hash: u64,
}

impl Fingerprint {
    async fn read(path: &std::path::Path) -> std::io::Result<Self> {
        let meta = tokio::fs::metadata(path).await?;
        let text = tokio::fs::read_to_string(path).await?;
        Ok(Fingerprint { mtime: meta.modified().ok(), len: meta.len(), hash: hash(&text) })
    }
}

fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}
