//! One HTTP request through the waypoint: authorization, route, filters, backend and endpoint
//! choice, the attempts with their timeouts and retries, and the answer.
//!
//! Local answers, with Envoy's bodies where Envoy has one: 403 `RBAC: access denied` (a policy
//! denied; counted with the policy's name), 400 for a path that cannot be normalized or a
//! request with both `Content-Length` and `Transfer-Encoding`, 404 when routes exist and none
//! matches, 500 when the chosen route has no usable backend (Gateway API), 503 `no healthy
//! upstream` when the backend has no healthy endpoint, 503 `upstream connect error or
//! disconnect/reset before headers` when the last attempt failed before a response, 504
//! `upstream request timeout` when a timeout ran out. A gRPC request gets these as Envoy sends
//! them: trailers-only, HTTP 200, `grpc-status` mapped from the HTTP status (403 → 7
//! PERMISSION_DENIED, 503 and 504 → 14 UNAVAILABLE, …) and the text in `grpc-message`; the
//! counters keep the HTTP status.
//!
//! Headers added upstream, as Istio's waypoint (Envoy's HTTP connection manager) does: the
//! downstream address appended to `x-forwarded-for` (`remote.ip` reads it back with
//! `numTrustedProxies`), `x-forwarded-proto: http` when absent (the waypoint's HTTP is plaintext
//! inside the tunnel), and an `x-request-id` (UUID v4) when absent. Hop-by-hop headers are not
//! forwarded, except an upgrade's (see [`crate::upgrade`]). `x-forwarded-client-cert` is not
//! added: Istio's waypoints do not add it either without an EnvoyFilter (istio/istio#54995).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HOST};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, Version, request::Parts};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use rand::Rng;
use tokio::time::Instant;

use crate::access;
use crate::authz::{self, Decision, remote_ip};
use crate::body::{Active, Counting, Pending, Telemetry, UpstreamBody, header_bytes};
use crate::config::Endpoint;
use crate::config::{
    Backend, Destination, Filter, HeaderModifier, Mirror, Port, Protocol, Retry, Route, Snapshot,
};
use crate::route::{self, modify_headers, pick_backend, pick_endpoint};
use crate::series::{Outcome, request_head_bytes};
use crate::server::{Shared, Source};
use crate::upgrade::Upgrade;
use crate::upstream::{Body, BoxError};

/// The downstream side of one CONNECT stream: who sent it and to which address.
#[derive(Debug)]
pub(crate) struct Downstream {
    /// The HBONE peer.
    pub(crate) source: Arc<Source>,
    /// The CONNECT's `:authority` (a destination's address and port).
    pub(crate) addr: SocketAddr,
    /// The request series its requests were recorded in, by what decides their labels.
    pub(crate) series: crate::series::Kept,
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"];

/// Answers one request and counts its status; its telemetry is recorded when the answer ends.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    downstream: Arc<Downstream>,
    conflict: Arc<AtomicBool>,
    req: Request<Incoming>,
) -> Response<Body> {
    let grpc = is_grpc(req.headers());
    let started = Instant::now();
    let seen = tracing::enabled!(target: "access", tracing::Level::INFO)
        .then(|| access::Seen::of(req.method(), req.uri(), req.version(), req.headers()));
    let request_head = request_head_bytes(&req);
    let request_body = Arc::new(AtomicU64::new(0));
    let resp = answer(&shared, &downstream, &conflict, req, &request_body).await;
    let status = resp.status();
    shared.counters.response(status);
    let flags = match resp.extensions().get::<LocalText>() {
        Some(LocalText(text)) => response_flags(status, text),
        None => "-",
    };
    let endpoint = resp.extensions().get::<ServedBy>().map(|s| s.0.clone());
    if let Some(seen) = seen {
        log_access(&shared, &downstream, &seen, &resp, flags, endpoint.as_deref(), started.elapsed());
    }
    let resp = if grpc && resp.extensions().get::<Local>().is_some() { grpc_local(resp) } else { resp };
    let grpc_status = if grpc {
        resp.headers().get("grpc-status").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    } else {
        None
    };
    let grpc_status_pending = grpc && grpc_status.is_none();
    let outcome = Outcome { endpoint, grpc, status, flags, grpc_status };
    let (parts, body) = resp.into_parts();
    // `:status` and its three digits.
    let response_head = header_bytes(&parts.headers) + 10;
    let pending =
        Pending { shared, downstream, outcome, started, request_head, request_body, grpc_status_pending };
    Response::from_parts(parts, BodyExt::boxed_unsync(Telemetry::new(body, pending, response_head)))
}

/// One access log line (see [`crate::access`]); a denial that no ALLOW policy allowed also
/// names the ALLOW policies that did not match.
fn log_access(
    shared: &Shared,
    downstream: &Downstream,
    seen: &access::Seen,
    resp: &Response<Body>,
    flags: &str,
    endpoint: Option<&Endpoint>,
    duration: Duration,
) {
    let denied = resp.extensions().get::<Denied>();
    let details = match (denied, flags) {
        (Some(d), _) => d.details.as_str(),
        (None, "-") => "via_upstream",
        (None, "NR") => "route_not_found",
        (None, "UH") => "no_healthy_upstream",
        (None, "UT") => "upstream_response_timeout",
        (None, "UF") => "upstream_reset_before_response_started",
        (None, _) => "local_reply",
    };
    let snapshot = shared.config.load();
    let cluster = snapshot.bound(downstream.addr).map(|(d, p)| {
        let kind = if matches!(p.protocol, Protocol::Tcp) { "tcp" } else { "http" };
        format!("inbound-vip|{}|{kind}|{}", p.port, d.hostname)
    });
    let out = access::Outcome {
        status: resp.status().as_u16(),
        flags,
        details,
        duration,
        upstream: endpoint.map(|e| e.address),
        cluster: cluster.as_deref(),
        local: downstream.addr,
        remote: downstream.source.ip,
    };
    let line = access::line(seen, &out);
    match denied.map(|d| d.allow_policies.as_slice()) {
        Some(allows) if !allows.is_empty() => {
            tracing::info!(target: "access", "{line} allow_policies_not_matched={}", allows.join(","));
        }
        _ => tracing::info!(target: "access", "{line}"),
    }
}

/// A denial's access-log details.
#[derive(Clone)]
struct Denied {
    details: String,
    allow_policies: Vec<String>,
}

/// The endpoint that answered (for telemetry).
#[derive(Clone)]
struct ServedBy(Arc<Endpoint>);

/// Envoy's response flag of a local answer.
fn response_flags(status: StatusCode, text: &str) -> &'static str {
    match (status.as_u16(), text) {
        (403, _) => "RBAC",
        (404, _) => "NR",
        (503, "no healthy upstream") => "UH",
        (503, _) => "UF",
        (504, _) => "UT",
        _ => "-",
    }
}

/// Marks an answer the waypoint made itself (not an endpoint's).
#[derive(Clone, Copy, Debug)]
struct Local;

fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A local answer to a gRPC request as Envoy sends it: a trailers-only response (HTTP 200) whose
/// `grpc-status` is the HTTP status mapped as gRPC's spec maps it, the text in `grpc-message`.
fn grpc_local(resp: Response<Body>) -> Response<Body> {
    let status = match resp.status().as_u16() {
        400 => "13",
        401 => "16",
        403 => "7",
        404 => "12",
        429 | 502 | 503 | 504 => "14",
        _ => "2",
    };
    let message = resp
        .extensions()
        .get::<LocalText>()
        .filter(|t| !t.0.is_empty())
        .and_then(|t| HeaderValue::from_str(t.0).ok());
    let mut out = Response::new(full(Bytes::new()));
    let headers = out.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static(status));
    if let Some(m) = message {
        headers.insert("grpc-message", m);
    }
    out
}

/// The text of a local answer.
#[derive(Clone, Copy, Debug)]
struct LocalText(&'static str);

/// A local answer with a text body.
fn local(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.extensions_mut().insert(Local);
    resp.extensions_mut().insert(LocalText(body));
    if !body.is_empty() {
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    }
    resp
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed_unsync()
}

/// What a chosen backend resolved to.
struct Target {
    destination: Arc<Destination>,
    port: Port,
}

async fn answer(
    shared: &Arc<Shared>,
    downstream: &Downstream,
    conflict: &AtomicBool,
    mut req: Request<Incoming>,
    request_body: &Arc<AtomicU64>,
) -> Response<Body> {
    if req.version() == Version::HTTP_11
        && conflict.load(Ordering::Relaxed)
        && req.headers().contains_key(header::TRANSFER_ENCODING)
    {
        return local(StatusCode::BAD_REQUEST, "Content-Length and Transfer-Encoding in one request");
    }
    let snapshot = shared.config.load_full();
    let Some((destination, port)) = snapshot.bound(downstream.addr) else {
        return local(StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream");
    };
    let upgrade = Upgrade::requested(&mut req);
    let (mut parts, body) = req.into_parts();
    let authority = authority(&parts);
    if let Some(refusal) = authorize(shared, downstream, &destination, &parts, &authority) {
        return refusal;
    }
    let (route, prefix) = match route::select(&destination.routes, port.port, &parts) {
        Some((r, p)) => (Some(r.clone()), p.map(str::to_owned)),
        None if destination.routes.iter().any(|r| r.port.is_none_or(|p| p == port.port)) => {
            return local(StatusCode::NOT_FOUND, "");
        }
        None => (None, None),
    };
    // The route's filters first (a redirect needs no backend), then its backend's.
    let mut response_modifiers: Vec<HeaderModifier> = Vec::new();
    let mut mirrors: Vec<Mirror> = Vec::new();
    let route_filters = route.as_deref().map(|r| r.filters.as_slice()).unwrap_or_default();
    if let Some(resp) = apply_filters(
        route_filters,
        &mut parts,
        &authority,
        prefix.as_deref(),
        &mut response_modifiers,
        &mut mirrors,
    ) {
        return resp;
    }
    // The route's backend, or the destination itself on this port.
    let backend = match &route {
        Some(r) => match pick_backend(&r.backends) {
            Some(b) => b.clone(),
            None => return local(StatusCode::INTERNAL_SERVER_ERROR, "no valid backend"),
        },
        None => {
            Backend { destination: destination.resource.clone(), port: port.port, weight: 1, filters: vec![] }
        }
    };
    let Some(target) = resolve(&snapshot, &backend, &port) else {
        return local(StatusCode::INTERNAL_SERVER_ERROR, "no valid backend");
    };
    if let Some(resp) = apply_filters(
        &backend.filters,
        &mut parts,
        &authority,
        prefix.as_deref(),
        &mut response_modifiers,
        &mut mirrors,
    ) {
        return resp;
    }
    prepare_upstream_headers(&mut parts.headers, downstream);
    if let Some(u) = &upgrade {
        u.restore(&mut parts.headers);
    }
    let route = route.as_deref();
    let retries = route.map_or(Retry::istio_default().attempts, |r| r.retry.attempts);
    let want = retries > 0 || !mirrors.is_empty();
    let body = Replay::new(body, want, shared.settings.limits.max_replay_body, request_body).await;
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(error = %e, "request body failed");
            return local(StatusCode::BAD_REQUEST, "request body failed");
        }
    };
    for m in &mirrors {
        mirror(shared, &snapshot, m, &parts, &body, &port);
    }
    let mut resp = attempts(shared, route, &target, &parts, body, upgrade).await;
    for m in &response_modifiers {
        modify_headers(resp.headers_mut(), m);
    }
    resp
}

/// Applies request filters in order; a redirect ends the request with its answer. Response
/// header changes and mirrors are collected for later.
fn apply_filters(
    filters: &[Filter],
    parts: &mut Parts,
    authority: &str,
    prefix: Option<&str>,
    response_modifiers: &mut Vec<HeaderModifier>,
    mirrors: &mut Vec<Mirror>,
) -> Option<Response<Body>> {
    for f in filters {
        match f {
            Filter::Redirect(r) => {
                let mut resp = local(r.status, "");
                if let Some(location) = route::redirect_location(parts, authority, r, prefix) {
                    resp.headers_mut().insert(header::LOCATION, location);
                }
                return Some(resp);
            }
            Filter::RequestHeaders(m) => modify_headers(&mut parts.headers, m),
            Filter::ResponseHeaders(m) => response_modifiers.push(m.clone()),
            Filter::Rewrite(r) => route::rewrite(parts, r, prefix),
            Filter::Mirror(m) => mirrors.push(m.clone()),
        }
    }
    None
}

/// `:authority`, or `Host` for HTTP/1.1.
fn authority(parts: &Parts) -> String {
    parts
        .uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| parts.headers.get(HOST).and_then(|h| h.to_str().ok()).map(str::to_owned))
        .unwrap_or_default()
}

/// The destination's policies on the request: the refusal when there is one, 403 `RBAC: access
/// denied` when denied (counted with the denying policy), 400 for a path that cannot be
/// normalized.
fn authorize(
    shared: &Shared,
    downstream: &Downstream,
    destination: &Destination,
    parts: &Parts,
    authority: &str,
) -> Option<Response<Body>> {
    let source_ip = downstream.source.ip;
    let request = authz::Request {
        method: parts.method.as_str(),
        authority,
        path: parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        headers: &parts.headers,
        source_principal: downstream.source.principal.as_deref(),
        source_ip,
        remote_ip: remote_ip(source_ip, &parts.headers, shared.settings.num_trusted_proxies),
        destination_ip: downstream.addr.ip(),
        destination_port: downstream.addr.port(),
        sni: None,
    };
    match destination.policies.authorize(&request) {
        Err(e) => {
            tracing::debug!(error = %e, "request path cannot be normalized; answered 400");
            Some(local(StatusCode::BAD_REQUEST, "invalid path"))
        }
        Ok(verdict) => match verdict.decision {
            Decision::Allow => None,
            Decision::Deny { policy, reason } => {
                tracing::debug!(?policy, %reason, principal = ?downstream.source.principal, "request denied");
                shared.counters.denial(policy.as_deref());
                let mut resp = local(StatusCode::FORBIDDEN, "RBAC: access denied");
                let allow_policies = match policy {
                    Some(_) => Vec::new(),
                    None => destination
                        .policies
                        .policies()
                        .iter()
                        .filter(|p| p.action == authz::Action::Allow)
                        .map(authz::Policy::key)
                        .collect(),
                };
                let details = access::denied_details(policy.as_deref());
                resp.extensions_mut().insert(Denied { details, allow_policies });
                Some(resp)
            }
        },
    }
}

/// The backend's destination and port; a port the destination does not list is used as given,
/// with the protocol of the port the request came in on.
fn resolve(snapshot: &Snapshot, backend: &Backend, incoming: &Port) -> Option<Target> {
    let destination = snapshot.destination(&backend.destination)?.clone();
    let port = destination.port(backend.port).cloned().unwrap_or(Port {
        port: backend.port,
        target_port: backend.port,
        protocol: incoming.protocol,
        name: String::new(),
    });
    Some(Target { destination, port })
}

fn prepare_upstream_headers(headers: &mut HeaderMap, downstream: &Downstream) {
    // `te: trailers` is end-to-end in practice: gRPC servers require it.
    let trailers = headers.get_all(header::TE).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    // Headers the `Connection` header names are hop-by-hop too.
    let named: Vec<http::HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| http::HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    // The source's address is formatted once per connection (`Source::ip_header`).
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => HeaderValue::from_str(&format!("{prev},{}", downstream.source.ip)).ok(),
        None => Some(downstream.source.ip_header.clone()),
    };
    if let Some(v) = xff {
        headers.insert("x-forwarded-for", v);
    }
    if !headers.contains_key("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
    if !headers.contains_key("x-request-id")
        && let Ok(v) = HeaderValue::from_bytes(&uuid_v4())
    {
        headers.insert("x-request-id", v);
    }
}

/// A random (version 4) UUID in its text form, written without allocating.
fn uuid_v4() -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut out = [b'-'; 36];
    let mut j = 0;
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            j += 1;
        }
        out[j] = HEX[usize::from(x >> 4)];
        out[j + 1] = HEX[usize::from(x & 0x0f)];
        j += 2;
    }
    out
}

/// A request body that can be sent again (buffered) or only once (streamed); either way its
/// bytes are counted for `istio_request_bytes`.
enum Replay {
    Buffered(Bytes),
    Once(Option<Counting<Incoming>>),
}

impl Replay {
    /// Buffers `body` when `want` and it is known to fit in `limit` bytes.
    async fn new(
        body: Incoming,
        want: bool,
        limit: usize,
        read: &Arc<AtomicU64>,
    ) -> Result<Replay, hyper::Error> {
        let fits = body.size_hint().upper().is_some_and(|n| n <= limit as u64);
        let body = Counting::new(body, read.clone());
        if want && fits {
            Ok(Replay::Buffered(body.collect().await?.to_bytes()))
        } else {
            Ok(Replay::Once(Some(body)))
        }
    }

    fn replayable(&self) -> bool {
        matches!(self, Replay::Buffered(_))
    }

    /// The body for the next attempt; `None` once a streamed body was sent.
    fn take(&mut self) -> Option<Body> {
        match self {
            Replay::Buffered(b) => Some(full(b.clone())),
            Replay::Once(b) => b.take().map(|b| b.map_err(BoxError::from).boxed_unsync()),
        }
    }
}

/// The request for one attempt: origin-form for HTTP/1.1 (with `Host`), absolute for HTTP/2.
fn upstream_request(parts: &Parts, body: Body, h2: bool) -> Option<Request<Body>> {
    let authority = authority(parts);
    let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut builder = Request::builder().method(parts.method.clone());
    let uri: Uri = if h2 {
        builder = builder.version(Version::HTTP_2);
        format!("http://{authority}{pq}").parse().ok()?
    } else {
        pq.parse().ok()?
    };
    let mut req = builder.uri(uri).body(body).ok()?;
    *req.headers_mut() = parts.headers.clone();
    if h2 {
        req.headers_mut().remove(HOST);
    } else if !req.headers().contains_key(HOST)
        && let Ok(v) = HeaderValue::from_str(&authority)
    {
        req.headers_mut().insert(HOST, v);
    }
    Some(req)
}

/// Whether requests to `port` go out as HTTP/2.
fn upstream_h2(port: &Port, route: Option<&Route>, downstream: Version) -> bool {
    match port.protocol {
        Protocol::Http2 | Protocol::Grpc => true,
        Protocol::Http => false,
        Protocol::Undeclared | Protocol::Tcp => {
            route.is_some_and(|r| r.grpc) || downstream == Version::HTTP_2
        }
    }
}

/// The attempts of one request: each to a healthy endpoint (another one on a retry), within the
/// per-attempt and the total timeouts; retried on a failure before a response or a listed
/// status while attempts remain and the body can be sent again.
async fn attempts(
    shared: &Arc<Shared>,
    route: Option<&Route>,
    target: &Target,
    parts: &Parts,
    mut body: Replay,
    mut upgrade: Option<Upgrade>,
) -> Response<Body> {
    // An upgrade is HTTP/1.1's.
    let h2 = upgrade.is_none() && upstream_h2(&target.port, route, parts.version);
    let deadline = route.and_then(|r| r.request_timeout).map(|t| Instant::now() + t);
    let retry = route.map_or_else(Retry::istio_default, |r| r.retry.clone());
    let attempts = if body.replayable() { 1 + retry.attempts } else { 1 };
    let mut previous = None;
    let mut last_failure = local(StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream");
    for attempt in 0..attempts {
        if attempt > 0 {
            shared.counters.retry();
            if !retry.backoff.is_zero() {
                tokio::time::sleep(retry.backoff).await;
            }
        }
        let Some(endpoint) = pick_endpoint(&target.destination, shared.settings.balance, previous.as_ref())
        else {
            return local(StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream");
        };
        let Some(b) = body.take() else { break };
        let Some(req) = upstream_request(parts, b, h2) else {
            return local(StatusCode::BAD_REQUEST, "invalid request target");
        };
        let now = Instant::now();
        let limit = match (route.and_then(|r| r.attempt_timeout), deadline) {
            (Some(t), Some(d)) => Some(t.min(d.saturating_duration_since(now))),
            (Some(t), None) => Some(t),
            (None, Some(d)) => Some(d.saturating_duration_since(now)),
            (None, None) => None,
        };
        let active = Active::new(endpoint.clone());
        let port = endpoint.target_port(&target.port);
        let send = shared.upstream.send(&endpoint, port, h2, req);
        let result = match limit {
            Some(l) => tokio::time::timeout(l, send).await.ok(),
            None => Some(send.await),
        };
        match result {
            None => {
                shared.counters.timeout();
                last_failure = local(StatusCode::GATEWAY_TIMEOUT, "upstream request timeout");
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "upstream attempt failed");
                last_failure = local(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upstream connect error or disconnect/reset before headers",
                );
            }
            Some(Ok(mut resp)) => {
                if let Some(headers) = upgrade.take().and_then(|u| u.splice(&mut resp)) {
                    let mut switched = downstream_response(resp, active, None);
                    switched.headers_mut().extend(headers);
                    return switched;
                }
                let status = resp.status().as_u16();
                let grpc_retriable =
                    retry.grpc && resp.headers().get("grpc-status").is_some_and(|s| s == "14" || s == "1");
                if attempt + 1 < attempts && (retry.codes.contains(&status) || grpc_retriable) {
                    tracing::debug!(status, grpc_retriable, "retrying a listed status");
                    previous = Some(endpoint);
                    last_failure = downstream_response(resp, active, deadline);
                    continue;
                }
                return downstream_response(resp, active, deadline);
            }
        }
        previous = Some(endpoint);
    }
    last_failure
}

/// The endpoint's response, its body holding the in-flight count and the total deadline.
fn downstream_response(
    resp: Response<Incoming>,
    active: Active,
    deadline: Option<Instant>,
) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    parts.extensions.insert(ServedBy(active.endpoint().clone()));
    Response::from_parts(parts, UpstreamBody::new(body, active, deadline).boxed_unsync())
}

/// Sends a copy of the request to the mirror's destination, fire and forget (its answer is
/// read and dropped); only buffered bodies are mirrored. `Host` gets Envoy's `-shadow` suffix.
fn mirror(
    shared: &Arc<Shared>,
    snapshot: &Snapshot,
    m: &Mirror,
    parts: &Parts,
    body: &Replay,
    incoming: &Port,
) {
    let Replay::Buffered(bytes) = body else { return };
    if m.percent < 100 && rand::rng().random_range(0..100) >= m.percent {
        return;
    }
    let backend = Backend { destination: m.destination.clone(), port: m.port, weight: 1, filters: vec![] };
    let Some(target) = resolve(snapshot, &backend, incoming) else { return };
    let Some(endpoint) = pick_endpoint(&target.destination, shared.settings.balance, None) else { return };
    let mut parts = parts.clone();
    let shadow = format!("{}-shadow", authority(&parts));
    if let Ok(v) = HeaderValue::from_str(&shadow) {
        parts.headers.insert(HOST, v);
        parts.uri = parts.uri.path_and_query().and_then(|pq| pq.as_str().parse().ok()).unwrap_or_default();
    }
    let h2 = upstream_h2(&target.port, None, parts.version);
    let Some(req) = upstream_request(&parts, full(bytes.clone()), h2) else { return };
    let (upstream, port) = (shared.upstream.clone(), endpoint.target_port(&target.port));
    tokio::spawn(async move {
        let timeout = Duration::from_secs(30);
        if let Ok(Ok(resp)) = tokio::time::timeout(timeout, upstream.send(&endpoint, port, h2, req)).await {
            let _ = tokio::time::timeout(timeout, resp.into_body().collect()).await;
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids_are_version_4_uuids() {
        let a = super::uuid_v4();
        let text = std::str::from_utf8(&a).expect("ascii");
        let groups: Vec<&str> = text.split('-').collect();
        assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12], "{text}");
        assert!(
            text.bytes().all(|c| c == b'-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{text}"
        );
        assert_eq!(&groups[2][..1], "4", "{text}");
        assert!(matches!(&groups[3][..1], "8" | "9" | "a" | "b"), "{text}");
        assert_ne!(super::uuid_v4(), a);
    }
}
