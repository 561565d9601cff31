//! Close-per-request HTTP load, as HTTP/1.0 clients, health checkers and wrk with
//! `Connection: close` make it: threads in client pods' namespaces, each opening a connection,
//! sending one GET, reading the whole answer (by its Content-Length) and closing at once, before
//! the server's FIN if that has not come yet. Every connection's start and duration is kept.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{CONNECT_TIMEOUT, run_in};

/// When a churn run stops.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    /// After this long.
    Elapsed(Duration),
    /// After this many connections in all.
    Connections(usize),
}

/// What a churn run saw.
#[derive(Debug, Default)]
pub struct ChurnRun {
    /// Per connection that succeeded: its start (since the run's start) and how long its
    /// connect, request and whole answer took.
    pub done: Vec<(Duration, Duration)>,
    /// Per failed connection: its start and the error.
    pub failed: Vec<(Duration, String)>,
    /// How long the run took.
    pub elapsed: Duration,
}

impl ChurnRun {
    /// Connections per second over the whole run.
    pub fn rate(&self) -> f64 {
        self.done.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Per window of `width` from the start (the last one partial, left out): connections per
    /// second and the p99 of their durations in ms.
    pub fn windows(&self, width: Duration) -> Vec<(f64, f64)> {
        let n = (self.elapsed.as_secs_f64() / width.as_secs_f64()).floor() as usize;
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); n];
        for (start, took) in &self.done {
            let i = (start.as_secs_f64() / width.as_secs_f64()) as usize;
            if let Some(w) = per.get_mut(i) {
                w.push(took.as_secs_f64() * 1e3);
            }
        }
        per.iter().map(|w| (w.len() as f64 / width.as_secs_f64(), percentile(w, 99.0))).collect()
    }

    /// The slowest connection: its start and duration.
    pub fn slowest(&self) -> Option<(Duration, Duration)> {
        self.done.iter().copied().max_by_key(|(_, took)| *took)
    }
}

/// Percentile `p` (0–100) of `values`, nearest rank; NaN for none.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Runs `threads` connection loops in each of `netns` against `http://dst{path}` until `until`.
pub fn churn(netns: &[String], threads: usize, dst: SocketAddr, path: &str, until: Until) -> ChurnRun {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {dst}\r\nConnection: close\r\n\r\n");
    let started = AtomicUsize::new(0);
    let out = Mutex::new(ChurnRun::default());
    let start = Instant::now();
    let more = |started: &AtomicUsize| match until {
        Until::Elapsed(d) => start.elapsed() < d,
        Until::Connections(n) => started.fetch_add(1, Ordering::Relaxed) < n,
    };
    std::thread::scope(|scope| {
        for ns in netns {
            for _ in 0..threads {
                let (request, started, out) = (request.as_bytes(), &started, &out);
                let ns: Arc<str> = Arc::from(ns.as_str());
                scope.spawn(move || {
                    run_in(&ns, || {
                        let mut done = Vec::new();
                        let mut failed = Vec::new();
                        while more(started) {
                            let t0 = Instant::now();
                            match one(dst, request) {
                                Ok(()) => done.push((t0 - start, t0.elapsed())),
                                Err(e) => failed.push((t0 - start, format!("{:?}: {e}", e.kind()))),
                            }
                        }
                        let mut out = out.lock().unwrap_or_else(PoisonError::into_inner);
                        out.done.extend(done);
                        out.failed.extend(failed);
                    });
                });
            }
        }
    });
    let mut run = out.into_inner().unwrap_or_else(PoisonError::into_inner);
    run.elapsed = start.elapsed();
    run.done.sort();
    run
}

/// One connection: connect, send `request`, read the head and `Content-Length` bytes of body,
/// close (without waiting for the server's FIN).
fn one(dst: SocketAddr, request: &[u8]) -> io::Result<()> {
    let mut s = std::net::TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(request)?;
    let mut got = Vec::with_capacity(2048);
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before a whole answer"));
        }
        got.extend_from_slice(&buf[..n]);
        if let Some(head_end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                return Err(io::Error::other(format!("answer {:?}", head.lines().next())));
            }
            let Some(len) = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
            else {
                return Err(io::Error::other("an answer without Content-Length"));
            };
            if got.len() >= head_end + 4 + len {
                return Ok(());
            }
        }
    }
}
