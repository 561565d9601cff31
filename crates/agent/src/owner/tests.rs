use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ambit_objects::testing::ScriptedApi;
use serde_json::{Map, Value, json};

use super::*;
use crate::install::InstallConfig;

const NS: &str = "istio-system";
const DS: &str = "ambit-agent";
const FLANNEL: &str =
    r#"{"cniVersion":"0.4.0","name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}"#;

#[test]
fn decide_removes_only_on_a_sign_of_deletion() {
    let ds = "istio-system/ambit-agent";
    let refused = || Asked::Failed(AskError::Refused { code: 403, message: "forbidden".into() });
    let remove_deleting = Verdict::Remove { daemonset: ds.into(), why: "is being deleted" };
    let remove_gone = Verdict::Remove { daemonset: ds.into(), why: "no longer exists" };
    let keep = Verdict::KeepPresent { daemonset: ds.into() };
    let never = Verdict::KeepUnsure {
        daemonset: ds.into(),
        why: "the API server has no such DaemonSet and this agent never saw it (is AMBIT_AGENT_DAEMONSET its name?)"
            .into(),
    };
    let unsure = Verdict::KeepUnsure {
        daemonset: ds.into(),
        why: "the API server refused to read it (403: forbidden)".into(),
    };
    let cases = [
        (Seen::Deleted, Asked::Present, keep.clone()),
        (Seen::Unknown, Asked::Present, keep.clone()),
        (Seen::Unknown, Asked::Deleting, remove_deleting.clone()),
        (Seen::Present, Asked::Deleting, remove_deleting.clone()),
        (Seen::Present, Asked::NotFound, remove_gone.clone()),
        (Seen::Deleting, Asked::NotFound, remove_gone.clone()),
        (Seen::Deleted, Asked::NotFound, remove_gone.clone()),
        (Seen::Unknown, Asked::NotFound, never.clone()),
        (Seen::Absent, Asked::NotFound, never.clone()),
        (Seen::Deleting, refused(), remove_deleting.clone()),
        (Seen::Deleted, refused(), remove_gone.clone()),
        (Seen::Present, refused(), unsure.clone()),
        (Seen::Unknown, refused(), unsure.clone()),
        (Seen::Absent, refused(), unsure.clone()),
    ];
    for (seen, asked, want) in cases {
        let got = decide(ds, seen, asked.clone());
        assert_eq!(got, want, "{seen:?} {asked:?}");
        assert_eq!(got.removes(), matches!(want, Verdict::Remove { .. }), "{seen:?} {asked:?}");
    }
}

/// A node's CNI dirs with flannel's `.conf` as the primary config, and the plugin installed
/// into it (which turns it into a `.conflist` with our entry).
struct Node {
    _dir: tempfile::TempDir,
    conf: PathBuf,
    bin: PathBuf,
    installer: Installer,
}

impl Node {
    fn installed() -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let (conf, bin) = (dir.path().join("net.d"), dir.path().join("bin"));
        std::fs::create_dir(&conf).expect("mkdir");
        std::fs::write(conf.join("10-flannel.conf"), FLANNEL).expect("write conf");
        let source = dir.path().join("ambit-cni-src");
        std::fs::write(&source, b"\x7fELF pretend plugin").expect("write plugin");
        let entry = match json!({"type": "ambit-cni", "name": "ambit-cni"}) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        let installer = Installer::new(InstallConfig {
            cni_bin_dirs: vec![bin.clone()],
            conf_dir: conf.clone(),
            conf_name: None,
            chained: true,
            plugin_binary: source,
            plugin_name: "ambit-cni".into(),
            plugin_entry: entry,
            conf_mode_group_read: false,
        })
        .expect("installer");
        installer.install().expect("install");
        let node = Node { _dir: dir, conf, bin, installer };
        assert_eq!(node.listing(), ["10-flannel.conflist"]);
        assert!(node.read("10-flannel.conflist").contains("\"type\": \"ambit-cni\""));
        node
    }

    fn listing(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.conf)
            .expect("readdir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.conf.join(name)).expect("read conf")
    }

    /// The chain still holds ambit-cni, and the binary is there.
    fn assert_kept(&self) {
        assert_eq!(self.listing(), ["10-flannel.conflist"]);
        assert!(self.read("10-flannel.conflist").contains("\"type\": \"ambit-cni\""));
        assert!(self.bin.join("ambit-cni").exists());
    }

    /// The primary config is flannel's `.conf` as it was before the agent, and no binary is left.
    fn assert_restored(&self) {
        assert_eq!(self.listing(), ["10-flannel.conf"]);
        let now: Value = serde_json::from_str(&self.read("10-flannel.conf")).expect("json");
        let then: Value = serde_json::from_str(FLANNEL).expect("json");
        assert_eq!(now, then);
        assert!(!self.bin.join("ambit-cni").exists());
    }
}

fn daemonset(deleting: bool) -> Value {
    let mut ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": DS, "namespace": NS, "uid": "ds-1"},
        "spec": {"selector": {"matchLabels": {"app": DS}},
                 "template": {"metadata": {"labels": {"app": DS}}, "spec": {"containers": [{"name": "agent"}]}}}});
    if deleting {
        ds["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    ds
}

async fn wait_for(owner: &OwnerWatch, want: Seen) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while owner.seen() != want {
        assert!(Instant::now() < deadline, "the watch saw {:?}, want {want:?}", owner.seen());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A restart or an upgrade: the DaemonSet is there, the chain stays.
#[tokio::test]
async fn an_agent_stopped_while_its_daemonset_exists_keeps_the_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put(daemonset(false));
    let owner = OwnerWatch::start(api.client(&dir.path().join("kubeconfig")).await, NS, DS);
    wait_for(&owner, Seen::Present).await;
    let node = Node::installed();
    let verdict = on_stop(&node.installer, Some(&owner), false).await;
    assert_eq!(verdict, Verdict::KeepPresent { daemonset: format!("{NS}/{DS}") });
    node.assert_kept();
    // The watch listed and watched by name, and the question was a get of that one object.
    let path = format!("/apis/apps/v1/namespaces/{NS}/daemonsets");
    let listed = api.requests().into_iter().find(|s| s.path == path && s.verb() == "list").expect("a list");
    assert_eq!(listed.query.get("fieldSelector").map(String::as_str), Some("metadata.name=ambit-agent"));
    assert_eq!(api.count("get", &format!("{path}/{DS}")), 1);
}

/// `helm uninstall` with foreground deletion: the DaemonSet has a deletionTimestamp.
#[tokio::test]
async fn an_agent_stopped_while_its_daemonset_is_being_deleted_restores_the_conf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put(daemonset(false));
    let owner = OwnerWatch::start(api.client(&dir.path().join("kubeconfig")).await, NS, DS);
    wait_for(&owner, Seen::Present).await;
    api.put(daemonset(true));
    wait_for(&owner, Seen::Deleting).await;
    let node = Node::installed();
    let verdict = on_stop(&node.installer, Some(&owner), false).await;
    assert_eq!(verdict, Verdict::Remove { daemonset: format!("{NS}/{DS}"), why: "is being deleted" });
    node.assert_restored();
}

/// `helm uninstall` as it happens: the DaemonSet is deleted, then the agent's Role and account,
/// so the question at stop is refused; the watch saw the deletion before that.
#[tokio::test]
async fn an_agent_stopped_after_its_daemonset_and_role_are_deleted_restores_the_conf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put(daemonset(false));
    let owner = OwnerWatch::start(api.client(&dir.path().join("kubeconfig")).await, NS, DS);
    wait_for(&owner, Seen::Present).await;
    api.delete_from("daemonsets.apps", NS, DS);
    wait_for(&owner, Seen::Deleted).await;
    api.forbid("daemonsets.apps", "get");
    let node = Node::installed();
    let verdict = on_stop(&node.installer, Some(&owner), false).await;
    assert_eq!(verdict, Verdict::Remove { daemonset: format!("{NS}/{DS}"), why: "no longer exists" });
    node.assert_restored();

    // Without the watch's sign the same refusal keeps the chain.
    let other = OwnerWatch::start(api.client(&dir.path().join("kubeconfig")).await, NS, "other-agent");
    wait_for(&other, Seen::Absent).await;
    api.forbid("daemonsets.apps", "get");
    let node = Node::installed();
    let verdict = on_stop(&node.installer, Some(&other), false).await;
    assert_eq!(
        verdict.to_string(),
        "keeping ambit-cni in the node's CNI chain: cannot tell an uninstall from an upgrade, because the API server \
         refused to read it (403: daemonsets.apps \"other-agent\" is forbidden: User \
         \"system:serviceaccount:ambit-system:ambit-agent\" cannot get resource \"daemonsets\" in API group \"apps\" \
         in the namespace \"istio-system\") about DaemonSet istio-system/other-agent; if this is an uninstall, remove \
         the entry by hand (docs/install.md, \"Uninstall\")"
    );
    node.assert_kept();
}

/// No API server: the chain stays, and the log line says why.
#[tokio::test]
async fn an_agent_that_cannot_reach_the_api_server_keeps_the_chain_and_says_why() {
    let logs = LogBuf::default();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_writer(logs.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().expect("tempdir");
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let kubeconfig = dir.path().join("kubeconfig");
    let api = ScriptedApi::start().await;
    api.write_kubeconfig(&kubeconfig);
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    std::fs::write(&kubeconfig, text.replace(&api.url(), &format!("http://127.0.0.1:{port}")))
        .expect("write");
    drop(api);
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config");
    let owner = OwnerWatch::start(kube::Client::try_from(cfg).expect("client"), NS, DS);
    let node = Node::installed();
    let verdict = on_stop(&node.installer, Some(&owner), false).await;
    assert!(!verdict.removes(), "{verdict}");
    node.assert_kept();
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("keeping ambit-cni"))
        .unwrap_or_else(|| panic!("no verdict logged:\n{text}"));
    assert_eq!(line, format!(" WARN {verdict}"));
    assert_eq!(
        verdict.to_string(),
        "keeping ambit-cni in the node's CNI chain: cannot tell an uninstall from an upgrade, because the API server \
         could not be reached or read (client error (Connect): tcp connect error: Connection refused (os error 111)) \
         about DaemonSet istio-system/ambit-agent; if this is an uninstall, remove the entry by hand \
         (docs/install.md, \"Uninstall\")"
    );
}

/// `AMBIT_UNINSTALL_ON_EXIT=true` removes the plugin whatever the API says, and without asking.
#[tokio::test]
async fn uninstall_on_exit_removes_the_plugin_without_asking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put(daemonset(false));
    let owner = OwnerWatch::start(api.client(&dir.path().join("kubeconfig")).await, NS, DS);
    wait_for(&owner, Seen::Present).await;
    let node = Node::installed();
    assert_eq!(on_stop(&node.installer, Some(&owner), true).await, Verdict::RemoveForced);
    node.assert_restored();
    assert_eq!(api.count("get", &format!("/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}")), 0);
    // Without a DaemonSet to ask about (local mode), the plugin stays.
    let node = Node::installed();
    assert_eq!(on_stop(&node.installer, None, false).await, Verdict::KeepNoDaemonSet);
    node.assert_kept();
}

#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl LogBuf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl io::Write for LogBuf {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuf {
    type Writer = LogBuf;

    fn make_writer(&'a self) -> LogBuf {
        self.clone()
    }
}
