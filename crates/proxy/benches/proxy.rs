//! In-process microbenchmarks: authorization evaluation and state lookups (HBONE's own are in
//! `crates/hbone/benches`).
//!
//! Run: `cargo bench -p ambit-proxy` (add `-- --quick` for a fast pass).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ambit_identity::Identity;
use ambit_proxy::testing::{Connection, LocalConfig, State, evaluate};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

/// A state with `n` HBONE workloads and `n / 10` services of 10 endpoints each.
fn big_state(n: usize) -> State {
    let mut y = String::from("workloads:\n");
    for i in 0..n {
        let ip = Ipv4Addr::from(0x0a00_0000u32 + i as u32 + 1);
        let svc = i / 10;
        y.push_str(&format!(
            "- uid: c//v1/Pod/ns/w{i}\n  name: w{i}\n  namespace: ns\n  serviceAccount: sa{svc}\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  services:\n    \"ns/s{svc}.ns.svc.cluster.local\":\n      80: 8080\n"
        ));
    }
    y.push_str("services:\n");
    for s in 0..n / 10 {
        let vip = Ipv4Addr::from(0x0b00_0000u32 + s as u32 + 1);
        y.push_str(&format!(
            "- name: s{s}\n  namespace: ns\n  hostname: s{s}.ns.svc.cluster.local\n  vips: [\"/{vip}\"]\n  ports: {{80: 8080}}\n"
        ));
    }
    y.push_str("policies: []\n");
    let cfg = LocalConfig::parse(&y).expect("generated config parses");
    State::from_config(cfg, None).expect("state")
}

fn state(c: &mut Criterion) {
    let mut g = c.benchmark_group("state");
    for n in [1_000usize, 10_000] {
        let st = big_state(n);
        let source = st.workload_by_uid("c//v1/Pod/ns/w0").expect("w0");
        let ip: IpAddr = Ipv4Addr::from(0x0a00_0000u32 + (n as u32) / 2).into();
        let vip = SocketAddr::new(Ipv4Addr::from(0x0b00_0001u32).into(), 80);
        g.bench_function(BenchmarkId::new("workload_by_addr", n), |b| {
            b.iter(|| black_box(st.workload_by_addr("", black_box(ip))))
        });
        g.bench_function(BenchmarkId::new("route_outbound_vip", n), |b| {
            b.iter(|| black_box(st.route_outbound(&source, "", black_box(vip)).expect("route")))
        });
        g.bench_function(BenchmarkId::new("route_outbound_pod", n), |b| {
            b.iter(|| black_box(st.route_outbound(&source, "", SocketAddr::new(ip, 8080)).expect("route")))
        });
    }
    g.finish();
}

fn authorization(c: &mut Criterion) {
    let mut y = String::from("policies:\n");
    for i in 0..100 {
        y.push_str(&format!(
            "- name: p{i}\n  namespace: ns\n  scope: Namespace\n  action: Deny\n  rules: [[[{{principals: [{{Exact: \"cluster.local/ns/x/sa/sa{i}\"}}], destinationPorts: [{}]}}]]]\n",
            1000 + i
        ));
    }
    y.push_str("- name: allow\n  namespace: ns\n  scope: Namespace\n  action: Allow\n  rules: [[[{namespaces: [{Exact: ns}]}]]]\n");
    let cfg = LocalConfig::parse(&y).expect("policies parse");
    let policies = cfg.policies;
    let conn = Connection {
        src_ip: Ipv4Addr::new(10, 0, 0, 1).into(),
        src_identity: Some(Identity::new("cluster.local", "ns", "client")),
        dst_ip: Ipv4Addr::new(10, 0, 0, 2).into(),
        dst_port: 8080,
    };
    c.bench_function("authz/evaluate_100_deny_1_allow", |b| {
        b.iter(|| black_box(evaluate(policies.iter(), black_box(&conn))))
    });
}

criterion_group!(benches, state, authorization);
criterion_main!(benches);
