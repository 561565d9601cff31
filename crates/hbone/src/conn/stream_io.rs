//! A stream as a byte pipe: [`StreamIo`], `AsyncRead + AsyncWrite` over a [`StreamHandle`], for
//! code that speaks a protocol over the tunnel itself (the waypoint's HTTP server and client)
//! rather than relaying it to a socket.
//!
//! Poll-based, with no task of its own: a read hands out the received `Bytes` the driver queued
//! (a partly read one is kept for the next read), a write goes through the same capacity
//! reservation as [`StreamHandle::send`], and shutdown is END_STREAM. A reset stream or a dead
//! connection reads and writes as an error of kind [`crate::GONE`].

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::stream::{gone, send_buf, send_slots};
use super::*;

/// A stream as `AsyncRead + AsyncWrite` (see [`StreamHandle::into_io`]). Dropping it drops the
/// stream: a stream not ended both ways is reset.
pub struct StreamIo {
    handle: StreamHandle,
    /// The rest of a received chunk the reader has not taken yet.
    pending: Bytes,
    /// Held until the stream is dropped (a pool's stream slot).
    _guard: Option<Box<dyn Send + Sync>>,
}

impl StreamHandle {
    /// This stream as `AsyncRead + AsyncWrite`. A server answers the CONNECT with
    /// [`StreamHandle::respond`] first.
    pub fn into_io(self) -> StreamIo {
        StreamIo { handle: self, pending: Bytes::new(), _guard: None }
    }
}

impl StreamIo {
    /// Like [`StreamHandle::into_io`], holding `guard` for as long as the stream lives.
    pub(crate) fn with_guard(handle: StreamHandle, guard: Box<dyn Send + Sync>) -> StreamIo {
        StreamIo { handle, pending: Bytes::new(), _guard: Some(guard) }
    }

    /// The stream.
    pub fn handle(&self) -> &StreamHandle {
        &self.handle
    }

    /// The next received chunk: `None` at END_STREAM; its window goes back to the peer as it is
    /// taken from the queue (the bytes are then ours, as in [`StreamHandle::recv`]).
    fn poll_chunk(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        let id = self.handle.id;
        let mut st = self.handle.shared.lock();
        let st = &mut *st;
        let closed = st.closed.clone();
        let Some(s) = st.streams.get_mut(&id) else { return Poll::Ready(Err(gone(StreamError::Closed))) };
        if let Some(b) = s.queue.pop_front() {
            s.queued -= b.len();
            let n = b.len();
            st.release(Some(id), n);
            self.handle.shared.flush(st);
            return Poll::Ready(Ok(Some(b)));
        }
        if s.recv_done {
            return Poll::Ready(Ok(None));
        }
        if let Some(r) = s.reset {
            return Poll::Ready(Err(gone(StreamError::Reset(r))));
        }
        if let Some(e) = closed {
            return Poll::Ready(Err(gone(StreamError::Connection(e))));
        }
        s.recv_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncRead for StreamIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        while this.pending.is_empty() {
            match ready!(this.poll_chunk(cx))? {
                Some(chunk) => this.pending = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for StreamIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let handle = &this.handle;
        let want = data.len().min(SLOTS * SLOT_PAYLOAD);
        let cap = ready!(handle.poll_capacity(cx, want)).map_err(gone)?;
        let now = &data[..cap];
        SEND_BUF
            .with_borrow_mut(|buf| {
                let buf = send_buf(buf);
                for (i, part) in now.chunks(SLOT_PAYLOAD).enumerate() {
                    let at = i * SLOT + tls::HEADER_LEN + frame::HEADER_LEN;
                    buf[at..at + part.len()].copy_from_slice(part);
                }
                send_slots(&handle.shared, handle.shared.lock(), handle.id, buf, cap, cap, false)
            })
            .map_err(gone)?;
        Poll::Ready(Ok(cap))
    }

    /// Written records are with the connection already (its driver flushes what the socket did
    /// not take), so there is nothing to wait for.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// END_STREAM: our side is done; reading goes on until the peer's.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.handle.finish() {
            Ok(()) | Err(StreamError::Closed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(gone(e))),
        }
    }
}
