//! The values one rendering was made with (the chart's defaults, then each `-f` file and
//! `--set`, as helm merges them), and what the checks expect from them.

use std::path::Path;

use serde_json::Value;

use super::render::repo;

/// What a rendering must show, from its values.
#[derive(Clone, Debug)]
pub struct Expect {
    /// `mode=istiod`: no control plane, no CA objects.
    pub istiod: bool,
    /// `revision`: the suffix of every object name ("" for none).
    pub revision: String,
    /// Where the proxies dial xDS and the CA.
    pub discovery_address: String,
    /// `<registry>/` prefix of every image (empty: none).
    pub registry: String,
    /// The tag every image carries (`None`: a digest is used).
    pub tag: Option<String>,
    /// The digest every image carries.
    pub digest: Option<String>,
    /// `platform.cniBinDir`, `cniConfDir`, `netnsDir`.
    pub cni_bin_dir: String,
    pub cni_conf_dir: String,
    pub netns_dir: String,
    /// `agent.captureBackend`.
    pub capture_backend: String,
    /// `control.replicas`.
    pub control_replicas: i32,
    /// The Secret mounted as the control plane's ROOT_CA_DIR.
    pub ca_secret: String,
    /// Whether the chart renders that Secret itself.
    pub ca_generated: bool,
    /// Where the agent and the proxy run: `<component>.priorityClassName` (else
    /// `global.priorityClassName`), `nodeSelector`, `tolerations`.
    pub agent_placement: Placement,
    pub proxy_placement: Placement,
    /// Host paths of the agent's own `agent.volumes`.
    pub agent_extra_host_paths: Vec<String>,
}

/// A node component's placement, as its values set it.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub priority_class: Option<String>,
    pub node_selector: Value,
    pub tolerations: Value,
}

impl Expect {
    /// The name the chart gives an object: `base`, or `base-<revision>`.
    pub fn name(&self, base: &str) -> String {
        if self.revision.is_empty() { base.to_owned() } else { format!("{base}-{}", self.revision) }
    }

    /// The ConfigMap the proxies read the mesh root from.
    pub fn root_config_map(&self) -> String {
        if self.istiod { "istio-ca-root-cert".into() } else { self.name("istio-ca-root-cert") }
    }
}

/// Values: the chart's `values.yaml` merged with overrides.
#[derive(Clone, Debug)]
pub struct Values(pub Value);

impl Values {
    /// The chart's defaults.
    pub fn defaults() -> Values {
        Values(read_yaml(&repo().join("deploy/charts/ambit/values.yaml")))
    }

    /// The values of a `helm template` command line: `-f`/`--values`, `--set`, `--set-file`
    /// (paths relative to the repository root, as the commands run there).
    pub fn of_args(args: &[String]) -> Values {
        let mut v = Values::defaults();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, rest)) if f.starts_with("--") => (f, Some(rest.to_owned())),
                _ => (a.as_str(), None),
            };
            let mut value = || inline.clone().or_else(|| it.next().cloned()).unwrap_or_default();
            match flag {
                "-f" | "--values" => merge(&mut v.0, read_yaml(&repo().join(value()))),
                "--set" => {
                    for pair in value().split(',') {
                        if let Some((k, val)) = pair.split_once('=') {
                            set(&mut v.0, k, scalar(val));
                        }
                    }
                }
                "--set-file" => {
                    let pair = value();
                    if let Some((k, path)) = pair.split_once('=') {
                        let text = std::fs::read_to_string(repo().join(path))
                            .unwrap_or_else(|e| panic!("--set-file {path}: {e}"));
                        set(&mut v.0, k, Value::String(text));
                    }
                }
                _ => {}
            }
        }
        v
    }

    /// The string at `path` (`a.b.c`), or "".
    pub fn str(&self, path: &str) -> String {
        match self.at(path) {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }

    /// The value at `path`.
    pub fn at(&self, path: &str) -> &Value {
        path.split('.').fold(&self.0, |v, k| v.get(k).unwrap_or(&Value::Null))
    }

    /// The first of `paths` that is set (not empty), or "".
    pub fn first(&self, paths: &[&str]) -> String {
        paths.iter().map(|p| self.str(p)).find(|v| !v.is_empty()).unwrap_or_default()
    }

    /// What the rendering must show.
    pub fn expect(&self) -> Expect {
        let istiod = self.str("mode") == "istiod";
        let existing = self.str("ca.existingSecret");
        let tag = self.first(&["image.tag", "global.tag"]);
        let digest = self.str("image.digest");
        let revision = self.str("revision");
        let suffix = if revision.is_empty() { String::new() } else { format!("-{revision}") };
        let registry = self.first(&["image.registry", "global.hub"]);
        let placement = |c: &str| Placement {
            priority_class: Some(
                self.first(&[&format!("{c}.priorityClassName"), "global.priorityClassName"]),
            )
            .filter(|p| !p.is_empty()),
            node_selector: self.at(&format!("{c}.nodeSelector")).clone(),
            tolerations: self.at(&format!("{c}.tolerations")).clone(),
        };
        Expect {
            istiod,
            discovery_address: match (istiod, self.str("istiod.address")) {
                (true, a) if !a.is_empty() => a,
                (true, _) => format!("istiod{suffix}.{}.svc:15012", self.str("global.istioNamespace")),
                (false, _) => format!("ambit-control{suffix}.{}.svc:15012", super::render::NAMESPACE),
            },
            revision,
            registry: if registry.is_empty() { "localhost/ambit".into() } else { registry },
            tag: digest.is_empty().then(|| if tag.is_empty() { chart_app_version() } else { tag }),
            digest: (!digest.is_empty()).then_some(digest),
            cni_bin_dir: self.str("platform.cniBinDir"),
            cni_conf_dir: self.str("platform.cniConfDir"),
            netns_dir: self.str("platform.netnsDir"),
            capture_backend: self.str("agent.captureBackend"),
            control_replicas: self.at("control.replicas").as_i64().unwrap_or(1) as i32,
            ca_secret: if existing.is_empty() { "cacerts".into() } else { existing.clone() },
            ca_generated: existing.is_empty() && !istiod,
            agent_placement: placement("agent"),
            proxy_placement: placement("proxy"),
            agent_extra_host_paths: self
                .at("agent.volumes")
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_owned))
                .collect(),
        }
    }
}

/// `appVersion` of the ambit chart.
pub fn chart_app_version() -> String {
    let chart = read_yaml(&repo().join("deploy/charts/ambit/Chart.yaml"));
    chart["appVersion"].as_str().expect("Chart.yaml has appVersion").to_owned()
}

/// A YAML file as JSON.
pub fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Helm's merge: maps merge key by key, anything else replaces.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o,
    }
}

fn set(root: &mut Value, path: &str, value: Value) {
    let mut v = root;
    for key in path.split('.') {
        if !v.is_object() {
            *v = Value::Object(Default::default());
        }
        v = v.as_object_mut().expect("object").entry(key).or_insert(Value::Null);
    }
    *v = value;
}

/// `--set`'s typing of a scalar: booleans, integers, null, else a string.
fn scalar(s: &str) -> Value {
    match s {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "null" => Value::Null,
        _ => s.parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::String(s.to_owned())),
    }
}
