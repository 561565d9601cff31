//! Benchmark (not a test): pod A → pod B through real kernels, Ambit against a baseline without
//! the mesh on the same node, interleaved run by run. Needs root and iperf3, sockperf, wrk and
//! nginx. Two topologies:
//!
//! - `default`, what users run: a two-node `ambit up` cluster (pods created through each node's
//!   CNI chain — reference `loopback`, `bridge`, `host-local`, then `ambit-cni` — captured by the
//!   real `ambit agent`s with nftables over netlink, shared-mode node proxies whose state and
//!   certificates come from `ambit control` over xDS); client on node1, server on node2, so both
//!   node proxies carry each connection. Baseline: the same pods in a namespace that is not
//!   enrolled (same chain, bridges and routes; no capture, no proxy).
//! - `dedicated`: one dedicated `ambit proxy` inside each pod, capture by `iptables-restore` of
//!   the spec's rule set; baseline: two pods on the same bridge without capture.
//!
//! Each round runs every figure twice, baseline and Ambit back to back (the order alternates
//! between rounds), so both see the same machine load. Ratios are taken within a round and the
//! median of the per-round ratios is reported next to the medians of the raw figures. Proxy CPU
//! is utime + stime from `/proc/<pid>/stat` over each Ambit run, divided by the work done.
//!
//! Run it with `bash benches/e2e.sh [ROUNDS] [SECONDS] [MODES]` (release build, jemalloc), which
//! sets `BENCH_ROUNDS`, `BENCH_SECONDS` and `BENCH_MODES` for this file.

mod common;
mod mesh;

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use mesh::*;

const MARKER: &[u8] = b"AMBIT-BENCH-E2E-MARKER-0b3e";

/// What one run of the bench measures, from the environment.
struct Settings {
    rounds: usize,
    secs: u64,
    modes: Vec<String>,
    /// `BENCH_PERF_DIR`: record the proxies with `perf record` during each Ambit figure, into
    /// `<dir>/<mode>-<figure>-r<round>.data` (a profiling run: perf's own cost is in its numbers).
    perf_dir: Option<std::path::PathBuf>,
}

impl Settings {
    fn from_env() -> Settings {
        let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
        let number = |k: &str, d: &str| {
            var(k, d).parse::<u64>().unwrap_or_else(|e| panic!("{k}={:?} is not a number: {e}", var(k, d)))
        };
        Settings {
            rounds: usize::try_from(number("BENCH_ROUNDS", "5")).unwrap_or(5).max(1),
            secs: number("BENCH_SECONDS", "10").max(1),
            modes: var("BENCH_MODES", "default,dedicated").split(',').map(|m| m.trim().to_owned()).collect(),
            perf_dir: std::env::var_os("BENCH_PERF_DIR").map(Into::into),
        }
    }
}

/// A client pod and a server pod running nginx, iperf3 and sockperf.
struct Pair {
    client_netns: String,
    server_ip: Ipv4Addr,
    // Killed on drop.
    _servers: Vec<ChildGuard>,
}

impl Pair {
    fn new(client_netns: &str, server: &Pod, www: &Path, label: &str) -> Pair {
        // One nginx process (no master): a master killed on drop would leave its worker holding
        // the output pipes, and the guard waits for them to close.
        let dir = www.parent().unwrap_or(www);
        let conf = nginx_conf(dir, label).display().to_string();
        let error_log = format!("{}/nginx-{label}.log", dir.display());
        let ip = server.ip4.to_string();
        let servers = vec![
            server.spawn("nginx", &["-e", &error_log, "-c", &conf]),
            server.spawn("iperf3", &["-s", "-p", "5201"]),
            server.spawn("sockperf", &["sr", "--tcp", "-i", &ip, "-p", "11111"]),
        ];
        for (s, port) in servers.iter().zip([8080, 5201, 11111]) {
            let up = wait_for(|| listening(s.pid(), port), Duration::from_secs(10));
            assert!(up, "{label}: nothing listens on {port} in the server pod:\n{}", s.logs());
        }
        Pair { client_netns: client_netns.to_owned(), server_ip: server.ip4, _servers: servers }
    }

    /// Runs `program args` in the client pod; panics unless it succeeds.
    fn client(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.client_netns, program])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}): {}{stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// One TCP stream for `secs`: (Gbit/s, bytes received).
    fn iperf(&self, secs: u64) -> (f64, f64) {
        let out = self.client("iperf3", &["-c", &self.server_ip.to_string(), "-t", &secs.to_string(), "-J"]);
        let json: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("iperf3 JSON: {e}: {out}"));
        let received = &json["end"]["sum_received"];
        match (received["bits_per_second"].as_f64(), received["bytes"].as_f64()) {
            (Some(bps), Some(bytes)) => (bps / 1e9, bytes),
            _ => panic!("iperf3 gave no receiver summary: {out}"),
        }
    }

    /// 1 KiB ping-pong over one connection for `secs`: (p50, p99) in µs.
    fn sockperf(&self, secs: u64) -> (f64, f64) {
        let ip = self.server_ip.to_string();
        let t = secs.to_string();
        let out = self.client("sockperf", &["pp", "--tcp", "-i", &ip, "-p", "11111", "-m", "1024", "-t", &t]);
        let pct = |p: &str| {
            out.lines()
                .find(|l| l.contains(&format!("percentile {p} =")))
                .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("sockperf printed no {p} percentile:\n{out}"))
        };
        (pct("50.000"), pct("99.000"))
    }

    /// wrk with 16 connections for `secs` (`close`: one request per connection): (requests/s,
    /// requests). Panics on any socket error or non-2xx answer: such a run measures nothing.
    fn wrk(&self, secs: u64, close: bool) -> (f64, f64) {
        let url = format!("http://{}:8080/1k", self.server_ip);
        let d = format!("{secs}s");
        let mut args = vec!["-t1", "-c16", "-d", &d];
        if close {
            args.extend(["-H", "Connection: close"]);
        }
        args.push(&url);
        let out = self.client("wrk", &args);
        assert!(
            !out.contains("Socket errors") && !out.contains("Non-2xx"),
            "wrk saw errors (close={close}):\n{out}"
        );
        let rps = out
            .lines()
            .find(|l| l.starts_with("Requests/sec:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok());
        let requests = out
            .lines()
            .find(|l| l.contains(" requests in "))
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok());
        match (rps, requests) {
            (Some(rps), Some(n)) => (rps, n),
            _ => panic!("cannot read wrk's output:\n{out}"),
        }
    }
}

/// Largest VmHWM of `pids`, MiB.
fn peak_rss_mib(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .fold(0.0, f64::max)
        / 1024.0
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Per-round figures of one topology.
#[derive(Default)]
struct Results {
    /// (baseline, ambit) per round.
    tput: Vec<(f64, f64)>,
    p50: Vec<(f64, f64)>,
    p99: Vec<(f64, f64)>,
    cps: Vec<(f64, f64)>,
    rps: Vec<(f64, f64)>,
    /// Proxy CPU seconds per GB, per 10 000 new connections, per 10 000 keep-alive requests.
    cpu_gb: Vec<f64>,
    cpu_conn: Vec<f64>,
    cpu_req: Vec<f64>,
}

/// `perf record` of `pids` while it lives (sampled at 999 Hz, no call graphs: the release build
/// has no frame pointers, and a flat profile of self time is what BENCHMARKS.md keeps).
struct Perf(Option<ChildGuard>);

impl Perf {
    fn start(s: &Settings, name: &str, pids: &[u32]) -> Perf {
        let Some(dir) = &s.perf_dir else { return Perf(None) };
        std::fs::create_dir_all(dir).expect("perf dir");
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-q", "-F", "999", "-p", &pids.join(","), "-o"])
            .arg(dir.join(format!("{name}.data")));
        let guard = ChildGuard::spawn("perf record", cmd);
        std::thread::sleep(Duration::from_millis(300));
        Perf(Some(guard))
    }

    fn stop(mut self) {
        if let Some(mut g) = self.0.take() {
            g.signal(nix::sys::signal::Signal::SIGINT);
            let status = g.wait_timeout(Duration::from_secs(30));
            // perf record writes its file, then ends by the signal it got (re-raised).
            let ok = status.is_some_and(|s| {
                use std::os::unix::process::ExitStatusExt;
                s.success() || s.signal() == Some(nix::libc::SIGINT)
            });
            assert!(ok, "perf record failed: {:?}\n{}", status, g.logs());
        }
    }
}

/// Runs every figure `rounds` times, baseline and Ambit back to back.
fn measure(s: &Settings, mode: &str, base: &Pair, ambit: &Pair, proxies: &[u32]) -> Results {
    let mut r = Results::default();
    // Warm-up: certificates, pooled HBONE connections, nginx workers.
    for pair in [base, ambit] {
        pair.wrk(1, false);
    }
    for round in 0..s.rounds {
        let order: [(&Pair, bool); 2] =
            if round % 2 == 0 { [(base, false), (ambit, true)] } else { [(ambit, true), (base, false)] };
        let pick = |f: &mut dyn FnMut(&Pair, bool) -> f64| {
            let mut out = (0.0, 0.0);
            for (pair, is_ambit) in order {
                let v = f(pair, is_ambit);
                if is_ambit { out.1 = v } else { out.0 = v }
            }
            out
        };
        let secs = s.secs;
        let perf = |figure: &str, is_ambit: bool| {
            if is_ambit {
                Perf::start(s, &format!("{mode}-{figure}-r{}", round + 1), proxies)
            } else {
                Perf(None)
            }
        };
        r.tput.push(pick(&mut |pair, is_ambit| {
            let p = perf("tput", is_ambit);
            let c0 = cpu_seconds(proxies);
            let (gbps, bytes) = pair.iperf(secs);
            p.stop();
            if is_ambit {
                r.cpu_gb.push((cpu_seconds(proxies) - c0) / (bytes / 1e9));
            }
            gbps
        }));
        let mut p99 = (0.0, 0.0);
        r.p50.push(pick(&mut |pair, is_ambit| {
            let (p50, p99_) = pair.sockperf(secs);
            if is_ambit {
                p99.1 = p99_
            } else {
                p99.0 = p99_
            }
            p50
        }));
        r.p99.push(p99);
        r.cps.push(pick(&mut |pair, is_ambit| {
            let p = perf("conn", is_ambit);
            let c0 = cpu_seconds(proxies);
            let (rate, n) = pair.wrk(secs, true);
            p.stop();
            if is_ambit {
                r.cpu_conn.push((cpu_seconds(proxies) - c0) / n * 1e4);
            }
            rate
        }));
        r.rps.push(pick(&mut |pair, is_ambit| {
            let p = perf("req", is_ambit);
            let c0 = cpu_seconds(proxies);
            let (rate, n) = pair.wrk(secs, false);
            p.stop();
            if is_ambit {
                r.cpu_req.push((cpu_seconds(proxies) - c0) / n * 1e4);
            }
            rate
        }));
        eprintln!(
            "round {}/{} (baseline, ambit): tput {:?} Gbit/s, p50 {:?} µs, p99 {:?} µs, conn/s {:?}, req/s {:?}; \
             proxy CPU s/GB {:.2}, s/10k conn {:.2}, s/10k req {:.2}; load {}",
            round + 1,
            s.rounds,
            r.tput[round],
            r.p50[round],
            r.p99[round],
            r.cps[round],
            r.rps[round],
            r.cpu_gb[round],
            r.cpu_conn[round],
            r.cpu_req[round],
            loadavg(),
        );
    }
    r
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `12345.6` → `12 346`.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn print_table(title: &str, proxies: &str, r: &Results, rss: f64) {
    let base = |v: &[(f64, f64)]| median(&v.iter().map(|p| p.0).collect::<Vec<_>>());
    let ours = |v: &[(f64, f64)]| median(&v.iter().map(|p| p.1).collect::<Vec<_>>());
    let ratio = |v: &[(f64, f64)]| median(&v.iter().map(|p| p.1 / p.0).collect::<Vec<_>>());
    let added = |v: &[(f64, f64)]| median(&v.iter().map(|p| p.1 - p.0).collect::<Vec<_>>());
    let per_round =
        |v: &[f64], digits: usize| v.iter().map(|x| format!("{x:.digits$}")).collect::<Vec<_>>().join(" / ");
    let ratios = |v: &[(f64, f64)]| per_round(&v.iter().map(|p| p.1 / p.0).collect::<Vec<_>>(), 2);
    let adds = |v: &[(f64, f64)]| per_round(&v.iter().map(|p| p.1 - p.0).collect::<Vec<_>>(), 1);
    println!("\n### {title}\n");
    println!("| Figure | Baseline | Ambit | Ambit / baseline (median of per-round) | Per round |");
    println!("|---|---|---|---|---|");
    println!(
        "| Throughput, 1 TCP stream (iperf3), Gbit/s | {:.2} | {:.2} | {:.2} | {} |",
        base(&r.tput),
        ours(&r.tput),
        ratio(&r.tput),
        ratios(&r.tput)
    );
    println!(
        "| Latency p50, 1 KiB ping-pong (sockperf), µs | {:.1} | {:.1} | +{:.1} µs | {} |",
        base(&r.p50),
        ours(&r.p50),
        added(&r.p50),
        adds(&r.p50)
    );
    println!(
        "| Latency p99, µs | {:.1} | {:.1} | +{:.1} µs | {} |",
        base(&r.p99),
        ours(&r.p99),
        added(&r.p99),
        adds(&r.p99)
    );
    println!(
        "| New connections/s (wrk -c16, `Connection: close`, nginx 1 KiB) | {} | {} | {:.2} | {} |",
        thousands(base(&r.cps)),
        thousands(ours(&r.cps)),
        ratio(&r.cps),
        ratios(&r.cps)
    );
    println!(
        "| Keep-alive requests/s (wrk -c16, nginx 1 KiB) | {} | {} | {:.2} | {} |",
        thousands(base(&r.rps)),
        thousands(ours(&r.rps)),
        ratio(&r.rps),
        ratios(&r.rps)
    );
    println!(
        "| Proxy CPU ({proxies}), s per GB | — | {:.2} | — | {} |",
        median(&r.cpu_gb),
        per_round(&r.cpu_gb, 2)
    );
    println!(
        "| Proxy CPU, s per 10k new connections | — | {:.2} | — | {} |",
        median(&r.cpu_conn),
        per_round(&r.cpu_conn, 2)
    );
    println!(
        "| Proxy CPU, s per 10k keep-alive requests | — | {:.2} | — | {} |",
        median(&r.cpu_req),
        per_round(&r.cpu_req, 2)
    );
    println!("| Proxy peak RSS (largest), MiB | — | {rss:.1} | — | |");
}

/// How many idle pods per namespace the default path's cluster starts besides the pairs (for the
/// in-cluster CNI ADD figures).
const IDLE_PODS: usize = 10;

/// The default path's cluster for `ambit up`: an enrolled namespace `mesh` and a plain one
/// `base`, each with a client on node1 and a server on node2 running nginx, iperf3 and sockperf
/// as its containers, and [`IDLE_PODS`] idle pods.
fn default_cluster(www: &Path) -> String {
    let dir = www.parent().unwrap_or(www);
    let mut out = String::new();
    for (ns, label) in [("mesh", "  labels:\n    istio.io/dataplane-mode: ambient\n"), ("base", "")] {
        let nginx = nginx_container(dir, ns);
        out += &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n{label}---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: client, namespace: {ns}}}\nspec:\n  nodeName: node1\n  containers: [{{name: idle, command: [sleep, infinity]}}]\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: server, namespace: {ns}, labels: {{app: server}}}}\nspec:\n  nodeName: node2\n  containers:\n\
             \x20 - {nginx}\n\
             \x20 - {{name: iperf3, command: [iperf3, -s, -p, \"5201\"], ports: [{{containerPort: 5201}}]}}\n\
             \x20 - {{name: sockperf, command: [sockperf, sr, --tcp, -i, 0.0.0.0, -p, \"11111\"], ports: [{{containerPort: 11111}}]}}\n---\n\
             apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: idle, namespace: {ns}}}\nspec:\n  replicas: {IDLE_PODS}\n  selector: {{matchLabels: {{app: idle}}}}\n\
             \x20 template:\n    metadata: {{labels: {{app: idle}}}}\n    spec:\n      containers: [{{name: idle, command: [sleep, infinity]}}]\n---\n"
        );
    }
    out
}

/// The default path, as users run it: `ambit up` with two nodes (pods through each node's CNI
/// chain, the real agents' nftables capture, shared-mode node proxies with state and
/// certificates from `ambit control` over xDS), client on node1, server on node2. Baseline: the
/// same pods in a namespace that is not enrolled (same chain, bridges and routes; no capture, no
/// proxy). Also prints how long `ambit up` took and the CNI ADD latency of the cluster's pods.
fn default_path(s: &Settings, www: &Path) {
    let mut c = LocalCluster::new();
    let config = c.config(&default_cluster(www));
    let t0 = std::time::Instant::now();
    c.up(2, &config);
    let took = t0.elapsed();
    let state = c.state();
    let cni = |ns: &str| -> Vec<f64> {
        state.pods.iter().filter(|p| p.namespace == ns).map(|p| p.cni_add_ms).collect()
    };
    let (mesh_cni, base_cni) = (cni("mesh"), cni("base"));
    println!(
        "\n`ambit up` of {} pods on 2 nodes: ready (every pod ready, every node proxy holding every pod) in {:.2} s",
        state.pods.len(),
        took.as_secs_f64()
    );
    println!("\n| CNI ADD inside the cluster ({} pods each) | p50 | p99 |\n|---|---|---|", mesh_cni.len());
    println!(
        "| not enrolled (loopback, bridge, host-local, ambit-cni passes) | {:.1} ms | {:.1} ms |",
        percentile(&base_cni, 50.0),
        percentile(&base_cni, 99.0)
    );
    println!(
        "| enrolled (… ambit-cni waits for capture and the proxy's ack) | {:.1} ms | {:.1} ms |",
        percentile(&mesh_cni, 50.0),
        percentile(&mesh_cni, 99.0)
    );
    let proxies: Vec<u32> =
        state.processes.iter().filter(|p| p.name.starts_with("proxy/")).filter_map(|p| p.pid).collect();
    assert_eq!(proxies.len(), 2, "two node proxies: {:?}", state.processes);
    let pair = |ns: &str| Pair {
        client_netns: c.pod(&format!("{ns}/client")).netns,
        server_ip: c.pod(&format!("{ns}/server")).ip.unwrap_or_else(|| panic!("{ns}/server has no IP")),
        _servers: Vec::new(),
    };
    let (base, ambit) = (pair("base"), pair("mesh"));
    // The mesh pair is mTLS through both node proxies, counted with the client's identity.
    let before = c.counters();
    ambit.wrk(1, false);
    let got = counted(&before, &c.counters());
    assert!(
        got.mtls >= 16.0
            && got.plaintext == 0.0
            && got.principals == ["spiffe://cluster.local/ns/mesh/sa/default"],
        "{got:?}"
    );
    let r = measure(s, "default", &base, &ambit, &proxies);
    print_table(
        "Default path on `ambit up`: node1 → node2, shared node proxies, nftables capture by the agents, xDS and certificates from `ambit control`",
        "both node proxies",
        &r,
        peak_rss_mib(&proxies),
    );
}

/// Dedicated mode: one proxy inside each pod, iptables capture of the spec's rule set.
fn dedicated(s: &Settings, logs: &Path, www: &Path) {
    let mut mesh = Mesh::new();
    mesh.log_to_files(logs);
    let bc = mesh.outside_pod("base-client");
    let bs = mesh.outside_pod("base-server");
    let c = mesh.pod("client", "client");
    let sv = mesh.pod("server", "server");
    mesh.write_config(&[&c, &sv], &[], &[]);
    let proxies = [mesh.start_proxy(&c), mesh.start_proxy(&sv)];
    let pids: Vec<u32> = proxies.iter().map(ChildGuard::pid).collect();
    let echo = sv.pod.echo_server(7070);
    assert_echo(&c.pod, sv.pod.addr4(7070), "mesh pair");
    drop(echo);
    let base = Pair::new(&bc.netns, &bs, www, "dedicated-base");
    let ambit = Pair::new(&c.pod.netns, &sv.pod, www, "dedicated-ambit");
    let r = measure(s, "dedicated", &base, &ambit, &pids);
    print_table(
        "Dedicated mode: one proxy per pod, iptables capture (spec rule set)",
        "both proxies",
        &r,
        peak_rss_mib(&pids),
    );
}

#[test]
#[ignore = "benchmark: run `bash benches/e2e.sh` (release build) as root"]
fn bench_e2e() {
    if !require_root() {
        return;
    }
    let s = Settings::from_env();
    let dir = tempfile::tempdir().expect("tempdir");
    // The nginx configurations (`nginx_conf`) serve this folder.
    let www = dir.path().join("www");
    println!(
        "{} round(s) of {} s per figure, modes {:?}; load at start {}",
        s.rounds,
        s.secs,
        s.modes,
        loadavg()
    );
    for mode in &s.modes {
        match mode.as_str() {
            "default" => default_path(&s, &www),
            "dedicated" => dedicated(&s, dir.path(), &www),
            other => panic!("BENCH_MODES: unknown mode {other:?} (default, dedicated)"),
        }
    }
    println!("\nload at end {}", loadavg());
}
