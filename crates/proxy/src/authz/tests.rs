//! Local-config and `/config_dump` shapes, and the evaluator checked against a reference model.

use std::net::IpAddr;

use ambit_identity::Identity;
use ipnet::{IpNet, Ipv4Net};
use proptest::prelude::*;

use super::eval::DenyReason;
use super::eval::tests::with_debug_logs;
use super::*;

// ---- serde: the §2 local config keys and the dump shape -----------------------------------

fn yaml(s: &str) -> Authorization {
    serde_saphyr::from_str(s).unwrap_or_else(|e| panic!("YAML did not parse: {e}\n{s}"))
}

#[test]
fn yaml_full_policy() {
    let got = yaml(
        r#"
name: deny-9999
namespace: default
scope: Namespace
action: Deny
dryRun: true
rules:
- - - namespaces: [{Exact: a}, {Prefix: "kube-"}]
      notNamespaces: [{Suffix: "-system"}]
      serviceAccounts: [{namespace: a, serviceAccount: b}]
      notServiceAccounts: [{namespace: a, serviceAccount: c}]
      principals: [{Exact: "cluster.local/ns/a/sa/b"}]
      notPrincipals: [{Presence: []}]
      sourceIps: ["10.0.0.0/8", "2001:db8::/32"]
      notSourceIps: ["10.1.0.0/16"]
      destinationIps: ["10.0.0.2/32"]
      notDestinationIps: ["10.0.0.3/32"]
      destinationPorts: [80, 8080]
      notDestinationPorts: [9999]
  - []
- []
"#,
    );
    let net = |s: &str| s.parse::<IpNet>().unwrap_or_else(|e| panic!("{e}"));
    let want = Authorization {
        name: "deny-9999".into(),
        namespace: "default".into(),
        scope: Scope::Namespace,
        action: Action::Deny,
        dry_run: true,
        rules: vec![
            vec![
                vec![Match {
                    namespaces: vec![StringMatch::Exact("a".into()), StringMatch::Prefix("kube-".into())],
                    not_namespaces: vec![StringMatch::Suffix("-system".into())],
                    service_accounts: vec![ServiceAccountMatch {
                        namespace: "a".into(),
                        service_account: "b".into(),
                    }],
                    not_service_accounts: vec![ServiceAccountMatch {
                        namespace: "a".into(),
                        service_account: "c".into(),
                    }],
                    principals: vec![StringMatch::Exact("cluster.local/ns/a/sa/b".into())],
                    not_principals: vec![StringMatch::Presence()],
                    source_ips: vec![net("10.0.0.0/8"), net("2001:db8::/32")],
                    not_source_ips: vec![net("10.1.0.0/16")],
                    destination_ips: vec![net("10.0.0.2/32")],
                    not_destination_ips: vec![net("10.0.0.3/32")],
                    destination_ports: vec![80, 8080],
                    not_destination_ports: vec![9999],
                }],
                vec![],
            ],
            vec![],
        ],
    };
    assert_eq!(got, want);
}

#[test]
fn yaml_flow_style_and_defaults() {
    let got =
        yaml(r#"{name: p, namespace: ns, rules: [[[{principals: [{Exact: "cluster.local/ns/a/sa/b"}]}]]]}"#);
    assert_eq!(got.scope, Scope::Global);
    assert_eq!(got.action, Action::Allow);
    assert!(!got.dry_run);
    assert_eq!(
        got.rules,
        vec![vec![vec![Match {
            principals: vec![StringMatch::Exact("cluster.local/ns/a/sa/b".into())],
            ..Match::default()
        }]]]
    );
    assert!(yaml("{name: p, namespace: ns}").rules.is_empty());
}

#[test]
fn yaml_static_strict_policy() {
    let got = yaml(
        "name: istio_converted_static_strict\nnamespace: istio-system\nscope: WorkloadSelector\n\
         action: Deny\nrules: [[[{notPrincipals: [{Presence: []}]}]]]\n",
    );
    assert_eq!(got.rules[0][0][0].not_principals, vec![StringMatch::Presence()]);
    assert_eq!(got.scope, Scope::WorkloadSelector);
}

#[test]
fn yaml_rejects_bad_values() {
    for bad in [
        "{name: p, namespace: ns, rules: [[[{sourceIps: [\"10.0.0.0/33\"]}]]]}",
        "{name: p, namespace: ns, rules: [[[{sourceIps: [\"not-an-ip\"]}]]]}",
        "{name: p, namespace: ns, rules: [[[{destinationPorts: [65536]}]]]}",
        "{name: p, namespace: ns, rules: [[[{principals: [{Regex: x}]}]]]}",
        "{name: p, namespace: ns, action: Audit}",
        "{name: p, namespace: ns, scope: global}",
        "{namespace: ns}",
    ] {
        assert!(serde_saphyr::from_str::<Authorization>(bad).is_err(), "accepted: {bad}");
    }
}

#[test]
fn json_dump_shape() {
    let p = Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![vec![vec![Match {
            not_principals: vec![StringMatch::Presence()],
            principals: vec![StringMatch::Suffix("/sa/b".into())],
            source_ips: vec![
                Ipv4Net::new(std::net::Ipv4Addr::new(10, 0, 0, 0), 8)
                    .map(IpNet::V4)
                    .unwrap_or_else(|e| panic!("{e}")),
            ],
            destination_ports: vec![80],
            ..Match::default()
        }]]],
        dry_run: false,
    };
    let json = serde_json::to_value(&p).unwrap_or_else(|e| panic!("{e}"));
    let m = &json["rules"][0][0][0];
    assert_eq!(m["notPrincipals"], serde_json::json!([{"Presence": []}]));
    assert_eq!(m["principals"], serde_json::json!([{"Suffix": "/sa/b"}]));
    assert_eq!(m["sourceIps"], serde_json::json!(["10.0.0.0/8"]));
    assert_eq!(m["destinationPorts"], serde_json::json!([80]));
    assert_eq!(json["scope"], "WorkloadSelector");
    assert_eq!(json["action"], "Deny");
    assert_eq!(json["dryRun"], false);

    // The dump parses back, from JSON and from its YAML rendering.
    let back: Authorization = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, p);
    let y = serde_saphyr::to_string(&p).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(yaml(&y), p, "{y}");
}

#[test]
fn presence_spellings() {
    for json in [r#"{"Presence":[]}"#, r#"{"Presence":null}"#, r#"{"Presence":{}}"#] {
        let parsed: Result<StringMatch, _> = serde_json::from_str(json);
        assert_eq!(parsed.ok(), Some(StringMatch::Presence()), "{json}");
        let value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
        let parsed: Result<StringMatch, _> = serde_json::from_value(value);
        assert_eq!(parsed.ok(), Some(StringMatch::Presence()), "{json} via Value");
    }
    for y in ["{Presence: []}", "{Presence: ~}", "{Presence: {}}", "Presence: []"] {
        let parsed: Result<StringMatch, _> = serde_saphyr::from_str(y);
        assert_eq!(parsed.ok(), Some(StringMatch::Presence()), "{y}");
    }
    for bad in [r#"{"Presence":[1]}"#, r#"{"Presence":"x"}"#, r#"{"Presence":{"a":1}}"#] {
        assert!(serde_json::from_str::<StringMatch>(bad).is_err(), "{bad}");
    }
    assert_eq!(serde_json::to_string(&StringMatch::Presence()).unwrap_or_default(), r#"{"Presence":[]}"#);
}

// ---- reference model ---------------------------------------------------------------------

/// The evaluator written the obvious way: owned principal strings, four passes in §5.2 order,
/// IPv4-mapped ranges rewritten to IPv4 before comparing.
fn reference(policies: &[Authorization], conn: &Connection) -> Decision {
    let principal =
        conn.src_identity.as_ref().map(|i| i.to_string().trim_start_matches("spiffe://").to_owned());
    let namespace = conn.src_identity.as_ref().map(|i| i.namespace.clone());
    let sa = conn.src_identity.as_ref().map(|i| (i.namespace.clone(), i.service_account.clone()));
    let src = conn.src_ip.to_canonical();
    let dst = conn.dst_ip.to_canonical();

    let str_ok = |m: &StringMatch, v: &Option<String>| match (m, v) {
        (_, None) => false,
        (StringMatch::Exact(s), Some(v)) => v == s,
        (StringMatch::Prefix(s), Some(v)) => v.starts_with(s.as_str()),
        (StringMatch::Suffix(s), Some(v)) => v.ends_with(s.as_str()),
        (StringMatch::Presence(), Some(v)) => !v.is_empty(),
    };
    let ip_ok = |n: &IpNet, ip: IpAddr| match (canonical_net(n), ip) {
        (IpNet::V4(n), IpAddr::V4(ip)) => n.contains(&ip),
        (IpNet::V6(n), IpAddr::V6(ip)) => n.contains(&ip),
        _ => false,
    };
    let list = |pos_hits: Vec<bool>, neg_hits: Vec<bool>| {
        (pos_hits.is_empty() || pos_hits.contains(&true)) && !neg_hits.contains(&true)
    };
    let match_ok = |m: &Match| {
        if *m == Match::default() {
            return false;
        }
        let sa_ok = |s: &ServiceAccountMatch| {
            sa.as_ref().is_some_and(|(ns, name)| *ns == s.namespace && *name == s.service_account)
        };
        let checks = [
            list(
                m.namespaces.iter().map(|s| str_ok(s, &namespace)).collect(),
                m.not_namespaces.iter().map(|s| str_ok(s, &namespace)).collect(),
            ),
            list(
                m.service_accounts.iter().map(sa_ok).collect(),
                m.not_service_accounts.iter().map(sa_ok).collect(),
            ),
            list(
                m.principals.iter().map(|s| str_ok(s, &principal)).collect(),
                m.not_principals.iter().map(|s| str_ok(s, &principal)).collect(),
            ),
            list(
                m.source_ips.iter().map(|n| ip_ok(n, src)).collect(),
                m.not_source_ips.iter().map(|n| ip_ok(n, src)).collect(),
            ),
            list(
                m.destination_ips.iter().map(|n| ip_ok(n, dst)).collect(),
                m.not_destination_ips.iter().map(|n| ip_ok(n, dst)).collect(),
            ),
            list(
                m.destination_ports.iter().map(|p| *p == conn.dst_port).collect(),
                m.not_destination_ports.iter().map(|p| *p == conn.dst_port).collect(),
            ),
        ];
        checks.iter().all(|c| *c)
    };
    let policy_ok = |p: &Authorization| {
        let mut any_rule = false;
        for rule in &p.rules {
            let mut all_clauses = true;
            for clause in rule {
                if !clause.is_empty() && !clause.iter().any(match_ok) {
                    all_clauses = false;
                }
            }
            any_rule |= all_clauses;
        }
        any_rule
    };

    for p in policies.iter().filter(|p| p.action == Action::Deny && !p.dry_run) {
        if policy_ok(p) {
            return Decision::Deny(DenyReason::ExplicitDeny(format!("{}/{}", p.namespace, p.name)));
        }
    }
    let allows: Vec<&Authorization> =
        policies.iter().filter(|p| p.action == Action::Allow && !p.dry_run).collect();
    if allows.is_empty() || allows.into_iter().any(policy_ok) {
        Decision::Allow
    } else {
        Decision::Deny(DenyReason::NoAllowMatch)
    }
}

/// A range inside `::ffff:0:0/96` as the IPv4 range it denotes; anything else unchanged.
fn canonical_net(n: &IpNet) -> IpNet {
    if let IpNet::V6(v6) = n
        && v6.prefix_len() >= 96
        && let Some(v4) = v6.network().to_ipv4_mapped()
        && let Ok(net) = Ipv4Net::new(v4, v6.prefix_len() - 96)
    {
        return IpNet::V4(net);
    }
    *n
}

// ---- strategies over a small universe, so that matches actually happen --------------------

const STRINGS: &[&str] = &[
    "",
    "a",
    "b",
    "cluster.local",
    "cluster.local/ns/a/sa/b",
    "cluster.local/ns/a/sa/bb",
    "cluster.local/ns/a/sa/",
    "cluster.local/ns/a",
    "/ns/a/sa/b",
    "local/ns/b/sa/a",
    "/sa/b",
    "a/sa/a",
    "td/ns/a/sa/a",
    "spiffe://cluster.local/ns/a/sa/b",
];
const IPS: &[&str] = &["10.0.0.1", "10.0.0.2", "::ffff:10.0.0.1", "2001:db8::1", "192.168.1.1"];
const NETS: &[&str] = &[
    "10.0.0.0/24",
    "10.0.0.1/32",
    "0.0.0.0/0",
    "::ffff:10.0.0.0/120",
    "::ffff:10.0.0.2/128",
    "::/0",
    "2001:db8::/32",
    "192.168.0.0/16",
];
const PORTS: &[u16] = &[80, 8080, 9999];

fn arb_string_match() -> impl Strategy<Value = StringMatch> {
    let s = prop::sample::select(STRINGS).prop_map(String::from);
    prop_oneof![
        s.clone().prop_map(StringMatch::Exact),
        s.clone().prop_map(StringMatch::Prefix),
        s.prop_map(StringMatch::Suffix),
        Just(StringMatch::Presence()),
    ]
}

fn arb_sa() -> impl Strategy<Value = ServiceAccountMatch> {
    (prop::sample::select(&["a", "b"][..]), prop::sample::select(&["a", "b"][..]))
        .prop_map(|(ns, sa)| ServiceAccountMatch { namespace: ns.into(), service_account: sa.into() })
}

fn arb_net() -> impl Strategy<Value = IpNet> {
    prop::sample::select(NETS).prop_map(|s| s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
}

fn arb_ip() -> impl Strategy<Value = IpAddr> {
    prop::sample::select(IPS).prop_map(|s| s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
}

/// Mostly empty lists, so that a Match has only a few families set.
fn sparse<S: Strategy>(s: S) -> impl Strategy<Value = Vec<S::Value>>
where
    S::Value: std::fmt::Debug + Clone,
{
    prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(s, 1..=2)]
}

fn arb_match() -> impl Strategy<Value = Match> {
    let port = || prop::sample::select(PORTS);
    (
        (
            sparse(arb_string_match()),
            sparse(arb_string_match()),
            sparse(arb_sa()),
            sparse(arb_sa()),
            sparse(arb_string_match()),
            sparse(arb_string_match()),
        ),
        (
            sparse(arb_net()),
            sparse(arb_net()),
            sparse(arb_net()),
            sparse(arb_net()),
            sparse(port()),
            sparse(port()),
        ),
    )
        .prop_map(|((ns, nns, sas, nsas, pr, npr), (sip, nsip, dip, ndip, dp, ndp))| Match {
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
        })
}

fn arb_policy() -> impl Strategy<Value = Authorization> {
    use prop::collection::vec;
    (
        prop::sample::select(&["p0", "p1", "p2"][..]),
        prop_oneof![Just(Action::Allow), Just(Action::Deny)],
        prop_oneof![Just(Scope::Global), Just(Scope::Namespace), Just(Scope::WorkloadSelector)],
        prop_oneof![4 => Just(false), 1 => Just(true)],
        vec(vec(vec(arb_match(), 0..=2), 0..=2), 0..=2),
    )
        .prop_map(|(name, action, scope, dry_run, rules)| Authorization {
            name: name.into(),
            namespace: "ns".into(),
            scope,
            action,
            rules,
            dry_run,
        })
}

fn arb_connection() -> impl Strategy<Value = Connection> {
    let id = (
        prop::sample::select(&["cluster.local", "td"][..]),
        prop::sample::select(&["a", "b"][..]),
        prop::sample::select(&["a", "b", "bb"][..]),
    )
        .prop_map(|(td, ns, sa)| Identity::new(td, ns, sa));
    (arb_ip(), proptest::option::of(id), arb_ip(), prop::sample::select(PORTS)).prop_map(
        |(src_ip, src_identity, dst_ip, dst_port)| Connection { src_ip, src_identity, dst_ip, dst_port },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The evaluator agrees with the reference model, with and without debug logging (which
    /// changes how far the single pass goes).
    #[test]
    fn evaluate_matches_reference(
        policies in prop::collection::vec(arb_policy(), 0..=4),
        conn in arb_connection(),
    ) {
        let want = reference(&policies, &conn);
        prop_assert_eq!(evaluate(&policies, &conn), want.clone());
        let (logged, _) = with_debug_logs(|| evaluate(&policies, &conn));
        prop_assert_eq!(logged, want);
    }

    /// Piecewise principal comparison agrees with comparing the built string.
    #[test]
    fn principal_pieces_match_the_string(
        td in "[a.]{1,3}", ns in "[a/]{1,3}", sa in "[as/]{1,3}",
        pat in "[a./ns]{0,14}", kind in 0u8..4,
    ) {
        let id = Identity::new(&td, &ns, &sa);
        let full = format!("{td}/ns/{ns}/sa/{sa}");
        let m = match kind {
            0 => StringMatch::Exact(pat.clone()),
            1 => StringMatch::Prefix(pat.clone()),
            2 => StringMatch::Suffix(pat.clone()),
            _ => StringMatch::Presence(),
        };
        prop_assert_eq!(m.matches_principal(&id), m.matches(&full), "{:?} vs {}", m, full);
        // Also the exact principal itself and its proper prefixes/suffixes.
        prop_assert!(StringMatch::Exact(full.clone()).matches_principal(&id));
        for cut in 0..=full.len() {
            prop_assert!(StringMatch::Prefix(full[..cut].to_owned()).matches_principal(&id));
            prop_assert!(StringMatch::Suffix(full[cut..].to_owned()).matches_principal(&id));
        }
    }
}
