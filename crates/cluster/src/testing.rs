//! Helpers for tests that build clusters (this crate's, the end-to-end suite's, the
//! benchmarks'): whether they may run.

use std::sync::OnceLock;

/// True when this process is root and `ip netns` works. Otherwise: under `CI=true` the calling
/// test fails (a privileged test never skips in CI); elsewhere it prints "skipping: needs root"
/// and returns false so the test can return early.
pub fn require_root() -> bool {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    match PROBE.get_or_init(probe) {
        Ok(()) => true,
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "this test needs root and network namespaces, and cannot run in CI: {why}; run the suite as root"
            )
        }
        Err(why) => {
            eprintln!("skipping: needs root ({why})");
            false
        }
    }
}

fn probe() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("not running as root".into());
    }
    let name = format!("ambc{}0-probe", std::process::id());
    crate::ip::add_netns(&name).map_err(|e| e.to_string())?;
    crate::ip::delete_netns(&name).map_err(|e| e.to_string())
}
