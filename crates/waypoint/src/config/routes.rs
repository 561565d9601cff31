//! Route rules (HTTPRoute, GRPCRoute) as typed values, parsed from their resources: regular
//! expressions compiled with size limits, header names and values checked, ports in range.

use std::time::Duration;

use ambit_api::waypoint as api;
use http::{HeaderName, HeaderValue, Method};
use regex::Regex;

use super::{MAX_REGEX_LEN, MAX_RETRIES, REGEX_SIZE_LIMIT, port_number};

/// One HTTPRoute or GRPCRoute rule.
#[derive(Debug)]
pub struct Route {
    /// `<namespace>/<route>#<n>`.
    pub name: String,
    /// The port it applies to (`None`: every port).
    pub port: Option<u16>,
    /// OR-ed; none matches every request.
    pub matches: Vec<Match>,
    /// Applied in order.
    pub filters: Vec<Filter>,
    /// Weighted; none (or all weights 0) answers 500.
    pub backends: Vec<Backend>,
    /// The whole request, retries included.
    pub request_timeout: Option<Duration>,
    /// One attempt.
    pub attempt_timeout: Option<Duration>,
    /// Retries.
    pub retry: Retry,
    /// A GRPCRoute.
    pub grpc: bool,
}

/// All set fields must match.
#[derive(Debug, Default)]
pub struct Match {
    /// The path.
    pub path: Option<PathMatch>,
    /// Headers.
    pub headers: Vec<(HeaderName, StringMatch)>,
    /// Query parameters (names exact).
    pub query: Vec<(String, StringMatch)>,
    /// The method.
    pub method: Option<Method>,
}

/// A path match.
#[derive(Debug)]
pub enum PathMatch {
    /// The whole path.
    Exact(String),
    /// Gateway API `PathPrefix`: element-wise.
    Prefix(String),
    /// A regular expression matching the whole path.
    Regex(Regex),
}

/// A header or query value match.
#[derive(Debug)]
pub enum StringMatch {
    /// The whole value.
    Exact(String),
    /// A regular expression matching the whole value.
    Regex(Regex),
}

/// A route or backend filter.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Request header changes.
    RequestHeaders(HeaderModifier),
    /// Response header changes.
    ResponseHeaders(HeaderModifier),
    /// Host and path rewrite.
    Rewrite(Rewrite),
    /// Answer with a redirect.
    Redirect(Redirect),
    /// Copy the request to another destination, fire and forget.
    Mirror(Mirror),
}

/// Header changes: set (replace), add (append), remove.
#[derive(Debug, Clone, Default)]
pub struct HeaderModifier {
    /// Replaced.
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Appended.
    pub add: Vec<(HeaderName, HeaderValue)>,
    /// Removed.
    pub remove: Vec<HeaderName>,
}

/// A path rewrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRewrite {
    /// The whole path.
    Full(String),
    /// The matched prefix.
    Prefix(String),
}

/// A URL rewrite.
#[derive(Debug, Clone, Default)]
pub struct Rewrite {
    /// The new `Host`/`:authority`.
    pub hostname: Option<HeaderValue>,
    /// The new path.
    pub path: Option<PathRewrite>,
}

/// A redirect answer.
#[derive(Debug, Clone)]
pub struct Redirect {
    /// `http` or `https`.
    pub scheme: Option<String>,
    /// The new host.
    pub hostname: Option<String>,
    /// The new path.
    pub path: Option<PathRewrite>,
    /// The new port.
    pub port: Option<u16>,
    /// 301 or 302.
    pub status: http::StatusCode,
}

/// A request mirror.
#[derive(Debug, Clone)]
pub struct Mirror {
    /// A destination resource name.
    pub destination: String,
    /// Its port.
    pub port: u16,
    /// Percent of requests mirrored (0–100).
    pub percent: u32,
}

/// One weighted backend of a route.
#[derive(Debug, Clone)]
pub struct Backend {
    /// A destination resource name.
    pub destination: String,
    /// Its port.
    pub port: u16,
    /// Relative weight.
    pub weight: u32,
    /// Filters for requests sent to this backend.
    pub filters: Vec<Filter>,
}

/// Retries of a route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retry {
    /// Retries after the first attempt.
    pub attempts: u32,
    /// Statuses retried (connect failures and resets always are).
    pub codes: Vec<u16>,
    /// Wait between attempts.
    pub backoff: Duration,
    /// gRPC answers `UNAVAILABLE` (14) and `CANCELLED` (1) with the status in the head
    /// (trailers-only) are retried too: Envoy's `unavailable` and `cancelled`.
    pub grpc: bool,
}

impl Retry {
    /// What Istio gives a route that sets no retry policy (its mesh default,
    /// `defaultHttpRetryPolicy`): 2 retries, of connection failures, refused streams, 503s and
    /// gRPC `UNAVAILABLE`/`CANCELLED` (`retryOn: connect-failure,refused-stream,unavailable,
    /// cancelled,retriable-status-codes`), each on another endpoint, after Envoy's 25 ms base
    /// interval. A route that sets one (even
    /// `attempts: 0`) gets what it sets.
    pub fn istio_default() -> Retry {
        Retry { attempts: 2, codes: vec![503], backoff: Duration::from_millis(25), grpc: true }
    }
}

/// A regular expression that must match a whole value, with size limits.
fn regex(pattern: &str) -> Result<Regex, String> {
    if pattern.len() > MAX_REGEX_LEN {
        return Err(format!("regular expression of {} bytes (at most {MAX_REGEX_LEN})", pattern.len()));
    }
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .nest_limit(64)
        .build()
        .map_err(|e| format!("regular expression {pattern:?}: {e}"))
}

fn string_match(kind: &Option<api::value_match::Kind>) -> Result<StringMatch, String> {
    match kind {
        Some(api::value_match::Kind::Exact(v)) => Ok(StringMatch::Exact(v.clone())),
        Some(api::value_match::Kind::Regex(r)) => regex(r).map(StringMatch::Regex),
        None => Err("a value match without a value".into()),
    }
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a header name"))
}

fn header_value(value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value).map_err(|_| format!("{value:?} is not a header value"))
}

fn parse_match(m: &api::Match) -> Result<Match, String> {
    let path = match m.path.as_ref().and_then(|p| p.kind.as_ref()) {
        None => None,
        Some(api::path_match::Kind::Exact(p)) => Some(PathMatch::Exact(p.clone())),
        Some(api::path_match::Kind::Prefix(p)) => {
            // `/a/` and `/a` are the same prefix element-wise.
            let trimmed = p.trim_end_matches('/');
            Some(PathMatch::Prefix(if trimmed.is_empty() { "/".into() } else { trimmed.into() }))
        }
        Some(api::path_match::Kind::Regex(r)) => Some(PathMatch::Regex(regex(r)?)),
    };
    let headers = m
        .headers
        .iter()
        .map(|h| Ok((header_name(&h.name)?, string_match(&h.kind)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let query = m
        .query_params
        .iter()
        .map(|q| Ok((q.name.clone(), string_match(&q.kind)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let method = if m.method.is_empty() {
        None
    } else {
        Some(Method::from_bytes(m.method.as_bytes()).map_err(|_| format!("{:?} is not a method", m.method))?)
    };
    Ok(Match { path, headers, query, method })
}

fn modifier(m: &api::HeaderModifier) -> Result<HeaderModifier, String> {
    let pairs = |list: &[api::Header]| {
        list.iter()
            .map(|h| Ok((header_name(&h.name)?, header_value(&h.value)?)))
            .collect::<Result<Vec<_>, String>>()
    };
    Ok(HeaderModifier {
        set: pairs(&m.set)?,
        add: pairs(&m.add)?,
        remove: m.remove.iter().map(|n| header_name(n)).collect::<Result<Vec<_>, _>>()?,
    })
}

fn parse_filter(f: &api::Filter) -> Result<Filter, String> {
    use api::filter::Kind;
    match &f.kind {
        Some(Kind::RequestHeaders(m)) => Ok(Filter::RequestHeaders(modifier(m)?)),
        Some(Kind::ResponseHeaders(m)) => Ok(Filter::ResponseHeaders(modifier(m)?)),
        Some(Kind::UrlRewrite(r)) => Ok(Filter::Rewrite(Rewrite {
            hostname: (!r.hostname.is_empty()).then(|| header_value(&r.hostname)).transpose()?,
            path: match &r.path {
                None => None,
                Some(api::rewrite::Path::FullPath(p)) => Some(PathRewrite::Full(p.clone())),
                Some(api::rewrite::Path::Prefix(p)) => Some(PathRewrite::Prefix(p.clone())),
            },
        })),
        Some(Kind::Redirect(r)) => Ok(Filter::Redirect(Redirect {
            scheme: match r.scheme.as_str() {
                "" => None,
                "http" | "https" => Some(r.scheme.clone()),
                other => return Err(format!("redirect scheme {other:?} (http or https)")),
            },
            hostname: (!r.hostname.is_empty()).then(|| r.hostname.clone()),
            path: match &r.path {
                None => None,
                Some(api::redirect::Path::FullPath(p)) => Some(PathRewrite::Full(p.clone())),
                Some(api::redirect::Path::Prefix(p)) => Some(PathRewrite::Prefix(p.clone())),
            },
            port: (r.port != 0).then(|| port_number(r.port, "redirect port")).transpose()?,
            status: match r.status_code {
                0 | 302 => http::StatusCode::FOUND,
                301 => http::StatusCode::MOVED_PERMANENTLY,
                other => return Err(format!("redirect status {other} (301 or 302)")),
            },
        })),
        Some(Kind::Mirror(m)) => Ok(Filter::Mirror(Mirror {
            destination: m.destination.clone(),
            port: port_number(m.port, "mirror port")?,
            percent: if m.percent == 0 { 100 } else { m.percent.min(100) },
        })),
        None => Err("a filter without a kind".into()),
    }
}

fn millis(ms: u32) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(u64::from(ms)))
}

pub(super) fn parse_route(r: &api::Route) -> Result<Route, String> {
    let port = if r.port == 0 { None } else { Some(port_number(r.port, "port")?) };
    let backends = r
        .backends
        .iter()
        .map(|b| {
            Ok(Backend {
                destination: b.destination.clone(),
                port: port_number(b.port, "backend port")?,
                weight: b.weight,
                filters: b.filters.iter().map(parse_filter).collect::<Result<Vec<_>, _>>()?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let retry = match &r.retry {
        None => Retry::istio_default(),
        Some(retry) => Retry {
            attempts: retry.attempts.min(MAX_RETRIES),
            codes: retry
                .codes
                .iter()
                .map(|c| match u16::try_from(*c) {
                    Ok(c) if (100..600).contains(&c) => Ok(c),
                    _ => Err(format!("retry code {c} is not an HTTP status")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            backoff: Duration::from_millis(u64::from(retry.backoff_ms)),
            grpc: false,
        },
    };
    Ok(Route {
        name: r.name.clone(),
        port,
        matches: r.matches.iter().map(parse_match).collect::<Result<Vec<_>, _>>()?,
        filters: r.filters.iter().map(parse_filter).collect::<Result<Vec<_>, _>>()?,
        backends,
        request_timeout: millis(r.request_timeout_ms),
        attempt_timeout: millis(r.backend_request_timeout_ms),
        retry,
        grpc: r.grpc,
    })
}
