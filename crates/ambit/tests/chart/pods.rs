//! Reading pod templates: which component a container runs, where a path inside it comes
//! from (which volume, which host path), its environment and probes.

use std::collections::BTreeSet;
use std::path::{Component as PathPart, Path, PathBuf};

use ambit_objects::k8s_openapi::api::core::v1::{
    Container, PodSpec, Probe, ProjectedVolumeSource, SecretVolumeSource, VolumeMount,
};
use ambit_objects::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The Ambit component a container runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    Agent,
    Proxy,
    Control,
}

impl Component {
    /// The key of `ambit config-reference`'s JSON.
    pub fn key(self) -> &'static str {
        match self {
            Component::Agent => "agent",
            Component::Proxy => "proxy",
            Component::Control => "control",
        }
    }
}

/// From the command line: `ambit agent` / `install-cni` run the agent, `ambit proxy` /
/// `ztunnel` the proxy, `ambit control` the control plane.
pub fn component(c: &Container) -> Option<Component> {
    let argv: Vec<&str> =
        c.command.iter().flatten().chain(c.args.iter().flatten()).map(String::as_str).collect();
    let program = Path::new(argv.first()?).file_name()?.to_str()?;
    match (program, argv.get(1).copied()) {
        ("install-cni", _) | ("ambit", Some("agent")) => Some(Component::Agent),
        ("ztunnel", _) | ("ambit", Some("proxy")) => Some(Component::Proxy),
        ("ambit", Some("control")) => Some(Component::Control),
        _ => None,
    }
}

/// What a path inside a container is backed by.
#[derive(Clone, Debug, PartialEq)]
pub enum Backing<'a> {
    /// A host directory: the host path the container path names.
    Host(PathBuf),
    /// A pod-local scratch directory.
    EmptyDir,
    /// A ConfigMap key (the file name under the mount).
    ConfigMap { name: String, key: String },
    /// A Secret volume.
    Secret(&'a SecretVolumeSource),
    /// A projected volume; the file name under the mount.
    Projected(&'a ProjectedVolumeSource, String),
    /// Not under any mount: the image's own filesystem.
    Image,
}

/// Where `path` (absolute, or relative to the container's workingDir) comes from, and the mount.
pub fn backing<'a>(pod: &'a PodSpec, c: &'a Container, path: &str) -> (Backing<'a>, Option<&'a VolumeMount>) {
    let path = match (Path::new(path).is_absolute(), &c.working_dir) {
        (true, _) => normalize(Path::new(path)),
        (false, Some(dir)) => normalize(&Path::new(dir).join(path)),
        // Relative with no workingDir: resolves against whatever the image says.
        (false, None) => return (Backing::Image, None),
    };
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(normalize(Path::new(&m.mount_path))))
        .max_by_key(|m| normalize(Path::new(&m.mount_path)).components().count());
    let Some(mount) = mount else { return (Backing::Image, None) };
    let rest = path.strip_prefix(normalize(Path::new(&mount.mount_path))).unwrap_or(Path::new("")).to_owned();
    let Some(volume) = pod.volumes.iter().flatten().find(|v| v.name == mount.name) else {
        return (Backing::Image, Some(mount));
    };
    let file = rest.to_string_lossy().into_owned();
    let b = if let Some(h) = &volume.host_path {
        Backing::Host(if file.is_empty() { PathBuf::from(&h.path) } else { Path::new(&h.path).join(&rest) })
    } else if volume.empty_dir.is_some() {
        Backing::EmptyDir
    } else if let Some(cm) = &volume.config_map {
        Backing::ConfigMap { name: cm.name.clone(), key: file }
    } else if let Some(s) = &volume.secret {
        Backing::Secret(s)
    } else if let Some(p) = &volume.projected {
        Backing::Projected(p, file)
    } else {
        Backing::Image
    };
    (b, Some(mount))
}

/// The host path behind `path` in the container, if it is on a hostPath volume.
pub fn host_path(pod: &PodSpec, c: &Container, path: &str) -> Option<PathBuf> {
    match backing(pod, c, path).0 {
        Backing::Host(p) => Some(p),
        _ => None,
    }
}

/// `/a/./b/` → `/a/b`, without touching the filesystem.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in p.components() {
        match part {
            PathPart::CurDir => {}
            PathPart::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The literal value of the environment variable `name`.
pub fn env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

/// The downward-API field (`metadata.name`) or container resource (`limits.cpu`) behind the
/// environment variable `name`.
pub fn env_field<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    let from = c.env.iter().flatten().find(|e| e.name == name)?.value_from.as_ref()?;
    match (&from.field_ref, &from.resource_field_ref) {
        (Some(f), _) => Some(f.field_path.as_str()),
        (None, Some(r)) => Some(r.resource.as_str()),
        (None, None) => None,
    }
}

/// Every environment variable name the container sets.
pub fn env_names(c: &Container) -> BTreeSet<String> {
    c.env.iter().flatten().map(|e| e.name.clone()).collect()
}

/// A probe's port as a number: a containerPort of `c` (by name or number), else `None`.
pub fn probe_port(c: &Container, port: &IntOrString) -> Option<i32> {
    let ports = c.ports.iter().flatten();
    match port {
        IntOrString::Int(n) => ports.clone().find(|p| p.container_port == *n).map(|p| p.container_port),
        IntOrString::String(name) => {
            ports.clone().find(|p| p.name.as_deref() == Some(name.as_str())).map(|p| p.container_port)
        }
    }
}

/// What a probe asks: `GET <path> :<port>` or `TCP :<port>`, the port resolved against the
/// container's ports (`?` when it is not one of them).
pub fn describe(c: &Container, probe: Option<&Probe>) -> String {
    let Some(p) = probe else { return "none".into() };
    let port = |port: &IntOrString| probe_port(c, port).map_or("?".to_owned(), |n| n.to_string());
    if let Some(h) = &p.http_get {
        format!("GET {} :{}", h.path.as_deref().unwrap_or("/"), port(&h.port))
    } else if let Some(t) = &p.tcp_socket {
        format!("TCP :{}", port(&t.port))
    } else {
        "other".into()
    }
}
