//! Pod sandboxes as a container runtime makes them: a fresh network namespace and a "pause"
//! process inside it whose cgroup path carries kubelet's `pod<uid>` segment, so a node agent
//! finds the pod's namespace through `/proc` (by cgroup) exactly as on a real node.
//!
//! A sandbox is not removed when its value is dropped: `ambit up` hands sandboxes to the
//! cluster's supervisor, which outlives the command. Call [`Sandbox::remove`] (tests wrap it in
//! a guard).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cni::PodRef;
use crate::ip::{self, CommandError};

/// Why a sandbox could not be made or removed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No cgroup v2 hierarchy is mounted.
    #[error("no cgroup2 filesystem is mounted (the node agent finds pods by their cgroup paths)")]
    NoCgroup2,
    /// A cgroup directory could not be made or joined.
    #[error("cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The pause process could not be started.
    #[error("cannot start the pause process of {pod}: {source}")]
    Pause {
        /// `namespace/name`.
        pod: String,
        /// Why.
        source: std::io::Error,
    },
    /// The pause process did not enter the namespace in time.
    #[error("the pause process of {0} did not enter its network namespace within 5 s")]
    PauseStuck(String),
    /// A namespace command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
}

/// A pod's sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// What CNI is told about the pod.
    pub pod: PodRef,
    /// The pod namespace's `ip netns` name.
    pub netns: String,
    /// The sandbox's cgroup directory.
    pub cgroup: PathBuf,
    pause: Option<Child>,
}

impl Sandbox {
    /// Creates the sandbox of pod `namespace/name` (uid `uid`; a random one when `None`) in
    /// namespace `netns`, with its cgroup under `cgroup_root` (a directory of the cgroup2
    /// hierarchy, see [`cgroup2_mount`]). On failure nothing is left behind.
    pub fn create(
        netns: &str,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        cgroup_root: &Path,
    ) -> Result<Sandbox, SandboxError> {
        let uid = uid.map_or_else(random_uid, str::to_owned);
        let container_id = container_id();
        let cgroup = cgroup_root
            .join(format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")))
            .join(format!("cri-containerd-{container_id}.scope"));
        ip::add_netns(netns)?;
        let mut sandbox = Sandbox {
            pod: PodRef {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                uid,
                container_id,
                netns: ip::netns_path(netns),
            },
            netns: netns.to_owned(),
            cgroup,
            pause: None,
        };
        if let Err(e) = sandbox.start_pause() {
            let _ = sandbox.remove();
            return Err(e);
        }
        Ok(sandbox)
    }

    fn start_pause(&mut self) -> Result<(), SandboxError> {
        let label = format!("{}/{}", self.pod.namespace, self.pod.name);
        std::fs::create_dir_all(&self.cgroup)
            .map_err(|source| SandboxError::Cgroup { path: self.cgroup.clone(), source })?;
        // Join the cgroup first, then enter the netns: the process is never seen half set up.
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" && exec ip netns exec "$2" sleep infinity"#)
            .arg("pause")
            .arg(&self.cgroup)
            .arg(&self.netns)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|source| SandboxError::Pause { pod: label.clone(), source })?;
        let pid = child.id();
        self.pause = Some(child);
        let own = std::fs::read_link("/proc/self/ns/net").ok();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
            // `sleep` has replaced the shell and `ip` once the namespace differs from ours.
            if theirs.is_some() && theirs != own {
                return Ok(());
            }
            if let Some(c) = self.pause.as_mut()
                && matches!(c.try_wait(), Ok(Some(_)))
            {
                return Err(SandboxError::PauseStuck(label));
            }
            if Instant::now() > deadline {
                return Err(SandboxError::PauseStuck(label));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The pause process's pid (0 once removed).
    pub fn pause_pid(&self) -> u32 {
        self.pause.as_ref().map_or(0, Child::id)
    }

    /// Kills every process in the sandbox, removes its namespace and cgroup directories.
    /// Safe to repeat.
    pub fn remove(&mut self) -> Result<(), SandboxError> {
        if let Some(mut pause) = self.pause.take() {
            let _ = pause.kill();
            let _ = pause.wait();
        }
        ip::delete_netns(&self.netns)?;
        let _ = std::fs::remove_dir(&self.cgroup);
        if let Some(parent) = self.cgroup.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
/// hybrid hosts).
pub fn cgroup2_mount() -> Result<PathBuf, SandboxError> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f.get(1).copied().unwrap_or_default()))
        })
        .next()
        .ok_or(SandboxError::NoCgroup2)
}

/// A random pod UID in Kubernetes' form (8-4-4-4-12 hex).
pub fn random_uid() -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// A random sandbox container id: 64 hex digits, as containerd makes them.
pub fn container_id() -> String {
    (0..4).map(|_| format!("{:016x}", rand::random::<u64>())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_kubernetes_and_containerd_shapes() {
        let uid = random_uid();
        let parts: Vec<usize> = uid.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{uid}");
        let id = container_id();
        assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_ne!(random_uid(), uid);
    }
}
