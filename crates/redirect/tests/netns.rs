//! Root tests: both backends applied for real in fresh network namespaces (v4 and v6), live rule
//! sets compared with the rendered ones, real redirected connections, drift reconcile, 500
//! apply/remove cycles, and the host probe SNAT in a namespace standing in for the host.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ambit_cluster::testing::require_root;
use ambit_redirect::host::{IptablesProbeSnat, NftProbeSnat, ProbeEntryRemoval, kubelet_uid};
use ambit_redirect::{
    Family, IptablesBackend, NftablesBackend, PodCapture, RuleBackend, Verification, Xtables, in_netns,
    render_iptables, render_nftables,
};

/// A named network namespace, deleted on drop (also when the test fails).
struct Netns {
    name: String,
    file: File,
}

impl Netns {
    fn try_new(tag: &str) -> Result<Netns, String> {
        let name = format!("rdx{}-{tag}-{:04x}", std::process::id(), rand::random::<u16>());
        let out = Command::new("ip").args(["netns", "add", &name]).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("ip netns add: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let file = File::open(format!("/var/run/netns/{name}")).map_err(|e| e.to_string())?;
        Ok(Netns { name, file })
    }

    fn new(tag: &str) -> Netns {
        let ns = Netns::try_new(tag).unwrap_or_else(|e| panic!("cannot create netns: {e}"));
        ns.ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn exec(&self, argv: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {argv:?}: {e}"))
    }

    fn ok(&self, argv: &[&str]) -> String {
        let out = self.exec(argv);
        assert!(out.status.success(), "{argv:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(self.file.as_fd(), || Ok(f())).unwrap_or_else(|e| panic!("cannot enter {}: {e}", self.name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

fn dual_stack() -> PodCapture {
    PodCapture { ipv6: true, virtual_interfaces: vec!["vif0".into()], ..PodCapture::default() }
}

fn iptables_backend() -> IptablesBackend {
    IptablesBackend::with_binaries(Xtables::named("iptables-nft"), Xtables::named("ip6tables-nft"), true)
}

/// Nothing of ours left: no istio/ISTIO tables or chains, no fwmark rule, no table-100 routes.
fn assert_clean(ns: &Netns) {
    let ruleset = ns.ok(&["nft", "list", "ruleset"]);
    assert!(!ruleset.to_lowercase().contains("istio"), "leftover rules:\n{ruleset}");
    for family in ["-4", "-6"] {
        let rules = ns.ok(&["ip", family, "rule", "show"]);
        assert!(!rules.contains("0x111") && !rules.contains("32764"), "leftover ip rule:\n{rules}");
        let out = ns.exec(&["ip", family, "route", "show", "table", "100"]);
        let routes = String::from_utf8_lossy(&out.stdout);
        assert!(routes.trim().is_empty(), "leftover table 100 routes:\n{routes}");
    }
}

/// The live istio tables of `nft list ruleset`, trimmed, counters reduced to `counter`.
fn live_nft_listing(ns: &Netns) -> Vec<String> {
    let ruleset = ns.ok(&["nft", "list", "ruleset"]);
    let mut lines = Vec::new();
    let mut inside = false;
    for raw in ruleset.lines() {
        if raw.starts_with("table inet istio-ambient-") {
            inside = true;
        }
        if inside {
            let line = raw.trim();
            if !line.is_empty() {
                let mut tokens: Vec<&str> = line.split_whitespace().collect();
                if let Some(i) = tokens.iter().position(|t| *t == "packets") {
                    tokens.drain(i..i + 4);
                }
                lines.push(tokens.join(" "));
            }
            if raw == "}" {
                inside = false;
            }
        }
    }
    lines
}

fn check_cycle(backend: &dyn RuleBackend, capture: &PodCapture) -> Netns {
    let ns = Netns::new("pod");
    let fd = ns.file.as_fd();
    assert_eq!(backend.verify(fd, capture).expect("verify clean"), Verification::Absent);
    backend.apply(fd, capture).expect("apply");
    assert_eq!(backend.verify(fd, capture).expect("verify"), Verification::InSync);
    for family in ["-4", "-6"] {
        assert!(
            ns.ok(&["ip", family, "rule", "show"]).contains("32764:\tfrom all fwmark 0x111/0xfff lookup 100")
        );
        assert!(ns.ok(&["ip", family, "route", "show", "table", "100"]).starts_with("local default dev lo"));
    }
    ns
}

fn check_removal(backend: &dyn RuleBackend, capture: &PodCapture, ns: &Netns) {
    let fd = ns.file.as_fd();
    backend.remove(fd, capture).expect("remove");
    assert_clean(ns);
    backend.remove(fd, capture).expect("second remove");
    assert_clean(ns);
    assert_eq!(backend.verify(fd, capture).expect("verify after remove"), Verification::Absent);
}

#[test]
fn nftables_apply_verify_remove() {
    if !require_root() {
        return;
    }
    let backend = NftablesBackend::default();
    let capture = dual_stack();
    let ns = check_cycle(&backend, &capture);
    let live = live_nft_listing(&ns);
    assert_eq!(live, render_nftables(&capture).listing(), "live ruleset differs from the rendering");
    backend.apply(ns.file.as_fd(), &capture).expect("second apply");
    assert_eq!(live_nft_listing(&ns), live, "second apply changed the ruleset");
    assert_eq!(backend.verify(ns.file.as_fd(), &capture).expect("verify"), Verification::InSync);
    // Turning DNS capture off rebuilds without the raw table (in the same transaction).
    let no_dns = PodCapture { dns: false, ..capture.clone() };
    backend.apply(ns.file.as_fd(), &no_dns).expect("apply without DNS");
    assert!(!ns.ok(&["nft", "list", "ruleset"]).contains("istio-ambient-raw"));
    assert_eq!(backend.verify(ns.file.as_fd(), &no_dns).expect("verify"), Verification::InSync);
    assert!(matches!(backend.verify(ns.file.as_fd(), &capture).expect("verify"), Verification::Drift(_)));
    check_removal(&backend, &capture, &ns);
}

/// A dual-stack capture in a pod whose IPv6 is disabled (an IPv4-only node with the agent's
/// IPv6 support on): apply, verify and remove all work, and no IPv6 route is needed.
#[test]
fn nftables_dual_stack_capture_in_a_pod_without_ipv6() {
    if !require_root() {
        return;
    }
    let backend = NftablesBackend::default();
    let capture = dual_stack();
    let ns = Netns::new("nov6");
    ns.ok(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
    ns.ok(&["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1"]);
    let fd = ns.file.as_fd();
    backend.apply(fd, &capture).expect("apply without IPv6");
    assert_eq!(backend.verify(fd, &capture).expect("verify"), Verification::InSync);
    assert_eq!(live_nft_listing(&ns), render_nftables(&capture).listing());
    backend.apply(fd, &capture).expect("second apply");
    check_removal(&backend, &capture, &ns);
}

#[test]
fn nftables_drift_is_detected_and_repaired() {
    if !require_root() {
        return;
    }
    let backend = NftablesBackend::default();
    let capture = dual_stack();
    let ns = check_cycle(&backend, &capture);
    ns.ok(&[
        "nft",
        "add",
        "rule",
        "inet",
        "istio-ambient-nat",
        "istio-output",
        "tcp",
        "dport",
        "9999",
        "accept",
    ]);
    let Verification::Drift(details) = backend.verify(ns.file.as_fd(), &capture).expect("verify") else {
        panic!("foreign rule not detected");
    };
    assert!(!details.is_empty());
    backend.apply(ns.file.as_fd(), &capture).expect("apply");
    assert_eq!(backend.verify(ns.file.as_fd(), &capture).expect("verify"), Verification::InSync);

    // Same number of rules, one value changed: still drift (the comparison reads values).
    ns.ok(&["nft", "flush", "chain", "inet", "istio-ambient-mangle", "istio-output"]);
    ns.ok(&[
        "nft",
        "add",
        "rule",
        "inet",
        "istio-ambient-mangle",
        "istio-output",
        "ct",
        "mark",
        "and",
        "0xfff",
        "==",
        "0x222",
        "counter",
        "meta",
        "mark",
        "set",
        "ct",
        "mark",
    ]);
    let Verification::Drift(details) = backend.verify(ns.file.as_fd(), &capture).expect("verify") else {
        panic!("changed mark value not detected");
    };
    assert!(details.iter().any(|d| d.contains("istio-output")), "{details:?}");
    // A missing policy-routing rule is drift too.
    ns.ok(&["ip", "-4", "rule", "del", "fwmark", "0x111/0xfff", "lookup", "100"]);
    backend.apply(ns.file.as_fd(), &capture).expect("apply");
    ns.ok(&["ip", "-4", "rule", "del", "fwmark", "0x111/0xfff", "lookup", "100"]);
    let Verification::Drift(details) = backend.verify(ns.file.as_fd(), &capture).expect("verify") else {
        panic!("missing ip rule not detected");
    };
    assert!(details.iter().any(|d| d.contains("rule")), "{details:?}");
    backend.apply(ns.file.as_fd(), &capture).expect("apply");
    assert_eq!(backend.verify(ns.file.as_fd(), &capture).expect("verify"), Verification::InSync);
    check_removal(&backend, &capture, &ns);
}

#[test]
fn iptables_apply_verify_remove() {
    if !require_root() {
        return;
    }
    let backend = iptables_backend();
    let capture = dual_stack();
    let ns = check_cycle(&backend, &capture);
    for (family, cmd, save) in [
        (Family::V4, "iptables-nft", "iptables-nft-save"),
        (Family::V6, "ip6tables-nft", "ip6tables-nft-save"),
    ] {
        let rendered = render_iptables(&capture, family);
        let live = ns.ok(&[save]);
        // Every rendered rule is in the kernel (-C), and nothing else of ours is.
        let mut table = "";
        let mut count = 0;
        for line in rendered.lines() {
            if let Some(t) = line.strip_prefix("* ") {
                table = t;
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let mut argv = vec![cmd, "-t", table, "-C"];
                argv.extend(rule.split_whitespace());
                ns.ok(&argv);
                count += 1;
            }
        }
        let ours = live.lines().filter(|l| l.starts_with("-A") && l.contains("ISTIO_")).count();
        assert_eq!(ours, count, "{cmd}: live rules differ from the rendering:\n{live}");
        assert_eq!(live.matches(":ISTIO_").count(), 2 * 3, "{cmd}: chains in mangle, nat, raw:\n{live}");
    }
    let before =
        ns.ok(&["iptables-nft-save"]).lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    backend.apply(ns.file.as_fd(), &capture).expect("second apply");
    let after =
        ns.ok(&["iptables-nft-save"]).lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    assert_eq!(before, after, "second apply changed the rules");
    check_removal(&backend, &capture, &ns);
}

#[test]
fn iptables_foreign_rule_is_reconciled() {
    if !require_root() {
        return;
    }
    let backend = iptables_backend();
    let capture = dual_stack();
    let ns = check_cycle(&backend, &capture);
    ns.ok(&[
        "iptables-nft",
        "-t",
        "nat",
        "-A",
        "ISTIO_OUTPUT",
        "-p",
        "tcp",
        "--dport",
        "9999",
        "-j",
        "ACCEPT",
    ]);
    ns.ok(&["ip6tables-nft", "-t", "mangle", "-A", "OUTPUT", "-j", "ISTIO_OUTPUT"]);
    let Verification::Drift(details) = backend.verify(ns.file.as_fd(), &capture).expect("verify") else {
        panic!("foreign rules not detected");
    };
    assert!(details.iter().any(|d| d.contains("nat/ISTIO_OUTPUT")), "{details:?}");
    assert!(details.iter().any(|d| d.contains("duplicate jump")), "{details:?}");
    backend.apply(ns.file.as_fd(), &capture).expect("reconciling apply");
    assert_eq!(backend.verify(ns.file.as_fd(), &capture).expect("verify"), Verification::InSync);
    assert!(!ns.ok(&["iptables-nft-save"]).contains("9999"));
    assert!(!ns.ok(&["iptables-nft-save"]).contains("DROP"), "guardrails left behind");
    check_removal(&backend, &capture, &ns);
}

fn migrate_req(ns: &Netns) -> String {
    ns.ok(&["sysctl", "-n", "net.ipv4.tcp_migrate_req"]).trim().to_owned()
}

/// `net.ipv4.tcp_migrate_req` is part of the capture: apply sets it to 1 in the pod netns (and
/// nowhere else), verify reports it when it drifts back to 0, apply repairs it, remove puts the
/// kernel default back.
fn check_migrate_req(backend: &dyn RuleBackend) {
    let host_before = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req").expect("host sysctl");
    let capture = dual_stack();
    let ns = Netns::new("mig");
    let fd = ns.file.as_fd();
    assert_eq!(migrate_req(&ns), "0", "a fresh netns starts with the kernel default");
    backend.apply(fd, &capture).expect("apply");
    assert_eq!(migrate_req(&ns), "1", "apply must set net.ipv4.tcp_migrate_req in the pod netns");
    assert_eq!(backend.verify(fd, &capture).expect("verify"), Verification::InSync);
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req").expect("host sysctl"),
        host_before,
        "the test's own netns changed"
    );
    ns.ok(&["sysctl", "-qw", "net.ipv4.tcp_migrate_req=0"]);
    assert_eq!(
        backend.verify(fd, &capture).expect("verify"),
        Verification::Drift(vec![
            "sysctl net.ipv4.tcp_migrate_req is 0, want 1 (a node proxy upgrade would reset queued connections)"
                .to_owned()
        ])
    );
    backend.apply(fd, &capture).expect("repairing apply");
    assert_eq!(migrate_req(&ns), "1");
    assert_eq!(backend.verify(fd, &capture).expect("verify"), Verification::InSync);
    backend.remove(fd, &capture).expect("remove");
    assert_eq!(migrate_req(&ns), "0", "remove must restore the kernel default");
    assert_eq!(backend.verify(fd, &capture).expect("verify"), Verification::Absent);
}

#[test]
fn nftables_sets_and_verifies_tcp_migrate_req() {
    if !require_root() {
        return;
    }
    check_migrate_req(&NftablesBackend::default());
}

#[test]
fn iptables_sets_and_verifies_tcp_migrate_req() {
    if !require_root() {
        return;
    }
    check_migrate_req(&iptables_backend());
}

/// A pod netns wired to a peer netns over a veth: 10.77.0.1/24 + fd77::1/64 ↔ .2 / ::2.
fn pod_with_peer() -> (Netns, Netns) {
    let pod = Netns::new("pod");
    let peer = Netns::new("peer");
    pod.ok(&["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &peer.name]);
    for (ns, v4, v6) in [(&pod, "10.77.0.1/24", "fd77::1/64"), (&peer, "10.77.0.2/24", "fd77::2/64")] {
        ns.ok(&["ip", "addr", "add", v4, "dev", "eth0"]);
        ns.ok(&["ip", "addr", "add", v6, "dev", "eth0", "nodad"]);
        ns.ok(&["ip", "link", "set", "eth0", "up"]);
    }
    (pod, peer)
}

fn accept_within(listener: &TcpListener, timeout: Duration) -> Option<TcpStream> {
    listener.set_nonblocking(true).expect("nonblocking listener");
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok((stream, _)) = listener.accept() {
            return Some(stream);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn listen(ns: &Netns, addr: SocketAddr) -> TcpListener {
    ns.run(|| {
        let domain = socket2::Domain::for_address(addr);
        let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None).expect("socket");
        if addr.is_ipv6() {
            socket.set_only_v6(true).expect("v6only");
        }
        socket.set_reuse_address(true).expect("reuseaddr");
        socket.bind(&addr.into()).expect("bind");
        socket.listen(16).expect("listen");
        TcpListener::from(socket)
    })
}

fn connect(ns: &Netns, addr: SocketAddr, mark: Option<u32>) -> std::io::Result<TcpStream> {
    ns.run(|| {
        let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
        if let Some(mark) = mark {
            socket.set_mark(mark)?;
        }
        socket.connect_timeout(&addr.into(), Duration::from_secs(3))?;
        Ok(TcpStream::from(socket))
    })
}

fn check_redirect(backend: &dyn RuleBackend) {
    let (pod, peer) = pod_with_peer();
    let capture = PodCapture { ipv6: true, ..PodCapture::default() };
    backend.apply(pod.file.as_fd(), &capture).expect("apply");
    for (any, target) in [
        (IpAddr::from(Ipv4Addr::UNSPECIFIED), IpAddr::from(Ipv4Addr::new(10, 77, 0, 2))),
        (IpAddr::from(Ipv6Addr::UNSPECIFIED), "fd77::2".parse().expect("address")),
    ] {
        let outbound = listen(&pod, SocketAddr::new(any, 15001));
        let app = listen(&peer, SocketAddr::new(any, 8080));
        let dst = SocketAddr::new(target, 8080);

        let mut client = connect(&pod, dst, None).expect("captured connect");
        let mut captured = accept_within(&outbound, Duration::from_secs(3))
            .unwrap_or_else(|| panic!("connection to {dst} was not redirected to 15001"));
        let original = captured.local_addr().expect("local addr");
        assert_eq!(original.port(), 15001);
        client.write_all(b"hi").expect("write");
        let mut buf = [0; 2];
        captured.set_nonblocking(false).expect("blocking");
        captured.read_exact(&mut buf).expect("read");
        assert_eq!(&buf, b"hi");
        assert!(
            accept_within(&app, Duration::from_millis(100)).is_none(),
            "captured connection reached {dst}"
        );

        let _marked = connect(&pod, dst, Some(0x539)).expect("marked connect");
        assert!(
            accept_within(&app, Duration::from_secs(3)).is_some(),
            "marked connection did not reach {dst}"
        );
        assert!(
            accept_within(&outbound, Duration::from_millis(100)).is_none(),
            "marked connection was redirected"
        );
    }
    backend.remove(pod.file.as_fd(), &capture).expect("remove");
    assert_clean(&pod);
}

#[test]
fn nftables_redirects_real_connections() {
    if require_root() {
        check_redirect(&NftablesBackend::default());
    }
}

#[test]
fn iptables_redirects_real_connections() {
    if require_root() {
        check_redirect(&iptables_backend());
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn check_many_cycles(backend: &dyn RuleBackend) {
    let ns = Netns::new("cycles");
    let capture = dual_stack();
    // One warm-up cycle: lazily opened fds (e.g. by the test harness) are counted in `before`.
    backend.apply(ns.file.as_fd(), &capture).expect("apply");
    backend.remove(ns.file.as_fd(), &capture).expect("remove");
    let before = open_fds();
    for i in 0..500 {
        backend.apply(ns.file.as_fd(), &capture).unwrap_or_else(|e| panic!("apply #{i}: {e}"));
        backend.remove(ns.file.as_fd(), &capture).unwrap_or_else(|e| panic!("remove #{i}: {e}"));
    }
    assert_clean(&ns);
    let after = open_fds();
    // Other tests run in parallel threads of this process: allow their few transient fds.
    assert!(after <= before + 8, "fds grew from {before} to {after} over 500 cycles");
}

#[test]
fn nftables_500_cycles_leave_nothing_behind() {
    if require_root() {
        check_many_cycles(&NftablesBackend::default());
    }
}

#[test]
fn iptables_500_cycles_leave_nothing_behind() {
    if require_root() {
        check_many_cycles(&iptables_backend());
    }
}

#[test]
fn nft_host_probe_snat() {
    if !require_root() {
        return;
    }
    let host = Netns::new("host");
    let fd = host.file.as_fd();
    let snat = NftProbeSnat::new(true, 4242);
    // Before install there is no set: the kernel's refusal names the operation and the errno.
    let err = snat.upsert(fd, "10.1.2.3".parse().expect("address"), "uid-a").expect_err("no set yet");
    let text = err.to_string();
    assert!(text.contains("add element inet istio-ambient-nat istio-inpod-probes-v4 { 10.1.2.3 }"), "{text}");
    assert!(text.contains("ENOENT"), "{text}");
    assert!(!host.ok(&["nft", "list", "ruleset"]).contains("istio"), "nothing half-applied");
    snat.install(fd).expect("install");
    snat.install(fd).expect("install again");
    let ruleset = host.ok(&["nft", "list", "ruleset"]);
    assert!(ruleset.contains("meta skuid 4242 ip daddr @istio-inpod-probes-v4"), "{ruleset}");
    assert!(ruleset.contains("snat ip6 to fd16:9254:7127:1337:ffff:ffff:ffff:ffff"), "{ruleset}");

    let ip: IpAddr = "10.1.2.3".parse().expect("address");
    let mapped: IpAddr = "::ffff:10.1.2.3".parse().expect("address");
    snat.upsert(fd, ip, "uid-a").expect("upsert");
    snat.upsert(fd, mapped, "uid-b").expect("upsert replaces the owner");
    snat.upsert(fd, "fd00::7".parse().expect("address"), "uid-c").expect("upsert v6");
    let entries = snat.entries(fd).expect("entries");
    assert!(entries.contains(&(ip, Some("uid-b".into()))), "{entries:?}");
    assert_eq!(entries.len(), 2);
    // nft itself reads our element and set comments (same user-data encoding as nft's).
    let set = host.ok(&["nft", "list", "set", "inet", "istio-ambient-nat", "istio-inpod-probes-v4"]);
    assert!(set.contains("10.1.2.3 comment \"uid-b\""), "{set}");
    assert!(set.contains("comment \"kubelet probe targets"), "{set}");
    assert_eq!(
        snat.remove_for_pod(fd, ip, "uid-a").expect("remove"),
        ProbeEntryRemoval::Foreign("uid-b".into())
    );
    // Reinstalling the rules keeps the elements.
    snat.install(fd).expect("reinstall");
    assert_eq!(snat.remove_for_pod(fd, ip, "uid-b").expect("remove"), ProbeEntryRemoval::Removed);
    assert_eq!(snat.remove_for_pod(fd, ip, "uid-b").expect("remove"), ProbeEntryRemoval::Absent);
    assert!(snat.upsert(fd, ip, "bad\" uid").is_err(), "quote in a comment accepted");
    snat.delete_rules(fd).expect("delete rules");
    assert!(!host.ok(&["nft", "list", "ruleset"]).contains("snat"));
    assert_eq!(snat.entries(fd).expect("entries").len(), 1, "delete_rules must keep the sets");
    snat.flush_sets(fd).expect("flush");
    assert!(snat.entries(fd).expect("entries").is_empty());
    snat.destroy(fd).expect("destroy");
    snat.destroy(fd).expect("destroy again");
    assert!(!host.ok(&["nft", "list", "ruleset"]).contains("istio"));
}

#[test]
fn iptables_host_probe_snat() {
    if !require_root() {
        return;
    }
    let host = Netns::new("host");
    let fd = host.file.as_fd();
    let snat = IptablesProbeSnat::new(true, Xtables::named("iptables-nft"), Xtables::named("ip6tables-nft"));
    snat.install(fd).expect("install");
    snat.install(fd).expect("install again");
    let spec = "-m owner --socket-exists -p tcp -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127";
    let mut argv = vec!["iptables-nft", "-t", "nat", "-C", "ISTIO_POSTRT"];
    argv.extend(spec.split_whitespace());
    host.ok(&argv);
    let saved = host.ok(&["iptables-nft-save", "-t", "nat"]);
    assert_eq!(saved.matches("-A POSTROUTING -j ISTIO_POSTRT").count(), 1, "{saved}");
    assert!(host.ok(&["ip6tables-nft-save", "-t", "nat"]).contains("istio-inpod-probes-v6"));

    let ip: IpAddr = "10.1.2.3".parse().expect("address");
    snat.upsert(fd, ip, "uid-a").expect("upsert");
    snat.upsert(fd, ip, "uid-b").expect("upsert replaces");
    assert_eq!(
        snat.remove_for_pod(fd, ip, "uid-a").expect("remove"),
        ProbeEntryRemoval::Foreign("uid-b".into())
    );
    assert_eq!(snat.remove_for_pod(fd, ip, "uid-b").expect("remove"), ProbeEntryRemoval::Removed);
    assert_eq!(snat.remove_for_pod(fd, ip, "uid-b").expect("remove"), ProbeEntryRemoval::Absent);
    snat.upsert(fd, "fd00::9".parse().expect("address"), "uid-v6").expect("upsert v6");
    snat.flush_sets(fd).expect("flush");
    assert!(snat.entries(fd).expect("entries").is_empty());
    snat.destroy(fd).expect("destroy");
    snat.destroy(fd).expect("destroy again");
    assert!(!host.ok(&["iptables-nft-save"]).contains("ISTIO"));
    assert!(!host.ok(&["ipset", "list", "-n"]).contains("istio"));
}

#[test]
fn kubelet_uid_from_proc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let add = |pid: &str, comm: &str, cmdline: &str, uid: u32| {
        let p = dir.path().join(pid);
        std::fs::create_dir(&p).expect("mkdir");
        std::fs::write(p.join("comm"), format!("{comm}\n")).expect("comm");
        std::fs::write(p.join("cmdline"), cmdline.replace(' ', "\0")).expect("cmdline");
        std::fs::write(p.join("status"), format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"))
            .expect("status");
    };
    std::fs::create_dir(dir.path().join("self")).expect("mkdir");
    add("10", "k3s", "k3s server", 7);
    assert_eq!(kubelet_uid(dir.path()).expect("k3s"), 7);
    add("20", "kubelet", "/usr/bin/something --config x", 8); // argv lacks "kubelet": ignored
    assert_eq!(kubelet_uid(dir.path()).expect("k3s still"), 7);
    add("30", "kubelet", "/usr/bin/KUBELET --config x", 9);
    assert_eq!(kubelet_uid(dir.path()).expect("kubelet"), 9);
    let empty = tempfile::tempdir().expect("tempdir");
    assert!(kubelet_uid(empty.path()).is_err());
}
