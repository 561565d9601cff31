//! The launcher script `ambit up --launcher` runs: for each containerized component, a
//! `podman run` built from the rendered pod (user, groups, capabilities, seccomp and AppArmor,
//! read-only root, volumes, environment with the downward API filled) and what the test adds.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ambit_objects::k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::chart;
use crate::common::hard_nofile;

/// A word of the launcher script: literal (quoted) or expanded by the shell when the component
/// starts (`ambit up`'s environment for it, the network namespace).
#[derive(Clone)]
pub enum Word {
    Lit(String),
    Shell(String),
}

impl Word {
    pub fn text(&self) -> String {
        match self {
            Word::Lit(s) => format!("'{}'", s.replace('\'', r"'\''")),
            Word::Shell(s) => format!("\"{s}\""),
        }
    }
}

pub fn lit(s: impl Into<String>) -> Word {
    Word::Lit(s.into())
}

/// A volume of the rendered pod that is not a host path: the directory standing for it, and
/// the shell lines that fill it when the component starts.
pub struct Stand {
    pub dir: PathBuf,
    pub fill: Vec<String>,
}

/// What the test gives one component beyond the rendered pod.
pub struct Extra {
    /// `ambit up`'s flags passed on (its stand-ins for the API server); every other flag it
    /// gives is one the rendered environment sets, and is dropped.
    pub keep: &'static [&'static str],
    pub drop: &'static [&'static str],
    /// Directories mounted at their own paths (`ambit up`'s folders), read-only or not.
    pub same_path: Vec<(PathBuf, bool)>,
    /// Rendered environment values replaced, each with why.
    pub env_override: Vec<(&'static str, Word)>,
    /// Environment of `ambit up` added (names the rendered pod does not set).
    pub env_from_up: &'static [&'static str],
    /// Rendered volumes that are not host paths, by name.
    pub stands: BTreeMap<&'static str, Stand>,
    /// Shell lines run first, in the component's network namespace.
    pub before: Vec<String>,
    /// More podman flags.
    pub flags: Vec<Word>,
}

/// One component as a container: the launcher's case for it.
pub struct Launch {
    /// `ambit up`'s process name (`control`, `agent/node1`, `proxy/node1`).
    pub process: String,
    /// The pod's name (`metadata.name`).
    pub pod_name: &'static str,
    /// The container's name (a shell word: the proxy's includes its generation's admin port).
    pub container: Word,
    pub pod: PodSpec,
    pub container_spec: Container,
    pub extra: Extra,
}

/// `1Mi` → bytes.
pub fn quantity_bytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("size {q}"));
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("size unit {other} in {q}"),
    }
}

impl Launch {
    /// The `podman run` words for this component, from the rendered pod.
    pub fn podman(&self, image: &str, node_fields: &BTreeMap<&str, Word>) -> (Vec<Word>, Vec<String>) {
        let (pod, c, x) = (&self.pod, &self.container_spec, &self.extra);
        let mut fields = node_fields.clone();
        fields.insert("metadata.name", lit(self.pod_name));
        fields.insert("spec.serviceAccountName", lit(pod.service_account_name.clone().unwrap_or_default()));
        let mut w = vec![
            lit("run"),
            lit("--rm"),
            lit("--replace"),
            lit("--name"),
            self.container.clone(),
            lit("--pull"),
            lit("never"),
            lit("--network"),
            Word::Shell("ns:/var/run/netns/$netns".into()),
            lit("--hostname"),
            lit(self.pod_name),
            lit("--ulimit"),
            lit(format!("nofile={n}:{n}", n = hard_nofile())),
            lit("--ulimit"),
            lit("nproc=4096:4096"),
        ];
        // Shell lines run before the container starts.
        let mut prepare = x.before.clone();
        let psc = pod.security_context.clone().unwrap_or_default();
        let sc = c.security_context.clone().unwrap_or_default();
        let user = sc.run_as_user.or(psc.run_as_user);
        let group = sc.run_as_group.or(psc.run_as_group);
        if let Some(u) = user {
            w.extend([lit("--user"), lit(format!("{u}:{}", group.unwrap_or(0)))]);
        }
        if let Some(g) = psc.fs_group {
            w.extend([lit("--group-add"), lit(g.to_string())]);
        }
        assert_ne!(sc.privileged, Some(true), "{}: privileged", self.process);
        let caps = sc.capabilities.clone().unwrap_or_default();
        for d in caps.drop.iter().flatten() {
            w.extend([lit("--cap-drop"), lit(d)]);
        }
        for a in caps.add.iter().flatten() {
            w.extend([lit("--cap-add"), lit(a)]);
        }
        if sc.allow_privilege_escalation == Some(false) {
            w.extend([lit("--security-opt"), lit("no-new-privileges")]);
        }
        if sc.read_only_root_filesystem == Some(true) {
            // Kubernetes mounts no tmpfs of its own on a read-only root; podman would.
            w.extend([lit("--read-only"), lit("--read-only-tmpfs=false")]);
        }
        // No profile: the kubelet's default, Unconfined; RuntimeDefault: the runtime's.
        match sc.seccomp_profile.or(psc.seccomp_profile).map(|p| p.type_) {
            None => w.extend([lit("--security-opt"), lit("seccomp=unconfined")]),
            Some(t) if t == "RuntimeDefault" => {}
            Some(t) => panic!("{}: seccomp profile {t}", self.process),
        }
        match sc.app_armor_profile.or(psc.app_armor_profile).map(|p| p.type_) {
            Some(t) if t == "Unconfined" => w.extend([lit("--security-opt"), lit("apparmor=unconfined")]),
            None => {}
            Some(t) if t == "RuntimeDefault" => {}
            Some(t) => panic!("{}: AppArmor profile {t}", self.process),
        }
        if let Some(dir) = &c.working_dir {
            w.extend([lit("--workdir"), lit(dir)]);
        }
        // The environment: the rendered values, the downward API as the kubelet fills it.
        for e in c.env.iter().flatten() {
            let value = if let Some((_, v)) = x.env_override.iter().find(|(n, _)| *n == e.name) {
                match v {
                    Word::Lit(s) => lit(format!("{}={s}", e.name)),
                    Word::Shell(s) => Word::Shell(format!("{}={s}", e.name)),
                }
            } else if let Some(v) = &e.value {
                lit(format!("{}={v}", e.name))
            } else {
                let field = chart::pods::env_field(c, &e.name)
                    .unwrap_or_else(|| panic!("{}: env {} has no value", self.process, e.name));
                match fields.get(field) {
                    Some(Word::Lit(v)) => lit(format!("{}={v}", e.name)),
                    Some(Word::Shell(v)) => Word::Shell(format!("{}={v}", e.name)),
                    None => {
                        panic!("{}: env {} from {field}, which the test does not fill", self.process, e.name)
                    }
                }
            };
            w.extend([lit("--env"), value]);
        }
        for (name, _) in &x.env_override {
            assert!(
                c.env.iter().flatten().any(|e| e.name == *name),
                "{}: the rendered pod no longer sets {name}, which the test overrides",
                self.process
            );
        }
        for name in x.env_from_up {
            assert!(
                !c.env.iter().flatten().any(|e| e.name == *name),
                "{}: the rendered pod sets {name} itself",
                self.process
            );
            w.extend([lit("--env"), Word::Shell(format!("{name}=${name}"))]);
        }
        // The volumes.
        for m in c.volume_mounts.iter().flatten() {
            let v = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == m.name)
                .unwrap_or_else(|| panic!("{}: no volume {}", self.process, m.name));
            let ro = if m.read_only == Some(true) { ":ro" } else { "" };
            if let Some(h) = &v.host_path {
                if h.type_.as_deref() == Some("DirectoryOrCreate") {
                    prepare.push(format!("mkdir -p '{}'", h.path));
                }
                let propagation = match m.mount_propagation.as_deref() {
                    None | Some("None") => "",
                    Some("HostToContainer") => {
                        if ro.is_empty() {
                            ":rslave"
                        } else {
                            ",rslave"
                        }
                    }
                    Some(p) => panic!("{}: mount propagation {p}", self.process),
                };
                w.extend([lit("--volume"), lit(format!("{}:{}{ro}{propagation}", h.path, m.mount_path))]);
            } else if let Some(e) = v.empty_dir.as_ref().filter(|e| e.medium.as_deref() == Some("Memory")) {
                let size = e.size_limit.as_ref().map_or(64 << 20, |q| quantity_bytes(&q.0));
                w.extend([lit("--tmpfs"), lit(format!("{}:rw,size={size}", m.mount_path))]);
            } else {
                let stand = x.stands.get(m.name.as_str()).unwrap_or_else(|| {
                    panic!(
                        "{}: the rendered pod mounts volume {:?}, which the test does not stand in for",
                        self.process, v
                    )
                });
                prepare.push(format!("mkdir -p '{}'", stand.dir.display()));
                prepare.extend(stand.fill.iter().cloned());
                if let (true, Some(g)) = (v.empty_dir.is_some(), psc.fs_group) {
                    // The kubelet gives an emptyDir to the pod's fsGroup.
                    prepare.push(format!("chown -R {}:{g} '{}'", user.unwrap_or(0), stand.dir.display()));
                }
                w.extend([lit("--volume"), lit(format!("{}:{}{ro}", stand.dir.display(), m.mount_path))]);
            }
        }
        for (dir, ro) in &x.same_path {
            let d = dir.display();
            w.extend([lit("--volume"), lit(format!("{d}:{d}{}", if *ro { ":ro" } else { "" }))]);
        }
        w.extend(x.flags.iter().cloned());
        let command: Vec<String> = c.command.clone().unwrap_or_default();
        w.extend([lit("--entrypoint"), lit(serde_json::to_string(&command).expect("JSON"))]);
        w.push(lit(image));
        w.extend(c.args.iter().flatten().map(lit));
        (w, prepare)
    }

    /// The launcher's `case` branch.
    pub fn case(&self, image: &str, fields: &BTreeMap<&str, Word>) -> String {
        let (words, prepare) = self.podman(image, fields);
        let mut s = format!("{})\n", self.process);
        s += &format!("    keep '{}' '{}' \"$@\"\n", self.extra.keep.join(" "), self.extra.drop.join(" "));
        for p in prepare {
            s += &format!("    {p}\n");
        }
        let words: Vec<String> = words.iter().map(Word::text).collect();
        // `ip netns exec` gave this process a mount namespace with a fresh /sys (no cgroups):
        // podman runs in the one of `ambit up`, the parent.
        s += &format!(
            "    exec nsenter --mount=/proc/$PPID/ns/mnt podman {} \"${{kept[@]}}\"\n    ;;\n",
            words.join(" \\\n        ")
        );
        s
    }
}

/// The script `ambit up --launcher` runs each component through.
pub fn launcher(cases: &[String]) -> String {
    format!(
        r#"#!/bin/bash
# Written by tests/up_containers.rs: runs the control plane and node1's agent and proxy as
# podman containers, every other component as `ambit up` would.
set -euo pipefail
export HOME="${{HOME:-/root}}"
name=$1 netns=$2 program=$3
shift 3
# keep KEEP DROP ARGS...: the subcommand, then ARGS' flags named in KEEP (each with its value)
# into kept; a flag in neither list is an error.
keep() {{
    local keep=" $1 " drop=" $2 "
    shift 2
    sub=$1
    shift
    kept=()
    while (( $# > 0 )); do
        if [[ $keep == *" $1 "* ]]; then kept+=("$1" "$2")
        elif [[ $drop != *" $1 "* ]]; then echo "launcher: $name: unexpected argument $1" >&2; exit 2
        fi
        shift 2
    done
}}
case "$name" in
{}*)
    exec "$program" "$@"
    ;;
esac
"#,
        cases.concat()
    )
}
