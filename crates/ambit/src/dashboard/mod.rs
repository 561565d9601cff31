//! `ambit dashboard`: a picture of the mesh in the browser. A read-only page (its assets built
//! into the binary) draws the graph of workloads and Services with live edges, and a click shows
//! what is behind a node or an edge; the page polls `/api/graph` and asks `/api/node` and
//! `/api/edge` on a click. The data comes from the local cluster (`ambit up`), or in a cluster
//! from the control plane's monitoring endpoints and a Prometheus that scrapes the proxies.
//!
//! It binds a loopback address unless told otherwise (it has no login), refuses requests whose
//! `Host` is not that address (a web page elsewhere cannot reach it through DNS rebinding),
//! answers only GET and HEAD, and reads its sources at most once per [`MIN_REFRESH`] however
//! many pages poll it.

mod collect;
mod details;
mod graph;
mod logs;
mod prometheus;

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_admin::Body;
use bytes::Bytes;
use clap::Args;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::Mutex;

use crate::up::Where;

/// The page's default port.
pub const DEFAULT_PORT: u16 = 15600;

/// Sources are read at most this often, however many pages poll.
pub const MIN_REFRESH: Duration = Duration::from_secs(1);

/// Seconds the page waits between refreshes.
const INTERVAL: u64 = 2;

/// Longest query string accepted.
const MAX_QUERY: usize = 1024;

/// `ambit dashboard`.
#[derive(Args, Debug)]
pub struct DashboardArgs {
    /// The port to serve on.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// The address to serve on; one that is not loopback needs --allow-remote.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: IpAddr,
    /// Serve on a non-loopback address although the page has no login (anyone who reaches the
    /// address sees the mesh's workloads, policies and traffic).
    #[arg(long)]
    pub allow_remote: bool,
    /// In a cluster: the control plane's monitoring address (`http://HOST:15014`, e.g. through
    /// `kubectl port-forward -n istio-system deploy/ambit-control 15014`). Needs --prometheus.
    #[arg(long, requires = "prometheus")]
    pub control: Option<String>,
    /// In a cluster: a Prometheus that scrapes the proxies and waypoints (`http://HOST:9090`).
    /// Needs --control.
    #[arg(long, requires = "control")]
    pub prometheus: Option<String>,
    #[command(flatten)]
    pub at: Where,
}

/// Where the data comes from.
enum Source {
    /// The local cluster: its record names every component.
    Local(crate::context::Target),
    /// A cluster: the control plane and a Prometheus.
    Remote { control: SocketAddr, prometheus: SocketAddr, description: String },
}

impl Source {
    fn collect(&self) -> collect::Snapshot {
        match self {
            Source::Local(at) => match at.load() {
                Ok(state) => {
                    let layout = ambit_cluster::up::Layout(at.run_dir.clone());
                    collect::Local { state, layout }.collect()
                }
                Err(e) => collect::Snapshot {
                    generated: ambit_identity::rfc3339(std::time::SystemTime::now()),
                    source: format!("local cluster {}", at.run_dir.display()),
                    problems: vec![e],
                    ..collect::Snapshot::default()
                },
            },
            Source::Remote { control, prometheus, description } => {
                let mut s = collect::Snapshot {
                    generated: ambit_identity::rfc3339(std::time::SystemTime::now()),
                    source: description.clone(),
                    ..collect::Snapshot::default()
                };
                collect::read_control(&mut s, None, *control);
                prometheus::read(&mut s, *prometheus);
                s.problems.push(
                    "from Prometheus: denials are counted, but the last denied connections, certificates and \
                     access logs need the proxies' admin endpoints (`ambit inspect --admin`)"
                        .into(),
                );
                s
            }
        }
    }
}

/// What the last refresh read and drew.
struct Current {
    at: Instant,
    snapshot: Arc<collect::Snapshot>,
    graph: Arc<graph::Graph>,
    body: Bytes,
    etag: String,
}

/// The server's state.
struct Dashboard {
    source: Source,
    current: Mutex<(Option<Current>, graph::Previous)>,
    /// The `Host` values accepted (empty: any).
    hosts: Vec<String>,
}

impl Dashboard {
    /// The current snapshot and graph, read again when older than [`MIN_REFRESH`].
    async fn current(self: &Arc<Self>) -> (Arc<collect::Snapshot>, Arc<graph::Graph>, Bytes, String) {
        let mut guard = self.current.lock().await;
        if let Some(c) = guard.0.as_ref().filter(|c| c.at.elapsed() < MIN_REFRESH) {
            return (c.snapshot.clone(), c.graph.clone(), c.body.clone(), c.etag.clone());
        }
        let me = self.clone();
        let mut previous = std::mem::take(&mut guard.1);
        let built = tokio::task::spawn_blocking(move || {
            let snapshot = me.source.collect();
            let index = details::Index::new(&snapshot);
            let graph = graph::build(&snapshot, |id| index.policies(id).len(), &mut previous, INTERVAL);
            drop(index);
            (snapshot, graph, previous)
        })
        .await;
        let (snapshot, graph, previous) = match built {
            Ok(b) => b,
            Err(e) => {
                let s = collect::Snapshot {
                    problems: vec![format!("reading the sources failed: {e}")],
                    ..Default::default()
                };
                let g =
                    graph::Graph { problems: s.problems.clone(), interval: INTERVAL, ..Default::default() };
                (s, g, graph::Previous::default())
            }
        };
        let body = Bytes::from(serde_json::to_vec(&graph).unwrap_or_default());
        // The same graph read at another time is the same answer: a poll gets 304.
        let etag = etag(
            &serde_json::to_vec(&graph::Graph { generated: String::new(), ..graph.clone() })
                .unwrap_or_default(),
        );
        let c =
            Current { at: Instant::now(), snapshot: Arc::new(snapshot), graph: Arc::new(graph), body, etag };
        let out = (c.snapshot.clone(), c.graph.clone(), c.body.clone(), c.etag.clone());
        *guard = (Some(c), previous);
        out
    }
}

/// A strong validator of a body.
fn etag(body: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    format!("\"{:016x}\"", h.finish())
}

/// Runs `ambit dashboard`.
pub fn dashboard(args: DashboardArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ambit dashboard: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: DashboardArgs) -> Result<(), String> {
    if !args.address.is_loopback() && !args.allow_remote {
        return Err(format!(
            "{} is not a loopback address and the dashboard has no login: anyone who reaches it sees \
             the mesh's workloads, policies and traffic; add --allow-remote to serve there anyway",
            args.address
        ));
    }
    let source = match (&args.control, &args.prometheus) {
        (Some(c), Some(p)) => Source::Remote {
            control: crate::inspect::address(c)?,
            prometheus: crate::inspect::address(p)?,
            description: format!("control plane {c}, Prometheus {p}"),
        },
        _ => Source::Local(args.at.resolve()?),
    };
    let addr = SocketAddr::new(args.address, args.port);
    runtime()?.block_on(async move {
        let listener = ambit_admin::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        println!("ambit dashboard: http://{bound}/ (Ctrl-C stops it)");
        tokio::select! {
            () = serve(listener, source, args.allow_remote) => {}
            () = ambit_admin::shutdown_signal() => {}
        }
        Ok(())
    })
}

/// Serves the local cluster's page on `addr` from a thread of its own, for as long as the
/// process lives (the cluster's owner does, while the cluster is up); the address bound.
pub fn spawn_local(at: crate::context::Target, addr: SocketAddr) -> Result<SocketAddr, String> {
    let listener = ambit_admin::bind_std(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("dashboard".into())
        .spawn(move || {
            let runtime = match runtime() {
                Ok(r) => r,
                Err(e) => return tracing::warn!("the dashboard stopped: {e}"),
            };
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve(l, Source::Local(at), false).await,
                    Err(e) => tracing::warn!("the dashboard stopped: {e}"),
                }
            });
        })
        .map_err(|e| format!("cannot start the dashboard's thread: {e}"))?;
    Ok(bound)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

/// Serves the page on `listener` until the process ends.
async fn serve(listener: tokio::net::TcpListener, source: Source, allow_remote: bool) {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let state = Arc::new(Dashboard {
        hosts: if allow_remote { Vec::new() } else { hosts(port) },
        source,
        current: Mutex::new((None, graph::Previous::default())),
    });
    ambit_admin::serve(listener, move |req| {
        let state = state.clone();
        async move { handle(req, state).await }
    })
    .await;
}

/// The `Host` values a loopback server answers.
fn hosts(port: u16) -> Vec<String> {
    ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .flat_map(|h| [format!("{h}:{port}"), (*h).to_owned()])
        .collect()
}

/// The page's files: path, type, content.
const ASSETS: [(&str, &str, &str); 6] = [
    ("/", "text/html; charset=utf-8", include_str!("assets/index.html")),
    ("/index.html", "text/html; charset=utf-8", include_str!("assets/index.html")),
    ("/app.css", "text/css; charset=utf-8", include_str!("assets/app.css")),
    ("/app.js", "text/javascript; charset=utf-8", include_str!("assets/app.js")),
    ("/graph.js", "text/javascript; charset=utf-8", include_str!("assets/graph.js")),
    ("/panel.js", "text/javascript; charset=utf-8", include_str!("assets/panel.js")),
];

/// The page's content security policy: its own assets only.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
    connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

async fn handle(req: Request<Incoming>, state: Arc<Dashboard>) -> Response<Body> {
    if !state.hosts.is_empty() {
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        if !state.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return error(StatusCode::FORBIDDEN, &format!("Host {host:?} is not this dashboard's address"));
        }
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "the dashboard is read-only: GET and HEAD only");
        r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let query = req.uri().query().unwrap_or_default();
    if query.len() > MAX_QUERY {
        return error(StatusCode::URI_TOO_LONG, &format!("the query is longer than {MAX_QUERY} bytes"));
    }
    let id =
        || ambit_admin::query_pairs(Some(query)).into_iter().rev().find(|(k, _)| k == "id").map(|(_, v)| v);
    let path = req.uri().path();
    let mut r = match path {
        _ if let Some((_, kind, body)) = ASSETS.iter().find(|(p, _, _)| *p == path) => asset(kind, body),
        "/api/graph" => {
            let (_, _, body, etag) = state.current().await;
            let unchanged = req
                .headers()
                .get(header::IF_NONE_MATCH)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
            let mut r = if unchanged {
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::NOT_MODIFIED;
                r
            } else {
                json_body(body)
            };
            if let Ok(v) = header::HeaderValue::from_str(&etag) {
                r.headers_mut().insert(header::ETAG, v);
            }
            r
        }
        "/api/node" | "/api/edge" => {
            let Some(id) = id() else { return error(StatusCode::BAD_REQUEST, "the query needs ?id=") };
            let (snapshot, graph, _, _) = state.current().await;
            let index = details::Index::new(&snapshot);
            let found = if req.uri().path() == "/api/node" {
                index.node(&id, &graph).map(|d| serde_json::to_vec(&d))
            } else {
                index.edge(&id, &graph).map(|d| serde_json::to_vec(&d))
            };
            match found {
                Some(Ok(body)) => json_body(Bytes::from(body)),
                Some(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("does not serialize: {e}")),
                None => {
                    let what = if req.uri().path() == "/api/node" { "node" } else { "edge" };
                    error(StatusCode::NOT_FOUND, &format!("no {what} {id} in the graph now"))
                }
            }
        }
        path => error(StatusCode::NOT_FOUND, &format!("no page {path}")),
    };
    let h = r.headers_mut();
    h.insert("content-security-policy", header::HeaderValue::from_static(CSP));
    h.insert("x-content-type-options", header::HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", header::HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", header::HeaderValue::from_static("DENY"));
    if req.method() == Method::HEAD {
        *r.body_mut() = Full::new(Bytes::new());
    }
    r
}

fn asset(content_type: &'static str, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    r.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    r
}

fn json_body(body: Bytes) -> Response<Body> {
    let mut r = Response::new(Full::new(body));
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    r
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::to_vec(&serde_json::json!({ "error": message })).unwrap_or_default();
    let mut r = json_body(Bytes::from(body));
    *r.status_mut() = status;
    r
}
