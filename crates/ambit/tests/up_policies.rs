//! Policy truth and an honest `ambit status` on `ambit up`: what a policy does that differs
//! from what was written is said when it is applied, listed by the control plane and by
//! `ambit status`, and shown on the traffic (the destination proxy's deny counter and its
//! record of the denial, with the deciding policy and the time); status tells a crash-looping
//! pod, a stopped control plane and a replaced proxy's ports as they are.
//!
//! Needs root (under `CI=true` a missing privilege fails instead of skipping).

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

/// One node: a client and a server in an enrolled namespace; a plain namespace with an L7
/// policy, which `ambit up` warns about.
const CLUSTER: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: plain}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: demo}
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
metadata: {name: server, namespace: demo, labels: {app: server}}
spec:
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: paths, namespace: plain}
spec:
  action: DENY
  rules:
  - to: [{operation: {ports: ["8080"], paths: ["/admin"]}}]
"#;

const ALLOW_GET: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-get, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/client"]}}]
    to: [{operation: {methods: ["GET"], paths: ["/api/*"]}}]
"#;

const DENY_DELETE: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-delete, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  action: DENY
  rules:
  - to: [{operation: {methods: ["DELETE"]}}]
"#;

/// A typo (`rulez`), a lower-case action and a type error: each refused, naming the field and
/// its own line.
const TYPO: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: typo, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rulez:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/client"]}}]
"#;

const LOWER_CASE: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: lower, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  action: deny
  rules:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/other"]}}]
"#;

const REPLICAS: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: plain}
spec:
  selector: {matchLabels: {app: web}}
  template: {metadata: {labels: {app: web}}, spec: {containers: [{name: idle, command: [sleep, infinity]}]}}
  replicas: "three"
"#;

const CRASHER: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: crasher, namespace: plain}
spec:
  containers: [{name: main, command: [sh, -c, "exit 3"]}]
"#;

const ALLOW_GET_WARNING: &str = "Warning: AuthorizationPolicy demo/allow-get: rules[0] dropped: node proxies \
    cannot check methods, paths; this ALLOW policy now allows nothing, so it denies all traffic to workloads \
    with app=server in namespace demo that no other ALLOW policy allows, until a waypoint enforces it";

const DENY_DELETE_WARNING: &str = "Warning: AuthorizationPolicy demo/deny-delete: rules[0]: node proxies cannot \
    check methods: DENY applied to all traffic to workloads with app=server in namespace demo, whatever the \
    method, until a waypoint enforces the policy";

/// `ambit apply -f` of `text` from the scratch file `name`: what it printed.
fn apply(c: &LocalCluster, name: &str, text: &str) -> Ran {
    let f = c.file(name, text);
    let r = c.ambit(&["apply", "-f", f.to_str().unwrap_or_default()]);
    assert_eq!(r.code, Some(0), "ambit apply -f {name}:\n{r}");
    r
}

/// The last denial node1's proxy recorded, as `ambit status -o json` shows it.
fn last_denial(c: &LocalCluster) -> Value {
    c.status()["denials"].as_array().and_then(|d| d.last().cloned()).unwrap_or(Value::Null)
}

/// `client` → `server` is denied (the destination proxy counted it), and the proxy's record of
/// it names `reason` and `policies`, with a time of now.
fn assert_denied_by(c: &LocalCluster, reason: &str, policies: &[&str]) {
    let stamp = |t| ambit_identity::rfc3339(t);
    let before = stamp(std::time::SystemTime::now() - Duration::from_secs(1));
    let mut last = String::new();
    let denied = wait_for(
        || match try_denied(c, "demo/client", "demo/server") {
            Ok(_) => true,
            Err(e) => {
                last = e;
                false
            }
        },
        Duration::from_secs(10),
    );
    assert!(denied, "client → server was not denied: {last}\n{}", c.logs());
    let d = last_denial(c);
    assert_eq!(d["source"], CLIENT, "{d}");
    assert_eq!(d["destination"], "demo/server", "{d}");
    assert_eq!(d["reason"], reason, "{d}");
    assert_eq!(d["policies"], serde_json::json!(policies), "{d}");
    // RFC 3339 in UTC with whole seconds: ordered as text.
    let time = d["time"].as_str().unwrap_or_default();
    let now = stamp(std::time::SystemTime::now());
    assert!(
        time.len() == now.len() && before.as_str() <= time && time <= now.as_str(),
        "denied at {time}: not between {before} and {now}"
    );
}

#[test]
fn policies_say_what_they_do_and_status_tells_the_truth() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let config = c.file("config/cluster.yaml", CLUSTER);
    let up = c.up(1, config.parent().unwrap_or(&config));
    assert!(
        up.stderr.lines().any(|l| l
            == "Warning: AuthorizationPolicy plain/paths: rules[0]: node proxies cannot check paths: DENY \
                applied to all traffic to every workload in namespace plain matching to port 8080, whatever the \
                path, until a waypoint enforces the policy"),
        "{up}"
    );
    assert_mtls(&c, "demo/client", "demo/server", CLIENT, "before any policy");

    // An ALLOW with methods and paths: created with a warning, and the client is denied, as the
    // warning says; the proxy names the policy.
    let r = apply(&c, "allow-get.yaml", ALLOW_GET);
    assert_eq!(r.stdout, "AuthorizationPolicy demo/allow-get created\n", "{r}");
    assert_eq!(r.stderr, format!("{ALLOW_GET_WARNING}\n"), "{r}");
    assert_denied_by(&c, "allow policies exist, but none allowed", &["demo/allow-get"]);
    let (code, body) = c.control_get("/debug/config_errors");
    assert_eq!(code, 200, "{body}");
    let errors: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(errors["errors"], serde_json::json!([]), "{errors}");
    let listed: Vec<&str> =
        errors["policies"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(listed, ["allow-get", "paths"], "{errors}");
    assert_eq!(
        errors["policies"][0]["warnings"][0]["fields"],
        serde_json::json!(["rules[0].to[0].operation.methods", "rules[0].to[0].operation.paths"]),
        "{errors}"
    );
    let shown = c.ambit(&["status"]);
    let want = format!(
        "  AuthorizationPolicy demo/allow-get  ALLOW  workloads with app=server in namespace demo\n      allows \
         nothing (no rule): every connection it applies to is denied unless another ALLOW policy allows it\n      \
         warning: {}\n",
        ALLOW_GET_WARNING.trim_start_matches("Warning: AuthorizationPolicy demo/allow-get: ")
    );
    assert!(shown.stdout.contains(&want), "want\n{want}in\n{shown}");
    assert!(
        shown.stdout.lines().any(|l| l.ends_with(&format!(
            " node1  {CLIENT} → demo/server: allow policies exist, but none allowed [demo/allow-get]"
        ))),
        "{shown}"
    );

    // A DENY naming only a method: every connection to the server is denied, as its warning
    // says, and the proxy names the DENY policy.
    c.delete("allow-get.yaml", ALLOW_GET);
    let allowed = wait_for(
        || connect(&c, "demo/client", "demo/server").get("reply").is_some(),
        Duration::from_secs(10),
    );
    assert!(allowed, "removing allow-get did not allow the client again\n{}", c.logs());
    let r = apply(&c, "deny-delete.yaml", DENY_DELETE);
    assert_eq!(r.stdout, "AuthorizationPolicy demo/deny-delete created\n", "{r}");
    assert_eq!(r.stderr, format!("{DENY_DELETE_WARNING}\n"), "{r}");
    assert_denied_by(&c, "explicitly denied by: demo/deny-delete", &["demo/deny-delete"]);
    let policies = c.status()["policies"].clone();
    let deny = policies.as_array().into_iter().flatten().find(|p| p["name"] == "deny-delete").cloned();
    let deny = deny.unwrap_or_else(|| panic!("no deny-delete in {policies}"));
    assert_eq!(deny["rules"], serde_json::json!(["denies all traffic"]), "{deny}");
    assert_eq!(deny["appliesTo"], "workloads with app=server in namespace demo", "{deny}");

    // Refused at apply time, naming the field and its line; nothing changes, so the client,
    // allowed again once deny-delete is gone, stays allowed.
    c.delete("deny-delete.yaml", DENY_DELETE);
    let allowed = wait_for(
        || connect(&c, "demo/client", "demo/server").get("reply").is_some(),
        Duration::from_secs(10),
    );
    assert!(allowed, "removing deny-delete did not allow the client again\n{}", c.logs());
    for (name, text, want) in [
        (
            "typo.yaml",
            TYPO,
            ":7:3: AuthorizationPolicy demo/typo: unknown field \"spec.rulez\" (did you mean \"rules\"?)",
        ),
        (
            "lower.yaml",
            LOWER_CASE,
            ":6:11: AuthorizationPolicy demo/lower: spec.action: Unsupported value: \"deny\": supported values: \
             \"ALLOW\", \"DENY\", \"AUDIT\", \"CUSTOM\"",
        ),
        (
            "replicas.yaml",
            REPLICAS,
            ":7:13: Deployment plain/web: spec.replicas: invalid type: string \"three\", expected i32",
        ),
    ] {
        let f = c.file(name, text);
        let r = c.ambit(&["apply", "-f", f.to_str().unwrap_or_default()]);
        assert_eq!(r.code, Some(1), "{r}");
        assert_eq!(r.stdout, "", "{r}");
        assert_eq!(
            r.stderr,
            format!("ambit apply: 1 problem(s); nothing was applied:\n  {}{want}\n", f.display()),
            "{r}"
        );
        assert_mtls(&c, "demo/client", "demo/server", CLIENT, &format!("after {name} was refused"));
    }

    // -o yaml is the same report as -o json.
    let yaml = c.ambit(&["status", "-o", "yaml"]);
    assert_eq!(yaml.code, Some(0), "{yaml}");
    let from_yaml: Value = serde_saphyr::from_str(&yaml.stdout).unwrap_or_else(|e| panic!("{e}:\n{yaml}"));
    let json = c.status();
    for key in ["phase", "policies", "services", "runDir", "owner"] {
        assert_eq!(from_yaml[key], json[key], "{key}");
    }

    // A container that keeps exiting: its pod is CrashLoopBackOff, not Ready.
    apply(&c, "crasher.yaml", CRASHER);
    let crasher = || {
        let pods = c.status()["pods"].clone();
        pods.as_array()
            .into_iter()
            .flatten()
            .find(|p| p["pod"] == "plain/crasher")
            .cloned()
            .unwrap_or_default()
    };
    let crashing =
        wait_for(|| crasher()["restarts"].as_u64().is_some_and(|r| r >= 2), Duration::from_secs(30));
    assert!(crashing, "the crasher was not restarted twice: {}", crasher());
    let p = crasher();
    assert_eq!(p["phase"], "CrashLoopBackOff", "{p}");
    let message = p["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("container main ended (exit status 3), restarted "), "{p}");

    // A stopped control plane: the cluster is degraded, and says why.
    let r = c.ambit(&["stop", "control"]);
    assert_eq!(r.code, Some(0), "{r}");
    let s = c.status();
    assert_eq!(s["phase"], "degraded", "{s}");
    let problem = s["problems"][0].as_str().unwrap_or_default();
    assert_eq!(problem, "control plane not ready (control: stopped on request)", "{s}");
    let r = c.ambit(&["start", "control"]);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(wait_for(|| c.status()["phase"] == "ready", Duration::from_secs(20)), "{}", c.status());

    // A replaced node proxy: status shows the ports it listens on now.
    let r = c.ambit(&["restart", "proxy/node1"]);
    assert_eq!(r.code, Some(0), "{r}");
    let s = c.status();
    let proxy = s["processes"].as_array().into_iter().flatten().find(|p| p["name"] == "proxy/node1").cloned();
    let proxy = proxy.unwrap_or_else(|| panic!("no proxy/node1 in {s}"));
    assert_eq!(
        proxy["ports"],
        serde_json::json!([
            {"name": "admin", "address": "127.0.0.1:16000"},
            {"name": "metrics", "address": "127.0.0.1:16020"},
            {"name": "ready", "address": "127.0.0.1:16021"},
        ]),
        "{proxy}"
    );
    let shown = c.ambit(&["status"]);
    assert!(
        shown.stdout.contains("admin 127.0.0.1:16000, metrics 127.0.0.1:16020, ready 127.0.0.1:16021"),
        "{shown}"
    );
}
