//! Benchmark (not a test): connection churn. Close-per-request HTTP connections (one GET with
//! `Connection: close`, the answer read by its length, the socket closed at once, as wrk,
//! HTTP/1.0 clients and health checkers do) from client pods on node1 to one nginx port on node2
//! of a two-node `ambit up` cluster, 16 at a time, for `BENCH_SECONDS` (default 60), through the
//! mesh (namespace `mesh`, both node proxies on each connection) and without it (namespace `base`,
//! the same chain and bridges, not enrolled), run by run in turn. Two variants: one client pod
//! with 16 threads, and four client pods with 4 threads each.
//!
//! Per run it prints every 5 s window (connections/s, p99 of connect + request + answer), and per
//! variant the figures issue 27 asks for: the mesh's lowest window against the direct rate, and
//! its worst window's p99 against its first window's. `BENCH_NODE_PROXY=<binary>` runs another
//! build (or the reference ztunnel) as the node proxies (`ambit up --node-proxy`).
//!
//! Run: `cargo test --release -p ambit --features jemalloc --test bench_churn -- --ignored
//! --nocapture` as root.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;

const WINDOW: Duration = Duration::from_secs(5);

/// The cluster: per namespace (`mesh` enrolled, `base` not) a pod `solo` and pods `c1`…`c4` on
/// node1, and `server` on node2 running nginx with a 1 KiB page.
fn cluster(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for (ns, label) in [("mesh", "  labels:\n    istio.io/dataplane-mode: ambient\n"), ("base", "")] {
        out += &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n{label}---\n");
        for client in ["solo", "c1", "c2", "c3", "c4"] {
            out += &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {client}, namespace: {ns}}}\nspec:\n  nodeName: node1\n  containers: [{{name: idle, command: [sleep, infinity]}}]\n---\n"
            );
        }
        out += &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: server, namespace: {ns}}}\nspec:\n  nodeName: node2\n  containers:\n  - {}\n---\n",
            nginx_container(dir, ns)
        );
    }
    out
}

fn print_run(label: &str, run: &ChurnRun) {
    let w = run.windows(WINDOW);
    let rates: Vec<String> = w.iter().map(|(r, _)| format!("{r:.0}")).collect();
    let p99s: Vec<String> = w.iter().map(|(_, p)| format!("{p:.2}")).collect();
    let slowest = run
        .slowest()
        .map(|(at, took)| format!("{:.1} ms at {:.1} s", took.as_secs_f64() * 1e3, at.as_secs_f64()));
    println!(
        "| {label} | {:.0} | {} | {} | {} | {} |",
        run.rate(),
        rates.join(" "),
        p99s.join(" "),
        slowest.unwrap_or_default(),
        run.failed.len()
    );
}

#[test]
#[ignore = "benchmark: run as root with a release build (see the file's header)"]
fn bench_churn() {
    if !require_root() {
        return;
    }
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let secs: u64 = var("BENCH_SECONDS", "60").parse().expect("BENCH_SECONDS is a number");
    let rounds: usize = var("BENCH_ROUNDS", "1").parse().expect("BENCH_ROUNDS is a number");
    let mut c = LocalCluster::new();
    let config = c.config(&cluster(c.scratch.path()));
    let node_proxy = std::env::var("BENCH_NODE_PROXY").ok();
    let extra: Vec<&str> = match &node_proxy {
        Some(p) => vec!["--node-proxy", p],
        None => Vec::new(),
    };
    c.up_with(2, &config, &extra);
    println!(
        "node proxies: {}; {secs} s per run, {rounds} round(s), 16 connections at a time",
        node_proxy.as_deref().unwrap_or("ambit proxy (this build)")
    );
    let server = |ns: &str| -> SocketAddr {
        SocketAddr::new(c.pod(&format!("{ns}/server")).ip.expect("server IP").into(), 8080)
    };
    let netns = |ns: &str, pods: &[&str]| -> Vec<String> {
        pods.iter().map(|p| c.pod(&format!("{ns}/{p}")).netns).collect()
    };
    // Warm-up: certificates, the pooled HBONE connection, nginx.
    for ns in ["mesh", "base"] {
        let warm = churn(&netns(ns, &["c4"]), 2, server(ns), "/1k", Until::Connections(200));
        assert!(
            warm.failed.is_empty(),
            "{ns}: warm-up failed: {:?}",
            &warm.failed[..warm.failed.len().min(5)]
        );
    }
    println!(
        "\n| Run | conn/s | conn/s per 5 s window | p99 ms per 5 s window | slowest | failed |\n|---|---|---|---|---|---|"
    );
    let mut summary = Vec::new();
    for round in 0..rounds {
        for (variant, pods, threads) in
            [("1 client pod", &["solo"][..], 16), ("4 client pods", &["c1", "c2", "c3", "c4"][..], 4)]
        {
            let mut order = ["base", "mesh"];
            if round % 2 == 1 {
                order.reverse();
            }
            let mut runs = Vec::new();
            for ns in order {
                let run = churn(
                    &netns(ns, pods),
                    threads,
                    server(ns),
                    "/1k",
                    Until::Elapsed(Duration::from_secs(secs)),
                );
                print_run(
                    &format!("r{round} {variant}, {}", if ns == "mesh" { "mesh" } else { "direct" }),
                    &run,
                );
                runs.push((ns, run));
            }
            let get = |ns: &str| &runs.iter().find(|(n, _)| *n == ns).expect("both ran").1;
            let (direct, mesh) = (get("base"), get("mesh"));
            let w = mesh.windows(WINDOW);
            let lowest = w.iter().map(|(r, _)| *r).fold(f64::INFINITY, f64::min);
            let first_p99 = w.first().map_or(f64::NAN, |(_, p)| *p);
            let worst_p99 = w.iter().skip(1).map(|(_, p)| *p).fold(0.0, f64::max);
            summary.push(format!(
                "| r{round} {variant} | {:.2} | {:.2} | {first_p99:.2} | {worst_p99:.2} | {:+.2} |",
                mesh.rate() / direct.rate(),
                lowest / direct.rate(),
                worst_p99 - first_p99
            ));
        }
    }
    println!(
        "\n| Variant | mesh/direct conn/s (whole run) | lowest mesh 5 s window / direct | mesh p99 first window ms | worst later window ms | worst − first ms |\n|---|---|---|---|---|---|"
    );
    for line in summary {
        println!("{line}");
    }
}
