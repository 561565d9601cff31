//! A minimal HTTP/1.1 client over a unix stream socket, with one deadline for the whole exchange.
//!
//! Written on `std` alone because the plugin is exec'd for every pod sandbox and must start in
//! milliseconds: no async runtime, no HTTP stack. It sends one request with `Connection: close`
//! and reads one response: status line, headers, and a body framed by `Content-Length`,
//! `Transfer-Encoding: chunked` or connection close, capped at [`MAX_BODY`] bytes.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Largest response body kept (the rest is dropped), as istio-cni reads at most 1 MiB.
pub const MAX_BODY: usize = 1 << 20;
const MAX_HEAD: usize = 64 * 1024;

/// An HTTP client for the node agent's unix socket.
#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
    timeout: Duration,
}

/// A response: status code and (possibly truncated) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Body bytes, at most [`MAX_BODY`]; empty for 200 (not read).
    pub body: Vec<u8>,
}

/// Why no response was obtained.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket does not exist or refused the connection.
    #[error("cannot connect to {}: {source}", socket.display())]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The connect error.
        #[source]
        source: io::Error,
    },
    /// The deadline passed.
    #[error("no answer from {} within {timeout:?} (while {stage})", socket.display())]
    Timeout {
        /// The socket path.
        socket: PathBuf,
        /// The configured total timeout.
        timeout: Duration,
        /// What was in progress.
        stage: &'static str,
    },
    /// The connection failed mid-exchange (e.g. the agent exited).
    #[error("connection to {} failed while {stage}: {source}", socket.display())]
    Io {
        /// The socket path.
        socket: PathBuf,
        /// What was in progress.
        stage: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The peer did not speak HTTP/1.x.
    #[error("malformed HTTP response from {}: {reason}", socket.display())]
    Malformed {
        /// The socket path.
        socket: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

impl AgentClient {
    /// A client for `socket` whose every exchange must finish within `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        AgentClient { socket: socket.into(), timeout }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Checks that the socket accepts a connection within the timeout, then closes it.
    pub fn probe(&self) -> Result<(), ClientError> {
        let deadline = Instant::now() + self.timeout;
        self.connect(deadline).map(drop)
    }

    /// Sends `POST path` with a JSON body and reads the response.
    pub fn post_json(&self, path: &str, body: &[u8]) -> Result<Response, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let mut stream = self.connect(deadline)?;
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: unix\r\nUser-Agent: ambit-cni/{}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.set_timeout(&stream, deadline, "sending the request")?;
        stream.write_all(&request).map_err(|e| self.io_error(e, "sending the request"))?;
        let mut reader = Reader { client: self, stream, deadline, buf: Vec::with_capacity(1024), pos: 0 };
        reader.response()
    }

    fn connect(&self, deadline: Instant) -> Result<UnixStream, ClientError> {
        // A unix connect blocks when the listener's backlog is full (a hung agent), so it runs
        // on a helper thread that is abandoned at the deadline.
        let (tx, rx) = mpsc::channel();
        let path = self.socket.clone();
        std::thread::Builder::new()
            .name("connect".into())
            .spawn(move || {
                let _ = tx.send(UnixStream::connect(path));
            })
            .map_err(|source| ClientError::Connect { socket: self.socket.clone(), source })?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(source)) => Err(ClientError::Connect { socket: self.socket.clone(), source }),
            Err(_) => Err(self.timeout_error("connecting")),
        }
    }

    fn set_timeout(
        &self,
        stream: &UnixStream,
        deadline: Instant,
        stage: &'static str,
    ) -> Result<(), ClientError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timeout_error(stage));
        }
        stream
            .set_read_timeout(Some(left))
            .and_then(|()| stream.set_write_timeout(Some(left)))
            .map_err(|e| self.io_error(e, stage))
    }

    fn timeout_error(&self, stage: &'static str) -> ClientError {
        ClientError::Timeout { socket: self.socket.clone(), timeout: self.timeout, stage }
    }

    fn io_error(&self, e: io::Error, stage: &'static str) -> ClientError {
        if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
            self.timeout_error(stage)
        } else {
            ClientError::Io { socket: self.socket.clone(), stage, source: e }
        }
    }

    fn malformed(&self, reason: impl Into<String>) -> ClientError {
        ClientError::Malformed { socket: self.socket.clone(), reason: reason.into() }
    }
}

/// Buffered reads from the stream, each bounded by the shared deadline.
struct Reader<'c> {
    client: &'c AgentClient,
    stream: UnixStream,
    deadline: Instant,
    buf: Vec<u8>,
    pos: usize,
}

enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

impl Reader<'_> {
    fn response(&mut self) -> Result<Response, ClientError> {
        loop {
            let head = self.head()?;
            let (status, framing) = self.parse_head(&head)?;
            // Interim 1xx responses precede the real one.
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            if status == 200 {
                return Ok(Response { status, body: Vec::new() });
            }
            // The status is known; the body only adds detail, so a failure reading it keeps
            // whatever arrived.
            let mut body = Vec::new();
            let _ = self.body(framing, &mut body);
            return Ok(Response { status, body });
        }
    }

    /// Reads up to and including the blank line; returns the head without it.
    fn head(&mut self) -> Result<String, ClientError> {
        loop {
            if let Some(end) = find(&self.buf[self.pos..], b"\r\n\r\n") {
                let head = &self.buf[self.pos..self.pos + end];
                let head = String::from_utf8_lossy(head).into_owned();
                self.pos += end + 4;
                return Ok(head);
            }
            if self.buf.len() - self.pos > MAX_HEAD {
                return Err(self.client.malformed("response headers exceed 64 KiB"));
            }
            if self.fill("reading the response")? == 0 {
                return Err(if self.buf.len() == self.pos {
                    self.client.io_error(
                        io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before any response"),
                        "reading the response",
                    )
                } else {
                    self.client.malformed("connection closed inside the response headers")
                });
            }
        }
    }

    fn parse_head(&self, head: &str) -> Result<(u16, Framing), ClientError> {
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        let code = parts.next().unwrap_or_default();
        if !version.starts_with("HTTP/1.") || code.len() != 3 {
            return Err(self.client.malformed(format!("bad status line {status_line:?}")));
        }
        let status: u16 =
            code.parse().map_err(|_| self.client.malformed(format!("bad status code {code:?}")))?;
        let mut framing = Framing::UntilClose;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                return Err(self.client.malformed(format!("bad header line {line:?}")));
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
            {
                framing = Framing::Chunked;
            } else if name.eq_ignore_ascii_case("content-length") && !matches!(framing, Framing::Chunked) {
                let len = value
                    .parse()
                    .map_err(|_| self.client.malformed(format!("bad Content-Length {value:?}")))?;
                framing = Framing::Length(len);
            }
        }
        Ok((status, framing))
    }

    fn body(&mut self, framing: Framing, out: &mut Vec<u8>) -> Result<(), ClientError> {
        match framing {
            Framing::Length(len) => self.take(len.min(MAX_BODY), out),
            Framing::UntilClose => {
                while out.len() < MAX_BODY {
                    if self.pos == self.buf.len() && self.fill("reading the body")? == 0 {
                        break;
                    }
                    let n = (self.buf.len() - self.pos).min(MAX_BODY - out.len());
                    out.extend_from_slice(&self.buf[self.pos..self.pos + n]);
                    self.pos += n;
                }
                Ok(())
            }
            Framing::Chunked => loop {
                let line = self.line()?;
                let size = line.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(size, 16)
                    .map_err(|_| self.client.malformed(format!("bad chunk size {size:?}")))?;
                if size == 0 || out.len() >= MAX_BODY {
                    return Ok(());
                }
                let keep = size.min(MAX_BODY - out.len());
                self.take(keep, out)?;
                let mut skipped = Vec::new();
                self.take(size - keep, &mut skipped)?;
                self.line()?;
            },
        }
    }

    fn take(&mut self, len: usize, out: &mut Vec<u8>) -> Result<(), ClientError> {
        let mut left = len;
        while left > 0 {
            if self.pos == self.buf.len() && self.fill("reading the body")? == 0 {
                return Err(self.client.malformed("connection closed inside the body"));
            }
            let n = (self.buf.len() - self.pos).min(left);
            out.extend_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            left -= n;
        }
        Ok(())
    }

    fn line(&mut self) -> Result<String, ClientError> {
        loop {
            if let Some(end) = find(&self.buf[self.pos..], b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[self.pos..self.pos + end]).into_owned();
                self.pos += end + 2;
                return Ok(line);
            }
            if self.buf.len() - self.pos > MAX_HEAD {
                return Err(self.client.malformed("chunk header line too long"));
            }
            if self.fill("reading the body")? == 0 {
                return Err(self.client.malformed("connection closed inside the body"));
            }
        }
    }

    /// Reads more bytes into the buffer; 0 at end of stream.
    fn fill(&mut self, stage: &'static str) -> Result<usize, ClientError> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.client.set_timeout(&self.stream, self.deadline, stage)?;
        let mut chunk = [0u8; 8192];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.client.io_error(e, stage)),
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests;
