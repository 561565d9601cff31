//! End-to-end tests of `ambit proxy` configured over xDS only: a delta ADS server started by the
//! test (built on `ambit-xds`, serving the test's YAML), proxies in dedicated and shared mode in
//! network namespaces, and the proxy started exactly as Istio's ztunnel chart starts ztunnel.
//! Needs root; under `CI=true` a missing privilege fails the test instead of skipping it.

mod common;
mod mesh;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ambit_zds::WorkloadInfo;
use common::*;
use mesh::*;

const MARKER: &[u8] = b"AMBIT-XDS-MARKER-51c2";

/// Port of the test's plaintext xDS server (istiod's plaintext port).
const XDS_PORT: u16 = 15010;

fn uid(p: &MeshPod) -> String {
    format!("uid-{}", p.workload)
}

fn info(p: &MeshPod) -> WorkloadInfo {
    WorkloadInfo { name: p.workload.clone(), namespace: "default".into(), service_account: p.sa.clone() }
}

/// The proxy's readiness answer from inside its pod.
fn readiness(p: &MeshPod) -> (u16, String) {
    p.pod.http_get(p.pod.addr4(15021), "/healthz/ready").unwrap_or((0, String::new()))
}

/// `/config_dump` of a dedicated proxy, parsed.
fn dump(p: &MeshPod) -> serde_json::Value {
    let body = http_body_admin(p);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("config_dump is not JSON ({e}): {body}"))
}

/// The admin port listens on 127.0.0.1 inside the pod.
fn http_body_admin(p: &MeshPod) -> String {
    let addr = std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), 15000);
    let (status, body) = p.pod.run(|| http_get(addr, "/config_dump")).expect("GET /config_dump");
    assert_eq!(status, 200, "/config_dump: {body}");
    body
}

fn workload_uids(dump: &serde_json::Value) -> Vec<String> {
    dump["workloads"]
        .as_array()
        .map(|ws| ws.iter().filter_map(|w| w["uid"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// Two dedicated proxies (pods a and b, node 1) and one shared-mode node proxy (pod c on node 2,
/// handed over ZDS) take their state only from the test's xDS server: not ready before the
/// first sync; mTLS with the source IP kept in every direction; a policy pushed while a
/// connection is open closes it within 1 s; a removed workload disappears; killing the server
/// leaves traffic and readiness untouched, and the restarted server resyncs what changed
/// meanwhile.
#[test]
fn proxies_run_on_state_from_xds_only() {
    if !require_root() {
        return;
    }
    let mut mesh = Mesh::new();
    let node2 = mesh.cluster.add_node("node2");
    let sockets = tempfile::tempdir().expect("tempdir");
    let agent2 = FakeAgent::start(&sockets.path().join("node2.sock"));
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    let c = mesh.pod_on(&node2, "c", "other");
    mesh.write_config(&[&a, &b, &c], &[], &[]);
    let xds_url = format!("http://{}:{XDS_PORT}", mesh.cluster.node().ip4);
    mesh.use_xds(&xds_url);

    // Not ready before the first sync: no server yet.
    let pa = mesh.spawn_proxy_unready(&a, &[]);
    let not_ready = wait_for(|| readiness(&a).0 == 500, Duration::from_secs(10));
    assert!(not_ready, "proxy a's readiness never answered 500 while no xDS server runs:\n{}", pa.logs());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        readiness(&a),
        (500, "not ready, pending: state manager\n".to_owned()),
        "proxy a without xDS state:\n{}",
        pa.logs()
    );
    let mut server =
        XdsServer::start(mesh.cluster.node(), XDS_PORT, mesh.config_path(), XdsOptions::default());
    let synced = wait_for(|| readiness(&a).0 == 200, Duration::from_secs(20));
    assert!(synced, "proxy a not ready after the xDS server started:\n{}", pa.logs());
    let pb = mesh.start_proxy(&b);
    let p2 = mesh.start_node_proxy(&node2, agent2.path(), &[]);
    agent2.add_pod(&uid(&c), info(&c), &c.pod.netns).unwrap_or_else(|e| panic!("add c: NACK {e}"));
    let eb = b.pod.echo_server(8080);
    let ec = c.pod.echo_server(8080);
    let ea = a.pod.echo_server(8080);

    // mTLS everywhere, source IPs kept.
    let cap = mesh.cluster.node().tcpdump(None);
    assert_echo(&a.pod, b.pod.addr4(8080), "a -> b (dedicated -> dedicated)");
    assert_echo(&a.pod, c.pod.addr4(8080), "a -> c (dedicated -> shared, other node)");
    assert_echo(&c.pod, a.pod.addr4(8080), "c -> a (shared -> dedicated)");
    let segments = pcap_payloads(&cap.stop());
    assert!(!segments.is_empty(), "the capture saw no traffic");
    for (src, dst, payload) in &segments {
        assert!(!contains(payload, MARKER), "plaintext seen on the wire: {src} -> {dst}");
    }
    assert_eq!(eb.peer_ips().last(), Some(&IpAddr::V4(a.pod.ip4)), "b's app did not see a's IP");
    assert_eq!(ec.peer_ips().last(), Some(&IpAddr::V4(a.pod.ip4)), "c's app did not see a's IP");
    assert_eq!(ea.peer_ips().last(), Some(&IpAddr::V4(c.pod.ip4)), "a's app did not see c's IP");
    let body = metrics(&b);
    let line = body
        .lines()
        .find(|l| {
            l.starts_with("istio_tcp_connections_opened_total{") && l.contains("reporter=\"destination\"")
        })
        .unwrap_or_else(|| panic!("b counted no inbound connection:\n{body}"));
    assert!(line.contains("source_principal=\"spiffe://cluster.local/ns/default/sa/client\""), "{line}");
    assert!(line.contains("connection_security_policy=\"mutual_tls\""), "{line}");
    let xds_lines: Vec<&str> = body.lines().filter(|l| l.starts_with("istio_xds_message_total{")).collect();
    assert!(xds_lines.len() == 2, "b's xDS message counters (one per type): {xds_lines:?}");

    // A policy pushed while a connection is open closes it within 1 s.
    let mut live = a.pod.connect_tcp(b.pod.addr4(8080)).expect("connect a -> b");
    roundtrip(&mut live, b"ping");
    let deny_client = Policy {
        yaml: "- name: deny-client\n  namespace: default\n  scope: Namespace\n  action: Deny\n  rules: [[[{principals: [{Exact: \"cluster.local/ns/default/sa/client\"}]}]]]\n",
    };
    mesh.write_config(&[&a, &b, &c], &[deny_client], &[]);
    let pushed = Instant::now();
    let closed = expect_close(&mut live, Duration::from_secs(1));
    assert!(closed.is_ok(), "live connection not closed within 1 s of the push: {closed:?}\n{}", pb.logs());
    eprintln!("policy push -> close: {:?}", pushed.elapsed());
    assert!(
        wait_for(
            || pb.logs().contains("closing connection denied after a policy change"),
            Duration::from_secs(2)
        ),
        "b's proxy did not log closing the denied connection:\n{}",
        pb.logs()
    );
    assert_denied(&a.pod, b.pod.addr4(8080), ProxyOf::Pod(&b), "a -> b after deny-client");
    mesh.write_config(&[&a, &b, &c], &[], &[]);
    assert!(
        wait_for(
            || a.pod.connect_tcp(b.pod.addr4(8080)).is_ok_and(|mut s| echo_roundtrip(&mut s, b"x").is_ok()),
            Duration::from_secs(5)
        ),
        "a -> b not allowed again after the policy was removed"
    );

    // A removed workload disappears from every proxy's state.
    let c_uid = "cluster1//v1/Pod/default/c";
    assert!(workload_uids(&dump(&a)).iter().any(|u| u == c_uid), "a does not hold c before the removal");
    mesh.write_config(&[&a, &b], &[], &[]);
    assert!(
        wait_for(|| !workload_uids(&dump(&a)).iter().any(|u| u == c_uid), Duration::from_secs(5)),
        "c still in a's state after its removal: {:?}",
        workload_uids(&dump(&a))
    );
    mesh.write_config(&[&a, &b, &c], &[], &[]);
    assert!(
        wait_for(|| workload_uids(&dump(&a)).iter().any(|u| u == c_uid), Duration::from_secs(5)),
        "c not back in a's state"
    );

    // Kill the server: traffic and readiness are untouched; restart: what changed meanwhile
    // arrives, and the connection opened before the kill still flows.
    let mut long = a.pod.connect_tcp(b.pod.addr4(8080)).expect("connect a -> b");
    roundtrip(&mut long, b"before");
    server.kill();
    std::thread::sleep(Duration::from_millis(300));
    roundtrip(&mut long, b"while the server is down");
    assert_echo(&a.pod, b.pod.addr4(8080), "a -> b, new connection, server down");
    assert_echo(&a.pod, c.pod.addr4(8080), "a -> c, new connection, server down");
    assert_eq!(readiness(&a).0, 200, "a became unready when the xDS server went away");
    let d = mesh.pod("d", "late");
    mesh.write_config(&[&a, &b, &c, &d], &[], &[]);
    server.restart();
    let d_uid = "cluster1//v1/Pod/default/d";
    for (name, p) in [("a", &a), ("b", &b)] {
        assert!(
            wait_for(|| workload_uids(&dump(p)).iter().any(|u| u == d_uid), Duration::from_secs(20)),
            "{name} did not resync after the server restart: {:?}",
            dump(p)["xds"]
        );
    }
    roundtrip(&mut long, b"after the restart");
    let status = &dump(&a)["xds"];
    assert!(status["connection"]["connects"].as_u64().unwrap_or(0) >= 2, "a's xDS status: {status}");
    let terminations = metrics(&a)
        .lines()
        .filter(|l| l.starts_with("istio_xds_connection_terminations_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum::<u64>();
    assert!(terminations >= 1, "a counted no xDS termination after the server was killed");
    drop((pa, pb, p2));
}

/// `ambit proxy ztunnel` with exactly the environment of Istio's ztunnel chart, the chart's
/// mounts (root cert, token, ZDS dir) and an `/etc/hosts` naming istiod: it fetches its state
/// from the test's TLS xDS server with the token, its pods' certificates from the CA on the same
/// port, and serves a pod-to-pod connection.
#[test]
fn starts_as_the_istio_ztunnel_chart_starts_ztunnel() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let node = mesh.cluster.node();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    mesh.write_config(&[&a, &b], &[], &[]);
    let chart = ChartNode::new(node);
    let opts = XdsOptions {
        tls: Some(chart.serving_cert()),
        token: Some(chart.token.clone()),
        ca: Some(chart.ca.clone()),
        debounce: None,
    };
    let server = XdsServer::start(node, 15012, mesh.config_path(), opts);
    let agent = FakeAgent::start(&chart.zds_socket());
    let mut proxy = chart.spawn_ztunnel(node);
    let ready = wait_for(
        || {
            proxy.try_wait().is_none()
                && node_http_get(node, 15021, "/healthz/ready").is_ok_and(|(s, _)| s == 200)
        },
        Duration::from_secs(30),
    );
    assert!(ready, "ztunnel-chart proxy not ready:\n{}", proxy.logs());
    for p in [&a, &b] {
        agent
            .add_pod(&uid(p), info(p), &p.pod.netns)
            .unwrap_or_else(|e| panic!("add {}: NACK {e}", p.pod.name));
    }
    let _eb = b.pod.echo_server(8080);
    assert_echo(&a.pod, b.pod.addr4(8080), "a -> b under the chart's settings");

    let streams = server.streams();
    assert_eq!(streams.len(), 1, "xDS streams: {streams:?}");
    let expected_id =
        format!("ztunnel~{}~ztunnel-x7k2p.istio-system~istio-system.svc.cluster.local", node.ip4);
    assert_eq!(streams[0].node_id, expected_id);
    let requests = chart.ca.requests();
    assert!(
        proxy.wait_for_log("initial xDS sync complete", Duration::from_secs(2)),
        "the proxy did not log its initial sync:\n{}",
        proxy.logs()
    );
    assert!(!requests.is_empty(), "the CA saw no request");
    for r in &requests {
        let auth = r.headers.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.as_str());
        assert_eq!(
            auth,
            Some(format!("Bearer {}", chart.token).as_str()),
            "CA request headers: {:?}",
            r.headers
        );
        let cluster = r.headers.iter().find(|(k, _)| k == "clusterid").map(|(_, v)| v.as_str());
        assert_eq!(cluster, Some("Kubernetes"));
    }
    eprintln!("ztunnel-chart proxy log:\n{}", proxy.logs());
}

/// What Istio's ztunnel chart gives the ztunnel pod, reproduced on one test node: istiod's root
/// certificate at `/var/run/secrets/istio`, the projected token at `/var/run/secrets/tokens`, the
/// ZDS directory `/var/run/ztunnel` (bind mounts in a private mount namespace), istiod's name
/// resolving to the node (`/etc/hosts`), the chart's arguments and environment, working
/// directory `/`.
struct ChartNode {
    dir: tempfile::TempDir,
    token: String,
    ca: std::sync::Arc<ambit_identity::testing::TestCaService>,
    cert_pem: String,
    key_pem: String,
}

/// The name the chart gives istiod.
const ISTIOD: &str = "istiod.istio-system.svc";

impl ChartNode {
    fn new(node: &Node) -> ChartNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let (root_pem, cert_pem, key_pem) = ambit_identity::testing::server_certificate(&[ISTIOD]);
        let token = format!("chart-token-{:08x}", rand::random::<u32>());
        for sub in ["istio", "tokens", "ztunnel"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        std::fs::write(dir.path().join("istio/root-cert.pem"), root_pem).expect("write root");
        std::fs::write(dir.path().join("tokens/istio-token"), &token).expect("write token");
        std::fs::write(dir.path().join("hosts"), format!("127.0.0.1 localhost\n{} {ISTIOD}\n", node.ip4))
            .expect("write hosts");
        let ca = ambit_identity::FakeCa::generate();
        let ca = std::sync::Arc::new(ambit_identity::testing::TestCaService::new(std::sync::Arc::new(ca)));
        ChartNode { dir, token, ca, cert_pem, key_pem }
    }

    /// The xDS server's TLS certificate and key (for istiod's name, signed by the mounted root).
    fn serving_cert(&self) -> (String, String) {
        (self.cert_pem.clone(), self.key_pem.clone())
    }

    /// Where the agent's ZDS socket is (the proxy sees it at `/var/run/ztunnel/ztunnel.sock`).
    fn zds_socket(&self) -> std::path::PathBuf {
        self.dir.path().join("ztunnel/ztunnel.sock")
    }

    /// `ambit proxy ztunnel` as the chart runs ztunnel, in `node`'s netns.
    fn spawn_ztunnel(&self, node: &Node) -> ChildGuard {
        let mounts = [
            ("istio", "/var/run/secrets/istio"),
            ("tokens", "/var/run/secrets/tokens"),
            ("ztunnel", "/var/run/ztunnel"),
        ];
        for (_, target) in mounts {
            std::fs::create_dir_all(target).unwrap_or_else(|e| panic!("mkdir {target}: {e}"));
        }
        let mut script = String::from("set -e; mount --make-rprivate /; ");
        for (sub, target) in mounts {
            script.push_str(&format!("mount --bind '{}' '{target}'; ", self.dir.path().join(sub).display()));
        }
        script.push_str(&format!("mount --bind '{}' /etc/hosts; ", self.dir.path().join("hosts").display()));
        script.push_str("cd /; exec ip netns exec \"$0\" \"$1\" proxy ztunnel");
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--", "sh", "-c", &script, &node.netns, env!("CARGO_BIN_EXE_ambit")]);
        cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
        // Exactly what the chart's DaemonSet sets (downward API values filled in).
        for (k, v) in [
            ("CA_ADDRESS", format!("{ISTIOD}:15012")),
            ("XDS_ADDRESS", format!("{ISTIOD}:15012")),
            ("RUST_LOG", "info".to_owned()),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes".to_owned()),
            ("INPOD_ENABLED", "true".to_owned()),
            ("TERMINATION_GRACE_PERIOD_SECONDS", "30".to_owned()),
            ("POD_NAME", "ztunnel-x7k2p".to_owned()),
            ("POD_NAMESPACE", "istio-system".to_owned()),
            ("NODE_NAME", node.name.clone()),
            ("INSTANCE_IP", node.ip4.to_string()),
            ("SERVICE_ACCOUNT", "ztunnel".to_owned()),
            ("ZTUNNEL_CPU_LIMIT", "2".to_owned()),
        ] {
            cmd.env(k, v);
        }
        ChildGuard::spawn("ztunnel-chart proxy", cmd)
    }
}
