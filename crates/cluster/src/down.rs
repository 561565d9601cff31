//! Taking a cluster down: its owner stopped, every process in its namespaces killed, every
//! namespace of its tag deleted, its cgroups and its run directory removed. It works from the
//! record when there is one and from the tag alone when there is not (a crash before the record
//! was written), and doing it twice is not an error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ip::CommandError;
use crate::state::{ClusterState, StateError};
use crate::topology::remove_tagged;

/// What [`down`] removed.
#[derive(Debug, Default)]
pub struct Removed {
    /// The owner's pid, if it was running and was stopped.
    pub owner: Option<u32>,
    /// Namespaces deleted.
    pub namespaces: Vec<String>,
    /// Cgroup directories removed.
    pub cgroups: usize,
    /// Whether the run directory was removed.
    pub run_dir: bool,
    /// What could not be removed.
    pub errors: Vec<String>,
}

impl Removed {
    /// Whether there was nothing to remove.
    pub fn nothing(&self) -> bool {
        self.owner.is_none() && self.namespaces.is_empty() && self.cgroups == 0 && !self.run_dir
    }
}

/// Takes down the cluster of `run_dir` whose namespaces carry `tag`: stops the recorded owner
/// (SIGTERM, SIGKILL after `grace`), deletes every `<tag>-*` namespace (killing what runs in
/// them), removes the recorded cgroup root and the run directory.
pub fn down(run_dir: &Path, tag: &str, grace: Duration) -> Removed {
    let mut removed = Removed::default();
    let state = match ClusterState::load(run_dir) {
        Ok(s) => Some(s),
        Err(StateError::Missing(_)) => None,
        Err(e) => {
            // An unreadable record still leaves the tag to go by.
            removed.errors.push(e.to_string());
            None
        }
    };
    if let Some(s) = &state
        && s.owner != std::process::id()
        && s.owner_alive()
    {
        crate::supervise::stop_pid(s.owner, grace);
        removed.owner = Some(s.owner);
    }
    let tags: Vec<String> = state
        .iter()
        .map(|s| s.network.tag.clone())
        .chain(std::iter::once(tag.to_owned()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for t in tags {
        let (names, errors) = remove_tagged(&t);
        removed.namespaces.extend(names);
        removed.errors.extend(errors.iter().map(CommandError::to_string));
    }
    if let Some(s) = &state {
        removed.cgroups = remove_tree(&s.cgroup_root, &mut removed.errors);
    }
    if run_dir.exists() {
        match std::fs::remove_dir_all(run_dir) {
            Ok(()) => removed.run_dir = true,
            Err(e) => removed.errors.push(format!("{}: {e}", run_dir.display())),
        }
    }
    removed
}

/// A running cluster owner (`ambit up --supervise`), found in `/proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Its pid.
    pub pid: u32,
    /// The run directory it was started with.
    pub run_dir: PathBuf,
}

/// The running owners of clusters whose namespaces carry `tag`: every process started as
/// `ambit up --supervise … --run-dir D --tag T` (how `ambit up` starts the owner), read from
/// `/proc/<pid>/cmdline`. A record can be removed or point elsewhere; the running process is
/// what holds the namespaces.
pub fn live_owners(tag: &str) -> Vec<Owner> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if let Some(run_dir) = owner_of(&args, tag)
            && crate::state::pid_alive(pid)
        {
            out.push(Owner { pid, run_dir });
        }
    }
    out.sort_by_key(|o| o.pid);
    out
}

/// The run directory of an owner's command line if it owns `tag`.
fn owner_of(args: &[String], tag: &str) -> Option<PathBuf> {
    if args.get(1).map(String::as_str) != Some("up") || !args.iter().any(|a| a == "--supervise") {
        return None;
    }
    let value = |flag: &str| args.windows(2).find(|w| w[0] == flag).map(|w| w[1].clone());
    if value("--tag")? != tag {
        return None;
    }
    value("--run-dir").map(PathBuf::from)
}

/// Removes a cgroup directory tree bottom-up (cgroup directories are removed with rmdir once
/// empty of processes); returns how many directories went.
fn remove_tree(root: &Path, errors: &mut Vec<String>) -> usize {
    if !root.is_dir() {
        return 0;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        dirs.push(d);
    }
    let mut n = 0;
    // Deepest first.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        match std::fs::remove_dir(&d) {
            Ok(()) => n += 1,
            Err(e) => errors.push(format!("{}: {e}", d.display())),
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_up_is_nothing_removed_and_no_error() {
        let tmp = tempfile::tempdir().expect("tmp");
        let run = tmp.path().join("run");
        let removed = down(&run, "ambcnothing", Duration::from_millis(10));
        assert!(removed.nothing() && removed.errors.is_empty(), "{removed:?}");
    }

    #[test]
    fn owners_are_recognised_by_their_command_line() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let owner =
            args("/x/ambit up --supervise --nodes 2 --run-dir /tmp/c1 --tag lab --ambit-cni /x/ambit-cni");
        assert_eq!(owner_of(&owner, "lab"), Some(PathBuf::from("/tmp/c1")));
        assert_eq!(owner_of(&owner, "ambit"), None, "another tag");
        assert_eq!(owner_of(&args("/x/ambit up --run-dir /tmp/c1 --tag lab"), "lab"), None, "not the owner");
        assert_eq!(owner_of(&args("/x/ambit down --supervise --run-dir /d --tag lab"), "lab"), None);
        // This test process is no owner of any tag.
        assert!(live_owners("ambcnothing").is_empty());
    }

    #[test]
    fn a_plain_directory_tree_is_removed_bottom_up() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().join("cg");
        std::fs::create_dir_all(root.join("a/b")).expect("dirs");
        std::fs::create_dir_all(root.join("c")).expect("dirs");
        let mut errors = Vec::new();
        assert_eq!(remove_tree(&root, &mut errors), 4);
        assert!(errors.is_empty() && !root.exists());
    }
}
