//! Criterion benchmarks of the incremental state: building a mesh of 100 000 workloads and
//! 10 000 services from scratch, and applying one workload change to it.
//!
//! Run: `cargo bench -p ambit-proxy --bench state`. Per-update percentiles and memory are in
//! the `state_update` bench binary.

mod common;

use std::hint::black_box;

use ambit_proxy::testing::{Delta, HealthStatus, State};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

fn build(c: &mut Criterion) {
    let mut g = c.benchmark_group("state");
    g.sample_size(10);
    g.bench_function("from_config_100k_workloads_10k_services", |b| {
        b.iter_batched(
            || common::mesh(100_000),
            |cfg| black_box(State::from_config(cfg, Some(common::NODE)).expect("state")),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn update(c: &mut Criterion) {
    let st = State::from_config(common::mesh(100_000), Some(common::NODE)).expect("state");
    let mut g = c.benchmark_group("state");
    let mut i = 0usize;
    g.bench_function("apply_one_workload_move_at_100k", |b| {
        b.iter_batched(
            || {
                i = (i + 7919) % 100_000;
                let mut w = common::workload(i);
                w.workload_ips = vec![common::workload_ip(200_000 + i)];
                Delta { workloads: vec![w], ..Delta::default() }
            },
            |delta| black_box(st.apply(delta)),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("apply_one_endpoint_health_change_at_100k", |b| {
        b.iter_batched(
            || {
                i = (i + 7919) % 100_000;
                let mut w = common::workload(i);
                w.status = HealthStatus::Unhealthy;
                Delta { workloads: vec![w], ..Delta::default() }
            },
            |delta| black_box(st.apply(delta)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, build, update);
criterion_main!(benches);
