//! The waypoint's xDS client: one delta ADS stream (wildcard) for `ambit.waypoint.v1`
//! Destination and Policy. It keeps every resource it holds; on every change it rebuilds the
//! [`Snapshot`] from all of them (on the blocking pool) and installs it, the first time once
//! both types have answered. What `Snapshot::build`
//! refuses is logged once and shown in `/config_dump`, and the response is ACKed: the
//! refusal is the control plane's configuration, already reported by its translation, and a
//! NACK would hold back the rest. Only a payload that does not decode is NACKed (by
//! `ambit_xds`'s typed adapter), as the node proxy does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use ambit_api::type_url::{WAYPOINT_DESTINATION, WAYPOINT_POLICY};
use ambit_api::waypoint as api;
use ambit_identity::control::{ControlError, ControlPlane, ControlSettings, Service};
use ambit_identity::{CertManager, Identity};
use ambit_xds::client::{
    ClientConfig, ClientHandle, ClientStatus, Connector, Handler, MetadataSource, Rejection, Subscription,
    Typed, TypedHandler, TypedUpdate, XdsClient,
};
use ambit_xds::node::NodeInfo;
use ambit_xds::{BoxFuture, XdsMetrics};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::{Snapshot, Waypoint};

/// The running client and what it holds.
#[derive(Clone)]
pub(crate) struct Xds {
    handle: ClientHandle,
    held: Arc<Mutex<Held>>,
}

/// The resources held, by name, and the refusals of the snapshot built from them.
#[derive(Default)]
struct Held {
    destinations: BTreeMap<String, (String, api::Destination)>,
    policies: BTreeMap<String, (String, api::Policy)>,
    refusals: Vec<String>,
    logged: BTreeSet<String>,
    /// Whether a response of each type has come: the snapshot is first built once both have,
    /// so destinations never wait, refused, for policies still on their way.
    destinations_in: bool,
    policies_in: bool,
}

/// `/config_dump`'s view of what the client holds.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HeldDump {
    /// Destination name → version.
    destinations: BTreeMap<String, String>,
    /// Policy name → version.
    policies: BTreeMap<String, String>,
    /// What `Snapshot::build` refused in the current configuration.
    refusals: Vec<String>,
}

impl Xds {
    /// Starts the client on the current (control) runtime; every change is installed in `waypoint`.
    pub(crate) fn start(
        settings: &ControlSettings,
        node: &NodeInfo,
        present: Option<(Arc<CertManager>, Identity)>,
        waypoint: Waypoint,
        registry: &mut Registry,
    ) -> Result<Xds, ControlError> {
        let control = ControlPlane::new(settings.control_plane_config(Service::Xds))?;
        let cfg = ClientConfig::new(
            node.to_proto(),
            control.address(),
            vec![
                (WAYPOINT_DESTINATION.to_owned(), Subscription::Wildcard),
                (WAYPOINT_POLICY.to_owned(), Subscription::Wildcard),
            ],
        );
        let c = control.clone();
        // With a node's token, the stream presents the waypoint's own certificate (fetched, and
        // so renewed, at every connect): the control plane knows the waypoint by it.
        let connector: Connector = Arc::new(move || {
            let (c, present) = (c.clone(), present.clone());
            Box::pin(async move {
                match present {
                    Some((certs, id)) => {
                        let cert = certs
                            .fetch(&id)
                            .await
                            .map_err(|e| format!("no certificate to present to the xDS server yet: {e}"))?;
                        c.connect_as(&cert).await.map_err(Into::into)
                    }
                    None => c.connect().await.map_err(Into::into),
                }
            })
        });
        let metadata: MetadataSource = Arc::new(move || control.metadata().map_err(Into::into));
        let held = Arc::new(Mutex::new(Held::default()));
        let apply = Apply { held: held.clone(), waypoint };
        let handlers: [(String, Arc<dyn Handler>); 2] = [
            (
                WAYPOINT_DESTINATION.to_owned(),
                Arc::new(Typed::<api::Destination, _>::new(
                    WAYPOINT_DESTINATION,
                    Destinations(apply.clone()),
                )),
            ),
            (
                WAYPOINT_POLICY.to_owned(),
                Arc::new(Typed::<api::Policy, _>::new(WAYPOINT_POLICY, Policies(apply))),
            ),
        ];
        let metrics = XdsMetrics::register(registry.sub_registry_with_prefix("istio"));
        let (handle, task) = XdsClient::new(cfg, connector, metadata, handlers, metrics);
        tokio::spawn(task);
        Ok(Xds { handle, held })
    }

    /// Resolves once the first response of both types is applied and ACKed.
    pub(crate) fn synced(&self) -> impl Future<Output = ()> + Send + 'static {
        self.handle.synced()
    }

    /// The client's connection and per-type state.
    pub(crate) fn status(&self) -> ClientStatus {
        self.handle.status()
    }

    /// The resources held and the current refusals.
    pub(crate) fn held(&self) -> HeldDump {
        Xds::dump_of(&self.held)
    }

    fn dump_of(held: &Mutex<Held>) -> HeldDump {
        let h = held.lock().unwrap_or_else(PoisonError::into_inner);
        HeldDump {
            destinations: h.destinations.iter().map(|(n, (v, _))| (n.clone(), v.clone())).collect(),
            policies: h.policies.iter().map(|(n, (v, _))| (n.clone(), v.clone())).collect(),
            refusals: h.refusals.clone(),
        }
    }
}

/// Applies one type's changes to what is held, then rebuilds and installs the snapshot.
#[derive(Clone)]
struct Apply {
    held: Arc<Mutex<Held>>,
    waypoint: Waypoint,
}

struct Destinations(Apply);
struct Policies(Apply);

impl TypedHandler<api::Destination> for Destinations {
    fn apply(
        &self,
        updates: Vec<TypedUpdate<api::Destination>>,
        removed: Vec<String>,
    ) -> BoxFuture<'_, Vec<Rejection>> {
        self.0.run(move |h| {
            h.destinations_in = true;
            for u in updates {
                h.destinations.insert(u.name, (u.version, u.resource));
            }
            for name in removed {
                h.destinations.remove(&name);
            }
        })
    }
}

impl TypedHandler<api::Policy> for Policies {
    fn apply(
        &self,
        updates: Vec<TypedUpdate<api::Policy>>,
        removed: Vec<String>,
    ) -> BoxFuture<'_, Vec<Rejection>> {
        self.0.run(move |h| {
            h.policies_in = true;
            for u in updates {
                h.policies.insert(u.name, (u.version, u.resource));
            }
            for name in removed {
                h.policies.remove(&name);
            }
        })
    }
}

impl Apply {
    fn run(&self, change: impl FnOnce(&mut Held) + Send + 'static) -> BoxFuture<'_, Vec<Rejection>> {
        let (held, waypoint) = (self.held.clone(), self.waypoint.clone());
        Box::pin(async move {
            // Building runs on the blocking pool, off the control runtime that answers admin
            // and readiness.
            let job = tokio::task::spawn_blocking(move || {
                let mut h = held.lock().unwrap_or_else(PoisonError::into_inner);
                change(&mut h);
                if h.destinations_in && h.policies_in {
                    rebuild(&mut h, &waypoint);
                }
            });
            match job.await {
                Ok(()) => Vec::new(),
                // A panic while building: the installed snapshot is unchanged; NACK so the
                // server knows.
                Err(e) => vec![Rejection {
                    name: "*".to_owned(),
                    reason: format!("applying the response failed: {e}"),
                }],
            }
        })
    }
}

/// Builds the snapshot from everything held and installs it; logs each new refusal once.
fn rebuild(h: &mut Held, waypoint: &Waypoint) {
    let destinations: Vec<(String, api::Destination)> =
        h.destinations.iter().map(|(n, (_, d))| (n.clone(), d.clone())).collect();
    let policies: Vec<(String, api::Policy)> =
        h.policies.iter().map(|(n, (_, p))| (n.clone(), p.clone())).collect();
    let (snapshot, errors) = Snapshot::build(&destinations, &policies);
    waypoint.set_config(snapshot);
    h.refusals = errors.iter().map(ToString::to_string).collect();
    for r in &h.refusals {
        if h.logged.insert(r.clone()) {
            tracing::warn!(refusal = %r, "configuration refused in part");
        }
    }
    // Forget what no longer occurs, so it is logged again if it comes back.
    let current: BTreeSet<&String> = h.refusals.iter().collect();
    h.logged.retain(|r| current.contains(r));
    tracing::info!(
        destinations = destinations.len(),
        policies = policies.len(),
        refusals = h.refusals.len(),
        "configuration installed"
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ambit_hbone::testing::{TcpDialer, settings};
    use ambit_identity::{CertManager, FakeCa};

    use super::*;
    use crate::Settings;
    use crate::testing::{endpoint, service, waypoint_identity};

    fn update<M>(name: &str, resource: M) -> TypedUpdate<M> {
        TypedUpdate { name: name.to_owned(), version: "v1".to_owned(), aliases: vec![], resource }
    }

    /// The snapshot waits for both types, is rebuilt from everything held, and its refusals are
    /// reported (and ACKed: no rejection goes back) until the resource that caused them leaves.
    #[tokio::test]
    async fn snapshot_from_everything_held_once_both_types_answered() {
        let certs = CertManager::new(Arc::new(FakeCa::generate()), Duration::from_secs(3600));
        let pool =
            ambit_hbone::Pool::new(certs.clone(), Box::new(TcpDialer), settings(), Duration::from_secs(60));
        let waypoint = Waypoint::new(Settings::new(waypoint_identity(), [127, 0, 0, 1].into()), certs, pool);
        let held = Arc::new(Mutex::new(Held::default()));
        let apply = Apply { held: held.clone(), waypoint: waypoint.clone() };
        let (destinations, policies) = (Destinations(apply.clone()), Policies(apply));
        let refusals = || held.lock().unwrap_or_else(PoisonError::into_inner).refusals.clone();

        let mut good = service(
            "echo",
            Some("10.96.0.10"),
            &[(80, 8080, api::Protocol::Http)],
            vec![endpoint("10.1.0.1")],
        );
        good.policies = vec!["gw-ns/waypoint/app-ns/deny".to_owned()];
        let mut broken = service("broken", Some("10.96.0.11"), &[(80, 8080, api::Protocol::Http)], vec![]);
        broken.addresses = vec![vec![10, 96, 0]];
        let rejected = destinations.apply(vec![update("echo", good), update("broken", broken)], vec![]).await;
        assert!(rejected.is_empty());
        assert_eq!(waypoint.config().len(), 0, "nothing installed before the policies' first answer");
        assert!(refusals().is_empty(), "{:?}", refusals());

        let deny = api::Policy { name: "deny".into(), namespace: "app-ns".into(), ..Default::default() };
        let rejected = policies.apply(vec![update("gw-ns/waypoint/app-ns/deny", deny)], vec![]).await;
        assert!(rejected.is_empty(), "a refusal is reported, not NACKed");
        assert_eq!(waypoint.config().len(), 1);
        assert_eq!(
            refusals(),
            ["destination broken refused: address 0 has 3 bytes; an IP address has 4 or 16"]
        );

        let rejected = destinations.apply(vec![], vec!["broken".to_owned()]).await;
        assert!(rejected.is_empty());
        assert!(refusals().is_empty(), "{:?}", refusals());
        assert!(held.lock().unwrap_or_else(PoisonError::into_inner).logged.is_empty(), "forgotten once gone");
        let dump = Xds::dump_of(&held);
        assert_eq!(dump.destinations, BTreeMap::from([("echo".to_owned(), "v1".to_owned())]));
        assert_eq!(dump.policies.len(), 1);
    }
}
