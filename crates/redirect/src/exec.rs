//! Running the rule tools (`nft`, `iptables*`, `ip`, `ipset`) from the current thread, so that
//! children inherit the thread's network namespace.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::RedirectError;

/// Runs `program args` with `stdin` as input and returns its output, whatever its exit status.
pub(crate) fn output(program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output, RedirectError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawn_error = |source| RedirectError::Spawn { program: program.to_owned(), source };
    let mut child = cmd.spawn().map_err(spawn_error)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Inputs are a few KiB: the pipe buffer takes them before the tool starts writing output.
        let written = pipe.write_all(input.as_bytes());
        drop(pipe);
        if let Err(source) = written {
            let _ = child.wait();
            return Err(spawn_error(source));
        }
    }
    child.wait_with_output().map_err(spawn_error)
}

/// Runs `program args` and fails with its stderr unless it exits successfully.
pub(crate) fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output, RedirectError> {
    let out = output(program, args, stdin)?;
    if out.status.success() { Ok(out) } else { Err(failure(program, args, &out)) }
}

/// The error for a finished command that failed.
pub(crate) fn failure(program: &str, args: &[&str], out: &Output) -> RedirectError {
    RedirectError::Command {
        command: command_line(program, args),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    }
}

/// `program arg arg...` for messages.
pub(crate) fn command_line(program: &str, args: &[&str]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        line.push(' ');
        line.push_str(arg);
    }
    line
}

/// Standard output as text.
pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
