use std::collections::BTreeMap;
use std::sync::Mutex as StdMutex;

use ambit_zds::{Request, ZdsClient, ZdsListener};

use super::*;
use crate::enroll::{AMBIENT, DATAPLANE_MODE};
use crate::model::Phase;

#[derive(Default)]
struct Recorder {
    events: StdMutex<Vec<String>>,
    fail_apply: std::sync::atomic::AtomicBool,
    /// What the next `repair` finds drifted (taken by it).
    drift: StdMutex<Vec<String>>,
}

impl Recorder {
    fn push(&self, e: String) {
        self.events.lock().expect("lock").push(e);
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.events.lock().expect("lock"))
    }
}

impl Capture for Recorder {
    fn apply(&self, _: &Netns, pod: &Pod) -> Result<(), String> {
        self.push(format!("apply {}", pod.name));
        if self.fail_apply.load(std::sync::atomic::Ordering::Relaxed) {
            Err("iptables exploded".into())
        } else {
            Ok(())
        }
    }
    fn repair(&self, _: &Netns, pod: &Pod) -> Result<Vec<String>, String> {
        self.push(format!("verify {}", pod.name));
        Ok(std::mem::take(&mut *self.drift.lock().expect("lock")))
    }
    fn remove(&self, _: &Netns) -> Result<(), String> {
        self.push("remove".into());
        Ok(())
    }
}

impl Annotate for Recorder {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> futures::future::BoxFuture<'static, Result<(), String>> {
        self.push(format!("annotate {} {}", pod.name, value.unwrap_or("-")));
        Box::pin(async { Ok(()) })
    }
}

fn ns(name: &str, ambient: bool) -> Namespace {
    let labels = if ambient {
        BTreeMap::from([(DATAPLANE_MODE.to_owned(), AMBIENT.to_owned())])
    } else {
        BTreeMap::new()
    };
    Namespace { name: name.into(), labels }
}

fn pod(uid: &str, name: &str, namespace: &str) -> Pod {
    Pod {
        uid: uid.into(),
        name: name.into(),
        namespace: namespace.into(),
        service_account: "sa".into(),
        phase: Phase::Running,
        ips: vec!["10.0.0.9".parse().expect("ip")],
        ..Default::default()
    }
}

fn event(name: &str, namespace: &str) -> PluginEvent {
    PluginEvent {
        netns: "/proc/self/ns/net".into(),
        pod_name: name.into(),
        pod_namespace: namespace.into(),
        ips: vec!["10.0.0.9".parse().expect("ip")],
    }
}

struct Setup {
    mesh: Arc<Mesh>,
    rec: Arc<Recorder>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("zds.sock");
    let listener = ZdsListener::bind(&path).expect("bind");
    let zds = ZdsServer::new(&path);
    let rec = Arc::new(Recorder::default());
    let paths = HostPaths { netns_prefix: PathBuf::from("/"), proc_root: PathBuf::from("/proc") };
    let mesh = Mesh::new(Enrollment::default(), zds.clone(), rec.clone(), rec.clone(), paths);
    let m = mesh.clone();
    tokio::spawn(zds.run(listener, Arc::new(move || m.snapshot())));
    Setup { mesh, rec, path, _dir: dir }
}

/// A fake node proxy acking everything (answers with `nack` when set), recording requests.
async fn fake_proxy(path: &Path, nack: Option<&'static str>) -> Arc<StdMutex<Vec<String>>> {
    let mut client = ZdsClient::connect(path).await.expect("connect");
    let seen = Arc::new(StdMutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok(Some(req)) = client.recv().await {
            let (line, is_add) = match &req {
                Request::Add { uid, .. } => (format!("add {uid}"), true),
                Request::Keep { uid } => (format!("keep {uid}"), false),
                Request::Del { uid } => (format!("del {uid}"), false),
                Request::SnapshotSent => ("snapshot".to_owned(), false),
            };
            s.lock().expect("lock").push(line);
            let ack = match nack {
                Some(e) if is_add => Err(e.to_owned()),
                _ => Ok(()),
            };
            if client.ack(ack).await.is_err() {
                return;
            }
        }
    });
    // Wait until the (empty) snapshot went through.
    for _ in 0..200 {
        if seen.lock().expect("lock").iter().any(|l| l == "snapshot") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen
}

#[tokio::test]
async fn cni_add_enrolls_then_namespace_unlabel_releases() {
    let s = setup().await;
    let seen = fake_proxy(&s.path, None).await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u1", "web", "demo"));
    assert_eq!(s.mesh.cni_add(&event("web", "demo")).await.expect("add"), AddOutcome::Enrolled);
    assert_eq!(s.rec.take(), vec!["apply web", "annotate web enabled"]);
    assert_eq!(seen.lock().expect("lock").last().map(String::as_str), Some("add u1"));
    assert_eq!(s.mesh.snapshot().len(), 1);
    // Idempotent reconcile: the capture is verified, nothing else happens.
    s.mesh.reconcile("u1").await.expect("reconcile");
    assert_eq!(s.rec.take(), vec!["verify web"]);
    assert_eq!(seen.lock().expect("lock").last().map(String::as_str), Some("add u1"), "no new ZDS request");
    // A capture that drifted is repaired by the reconcile, and the pod stays enrolled.
    *s.rec.drift.lock().expect("lock") = vec!["sysctl net.ipv4.tcp_migrate_req is 0, want 1".into()];
    s.mesh.reconcile("u1").await.expect("reconcile repairs");
    assert_eq!(s.rec.take(), vec!["verify web"]);
    assert_eq!(s.mesh.enrolled().len(), 1);
    // The namespace loses its label: the pod is released (rules removed, proxy told).
    let affected = s.mesh.upsert_namespace(ns("demo", false));
    assert_eq!(affected, vec!["u1".to_owned()]);
    s.mesh.reconcile("u1").await.expect("release");
    assert_eq!(s.rec.take(), vec!["remove", "annotate web -"]);
    assert_eq!(seen.lock().expect("lock").last().map(String::as_str), Some("del u1"));
    assert!(s.mesh.enrolled().is_empty());
}

#[tokio::test]
async fn not_enrolled_pods_pass_at_once() {
    let s = setup().await;
    s.mesh.upsert_namespace(ns("plain", false));
    s.mesh.upsert_pod(pod("u2", "db", "plain"));
    let out = s.mesh.cni_add(&event("db", "plain")).await.expect("answer");
    assert!(matches!(out, AddOutcome::NotEnrolled(_)), "{out:?}");
    assert!(s.rec.take().is_empty(), "nothing applied for a pod outside the mesh");
}

#[tokio::test]
async fn no_proxy_means_pending_and_captured() {
    let s = setup().await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u3", "api", "demo"));
    let err = s.mesh.cni_add(&event("api", "demo")).await.expect_err("no proxy");
    assert!(matches!(err, MeshError::Proxy(ZdsError::NoProxy(_))), "{err}");
    assert!(err.retryable());
    // A CNI ADD that fails leaves nothing behind (the runtime retries the whole sandbox).
    assert_eq!(s.rec.take(), vec!["apply api", "remove"]);
    assert!(s.mesh.enrolled().is_empty());
}

#[tokio::test]
async fn proxy_nack_and_capture_failure() {
    let s = setup().await;
    let _seen = fake_proxy(&s.path, Some("cannot bind")).await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u4", "w", "demo"));
    let err = s.mesh.cni_add(&event("w", "demo")).await.expect_err("nack");
    assert!(err.to_string().contains("cannot bind"), "{err}");
    assert_eq!(s.rec.take(), vec!["apply w", "remove"]);
    s.rec.fail_apply.store(true, std::sync::atomic::Ordering::Relaxed);
    let err = s.mesh.cni_add(&event("w", "demo")).await.expect_err("capture fails");
    assert!(matches!(err, MeshError::Capture { .. }) && !err.retryable(), "{err}");
    assert_eq!(s.rec.take(), vec!["apply w", "remove"], "a failed capture is rolled back");
}

#[tokio::test]
async fn deleted_pods_leave_the_proxy_without_touching_their_netns() {
    let s = setup().await;
    let seen = fake_proxy(&s.path, None).await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u5", "job", "demo"));
    s.mesh.cni_add(&event("job", "demo")).await.expect("add");
    s.rec.take();
    s.mesh.delete_pod("u5").await.expect("delete");
    assert_eq!(s.rec.take(), vec!["annotate job -"]);
    assert_eq!(seen.lock().expect("lock").last().map(String::as_str), Some("del u5"));
    let err = s.mesh.cni_add(&event("job", "demo")).await.expect_err("gone");
    assert!(matches!(err, MeshError::UnknownPod(_)), "{err}");
}

#[tokio::test]
async fn enrollment_cache_marks_namespaces_where_pods_may_be_enrolled() {
    let s = setup().await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_namespace(ns("plain", false));
    s.mesh.upsert_namespace(ns("mixed", false));
    s.mesh.upsert_pod(pod("u1", "web", "plain"));
    let mut labelled = pod("u2", "api-7d9", "mixed");
    labelled.labels = BTreeMap::from([(DATAPLANE_MODE.to_owned(), AMBIENT.to_owned())]);
    s.mesh.upsert_pod(labelled);
    let cache = s.mesh.enrollment_cache();
    assert_eq!(cache["namespaces"]["demo"], true);
    assert_eq!(cache["namespaces"]["plain"], false, "no pod of it is selected");
    // A sibling of the labelled pod created while the agent is down must not start uncaptured.
    assert_eq!(cache["namespaces"]["mixed"], true, "a pod selected by its own label");
}
