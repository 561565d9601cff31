//! The demo applications' HTTP side, on hyper.
//!
//! Server (`ambit app echo`, for a connection that starts with a request): HTTP/1.1 with
//! keep-alive or HTTP/2 with prior knowledge. Every answer carries `x-server: <pod>` and a JSON
//! body `{"server","peer","local","method","path","headers"}` (what it saw of the request; the
//! peer is the client's own address in the mesh); a path with the segments `status/<code>`
//! (`/api/status/503`) is answered with that status, one with `delay/<ms>` after that long (at
//! most a minute); a gRPC request (`content-type:
//! application/grpc…`) gets its own message back with `grpc-status: 0`.
//!
//! Client (`ambit app http`): one connection, N requests one after the other, one JSON line
//! each: `{"status", "server", "ms"}` (and `"grpcStatus"` for gRPC), or `{"error", "detail"}`
//! when no answer came. A connection the server closes between requests is opened again
//! (`"reconnected": true` on the next line), and an idempotent request that meets such a close
//! as it goes out is sent once more on a new connection (`"retried"`: the first error), as any
//! keep-alive client does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};

use super::{parse_duration, resolve};

/// Largest request body the server reads (the rest of a larger one is refused with 413).
const MAX_BODY: usize = 1 << 20;
/// Longest `/delay/<ms>`.
const MAX_DELAY: Duration = Duration::from_secs(60);

/// Who answers, as the line protocol says it.
pub struct Who {
    /// The pod's name.
    pub server: String,
    /// The peer address seen.
    pub peer: String,
    /// The local address.
    pub local: String,
}

/// Whether these first bytes start an HTTP/1.1 request or the HTTP/2 preface.
pub fn starts_a_request(first: &[u8; 4]) -> bool {
    const STARTS: [&[u8; 4]; 10] =
        [b"GET ", b"POST", b"PUT ", b"DELE", b"HEAD", b"OPTI", b"PATC", b"PRI ", b"CONN", b"TRAC"];
    STARTS.contains(&first)
}

type Body = BoxBody<Bytes, Infallible>;

/// Serves one connection until the client closes it.
pub async fn serve(conn: std::net::TcpStream, who: Who) {
    let Ok(()) = conn.set_read_timeout(None) else { return };
    let Ok(()) = conn.set_nonblocking(true) else { return };
    let Ok(tcp) = tokio::net::TcpStream::from_std(conn) else { return };
    let who = Arc::new(who);
    let service = service_fn(move |req| answer(req, who.clone()));
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
}

async fn answer(req: Request<Incoming>, who: Arc<Who>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let method = req.method().to_string();
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (k.as_str().to_owned(), Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()))
        })
        .collect();
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(plain(&who, StatusCode::PAYLOAD_TOO_LARGE, "request body over 1 MiB\n".into())),
    };
    if grpc {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body = Full::new(body).with_trailers(async move { Some(Ok(trailers)) }).boxed();
        let mut resp = Response::new(body);
        resp.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        add_server(&mut resp, &who);
        return Ok(resp);
    }
    let mut status = StatusCode::OK;
    let bare = path.split('?').next().unwrap_or_default();
    if let Some(code) = segment_after(bare, "status") {
        match code.parse::<u16>().ok().and_then(|c| StatusCode::from_u16(c).ok()) {
            Some(s) => status = s,
            None => return Ok(plain(&who, StatusCode::BAD_REQUEST, format!("{code:?} is not a status\n"))),
        }
    } else if let Some(ms) = segment_after(bare, "delay") {
        match ms.parse::<u64>() {
            Ok(ms) => tokio::time::sleep(Duration::from_millis(ms).min(MAX_DELAY)).await,
            Err(_) => {
                return Ok(plain(&who, StatusCode::BAD_REQUEST, format!("{ms:?} is not milliseconds\n")));
            }
        }
    }
    let text = json!({
        "server": who.server, "peer": who.peer, "local": who.local,
        "method": method, "path": path, "headers": headers,
    });
    let mut resp = plain(&who, status, format!("{text}\n"));
    resp.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

/// The path segment after the last segment `name` (`/api/status/503` → `503`).
fn segment_after<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    let mut segments = path.split('/').rev().peekable();
    let mut after = None;
    while let Some(s) = segments.next() {
        if segments.peek() == Some(&name) {
            after = Some(s);
            break;
        }
    }
    after
}

fn plain(who: &Who, status: StatusCode, text: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(text)).boxed());
    *resp.status_mut() = status;
    add_server(&mut resp, who);
    resp
}

fn add_server(resp: &mut Response<Body>, who: &Who) {
    if let Ok(v) = HeaderValue::from_str(&who.server) {
        resp.headers_mut().insert("x-server", v);
    }
}

/// `ambit app http`'s arguments.
#[derive(clap::Args)]
pub struct HttpArgs {
    /// `http://host:port/path`; the host is resolved as `ambit app client` resolves names.
    url: String,
    /// Request method.
    #[arg(long, short = 'X', default_value = "GET")]
    method: String,
    /// A request header, `name: value` (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// How many requests, one after the other on one connection.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Wait between requests.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    interval: Duration,
    /// How long to wait for the connection and for each answer.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    timeout: Duration,
    /// HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    #[arg(long)]
    http2: bool,
    /// A gRPC call (POST of one message, HTTP/2) to the URL's path, e.g. `/pkg.Service/Method`.
    #[arg(long)]
    grpc: bool,
}

/// Sends the requests; fails when some got no answer at all.
pub fn client(args: &HttpArgs) -> Result<(), String> {
    let rest = args.url.strip_prefix("http://").ok_or_else(|| format!("{}: only http:// URLs", args.url))?;
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    let method = Method::from_bytes(args.method.as_bytes())
        .map_err(|_| format!("{:?} is not a method", args.method))?;
    let mut headers = HeaderMap::new();
    for h in &args.headers {
        let (k, v) = h.split_once(':').ok_or_else(|| format!("header {h:?} is not `name: value`"))?;
        let k =
            HeaderName::from_bytes(k.trim().as_bytes()).map_err(|_| format!("{k:?} is not a header name"))?;
        let v = HeaderValue::from_str(v.trim()).map_err(|_| format!("{v:?} is not a header value"))?;
        headers.append(k, v);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let failed = rt.block_on(async {
        let mut conn: Option<Sender> = None;
        let mut reconnected = false;
        let mut sent_on_conn = 0u32;
        let mut failed = 0;
        for i in 0..args.count {
            if i > 0 && !args.interval.is_zero() {
                tokio::time::sleep(args.interval).await;
            }
            let t0 = Instant::now();
            if conn.as_ref().is_none_or(Sender::closed) {
                reconnected = conn.is_some();
                sent_on_conn = 0;
                conn = match open(authority, args.http2 || args.grpc, args.timeout).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        failed += 1;
                        println!("{}", json!({ "error": "connect", "detail": e, "ms": ms(t0) }));
                        continue;
                    }
                };
            }
            let Some(sender) = conn.as_mut() else { continue };
            let req = request(&method, authority, path, &headers, args.grpc);
            let mut line = match tokio::time::timeout(args.timeout, sender.send(req)).await {
                Err(_) => json!({ "error": "timeout", "detail": format!("no answer in {:?}", args.timeout) }),
                Ok(Err(e)) => json!({ "error": "request", "detail": e }),
                Ok(Ok(line)) => line,
            };
            // A reused connection the server closed as this request went out: an idempotent
            // request is sent again once on a new connection (RFC 9112 §9.3.1), as browsers
            // and curl do.
            let reused = sent_on_conn > 0;
            sent_on_conn += 1;
            if line["error"] == "request" && reused && method.is_idempotent() && !args.grpc {
                let first = line["detail"].clone();
                line = match open(authority, args.http2, args.timeout).await {
                    Err(e) => json!({ "error": "connect", "detail": e }),
                    Ok(mut fresh) => {
                        let req = request(&method, authority, path, &headers, false);
                        let again = match tokio::time::timeout(args.timeout, fresh.send(req)).await {
                            Err(_) => json!({ "error": "timeout", "detail": format!("no answer in {:?}", args.timeout) }),
                            Ok(Err(e)) => json!({ "error": "request", "detail": e }),
                            Ok(Ok(line)) => line,
                        };
                        conn = Some(fresh);
                        sent_on_conn = 1;
                        again
                    }
                };
                line["retried"] = json!(first);
            }
            if line.get("error").is_some() {
                failed += 1;
                conn = None;
            }
            line["ms"] = json!(ms(t0));
            if std::mem::take(&mut reconnected) {
                line["reconnected"] = json!(true);
            }
            println!("{line}");
        }
        failed
    });
    if failed > 0 { Err(format!("{failed} of {} requests got no answer", args.count)) } else { Ok(()) }
}

fn ms(t0: Instant) -> f64 {
    (t0.elapsed().as_secs_f64() * 1e4).round() / 10.0
}

fn request(method: &Method, authority: &str, path: &str, headers: &HeaderMap, grpc: bool) -> Request<Body> {
    let (method, body) = if grpc {
        // One length-prefixed message: not compressed, 5 bytes.
        (Method::POST, Bytes::from_static(b"\0\0\0\0\x05hello"))
    } else {
        (method.clone(), Bytes::new())
    };
    let mut req = Request::new(Full::new(body).boxed());
    *req.method_mut() = method;
    *req.uri_mut() = format!("http://{authority}{path}").parse().unwrap_or_default();
    req.headers_mut().extend(headers.clone());
    if grpc {
        req.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        req.headers_mut().insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    req
}

/// One connection's request sender.
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Sender {
    fn closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// Sends one request; the JSON line of its answer.
    async fn send(&mut self, req: Request<Body>) -> Result<Value, String> {
        let resp = match self {
            Sender::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let server = resp.headers().get("x-server").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let collected =
            Limited::new(resp.into_body(), MAX_BODY).collect().await.map_err(|e| e.to_string())?;
        let grpc_status = collected
            .trailers()
            .and_then(|t| t.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = collected.to_bytes();
        let mut line = json!({ "status": status, "server": server });
        if let Some(g) = grpc_status {
            line["grpcStatus"] = json!(g);
        }
        if let Ok(seen) = serde_json::from_slice::<Value>(&body) {
            line["seen"] = seen;
        } else if !body.is_empty() {
            line["body"] = json!(String::from_utf8_lossy(&body[..body.len().min(512)]));
        }
        Ok(line)
    }
}

async fn open(authority: &str, http2: bool, timeout: Duration) -> Result<Sender, String> {
    let addr: SocketAddr = resolve(authority)?;
    let tcp = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| format!("{addr}: no connection in {timeout:?}"))?
        .map_err(|e| format!("{addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let io = TokioIo::new(tcp);
    if http2 {
        let (s, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("{addr}: HTTP/2 handshake: {e}"))?;
        tokio::spawn(conn);
        Ok(Sender::H2(s))
    } else {
        let (s, conn) =
            hyper::client::conn::http1::handshake(io).await.map_err(|e| format!("{addr}: {e}"))?;
        tokio::spawn(conn);
        Ok(Sender::H1(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_and_delay_segments_are_read_anywhere_in_the_path() {
        assert_eq!(segment_after("/api/status/503", "status"), Some("503"));
        assert_eq!(segment_after("/status/404", "status"), Some("404"));
        assert_eq!(segment_after("/api/delay/2000", "delay"), Some("2000"));
        assert_eq!(segment_after("/api/x", "status"), None);
        assert_eq!(segment_after("/api/status", "status"), None);
    }

    #[test]
    fn requests_and_the_http2_preface_are_told_from_a_line_client() {
        assert!(starts_a_request(b"GET "));
        assert!(starts_a_request(b"PRI "));
        assert!(starts_a_request(b"DELE"));
        assert!(!starts_a_request(b"hell"));
    }
}
