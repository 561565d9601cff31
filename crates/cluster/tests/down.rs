//! `down` after a cluster was left running (root): the owner is stopped, the namespaces, the
//! sandboxes' processes and cgroups and the run directory are gone, and a second `down` finds
//! nothing to do.

use std::process::Command;
use std::time::Duration;

use ambit_cluster::down::down;
use ambit_cluster::ip;
use ambit_cluster::sandbox::{Sandbox, cgroup2_mount};
use ambit_cluster::state::{ClusterState, PodState, VERSION};
use ambit_cluster::testing::require_root;
use ambit_cluster::topology::NetworkSpec;

#[test]
fn down_removes_a_cluster_whose_owner_still_runs_and_is_idempotent() {
    if !require_root() {
        return;
    }
    let tag = format!("ambc{}4", std::process::id());
    let tmp = tempfile::tempdir().expect("tmp");
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).expect("run dir");
    let network = NetworkSpec {
        tag: tag.clone(),
        nodes: vec!["node1".into()],
        hosts: vec!["control".into()],
        segment: (252, rand::random()),
        pods: 246,
    }
    .build()
    .expect("network");
    let cgroup_root = cgroup2_mount().expect("cgroup2").join(format!("{tag}.slice"));
    let sb = Sandbox::create(&format!("{tag}-pod-a"), "demo", "a", None, &cgroup_root).expect("sandbox");
    // A stand-in for the supervisor that owns the cluster.
    let mut owner = Command::new("sleep").arg("60").spawn().expect("owner");
    let state = ClusterState {
        version: VERSION,
        run_dir: run.clone(),
        owner: owner.id(),
        network: network.clone(),
        cgroup_root: cgroup_root.clone(),
        pods: vec![PodState {
            namespace: "demo".into(),
            name: "a".into(),
            uid: sb.pod.uid.clone(),
            node: "node1".into(),
            netns: sb.netns.clone(),
            container_id: sb.pod.container_id.clone(),
            ip: None,
            ..PodState::default()
        }],
        phase: "ready".into(),
        processes: Vec::new(),
        errors: Vec::new(),
        events: Vec::new(),
        proxy_ports: Default::default(),
    };
    state.save().expect("record");
    // The sandbox is left running, as after a killed `ambit up`.
    let pause = sb.pause_pid();
    std::mem::forget(sb);

    let removed = down(&run, &tag, Duration::from_secs(2));
    assert!(removed.errors.is_empty(), "{:?}", removed.errors);
    assert_eq!(removed.owner, Some(owner.id()));
    let status = owner.wait().expect("owner reaped");
    assert!(!status.success(), "the owner was not stopped: {status}");
    let mut want = network.namespaces();
    want.push(format!("{tag}-pod-a"));
    want.sort();
    let mut got = removed.namespaces.clone();
    got.sort();
    assert_eq!(got, want);
    assert!(ip::netns_with_prefix(&format!("{tag}-")).is_empty());
    assert!(!ambit_cluster::state::pid_alive(pause), "pause still runs");
    assert!(removed.cgroups >= 3, "{removed:?}");
    assert!(!cgroup_root.exists() && !run.exists());

    let again = down(&run, &tag, Duration::from_secs(1));
    assert!(again.nothing() && again.errors.is_empty(), "{again:?}");
}
