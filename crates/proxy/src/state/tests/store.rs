//! Snapshot publication, notification and the local-file watcher.

use std::time::Duration;

use super::*;
use crate::authz::Scope;

const ONE_POLICY: &str = r#"
workloads:
- uid: u1
  namespace: default
  workloadIps: ["10.0.0.1"]
policies:
- {name: p, namespace: default, scope: Namespace}
"#;

fn parse(yaml: &str) -> State {
    State::from_config(LocalConfig::parse(yaml).unwrap(), None).unwrap()
}

#[test]
fn publish_notifies_and_tracks_policy_changes() {
    let store = StateStore::new(State::default());
    let mut any = store.subscribe();
    let mut pol = store.subscribe_policies();
    store.publish(parse(ONE_POLICY));
    assert!(any.has_changed().unwrap() && pol.has_changed().unwrap());
    any.mark_unchanged();
    pol.mark_unchanged();
    assert!(store.current().workload_by_uid("u1").is_some());

    // Same policies, different workloads: only the general watcher fires.
    store.publish(parse(&ONE_POLICY.replace("10.0.0.1", "10.0.0.2")));
    assert!(any.has_changed().unwrap());
    assert!(!pol.has_changed().unwrap());
    any.mark_unchanged();

    // Changed policy content fires the policy watcher.
    store.publish(parse(&ONE_POLICY.replace("scope: Namespace", "scope: Global")));
    assert!(any.has_changed().unwrap() && pol.has_changed().unwrap());
    let cur = store.current();
    assert_eq!(cur.policies().next().unwrap().scope, Scope::Global);
}

/// `ONE_POLICY` in a file, the store built from it, and its watcher (20 ms polls) after it took
/// its initial fingerprint.
async fn watched() -> (tempfile::TempDir, std::path::PathBuf, StateStore, tokio::task::JoinHandle<()>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("local.yaml");
    std::fs::write(&path, ONE_POLICY).unwrap();
    let (state, loaded) = load_local_file(&path, None).unwrap();
    let store = StateStore::new(state);
    let task =
        tokio::spawn(watch_local_file(store.clone(), path.clone(), Duration::from_millis(20), Some(loaded)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    (dir, path, store, task)
}

async fn wait_for(store: &StateStore, pred: impl Fn(&State) -> bool) -> bool {
    for _ in 0..200 {
        if pred(&store.current()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn watcher_reloads_and_keeps_state_on_bad_files() {
    let (_dir, path, store, task) = watched().await;
    let pol = store.subscribe_policies();

    // A valid change is picked up.
    std::fs::write(&path, ONE_POLICY.replace("uid: u1", "uid: u2")).unwrap();
    assert!(wait_for(&store, |s| s.workload_by_uid("u2").is_some()).await);
    assert!(!pol.has_changed().unwrap(), "policies did not change");

    // A broken file is rejected; the previous state stays.
    std::fs::write(&path, "workloads: [[[").unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(store.current().workload_by_uid("u2").is_some());

    // Recovery.
    std::fs::write(&path, ONE_POLICY.replace("uid: u1", "uid: u3")).unwrap();
    assert!(wait_for(&store, |s| s.workload_by_uid("u3").is_some()).await);
    task.abort();
}

/// Empty files and files with duplicate uids or addresses are rejected and the previous state
/// stays; `{}` is the explicit way to empty the config.
#[tokio::test]
async fn watcher_keeps_state_on_empty_and_duplicate_files() {
    let (_dir, path, store, task) = watched().await;

    let dup = "workloads:\n- {uid: u9, namespace: d, workloadIps: [10.0.0.9]}\n- {uid: u9, namespace: d, workloadIps: [10.0.0.8]}\n";
    let dup_ip = "workloads:\n- {uid: u8, namespace: d, workloadIps: [10.0.0.9]}\n- {uid: u9, namespace: d, workloadIps: [10.0.0.9]}\n";
    for (what, text) in [
        ("empty", ""),
        ("truncated to a comment", "# mesh\n"),
        ("duplicate uid", dup),
        ("duplicate IP", dup_ip),
    ] {
        std::fs::write(&path, text).unwrap();
        // A file accepted would replace u1 at the next 20 ms poll.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let st = store.current();
        assert!(st.workload_by_uid("u1").is_some(), "{what}: the previous state was dropped");
        assert_eq!(st.workloads().count(), 1, "{what}");
    }
    std::fs::write(&path, "{}\n").unwrap();
    assert!(
        wait_for(&store, |s| s.workloads().count() == 0 && s.policies().count() == 0).await,
        "`{{}}` empties the config"
    );
    task.abort();
}

/// With xDS beside the file, a file change is a delta: what xDS delivered stays, what left the
/// file goes.
#[tokio::test]
async fn file_reloads_keep_what_xds_delivered() {
    let (_dir, path, store, task) = watched().await;

    // A workload from xDS.
    let from_xds =
        LocalConfig::parse("workloads:\n- {uid: x1, namespace: d, workloadIps: [10.0.0.99]}\n").unwrap();
    let applied = store.apply(Delta::from(from_xds));
    assert!(applied.changed && applied.rejected.is_empty(), "{applied:?}");

    // The file's u1 is replaced by u2: u1 leaves, x1 stays.
    std::fs::write(&path, ONE_POLICY.replace("uid: u1", "uid: u2")).unwrap();
    assert!(wait_for(&store, |s| s.workload_by_uid("u2").is_some()).await);
    let st = store.current();
    assert!(st.workload_by_uid("u1").is_none(), "u1 left the file but stayed in the state");
    assert!(st.workload_by_uid("x1").is_some(), "the file reload dropped the workload xDS delivered");
    task.abort();
}

/// The process's resident set, in bytes (`/proc/self/statm`'s second field, in pages).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn pages_a_load_freed_go_back_to_the_system() {
    // What a large load leaves behind: many small blocks, freed, with a few live ones among
    // them (the state), so the heap cannot shrink from its top alone.
    let run = std::thread::spawn(|| {
        let mut blocks: Vec<Vec<u8>> = (0..400_000).map(|i| vec![(i % 251) as u8; 200]).collect();
        let kept: Vec<Vec<u8>> = blocks.iter().step_by(1000).cloned().collect();
        let loaded = rss();
        blocks.clear();
        blocks.shrink_to_fit();
        let freed = rss();
        release_freed();
        let released = rss();
        drop(kept);
        (loaded, freed, released)
    });
    let (loaded, freed, released) = run.join().unwrap();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    assert!(
        freed + (32 << 20) > loaded,
        "freeing alone is expected to keep the pages: {:.1} MiB loaded, {:.1} MiB after the free",
        mib(loaded),
        mib(freed)
    );
    assert!(
        released + (32 << 20) < freed,
        "{:.1} MiB after the free, {:.1} MiB after release_freed: want at least 32 MiB back",
        mib(freed),
        mib(released)
    );
}
