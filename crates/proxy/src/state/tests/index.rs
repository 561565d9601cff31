//! §1.6 indexing: address rank, node-local index, policy selection.

use super::*;
use crate::authz::{Action, Authorization, Scope};

#[test]
fn address_rank_prefers_hbone_pods() {
    let shared = ["10.0.0.1"];
    let other = wl("WorkloadEntry/default/other", &shared);
    let mut hbone_other = wl("WorkloadEntry/default/hbone", &shared);
    hbone_other.protocol = Protocol::Hbone;
    let pod = wl("c//Pod/default/pod", &shared);
    let mut hbone_pod = wl("c//Pod/default/hbone-pod", &shared);
    hbone_pod.protocol = Protocol::Hbone;
    let all = [other, hbone_other, pod, hbone_pod];
    // Each added workload outranks the previous ones, whatever the insertion order.
    for n in 1..=all.len() {
        for rev in [false, true] {
            let mut ws: Vec<Workload> = all[..n].to_vec();
            if rev {
                ws.reverse();
            }
            let st = state(ws, vec![]);
            let best = st.workload_by_addr("", ip("10.0.0.1")).unwrap();
            assert_eq!(best.uid, all[n - 1].uid, "n={n} rev={rev}");
        }
    }
    // Different networks are different keys.
    let mut remote = wl("c//Pod/default/remote", &shared);
    remote.network = "remote".into();
    let st = state(vec![remote], vec![]);
    assert!(st.workload_by_addr("", ip("10.0.0.1")).is_none());
    assert_eq!(&*st.workload_by_addr("remote", ip("10.0.0.1")).unwrap().name, "remote");
}

#[test]
fn find_local_by_node_and_identity() {
    let mut a = wl("c//Pod/ns/a", &["10.0.0.1"]);
    a.namespace = "ns".into();
    a.node = "n1".into();
    a.service_account = Default::default();
    let mut b = a.clone();
    b.uid = "c//Pod/ns/b".into();
    b.name = "b".into();
    b.node = "n2".into();
    let st = State::from_config(
        LocalConfig { workloads: vec![a, b], services: vec![], policies: vec![] },
        Some("n1"),
    )
    .unwrap();
    // An empty service account means `default`.
    assert!(st.find_local("ns", "a", "default").is_some());
    assert!(st.find_local("ns", "a", "").is_some());
    assert!(st.find_local("ns", "a", "other").is_none());
    assert!(st.find_local("ns", "b", "default").is_none());
    assert!(st.workload_by_uid("c//Pod/ns/b").is_some());
}

/// A DENY policy with no rules.
pub(super) fn policy(ns: &str, name: &str, scope: Scope) -> Authorization {
    Authorization {
        name: name.into(),
        namespace: ns.into(),
        scope,
        action: Action::Deny,
        rules: vec![],
        dry_run: false,
    }
}

#[test]
fn policies_for_workload() {
    let mut w = wl("c//Pod/ns/a", &["10.0.0.1"]);
    w.namespace = "ns".into();
    w.authorization_policies = vec!["ns/selected".into(), "ns/ns-wide".into(), "ns/missing".into()];
    let st = State::from_config(
        LocalConfig {
            workloads: vec![w.clone()],
            services: vec![],
            policies: vec![
                policy("istio-system", "global", Scope::Global),
                policy("ns", "ns-wide", Scope::Namespace),
                policy("other", "other-ns", Scope::Namespace),
                policy("ns", "selected", Scope::WorkloadSelector),
                policy("ns", "not-selected", Scope::WorkloadSelector),
            ],
        },
        None,
    )
    .unwrap();
    let mut keys: Vec<String> = st.policies_for(&w).iter().map(|p| p.key()).collect();
    keys.sort();
    assert_eq!(keys, ["istio-system/global", "ns/ns-wide", "ns/selected"]);
    assert_eq!(st.policies().count(), 5);
}

/// An endpoint set changes representation at [`SMALL_SET`] (a slice, then a map above it, a slice
/// again below half) without changing what it holds or how it compares.
#[test]
fn endpoint_sets_hold_the_same_endpoints_as_a_slice_or_a_map() {
    use super::endpoints::SMALL_SET;
    use super::model::Endpoint;
    let ep = |i: usize| Endpoint {
        workload_uid: format!("uid-{i:03}").into(),
        port: Default::default(),
        status: if i.is_multiple_of(2) { HealthStatus::Healthy } else { HealthStatus::Unhealthy },
    };
    let mut set = EndpointSet::default();
    let mut expect = std::collections::BTreeMap::new();
    for i in (0..=SMALL_SET + 8).rev() {
        assert_eq!(set.insert(format!("uid-{i:03}"), ep(i)), None);
        expect.insert(format!("uid-{i:03}"), ep(i));
        let shadow: EndpointSet = expect.clone().into_iter().collect();
        assert_eq!(set, shadow, "after inserting {i}");
        assert_eq!(set.len(), expect.len());
    }
    // Replacing returns the old endpoint; every endpoint is found by its uid.
    let mut healthy = ep(1);
    healthy.status = HealthStatus::Healthy;
    assert_eq!(set.insert("uid-001", healthy.clone()), Some(ep(1)));
    expect.insert("uid-001".into(), healthy);
    for (uid, e) in &expect {
        assert_eq!(set.get(uid), Some(e));
    }
    let copy = set.clone();
    for i in 0..=SMALL_SET + 8 {
        let uid = format!("uid-{i:03}");
        assert_eq!(set.remove(&uid), expect.remove(&uid), "removing {i}");
        assert_eq!(set.get(&uid), None);
        let shadow: EndpointSet = expect.clone().into_iter().collect();
        assert_eq!(set, shadow, "after removing {i}");
    }
    assert!(set.is_empty());
    // The copy taken before the removals is untouched.
    assert_eq!(copy.len(), SMALL_SET + 9);
    assert_eq!(serde_json::to_value(&copy).expect("serializes")["uid-000"]["workloadUid"], "uid-000");
}
