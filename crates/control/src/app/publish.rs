//! Translation output → the xDS server's resources: the set of types served (the waypoint
//! types scoped to each waypoint's identity) and the publisher that turns each `Output` into
//! changes.

use ambit_api::type_url::{ADDRESS, AUTHORIZATION, WAYPOINT_DESTINATION, WAYPOINT_POLICY};
use ambit_xds::server::{Changes, Resources, ServerResource};
use prost::Message;

use crate::translate::{Output, Translator};

/// The resource set `ambit control` serves: Address, then Authorization, then the waypoint
/// types, which are scoped (`ambit_xds::server::scope_of` their names, `<gw ns>/<gw name>`): a
/// stream receives only those of its verified identity's `<namespace>/<service account>`
/// (`NodeCheck::scope`), so a waypoint gets its own Gateway's and a node proxy none.
pub(crate) fn resources() -> Resources {
    Resources::with_scoped(
        [ADDRESS, AUTHORIZATION, WAYPOINT_DESTINATION, WAYPOINT_POLICY],
        [WAYPOINT_DESTINATION, WAYPOINT_POLICY],
    )
}

/// Turns translation output into xDS changes.
pub(crate) struct Publisher {
    resources: Resources,
    /// Services each workload was a member of when last published (to refresh the services'
    /// member lists, which on-demand subscribers receive along with a service).
    members: std::collections::HashMap<String, Vec<String>>,
}

impl Publisher {
    /// A publisher into `resources`.
    pub(crate) fn new(resources: Resources) -> Publisher {
        Publisher { resources, members: std::collections::HashMap::new() }
    }

    /// Publishes what one `apply` changed.
    pub(crate) fn publish(&mut self, tr: &Translator, out: Output) {
        if out.is_empty() {
            return;
        }
        let mut address = Changes { type_url: ADDRESS.into(), ..Changes::default() };
        let mut touched_services = std::collections::BTreeSet::new();
        let mut published = std::collections::BTreeSet::new();
        for (name, value) in out.addresses {
            let old = self.members.remove(&name).unwrap_or_default();
            touched_services.extend(old);
            match value {
                Some(a) => {
                    let services = workload_services(&a);
                    touched_services.extend(services.iter().cloned());
                    if !services.is_empty() {
                        self.members.insert(name.clone(), services);
                    }
                    published.insert(name.clone());
                    address.upserts.push(self.resource(tr, name, &a));
                }
                None => address.removals.push(name),
            }
        }
        // Services whose member list changed, with their fresh list.
        for key in touched_services {
            if published.contains(&key) {
                continue;
            }
            if let Some(a) = tr.address(&key) {
                address.upserts.push(self.resource(tr, key, a));
            }
        }
        let authorization = plain(AUTHORIZATION, out.authorizations);
        let destination = plain(WAYPOINT_DESTINATION, out.destinations);
        let policy = plain(WAYPOINT_POLICY, out.policies);
        if let Err(e) = self.resources.publish([address, authorization, destination, policy]) {
            tracing::error!("publishing failed: {e}");
        }
    }

    fn resource(&self, tr: &Translator, name: String, a: &ambit_api::workload::Address) -> ServerResource {
        let is_service = matches!(a.r#type, Some(ambit_api::workload::address::Type::Service(_)));
        ServerResource {
            aliases: tr.aliases(&name),
            also: if is_service { tr.service_members(&name) } else { Vec::new() },
            node: if is_service { None } else { tr.node_of(&name).map(str::to_owned) },
            resource: prost_types::Any { type_url: ADDRESS.into(), value: a.encode_to_vec() },
            name,
        }
    }
}

/// Changes of a type whose resources have no aliases, members or node.
fn plain<M: Message>(type_url: &str, out: Vec<(String, Option<M>)>) -> Changes {
    let mut changes = Changes { type_url: type_url.into(), ..Changes::default() };
    for (name, value) in out {
        match value {
            Some(m) => changes.upserts.push(ServerResource {
                name,
                aliases: Vec::new(),
                resource: prost_types::Any { type_url: type_url.into(), value: m.encode_to_vec() },
                also: Vec::new(),
                node: None,
            }),
            None => changes.removals.push(name),
        }
    }
    changes
}

/// The service keys of a workload Address.
fn workload_services(a: &ambit_api::workload::Address) -> Vec<String> {
    match &a.r#type {
        Some(ambit_api::workload::address::Type::Workload(w)) => w.services.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
