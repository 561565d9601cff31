//! Benchmark (not a test): a real `ambit proxy` (dedicated mode, in a pod netns) fed by the
//! test's delta ADS server with the generated mesh of N workloads, N / 10 services and one policy
//! per 100 workloads (`ambit_proxy::testing::generated::mesh`, the shape istiod sends: every pod
//! field set, one address, a listed policy, locality; the same mesh `benches/memory.sh` loads from
//! the file), for N in `BENCH_XDS_SIZES` (default `10000,100000`). Prints, per N:
//!
//! - initial sync: proxy process start → `/healthz/ready` 200 (the initial response of both
//!   types applied and ACKed, every part of it when the server split it: `ambit_xds::parts`);
//! - memory: the proxy's RSS after the sync, and its growth over the same proxy holding only its
//!   own workload (N = 0, measured first);
//! - bytes on the wire per workload: `istio_xds_message_bytes_total` (Any payloads) / N;
//! - one workload update at N: `BENCH_XDS_UPDATES` (default 1 000) single-workload changes
//!   (a new revision label) published one at a time (debounce 0), each timed from publish to the proxy's ACK seen by
//!   the server (p50, p99, max), and the proxy's CPU (utime + stime) per update.
//!
//! `cargo test --release -p ambit --test bench_xds -- --ignored --nocapture` (needs root).

mod common;
mod mesh;

use std::time::{Duration, Instant};

use ambit_api::type_url::{ADDRESS, AUTHORIZATION};
use ambit_proxy::testing::generated;
use ambit_proxy::testing::{address_resources, authorization_resources};
use ambit_xds::server::Changes;
use common::*;
use mesh::*;

const MARKER: &[u8] = b"AMBIT-BENCH-XDS-MARKER-2e7d";

fn sizes() -> Vec<usize> {
    std::env::var("BENCH_XDS_SIZES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

struct Figures {
    sync: Duration,
    rss_kib: u64,
    peak_kib: u64,
    payload_bytes: f64,
    updates: Vec<Duration>,
    cpu_per_update: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn metric(body: &str, name: &str, label: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The server's view of the one stream: (responses sent, last nonce sent, last nonce ACKed).
fn address_stream(server: &XdsServer) -> Option<(u64, String, String)> {
    let streams = server.streams();
    let t = streams.first()?.types.iter().find(|t| t.type_url == ADDRESS)?.clone();
    Some((t.responses, t.last_nonce.clone(), t.acked_nonces.last().cloned().unwrap_or_default()))
}

fn run(n: usize, updates: usize) -> Figures {
    let mut mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    mesh.write_config(&[&a], &[], &[]);
    let port = 15010;
    mesh.use_xds(&format!("http://{}:{port}", mesh.cluster.node().ip4));
    let opts = XdsOptions { debounce: Some(Duration::ZERO), ..XdsOptions::default() };
    let server = XdsServer::start(mesh.cluster.node(), port, mesh.config_path(), opts);
    let cfg = generated::mesh(n);
    let (workloads, services) = (&cfg.workloads[..], &cfg.services[..]);
    server.publish(vec![
        Changes {
            type_url: ADDRESS.into(),
            upserts: address_resources(workloads, services),
            removals: vec![],
        },
        Changes {
            type_url: AUTHORIZATION.into(),
            upserts: authorization_resources(&cfg.policies),
            removals: vec![],
        },
    ]);
    // The file's own workload (pod a) is published by the watcher within its poll interval.
    std::thread::sleep(Duration::from_millis(300));

    let t0 = Instant::now();
    let mut proxy = mesh.spawn_proxy_unready(&a, &[("RUST_LOG", "warn"), ("NODE_NAME", generated::NODE)]);
    let ready = wait_for(
        || {
            proxy.try_wait().is_none()
                && a.pod.http_get(a.pod.addr4(15021), "/healthz/ready").is_ok_and(|(s, _)| s == 200)
        },
        Duration::from_secs(600),
    );
    assert!(ready, "proxy not ready with {n} workloads:\n{}", proxy.logs());
    let sync = t0.elapsed();
    // Let allocator and the blocking pool settle before reading memory.
    std::thread::sleep(Duration::from_secs(2));
    let pid = proxy.pid();
    let rss_kib = rss_kib(pid);
    let peak_kib = status_kib(pid, "VmHWM");
    let body = metrics(&a);
    let payload = metric(&body, "istio_xds_message_bytes_total", ADDRESS);

    let mut times = Vec::new();
    let mut cpu_per_update = 0.0;
    if n > 0 && updates > 0 {
        let c0 = cpu_seconds(&[pid]);
        for k in 0..updates {
            let i = (k * 7919) % n;
            let mut w = cfg.workloads[i].clone();
            // A new revision label: a change istiod pushes for a rollout.
            w.canonical_revision = format!("rev-{k}").into();
            let before = address_stream(&server).map(|s| s.0).unwrap_or(0);
            let t = Instant::now();
            server.publish(vec![Changes {
                type_url: ADDRESS.into(),
                upserts: address_resources(std::slice::from_ref(&w), &[]),
                removals: vec![],
            }]);
            loop {
                if let Some((sent, last, acked)) = address_stream(&server)
                    && sent > before
                    && last == acked
                {
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "update {k} not ACKed in 10 s");
                std::thread::sleep(Duration::from_micros(50));
            }
            times.push(t.elapsed());
        }
        cpu_per_update = (cpu_seconds(&[pid]) - c0) / updates as f64;
    }
    times.sort();
    drop(server);
    let _ = proxy.stop(Duration::from_secs(5));
    Figures {
        sync,
        rss_kib,
        peak_kib,
        payload_bytes: if n > 0 { payload / n as f64 } else { 0.0 },
        updates: times,
        cpu_per_update,
    }
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored on a release build"]
fn xds_state_at_scale() {
    if !require_root() {
        return;
    }
    let updates: usize = std::env::var("BENCH_XDS_UPDATES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let base = run(0, 0);
    println!("xds bench: N=0 (own workload only): sync {:?}, RSS {} MiB", base.sync, base.rss_kib / 1024);
    for n in sizes() {
        let f = run(n, updates);
        println!(
            "xds bench: N={n} workloads + {} services + {} policies: initial sync {:.2} s, RSS {} MiB (+{} MiB over N=0, {:.2} KiB per workload), peak RSS {} MiB, {:.0} payload bytes per workload",
            n / 10,
            n.div_ceil(100),
            f.sync.as_secs_f64(),
            f.rss_kib / 1024,
            f.rss_kib.saturating_sub(base.rss_kib) / 1024,
            f.rss_kib.saturating_sub(base.rss_kib) as f64 / n as f64,
            f.peak_kib / 1024,
            f.payload_bytes,
        );
        println!(
            "xds bench: N={n}: {} single-workload updates, publish -> ACK p50 {:?}, p99 {:?}, max {:?}; proxy CPU {:.1} µs per update",
            f.updates.len(),
            percentile(&f.updates, 0.5),
            percentile(&f.updates, 0.99),
            f.updates.last().copied().unwrap_or_default(),
            f.cpu_per_update * 1e6,
        );
    }
}
