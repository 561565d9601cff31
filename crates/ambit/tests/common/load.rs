//! A client load: threads in a pod's namespace opening short connections at a paced rate,
//! counting successes and recording every failure with its time.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{CONNECT_TIMEOUT, echo_roundtrip, run_in};

/// What the client saw: successes, and every failure with its time and error.
#[derive(Default)]
pub struct Tally {
    ok: AtomicUsize,
    failures: Mutex<Vec<(Duration, String)>>,
}

/// Threads in the client pod opening short echo connections, paced to `rate` per second in total.
pub struct Load {
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    /// When it started.
    pub start: Instant,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `threads` threads in namespace `netns`, each running `op(dst)` over and over, paced to
    /// `rate` per second in total.
    pub fn start(
        netns: &str,
        dst: SocketAddr,
        rate: u32,
        threads: u32,
        op: fn(SocketAddr) -> io::Result<()>,
    ) -> Load {
        let tally = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let interval = Duration::from_secs(1) * threads / rate;
        let threads = (0..threads)
            .map(|_| {
                let (netns, tally, stop) = (netns.to_owned(), tally.clone(), stop.clone());
                std::thread::spawn(move || {
                    run_in(&netns, || {
                        let mut next = Instant::now();
                        while !stop.load(Ordering::Relaxed) {
                            match op(dst) {
                                Ok(()) => {
                                    tally.ok.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => tally
                                    .failures
                                    .lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .push((start.elapsed(), format!("{:?}: {e}", e.kind()))),
                            }
                            next += interval;
                            match next.checked_duration_since(Instant::now()) {
                                Some(wait) => std::thread::sleep(wait),
                                // Behind schedule: catch up, but never by more than 1 s of work.
                                None if next + Duration::from_secs(1) < Instant::now() => {
                                    next = Instant::now();
                                }
                                None => {}
                            }
                        }
                    })
                })
            })
            .collect();
        Load { tally, stop, start, threads }
    }

    /// Connections that succeeded so far.
    pub fn ok(&self) -> usize {
        self.tally.ok.load(Ordering::Relaxed)
    }

    /// Failures so far: (time since the start, error).
    pub fn failures(&self) -> Vec<(Duration, String)> {
        self.tally.failures.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops the threads; returns (successes, failures, time the load ran).
    pub fn finish(mut self) -> (usize, Vec<(Duration, String)>, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap_or_else(|_| panic!("a client thread panicked"));
        }
        (self.ok(), self.failures(), self.start.elapsed())
    }
}

/// One connection: connect, send one byte, half-close, read the echo to EOF.
pub fn short_echo(dst: SocketAddr) -> io::Result<()> {
    let mut s = std::net::TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT)?;
    let reply = echo_roundtrip(&mut s, b"x")?;
    if reply == b"x" { Ok(()) } else { Err(io::Error::other(format!("echo returned {reply:?}"))) }
}
