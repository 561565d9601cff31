//! The values an Istio user writes (ci/istio-style-values.yaml), each read back from the objects
//! it must change; the revision's names; the NOTES the chart prints.

use std::collections::BTreeSet;

use ambit_objects::k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use serde_json::{Value, json};

use super::checks::check;
use super::pods::env;
use super::render::{NAMESPACE, Release, render, run_helm};
use super::values::Values;

/// The file, as docs/install.md names it.
pub const FILE: &str = "deploy/charts/ambit/ci/istio-style-values.yaml";

/// One component's pod template in the rendering, by its workload's name.
pub fn template(r: &Release, name: &str) -> PodTemplateSpec {
    let ds = r.daemon_set(name).and_then(|d| d.spec.as_ref()).map(|s| s.template.clone());
    let deploy = r.deployment(name).and_then(|d| d.spec.as_ref()).map(|s| s.template.clone());
    ds.or(deploy).unwrap_or_else(|| panic!("no workload {name} in the rendering"))
}

fn spec(t: &PodTemplateSpec) -> &PodSpec {
    t.spec.as_ref().expect("pod spec")
}

fn container(t: &PodTemplateSpec) -> &Container {
    spec(t).containers.first().expect("a container")
}

fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("json")
}

/// Every field of the file, on the objects it belongs to.
pub fn check_every_field(r: &Release) {
    let (agent, proxy, control) = (
        template(r, "ambit-agent-canary"),
        template(r, "ztunnel-canary"),
        template(r, "ambit-control-canary"),
    );
    let all = [("agent", &agent), ("proxy", &proxy), ("control", &control)];

    // global.hub, global.tag, global.imagePullPolicy, global.imagePullSecrets: every pod.
    for (what, t) in all {
        let c = container(t);
        let repo = if what == "agent" { "ambit-agent" } else { "ambit" };
        assert_eq!(
            c.image.as_deref(),
            Some(format!("registry.example.com/mesh/{repo}:0.1.0").as_str()),
            "{what}"
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"), "{what}");
        assert_eq!(json_of(&spec(t).image_pull_secrets), json!([{"name": "mesh-pull"}]), "{what}");
    }
    assert_eq!(
        env(container(&control), "AMBIT_WAYPOINT_IMAGE"),
        Some("registry.example.com/mesh/ambit:0.1.0"),
        "waypoints run the proxy's image from global.hub"
    );

    // global.logAsJson for the agent (its flag) and the control plane (its variable);
    // proxy.logAsJson: false wins over it.
    assert_eq!(container(&agent).args.clone().unwrap_or_default(), ["--log_as_json"]);
    assert_eq!(env(container(&control), "AMBIT_LOG_FORMAT"), Some("json"));
    assert_eq!(env(container(&proxy), "LOG_FORMAT"), None, "proxy.logAsJson=false");

    // priorityClassName: the agent's and proxy's own; global.priorityClassName for the control
    // plane, whose own is empty.
    for (what, t, want) in [
        ("agent", &agent, "node-mesh-critical"),
        ("proxy", &proxy, "node-mesh-critical"),
        ("control", &control, "mesh-critical"),
    ] {
        assert_eq!(spec(t).priority_class_name.as_deref(), Some(want), "{what}");
    }

    // podLabels on the pods (never in a selector); podAnnotations beside the chart's.
    for (what, t) in all {
        let labels = t.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        assert_eq!(labels.get("team").map(String::as_str), Some("mesh"), "{what}");
        assert_eq!(labels.get("istio.io/rev").map(String::as_str), Some("canary"), "{what}");
        let annotations = t.metadata.as_ref().and_then(|m| m.annotations.clone()).unwrap_or_default();
        let owner = annotations.get("example.com/owner").map(String::as_str);
        assert_eq!(owner, if what == "proxy" { None } else { Some("mesh-team") }, "{what}");
        assert_eq!(annotations.get("prometheus.io/scrape").map(String::as_str), Some("true"), "{what}");
    }
    for d in &r.daemon_sets {
        let sel = d.spec.as_ref().and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
        assert!(!sel.contains_key("team"), "{:?} selects by a user label", d.metadata.name);
    }

    // env: after the chart's own variables, as strings.
    for (what, t, name, value) in [
        ("agent", &agent, "AMBIENT_DNS_CAPTURE", "true"),
        ("proxy", &proxy, "ZTUNNEL_WORKER_THREADS", "2"),
        ("control", &control, "PILOT_DEBOUNCE_AFTER", "200ms"),
    ] {
        let c = container(t);
        let last = c.env.as_ref().and_then(|e| e.last()).map(|e| (e.name.as_str(), e.value.as_deref()));
        assert_eq!(last, Some((name, Some(value))), "{what}");
    }

    // volumes and volumeMounts: added after the chart's.
    for (what, t, volume, mount) in [
        (
            "agent",
            &agent,
            json!({"name": "extra-config", "configMap": {"name": "agent-extra"}}),
            json!({"name": "extra-config", "mountPath": "/etc/agent-extra", "readOnly": true}),
        ),
        (
            "proxy",
            &proxy,
            json!({"name": "scratch", "emptyDir": {}}),
            json!({"name": "scratch", "mountPath": "/tmp"}),
        ),
        (
            "control",
            &control,
            json!({"name": "extra-config", "configMap": {"name": "control-extra"}}),
            json!({"name": "extra-config", "mountPath": "/etc/control-extra", "readOnly": true}),
        ),
    ] {
        let volumes = json_of(&spec(t).volumes);
        assert_eq!(volumes.as_array().and_then(|v| v.last()), Some(&volume), "{what}");
        let mounts = json_of(&container(t).volume_mounts);
        assert_eq!(mounts.as_array().and_then(|v| v.last()), Some(&mount), "{what}");
    }

    // nodeSelector (merged with the chart's Linux selector), affinity, tolerations, resources.
    let arch = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}]}}});
    let dedicated =
        json!([{"key": "mesh.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}]);
    for (what, t) in [("agent", &agent), ("proxy", &proxy)] {
        assert_eq!(
            json_of(&spec(t).node_selector),
            json!({"kubernetes.io/os": "linux", "mesh.example.com/revision": "canary"}),
            "{what}"
        );
        assert_eq!(json_of(&spec(t).affinity), arch, "{what}");
        assert_eq!(json_of(&spec(t).tolerations), dedicated, "{what}");
    }
    assert_eq!(
        json_of(&spec(&control).node_selector),
        json!({"kubernetes.io/os": "linux", "node-role.example.com/infra": "true"})
    );
    assert_eq!(
        json_of(&spec(&control).affinity),
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app": "ambit-control", "istio.io/rev": "canary"}}}]}}),
        "control.affinity replaces the chart's preferred anti-affinity"
    );
    assert_eq!(
        json_of(&spec(&control).tolerations),
        json!([{"key": "node-role.example.com/infra", "operator": "Exists", "effect": "NoSchedule"}])
    );
    for (what, t, want) in [
        (
            "agent",
            &agent,
            json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}),
        ),
        (
            "proxy",
            &proxy,
            json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}),
        ),
        ("control", &control, json!({"requests": {"cpu": "1", "memory": "1Gi"}})),
    ] {
        assert_eq!(json_of(&container(t).resources), want, "{what}");
    }

    // revision: the control plane serves its revision's objects, the proxies dial it, it
    // trusts their account; names and labels below.
    let c = container(&control);
    assert_eq!(env(c, "REVISION"), Some("canary"));
    assert_eq!(env(c, "CA_TRUSTED_NODE_ACCOUNTS"), Some(format!("{NAMESPACE}/ztunnel-canary").as_str()));
    assert_eq!(env(c, "ISTIOD_CUSTOM_HOST"), Some(format!("ambit-control-canary.{NAMESPACE}.svc").as_str()));
    assert_eq!(
        env(container(&proxy), "XDS_ADDRESS"),
        Some(format!("ambit-control-canary.{NAMESPACE}.svc:15012").as_str())
    );
    assert_eq!(env(container(&agent), "AMBIT_AGENT_DAEMONSET"), Some("ambit-agent-canary"));
    revisioned(r, "canary");
}

/// With a revision, every object is named `<name>-<revision>` and labelled with it, except the
/// mesh's CA Secret, which every revision shares.
pub fn revisioned(r: &Release, revision: &str) {
    let suffix = format!("-{revision}");
    for name in r.names() {
        if name == "secret/cacerts" {
            continue;
        }
        assert!(name.ends_with(&suffix), "{name} does not carry the revision");
    }
    let labelled = r
        .daemon_sets
        .iter()
        .map(|o| &o.metadata)
        .chain(r.deployments.iter().map(|o| &o.metadata))
        .chain(r.services.iter().map(|o| &o.metadata))
        .chain(r.service_accounts.iter().map(|o| &o.metadata))
        .chain(r.cluster_roles.iter().map(|o| &o.metadata))
        .chain(r.roles.iter().map(|o| &o.metadata))
        .chain(r.config_maps.iter().map(|o| &o.metadata));
    for m in labelled {
        let rev = m.labels.as_ref().and_then(|l| l.get("istio.io/rev")).map(String::as_str);
        assert_eq!(rev, Some(revision), "{:?}", m.name);
    }
}

/// `kind/name` of every object, without the ones several revisions may share.
pub fn owned_names(r: &Release) -> BTreeSet<String> {
    r.names().into_iter().filter(|n| n != "secret/cacerts").collect()
}

/// The NOTES `helm install` prints with `extra` values (a client-side dry run).
pub fn notes(extra: &[&str]) -> String {
    let mut args: Vec<String> =
        ["install", "ambit", "deploy/charts/ambit", "-n", NAMESPACE, "--dry-run=client"]
            .map(String::from)
            .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = run_helm(&args).unwrap_or_else(|e| panic!("helm {args:?}: {e}"));
    let at = out.find("\nNOTES:\n").unwrap_or_else(|| panic!("no NOTES in:\n{out}"));
    out[at + "\nNOTES:\n".len()..].to_owned()
}

/// Renders the file (and, for `global.istioNamespace`, the file with mode=istiod).
pub fn render_file(extra: &[&str]) -> Release {
    let mut args = vec!["-f", FILE];
    args.extend_from_slice(extra);
    render(&args).unwrap_or_else(|e| panic!("{FILE} {extra:?}: {e}"))
}

#[test]
fn istio_style_values_render_each_setting() {
    let r = render_file(&[]);
    let args: Vec<String> = ["-f", FILE].map(String::from).to_vec();
    let problems = check(&r, &Values::of_args(&args).expect());
    assert!(problems.is_empty(), "{problems:#?}");
    check_every_field(&r);

    // global.istioNamespace: with istiod, the proxies dial the revision's istiod there, as
    // Istio's ztunnel chart does.
    let r = render_file(&["--set", "mode=istiod"]);
    let proxy = template(&r, "ztunnel-canary");
    for var in ["XDS_ADDRESS", "CA_ADDRESS"] {
        assert_eq!(env(container(&proxy), var), Some("istiod-canary.mesh-system.svc:15012"), "{var}");
    }
    let cm =
        spec(&proxy).volumes.iter().flatten().find_map(|v| v.config_map.as_ref().map(|c| c.name.clone()));
    assert_eq!(cm.as_deref(), Some("istio-ca-root-cert"), "with istiod, istiod's root ConfigMap");
}

/// Two releases of different revisions in one namespace create no object of the same kind and
/// name (cluster-scoped ones included); only the mesh's CA Secret is shared, by reference.
#[test]
fn two_revisions_in_one_namespace_share_no_object() {
    let first = render(&[]).expect("default revision");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root-cert.pem");
    let cm = first.config_maps.iter().find(|c| c.metadata.name.as_deref() == Some("istio-ca-root-cert"));
    let pem = cm.and_then(|c| c.data.as_ref()?.get("root-cert.pem").cloned()).expect("root");
    std::fs::write(&root, &pem).expect("write root");
    let set_file = format!("ca.rootCert={}", root.display());
    let second =
        render(&["--set", "revision=canary", "--set", "ca.existingSecret=cacerts", "--set-file", &set_file])
            .expect("canary revision");
    revisioned(&second, "canary");
    let shared: Vec<String> = owned_names(&first).intersection(&owned_names(&second)).cloned().collect();
    assert!(shared.is_empty(), "both releases would own {shared:?}");
    assert!(second.secrets.is_empty(), "the canary creates no CA of its own");
    let control = template(&second, "ambit-control-canary");
    let secret = spec(&control).volumes.iter().flatten().find_map(|v| v.secret.as_ref()?.secret_name.clone());
    assert_eq!(secret.as_deref(), Some("cacerts"), "the canary signs under the first release's root");
    // The same revision twice is what helm refuses (same names): the check can fail.
    let again = render(&[]).expect("default again");
    assert!(!owned_names(&first).is_disjoint(&owned_names(&again)));
}

/// NOTES: what was installed and the commands that verify it, naming rendered objects.
#[test]
fn notes_tell_what_was_installed_and_how_to_verify() {
    let text = notes(&[]);
    assert_eq!(
        text.trim_end(),
        "Ambit 0.1.0 is installed in the namespace istio-system (release ambit, revision default, mode ambit):
  node agent     DaemonSet ambit-agent
  node proxy     DaemonSet ztunnel, dialing ambit-control.istio-system.svc:15012
  control plane  Deployment ambit-control (1 replica(s)), CA root in the ConfigMap istio-ca-root-cert

Wait for them:
  kubectl -n istio-system rollout status daemonset/ambit-agent
  kubectl -n istio-system rollout status daemonset/ztunnel
  kubectl -n istio-system rollout status deployment/ambit-control

Then enroll a namespace (kubectl label namespace NAME istio.io/dataplane-mode=ambient): its new
pods get the annotation ambient.istio.io/redirection=enabled once captured and served by their
node's proxy.
`helm uninstall ambit -n istio-system` also takes ambit-cni out of every node's CNI chain.
docs/install.md has the rest."
    );
    for extra in [&["-f", FILE][..], &["-f", FILE, "--set", "mode=istiod"], &["--set", "mode=istiod"]] {
        let text = notes(extra);
        let objects: BTreeSet<String> = render(extra).expect("renders").names().into_iter().collect();
        let mut named = 0;
        for line in text.lines().map(str::trim).filter(|l| l.starts_with("kubectl -n")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words.get(2), Some(&NAMESPACE), "{line}");
            let object = words.last().copied().unwrap_or_default();
            assert!(
                objects.contains(object),
                "{extra:?}: NOTES names {object}, which is not rendered:\n{text}"
            );
            named += 1;
        }
        let want = if extra.contains(&"mode=istiod") { 2 } else { 3 };
        assert_eq!(named, want, "{extra:?}: one rollout command per workload:\n{text}");
    }
}

/// values.schema.json: every object schema it defines says what else it allows
/// (`additionalProperties`), so no key is ignored silently; only Kubernetes objects passed
/// through as they are stay open, and they are listed here.
#[test]
fn the_schema_closes_every_object_it_defines() {
    let text = std::fs::read_to_string(super::render::repo().join("deploy/charts/ambit/values.schema.json"))
        .expect("schema");
    let schema: Value = serde_json::from_str(&text).expect("JSON");
    let passed_through: BTreeSet<&str> = [
        "/$defs/affinity/properties/nodeAffinity",
        "/$defs/affinity/properties/podAffinity",
        "/$defs/affinity/properties/podAntiAffinity",
        "/$defs/volumes/items",
    ]
    .into();
    let mut open = Vec::new();
    open_objects(&schema, "", &mut open);
    let open: Vec<String> = open.into_iter().filter(|p| !passed_through.contains(p.as_str())).collect();
    assert!(open.is_empty(), "object schemas without additionalProperties: {open:?}");
    // The walk sees an open object: the check can fail.
    let mut found = Vec::new();
    open_objects(&json!({"properties": {"a": {"type": "object"}}}), "", &mut found);
    assert_eq!(found, ["/properties/a"]);
}

/// JSON pointers of the schemas in `v` of type object without `additionalProperties`.
fn open_objects(v: &Value, at: &str, out: &mut Vec<String>) {
    let Value::Object(map) = v else { return };
    if map.get("type") == Some(&json!("object")) && !map.contains_key("additionalProperties") {
        out.push(at.to_owned());
    }
    for (k, child) in map {
        match child {
            Value::Object(_) => open_objects(child, &format!("{at}/{k}"), out),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    open_objects(item, &format!("{at}/{k}/{i}"), out);
                }
            }
            _ => {}
        }
    }
}
