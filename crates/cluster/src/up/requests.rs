//! `ambit restart|stop|start`: requests left in the run directory's requests folder, carried
//! out by the cluster's owner, each answered in a `.done` file next to it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::{Cluster, Layout, MAX_REQUEST, STOP_GRACE, write_atomic};
use crate::state::ClusterState;

impl Cluster {
    /// Carries out the requests `ambit restart|stop|start` left in the requests folder.
    pub(super) fn handle_requests(&mut self) {
        let dir = self.layout.requests();
        let Ok(entries) = std::fs::read_dir(&dir) else { return };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for file in files {
            // A request is a few dozen bytes; read at most MAX_REQUEST of whatever is there.
            let mut text = String::new();
            if let Ok(f) = std::fs::File::open(&file) {
                use std::io::Read;
                let _ = f.take(MAX_REQUEST).read_to_string(&mut text);
            }
            let _ = std::fs::remove_file(&file);
            let reply = match serde_json::from_str::<Request>(&text) {
                Ok(req) => {
                    let r = self.handle(&req);
                    let line = match &r {
                        Ok(m) => m.clone(),
                        Err(m) => format!("{} {} failed: {m}", req.op, req.name),
                    };
                    self.event(line);
                    match r {
                        Ok(message) => Reply { ok: true, message },
                        Err(message) => Reply { ok: false, message },
                    }
                }
                Err(e) => Reply { ok: false, message: format!("not a request: {e}") },
            };
            let _ = write_atomic(
                &file.with_extension("done"),
                &serde_json::to_string(&reply).unwrap_or_default(),
            );
        }
    }

    pub(super) fn handle(&mut self, req: &Request) -> Result<String, String> {
        if self.sup.spec(&req.name).is_none() {
            let names: Vec<String> = self.sup.status().into_iter().map(|p| p.name).collect();
            return Err(format!("no process named {:?}; there are: {}", req.name, names.join(", ")));
        }
        let proxy_node =
            req.name.strip_prefix("proxy/").and_then(|n| self.nodes.iter().position(|m| m.member.name == n));
        let waypoint = self
            .sup
            .spec(&req.name)
            .is_some_and(|s| s.program == self.cfg.ambit && s.args.first().is_some_and(|a| a == "waypoint"));
        match (req.op.as_str(), proxy_node) {
            ("restart", Some(i)) => self.replace_proxy(i),
            ("restart", None) if waypoint && !req.kill => self.replace_waypoint(&req.name),
            ("restart", None) => {
                self.sup.hold(&req.name, STOP_GRACE, req.kill);
                self.sup.release(&req.name).map_err(|e| e.to_string())?;
                Ok(format!("{} restarted", req.name))
            }
            ("stop", _) => {
                self.sup.hold(&req.name, STOP_GRACE, req.kill);
                let how = if req.kill { "killed (SIGKILL)" } else { "stopped" };
                Ok(format!("{} {how}; it stays down until `ambit start {}{}`", req.name, req.name, req.flags))
            }
            ("start", _) => {
                self.sup.release(&req.name).map_err(|e| e.to_string())?;
                Ok(format!("{} started", req.name))
            }
            (op, _) => Err(format!("unknown operation {op:?} (restart, stop, start)")),
        }
    }
}

/// A request to the cluster's owner: `restart`, `stop` or `start` process `name` (as
/// `ambit status` lists them: `control`, `agent/node1`, `proxy/node1`, `pod/demo/web/app`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// `restart`, `stop` or `start`.
    pub op: String,
    /// The process.
    pub name: String,
    /// SIGKILL instead of SIGTERM (`stop`, `restart`).
    #[serde(default)]
    pub kill: bool,
    /// How the requester names this cluster on a command line (` --run-dir D --tag T`, or empty
    /// for the default one), for the commands the answer suggests.
    #[serde(default)]
    pub flags: String,
}

/// The owner's answer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reply {
    /// Whether it was done.
    pub ok: bool,
    /// What happened.
    pub message: String,
}

/// Hands `req` to the owner of the cluster in `run_dir` and waits (at most `timeout`) for its
/// answer.
pub fn submit(run_dir: &Path, req: &Request, timeout: Duration) -> Result<Reply, String> {
    let layout = Layout(run_dir.to_owned());
    let state = ClusterState::load(run_dir).map_err(|e| e.to_string())?;
    if !state.owner_alive() {
        return Err("the cluster's owner is gone; `ambit down`, then `ambit up`".into());
    }
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let file = layout.requests().join(format!("{nanos:020}-{}.json", std::process::id()));
    write_atomic(&file, &serde_json::to_string(req).unwrap_or_default()).map_err(|e| e.to_string())?;
    let done = file.with_extension("done");
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(&done) {
            let _ = std::fs::remove_file(&done);
            return serde_json::from_str(&text).map_err(|e| format!("a garbled answer: {e}"));
        }
        if Instant::now() > deadline {
            let _ = std::fs::remove_file(&file);
            return Err(format!("no answer from the cluster's owner within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
