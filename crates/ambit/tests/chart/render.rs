//! Running the real `helm`, and every rendered document as its typed Kubernetes object.

use std::path::{Path, PathBuf};
use std::process::Command;

use ambit_objects::k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use ambit_objects::k8s_openapi::api::core::v1::{ConfigMap, PodSpec, Secret, Service, ServiceAccount};
use ambit_objects::k8s_openapi::api::policy::v1::PodDisruptionBudget;
use ambit_objects::k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use ambit_objects::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The release namespace every rendering uses (the documented default).
pub const NAMESPACE: &str = "istio-system";

/// The `helm` to run: `$HELM`, else `helm` on PATH. Missing is a failure, not a skip: CI
/// installs it (scripts/install-helm.sh), and a chart nobody renders is not tested.
pub fn helm() -> PathBuf {
    let helm = std::env::var_os("HELM").map(PathBuf::from).unwrap_or_else(|| "helm".into());
    match Command::new(&helm).args(["version", "--template", "{{.Version}}"]).output() {
        Ok(out) if out.status.success() => helm,
        Ok(out) => panic!(
            "{} version failed ({}): {}; install helm with `bash scripts/install-helm.sh` or set HELM",
            helm.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "cannot run {} ({e}): the chart tests need helm; install it with `bash scripts/install-helm.sh` \
             (as root), or point HELM at a helm binary",
            helm.display()
        ),
    }
}

/// Runs helm with `args` in the repository root: stdout, or the trimmed stderr.
pub fn run_helm(args: &[String]) -> Result<String, String> {
    let out = Command::new(helm())
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("helm {args:?}: {e}"));
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm prints UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// `helm template ambit deploy/charts/ambit -n istio-system <extra>`, parsed.
pub fn render(extra: &[&str]) -> Result<Release, String> {
    let mut args: Vec<String> =
        ["template", "ambit", "deploy/charts/ambit", "--namespace", NAMESPACE].map(String::from).to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    render_args(&args)
}

/// Any `helm template …` command line (without `helm`), parsed.
pub fn render_args(args: &[String]) -> Result<Release, String> {
    let text = run_helm(args)?;
    Ok(Release::parse(&text).unwrap_or_else(|e| panic!("helm {}: {e}", args.join(" "))))
}

/// Every object of one rendering, typed.
#[derive(Clone, Debug, Default)]
pub struct Release {
    pub service_accounts: Vec<ServiceAccount>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    pub daemon_sets: Vec<DaemonSet>,
    pub deployments: Vec<Deployment>,
    pub services: Vec<Service>,
    pub pdbs: Vec<PodDisruptionBudget>,
    pub secrets: Vec<Secret>,
    pub config_maps: Vec<ConfigMap>,
    pub crds: Vec<CustomResourceDefinition>,
}

impl Release {
    /// Parses helm's output: every document must be one of the kinds above and must survive a
    /// round trip through its typed object unchanged, so a misspelt or misplaced field (which
    /// the typed parse alone would drop silently) is an error.
    pub fn parse(text: &str) -> Result<Release, String> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| format!("YAML: {e}"))?;
        let mut r = Release::default();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let what = format!("{kind} {name}");
            match kind.as_str() {
                "ServiceAccount" => r.service_accounts.push(typed(&doc, &what)?),
                "ClusterRole" => r.cluster_roles.push(typed(&doc, &what)?),
                "ClusterRoleBinding" => r.cluster_role_bindings.push(typed(&doc, &what)?),
                "Role" => r.roles.push(typed(&doc, &what)?),
                "RoleBinding" => r.role_bindings.push(typed(&doc, &what)?),
                "DaemonSet" => r.daemon_sets.push(typed(&doc, &what)?),
                "Deployment" => r.deployments.push(typed(&doc, &what)?),
                "Service" => r.services.push(typed(&doc, &what)?),
                "PodDisruptionBudget" => r.pdbs.push(typed(&doc, &what)?),
                "Secret" => r.secrets.push(typed(&doc, &what)?),
                "ConfigMap" => r.config_maps.push(typed(&doc, &what)?),
                "CustomResourceDefinition" => r.crds.push(typed(&doc, &what)?),
                _ => return Err(format!("unexpected kind {what:?} in the rendering")),
            }
        }
        Ok(r)
    }

    /// The DaemonSet named `name`.
    pub fn daemon_set(&self, name: &str) -> Option<&DaemonSet> {
        self.daemon_sets.iter().find(|d| d.metadata.name.as_deref() == Some(name))
    }

    /// The Deployment named `name`.
    pub fn deployment(&self, name: &str) -> Option<&Deployment> {
        self.deployments.iter().find(|d| d.metadata.name.as_deref() == Some(name))
    }

    /// The pod template of the DaemonSet or Deployment `name`.
    pub fn pod_spec(&self, name: &str) -> Option<PodSpec> {
        let ds = self.daemon_set(name).and_then(|d| d.spec.as_ref()).map(|s| &s.template);
        let deploy = self.deployment(name).and_then(|d| d.spec.as_ref()).map(|s| &s.template);
        ds.or(deploy).and_then(|t| t.spec.clone())
    }

    /// `kind/name` of every object, as `kubectl` names them (lower-case kind).
    pub fn names(&self) -> Vec<String> {
        fn each<
            T: ambit_objects::k8s_openapi::Resource + ambit_objects::k8s_openapi::Metadata<Ty = ObjectMeta>,
        >(
            items: &[T],
        ) -> impl Iterator<Item = String> + '_ {
            items.iter().map(|i| {
                format!("{}/{}", T::KIND.to_lowercase(), i.metadata().name.clone().unwrap_or_default())
            })
        }
        use ambit_objects::ObjectMeta;
        let mut out = Vec::new();
        out.extend(each(&self.service_accounts));
        out.extend(each(&self.cluster_roles));
        out.extend(each(&self.cluster_role_bindings));
        out.extend(each(&self.roles));
        out.extend(each(&self.role_bindings));
        out.extend(each(&self.daemon_sets));
        out.extend(each(&self.deployments));
        out.extend(each(&self.services));
        out.extend(each(&self.pdbs));
        out.extend(each(&self.secrets));
        out.extend(each(&self.config_maps));
        out.extend(each(&self.crds));
        out
    }
}

/// `doc` as a `T`, and back to the same JSON.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> Result<T, String> {
    let t: T = serde_json::from_value(doc.clone()).map_err(|e| format!("{what}: {e}"))?;
    let back = serde_json::to_value(&t).map_err(|e| format!("{what}: {e}"))?;
    match first_difference(doc, &back, String::new()) {
        None => Ok(t),
        Some(at) => Err(format!(
            "{what}: the typed object differs from the rendered document at {at} (a field the API does not \
             have, or a value of the wrong type)"
        )),
    }
}

/// The JSON pointer of the first place where `a` and `b` differ.
pub fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys()) {
                let (va, vb) = (x.get(key).unwrap_or(&Value::Null), y.get(key).unwrap_or(&Value::Null));
                if let Some(d) = first_difference(va, vb, format!("{at}/{key}")) {
                    return Some(d);
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (va, vb))| first_difference(va, vb, format!("{at}/{i}"))),
        (x, y) if x == y => None,
        _ => Some(if at.is_empty() { "/".into() } else { at }),
    }
}
