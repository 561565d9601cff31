use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};

use super::*;

const CLIENT: &str = "spiffe://cluster.local/ns/demo/sa/client";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn pats(values: &[&str]) -> Vec<Pattern> {
    Pattern::parse_all(values)
}

/// A GET of `/api/items?x=1` on `Example.com:8080` from the demo client.
fn request<'a>(headers: &'a HeaderMap) -> Request<'a> {
    Request {
        method: "GET",
        authority: "Example.com:8080",
        path: "/api/./items?x=1",
        headers,
        source_principal: Some(CLIENT),
        source_ip: ip("10.0.0.5"),
        remote_ip: ip("203.0.113.7"),
        destination_ip: ip("10.0.1.9"),
        destination_port: 8080,
        sni: Some("example.com"),
    }
}

fn policy(name: &str, action: Action, rules: Vec<Rule>) -> Policy {
    Policy { name: name.into(), namespace: "demo".into(), action, rules }
}

fn source_matches(source: Source, req: &Request<'_>) -> bool {
    Rule { from: vec![source], ..Rule::default() }.matches(req, "/api/items", Action::Allow)
}

fn operation_matches(operation: Operation, req: &Request<'_>) -> bool {
    Rule { to: vec![operation], ..Rule::default() }.matches(req, "/api/items", Action::Allow)
}

fn condition_matches(condition: Condition, req: &Request<'_>, action: Action) -> bool {
    Rule { when: vec![condition], ..Rule::default() }.matches(req, "/api/items", action)
}

#[test]
fn source_fields_and_negations() {
    let headers = HeaderMap::new();
    let req = request(&headers);
    let cases: Vec<(&str, Source, bool)> = vec![
        ("empty source", Source::default(), true),
        (
            "principal exact",
            Source { principals: pats(&["cluster.local/ns/demo/sa/client"]), ..Default::default() },
            true,
        ),
        (
            "principal with spiffe:// never matches",
            Source { principals: pats(&[CLIENT]), ..Default::default() },
            false,
        ),
        (
            "principal prefix",
            Source { principals: pats(&["cluster.local/ns/demo/*"]), ..Default::default() },
            true,
        ),
        ("principal suffix", Source { principals: pats(&["*/sa/client"]), ..Default::default() }, true),
        ("principal suffix miss", Source { principals: pats(&["*/sa/other"]), ..Default::default() }, false),
        ("principal presence", Source { principals: pats(&["*"]), ..Default::default() }, true),
        (
            "principal one of",
            Source { principals: pats(&["x", "cluster.local/ns/demo/sa/client"]), ..Default::default() },
            true,
        ),
        ("notPrincipals hit", Source { not_principals: pats(&["*/sa/client"]), ..Default::default() }, false),
        ("notPrincipals miss", Source { not_principals: pats(&["*/sa/other"]), ..Default::default() }, true),
        ("namespace exact", Source { namespaces: vec![Glob::new("demo")], ..Default::default() }, true),
        ("namespace glob", Source { namespaces: vec![Glob::new("de*")], ..Default::default() }, true),
        ("namespace miss", Source { namespaces: vec![Glob::new("prod")], ..Default::default() }, false),
        (
            "notNamespaces hit",
            Source { not_namespaces: vec![Glob::new("demo")], ..Default::default() },
            false,
        ),
        ("ipBlocks hit", Source { ip_blocks: vec![net("10.0.0.0/24")], ..Default::default() }, true),
        ("ipBlocks miss", Source { ip_blocks: vec![net("10.9.0.0/16")], ..Default::default() }, false),
        ("notIpBlocks hit", Source { not_ip_blocks: vec![net("10.0.0.5/32")], ..Default::default() }, false),
        (
            "remoteIpBlocks reads remote ip",
            Source { remote_ip_blocks: vec![net("203.0.113.0/24")], ..Default::default() },
            true,
        ),
        (
            "remoteIpBlocks ignores source ip",
            Source { remote_ip_blocks: vec![net("10.0.0.0/8")], ..Default::default() },
            false,
        ),
        (
            "notRemoteIpBlocks hit",
            Source { not_remote_ip_blocks: vec![net("203.0.113.7/32")], ..Default::default() },
            false,
        ),
        (
            "requestPrincipals without a JWT",
            Source { request_principals: pats(&["*"]), ..Default::default() },
            false,
        ),
        (
            "notRequestPrincipals without a JWT",
            Source { not_request_principals: pats(&["*"]), ..Default::default() },
            true,
        ),
        (
            "fields are AND-ed",
            Source { principals: pats(&["*"]), ip_blocks: vec![net("10.9.0.0/16")], ..Default::default() },
            false,
        ),
        (
            "positive and negated of one field",
            Source {
                namespaces: vec![Glob::new("*")],
                not_namespaces: vec![Glob::new("prod")],
                ..Default::default()
            },
            true,
        ),
    ];
    for (name, source, want) in cases {
        assert_eq!(source_matches(source, &req), want, "{name}");
    }
}

#[test]
fn a_peer_without_identity_matches_no_principal_or_namespace() {
    let headers = HeaderMap::new();
    let req = Request { source_principal: None, ..request(&headers) };
    let cases: Vec<(&str, Source, bool)> = vec![
        ("principals *", Source { principals: pats(&["*"]), ..Default::default() }, false),
        ("notPrincipals *", Source { not_principals: pats(&["*"]), ..Default::default() }, true),
        ("namespaces *", Source { namespaces: vec![Glob::new("*")], ..Default::default() }, false),
        ("notNamespaces *", Source { not_namespaces: vec![Glob::new("*")], ..Default::default() }, true),
    ];
    for (name, source, want) in cases {
        assert_eq!(source_matches(source, &req), want, "{name}");
    }
    let other = Request { source_principal: Some("https://example.com/x"), ..request(&headers) };
    assert!(!source_matches(Source { principals: pats(&["*x"]), ..Default::default() }, &other));
    assert!(source_matches(Source { principals: pats(&["*"]), ..Default::default() }, &other));
}

#[test]
fn operation_fields_and_negations() {
    let headers = HeaderMap::new();
    let req = request(&headers);
    let cases: Vec<(&str, Operation, bool)> = vec![
        ("empty operation", Operation::default(), true),
        (
            "host with port, other case",
            Operation { hosts: pats(&["example.COM:8080"]), ..Default::default() },
            true,
        ),
        (
            "host without port does not match",
            Operation { hosts: pats(&["example.com"]), ..Default::default() },
            false,
        ),
        (
            "host prefix covers the port",
            Operation { hosts: pats(&["example.com*"]), ..Default::default() },
            true,
        ),
        ("host suffix", Operation { hosts: pats(&["*.com:8080"]), ..Default::default() }, true),
        ("host presence", Operation { hosts: pats(&["*"]), ..Default::default() }, true),
        (
            "notHosts ignores case",
            Operation { not_hosts: pats(&["EXAMPLE.com:8080"]), ..Default::default() },
            false,
        ),
        ("port", Operation { ports: vec![8080], ..Default::default() }, true),
        ("port miss", Operation { ports: vec![80], ..Default::default() }, false),
        ("notPorts hit", Operation { not_ports: vec![8080], ..Default::default() }, false),
        ("method exact", Operation { methods: pats(&["GET"]), ..Default::default() }, true),
        ("method is case-sensitive", Operation { methods: pats(&["get"]), ..Default::default() }, false),
        ("method presence", Operation { methods: pats(&["*"]), ..Default::default() }, true),
        ("notMethods hit", Operation { not_methods: pats(&["GET", "POST"]), ..Default::default() }, false),
        ("notMethods miss", Operation { not_methods: pats(&["POST"]), ..Default::default() }, true),
        ("path exact", Operation { paths: pats(&["/api/items"]), ..Default::default() }, true),
        ("path prefix", Operation { paths: pats(&["/api/*"]), ..Default::default() }, true),
        ("path suffix", Operation { paths: pats(&["*/items"]), ..Default::default() }, true),
        ("path is case-sensitive", Operation { paths: pats(&["/API/items"]), ..Default::default() }, false),
        ("notPaths hit", Operation { not_paths: pats(&["/api/*"]), ..Default::default() }, false),
        ("notPaths miss", Operation { not_paths: pats(&["/admin*"]), ..Default::default() }, true),
        (
            "fields are AND-ed",
            Operation { methods: pats(&["GET"]), ports: vec![80], ..Default::default() },
            false,
        ),
    ];
    for (name, operation, want) in cases {
        assert_eq!(operation_matches(operation, &req), want, "{name}");
    }
}

#[test]
fn conditions_by_key() {
    let mut headers = HeaderMap::new();
    headers.append("x-team", HeaderValue::from_static("blue"));
    headers.append("x-team", HeaderValue::from_static("red"));
    headers.append("x-empty", HeaderValue::from_static(""));
    let req = request(&headers);
    let cases: Vec<(&str, &[&str], &[&str], bool)> = vec![
        ("request.headers[X-Team]", &["blue,red"], &[], true),
        ("request.headers[x-team]", &["blue"], &[], false),
        ("request.headers[x-team]", &["blue*"], &[], true),
        ("request.headers[x-team]", &["*red"], &[], true),
        ("request.headers[x-team]", &["*"], &[], true),
        ("request.headers[x-team]", &[], &["*red"], false),
        ("request.headers[x-empty]", &["*"], &[], true),
        ("request.headers[x-missing]", &["*"], &[], false),
        ("request.headers[x-missing]", &[], &["*"], true),
        ("request.headers[x-missing]", &[], &["blue"], true),
        ("source.ip", &["10.0.0.5"], &[], true),
        ("source.ip", &["10.0.0.0/8"], &["10.0.0.5"], false),
        ("remote.ip", &["203.0.113.7"], &[], true),
        ("remote.ip", &["10.0.0.5"], &[], false),
        ("destination.ip", &["10.0.1.0/24"], &[], true),
        ("destination.port", &["8080"], &[], true),
        ("destination.port", &["80", "443"], &[], false),
        ("destination.port", &[], &["8080"], false),
        ("source.namespace", &["demo"], &[], true),
        ("source.namespace", &[], &["d*"], false),
        ("source.principal", &["cluster.local/ns/demo/sa/client"], &[], true),
        ("source.principal", &["*/sa/other"], &[], false),
        ("connection.sni", &["*.com"], &[], true),
        ("connection.sni", &["example.org"], &[], false),
        ("request.auth.principal", &["*"], &[], false),
        ("request.auth.claims[iss]", &["issuer"], &[], false),
        ("request.auth.audiences", &[], &["aud"], true),
    ];
    for (key, values, not_values, want) in cases {
        let condition = Condition::parse(key, values, not_values);
        assert!(!matches!(condition, Condition::Unenforceable { .. }), "{key} parses: {condition:?}");
        assert_eq!(
            condition_matches(condition, &req, Action::Allow),
            want,
            "{key} {values:?} not {not_values:?}"
        );
    }
}

#[test]
fn unsupported_conditions_are_unenforceable_never_ignored() {
    let cases: [(&str, &[&str], &str); 8] = [
        ("request.headers", &["x"], "the header name must be in brackets: request.headers[NAME]"),
        ("request.headers[:authority]", &["x"], "pseudo-header \":authority\" is not supported yet"),
        ("request.headers[bad name]", &["x"], "\"bad name\" is not a valid header name"),
        ("source.ip", &["10.0.0.300"], "\"10.0.0.300\" is not an IP address or CIDR block"),
        ("destination.port", &["http"], "\"http\" is not a port (0-65535)"),
        (
            "experimental.envoy.filters.a.b[c]",
            &["x"],
            "Envoy filter metadata does not exist in Ambit's waypoint",
        ),
        ("request.auth.claims[]", &["x"], "not an attribute Istio defines for HTTP requests"),
        ("source.labels[app]", &["x"], "not an attribute Istio defines for HTTP requests"),
    ];
    for (key, values, reason) in cases {
        let want = Condition::Unenforceable { key: key.into(), reason: reason.into() };
        assert_eq!(Condition::parse(key, values, &[]), want, "{key}");
    }
    let headers = HeaderMap::new();
    let req = request(&headers);
    let odd = || Condition::parse::<&str>("source.labels[app]", &["x"], &[]);
    assert!(!condition_matches(odd(), &req, Action::Allow));
    assert!(condition_matches(odd(), &req, Action::Deny));
    assert!(condition_matches(odd(), &req, Action::Audit));

    let set = PolicySet::new(vec![
        policy("allow", Action::Allow, vec![Rule { when: vec![odd()], ..Rule::default() }]),
        policy("deny", Action::Deny, vec![Rule { when: vec![odd()], ..Rule::default() }]),
    ]);
    let found: Vec<String> = set.unenforceable().iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        [
            "demo/allow (ALLOW): condition \"source.labels[app]\" cannot be enforced: not an attribute Istio \
             defines for HTTP requests; its rule never allows",
            "demo/deny (DENY): condition \"source.labels[app]\" cannot be enforced: not an attribute Istio \
             defines for HTTP requests; its rule denies as if the condition held",
        ]
    );
}

#[test]
fn rules_need_from_to_and_when() {
    let headers = HeaderMap::new();
    let req = request(&headers);
    let hit_from = Source { namespaces: vec![Glob::new("demo")], ..Default::default() };
    let miss_from = Source { namespaces: vec![Glob::new("prod")], ..Default::default() };
    let hit_to = Operation { methods: pats(&["GET"]), ..Default::default() };
    let miss_to = Operation { methods: pats(&["POST"]), ..Default::default() };
    let hit_when = Condition::parse("destination.port", &["8080"], &[]);
    let miss_when = Condition::parse("destination.port", &["80"], &[]);
    let cases = [
        ("empty rule", Rule::default(), true),
        (
            "all three match",
            Rule { from: vec![hit_from.clone()], to: vec![hit_to.clone()], when: vec![hit_when.clone()] },
            true,
        ),
        ("from is OR-ed", Rule { from: vec![miss_from.clone(), hit_from.clone()], ..Rule::default() }, true),
        ("to is OR-ed", Rule { to: vec![miss_to.clone(), hit_to.clone()], ..Rule::default() }, true),
        (
            "when is AND-ed",
            Rule { when: vec![hit_when.clone(), miss_when.clone()], ..Rule::default() },
            false,
        ),
        (
            "from misses",
            Rule { from: vec![miss_from], to: vec![hit_to], when: vec![hit_when.clone()] },
            false,
        ),
        ("to misses", Rule { from: vec![hit_from], to: vec![miss_to], when: vec![hit_when] }, false),
    ];
    for (name, rule, want) in cases {
        assert_eq!(rule.matches(&req, "/api/items", Action::Allow), want, "{name}");
    }
}

fn allow_get() -> Rule {
    Rule { to: vec![Operation { methods: pats(&["GET"]), ..Default::default() }], ..Rule::default() }
}

fn any_request() -> Rule {
    Rule::default()
}

fn only_post() -> Rule {
    Rule { to: vec![Operation { methods: pats(&["POST"]), ..Default::default() }], ..Rule::default() }
}

#[test]
fn evaluation_order() {
    let headers = HeaderMap::new();
    let req = request(&headers);
    let no_allow = Decision::Deny { policy: None, reason: DenyReason::NoAllowPolicyMatched };
    let denied_by = |name: &str| Decision::Deny {
        policy: Some(format!("demo/{name}")),
        reason: DenyReason::DenyPolicyMatched,
    };
    let cases: Vec<(&str, Vec<Policy>, Decision, Vec<&str>)> = vec![
        ("no policies allow", vec![], Decision::Allow, vec![]),
        (
            "a matching ALLOW allows",
            vec![policy("a", Action::Allow, vec![allow_get()])],
            Decision::Allow,
            vec![],
        ),
        (
            "ALLOW present, none matches",
            vec![policy("a", Action::Allow, vec![only_post()])],
            no_allow.clone(),
            vec![],
        ),
        (
            "ALLOW without rules allows nothing",
            vec![policy("a", Action::Allow, vec![])],
            no_allow.clone(),
            vec![],
        ),
        (
            "one of several ALLOWs suffices",
            vec![
                policy("a", Action::Allow, vec![only_post()]),
                policy("b", Action::Allow, vec![allow_get()]),
            ],
            Decision::Allow,
            vec![],
        ),
        (
            "DENY beats ALLOW",
            vec![
                policy("a", Action::Allow, vec![any_request()]),
                policy("d", Action::Deny, vec![allow_get()]),
            ],
            denied_by("d"),
            vec![],
        ),
        (
            "a DENY that does not match",
            vec![policy("d", Action::Deny, vec![only_post()])],
            Decision::Allow,
            vec![],
        ),
        (
            "DENY without rules denies nothing",
            vec![policy("d", Action::Deny, vec![])],
            Decision::Allow,
            vec![],
        ),
        (
            "the first matching DENY is named",
            vec![
                policy("d1", Action::Deny, vec![only_post()]),
                policy("d2", Action::Deny, vec![any_request()]),
                policy("d3", Action::Deny, vec![any_request()]),
            ],
            denied_by("d2"),
            vec![],
        ),
        (
            "AUDIT does not decide, alone",
            vec![policy("audit", Action::Audit, vec![any_request()])],
            Decision::Allow,
            vec!["demo/audit"],
        ),
        (
            "AUDIT does not decide, nor count as ALLOW",
            vec![
                policy("audit", Action::Audit, vec![any_request()]),
                policy("a", Action::Allow, vec![only_post()]),
            ],
            no_allow,
            vec!["demo/audit"],
        ),
        (
            "AUDIT lists every match, also on a deny",
            vec![
                policy("au1", Action::Audit, vec![allow_get()]),
                policy("au2", Action::Audit, vec![only_post()]),
                policy("au3", Action::Audit, vec![any_request()]),
                policy("d", Action::Deny, vec![any_request()]),
            ],
            denied_by("d"),
            vec!["demo/au1", "demo/au3"],
        ),
    ];
    for (name, policies, decision, audited) in cases {
        let verdict = PolicySet::new(policies).authorize(&req).expect("the path normalizes");
        let audited: Vec<String> = audited.into_iter().map(String::from).collect();
        assert_eq!(verdict, Verdict { decision, audited }, "{name}");
    }
}

#[test]
fn paths_match_after_normalization_and_bad_paths_are_refused() {
    let headers = HeaderMap::new();
    let deny_admin = PolicySet::new(vec![policy(
        "no-admin",
        Action::Deny,
        vec![Rule {
            to: vec![Operation { paths: pats(&["/admin*"]), ..Default::default() }],
            ..Rule::default()
        }],
    )]);
    let denied =
        Decision::Deny { policy: Some("demo/no-admin".into()), reason: DenyReason::DenyPolicyMatched };
    let cases = [
        ("/admin", Ok(denied.clone())),
        ("/public/../admin/x", Ok(denied.clone())),
        ("/%61dmin", Ok(denied.clone())),
        ("/public/%2e%2e/admin", Ok(denied.clone())),
        ("/public/..\\admin", Ok(denied)),
        ("/public?/admin", Ok(Decision::Allow)),
        ("/public%2F..%2Fadmin", Ok(Decision::Allow)),
        ("/admin%00", Err(PathError::Nul { at: 6 })),
        ("/admin%zz", Err(PathError::InvalidEscape { at: 6 })),
    ];
    for (path, want) in cases {
        let req = Request { path, ..request(&headers) };
        let got = deny_admin.authorize(&req).map(|v| v.decision);
        assert_eq!(got, want, "path {path:?}");
    }
}

#[test]
fn remote_ip_uses_xff_only_with_trusted_proxies() {
    let downstream = ip("10.0.0.5");
    let mut headers = HeaderMap::new();
    headers.append("x-forwarded-for", HeaderValue::from_static("198.51.100.1, 203.0.113.7"));
    headers.append("x-forwarded-for", HeaderValue::from_static("192.0.2.9"));
    let cases = [(0, "10.0.0.5"), (1, "192.0.2.9"), (2, "203.0.113.7"), (3, "198.51.100.1"), (4, "10.0.0.5")];
    for (trusted, want) in cases {
        assert_eq!(remote_ip(downstream, &headers, trusted), ip(want), "numTrustedProxies {trusted}");
    }
    let mut junk = HeaderMap::new();
    junk.append("x-forwarded-for", HeaderValue::from_static("unknown"));
    assert_eq!(remote_ip(downstream, &junk, 1), downstream);
    assert_eq!(remote_ip(downstream, &HeaderMap::new(), 1), downstream);
}

#[test]
fn source_namespace_comes_from_the_principal() {
    let headers = HeaderMap::new();
    let cases = [
        (Some(CLIENT), Some("demo")),
        (Some("spiffe://td/ns/prod"), Some("prod")),
        (Some("spiffe://td/sa/x"), None),
        (None, None),
    ];
    for (principal, want) in cases {
        let req = Request { source_principal: principal, ..request(&headers) };
        assert_eq!(req.source_namespace(), want, "{principal:?}");
    }
}

#[test]
fn actions_parse_and_custom_is_refused() {
    assert_eq!("ALLOW".parse(), Ok(Action::Allow));
    assert_eq!("".parse(), Ok(Action::Allow));
    assert_eq!("DENY".parse(), Ok(Action::Deny));
    assert_eq!("AUDIT".parse(), Ok(Action::Audit));
    assert_eq!("CUSTOM".parse::<Action>(), Err(UnsupportedAction("CUSTOM".into())));
    assert_eq!(
        UnsupportedAction("CUSTOM".into()).to_string(),
        "authorization action \"CUSTOM\" is not supported (ALLOW, DENY and AUDIT are)"
    );
    assert_eq!(DenyReason::NoAllowPolicyMatched.to_string(), "no ALLOW policy matched");
    assert_eq!(DenyReason::DenyPolicyMatched.to_string(), "a DENY policy matched");
}

#[test]
fn connections_allow_no_http_rule_and_deny_with_http_fields_left_out() {
    let headers = HeaderMap::new();
    let req = request(&headers);
    let get_on_8080 = Rule {
        to: vec![Operation { methods: pats(&["GET"]), ports: vec![8080], ..Operation::default() }],
        ..Rule::default()
    };
    let header_cond =
        Rule { when: vec![Condition::parse("request.headers[x-a]", &["b"], &[])], ..Rule::default() };
    let port_9000 =
        Rule { to: vec![Operation { ports: vec![9000], ..Operation::default() }], ..Rule::default() };
    let cases: Vec<(&str, Vec<Policy>, Decision)> = vec![
        (
            "an ALLOW rule with a method never allows a connection",
            vec![policy("allow-get", Action::Allow, vec![get_on_8080.clone()])],
            Decision::Deny { policy: None, reason: DenyReason::NoAllowPolicyMatched },
        ),
        (
            "a DENY rule with a method denies the port's connections (method left out)",
            vec![policy("deny-get", Action::Deny, vec![get_on_8080])],
            Decision::Deny { policy: Some("demo/deny-get".into()), reason: DenyReason::DenyPolicyMatched },
        ),
        (
            "a DENY rule with a header condition denies every connection",
            vec![policy("deny-header", Action::Deny, vec![header_cond])],
            Decision::Deny { policy: Some("demo/deny-header".into()), reason: DenyReason::DenyPolicyMatched },
        ),
        (
            "a DENY rule on another port does not match",
            vec![policy("deny-9000", Action::Deny, vec![port_9000.clone()])],
            Decision::Allow,
        ),
        (
            "an L4 ALLOW rule allows",
            vec![policy(
                "allow-port",
                Action::Allow,
                vec![Rule {
                    to: vec![Operation { ports: vec![8080], ..Operation::default() }],
                    ..Rule::default()
                }],
            )],
            Decision::Allow,
        ),
    ];
    for (name, policies, want) in cases {
        let verdict = PolicySet::new(policies).authorize_connection(&req);
        assert_eq!(verdict.decision, want, "{name}");
    }
}
