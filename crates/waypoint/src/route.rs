//! Per-request routing: the first matching route rule, its filters, the weighted backend choice
//! and the endpoint load balancing.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::header::HOST;
use http::{HeaderMap, HeaderValue, Uri, request::Parts};
use rand::Rng;

use crate::config::{
    Backend, Destination, Endpoint, HeaderModifier, Match, PathMatch, PathRewrite, Redirect, Rewrite, Route,
    StringMatch,
};

/// How a request's endpoint is chosen among a destination's healthy endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    /// Each in turn.
    RoundRobin,
    /// The less busy of two picked at random (Envoy's LEAST_REQUEST, Istio's default).
    #[default]
    LeastRequest,
}

/// The first route for `port` whose matches take the request (a route without matches takes
/// every request), with the path prefix it matched (for prefix rewrites).
pub(crate) fn select<'r>(
    routes: &'r [Arc<Route>],
    port: u16,
    parts: &Parts,
) -> Option<(&'r Arc<Route>, Option<&'r str>)> {
    routes.iter().filter(|r| r.port.is_none_or(|p| p == port)).find_map(|r| {
        if r.matches.is_empty() {
            return Some((r, None));
        }
        r.matches.iter().find(|m| matches(m, parts)).map(|m| {
            let prefix = match &m.path {
                Some(PathMatch::Prefix(p)) => Some(p.as_str()),
                _ => None,
            };
            (r, prefix)
        })
    })
}

fn matches(m: &Match, parts: &Parts) -> bool {
    let path = parts.uri.path();
    let path_ok = match &m.path {
        None => true,
        Some(PathMatch::Exact(p)) => path == p,
        Some(PathMatch::Prefix(p)) => prefix_matches(p, path),
        Some(PathMatch::Regex(r)) => r.is_match(path),
    };
    path_ok
        && m.method.as_ref().is_none_or(|method| *method == parts.method)
        && m.headers
            .iter()
            .all(|(name, value)| joined(&parts.headers, name).is_some_and(|v| value.matches(&v)))
        && m.query.iter().all(|(name, value)| query_value(&parts.uri, name).is_some_and(|v| value.matches(v)))
}

/// Gateway API `PathPrefix`: element-wise, so `/a` matches `/a`, `/a/` and `/a/b`, not `/ab`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/" || path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

impl StringMatch {
    fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(e) => value == e,
            StringMatch::Regex(r) => r.is_match(value),
        }
    }
}

/// All values of a header joined with `,` (Envoy's header matching), `None` when absent.
fn joined(headers: &HeaderMap, name: &http::HeaderName) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    let mut out = String::from_utf8_lossy(values.next()?.as_bytes()).into_owned();
    for v in values {
        out.push(',');
        out.push_str(&String::from_utf8_lossy(v.as_bytes()));
    }
    Some(out)
}

/// The first value of query parameter `name` (as sent, not percent-decoded).
fn query_value<'u>(uri: &'u Uri, name: &str) -> Option<&'u str> {
    uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

/// A backend by weight; `None` when there is none with a weight above 0.
pub(crate) fn pick_backend(backends: &[Backend]) -> Option<&Backend> {
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut at = rand::rng().random_range(0..total);
    for b in backends {
        let w = u64::from(b.weight);
        if at < w {
            return Some(b);
        }
        at -= w;
    }
    None
}

/// A healthy endpoint of `destination`, other than `avoid` when there is another (a retry goes
/// to a different endpoint, as Istio's `previous_hosts` retry predicate does).
pub(crate) fn pick_endpoint(
    destination: &Destination,
    balance: Balance,
    avoid: Option<&Arc<Endpoint>>,
) -> Option<Arc<Endpoint>> {
    let healthy: Vec<&Arc<Endpoint>> = destination.endpoints.iter().filter(|e| e.healthy).collect();
    let candidates: Vec<&Arc<Endpoint>> = match avoid {
        Some(a) if healthy.len() > 1 => healthy.iter().copied().filter(|e| !Arc::ptr_eq(e, a)).collect(),
        _ => healthy,
    };
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0].clone()),
        n => match balance {
            Balance::RoundRobin => {
                let i = destination.cursor.fetch_add(1, Ordering::Relaxed);
                Some(candidates[i % n].clone())
            }
            Balance::LeastRequest => {
                let mut rng = rand::rng();
                let a = rng.random_range(0..n);
                let b = (a + rng.random_range(1..n)) % n;
                let (a, b) = (candidates[a], candidates[b]);
                Some(if b.active() < a.active() { b.clone() } else { a.clone() })
            }
        },
    }
}

/// Applies a header modifier: set replaces, add appends, remove removes.
pub(crate) fn modify_headers(headers: &mut HeaderMap, m: &HeaderModifier) {
    for (name, value) in &m.set {
        headers.insert(name.clone(), value.clone());
    }
    for (name, value) in &m.add {
        headers.append(name.clone(), value.clone());
    }
    for name in &m.remove {
        headers.remove(name);
    }
}

/// The path after a rewrite: the whole path, or the matched prefix replaced (query kept).
fn rewritten_path(uri: &Uri, rewrite: &PathRewrite, matched_prefix: Option<&str>) -> String {
    let path = uri.path();
    let new_path = match rewrite {
        PathRewrite::Full(p) => p.clone(),
        PathRewrite::Prefix(p) => {
            let rest =
                matched_prefix.filter(|m| *m != "/").and_then(|m| path.strip_prefix(m)).unwrap_or(path);
            let rest = rest.trim_start_matches('/');
            let base = p.trim_end_matches('/');
            if rest.is_empty() {
                if base.is_empty() { "/".into() } else { base.to_owned() }
            } else {
                format!("{base}/{rest}")
            }
        }
    };
    match uri.query() {
        Some(q) => format!("{new_path}?{q}"),
        None => new_path,
    }
}

/// Applies a URL rewrite to the request head.
pub(crate) fn rewrite(parts: &mut Parts, r: &Rewrite, matched_prefix: Option<&str>) {
    if let Some(host) = &r.hostname {
        parts.headers.insert(HOST, host.clone());
    }
    if let Some(path) = &r.path {
        let new = rewritten_path(&parts.uri, path, matched_prefix);
        if let Ok(pq) = new.parse::<http::uri::PathAndQuery>() {
            let mut uri = std::mem::take(&mut parts.uri).into_parts();
            uri.path_and_query = Some(pq);
            parts.uri = Uri::from_parts(uri).unwrap_or_default();
        }
    }
}

/// The `Location` of a redirect of the request `parts` (sent to `host`).
pub(crate) fn redirect_location(
    parts: &Parts,
    host: &str,
    r: &Redirect,
    matched_prefix: Option<&str>,
) -> Option<HeaderValue> {
    let scheme = r.scheme.as_deref().unwrap_or("http");
    let (host_only, port) = split_host(host);
    let hostname = r.hostname.as_deref().unwrap_or(host_only);
    let port = r.port.or(if r.hostname.is_some() || r.scheme.is_some() { None } else { port });
    let default = if scheme == "https" { 443 } else { 80 };
    let authority = match port {
        Some(p) if p != default => format!("{hostname}:{p}"),
        _ => hostname.to_owned(),
    };
    let path = match &r.path {
        Some(p) => rewritten_path(&parts.uri, p, matched_prefix),
        None => parts.uri.path_and_query().map(|pq| pq.as_str().to_owned()).unwrap_or_else(|| "/".into()),
    };
    HeaderValue::from_str(&format!("{scheme}://{authority}{path}")).ok()
}

/// `host[:port]` (an IPv6 literal in brackets) → host and port.
fn split_host(host: &str) -> (&str, Option<u16>) {
    match host.rsplit_once(':') {
        Some((h, p)) if h.ends_with(']') || !h.contains(':') => match p.parse() {
            Ok(port) => (h, Some(port)),
            Err(_) => (host, None),
        },
        _ => (host, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> Parts {
        let (parts, ()) = http::Request::get(uri).body(()).expect("request").into_parts();
        parts
    }

    #[test]
    fn path_prefix_is_element_wise() {
        assert!(prefix_matches("/a", "/a"));
        assert!(prefix_matches("/a", "/a/"));
        assert!(prefix_matches("/a", "/a/b"));
        assert!(!prefix_matches("/a", "/ab"));
        assert!(prefix_matches("/", "/anything"));
    }

    #[test]
    fn prefix_rewrites_replace_the_matched_elements() {
        let p = PathRewrite::Prefix("/v2".into());
        assert_eq!(rewritten_path(&"/v1/users?x=1".parse().expect("uri"), &p, Some("/v1")), "/v2/users?x=1");
        assert_eq!(rewritten_path(&"/v1".parse().expect("uri"), &p, Some("/v1")), "/v2");
        let root = PathRewrite::Prefix("/".into());
        assert_eq!(rewritten_path(&"/v1/users".parse().expect("uri"), &root, Some("/v1")), "/users");
    }

    fn destination(n: usize) -> Destination {
        let endpoints = (0..n)
            .map(|i| {
                Arc::new(Endpoint {
                    address: std::net::IpAddr::from([10, 0, 0, i as u8]),
                    identity: None,
                    tunnel: crate::config::Tunnel::None,
                    ports: Default::default(),
                    healthy: true,
                    uid: String::new(),
                    workload_name: String::new(),
                    namespace: String::new(),
                    active: Default::default(),
                })
            })
            .collect();
        Destination {
            resource: "d".into(),
            kind: crate::config::DestinationKind::Service,
            name: "d".into(),
            namespace: "ns".into(),
            hostname: String::new(),
            bound: false,
            addresses: vec![],
            ports: vec![],
            endpoints,
            routes: vec![],
            policies: Default::default(),
            subject_alt_names: vec![],
            cursor: Default::default(),
        }
    }

    #[test]
    fn least_request_prefers_the_idler_endpoint_and_retries_avoid_the_last_one() {
        let d = destination(2);
        d.endpoints[0].active.store(5, Ordering::Relaxed);
        for _ in 0..50 {
            let e = pick_endpoint(&d, Balance::LeastRequest, None).expect("an endpoint");
            assert!(Arc::ptr_eq(&e, &d.endpoints[1]));
        }
        let d = destination(3);
        for _ in 0..50 {
            let e = pick_endpoint(&d, Balance::RoundRobin, Some(&d.endpoints[0])).expect("an endpoint");
            assert!(!Arc::ptr_eq(&e, &d.endpoints[0]));
        }
        // One endpoint: a retry goes to it again rather than nowhere.
        let d = destination(1);
        assert!(pick_endpoint(&d, Balance::LeastRequest, Some(&d.endpoints[0])).is_some());
    }

    #[test]
    fn query_values_are_found_by_exact_name() {
        let p = parts("/x?a=1&bb=2&b=3");
        assert_eq!(query_value(&p.uri, "b"), Some("3"));
        assert_eq!(query_value(&p.uri, "c"), None);
    }
}
