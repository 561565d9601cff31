//! `ambit dashboard` in a real browser: the demo cluster (`ambit up --demo`, whose owner serves
//! the page), its flows run, then headless Chromium driven by Selenium (`tests/dashboard/
//! drive.py`) asserts on the page's DOM: the demo's workloads and Services, the edges its flows
//! made, mTLS and plaintext edges marked, the denied edges red with their counts, a click on a
//! denied edge showing the policy that denied it, and a policy applied live (`ambit apply`) with
//! a connection it denies appearing within 10 s without a reload. The screenshots are saved in
//! `target/ci-artifacts/` (or `$AMBIT_ARTIFACTS_DIR`).
//!
//! Needs root, and Python with Selenium plus Debian's `chromium` and `chromium-driver`
//! (`.ci/run` installs them and exports `AMBIT_SELENIUM_PYTHON`). Under `CI=true` anything
//! missing fails the test; otherwise it is skipped with the reason.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// Where `.ci/run` puts the Selenium venv.
const DEFAULT_PYTHON: &str = "/opt/ambit-selenium/bin/python3";

/// A policy applied while the page is open: demo/client may no longer reach the servers.
const LIVE_POLICY: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: server-deny-client
  namespace: demo
spec:
  selector:
    matchLabels:
      app: server
  action: DENY
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/demo/sa/client"]
"#;

/// The Python that runs drive.py, or why there is none (a panic under `CI=true`).
fn selenium() -> Option<PathBuf> {
    let python = std::env::var_os("AMBIT_SELENIUM_PYTHON")
        .map_or_else(|| PathBuf::from(DEFAULT_PYTHON), PathBuf::from);
    let check = Command::new(&python).args(["-c", "import selenium; print(selenium.__version__)"]).output();
    let why = match check {
        Ok(o) if o.status.success() => {
            if Path::new("/usr/bin/chromium").is_file() && Path::new("/usr/bin/chromedriver").is_file() {
                return Some(python);
            }
            "Debian's chromium and chromium-driver are not installed".to_owned()
        }
        Ok(o) => format!(
            "{} cannot import selenium: {}",
            python.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run {}: {e} (set AMBIT_SELENIUM_PYTHON)", python.display()),
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the browser test cannot run in CI: {why}");
    }
    eprintln!("skipping: {why}");
    None
}

/// A raw HTTP/1.1 request to the dashboard with a `Host` of our choosing: status and body.
fn raw(addr: SocketAddr, method: &str, path: &str, host: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect to the dashboard");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, head.to_owned(), body.to_owned())
}

fn artifacts() -> PathBuf {
    let dir = std::env::var_os("AMBIT_ARTIFACTS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ci-artifacts"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

#[test]
fn the_dashboard_draws_the_demo_and_follows_a_live_policy_in_a_browser() {
    if !require_root() {
        return;
    }
    let Some(python) = selenium() else { return };
    let mut c = LocalCluster::new();
    let r = c.up_demo_with(&["--dashboard", "127.0.0.1:0"]);
    assert_eq!(r.code, Some(0), "ambit up --demo:\n{r}\n{}", c.logs());
    let url =
        std::fs::read_to_string(c.run_dir.join("dashboard")).expect("the owner says where the dashboard is");
    let url = url.trim().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "the dashboard is not served: {url}");
    assert!(r.stdout.contains(&format!("dashboard   {url}")), "the summary shows the dashboard:\n{r}");
    assert!(r.stdout.contains(&format!("The mesh in a browser, these flows drawn: {url}")), "{r}");
    assert_eq!(c.status()["dashboard"], url.as_str(), "ambit status says where the dashboard is");
    let addr: SocketAddr =
        url.trim_start_matches("http://").trim_end_matches('/').parse().expect("an address");

    // What the server refuses, before the browser.
    let host = format!("127.0.0.1:{}", addr.port());
    let (code, head, _) = raw(addr, "GET", "/", &host);
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("content-security-policy: default-src 'self'"), "{head}");
    let (code, _, body) = raw(addr, "GET", "/api/graph", "rebound.example.com");
    assert_eq!(
        (code, body.as_str()),
        (403, r#"{"error":"Host \"rebound.example.com\" is not this dashboard's address"}"#)
    );
    let (code, head, body) = raw(addr, "POST", "/api/graph", &host);
    assert_eq!((code, body.as_str()), (405, r#"{"error":"the dashboard is read-only: GET and HEAD only"}"#));
    assert!(head.contains("allow: GET, HEAD"), "{head}");
    let (code, _, body) =
        raw(addr, "GET", "/api/edge?id=workload/demo/nobody-%3Eworkload/demo/client", &host);
    assert_eq!(
        (code, body.as_str()),
        (404, r#"{"error":"no edge workload/demo/nobody->workload/demo/client in the graph now"}"#)
    );

    let policy = c.file("live-policy.yaml", LIVE_POLICY);
    let server1 = c.addr("demo/server-1", 8080).to_string();
    let client = c.pod("demo/client").netns;
    // Connections until the policy is in force on node2 (the first one it denies ends the loop).
    let denied_by_client = format!(
        "for i in $(seq 100); do ip netns exec {client} {} app client {server1} --count 1 >/dev/null 2>&1 || exit 0; \
         sleep 0.1; done; echo 'the live policy never denied client → server-1' >&2; exit 1",
        ambit_bin()
    );
    let expect = json!({
        "nodes": [
            "workload/demo/client", "workload/demo/other", "workload/demo/server", "workload/demo/api-v1",
            "workload/demo/api-v2", "workload/demo/waypoint", "workload/plain/outsider", "workload/plain/web",
            "service/demo/server", "service/demo/api",
        ],
        "kinds": {
            "workload/demo/waypoint": "waypoint", "service/demo/api": "service", "workload/demo/server": "workload",
        },
        "mtlsEdges": [
            "workload/demo/client->service/demo/server", "service/demo/server->workload/demo/server",
            "workload/demo/client->service/demo/api", "service/demo/api->workload/demo/api-v1",
        ],
        "plaintextEdges": ["workload/demo/client->workload/plain/web", "workload/plain/outsider->service/demo/server"],
        // A workload's panel: its pods and nodes, identity, certificates, policies in words, denials.
        "nodePanels": [{"id": "workload/demo/server", "contains": [
            "server-0", "server-1", "node1", "node2", "spiffe://cluster.local/ns/demo/sa/server",
            "Available", "server-allow-client", "allows from principal cluster.local/ns/demo/sa/client",
            "mTLS required: plaintext connections are refused", "allow policies exist, but none allowed",
        ]}],
        "deniedEdges": [
            {"id": "workload/demo/other->service/demo/server", "count": 1, "policy": "demo/server-allow-client"},
            {"id": "workload/plain/outsider->service/demo/server", "count": 1, "policy": "demo/strict"},
            {"id": "workload/demo/client->service/demo/api", "count": 1, "policy": "demo/api-read"},
        ],
        "live": {
            "command": [ambit_bin(), "apply", "-f", policy],
            "node": "workload/demo/server",
            "policies": 3,
            "then": [["sh", "-c", denied_by_client]],
            "edge": "workload/demo/client->service/demo/server",
            "denied": 1,
            "within": 10,
        },
        "maxFirstRenderMs": 2000,
    });
    let dir = artifacts();
    let expect_file = c.file("expect.json", &expect.to_string());
    let report_file = c.scratch.path().join("report.json");
    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/drive.py"))
        .args(["--url", &url, "--expect"])
        .arg(&expect_file)
        .arg("--screenshot")
        .arg(dir.join("dashboard-demo.png"))
        .arg("--report")
        .arg(&report_file)
        .env("AMBIT_UP_RUN_DIR", &c.run_dir)
        .env("AMBIT_UP_TAG", &c.tag)
        .env("AMBIT_UP_CONTEXT", &c.context)
        .output();
    let ran = Ran::of(out, "drive.py");
    println!("{ran}");
    assert_eq!(ran.code, Some(0), "the page is not what the demo's flows made:\n{ran}\n{}", c.logs());
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&report_file).expect("drive.py's report"))
            .expect("JSON");
    println!("screenshots in {}; report {report}", dir.display());

    // The live denial the page showed is the one the server's proxy counted.
    let node = c.pod("demo/server-1").node;
    let metrics = c.proxy_metrics(&node);
    let denied = probe_sum(&metrics, "spiffe://cluster.local/ns/demo/sa/client");
    assert_eq!(denied, 1.0, "node2's proxy counted the live policy's denial");
}

/// `istio_tcp_connections_failed_total` with the DENY flag from `principal`, as destination.
fn probe_sum(metrics: &str, principal: &str) -> f64 {
    ambit_cluster::probe::metric_sum(
        metrics,
        "istio_tcp_connections_failed_total",
        &[("reporter", "destination"), ("response_flags", "DENY"), ("source_principal", principal)],
    )
}

/// Namespaces × Deployments × replicas of the scale test: 200 pods.
const SCALE: (usize, usize, usize) = (5, 10, 4);

/// The scale test's objects: in each of 5 enrolled namespaces, 5 Deployments of echo servers
/// with a Service each and 5 of idle clients, 4 replicas each, and a policy that lets only the
/// namespace's clients reach its servers.
fn scale_objects() -> String {
    let (namespaces, deployments, replicas) = SCALE;
    let mut out = String::new();
    for n in 0..namespaces {
        let ns = format!("team{n}");
        out += &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    istio.io/dataplane-mode: ambient\n---\n"
        );
        for d in 0..deployments {
            let server = d < deployments / 2;
            let name = if server { format!("api{d}") } else { format!("client{d}") };
            let command = if server { r#"[ambit, app, echo, --port, "8080"]"# } else { "[sleep, infinity]" };
            out += &format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  \
                 replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      \
                 labels: {{app: {name}, role: {role}}}\n    spec:\n      containers:\n      - name: main\n        \
                 command: {command}\n---\n",
                role = if server { "server" } else { "client" },
            );
            if server {
                out += &format!(
                    "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  \
                     selector: {{app: {name}}}\n  ports:\n  - {{name: tcp, port: 80, targetPort: 8080}}\n---\n"
                );
            }
        }
        out += &format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: servers\n  namespace: {ns}\n\
             spec:\n  selector:\n    matchLabels: {{role: server}}\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n        \
             namespaces: [\"{ns}\"]\n---\n"
        );
    }
    out
}

#[test]
fn the_page_draws_200_pods_on_6_nodes_within_2_s_of_loading() {
    if !require_root() {
        return;
    }
    let Some(python) = selenium() else { return };
    let (namespaces, deployments, replicas) = SCALE;
    let mut c = LocalCluster::new();
    let config = c.config(&scale_objects());
    c.up_with(6, &config, &["--dashboard", "127.0.0.1:0"]);
    let state = c.state();
    assert_eq!(state.pods.len(), namespaces * deployments * replicas, "200 pods");
    // Traffic: each client Deployment's first pod to a Service of its namespace.
    let mut expected_edges = Vec::new();
    for n in 0..namespaces {
        for d in deployments / 2..deployments {
            let api = d - deployments / 2;
            let from = format!("team{n}/client{d}-0");
            let svc = service_ip(&c, &format!("team{n}"), &format!("api{api}"));
            c.client(&from, &format!("{svc}:80"), 2);
            expected_edges.push(format!("workload/team{n}/client{d}->service/team{n}/api{api}"));
        }
    }
    let url = std::fs::read_to_string(c.run_dir.join("dashboard")).expect("the dashboard's address");
    let expect = json!({
        "nodes": ["workload/team0/client5", "service/team4/api4", "workload/team3/api2"],
        "mtlsEdges": expected_edges,
        "maxFirstRenderMs": 2000,
    });
    let expect_file = c.file("expect.json", &expect.to_string());
    let report_file = c.scratch.path().join("report.json");
    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/drive.py"))
        .args(["--url", url.trim(), "--expect"])
        .arg(&expect_file)
        .arg("--screenshot")
        .arg(artifacts().join("dashboard-200-pods.png"))
        .arg("--report")
        .arg(&report_file)
        .output();
    let ran = Ran::of(out, "drive.py");
    println!("{ran}");
    assert_eq!(ran.code, Some(0), "the page does not draw the 200 pods as expected:\n{ran}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&report_file).expect("drive.py's report"))
            .expect("JSON");
    let first = report["firstRenderMs"].as_f64().expect("firstRenderMs");
    let bytes = report["refreshBytes"].as_u64().expect("refreshBytes");
    println!("200 pods on 6 nodes: first render {first:.0} ms, one refresh {bytes} bytes");
    assert!(first <= 2000.0, "first render took {first} ms");
    // 50 workloads, 25 Services and their edges: a refresh stays small.
    assert!(bytes > 0 && bytes <= 64 * 1024, "one refresh transferred {bytes} bytes");
}

/// The virtual IP `ambit up` gave Service `ns/name`.
fn service_ip(c: &LocalCluster, ns: &str, name: &str) -> String {
    let (code, body) = c.control_get("/debug/config_dump?type=address");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    let key = format!("{ns}/{name}.{ns}.svc.cluster.local");
    v["addresses"][&key]["service"]["addresses"][0]
        .as_str()
        .and_then(|a| a.rsplit('/').next())
        .unwrap_or_else(|| panic!("no Service {key} in the control plane's dump"))
        .to_owned()
}

#[test]
fn a_dashboard_without_login_is_not_served_beyond_loopback_unless_asked() {
    let out = Command::new(ambit_bin()).args(["dashboard", "--address", "0.0.0.0", "--port", "0"]).output();
    let r = Ran::of(out, "ambit dashboard");
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stderr.trim(),
        "ambit dashboard: 0.0.0.0 is not a loopback address and the dashboard has no login: anyone who \
         reaches it sees the mesh's workloads, policies and traffic; add --allow-remote to serve there anyway"
    );
    let out = Command::new(ambit_bin()).args(["dashboard", "--control", "http://127.0.0.1:15014"]).output();
    let r = Ran::of(out, "ambit dashboard");
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr.contains("the following required arguments were not provided:\n  --prometheus <PROMETHEUS>"),
        "{r}"
    );
    if !require_root() {
        return;
    }
    let c = LocalCluster::new();
    let r = c.ambit(&["up", "--dashboard", "10.0.0.1:15600"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stderr.trim(),
        "ambit up: --dashboard 10.0.0.1:15600: the cluster's dashboard is served on loopback addresses only \
         (it has no login); `ambit dashboard --address … --allow-remote` serves it elsewhere"
    );
    assert!(!c.run_dir.exists(), "nothing was built");
}

/// A one-thread HTTP/1.0 server answering each GET by `answer(path)`, for as long as the test runs.
fn fake_server(answer: fn(&str) -> (u16, String)) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 && s.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let (code, body) = answer(&path);
            let _ = write!(s, "HTTP/1.0 {code} X\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        }
    });
    addr
}

/// A control plane's monitoring port: two workloads of one namespace, a Service, a policy.
fn control_answer(path: &str) -> (u16, String) {
    let body = match path {
        "/debug/config_dump?type=address" => json!({"addresses": {
            "Kubernetes//Pod/shop/web-7d9-abc": {"workload": {"addresses": ["10.0.1.5"], "name": "web-7d9-abc",
                "namespace": "shop", "node": "n1", "service_account": "web", "workload_name": "web",
                "tunnel_protocol": "HBONE", "status": "HEALTHY", "authorization_policies": ["shop/db-allow-web"]}},
            "Kubernetes//Pod/shop/db-0": {"workload": {"addresses": ["10.0.2.7"], "name": "db-0",
                "namespace": "shop", "node": "n2", "service_account": "db", "workload_name": "db",
                "tunnel_protocol": "HBONE", "status": "HEALTHY", "authorization_policies": ["shop/db-allow-web"],
                "services": {"shop/db.shop.svc.cluster.local": ["5432:5432"]}}},
            "shop/db.shop.svc.cluster.local": {"service": {"addresses": ["/10.96.0.9"], "hostname": "db.shop.svc.cluster.local",
                "name": "db", "namespace": "shop", "ports": ["5432:5432 TCP"]}},
        }}),
        "/debug/config_dump?type=authorization" => {
            json!({"authorizations": {"shop/db-allow-web": {"scope": "WORKLOAD_SELECTOR"}}})
        }
        "/debug/policies" => {
            json!([{"kind": "AuthorizationPolicy", "namespace": "shop", "name": "db-allow-web",
            "action": "ALLOW", "appliesTo": "workloads with app=db in namespace shop", "enforced": true,
            "rules": ["allows from principal cluster.local/ns/shop/sa/web"], "warnings": []}])
        }
        _ => return (404, "no".into()),
    };
    (200, body.to_string())
}

/// A Prometheus that scraped one destination proxy: web → db, 7 mTLS connections, 2 denied.
fn prometheus_answer(path: &str) -> (u16, String) {
    let labels = |flags: &str| {
        json!({"reporter": "destination", "source_workload": "web", "source_workload_namespace": "shop",
            "source_principal": "spiffe://cluster.local/ns/shop/sa/web", "destination_workload": "db",
            "destination_workload_namespace": "shop", "destination_service_name": "db",
            "destination_service_namespace": "shop", "connection_security_policy": "mutual_tls",
            "response_flags": flags, "pod": "ztunnel-n2"})
    };
    let result = match path.strip_prefix("/api/v1/query?query=") {
        Some("istio_tcp_connections_opened_total") => json!([{"metric": labels("-"), "value": [1.7e9, "7"]}]),
        Some("istio_tcp_connections_failed_total") => {
            json!([{"metric": labels("DENY"), "value": [1.7e9, "2"]}])
        }
        Some(_) => json!([]),
        None => return (404, "no".into()),
    };
    (200, json!({"status": "success", "data": {"resultType": "vector", "result": result}}).to_string())
}

#[test]
fn in_a_cluster_the_graph_comes_from_the_control_plane_and_prometheus() {
    let control = fake_server(control_answer);
    let prometheus = fake_server(prometheus_answer);
    let mut child = Command::new(ambit_bin())
        .args(["dashboard", "--port", "0", "--control"])
        .arg(format!("http://{control}"))
        .arg("--prometheus")
        .arg(format!("http://{prometheus}"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("ambit dashboard");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("its first line");
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("ambit dashboard: http://")
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not the address line: {line:?}"));
    let host = format!("127.0.0.1:{}", addr.port());
    let (code, _, body) = raw(addr, "GET", "/api/graph", &host);
    let (_, _, node) = raw(addr, "GET", "/api/node?id=workload/shop/db", &host);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(code, 200, "{body}");
    let g: Value = serde_json::from_str(&body).expect("JSON");
    let ids: Vec<&str> =
        g["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["id"].as_str()).collect();
    assert_eq!(ids, ["service/shop/db", "workload/shop/db", "workload/shop/web"]);
    let edges: Vec<&str> =
        g["edges"].as_array().expect("edges").iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(edges, ["service/shop/db->workload/shop/db", "workload/shop/web->service/shop/db"]);
    let e = &g["edges"][1];
    assert_eq!(
        (e["connections"].as_u64(), e["denied"].as_u64(), e["mtls"].as_str()),
        (Some(7), Some(2), Some("all"))
    );
    let problems = g["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].as_str().unwrap_or_default().starts_with("from Prometheus: denials are counted, but"),
        "{problems:?}"
    );
    let node: Value = serde_json::from_str(&node).expect("JSON");
    assert_eq!(node["policies"][0]["name"], "db-allow-web", "{node}");
    assert_eq!(node["pods"][0]["enrolled"], "enabled", "{node}");
}
