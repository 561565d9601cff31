use std::collections::BTreeMap;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, Ordering};

use ambit_cni::event::{EventIp, IpNet};
use ambit_zds::{Request, ZdsClient, ZdsListener};
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;

use super::*;
use crate::annotate::{Annotate, AnnotateError, Retry};
use crate::enroll::{AMBIENT, DATAPLANE_MODE};
use crate::model::Phase;
use crate::test_support::OtherNetns;

/// Records capture operations and annotation writes (separately: annotations are written by the
/// worker, after the ADD answered).
#[derive(Default)]
struct Recorder {
    captures: StdMutex<Vec<String>>,
    annotations: StdMutex<Vec<String>>,
    fail_apply: AtomicBool,
    refuse_annotations: AtomicBool,
    /// What the next `repair` finds drifted (taken by it).
    drift: StdMutex<Vec<String>>,
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.captures.lock().expect("lock"))
    }
    fn annotations(&self) -> Vec<String> {
        self.annotations.lock().expect("lock").clone()
    }
}

impl Capture for Recorder {
    fn apply(&self, _: &Netns, pod: &Pod) -> Result<(), CaptureError> {
        self.captures.lock().expect("lock").push(format!("apply {}", pod.name));
        if self.fail_apply.load(Ordering::Relaxed) {
            Err(CaptureError::Task("iptables exploded".into()))
        } else {
            Ok(())
        }
    }
    fn repair(&self, _: &Netns, pod: &Pod) -> Result<Vec<String>, CaptureError> {
        self.captures.lock().expect("lock").push(format!("verify {}", pod.name));
        Ok(std::mem::take(&mut *self.drift.lock().expect("lock")))
    }
    fn remove(&self, _: &Netns) -> Result<(), CaptureError> {
        self.captures.lock().expect("lock").push("remove".into());
        Ok(())
    }
}

impl Annotate for Recorder {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), AnnotateError>> {
        self.annotations.lock().expect("lock").push(format!("{} {}", pod.name, value.unwrap_or("-")));
        let refused = self.refuse_annotations.load(Ordering::Relaxed);
        let pod = format!("{}/{}", pod.namespace, pod.name);
        Box::pin(async move {
            if refused {
                Err(AnnotateError::Refused { pod, code: 403, message: "pods/status is forbidden".into() })
            } else {
                Ok(())
            }
        })
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

fn event_at(name: &str, namespace: &str, netns: &str) -> PluginEvent {
    PluginEvent {
        netns: netns.into(),
        pod_name: name.into(),
        pod_namespace: namespace.into(),
        ips: vec![EventIp {
            interface: Some(0),
            address: IpNet::parse_cidr("10.0.0.9/24").expect("cidr"),
            gateway: None,
        }],
    }
}

struct Setup {
    mesh: Arc<Mesh>,
    rec: Arc<Recorder>,
    annotations: Arc<Annotations>,
    path: PathBuf,
    /// A pod network namespace (not the test's own).
    netns: OtherNetns,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn event(&self, name: &str, namespace: &str) -> PluginEvent {
        event_at(name, namespace, &self.netns.path().display().to_string())
    }
}

const FAST: Retry = Retry {
    first: Duration::from_millis(5),
    max: Duration::from_millis(20),
    timeout: Duration::from_secs(1),
};

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("zds.sock");
    let listener = ZdsListener::bind(&path).expect("bind");
    let zds = ZdsServer::new(&path);
    let rec = Arc::new(Recorder::default());
    let annotations = Annotations::new(rec.clone(), FAST, Counter::default());
    tokio::spawn(annotations.clone().run());
    let paths = HostPaths {
        netns_prefix: PathBuf::from("/"),
        proc_root: PathBuf::from("/proc"),
        host_namespaces: HostNamespaces::discover(Path::new("/proc/self/ns/net"), Path::new("/proc")),
    };
    let mesh = Mesh::new(Enrollment::default(), zds.clone(), rec.clone(), annotations.clone(), paths);
    let m = mesh.clone();
    tokio::spawn(zds.run(listener, Arc::new(move || m.snapshot())));
    Setup { mesh, rec, annotations, path, netns: OtherNetns::new(), _dir: dir }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
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
    assert_eq!(s.mesh.cni_add(&s.event("web", "demo")).await.expect("add"), AddOutcome::Enrolled);
    assert_eq!(s.rec.take(), vec!["apply web"]);
    until("the annotation", || s.rec.annotations() == ["web enabled"]).await;
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
    assert_eq!(s.rec.take(), vec!["remove"]);
    until("the annotation removed", || s.rec.annotations() == ["web enabled", "web -"]).await;
    assert_eq!(seen.lock().expect("lock").last().map(String::as_str), Some("del u1"));
    assert!(s.mesh.enrolled().is_empty());
}

#[tokio::test]
async fn not_enrolled_pods_pass_at_once() {
    let s = setup().await;
    s.mesh.upsert_namespace(ns("plain", false));
    s.mesh.upsert_pod(pod("u2", "db", "plain"));
    let out = s.mesh.cni_add(&s.event("db", "plain")).await.expect("answer");
    assert!(matches!(out, AddOutcome::NotEnrolled(_)), "{out:?}");
    assert!(s.rec.take().is_empty(), "nothing applied for a pod outside the mesh");
}

#[tokio::test]
async fn no_proxy_means_pending_and_captured() {
    let s = setup().await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u3", "api", "demo"));
    let err = s.mesh.cni_add(&s.event("api", "demo")).await.expect_err("no proxy");
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
    let err = s.mesh.cni_add(&s.event("w", "demo")).await.expect_err("nack");
    assert!(err.to_string().contains("cannot bind"), "{err}");
    assert_eq!(s.rec.take(), vec!["apply w", "remove"]);
    s.rec.fail_apply.store(true, Ordering::Relaxed);
    let err = s.mesh.cni_add(&s.event("w", "demo")).await.expect_err("capture fails");
    assert!(matches!(err, MeshError::Capture { .. }) && !err.retryable(), "{err}");
    assert_eq!(s.rec.take(), vec!["apply w", "remove"], "a failed capture is rolled back");
}

#[tokio::test]
async fn deleted_pods_leave_the_proxy_without_touching_their_netns() {
    let s = setup().await;
    let seen = fake_proxy(&s.path, None).await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u5", "job", "demo"));
    s.mesh.cni_add(&s.event("job", "demo")).await.expect("add");
    s.rec.take();
    s.mesh.delete_pod("u5").await.expect("delete");
    assert!(s.rec.take().is_empty(), "a deleted pod's netns is not touched");
    assert_eq!(seen.lock().expect("lock").last().map(String::as_str), Some("del u5"));
    let err = s.mesh.cni_add(&s.event("job", "demo")).await.expect_err("gone");
    assert!(matches!(err, MeshError::UnknownPod(_)), "{err}");
}

/// Point 10: an API that refuses every `pods/status` patch does not fail the ADD: the pod is
/// captured once and acked, the patch is retried, and every failure is counted.
#[tokio::test]
async fn refused_annotation_does_not_fail_the_add() {
    let s = setup().await;
    let seen = fake_proxy(&s.path, None).await;
    s.rec.refuse_annotations.store(true, Ordering::Relaxed);
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u6", "web", "demo"));
    assert_eq!(s.mesh.cni_add(&s.event("web", "demo")).await.expect("ADD"), AddOutcome::Enrolled);
    assert_eq!(s.rec.take(), vec!["apply web"], "captured once, nothing rolled back");
    assert_eq!(seen.lock().expect("lock").iter().filter(|l| *l == "add u6").count(), 1, "acked once");
    assert_eq!(s.mesh.enrolled(), HashSet::from(["u6".to_owned()]));
    until("three refused patches", || s.annotations.failures() >= 3).await;
    let tried = s.rec.annotations();
    assert!(tried.len() >= 3 && tried.iter().all(|a| a == "web enabled"), "{tried:?}");
    assert_eq!(s.annotations.pending(), 1);
    // Reconcile sees nothing to do: the capture is verified, no second capture, no second Add.
    s.mesh.reconcile("u6").await.expect("reconcile");
    assert_eq!(s.rec.take(), vec!["verify web"]);
    assert_eq!(seen.lock().expect("lock").iter().filter(|l| *l == "add u6").count(), 1, "no second Add");
    // Once the API accepts, the report is written and the queue empties.
    s.rec.refuse_annotations.store(false, Ordering::Relaxed);
    until("the patch accepted", || s.annotations.pending() == 0).await;
    let failures = s.annotations.failures();
    assert_eq!(failures as usize, s.rec.annotations().len() - 1, "every attempt but the last failed");
}

/// Point 14 at the core: what a CNI ADD names must be a network namespace other than the
/// agent's and the host's, and is checked before anything enters it.
#[tokio::test]
async fn cni_add_refuses_what_is_not_a_pods_netns() {
    let s = setup().await;
    let seen = fake_proxy(&s.path, None).await;
    s.mesh.upsert_namespace(ns("demo", true));
    s.mesh.upsert_pod(pod("u7", "web", "demo"));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hostname");
    std::fs::write(&file, "x").expect("write");
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    let cases: Vec<(String, String)> = vec![
        (
            file.display().to_string(),
            format!("it is not a network namespace (it refers to {})", file.display()),
        ),
        (dir.path().join("missing").display().to_string(), "it does not exist".into()),
        (dir.path().display().to_string(), "it is not a network namespace (it is a directory)".into()),
        (fifo.display().to_string(), "it is not a network namespace (it is a FIFO)".into()),
        ("/proc/self/ns/net".into(), "it is the node agent's own network namespace, not a pod's".into()),
        ("/proc/self/ns/uts".into(), "it is not a network namespace (it is another kind of namespace".into()),
    ];
    for (path, reason) in cases {
        let err = s.mesh.cni_add(&event_at("web", "demo", &path)).await.expect_err(&path);
        assert!(matches!(err, MeshError::InvalidNetns { .. }), "{path}: {err}");
        let want = format!("refusing CNI_NETNS {path} of pod demo/web: {reason}");
        assert!(err.to_string().starts_with(&want), "{path}:\n got {err}\nwant {want}");
        assert!(!err.retryable());
    }
    assert!(s.rec.take().is_empty(), "nothing was applied");
    assert!(!seen.lock().expect("lock").iter().any(|l| l.starts_with("add")), "nothing reached the proxy");
    // A namespace named as the host's (`--host-netns`) is refused too.
    let host = OtherNetns::new();
    let host_id = ambit_netns::NetnsId::of_path(&host.path()).expect("id");
    let named = HostNamespaces::of([(host_id, "the host's network namespace (/test/host)".to_owned())]);
    let err = named.open_pod_netns(&host.path()).expect_err("host");
    assert_eq!(err.to_string(), "it is the host's network namespace (/test/host), not a pod's");
    assert!(named.open_pod_netns(&s.netns.path()).is_ok(), "a pod's namespace opens");
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
    assert!(cache.namespaces["demo"]);
    assert!(!cache.namespaces["plain"], "no pod of it is selected");
    // A sibling of the labelled pod created while the agent is down must not start uncaptured.
    assert!(cache.namespaces["mixed"], "a pod selected by its own label");
}

fn k8s_pod(uid: Option<&str>, name: &str) -> ambit_objects::Object {
    let pod: ambit_objects::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "demo", "uid": uid},
        "spec": {"serviceAccountName": "sa", "containers": []},
        "status": {"phase": "Running", "podIP": "10.0.0.9"}
    }))
    .expect("pod");
    pod.into()
}

/// The main loop's changes: a pod recreated under its name (new uid) replaces the enrolled one,
/// which leaves the proxy; a pod that stops converting (no uid) is removed too; a Delete removes.
#[tokio::test]
async fn source_changes_replace_recreated_pods_and_remove_deleted_ones() {
    use crate::app::reconcile::apply;
    use ambit_objects::{Change, Kind, ObjectKey};
    let s = setup().await;
    let events = std::sync::Mutex::new(Vec::<String>::new());
    let event = |kind: &str| events.lock().expect("lock").push(kind.to_owned());
    let seen = fake_proxy(&s.path, None).await;
    s.mesh.upsert_namespace(ns("demo", true));
    let dirty = apply(&s.mesh, vec![Change::Upsert(k8s_pod(Some("u1"), "web"))], &event).await;
    assert_eq!(dirty, HashSet::from(["u1".to_owned()]));
    assert_eq!(s.mesh.cni_add(&s.event("web", "demo")).await.expect("add"), AddOutcome::Enrolled);
    assert_eq!(s.mesh.enrolled(), HashSet::from(["u1".to_owned()]));

    let dirty = apply(&s.mesh, vec![Change::Upsert(k8s_pod(Some("u2"), "web"))], &event).await;
    assert_eq!(dirty, HashSet::from(["u2".to_owned()]));
    assert_eq!(s.mesh.uid_of("demo", "web").as_deref(), Some("u2"));
    assert!(s.mesh.enrolled().is_empty(), "the old uid left the mesh");
    until("del u1 sent", || seen.lock().expect("lock").iter().any(|l| l == "del u1")).await;
    assert_eq!(s.mesh.pods(), ["u2"]);

    apply(&s.mesh, vec![Change::Upsert(k8s_pod(None, "web"))], &event).await;
    assert!(s.mesh.pods().is_empty(), "a pod without uid replaces nothing and is not kept");

    apply(&s.mesh, vec![Change::Upsert(k8s_pod(Some("u3"), "db"))], &event).await;
    apply(&s.mesh, vec![Change::Delete(ObjectKey::new(Kind::Pod, "demo", "db"))], &event).await;
    assert_eq!(
        *events.lock().expect("lock"),
        ["add", "update", "update", "add", "delete"],
        "the types istio-cni counts in nodeagent_reconcile_events_total"
    );
    assert!(s.mesh.pods().is_empty());
}
