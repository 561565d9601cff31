//! Finding the network namespace of a running pod from `/proc` (for pods enrolled after they
//! started, and after an agent restart).
//!
//! For each process: its cgroup path names the pod UID (kubelet's `pod<uid>` segment, with `_`
//! or `-` separators) and the container; its `ns/net` is the namespace. The host namespace is
//! never taken, a namespace is taken only if the caller confirms it holds one of the pod's IPs
//! (a process of another pod can transit a namespace), and among several processes of a pod the
//! oldest (the sandbox's pause process) wins. Nothing a process writes can make the scan panic;
//! unreadable or odd entries are skipped.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use ambit_netns::NetnsId;

/// A pod's network namespace found through one of its processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Pod UID (canonical, `-`-separated, lower case).
    pub uid: String,
    /// The process it was found through.
    pub pid: u32,
    /// `<proc>/<pid>/ns/net`.
    pub netns_path: PathBuf,
    /// `(dev, inode)` of the namespace.
    pub netns_id: NetnsId,
    /// The process's start time (clock ticks since boot).
    pub starttime: u64,
}

/// Extracts the canonical pod UID from one cgroup path, if it has kubelet's `pod<uid>` segment
/// followed by a container id.
pub fn pod_uid_from_cgroup_path(path: &str) -> Option<String> {
    let path = path.strip_suffix(".scope").unwrap_or(path);
    let bytes = path.as_bytes();
    // The container id: the trailing run of non-punctuation characters.
    let tail = bytes.iter().rposition(|b| b.is_ascii_punctuation()).map_or(0, |i| i + 1);
    if tail >= bytes.len() {
        return None;
    }
    let mut search = 0;
    while let Some(off) = path[search..].find("pod") {
        let at = search + off;
        search = at + 3;
        if at == 0 || !bytes[at - 1].is_ascii_punctuation() {
            continue;
        }
        if let Some((uid, end)) = parse_uid(&bytes[at + 3..])
            && at + 3 + end < tail
            && bytes[at + 3 + end].is_ascii_punctuation()
        {
            return Some(uid);
        }
    }
    None
}

/// 8-4-4-4-12 hex digits, each separator one optional punctuation character.
fn parse_uid(b: &[u8]) -> Option<(String, usize)> {
    let mut out = String::with_capacity(36);
    let mut i = 0;
    for (g, len) in [8, 4, 4, 4, 12].into_iter().enumerate() {
        if g > 0 {
            if b.get(i).is_some_and(|c| c.is_ascii_punctuation()) {
                i += 1;
            }
            out.push('-');
        }
        for _ in 0..len {
            let c = *b.get(i)?;
            if !c.is_ascii_hexdigit() {
                return None;
            }
            out.push(c.to_ascii_lowercase() as char);
            i += 1;
        }
    }
    Some((out, i))
}

/// The pod UID of a process from its `cgroup` file: every line that names a pod must name the
/// same one; a line without two colons makes the process unusable.
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    let mut uid: Option<String> = None;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let mut parts = line.splitn(3, ':');
        let (_, _, path) = (parts.next()?, parts.next()?, parts.next()?);
        if let Some(u) = pod_uid_from_cgroup_path(path) {
            match &uid {
                Some(prev) if *prev != u => return None,
                _ => uid = Some(u),
            }
        }
    }
    uid
}

/// Field 22 of `/proc/<pid>/stat` (start time), parsed after the command name's last `)`.
pub fn starttime(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// What a scan found: per pod UID its namespace, and how many processes of the wanted pods had
/// a namespace the agent may not read.
#[derive(Debug, Default)]
pub struct Scan {
    /// The wanted pods found.
    pub found: HashMap<String, Found>,
    /// Processes of wanted pods whose `ns/net` refused the agent (permission denied: reading
    /// another user's or a more privileged process's namespace needs CAP_SYS_PTRACE).
    pub refused: usize,
}

/// Scans `proc_root` for the network namespaces of the pods in `wanted`.
///
/// `owns(uid, netns_path)` confirms the namespace belongs to the pod (it holds one of its IPs);
/// the host namespace (that of pid 1) is never returned.
pub fn scan(proc_root: &Path, wanted: &HashSet<String>, owns: impl Fn(&str, &Path) -> bool) -> Scan {
    let host = ambit_netns::host_id(proc_root).ok();
    let mut best: HashMap<String, Found> = HashMap::new();
    let mut refused = 0;
    let mut accepted: HashSet<NetnsId> = HashSet::new();
    let Ok(entries) = fs::read_dir(proc_root) else { return Scan::default() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let dir = entry.path();
        let pod_of = || fs::read_to_string(dir.join("cgroup")).ok().and_then(|t| pod_uid_from_cgroup(&t));
        let netns_path = dir.join("ns/net");
        let id = match NetnsId::of_path(&netns_path) {
            Ok(id) => id,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                if pod_of().is_some_and(|uid| wanted.contains(&uid)) {
                    refused += 1;
                }
                continue;
            }
            Err(_) => continue,
        };
        if Some(id) == host {
            continue;
        }
        let Some(uid) = pod_of() else { continue };
        if !wanted.contains(&uid) {
            continue;
        }
        let Some(start) = fs::read_to_string(dir.join("stat")).ok().and_then(|s| starttime(&s)) else {
            continue;
        };
        if !accepted.contains(&id) && !owns(&uid, &netns_path) {
            continue;
        }
        accepted.insert(id);
        let candidate = Found { uid: uid.clone(), pid, netns_path, netns_id: id, starttime: start };
        match best.get(&uid) {
            Some(b) if b.starttime <= start => {}
            _ => {
                best.insert(uid, candidate);
            }
        }
    }
    Scan { found: best, refused }
}

#[cfg(test)]
mod tests;
