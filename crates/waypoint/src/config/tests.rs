//! Parsing the control plane's resources: each refusal reported with its reason, values that
//! cannot be enforced kept as unenforceable conditions, missing policies failing closed.

use std::net::{IpAddr, Ipv4Addr};

use ambit_api::waypoint as api;

use super::*;
use crate::authz::{Decision, Request};

fn destination(vip: Vec<u8>) -> api::Destination {
    api::Destination {
        bound: true,
        addresses: vec![vip],
        ports: vec![api::Port {
            port: 80,
            target_port: 8080,
            protocol: api::Protocol::Http as i32,
            name: "http".into(),
        }],
        ..api::Destination::default()
    }
}

fn request(headers: &http::HeaderMap) -> Request<'_> {
    Request {
        method: "GET",
        authority: "svc",
        path: "/",
        headers,
        source_principal: Some("spiffe://cluster.local/ns/default/sa/client"),
        source_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        remote_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        destination_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        destination_port: 80,
        sni: None,
    }
}

#[test]
fn a_bound_destination_is_found_by_address_and_port() {
    let (s, errors) = Snapshot::build(&[("d".into(), destination(vec![10, 0, 0, 1]))], &[]);
    assert!(errors.is_empty(), "{errors:?}");
    let (d, port) = s.bound("10.0.0.1:80".parse().expect("addr")).expect("bound");
    assert_eq!((d.resource.as_str(), port.target_port, port.protocol), ("d", 8080, Protocol::Http));
    assert!(s.bound("10.0.0.1:81".parse().expect("addr")).is_none());
}

#[test]
fn addresses_of_the_wrong_length_refuse_the_destination() {
    let (s, errors) = Snapshot::build(&[("d".into(), destination(vec![10, 0, 0]))], &[]);
    assert!(s.is_empty());
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["destination d refused: address 0 has 3 bytes; an IP address has 4 or 16"]
    );
}

#[test]
fn a_regex_that_does_not_compile_or_is_too_long_refuses_the_destination() {
    let mut d = destination(vec![10, 0, 0, 1]);
    d.routes = vec![api::Route {
        name: "ns/r#0".into(),
        matches: vec![api::Match {
            path: Some(api::PathMatch { kind: Some(api::path_match::Kind::Regex("(unclosed".into())) }),
            ..Default::default()
        }],
        ..Default::default()
    }];
    let (_, errors) = Snapshot::build(&[("d".into(), d.clone())], &[]);
    let [ConfigError::Destination { resource, reason }] = errors.as_slice() else { panic!("{errors:?}") };
    assert_eq!(resource, "d");
    assert!(reason.starts_with("route \"ns/r#0\": regular expression \"(unclosed\": "), "{reason}");

    d.routes[0].matches[0].path =
        Some(api::PathMatch { kind: Some(api::path_match::Kind::Regex("a".repeat(2000))) });
    let (_, errors) = Snapshot::build(&[("d".into(), d.clone())], &[]);
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["destination d refused: route \"ns/r#0\": regular expression of 2000 bytes (at most 1024)"]
    );

    // A huge repetition compiles past the size limit: refused, not built.
    d.routes[0].matches[0].path =
        Some(api::PathMatch { kind: Some(api::path_match::Kind::Regex("(\\w{100}){100}".into())) });
    let (_, errors) = Snapshot::build(&[("d".into(), d)], &[]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("exceeds size limit"), "{}", errors[0]);
}

#[test]
fn an_hbone_endpoint_without_identity_is_left_out_and_reported() {
    let mut d = destination(vec![10, 0, 0, 1]);
    d.endpoints = vec![
        api::Endpoint {
            address: vec![10, 1, 0, 1],
            tunnel: ambit_api::workload::TunnelProtocol::Hbone as i32,
            ..Default::default()
        },
        api::Endpoint {
            address: vec![10, 1, 0, 2],
            tunnel: ambit_api::workload::TunnelProtocol::None as i32,
            healthy: true,
            ..Default::default()
        },
    ];
    let (s, errors) = Snapshot::build(&[("d".into(), d)], &[]);
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "destination d: endpoint 0 left out: an HBONE endpoint needs an identity (its node proxy must present it)"
        ]
    );
    assert_eq!(s.destination("d").expect("kept").endpoints.len(), 1);
}

#[test]
fn unreadable_policy_values_become_unenforceable_conditions() {
    let policy = api::Policy {
        name: "p".into(),
        namespace: "ns".into(),
        action: api::policy::Action::Allow as i32,
        rules: vec![api::Rule {
            from: vec![api::Source { ip_blocks: vec!["not-an-ip".into()], ..Default::default() }],
            ..Default::default()
        }],
    };
    let mut d = destination(vec![10, 0, 0, 1]);
    d.policies = vec!["gw/ns/p".into()];
    let (s, errors) = Snapshot::build(&[("d".into(), d)], &[("gw/ns/p".into(), policy)]);
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "ns/p (ALLOW): condition \"from.source.ipBlocks\" cannot be enforced: \"not-an-ip\" is not an IP address or CIDR block; its rule never allows"
        ]
    );
    // The ALLOW rule never matches: denied, not allowed for lack of a block.
    let headers = http::HeaderMap::new();
    let d = s.destination("d").expect("kept");
    let verdict = d.policies.authorize(&request(&headers)).expect("verdict");
    assert!(matches!(verdict.decision, Decision::Deny { policy: None, .. }), "{verdict:?}");
}

#[test]
fn a_missing_policy_denies_every_request_and_an_unknown_action_is_refused() {
    let policy = api::Policy { name: "p".into(), namespace: "ns".into(), action: 7, rules: vec![] };
    let mut d = destination(vec![10, 0, 0, 1]);
    d.policies = vec!["gw/ns/p".into()];
    let (s, errors) = Snapshot::build(&[("d".into(), d)], &[("gw/ns/p".into(), policy)]);
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        text[0],
        "policy gw/ns/p refused: action 7 is not supported (ALLOW, DENY and AUDIT are); destinations naming it deny every request"
    );
    assert_eq!(
        text[1],
        "destination d names policy gw/ns/p, which is not in the configuration: its requests are denied until it arrives"
    );
    let headers = http::HeaderMap::new();
    let d = s.destination("d").expect("kept");
    let verdict = d.policies.authorize(&request(&headers)).expect("verdict");
    assert_eq!(
        verdict.decision,
        Decision::Deny { policy: Some("gw/ns/p".into()), reason: crate::DenyReason::DenyPolicyMatched }
    );
    assert!(matches!(d.policies.authorize_connection(&request(&headers)).decision, Decision::Deny { .. }));
}

#[test]
fn two_destinations_on_one_address_keep_the_first_by_name() {
    let (s, errors) = Snapshot::build(
        &[("b".into(), destination(vec![10, 0, 0, 1])), ("a".into(), destination(vec![10, 0, 0, 1]))],
        &[],
    );
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.0.0.1:80 is claimed by a and b; requests go to a"]
    );
    assert_eq!(s.bound("10.0.0.1:80".parse().expect("addr")).expect("bound").0.resource, "a");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn arb_destination() -> impl Strategy<Value = api::Destination> {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 0..3),
            prop::collection::vec((any::<u32>(), any::<u32>(), -1i32..6), 0..3),
            prop::collection::vec((prop::collection::vec(any::<u8>(), 0..20), "\\PC{0,40}", -1i32..4), 0..3),
            prop::collection::vec(("\\PC{0,20}", "\\PC{0,20}", any::<u32>(), any::<u32>()), 0..3),
        )
            .prop_map(|(addresses, ports, endpoints, routes)| api::Destination {
                bound: true,
                addresses,
                ports: ports
                    .into_iter()
                    .map(|(port, target_port, protocol)| api::Port {
                        port,
                        target_port,
                        protocol,
                        name: String::new(),
                    })
                    .collect(),
                endpoints: endpoints
                    .into_iter()
                    .map(|(address, identity, tunnel)| api::Endpoint {
                        address,
                        identity,
                        tunnel,
                        healthy: true,
                        ..Default::default()
                    })
                    .collect(),
                routes: routes
                    .into_iter()
                    .map(|(regex, header, port, status)| api::Route {
                        name: "r".into(),
                        matches: vec![api::Match {
                            path: Some(api::PathMatch { kind: Some(api::path_match::Kind::Regex(regex)) }),
                            headers: vec![api::ValueMatch {
                                name: header.clone(),
                                kind: Some(api::value_match::Kind::Exact(header)),
                            }],
                            ..Default::default()
                        }],
                        filters: vec![api::Filter {
                            kind: Some(api::filter::Kind::Redirect(api::Redirect {
                                port,
                                status_code: status,
                                ..Default::default()
                            })),
                        }],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
    }

    proptest! {
        /// Any resource parses or is refused with a reason, never a panic; what is kept holds
        /// what the types promise.
        #[test]
        fn any_destination_is_parsed_or_refused(d in arb_destination()) {
            let (s, errors) = Snapshot::build(&[("d".into(), d.clone())], &[]);
            match s.destination("d") {
                Some(kept) => {
                    prop_assert_eq!(kept.addresses.len(), d.addresses.len());
                    prop_assert!(kept.ports.iter().all(|p| p.port != 0 && p.target_port != 0));
                    prop_assert!(kept.endpoints.iter().all(|e| e.tunnel == Tunnel::None || e.identity.is_some()));
                }
                None => {
                    let refused = errors.iter().any(|e| matches!(e, ConfigError::Destination { .. }));
                    prop_assert!(refused, "left out without a reason: {:?}", errors);
                }
            }
        }
    }
}

/// `serviceAccounts` stand for the principals `*/ns/<ns>/sa/<sa>` (a bare name in the policy's
/// namespace); a source setting both them and `principals`, or a value that is not a service
/// account, cannot be enforced: the ALLOW rule never matches. Before, the field was not read, so
/// an ALLOW from one service account allowed every client.
#[test]
fn service_accounts_are_principals_and_a_source_with_both_cannot_be_enforced() {
    let policy = |from: api::Source| api::Policy {
        name: "p".into(),
        namespace: "default".into(),
        action: api::policy::Action::Allow as i32,
        rules: vec![api::Rule { from: vec![from], ..Default::default() }],
    };
    let decide = |from: api::Source| {
        let mut d = destination(vec![10, 0, 0, 1]);
        d.policies = vec!["gw/default/p".into()];
        let (s, errors) = Snapshot::build(&[("d".into(), d)], &[("gw/default/p".into(), policy(from))]);
        let headers = http::HeaderMap::new();
        let d = s.destination("d").expect("kept");
        let verdict = d.policies.authorize(&request(&headers)).expect("verdict");
        (
            matches!(verdict.decision, Decision::Allow),
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        )
    };
    let accounts = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    // The request comes from cluster.local/ns/default/sa/client.
    assert_eq!(
        decide(api::Source { service_accounts: accounts(&["default/client"]), ..Default::default() }),
        (true, vec![])
    );
    assert_eq!(
        decide(api::Source { service_accounts: accounts(&["client"]), ..Default::default() }),
        (true, vec![])
    );
    assert_eq!(
        decide(api::Source { service_accounts: accounts(&["default/other"]), ..Default::default() }),
        (false, vec![])
    );
    assert_eq!(
        decide(api::Source { service_accounts: accounts(&["other/client"]), ..Default::default() }),
        (false, vec![])
    );
    assert_eq!(
        decide(api::Source { not_service_accounts: accounts(&["default/client"]), ..Default::default() }),
        (false, vec![])
    );
    assert_eq!(
        decide(api::Source {
            principals: accounts(&["cluster.local/ns/default/sa/client"]),
            service_accounts: accounts(&["default/other"]),
            ..Default::default()
        }),
        (
            false,
            vec![
                "default/p (ALLOW): condition \"from.source.serviceAccounts\" cannot be enforced: principals and \
                 serviceAccounts are both set in one source; its rule never allows"
                    .to_owned()
            ]
        )
    );
    assert_eq!(
        decide(api::Source { service_accounts: accounts(&["a/b/c"]), ..Default::default() }),
        (
            false,
            vec![
                "default/p (ALLOW): condition \"from.source.serviceAccounts\" cannot be enforced: \"a/b/c\" is not a \
                 service account (<namespace>/<name> or <name>); its rule never allows"
                    .to_owned()
            ]
        )
    );
}

/// A workload bound to a waypoint but in no Service comes without ports: every port it is
/// dialed on is served, sniffed (before, nothing was indexed and every CONNECT got 404).
#[test]
fn a_bound_destination_without_ports_serves_every_port_sniffed() {
    let mut d = destination(vec![10, 0, 0, 7]);
    d.kind = api::destination::Kind::Workload as i32;
    d.ports.clear();
    let (s, errors) = Snapshot::build(&[("w".into(), d)], &[]);
    assert!(errors.is_empty(), "{errors:?}");
    let (found, port) = s.bound("10.0.0.7:9090".parse().expect("addr")).expect("bound on any port");
    assert_eq!((found.resource.as_str(), port.port, port.target_port), ("w", 9090, 9090));
    assert_eq!(port.protocol, Protocol::Undeclared);
    assert!(s.bound("10.0.0.8:9090".parse().expect("addr")).is_none());
}
