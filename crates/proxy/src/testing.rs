//! Test helpers (never shipped): the proxy's default configuration, local configs served as xDS
//! resources, and generated meshes (HBONE's helpers are `ambit_hbone::testing`); and the inner
//! types the proxy's own tests and benches and the end-to-end tests reach past the public face.

pub use crate::authz::{Connection, evaluate};
pub use crate::config::{ControlSettings, NodeInfo, XdsSettings};
pub use crate::state::{Applied, Delta, HealthStatus, LocalConfig, State, StateStore};
pub use crate::xds::Xds;

/// The proxy's default configuration (shared mode, no state file read).
pub fn config() -> crate::config::Config {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: crate::config::ProxyArgs,
    }
    let cli = Cli::try_parse_from([
        "proxy",
        "--local-xds-path",
        "/dev/null",
        "--xds-address",
        "",
        "--fake-ca",
        "true",
    ])
    .expect("default arguments parse");
    crate::config::Config::from_args_env(&cli.args, &crate::config::Env::new())
        .expect("default configuration is valid")
}

// ---- xDS: a local config served as xDS resources (tests and benchmarks) ----

/// An `Any` holding `msg` under `type_url`.
pub fn any<M: prost::Message>(type_url: &str, msg: &M) -> prost_types::Any {
    prost_types::Any { type_url: type_url.to_owned(), value: msg.encode_to_vec() }
}

/// The `Address` resources istiod would serve for these workloads and services: a workload by
/// uid with its addresses as aliases (`network/ip`), a service by `ns/hostname` with its VIPs as
/// aliases and its member workloads sent along.
pub fn address_resources(
    workloads: &[crate::state::Workload],
    services: &[crate::state::Service],
) -> Vec<ambit_xds::server::ServerResource> {
    use ambit_api::workload as pb;
    let mut members: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for w in workloads {
        for key in w.services.keys() {
            members.entry(key.to_string()).or_default().push(w.uid.to_string());
        }
    }
    let mut out = Vec::with_capacity(workloads.len() + services.len());
    for w in workloads {
        let address = pb::Address { r#type: Some(pb::address::Type::Workload(w.into())) };
        out.push(ambit_xds::server::ServerResource {
            name: w.uid.to_string(),
            aliases: w.workload_ips.iter().map(|ip| format!("{}/{ip}", w.network)).collect(),
            resource: any(ambit_api::type_url::ADDRESS, &address),
            also: Vec::new(),
            node: None,
        });
    }
    for s in services {
        let address = pb::Address { r#type: Some(pb::address::Type::Service(s.into())) };
        out.push(ambit_xds::server::ServerResource {
            name: s.key(),
            aliases: s.vips.iter().map(|v| format!("{}/{}", v.network, v.address)).collect(),
            resource: any(ambit_api::type_url::ADDRESS, &address),
            also: members.remove(&s.key()).unwrap_or_default(),
            node: None,
        });
    }
    out
}

/// The `Authorization` resources for these policies, by `ns/name`.
pub fn authorization_resources(
    policies: &[crate::authz::Authorization],
) -> Vec<ambit_xds::server::ServerResource> {
    policies
        .iter()
        .map(|p| ambit_xds::server::ServerResource {
            name: p.key(),
            aliases: Vec::new(),
            resource: any(ambit_api::type_url::AUTHORIZATION, &ambit_api::security::Authorization::from(p)),
            also: Vec::new(),
            node: None,
        })
        .collect()
}

/// What a test xDS server serving local configs has published: turns each new config into the
/// changes to publish (everything in it as upserts — an unchanged resource is no change to
/// `ambit_xds::server::Resources` — and the names that vanished as removals).
#[derive(Debug, Default)]
pub struct ServedConfig {
    addresses: std::collections::BTreeSet<String>,
    policies: std::collections::BTreeSet<String>,
}

impl ServedConfig {
    /// The changes that take the server from the last config to `cfg`.
    pub fn changes(&mut self, cfg: &crate::state::LocalConfig) -> Vec<ambit_xds::server::Changes> {
        let addresses = address_resources(&cfg.workloads, &cfg.services);
        let policies = authorization_resources(&cfg.policies);
        let names = |r: &[ambit_xds::server::ServerResource]| {
            r.iter().map(|r| r.name.clone()).collect::<std::collections::BTreeSet<_>>()
        };
        let (new_addresses, new_policies) = (names(&addresses), names(&policies));
        let removed_addresses = self.addresses.difference(&new_addresses).cloned().collect();
        let removed_policies = self.policies.difference(&new_policies).cloned().collect();
        self.addresses = new_addresses;
        self.policies = new_policies;
        vec![
            ambit_xds::server::Changes {
                type_url: ambit_api::type_url::ADDRESS.to_owned(),
                upserts: addresses,
                removals: removed_addresses,
            },
            ambit_xds::server::Changes {
                type_url: ambit_api::type_url::AUTHORIZATION.to_owned(),
                upserts: policies,
                removals: removed_policies,
            },
        ]
    }
}

/// A generated mesh for benchmarks and tests, of the shape issue 30's benchmark names: `n`
/// workloads (pods as istiod sends them: every string field set, one IPv4 address, HBONE,
/// locality, one listed policy, one service), `n / 10` services of ten pods each and one policy
/// per 100 workloads (a `serviceAccounts` rule). Names repeat as in a real cluster: 100
/// namespaces, one service account per service, one trust domain, one cluster, 100 pods per
/// node, one region and three zones.
pub mod generated {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr};

    use crate::authz::{Action, Authorization, Match, Scope, ServiceAccountMatch};
    use crate::state::{
        HealthStatus, LocalConfig, Locality, NetworkAddress, NetworkMode, Protocol, Service, Visibility,
        Workload, WorkloadSpec,
    };

    /// The node the benchmarked proxy runs on (workloads 700 to 799 are on it).
    pub const NODE: &str = "node-7";

    /// Namespace of service `s`: the ten services of one policy share it.
    fn namespace(s: usize) -> usize {
        (s / 10) % 100
    }

    pub fn workload_ip(i: usize) -> IpAddr {
        Ipv4Addr::from(0x0a00_0000u32 + i as u32 + 1).into()
    }

    /// Workload `i`: a pod of service `i / 10`, on node `i / 100`, listing policy `i / 100`.
    pub fn workload(i: usize) -> Workload {
        workload_of(i, i / 10)
    }

    /// Workload `i`, an endpoint of service `svc` (in that service's namespace).
    pub fn workload_of(i: usize, svc: usize) -> Workload {
        let ns = namespace(svc);
        let services = [(format!("ns{ns}/app-{svc}.ns{ns}.svc.cluster.local"), BTreeMap::from([(80, 8080)]))]
            .into_iter()
            .collect();
        WorkloadSpec {
            uid: format!("cluster1//v1/Pod/ns{ns}/app-{svc}-5d9c7b8f4-{i}").into(),
            name: format!("app-{svc}-5d9c7b8f4-{i}").into(),
            namespace: format!("ns{ns}").into(),
            workload_ips: vec![workload_ip(i)],
            protocol: Protocol::Hbone,
            trust_domain: "cluster.local".into(),
            service_account: format!("app-{svc}").into(),
            network: Default::default(),
            waypoint: None,
            network_gateway: None,
            node: format!("node-{}", i / 100).into(),
            canonical_name: format!("app-{svc}").into(),
            canonical_revision: "v1".into(),
            workload_name: format!("app-{svc}").into(),
            workload_type: "deployment".into(),
            cluster_id: "cluster1".into(),
            authorization_policies: vec![format!("ns{ns}/allow-{}", i / 100).into()],
            status: HealthStatus::Healthy,
            locality: Locality {
                region: "eu-west-1".into(),
                zone: ["eu-west-1a", "eu-west-1b", "eu-west-1c"][i % 3].into(),
                subzone: Default::default(),
            },
            capacity: 1,
            hostname: Default::default(),
            network_mode: NetworkMode::Standard,
            native_tunnel: false,
            application_tunnel: None,
            services,
        }
        .into()
    }

    /// Service `s`, in namespace `(s / 10) % 100`, of workloads `10 s .. 10 s + 9`.
    pub fn service(s: usize) -> Service {
        let ns = namespace(s);
        Service {
            name: format!("app-{s}"),
            namespace: format!("ns{ns}"),
            hostname: format!("app-{s}.ns{ns}.svc.cluster.local"),
            vips: vec![NetworkAddress {
                network: String::new(),
                address: Ipv4Addr::from(0x0b00_0000u32 + s as u32 + 1).into(),
            }],
            cidr_vips: vec![],
            ports: BTreeMap::from([(80, 8080)]),
            endpoints: Default::default(),
            subject_alt_names: vec![],
            waypoint: None,
            weighted_waypoints: vec![],
            load_balancer: None,
            ip_families: None,
            canonical: false,
            visibility: Visibility::Public,
        }
    }

    /// Policy `p`, selecting workloads `100 p .. 100 p + 99` (they list it), allowing the service
    /// account of the first service of the next hundred workloads (another deployment calling).
    pub fn policy(p: usize) -> Authorization {
        let caller = (p + 1) * 10;
        Authorization {
            name: format!("allow-{p}"),
            namespace: format!("ns{}", p % 100),
            scope: Scope::WorkloadSelector,
            action: Action::Allow,
            rules: vec![vec![vec![Match {
                service_accounts: vec![ServiceAccountMatch {
                    namespace: format!("ns{}", namespace(caller)),
                    service_account: format!("app-{caller}"),
                }],
                ..Match::default()
            }]]],
            dry_run: false,
        }
    }

    /// `workloads` workloads, `workloads / 10` services, one policy per 100 workloads.
    pub fn mesh(workloads: usize) -> LocalConfig {
        LocalConfig {
            workloads: (0..workloads).map(workload).collect(),
            services: (0..workloads / 10).map(service).collect(),
            policies: (0..workloads.div_ceil(100)).map(policy).collect(),
        }
    }

    /// `workloads` workloads spread round-robin over `services` services (at least one), one
    /// policy per 100 workloads.
    pub fn mesh_with(workloads: usize, services: usize) -> LocalConfig {
        let services = services.max(1);
        LocalConfig {
            workloads: (0..workloads).map(|i| workload_of(i, i % services)).collect(),
            services: (0..services).map(service).collect(),
            policies: (0..workloads.div_ceil(100)).map(policy).collect(),
        }
    }

    /// [`mesh`] as ztunnel-format local-config YAML (what `LOCAL_XDS_PATH` reads; ztunnel reads
    /// the same file): the memory benchmark's and the bytes-per-workload guard's input.
    pub fn local_config_yaml(n: usize) -> String {
        serde_saphyr::to_string(&mesh(n)).expect("a generated mesh serializes")
    }
}

/// The inline sizes of the state's types (what `crates/proxy/tests/memory.rs` prints).
pub fn struct_sizes() -> Vec<(&'static str, usize)> {
    use crate::state::{EndpointSet, Locality, Service, State, Workload};
    use std::mem::size_of;
    vec![
        ("Workload", size_of::<Workload>()),
        ("Service", size_of::<Service>()),
        ("EndpointSet", size_of::<EndpointSet>()),
        ("Locality", size_of::<Locality>()),
        ("Authorization", size_of::<crate::authz::Authorization>()),
        ("State", size_of::<State>()),
    ]
}
