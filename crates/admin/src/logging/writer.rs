//! Log lines written off the calling thread.
//!
//! A proxy writes an access-log line per connection. Written straight to stderr, each line is a
//! `write` syscall on a data-plane worker, and a stderr that stops draining (a stuck log
//! collector on the other end of the pipe) would block the worker and every connection on it.
//! [`LogSink`] instead appends each line to a bounded in-memory buffer and lets one thread of its
//! own write the buffer out. A line logged while the thread is idle is written at once (a lone
//! line is not held back); lines logged within [`FLUSH_INTERVAL`] of a write wait for the next
//! write, which comes when the interval is up, or sooner once [`WAKE_AT`] bytes are waiting. So a
//! busy proxy makes one `write` per interval for many lines, and a quiet one shows each line as
//! it happens. When more than the sink's limit (default [`MAX_PENDING`])
//! is waiting, new lines are dropped and counted, and the count is written as a line of its own
//! once the output drains; the caller never waits for the output. [`LogSink::flush`] writes
//! everything out now; the process calls it before it exits, and a panic calls it before the
//! panic message is printed, so no line logged before either is lost.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Shortest time between two writes while lines keep coming; the longest a line waits.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);
/// Waiting bytes that wake the writer thread before the interval is up.
pub const WAKE_AT: usize = 64 * 1024;
/// Default bound on waiting bytes; lines beyond it are dropped and counted. The sink holds at
/// most twice this: what is waiting, and the batch the writer thread is writing out.
pub const MAX_PENDING: usize = 4 << 20;

/// Lines waiting to be written.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    /// Lines dropped since the last report.
    dropped: u64,
    /// The writer thread was told to stop.
    stopped: bool,
    /// The writer thread waits for a line with no deadline: the next line must wake it.
    idle: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// The output; held while writing, so lines come out in the order they were logged.
    out: Mutex<Box<dyn Write + Send>>,
    max_pending: usize,
    /// [`FLUSH_INTERVAL`], except in tests.
    interval: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Takes what is waiting and writes it out (with the report of dropped lines, if any).
    fn write_out(&self, spare: &mut Vec<u8>) {
        let mut out = lock(&self.out);
        let dropped = {
            let mut p = lock(&self.pending);
            std::mem::swap(&mut p.buf, spare);
            std::mem::take(&mut p.dropped)
        };
        if dropped > 0 {
            spare.extend_from_slice(
                format!("{dropped} log lines dropped: the log output did not keep up\n").as_bytes(),
            );
        }
        if !spare.is_empty() {
            // An output that fails (closed stderr) loses these lines; there is nowhere to say so.
            let _ = out.write_all(spare).and_then(|()| out.flush());
        }
        spare.clear();
        // Do not keep a burst's allocation forever.
        if spare.capacity() > 4 * WAKE_AT {
            *spare = Vec::new();
        }
    }
}

/// A `MakeWriter` whose writes are buffered and written out by a thread of its own (see the
/// module docs). Clones share the buffer and the thread.
#[derive(Clone)]
pub struct LogSink {
    shared: Arc<Shared>,
}

impl LogSink {
    /// A sink writing to `out`, holding at most `max_pending` waiting bytes; starts its thread.
    pub fn new(out: Box<dyn Write + Send>, max_pending: usize) -> io::Result<LogSink> {
        LogSink::start(out, max_pending, FLUSH_INTERVAL)
    }

    fn start(out: Box<dyn Write + Send>, max_pending: usize, interval: Duration) -> io::Result<LogSink> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            out: Mutex::new(out),
            max_pending,
            interval,
        });
        let s = shared.clone();
        std::thread::Builder::new().name("ambit-log".into()).spawn(move || {
            let mut spare = Vec::new();
            let mut p = lock(&s.pending);
            loop {
                while p.buf.is_empty() && p.dropped == 0 && !p.stopped {
                    p.idle = true;
                    p = s.wake.wait(p).unwrap_or_else(|e| e.into_inner());
                }
                p.idle = false;
                let stopped = p.stopped;
                drop(p);
                s.write_out(&mut spare);
                if stopped {
                    return;
                }
                // Lines logged in the interval after a write are gathered for the next one.
                p = lock(&s.pending);
                p = s
                    .wake
                    .wait_timeout_while(p, s.interval, |p| !p.stopped && p.buf.len() < WAKE_AT)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        })?;
        Ok(LogSink { shared })
    }

    /// Writes out everything logged so far, on the calling thread.
    pub fn flush(&self) {
        self.shared.write_out(&mut Vec::new());
    }

    /// Writes out what is waiting and ends the writer thread; later lines are still buffered and
    /// written by [`LogSink::flush`].
    pub fn stop(&self) {
        lock(&self.shared.pending).stopped = true;
        self.shared.wake.notify_one();
    }

    fn push(&self, line: &[u8]) {
        let mut p = lock(&self.shared.pending);
        if p.buf.len() + line.len() > self.shared.max_pending {
            p.dropped += 1;
            if p.idle {
                self.shared.wake.notify_one();
            }
            return;
        }
        let was = p.buf.len();
        p.buf.extend_from_slice(line);
        if (p.idle && was == 0) || (was < WAKE_AT && p.buf.len() >= WAKE_AT) {
            self.shared.wake.notify_one();
        }
    }
}

/// One event's writer: `tracing-subscriber` formats an event and writes it with one call.
pub struct LineWriter<'a>(&'a LogSink);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Instant;

    /// An output that appends to a shared buffer, optionally blocked until released.
    #[derive(Clone, Default)]
    struct Shared(Arc<(Mutex<Vec<u8>>, Mutex<()>)>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _open = lock(&self.0.1);
            lock(&self.0.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(lock(&self.0.0).clone()).unwrap()
        }
    }

    fn log(sink: &LogSink, line: &str) {
        use tracing_subscriber::fmt::MakeWriter;
        sink.make_writer().write_all(line.as_bytes()).unwrap();
    }

    #[test]
    fn lines_come_out_in_order_on_flush() {
        let out = Shared::default();
        let sink = LogSink::new(Box::new(out.clone()), MAX_PENDING).unwrap();
        let lines: Vec<String> = (0..1000).map(|i| format!("line {i}\n")).collect();
        for l in &lines {
            log(&sink, l);
        }
        sink.flush();
        assert_eq!(out.text(), lines.concat());
        sink.stop();
    }

    #[test]
    fn the_thread_writes_lines_out_without_a_flush() {
        let out = Shared::default();
        let sink = LogSink::new(Box::new(out.clone()), MAX_PENDING).unwrap();
        log(&sink, "hello\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.text().is_empty() {
            assert!(Instant::now() < deadline, "the writer thread never wrote the line");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(out.text(), "hello\n");
        sink.stop();
    }

    #[test]
    fn a_lone_line_is_written_at_once_and_a_quick_second_one_waits_for_the_interval() {
        let out = Shared::default();
        let sink = LogSink::start(Box::new(out.clone()), MAX_PENDING, Duration::from_secs(3600)).unwrap();
        log(&sink, "first\n");
        // The thread was idle: the line does not wait for the (hour-long) interval.
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.text().is_empty() {
            assert!(Instant::now() < deadline, "a lone line was held back");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Right after a write, the next line is gathered for the next write.
        log(&sink, "second\n");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(out.text(), "first\n", "a line within the interval after a write was written on its own");
        sink.flush();
        assert_eq!(out.text(), "first\nsecond\n");
        sink.stop();
    }

    #[test]
    fn a_stuck_output_drops_and_counts_lines_instead_of_blocking() {
        let out = Shared::default();
        let blocked = lock(&out.0.1);
        let sink = LogSink::new(Box::new(out.clone()), 100).unwrap();
        // The first line may already be in the writer thread, stuck on the output; what follows
        // fills the 100-byte bound and the rest is dropped, while every call returns at once.
        for i in 0..50 {
            log(&sink, &format!("line {i:02} ....\n")); // 14 bytes
        }
        drop(blocked);
        sink.flush();
        let text = out.text();
        let kept = text.lines().filter(|l| l.starts_with("line ")).count();
        let report = text.lines().find(|l| l.ends_with("log lines dropped: the log output did not keep up"));
        let dropped: usize = report.and_then(|l| l.split(' ').next()).unwrap().parse().unwrap();
        // At most one full buffer taken by the thread before it blocked, and one more waiting.
        assert!(kept <= 2 * (100 / 14), "{kept} lines kept past the bound");
        assert_eq!(kept + dropped, 50, "every line is either written or counted:\n{text}");
        sink.stop();
    }
}
