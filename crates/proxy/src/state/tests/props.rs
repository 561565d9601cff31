//! Property tests: parsing and conversion never panic on arbitrary input.

use proptest::prelude::*;

use super::*;
use ambit_api::workload as pb;

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 4),
        prop::collection::vec(any::<u8>(), 16),
        prop::collection::vec(any::<u8>(), 0..20),
    ]
}

fn gateway() -> impl Strategy<Value = Option<pb::GatewayAddress>> {
    prop::option::of((any::<u32>(), prop::option::of((any::<bool>(), bytes(), ".{0,8}"))).prop_map(
        |(port, dest)| pb::GatewayAddress {
            hbone_mtls_port: port,
            destination: dest.map(|(addr, b, s)| {
                if addr {
                    pb::gateway_address::Destination::Address(pb::NetworkAddress {
                        network: s,
                        address: b,
                        length: None,
                    })
                } else {
                    pb::gateway_address::Destination::Hostname(pb::NamespacedHostname {
                        namespace: s.clone(),
                        hostname: s,
                    })
                }
            }),
        },
    ))
}

fn ports() -> impl Strategy<Value = Vec<pb::Port>> {
    prop::collection::vec(
        (any::<u32>(), any::<u32>(), any::<i32>()).prop_map(|(s, t, a)| pb::Port {
            service_port: s,
            target_port: t,
            app_protocol: a,
        }),
        0..3,
    )
}

fn small_enum() -> impl Strategy<Value = i32> {
    prop_oneof![0..4i32, any::<i32>()]
}

fn workload() -> impl Strategy<Value = pb::Workload> {
    (
        ".{0,12}",
        prop::collection::vec(bytes(), 0..3),
        small_enum(),
        small_enum(),
        gateway(),
        prop::collection::hash_map(".{0,10}", ports(), 0..3),
        prop::option::of(any::<u32>()),
        prop::option::of((small_enum(), any::<u32>())),
        (small_enum(), small_enum()),
    )
        .prop_map(|(uid, addresses, tp, status, waypoint, services, capacity, tunnel, (wt, nm))| {
            pb::Workload {
                uid,
                addresses,
                tunnel_protocol: tp,
                status,
                waypoint,
                services: services.into_iter().map(|(k, p)| (k, pb::PortList { ports: p })).collect(),
                capacity,
                application_tunnel: tunnel.map(|(protocol, port)| pb::ApplicationTunnel { protocol, port }),
                workload_type: wt,
                network_mode: nm,
                ..Default::default()
            }
        })
}

fn service() -> impl Strategy<Value = pb::Service> {
    (
        prop::collection::vec((bytes(), prop::option::of(any::<u32>())), 0..3),
        ports(),
        gateway(),
        prop::option::of((prop::collection::vec(small_enum(), 0..3), small_enum(), small_enum())),
        (small_enum(), small_enum()),
        prop::collection::vec((gateway(), any::<u32>()), 0..2),
    )
        .prop_map(|(addrs, ports, waypoint, lb, (fam, vis), ww)| pb::Service {
            hostname: "h".into(),
            addresses: addrs
                .into_iter()
                .map(|(address, length)| pb::NetworkAddress { network: String::new(), address, length })
                .collect(),
            ports,
            waypoint,
            load_balancing: lb.map(|(routing_preference, mode, health_policy)| pb::LoadBalancing {
                routing_preference,
                mode,
                health_policy,
            }),
            ip_families: fam,
            visibility: vis,
            weighted_waypoints: ww
                .into_iter()
                .map(|(destination, weight)| pb::WeightedWaypoint { destination, weight })
                .collect(),
            ..Default::default()
        })
}

/// A workload with every field the model keeps set to something.
fn rich_workload() -> impl Strategy<Value = pb::Workload> {
    (
        workload(),
        ("[a-z]{0,6}", "[a-z]{0,6}", "[a-z]{0,6}", "[a-z.]{0,6}", "[a-z]{0,4}", "[a-z]{0,4}"),
        prop::collection::vec("[a-z/]{1,8}", 0..3),
        prop::option::of(("[a-z]{0,3}", "[a-z]{0,3}", "[a-z]{0,3}")),
        (any::<bool>(), "[a-z]{0,4}", "[a-z]{0,4}", "[a-z]{0,4}", "[a-z.]{0,8}", gateway()),
    )
        .prop_map(
            |(mut w, (name, ns, sa, td, node, net), pols, loc, (native, cn, cr, wn, host, ngw))| {
                w.name = name;
                w.namespace = ns;
                w.service_account = sa;
                w.trust_domain = td;
                w.node = node;
                w.network = net;
                w.authorization_policies = pols;
                w.locality = loc.map(|(region, zone, subzone)| pb::Locality { region, zone, subzone });
                w.native_tunnel = native;
                w.canonical_name = cn;
                w.canonical_revision = cr;
                w.workload_name = wn;
                w.hostname = host;
                w.network_gateway = ngw;
                w
            },
        )
}

fn rich_service() -> impl Strategy<Value = pb::Service> {
    (
        service(),
        "[a-z]{0,6}",
        "[a-z]{0,6}",
        "[a-z.]{1,10}",
        prop::collection::vec("[a-z:/]{0,12}", 0..2),
        any::<bool>(),
    )
        .prop_map(|(mut s, name, ns, host, sans, canonical)| {
            s.name = name;
            s.namespace = ns;
            s.hostname = host;
            s.subject_alt_names = sans;
            s.canonical = canonical;
            s
        })
}

fn string_match() -> impl Strategy<Value = ambit_api::security::StringMatch> {
    use ambit_api::security::string_match::MatchType;
    prop::option::of(prop_oneof![
        "[a-z/]{0,6}".prop_map(MatchType::Exact),
        "[a-z/]{0,6}".prop_map(MatchType::Prefix),
        "[a-z/]{0,6}".prop_map(MatchType::Suffix),
        Just(MatchType::Presence(())),
    ])
    .prop_map(|match_type| ambit_api::security::StringMatch { match_type })
}

fn authorization() -> impl Strategy<Value = ambit_api::security::Authorization> {
    use ambit_api::security as sec;
    let addr = || {
        (bytes(), prop_oneof![0..=128u32, any::<u32>()])
            .prop_map(|(address, length)| sec::Address { address, length })
    };
    let ports = || prop::collection::vec(prop_oneof![0..=65535u32, any::<u32>()], 0..2);
    let accounts = prop::collection::vec(
        ("[a-z]{0,4}", "[a-z]{0,4}")
            .prop_map(|(namespace, service_account)| sec::ServiceAccountMatch { namespace, service_account }),
        0..2,
    );
    let strings = || prop::collection::vec(string_match(), 0..3);
    let nets = || prop::collection::vec(addr(), 0..3);
    let m = (strings(), strings(), strings(), accounts, nets(), nets(), ports(), ports()).prop_map(
        |(
            namespaces,
            not_principals,
            principals,
            service_accounts,
            source_ips,
            not_destination_ips,
            destination_ports,
            not_destination_ports,
        )| sec::Match {
            namespaces,
            not_principals,
            principals,
            service_accounts,
            source_ips,
            not_destination_ips,
            destination_ports,
            not_destination_ports,
            ..Default::default()
        },
    );
    let rules = prop::collection::vec(
        prop::collection::vec(
            prop::collection::vec(m, 0..3).prop_map(|matches| sec::Clause { matches }),
            0..3,
        )
        .prop_map(|clauses| sec::Rule { clauses }),
        0..3,
    );
    ("[a-z]{0,6}", "[a-z]{0,6}", small_enum(), small_enum(), rules, any::<bool>()).prop_map(
        |(name, namespace, scope, action, rules, dry_run)| sec::Authorization {
            name,
            namespace,
            scope,
            action,
            rules,
            dry_run,
            extensions: vec![],
        },
    )
}

/// YAML-ish noise built from the tokens the format uses.
fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("workloads:".to_owned()),
        Just("services:".to_owned()),
        Just("policies:".to_owned()),
        Just("\n- ".to_owned()),
        Just("\n  ".to_owned()),
        Just("uid: a".to_owned()),
        Just("namespace: d".to_owned()),
        Just("workloadIps: [\"10.0.0.1\"]".to_owned()),
        Just("vips: [\"/1.2.3.4\"]".to_owned()),
        Just("hostname: h".to_owned()),
        Just("rules: [[[{principals: [{Exact: x}]}]]]".to_owned()),
        Just("services: {\"d/h\": {80: 8080}}".to_owned()),
        Just("waypoint: {destination: \"/1.2.3.4\"}".to_owned()),
        Just("&a ".to_owned()),
        Just("*a".to_owned()),
        Just("{".to_owned()),
        Just("[".to_owned()),
        Just("!Exact ".to_owned()),
        ".{0,6}",
    ];
    prop::collection::vec(token, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn local_config_parse_never_panics(s in yamlish()) {
        if let Ok(cfg) = LocalConfig::parse(&s) {
            let _ = State::from_config(cfg, None);
        }
    }

    #[test]
    fn local_config_parse_never_panics_on_any_string(s in ".{0,200}") {
        let _ = LocalConfig::parse(&s);
    }

    #[test]
    fn proto_conversion_never_panics(w in workload(), s in service()) {
        let converted = (Workload::try_from(w), Service::try_from(s));
        // Whatever converts must also index and route without panicking.
        if let (Ok(w), Ok(s)) = converted {
            let st = State::from_config(
                LocalConfig { workloads: vec![w.clone()], services: vec![s], policies: vec![] },
                None,
            );
            if let Ok(st) = st {
                for ip_ in w.workload_ips.iter().take(1) {
                    let _ = st.route_outbound(&w, "", SocketAddr::new(*ip_, 80));
                }
            }
        }
    }

    /// proto → model → proto → model is the identity (for what converts at all).
    #[test]
    fn model_to_proto_round_trips(w in rich_workload(), s in rich_service(), p in authorization()) {
        if let Ok(model) = Workload::try_from(w) {
            let back = pb::Workload::from(&model);
            prop_assert_eq!(Workload::try_from(back), Ok(model.clone()));
            let addr = Address::Workload(model);
            prop_assert_eq!(Address::try_from(pb::Address::from(&addr)), Ok(addr));
        }
        if let Ok(model) = Service::try_from(s) {
            let back = pb::Service::from(&model);
            prop_assert_eq!(Service::try_from(back), Ok(model.clone()));
            let addr = Address::Service(model);
            prop_assert_eq!(Address::try_from(pb::Address::from(&addr)), Ok(addr));
        }
        if let Ok(model) = crate::authz::Authorization::try_from(&p) {
            let back = ambit_api::security::Authorization::from(&model);
            prop_assert_eq!(crate::authz::Authorization::try_from(&back), Ok(model));
        }
    }

    #[test]
    fn authority_parse_never_panics(s in ".{0,40}") {
        if let Ok(a) = s.parse::<Authority>() {
            prop_assert_eq!(a.to_string().parse::<Authority>(), Ok(a.clone()));
            // The port is spelled the one way it prints.
            prop_assert_eq!(s.rsplit_once(':').map(|(_, p)| p.to_owned()), Some(a.port().to_string()));
        }
    }

    #[test]
    fn ports_parse_only_in_canonical_form(port in "[0-9+]{1,7}") {
        let ok = format!("10.0.0.2:{port}").parse::<Authority>().is_ok();
        let canonical = port.parse::<u16>().is_ok_and(|p| p != 0 && p.to_string() == port);
        prop_assert_eq!(ok, canonical, "{}", port);
        prop_assert_eq!(format!("example.com:{port}").parse::<Authority>().is_ok(), canonical);
    }
}
