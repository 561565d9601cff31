//! The delta ADS client: one `DeltaAggregatedResources` stream carrying every subscribed type.
//!
//! [`XdsClient::new`] returns a [`ClientHandle`] and the client's task (a future the owner spawns
//! on its control runtime). The task connects through the owner's [`Connector`], sends one
//! initial request per type in the configured order, hands every response to that type's
//! [`Handler`], answers with an ACK or a NACK naming each rejected resource, and reconnects with
//! jittered backoff when the stream ends (reasons and waits as ztunnel, `node-proxy.md` §1.4).

mod task;
mod wire;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use ambit_api::xds::Node;
use serde::Serialize;
use tokio::sync::{Notify, oneshot, watch};
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;

use crate::{BoxError, BoxFuture, TerminationReason, XdsMetrics};

/// Builds a fresh channel to the server; called on every (re)connect, so TLS settings and roots
/// are rebuilt each time. Keepalive is the channel's business.
pub type Connector = Arc<dyn Fn() -> BoxFuture<'static, Result<Channel, BoxError>> + Send + Sync>;

/// Builds the metadata of a new stream (token, headers); called for every stream, so a token
/// file is re-read each time.
pub type MetadataSource = Arc<dyn Fn() -> Result<MetadataMap, BoxError> + Send + Sync>;

/// Default limit on one decoded response (ztunnel's: 200 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 200 * 1024 * 1024;

/// At most this many distinct on-demand names may wait for an answer at once.
pub const MAX_PENDING_DEMANDS: usize = 10_000;

/// How one type is subscribed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subscription {
    /// Everything the server has (subscribe list empty).
    Wildcard,
    /// Nothing until [`ClientHandle::demand`] asks for a name (`subscribe=["*"]`,
    /// `unsubscribe=["*"]`).
    OnDemand,
    /// Exactly these names (more may be demanded).
    Named(BTreeSet<String>),
}

/// Reconnect backoff: doubles from `initial` up to `max`, each wait jittered into `[w/2, w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// First wait, and the wait after a reset.
    pub initial: Duration,
    /// Cap on the doubled wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(10), max: Duration::from_secs(15) }
    }
}

/// What the client subscribes to and how it behaves.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Sent in every initial request.
    pub node: Node,
    /// The server's address, for status and error messages only (the connector dials).
    pub server: String,
    /// Types in the order their initial requests are sent, each with its subscription.
    pub subscriptions: Vec<(String, Subscription)>,
    /// Reconnect backoff.
    pub backoff: Backoff,
    /// Largest decoded response accepted; a larger one ends the stream and reconnects.
    pub max_message_bytes: usize,
}

impl ClientConfig {
    /// A config with the default backoff and message limit.
    pub fn new(node: Node, server: impl Into<String>, subscriptions: Vec<(String, Subscription)>) -> Self {
        Self {
            node,
            server: server.into(),
            subscriptions,
            backoff: Backoff::default(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

/// One added or updated resource as the server sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// The resource's name.
    pub name: String,
    /// The server's version of it.
    pub version: String,
    /// Other names it is known by (on-demand answers).
    pub aliases: Vec<String>,
    /// The payload, not yet decoded.
    pub resource: prost_types::Any,
}

/// A resource the handler (or the typed adapter) could not apply, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The resource's name.
    pub name: String,
    /// Why it was rejected (sent to the server in the NACK).
    pub reason: String,
}

/// Applies the resources of one type. Applies every good resource, updates before removals,
/// and returns the bad ones (partial apply); the client ACKs when none is returned, else NACKs.
pub trait Handler: Send + Sync + 'static {
    /// Applies one response's updates, then its removals.
    fn apply(&self, updates: Vec<Update>, removed: Vec<String>) -> BoxFuture<'_, Vec<Rejection>>;
}

/// One decoded resource for a [`TypedHandler`].
#[derive(Clone, Debug, PartialEq)]
pub struct TypedUpdate<M> {
    /// The resource's name.
    pub name: String,
    /// The server's version of it.
    pub version: String,
    /// Other names it is known by.
    pub aliases: Vec<String>,
    /// The decoded message.
    pub resource: M,
}

/// A handler that only ever sees decoded messages of type `M` (see [`Typed`]).
pub trait TypedHandler<M>: Send + Sync + 'static {
    /// Applies the decoded updates, then the removals; returns what it rejected.
    fn apply(&self, updates: Vec<TypedUpdate<M>>, removed: Vec<String>) -> BoxFuture<'_, Vec<Rejection>>;
}

/// Adapts a [`TypedHandler`] into a [`Handler`]: decodes each `Any` as `M` after checking its type
/// URL, and rejects (with the reason) every resource that does not decode.
pub struct Typed<M, H> {
    type_url: String,
    inner: H,
    _message: PhantomData<fn() -> M>,
}

impl<M, H> Typed<M, H> {
    /// Wraps `inner`, expecting payloads of `type_url`.
    pub fn new(type_url: impl Into<String>, inner: H) -> Self {
        Self { type_url: type_url.into(), inner, _message: PhantomData }
    }
}

impl<M, H> Handler for Typed<M, H>
where
    M: prost::Message + Default + Send + 'static,
    H: TypedHandler<M>,
{
    fn apply(&self, updates: Vec<Update>, removed: Vec<String>) -> BoxFuture<'_, Vec<Rejection>> {
        let mut rejected = Vec::new();
        let mut good = Vec::with_capacity(updates.len());
        for u in updates {
            match decode::<M>(&self.type_url, &u) {
                Ok(resource) => {
                    good.push(TypedUpdate { name: u.name, version: u.version, aliases: u.aliases, resource })
                }
                Err(r) => rejected.push(r),
            }
        }
        Box::pin(async move {
            rejected.extend(self.inner.apply(good, removed).await);
            rejected
        })
    }
}

/// Decodes one update's payload as `M` after checking its type URL against `type_url`; the
/// rejection says which check failed. [`Typed`] decodes a whole response with it; a handler that
/// converts as it goes (so a large response never exists decoded all at once) calls it per update.
pub fn decode<M: prost::Message + Default>(type_url: &str, u: &Update) -> Result<M, Rejection> {
    if u.resource.type_url != type_url {
        return Err(Rejection {
            name: u.name.clone(),
            reason: format!("payload has type URL {:?}, expected {type_url:?}", u.resource.type_url),
        });
    }
    M::decode(u.resource.value.as_slice())
        .map_err(|e| Rejection { name: u.name.clone(), reason: format!("cannot decode {type_url}: {e}") })
}

/// Why an on-demand request could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DemandError {
    /// The client's task has ended (or was never spawned and dropped).
    #[error("the xDS client has stopped")]
    Stopped,
    /// The type is not subscribed on demand or by name.
    #[error("type {0} is not subscribed on demand or by name, so it cannot be demanded")]
    NotDemandable(String),
    /// Too many names are already waiting.
    #[error("{MAX_PENDING_DEMANDS} on-demand requests are already waiting for the xDS server")]
    TooMany,
}

/// The client's state for `/config_dump`.
#[derive(Clone, Debug, Serialize)]
pub struct ClientStatus {
    /// The connection to the server.
    pub connection: ConnectionStatus,
    /// One entry per subscribed type, in subscription order.
    pub types: Vec<TypeStatus>,
}

/// The connection to the server.
#[derive(Clone, Debug, Serialize)]
pub struct ConnectionStatus {
    /// What the client is doing now.
    pub state: ConnectionState,
    /// The server's address (as configured).
    pub server: String,
    /// Streams opened since start.
    pub connects: u64,
    /// Why the last stream ended (or could not open), if one has.
    pub last_error: Option<String>,
}

/// What the client is doing now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state")]
pub enum ConnectionState {
    /// Dialing or opening the stream.
    Connecting,
    /// The stream is open.
    Connected,
    /// Waiting before the next connect.
    Backoff {
        /// Why the last stream ended.
        reason: TerminationReason,
        /// How long the wait is.
        retry_in: Duration,
    },
}

/// One type's state.
#[derive(Clone, Debug, Serialize)]
pub struct TypeStatus {
    /// The type URL.
    pub type_url: String,
    /// `wildcard`, `on-demand` or `named`.
    pub subscription: &'static str,
    /// `system_version_info` of the last response.
    pub system_version_info: String,
    /// Nonce of the last response.
    pub last_nonce: String,
    /// Resources held (applied and not since removed).
    pub resources: usize,
    /// The last NACK sent.
    pub last_nack: Option<Nack>,
    /// ACKs sent since start.
    pub acks: u64,
    /// NACKs sent since start.
    pub nacks: u64,
}

/// A NACK the client sent.
#[derive(Clone, Debug, Serialize)]
pub struct Nack {
    /// The nonce of the rejected response.
    pub nonce: String,
    /// The `error_detail.message` sent.
    pub message: String,
    /// When.
    pub at: SystemTime,
}

/// The xDS client (see the module docs).
pub struct XdsClient;

impl XdsClient {
    /// Builds the client: the handle, and the task the owner spawns. `handlers` maps type URLs to
    /// their handler; a type without one is logged once and ACKed.
    #[allow(clippy::new_ret_no_self, reason = "the client is its handle plus its task")]
    pub fn new(
        cfg: ClientConfig,
        connector: Connector,
        metadata: MetadataSource,
        handlers: impl IntoIterator<Item = (String, Arc<dyn Handler>)>,
        metrics: XdsMetrics,
    ) -> (ClientHandle, impl Future<Output = ()> + Send + 'static) {
        let needs_sync = cfg.subscriptions.iter().any(|(_, s)| *s != Subscription::OnDemand);
        let status = ClientStatus {
            connection: ConnectionStatus {
                state: ConnectionState::Connecting,
                server: cfg.server.clone(),
                connects: 0,
                last_error: None,
            },
            types: cfg
                .subscriptions
                .iter()
                .map(|(url, sub)| TypeStatus {
                    type_url: url.clone(),
                    subscription: match sub {
                        Subscription::Wildcard => "wildcard",
                        Subscription::OnDemand => "on-demand",
                        Subscription::Named(_) => "named",
                    },
                    system_version_info: String::new(),
                    last_nonce: String::new(),
                    resources: 0,
                    last_nack: None,
                    acks: 0,
                    nacks: 0,
                })
                .collect(),
        };
        let demandable = cfg
            .subscriptions
            .iter()
            .filter(|(_, s)| *s != Subscription::Wildcard)
            .map(|(u, _)| u.clone())
            .collect();
        let shared = Arc::new(Shared {
            status: Mutex::new(status),
            synced: watch::Sender::new(!needs_sync),
            demands: Mutex::new(Demands::default()),
            demand_wake: Notify::new(),
            demandable,
        });
        let handle = ClientHandle { shared: shared.clone() };
        let task = task::Task::new(cfg, connector, metadata, handlers.into_iter().collect(), metrics, shared);
        (handle, task.run())
    }
}

/// A cheap, cloneable handle on the running client.
#[derive(Clone)]
pub struct ClientHandle {
    shared: Arc<Shared>,
}

impl ClientHandle {
    /// Asks the server for `name` of `type_url` (on the live stream, or with the next connect).
    /// Resolves when a response carries a resource with that name or alias, or lists it as
    /// removed; the caller bounds the wait with a timeout.
    pub fn demand(
        &self,
        type_url: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), DemandError>> + Send + 'static + use<> {
        let rx = self.register_demand(type_url, name);
        async move { rx?.await.map_err(|_| DemandError::Stopped) }
    }

    /// Resolves once an ACK (not a NACK) has been sent for every type that is not on demand.
    pub fn synced(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut rx = self.shared.synced.subscribe();
        async move {
            // The sender lives as long as the handle's shared state, so this only ends on sync.
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// Whether [`ClientHandle::synced`] has resolved.
    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    /// A copy of the client's state.
    pub fn status(&self) -> ClientStatus {
        self.shared.status().clone()
    }

    fn register_demand(&self, type_url: &str, name: &str) -> Result<oneshot::Receiver<()>, DemandError> {
        if !self.shared.demandable.contains(type_url) {
            return Err(DemandError::NotDemandable(type_url.to_owned()));
        }
        let mut d = self.shared.demands.lock().unwrap_or_else(PoisonError::into_inner);
        if d.stopped {
            return Err(DemandError::Stopped);
        }
        let waiting = d.waiting;
        let by_name = d.waiters.entry(type_url.to_owned()).or_default();
        if !by_name.contains_key(name) && waiting >= MAX_PENDING_DEMANDS {
            // Callers that gave up leave closed senders behind; drop them before refusing.
            d.prune();
            if d.waiting >= MAX_PENDING_DEMANDS {
                return Err(DemandError::TooMany);
            }
        }
        let (tx, rx) = oneshot::channel();
        let by_name = d.waiters.entry(type_url.to_owned()).or_default();
        let fresh = !by_name.contains_key(name);
        let senders = by_name.entry(name.to_owned()).or_default();
        // Callers that timed out on this name leave closed senders; drop them as we go.
        senders.retain(|s| !s.is_closed());
        senders.push(tx);
        if fresh {
            d.waiting += 1;
        }
        d.outbox.push((type_url.to_owned(), name.to_owned()));
        drop(d);
        self.shared.demand_wake.notify_one();
        Ok(rx)
    }
}

/// State shared by the handle and the task.
pub(crate) struct Shared {
    status: Mutex<ClientStatus>,
    synced: watch::Sender<bool>,
    demands: Mutex<Demands>,
    demand_wake: Notify,
    demandable: std::collections::HashSet<String>,
}

impl Shared {
    fn status(&self) -> std::sync::MutexGuard<'_, ClientStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn demands(&self) -> std::sync::MutexGuard<'_, Demands> {
        self.demands.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Waiting on-demand callers and the names not yet handed to the task.
#[derive(Default)]
struct Demands {
    /// type URL → name → callers waiting for it.
    waiters: HashMap<String, HashMap<String, Vec<oneshot::Sender<()>>>>,
    /// Number of distinct names in `waiters`.
    waiting: usize,
    /// Demands the task has not yet sent.
    outbox: Vec<(String, String)>,
    stopped: bool,
}

impl Demands {
    fn prune(&mut self) {
        for by_name in self.waiters.values_mut() {
            by_name.retain(|_, senders| {
                senders.retain(|s| !s.is_closed());
                !senders.is_empty()
            });
        }
        self.waiting = self.waiters.values().map(HashMap::len).sum();
    }

    /// Wakes every caller waiting for `name` of `type_url`.
    fn resolve(&mut self, type_url: &str, name: &str) {
        if let Some(by_name) = self.waiters.get_mut(type_url)
            && let Some(senders) = by_name.remove(name)
        {
            self.waiting -= 1;
            for s in senders {
                let _ = s.send(());
            }
        }
    }
}
