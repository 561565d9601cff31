//! The invariants every rendering of the ambit chart must hold. [`check`] returns every
//! violation as a sentence, so a test can also show that a broken object is caught.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use ambit_objects::k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use ambit_objects::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use ambit_objects::{Kind, ObjectMeta};

use super::pods::{self, Backing, Component, backing, component, describe, env, env_field, host_path};
use super::render::{NAMESPACE, Release};
use super::values::{Expect, Placement};

/// Every violation of the chart's invariants in `r`, rendered with values that expect `e`.
pub fn check(r: &Release, e: &Expect) -> Vec<String> {
    let mut p = Problems::default();
    objects(r, e, &mut p);
    rbac(r, e, &mut p);
    for (what, template, comp) in workloads(r) {
        for c in &template.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default() {
            container(&what, c, comp, e, &mut p);
        }
    }
    let (agent_name, proxy_name) = (e.name("ambit-agent"), e.name("ztunnel"));
    if let Some(spec) = r.pod_spec(&agent_name) {
        agent(&spec, e, &mut p);
    }
    if let Some(spec) = r.pod_spec(&proxy_name) {
        proxy(r, &spec, e, &mut p);
    }
    if let (Some(agent), Some(proxy)) = (r.pod_spec(&agent_name), r.pod_spec(&proxy_name)) {
        agent_and_proxy(r, e, &agent, &proxy, &mut p);
    }
    // The agent: never two on a node. The proxy: the new one before the old one leaves.
    rolling(r, &agent_name, 0, 1, &mut p);
    rolling(r, &proxy_name, 1, 0, &mut p);
    if !e.istiod {
        control(r, e, &mut p);
    }
    ca(r, e, &mut p);
    p.0
}

#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn ensure(&mut self, ok: bool, problem: impl FnOnce() -> String) {
        if !ok {
            self.0.push(problem());
        }
    }
}

/// The capabilities each component adds (after dropping ALL), exactly, for the agent's capture
/// backend: NET_RAW only for iptables (iptables-legacy's raw sockets).
pub fn capabilities(c: Component, capture_backend: &str) -> &'static [&'static str] {
    match (c, capture_backend) {
        (Component::Agent, "iptables") => &["NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"],
        (Component::Agent, _) => &["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"],
        (Component::Proxy, _) => &["NET_ADMIN", "SYS_ADMIN"],
        (Component::Control, _) => &[],
    }
}

/// `(apiGroup, resource, verb)` the agent may use: what it watches, and the annotation patch.
pub fn agent_permissions() -> BTreeSet<(String, String, String)> {
    let mut out = watch(&ambit_agent::kube::filter("node").kinds.into_iter().collect::<Vec<_>>());
    out.insert((String::new(), "pods/status".into(), "patch".into()));
    out
}

/// `(apiGroup, resource, verb)` the control plane may use: it watches every kind it reads,
/// creates TokenReviews, patches the AuthorizationPolicies' status (ZtunnelAccepted), and
/// deploys waypoints: server-side apply (create, patch) of Deployments, Services,
/// ServiceAccounts and the root ConfigMap, and the Gateways' status.
pub fn control_permissions() -> BTreeSet<(String, String, String)> {
    let mut out = watch(Kind::ALL);
    out.insert(("authentication.k8s.io".into(), "tokenreviews".into(), "create".into()));
    out.insert(("security.istio.io".into(), "authorizationpolicies/status".into(), "patch".into()));
    for (group, resource) in
        [("apps", "deployments"), ("", "services"), ("", "serviceaccounts"), ("", "configmaps")]
    {
        for verb in ["create", "patch"] {
            out.insert((group.into(), resource.into(), verb.into()));
        }
    }
    out.insert(("gateway.networking.k8s.io".into(), "gateways/status".into(), "patch".into()));
    out
}

fn watch(kinds: &[Kind]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for &kind in kinds {
        let resource = ambit_objects::kube::resource(kind);
        let plural = resource.split('.').next().unwrap_or_default().to_owned();
        for verb in ["get", "list", "watch"] {
            out.insert((kind.group().to_owned(), plural.clone(), verb.to_owned()));
        }
    }
    out
}

fn name(m: &ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or_default()
}

fn names<'a, T: 'a>(items: &'a [T], meta: impl Fn(&'a T) -> &'a ObjectMeta) -> BTreeSet<String> {
    items.iter().map(|i| name(meta(i)).to_owned()).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The objects of the mode, all in the release namespace.
fn objects(r: &Release, e: &Expect, p: &mut Problems) {
    let control = !e.istiod;
    let (agent, proxy, ctl) = (e.name("ambit-agent"), e.name("ztunnel"), e.name("ambit-control"));
    let want_sa = if control { set(&[&agent, &proxy, &ctl]) } else { set(&[&agent, &proxy]) };
    let got = names(&r.service_accounts, |o| &o.metadata);
    p.ensure(got == want_sa, || format!("ServiceAccounts {got:?}, want {want_sa:?}"));
    let got = names(&r.daemon_sets, |o| &o.metadata);
    p.ensure(got == set(&[&agent, &proxy]), || format!("DaemonSets {got:?}, want {agent} and {proxy}"));
    let want = if control { set(&[&ctl]) } else { BTreeSet::new() };
    for (kind, got) in [
        ("Deployments", names(&r.deployments, |o| &o.metadata)),
        ("Services", names(&r.services, |o| &o.metadata)),
        ("PodDisruptionBudgets", names(&r.pdbs, |o| &o.metadata)),
    ] {
        p.ensure(got == want, || format!("{kind} {got:?}, want {want:?}"));
    }
    let want = if e.ca_generated { set(&["cacerts"]) } else { BTreeSet::new() };
    let got = names(&r.secrets, |o| &o.metadata);
    p.ensure(got == want, || format!("Secrets {got:?}, want {want:?}"));
    let want = if control { set(&[&e.root_config_map()]) } else { BTreeSet::new() };
    let got = names(&r.config_maps, |o| &o.metadata);
    p.ensure(got == want, || format!("ConfigMaps {got:?}, want {want:?} (mode=istiod uses istiod's)"));
    let namespaced = r
        .service_accounts
        .iter()
        .map(|o| &o.metadata)
        .chain(r.daemon_sets.iter().map(|o| &o.metadata))
        .chain(r.deployments.iter().map(|o| &o.metadata))
        .chain(r.services.iter().map(|o| &o.metadata))
        .chain(r.pdbs.iter().map(|o| &o.metadata))
        .chain(r.secrets.iter().map(|o| &o.metadata))
        .chain(r.config_maps.iter().map(|o| &o.metadata))
        .chain(r.roles.iter().map(|o| &o.metadata))
        .chain(r.role_bindings.iter().map(|o| &o.metadata));
    for m in namespaced {
        p.ensure(m.namespace.as_deref() == Some(NAMESPACE), || {
            format!("{} is in namespace {:?}, not the release's {NAMESPACE}", name(m), m.namespace)
        });
    }
}

/// Exact permissions, no wildcards, each role bound to its component's account only.
fn rbac(r: &Release, e: &Expect, p: &mut Problems) {
    agent_role(r, e, p);
    let (agent, ctl) = (e.name("ambit-agent"), e.name("ambit-control"));
    let mut want = BTreeMap::from([(agent.clone(), (agent_permissions(), agent.clone()))]);
    if !e.istiod {
        want.insert(ctl.clone(), (control_permissions(), ctl.clone()));
    }
    let got = names(&r.cluster_roles, |o| &o.metadata);
    let want_names: BTreeSet<String> = want.keys().map(|k| k.to_string()).collect();
    p.ensure(got == want_names, || format!("ClusterRoles {got:?}, want {want_names:?}"));
    for role in &r.cluster_roles {
        let mut granted = BTreeSet::new();
        for rule in role.rules.iter().flatten() {
            p.ensure(rule.non_resource_urls.is_none() && rule.resource_names.is_none(), || {
                format!("ClusterRole {}: a rule with nonResourceURLs or resourceNames", name(&role.metadata))
            });
            for g in rule.api_groups.iter().flatten() {
                for res in rule.resources.iter().flatten() {
                    for v in &rule.verbs {
                        for field in [g, res, v] {
                            p.ensure(!field.contains('*'), || {
                                format!(
                                    "ClusterRole {} grants a wildcard ({g:?}, {res:?}, {v:?})",
                                    name(&role.metadata)
                                )
                            });
                        }
                        granted.insert((g.clone(), res.clone(), v.clone()));
                    }
                }
            }
        }
        if let Some((need, _)) = want.get(name(&role.metadata)) {
            let extra: Vec<_> = granted.difference(need).collect();
            let missing: Vec<_> = need.difference(&granted).collect();
            p.ensure(extra.is_empty() && missing.is_empty(), || {
                format!(
                    "ClusterRole {}: grants {extra:?} beyond its need, lacks {missing:?}",
                    name(&role.metadata)
                )
            });
        }
    }
    let bound: BTreeSet<String> = names(&r.cluster_role_bindings, |o| &o.metadata);
    p.ensure(bound == want_names, || format!("ClusterRoleBindings {bound:?}, want {want_names:?}"));
    for b in &r.cluster_role_bindings {
        let role = &b.role_ref.name;
        let subjects: Vec<(String, String, Option<String>)> = b
            .subjects
            .iter()
            .flatten()
            .map(|s| (s.kind.clone(), s.name.clone(), s.namespace.clone()))
            .collect();
        let account = want.get(role.as_str()).map(|(_, sa)| sa.as_str()).unwrap_or("?");
        let expected = vec![("ServiceAccount".to_owned(), account.to_owned(), Some(NAMESPACE.to_owned()))];
        p.ensure(b.role_ref.kind == "ClusterRole" && subjects == expected, || {
            format!(
                "ClusterRoleBinding {} binds {role} to {subjects:?}, want only {expected:?}",
                name(&b.metadata)
            )
        });
    }
}

/// The one namespaced permission: the agent reads its own DaemonSet (get, and list and watch
/// by name), to tell an uninstall from an upgrade when it stops.
fn agent_role(r: &Release, e: &Expect, p: &mut Problems) {
    let agent = e.name("ambit-agent");
    let want = set(&[&agent]);
    let got = names(&r.roles, |o| &o.metadata);
    p.ensure(got == want, || {
        format!("Roles {got:?}, want {want:?}: only the agent needs a namespaced permission (its DaemonSet)")
    });
    let got = names(&r.role_bindings, |o| &o.metadata);
    p.ensure(got == want, || format!("RoleBindings {got:?}, want {want:?}"));
    for role in &r.roles {
        let rules: Vec<[Vec<String>; 4]> = role
            .rules
            .iter()
            .flatten()
            .map(|r| {
                [
                    r.api_groups.clone().unwrap_or_default(),
                    r.resources.clone().unwrap_or_default(),
                    r.resource_names.clone().unwrap_or_default(),
                    r.verbs.clone(),
                ]
            })
            .collect();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let expected = vec![[
            strings(&["apps"]),
            strings(&["daemonsets"]),
            vec![agent.clone()],
            strings(&["get", "list", "watch"]),
        ]];
        p.ensure(rules == expected, || {
            format!("Role {}: rules {rules:?}, want only {expected:?}", name(&role.metadata))
        });
    }
    for b in &r.role_bindings {
        let subjects: Vec<(String, String, Option<String>)> = b
            .subjects
            .iter()
            .flatten()
            .map(|s| (s.kind.clone(), s.name.clone(), s.namespace.clone()))
            .collect();
        let expected = vec![("ServiceAccount".to_owned(), agent.clone(), Some(NAMESPACE.to_owned()))];
        p.ensure(
            (b.role_ref.kind.as_str(), b.role_ref.name.as_str()) == ("Role", agent.as_str())
                && subjects == expected,
            || {
                format!(
                    "RoleBinding {} binds {} {} to {subjects:?}, want Role {agent} to {expected:?}",
                    name(&b.metadata),
                    b.role_ref.kind,
                    b.role_ref.name
                )
            },
        );
    }
}

/// Every pod template with its owner and the component of its containers.
fn workloads(r: &Release) -> Vec<(String, PodTemplateSpec, Option<Component>)> {
    let mut out = Vec::new();
    for d in &r.daemon_sets {
        if let Some(s) = &d.spec {
            out.push((format!("DaemonSet {}", name(&d.metadata)), s.template.clone()));
        }
    }
    for d in &r.deployments {
        if let Some(s) = &d.spec {
            out.push((format!("Deployment {}", name(&d.metadata)), s.template.clone()));
        }
    }
    out.into_iter()
        .map(|(what, t)| {
            let comp = t.spec.as_ref().and_then(|s| s.containers.first()).and_then(component);
            (what, t, comp)
        })
        .collect()
}

/// Image pinned, least privilege, probes on declared ports.
fn container(what: &str, c: &Container, comp: Option<Component>, e: &Expect, p: &mut Problems) {
    let at = format!("{what} container {}", c.name);
    let Some(comp) = comp.filter(|k| component(c) == Some(*k)) else {
        p.0.push(format!("{at}: runs {:?} {:?}, not an Ambit component", c.command, c.args));
        return;
    };
    let image = c.image.clone().unwrap_or_default();
    let repo = image.split(['@', ':']).next().unwrap_or_default().rsplit('/').next().unwrap_or_default();
    let prefix = if e.registry.is_empty() { String::new() } else { format!("{}/", e.registry) };
    let want = match (&e.digest, &e.tag) {
        (Some(d), _) => format!("{prefix}{repo}@{d}"),
        (None, Some(t)) => format!("{prefix}{repo}:{t}"),
        (None, None) => String::new(),
    };
    p.ensure(image == want && !image.ends_with(":latest"), || {
        format!("{at}: image {image:?}, want {want:?}")
    });
    let sc = c.security_context.clone().unwrap_or_default();
    p.ensure(sc.privileged == Some(false), || format!("{at}: privileged is {:?}, want false", sc.privileged));
    p.ensure(sc.allow_privilege_escalation == Some(false), || {
        format!("{at}: allowPrivilegeEscalation is {:?}, want false", sc.allow_privilege_escalation)
    });
    p.ensure(sc.read_only_root_filesystem == Some(true), || {
        format!("{at}: readOnlyRootFilesystem is {:?}, want true", sc.read_only_root_filesystem)
    });
    // The control plane's pod sets it for the pod; the node components' containers their own.
    if comp != Component::Control {
        let seccomp = sc.seccomp_profile.as_ref().map(|s| s.type_.as_str());
        p.ensure(seccomp == Some("RuntimeDefault"), || {
            format!("{at}: seccomp profile {seccomp:?}, want RuntimeDefault")
        });
    }
    let caps = sc.capabilities.unwrap_or_default();
    let drop: Vec<String> = caps.drop.unwrap_or_default();
    p.ensure(drop == ["ALL"], || format!("{at}: capabilities drop {drop:?}, want [ALL]"));
    let add: BTreeSet<String> = caps.add.unwrap_or_default().into_iter().collect();
    let want_add = set(capabilities(comp, &e.capture_backend));
    p.ensure(add == want_add, || format!("{at}: capabilities add {add:?}, want exactly {want_add:?}"));
    p.ensure(c.resources.as_ref().and_then(|r| r.requests.as_ref()).is_some(), || {
        format!("{at}: no resource requests")
    });
    for (kind, probe) in [("readiness", &c.readiness_probe), ("liveness", &c.liveness_probe)] {
        if let Some(pr) = probe {
            let port = pr.http_get.as_ref().map(|h| &h.port).or(pr.tcp_socket.as_ref().map(|t| &t.port));
            p.ensure(port.and_then(|port| pods::probe_port(c, port)).is_some(), || {
                format!("{at}: the {kind} probe's port is not one of the container's ports")
            });
        }
    }
    let probes = (describe(c, c.readiness_probe.as_ref()), describe(c, c.liveness_probe.as_ref()));
    let want = match comp {
        Component::Agent => ("GET /readyz :8000", "GET /healthz :8000"),
        Component::Proxy => ("GET /healthz/ready :15021", "TCP :15021"),
        Component::Control => ("GET /ready :8080", "none"),
    };
    p.ensure((probes.0.as_str(), probes.1.as_str()) == want, || {
        format!("{at}: probes (readiness, liveness) {probes:?}, want {want:?}")
    });
}

/// Node-wide: not on the host's namespaces, Linux nodes only, and the priority, node selector
/// and tolerations the values give (by default: system-node-critical, every taint tolerated).
fn node_pod(what: &str, spec: &PodSpec, want: &Placement, p: &mut Problems) {
    p.ensure(spec.host_network != Some(true), || format!("{what}: hostNetwork"));
    p.ensure(spec.host_pid != Some(true) && spec.host_ipc != Some(true), || {
        format!("{what}: hostPID or hostIPC")
    });
    p.ensure(spec.priority_class_name == want.priority_class, || {
        format!("{what}: priorityClassName {:?}, want {:?}", spec.priority_class_name, want.priority_class)
    });
    let json = |v: Option<serde_json::Value>| v.filter(|v| !v.is_null() && v != &serde_json::json!([]));
    let tolerations = json(serde_json::to_value(&spec.tolerations).ok());
    p.ensure(tolerations == json(Some(want.tolerations.clone())), || {
        format!("{what}: tolerations {tolerations:?}, want {:?}", want.tolerations)
    });
    let selector = json(serde_json::to_value(&spec.node_selector).ok());
    p.ensure(selector == json(Some(want.node_selector.clone())), || {
        format!("{what}: nodeSelector {selector:?}, want {:?}", want.node_selector)
    });
    let linux = spec.node_selector.as_ref().and_then(|n| n.get("kubernetes.io/os")).map(String::as_str);
    p.ensure(linux == Some("linux"), || format!("{what}: nodeSelector kubernetes.io/os is {linux:?}"));
}

fn rolling(r: &Release, ds: &str, surge: i32, unavailable: i32, p: &mut Problems) {
    let s = r.daemon_set(ds).and_then(|d| d.spec.as_ref()).and_then(|s| s.update_strategy.clone());
    let ru = s.as_ref().and_then(|s| s.rolling_update.clone());
    let got = (
        s.as_ref().and_then(|s| s.type_.clone()),
        ru.as_ref().and_then(|r| r.max_surge.clone()),
        ru.as_ref().and_then(|r| r.max_unavailable.clone()),
    );
    let want = (
        Some("RollingUpdate".to_owned()),
        Some(IntOrString::Int(surge)),
        Some(IntOrString::Int(unavailable)),
    );
    p.ensure(got == want, || format!("DaemonSet {ds}: update strategy {got:?}, want {want:?}"));
}

fn agent(spec: &PodSpec, e: &Expect, p: &mut Problems) {
    let what = &format!("DaemonSet {}", e.name("ambit-agent"));
    node_pod(what, spec, &e.agent_placement, p);
    let Some(c) = spec.containers.first() else { return };
    for (var, field) in [
        ("NODE_NAME", "spec.nodeName"),
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        p.ensure(env_field(c, var) == Some(field), || {
            format!("{what}: {var} is not the downward API's {field}")
        });
    }
    // The DaemonSet the agent asks about when it stops (uninstall or upgrade) is its own, and
    // its Role lets it read exactly that one (checked in `rbac`).
    let own = e.name("ambit-agent");
    p.ensure(env(c, "AMBIT_AGENT_DAEMONSET") == Some(own.as_str()), || {
        format!(
            "{what}: AMBIT_AGENT_DAEMONSET {:?}, want its own DaemonSet {own}",
            env(c, "AMBIT_AGENT_DAEMONSET")
        )
    });
    p.ensure(env(c, "AMBIT_CAPTURE_BACKEND") == Some(e.capture_backend.as_str()), || {
        format!(
            "{what}: AMBIT_CAPTURE_BACKEND {:?}, want {}",
            env(c, "AMBIT_CAPTURE_BACKEND"),
            e.capture_backend
        )
    });
    let host = |var: &str| env(c, var).and_then(|path| host_path(spec, c, path));
    for (var, want) in [
        ("MOUNTED_CNI_NET_DIR", e.cni_conf_dir.as_str()),
        ("AMBIT_CNI_BIN_DIR", e.cni_bin_dir.as_str()),
        ("AMBIT_PROC_ROOT", "/proc"),
        ("AMBIT_HOST_NETNS", "/proc/1/ns/net"),
    ] {
        p.ensure(host(var) == Some(PathBuf::from(want)), || {
            format!("{what}: {var}={:?} is on the host at {:?}, want {want}", env(c, var), host(var))
        });
    }
    // The plugin runs on the host and finds the agent's socket at the path the agent names.
    let run = env(c, "CNI_AGENT_RUN_DIR").unwrap_or("/var/run/ambit");
    p.ensure(host("CNI_AGENT_RUN_DIR") == Some(PathBuf::from(run)), || {
        format!(
            "{what}: CNI_AGENT_RUN_DIR {run} is not the same path on the host ({:?})",
            host("CNI_AGENT_RUN_DIR")
        )
    });
    // A CNI_NETNS from the runtime, under the agent's host prefix.
    let prefix = env(c, "AMBIT_HOST_PREFIX").unwrap_or("/");
    let netns = format!("{}/cni-0123", e.netns_dir);
    let inside = format!("{}/{}", prefix.trim_end_matches('/'), netns.trim_start_matches('/'));
    let (b, mount) = backing(spec, c, &inside);
    p.ensure(b == Backing::Host(PathBuf::from(&netns)), || {
        format!("{what}: CNI_NETNS {netns} is opened as {inside}, which is {b:?}")
    });
    p.ensure(mount.and_then(|m| m.mount_propagation.as_deref()) == Some("HostToContainer"), || {
        format!("{what}: the netns mount does not propagate new namespaces (HostToContainer)")
    });
    let proc_mount = backing(spec, c, "/host/proc").1;
    p.ensure(proc_mount.and_then(|m| m.read_only) == Some(true), || {
        format!("{what}: /host/proc is not read-only")
    });
    // Only these host paths (and those agent.volumes adds), nothing broader.
    let hosts: BTreeSet<String> =
        spec.volumes.iter().flatten().filter_map(|v| v.host_path.as_ref()).map(|h| h.path.clone()).collect();
    let mut want: BTreeSet<String> = [
        e.cni_bin_dir.as_str(),
        e.cni_conf_dir.as_str(),
        "/proc",
        e.netns_dir.as_str(),
        run,
        "/var/run/ztunnel",
    ]
    .map(String::from)
    .into();
    want.extend(e.agent_extra_host_paths.iter().cloned());
    p.ensure(hosts == want, || format!("{what}: host paths {hosts:?}, want {want:?}"));
}

fn proxy(r: &Release, spec: &PodSpec, e: &Expect, p: &mut Problems) {
    let own = e.name("ztunnel");
    let what = &format!("DaemonSet {own}");
    node_pod(what, spec, &e.proxy_placement, p);
    let template = r.daemon_set(&own).and_then(|d| d.spec.as_ref()).map(|s| s.template.clone());
    let labels = template.and_then(|t| t.metadata).and_then(|m| m.labels).unwrap_or_default();
    p.ensure(labels.get("app").map(String::as_str) == Some("ztunnel"), || {
        format!("{what}: pods lack app=ztunnel")
    });
    p.ensure(spec.service_account_name.as_deref() == Some(own.as_str()), || {
        format!("{what}: service account {:?}, want {own}", spec.service_account_name)
    });
    p.ensure(spec.automount_service_account_token == Some(false), || {
        format!("{what}: mounts an API token; the proxy needs only its istio-ca token")
    });
    let Some(c) = spec.containers.first() else { return };
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("NODE_NAME", "spec.nodeName"),
        ("INSTANCE_IP", "status.podIP"),
        ("SERVICE_ACCOUNT", "spec.serviceAccountName"),
    ] {
        p.ensure(env_field(c, var) == Some(field), || {
            format!("{what}: {var} is not the downward API's {field}")
        });
    }
    p.ensure(env_field(c, "ZTUNNEL_CPU_LIMIT") == Some("limits.cpu"), || {
        format!("{what}: ZTUNNEL_CPU_LIMIT is not the container's limits.cpu")
    });
    for var in ["XDS_ADDRESS", "CA_ADDRESS"] {
        p.ensure(env(c, var) == Some(e.discovery_address.as_str()), || {
            format!("{what}: {var} {:?}, want {}", env(c, var), e.discovery_address)
        });
    }
    let sc = c.security_context.clone().unwrap_or_default();
    p.ensure((sc.run_as_user, sc.run_as_group) == (Some(0), Some(1337)), || {
        format!("{what}: runs as {:?}:{:?}, want 0:1337", sc.run_as_user, sc.run_as_group)
    });
    // The roots and the token where the proxy reads them (its defaults are relative).
    let root_default = "./var/run/secrets/istio/root-cert.pem";
    for var in ["XDS_ROOT_CA", "CA_ROOT_CA"] {
        let path = env(c, var).unwrap_or(root_default);
        let want = Backing::ConfigMap { name: e.root_config_map(), key: "root-cert.pem".into() };
        let got = backing(spec, c, path).0;
        p.ensure(got == want, || format!("{what}: {var} {path} is {got:?}, want {want:?}"));
    }
    let token = env(c, "AUTH_TOKEN").unwrap_or("./var/run/secrets/tokens/istio-token");
    match backing(spec, c, token).0 {
        Backing::Projected(v, file) => {
            let t = v.sources.iter().flatten().find_map(|s| s.service_account_token.clone());
            let got = t.map(|t| (t.audience, t.expiration_seconds, t.path));
            let want = Some((Some("istio-ca".to_owned()), Some(43200), file));
            p.ensure(got == want, || format!("{what}: token {token} is {got:?}, want {want:?}"));
        }
        other => p.0.push(format!("{what}: AUTH_TOKEN {token} is {other:?}, not a projected token")),
    }
    // The grace period outlasts the drain deadline, computed as the proxy does.
    let grace = spec.termination_grace_period_seconds.unwrap_or(30);
    let tgps = env(c, "TERMINATION_GRACE_PERIOD_SECONDS").map(|s| s.parse::<i64>().unwrap_or(-1));
    p.ensure(tgps.is_none_or(|t| t == grace), || {
        format!("{what}: TERMINATION_GRACE_PERIOD_SECONDS {tgps:?} is not the pod's {grace}")
    });
    let deadline = drain_deadline(env(c, "CONNECTION_TERMINATION_DEADLINE"), tgps);
    p.ensure(Duration::from_secs(grace.max(0) as u64) > deadline, || {
        format!(
            "{what}: terminationGracePeriodSeconds {grace} does not outlast the drain deadline {deadline:?}"
        )
    });
    let _ = e;
}

/// The proxy's drain deadline from its environment (ambit-proxy's rule).
pub fn drain_deadline(explicit: Option<&str>, grace: Option<i64>) -> Duration {
    if let Some(d) = explicit {
        return ambit_admin::parse_duration(d).unwrap_or(Duration::MAX);
    }
    match grace {
        Some(t) if t > 10 => Duration::from_secs(t as u64 - 5),
        Some(t) => Duration::from_secs((t.max(1) as u64 - 1).max(1)),
        None => Duration::from_secs(5),
    }
}

/// One ZDS socket, the proxy's pods exempt, the proxy's account trusted.
fn agent_and_proxy(r: &Release, e: &Expect, agent: &PodSpec, proxy: &PodSpec, p: &mut Problems) {
    let (Some(a), Some(x)) = (agent.containers.first(), proxy.containers.first()) else { return };
    let zds = "/var/run/ztunnel/ztunnel.sock";
    let server = host_path(agent, a, env(a, "ZTUNNEL_UDS_ADDRESS").unwrap_or(zds));
    let client = host_path(proxy, x, env(x, "INPOD_UDS").unwrap_or(zds));
    p.ensure(server.is_some() && server == client, || {
        format!("the agent serves ZDS at {server:?} on the host, the proxy dials {client:?}")
    });
    let labels = r
        .daemon_set(&e.name("ztunnel"))
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selector = env(a, "AMBIT_PROXY_POD_LABELS").unwrap_or("app=ztunnel");
    let selects = selector.split(',').all(|kv| {
        kv.split_once('=').is_some_and(|(k, v)| labels.get(k.trim()).map(String::as_str) == Some(v.trim()))
    });
    p.ensure(selects, || {
        format!("AMBIT_PROXY_POD_LABELS={selector} does not select the proxy's pods {labels:?}")
    });
}

fn control(r: &Release, e: &Expect, p: &mut Problems) {
    let what = &format!("Deployment {}", e.name("ambit-control"));
    let Some(d) = r.deployment(&e.name("ambit-control")) else { return };
    let Some(spec) = d.spec.as_ref() else { return };
    p.ensure(spec.replicas == Some(e.control_replicas), || {
        format!("{what}: replicas {:?}, want {}", spec.replicas, e.control_replicas)
    });
    let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    let Some(pod) = spec.template.spec.as_ref() else { return };
    let psc = pod.security_context.clone().unwrap_or_default();
    p.ensure(psc.run_as_non_root == Some(true) && psc.run_as_user == Some(65532), || {
        format!(
            "{what}: runs as {:?} (runAsNonRoot {:?}), want 65532, non-root",
            psc.run_as_user, psc.run_as_non_root
        )
    });
    let Some(c) = pod.containers.first() else { return };
    match backing(pod, c, env(c, "ROOT_CA_DIR").unwrap_or("./etc/cacerts")) {
        (Backing::Secret(s), m) => {
            p.ensure(s.secret_name.as_deref() == Some(e.ca_secret.as_str()), || {
                format!("{what}: ROOT_CA_DIR is Secret {:?}, want {}", s.secret_name, e.ca_secret)
            });
            p.ensure(s.default_mode == Some(0o440) && psc.fs_group == psc.run_as_group, || {
                format!(
                    "{what}: CA files mode {:?} for group {:?}, want 0440 for the process's group",
                    s.default_mode, psc.fs_group
                )
            });
            p.ensure(m.and_then(|m| m.read_only) == Some(true), || {
                format!("{what}: the CA is mounted writable")
            });
        }
        other => p.0.push(format!("{what}: ROOT_CA_DIR is {:?}, not the CA Secret", other.0)),
    }
    let state = env(c, "AMBIT_CONTROL_STATE_DIR").unwrap_or("/var/lib/ambit/control");
    let got = backing(pod, c, state).0;
    p.ensure(got == Backing::EmptyDir, || {
        format!("{what}: the state dir {state} is {got:?}, want an emptyDir")
    });
    let trusted = format!("{NAMESPACE}/{}", e.name("ztunnel"));
    p.ensure(env(c, "CA_TRUSTED_NODE_ACCOUNTS").is_none_or(|t| t == trusted), || {
        format!("{what}: CA_TRUSTED_NODE_ACCOUNTS {:?}, want {trusted}", env(c, "CA_TRUSTED_NODE_ACCOUNTS"))
    });
    // The proxies verify the serving certificate for the host they dial.
    let host = e.discovery_address.split(':').next().unwrap_or_default();
    let custom = env(c, "ISTIOD_CUSTOM_HOST").unwrap_or_default();
    p.ensure(custom.split(',').any(|h| h == host), || {
        format!("{what}: the serving certificate does not name {host} (ISTIOD_CUSTOM_HOST={custom:?})")
    });
    // The waypoints it deploys run the proxy's image (it holds `ambit waypoint`) and dial the
    // address the node proxies dial.
    let proxy_image = r
        .daemon_sets
        .iter()
        .find(|d| name(&d.metadata) == e.name("ztunnel"))
        .and_then(|d| d.spec.as_ref()?.template.spec.as_ref()?.containers.first()?.image.clone());
    p.ensure(proxy_image.is_some() && env(c, "AMBIT_WAYPOINT_IMAGE") == proxy_image.as_deref(), || {
        format!(
            "{what}: AMBIT_WAYPOINT_IMAGE {:?}, want the proxy's image {proxy_image:?}",
            env(c, "AMBIT_WAYPOINT_IMAGE")
        )
    });
    p.ensure(env(c, "AMBIT_WAYPOINT_CONTROL_ADDRESS") == Some(e.discovery_address.as_str()), || {
        format!(
            "{what}: AMBIT_WAYPOINT_CONTROL_ADDRESS {:?}, want {}",
            env(c, "AMBIT_WAYPOINT_CONTROL_ADDRESS"),
            e.discovery_address
        )
    });
    // The Service reaches the pods on 15012 and 15014, and only those.
    for s in &r.services {
        let sspec = s.spec.clone().unwrap_or_default();
        let selects = sspec.selector.unwrap_or_default().iter().all(|(k, v)| labels.get(k) == Some(v));
        p.ensure(selects, || format!("Service {}: does not select the control pods", name(&s.metadata)));
        let ports: BTreeMap<i32, Option<i32>> = sspec
            .ports
            .iter()
            .flatten()
            .map(|sp| (sp.port, sp.target_port.as_ref().and_then(|t| pods::probe_port(c, t))))
            .collect();
        let want = BTreeMap::from([(15012, Some(15012)), (15014, Some(15014))]);
        p.ensure(ports == want, || {
            format!("Service {}: port → container port {ports:?}, want {want:?}", name(&s.metadata))
        });
    }
    // A node drain never deadlocks, and with replicas one stays up.
    for b in &r.pdbs {
        let bs = b.spec.clone().unwrap_or_default();
        let selects = bs
            .selector
            .and_then(|s| s.match_labels)
            .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
        let n = e.control_replicas;
        let allowed = match (&bs.min_available, &bs.max_unavailable) {
            (Some(IntOrString::Int(m)), None) => n - m,
            (None, Some(IntOrString::Int(u))) => *u,
            _ => -1,
        };
        p.ensure(selects && allowed >= 1 && (n == 1 || n - allowed >= 1), || {
            format!(
                "PodDisruptionBudget {}: allows {allowed} of {n} replicas to be evicted (selects them: {selects}); \
                 want at least 1, and one left when there are several",
                name(&b.metadata)
            )
        });
    }
}

fn ca(r: &Release, e: &Expect, p: &mut Problems) {
    if e.istiod {
        return;
    }
    let cm = e.root_config_map();
    let root = r
        .config_maps
        .iter()
        .find(|c| name(&c.metadata) == cm)
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get("root-cert.pem"))
        .cloned()
        .unwrap_or_default();
    p.ensure(root.trim_start().starts_with("-----BEGIN CERTIFICATE-----"), || {
        format!("ConfigMap {cm}: root-cert.pem is not a PEM certificate: {root:?}")
    });
    if !e.ca_generated {
        return;
    }
    let Some(s) = r.secrets.iter().find(|s| name(&s.metadata) == "cacerts") else { return };
    let data = s.data.clone().unwrap_or_default();
    let keys: BTreeSet<String> = data.keys().cloned().collect();
    let want = set(&["ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem"]);
    p.ensure(keys == want, || {
        format!("Secret cacerts: keys {keys:?}, want Istio's plugged-CA layout {want:?}")
    });
    let keep =
        s.metadata.annotations.as_ref().and_then(|a| a.get("helm.sh/resource-policy")).map(String::as_str);
    p.ensure(keep == Some("keep"), || {
        "Secret cacerts: not kept on uninstall (helm.sh/resource-policy)".into()
    });
    let secret_root =
        data.get("root-cert.pem").map(|b| String::from_utf8_lossy(&b.0).into_owned()).unwrap_or_default();
    p.ensure(secret_root.trim() == root.trim(), || {
        format!("ConfigMap {cm} is not the Secret's root-cert.pem: proxies would not trust the CA")
    });
}
