#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::thread;

use super::*;

/// Serves one connection: reads the request head and body, then writes `reply` (after `delay`).
fn serve_once(
    reply: &'static [u8],
    delay: Duration,
) -> (tempfile::TempDir, PathBuf, thread::JoinHandle<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let handle = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream);
        let mut request = Vec::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            request.extend_from_slice(line.as_bytes());
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        request.extend_from_slice(&body);
        thread::sleep(delay);
        let mut stream = reader.into_inner();
        let _ = stream.write_all(reply);
        request
    });
    (dir, path, handle)
}

#[test]
fn sends_a_well_formed_request_and_reads_200() {
    let (_dir, path, server) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", Duration::ZERO);
    let client = AgentClient::new(&path, Duration::from_secs(5));
    let response = client.post_json("/cmdadd", br#"{"a":1}"#).unwrap();
    assert_eq!(response, Response { status: 200, body: Vec::new() });
    let request = String::from_utf8(server.join().unwrap()).unwrap();
    assert!(request.starts_with("POST /cmdadd HTTP/1.1\r\nHost: unix\r\n"), "{request}");
    assert!(request.contains("\r\nContent-Type: application/json\r\n"));
    assert!(request.contains("\r\nContent-Length: 7\r\n"));
    assert!(request.ends_with("\r\n\r\n{\"a\":1}"));
}

#[test]
fn reads_error_bodies_in_every_framing() {
    let cases: [(&'static [u8], &[u8]); 4] = [
        (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 22\r\n\r\nno ztunnel connection\n", b"no ztunnel connection\n"),
        (b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nno \r\n8;x=y\r\nztunnel!\r\n0\r\n\r\n", b"no ztunnel!"),
        (b"HTTP/1.0 400 Bad Request\r\n\r\nempty body", b"empty body"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy", b"busy"),
    ];
    for (reply, body) in cases {
        let (_dir, path, server) = serve_once(reply, Duration::ZERO);
        let response = AgentClient::new(&path, Duration::from_secs(5)).post_json("/cmdadd", b"{}").unwrap();
        assert_eq!(response.body, body, "{}", String::from_utf8_lossy(reply));
        assert_ne!(response.status, 200);
        server.join().unwrap();
    }
}

#[test]
fn malformed_and_truncated_answers() {
    for reply in [
        &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200",
    ] {
        let (_dir, path, server) = serve_once(reply, Duration::ZERO);
        let err = AgentClient::new(&path, Duration::from_secs(5)).post_json("/cmdadd", b"{}").unwrap_err();
        assert!(matches!(err, ClientError::Malformed { .. }), "{}: {err:?}", String::from_utf8_lossy(reply));
        server.join().unwrap();
    }
    let (_dir, path, server) = serve_once(b"", Duration::ZERO);
    let err = AgentClient::new(&path, Duration::from_secs(5)).post_json("/cmdadd", b"{}").unwrap_err();
    assert!(matches!(err, ClientError::Io { .. }), "{err:?}");
    server.join().unwrap();
}

#[test]
fn deadline_covers_the_whole_exchange() {
    let (_dir, path, server) = serve_once(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_millis(600));
    let start = Instant::now();
    let err = AgentClient::new(&path, Duration::from_millis(150)).post_json("/cmdadd", b"{}").unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
    assert!(took >= Duration::from_millis(140) && took < Duration::from_millis(550), "{took:?}");
    server.join().unwrap();
}

#[test]
fn missing_socket_and_refused_connection() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.sock");
    let err = AgentClient::new(&missing, Duration::from_secs(1)).post_json("/cmdadd", b"{}").unwrap_err();
    assert!(
        matches!(&err, ClientError::Connect { source, .. } if source.kind() == io::ErrorKind::NotFound),
        "{err:?}"
    );
    // A socket file whose listener is gone refuses connections.
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let client = AgentClient::new(&stale, Duration::from_secs(1));
    assert!(matches!(client.probe(), Err(ClientError::Connect { .. })));
    assert!(matches!(client.post_json("/cmdadd", b"{}"), Err(ClientError::Connect { .. })));
}

#[test]
fn probe_succeeds_on_a_listening_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    AgentClient::new(&path, Duration::from_secs(1)).probe().unwrap();
}

#[test]
fn error_body_is_capped() {
    static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let big = BIG.get_or_init(|| {
        let mut v = format!("HTTP/1.1 500 x\r\nContent-Length: {}\r\n\r\n", MAX_BODY + 10).into_bytes();
        v.resize(v.len() + MAX_BODY + 10, b'e');
        v
    });
    let (_dir, path, server) = serve_once(big, Duration::ZERO);
    let response = AgentClient::new(&path, Duration::from_secs(5)).post_json("/cmdadd", b"{}").unwrap();
    assert_eq!(response.body.len(), MAX_BODY);
    server.join().unwrap();
}
