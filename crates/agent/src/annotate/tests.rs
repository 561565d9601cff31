use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

/// Refuses the first `refuse` patches (403), then accepts; records every attempt.
#[derive(Default)]
struct Scripted {
    refuse: AtomicU32,
    hang: std::sync::atomic::AtomicBool,
    attempts: Mutex<Vec<(String, Option<&'static str>)>>,
}

impl Annotate for Scripted {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), AnnotateError>> {
        self.attempts.lock().expect("lock").push((pod.name.clone(), value));
        let refuse =
            self.refuse.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        let hang = self.hang.load(Ordering::SeqCst);
        let pod = format!("{}/{}", pod.namespace, pod.name);
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            if refuse {
                Err(AnnotateError::Refused { pod, code: 403, message: "forbidden".into() })
            } else {
                Ok(())
            }
        })
    }
}

fn pod(uid: &str, name: &str) -> Pod {
    Pod { uid: uid.into(), name: name.into(), namespace: "demo".into(), ..Default::default() }
}

const FAST: Retry = Retry {
    first: Duration::from_millis(5),
    max: Duration::from_millis(20),
    timeout: Duration::from_millis(200),
};

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn refused_patches_are_counted_and_retried_until_they_pass() {
    let api = Arc::new(Scripted { refuse: AtomicU32::new(3), ..Default::default() });
    let a = Annotations::new(api.clone(), FAST, Counter::default());
    tokio::spawn(a.clone().run());
    a.set(&pod("u1", "web"), Some("enabled"));
    until("the patch passes", || a.pending() == 0).await;
    assert_eq!(a.failures(), 3);
    assert_eq!(*api.attempts.lock().expect("lock"), vec![("web".to_owned(), Some("enabled")); 4]);
}

#[tokio::test]
async fn a_newer_value_replaces_one_not_written_and_deleted_pods_are_dropped() {
    let api = Arc::new(Scripted { refuse: AtomicU32::new(u32::MAX), ..Default::default() });
    let a = Annotations::new(api.clone(), FAST, Counter::default());
    tokio::spawn(a.clone().run());
    a.set(&pod("u1", "web"), Some("pending"));
    until("a first failure", || a.failures() >= 1).await;
    a.set(&pod("u1", "web"), Some("enabled"));
    until("the newer value tried", || {
        api.attempts.lock().expect("lock").iter().any(|(_, v)| *v == Some("enabled"))
    })
    .await;
    assert_eq!(a.pending(), 1, "one pod, one wanted value");
    a.forget("u1");
    assert_eq!(a.pending(), 0);
    let tried = api.attempts.lock().expect("lock").len();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(api.attempts.lock().expect("lock").len(), tried, "a forgotten pod is not patched again");
}

#[tokio::test]
async fn a_hung_api_times_out_and_counts() {
    let api = Arc::new(Scripted { hang: true.into(), ..Default::default() });
    let a = Annotations::new(api.clone(), FAST, Counter::default());
    tokio::spawn(a.clone().run());
    a.set(&pod("u1", "web"), Some("enabled"));
    until("a timeout", || a.failures() >= 1).await;
    assert_eq!(a.pending(), 1);
}

#[test]
fn backoff_doubles_to_the_cap() {
    let r = Retry { first: Duration::from_secs(1), max: Duration::from_secs(60), timeout: Duration::ZERO };
    let waits: Vec<u64> = (1..=8).map(|n| backoff(r, n).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(backoff(r, u32::MAX), Duration::from_secs(60));
}

/// Local mode: the worker writes the wanted values to `<dir>/<node>.json`; a removed value and
/// a deleted pod leave it; a restarted agent keeps what it wrote before, minus pods gone since.
#[tokio::test]
async fn local_mode_writes_the_capture_state_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let read = || -> Vec<(String, String, String)> {
        let bytes = std::fs::read(dir.path().join("node-1.json")).expect("the capture-state file");
        let state: CaptureState = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(state.node, "node-1");
        state.pods.into_iter().map(|p| (p.name, p.uid, p.redirection)).collect()
    };
    let file = Arc::new(FileAnnotate::new(dir.path(), "node-1").expect("file annotate"));
    assert_eq!(read(), [], "written at start");
    let a = Annotations::new(file.clone(), FAST, Counter::default());
    tokio::spawn(a.clone().run());
    a.set(&pod("u1", "web"), Some("enabled"));
    a.set(&pod("u2", "api"), Some("pending"));
    until("both written", || a.pending() == 0).await;
    let both = [("api".into(), "u2".into(), "pending".into()), ("web".into(), "u1".into(), "enabled".into())];
    assert_eq!(read(), both);
    a.set(&pod("u2", "api"), None);
    until("removal written", || a.pending() == 0).await;
    assert_eq!(read(), [("web".into(), "u1".into(), "enabled".into())]);
    a.forget("u1");
    assert_eq!(read(), [], "a deleted pod leaves the file");

    a.set(&pod("u1", "web"), Some("enabled"));
    a.set(&pod("u3", "db"), Some("enabled"));
    until("written", || a.pending() == 0).await;
    let restarted = FileAnnotate::new(dir.path(), "node-1").expect("restart");
    assert_eq!(read().len(), 2, "a restart keeps the earlier state");
    restarted.retain(&["u3".to_owned()].into()).expect("retain");
    assert_eq!(read(), [("db".into(), "u3".into(), "enabled".into())], "pods gone since are dropped");
    assert!(matches!(FileAnnotate::new(dir.path(), "a/b"), Err(CaptureError::NodeName(_))));
    let names: Vec<_> =
        std::fs::read_dir(dir.path()).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names, ["node-1.json"], "no temporary file left behind");
}

/// The agent's file and the control plane's file source meet: the pod read from YAML carries
/// the annotation the agent wrote.
#[test]
fn the_file_source_lays_the_agents_state_over_the_pod() {
    use ambit_objects::file::FileSource;
    use ambit_objects::{Change, Filter, Object};
    let dir = tempfile::tempdir().expect("tempdir");
    let (objects, state) = (dir.path().join("objects"), dir.path().join("state"));
    std::fs::create_dir_all(&objects).expect("mkdir");
    std::fs::create_dir_all(&state).expect("mkdir");
    std::fs::write(
        objects.join("web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: demo\n  uid: u1\nspec:\n  nodeName: node-1\n",
    )
    .expect("write");
    let file = FileAnnotate::new(&state, "node-1").expect("file annotate");
    let mut src = FileSource::new(&objects, Filter::all()).with_capture_state(&state);
    assert_eq!(src.poll().len(), 1);
    futures::executor::block_on(file.set_redirection(&pod("u1", "web"), Some("enabled"))).expect("written");
    let changes = src.poll();
    let [Change::Upsert(Object::Pod(p))] = changes.as_slice() else { panic!("one pod upsert: {changes:?}") };
    assert_eq!(
        p.metadata.annotations.as_ref().and_then(|a| a.get(crate::enroll::REDIRECTION)).map(String::as_str),
        Some("enabled")
    );
}
