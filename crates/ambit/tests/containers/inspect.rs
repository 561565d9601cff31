//! What runs: the test's containers, and their privileges read from inside them.

use crate::common::images::{ok, run};
use crate::containers::launch::Launch;

/// One line of `/proc/<pid>/status`.
pub fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
        .to_owned()
}

/// A capability set from the names Kubernetes uses.
pub fn cap_mask(names: &[String]) -> u64 {
    names
        .iter()
        .map(|n| {
            1u64 << match n.as_str() {
                "NET_ADMIN" => 12,
                "NET_RAW" => 13,
                "SYS_PTRACE" => 19,
                "SYS_ADMIN" => 21,
                other => panic!("capability {other}: add its number here"),
            }
        })
        .fold(0, |a, b| a | b)
}

/// The host pid of a running container.
pub fn container_pid(name: &str) -> u32 {
    ok("podman", &["inspect", "--format", "{{.State.Pid}}", name]).trim().parse().expect("pid")
}

/// The running container whose name starts with `prefix`.
pub fn container_named(prefix: &str) -> Vec<String> {
    ok("podman", &["ps", "--format", "{{.Names}}"])
        .lines()
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// The container `name` runs with exactly the rendered privileges: user and groups,
/// capabilities (effective, permitted, bounding; none inheritable or ambient), no new
/// privileges, the seccomp mode, the image's binary, and a root that refuses writes when the
/// chart says read-only. Read inside the container: its /proc, its root.
pub fn assert_privileges(name: &str, launch: &Launch, image: &str) {
    let pid = container_pid(name);
    // Through the container's own /proc (its root's), where the component is pid 1.
    let status = std::fs::read_to_string(format!("/proc/{pid}/root/proc/1/status")).expect("status");
    assert_eq!(status_field(&status, "Name"), "ambit", "{}", launch.process);
    let (pod, c) = (&launch.pod, &launch.container_spec);
    let psc = pod.security_context.clone().unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let uid = sc.run_as_user.or(psc.run_as_user).expect("runAsUser");
    let gid = sc.run_as_group.or(psc.run_as_group).unwrap_or(0);
    let what = &launch.process;
    assert_eq!(status_field(&status, "Uid"), format!("{uid}\t{uid}\t{uid}\t{uid}"), "{what}");
    assert_eq!(status_field(&status, "Gid"), format!("{gid}\t{gid}\t{gid}\t{gid}"), "{what}");
    let groups = status_field(&status, "Groups");
    // The runtime lists the primary group among the supplementary ones (containerd does the
    // same), then the pod's fsGroup.
    let mut want_groups: Vec<i64> = std::iter::once(gid).chain(psc.fs_group).collect();
    want_groups.dedup();
    let got_groups: Vec<i64> = groups.split_whitespace().map(|g| g.parse().expect("gid")).collect();
    assert_eq!(got_groups, want_groups, "{what}: supplementary groups");
    let caps = sc.capabilities.clone().unwrap_or_default();
    assert_eq!(caps.drop.clone().unwrap_or_default(), ["ALL"], "{what}");
    let add = cap_mask(&caps.add.clone().unwrap_or_default());
    let read = |f: &str| u64::from_str_radix(&status_field(&status, f), 16).expect("hex");
    // Root keeps the bounding set as effective; any other user starts with none.
    let effective = if uid == 0 { add } else { 0 };
    assert_eq!(read("CapEff"), effective, "{what}: effective capabilities {status}");
    assert_eq!(read("CapPrm"), effective, "{what}: permitted capabilities");
    assert_eq!(read("CapBnd"), add, "{what}: bounding set");
    assert_eq!(read("CapInh"), 0, "{what}: inheritable");
    assert_eq!(read("CapAmb"), 0, "{what}: ambient");
    assert_eq!(
        status_field(&status, "NoNewPrivs"),
        if sc.allow_privilege_escalation == Some(false) { "1" } else { "0" },
        "{what}"
    );
    let seccomp = match sc.seccomp_profile.or(psc.seccomp_profile) {
        None => "0",
        Some(_) => "2",
    };
    assert_eq!(status_field(&status, "Seccomp"), seccomp, "{what}: seccomp mode");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    assert_eq!(exe.to_str(), c.command.as_ref().and_then(|c| c.first()).map(String::as_str), "{what}");
    let ran = ok("podman", &["inspect", "--format", "{{.ImageName}}", name]);
    assert_eq!(ran.trim(), image, "{what}");
    let probe = format!("/proc/{pid}/root/.ambit-write-probe");
    let wrote = std::fs::write(&probe, b"");
    if sc.read_only_root_filesystem == Some(true) {
        assert_eq!(
            wrote.as_ref().err().and_then(std::io::Error::raw_os_error),
            Some(30),
            "{what}: {wrote:?}"
        );
    } else {
        let _ = std::fs::remove_file(&probe);
    }
}

/// Removes the cluster's containers, whatever happened.
pub struct Cleanup {
    pub tag: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for name in container_named(&self.tag) {
            let _ = run("podman", &["rm", "--force", "--time", "0", &name]);
        }
    }
}
