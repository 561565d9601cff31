//! `ambit app`: the demo applications `ambit up` runs as containers (any `command:` works too).
//!
//! - `ambit app echo --port P`: a TCP server. To each connection it first sends one JSON line,
//!   `{"server":"<pod>","peer":"<ip:port>","local":"<ip:port>"}` (who answered, and the peer
//!   address it saw: in the mesh, the client pod's own address), then echoes what it receives.
//!   An HTTP request (HTTP/1.1 or HTTP/2 prior knowledge, told from the first bytes) is served
//!   by hyper instead (see [`http::serve`]): the same JSON plus what it saw of the request,
//!   `…/status/<code>` answered with that status, `…/delay/<ms>` after that long, gRPC echoed.
//! - `ambit app client ADDR [--count N] [--timeout D]`: opens N connections to ADDR (`ip:port`
//!   or `name:port`, the name resolved for each connection as curl does, through the pod's
//!   resolver) one after the other and prints one JSON line per connection: the server's line
//!   when one came, or how the connection ended (`refused`, `reset`, `closed` with no reply,
//!   `timeout`, `dns` when the name did not resolve).
//! - `ambit app http URL [--method M] [-H 'name: value'] [--count N] [--http2] [--grpc]`: sends N
//!   requests on ONE keep-alive connection (HTTP/1.1, or HTTP/2 with prior knowledge) and prints
//!   one JSON line per request: its status, the server that answered, gRPC's status (see
//!   [`http`]).
//!
//! The HTTP side of `echo` and `http` is hyper's, not ours: the demo application is no place
//! for another HTTP implementation.

mod http;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde_json::json;

/// The demo applications.
#[derive(Parser)]
pub struct AppArgs {
    #[command(subcommand)]
    command: AppCommand,
}

#[derive(Subcommand)]
enum AppCommand {
    /// A TCP (and HTTP) server that says who answered and which peer address it saw, then echoes.
    Echo {
        /// The port to listen on (all addresses).
        #[arg(long, default_value_t = 8080)]
        port: u16,
    },
    /// Connects to ADDR and prints what came back, one JSON line per connection.
    Client {
        /// `ip:port` or `name:port` to connect to.
        addr: String,
        /// How many connections, one after the other.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// How long to wait for the connection and for the server's line.
        #[arg(long, default_value = "3s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Sends requests on one keep-alive connection and prints one JSON line per request.
    Http(http::HttpArgs),
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a duration like 3s or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(format!("{s:?}: the unit must be ms or s")),
    }
}

/// Most bytes one echo connection may send before the server closes it.
const MAX_ECHO: u64 = 64 << 20;
/// How long an echo connection may stay idle.
const IDLE: Duration = Duration::from_secs(60);

/// Runs `ambit app …`.
pub fn run(args: AppArgs) -> Result<(), String> {
    match args.command {
        AppCommand::Echo { port } => echo(port),
        AppCommand::Http(args) => http::client(&args),
        AppCommand::Client { addr, count, timeout } => {
            let mut failed = 0;
            for _ in 0..count {
                let line = match resolve(&addr) {
                    Ok(a) => client(a, timeout),
                    Err(e) => json!({ "addr": addr, "error": "dns", "detail": e }),
                };
                if line.get("reply").is_none() {
                    failed += 1;
                }
                println!("{line}");
            }
            if failed > 0 { Err(format!("{failed} of {count} connections got no reply")) } else { Ok(()) }
        }
    }
}

fn echo(port: u16) -> Result<(), String> {
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
    let server = std::env::var("POD_NAME").unwrap_or_else(|_| "echo".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    eprintln!("ambit app echo: {server} listening on port {port}");
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let (server, rt) = (server.clone(), rt.handle().clone());
        std::thread::spawn(move || {
            let _ = serve(conn, &server, &rt);
        });
    }
    Ok(())
}

fn serve(mut conn: TcpStream, server: &str, rt: &tokio::runtime::Handle) -> std::io::Result<()> {
    let peer = conn.peer_addr()?;
    let local = conn.local_addr()?;
    // An HTTP client speaks first; a line client waits for our line. Peek briefly to tell.
    conn.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut first = [0u8; 4];
    let speaks_http = matches!(conn.peek(&mut first), Ok(4) if http::starts_a_request(&first));
    conn.set_read_timeout(Some(IDLE))?;
    if speaks_http {
        let who = http::Who { server: server.to_owned(), peer: unmapped(peer), local: unmapped(local) };
        rt.spawn(http::serve(conn, who));
        return Ok(());
    }
    let hello = json!({ "server": server, "peer": unmapped(peer), "local": unmapped(local) }).to_string();
    conn.write_all(format!("{hello}\n").as_bytes())?;
    let mut r = conn.try_clone()?.take(MAX_ECHO);
    std::io::copy(&mut r, &mut conn)?;
    Ok(())
}

/// `::ffff:a.b.c.d` shown as `a.b.c.d`.
pub(crate) fn unmapped(a: SocketAddr) -> String {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()).to_string(),
            None => a.to_string(),
        },
        SocketAddr::V4(_) => a.to_string(),
    }
}

/// `ip:port`, or `name:port` through the system's resolver (its first IPv4 address, else its
/// first address).
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let all: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| format!("{addr}: {e}"))?.collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().ok_or_else(|| format!("{addr}: no address"))
}

fn client(addr: SocketAddr, timeout: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    let ms = |t0: Instant| (t0.elapsed().as_secs_f64() * 1e4).round() / 10.0;
    let mut conn = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(c) => c,
        Err(e) => {
            return json!({ "addr": addr.to_string(), "error": kind(&e), "detail": e.to_string(), "ms": ms(t0) });
        }
    };
    let local = conn.local_addr().map(unmapped).unwrap_or_default();
    let _ = conn.set_read_timeout(Some(timeout));
    let _ = conn.write_all(b"hello from ambit app client\n");
    let mut reader = BufReader::new(&mut conn).take(64 * 1024);
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => {
            json!({ "addr": addr.to_string(), "local": local, "error": "closed", "detail": "closed with no reply", "ms": ms(t0) })
        }
        Ok(_) => match serde_json::from_str::<serde_json::Value>(line.trim()) {
            Ok(reply) => json!({ "addr": addr.to_string(), "local": local, "reply": reply, "ms": ms(t0) }),
            Err(_) => {
                json!({ "addr": addr.to_string(), "local": local, "error": "garbled", "detail": line.trim(), "ms": ms(t0) })
            }
        },
        Err(e) => {
            json!({ "addr": addr.to_string(), "local": local, "error": kind(&e), "detail": e.to_string(), "ms": ms(t0) })
        }
    }
}

pub(crate) fn kind(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "refused",
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => "reset",
        K::TimedOut | K::WouldBlock => "timeout",
        K::UnexpectedEof => "closed",
        _ => "error",
    }
}
