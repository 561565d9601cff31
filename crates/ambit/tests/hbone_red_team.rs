//! The security review's attacks on HBONE's record layer and HTTP/2 engine (issue 24), replayed
//! against a real `ambit proxy` (dedicated mode, in its pod's network namespace) by a pod
//! outside the mesh that holds a valid mesh certificate, through real sockets. Each attack is
//! bounded and asserts its figure: KeyUpdate answers owed, the count at which GOAWAY comes,
//! memory per connection, floods cut with their code, CPU per trickled record. Needs root;
//! under `CI=true` a missing privilege fails the test instead of skipping it.

mod common;
mod mesh;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ambit_hbone::testing::wire::{self, Alert, Reason, content};
use ambit_hbone::testing::{RawPeer, Seen};
use ambit_identity::{FakeCa, Identity, WorkloadCertificate};
use common::*;
use mesh::*;

/// What the mesh helpers echo (unused here).
const MARKER: &[u8] = b"AMBIT-RED-TEAM-MARKER-5e21";
const T: Duration = Duration::from_secs(20);
/// How soon the proxy must end a connection once the attack crossed its limit.
const PROMPT: Duration = Duration::from_secs(5);

/// A pod with its proxy, and an attacker outside the mesh with a mesh certificate.
struct Target {
    mesh: Mesh,
    b: MeshPod,
    x: Pod,
    proxy: ChildGuard,
    cert: WorkloadCertificate,
    rt: tokio::runtime::Runtime,
}

impl Target {
    fn new() -> Target {
        let mesh = Mesh::new();
        let b = mesh.pod("b", "server");
        let x = mesh.outside_pod("x");
        mesh.write_config(&[&b], &[], &[]);
        let proxy = mesh.start_proxy(&b);
        let ca = FakeCa::from_dir(&mesh.ca_dir()).expect("the mesh's dev CA");
        let cert = ca
            .issue(&Identity::new("cluster.local", "default", "attacker"), Duration::from_secs(3600))
            .expect("issue");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Target { mesh, b, x, proxy, cert, rt }
    }

    fn hbone(&self) -> SocketAddr {
        self.b.pod.addr4(15008)
    }

    /// A TLS connection from the attacker's pod to the proxy's 15008, past the proxy's SETTINGS.
    fn peer(&self) -> RawPeer {
        let dst = self.hbone();
        let tcp =
            self.x.run(|| std::net::TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT)).expect("connect");
        tcp.set_nonblocking(true).expect("nonblocking");
        self.rt.block_on(async {
            let tcp = tokio::net::TcpStream::from_std(tcp).expect("tokio socket");
            tcp.set_nodelay(true).expect("nodelay");
            let server = Identity::new("cluster.local", "default", "server");
            let mut p = RawPeer::over(tcp, &self.cert, &server).await.expect("TLS with the proxy");
            // What follows is read by the record layer, not inside the handshake.
            assert!(p.settled(T).await, "no SETTINGS from the proxy: {:?}", p.seen);
            p
        })
    }

    fn send(&self, p: &mut RawPeer, bytes: &[u8]) {
        self.rt.block_on(p.send(bytes)).expect("send");
    }

    /// Reads until `done` holds or the connection ends; returns whether `done` held and when.
    fn read_until(&self, p: &mut RawPeer, limit: Duration, done: impl Fn(&Seen) -> bool) -> (bool, Duration) {
        let t0 = Instant::now();
        let held = self.rt.block_on(p.read_until(limit, done));
        (held, t0.elapsed())
    }

    /// The proxy still serves: a fresh connection's PING is answered.
    fn assert_serves(&self, what: &str) {
        let mut p = self.peer();
        let mut plain = wire::client_preface();
        wire::ping(&mut plain, *b"alive?!!", false);
        let v = p.data(&plain);
        self.send(&mut p, &v);
        let (ok, _) = self.read_until(&mut p, T, |s| s.pong(b"alive?!!"));
        assert!(ok, "{what}: the proxy no longer answers a fresh connection: {:?}", p.seen);
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.proxy.pid())
    }
}

fn connect(id: u32) -> Vec<u8> {
    wire::frame(wire::kind::HEADERS, wire::flag::END_HEADERS, id, &wire::connect_block("10.0.0.1:8080"))
}

/// Point 1: 100 000 KeyUpdate(update_requested) in one burst. At most one answer is owed and
/// sent; the connection ends with unexpected_message at the 33rd (rustls's limit), promptly;
/// the proxy holds no more memory for it and keeps serving.
#[test]
fn a_key_update_flood_owes_one_answer_and_is_cut() {
    if !require_root() {
        return;
    }
    let t = Target::new();
    t.assert_serves("before");
    let before = t.rss_kib();
    let mut p = t.peer();
    let mut v = p.data(&wire::client_preface());
    for _ in 0..100_000 {
        v.extend(p.request_key_update());
    }
    let t0 = Instant::now();
    t.rt.block_on(p.send_reading(&v, T, |s| s.closed));
    let took = t0.elapsed();
    eprintln!(
        "KeyUpdate flood: {} answers, alert {:?}, closed after {took:?}, proxy RSS {before} -> {} KiB",
        p.seen.key_updates,
        p.seen.alert,
        t.rss_kib()
    );
    assert!(p.seen.key_updates <= 1, "answers owed and sent: {}", p.seen.key_updates);
    assert_eq!(p.seen.alert, Some(Alert::UNEXPECTED_MESSAGE), "{:?}", p.seen);
    assert!(took < PROMPT, "closed after {took:?}");
    let grew = t.rss_kib().saturating_sub(before);
    assert!(grew < 1024, "the proxy grew by {grew} KiB for one connection");
    t.assert_serves("after the flood");
}

/// Point 3 ("MadeYouReset"): streams opened and broken by the peer (a WINDOW_UPDATE of 0) are
/// reset by the proxy; the 1 025th ends the connection with GOAWAY(ENHANCE_YOUR_CALM).
#[test]
fn resets_the_peer_causes_end_the_connection_at_the_documented_count() {
    if !require_root() {
        return;
    }
    let t = Target::new();
    let mut p = t.peer();
    let v = p.data(&wire::client_preface());
    t.send(&mut p, &v);
    // In batches of 50, each once the last was reset: the proxy takes 200 streams at a time
    // (SETTINGS_MAX_CONCURRENT_STREAMS), and a stream it reset leaves once its handler saw it.
    // A busy proxy refuses what its handlers have not let go yet (not a fault): keep going
    // until the GOAWAY, up to 20 000 streams.
    let mut sent = 0u32;
    let (mut got, mut took) = (false, Duration::ZERO);
    let t0 = Instant::now();
    while !got && sent < 20_000 && t0.elapsed() < Duration::from_secs(60) {
        let mut plain = Vec::new();
        for i in sent..sent + 50 {
            plain.extend(connect(2 * i + 1));
            wire::window_update(&mut plain, 2 * i + 1, 0);
        }
        sent += 50;
        let v = p.data(&plain);
        let n = sent as usize;
        let batch_start = Instant::now();
        got = t.rt.block_on(p.send_reading(&v, T, |s| s.goaway().is_some() || s.resets().len() >= n));
        got = got && p.seen.goaway().is_some();
        took = batch_start.elapsed();
    }
    let resets = p.seen.resets();
    let faults = resets.iter().filter(|(_, r)| *r == Reason::PROTOCOL_ERROR).count();
    eprintln!(
        "MadeYouReset: {faults} streams reset for their faults ({} resets in all), then GOAWAY {:?} after {took:?}",
        resets.len(),
        p.seen.goaway()
    );
    assert!(got, "no GOAWAY: {:?}", p.seen.goaway());
    assert_eq!(faults, 1_024, "streams reset for a fault before the GOAWAY");
    // A busy proxy may still hold a batch's reset streams when the next arrives: those over its
    // stream limit are refused, which is not a fault.
    assert!(
        resets.iter().all(|(_, r)| *r == Reason::PROTOCOL_ERROR || *r == Reason::REFUSED_STREAM),
        "{resets:?}"
    );
    assert_eq!(p.seen.goaway().map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM));
    assert!(took < PROMPT, "GOAWAY after {took:?}");
    t.assert_serves("after the resets");
}

/// What an attacking connection does before it sits idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pin {
    /// The HTTP/2 handshake and a PING, nothing else: the plain figure.
    Plain,
    /// One HEADERS frame of 100 KiB (over the header list limit: that stream is refused).
    LargeHeaders,
    /// The first bytes of a 64 KiB post-handshake message, then application data.
    PendingFragment,
}

/// Opens 200 connections of `kind` (each does its part and gets its answer), holds them, and
/// returns the proxy's RSS growth per connection in KiB, and how many the proxy closed.
fn pinned_per_connection(kind: Pin) -> (f64, usize) {
    const N: usize = 200;
    let t = Target::new();
    // Warm up the allocator and the proxy's per-thread buffers.
    t.assert_serves("warm-up");
    std::thread::sleep(Duration::from_millis(500));
    let before = t.rss_kib();
    let mut held = Vec::with_capacity(N);
    let mut closed = 0;
    for i in 0..N {
        let mut p = t.peer();
        let mut plain = wire::client_preface();
        wire::ping(&mut plain, *b"pinned!!", false);
        let mut v = p.data(&plain);
        match kind {
            Pin::Plain => {}
            Pin::LargeHeaders => {
                let value = "v".repeat(100 * 1024);
                let block = wire::literal_block(&[(":method", "CONNECT"), (":authority", "10.0.0.1:8080")]);
                let mut block = block;
                block.push(0);
                block.push(1);
                block.push(b'x');
                // A value over 127 bytes: its length as a 7-bit-prefix integer.
                let mut len = value.len() - 127;
                block.push(127);
                while len >= 128 {
                    block.push((len % 128) as u8 | 0x80);
                    len /= 128;
                }
                block.push(len as u8);
                block.extend_from_slice(value.as_bytes());
                let headers = wire::frame(wire::kind::HEADERS, wire::flag::END_HEADERS, 1, &block);
                v.extend(p.data(&headers));
            }
            Pin::PendingFragment => {
                v.extend(p.record(content::HANDSHAKE, &[4, 0, 0xff, 0xf0]));
                v.extend(p.record(content::HANDSHAKE, &vec![0u8; 16_000]));
                v.extend(p.data(&plain));
            }
        }
        t.send(&mut p, &v);
        let want_reset = kind == Pin::LargeHeaders;
        let (_, _) =
            t.read_until(&mut p, T, |s| s.pong(b"pinned!!") && (!want_reset || !s.resets().is_empty()));
        if p.seen.closed || p.seen.alert.is_some() {
            closed += 1;
        } else {
            assert!(p.seen.pong(b"pinned!!"), "{kind:?} connection {i}: {:?}", p.seen);
            if want_reset {
                assert_eq!(p.seen.resets(), vec![(1, Reason::PROTOCOL_ERROR)], "{kind:?} connection {i}");
            }
        }
        held.push(p);
    }
    std::thread::sleep(Duration::from_secs(1));
    let per = (t.rss_kib().saturating_sub(before)) as f64 / N as f64;
    eprintln!("{kind:?}: {per:.1} KiB per connection ({closed} of {N} closed by the proxy)");
    drop(held);
    (per, closed)
}

/// Point 4: what one connection can make the proxy hold. 200 connections of a peer (the cap is
/// 256) that each sent one large HEADERS frame hold at most ~2x the plain figure each; a
/// handshake fragment left pending while application data flows ends its connection.
#[test]
fn a_connection_pins_at_most_twice_the_plain_figure() {
    if !require_root() {
        return;
    }
    let (plain, closed) = pinned_per_connection(Pin::Plain);
    assert_eq!(closed, 0, "plain connections closed");
    let (large, closed) = pinned_per_connection(Pin::LargeHeaders);
    assert_eq!(closed, 0, "connections with a refused HEADERS frame closed");
    assert!(
        large <= 2.0 * plain.max(4.0),
        "after one large HEADERS frame a connection holds {large:.1} KiB, the plain figure is {plain:.1} KiB"
    );
    let (_, closed) = pinned_per_connection(Pin::PendingFragment);
    assert_eq!(closed, 200, "connections with a pending handshake fragment still open");
}

/// Point 7: chatter is counted. PRIORITY frames beyond the limit end the connection with
/// GOAWAY(ENHANCE_YOUR_CALM); empty records and user_canceled alerts beyond rustls's limits
/// end it with unexpected_message; each promptly, and the proxy keeps serving.
#[test]
fn chatter_floods_are_cut_with_their_code() {
    if !require_root() {
        return;
    }
    let t = Target::new();
    let mut p = t.peer();
    let mut plain = wire::client_preface();
    for _ in 0..10_100 {
        plain.extend(wire::frame(wire::kind::PRIORITY, 0, 3, &[0, 0, 0, 1, 1]));
    }
    let v = p.data(&plain);
    t.send(&mut p, &v);
    let (got, took) = t.read_until(&mut p, T, |s| s.goaway().is_some());
    assert!(got, "no GOAWAY for a PRIORITY flood: {:?}", p.seen);
    assert_eq!(p.seen.goaway().map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM));
    assert!(took < PROMPT, "GOAWAY after {took:?}");

    type Record = fn(&mut RawPeer) -> Vec<u8>;
    let records: [(&str, Record, usize); 2] = [
        ("empty records", |p| p.record(content::APPLICATION_DATA, &[]), 1_000),
        ("user_canceled alerts", |p| p.record(content::ALERT, &[1, 90]), 1_000),
    ];
    for (name, record, n) in records {
        let mut p = t.peer();
        let mut v = p.data(&wire::client_preface());
        for _ in 0..n {
            v.extend(record(&mut p));
        }
        t.send(&mut p, &v);
        let (_, took) = t.read_until(&mut p, T, |s| s.closed);
        assert_eq!(p.seen.alert, Some(Alert::UNEXPECTED_MESSAGE), "{name}: {:?}", p.seen);
        assert!(took < PROMPT, "{name}: closed after {took:?}");
    }
    t.assert_serves("after the floods");
}

/// Point 8: a record trickled one byte per write costs the proxy CPU in proportion to its
/// bytes, not to their square: 50 full records sent a byte at a time against the same in 1 KiB
/// writes.
#[test]
fn trickled_records_cost_linear_cpu() {
    if !require_root() {
        return;
    }
    const RECORDS: usize = 50;
    let t = Target::new();
    let _app = t.b.pod.echo_server(8080);
    let pid = t.proxy.pid();
    let mut cost = Vec::new();
    for piece in [1usize, 1024] {
        let mut p = t.peer();
        // A CONNECT first: the connection is past its first-stream deadline.
        let mut plain = wire::client_preface();
        plain.extend(wire::frame(
            wire::kind::HEADERS,
            wire::flag::END_HEADERS,
            1,
            &wire::connect_block(&t.b.pod.addr4(8080).to_string()),
        ));
        wire::ping(&mut plain, *b"started!", false);
        let v = p.data(&plain);
        t.send(&mut p, &v);
        assert!(t.read_until(&mut p, T, |s| s.pong(b"started!")).0, "{:?}", p.seen);
        // Full records, each one frame of an unknown type (skipped), then a PING.
        let filler = wire::frame(0xee, 0, 0, &vec![0u8; wire::MAX_CONTENT - wire::HEADER_LEN]);
        let mut v: Vec<u8> = (0..RECORDS).flat_map(|_| p.data(&filler)).collect();
        let mut ping = Vec::new();
        wire::ping(&mut ping, *b"trickled", false);
        v.extend(p.data(&ping));
        let cpu0 = cpu_seconds(&[pid]);
        let t0 = Instant::now();
        t.rt.block_on(async {
            for chunk in v.chunks(piece) {
                p.send(chunk).await.expect("send a piece");
            }
        });
        let sent_in = t0.elapsed();
        let (ok, _) = t.read_until(&mut p, T, |s| s.pong(b"trickled"));
        assert!(ok, "the PING behind the trickled records was not answered: {:?}", p.seen);
        let per_record_ms = (cpu_seconds(&[pid]) - cpu0) * 1000.0 / RECORDS as f64;
        eprintln!("{piece}-byte writes: {per_record_ms:.2} ms of proxy CPU per record (sent in {sent_in:?})");
        cost.push(per_record_ms);
    }
    let _ = &t.mesh;
    // Before the fix a record cost 27 ms here (quadratic copying); after it, 1.5-8.8 ms on this
    // 2-core machine (the figure moves with scheduling: it counts 16 384 wakeups' worth of
    // 10 ms CPU ticks), so the bound is half the quadratic figure, not the best run.
    assert!(cost[0] < 13.0, "a record trickled a byte at a time costs {:.2} ms of proxy CPU", cost[0]);
}
