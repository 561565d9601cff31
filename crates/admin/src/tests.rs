//! `/`, `/logging` and `/debug/pprof/profile`, over real HTTP/1.1.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, reload};

use super::*;
use crate::logging::{HELP, LogControl};
use tokio::net::TcpListener;

const INDEX: &str = "test admin\n  /logging\n  /debug/pprof/profile\n";

/// Starts [`tools`] on 127.0.0.1 (with `logs`, if any) and returns its address.
async fn start(logs: Option<Arc<LogControl>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, move |req: Request<Incoming>| {
        let logs = logs.clone();
        async move { tools_with(INDEX, req.method(), req.uri(), logs.as_deref()).await }
    }));
    addr
}

/// One request on a fresh connection: (status, body).
async fn call(addr: SocketAddr, method: &str, path: &str) -> (u16, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("{method} {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("status code");
    (status, raw[end + 4..].to_vec())
}

async fn call_text(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let (status, body) = call(addr, method, path).await;
    (status, String::from_utf8(body).unwrap())
}

/// Everything written through the test's subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Lines about the probe target (the server's own events are ignored).
    fn probes(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter(|l| l.contains("probe:"))
            .map(|l| l.rsplit("probe: ").next().unwrap().to_owned())
            .collect()
    }
}

fn probe(n: usize) {
    tracing::debug!(target: "probe", "debug {n}");
    tracing::info!(target: "probe", "info {n}");
    tracing::trace!(target: "probe", "trace {n}");
}

#[test]
fn logging_reads_changes_and_resets_the_level() {
    let out = Captured::default();
    let writer = out.clone();
    let (layer, handle) = reload::Layer::new(EnvFilter::new("info"));
    let subscriber = tracing_subscriber::registry()
        .with(layer)
        .with(tracing_subscriber::fmt::layer().with_writer(move || writer.clone()).with_ansi(false));
    let logs = Arc::new(LogControl::new(handle, "info".into()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let addr = start(Some(logs)).await;
            let help_405 = format!("Invalid HTTP method\n{HELP}");
            for method in ["GET", "PUT", "DELETE"] {
                assert_eq!(call_text(addr, method, "/logging").await, (405, help_405.clone()), "{method}");
            }
            assert_eq!(call_text(addr, "GET", "/logging?level=debug").await, (405, help_405.clone()));
            assert_eq!(
                call_text(addr, "POST", "/logging").await,
                (200, "current log level is info\n".into())
            );
            probe(1);

            // One module raised.
            assert_eq!(
                call_text(addr, "POST", "/logging?level=probe:debug").await,
                (200, "current log level is probe=debug,info\n".into())
            );
            probe(2);
            // Percent-encoded, as an HTTP client may send it; a later directive for the same
            // module replaces the earlier one.
            assert_eq!(
                call_text(addr, "POST", "/logging?level=probe%3Atrace").await,
                (200, "current log level is probe=trace,info\n".into())
            );
            probe(3);
            // Refused: the filter in effect stays.
            for bad in ["loud", "probe:loud", "probe:", "a%20b:info", "probe=debug"] {
                let decoded = bad.replace("%20", " ");
                assert_eq!(
                    call_text(addr, "POST", &format!("/logging?level={bad}")).await,
                    (400, format!("Invalid level provided: {decoded}\n{HELP}")),
                    "{bad}"
                );
            }
            assert_eq!(
                call_text(addr, "POST", "/logging").await,
                (200, "current log level is probe=trace,info\n".into())
            );
            // Global level.
            assert_eq!(
                call_text(addr, "POST", "/logging?level=warn").await,
                (200, "current log level is probe=trace,warn\n".into())
            );
            // Reset to the startup filter, and reset plus a change.
            assert_eq!(
                call_text(addr, "POST", "/logging?reset").await,
                (200, "current log level is info\n".into())
            );
            probe(4);
            assert_eq!(
                call_text(addr, "POST", "/logging?reset&level=probe:debug").await,
                (200, "current log level is probe=debug,info\n".into())
            );
            probe(5);
        })
    });
    assert_eq!(
        out.probes(),
        ["info 1", "debug 2", "info 2", "debug 3", "info 3", "trace 3", "info 4", "debug 5", "info 5"]
    );
}

#[tokio::test]
async fn logging_without_a_reloadable_filter_says_so() {
    let addr = start(None).await;
    assert_eq!(
        call_text(addr, "POST", "/logging?level=debug").await,
        (500, "the log filter cannot be changed: this process did not install a reloadable one\n".into())
    );
}

#[tokio::test]
async fn index_answers_the_list_and_unknown_paths_are_404() {
    let addr = start(None).await;
    let (status, body) = call_text(addr, "GET", "/").await;
    assert_eq!(status, 200);
    assert_eq!(body, INDEX);
    assert_eq!(call_text(addr, "GET", "/debug/pprof/heap").await, (404, "not found\n".into()));
}

/// The profile tests share the process-wide sampler: one at a time.
static PROFILE_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Burns CPU in a function the profile must show.
#[inline(never)]
fn spin_for_profile(until: Instant) -> u64 {
    let mut x = 0u64;
    while Instant::now() < until {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
    x
}

fn string(p: &ambit_api::pprof::Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_profile_parameters_concurrency_and_content() {
    let _one = PROFILE_TESTS.lock().await;
    let addr = start(None).await;
    let bad = |name: &str, value: &str, max: u32| {
        (400, format!("invalid {name} {value:?}: must be an integer from 1 to {max}\n"))
    };
    for (query, expected) in [
        ("seconds=0", bad("seconds", "0", 300)),
        ("seconds=301", bad("seconds", "301", 300)),
        ("seconds=abc", bad("seconds", "abc", 300)),
        ("seconds=-1", bad("seconds", "-1", 300)),
        ("seconds=", bad("seconds", "", 300)),
        ("frequency=0", bad("frequency", "0", 1000)),
        ("frequency=1001", bad("frequency", "1001", 1000)),
        ("seconds=1&frequency=1.5", bad("frequency", "1.5", 1000)),
    ] {
        assert_eq!(
            call_text(addr, "GET", &format!("/debug/pprof/profile?{query}")).await,
            expected,
            "{query}"
        );
    }
    assert_eq!(call_text(addr, "POST", "/debug/pprof/profile").await, (405, "use GET\n".into()));

    let spinner = std::thread::spawn(|| spin_for_profile(Instant::now() + Duration::from_millis(1500)));
    let first = tokio::spawn(call(addr, "GET", "/debug/pprof/profile?seconds=1&frequency=1000"));
    let waited = Instant::now();
    while !crate::profile::running() {
        assert!(waited.elapsed() < Duration::from_secs(5), "the profile never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        call_text(addr, "GET", "/debug/pprof/profile?seconds=1").await,
        (409, "a CPU profile is already being taken; retry when it has finished\n".into())
    );
    let (status, body) = first.await.unwrap();
    spinner.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let p = ambit_api::pprof::Profile::decode(body.as_slice()).expect("a pprof Profile message");
    assert_eq!(string(&p, 0), "");
    let types: Vec<(&str, &str)> =
        p.sample_type.iter().map(|t| (string(&p, t.r#type), string(&p, t.unit))).collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let period = p.period_type.as_ref().unwrap();
    assert_eq!((string(&p, period.r#type), string(&p, period.unit)), ("cpu", "nanoseconds"));
    assert_eq!(p.period, 1_000_000, "1000 Hz");
    assert!(p.duration_nanos >= 1_000_000_000, "{}", p.duration_nanos);
    assert!(!p.sample.is_empty());
    for s in &p.sample {
        assert_eq!(s.value.len(), 2);
        assert_eq!(s.value[1], s.value[0] * p.period);
        for id in &s.location_id {
            assert!(p.location.iter().any(|l| l.id == *id), "sample refers to unknown location {id}");
        }
        assert_eq!(string(&p, s.label[0].key), "thread");
    }
    for l in &p.location {
        for line in &l.line {
            assert!(p.function.iter().any(|f| f.id == line.function_id));
        }
    }
    let spin_samples: i64 = p
        .sample
        .iter()
        .filter(|s| {
            s.location_id.iter().any(|id| {
                let loc = p.location.iter().find(|l| l.id == *id).unwrap();
                loc.line.iter().any(|line| {
                    let f = p.function.iter().find(|f| f.id == line.function_id).unwrap();
                    string(&p, f.name).contains("spin_for_profile")
                })
            })
        })
        .map(|s| s.value[0])
        .sum();
    // One busy thread for 1 s at 1000 Hz is up to 1000 samples; a loaded machine gives it less CPU.
    assert!(spin_samples > 20, "{spin_samples} samples in spin_for_profile");

    // The slot is free again.
    assert!(!crate::profile::running());
    let (status, _) = call(addr, "GET", "/debug/pprof/profile?seconds=1&frequency=10").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_whose_client_goes_away_stops() {
    let _one = PROFILE_TESTS.lock().await;
    let addr = start(None).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /debug/pprof/profile?seconds=300 HTTP/1.1\r\nhost: admin\r\n\r\n").await.unwrap();
    let waited = Instant::now();
    while !crate::profile::running() {
        assert!(waited.elapsed() < Duration::from_secs(5), "the profile never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(s);
    let waited = Instant::now();
    while crate::profile::running() {
        assert!(waited.elapsed() < Duration::from_secs(3), "the sampler still runs after the client left");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Serves `ok` to every request within `limits` on 127.0.0.1; returns the address.
async fn start_within(limits: Limits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_within(listener, limits, |_req: Request<Incoming>| async {
        Response::new(Body::from("ok"))
    }));
    addr
}

/// A request that asks the server to close after its answer.
const GET_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n";

/// How [`start_within`]'s answers begin.
const OK: &[u8] = b"HTTP/1.1 200 OK\r\n";

fn assert_ok(answer: &[u8]) {
    assert!(answer.starts_with(OK), "{}", String::from_utf8_lossy(answer));
}

/// A connection from `ip` (a loopback address) to `addr`.
async fn connect_from(ip: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
    s.connect(addr).await.unwrap()
}

/// Reads until the peer closes; `Ok(bytes)` when it did within `limit`.
async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> Result<Vec<u8>, &'static str> {
    let mut raw = Vec::new();
    match tokio::time::timeout(limit, s.read_to_end(&mut raw)).await {
        Ok(Ok(_)) => Ok(raw),
        Ok(Err(_)) => Ok(raw),
        Err(_) => Err("still open"),
    }
}

#[tokio::test]
async fn one_peer_holds_at_most_its_share_of_connections_and_others_are_still_served() {
    let addr =
        start_within(Limits { connections: 8, per_peer: 3, header_read_timeout: Duration::from_secs(30) })
            .await;
    // Three idle connections from 127.0.0.1 are held; the fourth is closed at once, unread.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.1", addr).await);
    }
    let mut fourth = connect_from("127.0.0.1", addr).await;
    assert_eq!(closed_within(&mut fourth, Duration::from_secs(5)).await, Ok(Vec::new()));
    // Another address is served meanwhile.
    let mut other = connect_from("127.0.0.2", addr).await;
    other.write_all(GET_CLOSE).await.unwrap();
    assert_ok(&closed_within(&mut other, Duration::from_secs(5)).await.unwrap());
    // Once one of the three ends, 127.0.0.1 is served again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = connect_from("127.0.0.1", addr).await;
        again.write_all(GET_CLOSE).await.unwrap();
        let answer = closed_within(&mut again, Duration::from_secs(5)).await.unwrap();
        if answer.starts_with(OK) {
            break;
        }
        assert!(Instant::now() < deadline, "127.0.0.1 is not served after one of its connections ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_head_that_does_not_arrive_in_time_closes_the_connection() {
    let addr =
        start_within(Limits { connections: 8, per_peer: 8, header_read_timeout: Duration::from_millis(300) })
            .await;
    let mut slow = connect_from("127.0.0.1", addr).await;
    slow.write_all(b"GET / HTTP/1.1\r\nhost: ad").await.unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut slow, Duration::from_secs(10)).await.is_ok(),
        "a partial head held the connection"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "closed before the timeout: {:?}",
        started.elapsed()
    );
    // An idle keep-alive connection is closed after the same time.
    let mut idle = connect_from("127.0.0.1", addr).await;
    idle.write_all(b"GET / HTTP/1.1\r\nhost: admin\r\n\r\n").await.unwrap();
    assert_ok(&closed_within(&mut idle, Duration::from_secs(10)).await.unwrap());
}

#[tokio::test]
async fn a_full_listener_serves_the_next_connection_once_one_ends() {
    let addr =
        start_within(Limits { connections: 2, per_peer: 8, header_read_timeout: Duration::from_secs(30) })
            .await;
    let first = connect_from("127.0.0.1", addr).await;
    let _second = connect_from("127.0.0.2", addr).await;
    // The third waits in the backlog: no answer while both slots are held…
    let mut third = connect_from("127.0.0.3", addr).await;
    third.write_all(GET_CLOSE).await.unwrap();
    assert_eq!(closed_within(&mut third, Duration::from_millis(300)).await, Err("still open"));
    // …and is answered once one ends.
    drop(first);
    assert_ok(&closed_within(&mut third, Duration::from_secs(5)).await.unwrap());
}
