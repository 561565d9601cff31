//! The `ambit` binary: each subcommand wires Ambit's libraries into one process.

#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Ambit: a sidecar-less service-mesh data plane.
#[derive(Parser)]
#[command(name = "ambit", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node proxy (ztunnel-compatible): HBONE mTLS tunnel, L4 authorization, metrics.
    ///
    /// Every setting is an environment variable with ztunnel's name; flags override them.
    Proxy(Box<ambit_proxy::config::ProxyArgs>),
    /// Run the node agent: enrollment, in-pod traffic capture, the ZDS server for the node
    /// proxy and the CNI plugin's event server.
    Agent(Box<ambit_agent::app::AgentArgs>),
    /// Development certificate authority for FAKE_CA_ROOT.
    DevCa {
        #[command(subcommand)]
        command: DevCaCommand,
    },
}

#[derive(Subcommand)]
enum DevCaCommand {
    /// Create DIR/root-cert.pem and DIR/root-key.pem: a root that several `FAKE_CA=true` proxies
    /// can share (FAKE_CA_ROOT=DIR) so that they trust each other. For development only.
    Init {
        /// Directory to write into (created if missing).
        dir: PathBuf,
        /// Overwrite an existing root.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Proxy(args) => {
            ambit_proxy::app::init_logging(&args.rust_log, args.log_format == "json");
            let cfg = match ambit_proxy::config::Config::from_args(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ambit proxy: {e}");
                    return ExitCode::from(2);
                }
            };
            match ambit_proxy::app::run(cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("ambit proxy: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Agent(args) => {
            ambit_proxy::app::init_logging(&args.rust_log, false);
            match ambit_agent::app::run(*args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ambit agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::DevCa { command: DevCaCommand::Init { dir, force } } => {
            match ambit_identity::dev_ca_init(&dir, force) {
                Ok(()) => {
                    println!("wrote {0}/root-cert.pem and {0}/root-key.pem", dir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("ambit dev-ca init: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
