use super::*;
use crate::model::Phase;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn pod(pod_labels: &[(&str, &str)]) -> Pod {
    Pod {
        uid: "u".into(),
        name: "p".into(),
        namespace: "demo".into(),
        labels: labels(pod_labels),
        phase: Phase::Running,
        ..Default::default()
    }
}

fn ns(ns_labels: &[(&str, &str)]) -> Namespace {
    Namespace { name: "demo".into(), labels: labels(ns_labels) }
}

#[test]
fn istio_default_rules() {
    let e = Enrollment::default();
    let amb = [(DATAPLANE_MODE, AMBIENT)];
    let none = [(DATAPLANE_MODE, NONE)];
    // (pod labels, namespace labels, enrolled?)
    type Labels<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Labels<'_>, Labels<'_>, bool)] = &[
        (&[], &[], false),
        (&amb, &[], true),
        (&[], &amb, true),
        (&none, &amb, false),
        (&amb, &none, true),
        (&[(DATAPLANE_MODE, "sidecar")], &amb, true),
        (&[("app", "x")], &[("other", "y")], false),
    ];
    for (pl, nl, want) in cases {
        assert_eq!(e.decide(&pod(pl), &ns(nl)) == Decision::Enroll, *want, "pod {pl:?} ns {nl:?}");
    }
}

#[test]
fn exclusions_win() {
    let e = Enrollment::default();
    let amb = [(DATAPLANE_MODE, AMBIENT)];
    let mut p = pod(&amb);
    p.host_network = true;
    assert_eq!(e.decide(&p, &ns(&amb)), Decision::Skip(SkipReason::HostNetwork));
    let mut p = pod(&amb);
    p.annotations.insert(SIDECAR_STATUS.into(), "{}".into());
    assert_eq!(e.decide(&p, &ns(&amb)), Decision::Skip(SkipReason::Sidecar));
    let mut p = pod(&amb);
    p.namespace = "kube-system".into();
    assert_eq!(e.decide(&p, &ns(&amb)), Decision::Skip(SkipReason::ExcludedNamespace));
    let mut p = pod(&amb);
    p.phase = Phase::Succeeded;
    assert_eq!(e.decide(&p, &ns(&amb)), Decision::Skip(SkipReason::Terminal));
}

#[test]
fn namespace_enrollment_change_detection() {
    let e = Enrollment::default();
    assert!(e.namespace_enrolls(&ns(&[(DATAPLANE_MODE, AMBIENT)])));
    assert!(!e.namespace_enrolls(&ns(&[])));
}

#[test]
fn selector_operators_and_parsing() {
    let sel = parse_selectors(
        r#"[{"podSelector": {"matchExpressions": [
              {"key": "tier", "operator": "In", "values": ["web", "api"]},
              {"key": "legacy", "operator": "DoesNotExist"}]},
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}}]"#,
    )
    .expect("valid selectors");
    let e = Enrollment {
        selectors: sel,
        excluded_namespaces: BTreeSet::new(),
        system: SystemSelector::default(),
    };
    let team = [("team", "a")];
    assert_eq!(e.decide(&pod(&[("tier", "web")]), &ns(&team)), Decision::Enroll);
    assert_ne!(e.decide(&pod(&[("tier", "db")]), &ns(&team)), Decision::Enroll);
    assert_ne!(e.decide(&pod(&[("tier", "web"), ("legacy", "1")]), &ns(&team)), Decision::Enroll);
    assert_ne!(e.decide(&pod(&[("tier", "web")]), &ns(&[])), Decision::Enroll);
    // An empty selector object matches everything.
    let all = parse_selectors(r#"[{"podSelector": {}, "namespaceSelector": {}}]"#).expect("valid");
    let e = Enrollment {
        selectors: all,
        excluded_namespaces: BTreeSet::new(),
        system: SystemSelector::default(),
    };
    assert_eq!(e.decide(&pod(&[]), &ns(&[])), Decision::Enroll);
    for bad in
        [r#"[{"podSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}}]"#, r#"{"x": 1}"#, "["]
    {
        assert!(parse_selectors(bad).is_err(), "{bad}");
    }
}

#[test]
fn selectors_in_yaml_as_istio_cni_s_chart_renders_them() {
    assert_eq!(parse_selectors(ISTIO_CHART_SELECTORS).expect("yaml"), default_selectors());
    // `NotIn` with an unquoted `none` stays the string "none" (YAML 1.2, no null), and a
    // YAML flow form is the same list.
    let flow = "[{podSelector: {matchLabels: {istio.io/dataplane-mode: ambient}}}]";
    assert_eq!(parse_selectors(flow).expect("flow").len(), 1);
    assert_eq!(
        parse_selectors("- podSelector: [1]").expect_err("a list is no selector").to_string(),
        "invalid enablement selectors: invalid type: integer `1`, expected a map"
    );
    let e = parse_selectors("- podSelector: {matchLabels: {a: b}\n").expect_err("broken").to_string();
    assert!(e.starts_with("invalid enablement selectors: line "), "{e}");
    assert_eq!(
        parse_selectors("- {}\n---\n- {}\n").expect_err("two documents").to_string(),
        "invalid enablement selectors: 2 YAML documents where one is expected"
    );
}

#[test]
fn no_selectors_enroll_nothing() {
    let e = Enrollment {
        selectors: Vec::new(),
        excluded_namespaces: BTreeSet::new(),
        system: SystemSelector::default(),
    };
    assert_eq!(
        e.decide(&pod(&[(DATAPLANE_MODE, AMBIENT)]), &ns(&[])),
        Decision::Skip(SkipReason::NotSelected)
    );
}

/// The agent's own pod and the node proxy's pods are never enrolled, even in an enrolled
/// namespace or with the ambient label on the pod.
#[test]
fn system_pods_are_never_enrolled() {
    let e = Enrollment {
        system: SystemSelector {
            agent: Some(("demo".into(), "ambit-agent-x7k2p".into())),
            proxy: Some(("demo".into(), LabelSelector::parse_equalities("app=ztunnel").expect("sel"))),
        },
        ..Enrollment::default()
    };
    let amb = [(DATAPLANE_MODE, AMBIENT)];
    let mut agent = pod(&amb);
    agent.name = "ambit-agent-x7k2p".into();
    assert_eq!(e.decide(&agent, &ns(&amb)), Decision::Skip(SkipReason::SystemPod(SystemRole::Agent)));
    let proxy = pod(&[("app", "ztunnel"), (DATAPLANE_MODE, AMBIENT)]);
    assert_eq!(e.decide(&proxy, &ns(&amb)), Decision::Skip(SkipReason::SystemPod(SystemRole::Proxy)));
    // Same labels in another namespace, or another name: an ordinary pod.
    let mut elsewhere = proxy.clone();
    elsewhere.namespace = "other".into();
    assert_eq!(e.decide(&elsewhere, &ns(&amb)), Decision::Enroll);
    assert_eq!(e.decide(&pod(&amb), &ns(&amb)), Decision::Enroll);
}

#[test]
fn equality_selectors() {
    let s = LabelSelector::parse_equalities(" app=ztunnel , tier = node ").expect("ok");
    assert_eq!(s.match_labels, labels(&[("app", "ztunnel"), ("tier", "node")]));
    assert!(LabelSelector::parse_equalities("").expect("empty").is_empty());
    for bad in ["app", "=x", "a=b=c"] {
        assert!(LabelSelector::parse_equalities(bad).is_err(), "{bad}");
    }
}
