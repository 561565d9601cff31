//! The `ambit-cni` executable: runs one CNI command and prints its result or error.

use std::io::Write;
use std::process::ExitCode;

use ambit_cni::CniError;
use ambit_cni::plugin::{self, Env, Output};

fn main() -> ExitCode {
    // stdout is reserved for the result/error JSON; a panic report goes to stderr only, and
    // `catch_panics` turns the panic into a CNI error object.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("ambit-cni: internal error: {info}");
    }));
    let outcome = plugin::catch_panics(|| {
        let env = Env::from_process();
        plugin::run(&env, &mut std::io::stdin().lock())
    });
    match outcome {
        Ok(Output::Stdout(json)) => print_stdout(&json),
        Ok(Output::Nothing) => ExitCode::SUCCESS,
        Ok(Output::About(text)) => {
            eprintln!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn print_stdout(json: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{json}").and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ambit-cni: cannot write the result to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

fn fail(e: &CniError) -> ExitCode {
    let mut out = std::io::stdout().lock();
    if let Err(write_err) = writeln!(out, "{}", e.to_json()).and_then(|()| out.flush()) {
        eprintln!("ambit-cni: {e}; also cannot write the error to stdout: {write_err}");
    }
    ExitCode::FAILURE
}
