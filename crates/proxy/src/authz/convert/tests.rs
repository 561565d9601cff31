//! Conversion of xDS Authorization resources: field mapping, what is dropped, what is rejected.

use ambit_api::security as proto;
use ambit_api::security::string_match::MatchType;
use ipnet::IpNet;
use proptest::prelude::*;

use super::ConvertError;
use crate::authz::{Action, Authorization, Match, Scope, ServiceAccountMatch, StringMatch};

fn sm(t: MatchType) -> proto::StringMatch {
    proto::StringMatch { match_type: Some(t) }
}

fn addr(bytes: &[u8], length: u32) -> proto::Address {
    proto::Address { address: bytes.to_vec(), length }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap_or_else(|e| panic!("bad test CIDR {s}: {e}"))
}

fn wrap(m: proto::Match) -> proto::Authorization {
    proto::Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        rules: vec![proto::Rule { clauses: vec![proto::Clause { matches: vec![m] }] }],
        ..Default::default()
    }
}

fn only_match(a: &Authorization) -> &Match {
    &a.rules[0][0][0]
}

#[test]
fn full_policy_converts() {
    let p = proto::Authorization {
        name: "istio_converted_static_strict".into(),
        namespace: "istio-system".into(),
        scope: proto::Scope::WorkloadSelector as i32,
        action: proto::Action::Deny as i32,
        rules: vec![
            proto::Rule {
                clauses: vec![
                    proto::Clause {
                        matches: vec![proto::Match {
                            namespaces: vec![sm(MatchType::Exact("a".into()))],
                            not_namespaces: vec![sm(MatchType::Prefix("kube-".into()))],
                            service_accounts: vec![proto::ServiceAccountMatch {
                                namespace: "a".into(),
                                service_account: "b".into(),
                            }],
                            principals: vec![sm(MatchType::Suffix("/sa/b".into()))],
                            not_principals: vec![sm(MatchType::Presence(()))],
                            source_ips: vec![addr(&[10, 0, 0, 0], 8)],
                            not_destination_ips: vec![addr(
                                &[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                                128,
                            )],
                            destination_ports: vec![80, 65535],
                            not_destination_ports: vec![0],
                            ..Default::default()
                        }],
                    },
                    proto::Clause { matches: vec![] },
                ],
            },
            proto::Rule { clauses: vec![] },
        ],
        dry_run: true,
        extensions: vec![],
    };
    let got = Authorization::try_from(&p).unwrap_or_else(|e| panic!("{e}"));
    let want = Authorization {
        name: "istio_converted_static_strict".into(),
        namespace: "istio-system".into(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![
            vec![
                vec![Match {
                    namespaces: vec![StringMatch::Exact("a".into())],
                    not_namespaces: vec![StringMatch::Prefix("kube-".into())],
                    service_accounts: vec![ServiceAccountMatch {
                        namespace: "a".into(),
                        service_account: "b".into(),
                    }],
                    principals: vec![StringMatch::Suffix("/sa/b".into())],
                    not_principals: vec![StringMatch::Presence()],
                    source_ips: vec![net("10.0.0.0/8")],
                    not_destination_ips: vec![net("2001:db8::1/128")],
                    destination_ports: vec![80, 65535],
                    not_destination_ports: vec![0],
                    ..Match::default()
                }],
                vec![],
            ],
            vec![],
        ],
        dry_run: true,
    };
    assert_eq!(got, want);
    assert_eq!(Authorization::try_from(p.clone()), Ok(want));
}

#[test]
fn enum_values() {
    for (scope, want) in [(0, Scope::Global), (1, Scope::Namespace), (2, Scope::WorkloadSelector)] {
        let p = proto::Authorization { scope, ..Default::default() };
        assert_eq!(Authorization::try_from(&p).map(|a| a.scope), Ok(want));
    }
    for (action, want) in [(0, Action::Allow), (1, Action::Deny)] {
        let p = proto::Authorization { action, ..Default::default() };
        assert_eq!(Authorization::try_from(&p).map(|a| a.action), Ok(want));
    }
}

#[test]
fn unknown_enums_are_rejected_with_the_policy_key() {
    let p = proto::Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        action: 2, // e.g. AUDIT in some future API
        ..Default::default()
    };
    let err = Authorization::try_from(&p).err();
    assert_eq!(
        err,
        Some(ConvertError::InPolicy {
            policy: "ns/p".into(),
            error: Box::new(ConvertError::UnknownAction(2)),
        })
    );
    let text = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(text.starts_with("authorization policy ns/p: unknown action value 2"), "{text}");

    let p = proto::Authorization { scope: -1, ..Default::default() };
    assert!(matches!(
        Authorization::try_from(&p),
        Err(ConvertError::InPolicy { error, .. }) if *error == ConvertError::UnknownScope(-1)
    ));
}

#[test]
fn ports_above_u16_are_rejected() {
    for m in [
        proto::Match { destination_ports: vec![80, 65536], ..Default::default() },
        proto::Match { not_destination_ports: vec![u32::MAX], ..Default::default() },
    ] {
        let err = Authorization::try_from(&wrap(m)).err();
        let Some(ConvertError::InPolicy { policy, error }) = err else {
            panic!("expected a policy error, got {err:?}");
        };
        assert_eq!(policy, "ns/p");
        assert!(matches!(*error, ConvertError::PortOutOfRange(_)), "{error}");
        assert!(error.to_string().contains("above 65535"));
    }
}

#[test]
fn invalid_addresses_are_dropped() {
    let m = proto::Match {
        source_ips: vec![
            addr(&[10, 0, 0, 1], 32),
            addr(&[10, 0, 0], 24),      // 3 bytes
            addr(&[10, 0, 0, 1], 33),   // prefix too long for IPv4
            addr(&[], 0),               // empty
            addr(&[1; 16], 129),        // prefix too long for IPv6
            addr(&[1; 16], 300),        // does not even fit a u8
            addr(&[1; 5], 8),           // 5 bytes
            addr(&[192, 168, 0, 0], 0), // /0 is a valid prefix
        ],
        not_source_ips: vec![addr(&[1, 2, 3], 8)],
        destination_ips: vec![addr(&[0xff; 16], 64)],
        not_destination_ips: vec![addr(&[0; 17], 8)],
        ..Default::default()
    };
    let a = Authorization::try_from(&wrap(m)).unwrap_or_else(|e| panic!("{e}"));
    let got = only_match(&a);
    assert_eq!(got.source_ips, vec![net("10.0.0.1/32"), net("192.168.0.0/0")]);
    assert!(got.not_source_ips.is_empty());
    assert_eq!(got.destination_ips, vec![net("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/64")]);
    assert!(got.not_destination_ips.is_empty());
}

#[test]
fn string_match_without_type_is_dropped() {
    let m = proto::Match {
        principals: vec![
            proto::StringMatch { match_type: None },
            sm(MatchType::Exact("cluster.local/ns/a/sa/b".into())),
        ],
        not_namespaces: vec![proto::StringMatch { match_type: None }],
        ..Default::default()
    };
    let a = Authorization::try_from(&wrap(m)).unwrap_or_else(|e| panic!("{e}"));
    let got = only_match(&a);
    assert_eq!(got.principals, vec![StringMatch::Exact("cluster.local/ns/a/sa/b".into())]);
    assert!(got.not_namespaces.is_empty());
}

/// A match whose only entries were dropped becomes empty, and an empty match never matches.
#[test]
fn match_emptied_by_dropping_never_matches() {
    let m = proto::Match { source_ips: vec![addr(&[1, 2, 3], 8)], ..Default::default() };
    let a = Authorization::try_from(&wrap(m)).unwrap_or_else(|e| panic!("{e}"));
    assert!(only_match(&a).is_empty());
}

// ---- property: conversion never panics ----------------------------------------------------

fn arb_string_match() -> impl Strategy<Value = proto::StringMatch> {
    let s = "[a-z/.*]{0,8}";
    let t = prop_oneof![
        s.prop_map(MatchType::Exact),
        s.prop_map(MatchType::Prefix),
        s.prop_map(MatchType::Suffix),
        Just(MatchType::Presence(())),
    ];
    proptest::option::of(t).prop_map(|match_type| proto::StringMatch { match_type })
}

fn arb_address() -> impl Strategy<Value = proto::Address> {
    (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 4),
            prop::collection::vec(any::<u8>(), 16),
            prop::collection::vec(any::<u8>(), 0..20),
        ],
        prop_oneof![0u32..=129, any::<u32>()],
    )
        .prop_map(|(address, length)| proto::Address { address, length })
}

fn arb_sa() -> impl Strategy<Value = proto::ServiceAccountMatch> {
    ("[a-z]{0,3}", "[a-z]{0,3}")
        .prop_map(|(namespace, service_account)| proto::ServiceAccountMatch { namespace, service_account })
}

fn arb_match() -> impl Strategy<Value = proto::Match> {
    use prop::collection::vec;
    let ports = || vec(prop_oneof![0u32..=70000, any::<u32>()], 0..3);
    (
        (
            vec(arb_string_match(), 0..3),
            vec(arb_string_match(), 0..3),
            vec(arb_sa(), 0..2),
            vec(arb_sa(), 0..2),
            vec(arb_string_match(), 0..3),
            vec(arb_string_match(), 0..3),
        ),
        (
            vec(arb_address(), 0..3),
            vec(arb_address(), 0..3),
            vec(arb_address(), 0..3),
            vec(arb_address(), 0..3),
            ports(),
            ports(),
        ),
    )
        .prop_map(|((ns, nns, sas, nsas, pr, npr), (sip, nsip, dip, ndip, dp, ndp))| proto::Match {
            namespaces: ns,
            not_namespaces: nns,
            service_accounts: sas,
            not_service_accounts: nsas,
            principals: pr,
            not_principals: npr,
            source_ips: sip,
            not_source_ips: nsip,
            destination_ips: dip,
            not_destination_ips: ndip,
            destination_ports: dp,
            not_destination_ports: ndp,
            extensions: vec![],
        })
}

fn arb_authorization() -> impl Strategy<Value = proto::Authorization> {
    use prop::collection::vec;
    let rule = vec(vec(arb_match(), 0..3).prop_map(|matches| proto::Clause { matches }), 0..3)
        .prop_map(|clauses| proto::Rule { clauses });
    (
        "[a-z]{0,4}",
        "[a-z]{0,4}",
        prop_oneof![0i32..=3, any::<i32>()],
        prop_oneof![0i32..=2, any::<i32>()],
        vec(rule, 0..3),
        any::<bool>(),
    )
        .prop_map(|(name, namespace, scope, action, rules, dry_run)| proto::Authorization {
            name,
            namespace,
            scope,
            action,
            rules,
            dry_run,
            extensions: vec![],
        })
}

proptest! {
    /// Conversion never panics; on success the shape is preserved and exactly the documented
    /// entries were dropped; on failure the cause is one of the documented rejections.
    #[test]
    fn conversion_never_panics(p in arb_authorization()) {
        let bad_port = p.rules.iter().flat_map(|r| &r.clauses).flat_map(|c| &c.matches)
            .flat_map(|m| m.destination_ports.iter().chain(&m.not_destination_ports))
            .any(|&port| port > u32::from(u16::MAX));
        let bad_enum = !(0..=2).contains(&p.scope) || !(0..=1).contains(&p.action);
        match Authorization::try_from(&p) {
            Ok(a) => {
                prop_assert!(!bad_port && !bad_enum);
                prop_assert_eq!(a.rules.len(), p.rules.len());
                for (r, pr) in a.rules.iter().zip(&p.rules) {
                    prop_assert_eq!(r.len(), pr.clauses.len());
                    for (c, pc) in r.iter().zip(&pr.clauses) {
                        prop_assert_eq!(c.len(), pc.matches.len());
                        for (m, pm) in c.iter().zip(&pc.matches) {
                            let typed = pm.principals.iter().filter(|s| s.match_type.is_some()).count();
                            prop_assert_eq!(m.principals.len(), typed);
                            prop_assert!(m.source_ips.len() <= pm.source_ips.len());
                            prop_assert_eq!(m.destination_ports.len(), pm.destination_ports.len());
                        }
                    }
                }
            }
            Err(ConvertError::InPolicy { policy, error }) => {
                prop_assert_eq!(policy, format!("{}/{}", p.namespace, p.name));
                match *error {
                    ConvertError::PortOutOfRange(_) => prop_assert!(bad_port),
                    ConvertError::UnknownScope(_) | ConvertError::UnknownAction(_) => {
                        prop_assert!(bad_enum)
                    }
                    ConvertError::InPolicy { .. } => prop_assert!(false, "nested policy error"),
                }
            }
            Err(e) => prop_assert!(false, "error without policy context: {}", e),
        }
    }

    /// A well-formed address always converts, to the same bits and prefix.
    #[test]
    fn valid_addresses_round_trip(v4 in any::<[u8; 4]>(), l4 in 0u32..=32, v6 in any::<[u8; 16]>(), l6 in 0u32..=128) {
        let n4 = super::address_to_net(&addr(&v4, l4));
        prop_assert_eq!(n4.map(|n| (n.addr(), u32::from(n.prefix_len()))), Some((v4.into(), l4)));
        let n6 = super::address_to_net(&addr(&v6, l6));
        prop_assert_eq!(n6.map(|n| (n.addr(), u32::from(n.prefix_len()))), Some((v6.into(), l6)));
    }
}
