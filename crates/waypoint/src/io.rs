//! The downstream byte stream as the HTTP server reads it: bytes read while sniffing the
//! protocol put back in front, an idle deadline, and a watch for HTTP/1.1 heads that carry both
//! `Content-Length` and `Transfer-Encoding`.
//!
//! hyper takes such a request as chunked, drops `Content-Length` and closes the connection after
//! it (RFC 9112 §6.3 allows that); Envoy refuses it with 400 (`allow_chunked_length: false`),
//! and so does the waypoint: the watch marks the connection when a head has both, and the
//! request handler answers that request 400. hyper removes the evidence before the handler sees
//! the request, hence the watch on the bytes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What a sniff of the first bytes found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// An HTTP/1.x request line or the HTTP/2 preface.
    Http,
    /// Anything else (or nothing within the sniff timeout).
    Tcp,
}

/// Reads the first bytes of `io` (up to `timeout`) and tells whether they start an HTTP request;
/// the bytes read are returned to be put back in front.
pub(crate) async fn sniff<T: AsyncRead + Unpin>(
    io: &mut T,
    timeout: Duration,
) -> io::Result<(Sniffed, Bytes)> {
    let mut buf = vec![0u8; 64];
    let n = match tokio::time::timeout(timeout, io.read(&mut buf)).await {
        Err(_) => return Ok((Sniffed::Tcp, Bytes::new())),
        Ok(r) => r?,
    };
    buf.truncate(n);
    Ok((if looks_like_http(&buf) { Sniffed::Http } else { Sniffed::Tcp }, Bytes::from(buf)))
}

/// An HTTP/1 request line starts with a method token (upper-case letters) and a space; HTTP/2
/// prior knowledge starts with `PRI * HTTP/2.0`, which has that shape too.
fn looks_like_http(bytes: &[u8]) -> bool {
    let token = bytes.iter().take_while(|b| b.is_ascii_uppercase()).count();
    token > 0 && token <= 16 && (bytes.get(token) == Some(&b' ') || token == bytes.len())
}

/// The downstream stream with its put-back bytes, idle deadline and CL/TE watch.
pub(crate) struct DownstreamIo<T> {
    inner: T,
    prefix: Bytes,
    idle: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
    watch: HeadWatch,
}

impl<T> DownstreamIo<T> {
    /// `inner` after `prefix`; no bytes either way for `idle` fails reads and writes
    /// (`TimedOut`), which ends the connection.
    pub(crate) fn new(inner: T, prefix: Bytes, idle: Duration, conflict: Arc<AtomicBool>) -> Self {
        let last = Instant::now();
        DownstreamIo {
            inner,
            prefix,
            idle,
            last,
            timer: Box::pin(tokio::time::sleep_until(last + idle)),
            watch: HeadWatch { conflict, ..HeadWatch::default() },
        }
    }

    fn touch(&mut self) {
        self.last = Instant::now();
    }

    /// Ready with an error once the stream has been idle for the idle timeout.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let due = self.last + self.idle;
            if self.timer.deadline() != due {
                self.timer.as_mut().reset(due);
            }
            ready!(self.timer.as_mut().poll(cx));
            if self.last + self.idle <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no bytes either way for {:?}: idle connection closed", self.idle),
                ));
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for DownstreamIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            this.watch.scan(&this.prefix[..n]);
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            this.touch();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let filled = &buf.filled()[before..];
                this.watch.scan(filled);
                this.touch();
                Poll::Ready(r)
            }
            Poll::Pending => match this.poll_idle(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for DownstreamIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, data) {
            Poll::Ready(r) => {
                this.touch();
                Poll::Ready(r)
            }
            Poll::Pending => match this.poll_idle(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Watches the lines of the byte stream: a block of lines between empty lines (a message head,
/// or part of a body) holding both a `Content-Length:` and a `Transfer-Encoding:` line marks
/// the connection. Bodies are not skipped, so a body that itself holds such a block marks it
/// too (a false 400 on a later chunked request of that connection, never a missed conflict).
#[derive(Default)]
struct HeadWatch {
    conflict: Arc<AtomicBool>,
    /// The start of the current line, lower-cased, up to 18 bytes.
    line: Vec<u8>,
    /// Bytes in the current line.
    line_len: usize,
    saw_cl: bool,
    saw_te: bool,
}

impl HeadWatch {
    fn scan(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                // `\r\n` or a bare `\n` ends the line; an empty line ends the block.
                if self.line_len == 0 || (self.line_len == 1 && self.line.first() == Some(&b'\r')) {
                    self.saw_cl = false;
                    self.saw_te = false;
                } else if self.line.starts_with(b"content-length:") {
                    self.saw_cl = true;
                } else if self.line.starts_with(b"transfer-encoding:") {
                    self.saw_te = true;
                }
                if self.saw_cl && self.saw_te {
                    self.conflict.store(true, Ordering::Relaxed);
                }
                self.line.clear();
                self.line_len = 0;
            } else {
                if self.line.len() < 18 {
                    self.line.push(b.to_ascii_lowercase());
                }
                self.line_len += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(chunks: &[&[u8]]) -> bool {
        let mut w = HeadWatch::default();
        for c in chunks {
            w.scan(c);
        }
        w.conflict.load(Ordering::Relaxed)
    }

    #[test]
    fn a_head_with_both_lengths_is_seen_across_reads() {
        assert!(watched(&[
            b"POST / HTTP/1.1\r\nContent-Len",
            b"gth: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(watched(&[b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n"]));
        assert!(!watched(&[b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"]));
        assert!(!watched(&[b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\nPOST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"]));
    }

    #[test]
    fn request_lines_and_the_h2_preface_sniff_as_http() {
        assert!(looks_like_http(b"GET / HTTP/1.1\r\n"));
        assert!(looks_like_http(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        assert!(looks_like_http(b"POS"));
        assert!(!looks_like_http(b"\x16\x03\x01"));
        assert!(!looks_like_http(b"hello world"));
    }
}
