//! End-to-end tests of `ambit proxy` in dedicated mode: pods as network namespaces with the
//! in-pod capture rules, one proxy process per pod, one local config file (ztunnel's format).
//! Needs root; under `CI=true` a missing privilege fails the test instead of skipping it.

mod common;
mod mesh;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::*;
use mesh::*;

const MARKER: &[u8] = b"AMBIT-PLAINTEXT-MARKER-7f3a";

/// A → B over HBONE: payload arrives, the wire shows TLS on 15008 and never the plaintext, B's
/// app sees A's IP, and metrics and access logs on both sides carry both identities.
#[test]
fn hbone_between_two_pods() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    mesh.write_config(&[&a, &b], &[], &[]);
    let pa = mesh.start_proxy(&a);
    let pb = mesh.start_proxy_with(&b, &[("LOG_FORMAT", "json")]);
    let echo = b.pod.echo_server(8080);
    let cap = mesh.cluster.node().tcpdump(None);

    for dst in [b.pod.addr4(8080), b.pod.addr6(8080)] {
        let mut s = a.pod.connect_tcp(dst).expect("connect through the proxy");
        let reply = echo_roundtrip(&mut s, MARKER).expect("echo through HBONE");
        assert_eq!(reply, MARKER, "payload to {dst} did not come back intact");
    }
    let pcap = cap.stop();
    let segments = pcap_payloads(&pcap);
    assert!(!segments.is_empty(), "the capture saw no traffic");
    for (src, dst, payload) in &segments {
        assert!(!contains(payload, MARKER), "plaintext seen on the wire: {src} -> {dst}");
    }
    let tls_to_15008 = segments
        .iter()
        .filter(|(_, dst, p)| dst.port() == 15008 && matches!(p.first(), Some(0x16 | 0x17)))
        .count();
    assert!(tls_to_15008 >= 2, "expected TLS records to port 15008, saw {tls_to_15008}");
    assert!(
        segments.iter().all(|(s, d, _)| s.port() == 15008 || d.port() == 15008),
        "mesh traffic left the pod on a port other than 15008"
    );

    let peers = echo.peer_ips();
    assert!(peers.contains(&IpAddr::V4(a.pod.ip4)), "B's app did not see A's IPv4: {peers:?}");
    assert!(peers.contains(&IpAddr::V6(a.pod.ip6)), "B's app did not see A's IPv6: {peers:?}");

    let client_id = "spiffe://cluster.local/ns/default/sa/client";
    let server_id = "spiffe://cluster.local/ns/default/sa/server";
    let src_metrics = metrics(&a);
    let dst_metrics = metrics(&b);
    for (side, body, reporter) in [("A", &src_metrics, "source"), ("B", &dst_metrics, "destination")] {
        let line = body
            .lines()
            .find(|l| {
                l.starts_with("istio_tcp_connections_opened_total{")
                    && l.contains(&format!("reporter=\"{reporter}\""))
            })
            .unwrap_or_else(|| panic!("{side}: no opened counter with reporter={reporter}:\n{body}"));
        assert!(line.contains(&format!("source_principal=\"{client_id}\"")), "{side}: {line}");
        assert!(line.contains(&format!("destination_principal=\"{server_id}\"")), "{side}: {line}");
        assert!(line.contains("connection_security_policy=\"mutual_tls\""), "{side}: {line}");
        assert!(line.ends_with(" 2"), "{side}: expected 2 connections: {line}");
        let sent = counter(body, "istio_tcp_received_bytes_total", reporter);
        assert_eq!(sent, 2 * MARKER.len() as u64, "{side}: client->server bytes");
    }
    assert!(
        wait_for(
            || {
                let la = pa.logs();
                let lb = pb.logs();
                la.contains("connection complete") && lb.contains("connection complete")
            },
            Duration::from_secs(5)
        ),
        "no access log line:\nA:\n{}\nB:\n{}",
        pa.logs(),
        pb.logs()
    );
    let plain = pa.logs();
    let line = plain.lines().find(|l| l.contains("connection complete")).unwrap_or_default();
    assert!(line.contains(client_id) && line.contains(server_id), "access log lacks identities: {line}");
    // B logs JSON (LOG_FORMAT=json): one object per line with Istio's field names.
    let json = pb.logs();
    let line = json.lines().find(|l| l.contains("connection complete")).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(v["src.identity"], client_id, "{line}");
    assert_eq!(v["dst.identity"], server_id, "{line}");
    assert_eq!(v["direction"], "inbound", "{line}");
    assert_eq!(v["bytes_recv"], MARKER.len() as u64, "{line}");
}

/// Policies: a Deny on one port, an Allow-only-from-one-service-account, a policy added while a
/// connection is open, and plaintext refused where mTLS is required.
#[test]
fn authorization_policies() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let c = mesh.pod("c", "other");
    let b = mesh.pod("b", "server").with_policies(&["default/deny-9090"]);
    let d = mesh
        .pod("d", "strict")
        .with_policies(&["default/only-client", "istio-system/istio_converted_static_strict"]);
    let outside = mesh.outside_pod("e");
    let policies = [DENY_9090, ONLY_CLIENT, STATIC_STRICT];
    mesh.write_config(&[&a, &b, &c, &d], &policies, &[]);
    let [_pa, _pb, _pc, pd] =
        [mesh.start_proxy(&a), mesh.start_proxy(&b), mesh.start_proxy(&c), mesh.start_proxy(&d)];
    let _e8080 = b.pod.echo_server(8080);
    let e9090 = b.pod.echo_server(9090);
    let ed = d.pod.echo_server(8080);

    assert_echo(&a.pod, b.pod.addr4(8080), "deny-9090 must not block 8080");
    assert_denied(&a.pod, b.pod.addr4(9090), ProxyOf::Pod(&b), "deny-9090 must block 9090");
    assert!(e9090.peers().is_empty(), "a denied connection reached B's app on 9090");
    assert_echo(&c.pod, b.pod.addr4(8080), "any identity may reach B:8080");
    assert_echo(&a.pod, d.pod.addr4(8080), "only-client allows A");
    assert_denied(&c.pod, d.pod.addr4(8080), ProxyOf::Pod(&d), "only-client must block C");
    let before = ed.peers().len();
    assert_denied(
        &outside,
        d.pod.addr4(8080),
        ProxyOf::Pod(&d),
        "plaintext to a STRICT pod must be refused on 15006",
    );
    assert_eq!(ed.peers().len(), before, "the refused plaintext connection reached D's app");
    assert_echo(&outside, b.pod.addr4(8080), "plaintext to a non-strict pod is allowed");

    // A live connection that a new policy denies is closed.
    let mut live = a.pod.connect_tcp(d.pod.addr4(8080)).expect("connect");
    live.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    live.write_all(b"ping").expect("write");
    let mut buf = [0u8; 4];
    live.read_exact(&mut buf).expect("echo before the policy change");
    let deny_client = Policy {
        yaml: "- name: deny-client\n  namespace: default\n  scope: Namespace\n  action: Deny\n  rules: [[[{principals: [{Exact: \"cluster.local/ns/default/sa/client\"}]}]]]\n",
    };
    mesh.write_config(&[&a, &b, &c, &d], &[DENY_9090, ONLY_CLIENT, STATIC_STRICT, deny_client], &[]);
    // Closed by D's proxy because of the new policy (not by a dead proxy), within the reload
    // interval (500 ms) plus the deny bound.
    let closed = expect_close(&mut live, Duration::from_secs(5));
    assert!(closed.is_ok(), "live connection not closed after the policy change: {closed:?}");
    assert!(
        wait_for(
            || pd.logs().contains("closing connection denied after a policy change"),
            Duration::from_secs(2)
        ),
        "D's proxy did not log closing the denied connection:\n{}",
        pd.logs()
    );
    assert_denied(&a.pod, d.pod.addr4(8080), ProxyOf::Pod(&d), "new connections are denied too");
}

/// A service VIP with two endpoints spreads connections over both; an unknown destination
/// passes through unchanged (plaintext on the wire).
#[test]
fn service_vip_and_passthrough() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server").in_service("default/echo.default.svc.cluster.local", 80, 8080);
    let c = mesh.pod("c", "server").in_service("default/echo.default.svc.cluster.local", 80, 8080);
    let outside = mesh.outside_pod("e");
    let vip = mesh.vip4(10);
    let service = format!(
        "- name: echo\n  namespace: default\n  hostname: echo.default.svc.cluster.local\n  vips: [\"/{vip}\"]\n  ports: {{80: 8080}}\n"
    );
    mesh.write_config(&[&a, &b, &c], &[], &[&service]);
    let _proxies = [mesh.start_proxy(&a), mesh.start_proxy(&b), mesh.start_proxy(&c)];
    let eb = b.pod.echo_server(8080);
    let ec = c.pod.echo_server(8080);
    for i in 0..20 {
        assert_echo(&a.pod, SocketAddr::new(vip.into(), 80), &format!("VIP connection {i}"));
    }
    let (nb, nc) = (eb.peers().len(), ec.peers().len());
    assert_eq!(nb + nc, 20);
    assert!(nb > 0 && nc > 0, "connections not spread over both endpoints: b={nb} c={nc}");

    let eo = outside.echo_server(7070);
    let cap = mesh.cluster.node().tcpdump(None);
    assert_echo(&a.pod, outside.addr4(7070), "passthrough to an unknown destination");
    let segments = pcap_payloads(&cap.stop());
    assert!(
        segments.iter().any(|(_, d, p)| d.port() == 7070 && contains(p, MARKER)),
        "passthrough traffic should be the unchanged plaintext"
    );
    assert_eq!(eo.peer_ips(), vec![IpAddr::V4(a.pod.ip4)]);
}

/// Graceful drain: listeners close at once and readiness turns to 500 "draining", an open
/// connection keeps working until the deadline and is then closed by force, and a second proxy
/// started beside the first takes every new connection.
#[test]
fn drain_and_handoff() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    mesh.write_config(&[&a, &b], &[], &[]);
    let _pa = mesh.start_proxy(&a);
    let mut old = mesh.start_proxy_with(&b, &[("CONNECTION_TERMINATION_DEADLINE", "8s")]);
    let _echo = b.pod.echo_server(8080);

    let mut held = a.pod.connect_tcp(b.pod.addr4(8080)).expect("connect");
    held.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    roundtrip(&mut held, b"before");

    let new = mesh.start_proxy_with(
        &b,
        &[
            ("AMBIT_ADMIN_ADDR", "127.0.0.1:16000"),
            ("AMBIT_STATS_ADDR", "[::]:16020"),
            ("AMBIT_READINESS_ADDR", "[::]:16021"),
        ],
    );
    // A client opening connections continuously while the old proxy is told to drain.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let (pod, dst, stop) = (a.pod.clone(), b.pod.addr4(8080), stop.clone());
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match pod.connect_tcp(dst).and_then(|mut s| echo_roundtrip(&mut s, b"x")) {
                    Ok(r) if r == b"x" => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (ok, failed)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    old.signal(nix::sys::signal::Signal::SIGTERM);
    let sigterm = Instant::now();
    assert!(
        wait_for(|| old.logs().contains("listener closed for drain"), Duration::from_secs(2)),
        "old proxy did not close its listeners at once:\n{}",
        old.logs()
    );
    // The draining proxy reports not ready (its readiness port stays open to say so).
    let mut last = None;
    let not_ready = wait_for(
        || {
            last = Some(b.pod.http_get(b.pod.addr4(15021), "/healthz/ready").map_err(|e| e.to_string()));
            last.as_ref()
                .is_some_and(|r| r.as_ref().is_ok_and(|(s, body)| *s == 500 && body.contains("draining")))
        },
        Duration::from_secs(2),
    );
    assert!(not_ready, "the draining proxy's readiness did not answer 500 draining: {last:?}");
    let opened_old = counter(&metrics(&b), "istio_tcp_connections_opened_total", "destination");
    std::thread::sleep(Duration::from_secs(2));
    // The held connection still works during the drain.
    roundtrip(&mut held, b"during drain");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = client.join().expect("client thread");
    let opened_old_after = counter(&metrics(&b), "istio_tcp_connections_opened_total", "destination");
    assert_eq!(opened_old_after, opened_old, "the draining proxy accepted new connections");
    assert!(
        failed.is_empty(),
        "{} of {} connections failed during the handoff: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    assert!(ok > 20, "too few connections during the handoff: {ok}");
    let new_opened =
        counter(&http_body(&b, 16020, "/metrics"), "istio_tcp_connections_opened_total", "destination");
    assert!(new_opened > 0, "the new proxy took no connection");
    assert!(old.try_wait().is_none(), "old proxy exited before its deadline with a connection open");
    // The held connection is still open at the deadline: the old proxy closes it by force then.
    let closed = expect_close(&mut held, Duration::from_secs(12));
    let at = sigterm.elapsed();
    assert!(closed.is_ok(), "held connection not closed at the drain deadline: {closed:?}");
    assert!(
        at >= Duration::from_millis(7500) && at <= Duration::from_secs(10),
        "held connection closed {at:?} after SIGTERM; the deadline is 8 s"
    );
    let status = old.wait_timeout(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "old proxy did not exit cleanly after its deadline: {status:?}"
    );
    // Its access-log line (the only inbound one with 18 bytes: "before" + "during drain") says
    // why it was closed.
    let logs = old.logs();
    let forced = logs.lines().find(|l| {
        l.contains("connection complete")
            && l.contains("direction=\"inbound\"")
            && l.contains("bytes_recv=18")
    });
    assert!(
        forced.is_some_and(|l| l.contains("error=\"connection failed to drain within the timeout\"")),
        "the old proxy did not log the forced close of the held connection:\n{logs}"
    );
    assert!(logs.contains("closed connections that did not finish before the drain deadline"), "{logs}");
    drop(new);
}

/// Bad input on 15008 and in the config file, each answered as the spec says while the proxy
/// keeps serving everyone else.
#[test]
fn bad_input_is_rejected_and_service_continues() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    let outside = mesh.outside_pod("e");
    mesh.write_config(&[&a, &b], &[], &[]);
    let _pa = mesh.start_proxy(&a);
    let pb = mesh.start_proxy(&b);
    let _echo = b.pod.echo_server(8080);
    let hbone = b.pod.addr4(15008);
    let ca = ambit_identity::FakeCa::from_dir(&mesh.ca_dir()).expect("shared dev CA");
    let client = ambit_identity::Identity::new("cluster.local", "default", "client");
    let server = ambit_identity::Identity::new("cluster.local", "default", "server");
    let good = ca.issue(&client, Duration::from_secs(3600)).expect("issue");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");

    // A well-formed CONNECT from a hand-built client works (the checks below are not vacuous).
    let status =
        rt.block_on(raw::connect(&outside, hbone, &good, &server, "CONNECT", &b.pod.addr4(8080).to_string()));
    assert_eq!(status.expect("valid CONNECT"), 200);
    // Not CONNECT: 400.
    let status =
        rt.block_on(raw::connect(&outside, hbone, &good, &server, "GET", &b.pod.addr4(8080).to_string()));
    assert_eq!(status.expect("GET answered"), 400);
    // CONNECT to an address the pod does not own: 400.
    let status =
        rt.block_on(raw::connect(&outside, hbone, &good, &server, "CONNECT", &a.pod.addr4(8080).to_string()));
    assert_eq!(status.expect("foreign authority answered"), 400);
    // A client certificate from another trust domain (same root): the handshake is refused.
    let foreign = ca
        .issue(&ambit_identity::Identity::new("evil.example", "default", "client"), Duration::from_secs(3600))
        .expect("issue");
    let r = rt.block_on(raw::connect(
        &outside,
        hbone,
        &foreign,
        &server,
        "CONNECT",
        &b.pod.addr4(8080).to_string(),
    ));
    // Refused by the proxy in TLS (a dead proxy or a closed port fails at "tcp:" instead).
    let refused = r.as_ref().err().is_some_and(|e| !e.starts_with("tcp:"));
    assert!(refused, "a foreign trust domain was not refused by the proxy's TLS: {r:?}");
    // Garbage instead of a TLS ClientHello: the proxy closes the connection at once, with no
    // HTTP answer (a silent or dead peer fails: the close must come within the bound).
    let mut g = outside.connect_tcp(hbone).expect("tcp to 15008");
    g.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01garbage").expect("write garbage");
    let closed = expect_close(&mut g, Duration::from_secs(2));
    let (buf, _) = closed.unwrap_or_else(|e| panic!("garbage on 15008: {e}"));
    assert!(!contains(&buf, b"HTTP/1.1"), "garbage got an HTTP answer: {:?}", String::from_utf8_lossy(&buf));
    // A malformed config on reload: rejected with an error, previous state kept.
    mesh.write_raw("workloads: [ {uid: broken, workloadIps: [\"not-an-ip\"\n");
    assert!(
        wait_for(|| pb.logs().contains("rejected"), Duration::from_secs(5)),
        "no error logged for the broken config:\n{}",
        pb.logs()
    );
    assert_echo(&a.pod, b.pod.addr4(8080), "after all of the above, A still reaches B");
    mesh.write_config(&[&a, &b], &[], &[]);
    assert_echo(&a.pod, b.pod.addr4(8080), "after the config is repaired");
}

/// The deny check proves a denial, not merely a closed connection. Against broken setups in
/// which the former check ("connect failed, or no bytes came back within 10 s") passed, it
/// fails, each time for its own reason: no app behind the port (closed after a failed dial),
/// the policy removed, the source's proxy killed (connect refused), the destination's proxy
/// killed. The close check likewise fails on a peer that stays silent.
#[test]
fn deny_evidence_rejects_broken_setups() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server").with_policies(&["default/deny-9090"]);
    let outside = mesh.outside_pod("e");
    mesh.write_config(&[&a, &b], &[DENY_9090], &[]);
    let mut pa = mesh.start_proxy(&a);
    let mut pb = mesh.start_proxy(&b);
    let _e9090 = b.pod.echo_server(9090);
    // The real denial passes the check.
    assert_denied(&a.pod, b.pod.addr4(9090), ProxyOf::Pod(&b), "deny-9090");

    // No app on 7070: B's proxy closes the stream after a failed dial, with no DENY.
    let no_app = b.pod.addr4(7070);
    assert!(former_blocked_check(&a.pod, no_app), "setup: 7070 should look blocked to the former check");
    let e = check_fails(|| assert_denied(&a.pod, no_app, ProxyOf::Pod(&b), "no app"));
    assert!(e.contains("DENY failures") && e.contains("(expected 1)"), "{e}");

    // A silent app behind the proxy: the close check does not take silence for a close.
    let _silent = b.pod.listen_tcp(b.pod.addr4(7171));
    let mut s = outside.connect_tcp(b.pod.addr4(7171)).expect("connect to the silent app");
    let r = expect_close(&mut s, Duration::from_secs(1));
    assert!(r.as_ref().is_err_and(|e| e.starts_with("not closed within 1s")), "{r:?}");

    // The policy removed: 9090 echoes, and the check says so.
    mesh.write_config(&[&a, &b.clone().with_policies(&[])], &[], &[]);
    let reloaded = wait_for(
        || {
            a.pod
                .connect_tcp(b.pod.addr4(9090))
                .and_then(|mut s| echo_roundtrip(&mut s, MARKER))
                .is_ok_and(|r| r == MARKER)
        },
        Duration::from_secs(5),
    );
    assert!(reloaded, "9090 still denied after the policy was removed");
    let e = check_fails(|| assert_denied(&a.pod, b.pod.addr4(9090), ProxyOf::Pod(&b), "no policy"));
    assert!(
        e.contains("not closed within 2s") && e.contains(&format!("{} bytes arrived", MARKER.len())),
        "{e}"
    );
    mesh.write_config(&[&a, &b], &[DENY_9090], &[]);
    assert!(
        wait_for(|| former_blocked_check(&a.pod, b.pod.addr4(9090)), Duration::from_secs(5)),
        "the policy did not come back"
    );

    // The source's proxy killed: the capture sends the connect to a closed port.
    pa.kill();
    assert!(former_blocked_check(&a.pod, b.pod.addr4(9090)), "the former check passed on a refused connect");
    let e = check_fails(|| assert_denied(&a.pod, b.pod.addr4(9090), ProxyOf::Pod(&b), "dead source proxy"));
    assert!(e.contains("connect to") && e.contains("is the proxy running?"), "{e}");

    // The destination's proxy killed: nothing can count a denial.
    pb.kill();
    let e = check_fails(|| {
        assert_denied(&outside, b.pod.addr4(9090), ProxyOf::Pod(&b), "dead destination proxy")
    });
    assert!(e.contains("GET from the proxy"), "{e}");
    assert!(former_blocked_check(&outside, b.pod.addr4(9090)), "the former check passed on a dead proxy");
}

/// The deny check these tests used before: a connect error, an error while reading (a 10 s
/// timeout included) or an empty reply all counted as "blocked". Kept only to show, above,
/// that it passes on broken setups.
fn former_blocked_check(from: &Pod, dst: SocketAddr) -> bool {
    let Ok(mut s) = from.connect_tcp(dst) else {
        return true;
    };
    match echo_roundtrip(&mut s, MARKER) {
        Ok(reply) => reply.is_empty(),
        Err(_) => true,
    }
}

/// Runs a check that must fail; returns its panic message.
fn check_fails(check: impl FnOnce()) -> String {
    let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) else {
        panic!("the check passed against a broken setup");
    };
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// The admin and metrics endpoints the README documents: `/stats/prometheus` serves the same
/// families and samples as `/metrics`, unknown paths are 404; `/quitquitquit` refuses GET (405)
/// and on POST (200) drains and exits the proxy cleanly.
#[test]
fn admin_quitquitquit_and_stats_prometheus() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    mesh.write_config(&[&a, &b], &[], &[]);
    let _pb = mesh.start_proxy(&b);
    let mut pa = mesh.start_proxy(&a);
    let _echo = b.pod.echo_server(8080);
    assert_echo(&a.pod, b.pod.addr4(8080), "a -> b");

    let metrics = http_body(&a, 15020, "/metrics");
    let stats = http_body(&a, 15020, "/stats/prometheus");
    let families = |body: &str| -> std::collections::BTreeSet<String> {
        body.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(str::to_owned).collect()
    };
    assert!(
        families(&stats).contains("istio_tcp_connections_opened counter"),
        "/stats/prometheus lacks the connection counters:\n{stats}"
    );
    assert_eq!(families(&stats), families(&metrics), "/stats/prometheus and /metrics differ");
    assert_eq!(counter(&stats, "istio_tcp_connections_opened_total", "source"), 1, "{stats}");
    let not_found = a.pod.http_get(a.pod.addr4(15020), "/stats/nothing").expect("GET /stats/nothing");
    assert_eq!(not_found, (404, "not found\n".to_owned()));

    let admin = SocketAddr::from(([127, 0, 0, 1], 15000));
    let get = a.pod.http_get(admin, "/quitquitquit").expect("GET /quitquitquit");
    assert_eq!(get, (405, "use POST\n".to_owned()));
    assert!(pa.try_wait().is_none(), "a GET of /quitquitquit stopped the proxy");
    let stream = a.pod.connect_tcp(admin).expect("connect to the admin port");
    let post = http_request_on(stream, admin, "POST", "/quitquitquit").expect("POST /quitquitquit");
    assert_eq!(post, (200, "shutdown now\n".to_owned()));
    let status = pa.wait_timeout(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "proxy did not exit cleanly after /quitquitquit: {status:?}"
    );
    let logs = pa.logs();
    assert!(
        logs.contains("/quitquitquit received") && logs.contains("drained, exiting"),
        "no drain after /quitquitquit:\n{logs}"
    );
}

/// CONNECT authorities an attacker with a valid certificate could send: a port with leading
/// zeros is refused (400, as any non-canonical authority), and a 60 KB authority is refused with
/// an access-log line of bounded length, not one the size of the authority.
#[test]
fn hostile_connect_authorities_are_refused() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    let outside = mesh.outside_pod("e");
    mesh.write_config(&[&a, &b], &[], &[]);
    let _pa = mesh.start_proxy(&a);
    let pb = mesh.start_proxy(&b);
    let _echo = b.pod.echo_server(8080);
    let hbone = b.pod.addr4(15008);
    let ca = ambit_identity::FakeCa::from_dir(&mesh.ca_dir()).expect("shared dev CA");
    let client = ambit_identity::Identity::new("cluster.local", "default", "client");
    let server = ambit_identity::Identity::new("cluster.local", "default", "server");
    let good = ca.issue(&client, Duration::from_secs(3600)).expect("issue");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let connect =
        |authority: &str| rt.block_on(raw::connect(&outside, hbone, &good, &server, "CONNECT", authority));

    assert_eq!(connect(&b.pod.addr4(8080).to_string()), Ok(200), "the canonical authority");
    let zeros = format!("{}:008080", b.pod.ip4);
    assert_eq!(connect(&zeros), Ok(400), "{zeros}");
    assert_eq!(connect(&format!("[{}]:08080", b.pod.ip6)), Ok(400), "IPv6 with a leading zero");

    let huge = format!("{}:80", "a".repeat(60_000));
    assert_eq!(connect(&huge), Ok(400), "a 60 KB authority");
    assert!(
        wait_for(|| pb.logs().contains("no valid authority pseudo header: aaaa"), Duration::from_secs(5)),
        "the refusal is not logged:\n{}",
        pb.logs()
    );
    let logs = pb.logs();
    let longest = logs.lines().map(str::len).max().unwrap_or_default();
    let line =
        logs.lines().find(|l| l.contains("no valid authority pseudo header: aaaa")).unwrap_or_default();
    assert!(
        line.contains("bytes, cut to 1024)"),
        "the log line does not say it was cut: {}",
        &line[..line.len().min(300)]
    );
    assert!(longest < 4096, "a {longest}-byte log line");
    assert_echo(&a.pod, b.pod.addr4(8080), "A still reaches B");
}

/// Reloads of the local config that would silently drop workloads are rejected, each with its
/// reason and file position in the log, and the previous state stays (config dump and traffic):
/// a file truncated to nothing (as an editor does before writing), a duplicate uid, a duplicate
/// IP. `{}` is the explicit empty config and is applied. A large file is parsed off the control
/// runtime: readiness and admin keep answering promptly while it parses.
#[test]
fn local_config_reloads_refuse_empty_and_duplicates() {
    if !require_root() {
        return;
    }
    let mesh = Mesh::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    mesh.write_config(&[&a, &b], &[], &[]);
    let good = std::fs::read_to_string(mesh.config_path()).expect("read the config");
    let _pa = mesh.start_proxy(&a);
    let pb = mesh.start_proxy(&b);
    let _echo = b.pod.echo_server(8080);
    assert_echo(&a.pod, b.pod.addr4(8080), "before any reload");
    let admin = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), 15000);
    let dumped_uids = || -> Vec<String> {
        let (status, body) = b.pod.http_get(admin, "/config_dump").expect("config dump");
        assert_eq!(status, 200, "{body}");
        let dump: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let workloads = dump["workloads"].as_array().cloned().unwrap_or_default();
        workloads.iter().filter_map(|w| w["uid"].as_str().map(str::to_owned)).collect()
    };
    let uids = dumped_uids();
    assert_eq!(uids.len(), 2, "{uids:?}");

    // The good file's workload items ("- uid: ..." blocks) and where they start.
    let starts: Vec<usize> = good.match_indices("\n- uid: ").map(|(i, _)| i + 1).collect();
    let end = good.find("\npolicies:").expect("policies key") + 1;
    let block_a = &good[starts[0]..starts[1]];
    let line_of = |text: &str, offset: usize| text[..offset].matches('\n').count() + 1;
    let dup_uid = format!("{}{block_a}{}", &good[..end], &good[end..]);
    let copy = block_a.replacen(
        "- uid: cluster1//v1/Pod/default/a\n",
        "- uid: cluster1//v1/Pod/default/a-copy\n",
        1,
    );
    let dup_ip = format!("{}{copy}{}", &good[..end], &good[end..]);
    let third = line_of(&dup_uid, end);
    let first_a = line_of(&good, starts[0]);
    let cases = [
        (
            "a file truncated in place",
            String::new(),
            "the local config is empty (only whitespace or comments), which would remove every workload, \
             service and policy; refusing it (an editor may have truncated it before writing). Write `{}` \
             for a config that is meant to be empty"
                .to_owned(),
        ),
        (
            "a duplicate uid",
            dup_uid,
            format!(
                "workload at line {third}, column 3 has uid \"cluster1//v1/Pod/default/a\", which the workload \
                 at line {first_a}, column 3 already has; every workload needs its own uid"
            ),
        ),
        (
            "a duplicate IP",
            dup_ip,
            format!(
                "workload \"cluster1//v1/Pod/default/a-copy\" at line {third}, column 3 has address {} on \
                 network \"\", which workload \"cluster1//v1/Pod/default/a\" at line {first_a}, column 3 \
                 already has; two workloads cannot share an address on one network (only host-network \
                 workloads may)",
                a.pod.ip4
            ),
        ),
    ];
    for (what, text, reason) in cases {
        let rejected = pb.logs().matches("rejected local config change").count();
        // In place, as an editor that truncates and then writes does (no rename).
        std::fs::write(mesh.config_path(), &text).expect("write the config");
        assert!(
            wait_for(
                || pb.logs().matches("rejected local config change").count() > rejected,
                Duration::from_secs(5)
            ),
            "{what}: no rejection logged:\n{}",
            pb.logs()
        );
        let logs = pb.logs();
        let line = logs.lines().rfind(|l| l.contains("rejected local config change")).unwrap_or_default();
        assert!(line.contains(&reason), "{what}: the rejection does not say {reason:?}:\n{line}");
        assert_eq!(dumped_uids(), uids, "{what}: the previous workloads are gone from /config_dump");
        assert_echo(&a.pod, b.pod.addr4(8080), &format!("after {what}"));
    }

    // `{}` is explicit: applied, every workload goes.
    let reloaded = pb.logs().matches("local config reloaded").count();
    mesh.write_raw("{}\n");
    assert!(
        wait_for(|| pb.logs().matches("local config reloaded").count() > reloaded, Duration::from_secs(5)),
        "`{{}}` not applied:\n{}",
        pb.logs()
    );
    assert_eq!(dumped_uids(), Vec::<String>::new());

    // A large file (the two pods and 100 000 more workloads): readiness and admin answer promptly
    // while it parses. The fillers are on a network of their own: their 10.200-10.201 addresses
    // would otherwise collide with the pods' whenever the cluster's subnet falls in that range
    // (CI at a5d7126: a pod at 10.200.66.2 and filler-16898 refused as a duplicate address).
    let mut big = good.replacen("workloads:\n", "", 1);
    big.insert_str(0, "workloads:\n");
    let filler: String = (0..100_000)
        .map(|i| {
            format!(
                "- {{uid: filler-{i}, namespace: other, network: filler, workloadIps: [10.{}.{}.{}]}}\n",
                200 + i / 65_536,
                i / 256 % 256,
                i % 256
            )
        })
        .collect();
    big.insert_str("workloads:\n".len(), &filler);
    let reloaded = pb.logs().matches("local config reloaded").count();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = {
        let (pod, stop) = (b.pod.clone(), stop.clone());
        let ready = b.pod.addr4(15021);
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            let mut probes = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (addr, path) in [(ready, "/healthz/ready"), (admin, "/")] {
                    let t0 = Instant::now();
                    let r = pod.http_get(addr, path);
                    worst = worst.max(t0.elapsed());
                    probes += 1;
                    assert!(r.is_ok_and(|(s, _)| s == 200), "{path} failed during the reload");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (worst, probes)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    mesh.write_raw(&big);
    let applied =
        wait_for(|| pb.logs().matches("local config reloaded").count() > reloaded, Duration::from_secs(60));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (worst, probes) = prober.join().expect("prober");
    assert!(applied, "the large file was not applied:\n{}", pb.logs());
    let logs = pb.logs();
    let line = logs.lines().rfind(|l| l.contains("local config reloaded")).unwrap_or_default().to_owned();
    assert!(line.contains("workloads=100002"), "{line}");
    let took = line
        .split("took=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .map(str::to_owned)
        .unwrap_or_default();
    println!("large reload: {line}; {probes} probes, the slowest {worst:?}");
    let took_ms = parse_duration_ms(&took);
    assert!(took_ms >= 1000.0, "the large file parsed in {took}: too small to show anything");
    assert!(worst < Duration::from_millis(500), "readiness/admin took {worst:?} while a {took} parse ran");
    assert_echo(&a.pod, b.pod.addr4(8080), "after the large reload");
}

/// Milliseconds of a `Debug`-printed `Duration` (`1.234s`, `567.8ms`, `12µs`).
fn parse_duration_ms(text: &str) -> f64 {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().unwrap_or_default();
    match unit {
        "s" => n * 1000.0,
        "ms" => n,
        "µs" | "us" => n / 1000.0,
        "ns" => n / 1_000_000.0,
        _ => 0.0,
    }
}

/// A hand-built HBONE client, to send what a well-behaved proxy never would.
mod raw {
    use super::*;
    use ambit_identity::{Identity, WorkloadCertificate};

    /// TLS + HTTP/2 to `hbone` from inside `from`, one request; returns the response status.
    pub async fn connect(
        from: &Pod,
        hbone: SocketAddr,
        cert: &WorkloadCertificate,
        server: &Identity,
        method: &str,
        authority: &str,
    ) -> Result<u16, String> {
        let std = from.connect_tcp(hbone).map_err(|e| format!("tcp: {e}"))?;
        std.set_nonblocking(true).map_err(|e| e.to_string())?;
        let tcp = tokio::net::TcpStream::from_std(std).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(cert.client_config(std::slice::from_ref(server)))
            .connect(rustls_pki_types::ServerName::IpAddress(hbone.ip().into()), tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let (mut send, conn) = h2::client::handshake(tls).await.map_err(|e| format!("h2: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::builder()
            .method(method)
            .uri(if method == "CONNECT" { authority.to_owned() } else { format!("https://{authority}/") })
            .body(())
            .map_err(|e| e.to_string())?;
        let (resp, _body) = send.send_request(req, false).map_err(|e| format!("send: {e}"))?;
        let resp = tokio::time::timeout(Duration::from_secs(10), resp)
            .await
            .map_err(|_| "no response".to_owned())?
            .map_err(|e| format!("response: {e}"))?;
        Ok(resp.status().as_u16())
    }
}
