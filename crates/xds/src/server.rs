//! The delta ADS server: the owner publishes resources, every stream gets what it subscribed to.
//!
//! [`Resources`] is the owner's published set, per type URL, in the order the types were
//! registered (responses follow that order: Address before Authorization). [`AdsServer`]
//! implements the generated `AggregatedDiscoveryService` trait, so the owner mounts it on its own
//! tonic `Server` (with TLS or not). Per stream it follows istiod (`control-plane.md` §5.1–§5.3)
//! for a generic type.
//!
//! Bounded: a publish only marks names dirty. A debouncer merges those marks and, after
//! `debounce_after` of quiet (or `debounce_max` after the first), hands each stream the set of
//! changed names; the stream builds its push from the current state when it can send. At most
//! one response per stream is queued (the next waits until the client reads), so a client that
//! never reads makes the server hold one response and a set of distinct names, never a queue of
//! copies. Streams are capped at [`ServerConfig::max_streams`].
//!
//! Admission, in istiod's order: readiness ([`AdsServer::set_ready`]), the stream cap, the
//! new-stream rate limit ([`ServerConfig::new_streams_per_second`]), the owner's asynchronous
//! [`Authenticate`] hook (its [`Principal`] is kept for the stream), and on the first request a
//! node with an id and the owner's [`Authorize`] hook ([`istio::NodeCheck`] is istiod's).
//!
//! Scoped types ([`Resources::with_scoped`]): a resource of such a type is visible only to the
//! streams whose scope (from [`Authorize::scope`], derived from the peer's proven identity)
//! equals its name's first two `/`-separated segments ([`scope_of`]); a stream without a scope
//! sees none of them, and a removal is only sent where the resource was visible. Ambit uses
//! this to hand each waypoint only its own Gateway's configuration.
//!
//! Metrics ([`ServerMetrics`], handed over in [`Hooks::metrics`]) are istiod's: connected
//! streams, responses, NACKs, push time and convergence time, counted where each happens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryService;
use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use ambit_identity::Identity;
use serde::Serialize;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::BoxFuture;

pub mod istio;
mod metrics;
mod resources;
mod stream;

use stream::{on_request, push};

use metrics::{Connected, TypeMetrics};
pub use metrics::{MAX_VERSION_LEN, MAX_VERSIONS, OTHER_VERSION, RefusalReason, ServerMetrics, metric_type};
pub use resources::{Changes, PublishError, Resources, ServerResource, scope_of};
use resources::{Dirty, Entry, Inbox, Pending, TypeSet};

/// Who the authenticator says the peer is, kept for the stream's life and handed to the
/// [`Authorize`] hook on the stream's first request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// The peer as the authenticator names it (for logs and status: a SPIFFE id, a token's
    /// subject, "node token for node-1").
    pub name: String,
    /// The SPIFFE identities the peer proved (a certificate's URI SANs, the service account a
    /// reviewed token belongs to); what an authorizer matches the node against.
    #[serde(serialize_with = "display_all")]
    pub identities: Vec<Identity>,
}

/// Authenticates a stream from its metadata and peer certificates (in the request's extensions)
/// before anything is read from it.
///
/// Asynchronous because authentication may be a network call (a Kubernetes `TokenReview`); a
/// stream whose authentication takes longer than [`ServerConfig::authenticate_timeout`] is
/// refused with `Unavailable`, and other streams are served meanwhile.
pub trait Authenticate: Send + Sync {
    /// `Err` ends the stream with that status (e.g. `Unauthenticated` "authentication failure").
    fn authenticate<'a>(&'a self, req: &'a Request<()>) -> BoxFuture<'a, Result<Principal, Status>>;
}

/// Validates a stream's node and authorizes its principal for it, once, on the stream's first
/// request (after the server checked that the node and its id are present).
///
/// Synchronous: it decides on what is in hand (the node the client sent and the principal
/// [`Authenticate`] returned); anything that needs the network belongs in the authenticator.
/// [`istio::NodeCheck`] is istiod's rule set.
pub trait Authorize: Send + Sync {
    /// `principal` is `None` when the server has no authenticator (e.g. a plaintext port).
    /// `Err` ends the stream with that status (istiod: `InvalidArgument` for a malformed node,
    /// `PermissionDenied` "authorization failed: …" for an identity that does not match it).
    fn authorize(&self, principal: Option<&Principal>, node: &Node) -> Result<(), Status>;

    /// The stream's scope, asked once after [`Authorize::authorize`] accepted it: which
    /// resources of the scoped types ([`Resources::with_scoped`]) it receives. Derive it from
    /// what the peer proved (`principal`), never from the node alone. Default: none, so the
    /// stream receives no scoped resource.
    fn scope(&self, principal: Option<&Principal>, node: &Node) -> Option<String> {
        let _ = (principal, node);
        None
    }
}

/// The owner's hooks into the server: admission checks (none by default: anonymous and
/// unchecked) and where it counts (by default metrics registered nowhere).
#[derive(Clone, Default)]
pub struct Hooks {
    /// Asked once per stream, before its first request is read.
    pub authenticate: Option<Arc<dyn Authenticate>>,
    /// Asked once per stream, on its first request.
    pub authorize: Option<Arc<dyn Authorize>>,
    /// The metrics the server records into ([`ServerMetrics::register`] puts them on the
    /// owner's registry).
    pub metrics: ServerMetrics,
}

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Push once no change arrived for this long...
    pub debounce_after: Duration,
    /// ...or this long after the first change of a burst.
    pub debounce_max: Duration,
    /// Streams served at once; more are refused with `ResourceExhausted`.
    pub max_streams: usize,
    /// Names one stream may subscribe to (all types together); a request that goes past it
    /// ends the stream with `ResourceExhausted`. (The size of one request is bounded by the
    /// tonic server's decoding limit, which the owner sets.)
    pub max_subscribed_names: usize,
    /// New streams accepted per second (istiod's `PILOT_MAX_REQUESTS_PER_SECOND`; default
    /// min(15 + 5 × cores, 100)); 0 accepts without limit. One stream may start every
    /// 1/rate seconds; a stream that would have to wait longer than `new_stream_max_wait` for
    /// its turn is refused with `ResourceExhausted`, so a reconnect storm is spread out and
    /// what waits is bounded by rate × wait.
    pub new_streams_per_second: u32,
    /// How long a new stream may wait for its turn under the rate limit (istiod: 1 s).
    pub new_stream_max_wait: Duration,
    /// A stream whose authentication did not finish within this is refused with
    /// `Unavailable` (a hung `TokenReview` must not hold a stream slot forever).
    pub authenticate_timeout: Duration,
    /// Whether the server serves from the start; an owner whose state comes from a sync sets
    /// `false` and calls [`AdsServer::set_ready`] once synced, so no proxy is handed an empty
    /// state that would wipe what it holds.
    pub ready: bool,
    /// A response larger than this is sent in parts ([`crate::parts`]), each at most this large
    /// (or one resource, if a single one is larger). Default 64 MiB: a third of the 200 MiB
    /// decoding limit of ztunnel's and Ambit's clients.
    pub max_response_bytes: usize,
}

/// [`ServerConfig::max_response_bytes`]'s default.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

impl Default for ServerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Self {
            debounce_after: Duration::from_millis(100),
            debounce_max: Duration::from_secs(10),
            max_streams: 100_000,
            max_subscribed_names: 1_000_000,
            new_streams_per_second: u32::try_from(cores.saturating_mul(5).saturating_add(15))
                .unwrap_or(u32::MAX)
                .min(100),
            new_stream_max_wait: Duration::from_secs(1),
            authenticate_timeout: Duration::from_secs(10),
            ready: true,
            max_response_bytes: MAX_RESPONSE_BYTES,
        }
    }
}

/// One stream's state, for tests and debug endpoints.
#[derive(Clone, Debug, Serialize)]
pub struct StreamStatus {
    /// The server's id of the stream.
    pub id: u64,
    /// `node.id` of its first request (empty until then).
    pub node_id: String,
    /// The `NODE_NAME` metadata of its first request: the node whose node-local resources an
    /// on-demand subscription receives unrequested.
    pub node_name: Option<String>,
    /// What the authenticator returned.
    pub principal: Option<Principal>,
    /// The scope [`Authorize::scope`] gave it (which scoped resources it receives).
    pub scope: Option<String>,
    /// Changed names waiting to be pushed (bounded by the distinct names changed).
    pub pending_names: usize,
    /// One entry per type the client subscribed to, in registration order.
    pub types: Vec<StreamTypeStatus>,
}

/// One type's subscription on a stream.
#[derive(Clone, Debug, Serialize)]
pub struct StreamTypeStatus {
    /// The type URL.
    pub type_url: String,
    /// Whether the client subscribed to everything.
    pub wildcard: bool,
    /// Names subscribed (sorted; empty for wildcard).
    pub subscriptions: Vec<String>,
    /// Responses sent.
    pub responses: u64,
    /// Nonce of the last response sent.
    pub last_nonce: String,
    /// The last ACKed nonces, oldest first (at most [`STATUS_HISTORY`]).
    pub acked_nonces: Vec<String>,
    /// The last NACKs, oldest first (at most [`STATUS_HISTORY`]).
    pub nacks: Vec<ServerNack>,
}

/// A NACK a client sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServerNack {
    /// The nonce it rejected.
    pub nonce: String,
    /// Its `error_detail.message`.
    pub message: String,
}

/// ACKed nonces and NACKs kept per stream and type.
pub const STATUS_HISTORY: usize = 16;

/// The delta ADS service (cheap to clone; clones share streams and status).
#[derive(Clone)]
pub struct AdsServer {
    inner: Arc<ServerInner>,
}

struct ServerInner {
    resources: Resources,
    cfg: ServerConfig,
    hooks: Hooks,
    /// `hooks.metrics` per type index.
    type_metrics: Vec<TypeMetrics>,
    ready: AtomicBool,
    rate: RateLimit,
    inbox: Arc<Inbox>,
    streams: Mutex<HashMap<u64, Arc<StreamShared>>>,
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
    debouncer: OnceLock<()>,
}

struct StreamShared {
    dirty: Mutex<Pending>,
    wake: Notify,
    state: Mutex<StreamState>,
}

struct StreamState {
    id: u64,
    node_id: Option<String>,
    node_name: Option<String>,
    principal: Option<Principal>,
    scope: Option<String>,
    subs: Vec<Option<Sub>>,
    counter: u64,
}

struct Sub {
    wildcard: bool,
    /// The snapshot version of the last response that sent everything (wildcard).
    base: u64,
    /// Subscribed names (not wildcard), each with the snapshot version it was last resolved at.
    names: HashMap<String, u64>,
    responses: u64,
    /// The nonces of the last response's parts ([`crate::parts`]; one unless it was split):
    /// an ACK or NACK of any of them is current.
    in_flight: Vec<String>,
    acked: Vec<String>,
    nacks: Vec<ServerNack>,
}

impl AdsServer {
    /// Serves `resources`, admitting streams through `hooks`.
    pub fn new(resources: Resources, cfg: ServerConfig, hooks: Hooks) -> Self {
        let width = resources.inner.types.len();
        let inbox = Arc::new(Inbox { dirty: Mutex::new(Pending::new(width)), wake: Notify::new() });
        lock(&resources.inner.inboxes).push(Arc::downgrade(&inbox));
        let slots = Arc::new(Semaphore::new(cfg.max_streams));
        let type_metrics = resources.inner.types.iter().map(|t| hooks.metrics.for_type(t)).collect();
        Self {
            inner: Arc::new(ServerInner {
                resources,
                type_metrics,
                ready: AtomicBool::new(cfg.ready),
                rate: RateLimit::new(cfg.new_streams_per_second, cfg.new_stream_max_wait),
                cfg,
                hooks,
                inbox,
                streams: Mutex::new(HashMap::new()),
                slots,
                next_id: AtomicU64::new(1),
                debouncer: OnceLock::new(),
            }),
        }
    }

    /// Opens (or closes) the server to new streams; while not ready each new stream is refused
    /// with `Unavailable` "server is not ready to serve discovery information". Open streams
    /// are not affected.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }

    /// Whether new streams are served.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    /// Every open stream's state, by stream id.
    pub fn status(&self) -> Vec<StreamStatus> {
        let streams: Vec<_> = lock(&self.inner.streams).values().cloned().collect();
        let types = &self.inner.resources.inner.types;
        let mut out: Vec<StreamStatus> = streams
            .iter()
            .map(|s| {
                let pending_names = lock(&s.dirty).names.iter().map(HashMap::len).sum();
                let st = lock(&s.state);
                StreamStatus {
                    id: st.id,
                    node_id: st.node_id.clone().unwrap_or_default(),
                    node_name: st.node_name.clone(),
                    principal: st.principal.clone(),
                    scope: st.scope.clone(),
                    pending_names,
                    types: st
                        .subs
                        .iter()
                        .zip(types)
                        .filter_map(|(sub, url)| {
                            let sub = sub.as_ref()?;
                            let mut subscriptions: Vec<String> = sub.names.keys().cloned().collect();
                            subscriptions.sort();
                            Some(StreamTypeStatus {
                                type_url: url.clone(),
                                wildcard: sub.wildcard,
                                subscriptions,
                                responses: sub.responses,
                                last_nonce: sub.in_flight.last().cloned().unwrap_or_default(),
                                acked_nonces: sub.acked.clone(),
                                nacks: sub.nacks.clone(),
                            })
                        })
                        .collect(),
                }
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }

    fn start_debouncer(&self) {
        self.inner.debouncer.get_or_init(|| {
            tokio::spawn(debounce(Arc::downgrade(&self.inner), self.inner.inbox.clone()));
        });
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let metrics = &self.inner.hooks.metrics;
        if !self.is_ready() {
            debug!(peer = ?request.remote_addr(), "xDS stream refused: not ready");
            metrics.refused(RefusalReason::NotReady);
            return Err(Status::unavailable("server is not ready to serve discovery information"));
        }
        let Ok(slot) = self.inner.slots.clone().try_acquire_owned() else {
            metrics.refused(RefusalReason::TooManyStreams);
            return Err(Status::resource_exhausted(format!(
                "this xDS server already serves {} streams; retry later",
                self.inner.cfg.max_streams
            )));
        };
        match self.inner.rate.reserve() {
            Some(wait) if !wait.is_zero() => tokio::time::sleep(wait).await,
            Some(_) => {}
            None => {
                // Debug: a reconnect storm refuses many streams, one line each would flood the log.
                debug!(peer = ?request.remote_addr(), "xDS stream refused: new-stream rate limit exceeded");
                metrics.refused(RefusalReason::RateLimited);
                return Err(Status::resource_exhausted(format!(
                    "request rate limit exceeded: this xDS server accepts {} new streams per second; retry later",
                    self.inner.cfg.new_streams_per_second
                )));
            }
        }
        let (metadata, extensions, incoming) = request.into_parts();
        let probe = Request::from_parts(metadata, extensions, ());
        let principal = match &self.inner.hooks.authenticate {
            Some(auth) => {
                let limit = self.inner.cfg.authenticate_timeout;
                match tokio::time::timeout(limit, auth.authenticate(&probe)).await {
                    Ok(Ok(p)) => Some(p),
                    Ok(Err(status)) => {
                        info!(peer = ?probe.remote_addr(), "xDS stream refused: {status}");
                        metrics.refused(RefusalReason::Unauthenticated);
                        return Err(status);
                    }
                    Err(_) => {
                        warn!(peer = ?probe.remote_addr(), "xDS stream refused: authentication took longer than {limit:?}");
                        metrics.refused(RefusalReason::AuthenticationTimeout);
                        return Err(Status::unavailable(format!(
                            "authentication did not finish within {limit:?}; retry later"
                        )));
                    }
                }
            }
            None => None,
        };
        self.start_debouncer();
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let width = self.inner.resources.inner.types.len();
        let shared = Arc::new(StreamShared {
            dirty: Mutex::new(Pending::new(width)),
            wake: Notify::new(),
            state: Mutex::new(StreamState {
                id,
                node_id: None,
                node_name: None,
                principal,
                scope: None,
                subs: (0..width).map(|_| None).collect(),
                counter: 0,
            }),
        });
        lock(&self.inner.streams).insert(id, shared.clone());
        let (tx, rx) = mpsc::channel(1);
        let server = self.inner.clone();
        tokio::spawn(async move {
            let _slot = slot;
            serve_stream(&server, &shared, incoming, tx).await;
            lock(&server.streams).remove(&id);
            debug!(stream = id, "xDS stream closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Tx = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

async fn serve_stream(
    server: &ServerInner,
    shared: &StreamShared,
    mut incoming: Streaming<DeltaDiscoveryRequest>,
    tx: Tx,
) {
    // Counted in `pilot_xds` from admission until the stream ends.
    let mut connected: Option<Connected> = None;
    loop {
        // The responses by type index, when building them started, and for a push when its
        // first change was published.
        let (responses, started, since) = tokio::select! {
            req = incoming.message() => match req {
                Ok(Some(req)) => {
                    let started = Instant::now();
                    if connected.is_none() {
                        match admit(server, shared, &req) {
                            Ok(c) => connected = Some(c),
                            Err(status) => {
                                let _ = tx.send(Err(status)).await;
                                return;
                            }
                        }
                    }
                    match on_request(server, shared, req) {
                        Ok(r) => (r, started, None),
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                    }
                }
                Ok(None) => return,
                Err(status) => {
                    debug!("xDS stream read failed: {status}");
                    return;
                }
            },
            () = shared.wake.notified() => {
                let started = Instant::now();
                let pending = lock(&shared.dirty).take();
                (push(server, shared, &pending.names), started, pending.since)
            },
            () = tx.closed() => return,
        };
        let build = started.elapsed();
        let mut sent = false;
        for (ti, r) in responses {
            let count = r.resources.len();
            let bytes = r.resources.iter().filter_map(|x| x.resource.as_ref()).map(|a| a.value.len()).sum();
            let handing = Instant::now();
            // One response queued at a time: a client that does not read stalls only itself.
            if tx.send(Ok(r)).await.is_err() {
                return;
            }
            // Its build plus its own wait for the stream, not the wait for the types before it.
            server.type_metrics[ti].sent(count, bytes, build + handing.elapsed());
            sent = true;
        }
        if sent && let Some(since) = since {
            server.hooks.metrics.converged(since.elapsed());
        }
    }
}

/// The first request's checks (istiod's `initConnection`): a node with an id, then the owner's
/// [`Authorize`] hook on it and the stream's principal. Records the node on the stream, and
/// counts the stream as connected from here on.
fn admit(
    server: &ServerInner,
    shared: &StreamShared,
    req: &DeltaDiscoveryRequest,
) -> Result<Connected, Status> {
    let metrics = &server.hooks.metrics;
    let node = match &req.node {
        Some(node) if !node.id.is_empty() => node,
        _ => {
            metrics.refused(RefusalReason::MissingNode);
            return Err(Status::invalid_argument("missing node information"));
        }
    };
    let mut st = lock(&shared.state);
    if let Some(authorize) = &server.hooks.authorize
        && let Err(status) = authorize.authorize(st.principal.as_ref(), node)
    {
        warn!(
            stream = st.id,
            node = %node.id,
            principal = st.principal.as_ref().map(|p| p.name.as_str()),
            "xDS stream refused: {status}"
        );
        metrics.refused(RefusalReason::Unauthorized);
        return Err(status);
    }
    st.node_id = Some(node.id.clone());
    st.node_name = metadata_string(node, NODE_NAME).map(str::to_owned);
    st.scope = server.hooks.authorize.as_ref().and_then(|a| a.scope(st.principal.as_ref(), node));
    debug!(stream = st.id, node = %node.id, node_name = ?st.node_name, scope = ?st.scope, "xDS stream admitted");
    Ok(metrics.connected(metadata_string(node, ISTIO_VERSION)))
}

/// The node metadata key carrying the proxy's Istio version (the `version` label of `pilot_xds`).
pub const ISTIO_VERSION: &str = "ISTIO_VERSION";

/// The node metadata key naming the node a proxy runs on (node-proxy.md §1.4).
pub const NODE_NAME: &str = "NODE_NAME";

/// A string value of `node.metadata` (non-string values count as absent, as istiod reads them).
pub fn metadata_string<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    match node.metadata.as_ref()?.fields.get(key)?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(s) => Some(s.as_str()),
        _ => None,
    }
}

/// Merges publishes: waits for a first change, then for `debounce_after` of quiet or
/// `debounce_max` after the first, and hands the merged names to every stream.
async fn debounce(server: Weak<ServerInner>, inbox: Arc<Inbox>) {
    loop {
        inbox.wake.notified().await;
        let Some((after, max)) = server.upgrade().map(|s| (s.cfg.debounce_after, s.cfg.debounce_max)) else {
            return;
        };
        let first = Instant::now();
        let mut last = first;
        // A zero debounce pushes at once (a timer would round up to the next millisecond tick).
        while !after.is_zero() {
            let deadline = (last + after).min(first + max);
            tokio::select! {
                () = inbox.wake.notified() => last = Instant::now(),
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let batch = lock(&inbox.dirty).take();
        let Some(server) = server.upgrade() else { return };
        let streams: Vec<_> = lock(&server.streams).values().cloned().collect();
        for s in streams {
            lock(&s.dirty).merge(&batch.names, batch.since);
            s.wake.notify_one();
        }
    }
}

fn merge(into: &mut Dirty, from: &Dirty) {
    for (into, from) in into.iter_mut().zip(from) {
        for (name, v) in from {
            let e = into.entry(name.clone()).or_insert(*v);
            *e = (*e).max(*v);
        }
    }
}

fn keep_last<T>(v: &mut Vec<T>, item: T) {
    if v.len() >= STATUS_HISTORY {
        v.remove(0);
    }
    v.push(item);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serializes identities by their `spiffe://` form.
fn display_all<S: serde::Serializer>(ids: &[Identity], ser: S) -> Result<S::Ok, S::Error> {
    ser.collect_seq(ids.iter().map(ToString::to_string))
}

/// istiod's new-stream limiter (`golang.org/x/time/rate` with a burst of one, waited on for a
/// bounded time): one stream every `interval`; a stream whose turn is further away than
/// `max_wait` is refused without taking a turn.
struct RateLimit {
    interval: Option<Duration>,
    max_wait: Duration,
    next: Mutex<Option<Instant>>,
}

impl RateLimit {
    fn new(per_second: u32, max_wait: Duration) -> Self {
        let interval = (per_second > 0).then(|| Duration::from_secs(1) / per_second);
        Self { interval, max_wait, next: Mutex::new(None) }
    }

    /// How long the caller must wait for its turn (which it has taken), or `None` when that is
    /// longer than `max_wait`.
    fn reserve(&self) -> Option<Duration> {
        let Some(interval) = self.interval else { return Some(Duration::ZERO) };
        let now = Instant::now();
        let mut next = lock(&self.next);
        let turn = next.map_or(now, |n| n.max(now));
        let wait = turn - now;
        if wait > self.max_wait {
            return None;
        }
        *next = Some(turn + interval);
        Some(wait)
    }
}
