//! `ambit inspect` on `ambit up`: every subcommand against a node of the local cluster and
//! against a proxy's admin address (as `kubectl port-forward` gives it), as a table and as JSON,
//! checked against what the cluster is: the pods' addresses and identities, the Service, the
//! policy in words, a certificate's expiry, a live connection, a denied connection with the
//! policy that denied it, the log level, and the xDS state against the control plane's.
//!
//! Needs root (under `CI=true` a missing privilege fails instead of skipping).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const CLUSTER: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: demo}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: other, namespace: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo, labels: {app: client}}
spec:
  serviceAccountName: client
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: demo, labels: {app: other}}
spec:
  serviceAccountName: other
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: demo, labels: {app: server}}
spec:
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: demo}
spec:
  clusterIP: 10.96.0.20
  selector: {app: server}
  ports: [{name: tcp-echo, port: 80, targetPort: 8080}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  rules:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/client"]}}]
"#;

/// `ambit inspect ARGS`, which must succeed: its output.
fn inspect(c: &LocalCluster, args: &[&str]) -> String {
    let mut all = vec!["inspect"];
    all.extend_from_slice(args);
    let r = c.ambit(&all);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(r.stderr, "", "{r}");
    r.stdout
}

/// `ambit inspect ARGS -o json`, parsed.
fn inspect_json(c: &LocalCluster, args: &[&str]) -> Vec<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    let out = inspect(c, &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

/// A table's rows as cells (columns are separated by two spaces or more).
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .filter(|l| !l.starts_with("    "))
        .map(|l| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned).collect())
        .collect()
}

/// `ambit inspect ARGS` run in the node's namespace against the proxy's admin address (what a
/// port-forward to a proxy pod gives), which must succeed.
fn inspect_admin(c: &LocalCluster, args: &[&str]) -> String {
    let admin = format!("http://127.0.0.1:{}", c.state().proxy("node1").admin);
    let out = Command::new("ip")
        .args(["netns", "exec", &format!("{}-node1", c.tag), ambit_bin(), "inspect"])
        .args(args)
        .args(["--admin", &admin])
        .output()
        .expect("ip netns exec");
    let r = Ran::of(Ok(out), "ambit inspect --admin");
    assert_eq!(r.code, Some(0), "{r}");
    r.stdout
}

#[test]
fn inspect_shows_what_a_node_proxy_knows() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let config = c.file("config/cluster.yaml", CLUSTER);
    c.up(1, config.parent().unwrap_or(&config));
    let ip = |pod: &str| c.pod(pod).ip.map(|i| i.to_string()).unwrap_or_default();
    assert!(wait_for(|| enrolled(&c, "demo/server") && enrolled(&c, "demo/client"), Duration::from_secs(10)));

    // Workloads: one row per pod, with its address and identity.
    let table = inspect(&c, &["workloads", "--node", "node1"]);
    let got = rows(&table);
    assert_eq!(
        got[0],
        ["PROXY", "NAMESPACE", "NAME", "ADDRESS", "NODE", "PROTOCOL", "IDENTITY", "STATUS", "WAYPOINT"]
    );
    let want: Vec<Vec<String>> =
        [("client", CLIENT), ("other", OTHER), ("server", "spiffe://cluster.local/ns/demo/sa/default")]
            .iter()
            .map(|(pod, id)| {
                ["node1", "demo", pod, &ip(&format!("demo/{pod}")), "node1", "HBONE", id, "Healthy", "-"]
                    .map(str::to_owned)
                    .to_vec()
            })
            .collect();
    assert_eq!(got[1..], want[..], "{table}");
    let json = inspect_json(&c, &["workloads", "-n", "demo"]);
    assert_eq!(json.len(), 3, "{json:?}");
    assert_eq!(json[0]["identity"], CLIENT);
    assert_eq!(json[0]["addresses"], serde_json::json!([ip("demo/client")]));
    assert_eq!(inspect(&c, &["workloads", "-n", "plain"]), "(none)\n");

    // Services.
    let table = inspect(&c, &["services"]);
    assert_eq!(rows(&table)[1], ["node1", "demo", "server", "10.96.0.20", "80→8080", "1", "-"], "{table}");
    assert_eq!(inspect_json(&c, &["services"])[0]["hostname"], "server.demo.svc.cluster.local");

    // Policies, in words, with what they apply to.
    let table = inspect(&c, &["policies", "-n", "demo"]);
    assert_eq!(
        table,
        "PROXY  NAMESPACE  NAME          SCOPE             ACTION  APPLIES TO\nnode1  demo       allow-client  \
         WorkloadSelector  Allow   workloads with app=server in namespace demo\n    allows from principal \
         cluster.local/ns/demo/sa/client\n"
    );
    let json = inspect_json(&c, &["policies", "-n", "demo"]);
    assert_eq!(
        json[0]["rules"],
        serde_json::json!(["allows from principal cluster.local/ns/demo/sa/client"])
    );

    // Certificates: each enrolled pod's, Available, with a serial and an expiry in the future.
    let now = ambit_identity::rfc3339(std::time::SystemTime::now());
    let certs = inspect_json(&c, &["certificates"]);
    let server = certs
        .iter()
        .find(|x| x["identity"] == "spiffe://cluster.local/ns/demo/sa/default")
        .unwrap_or_else(|| panic!("{certs:?}"));
    assert_eq!(server["state"], "Available", "{server}");
    let expires = server["expirationTime"].as_str().unwrap_or_default();
    assert!(expires.len() == now.len() && expires > now.as_str(), "expires {expires}, now {now}");
    assert!(!server["serialNumber"].as_str().unwrap_or_default().is_empty(), "{server}");
    let table = inspect(&c, &["certificates"]);
    assert!(
        rows(&table)
            .iter()
            .any(|r| r.len() == 6 && r[1] == "spiffe://cluster.local/ns/demo/sa/default" && r[5] == expires),
        "{table}"
    );

    // A live connection from the client: listed with its identity and the bytes the server sent.
    let server_addr = format!("{}:8080", ip("demo/server"));
    let mut holder = Command::new("ip");
    holder.args(["netns", "exec", &c.pod("demo/client").netns, "bash", "-c"]).arg(format!(
        "exec 3<>/dev/tcp/{}/8080 && read -r line <&3 && echo \"$line\" && sleep 30",
        ip("demo/server")
    ));
    let holder = ChildGuard::spawn("holder", holder);
    let live = wait_for(
        || inspect_json(&c, &["connections"]).iter().any(|x| x["bytesReceived"].as_u64().unwrap_or(0) > 0),
        Duration::from_secs(10),
    );
    assert!(
        live,
        "no live connection with bytes: {:?}\n{}",
        inspect_json(&c, &["connections"]),
        holder.logs()
    );
    let conns = inspect_json(&c, &["connections"]);
    assert_eq!(conns[0]["srcIdentity"], CLIENT, "{conns:?}");
    assert_eq!(conns[0]["dstWorkload"], "demo/server", "{conns:?}");
    assert_eq!(conns[0]["dst"], server_addr.as_str(), "{conns:?}");
    let table = inspect(&c, &["connections"]);
    assert_eq!(rows(&table)[1][2..5], [CLIENT, server_addr.as_str(), "demo/server"], "{table}");
    drop(holder);

    // A denied connection: when, from whom, and the policy that decided.
    try_denied(&c, "demo/other", "demo/server").unwrap_or_else(|e| panic!("other → server: {e}"));
    let denials = inspect_json(&c, &["denials"]);
    let last = denials.last().cloned().unwrap_or_default();
    assert_eq!(last["srcIdentity"], OTHER, "{denials:?}");
    assert_eq!(last["reason"], "allow policies exist, but none allowed", "{last}");
    assert_eq!(last["policies"], serde_json::json!(["demo/allow-client"]), "{last}");
    let table = inspect(&c, &["denials"]);
    let row = rows(&table).pop().unwrap_or_default();
    assert_eq!(
        row[3..],
        [OTHER, "demo/server", "allow policies exist, but none allowed", "demo/allow-client"],
        "{table}"
    );

    // The log level, set and reset.
    assert_eq!(inspect(&c, &["log"]), "PROXY  LEVEL\nnode1  info\n");
    assert_eq!(inspect(&c, &["log", "--level", "debug"]), "PROXY  LEVEL\nnode1  debug\n");
    assert_eq!(inspect(&c, &["log", "--level", "reset"]), "PROXY  LEVEL\nnode1  info\n");

    // xDS: both types synced with the control plane.
    let sync = inspect_json(&c, &["sync"]);
    let status: Vec<(&str, &str)> = sync
        .iter()
        .map(|s| (s["typeUrl"].as_str().unwrap_or_default(), s["status"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        status,
        [
            ("type.googleapis.com/istio.workload.Address", "SYNCED"),
            ("type.googleapis.com/istio.security.Authorization", "SYNCED")
        ],
        "{sync:?}"
    );
    assert_eq!(rows(&inspect(&c, &["sync"]))[1][5], "SYNCED");

    // Against the proxy's admin address instead of the local cluster: the same answers.
    let json = |s: String| -> Vec<Value> { serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}")) };
    let strip = |mut v: Vec<Value>| {
        for x in &mut v {
            x["node"] = Value::Null;
        }
        v
    };
    for what in ["workloads", "services", "certificates", "denials"] {
        let by_node = strip(inspect_json(&c, &[what]));
        let by_admin = strip(json(inspect_admin(&c, &[what, "-o", "json"])));
        assert_eq!(by_admin, by_node, "{what}");
    }
    let table = inspect_admin(&c, &["policies", "-n", "demo"]);
    assert!(
        table.contains("allow-client")
            && table.contains("    allows from principal cluster.local/ns/demo/sa/client"),
        "{table}"
    );
    assert!(inspect_admin(&c, &["log"]).ends_with("  info\n"));
    let control_ip =
        c.state().network.hosts.iter().find(|h| h.name == "control").map(|h| h.ip).expect("control");
    let control = format!("http://{control_ip}:15014");
    let synced = inspect_admin(&c, &["sync", "--control", &control]);
    assert_eq!(
        rows(&synced).iter().skip(1).filter(|r| r.last().map(String::as_str) == Some("SYNCED")).count(),
        2,
        "{synced}"
    );

    // Errors say what to do.
    let r = c.ambit(&["inspect", "workloads", "--node", "node9"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(r.stderr, "ambit inspect: no node node9 in the local cluster (its nodes: node1)\n", "{r}");
    let r = c.ambit(&["inspect", "sync", "--admin", "http://127.0.0.1:1"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(r.stderr, "ambit inspect: sync needs the control plane: --control http://HOST:15014\n", "{r}");
}
