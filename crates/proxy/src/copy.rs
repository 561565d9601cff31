//! Bidirectional byte copying between a downstream and an upstream, half-close preserving: the
//! plain TCP relays (HBONE streams relay through [`ambit_hbone::StreamHandle::relay`], see
//! [`hbone_relay`]), and the byte accounting both share.
//!
//! Each direction is a [`Source`] feeding a [`Sink`] with whole [`Bytes`] chunks. Read buffers
//! start small and grow with the flow (1 KiB, then ~16 KiB after 128 KiB, then ~256 KiB after
//! 10 MiB), which keeps idle connections cheap and bulk transfers efficient.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

// `GONE`: the kind of error `Source::gone` and `Sink::gone` report (the HBONE relay's too);
// `is_benign`: errors that mean "the peer went away", not a failure of the proxy.
use ambit_hbone::{GONE, is_benign};
use bytes::{Bytes, BytesMut};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Where a direction's bytes come from.
pub trait Source: Send {
    /// The next chunk, or `None` at end of stream.
    fn read_chunk(&mut self) -> impl Future<Output = io::Result<Option<Bytes>>> + Send;

    /// The first `n` bytes read were written on: flow control may hand their room back to the
    /// sender now (HTTP/2 releases window capacity only here, so unwritten bytes stay bounded by
    /// the window).
    fn consumed(&mut self, _n: usize) {}

    /// Resolves when the far side is gone (stream reset, connection closed) while the sink is
    /// still busy with the last chunk. Never resolves for sources without such a signal.
    fn gone(&mut self) -> impl Future<Output = io::Error> + Send {
        std::future::pending()
    }
}

/// Where a direction's bytes go.
pub trait Sink: Send {
    /// Writes a whole chunk.
    fn write_chunk(&mut self, chunk: Bytes) -> impl Future<Output = io::Result<()>> + Send;
    /// Signals end of stream (TCP FIN / HTTP/2 END_STREAM).
    fn finish(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Resolves when the far side is gone while the source is still waiting for data. Never
    /// resolves for sinks without such a signal.
    fn gone(&mut self) -> impl Future<Output = io::Error> + Send {
        std::future::pending()
    }

    /// The other side is gone: end this side abortively (TCP: RST, dropping unsent bytes)
    /// when it is closed.
    fn abort(&mut self) {}
}

/// Bytes moved in each direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transferred {
    /// Downstream → upstream.
    pub sent: u64,
    /// Upstream → downstream.
    pub received: u64,
}

/// Live counters updated after every chunk (so metrics move while a connection is open).
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Metric counters of downstream → upstream bytes.
    pub sent: Vec<Counter>,
    /// Metric counters of upstream → downstream bytes.
    pub received: Vec<Counter>,
    sent_bytes: AtomicU64,
    received_bytes: AtomicU64,
}

impl LiveCounters {
    /// Counters feeding these metric counters.
    pub fn new(sent: Vec<Counter>, received: Vec<Counter>) -> Self {
        LiveCounters { sent, received, ..Default::default() }
    }

    /// Counts `n` bytes moved downstream → upstream.
    pub fn add_sent(&self, n: usize) {
        self.sent_bytes.fetch_add(n as u64, Ordering::Relaxed);
        for c in &self.sent {
            c.inc_by(n as u64);
        }
    }

    /// Counts `n` bytes moved upstream → downstream.
    pub fn add_received(&self, n: usize) {
        self.received_bytes.fetch_add(n as u64, Ordering::Relaxed);
        for c in &self.received {
            c.inc_by(n as u64);
        }
    }

    /// Bytes moved so far by this connection.
    pub fn transferred(&self) -> Transferred {
        Transferred {
            sent: self.sent_bytes.load(Ordering::Relaxed),
            received: self.received_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Relays an HBONE stream to `app` ([`ambit_hbone::StreamHandle::relay`]), counting in
/// `counters`: bytes from the app are `received` when the app is the upstream (inbound), `sent`
/// when it is the downstream (outbound).
pub async fn hbone_relay(
    stream: ambit_hbone::StreamHandle,
    app: tokio::net::TcpStream,
    counters: Arc<LiveCounters>,
    app_is_upstream: bool,
) -> (Transferred, io::Result<()>) {
    let side = Arc::new(AppSide { counters: counters.clone(), app_is_upstream });
    let r = stream.relay(app, side).await;
    (counters.transferred(), r)
}

/// A connection's counters as seen from the app end of its HBONE stream.
struct AppSide {
    counters: Arc<LiveCounters>,
    app_is_upstream: bool,
}

impl ambit_hbone::RelayCounters for AppSide {
    fn app_to_stream(&self, n: usize) {
        if self.app_is_upstream { self.counters.add_received(n) } else { self.counters.add_sent(n) }
    }

    fn stream_to_app(&self, n: usize) {
        if self.app_is_upstream { self.counters.add_sent(n) } else { self.counters.add_received(n) }
    }
}

/// Copies downstream → upstream and upstream → downstream until both directions end.
///
/// When one side reaches end of stream, the other side's write half is finished, and the
/// opposite direction keeps running (half-close). An error in either direction ends both;
/// resets and broken pipes after data has flowed count as a normal end. When a side is gone
/// (its [`Source::gone`] or [`Sink::gone`] fires) the relay ends at once even if the other side
/// never reads or writes again, and the other side is aborted ([`Sink::abort`]), so a relay and
/// its buffers never outlive a client that left.
pub async fn bidirectional<DR, DW, UR, UW>(
    down: (DR, DW),
    up: (UR, UW),
    counters: &LiveCounters,
) -> (Transferred, io::Result<()>)
where
    DR: Source,
    DW: Sink,
    UR: Source,
    UW: Sink,
{
    let (mut dr, mut dw) = down;
    let (mut ur, mut uw) = up;
    let res = {
        let a = one_way(&mut dr, &mut uw, &counters.sent, &counters.sent_bytes);
        let b = one_way(&mut ur, &mut dw, &counters.received, &counters.received_bytes);
        tokio::try_join!(a, b).map(|_| ())
    };
    if let Err(e) = &res
        && e.kind() == GONE
    {
        uw.abort();
        dw.abort();
    }
    (counters.transferred(), res)
}

async fn one_way<S: Source, W: Sink>(
    src: &mut S,
    dst: &mut W,
    counters: &[Counter],
    total: &AtomicU64,
) -> io::Result<()> {
    loop {
        // `biased`: the far side's `gone` is polled only while the data side is pending.
        let read = tokio::select! {
            biased;
            r = src.read_chunk() => r,
            e = dst.gone() => return Err(e),
        };
        let chunk = match read {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) if is_benign(&e) => break,
            Err(e) => return Err(e),
        };
        let n = chunk.len();
        let written = tokio::select! {
            biased;
            r = dst.write_chunk(chunk) => r,
            e = src.gone() => return Err(e),
        };
        match written {
            Ok(()) => {}
            Err(e) if is_benign(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        src.consumed(n);
        total.fetch_add(n as u64, Ordering::Relaxed);
        for c in counters {
            c.inc_by(n as u64);
        }
    }
    match dst.finish().await {
        Err(e) if !is_benign(&e) => Err(e),
        _ => Ok(()),
    }
}

const INITIAL: usize = 1024;
const MEDIUM: usize = 16 * 1024 - 64;
const LARGE: usize = 16 * 16 * 1024 - 64;
const MEDIUM_AFTER: u64 = 128 * 1024;
const LARGE_AFTER: u64 = 10 * 1024 * 1024;

/// The read half of a TCP stream, with a buffer that grows with the flow.
pub struct TcpSource {
    read: OwnedReadHalf,
    buf: BytesMut,
    seen: u64,
}

impl TcpSource {
    /// Wraps a read half.
    pub fn new(read: OwnedReadHalf) -> Self {
        TcpSource { read, buf: BytesMut::new(), seen: 0 }
    }

    fn target(&self) -> usize {
        if self.seen >= LARGE_AFTER {
            LARGE
        } else if self.seen >= MEDIUM_AFTER {
            MEDIUM
        } else {
            INITIAL
        }
    }
}

impl Source for TcpSource {
    async fn read_chunk(&mut self) -> io::Result<Option<Bytes>> {
        let want = self.target();
        if self.buf.capacity() < want {
            // Chunks already handed out keep their memory; this reserves fresh space only
            // when the remaining tail is too small, amortised over many reads.
            self.buf.reserve(want);
        }
        let n = self.read.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Ok(None);
        }
        self.seen += n as u64;
        Ok(Some(self.buf.split().freeze()))
    }
}

/// The write half of a TCP stream.
pub struct TcpSink(pub OwnedWriteHalf);

impl Sink for TcpSink {
    async fn write_chunk(&mut self, chunk: Bytes) -> io::Result<()> {
        self.0.write_all(&chunk).await
    }

    async fn finish(&mut self) -> io::Result<()> {
        self.0.shutdown().await
    }

    fn abort(&mut self) {
        // Closing then resets the connection and frees unsent bytes at once, instead of leaving
        // them (and an orphaned socket) queued to an app that does not read.
        let _ = socket2::SockRef::from(self.0.as_ref()).set_linger(Some(std::time::Duration::ZERO));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.expect("connect"), b.expect("accept").0)
    }

    // client <-> [down | proxy copy | up] <-> server; checks payload integrity both ways,
    // half-close propagation and byte counts.
    #[tokio::test]
    async fn tcp_to_tcp_half_close_and_counts() {
        let (mut client, down) = pair().await;
        let (up, mut server) = pair().await;
        let (sent, received) = (Counter::default(), Counter::default());
        let counters = LiveCounters::new(vec![sent.clone()], vec![received.clone()]);
        let proxy = tokio::spawn(async move {
            let (dr, dw) = down.into_split();
            let (ur, uw) = up.into_split();
            bidirectional((TcpSource::new(dr), TcpSink(dw)), (TcpSource::new(ur), TcpSink(uw)), &counters)
                .await
        });
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&payload).await.expect("write");
        client.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.expect("server read");
        assert_eq!(got, payload);
        // The other direction still works after the client half-closed.
        server.write_all(b"reply").await.expect("reply");
        server.shutdown().await.expect("server shutdown");
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.expect("client read");
        assert_eq!(back, b"reply");
        let (t, res) = proxy.await.expect("join");
        res.expect("copy ok");
        assert_eq!(t, Transferred { sent: payload.len() as u64, received: 5 });
        assert_eq!(sent.get(), payload.len() as u64);
        assert_eq!(received.get(), 5);
    }
}
