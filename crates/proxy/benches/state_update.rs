//! Records what one xDS-style update costs at scale: p50/p99/max of 10 000 single-workload
//! updates published through `StateStore::apply` at N workloads (+ N / 10 services, N / 100
//! policies: `testing::generated::mesh`), and the memory the state holds at N (growth of this
//! process's resident set, `VmRSS` in `/proc/self/status`, system allocator), for N in
//! `STATE_UPDATE_SIZES` (default `10000,100000`).
//!
//! Run: `cargo bench -p ambit-proxy --bench state_update`.

mod common;

use std::time::{Duration, Instant};

use ambit_proxy::testing::{Delta, HealthStatus, State, StateStore};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn memory(workloads: usize) -> State {
    let before = rss_kib();
    let mesh = common::mesh(workloads);
    let started = Instant::now();
    let st = State::from_config(mesh, Some(common::NODE)).expect("state");
    let took = started.elapsed();
    let after = rss_kib();
    let (w, s, p) = st.counts();
    println!(
        "state of {w} workloads, {s} services, {p} policies: built in {took:?}, RSS +{} MiB ({} bytes per workload)",
        (after.saturating_sub(before)) / 1024,
        (after.saturating_sub(before)) * 1024 / w as u64
    );
    st
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    // Criterion-style flags (`--bench`) are accepted and ignored.
    let sizes: Vec<usize> = std::env::var("STATE_UPDATE_SIZES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    for n in sizes {
        updates_at(n);
    }
}

fn updates_at(size: usize) {
    let st = memory(size);
    let store = StateStore::new(st);
    // A reader holds a snapshot, as a live connection does: updates must not disturb it.
    let held = store.current();
    const UPDATES: usize = 10_000;
    let mut times = Vec::with_capacity(UPDATES);
    let cpu_start = cpu_time();
    let wall = Instant::now();
    for n in 0..UPDATES {
        let i = (n * 7919) % size;
        let mut w = common::workload(i);
        if n % 2 == 0 {
            // Moved to another IP: the address index changes.
            w.workload_ips = vec![common::workload_ip(2 * size + n)];
        } else {
            // Unhealthy: its endpoint leaves its service (a copy of the service, sharing the rest).
            w.status = HealthStatus::Unhealthy;
        }
        let delta = Delta { workloads: vec![w], ..Delta::default() };
        let t = Instant::now();
        let applied = store.apply(delta);
        times.push(t.elapsed());
        assert!(applied.changed && applied.rejected.is_empty());
    }
    let wall = wall.elapsed();
    let cpu = cpu_time().saturating_sub(cpu_start);
    times.sort();
    println!(
        "{UPDATES} single-workload updates at {size} workloads (StateStore::apply): p50 {:?}, p99 {:?}, \
         max {:?}; {wall:?} wall, {cpu:?} CPU in total",
        percentile(&times, 0.50),
        percentile(&times, 0.99),
        times[times.len() - 1],
    );
    assert_eq!(held.counts().0, size);
}

/// This process's user + system CPU time (from `/proc/self/stat`, in clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    Duration::from_millis(ticks * 10)
}
