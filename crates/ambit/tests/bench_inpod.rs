//! Benchmark (not a test): ZDS Add → ack latency over 200 pods, and proxy memory with 200 idle
//! pods. Needs root. Run it on a release build:
//!
//! `cargo test --release -p ambit --test bench_inpod -- --ignored --nocapture`

mod common;

use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const PODS: usize = 200;

/// Network namespaces created with `ip -batch`, deleted on drop.
struct Namespaces(Vec<String>);

impl Namespaces {
    fn create(prefix: &str, n: usize) -> Namespaces {
        let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
        let mut batch = String::new();
        for name in &names {
            batch.push_str(&format!("netns add {name}\n"));
        }
        // The guard exists before anything is created, so a failure part-way still cleans up.
        let ns = Namespaces(names);
        run_batch(&batch);
        for name in &ns.0 {
            let ok = Command::new("ip").args(["-n", name, "link", "set", "lo", "up"]).status();
            assert!(ok.is_ok_and(|s| s.success()), "cannot set lo up in {name}");
        }
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let batch: String = self.0.iter().map(|n| format!("netns del {n}\n")).collect();
        let _ = std::fs::write("/tmp/ambit-bench-del.batch", batch);
        let _ = Command::new("ip").args(["-force", "-batch", "/tmp/ambit-bench-del.batch"]).status();
    }
}

fn run_batch(batch: &str) {
    let path = std::env::temp_dir().join(format!("ambit-bench-{}.batch", std::process::id()));
    std::fs::write(&path, batch).expect("write batch");
    let ok = Command::new("ip").arg("-batch").arg(&path).status().expect("run ip").success();
    assert!(ok, "ip -batch failed");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored on a release build"]
fn bench_zds_add_latency_and_memory() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ambit = env!("CARGO_BIN_EXE_ambit");
    let ok =
        Command::new(ambit).args(["dev-ca", "init"]).arg(dir.path().join("ca")).status().expect("dev-ca");
    assert!(ok.success());
    std::fs::write(dir.path().join("mesh.yaml"), "workloads: []\nservices: []\npolicies: []\n")
        .expect("config");
    let sock = dir.path().join("zds.sock");
    let ns = Namespaces::create(&format!("ambb{}", std::process::id()), PODS);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let listener = rt.block_on(async { ambit_zds::ZdsListener::bind(&sock) }).expect("bind ZDS");
    let mut cmd = Command::new(ambit);
    cmd.arg("proxy")
        .env_clear()
        .env("PROXY_MODE", "shared")
        .env("INPOD_UDS", &sock)
        .env("LOCAL_XDS_PATH", dir.path().join("mesh.yaml"))
        .env("XDS_ADDRESS", "")
        .env("FAKE_CA", "true")
        .env("FAKE_CA_ROOT", dir.path().join("ca"))
        .env("RUST_LOG", "warn")
        .env("AMBIT_ADMIN_ADDR", "127.0.0.1:17000")
        .env("AMBIT_STATS_ADDR", "127.0.0.1:17020")
        .env("AMBIT_READINESS_ADDR", "127.0.0.1:17021");
    let proxy = ChildGuard::spawn("proxy", cmd);
    let (latencies, rss_empty, rss_full) = rt.block_on(async {
        let mut conn = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .expect("proxy connects within 10 s")
            .expect("accept");
        conn.recv_hello().await.expect("hello");
        conn.snapshot_sent().await.expect("snapshot ack").into_result().expect("snapshot accepted");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_empty = rss_kib(proxy.pid());
        let mut latencies = Vec::with_capacity(PODS);
        for (i, name) in ns.0.iter().enumerate() {
            let fd =
                ambit_netns::Netns::open(&std::path::Path::new("/var/run/netns").join(name)).expect("netns");
            let info = ambit_zds::WorkloadInfo {
                name: format!("pod-{i}"),
                namespace: "bench".into(),
                service_account: "default".into(),
            };
            let t0 = Instant::now();
            let ack = conn.add(&format!("uid-{i}"), &info, fd.as_fd()).await.expect("ack");
            latencies.push(t0.elapsed());
            ack.into_result().expect("pod accepted");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        (latencies, rss_empty, rss_kib(proxy.pid()))
    });
    for (i, l) in latencies.iter().enumerate().filter(|(_, l)| **l > Duration::from_millis(2)) {
        println!("slow Add (over 2 ms): pod #{i} took {l:?}");
    }
    let mut sorted = latencies.clone();
    sorted.sort();
    println!(
        "ZDS Add→ack over {PODS} pods: p50 {:?}, p99 {:?}, max {:?}",
        percentile(&sorted, 0.50),
        percentile(&sorted, 0.99),
        sorted[sorted.len() - 1]
    );
    println!(
        "proxy RSS: {} KiB with no pods, {} KiB with {PODS} idle pods ({} KiB per pod)",
        rss_empty,
        rss_full,
        (rss_full.saturating_sub(rss_empty)) / PODS as u64
    );
    drop(proxy);
}
