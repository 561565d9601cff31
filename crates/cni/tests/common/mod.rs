//! Test helpers: run the built `ambit-cni` binary, and a fake node agent on a unix socket.

#![allow(clippy::unwrap_used, dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A process environment as name/value pairs.
pub type EnvList = Vec<(String, String)>;

/// What the fake agent does with each request.
#[derive(Clone)]
pub enum Mode {
    /// Answer with this status and body after `delay`.
    Reply { status: u16, body: &'static str, delay: Duration },
    /// Read the request, then close without answering (an agent killed mid-request).
    Hangup,
}

impl Mode {
    pub fn ok() -> Mode {
        Mode::Reply { status: 200, body: "", delay: Duration::ZERO }
    }
}

/// One request the fake agent received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub head: String,
    pub body: String,
}

/// A fake node agent listening on `<dir>/pluginevent.sock`.
pub struct FakeAgent {
    pub dir: tempfile::TempDir,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<usize>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeAgent {
    pub fn start(mode: Mode) -> FakeAgent {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("pluginevent.sock")).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, connections, seen) = (stop.clone(), connections.clone(), seen.clone());
            thread::spawn(move || {
                // Keep accepting until told to stop, then drain what is already queued.
                loop {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            *connections.lock().unwrap() += 1;
                            stream.set_nonblocking(false).unwrap();
                            if let Some(s) = handle(stream, &mode) {
                                seen.lock().unwrap().push(s);
                            }
                        }
                        Err(_) if stop.load(Ordering::SeqCst) => break,
                        Err(_) => thread::sleep(Duration::from_millis(1)),
                    }
                }
            })
        };
        FakeAgent { dir, stop, connections, seen, thread: Some(thread) }
    }

    pub fn run_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops accepting and returns how many connections were made and what was received.
    pub fn finish(mut self) -> (usize, Vec<Seen>) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let n = *self.connections.lock().unwrap();
        let seen = self.seen.lock().unwrap().clone();
        (n, seen)
    }
}

fn handle(stream: std::os::unix::net::UnixStream, mode: &Mode) -> Option<Seen> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let seen = Seen { head, body: String::from_utf8(body).ok()? };
    let mut stream = reader.into_inner();
    match mode {
        Mode::Hangup => {}
        Mode::Reply { status, body, delay } => {
            thread::sleep(*delay);
            let reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes());
        }
    }
    Some(seen)
}

/// The outcome of one plugin exec.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Run {
    /// The CNI error object printed on failure.
    pub fn error(&self) -> serde_json::Value {
        assert_eq!(self.code, Some(1), "expected failure, got {self:?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("error is not JSON ({e}): {self:?}"))
    }

    /// The numeric CNI error code.
    pub fn error_code(&self) -> u64 {
        self.error()["code"].as_u64().unwrap()
    }

    /// The error message.
    pub fn error_msg(&self) -> String {
        self.error()["msg"].as_str().unwrap().to_owned()
    }

    pub fn assert_success(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success, got {self:?}");
        &self.stdout
    }
}

/// The standard environment of a pod ADD. `CNI_NETNS` is the spec's example path, which does not
/// exist here, so `CNI_NETNS_OVERRIDE=1` skips the plugin's own netns checks (tested on their
/// own in `netns_checks_*`).
pub fn pod_env(command: &str, pod: &str, namespace: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("CNI_COMMAND".to_owned(), command.to_owned()),
        ("CNI_CONTAINERID".to_owned(), "0c8a0e2f5b7d".to_owned()),
        ("CNI_NETNS".to_owned(), "/var/run/netns/cni-5f1c".to_owned()),
        ("CNI_NETNS_OVERRIDE".to_owned(), "1".to_owned()),
        ("CNI_IFNAME".to_owned(), "eth0".to_owned()),
        ("CNI_PATH".to_owned(), "/opt/cni/bin".to_owned()),
    ];
    let args = if pod.is_empty() {
        "IgnoreUnknown=1".to_owned()
    } else {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID=0c8a0e2f5b7d;K8S_POD_UID=863b91d4-4b68-4efa-917f-4b560e3e86aa"
        )
    };
    env.push(("CNI_ARGS".to_owned(), args));
    env
}

/// Removes one variable from an environment list.
pub fn without(mut env: Vec<(String, String)>, name: &str) -> Vec<(String, String)> {
    env.retain(|(k, _)| k != name);
    env
}

/// A network configuration for the plugin entry, with `extra` JSON members appended.
pub fn conf(version: &str, run_dir: &Path, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"k8s-pod-network","type":"ambit-cni","cni_agent_run_dir":"{}","exclude_namespaces":["kube-system"],"pod_namespace":"ambit-system","system_pods":[{{"role":"agent","namespace":"ambit-system","generateName":"ambit-agent-"}},{{"role":"proxy","namespace":"ambit-system","generateName":"ztunnel-"}}]{extra}}}"#,
        run_dir.display()
    )
}

/// Runs the plugin binary with exactly `env` and `stdin`.
pub fn exec(env: &[(String, String)], stdin: &str) -> Run {
    let mut cmd = Command::new(binary());
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    // The plugin may exit without reading stdin (VERSION); a broken pipe is fine then.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    let out = child.wait_with_output().unwrap();
    let took = start.elapsed();
    let mut stdout = String::from_utf8(out.stdout).unwrap();
    if stdout.ends_with('\n') {
        stdout.pop();
    }
    Run { code: out.status.code(), stdout, stderr: String::from_utf8_lossy(&out.stderr).into_owned(), took }
}

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ambit-cni"))
}
