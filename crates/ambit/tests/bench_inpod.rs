//! Benchmark (not a test): pods per node proxy. `BENCH_PODS` (default 1 000) pod network
//! namespaces are handed to one shared-mode proxy over ZDS, one after another; the bench times
//! each Add → ack at the wire (the pod's 15001/15006/15008 listeners and 15053 DNS sockets bound
//! inside its netns), samples the proxy's memory and descriptors every 100 pods, then removes
//! every pod and checks what is released; then repeats the Adds and Dels (`BENCH_CYCLES` cycles in
//! all, default 3) to show whether memory is reused or grows. Needs root. Run it on a release build:
//!
//! `cargo test --release -p ambit --test bench_inpod -- --ignored --nocapture`

mod common;

use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Descriptors the proxy keeps for its control path (AMBIT_FD_RESERVE's default).
const FD_RESERVE: u64 = 1024;
/// Descriptors a pod holds itself (its netns and listeners); the rest of its share is headroom.
const POD_FIXED_FDS: u64 = 8;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64).unwrap_or(0)
}

/// `tokio_num_alive_tasks` of the proxy's data-plane runtime (its stats port).
fn alive_tasks() -> u64 {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect("127.0.0.1:17020") else { return 0 };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut body = String::new();
    let _ = c.read_to_string(&mut body);
    body.lines()
        .filter(|l| l.starts_with("tokio_num_alive_tasks"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn summary(what: &str, latencies: &[Duration]) {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    println!(
        "{what}: p50 {:?}, p99 {:?}, max {:?}",
        percentile(&sorted, 0.50),
        percentile(&sorted, 0.99),
        sorted[sorted.len() - 1]
    );
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored on a release build"]
fn bench_pods_per_proxy() {
    if !require_root() {
        return;
    }
    let pods: usize = std::env::var("BENCH_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    // Each pod's share of the descriptor budget is its own descriptors plus a headroom for its
    // connections (AMBIT_POD_FD_HEADROOM, default 64). Where the open-files limit cannot hold the
    // default share for every pod (this machine's hard limit is 20 000 and cannot be raised),
    // the bench lowers the headroom and says so: the pods' own cost is what it measures.
    let extra_cycles: usize =
        std::env::var("BENCH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1) - 1;
    // The proxy raises its soft limit to the hard one it inherits from this process.
    let limit = hard_nofile();
    let headroom = ((limit.saturating_sub(FD_RESERVE)) / pods as u64).saturating_sub(POD_FIXED_FDS).min(64);
    assert!(headroom > 0, "RLIMIT_NOFILE {limit} cannot hold {pods} pods");
    println!(
        "pods per proxy: {pods} pods, RLIMIT_NOFILE {limit}, AMBIT_POD_FD_HEADROOM {headroom}{}",
        if headroom < 64 { " (lowered from 64 so that the pods fit the limit)" } else { "" }
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let ambit = env!("CARGO_BIN_EXE_ambit");
    let ok =
        Command::new(ambit).args(["dev-ca", "init"]).arg(dir.path().join("ca")).status().expect("dev-ca");
    assert!(ok.success());
    std::fs::write(dir.path().join("mesh.yaml"), "workloads: []\nservices: []\npolicies: []\n")
        .expect("config");
    let sock = dir.path().join("zds.sock");
    let t0 = Instant::now();
    let ns = BareNamespaces::create("pods", pods);
    println!("created {pods} network namespaces in {:?}", t0.elapsed());

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
        .env("AMBIT_POD_FD_HEADROOM", headroom.to_string())
        .env("AMBIT_ADMIN_ADDR", "127.0.0.1:17000")
        .env("AMBIT_STATS_ADDR", "127.0.0.1:17020")
        .env("AMBIT_READINESS_ADDR", "127.0.0.1:17021");
    let proxy = ChildGuard::spawn("proxy", cmd);
    let pid = proxy.pid();
    let sample = || (rss_kib(pid), fd_count(pid), alive_tasks());
    let (adds, dels, samples, empty, full, released, cycles) = rt.block_on(async {
        let mut conn = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .expect("proxy connects within 10 s")
            .expect("accept");
        conn.recv_hello().await.expect("hello");
        conn.snapshot_sent().await.expect("snapshot ack").into_result().expect("snapshot accepted");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let empty = sample();
        let mut adds = Vec::with_capacity(pods);
        let mut samples = Vec::new();
        for (i, name) in ns.names().iter().enumerate() {
            let fd =
                ambit_netns::Netns::open(&std::path::Path::new("/var/run/netns").join(name)).expect("netns");
            let info = ambit_zds::WorkloadInfo {
                name: format!("pod-{i}"),
                namespace: "bench".into(),
                service_account: "default".into(),
            };
            let t0 = Instant::now();
            let ack = conn.add(&format!("uid-{i}"), &info, fd.as_fd()).await.expect("ack");
            adds.push(t0.elapsed());
            ack.into_result().unwrap_or_else(|e| panic!("pod {i} refused: {e}"));
            if (i + 1) % 100 == 0 {
                samples.push((i + 1, sample()));
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let full = sample();
        let mut dels = Vec::with_capacity(pods);
        for i in 0..pods {
            let t0 = Instant::now();
            let ack = conn.del(&format!("uid-{i}")).await.expect("ack");
            dels.push(t0.elapsed());
            ack.into_result().unwrap_or_else(|e| panic!("del of pod {i} refused: {e}"));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let released = sample();
        // More cycles: memory an earlier one left with the allocator is reused, not grown.
        let mut cycles = Vec::new();
        for cycle in 2..=extra_cycles + 1 {
            for (i, name) in ns.names().iter().enumerate() {
                let fd = ambit_netns::Netns::open(&std::path::Path::new("/var/run/netns").join(name))
                    .expect("netns");
                let info = ambit_zds::WorkloadInfo {
                    name: format!("pod-{i}"),
                    namespace: "bench".into(),
                    service_account: "default".into(),
                };
                let ack = conn.add(&format!("uid-{i}"), &info, fd.as_fd()).await.expect("ack");
                ack.into_result().unwrap_or_else(|e| panic!("pod {i} refused in cycle {cycle}: {e}"));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            let full = sample();
            for i in 0..pods {
                let ack = conn.del(&format!("uid-{i}")).await.expect("ack");
                ack.into_result().unwrap_or_else(|e| panic!("del of pod {i} refused in cycle {cycle}: {e}"));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            cycles.push((cycle, full, sample()));
        }
        (adds, dels, samples, empty, full, released, cycles)
    });
    assert!(!proxy.logs().contains(" ERROR "), "the proxy logged errors:\n{}", proxy.logs());
    for (i, l) in adds.iter().enumerate().filter(|(_, l)| **l > Duration::from_millis(2)) {
        println!("slow Add (over 2 ms): pod #{i} took {l:?}");
    }
    summary(&format!("ZDS Add→ack over {pods} pods"), &adds);
    let last = pods.saturating_sub(100);
    summary(
        &format!("ZDS Add→ack of pods {}..{pods} (the proxy already holding {last})", last + 1),
        &adds[last..],
    );
    summary(&format!("ZDS Del→ack over {pods} pods"), &dels);
    println!("pods | proxy RSS KiB | descriptors | tasks");
    println!("0 | {} | {} | {}", empty.0, empty.1, empty.2);
    for (n, (rss, fds, tasks)) in &samples {
        println!("{n} | {rss} | {fds} | {tasks}");
    }
    let per_pod_kib = full.0.saturating_sub(empty.0) as f64 / pods as f64;
    let per_pod_fds = full.1.saturating_sub(empty.1) as f64 / pods as f64;
    println!(
        "with {pods} idle pods: RSS {} -> {} KiB ({per_pod_kib:.1} KiB per pod), descriptors {} -> {} ({per_pod_fds:.2} per pod)",
        empty.0, full.0, empty.1, full.1
    );
    println!(
        "after every Del: RSS {} KiB, descriptors {}, tasks {} (with the pods: {})",
        released.0, released.1, released.2, full.2
    );
    for (cycle, full, empty) in &cycles {
        println!(
            "cycle {cycle}: with {pods} pods RSS {} KiB, descriptors {}, tasks {}; after the Dels RSS {} KiB, descriptors {}, tasks {}",
            full.0, full.1, full.2, empty.0, empty.1, empty.2
        );
    }
    assert!(
        released.1 <= empty.1 + 8,
        "descriptors not released: {} before the pods, {} after",
        empty.1,
        released.1
    );
    for (cycle, _, after) in &cycles {
        assert!(after.1 <= empty.1 + 8, "descriptors not released after cycle {cycle}: {}", after.1);
    }
    drop(proxy);
}
