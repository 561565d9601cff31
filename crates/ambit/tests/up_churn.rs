//! Connection churn through the mesh (issue 27): close-per-request HTTP connections from one
//! client pod to one nginx port across nodes, as wrk with `Connection: close`,
//! HTTP/1.0 clients and health checkers make them, 8 at a time.
//!
//! Such a client closes as soon as it holds the whole answer. Without the mesh the server's FIN
//! comes with the answer and the client's close is the second: the server keeps the TIME_WAIT.
//! When a mesh delivers the answer first and the FIN later, the client closes first and keeps
//! the TIME_WAIT itself, one per connection for 60 s, and once they fill its port range every
//! connect() searches the range (the client's kernel time in `__inet_hash_connect`): the rate
//! collapsed from ~3 000 to ~250 connections/s after ~25 000 connections, each taking ~30 ms.
//! The test narrows the client's port range to 2 000 ports so that the same pile-up shows within
//! 20 000 connections: then connections fail or stall. Needs root (under `CI=true` a missing
//! privilege fails instead of skipping).

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;

/// Connections the test opens, and how many at a time.
const CONNECTIONS: usize = 20_000;
const THREADS: usize = 8;

fn cluster(dir: &std::path::Path) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: churn, labels: {{istio.io/dataplane-mode: ambient}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: client, namespace: churn}}\nspec:\n  nodeName: node1\n  containers: [{{name: idle, command: [sleep, infinity]}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: server, namespace: churn}}\nspec:\n  nodeName: node2\n  containers:\n  - {}\n",
        nginx_container(dir, "churn")
    )
}

/// `ip netns exec <netns> <args…>`, which must succeed; its standard output.
fn in_netns(netns: &str, args: &[&str]) -> String {
    let out =
        Command::new("ip").args(["netns", "exec", netns]).args(args).output().expect("run ip netns exec");
    assert!(out.status.success(), "{args:?} in {netns}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn close_per_request_connections_keep_their_speed_and_their_clients_rarely_close_first() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let config = c.config(&cluster(c.scratch.path()));
    c.up(2, &config);
    let client = c.pod("churn/client");
    let server = SocketAddr::new(c.pod("churn/server").ip.expect("server IP").into(), 8080);
    let client_ip = client.ip.expect("client IP").to_string();
    in_netns(&client.netns, &["sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=40000 41999"]);
    let warm = churn(std::slice::from_ref(&client.netns), 2, server, "/1k", Until::Connections(100));
    assert!(warm.failed.is_empty(), "warm-up: {:?}", warm.failed);

    let run =
        churn(std::slice::from_ref(&client.netns), THREADS, server, "/1k", Until::Connections(CONNECTIONS));
    // TIME_WAIT sockets the client itself holds (the in-pod proxy's own, bound to the
    // redirected port, are the server side's and do not take client ports).
    let listing = in_netns(&client.netns, &["ss", "-Htan", "state", "time-wait"]);
    let clients_tw = listing
        .lines()
        .filter(|l| {
            l.split_whitespace().nth(2).is_some_and(|local| local.starts_with(&format!("{client_ip}:")))
        })
        .count();
    let windows: Vec<String> =
        run.windows(Duration::from_secs(5)).iter().map(|(r, p)| format!("{r:.0}/s p99 {p:.1} ms")).collect();
    let (at, slowest) = run.slowest().expect("connections ran");
    println!(
        "{} connections in {:.1} s ({:.0}/s; per 5 s: {}); p99 {:.1} ms, slowest {:.1} ms at {:.1} s; TIME_WAIT held by the client: {clients_tw}",
        run.done.len(),
        run.elapsed.as_secs_f64(),
        run.rate(),
        windows.join(", "),
        percentile(&run.done.iter().map(|(_, t)| t.as_secs_f64() * 1e3).collect::<Vec<_>>(), 99.0),
        slowest.as_secs_f64() * 1e3,
        at.as_secs_f64()
    );
    assert!(
        run.failed.is_empty(),
        "{} connections failed, the first: {:?}",
        run.failed.len(),
        &run.failed[..run.failed.len().min(5)]
    );
    assert_eq!(run.done.len(), CONNECTIONS);
    // The server's FIN reaches the client with the answer: the client closes second. Not
    // always: when the server's FIN comes after the proxy read its answer, the two travel apart
    // (direct, 1–2 % of these clients close first; through the mesh before the fix 8.7 %, after
    // it 0.3–1.5 %).
    assert!(
        clients_tw * 100 <= CONNECTIONS * 4,
        "the client closed first on {clients_tw} of {CONNECTIONS} connections (over 4 %): the FIN lags the answer"
    );
    // A collapse makes every connection slow (pre-fix, the 60 s bench saw p99 of 80–145 ms per
    // 5 s window); single slow connections on a busy 2-core machine do not make one.
    let all: Vec<f64> = run.done.iter().map(|(_, took)| took.as_secs_f64() * 1e3).collect();
    let p99 = percentile(&all, 99.0);
    assert!(p99 <= 20.0, "p99 of connect + request + answer is {p99:.1} ms (over 20 ms)");
}
