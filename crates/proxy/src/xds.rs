//! The proxy's xDS client (`XDS_ADDRESS`): one delta ADS stream to istiod (or `ambit control`)
//! for `istio.workload.Address` and `istio.security.Authorization`, applied incrementally to
//! the [`StateStore`].
//!
//! Transport, ACK/NACK, reconnects and metrics are `ambit-xds`'s; the connection (TLS roots,
//! alternate name, token, headers) is `ambit_identity::control`'s, the same code the CA client
//! uses. This module converts and applies: each response becomes one [`Delta`], converted and
//! applied on the blocking pool (a first response of 100 000 workloads must not stall the
//! control runtime), and every resource that does not convert or apply is NACKed with its
//! reason while the rest applies.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ambit_api::type_url::{ADDRESS, AUTHORIZATION};
use ambit_api::{security as pb_security, workload as pb};
use ambit_identity::control::{ControlError, ControlPlane, Service as ControlService};
use ambit_xds::client::{
    ClientConfig, ClientHandle, ClientStatus, Connector, DemandError, Handler, MetadataSource, Rejection,
    Subscription, Typed, TypedHandler, TypedUpdate, XdsClient,
};
use ambit_xds::{BoxFuture, XdsMetrics};
use prometheus_client::registry::Registry;

use crate::config::XdsSettings;
use crate::state::{Delta, Rejected, StateStore};

/// How long a connection to an address the proxy does not know waits for the on-demand answer
/// (`XDS_ON_DEMAND`) before it is routed as unknown. ztunnel waits without a bound.
pub const ON_DEMAND_WAIT: Duration = Duration::from_secs(5);

/// The running xDS client.
#[derive(Clone)]
pub struct Xds {
    handle: ClientHandle,
    on_demand: bool,
}

/// Why the xDS client cannot start.
#[derive(Debug, thiserror::Error)]
pub enum XdsStartError {
    /// The control-plane connection settings are unusable.
    #[error(transparent)]
    Control(#[from] ControlError),
}

impl Xds {
    /// Starts the client on the current (control) runtime. `mark` is set on its sockets, so that
    /// a dedicated proxy's own control traffic is not captured by its pod's rules.
    pub fn start(
        settings: &XdsSettings,
        store: StateStore,
        mark: Option<u32>,
        registry: &mut Registry,
    ) -> Result<Xds, XdsStartError> {
        let mut control = settings.control.control_plane_config(ControlService::Xds);
        control.mark = mark;
        let control = ControlPlane::new(control)?;
        let address_sub = if settings.on_demand { Subscription::OnDemand } else { Subscription::Wildcard };
        let cfg = ClientConfig::new(
            settings.node.to_proto(),
            control.address(),
            vec![(ADDRESS.to_owned(), address_sub), (AUTHORIZATION.to_owned(), Subscription::Wildcard)],
        );
        let c = control.clone();
        let connector: Connector = Arc::new(move || {
            let c = c.clone();
            Box::pin(async move { c.connect().await.map_err(Into::into) })
        });
        let c = control;
        let metadata: MetadataSource = Arc::new(move || c.metadata().map_err(Into::into));
        let handlers: [(String, Arc<dyn Handler>); 2] = [
            (ADDRESS.to_owned(), Arc::new(Typed::<pb::Address, _>::new(ADDRESS, Addresses(store.clone())))),
            (
                AUTHORIZATION.to_owned(),
                Arc::new(Typed::<pb_security::Authorization, _>::new(AUTHORIZATION, Policies(store))),
            ),
        ];
        let metrics = XdsMetrics::register(registry.sub_registry_with_prefix("istio"));
        let (handle, task) = XdsClient::new(cfg, connector, metadata, handlers, metrics);
        tokio::spawn(task);
        Ok(Xds { handle, on_demand: settings.on_demand })
    }

    /// Resolves once the first response of every subscribed (not on-demand) type is applied and
    /// ACKed.
    pub fn synced(&self) -> impl Future<Output = ()> + Send + 'static {
        self.handle.synced()
    }

    /// Whether addresses are fetched on demand (`XDS_ON_DEMAND`).
    pub fn on_demand(&self) -> bool {
        self.on_demand
    }

    /// The client's state for `/config_dump`.
    pub fn status(&self) -> ClientStatus {
        self.handle.status()
    }

    /// With `XDS_ON_DEMAND`, asks for the address `network/ip` and waits (at most
    /// [`ON_DEMAND_WAIT`]) for the answer; returns whether an answer came. Without on-demand,
    /// returns `false` at once (the state already holds everything the server has).
    pub async fn demand_address(&self, network: &str, ip: IpAddr) -> bool {
        if !self.on_demand {
            return false;
        }
        let name = format!("{network}/{ip}");
        match tokio::time::timeout(ON_DEMAND_WAIT, self.handle.demand(ADDRESS, &name)).await {
            Ok(Ok(())) => true,
            Ok(Err(e @ (DemandError::Stopped | DemandError::TooMany | DemandError::NotDemandable(_)))) => {
                tracing::warn!(address = %name, error = %e, "on-demand address lookup failed");
                false
            }
            Err(_) => {
                tracing::warn!(address = %name, wait = ?ON_DEMAND_WAIT, "no on-demand answer in time");
                false
            }
        }
    }
}

/// Applies Address responses.
struct Addresses(StateStore);

/// Applies Authorization responses.
struct Policies(StateStore);

impl TypedHandler<pb::Address> for Addresses {
    fn apply(
        &self,
        updates: Vec<TypedUpdate<pb::Address>>,
        removed: Vec<String>,
    ) -> BoxFuture<'_, Vec<Rejection>> {
        let store = self.0.clone();
        apply_off_runtime(move || {
            let mut delta = Delta::default();
            let mut rejected = Vec::new();
            for u in updates {
                if let Err(r) = delta.add_address(&u.name, u.resource) {
                    rejected.push(r);
                }
            }
            delta.removed_addresses = removed;
            (store, delta, rejected)
        })
    }
}

impl TypedHandler<pb_security::Authorization> for Policies {
    fn apply(
        &self,
        updates: Vec<TypedUpdate<pb_security::Authorization>>,
        removed: Vec<String>,
    ) -> BoxFuture<'_, Vec<Rejection>> {
        let store = self.0.clone();
        apply_off_runtime(move || {
            let mut delta = Delta::default();
            let mut rejected = Vec::new();
            for u in updates {
                if let Err(r) = delta.add_authorization(&u.name, &u.resource) {
                    rejected.push(r);
                }
            }
            delta.removed_policies = removed;
            (store, delta, rejected)
        })
    }
}

/// Converts (in `build`) and applies one response on the blocking pool; returns every
/// rejection, conversion and application alike, as the NACK's entries.
fn apply_off_runtime(
    build: impl FnOnce() -> (StateStore, Delta, Vec<Rejected>) + Send + 'static,
) -> BoxFuture<'static, Vec<Rejection>> {
    Box::pin(async move {
        let job = tokio::task::spawn_blocking(move || {
            let (store, delta, mut rejected) = build();
            if !delta.is_empty() {
                rejected.extend(store.apply(delta).rejected);
            }
            rejected
        });
        match job.await {
            Ok(rejected) => rejected
                .into_iter()
                .map(|r| Rejection { reason: r.reason.to_string(), name: r.name })
                .collect(),
            // A panic while applying: the state is unchanged (the store publishes only a
            // finished snapshot); NACK the whole response so the server knows.
            Err(e) => {
                vec![Rejection { name: "*".to_owned(), reason: format!("applying the response failed: {e}") }]
            }
        }
    })
}
