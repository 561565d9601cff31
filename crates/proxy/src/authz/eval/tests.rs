//! Table tests for each matching rule and the evaluation order, plus the spec §5 scenarios.

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use ambit_identity::Identity;
use ipnet::IpNet;

use super::{DenyReason, evaluate, net_contains, policy_matches};
use crate::authz::{
    Action, Authorization, Connection, Decision, Match, Scope, ServiceAccountMatch, StringMatch,
};

// ---- helpers -------------------------------------------------------------------------------

/// Rules of a policy: OR of rules, each an AND of clauses, each an OR of matches.
type Rules = Vec<Vec<Vec<Match>>>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("bad test IP {s}: {e}"))
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap_or_else(|e| panic!("bad test CIDR {s}: {e}"))
}

fn ident(ns: &str, sa: &str) -> Identity {
    Identity::new("cluster.local", ns, sa)
}

/// mTLS connection from 10.0.0.1 with identity ns/sa to 10.0.0.2:port.
fn mtls(ns: &str, sa: &str, port: u16) -> Connection {
    Connection {
        src_ip: ip("10.0.0.1"),
        src_identity: Some(ident(ns, sa)),
        dst_ip: ip("10.0.0.2"),
        dst_port: port,
    }
}

/// Plaintext connection from 10.0.0.1 to 10.0.0.2:port.
fn plain(port: u16) -> Connection {
    Connection { src_ip: ip("10.0.0.1"), src_identity: None, dst_ip: ip("10.0.0.2"), dst_port: port }
}

fn exact(s: &str) -> StringMatch {
    StringMatch::Exact(s.into())
}

fn prefix(s: &str) -> StringMatch {
    StringMatch::Prefix(s.into())
}

fn suffix(s: &str) -> StringMatch {
    StringMatch::Suffix(s.into())
}

fn sa(ns: &str, sa: &str) -> ServiceAccountMatch {
    ServiceAccountMatch { namespace: ns.into(), service_account: sa.into() }
}

fn policy(name: &str, action: Action, rules: Rules) -> Authorization {
    Authorization {
        name: name.into(),
        namespace: "ns".into(),
        scope: Scope::Namespace,
        action,
        rules,
        dry_run: false,
    }
}

/// One rule of one clause of one match.
fn single(m: Match) -> Rules {
    vec![vec![vec![m]]]
}

fn ports(p: &[u16]) -> Match {
    Match { destination_ports: p.to_vec(), ..Match::default() }
}

fn denied_by(key: &str) -> Decision {
    Decision::Deny(DenyReason::ExplicitDeny(key.into()))
}

const NOT_ALLOWED: Decision = Decision::Deny(DenyReason::NoAllowMatch);

// ---- one Match, field family by field family -----------------------------------------------

#[test]
fn match_field_families() {
    let mapped_src = Connection { src_ip: ip("::ffff:10.0.0.1"), dst_ip: ip("::ffff:10.0.0.2"), ..plain(80) };
    let v6 = Connection { src_ip: ip("2001:db8::1"), dst_ip: ip("2001:db8::2"), ..plain(80) };
    let m = Match::default;
    #[rustfmt::skip]
    let table: Vec<(&str, Match, Connection, bool)> = vec![
        ("empty match never matches", m(), mtls("a", "b", 80), false),
        // ports
        ("port in list", Match { destination_ports: vec![81, 80], ..m() }, plain(80), true),
        ("port not in list", Match { destination_ports: vec![81], ..m() }, plain(80), false),
        ("negated port hit", Match { not_destination_ports: vec![80], ..m() }, plain(80), false),
        ("negated port miss", Match { not_destination_ports: vec![81], ..m() }, plain(80), true),
        ("positive and negative", Match { destination_ports: vec![80, 81], not_destination_ports: vec![81], ..m() }, plain(81), false),
        // source IPs
        ("src in CIDR", Match { source_ips: vec![net("10.0.0.0/24")], ..m() }, plain(80), true),
        ("src host", Match { source_ips: vec![net("10.0.0.1/32")], ..m() }, plain(80), true),
        ("src outside CIDR", Match { source_ips: vec![net("10.0.1.0/24")], ..m() }, plain(80), false),
        ("negated src hit", Match { not_source_ips: vec![net("10.0.0.0/8")], ..m() }, plain(80), false),
        ("negated src miss", Match { not_source_ips: vec![net("192.168.0.0/16")], ..m() }, plain(80), true),
        ("v4-mapped src vs v4 CIDR", Match { source_ips: vec![net("10.0.0.0/24")], ..m() }, mapped_src.clone(), true),
        ("v4 src vs mapped CIDR", Match { source_ips: vec![net("::ffff:10.0.0.0/120")], ..m() }, plain(80), true),
        ("v4 src vs ::/0", Match { source_ips: vec![net("::/0")], ..m() }, plain(80), false),
        ("v4 src vs 0.0.0.0/0", Match { source_ips: vec![net("0.0.0.0/0")], ..m() }, plain(80), true),
        ("v6 src vs v6 CIDR", Match { source_ips: vec![net("2001:db8::/32")], ..m() }, v6.clone(), true),
        ("v6 src vs v4 CIDR", Match { source_ips: vec![net("0.0.0.0/0")], ..m() }, v6.clone(), false),
        // destination IPs
        ("dst in CIDR", Match { destination_ips: vec![net("10.0.0.2/32")], ..m() }, plain(80), true),
        ("dst outside CIDR", Match { destination_ips: vec![net("10.0.0.1/32")], ..m() }, plain(80), false),
        ("negated dst hit", Match { not_destination_ips: vec![net("10.0.0.2/32")], ..m() }, plain(80), false),
        ("negated dst miss", Match { not_destination_ips: vec![net("10.0.0.1/32")], ..m() }, plain(80), true),
        ("v4-mapped dst", Match { destination_ips: vec![net("10.0.0.2/32")], ..m() }, mapped_src, true),
        ("v6 dst", Match { destination_ips: vec![net("2001:db8::2/128")], ..m() }, v6, true),
        // namespaces
        ("ns exact", Match { namespaces: vec![exact("a")], ..m() }, mtls("a", "b", 80), true),
        ("ns exact miss", Match { namespaces: vec![exact("ab")], ..m() }, mtls("a", "b", 80), false),
        ("ns prefix", Match { namespaces: vec![prefix("te")], ..m() }, mtls("team", "b", 80), true),
        ("ns suffix", Match { namespaces: vec![suffix("am")], ..m() }, mtls("team", "b", 80), true),
        ("ns presence", Match { namespaces: vec![StringMatch::Presence()], ..m() }, mtls("a", "b", 80), true),
        ("ns any of", Match { namespaces: vec![exact("x"), exact("a")], ..m() }, mtls("a", "b", 80), true),
        ("ns plaintext", Match { namespaces: vec![StringMatch::Presence()], ..m() }, plain(80), false),
        ("ns plaintext empty exact", Match { namespaces: vec![exact("")], ..m() }, plain(80), false),
        ("negated ns hit", Match { not_namespaces: vec![exact("a")], ..m() }, mtls("a", "b", 80), false),
        ("negated ns miss", Match { not_namespaces: vec![exact("x")], ..m() }, mtls("a", "b", 80), true),
        ("negated ns plaintext", Match { not_namespaces: vec![StringMatch::Presence()], ..m() }, plain(80), true),
        // service accounts
        ("sa hit", Match { service_accounts: vec![sa("a", "b")], ..m() }, mtls("a", "b", 80), true),
        ("sa wrong ns", Match { service_accounts: vec![sa("x", "b")], ..m() }, mtls("a", "b", 80), false),
        ("sa wrong name", Match { service_accounts: vec![sa("a", "x")], ..m() }, mtls("a", "b", 80), false),
        ("sa plaintext", Match { service_accounts: vec![sa("", "")], ..m() }, plain(80), false),
        ("negated sa hit", Match { not_service_accounts: vec![sa("a", "b")], ..m() }, mtls("a", "b", 80), false),
        ("negated sa miss", Match { not_service_accounts: vec![sa("a", "x")], ..m() }, mtls("a", "b", 80), true),
        ("negated sa plaintext", Match { not_service_accounts: vec![sa("a", "b")], ..m() }, plain(80), true),
        // principals
        ("principal exact", Match { principals: vec![exact("cluster.local/ns/a/sa/b")], ..m() }, mtls("a", "b", 80), true),
        ("principal with scheme", Match { principals: vec![exact("spiffe://cluster.local/ns/a/sa/b")], ..m() }, mtls("a", "b", 80), false),
        ("principal exact longer", Match { principals: vec![exact("cluster.local/ns/a/sa/bc")], ..m() }, mtls("a", "b", 80), false),
        ("principal exact shorter", Match { principals: vec![exact("cluster.local/ns/a/sa/")], ..m() }, mtls("a", "b", 80), false),
        ("principal prefix", Match { principals: vec![prefix("cluster.local/ns/a/")], ..m() }, mtls("a", "b", 80), true),
        ("principal prefix miss", Match { principals: vec![prefix("cluster.local/ns/b/")], ..m() }, mtls("a", "b", 80), false),
        ("principal suffix", Match { principals: vec![suffix("/sa/b")], ..m() }, mtls("a", "b", 80), true),
        ("principal suffix across pieces", Match { principals: vec![suffix("local/ns/a/sa/b")], ..m() }, mtls("a", "b", 80), true),
        ("principal suffix miss", Match { principals: vec![suffix("/sa/c")], ..m() }, mtls("a", "b", 80), false),
        ("principal presence", Match { principals: vec![StringMatch::Presence()], ..m() }, mtls("a", "b", 80), true),
        ("principal plaintext presence", Match { principals: vec![StringMatch::Presence()], ..m() }, plain(80), false),
        ("principal plaintext empty exact", Match { principals: vec![exact("")], ..m() }, plain(80), false),
        ("principal plaintext empty prefix", Match { principals: vec![prefix("")], ..m() }, plain(80), false),
        ("negated principal hit", Match { not_principals: vec![exact("cluster.local/ns/a/sa/b")], ..m() }, mtls("a", "b", 80), false),
        ("negated principal miss", Match { not_principals: vec![exact("cluster.local/ns/a/sa/c")], ..m() }, mtls("a", "b", 80), true),
        ("negated presence, mTLS", Match { not_principals: vec![StringMatch::Presence()], ..m() }, mtls("a", "b", 80), false),
        ("negated presence, plaintext", Match { not_principals: vec![StringMatch::Presence()], ..m() }, plain(80), true),
        // AND across families
        ("all families pass", Match {
            namespaces: vec![exact("a")], service_accounts: vec![sa("a", "b")],
            principals: vec![suffix("/sa/b")], source_ips: vec![net("10.0.0.0/8")],
            destination_ips: vec![net("10.0.0.2/32")], destination_ports: vec![80], ..m()
        }, mtls("a", "b", 80), true),
        ("one family fails", Match { destination_ports: vec![80], namespaces: vec![exact("x")], ..m() }, mtls("a", "b", 80), false),
        ("negation fails the AND", Match { destination_ports: vec![80], not_source_ips: vec![net("10.0.0.1/32")], ..m() }, plain(80), false),
    ];
    for (name, m, conn, want) in table {
        let p = policy("p", Action::Allow, single(m));
        assert_eq!(policy_matches(&p, &conn), want, "{name}");
    }
}

#[test]
fn net_contains_is_family_aware() {
    assert!(net_contains(&net("::ffff:0:0/96"), ip("1.2.3.4")));
    assert!(!net_contains(&net("::ffff:10.0.0.0/120"), ip("10.0.1.1")));
    // A range that only partly overlaps the mapped space does not match IPv4 peers.
    assert!(!net_contains(&net("::/64"), ip("1.2.3.4")));
    assert!(!net_contains(&net("::ffff:0:0/95"), ip("1.2.3.4")));
    assert!(!net_contains(&net("::/0"), ip("1.2.3.4")));
    assert!(!net_contains(&net("10.0.0.0/8"), ip("::1")));
}

// ---- rule / clause structure ---------------------------------------------------------------

#[test]
fn rule_and_clause_structure() {
    let conn = mtls("a", "b", 80);
    let hit = || ports(&[80]);
    let miss = || ports(&[81]);
    #[rustfmt::skip]
    let table: Vec<(&str, Rules, bool)> = vec![
        ("zero rules never match", vec![], false),
        ("rule with zero clauses matches", vec![vec![]], true),
        ("clause with zero matches counts as matched", vec![vec![vec![], vec![hit()]]], true),
        ("zero-match clause does not rescue a failing clause", vec![vec![vec![], vec![miss()]]], false),
        ("only an empty Match never matches", vec![vec![vec![Match::default()]]], false),
        ("empty Match is skipped among others", vec![vec![vec![Match::default(), hit()]]], true),
        ("clause is OR of matches", vec![vec![vec![miss(), hit()]]], true),
        ("rule is AND of clauses", vec![vec![vec![hit()], vec![miss()]]], false),
        ("rule is AND of clauses, all pass", vec![vec![vec![hit()], vec![hit()]]], true),
        ("policy is OR of rules", vec![vec![vec![miss()]], vec![vec![hit()]]], true),
        ("no rule matches", vec![vec![vec![miss()]], vec![vec![miss()]]], false),
    ];
    for (name, rules, want) in table {
        let p = policy("p", Action::Deny, rules);
        assert_eq!(policy_matches(&p, &conn), want, "{name}");
    }
}

// ---- evaluation order (§5.2) ---------------------------------------------------------------

#[test]
fn evaluation_order() {
    let conn = mtls("a", "b", 80);
    let allow_hit = policy("allow-hit", Action::Allow, single(ports(&[80])));
    let allow_miss = policy("allow-miss", Action::Allow, single(ports(&[81])));
    let deny_hit = policy("deny-hit", Action::Deny, single(ports(&[80])));
    let deny_hit2 = policy("deny-hit2", Action::Deny, single(ports(&[80])));
    let deny_miss = policy("deny-miss", Action::Deny, single(ports(&[81])));
    let dry = |p: &Authorization| Authorization { dry_run: true, ..p.clone() };
    #[rustfmt::skip]
    let table: Vec<(&str, Vec<Authorization>, Decision)> = vec![
        ("no policies: default allow", vec![], Decision::Allow),
        ("non-matching deny only", vec![deny_miss.clone()], Decision::Allow),
        ("matching deny", vec![deny_hit.clone()], denied_by("ns/deny-hit")),
        ("deny beats allow, deny last", vec![allow_hit.clone(), deny_hit.clone()], denied_by("ns/deny-hit")),
        ("deny beats allow, deny first", vec![deny_hit.clone(), allow_hit.clone()], denied_by("ns/deny-hit")),
        ("first matching deny is named", vec![deny_miss.clone(), deny_hit2.clone(), deny_hit.clone()], denied_by("ns/deny-hit2")),
        ("allow exists, none matches", vec![allow_miss.clone()], NOT_ALLOWED),
        ("one of several allows matches", vec![allow_miss.clone(), allow_hit.clone()], Decision::Allow),
        ("dry-run deny only logs", vec![dry(&deny_hit)], Decision::Allow),
        ("dry-run deny does not hide an enforced deny", vec![dry(&deny_hit), deny_hit2.clone()], denied_by("ns/deny-hit2")),
        ("dry-run allow alone is no allow policy", vec![dry(&allow_miss)], Decision::Allow),
        ("dry-run allow does not allow", vec![dry(&allow_hit), allow_miss.clone()], NOT_ALLOWED),
        ("dry-run deny plus allow", vec![dry(&deny_hit), allow_hit.clone()], Decision::Allow),
    ];
    for (name, policies, want) in table {
        assert_eq!(evaluate(&policies, &conn), want, "{name} (no subscriber)");
        let (got, _) = with_debug_logs(|| evaluate(&policies, &conn));
        assert_eq!(got, want, "{name} (debug logging on)");
    }
}

#[test]
fn scope_does_not_matter_to_evaluate() {
    for scope in [Scope::Global, Scope::Namespace, Scope::WorkloadSelector] {
        let p = Authorization { scope, ..policy("d", Action::Deny, single(ports(&[80]))) };
        assert_eq!(evaluate([&p], &plain(80)), denied_by("ns/d"), "{scope:?}");
    }
}

#[test]
fn deny_reason_texts() {
    assert_eq!(DenyReason::ExplicitDeny("ns/name".into()).to_string(), "explicitly denied by: ns/name");
    assert_eq!(DenyReason::NoAllowMatch.to_string(), "allow policies exist, but none allowed");
}

#[test]
fn dry_run_results_are_logged_at_debug() {
    let conn = mtls("a", "b", 80);
    let dry_deny = Authorization { dry_run: true, ..policy("dry-deny", Action::Deny, single(ports(&[80]))) };
    let dry_allow =
        Authorization { dry_run: true, ..policy("dry-allow", Action::Allow, single(ports(&[80]))) };
    let dry_allow_miss =
        Authorization { dry_run: true, ..policy("dry-allow-miss", Action::Allow, single(ports(&[81]))) };

    let (d, logs) = with_debug_logs(|| evaluate([&dry_deny, &dry_allow], &conn));
    assert_eq!(d, Decision::Allow);
    assert!(logs.contains("ns/dry-deny"), "{logs}");
    assert!(logs.contains("would deny"), "{logs}");
    assert!(logs.contains("ns/dry-allow"), "{logs}");
    assert!(logs.contains("would allow"), "{logs}");

    let (d, logs) = with_debug_logs(|| evaluate([&dry_allow_miss], &conn));
    assert_eq!(d, Decision::Allow);
    assert!(logs.contains("none would allow"), "{logs}");
}

// ---- spec §5.4 / §5.5 / §2 scenarios -------------------------------------------------------

/// §5.4: `istio-system/istio_converted_static_strict` rejects plaintext and lets mTLS through.
#[test]
fn static_strict_policy() {
    let strict = Authorization {
        name: "istio_converted_static_strict".into(),
        namespace: "istio-system".into(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: single(Match { not_principals: vec![StringMatch::Presence()], ..Match::default() }),
        dry_run: false,
    };
    assert_eq!(evaluate([&strict], &plain(80)), denied_by("istio-system/istio_converted_static_strict"));
    assert_eq!(
        evaluate([&strict], &plain(80)).to_deny_text().as_deref(),
        Some("explicitly denied by: istio-system/istio_converted_static_strict")
    );
    assert_eq!(evaluate([&strict], &mtls("a", "b", 80)), Decision::Allow);
}

/// §5.4: port-level mTLS exceptions and additions.
#[test]
fn converted_port_level_peer_authentication() {
    // STRICT workload, port 8080 PERMISSIVE: the rule gains a `notDestinationPorts` clause.
    let permissive_port = policy(
        "converted_peer_authentication_pa",
        Action::Deny,
        vec![vec![
            vec![Match { not_principals: vec![StringMatch::Presence()], ..Match::default() }],
            vec![Match { not_destination_ports: vec![8080], ..Match::default() }],
        ]],
    );
    assert_eq!(evaluate([&permissive_port], &plain(8080)), Decision::Allow);
    assert!(matches!(evaluate([&permissive_port], &plain(9090)), Decision::Deny(_)));
    assert_eq!(evaluate([&permissive_port], &mtls("a", "b", 9090)), Decision::Allow);

    // PERMISSIVE workload, port 9090 STRICT: one match with both fields.
    let strict_port = policy(
        "converted_peer_authentication_pa",
        Action::Deny,
        single(Match {
            not_principals: vec![StringMatch::Presence()],
            destination_ports: vec![9090],
            ..Match::default()
        }),
    );
    assert!(matches!(evaluate([&strict_port], &plain(9090)), Decision::Deny(_)));
    assert_eq!(evaluate([&strict_port], &plain(8080)), Decision::Allow);
    assert_eq!(evaluate([&strict_port], &mtls("a", "b", 9090)), Decision::Allow);
}

/// §5.5: an AuthorizationPolicy with `spec: {}` denies everything; a rule `{}` allows all.
#[test]
fn empty_policy_and_empty_rule() {
    let deny_all = policy("deny-all", Action::Allow, vec![]);
    assert_eq!(evaluate([&deny_all], &mtls("a", "b", 80)), NOT_ALLOWED);
    assert_eq!(evaluate([&deny_all], &plain(80)), NOT_ALLOWED);
    let allow_all = policy("allow-all", Action::Allow, vec![vec![]]);
    assert_eq!(evaluate([&allow_all], &plain(80)), Decision::Allow);
    assert_eq!(evaluate([&deny_all, &allow_all], &plain(80)), Decision::Allow);
}

/// §5.5: `from`/`to` clauses and the `*`, `x*`, `*x` value patterns.
#[test]
fn converted_authorization_policy() {
    // from: principals ["cluster.local/ns/a/*"], namespaces ["b"]; to: ports [80]
    let p = policy(
        "ap",
        Action::Allow,
        vec![vec![
            vec![ports(&[80])],
            vec![
                Match { principals: vec![prefix("cluster.local/ns/a/")], ..Match::default() },
                Match { namespaces: vec![exact("b")], ..Match::default() },
            ],
        ]],
    );
    assert_eq!(evaluate([&p], &mtls("a", "x", 80)), Decision::Allow);
    assert_eq!(evaluate([&p], &mtls("b", "x", 80)), Decision::Allow);
    assert_eq!(evaluate([&p], &mtls("c", "x", 80)), NOT_ALLOWED);
    assert_eq!(evaluate([&p], &mtls("a", "x", 81)), NOT_ALLOWED);
    assert_eq!(evaluate([&p], &plain(80)), NOT_ALLOWED);

    // principals ["*"] ⇒ presence: any mTLS peer, no plaintext.
    let any_peer = policy(
        "any",
        Action::Allow,
        single(Match { principals: vec![StringMatch::Presence()], ..Match::default() }),
    );
    assert_eq!(evaluate([&any_peer], &mtls("z", "z", 1)), Decision::Allow);
    assert_eq!(evaluate([&any_peer], &plain(1)), NOT_ALLOWED);

    // DENY when source.ip in 10.0.0.0/8 and principal "*/sa/bad"
    let d = policy(
        "deny-bad",
        Action::Deny,
        vec![vec![
            vec![Match { principals: vec![suffix("/sa/bad")], ..Match::default() }],
            vec![Match { source_ips: vec![net("10.0.0.0/8")], ..Match::default() }],
        ]],
    );
    assert_eq!(evaluate([&d], &mtls("a", "bad", 80)), denied_by("ns/deny-bad"));
    assert_eq!(evaluate([&d], &mtls("a", "good", 80)), Decision::Allow);
}

/// §5.5: the auto-generated waypoint allow policy admits only the waypoint's identity.
#[test]
fn waypoint_allow_policy() {
    let p = Authorization {
        name: "istio_allow_waypoint_app_waypoint".into(),
        namespace: "app".into(),
        scope: Scope::WorkloadSelector,
        action: Action::Allow,
        rules: single(Match {
            principals: vec![exact("cluster.local/ns/app/sa/waypoint")],
            ..Match::default()
        }),
        dry_run: false,
    };
    assert_eq!(evaluate([&p], &mtls("app", "waypoint", 80)), Decision::Allow);
    assert_eq!(evaluate([&p], &mtls("app", "client", 80)), NOT_ALLOWED);
}

/// §2 `examples/localhost.yaml`: `default/deny-9999` allows everything but port 9999.
#[test]
fn localhost_example_policy() {
    let p = Authorization {
        name: "deny-9999".into(),
        namespace: "default".into(),
        scope: Scope::Namespace,
        action: Action::Allow,
        rules: single(Match { not_destination_ports: vec![9999], ..Match::default() }),
        dry_run: false,
    };
    assert_eq!(evaluate([&p], &plain(8080)), Decision::Allow);
    assert_eq!(evaluate([&p], &mtls("a", "b", 8080)), Decision::Allow);
    assert_eq!(evaluate([&p], &plain(9999)), NOT_ALLOWED);
}

// ---- support -------------------------------------------------------------------------------

trait DenyText {
    fn to_deny_text(&self) -> Option<String>;
}

impl DenyText for Decision {
    fn to_deny_text(&self) -> Option<String> {
        match self {
            Decision::Allow => None,
            Decision::Deny(r) => Some(r.to_string()),
        }
    }
}

/// Runs `f` with a DEBUG subscriber installed and returns its result and the log text.
pub(crate) fn with_debug_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    let buf = LogBuf::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(buf.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = buf.0.lock().map(|b| String::from_utf8_lossy(&b).into_owned());
    (out, text.unwrap_or_default())
}

#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl io::Write for LogBuf {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(data);
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuf {
    type Writer = LogBuf;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
