//! The local cluster as a user types it: a cluster brought up with its own `--run-dir` and
//! `--tag` is found by later commands without them, every hint carries the flags, `ambit down`
//! refuses a tag whose owner runs elsewhere, a Service without a cluster IP gets one, and
//! `apply -f` takes a folder and standard input and says `unchanged`.
//!
//! Needs root (under `CI=true` a missing privilege fails instead of skipping).

mod common;

use common::*;
use serde_json::Value;

/// One node: an enrolled namespace, a server behind a Service that names no cluster IP, a client.
const SMALL: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: demo, labels: {app: web}}
spec:
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  selector: {app: web}
  ports: [{name: tcp-echo, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo}
spec:
  containers: [{name: idle, command: [sleep, infinity]}]
"#;

/// A cluster brought up with `--run-dir` and `--tag` is found by every later command without
/// them (the context), every hint names it as it must be typed, `ambit down --tag T` from
/// another run directory refuses while its owner runs, a Service without a cluster IP gets one
/// (reachable by name and by address), and `apply -f` takes a folder and standard input and
/// says `unchanged`.
#[test]
fn a_cluster_with_its_own_run_dir_and_tag_is_hard_to_misuse() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let config = c.file("small.yaml", SMALL);
    let (dir, tag) = (c.run_dir.display().to_string(), c.tag.clone());
    let flags = format!("--run-dir {dir} --tag {tag}");
    let up = c.up_typed(&[
        "--nodes",
        "1",
        "--config",
        config.to_str().unwrap_or_default(),
        "--run-dir",
        &dir,
        "--tag",
        &tag,
    ]);
    assert_eq!(up.code, Some(0), "{up}\n{}", c.logs());
    for hint in [
        format!("status      ambit status {flags}\n"),
        format!("remove all  ambit down {flags}\n"),
        format!("(edit with `ambit apply -f FILE {flags}` / `ambit delete -f FILE {flags}`)\n"),
    ] {
        assert!(up.stdout.contains(&hint), "want {hint:?} in\n{up}");
    }
    let remembered: Value =
        serde_json::from_str(&std::fs::read_to_string(&c.context).expect("context")).expect("JSON");
    assert_eq!(remembered, serde_json::json!({ "run_dir": dir, "tag": tag }));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&c.context).expect("context").mode() & 0o777, 0o600);

    // Without flags, the remembered cluster.
    let status = c.typed(&["status"], None);
    assert_eq!(status.code, Some(0), "{status}");
    assert!(
        status
            .stdout
            .starts_with(&format!("cluster: ready  (owner pid {}, run dir {dir})\n", c.state().owner)),
        "{status}"
    );

    // The Service got an address of the service range, kept in the objects the control plane
    // reads and shown by `ambit status`.
    let kept: Value = serde_json::from_str(
        &std::fs::read_to_string(c.run_dir.join("desired/service.demo.web.yaml")).expect("desired"),
    )
    .expect("JSON");
    let vip = kept["spec"]["clusterIP"].as_str().unwrap_or_default().to_owned();
    assert_eq!(vip, "10.96.133.246", "{kept}");
    assert_eq!(kept["spec"]["clusterIPs"], serde_json::json!([vip]));
    let passed = std::fs::read_to_string(c.run_dir.join("objects/service-demo-web.yaml")).expect("objects");
    assert!(passed.contains(&format!("\"clusterIP\": \"{vip}\"")), "{passed}");
    let services = c.status()["services"].clone();
    assert_eq!(
        services,
        serde_json::json!([{
            "namespace": "demo",
            "name": "web",
            "clusterIp": vip,
            "ports": [{ "name": "tcp-echo", "port": 80, "targetPort": "8080" }],
            "selector": { "app": "web" },
        }])
    );
    // Reachable by address and by name (the pod's DNS answered by its node proxy).
    let by_vip = c.client("demo/client", &format!("{vip}:80"), 1).remove(0);
    assert_eq!(by_vip["reply"]["server"], "server", "{by_vip}\n{}", c.logs());
    let by_name = c.client("demo/client", "web.demo.svc.cluster.local:80", 1).remove(0);
    assert_eq!(by_name["addr"], format!("{vip}:80"), "{by_name}");
    assert_eq!(by_name["reply"]["server"], "server", "{by_name}");

    // The same file again: every object unchanged, nothing written.
    let desired_before = desired_files(&c);
    let again = c.typed(&["apply", "-f", config.to_str().unwrap_or_default()], None);
    assert_eq!((again.code, again.stderr.as_str()), (Some(0), ""), "{again}");
    assert_eq!(
        again.stdout,
        "Namespace demo unchanged\nPod demo/server unchanged\nService demo/web unchanged\nPod demo/client unchanged\n"
    );
    assert_eq!(desired_files(&c), desired_before);

    // A folder: its .yaml and .yml files, in name order; other files are not read.
    let more = c.scratch.path().join("more");
    c.file("more/a.yaml", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: extra, namespace: demo}\n");
    c.file(
        "more/b.yml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web2, namespace: demo}\nspec:\n  selector: {app: web}\n  ports: [{port: 81, targetPort: 8080}]\n",
    );
    c.file("more/notes.txt", "not YAML: {");
    let r = c.typed(&["apply", "-f", more.to_str().unwrap_or_default()], None);
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(0), "ServiceAccount demo/extra created\nService demo/web2 created\n", ""),
        "{r}"
    );
    let web2_ip = |c: &LocalCluster| -> String {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(c.run_dir.join("desired/service.demo.web2.yaml")).expect("desired"),
        )
        .expect("JSON");
        v["spec"]["clusterIP"].as_str().unwrap_or_default().to_owned()
    };
    let first = web2_ip(&c);
    assert_eq!(first, "10.96.167.67");
    // Standard input, with a change: configured, and the Service keeps its address.
    let changed = "apiVersion: v1\nkind: Service\nmetadata: {name: web2, namespace: demo}\nspec:\n  selector: {app: web}\n  ports: [{port: 82, targetPort: 8080}]\n";
    let r = c.typed(&["apply", "-f", "-"], Some(changed));
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(0), "Service demo/web2 configured\n", ""),
        "{r}"
    );
    assert_eq!(web2_ip(&c), first, "re-applied without an address, the Service keeps its own");
    let r = c.typed(&["apply", "-f", "-"], Some(changed));
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "Service demo/web2 unchanged\n"), "{r}");
    let r =
        c.typed(&["apply", "-f", "-"], Some("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: [oops\n"));
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.starts_with("ambit apply: 1 problem(s); nothing was applied:\n  <stdin>:4"), "{r}");

    // A process stopped: the hint to start it again names the cluster.
    let r = c.typed(&["stop", "pod/demo/client/idle"], None);
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), format!("pod/demo/client/idle stopped; it stays down until `ambit start pod/demo/client/idle {flags}`\n").as_str()),
        "{r}"
    );
    let r = c.typed(&["start", "pod/demo/client/idle"], None);
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "pod/demo/client/idle started\n"), "{r}");

    // `ambit up` again: refused, with the commands for this cluster.
    let r = c.typed(&["up", "--run-dir", &dir, "--tag", &tag], None);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stderr,
        format!(
            "ambit up: a cluster is already up (run dir {dir}, owner pid {}, ready): `ambit status {flags}` shows it, `ambit down {flags}` removes it\n",
            c.state().owner
        )
    );
    // The tag in another run directory: `ambit up` and `ambit down` refuse, naming the owner.
    let elsewhere = c.scratch.path().join("elsewhere").display().to_string();
    let r = c.typed(&["up", "--run-dir", &elsewhere, "--tag", &tag], None);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stderr,
        format!(
            "ambit up: tag {tag} is taken by the cluster up in run dir {dir} (owner pid {}): `ambit status {flags}` shows it; choose another --tag\n",
            c.state().owner
        )
    );
    let r = c.typed(&["down", "--run-dir", &elsewhere, "--tag", &tag], None);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stderr,
        format!(
            "ambit down: the network namespaces {tag}-* belong to the cluster up in run dir {dir} (owner pid {}), not to {elsewhere}; nothing was removed. To take that cluster down: ambit down {flags}\n",
            c.state().owner
        )
    );
    assert_eq!(c.status()["phase"], "ready");
    assert!(
        ambit_cluster::ip::netns_exists(&format!("{tag}-node1")),
        "down removed the live cluster's network"
    );
    assert!(std::fs::read_to_string(&c.context).is_ok_and(|t| t.contains(&dir)), "the context changed");

    // `ambit down` without flags: the remembered cluster, which is then forgotten.
    let saved = std::fs::read(&c.context).expect("context");
    let state = c.state();
    let r = c.typed(&["down"], None);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.contains(&format!("stopped the cluster's owner (pid {})", state.owner)), "{r}");
    c.down_done();
    assert!(!c.context.exists(), "the context names a cluster that is gone");
    // A context naming a cluster that is gone says so.
    std::fs::write(&c.context, &saved).expect("context");
    std::fs::set_permissions(&c.context, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let r = c.typed(&["status"], None);
    assert_eq!(
        (r.code, r.stderr),
        (
            Some(1),
            format!(
                "ambit status: the last cluster brought up (run dir {dir}, tag {tag}) is gone: {dir} holds no cluster; `ambit up` starts one\n"
            )
        )
    );
}
