//! Network namespaces and links through iproute2's `ip` (the `iproute2` package), the same tool
//! a person uses to look at what was built: every namespace is an `ip netns` name, bind-mounted
//! under [`NETNS_DIR`], so `ip netns list` shows it and `ip netns exec` enters it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Where `ip netns` keeps its named namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";

/// A command that did not run or did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The program could not be started (not installed, not executable).
    #[error("cannot run {command}: {source}{hint}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
        /// What to install, when the program is missing.
        hint: String,
    },
    /// It ran and failed.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it wrote on stderr (trimmed, at most 2 KiB).
        stderr: String,
    },
}

/// The package that provides `program` on Debian, for the error of a missing program.
fn package_of(program: &str) -> Option<&'static str> {
    match program {
        "ip" | "bridge" => Some("iproute2"),
        "sysctl" => Some("procps"),
        "nft" => Some("nftables"),
        "iptables" | "ip6tables" | "iptables-restore" => Some("iptables"),
        _ => None,
    }
}

/// Runs `cmd` to completion with stdin closed; `Ok` with its output when it exits 0.
pub fn run(mut cmd: Command) -> Result<Output, CommandError> {
    let command = describe(&cmd);
    let out = cmd.stdin(Stdio::null()).output().map_err(|source| {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let hint = match (source.kind(), package_of(&program)) {
            (std::io::ErrorKind::NotFound, Some(pkg)) => format!(" (install the {pkg} package)"),
            _ => String::new(),
        };
        CommandError::Spawn { command: command.clone(), source, hint }
    })?;
    if out.status.success() {
        return Ok(out);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr: String = stderr.trim().chars().take(2048).collect();
    Err(CommandError::Failed { command, status: out.status, stderr })
}

/// The command line of `cmd`, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// `ip args…` in this process's namespace.
pub fn host(args: &[&str]) -> Result<(), CommandError> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run(cmd).map(drop)
}

/// `ip -n netns args…`.
pub fn inside(netns: &str, args: &[&str]) -> Result<(), CommandError> {
    let mut cmd = Command::new("ip");
    cmd.args(["-n", netns]).args(args);
    run(cmd).map(drop)
}

/// A command that runs `program args…` inside `netns` (`ip netns exec`, which also gives the
/// program the namespace's `/sys`).
pub fn exec_in(netns: &str, program: impl AsRef<Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).arg(program.as_ref()).args(args);
    cmd
}

/// Sets sysctls inside `netns` (`sysctl -q -w key=value …`).
pub fn sysctls(netns: &str, settings: &[(&str, &str)]) -> Result<(), CommandError> {
    let mut cmd = exec_in(netns, "sysctl", &["-q", "-w"]);
    for (key, value) in settings {
        cmd.arg(format!("{key}={value}"));
    }
    run(cmd).map(drop)
}

/// Creates a veth pair: `name` in namespace `netns`, its peer `peer` in `peer_netns`.
pub fn add_veth(name: &str, netns: &str, peer: &str, peer_netns: &str) -> Result<(), CommandError> {
    host(&["link", "add", name, "netns", netns, "type", "veth", "peer", "name", peer, "netns", peer_netns])
}

/// Creates the named namespace `name`.
pub fn add_netns(name: &str) -> Result<(), CommandError> {
    host(&["netns", "add", name])
}

/// The bind mount of the named namespace `name` (what `CNI_NETNS` is given).
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Whether the named namespace `name` exists.
pub fn netns_exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// The named namespaces whose name starts with `prefix`, sorted.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else { return Vec::new() };
    let mut names: Vec<String> = dir
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// The pids of the processes inside the named namespace `name` (`ip netns pids`); empty when it
/// does not exist.
pub fn pids_in(name: &str) -> Vec<i32> {
    let Ok(out) = Command::new("ip").args(["netns", "pids", name]).stdin(Stdio::null()).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Kills (SIGKILL) every process inside `name`, then deletes it; a namespace that is already
/// gone is not an error.
pub fn delete_netns(name: &str) -> Result<(), CommandError> {
    let pids = pids_in(name);
    for pid in &pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
    }
    if !pids.is_empty() {
        // SIGKILL is delivered asynchronously; give the exits a moment so the namespace can go.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if !netns_exists(name) {
        return Ok(());
    }
    host(&["netns", "del", name])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_names_its_package() {
        let mut cmd = Command::new("ip");
        // A path that cannot exist stands in for a machine without iproute2.
        cmd.env("PATH", "/nonexistent-ambit-test");
        let err = run(cmd).expect_err("no ip on that PATH");
        let msg = err.to_string();
        assert!(msg.starts_with("cannot run ip: "), "{msg}");
        assert!(msg.ends_with(" (install the iproute2 package)"), "{msg}");
    }

    #[test]
    fn a_failed_command_carries_its_line_status_and_stderr() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo broken >&2; exit 3"]);
        let err = run(cmd).expect_err("exit 3");
        assert_eq!(err.to_string(), "sh -c echo broken >&2; exit 3 failed (exit status: 3): broken");
    }
}
