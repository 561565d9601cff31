//! Benchmark (not a test): keep-alive HTTP through the waypoint against the L4 path and against
//! no mesh, on a two-node `ambit up` cluster (client on node1, server on node2, the waypoint
//! where `ambit up` places it), interleaved: every round runs the three paths back to back, the
//! order rotating between rounds, so all see the same machine load.
//!
//! - direct: a client and a server pod in a namespace that is not enrolled (to the pod's
//!   address: without kube-proxy, a VIP exists only for captured pods);
//! - L4: the same pods' twins in an enrolled namespace, to a Service without a waypoint (both
//!   node proxies carry each connection);
//! - waypoint: the same enrolled pods, to a Service with `istio.io/use-waypoint` (node proxy →
//!   waypoint → node proxy).
//!
//! Figures per path: wrk with 16 keep-alive connections (requests/s), wrk with one connection
//! (p50 and p99 latency); for the waypoint, its CPU (utime + stime of its process over the
//! 16-connection run) per request, and its RSS with 1 000 and 10 000 Services bound to it.
//! The server is `ambit app echo` (hyper) in every path.
//!
//! Run as root: `BENCH_ROUNDS=5 BENCH_SECONDS=5 cargo test --release -p ambit --features jemalloc
//! --test bench_waypoint -- --ignored --nocapture` (wrk installed).

mod common;

use std::time::Duration;

use common::*;

const CLUSTER: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: mesh, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: plain}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: mesh}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: mesh}
spec:
  nodeName: node1
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: mesh, labels: {app: server}}
spec:
  nodeName: node2
  containers: [{name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: plain}
spec:
  nodeName: node1
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: plain, labels: {app: server}}
spec:
  nodeName: node2
  containers: [{name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}]
---
apiVersion: v1
kind: Service
metadata: {name: l4, namespace: mesh}
spec: {clusterIP: 10.96.0.30, selector: {app: server}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: l7, namespace: mesh, labels: {istio.io/use-waypoint: waypoint}}
spec: {clusterIP: 10.96.0.31, selector: {app: server}, ports: [{name: http, port: 80, targetPort: 8080}]}
"#;

/// `count` more Services (`<prefix>-<i>`) bound to the waypoint, each selecting the server.
fn services(prefix: &str, count: usize) -> String {
    (0..count)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {prefix}-{i}, namespace: mesh, labels: \
                 {{istio.io/use-waypoint: waypoint}}}}\nspec: {{selector: {{app: server}}, ports: [{{name: http, \
                 port: 80, targetPort: 8080}}]}}\n---\n"
            )
        })
        .collect()
}

struct Figures {
    rps: f64,
    requests: f64,
    p50_us: f64,
    p99_us: f64,
}

fn wrk(c: &LocalCluster, from: &str, url: &str, conns: u32, secs: u64) -> (f64, f64, f64, f64) {
    let netns = c.pod(from).netns;
    let conns = format!("-c{conns}");
    let d = format!("{secs}s");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &netns, "wrk", "-t1", &conns, "-d", &d, "--latency", url])
        .output()
        .expect("wrk");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let out = String::from_utf8_lossy(&out.stdout).into_owned() + &err;
    assert!(!out.contains("Socket errors") && !out.contains("Non-2xx"), "wrk saw errors on {url}:\n{out}");
    let number = |prefix: &str| {
        out.lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {prefix} in wrk's output:\n{out}"))
    };
    let micros = |v: String| {
        let (n, unit) = v.split_at(v.find(|ch: char| ch.is_ascii_alphabetic()).unwrap_or(v.len()));
        let n: f64 = n.parse().unwrap_or(f64::NAN);
        match unit {
            "us" => n,
            "ms" => n * 1e3,
            "s" => n * 1e6,
            _ => f64::NAN,
        }
    };
    let rps: f64 = number("Requests/sec:").parse().unwrap_or(f64::NAN);
    let requests = out
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    (rps, requests, micros(number("50%")), micros(number("99%")))
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

fn waypoint_pid(c: &LocalCluster) -> u32 {
    let s = c.state();
    s.processes
        .iter()
        .find(|p| p.name == "pod/mesh/waypoint-0/istio-proxy")
        .and_then(|p| p.pid)
        .unwrap_or_else(|| panic!("no waypoint process"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

#[test]
#[ignore = "benchmark: run as root with wrk, see the module's documentation"]
fn waypoint_against_l4_and_direct() {
    if !require_root() {
        return;
    }
    let var = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (rounds, secs) = (var("BENCH_ROUNDS", 5), var("BENCH_SECONDS", 5));
    let mut c = LocalCluster::new();
    let dir = c.file("config/cluster.yaml", CLUSTER);
    c.up(2, dir.parent().unwrap_or(&dir));
    // Out of the mesh there is no Service VIP (no kube-proxy here): direct goes to the pod.
    let direct = format!("http://{}:8080/", c.addr("plain/server", 8080).ip());
    let paths = [
        ("direct", "plain/client", direct.as_str()),
        ("L4", "mesh/client", "http://10.96.0.30:80/"),
        ("waypoint", "mesh/client", "http://10.96.0.31:80/"),
    ];
    // Warm: every path answers, the waypoint has its upstream connection.
    for (_, from, url) in paths {
        wrk(&c, from, url, 1, 1);
    }
    let pid = waypoint_pid(&c);
    let hz = 100.0;
    let mut figures: Vec<Vec<Figures>> = (0..paths.len()).map(|_| Vec::new()).collect();
    let mut cpu_per_request = Vec::new();
    for round in 0..rounds {
        for k in 0..paths.len() {
            let i = (k + round as usize) % paths.len();
            let (name, from, url) = paths[i];
            let before = cpu_ticks(pid);
            let (rps, requests, _, _) = wrk(&c, from, url, 16, secs);
            let ticks = cpu_ticks(pid) - before;
            if name == "waypoint" {
                cpu_per_request.push(ticks as f64 / hz * 1e6 / requests);
            }
            let (_, _, p50_us, p99_us) = wrk(&c, from, url, 1, secs);
            figures[i].push(Figures { rps, requests, p50_us, p99_us });
        }
    }
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!("\nwaypoint bench at {commit}: {rounds} rounds × {secs} s per figure, order rotating\n");
    println!(
        "| path | req/s (16 conns) | × direct | p50 µs (1 conn) | p99 µs (1 conn) | added p50 µs | added p99 µs |"
    );
    println!("|---|---|---|---|---|---|---|");
    let direct_rps = median(figures[0].iter().map(|f| f.rps).collect());
    let direct_p50 = median(figures[0].iter().map(|f| f.p50_us).collect());
    let direct_p99 = median(figures[0].iter().map(|f| f.p99_us).collect());
    for (i, (name, _, _)) in paths.iter().enumerate() {
        let f = &figures[i];
        // Ratios within each round, then their median.
        let ratio = median((0..f.len()).map(|r| f[r].rps / figures[0][r].rps).collect());
        let (p50, p99) =
            (median(f.iter().map(|x| x.p50_us).collect()), median(f.iter().map(|x| x.p99_us).collect()));
        println!(
            "| {name} | {:.0} | {ratio:.2} | {p50:.0} | {p99:.0} | {:.0} | {:.0} |",
            median(f.iter().map(|x| x.rps).collect()),
            p50 - direct_p50,
            p99 - direct_p99
        );
        let _ = (direct_rps, f.iter().map(|x| x.requests).sum::<f64>());
    }
    println!(
        "\nwaypoint CPU per request (utime+stime over the 16-connection runs): median {:.1} µs (runs: {:?})",
        median(cpu_per_request.clone()),
        cpu_per_request.iter().map(|v| (v * 10.0).round() / 10.0).collect::<Vec<_>>()
    );
    let rss0 = rss_kib(pid);
    let mut rss = vec![(1usize, rss0)];
    for (prefix, count, want) in [("a", 1_000usize, 1_000usize), ("b", 9_000, 10_000)] {
        c.apply(&format!("{prefix}.yaml"), &services(prefix, count));
        let held = wait_for(
            || {
                let netns = c.pod("mesh/waypoint-0").netns;
                ambit_cluster::probe::http_get(&netns, 15000, "/config_dump").is_ok_and(|(_, b)| {
                    serde_json::from_str::<serde_json::Value>(&b).is_ok_and(|d| {
                        d["resources"]["destinations"].as_object().is_some_and(|m| m.len() >= want)
                    })
                })
            },
            Duration::from_secs(300),
        );
        assert!(held, "the waypoint did not get {want} destinations");
        std::thread::sleep(Duration::from_secs(2));
        rss.push((want, rss_kib(pid)));
    }
    println!(
        "\nwaypoint RSS by bound Services: {}",
        rss.iter().map(|(n, k)| format!("{n}: {:.1} MiB", *k as f64 / 1024.0)).collect::<Vec<_>>().join(", ")
    );
}
