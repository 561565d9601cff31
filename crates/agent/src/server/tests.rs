//! The event server through its real socket, with the plugin's own client: exact statuses and
//! messages for every answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_cni::client::AgentClient;
use ambit_zds::{Request, ZdsClient, ZdsListener};
use prometheus_client::metrics::counter::Counter;

use super::*;
use crate::annotate::{Annotations, LogAnnotate, Retry};
use crate::capture::{Capture, CaptureError};
use crate::enroll::{AMBIENT, DATAPLANE_MODE, Enrollment};
use crate::mesh::HostPaths;
use crate::model::{Namespace, Phase, Pod};
use crate::podns::HostNamespaces;
use crate::test_support::OtherNetns;
use crate::zds::ZdsServer;

struct NoMetrics;
impl EventMetrics for NoMetrics {
    fn observe(&self, _: &'static str, _: u16, _: f64) {}
}

/// Capture that succeeds, or fails for pods named `broken`.
struct FakeCapture;
impl Capture for FakeCapture {
    fn apply(&self, _: &ambit_netns::Netns, pod: &Pod) -> Result<(), CaptureError> {
        if pod.name == "broken" { Err(CaptureError::Task("nft: permission denied".into())) } else { Ok(()) }
    }
    fn repair(&self, _: &ambit_netns::Netns, _: &Pod) -> Result<Vec<String>, CaptureError> {
        Ok(Vec::new())
    }
    fn remove(&self, _: &ambit_netns::Netns) -> Result<(), CaptureError> {
        Ok(())
    }
}

struct Agent {
    client: AgentClient,
    zds: PathBuf,
    netns: OtherNetns,
    mesh: Arc<Mesh>,
    _dir: tempfile::TempDir,
}

async fn agent() -> Agent {
    let dir = tempfile::tempdir().expect("tempdir");
    let zds_path = dir.path().join("zds.sock");
    let zds = ZdsServer::new(&zds_path);
    let listener = ZdsListener::bind(&zds_path).expect("bind zds");
    let annotations = Annotations::new(Arc::new(LogAnnotate), Retry::default(), Counter::default());
    let paths = HostPaths {
        netns_prefix: PathBuf::from("/"),
        proc_root: PathBuf::from("/proc"),
        host_namespaces: HostNamespaces::discover(Path::new("/proc/self/ns/net"), Path::new("/proc")),
    };
    let mesh = Mesh::new(Enrollment::default(), zds.clone(), Arc::new(FakeCapture), annotations, paths);
    let m = mesh.clone();
    tokio::spawn(zds.run(listener, Arc::new(move || m.snapshot())));
    let labels = [(DATAPLANE_MODE.to_owned(), AMBIENT.to_owned())].into();
    mesh.upsert_namespace(Namespace { name: "demo".into(), labels });
    mesh.upsert_namespace(Namespace { name: "plain".into(), labels: Default::default() });
    for (uid, name, ns) in [("u1", "web", "demo"), ("u2", "db", "plain"), ("u3", "broken", "demo")] {
        mesh.upsert_pod(Pod {
            uid: uid.into(),
            name: name.into(),
            namespace: ns.into(),
            phase: Phase::Running,
            ..Default::default()
        });
    }
    let socket = dir.path().join("pluginevent.sock");
    let events = bind(&socket).expect("bind events");
    tokio::spawn(serve(events, mesh.clone(), Arc::new(NoMetrics)));
    Agent {
        client: AgentClient::new(socket, Duration::from_secs(10)),
        zds: zds_path,
        netns: OtherNetns::new(),
        mesh,
        _dir: dir,
    }
}

fn body(netns: &str, pod: &str, ns: &str) -> String {
    serde_json::json!({"Netns": netns, "PodName": pod, "PodNamespace": ns,
        "IPs": [{"Interface": 0, "Address": {"IP": "10.0.0.9", "Mask": "////AA=="}, "Gateway": "10.0.0.1"}]})
    .to_string()
}

/// POSTs on a blocking thread (the plugin's client is synchronous).
async fn post(a: &Agent, path: &str, body: String) -> (u16, String) {
    let client = a.client.clone();
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let r = client.post_json(&path, body.as_bytes()).expect("an answer");
        (r.status, String::from_utf8_lossy(&r.body).into_owned())
    })
    .await
    .expect("join")
}

/// Point 13: retryable failures are 503 (the plugin's code 11), permanent ones 500, bad
/// requests 400; each with its exact message.
#[tokio::test]
async fn statuses_of_every_answer() {
    let a = agent().await;
    let ns = a.netns.path().display().to_string();
    // Not enrolled: 200 at once.
    assert_eq!(post(&a, "/cmdadd", body(&ns, "db", "plain")).await.0, 200);
    // No proxy connected: retryable.
    let (status, text) = post(&a, "/cmdadd", body(&ns, "web", "demo")).await;
    assert_eq!(status, 503, "{text}");
    assert_eq!(
        text,
        format!(
            "no node proxy is connected to {}; is `ambit proxy` running on this node? (retryable: the runtime will retry the pod sandbox)\n",
            a.zds.display()
        )
    );
    // A pod the agent does not know (after waiting for the source): retryable.
    let (status, text) = post(&a, "/cmdadd", body(&ns, "ghost", "demo")).await;
    assert_eq!(status, 503, "{text}");
    assert_eq!(
        text,
        "pod demo/ghost is not known to the agent (yet); is the pod source in sync? (retryable: the runtime will retry the pod sandbox)\n"
    );
    // Capture fails: permanent.
    let (status, text) = post(&a, "/cmdadd", body(&ns, "broken", "demo")).await;
    assert_eq!(
        (status, text.as_str()),
        (
            500,
            "traffic capture for pod demo/broken failed: the capture task failed: nft: permission denied\n"
        )
    );
    // Bad requests.
    for (b, want) in [
        (String::new(), "empty request body; expected the CNI plugin's JSON event\n".to_owned()),
        (
            "{".to_owned(),
            "invalid CNI plugin event: EOF while parsing an object at line 1 column 1\n".to_owned(),
        ),
        (body("", "web", "demo"), "CNI plugin event has an empty Netns\n".to_owned()),
    ] {
        assert_eq!(post(&a, "/cmdadd", b).await, (400, want));
    }
    assert_eq!(
        post(&a, "/other", body(&ns, "web", "demo")).await,
        (404, "unknown path; the plugin posts to /cmdadd\n".into())
    );
    // Then a proxy: 200, captured and acked.
    let mut proxy = ZdsClient::connect(&a.zds).await.expect("connect");
    assert!(matches!(proxy.recv().await, Ok(Some(Request::SnapshotSent))));
    proxy.ack(Ok(())).await.expect("ack");
    let acker = tokio::spawn(async move {
        while let Ok(Some(_)) = proxy.recv().await {
            if proxy.ack(Ok(())).await.is_err() {
                return;
            }
        }
    });
    assert_eq!(post(&a, "/cmdadd", body(&ns, "web", "demo")).await.0, 200);
    assert_eq!(a.mesh.enrolled().len(), 1);
    acker.abort();
}

/// Point 14: the agent refuses, in its own process and whatever the plugin checked, a path that
/// is not a network namespace, a traversal path, a missing path and the host's (here: the
/// agent's own) namespace; 400 with the exact reason, nothing captured.
#[tokio::test]
async fn refuses_netns_paths_that_are_not_a_pods() {
    let a = agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hostname");
    std::fs::write(&file, "x").expect("write");
    let cases = [
        (file.display().to_string(), format!("refusing CNI_NETNS {0} of pod demo/web: it is not a network namespace (it refers to {0})\n", file.display())),
        (
            "/var/run/netns/../../proc/1/ns/net".to_owned(),
            "CNI_NETNS \"/var/run/netns/../../proc/1/ns/net\" has a '.' or '..' component; the runtime must pass the namespace's own path, not one that walks elsewhere\n".to_owned(),
        ),
        (
            "/var/run/netns/ambit-test-missing".to_owned(),
            "refusing CNI_NETNS /var/run/netns/ambit-test-missing of pod demo/web: it does not exist\n".to_owned(),
        ),
        (
            "/proc/self/ns/net".to_owned(),
            "refusing CNI_NETNS /proc/self/ns/net of pod demo/web: it is the node agent's own network namespace, not a pod's\n".to_owned(),
        ),
        (
            "relative/path".to_owned(),
            "CNI_NETNS \"relative/path\" is not an absolute path; the runtime must pass the namespace's path\n".to_owned(),
        ),
    ];
    for (netns, want) in cases {
        assert_eq!(post(&a, "/cmdadd", body(&netns, "web", "demo")).await, (400, want), "{netns}");
    }
    assert!(a.mesh.enrolled().is_empty());
}
