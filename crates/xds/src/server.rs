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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryService;
use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Resource};
use ambit_identity::Identity;
use serde::Serialize;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::{BoxFuture, resource_version};

pub mod istio;
mod metrics;

use metrics::{Connected, TypeMetrics};
pub use metrics::{MAX_VERSION_LEN, MAX_VERSIONS, OTHER_VERSION, RefusalReason, ServerMetrics, metric_type};

/// One resource the owner publishes.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerResource {
    /// Its name (unique within its type).
    pub name: String,
    /// Other names it answers to for named/on-demand subscribers (e.g. `<network>/<ip>`).
    pub aliases: Vec<String>,
    /// The payload.
    pub resource: prost_types::Any,
    /// Names sent along when this resource is sent to a named/on-demand subscriber (a Service
    /// brings its workloads); they join that subscription. A publish that changes only this
    /// list pushes nothing: the next subscriber gets the new list.
    pub also: Vec<String>,
    /// The node it lives on (a workload's `node`): an on-demand stream whose node metadata
    /// `NODE_NAME` names this node receives it unrequested, on its first response and on
    /// pushes, and it joins that subscription (control-plane.md §5.3). Wildcard streams get
    /// everything anyway.
    pub node: Option<String>,
}

/// Changes to one type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// The type URL (registered with [`Resources::new`]).
    pub type_url: String,
    /// Added or replaced resources.
    pub upserts: Vec<ServerResource>,
    /// Names removed.
    pub removals: Vec<String>,
}

/// Why a publish was refused (nothing of it was applied).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PublishError {
    /// The type was not registered.
    #[error("type {0} was not registered with Resources::new")]
    UnknownType(String),
}

/// The owner's published set (cheap to clone; clones share it).
#[derive(Clone)]
pub struct Resources {
    inner: Arc<ResourcesInner>,
}

struct ResourcesInner {
    types: Vec<String>,
    state: RwLock<Snapshot>,
    /// Debouncers of the servers serving this set.
    inboxes: Mutex<Vec<Weak<Inbox>>>,
}

struct Snapshot {
    version: u64,
    sets: Vec<TypeSet>,
}

#[derive(Default)]
struct TypeSet {
    /// Whether names are scoped ([`scope_of`]).
    scoped: bool,
    by_name: HashMap<String, Entry>,
    by_alias: HashMap<String, String>,
    /// Names of the resources on each node.
    by_node: HashMap<String, HashSet<String>>,
}

impl TypeSet {
    /// Whether the resource `name` may be shown to a stream with `scope`.
    fn visible(&self, name: &str, scope: Option<&str>) -> bool {
        !self.scoped || (scope.is_some() && scope_of(name) == scope)
    }

    /// Drops `res`'s aliases and node entry (those that still point at it).
    fn unindex(&mut self, res: &ServerResource) {
        for a in &res.aliases {
            if self.by_alias.get(a) == Some(&res.name) {
                self.by_alias.remove(a);
            }
        }
        if let Some(node) = &res.node
            && let Some(names) = self.by_node.get_mut(node)
        {
            names.remove(&res.name);
            if names.is_empty() {
                self.by_node.remove(node);
            }
        }
    }

    /// The names on `node` that `sub` does not hold and `also_asked` does not name.
    fn node_local(
        &self,
        node: Option<&str>,
        sub: &Sub,
        also_asked: &[String],
        scope: Option<&str>,
    ) -> Vec<String> {
        let Some(names) = node.and_then(|n| self.by_node.get(n)) else { return Vec::new() };
        let mut out: Vec<String> = names
            .iter()
            .filter(|n| !sub.names.contains_key(*n) && !also_asked.contains(n) && self.visible(n, scope))
            .cloned()
            .collect();
        out.sort();
        out
    }

    /// Whether the resource `name` lives on `node`.
    fn is_on(&self, name: &str, node: Option<&str>) -> bool {
        node.is_some_and(|node| self.by_name.get(name).and_then(|e| e.res.node.as_deref()) == Some(node))
    }
}

struct Entry {
    res: ServerResource,
    version: String,
}

/// Changed names per type index, each with the version of its latest change, merged until
/// they are pushed.
type Dirty = Vec<HashMap<String, u64>>;

/// Changes waiting to be pushed, and when the first of them was published.
struct Pending {
    names: Dirty,
    since: Option<Instant>,
}

impl Pending {
    fn new(width: usize) -> Self {
        Self { names: vec![HashMap::new(); width], since: None }
    }

    /// Adds `names` changed at `since` (the earliest publish wins).
    fn merge(&mut self, names: &Dirty, since: Option<Instant>) {
        merge(&mut self.names, names);
        self.since = match (self.since, since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Takes everything, leaving the set empty.
    fn take(&mut self) -> Self {
        let width = self.names.len();
        std::mem::replace(self, Self::new(width))
    }
}

struct Inbox {
    dirty: Mutex<Pending>,
    wake: Notify,
}

/// The scope of a resource name of a scoped type: its first two `/`-separated segments
/// (`ns/wp` of `ns/wp/ns/reviews.ns.svc.cluster.local`); `None` when it has fewer than three.
pub fn scope_of(name: &str) -> Option<&str> {
    let first = name.find('/')?;
    let second = first + 1 + name[first + 1..].find('/')?;
    Some(&name[..second])
}

impl Resources {
    /// An empty set serving `type_urls`, in this order.
    pub fn new<S: Into<String>>(type_urls: impl IntoIterator<Item = S>) -> Self {
        Self::with_scoped(type_urls, Vec::<String>::new())
    }

    /// An empty set serving `type_urls`, in this order, of which those in `scoped` are scoped:
    /// each of their resources is visible only to streams whose [`Authorize::scope`] equals
    /// [`scope_of`] its name.
    pub fn with_scoped<S: Into<String>, T: AsRef<str>>(
        type_urls: impl IntoIterator<Item = S>,
        scoped: impl IntoIterator<Item = T>,
    ) -> Self {
        let types: Vec<String> = type_urls.into_iter().map(Into::into).collect();
        let scoped_urls: Vec<T> = scoped.into_iter().collect();
        let scoped: Vec<bool> = types.iter().map(|t| scoped_urls.iter().any(|s| s.as_ref() == t)).collect();
        let sets = scoped.iter().map(|s| TypeSet { scoped: *s, ..TypeSet::default() }).collect();
        Self {
            inner: Arc::new(ResourcesInner {
                types,
                state: RwLock::new(Snapshot { version: 0, sets }),
                inboxes: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Applies `changes` (all or none), bumps the version if anything changed and wakes the
    /// servers' debouncers. A resource whose payload, aliases, `also` and node are unchanged is
    /// not a change. Returns the version after the publish.
    pub fn publish(&self, changes: impl IntoIterator<Item = Changes>) -> Result<u64, PublishError> {
        let mut indexed = Vec::new();
        for c in changes {
            let i = self.index(&c.type_url).ok_or_else(|| PublishError::UnknownType(c.type_url.clone()))?;
            indexed.push((i, c));
        }
        let mut dirty: Dirty = vec![HashMap::new(); self.inner.types.len()];
        let mut state = self.inner.state.write().unwrap_or_else(PoisonError::into_inner);
        let next = state.version + 1;
        for (i, c) in indexed {
            let set = &mut state.sets[i];
            for res in c.upserts {
                let version = resource_version(&res.resource);
                if let Some(old) = set.by_name.get_mut(&res.name)
                    && old.version == version
                    && old.res.aliases == res.aliases
                    && old.res.node == res.node
                {
                    // Only the names sent along changed (a service's members): kept for the
                    // next subscriber, pushed to nobody (istiod: members added later are not
                    // pushed to who subscribed to the service).
                    old.res.also = res.also;
                    continue;
                }
                if let Some(old) = set.by_name.remove(&res.name) {
                    set.unindex(&old.res);
                }
                for a in &res.aliases {
                    set.by_alias.insert(a.clone(), res.name.clone());
                }
                if let Some(node) = &res.node {
                    set.by_node.entry(node.clone()).or_default().insert(res.name.clone());
                }
                dirty[i].insert(res.name.clone(), next);
                set.by_name.insert(res.name.clone(), Entry { res, version });
            }
            for name in c.removals {
                if let Some(old) = set.by_name.remove(&name) {
                    set.unindex(&old.res);
                    dirty[i].insert(name, next);
                }
            }
        }
        if dirty.iter().all(HashMap::is_empty) {
            return Ok(state.version);
        }
        state.version = next;
        let version = next;
        drop(state);
        let now = Instant::now();
        let mut inboxes = lock(&self.inner.inboxes);
        inboxes.retain(|w| w.strong_count() > 0);
        for inbox in inboxes.iter().filter_map(Weak::upgrade) {
            lock(&inbox.dirty).merge(&dirty, Some(now));
            inbox.wake.notify_one();
        }
        Ok(version)
    }

    /// The current version (bumped by every publish that changed something).
    pub fn version(&self) -> u64 {
        self.read().version
    }

    /// Number of resources of `type_url`.
    pub fn len(&self, type_url: &str) -> usize {
        self.index(type_url).map_or(0, |i| self.read().sets[i].by_name.len())
    }

    /// Whether no resource of `type_url` is published.
    pub fn is_empty(&self, type_url: &str) -> bool {
        self.len(type_url) == 0
    }

    fn index(&self, type_url: &str) -> Option<usize> {
        self.inner.types.iter().position(|t| t == type_url)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Snapshot> {
        self.inner.state.read().unwrap_or_else(PoisonError::into_inner)
    }
}

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
}

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
    last_nonce: String,
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
                                last_nonce: sub.last_nonce.clone(),
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

/// Responses by type index.
type Responses = Vec<(usize, DeltaDiscoveryResponse)>;

fn on_request(
    server: &ServerInner,
    shared: &StreamShared,
    req: DeltaDiscoveryRequest,
) -> Result<Responses, Status> {
    let out = handle_request(server, shared, req)?;
    let subscribed: usize = lock(&shared.state).subs.iter().flatten().map(|s| s.names.len()).sum();
    let max_names = server.cfg.max_subscribed_names;
    if subscribed > max_names {
        server.hooks.metrics.refused(RefusalReason::TooManyNames);
        return Err(Status::resource_exhausted(format!(
            "this stream subscribes to {subscribed} names, more than the server's limit of {max_names}"
        )));
    }
    Ok(out)
}

fn handle_request(
    server: &ServerInner,
    shared: &StreamShared,
    req: DeltaDiscoveryRequest,
) -> Result<Responses, Status> {
    let resources = &server.resources;
    let mut st = lock(&shared.state);
    let Some(ti) = resources.index(&req.type_url) else {
        warn!(stream = st.id, type_url = %req.type_url, "xDS request for a type this server does not serve; ignored");
        return Ok(Vec::new());
    };
    let StreamState { subs, counter, id, node_name, scope, .. } = &mut *st;
    let node_name = node_name.as_deref();
    let scope = scope.as_deref();
    if let Some(err) = &req.error_detail {
        warn!(stream = *id, type_url = %req.type_url, nonce = %req.response_nonce, "xDS NACK: {}", err.message);
        server.type_metrics[ti].rejected();
        if let Some(sub) = subs[ti].as_mut() {
            keep_last(
                &mut sub.nacks,
                ServerNack { nonce: req.response_nonce.clone(), message: err.message.clone() },
            );
        }
        // Recorded only: the rejected version is not sent again, the next change is.
        return Ok(Vec::new());
    }
    let snap = resources.read();
    let set = &snap.sets[ti];
    let type_url = &resources.inner.types[ti];
    let Some(sub) = subs[ti].as_mut() else {
        let mut names: HashSet<String> = req.resource_names_subscribe.iter().cloned().collect();
        names.extend(req.initial_resource_versions.keys().cloned());
        for u in &req.resource_names_unsubscribe {
            names.remove(u);
        }
        let wildcard = names.remove("*") || req.resource_names_subscribe.is_empty();
        let mut sub = Sub {
            wildcard,
            base: snap.version,
            names: HashMap::new(),
            responses: 0,
            last_nonce: String::new(),
            acked: Vec::new(),
            nacks: Vec::new(),
        };
        let (resources_out, removed) = if wildcard {
            everything(set, &req.initial_resource_versions, scope)
        } else {
            let mut names: Vec<String> = names.into_iter().collect();
            names.extend(set.node_local(node_name, &sub, &names, scope));
            resolve(set, snap.version, &mut sub, &names, &req.initial_resource_versions, scope)
        };
        let resp = response(type_url, snap.version, &mut sub, counter, resources_out, removed);
        subs[ti] = Some(sub);
        return Ok(vec![(ti, resp)]);
    };
    if !req.response_nonce.is_empty() && req.response_nonce != sub.last_nonce {
        debug!(stream = *id, %type_url, nonce = %req.response_nonce, "stale nonce; request ignored");
        server.type_metrics[ti].expired_nonce();
        return Ok(Vec::new());
    }
    if !req.response_nonce.is_empty() {
        keep_last(&mut sub.acked, req.response_nonce.clone());
    }
    let mut resend_all = false;
    let mut new_names = Vec::new();
    for n in &req.resource_names_subscribe {
        if n == "*" {
            resend_all |= !sub.wildcard;
            sub.wildcard = true;
        } else if sub.wildcard || !sub.names.contains_key(n) {
            new_names.push(n.clone());
        }
    }
    for n in &req.resource_names_unsubscribe {
        if n == "*" {
            sub.wildcard = false;
        } else {
            sub.names.remove(n);
        }
    }
    let none = HashMap::new();
    let (out, removed) = if resend_all {
        sub.base = snap.version;
        everything(set, &none, scope)
    } else if !new_names.is_empty() {
        if !sub.wildcard {
            let local = set.node_local(node_name, sub, &new_names, scope);
            new_names.extend(local);
        }
        resolve(set, snap.version, sub, &new_names, &none, scope)
    } else {
        if req.response_nonce.is_empty() && req.resource_names_unsubscribe.is_empty() {
            debug!(stream = *id, %type_url, "request without nonce changes nothing; ignored");
        }
        return Ok(Vec::new());
    };
    Ok(vec![(ti, response(type_url, snap.version, sub, counter, out, removed))])
}

/// Every resource of the type the stream may see except those the client already holds at the
/// same version, and the names the client reported that no longer exist (for it).
fn everything(
    set: &TypeSet,
    initial: &HashMap<String, String>,
    scope: Option<&str>,
) -> (Vec<Resource>, Vec<String>) {
    let out = set
        .by_name
        .iter()
        .filter(|(name, e)| initial.get(*name) != Some(&e.version) && set.visible(name, scope))
        .map(|(_, e)| wire(e, false))
        .collect();
    let mut removed: Vec<String> =
        initial.keys().filter(|n| !set.by_name.contains_key(*n) || !set.visible(n, scope)).cloned().collect();
    removed.sort();
    (out, removed)
}

/// Looks `names` up by name or alias for a named/on-demand subscriber: what is found is sent
/// with its aliases and its `also` names, and joins the subscription; what is not is echoed as
/// removed.
fn resolve(
    set: &TypeSet,
    version: u64,
    sub: &mut Sub,
    names: &[String],
    initial: &HashMap<String, String>,
    scope: Option<&str>,
) -> (Vec<Resource>, Vec<String>) {
    let mut send: Vec<&str> = Vec::new();
    let mut removed = Vec::new();
    for name in names {
        if !sub.wildcard {
            sub.names.insert(name.clone(), version);
        }
        let real = if set.by_name.contains_key(name) {
            Some(name.as_str())
        } else {
            set.by_alias.get(name).map(String::as_str)
        }
        .filter(|real| set.visible(real, scope));
        match real {
            Some(real) => {
                send.push(real);
                if let Some(e) = set.by_name.get(real) {
                    send.extend(e.res.also.iter().map(String::as_str));
                }
            }
            None => removed.push(name.clone()),
        }
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for name in send {
        let Some(e) = set.by_name.get(name) else { continue };
        if !set.visible(name, scope) || !seen.insert(name) {
            continue;
        }
        if !sub.wildcard {
            sub.names.insert(name.to_owned(), version);
        }
        if initial.get(name) != Some(&e.version) {
            out.push(wire(e, true));
        }
    }
    (out, removed)
}

/// The changed names a stream's subscription covers, one response per type that has any.
fn push(server: &ServerInner, shared: &StreamShared, dirty: &Dirty) -> Responses {
    let resources = &server.resources;
    let snap = resources.read();
    let mut st = lock(&shared.state);
    let StreamState { subs, counter, node_name, scope, .. } = &mut *st;
    let node_name = node_name.as_deref();
    let scope = scope.as_deref();
    let mut out = Vec::new();
    for (ti, changed) in dirty.iter().enumerate() {
        let Some(Some(sub)) = subs.get_mut(ti) else { continue };
        if changed.is_empty() {
            continue;
        }
        let set = &snap.sets[ti];
        let (resources_out, removed) = if sub.wildcard {
            let mut removed = Vec::new();
            let mut res = Vec::new();
            for (name, _) in changed.iter().filter(|(n, v)| **v > sub.base && set.visible(n, scope)) {
                match set.by_name.get(name) {
                    Some(e) => res.push(wire(e, false)),
                    None => removed.push(name.clone()),
                }
            }
            (res, removed)
        } else {
            // Only names whose change is newer than what this stream was last sent, and
            // resources on the stream's node it does not hold yet (they join it).
            let covered: Vec<String> = changed
                .iter()
                .filter(|(n, v)| match sub.names.get(*n) {
                    Some(sent) => *v > sent,
                    None => set.is_on(n, node_name),
                })
                .map(|(n, _)| n.clone())
                .collect();
            let (res, mut removed) = resolve(set, snap.version, sub, &covered, &HashMap::new(), scope);
            removed.retain(|n| !set.by_alias.contains_key(n));
            (res, removed)
        };
        if resources_out.is_empty() && removed.is_empty() {
            continue;
        }
        out.push((
            ti,
            response(&resources.inner.types[ti], snap.version, sub, counter, resources_out, removed),
        ));
    }
    out
}

fn wire(e: &Entry, aliases: bool) -> Resource {
    Resource {
        name: e.res.name.clone(),
        aliases: if aliases { e.res.aliases.clone() } else { Vec::new() },
        version: e.version.clone(),
        resource: Some(e.res.resource.clone()),
        ..Default::default()
    }
}

fn response(
    type_url: &str,
    version: u64,
    sub: &mut Sub,
    counter: &mut u64,
    resources: Vec<Resource>,
    mut removed: Vec<String>,
) -> DeltaDiscoveryResponse {
    // Removals in a stable order (names come out of hash sets).
    removed.sort();
    *counter += 1;
    let nonce = format!("{version}-{counter}-{:016x}", rand::random::<u64>());
    sub.last_nonce = nonce.clone();
    sub.responses += 1;
    DeltaDiscoveryResponse {
        system_version_info: version.to_string(),
        resources,
        type_url: type_url.to_owned(),
        removed_resources: removed,
        nonce,
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
