//! HTTPRoute and GRPCRoute → the `routes` of a waypoint's Service Destinations, in Gateway API
//! precedence order, with their backends (which become Destinations too).
//!
//! Invalid references are never dropped: a backend that cannot be used becomes a Backend with
//! an empty destination (its share answers 500, as the Gateway API requires) and a
//! [`ConfigError`]; a match whose regular expression does not compile never matches (its entry
//! is left out) and is reported.

use ambit_api::waypoint::{
    Backend, Destination, Filter, Header, HeaderModifier, Match, Mirror, PathMatch, Redirect, Retry, Rewrite,
    Route, ValueMatch, filter, path_match, redirect, rewrite, value_match,
};
use ambit_api::workload::Service;
use ambit_objects::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use ambit_objects::route::{
    BackendRef, GrpcRoute, GrpcRouteMatch, HttpRoute, HttpRouteFilter, HttpRouteMatch, PathModifier,
};

use super::{Config, ConfigError, View, destinations, scoped};
use crate::translate::names::{self, Name};
use crate::translate::waypoints::Waypoint;

/// A route that attaches to a Service, with the parentRef's port.
struct Attached<'a> {
    name: Name,
    created: Option<&'a Time>,
    port: u32,
    route: Kind<'a>,
}

#[derive(Clone, Copy)]
enum Kind<'a> {
    Http(&'a HttpRoute),
    Grpc(&'a GrpcRoute),
}

impl Kind<'_> {
    fn name(self) -> &'static str {
        match self {
            Kind::Http(_) => "HTTPRoute",
            Kind::Grpc(_) => "GRPCRoute",
        }
    }
}

/// One entry of a Destination's `routes`, with what orders it.
struct Entry {
    rank: Rank,
    created: Option<Time>,
    route: Name,
    rule: usize,
    index: usize,
    value: Route,
}

/// Gateway API precedence of a match, higher first: path kind (exact, regex, prefix) and length,
/// method, header count, query parameter count.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Rank(u8, usize, bool, usize, usize);

/// Adds the routes of each bound Service (and the Destinations of their backends) to `config`.
pub(super) fn attach(
    view: &View<'_, '_>,
    wp_name: &Name,
    wp: &Waypoint<'_>,
    services: &[(String, &Service)],
    config: &mut Config,
) {
    for (key, s) in services {
        let attached = attached(view, wp_name, wp, s, config);
        let mut entries = Vec::new();
        for a in &attached {
            let mut rule_ctx =
                RuleCtx { view, wp: wp_name, route: &a.name, kind: a.route, config: &mut *config };
            match a.route {
                Kind::Http(r) => {
                    for (i, rule) in r.spec.rules.iter().enumerate() {
                        rule_ctx.http_rule(a, i, rule, &mut entries);
                    }
                }
                Kind::Grpc(r) => {
                    for (i, rule) in r.spec.rules.iter().enumerate() {
                        rule_ctx.grpc_rule(a, i, rule, &mut entries);
                    }
                }
            }
        }
        entries.sort_by(|a, b| {
            b.rank
                .cmp(&a.rank)
                .then_with(|| created_order(a.created.as_ref(), b.created.as_ref()))
                .then_with(|| a.route.cmp(&b.route))
                .then_with(|| (a.rule, a.index).cmp(&(b.rule, b.index)))
        });
        if let Some(d) = config.destinations.get_mut(&scoped(wp_name, key)) {
            d.routes = entries.into_iter().map(|e| e.value).collect();
        }
    }
}

/// Oldest first; a route without a timestamp after those with one.
fn created_order(a: Option<&Time>, b: Option<&Time>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(a), Some(b)) => a.0.cmp(&b.0),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

/// The routes attached to Service `s`: its own (producer routes, `parentRefs` to it from its
/// namespace), else those attached to the waypoint's Gateway that list its hostname (or none).
fn attached<'a>(
    view: &View<'_, 'a>,
    wp_name: &Name,
    wp: &Waypoint<'_>,
    s: &Service,
    config: &mut Config,
) -> Vec<Attached<'a>> {
    let store = view.ctx.store;
    let svc = Name::new(s.namespace.as_str(), s.name.as_str());
    let is_k8s = store
        .services
        .get(&svc)
        .is_some_and(|_| names::service_hostname(&svc, &view.ctx.settings.domain_suffix) == s.hostname);
    let routes = store
        .http_routes
        .iter()
        .map(|(n, r)| (n, Kind::Http(r), &r.metadata, &r.spec.parent_refs, &r.spec.hostnames))
        .chain(
            store
                .grpc_routes
                .iter()
                .map(|(n, r)| (n, Kind::Grpc(r), &r.metadata, &r.spec.parent_refs, &r.spec.hostnames)),
        );
    let mut own = Vec::new();
    let mut gateway = Vec::new();
    for (n, kind, meta, parents, hostnames) in routes {
        for (i, p) in parents.iter().enumerate() {
            let target = Name::new(p.namespace.as_deref().unwrap_or(&n.ns), p.name.as_str());
            let object = format!("{} {n}", kind.name());
            match (p.group.as_deref(), p.kind.as_deref()) {
                (Some("" | "core"), Some("Service")) if is_k8s && target == svc => {
                    if n.ns != svc.ns {
                        error(
                            config,
                            wp_name,
                            &object,
                            format!(
                                "parentRefs[{i}]: a route in namespace {} for Service {svc} is a consumer route, which waypoints do not apply",
                                n.ns
                            ),
                        );
                        continue;
                    }
                    let port = match (&p.section_name, p.port) {
                        (Some(section), _) => match service_port_named(view, &svc, section) {
                            Some(port) => port,
                            None => {
                                error(
                                    config,
                                    wp_name,
                                    &object,
                                    format!(
                                        "parentRefs[{i}]: Service {svc} has no port named {section:?}: the route is not applied to it"
                                    ),
                                );
                                continue;
                            }
                        },
                        (None, port) => port.map_or(0, u32::from),
                    };
                    own.push(Attached {
                        name: n.clone(),
                        created: meta.creation_timestamp.as_ref(),
                        port,
                        route: kind,
                    });
                }
                (None | Some("gateway.networking.k8s.io"), None | Some("Gateway")) if &target == wp_name => {
                    if !wp.accepts(view.ctx, &n.ns) {
                        error(
                            config,
                            wp_name,
                            &object,
                            format!(
                                "parentRefs[{i}]: the waypoint's listener does not allow routes from namespace {}",
                                n.ns
                            ),
                        );
                        continue;
                    }
                    if hostnames.is_empty() || hostnames.iter().any(|h| host_matches(h, &s.hostname)) {
                        gateway.push(Attached {
                            name: n.clone(),
                            created: meta.creation_timestamp.as_ref(),
                            port: 0,
                            route: kind,
                        });
                    }
                }
                _ => {}
            }
        }
    }
    if own.is_empty() { gateway } else { own }
}

/// A route hostname (exact, or `*.` wildcard) against a Service hostname.
fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.ends_with(suffix) && host.len() > suffix.len(),
        None => pattern == host,
    }
}

fn service_port_named(view: &View<'_, '_>, svc: &Name, section: &str) -> Option<u32> {
    let s = view.ctx.store.services.get(svc)?;
    let port = s.spec.as_ref()?.ports.iter().flatten().find(|p| p.name.as_deref() == Some(section))?;
    u32::try_from(port.port).ok()
}

fn error(config: &mut Config, wp: &Name, object: &str, message: String) {
    config.errors.push(ConfigError { waypoint: wp.to_string(), object: object.to_owned(), message });
}

/// What the conversion of one route's rules needs.
struct RuleCtx<'v, 'c, 'a> {
    view: &'v View<'c, 'a>,
    wp: &'v Name,
    route: &'v Name,
    kind: Kind<'a>,
    config: &'v mut Config,
}

impl RuleCtx<'_, '_, '_> {
    fn error(&mut self, message: String) {
        let object = format!("{} {}", self.kind.name(), self.route);
        error(self.config, self.wp, &object, message);
    }

    fn http_rule(
        &mut self,
        a: &Attached<'_>,
        i: usize,
        rule: &ambit_objects::route::HttpRouteRule,
        out: &mut Vec<Entry>,
    ) {
        let at = format!("rules[{i}]");
        let mut base = self.base(a, i, &rule.filters, &rule.backend_refs);
        if let Some(t) = &rule.timeouts {
            base.request_timeout_ms = self.duration(&format!("{at}.timeouts.request"), t.request.as_deref());
            base.backend_request_timeout_ms =
                self.duration(&format!("{at}.timeouts.backendRequest"), t.backend_request.as_deref());
        }
        if let Some(r) = &rule.retry {
            base.retry = Some(Retry {
                attempts: r.attempts.unwrap_or(0),
                codes: r.codes.iter().map(|c| u32::from(*c)).collect(),
                backoff_ms: self.duration(&format!("{at}.retry.backoff"), r.backoff.as_deref()),
            });
        }
        if rule.matches.is_empty() {
            self.push(a, i, 0, base, None, out);
            return;
        }
        for (m, mat) in rule.matches.iter().enumerate() {
            if let Some(converted) = self.http_match(&format!("{at}.matches[{m}]"), mat) {
                self.push(a, i, m, base.clone(), Some(converted), out);
            }
        }
    }

    fn grpc_rule(
        &mut self,
        a: &Attached<'_>,
        i: usize,
        rule: &ambit_objects::route::GrpcRouteRule,
        out: &mut Vec<Entry>,
    ) {
        let mut base = self.base(a, i, &rule.filters, &rule.backend_refs);
        base.grpc = true;
        if rule.matches.is_empty() {
            self.push(a, i, 0, base, None, out);
            return;
        }
        for (m, mat) in rule.matches.iter().enumerate() {
            if let Some(converted) = self.grpc_match(&format!("rules[{i}].matches[{m}]"), mat) {
                self.push(a, i, m, base.clone(), Some(converted), out);
            }
        }
    }

    fn push(
        &self,
        a: &Attached<'_>,
        rule: usize,
        index: usize,
        mut value: Route,
        m: Option<Match>,
        out: &mut Vec<Entry>,
    ) {
        let rank = rank(m.as_ref());
        value.matches = m.into_iter().collect();
        out.push(Entry { rank, created: a.created.cloned(), route: a.name.clone(), rule, index, value });
    }

    /// The rule without matches: name, port, filters, backends.
    fn base(
        &mut self,
        a: &Attached<'_>,
        i: usize,
        filters: &[HttpRouteFilter],
        backends: &[BackendRef],
    ) -> Route {
        let at = format!("rules[{i}]");
        let (filters, unsupported) = self.filters(&format!("{at}.filters"), filters);
        let backends = if unsupported {
            // A filter the waypoint cannot apply must not be skipped: the rule answers 500.
            vec![Backend { destination: String::new(), port: 0, weight: 1, filters: Vec::new() }]
        } else {
            backends
                .iter()
                .enumerate()
                .map(|(b, r)| self.backend(&format!("{at}.backendRefs[{b}]"), r))
                .collect()
        };
        Route {
            name: format!("{}#{i}", a.name),
            port: a.port,
            matches: Vec::new(),
            filters,
            backends,
            request_timeout_ms: 0,
            backend_request_timeout_ms: 0,
            retry: None,
            grpc: false,
        }
    }

    fn http_match(&mut self, at: &str, m: &HttpRouteMatch) -> Option<Match> {
        let path = match &m.path {
            None => None,
            Some(p) => {
                let value = p.value.clone().unwrap_or_else(|| "/".to_owned());
                Some(match p.kind.as_deref() {
                    Some("Exact") => path_match::Kind::Exact(value),
                    Some("RegularExpression") => {
                        self.regex(&format!("{at}.path"), &value)?;
                        path_match::Kind::Regex(value)
                    }
                    _ => path_match::Kind::Prefix(value),
                })
            }
        };
        let headers = self.values(&format!("{at}.headers"), &m.headers, true)?;
        let query_params = self.values(&format!("{at}.queryParams"), &m.query_params, false)?;
        Some(Match {
            path: path.map(|k| PathMatch { kind: Some(k) }),
            headers,
            query_params,
            method: m.method.clone().unwrap_or_default(),
        })
    }

    fn grpc_match(&mut self, at: &str, m: &GrpcRouteMatch) -> Option<Match> {
        let path = match &m.method {
            None => None,
            Some(method) => {
                let service = method.service.as_deref().filter(|s| !s.is_empty());
                let name = method.method.as_deref().filter(|s| !s.is_empty());
                match (method.kind.as_deref(), service, name) {
                    (_, None, None) => None,
                    (Some("RegularExpression"), s, n) => {
                        let value = format!("/{}/{}", s.unwrap_or("[^/]+"), n.unwrap_or("[^/]+"));
                        self.regex(&format!("{at}.method"), &value)?;
                        Some(path_match::Kind::Regex(value))
                    }
                    (_, Some(s), Some(n)) => Some(path_match::Kind::Exact(format!("/{s}/{n}"))),
                    (_, Some(s), None) => Some(path_match::Kind::Prefix(format!("/{s}/"))),
                    (_, None, Some(n)) => {
                        Some(path_match::Kind::Regex(format!("/[^/]+/{}", regex::escape(n))))
                    }
                }
            }
        };
        let headers = self.values(&format!("{at}.headers"), &m.headers, true)?;
        Some(Match {
            path: path.map(|k| PathMatch { kind: Some(k) }),
            headers,
            query_params: Vec::new(),
            method: String::new(),
        })
    }

    fn values(
        &mut self,
        at: &str,
        values: &[ambit_objects::route::ValueMatch],
        header: bool,
    ) -> Option<Vec<ValueMatch>> {
        let mut out = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let kind = if v.kind.as_deref() == Some("RegularExpression") {
                self.regex(&format!("{at}[{i}]"), &v.value)?;
                value_match::Kind::Regex(v.value.clone())
            } else {
                value_match::Kind::Exact(v.value.clone())
            };
            let name = if header { v.name.to_ascii_lowercase() } else { v.name.clone() };
            out.push(ValueMatch { name, kind: Some(kind) });
        }
        Some(out)
    }

    /// `Some` when `value` compiles; else the error is reported and the match never matches.
    fn regex(&mut self, at: &str, value: &str) -> Option<()> {
        match regex::Regex::new(value) {
            Ok(_) => Some(()),
            Err(e) => {
                let reason = e.to_string().lines().last().unwrap_or_default().trim().to_owned();
                self.error(format!(
                    "{at}: invalid regular expression {value:?} ({reason}): this match never matches"
                ));
                None
            }
        }
    }

    /// A Gateway API duration in milliseconds (0: none, or invalid and reported).
    fn duration(&mut self, at: &str, value: Option<&str>) -> u32 {
        let Some(value) = value else { return 0 };
        match parse_duration(value) {
            Some(ms) => ms,
            None => {
                self.error(format!(
                    "{at}: {value:?} is not a Gateway API duration (like 10s or 500ms): ignored"
                ));
                0
            }
        }
    }

    /// The filters, and whether one of them cannot be applied by a waypoint.
    fn filters(&mut self, at: &str, filters: &[HttpRouteFilter]) -> (Vec<Filter>, bool) {
        let mut out = Vec::new();
        let mut unsupported = false;
        for (i, f) in filters.iter().enumerate() {
            let kind = match f.kind.as_str() {
                "RequestHeaderModifier" => {
                    f.request_header_modifier.as_ref().map(|h| filter::Kind::RequestHeaders(headers(h)))
                }
                "ResponseHeaderModifier" => {
                    f.response_header_modifier.as_ref().map(|h| filter::Kind::ResponseHeaders(headers(h)))
                }
                "URLRewrite" => f.url_rewrite.as_ref().map(|r| {
                    filter::Kind::UrlRewrite(Rewrite {
                        hostname: r.hostname.clone().unwrap_or_default(),
                        path: r.path.as_ref().and_then(modifier).map(|p| match p {
                            Modified::Full(v) => rewrite::Path::FullPath(v),
                            Modified::Prefix(v) => rewrite::Path::Prefix(v),
                        }),
                    })
                }),
                "RequestRedirect" => f.request_redirect.as_ref().map(|r| {
                    filter::Kind::Redirect(Redirect {
                        scheme: r.scheme.clone().unwrap_or_default(),
                        hostname: r.hostname.clone().unwrap_or_default(),
                        path: r.path.as_ref().and_then(modifier).map(|p| match p {
                            Modified::Full(v) => redirect::Path::FullPath(v),
                            Modified::Prefix(v) => redirect::Path::Prefix(v),
                        }),
                        port: r.port.map_or(0, u32::from),
                        status_code: r.status_code.map_or(0, u32::from),
                    })
                }),
                "RequestMirror" => match &f.request_mirror {
                    Some(m) => {
                        let b = self.backend(&format!("{at}[{i}].requestMirror.backendRef"), &m.backend_ref);
                        let percent = match (&m.fraction, m.percent) {
                            (Some(fr), _) => {
                                let den = u64::from(fr.denominator.unwrap_or(100).max(1));
                                u32::try_from((u64::from(fr.numerator) * 100 / den).min(100)).unwrap_or(100)
                            }
                            (None, Some(p)) => p.min(100),
                            (None, None) => 100,
                        };
                        Some(filter::Kind::Mirror(Mirror {
                            destination: b.destination,
                            port: b.port,
                            percent,
                        }))
                    }
                    None => None,
                },
                other => {
                    self.error(format!(
                        "{at}[{i}]: filter {other} is not supported by waypoints: the rule answers 500"
                    ));
                    unsupported = true;
                    continue;
                }
            };
            match kind {
                Some(kind) => out.push(Filter { kind: Some(kind) }),
                None => {
                    self.error(format!(
                        "{at}[{i}]: filter {} has no configuration: the rule answers 500",
                        f.kind
                    ));
                    unsupported = true;
                }
            }
        }
        (out, unsupported)
    }

    /// One backendRef: its Destination (added to the waypoint's), or an empty destination and a
    /// reported error.
    fn backend(&mut self, at: &str, b: &BackendRef) -> Backend {
        let weight = b.weight.unwrap_or(1);
        let (filters, unsupported) = self.filters(&format!("{at}.filters"), &b.filters);
        let port = b.port.map_or(0, u32::from);
        let destination = match self.resolve(b) {
            Ok(_) if unsupported => String::new(),
            Ok(name) => name,
            Err(why) => {
                self.error(format!("{at}: {why}: its share of requests (weight {weight}) answers 500"));
                String::new()
            }
        };
        Backend { destination, port, weight, filters }
    }

    /// The full Destination name of a backend Service, adding its Destination if new.
    fn resolve(&mut self, b: &BackendRef) -> Result<String, String> {
        let group = b.group.as_deref().unwrap_or_default();
        let kind = b.kind.as_deref().unwrap_or("Service");
        if !matches!(group, "" | "core") || kind != "Service" {
            let group = if group.is_empty() { String::new() } else { format!("{group}/") };
            return Err(format!("kind {group}{kind} is not supported (only Services)"));
        }
        let ns = b.namespace.as_deref().unwrap_or(&self.route.ns);
        let svc = Name::new(ns, b.name.as_str());
        let key =
            names::service_key(ns, &names::service_hostname(&svc, &self.view.ctx.settings.domain_suffix));
        // Read even when missing: the Service appearing recomputes this waypoint.
        self.config.inputs.insert(key.clone());
        if ns != self.route.ns && !self.granted(&svc) {
            return Err(format!(
                "Service {svc} is in another namespace and no ReferenceGrant in {ns} allows {}s from {}",
                self.kind.name(),
                self.route.ns
            ));
        }
        let Some(object) = self.view.ctx.store.services.get(&svc) else {
            return Err(format!("Service {svc} does not exist"));
        };
        let Some(port) = b.port else { return Err(format!("a backend Service needs a port ({svc})")) };
        let has_port = object
            .spec
            .as_ref()
            .into_iter()
            .flat_map(|s| s.ports.iter().flatten())
            .any(|p| p.port == i32::from(port));
        if !has_port {
            return Err(format!("Service {svc} has no port {port}"));
        }
        let Some(service) = self.view.service(&key) else {
            return Err(format!("Service {svc} has no address in the mesh (an ExternalName Service?)"));
        };
        let full = scoped(self.wp, &key);
        if !self.config.destinations.contains_key(&full) {
            self.config.inputs.extend(self.view.members.get(&key).into_iter().flatten().cloned());
            let d: Destination = destinations::service(self.view, &key, service, false);
            self.config.destinations.insert(full.clone(), d);
        }
        Ok(full)
    }

    /// Whether a ReferenceGrant in the Service's namespace lets this route's kind and
    /// namespace refer to it.
    fn granted(&self, svc: &Name) -> bool {
        let kind = self.kind.name();
        self.view.ctx.store.grants.iter().filter(|(n, _)| n.ns == svc.ns).any(|(_, g)| {
            let from = g.spec.from.iter().any(|f| {
                f.group == "gateway.networking.k8s.io" && f.kind == kind && f.namespace == self.route.ns
            });
            let to = g.spec.to.iter().any(|t| {
                matches!(t.group.as_str(), "" | "core")
                    && t.kind == "Service"
                    && t.name.as_deref().is_none_or(|n| n.is_empty() || n == svc.name)
            });
            from && to
        })
    }
}

enum Modified {
    Full(String),
    Prefix(String),
}

fn modifier(p: &PathModifier) -> Option<Modified> {
    match p.kind.as_str() {
        "ReplaceFullPath" => Some(Modified::Full(p.replace_full_path.clone().unwrap_or_default())),
        "ReplacePrefixMatch" => Some(Modified::Prefix(p.replace_prefix_match.clone().unwrap_or_default())),
        _ => None,
    }
}

fn headers(h: &ambit_objects::route::HeaderModifier) -> HeaderModifier {
    let pairs = |l: &[ambit_objects::route::HttpHeader]| {
        l.iter().map(|h| Header { name: h.name.clone(), value: h.value.clone() }).collect()
    };
    HeaderModifier { set: pairs(&h.set), add: pairs(&h.add), remove: h.remove.clone() }
}

/// Precedence of one match (`None`: the rule matches everything, a `/` prefix).
fn rank(m: Option<&Match>) -> Rank {
    let Some(m) = m else { return Rank(1, 1, false, 0, 0) };
    let (kind, len) = match m.path.as_ref().and_then(|p| p.kind.as_ref()) {
        Some(path_match::Kind::Exact(v)) => (3, v.len()),
        Some(path_match::Kind::Regex(v)) => (2, v.len()),
        Some(path_match::Kind::Prefix(v)) => (1, v.len()),
        None => (1, 1),
    };
    Rank(kind, len, !m.method.is_empty(), m.headers.len(), m.query_params.len())
}

/// A Gateway API duration (`^([0-9]{1,5}(h|m|s|ms)){1,4}$`) in milliseconds, saturating.
pub(crate) fn parse_duration(s: &str) -> Option<u32> {
    let mut rest = s;
    let mut total: u64 = 0;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else {
            return None;
        };
        rest = &rest[len..];
        total = total.saturating_add(n.saturating_mul(unit));
        parts += 1;
        if parts > 4 {
            return None;
        }
    }
    if parts == 0 {
        return None;
    }
    Some(u32::try_from(total).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_api_durations() {
        assert_eq!(parse_duration("10s"), Some(10_000));
        assert_eq!(parse_duration("500ms"), Some(500));
        assert_eq!(parse_duration("1h2m3s4ms"), Some(3_723_004));
        assert_eq!(parse_duration("0s"), Some(0));
        for bad in ["", "10", "1.5s", "s", "123456s", "1h1m1s1ms1s", "10x", "-1s"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn durations_never_panic(s in "\\PC{0,16}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn durations_sum_their_parts(parts in proptest::collection::vec((0u64..100_000, 0usize..4), 1..5)) {
            let units = [("h", 3_600_000u64), ("m", 60_000), ("s", 1_000), ("ms", 1)];
            let text: String = parts.iter().map(|(n, u)| format!("{n}{}", units[*u].0)).collect();
            let want: u64 = parts.iter().map(|(n, u)| n * units[*u].1).sum();
            proptest::prop_assert_eq!(parse_duration(&text), Some(u32::try_from(want).unwrap_or(u32::MAX)));
        }
    }

    #[test]
    fn precedence_exact_then_regex_then_longest_prefix_then_method_headers_queries() {
        let m = |path: path_match::Kind, method: &str, headers: usize, queries: usize| Match {
            path: Some(PathMatch { kind: Some(path) }),
            headers: vec![ValueMatch::default(); headers],
            query_params: vec![ValueMatch::default(); queries],
            method: method.to_owned(),
        };
        let exact = rank(Some(&m(path_match::Kind::Exact("/a".into()), "", 0, 0)));
        let regex = rank(Some(&m(path_match::Kind::Regex("/a.*".into()), "", 0, 0)));
        let long = rank(Some(&m(path_match::Kind::Prefix("/api/v1".into()), "", 0, 0)));
        let short = rank(Some(&m(path_match::Kind::Prefix("/api".into()), "", 0, 0)));
        let method = rank(Some(&m(path_match::Kind::Prefix("/api".into()), "GET", 0, 0)));
        let headers = rank(Some(&m(path_match::Kind::Prefix("/api".into()), "GET", 2, 0)));
        let queries = rank(Some(&m(path_match::Kind::Prefix("/api".into()), "GET", 2, 1)));
        let all = rank(None);
        let mut got = vec![all, short, queries, exact, method, long, regex, headers];
        got.sort_by(|a, b| b.cmp(a));
        assert!(got == vec![exact, regex, long, queries, headers, method, short, all]);
    }
}
