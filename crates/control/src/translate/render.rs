//! Readable dumps of translated resources (the golden files and `/debug/config_dump`): IPs as
//! text, enums by name, proto defaults left out (except `status`, `tunnel_protocol`, `canonical`, `scope`, `action` and
//! `rules`, shown always).

use std::net::IpAddr;

use ambit_api::security::{self, Authorization, StringMatch, string_match};
use ambit_api::workload::{
    self, Address, AppProtocol, GatewayAddress, IpFamilies, NetworkMode, Service, TunnelProtocol, Workload,
    WorkloadStatus, WorkloadType, address, gateway_address, load_balancing,
};
use serde_json::{Map, Value, json};

/// An Address (workload or service) as JSON.
pub fn address(a: &Address) -> Value {
    match &a.r#type {
        Some(address::Type::Workload(w)) => json!({ "workload": workload(w) }),
        Some(address::Type::Service(s)) => json!({ "service": service(s) }),
        None => json!("empty Address"),
    }
}

fn ip(b: &[u8]) -> String {
    match b.len() {
        4 => <[u8; 4]>::try_from(b)
            .map_or_else(|_| format!("bad address {b:?}"), |a| IpAddr::from(a).to_string()),
        16 => <[u8; 16]>::try_from(b)
            .map_or_else(|_| format!("bad address {b:?}"), |a| IpAddr::from(a).to_string()),
        _ => format!("bad address {b:?}"),
    }
}

struct Obj(Map<String, Value>);

impl Obj {
    fn new() -> Obj {
        Obj(Map::new())
    }
    fn s(&mut self, k: &str, v: &str) -> &mut Obj {
        if !v.is_empty() {
            self.0.insert(k.into(), json!(v));
        }
        self
    }
    fn b(&mut self, k: &str, v: bool) -> &mut Obj {
        if v {
            self.0.insert(k.into(), json!(true));
        }
        self
    }
    fn v(&mut self, k: &str, v: Value) -> &mut Obj {
        let empty = match &v {
            Value::Null => true,
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        if !empty {
            self.0.insert(k.into(), v);
        }
        self
    }
    fn always(&mut self, k: &str, v: Value) -> &mut Obj {
        self.0.insert(k.into(), v);
        self
    }
    fn done(&mut self) -> Value {
        Value::Object(std::mem::take(&mut self.0))
    }
}

fn enum_name<E: TryFrom<i32>>(v: i32, name: impl Fn(&E) -> &'static str) -> Value {
    match E::try_from(v) {
        Ok(e) => json!(name(&e)),
        Err(_) => json!(format!("unknown {v}")),
    }
}

fn nonzero<E: TryFrom<i32>>(v: i32, name: impl Fn(&E) -> &'static str) -> Value {
    if v == 0 { Value::Null } else { enum_name(v, name) }
}

fn gateway(g: &Option<GatewayAddress>) -> Value {
    let Some(g) = g else { return Value::Null };
    let dest = match &g.destination {
        Some(gateway_address::Destination::Hostname(h)) => format!("hostname {}/{}", h.namespace, h.hostname),
        Some(gateway_address::Destination::Address(a)) => format!("address {}/{}", a.network, ip(&a.address)),
        None => "no destination".into(),
    };
    json!(format!("{dest} hbone {}", g.hbone_mtls_port))
}

fn port(p: &workload::Port) -> String {
    let mut s = format!("{}:{}", p.service_port, p.target_port);
    if p.app_protocol != 0 {
        s.push(' ');
        s.push_str(AppProtocol::try_from(p.app_protocol).map(|a| a.as_str_name()).unwrap_or("unknown"));
    }
    s
}

fn workload(w: &Workload) -> Value {
    let mut services: Vec<(&String, &workload::PortList)> = w.services.iter().collect();
    services.sort_by(|a, b| a.0.cmp(b.0));
    let services: Map<String, Value> = services
        .into_iter()
        .map(|(k, v)| (k.clone(), json!(v.ports.iter().map(port).collect::<Vec<_>>())))
        .collect();
    Obj::new()
        .s("uid", &w.uid)
        .s("name", &w.name)
        .s("namespace", &w.namespace)
        .v("addresses", json!(w.addresses.iter().map(|a| ip(a)).collect::<Vec<_>>()))
        .s("hostname", &w.hostname)
        .s("network", &w.network)
        .always("tunnel_protocol", enum_name(w.tunnel_protocol, TunnelProtocol::as_str_name))
        .s("trust_domain", &w.trust_domain)
        .s("service_account", &w.service_account)
        .v("waypoint", gateway(&w.waypoint))
        .v("network_gateway", gateway(&w.network_gateway))
        .s("node", &w.node)
        .s("canonical_name", &w.canonical_name)
        .s("canonical_revision", &w.canonical_revision)
        .v("workload_type", nonzero(w.workload_type, WorkloadType::as_str_name))
        .s("workload_name", &w.workload_name)
        .b("native_tunnel", w.native_tunnel)
        .v(
            "application_tunnel",
            w.application_tunnel.as_ref().map_or(Value::Null, |t| {
                let p = workload::application_tunnel::Protocol::try_from(t.protocol)
                    .map(|p| p.as_str_name())
                    .unwrap_or("unknown");
                json!(format!("{p} port {}", t.port))
            }),
        )
        .v("services", Value::Object(services))
        .v("authorization_policies", json!(w.authorization_policies))
        .always("status", enum_name(w.status, WorkloadStatus::as_str_name))
        .s("cluster_id", &w.cluster_id)
        .v(
            "locality",
            w.locality
                .as_ref()
                .map_or(Value::Null, |l| json!(format!("{}/{}/{}", l.region, l.zone, l.subzone))),
        )
        .v("network_mode", nonzero(w.network_mode, NetworkMode::as_str_name))
        .v("capacity", w.capacity.map_or(Value::Null, |c| json!(c)))
        .done()
}

fn service(s: &Service) -> Value {
    let addresses: Vec<String> = s
        .addresses
        .iter()
        .map(|a| match a.length {
            Some(l) => format!("{}/{}/{l}", a.network, ip(&a.address)),
            None => format!("{}/{}", a.network, ip(&a.address)),
        })
        .collect();
    let lb = s.load_balancing.as_ref().map_or(Value::Null, |lb| {
        let prefs: Vec<Value> =
            lb.routing_preference.iter().map(|p| enum_name(*p, load_balancing::Scope::as_str_name)).collect();
        Obj::new()
            .v("routing_preference", json!(prefs))
            .v("mode", nonzero(lb.mode, load_balancing::Mode::as_str_name))
            .v("health_policy", nonzero(lb.health_policy, load_balancing::HealthPolicy::as_str_name))
            .always("set", json!(true))
            .done()
    });
    let weighted: Vec<Value> = s
        .weighted_waypoints
        .iter()
        .map(|w| json!(format!("{} weight {}", gateway(&w.destination).as_str().unwrap_or("none"), w.weight)))
        .collect();
    Obj::new()
        .s("name", &s.name)
        .s("namespace", &s.namespace)
        .s("hostname", &s.hostname)
        .v("addresses", json!(addresses))
        .v("ports", json!(s.ports.iter().map(port).collect::<Vec<_>>()))
        .v("subject_alt_names", json!(s.subject_alt_names))
        .v("waypoint", gateway(&s.waypoint))
        .v("load_balancing", lb)
        .v("ip_families", nonzero(s.ip_families, IpFamilies::as_str_name))
        .always("canonical", json!(s.canonical))
        .b("ingress_use_waypoint", s.ingress_use_waypoint)
        .v("weighted_waypoints", json!(weighted))
        .v("visibility", if s.visibility == 0 { Value::Null } else { json!(s.visibility) })
        .done()
}

fn strings(v: &[StringMatch]) -> Value {
    json!(
        v.iter()
            .map(|m| match &m.match_type {
                Some(string_match::MatchType::Exact(s)) => format!("exact {s}"),
                Some(string_match::MatchType::Prefix(s)) => format!("prefix {s}"),
                Some(string_match::MatchType::Suffix(s)) => format!("suffix {s}"),
                Some(string_match::MatchType::Presence(())) => "presence".to_owned(),
                None => "unset".to_owned(),
            })
            .collect::<Vec<_>>()
    )
}

fn cidrs(v: &[security::Address]) -> Value {
    json!(v.iter().map(|a| format!("{}/{}", ip(&a.address), a.length)).collect::<Vec<_>>())
}

fn accounts(v: &[security::ServiceAccountMatch]) -> Value {
    json!(v.iter().map(|a| format!("{}/{}", a.namespace, a.service_account)).collect::<Vec<_>>())
}

fn matched(m: &security::Match) -> Value {
    Obj::new()
        .v("namespaces", strings(&m.namespaces))
        .v("not_namespaces", strings(&m.not_namespaces))
        .v("service_accounts", accounts(&m.service_accounts))
        .v("not_service_accounts", accounts(&m.not_service_accounts))
        .v("principals", strings(&m.principals))
        .v("not_principals", strings(&m.not_principals))
        .v("source_ips", cidrs(&m.source_ips))
        .v("not_source_ips", cidrs(&m.not_source_ips))
        .v("destination_ips", cidrs(&m.destination_ips))
        .v("not_destination_ips", cidrs(&m.not_destination_ips))
        .v("destination_ports", json!(m.destination_ports))
        .v("not_destination_ports", json!(m.not_destination_ports))
        .done()
}

/// `rules` is a list of rules (OR), each a list of clauses (AND), each a list of matches (OR).
/// An Authorization as JSON.
pub fn authorization(a: &Authorization) -> Value {
    let rules: Vec<Value> = a
        .rules
        .iter()
        .map(|r| {
            json!(
                r.clauses
                    .iter()
                    .map(|c| json!(c.matches.iter().map(matched).collect::<Vec<_>>()))
                    .collect::<Vec<_>>()
            )
        })
        .collect();
    Obj::new()
        .s("name", &a.name)
        .s("namespace", &a.namespace)
        .always("scope", enum_name(a.scope, security::Scope::as_str_name))
        .always("action", enum_name(a.action, security::Action::as_str_name))
        .b("dry_run", a.dry_run)
        .always("rules", json!(rules))
        .done()
}

/// A waypoint Destination as JSON (compact: a port is `80/HTTP -> 8080 (http)`, an endpoint
/// one object, a route its name, matches, filters and backends).
pub fn destination(d: &ambit_api::waypoint::Destination) -> Value {
    use ambit_api::waypoint::{Protocol, destination::Kind};
    let ports: Vec<String> = d
        .ports
        .iter()
        .map(|p| {
            let proto = Protocol::try_from(p.protocol).map(|p| p.as_str_name()).unwrap_or("unknown");
            let name = if p.name.is_empty() { String::new() } else { format!(" ({})", p.name) };
            format!("{}/{proto} -> {}{name}", p.port, p.target_port)
        })
        .collect();
    let endpoints: Vec<Value> = d
        .endpoints
        .iter()
        .map(|e| {
            let mut ports: Vec<(&u32, &u32)> = e.ports.iter().collect();
            ports.sort();
            Obj::new()
                .s("address", &ip(&e.address))
                .s("identity", &e.identity)
                .always("tunnel", enum_name(e.tunnel, TunnelProtocol::as_str_name))
                .v("ports", json!(ports.iter().map(|(s, t)| format!("{s} -> {t}")).collect::<Vec<_>>()))
                .always("healthy", json!(e.healthy))
                .v(
                    "locality",
                    e.locality
                        .as_ref()
                        .map_or(Value::Null, |l| json!(format!("{}/{}/{}", l.region, l.zone, l.subzone))),
                )
                .s("node", &e.node)
                .s("uid", &e.uid)
                .s("workload_name", &e.workload_name)
                .s("namespace", &e.namespace)
                .s("canonical_name", &e.canonical_name)
                .s("canonical_revision", &e.canonical_revision)
                .s("cluster_id", &e.cluster_id)
                .s("service_account", &e.service_account)
                .done()
        })
        .collect();
    Obj::new()
        .always("kind", enum_name(d.kind, Kind::as_str_name))
        .s("name", &d.name)
        .s("namespace", &d.namespace)
        .s("hostname", &d.hostname)
        .always("bound", json!(d.bound))
        .v("addresses", json!(d.addresses.iter().map(|a| ip(a)).collect::<Vec<_>>()))
        .v("ports", json!(ports))
        .v("endpoints", json!(endpoints))
        .v("routes", json!(d.routes.iter().map(route).collect::<Vec<_>>()))
        .v("policies", json!(d.policies))
        .v("subject_alt_names", json!(d.subject_alt_names))
        .done()
}

fn route(r: &ambit_api::waypoint::Route) -> Value {
    let matches: Vec<Value> = r.matches.iter().map(route_match).collect();
    let backends: Vec<Value> = r
        .backends
        .iter()
        .map(|b| {
            let dest = if b.destination.is_empty() { "(invalid: 500)" } else { b.destination.as_str() };
            Obj::new()
                .s("destination", dest)
                .v("port", if b.port == 0 { Value::Null } else { json!(b.port) })
                .always("weight", json!(b.weight))
                .v("filters", json!(b.filters.iter().map(route_filter).collect::<Vec<_>>()))
                .done()
        })
        .collect();
    Obj::new()
        .s("name", &r.name)
        .v("port", if r.port == 0 { Value::Null } else { json!(r.port) })
        .v("matches", json!(matches))
        .v("filters", json!(r.filters.iter().map(route_filter).collect::<Vec<_>>()))
        .v("backends", json!(backends))
        .v(
            "request_timeout_ms",
            if r.request_timeout_ms == 0 { Value::Null } else { json!(r.request_timeout_ms) },
        )
        .v(
            "backend_request_timeout_ms",
            if r.backend_request_timeout_ms == 0 { Value::Null } else { json!(r.backend_request_timeout_ms) },
        )
        .v(
            "retry",
            r.retry.as_ref().map_or(
                Value::Null,
                |t| json!({"attempts": t.attempts, "codes": t.codes, "backoff_ms": t.backoff_ms}),
            ),
        )
        .b("grpc", r.grpc)
        .done()
}

fn route_match(m: &ambit_api::waypoint::Match) -> Value {
    use ambit_api::waypoint::{path_match, value_match};
    let path = m.path.as_ref().and_then(|p| p.kind.as_ref()).map_or(Value::Null, |k| match k {
        path_match::Kind::Exact(v) => json!(format!("exact {v}")),
        path_match::Kind::Prefix(v) => json!(format!("prefix {v}")),
        path_match::Kind::Regex(v) => json!(format!("regex {v}")),
    });
    let values = |l: &[ambit_api::waypoint::ValueMatch]| -> Vec<String> {
        l.iter()
            .map(|v| match &v.kind {
                Some(value_match::Kind::Exact(x)) => format!("{} = {x}", v.name),
                Some(value_match::Kind::Regex(x)) => format!("{} ~ {x}", v.name),
                None => format!("{} (no value)", v.name),
            })
            .collect()
    };
    Obj::new()
        .v("path", path)
        .v("headers", json!(values(&m.headers)))
        .v("query_params", json!(values(&m.query_params)))
        .s("method", &m.method)
        .done()
}

fn route_filter(f: &ambit_api::waypoint::Filter) -> Value {
    use ambit_api::waypoint::{HeaderModifier, filter, redirect, rewrite};
    let headers = |h: &HeaderModifier| {
        let pairs = |l: &[ambit_api::waypoint::Header]| -> Vec<String> {
            l.iter().map(|h| format!("{}: {}", h.name, h.value)).collect()
        };
        Obj::new()
            .v("set", json!(pairs(&h.set)))
            .v("add", json!(pairs(&h.add)))
            .v("remove", json!(h.remove))
            .done()
    };
    match &f.kind {
        Some(filter::Kind::RequestHeaders(h)) => json!({ "request_headers": headers(h) }),
        Some(filter::Kind::ResponseHeaders(h)) => json!({ "response_headers": headers(h) }),
        Some(filter::Kind::UrlRewrite(r)) => {
            let path = match &r.path {
                Some(rewrite::Path::FullPath(p)) => json!(format!("full {p}")),
                Some(rewrite::Path::Prefix(p)) => json!(format!("prefix {p}")),
                None => Value::Null,
            };
            json!({ "url_rewrite": Obj::new().s("hostname", &r.hostname).v("path", path).done() })
        }
        Some(filter::Kind::Redirect(r)) => {
            let path = match &r.path {
                Some(redirect::Path::FullPath(p)) => json!(format!("full {p}")),
                Some(redirect::Path::Prefix(p)) => json!(format!("prefix {p}")),
                None => Value::Null,
            };
            let redirect = Obj::new()
                .s("scheme", &r.scheme)
                .s("hostname", &r.hostname)
                .v("path", path)
                .v("port", if r.port == 0 { Value::Null } else { json!(r.port) })
                .v("status_code", if r.status_code == 0 { Value::Null } else { json!(r.status_code) })
                .done();
            json!({ "redirect": redirect })
        }
        Some(filter::Kind::Mirror(m)) => {
            let dest = if m.destination.is_empty() { "(invalid: nothing)" } else { m.destination.as_str() };
            json!({ "mirror": { "destination": dest, "port": m.port, "percent": m.percent } })
        }
        None => json!("empty filter"),
    }
}

/// A waypoint Policy as JSON (empty lists left out).
pub fn waypoint_policy(p: &ambit_api::waypoint::Policy) -> Value {
    use ambit_api::waypoint::policy::Action;
    let rules: Vec<Value> = p
        .rules
        .iter()
        .map(|r| {
            let from: Vec<Value> = r
                .from
                .iter()
                .map(|s| {
                    Obj::new()
                        .v("principals", json!(s.principals))
                        .v("not_principals", json!(s.not_principals))
                        .v("request_principals", json!(s.request_principals))
                        .v("not_request_principals", json!(s.not_request_principals))
                        .v("namespaces", json!(s.namespaces))
                        .v("not_namespaces", json!(s.not_namespaces))
                        .v("ip_blocks", json!(s.ip_blocks))
                        .v("not_ip_blocks", json!(s.not_ip_blocks))
                        .v("remote_ip_blocks", json!(s.remote_ip_blocks))
                        .v("not_remote_ip_blocks", json!(s.not_remote_ip_blocks))
                        .v("service_accounts", json!(s.service_accounts))
                        .v("not_service_accounts", json!(s.not_service_accounts))
                        .done()
                })
                .collect();
            let to: Vec<Value> =
                r.to.iter()
                    .map(|o| {
                        Obj::new()
                            .v("hosts", json!(o.hosts))
                            .v("not_hosts", json!(o.not_hosts))
                            .v("ports", json!(o.ports))
                            .v("not_ports", json!(o.not_ports))
                            .v("methods", json!(o.methods))
                            .v("not_methods", json!(o.not_methods))
                            .v("paths", json!(o.paths))
                            .v("not_paths", json!(o.not_paths))
                            .done()
                    })
                    .collect();
            let when: Vec<Value> = r
                .when
                .iter()
                .map(|c| {
                    Obj::new()
                        .s("key", &c.key)
                        .v("values", json!(c.values))
                        .v("not_values", json!(c.not_values))
                        .done()
                })
                .collect();
            Obj::new().v("from", json!(from)).v("to", json!(to)).v("when", json!(when)).done()
        })
        .collect();
    Obj::new()
        .s("name", &p.name)
        .s("namespace", &p.namespace)
        .always("action", enum_name(p.action, Action::as_str_name))
        .always("rules", json!(rules))
        .done()
}
