//! A child process that is killed when its guard drops, with its output kept for failure reports.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A spawned process that is killed (SIGKILL) and reaped on drop; prints its output if the
/// test is panicking.
pub struct ChildGuard {
    label: String,
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    exited: Option<ExitStatus>,
    /// Where the output goes instead of memory (long-running, chatty processes).
    log_file: Option<std::path::PathBuf>,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr collected (stdin closed); panics if it cannot start.
    pub fn spawn(label: &str, mut cmd: Command) -> ChildGuard {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot spawn {label} ({cmd:?}): {e}"));
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(collect(out, Arc::clone(&output)));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(collect(err, Arc::clone(&output)));
        }
        ChildGuard { label: label.to_owned(), child, output, readers, exited: None, log_file: None }
    }

    /// Like [`ChildGuard::spawn`] with stdout and stderr appended to `log` instead of kept in
    /// memory (for benchmarks: a proxy logs two lines per connection).
    pub fn spawn_to_file(label: &str, mut cmd: Command, log: &std::path::Path) -> ChildGuard {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap_or_else(|e| panic!("cannot open {} for {label}: {e}", log.display()))
        };
        cmd.stdin(Stdio::null()).stdout(open()).stderr(open());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot spawn {label} ({cmd:?}): {e}"));
        ChildGuard {
            label: label.to_owned(),
            child,
            output: Arc::default(),
            readers: Vec::new(),
            exited: None,
            log_file: Some(log.to_owned()),
        }
    }

    /// The process id (with `ip netns exec` this is the program itself: it execs in place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process wrote to stdout and stderr so far (interleaved as it arrived).
    pub fn logs(&self) -> String {
        if let Some(file) = &self.log_file {
            return std::fs::read(file).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        }
        let out = self.output.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Waits up to `timeout` for `needle` to appear in the output. The output arrives through a
    /// pipe or a file after the process's log writer thread writes it, so a line can land a
    /// little after whatever else the line's event did is visible.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        super::wait_for(|| self.logs().contains(needle), timeout)
    }

    /// Sends `signal` to the process (no-op once it has been reaped).
    pub fn signal(&mut self, signal: Signal) {
        if self.exited.is_none() {
            let _ = kill(pid_of(&self.child), signal);
        }
    }

    /// The exit status if the process has exited (reaping it), `None` while it runs.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; returns the exit status and waits for output to drain.
    pub fn stop(&mut self, grace: Duration) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        let status = match self.wait_timeout(grace) {
            Some(status) => status,
            None => self.kill(),
        };
        self.drain();
        status
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        let _ = self.child.kill();
        let status = self.child.wait().unwrap_or_else(|e| panic!("cannot reap {}: {e}", self.label));
        self.exited = Some(status);
        status
    }

    fn drain(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
        self.drain();
        if std::thread::panicking()
            && let Some(file) = &self.log_file
        {
            let logs = self.logs();
            let tail = logs.char_indices().rev().nth(20_000).map_or(0, |(i, _)| i);
            eprintln!(
                "----- last lines of {} (pid {}, all in {}) -----\n{}\n----- end of {} -----",
                self.label,
                self.child.id(),
                file.display(),
                &logs[tail..],
                self.label
            );
        } else if std::thread::panicking() {
            eprintln!(
                "----- output of {} (pid {}) -----\n{}\n----- end of {} -----",
                self.label,
                self.child.id(),
                self.logs(),
                self.label
            );
        }
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

fn collect(mut from: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => into.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(&buf[..n]),
            }
        }
    })
}

/// The hard open-files limit of this process.
pub fn hard_nofile() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("read /proc/self/limits");
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|v| v.parse().ok())
        .expect("Max open files in /proc/self/limits")
}

/// Resident memory of a process (`VmRSS`), in KiB; 0 if it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// A KiB figure of a process's `/proc/<pid>/status` (`VmRSS`, `VmHWM`: its peak RSS), 0 if it
/// is gone.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of `pids`, in seconds (panics if one is gone: its CPU would be lost).
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let hz = *HZ.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().expect("run getconf CLK_TCK");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("CLK_TCK is a number")
    });
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_else(|e| panic!("process {pid} is gone: {e}"));
            // Fields after the command name (which may contain spaces) start at field 3.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (ticks(11) + ticks(12)) / hz
        })
        .sum()
}
