//! Benchmark (not a test): `ambit control` (local mode) on a generated YAML folder of N pods
//! (100 namespaces, 100 nodes, one Service per 10 pods, one AuthorizationPolicy per Service, a
//! mesh-wide STRICT PeerAuthentication), for N in `BENCH_CONTROL_SIZES` (default
//! `10000,100000`). A raw delta ADS client (wildcard Address + Authorization, as ztunnel
//! subscribes) connects to the plaintext port. Prints, per N:
//!
//! - initial sync: process start → `/ready` 200 (every file read and translated), and start →
//!   the client's first Address response received in full;
//! - memory: the control plane's RSS once ready and after serving the client;
//! - bytes on the wire per workload: the first Address response's encoded size / N;
//! - one pod changed among N: `BENCH_CONTROL_UPDATES` (default 50) edits of one pod's file (a
//!   new `version` label, so its canonical revision changes), each timed from the file's rename to the push arriving at the client
//!   (p50, p99), with the number of resources in each push (must be exactly 1);
//! - the same edit to a proxy's applied state: a real `ambit proxy` (shared mode, wildcard
//!   subscription, plaintext xDS, no pods) is connected too, and each edit is also timed from the
//!   rename to the control plane seeing the proxy ACK the push (the proxy ACKs after applying);
//!   `/debug/connections` is polled every millisecond for it.
//!
//! `cargo test --release -p ambit --test bench_control -- --ignored --nocapture` (no root needed).

mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ambit_api::type_url::{ADDRESS, AUTHORIZATION};
use ambit_api::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use common::*;
use prost::Message;

const PODS_PER_FILE: usize = 1000;
const NAMESPACES: usize = 100;
const NODES: usize = 100;

fn sizes() -> Vec<usize> {
    std::env::var("BENCH_CONTROL_SIZES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn updates() -> usize {
    std::env::var("BENCH_CONTROL_UPDATES").ok().and_then(|v| v.parse().ok()).unwrap_or(50)
}

/// The pods of one file (`file` 0-based); pod `changed.0` gets version label `changed.1`.
fn pods_file(file: usize, n: usize, changed: Option<(usize, usize)>) -> String {
    let mut y = String::new();
    for i in file * PODS_PER_FILE..((file + 1) * PODS_PER_FILE).min(n) {
        let svc = i / 10;
        let ns = svc % NAMESPACES;
        // The version label is the workload's canonical revision: a new value changes it.
        let version = match changed {
            Some((p, v)) if p == i => format!("v-edit-{v}"),
            _ => "v1".to_owned(),
        };
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{i}\n  namespace: ns-{ns}\n  uid: uid-{i}\n  generateName: app-{svc}-\n  labels:\n    app: app-{svc}\n    version: {version}\nspec:\n  nodeName: node-{node}\n  serviceAccountName: sa-{svc}\n  containers:\n  - name: app\n    image: app\n    ports:\n    - name: http\n      containerPort: 8080\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n  conditions:\n  - type: Ready\n    status: \"True\"\n",
            node = i % NODES,
            ip = pod_ip(i),
        );
    }
    y
}

fn pod_ip(i: usize) -> String {
    format!("10.{}.{}.{}", 1 + i / 65_536, (i / 256) % 256, i % 256)
}

/// Namespaces, nodes, services (one per 10 pods, in the pods' namespace), policies.
fn write_mesh(dir: &Path, n: usize) {
    let mut y = String::new();
    for ns in 0..NAMESPACES {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns-{ns}\n  labels:\n    istio.io/dataplane-mode: ambient\n"
        );
    }
    for node in 0..NODES {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: node-{node}\n  labels:\n    topology.kubernetes.io/region: r1\n    topology.kubernetes.io/zone: z{}\n",
            node % 3
        );
    }
    y.push_str("---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: default\n  namespace: istio-system\nspec:\n  mtls:\n    mode: STRICT\n");
    std::fs::write(dir.join("mesh.yaml"), y).expect("mesh.yaml");
    let services = n.div_ceil(10);
    for chunk in 0..services.div_ceil(PODS_PER_FILE) {
        let mut y = String::new();
        for svc in chunk * PODS_PER_FILE..((chunk + 1) * PODS_PER_FILE).min(services) {
            // The pods of a service are i = 10·svc … 10·svc + 9, all in its namespace.
            let ns = svc % NAMESPACES;
            let _ = write!(
                y,
                "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{svc}\n  namespace: ns-{ns}\nspec:\n  selector:\n    app: app-{svc}\n  clusterIP: 10.96.{}.{}\n  ports:\n  - name: http\n    port: 80\n    targetPort: http\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow-{svc}\n  namespace: ns-{ns}\nspec:\n  selector:\n    matchLabels:\n      app: app-{svc}\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/ns-{ns}/sa/sa-{}\"]\n    to:\n    - operation:\n        ports: [\"8080\"]\n",
                svc / 256 % 256,
                svc % 256,
                svc + 1,
            );
        }
        std::fs::write(dir.join(format!("svc-{chunk:04}.yaml")), y).expect("services");
    }
    for file in 0..n.div_ceil(PODS_PER_FILE) {
        std::fs::write(dir.join(format!("pods-{file:04}.yaml")), pods_file(file, n, None)).expect("pods");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

fn http_ok(port: u16, path: &str) -> bool {
    http_get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).is_ok_and(|(s, _)| s == 200)
}

fn node() -> Node {
    let mut meta = prost_types::Struct::default();
    for (k, v) in [("NAMESPACE", "istio-system"), ("NODE_NAME", "node-0"), ("CLUSTER_ID", "Kubernetes")] {
        meta.fields.insert(
            k.into(),
            prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(v.into())) },
        );
    }
    Node {
        id: "ztunnel~10.0.0.1~ztunnel-bench.istio-system~istio-system.svc.cluster.local".into(),
        metadata: Some(meta),
        ..Node::default()
    }
}

/// The next Address response (Authorization ones are acked and skipped), acked.
async fn next_address(
    stream: &mut tonic::Streaming<DeltaDiscoveryResponse>,
    tx: &tokio::sync::mpsc::Sender<DeltaDiscoveryRequest>,
) -> DeltaDiscoveryResponse {
    loop {
        let r = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("a push within 30 s")
            .expect("recv")
            .expect("stream open");
        let ack = DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..DeltaDiscoveryRequest::default()
        };
        tx.send(ack).await.expect("ack");
        if r.type_url == ADDRESS {
            return r;
        }
    }
}

/// The proxy's Address subscription on the control plane's `/debug/connections`: the nonce
/// last sent and whether the proxy has ACKed it.
fn proxy_address_nonce(monitoring: u16, node: &str) -> Option<(String, bool)> {
    let (status, body) =
        http_get(std::net::SocketAddr::from(([127, 0, 0, 1], monitoring)), "/debug/connections").ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let stream = v["streams"].as_array()?.iter().find(|s| s["node_name"] == node)?;
    let t = stream["types"].as_array()?.iter().find(|t| t["type_url"] == ADDRESS)?;
    let last = t["last_nonce"].as_str()?.to_owned();
    let acked = t["acked_nonces"].as_array()?.last().and_then(|n| n.as_str()) == Some(last.as_str());
    Some((last, acked))
}

/// Waits until the proxy has ACKed an Address push other than `before`; returns its nonce.
fn proxy_applied(monitoring: u16, node: &str, before: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((nonce, true)) = proxy_address_nonce(monitoring, node)
            && nonce != before
        {
            return nonce;
        }
        assert!(Instant::now() < deadline, "the proxy did not ACK a new Address push within 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A shared-mode `ambit proxy` subscribed (wildcard) to the control plane's plaintext port,
/// as node `node` with no pods (its ZDS socket does not exist).
fn spawn_proxy(dir: &Path, grpc: u16, node: &str) -> ChildGuard {
    let url = format!("http://127.0.0.1:{grpc}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ambit"));
    cmd.arg("proxy")
        .env("PROXY_MODE", "shared")
        .env("XDS_ADDRESS", &url)
        .env("CA_ADDRESS", &url)
        .env("FAKE_CA", "false")
        .env("NODE_NAME", node)
        .env("INPOD_UDS", dir.join("no-agent.sock"))
        .env("AMBIT_ADMIN_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("AMBIT_STATS_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("AMBIT_READINESS_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "warn");
    ChildGuard::spawn("proxy", cmd)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture (release build)"]
fn control_plane_scale() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for n in sizes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (config, state) = (dir.path().join("config"), dir.path().join("state"));
        std::fs::create_dir_all(&config).expect("config dir");
        let t = Instant::now();
        write_mesh(&config, n);
        println!("N={n}: wrote the YAML folder in {:?}", t.elapsed());
        let (grpc, monitoring, ready) = (free_port(), free_port(), free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ambit"));
        cmd.args(["control", "--config"])
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .args(["--secure-grpc-addr", "", "--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--monitoring-addr", &format!("127.0.0.1:{monitoring}")])
            .args(["--http-addr", &format!("127.0.0.1:{ready}")])
            .env("RUST_LOG", "warn");
        let started = Instant::now();
        let mut control = ChildGuard::spawn("control", cmd);
        let up =
            wait_for(|| control.try_wait().is_none() && http_ok(ready, "/ready"), Duration::from_secs(600));
        assert!(up, "ambit control did not become ready:\n{}", control.logs());
        let ready_after = started.elapsed();
        let rss_ready = rss_kib(control.pid());
        let proxy = spawn_proxy(dir.path(), grpc, "node-1");
        let synced = wait_for(
            || proxy_address_nonce(monitoring, "node-1").is_some_and(|(_, acked)| acked),
            Duration::from_secs(600),
        );
        assert!(synced, "the proxy did not sync:\n{}", proxy.logs());
        let proxy_synced = started.elapsed();

        let figures = rt.block_on(async {
            let url = format!("http://127.0.0.1:{grpc}");
            let mut client = AggregatedDiscoveryServiceClient::connect(url)
                .await
                .expect("connect")
                .max_decoding_message_size(usize::MAX);
            let (tx, rx) = tokio::sync::mpsc::channel::<DeltaDiscoveryRequest>(16);
            let wildcard = |type_url: &str| DeltaDiscoveryRequest {
                node: Some(node()),
                type_url: type_url.into(),
                resource_names_subscribe: vec!["*".into()],
                ..DeltaDiscoveryRequest::default()
            };
            tx.send(wildcard(ADDRESS)).await.expect("send");
            tx.send(wildcard(AUTHORIZATION)).await.expect("send");
            let mut stream = client
                .delta_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .expect("stream")
                .into_inner();
            let ack = |r: &DeltaDiscoveryResponse| DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                ..DeltaDiscoveryRequest::default()
            };
            let mut first_address: Option<(Duration, usize, usize)> = None;
            let mut authorizations = 0;
            while first_address.is_none() || authorizations == 0 {
                let r = stream.message().await.expect("recv").expect("stream open");
                tx.send(ack(&r)).await.expect("ack");
                if r.type_url == ADDRESS {
                    first_address = Some((started.elapsed(), r.resources.len(), r.encoded_len()));
                } else {
                    authorizations = r.resources.len();
                }
            }
            let (synced, addresses, bytes) = first_address.unwrap_or_default();
            let rss_served = rss_kib(control.pid());

            // One pod changed among N: rewrite its file with a new label value.
            let mut latencies = Vec::new();
            let mut applied = Vec::new();
            let mut sizes = Vec::new();
            let mut nonce = proxy_address_nonce(monitoring, "node-1").map(|(n, _)| n).unwrap_or_default();
            for u in 0..updates() {
                let pod = (u * 7919) % n;
                let file = pod / PODS_PER_FILE;
                let path = config.join(format!("pods-{file:04}.yaml"));
                let tmp = config.join(".edit.tmp");
                std::fs::write(&tmp, pods_file(file, n, Some((pod, u)))).expect("edit");
                let t = Instant::now();
                std::fs::rename(&tmp, &path).expect("rename");
                let r = next_address(&mut stream, &tx).await;
                latencies.push(t.elapsed());
                sizes.push(r.resources.len() + r.removed_resources.len());
                nonce = proxy_applied(monitoring, "node-1", &nonce);
                applied.push(t.elapsed());
                // Put the file back (another change, not timed) so the next edit is one pod.
                std::fs::write(&tmp, pods_file(file, n, None)).expect("restore");
                std::fs::rename(&tmp, &path).expect("rename");
                next_address(&mut stream, &tx).await;
                nonce = proxy_applied(monitoring, "node-1", &nonce);
            }
            (synced, addresses, bytes, authorizations, rss_served, latencies, applied, sizes)
        });
        let (synced, addresses, bytes, authorizations, rss_served, mut latencies, mut applied, sizes) =
            figures;
        latencies.sort();
        applied.sort();
        let rss_end = rss_kib(control.pid());
        println!(
            "N={n}: ready {ready_after:?}; first Address response at {synced:?} ({addresses} resources, {bytes} bytes = {:.0} B/workload); {authorizations} authorizations",
            bytes as f64 / n as f64
        );
        println!(
            "N={n}: RSS ready {} MiB, after serving {} MiB, at the end {} MiB",
            rss_ready / 1024,
            rss_served / 1024,
            rss_end / 1024
        );
        println!(
            "N={n}: one pod edited → push: p50 {:?} p99 {:?} max {:?} over {} edits; resources per push {:?}",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies.last().copied().unwrap_or_default(),
            latencies.len(),
            sizes.iter().collect::<std::collections::BTreeSet<_>>()
        );
        println!(
            "N={n}: proxy synced (first Address push ACKed) at {proxy_synced:?}; one pod edited → proxy applied and ACKed: p50 {:?} p99 {:?} max {:?}; proxy RSS {} MiB",
            percentile(&applied, 0.5),
            percentile(&applied, 0.99),
            applied.last().copied().unwrap_or_default(),
            rss_kib(proxy.pid()) / 1024
        );
        assert!(sizes.iter().all(|s| *s == 1), "a push of one changed pod carried {sizes:?} resources");
        control.stop(Duration::from_secs(5));
    }
}
