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
    Subscription, Update, XdsClient, decode,
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
            (ADDRESS.to_owned(), Arc::new(addresses(store.clone()))),
            (AUTHORIZATION.to_owned(), Arc::new(policies(store))),
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

    /// Whether [`Xds::synced`] has resolved.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_synced(&self) -> bool {
        self.handle.is_synced()
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
    /// `ON_DEMAND_WAIT`) for the answer; returns whether an answer came. Without on-demand,
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

/// Applies the responses of one type: each resource is decoded (as `M`, of `type_url`) and
/// converted into the delta by `add` one at a time, so a large response (100 000 workloads) never
/// exists decoded all at once; `removed` places the response's removals. The response itself is
/// dropped only after the state is built, in one piece.
struct Apply<M> {
    type_url: &'static str,
    store: StateStore,
    add: fn(&mut Delta, &str, M) -> Result<(), Rejected>,
    removed: fn(&mut Delta, Vec<String>),
}

/// What the server is told about a resource the state refused.
fn rejection(r: Rejected) -> Rejection {
    Rejection { reason: r.reason.to_string(), name: r.name }
}

/// The Address handler.
fn addresses(store: StateStore) -> Apply<pb::Address> {
    Apply {
        type_url: ADDRESS,
        store,
        add: |d, name, r| d.add_address(name, r),
        removed: |d, names| d.removed_addresses = names,
    }
}

/// The Authorization handler.
fn policies(store: StateStore) -> Apply<pb_security::Authorization> {
    Apply {
        type_url: AUTHORIZATION,
        store,
        add: |d, name, r| d.add_authorization(name, &r),
        removed: |d, names| d.removed_policies = names,
    }
}

impl<M: prost::Message + Default + Send + 'static> Handler for Apply<M> {
    fn apply(&self, updates: Vec<Update>, removed: Vec<String>) -> BoxFuture<'_, Vec<Rejection>> {
        let (type_url, store, add, place_removed) =
            (self.type_url, self.store.clone(), self.add, self.removed);
        Box::pin(async move {
            // Conversion and application run on the blocking pool, off the control runtime.
            let job = tokio::task::spawn_blocking(move || {
                let mut delta = Delta::default();
                let mut rejected = Vec::new();
                for u in &updates {
                    let converted =
                        decode::<M>(type_url, u).and_then(|m| add(&mut delta, &u.name, m).map_err(rejection));
                    if let Err(r) = converted {
                        rejected.push(r);
                    }
                }
                place_removed(&mut delta, removed);
                if !delta.is_empty() {
                    rejected.extend(store.apply(delta).rejected.into_iter().map(rejection));
                }
                let bytes: usize = updates.iter().map(|u| u.resource.value.len()).sum();
                drop(updates);
                if bytes >= crate::state::RELEASE_AFTER {
                    crate::state::release_freed();
                }
                rejected
            });
            match job.await {
                Ok(rejected) => rejected,
                // A panic while applying: the state is unchanged (the store publishes only a
                // finished snapshot); NACK the whole response so the server knows.
                Err(e) => vec![Rejection {
                    name: "*".to_owned(),
                    reason: format!("applying the response failed: {e}"),
                }],
            }
        })
    }
}
