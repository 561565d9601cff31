//! Incremental updates (`State::apply`): the §1.6 rules one change at a time, rejections, the
//! authorization flag, and incremental == built from scratch.

use proptest::prelude::*;

use super::index::policy;
use super::*;
use crate::authz::{Authorization, Scope};
use ambit_api::workload as pb;

const SVC: &str = "default/svc.example";

fn apply(st: &State, delta: Delta) -> (State, Applied) {
    st.apply(delta)
}

fn upsert_workloads(st: &State, ws: Vec<Workload>) -> State {
    let (next, applied) = apply(st, Delta { workloads: ws, ..Delta::default() });
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
    next
}

fn upsert_services(st: &State, ss: Vec<Service>) -> State {
    let (next, applied) = apply(st, Delta { services: ss, ..Delta::default() });
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
    next
}

fn remove(st: &State, names: &[&str]) -> (State, Applied) {
    apply(st, Delta { removed_addresses: names.iter().map(|n| n.to_string()).collect(), ..Delta::default() })
}

fn endpoint_uids(st: &State, key: &str) -> Vec<String> {
    let mut uids: Vec<String> =
        st.service_by_key(key).map(|s| s.endpoints.keys().map(str::to_owned).collect()).unwrap_or_default();
    uids.sort();
    uids
}

fn staged_uids(st: &State, key: &str) -> Vec<String> {
    let d = st.dump();
    let mut uids: Vec<String> =
        d["stagedServices"][key].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    uids.sort();
    uids
}

fn member(uid: &str, ip_: &str) -> Workload {
    endpoint_of(wl(uid, &[ip_]), SVC, &[(80, 8080)])
}

fn the_service() -> Service {
    svc("svc.example", &["10.96.0.1"], &[(80, 8080)])
}

#[test]
fn service_before_its_endpoints() {
    let st = upsert_services(&State::default(), vec![the_service()]);
    let st = upsert_workloads(&st, vec![member("c//Pod/default/a", "10.0.0.1")]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/a"]);
    assert!(staged_uids(&st, SVC).is_empty());
    // Routed through the VIP to the endpoint.
    let client = wl("c//Pod/default/client", &["10.0.0.9"]);
    let route = st.route_outbound(&client, "", sa("10.96.0.1:80")).unwrap();
    assert_eq!(route.kind, RouteKind::Tcp { target: sa("10.0.0.1:8080") });
}

#[test]
fn endpoints_before_their_service() {
    let st = upsert_workloads(&State::default(), vec![member("c//Pod/default/a", "10.0.0.1")]);
    assert!(st.service_by_key(SVC).is_none());
    assert_eq!(staged_uids(&st, SVC), ["c//Pod/default/a"]);
    let st = upsert_services(&st, vec![the_service()]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/a"]);
    assert!(staged_uids(&st, SVC).is_empty(), "the staged endpoints moved into the service");
    // A later service update carries the endpoints over.
    let mut changed = the_service();
    changed.ports.insert(443, 8443);
    let st = upsert_services(&st, vec![changed]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/a"]);
    assert_eq!(st.service_by_key(SVC).unwrap().ports.get(&443), Some(&8443));
}

#[test]
fn a_removed_services_endpoints_are_staged_again() {
    let st = upsert_services(&State::default(), vec![the_service()]);
    let st = upsert_workloads(
        &st,
        vec![member("c//Pod/default/a", "10.0.0.1"), member("c//Pod/default/b", "10.0.0.2")],
    );
    let (st, applied) = remove(&st, &[SVC]);
    assert!(applied.changed);
    assert!(st.service_by_key(SVC).is_none());
    assert!(st.service_by_vip("", ip("10.96.0.1"), "default").is_none());
    assert_eq!(staged_uids(&st, SVC), ["c//Pod/default/a", "c//Pod/default/b"]);
    // The service back: its endpoints are back too, without the workloads being resent.
    let st = upsert_services(&st, vec![the_service()]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/a", "c//Pod/default/b"]);
    // A removed workload leaves its service.
    let (st, _) = remove(&st, &["c//Pod/default/a"]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/b"]);
}

#[test]
fn best_by_rank_is_kept_right_when_the_best_is_removed() {
    let shared = ["10.0.0.1"];
    let entry = wl("WorkloadEntry/default/vm", &shared);
    let pod = wl("c//Pod/default/pod", &shared);
    let mut hbone_pod = wl("c//Pod/default/hbone-pod", &shared);
    hbone_pod.protocol = Protocol::Hbone;
    let st = upsert_workloads(&State::default(), vec![entry.clone(), hbone_pod.clone(), pod.clone()]);
    let best = |st: &State| st.workload_by_addr("", ip("10.0.0.1")).map(|w| w.uid.clone());
    assert_eq!(best(&st).as_deref(), Some("c//Pod/default/hbone-pod"));
    let (st, _) = remove(&st, &["c//Pod/default/hbone-pod"]);
    assert_eq!(best(&st).as_deref(), Some("c//Pod/default/pod"), "the next best, not a hole");
    // The best one losing rank (HBONE dropped) hands the address over too.
    let st = upsert_workloads(&st, vec![hbone_pod.clone()]);
    let mut demoted = entry.clone();
    demoted.protocol = Protocol::Tcp;
    let mut plain = hbone_pod;
    plain.protocol = Protocol::Tcp;
    let st = upsert_workloads(&st, vec![plain]);
    // Two plain pods: the lowest uid wins, whatever the order they came in.
    assert_eq!(best(&st).as_deref(), Some("c//Pod/default/hbone-pod"));
    let (st, _) = remove(&st, &["c//Pod/default/hbone-pod", "c//Pod/default/pod"]);
    assert_eq!(best(&st).as_deref(), Some("WorkloadEntry/default/vm"));
    let (st, _) = remove(&st, &["WorkloadEntry/default/vm"]);
    assert_eq!(best(&st), None);
}

#[test]
fn a_workload_moved_to_another_ip_leaves_no_stale_entry() {
    let mut w = member("c//Pod/default/a", "10.0.0.1");
    w.hostname = "a.example".into();
    let st = upsert_services(&State::default(), vec![the_service()]);
    let st = upsert_workloads(&st, vec![w.clone()]);
    let mut moved = w.clone();
    moved.workload_ips = vec![ip("10.0.0.2")];
    moved.hostname = "a2.example".into();
    moved.name = "a2".into();
    moved.services.clear();
    let st = upsert_workloads(&st, vec![moved]);
    assert!(st.workload_by_addr("", ip("10.0.0.1")).is_none(), "stale address entry");
    assert_eq!(&*st.workload_by_addr("", ip("10.0.0.2")).unwrap().name, "a2");
    assert!(st.workload_by_hostname("default", "a.example").is_none(), "stale hostname entry");
    assert!(st.workload_by_hostname("default", "a2.example").is_some());
    assert!(st.find_local("default", "a", "default").is_none(), "stale node-local entry");
    assert!(st.find_local("default", "a2", "default").is_some());
    assert!(endpoint_uids(&st, SVC).is_empty(), "stale endpoint");
    assert_eq!(st.counts(), (1, 1, 0));
}

#[test]
fn removal_by_uid_and_by_namespace_and_hostname() {
    let st = upsert_services(&State::default(), vec![the_service()]);
    let st = upsert_workloads(&st, vec![member("c//Pod/default/a", "10.0.0.1")]);
    // Unknown names and names whose hostname part holds `/` change nothing.
    for name in ["nobody", "default/unknown.example", "default/svc.example/x", "default/"] {
        let (same, applied) = remove(&st, &[name]);
        assert!(!applied.changed, "{name}");
        assert_eq!(same.counts(), (1, 1, 0), "{name}");
    }
    let (st, applied) = remove(&st, &["c//Pod/default/a"]);
    assert!(applied.changed);
    assert!(st.workload_by_uid("c//Pod/default/a").is_none());
    assert!(st.workload_by_addr("", ip("10.0.0.1")).is_none());
    let (st, applied) = remove(&st, &[SVC]);
    assert!(applied.changed);
    assert_eq!(st.counts(), (0, 0, 0));
    // A name that is both a workload uid and a service key removes the workload.
    let mut odd = wl("default/svc.example", &["10.0.0.3"]);
    odd.name = "odd".into();
    let st = upsert_services(&st, vec![the_service()]);
    let st = upsert_workloads(&st, vec![odd]);
    let (st, _) = remove(&st, &[SVC]);
    assert!(st.workload_by_uid(SVC).is_none());
    assert!(st.service_by_key(SVC).is_some());
}

#[test]
fn updates_apply_before_removals() {
    // One delta re-adding and removing the same workload: the removal wins (§1.4).
    let st = upsert_workloads(&State::default(), vec![wl("u1", &["10.0.0.1"])]);
    let (st, _) = apply(
        &st,
        Delta {
            workloads: vec![wl("u1", &["10.0.0.2"])],
            removed_addresses: vec!["u1".into()],
            ..Delta::default()
        },
    );
    assert!(st.workload_by_uid("u1").is_none());
    assert!(st.workload_by_addr("", ip("10.0.0.2")).is_none());
}

#[test]
fn a_bad_resource_is_rejected_with_its_reason_and_the_rest_applies() {
    let good = pb::Address {
        r#type: Some(pb::address::Type::Workload(pb::Workload {
            uid: "c//Pod/ns/good".into(),
            name: "good".into(),
            namespace: "ns".into(),
            addresses: vec![vec![10, 0, 0, 1]],
            ..Default::default()
        })),
    };
    let bad_ip = pb::Address {
        r#type: Some(pb::address::Type::Workload(pb::Workload {
            uid: "c//Pod/ns/bad".into(),
            namespace: "ns".into(),
            addresses: vec![vec![10, 0, 0, 1, 7]],
            ..Default::default()
        })),
    };
    let legacy = pb::Address {
        r#type: Some(pb::address::Type::Workload(pb::Workload {
            uid: "c//Pod/ns/legacy".into(),
            namespace: "ns".into(),
            tunnel_protocol: pb::TunnelProtocol::LegacyIstioMtls as i32,
            ..Default::default()
        })),
    };
    let service = pb::Address {
        r#type: Some(pb::address::Type::Service(pb::Service {
            name: "s".into(),
            namespace: "ns".into(),
            hostname: "s.ns.svc.cluster.local".into(),
            ..Default::default()
        })),
    };
    let no_hostname = pb::Address {
        r#type: Some(pb::address::Type::Service(pb::Service {
            name: "nohost".into(),
            namespace: "ns".into(),
            ..Default::default()
        })),
    };
    let mut delta = Delta::default();
    let mut rejected: Vec<String> = Vec::new();
    for (name, resource) in [
        ("c//Pod/ns/good", good),
        ("c//Pod/ns/bad", bad_ip),
        ("c//Pod/ns/legacy", legacy),
        ("empty", pb::Address { r#type: None }),
        ("ns/s.ns.svc.cluster.local", service),
        ("ns/", no_hostname),
    ] {
        if let Err(r) = delta.add_address(name, resource) {
            rejected.push(r.to_string());
        }
    }
    let mut bad_policy = ambit_api::security::Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        action: 7,
        ..Default::default()
    };
    if let Err(r) = delta.add_authorization("ns/p", &bad_policy) {
        rejected.push(r.to_string());
    }
    bad_policy.name = "ok".into();
    bad_policy.action = 0;
    delta.add_authorization("ns/ok", &bad_policy).unwrap();
    let (st, applied) = State::default().apply(delta);
    rejected.extend(applied.rejected.iter().map(ToString::to_string));
    assert_eq!(
        rejected,
        [
            "c//Pod/ns/bad: Workload.addresses: IP address must be 4 or 16 bytes, got 5",
            "c//Pod/ns/legacy: workload \"c//Pod/ns/legacy\": tunnel protocol LEGACY_ISTIO_MTLS is not \
             supported; use HBONE or NONE",
            "empty: Address resource has neither a workload nor a service",
            "ns/p: authorization policy ns/p: unknown action value 7 (known: 0 ALLOW, 1 DENY); is the \
             control plane newer than this proxy?",
            "ns/: service ns/nohost: hostname must not be empty",
        ]
    );
    assert!(applied.changed);
    assert_eq!(st.counts(), (1, 1, 1), "the good resources applied");
    assert!(st.workload_by_addr("", ip("10.0.0.1")).is_some());

    // A bad services key in a workload is refused the same way.
    let bad_key = endpoint_of(wl("u2", &["10.0.0.2"]), "nokey", &[]);
    let (st2, applied) =
        st.apply(Delta { workloads: vec![bad_key, wl("u3", &["10.0.0.3"])], ..Delta::default() });
    assert_eq!(
        applied.rejected.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["u2: workload \"u2\": services key \"nokey\" is not of the form \"<namespace>/<hostname>\""]
    );
    assert!(st2.workload_by_uid("u2").is_none() && st2.workload_by_uid("u3").is_some());
}

#[test]
fn applied_says_when_authorization_inputs_changed() {
    let mut local = wl("c//Pod/default/local", &["10.0.0.1"]);
    local.node = "n1".into();
    let mut remote = wl("c//Pod/default/remote", &["10.0.0.2"]);
    remote.node = "n2".into();
    let st = State::new(Some("n1"));
    let flags = |st: &State, delta: Delta| {
        let (next, a) = st.apply(delta);
        (next, (a.changed, a.authorization_changed))
    };
    let (st, f) = flags(&st, Delta { workloads: vec![local.clone(), remote.clone()], ..Delta::default() });
    assert_eq!(f, (true, false), "workloads without policy lists");
    let (st, f) =
        flags(&st, Delta { policies: vec![policy("default", "p", Scope::Namespace)], ..Delta::default() });
    assert_eq!(f, (true, true), "a policy added");
    let (st, f) =
        flags(&st, Delta { policies: vec![policy("default", "p", Scope::Namespace)], ..Delta::default() });
    assert_eq!(f, (false, false), "the same policy again");
    let (st, f) =
        flags(&st, Delta { policies: vec![policy("default", "p", Scope::Global)], ..Delta::default() });
    assert_eq!(f, (true, true), "a policy changed");
    let mut moved = local.clone();
    moved.workload_ips = vec![ip("10.0.0.3")];
    let (st, f) = flags(&st, Delta { workloads: vec![moved.clone()], ..Delta::default() });
    assert_eq!(f, (true, false), "an address change is not an authorization input");
    let mut listed = moved.clone();
    listed.authorization_policies = vec!["default/p".into()];
    let (st, f) = flags(&st, Delta { workloads: vec![listed.clone()], ..Delta::default() });
    assert_eq!(f, (true, true), "a local workload's policy list");
    let mut other_sa = listed.clone();
    other_sa.service_account = "other".into();
    let (st, f) = flags(&st, Delta { workloads: vec![other_sa], ..Delta::default() });
    assert_eq!(f, (true, true), "a local workload's identity");
    let mut remote_listed = remote.clone();
    remote_listed.authorization_policies = vec!["default/p".into()];
    let (st, f) = flags(&st, Delta { workloads: vec![remote_listed], ..Delta::default() });
    assert_eq!(f, (true, false), "another node's workload decides nothing here");
    let (st, f) = flags(&st, Delta { removed_policies: vec!["default/p".into()], ..Delta::default() });
    assert_eq!(f, (true, true), "a policy removed");
    let (_, f) = flags(&st, Delta { removed_policies: vec!["default/p".into()], ..Delta::default() });
    assert_eq!(f, (false, false), "an unknown policy removed");

    // The store bumps the policy watcher only on authorization changes.
    let store = StateStore::new(State::new(Some("n1")));
    let mut any = store.subscribe();
    let mut pol = store.subscribe_policies();
    store.apply(Delta { workloads: vec![local.clone()], ..Delta::default() });
    assert!(any.has_changed().unwrap() && !pol.has_changed().unwrap());
    any.mark_unchanged();
    store.apply(Delta { policies: vec![policy("default", "p", Scope::Namespace)], ..Delta::default() });
    assert!(any.has_changed().unwrap() && pol.has_changed().unwrap());
    any.mark_unchanged();
    pol.mark_unchanged();
    let applied = store.apply(Delta { workloads: vec![local], ..Delta::default() });
    assert!(!applied.changed);
    assert!(!any.has_changed().unwrap(), "nothing changed, nothing published");
}

#[test]
fn health_policy_changes_keep_unhealthy_endpoints() {
    let mut sick = member("c//Pod/default/sick", "10.0.0.1");
    sick.status = HealthStatus::Unhealthy;
    let healthy = member("c//Pod/default/ok", "10.0.0.2");
    let mut allow_all = the_service();
    allow_all.load_balancer =
        Some(LoadBalancer { health_policy: HealthPolicy::AllowAll, ..Default::default() });
    let st = upsert_workloads(&State::default(), vec![sick.clone(), healthy]);
    let st = upsert_services(&st, vec![the_service()]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/ok"]);
    let st = upsert_services(&st, vec![allow_all.clone()]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/ok", "c//Pod/default/sick"]);
    let st = upsert_services(&st, vec![the_service()]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/ok"]);
    let st = upsert_services(&st, vec![allow_all]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/ok", "c//Pod/default/sick"], "held, not lost");
    // Going healthy under ONLY_HEALTHY puts it in; going unhealthy takes it out.
    let st = upsert_services(&st, vec![the_service()]);
    sick.status = HealthStatus::Healthy;
    let st = upsert_workloads(&st, vec![sick.clone()]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/ok", "c//Pod/default/sick"]);
    sick.status = HealthStatus::Unhealthy;
    let st = upsert_workloads(&st, vec![sick]);
    assert_eq!(endpoint_uids(&st, SVC), ["c//Pod/default/ok"]);
}

#[test]
fn an_update_leaves_the_previous_snapshot_untouched() {
    let st = upsert_services(&State::default(), vec![the_service()]);
    let st = upsert_workloads(&st, vec![member("c//Pod/default/a", "10.0.0.1")]);
    let before = st.dump();
    let (next, _) = remove(&st, &["c//Pod/default/a", SVC]);
    assert_eq!(st.dump(), before);
    assert_ne!(next.dump(), before);
}

/// One step of a random history over a small universe of names and addresses.
#[derive(Clone, Debug)]
enum Op {
    Workload { uid: u8, ip: u8, hbone: bool, pod: bool, healthy: bool, services: Vec<u8>, policy: bool },
    Service { id: u8, vip: u8, allow_all: bool, port: u16 },
    Policy { id: u8, global: bool },
    RemoveWorkload(u8),
    RemoveService(u8),
    RemovePolicy(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6u8, 0..4u8, any::<bool>(), any::<bool>(), any::<bool>(), prop::collection::vec(0..3u8, 0..3), any::<bool>())
            .prop_map(|(uid, ip, hbone, pod, healthy, services, policy)| Op::Workload { uid, ip, hbone, pod, healthy, services, policy }),
        2 => (0..3u8, 0..3u8, any::<bool>(), 80..82u16).prop_map(|(id, vip, allow_all, port)| Op::Service { id, vip, allow_all, port }),
        1 => (0..2u8, any::<bool>()).prop_map(|(id, global)| Op::Policy { id, global }),
        1 => (0..6u8).prop_map(Op::RemoveWorkload),
        1 => (0..3u8).prop_map(Op::RemoveService),
        1 => (0..2u8).prop_map(Op::RemovePolicy),
    ]
}

fn op_workload(
    uid: u8,
    ip_: u8,
    hbone: bool,
    pod: bool,
    healthy: bool,
    services: &[u8],
    policy: bool,
) -> Workload {
    let uid = if pod { format!("c//Pod/default/w{uid}") } else { format!("WorkloadEntry/default/w{uid}") };
    let mut w = wl(&uid, &[&format!("10.0.0.{ip_}")]);
    w.name = uid.rsplit('/').next().unwrap_or_default().into();
    w.protocol = if hbone { Protocol::Hbone } else { Protocol::Tcp };
    w.status = if healthy { HealthStatus::Healthy } else { HealthStatus::Unhealthy };
    for s in services {
        w.services.insert(format!("default/s{s}.example"), BTreeMap::from([(80, 8000 + u16::from(*s))]));
    }
    if policy {
        w.authorization_policies = vec!["default/p0".into()];
    }
    w
}

proptest! {
    /// Any history of upserts and removals applied one delta at a time ends in the same state as
    /// building what is left from scratch (and so as `from_config` of it).
    #[test]
    fn incremental_equals_from_scratch(ops in prop::collection::vec(op(), 1..40)) {
        let mut st = State::default();
        let mut workloads: BTreeMap<String, Workload> = BTreeMap::new();
        let mut services: BTreeMap<String, Service> = BTreeMap::new();
        let mut policies: BTreeMap<String, Authorization> = BTreeMap::new();
        for op in ops {
            let mut delta = Delta::default();
            match op {
                Op::Workload { uid, ip, hbone, pod, healthy, services: s, policy } => {
                    // Pods and entries share uid numbers: drop the other kind's one.
                    let w = op_workload(uid, ip, hbone, pod, healthy, &s, policy);
                    let other = op_workload(uid, ip, hbone, !pod, healthy, &s, policy).uid.to_string();
                    if workloads.remove(&other).is_some() {
                        delta.removed_addresses.push(other);
                    }
                    workloads.insert(w.uid.to_string(), w.clone());
                    delta.workloads.push(w);
                }
                Op::Service { id, vip, allow_all, port } => {
                    let mut s = svc(&format!("s{id}.example"), &[&format!("10.96.0.{vip}")], &[(port, 8080)]);
                    if allow_all {
                        s.load_balancer = Some(LoadBalancer { health_policy: HealthPolicy::AllowAll, ..Default::default() });
                    }
                    services.insert(s.key(), s.clone());
                    delta.services.push(s);
                }
                Op::Policy { id, global } => {
                    let p = policy("default", &format!("p{id}"), if global { Scope::Global } else { Scope::Namespace });
                    policies.insert(p.key(), p.clone());
                    delta.policies.push(p);
                }
                Op::RemoveWorkload(uid) => {
                    for name in [format!("c//Pod/default/w{uid}"), format!("WorkloadEntry/default/w{uid}")] {
                        workloads.remove(&name);
                        delta.removed_addresses.push(name);
                    }
                }
                Op::RemoveService(id) => {
                    let key = format!("default/s{id}.example");
                    services.remove(&key);
                    delta.removed_addresses.push(key);
                }
                Op::RemovePolicy(id) => {
                    let key = format!("default/p{id}");
                    policies.remove(&key);
                    delta.removed_policies.push(key);
                }
            }
            let (next, applied) = st.apply(delta);
            prop_assert!(applied.rejected.is_empty());
            st = next;
        }
        let scratch = State::from_config(
            LocalConfig {
                workloads: workloads.into_values().collect(),
                services: services.into_values().collect(),
                policies: policies.into_values().collect(),
            },
            None,
        ).unwrap();
        prop_assert_eq!(st.dump(), scratch.dump());
        for i in 0..4 {
            let a = ip(&format!("10.0.0.{i}"));
            prop_assert_eq!(st.workload_by_addr("", a), scratch.workload_by_addr("", a));
            let v = ip(&format!("10.96.0.{i}"));
            prop_assert_eq!(st.service_by_vip("", v, "default"), scratch.service_by_vip("", v, "default"));
        }
        for w in scratch.workloads() {
            let mut a: Vec<String> = st.policies_for(w).iter().map(|p| p.key()).collect();
            let b: Vec<String> = scratch.policies_for(w).iter().map(|p| p.key()).collect();
            a.sort();
            let mut b = b;
            b.sort();
            prop_assert_eq!(a, b);
            prop_assert_eq!(st.find_local("default", &w.name, "default"), scratch.find_local("default", &w.name, "default"));
        }
    }
}
