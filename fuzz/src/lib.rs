//! Fixtures the fuzz targets share: a small mesh, the DNS proxy of one of its pods, and a
//! runtime to drive async entry points. Targets stay a few lines each: one parser call on the
//! input, plus the checks every accepted value must pass.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use ambit_proxy::fuzzing::{DnsClient, DnsConfig, DnsMetrics, DnsProxy, UpstreamSockets};
use ambit_proxy::fuzzing::{LocalConfig, State, StateStore};

/// The mesh every target that needs state uses: two pods, a service with both VIP families,
/// a headless service and a waypoint-free namespace policy.
pub const MESH: &str = r#"
workloads:
- uid: cluster1//v1/Pod/default/a
  name: a
  namespace: default
  serviceAccount: client
  workloadIps: ["10.244.7.2", "fd00:244:7::2"]
  protocol: HBONE
  services: {"default/echo.default.svc.cluster.local": {80: 8080}}
- uid: cluster1//v1/Pod/default/b
  name: b
  namespace: default
  serviceAccount: web
  workloadIps: ["10.244.7.3"]
  protocol: HBONE
  services: {"default/headless.default.svc.cluster.local": {80: 80}}
services:
- {name: echo, namespace: default, hostname: echo.default.svc.cluster.local,
   vips: ["/10.96.77.10", "/fd00:96:77::10"], ports: {80: 8080}}
- {name: headless, namespace: default, hostname: headless.default.svc.cluster.local}
policies:
- name: only-client
  namespace: default
  scope: Namespace
  action: Allow
  rules: [[[{principals: [{Exact: "cluster.local/ns/default/sa/client"}]}]]]
"#;

/// [`MESH`] as proxy state (built once).
pub fn mesh() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(build_mesh)
}

fn build_mesh() -> State {
    let cfg = LocalConfig::parse(MESH).unwrap_or_else(|e| panic!("fixture MESH does not parse: {e}"));
    State::from_config(cfg, None).unwrap_or_else(|e| panic!("fixture MESH is not a valid state: {e}"))
}

/// A single-threaded runtime for async entry points.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("cannot build a tokio runtime: {e}"))
    })
}

/// The DNS proxy of pod `a` of [`MESH`], with no upstream resolvers (forwarding fails at
/// once, without I/O).
pub fn dns_proxy() -> &'static Arc<DnsProxy> {
    static PROXY: OnceLock<Arc<DnsProxy>> = OnceLock::new();
    PROXY.get_or_init(|| {
        let cfg = DnsConfig {
            cluster_domain: "cluster.local".to_owned(),
            ipv6_enabled: true,
            preferred_namespace: None,
            upstreams: Vec::new(),
            search_domains: DnsConfig::pod_search_domains("default", "cluster.local"),
        };
        let client = DnsClient { namespace: "default".to_owned(), network: String::new(), workload: None };
        DnsProxy::new(
            StateStore::new(build_mesh()),
            Arc::new(cfg),
            client,
            Arc::new(NoUpstream),
            DnsMetrics::default(),
        )
    })
}

/// Upstream sockets that cannot be had (never reached: the fixture has no upstreams).
struct NoUpstream;

impl UpstreamSockets for NoUpstream {
    fn udp(&self, _upstream: SocketAddr) -> std::io::Result<tokio::net::UdpSocket> {
        Err(std::io::Error::other("no upstream in the fuzz fixture"))
    }

    fn tcp(
        &self,
        _upstream: SocketAddr,
    ) -> futures_boxed::BoxFuture<'_, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(async { Err(std::io::Error::other("no upstream in the fuzz fixture")) })
    }
}

mod futures_boxed {
    /// The boxed future type of [`ambit_proxy::fuzzing::UpstreamSockets::tcp`].
    pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;
}
