//! Readable dumps of translated resources for golden files: IPs as text, enums by name, proto
//! defaults left out (except `status`, `tunnel_protocol`, `canonical`, `scope`, `action` and
//! `rules`, shown always).

use std::net::IpAddr;

use ambit_api::security::{self, Authorization, StringMatch, string_match};
use ambit_api::workload::{
    self, Address, AppProtocol, GatewayAddress, IpFamilies, NetworkMode, Service, TunnelProtocol, Workload,
    WorkloadStatus, WorkloadType, address, gateway_address, load_balancing,
};
use serde_json::{Map, Value, json};

pub fn address(a: &Address) -> Value {
    match &a.r#type {
        Some(address::Type::Workload(w)) => json!({ "workload": workload(w) }),
        Some(address::Type::Service(s)) => json!({ "service": service(s) }),
        None => json!("empty Address"),
    }
}

fn ip(b: &[u8]) -> String {
    match b.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(b).expect("4")).to_string(),
        16 => IpAddr::from(<[u8; 16]>::try_from(b).expect("16")).to_string(),
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
