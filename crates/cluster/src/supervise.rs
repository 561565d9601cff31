//! Supervised processes: the cluster's components (`ambit control`, and per node `ambit agent`
//! and `ambit proxy`) and the pods' containers, each in its network namespace, its output
//! appended to a log file of its own. A process that exits is started again after a backoff
//! (100 ms, doubling to 10 s; back to 100 ms once it has run for 30 s), and every exit and
//! restart is counted and written to its log, so `ambit status` can show it.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::ip;

/// First restart delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A process that ran this long is healthy again: its next restart waits [`BACKOFF_MIN`].
pub const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    /// A name unique in the supervisor (`control`, `agent/node1`, `pod/demo/web/app`).
    pub name: String,
    /// The namespace to run in (`ip netns` name); `None`: the supervisor's own.
    pub netns: Option<String>,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Its whole environment (nothing is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// Where its stdout and stderr are appended.
    pub log: PathBuf,
    /// Whether it is started again when it exits.
    pub restart: bool,
}

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// A process of that name is supervised already.
    #[error("a process named {0:?} is already supervised")]
    Duplicate(String),
    /// Its log file could not be opened.
    #[error("log file {path}: {source}")]
    Log {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The program could not be started.
    #[error("cannot start {name} ({program}): {source}")]
    Spawn {
        /// The process's name.
        name: String,
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a process could not be replaced.
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError {
    /// No such process.
    #[error("no process named {0:?}")]
    Unknown(String),
    /// The replacement could not be started.
    #[error(transparent)]
    Start(#[from] SuperviseError),
    /// The replacement did not become ready; the running process stays.
    #[error("the replacement of {name} did not become ready within {waited:?}; the running one stays")]
    NotReady {
        /// The process.
        name: String,
        /// How long was waited.
        waited: Duration,
    },
}

/// A process's state as `ambit status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// Its name.
    pub name: String,
    /// Its pid while running.
    pub pid: Option<u32>,
    /// How many times it was started again.
    pub restarts: u32,
    /// How its last run ended (`exit status: 1`, `signal: 9 (SIGKILL)`), if it ended.
    pub last_exit: Option<String>,
    /// Whether it is running now.
    pub running: bool,
    /// Whether it was stopped on request (and is not restarted).
    #[serde(default)]
    pub held: bool,
    /// Whether it is crash-looping: waiting to be started again after exiting, or started
    /// again after exiting quickly twice in a row and not yet running for [`HEALTHY_AFTER`].
    #[serde(default)]
    pub crash_loop: bool,
}

/// What happened in one [`Supervisor::tick`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A process exited.
    Exited {
        /// Its name.
        name: String,
        /// How.
        status: String,
    },
    /// A process was started again.
    Restarted {
        /// Its name.
        name: String,
        /// Its restarts so far.
        restarts: u32,
    },
    /// A restart failed (it is tried again after the next backoff).
    RestartFailed {
        /// Its name.
        name: String,
        /// Why.
        error: String,
    },
}

struct Supervised {
    spec: ProcessSpec,
    child: Option<Child>,
    started: Instant,
    restarts: u32,
    backoff: Duration,
    due: Option<Instant>,
    last_exit: Option<String>,
    /// Stopped on request: not restarted until released.
    held: bool,
}

/// The supervised processes.
#[derive(Default)]
pub struct Supervisor {
    procs: Vec<Supervised>,
}

impl Supervisor {
    /// An empty supervisor.
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    /// Starts `spec` and supervises it.
    pub fn start(&mut self, spec: ProcessSpec) -> Result<u32, SuperviseError> {
        if self.procs.iter().any(|p| p.spec.name == spec.name) {
            return Err(SuperviseError::Duplicate(spec.name));
        }
        let child = spawn(&spec)?;
        let pid = child.id();
        self.procs.push(Supervised {
            spec,
            child: Some(child),
            started: Instant::now(),
            restarts: 0,
            backoff: BACKOFF_MIN,
            due: None,
            last_exit: None,
            held: false,
        });
        Ok(pid)
    }

    /// Reaps what exited, schedules restarts and starts what is due. Call it often (every
    /// 50–100 ms).
    pub fn tick(&mut self) -> Vec<Event> {
        let now = Instant::now();
        let mut events = Vec::new();
        for p in &mut self.procs {
            if let Some(child) = p.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                p.child = None;
                let how = describe(status);
                note(&p.spec, &format!("exited ({how})"));
                events.push(Event::Exited { name: p.spec.name.clone(), status: how.clone() });
                p.last_exit = Some(how);
                if p.spec.restart {
                    if now.duration_since(p.started) >= HEALTHY_AFTER {
                        p.backoff = BACKOFF_MIN;
                    }
                    p.due = Some(now + p.backoff);
                    p.backoff = (p.backoff * 2).min(BACKOFF_MAX);
                }
            }
            if p.child.is_none()
                && !p.held
                && let Some(due) = p.due
                && now >= due
            {
                p.due = None;
                match spawn(&p.spec) {
                    Ok(child) => {
                        p.restarts += 1;
                        p.started = now;
                        note(&p.spec, &format!("restarted (restart {}), pid {}", p.restarts, child.id()));
                        p.child = Some(child);
                        events.push(Event::Restarted { name: p.spec.name.clone(), restarts: p.restarts });
                    }
                    Err(e) => {
                        p.due = Some(now + p.backoff);
                        p.backoff = (p.backoff * 2).min(BACKOFF_MAX);
                        events.push(Event::RestartFailed { name: p.spec.name.clone(), error: e.to_string() });
                    }
                }
            }
        }
        events
    }

    /// Stops process `name` (SIGTERM, then SIGKILL after `grace`) and stops supervising it;
    /// false when there is no such process.
    pub fn stop(&mut self, name: &str, grace: Duration) -> bool {
        let Some(i) = self.procs.iter().position(|p| p.spec.name == name) else { return false };
        let mut p = self.procs.remove(i);
        if let Some(child) = p.child.as_mut() {
            terminate(child, grace);
            note(&p.spec, "stopped");
        }
        true
    }

    /// Stops process `name` and keeps it stopped (not restarted) until [`Supervisor::release`]:
    /// SIGTERM then SIGKILL after `grace`, or SIGKILL at once with `kill`. False when there is
    /// no such process.
    pub fn hold(&mut self, name: &str, grace: Duration, kill: bool) -> bool {
        let Some(p) = self.procs.iter_mut().find(|p| p.spec.name == name) else { return false };
        p.held = true;
        p.due = None;
        if let Some(mut child) = p.child.take() {
            if kill {
                let _ = child.kill();
                let _ = child.wait();
            } else {
                terminate(&mut child, grace);
            }
            let how = if kill { "killed on request" } else { "stopped on request" };
            note(&p.spec, how);
            p.last_exit = Some(how.to_owned());
        }
        true
    }

    /// Starts a held process again. False when there is no such process.
    pub fn release(&mut self, name: &str) -> Result<bool, SuperviseError> {
        let Some(p) = self.procs.iter_mut().find(|p| p.spec.name == name) else { return Ok(false) };
        p.held = false;
        if p.child.is_none() {
            let child = spawn(&p.spec)?;
            p.restarts += 1;
            p.started = Instant::now();
            p.backoff = BACKOFF_MIN;
            note(&p.spec, &format!("started on request, pid {}", child.id()));
            p.child = Some(child);
        }
        Ok(true)
    }

    /// Replaces process `name` without a gap: starts `spec` beside the running one, waits until
    /// `ready(pid)` holds for the new one's pid (at most `timeout`), then stops the old one (SIGTERM, SIGKILL after
    /// `grace`) and supervises the new one under the same name. If the new one does not become
    /// ready it is stopped and the old one keeps running. Returns the new pid.
    pub fn replace(
        &mut self,
        name: &str,
        spec: ProcessSpec,
        ready: &mut dyn FnMut(u32) -> bool,
        timeout: Duration,
        grace: Duration,
    ) -> Result<u32, ReplaceError> {
        let Some(i) = self.procs.iter().position(|p| p.spec.name == name) else {
            return Err(ReplaceError::Unknown(name.to_owned()));
        };
        let mut child = spawn(&spec)?;
        note(&spec, &format!("replacement started, pid {}", child.id()));
        let deadline = Instant::now() + timeout;
        while !ready(child.id()) {
            if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
                terminate(&mut child, grace);
                note(&spec, "replacement did not become ready; the running process stays");
                return Err(ReplaceError::NotReady { name: name.to_owned(), waited: timeout });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let p = &mut self.procs[i];
        if let Some(mut old) = p.child.take() {
            terminate(&mut old, grace);
            note(&p.spec, "replaced: the previous process was stopped");
        }
        let pid = child.id();
        p.child = Some(child);
        p.spec = spec;
        p.restarts += 1;
        p.started = Instant::now();
        p.held = false;
        p.due = None;
        Ok(pid)
    }

    /// The spec of process `name`.
    pub fn spec(&self, name: &str) -> Option<&ProcessSpec> {
        self.procs.iter().find(|p| p.spec.name == name).map(|p| &p.spec)
    }

    /// Stops everything, in reverse start order.
    pub fn stop_all(&mut self, grace: Duration) {
        while let Some(name) = self.procs.last().map(|p| p.spec.name.clone()) {
            self.stop(&name, grace);
        }
    }

    /// Each process's state, in start order.
    pub fn status(&self) -> Vec<ProcessStatus> {
        self.procs
            .iter()
            .map(|p| ProcessStatus {
                name: p.spec.name.clone(),
                pid: p.child.as_ref().map(Child::id),
                restarts: p.restarts,
                last_exit: p.last_exit.clone(),
                running: p.child.is_some(),
                held: p.held,
                crash_loop: p.restarts > 0
                    && !p.held
                    && ((p.child.is_none() && p.due.is_some())
                        || (p.backoff >= BACKOFF_MIN * 4 && p.started.elapsed() < HEALTHY_AFTER)),
            })
            .collect()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop_all(Duration::from_secs(2));
    }
}

fn spawn(spec: &ProcessSpec) -> Result<Child, SuperviseError> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .map_err(|source| SuperviseError::Log { path: spec.log.clone(), source })?;
    let log_err = log.try_clone().map_err(|source| SuperviseError::Log { path: spec.log.clone(), source })?;
    let mut cmd = match &spec.netns {
        Some(ns) => ip::exec_in(ns, &spec.program, &[]),
        None => Command::new(&spec.program),
    };
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    cmd.spawn().map_err(|source| SuperviseError::Spawn {
        name: spec.name.clone(),
        program: spec.program.clone(),
        source,
    })
}

/// SIGTERM, wait up to `grace`, then SIGKILL; always reaps.
fn terminate(child: &mut Child, grace: Duration) {
    stop_pid(child.id(), grace);
    let _ = child.wait();
}

/// SIGTERM `pid`, wait up to `grace` for it to be gone (or a zombie), then SIGKILL. For a
/// process of ours the caller still reaps it.
pub fn stop_pid(pid: u32, grace: Duration) {
    use nix::sys::signal::{Signal, kill};
    let target = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
    let _ = kill(target, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !crate::state::pid_alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = kill(target, Signal::SIGKILL);
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => {
            let name = nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str()).unwrap_or("?");
            format!("signal {sig} ({name})")
        }
        _ => status.to_string(),
    }
}

/// Appends a supervisor line to the process's log.
fn note(spec: &ProcessSpec, what: &str) {
    let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if let Ok(mut f) = OpenOptions::new().append(true).open(&spec.log) {
        let _ = writeln!(f, "--- ambit supervisor: {} {what} (unix time {secs})", spec.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &std::path::Path, name: &str, script: &str, restart: bool) -> ProcessSpec {
        ProcessSpec {
            name: name.into(),
            netns: None,
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            log: dir.join(format!("{name}.log")),
            restart,
        }
    }

    fn tick_until(
        s: &mut Supervisor,
        timeout: Duration,
        mut done: impl FnMut(&[Event]) -> bool,
    ) -> Vec<Event> {
        let deadline = Instant::now() + timeout;
        let mut all = Vec::new();
        while Instant::now() < deadline {
            all.extend(s.tick());
            if done(&all) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        all
    }

    #[test]
    fn a_crashed_process_is_restarted_counted_and_logged() {
        let tmp = tempfile::tempdir().expect("tmp");
        let mut s = Supervisor::new();
        s.start(sh(tmp.path(), "crashy", "echo run; exit 3", true)).expect("start");
        let events = tick_until(&mut s, Duration::from_secs(5), |e| {
            e.iter().filter(|e| matches!(e, Event::Restarted { .. })).count() >= 2
        });
        assert!(events.contains(&Event::Exited { name: "crashy".into(), status: "exit status 3".into() }));
        assert!(events.contains(&Event::Restarted { name: "crashy".into(), restarts: 2 }), "{events:?}");
        let status = &s.status()[0];
        assert!(status.restarts >= 2);
        assert_eq!(status.last_exit.as_deref(), Some("exit status 3"));
        let log = std::fs::read_to_string(tmp.path().join("crashy.log")).expect("log");
        assert!(log.matches("run\n").count() >= 2, "{log}");
        assert!(log.contains("--- ambit supervisor: crashy exited (exit status 3)"), "{log}");
        assert!(log.contains("--- ambit supervisor: crashy restarted (restart 1), pid "), "{log}");
    }

    #[test]
    fn stop_terminates_and_a_one_shot_process_is_not_restarted() {
        let tmp = tempfile::tempdir().expect("tmp");
        let mut s = Supervisor::new();
        let pid = s.start(sh(tmp.path(), "server", "exec sleep 30", true)).expect("start");
        s.start(sh(tmp.path(), "once", "exit 0", false)).expect("start");
        assert!(matches!(
            s.start(sh(tmp.path(), "once", "exit 0", false)),
            Err(SuperviseError::Duplicate(n)) if n == "once"
        ));
        let events = tick_until(&mut s, Duration::from_secs(3), |e| !e.is_empty());
        assert_eq!(events, [Event::Exited { name: "once".into(), status: "exit status 0".into() }]);
        assert!(tick_until(&mut s, Duration::from_millis(400), |e| !e.is_empty()).is_empty(), "restarted");
        assert_eq!(s.status()[0].pid, Some(pid));
        let started = Instant::now();
        assert!(s.stop("server", Duration::from_secs(5)));
        assert!(started.elapsed() < Duration::from_secs(2), "SIGTERM did not stop sleep");
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "still running");
        assert!(!s.stop("server", Duration::from_secs(1)));
    }

    #[test]
    fn a_held_process_stays_down_until_released_and_a_replacement_takes_over_without_a_gap() {
        let tmp = tempfile::tempdir().expect("tmp");
        let mut s = Supervisor::new();
        let first = s.start(sh(tmp.path(), "srv", "exec sleep 30", true)).expect("start");
        assert!(s.hold("srv", Duration::from_secs(2), true));
        assert!(tick_until(&mut s, Duration::from_millis(400), |e| !e.is_empty()).is_empty(), "restarted");
        assert!(!crate::state::pid_alive(first));
        let st = &s.status()[0];
        assert!(st.held && !st.running && st.last_exit.as_deref() == Some("killed on request"), "{st:?}");
        assert!(s.release("srv").expect("release"));
        let second = s.status()[0].pid.expect("running again");
        assert_ne!(second, first);
        // The replacement is ready once its marker file exists; the old one runs until then.
        let marker = tmp.path().join("ready");
        let spec = sh(tmp.path(), "srv", &format!("touch {}; exec sleep 30", marker.display()), true);
        let mut ready = |_: u32| marker.exists() && crate::state::pid_alive(second);
        let third = s
            .replace("srv", spec, &mut ready, Duration::from_secs(5), Duration::from_secs(2))
            .expect("replace");
        assert!(!crate::state::pid_alive(second), "the old one still runs");
        assert_eq!(s.status()[0].pid, Some(third));
        // A replacement that never gets ready leaves the running one alone.
        let never = sh(tmp.path(), "srv", "exec sleep 30", true);
        let err = s.replace("srv", never, &mut |_| false, Duration::from_millis(200), Duration::from_secs(1));
        assert!(matches!(err, Err(ReplaceError::NotReady { .. })), "{err:?}");
        assert_eq!(s.status()[0].pid, Some(third));
        assert!(matches!(
            s.replace("nope", sh(tmp.path(), "nope", "", false), &mut |_| true, Duration::ZERO, Duration::ZERO),
            Err(ReplaceError::Unknown(n)) if n == "nope"
        ));
        let log = std::fs::read_to_string(tmp.path().join("srv.log")).expect("log");
        assert!(log.contains("killed on request") && log.contains("started on request"), "{log}");
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().expect("tmp");
        let mut s = Supervisor::new();
        let mut spec = sh(tmp.path(), "ghost", "", false);
        spec.program = "/nonexistent/ambit".into();
        let err = s.start(spec).expect_err("no such program");
        assert_eq!(
            err.to_string(),
            "cannot start ghost (/nonexistent/ambit): No such file or directory (os error 2)"
        );
    }
}
