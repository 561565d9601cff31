//! The certificate manager: one certificate per identity, fetched by priority and kept fresh.
//!
//! One worker task owns the queue. Each identity has at most one queued request (a priority
//! and a due time) and at most one CA call in flight; at most [`MAX_CONCURRENT`] calls run at
//! once. Scheduling uses tokio time, so renewals and backoff can be tested with paused time;
//! certificate validity is converted from wall-clock time when a certificate arrives.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rand::Rng;
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::ca::{CaError, CertSigner};
use crate::cert::{CertEntry, WorkloadCertificate};
use crate::{Identity, csr};

/// At most this many CA calls run at once.
const MAX_CONCURRENT: usize = 8;
/// First retry delay after a failure.
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(150);
/// Never renew sooner than this after a successful fetch, whatever the certificate says.
const MIN_REFRESH: Duration = Duration::from_secs(1);

/// Urgency of a certificate request; `RealTime` is the most urgent and sorts first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// A connection is waiting for the certificate.
    RealTime,
    /// A local workload will soon need it (prefetch).
    Warmup,
    /// Rotation of a certificate that is still valid.
    Background,
}

/// Why [`CertManager::fetch`] returned no certificate.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CertError {
    /// The last CA request failed and no valid certificate is left; a retry is scheduled.
    #[error("no certificate for {identity}: {error}")]
    Unavailable {
        /// The identity.
        identity: Identity,
        /// The last CA error.
        error: Arc<CaError>,
    },
    /// The identity was forgotten while the request waited.
    #[error("certificate request for {0} was cancelled: no local workload uses this identity any more")]
    Forgotten(Identity),
}

/// One identity's state for `/config_dump`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertStateDump {
    /// The SPIFFE identity.
    pub identity: String,
    /// `Initializing`, `Available` or `Unavailable: <error>`.
    pub state: String,
    /// Leaf then intermediates of the current certificate, if any.
    pub cert_chain: Vec<CertEntry>,
    /// Roots of the current certificate, if any.
    pub root_certs: Vec<CertEntry>,
}

/// Keeps one certificate per identity: caches, renews at half-life, fetches by priority with backoff.
pub struct CertManager {
    inner: Arc<Inner>,
    worker: tokio::task::JoinHandle<()>,
}

impl CertManager {
    /// Creates the manager and spawns its worker on the current tokio runtime.
    pub fn new(signer: Arc<dyn CertSigner>, ttl: Duration) -> Arc<Self> {
        let inner = Arc::new(Inner { signer, ttl, state: Mutex::new(State::default()), wake: Notify::new() });
        let worker = tokio::spawn(inner.clone().run());
        Arc::new(CertManager { inner, worker })
    }

    /// The certificate for `id`, fetching it with RealTime priority (waiting if one is in flight).
    pub async fn fetch(&self, id: &Identity) -> Result<Arc<WorkloadCertificate>, CertError> {
        loop {
            let mut changed = {
                let mut state = self.inner.lock();
                let now = Instant::now();
                let entry = state.entry(id);
                if let Some(cert) = entry.valid_cert(now) {
                    return Ok(cert);
                }
                if let Status::Unavailable(error) = &entry.status {
                    return Err(CertError::Unavailable { identity: id.clone(), error: error.clone() });
                }
                if !entry.in_flight {
                    entry.request(Priority::RealTime, now);
                    self.inner.wake.notify_one();
                }
                entry.changed.subscribe()
            };
            if changed.changed().await.is_err() {
                return Err(CertError::Forgotten(id.clone()));
            }
        }
    }

    /// Starts fetching the certificate for `id` with Warmup priority unless it is known already.
    pub fn prefetch(&self, id: &Identity) {
        let mut state = self.inner.lock();
        let now = Instant::now();
        if !state.entries.contains_key(id) {
            state.entry(id).request(Priority::Warmup, now);
            self.inner.wake.notify_one();
        } else if let Some(entry) = state.entries.get_mut(id)
            && let Some(pending) = &mut entry.pending
        {
            pending.priority = pending.priority.min(Priority::Warmup);
        }
    }

    /// Drops the certificate of `id`; a request in flight is discarded and waiters get an error.
    pub fn forget(&self, id: &Identity) {
        self.inner.lock().entries.remove(id);
    }

    /// Every identity's state, sorted by identity.
    pub fn dump(&self) -> Vec<CertStateDump> {
        let state = self.inner.lock();
        let mut out: Vec<CertStateDump> = state
            .entries
            .iter()
            .map(|(id, entry)| {
                let dump = entry.cert.as_ref().map(|c| c.cert.dump()).unwrap_or_default();
                CertStateDump {
                    identity: id.to_string(),
                    state: match &entry.status {
                        Status::Initializing => "Initializing".to_owned(),
                        Status::Available => "Available".to_owned(),
                        Status::Unavailable(e) => format!("Unavailable: {e}"),
                    },
                    cert_chain: dump.cert_chain,
                    root_certs: dump.root_certs,
                }
            })
            .collect();
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        out
    }
}

impl Drop for CertManager {
    fn drop(&mut self) {
        self.worker.abort();
    }
}

struct Inner {
    signer: Arc<dyn CertSigner>,
    ttl: Duration,
    state: Mutex<State>,
    /// Wakes the worker: new request, finished call.
    wake: Notify,
}

#[derive(Default)]
struct State {
    entries: HashMap<Identity, Entry>,
    in_flight: usize,
    next_generation: u64,
}

struct Entry {
    /// Distinguishes this entry from one re-created after `forget`.
    generation: u64,
    status: Status,
    cert: Option<Current>,
    pending: Option<Pending>,
    in_flight: bool,
    backoff: Backoff,
    /// Signalled after every finished call; dropped (waking waiters with an error) on forget.
    changed: watch::Sender<()>,
}

enum Status {
    Initializing,
    Available,
    Unavailable(Arc<CaError>),
}

struct Current {
    cert: Arc<WorkloadCertificate>,
    valid_until: Instant,
}

#[derive(Clone, Copy)]
struct Pending {
    priority: Priority,
    due: Instant,
}

struct Backoff {
    next: Duration,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the map half-updated in a way that
        // matters more than stopping certificate handling altogether, so keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn run(self: Arc<Self>) {
        loop {
            match self.dispatch() {
                Some(due) => {
                    tokio::select! {
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// Starts every due request that fits; returns when the next queued one becomes due.
    fn dispatch(self: &Arc<Self>) -> Option<Instant> {
        let mut state = self.lock();
        let now = Instant::now();
        while state.in_flight < MAX_CONCURRENT {
            let next = state
                .entries
                .iter()
                .filter(|(_, e)| !e.in_flight)
                .filter_map(|(id, e)| e.pending.filter(|p| p.due <= now).map(|p| (id, p)))
                .min_by_key(|(_, p)| (p.priority, p.due))
                .map(|(id, p)| (id.clone(), p.priority));
            let Some((id, priority)) = next else { break };
            let Some(entry) = state.entries.get_mut(&id) else {
                break;
            };
            entry.pending = None;
            entry.in_flight = true;
            let generation = entry.generation;
            state.in_flight += 1;
            tracing::debug!(identity = %id, ?priority, "requesting certificate");
            tokio::spawn(self.clone().fetch_one(id, generation, priority));
        }
        if state.in_flight >= MAX_CONCURRENT {
            return None;
        }
        state.entries.values().filter(|e| !e.in_flight).filter_map(|e| e.pending.map(|p| p.due)).min()
    }

    async fn fetch_one(self: Arc<Self>, id: Identity, generation: u64, priority: Priority) {
        let result = self.issue(&id).await;
        let mut state = self.lock();
        state.in_flight -= 1;
        self.wake.notify_one();
        let Some(entry) = state.entries.get_mut(&id) else {
            return;
        };
        if entry.generation != generation {
            return;
        }
        entry.in_flight = false;
        let now = Instant::now();
        match result {
            Ok((cert, valid_until, refresh_at)) => {
                tracing::info!(identity = %id, "certificate issued");
                entry.backoff = Backoff::new();
                entry.status = Status::Available;
                entry.cert = Some(Current { cert: Arc::new(cert), valid_until });
                entry.pending = Some(Pending { priority: Priority::Background, due: refresh_at });
            }
            Err(error) => {
                let error = Arc::new(error);
                let mut due = now + entry.backoff.next_delay();
                match entry.cert.as_ref().filter(|c| c.valid_until > now) {
                    Some(current) => due = due.min(current.valid_until),
                    None => entry.status = Status::Unavailable(error.clone()),
                }
                tracing::warn!(identity = %id, retry_in = ?due - now, "certificate request failed: {error}");
                entry.pending = Some(Pending { priority, due });
            }
        }
        entry.changed.send_replace(());
    }

    /// Key, CSR, CA call; returns the certificate, when it expires and when to renew it.
    async fn issue(&self, id: &Identity) -> Result<(WorkloadCertificate, Instant, Instant), CaError> {
        let csr = csr::generate(id)?;
        let chain = self.signer.sign(csr.pem, id, self.ttl).await?;
        let cert = WorkloadCertificate::new(csr.key, &chain)?;
        let (now, wall) = (Instant::now(), SystemTime::now());
        let until = |t: SystemTime| t.duration_since(wall).unwrap_or_default();
        let remaining = until(cert.not_after());
        if remaining.is_zero() {
            return Err(crate::cert::CertificateError::Expired.into());
        }
        let half = cert.not_after().duration_since(cert.not_before()).unwrap_or_default() / 2;
        let refresh = until(cert.not_before() + half).max(MIN_REFRESH);
        Ok((cert, now + remaining, now + refresh))
    }
}

impl State {
    fn entry(&mut self, id: &Identity) -> &mut Entry {
        match self.entries.entry(id.clone()) {
            MapEntry::Occupied(e) => e.into_mut(),
            MapEntry::Vacant(e) => {
                self.next_generation += 1;
                e.insert(Entry {
                    generation: self.next_generation,
                    status: Status::Initializing,
                    cert: None,
                    pending: None,
                    in_flight: false,
                    backoff: Backoff::new(),
                    changed: watch::Sender::new(()),
                })
            }
        }
    }
}

impl Entry {
    fn valid_cert(&self, now: Instant) -> Option<Arc<WorkloadCertificate>> {
        self.cert.as_ref().filter(|c| c.valid_until > now).map(|c| c.cert.clone())
    }

    /// Queues a request, or makes the queued one at least this urgent and this early.
    fn request(&mut self, priority: Priority, due: Instant) {
        self.pending = Some(match self.pending {
            None => Pending { priority, due },
            Some(p) => Pending { priority: p.priority.min(priority), due: p.due.min(due) },
        });
    }
}

impl Backoff {
    fn new() -> Self {
        Backoff { next: BACKOFF_INITIAL }
    }

    /// The delay before the next retry: current interval ±20 %, then the interval doubles.
    fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(BACKOFF_MAX);
        let jitter: f64 = rand::rng().random_range(0.8..=1.2);
        base.mul_f64(jitter).min(BACKOFF_MAX)
    }
}

#[cfg(test)]
mod tests;
