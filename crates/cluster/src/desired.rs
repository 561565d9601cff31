//! What a user asks a local cluster to run: a folder of the same YAML they would give
//! Kubernetes. Every file is read with `ambit-objects`' reader (the control plane's and the
//! agents' own), every document decoded strictly into its type (as `kubectl apply` with
//! server-side field validation does: an unknown field, a value of the wrong type or outside a
//! CRD's enumeration is an error naming the field, at its own line and column), and the whole
//! folder checked before anything is applied: an unknown kind, a document that does not decode,
//! an object defined twice, a pod in a namespace that does not exist, a container without a command or a pod placed
//! on a node the cluster lacks is an error naming the file and line, and nothing of the folder is
//! used.
//!
//! Kinds: everything the control plane reads (Namespace, Service, EndpointSlice, ServiceEntry,
//! WorkloadEntry, AuthorizationPolicy, PeerAuthentication, Gateway, GatewayClass) is handed to it
//! as written; Pods and Deployments (`apps/v1`, `replicas` copies of the template) become
//! [`PodTemplate`]s that the cluster runs; ServiceAccounts are checked and kept. Nodes are the
//! cluster's own (`ambit up --nodes`).
//!
//! Services get a cluster IP as the API server gives one: a Service without `spec.clusterIP`
//! is given a free address of [`SERVICE_RANGE`] (chosen from its namespace and name, so the same
//! folder gets the same addresses), `clusterIP: None` stays headless, and an address given must
//! be in the range and not another Service's. `ambit up` and `ambit apply` write the address
//! into the object they keep, so it stays the Service's across re-applies and restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use ambit_objects::file::Origin;
use ambit_objects::k8s_openapi::api::apps::v1::Deployment;
use ambit_objects::k8s_openapi::api::core::v1::{PodSpec, ServiceAccount};
use ambit_objects::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use ambit_objects::strict::{self, Decoding, FieldError};
use ambit_objects::{Kind, Object, ObjectError};
use serde_json::Value;

/// Most replicas one Deployment may ask for.
pub const MAX_REPLICAS: i32 = 64;
/// Most pods one cluster runs.
pub const MAX_PODS: usize = 1_000;
/// Most YAML files read from one folder (`ambit apply` writes one per object, so this bounds
/// the objects of a cluster: 20 000 Services, Pods and policies together).
pub const MAX_FILES: usize = 20_000;
/// Longest pod name (a DNS label, as Kubernetes requires of pod hostnames).
pub const MAX_POD_NAME: usize = 63;
/// The namespace every cluster has without being told.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The namespace of the mesh's own components (the control plane's), present as in a cluster.
pub const SYSTEM_NAMESPACE: &str = "istio-system";

/// The range Services' cluster IPs come from: 10.96.0.0/16 (kubeadm's default service CIDR
/// starts there). Given addresses may be anywhere in it; those given out automatically come from
/// its upper half (10.96.128.0 and up), as the API server gives out dynamic addresses from the
/// upper part of its range and leaves the lower for chosen ones.
pub const SERVICE_RANGE: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 96, 0, 0), 16);

/// A file and line (and column, when a problem is at one field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub path: PathBuf,
    /// 1-based line of the document (0: the whole file).
    pub line: u64,
    /// 1-based column of the problem (0: the line, not shown).
    pub column: u64,
    /// Where the value read from the file is in it (to place an error in one of its fields).
    pub origin: Option<Origin>,
}

impl Location {
    /// A whole file (`line` 0) or a line of it.
    pub fn new(path: impl Into<PathBuf>, line: u64) -> Location {
        Location { path: path.into(), line, column: 0, origin: None }
    }

    /// Where the field `error` is about is written, if this is a value read from a file (else
    /// this location).
    fn of_field(&self, error: &FieldError) -> Location {
        let Some(origin) = &self.origin else { return self.clone() };
        let at = ambit_objects::file::field_position(&self.path, origin, error);
        Location { line: at.line, column: at.column, ..self.clone() }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (0, _) => write!(f, "{}", self.path.display()),
            (line, 0) => write!(f, "{}:{line}", self.path.display()),
            (line, column) => write!(f, "{}:{line}:{column}", self.path.display()),
        }
    }
}

/// One problem with the folder.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {problem}")]
pub struct DesiredError {
    /// Where.
    pub at: Location,
    /// What is wrong.
    pub problem: String,
}

/// Every problem found in a folder (it is used only when there is none).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct DesiredErrors(pub Vec<DesiredError>);

impl fmt::Display for DesiredErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// One object handed to the control plane and the agents as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Passed {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace (empty for cluster-scoped kinds).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The object as written.
    pub value: Value,
    /// Where.
    pub at: Location,
}

/// One pod the cluster runs: from a Pod, or one replica of a Deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct PodTemplate {
    /// Namespace.
    pub namespace: String,
    /// Pod name (`<deployment>-<i>` for a replica).
    pub name: String,
    /// The Deployment it belongs to.
    pub deployment: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Service account (`default` when not given).
    pub service_account: String,
    /// The node asked for (`spec.nodeName`), if any.
    pub node: Option<String>,
    /// The containers: processes run in the pod's network namespace.
    pub containers: Vec<Container>,
    /// The pod spec as written (what the Pod object the cluster reports carries).
    pub spec: Value,
    /// A digest of the template: a pod whose template changed is replaced.
    pub digest: u64,
    /// Where it is defined.
    pub at: Location,
}

/// One container: a command run in the pod's network namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// Name.
    pub name: String,
    /// `command` then `args`. `ambit` as the program is the running `ambit` binary.
    pub argv: Vec<String>,
    /// `env` with literal values.
    pub env: Vec<(String, String)>,
    /// Declared TCP ports: the pod is ready once each is listening.
    pub ports: Vec<u16>,
    /// `readinessProbe.httpGet` (port, path): the pod is ready once it answers 200 too.
    pub ready_http: Option<(u16, String)>,
}

/// A folder's objects, checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    /// What the control plane and the agents read as written, in file order.
    pub passed: Vec<Passed>,
    /// The pods to run, in file order.
    pub pods: Vec<PodTemplate>,
    /// The namespaces that exist (those defined, [`DEFAULT_NAMESPACE`] and [`SYSTEM_NAMESPACE`]).
    pub namespaces: BTreeSet<String>,
}

/// The kinds a folder may hold, for error messages.
pub const KINDS: &str = "Namespace, Pod, Deployment, Service, ServiceAccount, EndpointSlice, \
    ServiceEntry, WorkloadEntry, AuthorizationPolicy, PeerAuthentication, Gateway, GatewayClass";

/// The YAML files of `dir` (`.yaml`/`.yml`, not hidden), sorted.
pub fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, DesiredError> {
    let fail = |problem: String| DesiredError { at: Location::new(dir, 0), problem };
    let entries = std::fs::read_dir(dir).map_err(|e| fail(format!("cannot read the folder: {e}")))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| fail(format!("cannot read the folder: {e}")))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) || !path.is_file() {
            continue;
        }
        files.push(path);
        if files.len() > MAX_FILES {
            return Err(fail(format!("more than {MAX_FILES} YAML files")));
        }
    }
    files.sort();
    Ok(files)
}

impl Desired {
    /// Reads and checks every YAML file of `dir`; `nodes` are the cluster's node names (a pod's
    /// `nodeName` must be one of them).
    pub fn load(dir: &Path, nodes: &[String]) -> Result<Desired, DesiredErrors> {
        let files = yaml_files(dir).map_err(|e| DesiredErrors(vec![e]))?;
        Desired::load_files(&files, nodes)
    }

    /// Like [`Desired::load`] for the given files (in this order).
    pub fn load_files(files: &[PathBuf], nodes: &[String]) -> Result<Desired, DesiredErrors> {
        let (documents, errors) = read_files(files);
        Desired::check(documents, errors, nodes)
    }

    /// Checks documents read with [`read_files`] (and the errors reading them gave).
    pub fn check(
        documents: Vec<(Value, Location)>,
        errors: Vec<DesiredError>,
        nodes: &[String],
    ) -> Result<Desired, DesiredErrors> {
        let mut reader = Reader { errors, ..Reader::default() };
        let mut documents = documents;
        for (at, problem) in waypoints::expand(&mut documents) {
            reader.fail(&at, problem);
        }
        for (value, at) in documents {
            reader.document(value, at);
        }
        reader.finish(nodes)
    }
}

/// Every document of `files` with where it is, and the files' errors.
pub fn read_files(files: &[PathBuf]) -> (Vec<(Value, Location)>, Vec<DesiredError>) {
    let (mut documents, mut errors) = (Vec::new(), Vec::new());
    for path in files {
        match ambit_objects::file::values(path) {
            Ok(values) => documents.extend(values.into_iter().map(|(v, origin)| {
                let line = origin.at.line;
                (v, Location { origin: Some(origin), ..Location::new(path.clone(), line) })
            })),
            Err(e) => {
                let at = match e.at {
                    Some(p) => Location { column: p.column, ..Location::new(path.clone(), p.line) },
                    None => Location::new(path.clone(), 0),
                };
                errors.push(DesiredError { at, problem: e.problem.to_string() });
            }
        }
    }
    (documents, errors)
}

/// The file name an object is kept under in a desired folder of one object per file:
/// `<kind>.<namespace>.<name>.yaml` (`<kind>.<name>.yaml` for cluster-scoped kinds), lowercase
/// kind; `None` for a document without a kind or name.
pub fn object_file(value: &Value) -> Option<String> {
    let kind = value.get("kind")?.as_str()?.to_ascii_lowercase();
    let meta = value.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    let cluster_scoped = matches!(kind.as_str(), "namespace" | "node" | "gatewayclass");
    let namespace = meta.get("namespace").and_then(Value::as_str).unwrap_or(DEFAULT_NAMESPACE);
    let ok =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !ok(name) || !ok(namespace) || !ok(&kind) {
        return None;
    }
    Some(if cluster_scoped {
        format!("{kind}.{name}.yaml")
    } else {
        format!("{kind}.{namespace}.{name}.yaml")
    })
}

#[derive(Default)]
struct Reader {
    out: Desired,
    service_accounts: BTreeSet<(String, String)>,
    /// Where each object is defined: `kind/namespace/name` → location.
    seen: BTreeMap<(String, String, String), Location>,
    /// Namespaced objects with where they are, to check their namespace at the end.
    namespaced: Vec<(String, String, Location)>,
    errors: Vec<DesiredError>,
}

impl Reader {
    fn fail(&mut self, at: &Location, problem: impl Into<String>) {
        self.errors.push(DesiredError { at: at.clone(), problem: problem.into() });
    }

    /// `error` in a field of the `kind` object `value`, at the field.
    fn fail_field(&mut self, at: &Location, kind: &str, value: &Value, error: &FieldError) {
        let what = ambit_objects::describe(kind, value);
        self.fail(&at.of_field(error), format!("{what}: {error}"));
    }

    fn document(&mut self, mut value: Value, at: Location) {
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
        let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_owned();
        let meta = value.get("metadata");
        let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or_default().to_owned();
        let namespace = meta.and_then(|m| m.get("namespace")).and_then(Value::as_str).map(str::to_owned);
        if matches!(
            (api_version.as_str(), kind.as_str()),
            ("apps/v1", "Deployment") | ("v1", "ServiceAccount")
        ) {
            default_namespace(&mut value);
        }
        match (api_version.as_str(), kind.as_str()) {
            ("apps/v1", "Deployment") => self.deployment(value, at),
            ("v1", "ServiceAccount") => match strict::decode::<ServiceAccount>(&value, Decoding::Strict) {
                Ok(_) if name.is_empty() => self.fail(&at, "ServiceAccount has no metadata.name"),
                Ok(_) => {
                    let ns = namespace.unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
                    if self.define("ServiceAccount", &ns, &name, &at) {
                        self.namespaced.push((ns.clone(), format!("ServiceAccount {ns}/{name}"), at));
                        self.service_accounts.insert((ns, name));
                    }
                }
                Err(e) => self.fail_field(&at, "ServiceAccount", &value, &e),
            },
            ("v1", "Node") => self.fail(
                &at,
                "Node objects are the cluster's own (`ambit up --nodes N` makes node1..nodeN); remove this one",
            ),
            _ => self.object(value, &kind, &api_version, at),
        }
    }

    /// An object of a kind `ambit-objects` reads (Pods among them).
    fn object(&mut self, mut value: Value, kind: &str, api_version: &str, at: Location) {
        if Kind::of(api_version, kind).is_some_and(Kind::is_namespaced) {
            default_namespace(&mut value);
        }
        let object = match Object::decode(value.clone(), Decoding::Strict) {
            Ok(o) => o,
            Err(ObjectError::UnknownKind { .. }) => {
                return self.fail(
                    &at,
                    format!("kind {kind} ({api_version}) is not one `ambit up` runs; it reads {KINDS}"),
                );
            }
            Err(e) => {
                let at = match &e {
                    ObjectError::Field { error, .. } => at.of_field(error),
                    _ => at,
                };
                return self.fail(&at, e.to_string());
            }
        };
        let key = object.key();
        if !self.define(key.kind.name(), &key.namespace, &key.name, &at) {
            return;
        }
        if key.kind.is_namespaced() {
            self.namespaced.push((key.namespace.clone(), key.to_string(), at.clone()));
        }
        match object {
            Object::Pod(pod) => {
                let labels = pod.metadata.labels.clone().unwrap_or_default();
                let annotations = pod.metadata.annotations.clone().unwrap_or_default();
                let spec = value.get("spec").cloned().unwrap_or(Value::Null);
                if let Some(t) =
                    self.template(&key.namespace, &key.name, None, labels, annotations, spec, &at)
                {
                    self.out.pods.push(t);
                }
            }
            Object::Namespace(_) => {
                self.out.namespaces.insert(key.name.clone());
                self.out.passed.push(passed(key, value, at));
            }
            _ => self.out.passed.push(passed(key, value, at)),
        }
    }

    fn deployment(&mut self, value: Value, at: Location) {
        let d: Deployment = match strict::decode(&value, Decoding::Strict) {
            Ok(d) => d,
            Err(e) => return self.fail_field(&at, "Deployment", &value, &e),
        };
        let Some(name) = d.metadata.name.clone().filter(|n| !n.is_empty()) else {
            return self.fail(&at, "Deployment has no metadata.name");
        };
        let ns = d.metadata.namespace.clone().unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        if !self.define("Deployment", &ns, &name, &at) {
            return;
        }
        self.namespaced.push((ns.clone(), format!("Deployment {ns}/{name}"), at.clone()));
        let Some(spec) = d.spec else { return self.fail(&at, format!("Deployment {ns}/{name} has no spec")) };
        let replicas = spec.replicas.unwrap_or(1);
        if !(0..=MAX_REPLICAS).contains(&replicas) {
            return self.fail(
                &at,
                format!(
                    "Deployment {ns}/{name} asks for {replicas} replicas; `ambit up` runs 0 to {MAX_REPLICAS}"
                ),
            );
        }
        let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        // The selector must select the template, as the API server requires.
        let selects = spec
            .selector
            .match_labels
            .as_ref()
            .is_some_and(|want| !want.is_empty() && want.iter().all(|(k, v)| labels.get(k) == Some(v)));
        if !selects || spec.selector.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
            return self.fail(
                &at,
                format!(
                    "Deployment {ns}/{name}: spec.selector.matchLabels must be set and match spec.template.metadata.labels"
                ),
            );
        }
        let annotations =
            spec.template.metadata.as_ref().and_then(|m| m.annotations.clone()).unwrap_or_default();
        let pod_spec = value.pointer("/spec/template/spec").cloned().unwrap_or(Value::Null);
        for i in 0..replicas {
            let pod = format!("{name}-{i}");
            if let Some(t) = self.template(
                &ns,
                &pod,
                Some(&name),
                labels.clone(),
                annotations.clone(),
                pod_spec.clone(),
                &at,
            ) {
                self.out.pods.push(t);
            } else {
                break;
            }
        }
    }

    /// Records `kind ns/name` at `at`; false (and an error) when it was defined before.
    fn define(&mut self, kind: &str, namespace: &str, name: &str, at: &Location) -> bool {
        let key = (kind.to_owned(), namespace.to_owned(), name.to_owned());
        if let Some(first) = self.seen.get(&key) {
            let shown = if namespace.is_empty() { name.to_owned() } else { format!("{namespace}/{name}") };
            let problem = format!("{kind} {shown} is defined twice: also at {first}; delete one of them");
            self.fail(at, problem);
            return false;
        }
        self.seen.insert(key, at.clone());
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn template(
        &mut self,
        namespace: &str,
        name: &str,
        deployment: Option<&str>,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        spec_value: Value,
        at: &Location,
    ) -> Option<PodTemplate> {
        let what = format!("pod {namespace}/{name}");
        if name.len() > MAX_POD_NAME
            || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            self.fail(at, format!("{what}: a pod name is at most {MAX_POD_NAME} characters of [a-z0-9-]"));
            return None;
        }
        let spec: PodSpec = match serde_json::from_value(spec_value.clone()) {
            Ok(s) => s,
            Err(e) => {
                self.fail(at, format!("{what}: the pod spec does not decode: {e}"));
                return None;
            }
        };
        let mut containers = Vec::new();
        for c in &spec.containers {
            let mut argv = c.command.clone().unwrap_or_default();
            argv.extend(c.args.clone().unwrap_or_default());
            if argv.is_empty() {
                self.fail(
                    at,
                    format!(
                        "{what}: container {:?} has no command; `ambit up` runs commands in the pod's network namespace, not images (e.g. command: [ambit, app, echo])",
                        c.name
                    ),
                );
                return None;
            }
            let mut env = Vec::new();
            for e in c.env.iter().flatten() {
                match (&e.value, &e.value_from) {
                    (_, Some(_)) => {
                        self.fail(at, format!("{what}: env {:?}: only literal values are supported", e.name));
                        return None;
                    }
                    (v, None) => env.push((e.name.clone(), v.clone().unwrap_or_default())),
                }
            }
            let ports = c
                .ports
                .iter()
                .flatten()
                .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
                .filter_map(|p| u16::try_from(p.container_port).ok())
                .collect();
            let ready_http = match c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()) {
                None => None,
                Some(get) => match &get.port {
                    IntOrString::Int(port) if u16::try_from(*port).is_ok_and(|p| p > 0) => Some((
                        u16::try_from(*port).unwrap_or_default(),
                        get.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".to_owned()),
                    )),
                    other => {
                        self.fail(
                            at,
                            format!(
                                "{what}: container {:?}: readinessProbe.httpGet.port {other:?} is not a port number (named ports are not supported)",
                                c.name
                            ),
                        );
                        return None;
                    }
                },
            };
            containers.push(Container { name: c.name.clone(), argv, env, ports, ready_http });
        }
        if containers.is_empty() {
            self.fail(at, format!("{what} has no containers"));
            return None;
        }
        let digest = fnv1a(&[namespace, &spec_value.to_string(), &format!("{labels:?}{annotations:?}")]);
        Some(PodTemplate {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            deployment: deployment.map(str::to_owned),
            labels,
            annotations,
            service_account: spec
                .service_account_name
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".to_owned()),
            node: spec.node_name.clone().filter(|n| !n.is_empty()),
            containers,
            spec: spec_value,
            digest,
            at: at.clone(),
        })
    }

    fn finish(mut self, nodes: &[String]) -> Result<Desired, DesiredErrors> {
        self.out.namespaces.insert(DEFAULT_NAMESPACE.to_owned());
        self.out.namespaces.insert(SYSTEM_NAMESPACE.to_owned());
        for (ns, what, at) in std::mem::take(&mut self.namespaced) {
            if !self.out.namespaces.contains(&ns) {
                self.fail(&at, format!("{what} is in namespace {ns:?}, which no Namespace object defines"));
            }
        }
        let pods = std::mem::take(&mut self.out.pods);
        for p in &pods {
            if p.service_account != "default"
                && !self.service_accounts.contains(&(p.namespace.clone(), p.service_account.clone()))
            {
                self.fail(
                    &p.at,
                    format!(
                        "pod {}/{}: service account {:?} is not defined (add a ServiceAccount in namespace {})",
                        p.namespace, p.name, p.service_account, p.namespace
                    ),
                );
            }
            if let Some(n) = &p.node
                && !nodes.contains(n)
            {
                self.fail(
                    &p.at,
                    format!(
                        "pod {}/{}: nodeName {n:?} is not a node of this cluster ({})",
                        p.namespace,
                        p.name,
                        nodes.join(", ")
                    ),
                );
            }
        }
        if pods.len() > MAX_PODS {
            let at = pods.last().map(|p| p.at.clone()).unwrap_or(Location::new(PathBuf::new(), 0));
            self.fail(&at, format!("{} pods asked for; `ambit up` runs at most {MAX_PODS}", pods.len()));
        }
        self.out.pods = pods;
        self.cluster_ips();
        if self.errors.is_empty() { Ok(self.out) } else { Err(DesiredErrors(self.errors)) }
    }

    /// Checks the cluster IPs given and gives one to each Service without (see the module's
    /// documentation).
    fn cluster_ips(&mut self) {
        let (base, len) = SERVICE_RANGE;
        let size = 1u32 << (32 - len);
        let base = u32::from(base);
        let mut taken: BTreeMap<u32, String> = BTreeMap::new();
        let mut wanting = Vec::new();
        let mut problems = Vec::new();
        for (i, p) in self.out.passed.iter().enumerate() {
            if p.kind != Kind::Service
                || p.value.pointer("/spec/type").and_then(Value::as_str) == Some("ExternalName")
            {
                continue;
            }
            let what = format!("Service {}/{}", p.namespace, p.name);
            match cluster_ip(&p.value) {
                None => wanting.push(i),
                Some("None") => {}
                Some(text) => match text.parse::<Ipv4Addr>() {
                    Err(_) => problems.push((
                        p.at.clone(),
                        format!("{what}: clusterIP {text:?} is not an IPv4 address (or None, for a headless Service)"),
                    )),
                    Ok(ip) if u32::from(ip).wrapping_sub(base) >= size => problems.push((
                        p.at.clone(),
                        format!(
                            "{what}: clusterIP {ip} is outside the cluster's service range {}/{len}",
                            SERVICE_RANGE.0
                        ),
                    )),
                    Ok(ip) => {
                        if let Some(other) = taken.get(&u32::from(ip)) {
                            problems.push((p.at.clone(), format!("{what}: clusterIP {ip} is taken by {other}")));
                        } else {
                            taken.insert(u32::from(ip), what);
                        }
                    }
                },
            }
        }
        for (at, problem) in problems {
            self.fail(&at, problem);
        }
        // In name order, so that what a Service gets does not depend on the order of files.
        wanting.sort_by(|a, b| {
            let (a, b) = (&self.out.passed[*a], &self.out.passed[*b]);
            (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
        });
        let half = size / 2;
        for i in wanting {
            let p = &mut self.out.passed[i];
            // The upper half without its last address (the range's broadcast address).
            let span = half - 1;
            let start = u32::try_from(fnv1a(&[&p.namespace, &p.name]) % u64::from(span)).unwrap_or(0);
            let Some(offset) =
                (0..span).map(|k| half + (start + k) % span).find(|o| !taken.contains_key(&(base + o)))
            else {
                let at = p.at.clone();
                let problem = format!("Service {}/{}: the service range is full", p.namespace, p.name);
                self.fail(&at, problem);
                continue;
            };
            let ip = Ipv4Addr::from(base + offset);
            taken.insert(base + offset, format!("Service {}/{}", p.namespace, p.name));
            if let Some(spec) = p.value.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("clusterIP".into(), Value::String(ip.to_string()));
                spec.insert("clusterIPs".into(), Value::Array(vec![Value::String(ip.to_string())]));
            }
        }
    }
}

/// A Service's `spec.clusterIP` (else the first of `spec.clusterIPs`); `None` when neither is
/// set. `"None"` is a headless Service.
pub fn cluster_ip(service: &Value) -> Option<&str> {
    let spec = service.get("spec")?;
    spec.get("clusterIP")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| spec.pointer("/clusterIPs/0").and_then(Value::as_str).filter(|s| !s.is_empty()))
}

fn is_service(v: &Value) -> bool {
    v.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && v.get("kind").and_then(Value::as_str) == Some("Service")
}

/// Gives each Service of `ours` without a cluster IP the one its object in `current` has (as the
/// API server keeps a Service's address when it is applied again without one).
pub fn keep_cluster_ips(ours: &mut [(Value, Location)], current: &[(Value, Location)]) {
    for (v, _) in ours.iter_mut().filter(|(v, _)| is_service(v) && cluster_ip(v).is_none()) {
        let file = object_file(v);
        let kept =
            current.iter().find(|(c, _)| is_service(c) && object_file(c) == file).and_then(|(c, _)| {
                Some((c.pointer("/spec/clusterIP")?.clone(), c.pointer("/spec/clusterIPs").cloned()))
            });
        if let Some((ip, ips)) = kept
            && let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut)
        {
            spec.insert("clusterIP".into(), ip);
            if let Some(ips) = ips {
                spec.insert("clusterIPs".into(), ips);
            }
        }
    }
}

/// Writes into each Service of `documents` without a cluster IP the one the check gave it in
/// `d`, so that the object kept is the one that runs.
pub fn fill_cluster_ips(documents: &mut [(Value, Location)], d: &Desired) {
    for (v, _) in documents.iter_mut().filter(|(v, _)| is_service(v) && cluster_ip(v).is_none()) {
        let ns = v.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(DEFAULT_NAMESPACE);
        let name = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let Some(p) =
            d.passed.iter().find(|p| p.kind == Kind::Service && p.namespace == ns && p.name == name)
        else {
            continue;
        };
        let Some(given) = p.value.get("spec").cloned() else { continue };
        if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
            for field in ["clusterIP", "clusterIPs"] {
                if let Some(x) = given.get(field) {
                    spec.insert(field.into(), x.clone());
                }
            }
        }
    }
}

/// Namespaced objects without a namespace live in `default`, as `kubectl apply` puts them.
fn default_namespace(value: &mut Value) {
    if value.pointer("/metadata/namespace").is_none()
        && let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("namespace".into(), Value::String(DEFAULT_NAMESPACE.into()));
    }
}

fn passed(key: ambit_objects::ObjectKey, value: Value, at: Location) -> Passed {
    Passed { kind: key.kind, namespace: key.namespace, name: key.name, value, at }
}

/// A stable 64-bit digest (FNV-1a) of some strings.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

pub mod waypoints;

#[cfg(test)]
mod tests;
