//! Istio-standard metrics (`istio_tcp_*`, `istio_dns_*`, `istio_build`), the process and
//! runtime collectors (`process_*`, `tokio_*`) and the access log.
//!
//! Access-log fields that a peer can fill (error texts that quote its input, identities from its
//! certificate) are cut to [`MAX_LOG_FIELD`] bytes, so one request cannot write a 60 KB line.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::state::{Service, Workload};

/// Who reports a connection.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reporter {
    /// The client side (outbound).
    source,
    /// The server side (inbound, passthrough).
    destination,
}

/// Istio's CommonTrafficLabels, in Istio's order. Empty values render as `unknown`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabels {
    reporter: Reporter,
    source_workload: Label,
    source_canonical_service: Label,
    source_canonical_revision: Label,
    source_workload_namespace: Label,
    source_principal: Label,
    source_app: Label,
    source_version: Label,
    source_cluster: Label,
    destination_service: Label,
    destination_service_namespace: Label,
    destination_service_name: Label,
    destination_workload: Label,
    destination_canonical_service: Label,
    destination_canonical_revision: Label,
    destination_workload_namespace: Label,
    destination_principal: Label,
    destination_app: Label,
    destination_version: Label,
    destination_cluster: Label,
    request_protocol: Label,
    response_flags: Label,
    connection_security_policy: Label,
    #[prometheus(flatten)]
    locality: LocalityLabels,
}

/// `source_region`, `source_zone`, `destination_region`, `destination_zone`: present whenever the
/// source or the destination workload is known (the unknown side renders `unknown`), absent
/// otherwise.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
struct LocalityLabels(Option<[Label; 4]>);

impl EncodeLabelSet for LocalityLabels {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let Some([sr, sz, dr, dz]) = &self.0 else { return Ok(()) };
        [
            ("source_region", sr.clone()),
            ("source_zone", sz.clone()),
            ("destination_region", dr.clone()),
            ("destination_zone", dz.clone()),
        ]
        .encode(encoder)
    }
}

/// A label value that renders `unknown` when empty.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Label(pub String);

impl EncodeLabelValue for Label {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        if self.0.is_empty() { encoder.write_str("unknown") } else { encoder.write_str(&self.0) }
    }
}

/// Response flags (`-` when none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    /// No failure.
    None,
    /// Denied by policy.
    Deny,
    /// Upstream connect or other failure.
    Connect,
    /// TLS handshake failure.
    TlsFailure,
    /// HTTP/2 handshake failure.
    H2HandshakeFailure,
    /// HBONE dial timed out.
    NetworkPolicy,
    /// Certificate or identity error.
    IdentityError,
}

impl Flag {
    fn as_str(self) -> &'static str {
        match self {
            Flag::None => "-",
            Flag::Deny => "DENY",
            Flag::Connect => "CONNECT",
            Flag::TlsFailure => "TLS_FAILURE",
            Flag::H2HandshakeFailure => "H2_HANDSHAKE_FAILURE",
            Flag::NetworkPolicy => "NETWORK_POLICY",
            Flag::IdentityError => "IDENTITY_ERROR",
        }
    }
}

/// The proxy's metric families.
#[derive(Clone)]
pub struct Metrics {
    opened: Family<TrafficLabels, Counter>,
    closed: Family<TrafficLabels, Counter>,
    received: Family<TrafficLabels, Counter>,
    sent: Family<TrafficLabels, Counter>,
    failed: Family<TrafficLabels, Counter>,
    sockets_open: Family<ReporterLabel, Gauge>,
    /// `sockets_open` for reporter=source and reporter=destination.
    open_by_reporter: [Gauge; 2],
    handles: Arc<Mutex<HashMap<HandleKey, Arc<Handles>>>>,
    dns: DnsMetrics,
    /// The last connections denied by policy.
    pub denials: crate::denials::Denials,
}

/// The counters of one label set, looked up once and then shared by every connection with
/// the same peers: building the 23 labels, hashing and comparing them four times per
/// connection was the largest user-space cost of a new connection.
struct Handles {
    opened: Counter,
    closed: Counter,
    received: Counter,
    sent: Counter,
}

/// What the labels of an established connection are derived from. Workloads and services are
/// compared by identity of their `Arc` (the state hands out new ones when they change), and the
/// key holds them, so an address cannot be reused while cached.
#[derive(Clone)]
struct HandleKey {
    reporter: Reporter,
    src: Option<Arc<Workload>>,
    dst: Option<Arc<Workload>>,
    service: Option<Arc<Service>>,
    src_id: Option<ambit_identity::Identity>,
    dst_id: Option<ambit_identity::Identity>,
    mtls: bool,
}

impl HandleKey {
    fn of(info: &ConnectionInfo) -> HandleKey {
        HandleKey {
            reporter: info.reporter,
            src: info.src_workload.clone(),
            dst: info.dst_workload.clone(),
            service: info.dst_service.clone(),
            src_id: info.src_identity.clone(),
            dst_id: info.dst_identity.clone(),
            mtls: info.mtls,
        }
    }
}

fn ptr<T>(a: &Option<Arc<T>>) -> usize {
    a.as_ref().map_or(0, |a| Arc::as_ptr(a) as usize)
}

impl PartialEq for HandleKey {
    fn eq(&self, o: &Self) -> bool {
        self.reporter == o.reporter
            && ptr(&self.src) == ptr(&o.src)
            && ptr(&self.dst) == ptr(&o.dst)
            && ptr(&self.service) == ptr(&o.service)
            && self.mtls == o.mtls
            && self.src_id == o.src_id
            && self.dst_id == o.dst_id
    }
}

impl Eq for HandleKey {}

impl std::hash::Hash for HandleKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.reporter, ptr(&self.src), ptr(&self.dst), ptr(&self.service), self.mtls).hash(h);
        // Identities follow from the workloads in practice; hashing them adds little.
    }
}

/// Cached label sets; past this many, the cache starts over (state churn, many peers).
const MAX_CACHED_HANDLES: usize = 4096;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReporterLabel {
    reporter: Reporter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: String,
    tag: String,
}

impl Metrics {
    /// Registers the families (names as scraped get `istio_` and `_total` added).
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            opened: Family::default(),
            closed: Family::default(),
            received: Family::default(),
            sent: Family::default(),
            failed: Family::default(),
            sockets_open: Family::default(),
            open_by_reporter: [Gauge::default(), Gauge::default()],
            handles: Arc::default(),
            dns: DnsMetrics::default(),
            denials: crate::denials::Denials::default(),
        };
        let m = Metrics {
            open_by_reporter: [Reporter::source, Reporter::destination]
                .map(|reporter| m.sockets_open.get_or_create(&ReporterLabel { reporter }).clone()),
            ..m
        };
        let istio = registry.sub_registry_with_prefix("istio");
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                component: "ztunnel".into(),
                tag: std::env::var("ISTIO_META_ISTIO_VERSION").unwrap_or_else(|_| "unknown".into()),
            })
            .set(1);
        istio.register("build", "Istio component build info", build);
        istio.register(
            "tcp_connections_opened",
            "The total number of TCP connections opened",
            m.opened.clone(),
        );
        istio.register(
            "tcp_connections_closed",
            "The total number of TCP connections closed",
            m.closed.clone(),
        );
        istio.register(
            "tcp_received_bytes",
            "The size of total bytes received during request in case of a TCP connection",
            m.received.clone(),
        );
        istio.register(
            "tcp_sent_bytes",
            "The size of total bytes sent during response in case of a TCP connection",
            m.sent.clone(),
        );
        istio.register(
            "tcp_connections_failed",
            "The total number of TCP connections that failed to establish (unstable)",
            m.failed.clone(),
        );
        istio.register(
            "tcp_sockets_open",
            "The current number of open TCP sockets (unstable)",
            m.sockets_open.clone(),
        );
        m.dns.register(istio);
        m
    }

    /// The DNS proxies' families (shared by every DNS proxy of the process).
    pub fn dns(&self) -> &DnsMetrics {
        &self.dns
    }

    fn handles(&self, info: &ConnectionInfo) -> Arc<Handles> {
        let key = HandleKey::of(info);
        let mut cache = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = cache.get(&key) {
            return h.clone();
        }
        let labels = labels(info, Flag::None);
        let h = Arc::new(Handles {
            opened: self.opened.get_or_create(&labels).clone(),
            closed: self.closed.get_or_create(&labels).clone(),
            received: self.received.get_or_create(&labels).clone(),
            sent: self.sent.get_or_create(&labels).clone(),
        });
        if cache.len() >= MAX_CACHED_HANDLES {
            cache.clear();
        }
        cache.insert(key, h.clone());
        h
    }

    fn open_gauge(&self, reporter: Reporter) -> &Gauge {
        match reporter {
            Reporter::source => &self.open_by_reporter[0],
            Reporter::destination => &self.open_by_reporter[1],
        }
    }
}

/// Buckets of `istio_dns_upstream_request_duration_seconds` (ztunnel's).
pub const DNS_DURATION_BUCKETS: [f64; 6] = [0.0005, 0.001, 0.01, 0.1, 1.0, 5.0];

/// Istio's DnsLabels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DnsLabels {
    /// Lower-case query type (`a`, `aaaa`, `txt`, …).
    pub request_query_type: String,
    /// `udp` or `tcp`.
    pub request_protocol: String,
    /// The asking workload's canonical service (`unknown` when not known).
    pub source_canonical_service: Label,
    /// The asking workload's canonical revision (`unknown` when not known).
    pub source_canonical_revision: Label,
}

type DurationFamily = Family<DnsLabels, Histogram, fn() -> Histogram>;

/// The DNS proxy's families (`istio_dns_*`). A `DnsMetrics` that was never registered counts
/// into families nobody scrapes (tests, tools).
#[derive(Clone, Debug)]
pub struct DnsMetrics {
    requests: Family<DnsLabels, Counter>,
    upstream_requests: Family<DnsLabels, Counter>,
    upstream_failures: Family<DnsLabels, Counter>,
    upstream_duration: DurationFamily,
}

impl Default for DnsMetrics {
    fn default() -> DnsMetrics {
        DnsMetrics {
            requests: Family::default(),
            upstream_requests: Family::default(),
            upstream_failures: Family::default(),
            upstream_duration: Family::new_with_constructor(|| Histogram::new(DNS_DURATION_BUCKETS)),
        }
    }
}

impl DnsMetrics {
    /// Registers the families on `istio` (the `istio_`-prefixed registry).
    fn register(&self, istio: &mut Registry) {
        istio.register("dns_requests", "Total number of DNS requests (unstable)", self.requests.clone());
        istio.register(
            "dns_upstream_requests",
            "Total number of DNS requests forwarded to upstream resolvers (unstable)",
            self.upstream_requests.clone(),
        );
        istio.register(
            "dns_upstream_failures",
            "Total number of DNS requests that upstream resolvers failed to answer (unstable)",
            self.upstream_failures.clone(),
        );
        istio.register_with_unit(
            "dns_upstream_request_duration",
            "Time taken to get a DNS answer from upstream resolvers (unstable)",
            Unit::Seconds,
            self.upstream_duration.clone(),
        );
    }

    /// Counts one query (answered locally or forwarded).
    pub fn request(&self, labels: &DnsLabels) {
        self.requests.get_or_create(labels).inc();
    }

    /// Counts one forwarded query that took `elapsed`, and whether the upstreams failed it.
    pub fn upstream(&self, labels: &DnsLabels, elapsed: Duration, failed: bool) {
        self.upstream_requests.get_or_create(labels).inc();
        self.upstream_duration.get_or_create(labels).observe(elapsed.as_secs_f64());
        if failed {
            self.upstream_failures.get_or_create(labels).inc();
        }
    }
}

/// What is known about one connection, for metrics and the access log.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    /// Reporting side.
    pub reporter: Reporter,
    /// Client socket address.
    pub src_addr: std::net::SocketAddr,
    /// Source workload, if known.
    pub src_workload: Option<Arc<Workload>>,
    /// Source identity (mTLS only).
    pub src_identity: Option<ambit_identity::Identity>,
    /// L4 peer: pod IP:15008, the app, or the passthrough target.
    pub dst_addr: std::net::SocketAddr,
    /// CONNECT authority (HBONE only).
    pub hbone_addr: Option<std::net::SocketAddr>,
    /// Destination service, if known.
    pub dst_service: Option<Arc<Service>>,
    /// Destination workload, if known.
    pub dst_workload: Option<Arc<Workload>>,
    /// Destination identity (mTLS only).
    pub dst_identity: Option<ambit_identity::Identity>,
    /// mTLS was used.
    pub mtls: bool,
}

/// Live per-connection accounting: opened at creation, closed (with a log line) at `finish`.
pub struct ConnectionRecord {
    metrics: Metrics,
    info: ConnectionInfo,
    handles: Arc<Handles>,
    start: std::time::Instant,
    /// Counters for the copy loop (client→server, server→client), shared with the copy.
    pub counters: Arc<crate::copy::LiveCounters>,
}

impl ConnectionRecord {
    /// Records a newly established connection.
    pub fn open(metrics: &Metrics, info: ConnectionInfo) -> ConnectionRecord {
        let handles = metrics.handles(&info);
        handles.opened.inc();
        metrics.open_gauge(info.reporter).inc();
        let counters = Arc::new(crate::copy::LiveCounters::new(
            vec![handles.received.clone()],
            vec![handles.sent.clone()],
        ));
        tracing::debug!(target: "access",
            { src.addr = %info.src_addr, dst.addr = %info.dst_addr, direction = direction(info.reporter) },
            "connection opened");
        ConnectionRecord {
            metrics: metrics.clone(),
            info,
            handles,
            start: std::time::Instant::now(),
            counters,
        }
    }

    /// Bytes moved so far.
    pub fn snapshot(&self) -> crate::copy::Transferred {
        self.counters.transferred()
    }

    /// Records the end of the connection and writes its access-log line.
    pub fn finish(self, transferred: crate::copy::Transferred, error: Option<&dyn std::fmt::Display>) {
        self.handles.closed.inc();
        self.metrics.open_gauge(self.info.reporter).dec();
        let error = error.map(|e| e.to_string());
        access_log(&self.info, transferred, self.start.elapsed(), error.as_deref());
    }
}

/// Registers, on the root registry (no prefix), the process collector (`process_open_fds`,
/// `process_max_fds`, `process_resident_memory_bytes`, `process_cpu_seconds_total`) and the
/// collector of `runtime`'s stable tokio metrics (`tokio_*`, per worker where labelled).
pub fn register_process_and_runtime(registry: &mut Registry, runtime: tokio::runtime::Handle) {
    registry.register_collector(Box::new(ProcessCollector));
    registry.register_collector(Box::new(RuntimeCollector { runtime }));
}

/// `process_*`, read from `/proc/self` and `getrlimit`/`getrusage` at each scrape.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use nix::sys::resource::{Resource, UsageWho, getrlimit, getrusage};
        let e = &mut encoder;
        // Families whose source cannot be read are left out rather than reported as 0.
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle itself is one of the entries.
            let open = dir.count().saturating_sub(1) as u64;
            single(e, "process_open_fds", "Number of open file descriptors", None, ConstGauge::new(open))?;
        }
        if let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) {
            single(
                e,
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                ConstGauge::new(soft),
            )?;
        }
        if let Some(rss) = resident_bytes() {
            let help = "Resident memory size in bytes";
            single(e, "process_resident_memory", help, Some(Unit::Bytes), ConstGauge::new(rss))?;
        }
        if let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            let cpu = ConstCounter::new(secs(usage.user_time()) + secs(usage.system_time()));
            let help = "Total user and system CPU time spent in seconds";
            single(e, "process_cpu", help, Some(Unit::Seconds), cpu)?;
        }
        Ok(())
    }
}

/// Encodes one family of one unlabelled sample.
fn single(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, unit.as_ref(), metric.metric_type())?)
}

/// `VmRSS` of `/proc/self/status`, in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kb.checked_mul(1024)
}

/// The stable `RuntimeMetrics` of the data-path runtime (tokio without `tokio_unstable`).
#[derive(Debug)]
struct RuntimeCollector {
    runtime: tokio::runtime::Handle,
}

impl Collector for RuntimeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let m = self.runtime.metrics();
        let workers = m.num_workers();
        for (name, help, value) in [
            ("tokio_num_workers", "The number of worker threads used by the runtime", workers),
            (
                "tokio_global_queue_depth",
                "The number of tasks currently scheduled in the runtime's global queue",
                m.global_queue_depth(),
            ),
            (
                "tokio_num_alive_tasks",
                "The current number of alive tasks in the runtime",
                m.num_alive_tasks(),
            ),
        ] {
            single(&mut encoder, name, help, None, ConstGauge::new(value as u64))?;
        }
        {
            let mut family = encoder.encode_descriptor(
                "tokio_worker_total_busy_duration",
                "The amount of time the given worker thread has been busy",
                Some(&Unit::Seconds),
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for i in 0..workers {
                let c = ConstCounter::new(m.worker_total_busy_duration(i).as_secs_f64());
                c.encode(family.encode_family(&[("worker", i.to_string())])?)?;
            }
        }
        for (name, help, read) in [
            (
                "tokio_worker_park_count",
                "The total number of times the given worker thread has parked",
                tokio::runtime::RuntimeMetrics::worker_park_count
                    as fn(&tokio::runtime::RuntimeMetrics, usize) -> u64,
            ),
            (
                "tokio_worker_park_unpark_count",
                "The total number of times the given worker thread has parked and unparked",
                tokio::runtime::RuntimeMetrics::worker_park_unpark_count,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for i in 0..workers {
                let c = ConstCounter::new(read(&m, i));
                c.encode(family.encode_family(&[("worker", i.to_string())])?)?;
            }
        }
        Ok(())
    }
}

/// Longest value of one access-log field (bytes); longer ones are cut, saying how long they were.
pub const MAX_LOG_FIELD: usize = 1024;

pub use ambit_admin::clip;

/// Records a connection denied by policy: counted and logged as a failure with the DENY flag,
/// and kept among the recent denials with the policies that decided.
pub fn record_denial<'a>(
    metrics: &Metrics,
    info: &ConnectionInfo,
    reason: &crate::authz::DenyReason,
    policies: impl IntoIterator<Item = &'a crate::authz::Authorization>,
) {
    metrics.denials.record(info, reason, policies);
    let e = format!("connection closed due to policy rejection: {reason}");
    record_failure(metrics, info, Flag::Deny, &e);
}

/// Records a connection that failed before it was established (no bytes, flag set).
pub fn record_failure(metrics: &Metrics, info: &ConnectionInfo, flag: Flag, error: &dyn std::fmt::Display) {
    let labels = labels(info, flag);
    metrics.failed.get_or_create(&labels).inc();
    let e = error.to_string();
    let e = clip(&e, MAX_LOG_FIELD);
    let src_id = info.src_identity.as_ref().map(ToString::to_string).unwrap_or_default();
    tracing::warn!(target: "access", {
        src.addr = %info.src_addr,
        src.workload = info.src_workload.as_deref().map(|w| &*w.name).unwrap_or_default(),
        src.identity = %clip(&src_id, MAX_LOG_FIELD),
        dst.addr = %info.dst_addr,
        dst.workload = info.dst_workload.as_deref().map(|w| &*w.name).unwrap_or_default(),
        direction = direction(info.reporter),
        error = %e },
        "connection failed");
}

fn direction(r: Reporter) -> &'static str {
    match r {
        Reporter::source => "outbound",
        Reporter::destination => "inbound",
    }
}

fn access_log(info: &ConnectionInfo, t: crate::copy::Transferred, elapsed: Duration, error: Option<&str>) {
    let src_w = info.src_workload.as_deref();
    let dst_w = info.dst_workload.as_deref();
    let src_id = info.src_identity.as_ref().map(clipped);
    let dst_id = info.dst_identity.as_ref().map(clipped);
    let error = error.map(|e| clip(e, MAX_LOG_FIELD));
    let hbone = info.hbone_addr.map(|a| a.to_string());
    let duration = Millis(elapsed);
    macro_rules! line {
        ($lvl:ident, $msg:literal) => {
            tracing::$lvl!(target: "access", {
                src.addr = %info.src_addr,
                src.workload = src_w.map(|w| &*w.name),
                src.namespace = src_w.map(|w| w.namespace.as_str()),
                src.identity = src_id.as_deref(),
                dst.addr = %info.dst_addr,
                dst.hbone_addr = hbone.as_deref(),
                dst.service = info.dst_service.as_deref().map(|s| s.hostname.as_str()),
                dst.workload = dst_w.map(|w| &*w.name),
                dst.namespace = dst_w.map(|w| w.namespace.as_str()),
                dst.identity = dst_id.as_deref(),
                direction = direction(info.reporter),
                bytes_sent = if info.reporter == Reporter::source { t.sent } else { t.received },
                bytes_recv = if info.reporter == Reporter::source { t.received } else { t.sent },
                duration = %duration,
                error = error.as_deref() },
                $msg)
        };
    }
    if error.is_some() {
        line!(error, "connection complete");
    } else {
        line!(info, "connection complete");
    }
}

/// An identity as the access log writes it: cut at [`MAX_LOG_FIELD`] (copied again only then).
fn clipped(id: &ambit_identity::Identity) -> String {
    let s = id.to_string();
    if s.len() <= MAX_LOG_FIELD { s } else { clip(&s, MAX_LOG_FIELD).into_owned() }
}

/// A duration as the access log writes it, `<whole milliseconds>ms`, formatted into the line.
struct Millis(Duration);

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ms", self.0.as_millis())
    }
}

fn labels(info: &ConnectionInfo, flag: Flag) -> TrafficLabels {
    let s = info.src_workload.as_deref();
    let d = info.dst_workload.as_deref();
    let w = |w: Option<&Workload>, f: fn(&Workload) -> &str| Label(w.map(f).unwrap_or_default().to_owned());
    let principal =
        |id: &Option<ambit_identity::Identity>| Label(id.as_ref().map(|i| i.to_string()).unwrap_or_default());
    let svc = info.dst_service.as_deref();
    TrafficLabels {
        reporter: info.reporter,
        source_workload: w(s, |w| if w.workload_name.is_empty() { &w.name } else { &w.workload_name }),
        source_canonical_service: w(s, |w| &w.canonical_name),
        source_canonical_revision: w(s, |w| &w.canonical_revision),
        source_workload_namespace: w(s, |w| &w.namespace),
        source_principal: principal(&info.src_identity),
        source_app: w(s, |w| &w.canonical_name),
        source_version: w(s, |w| &w.canonical_revision),
        source_cluster: w(s, |w| &w.cluster_id),
        destination_service: Label(svc.map(|s| s.hostname.clone()).unwrap_or_default()),
        destination_service_namespace: Label(svc.map(|s| s.namespace.clone()).unwrap_or_default()),
        destination_service_name: Label(svc.map(|s| s.name.clone()).unwrap_or_default()),
        destination_workload: w(d, |w| if w.workload_name.is_empty() { &w.name } else { &w.workload_name }),
        destination_canonical_service: w(d, |w| &w.canonical_name),
        destination_canonical_revision: w(d, |w| &w.canonical_revision),
        destination_workload_namespace: w(d, |w| &w.namespace),
        destination_principal: principal(&info.dst_identity),
        destination_app: w(d, |w| &w.canonical_name),
        destination_version: w(d, |w| &w.canonical_revision),
        destination_cluster: w(d, |w| &w.cluster_id),
        request_protocol: Label("tcp".into()),
        response_flags: Label(flag.as_str().into()),
        connection_security_policy: Label(if info.mtls { "mutual_tls" } else { "unknown" }.into()),
        locality: LocalityLabels((s.is_some() || d.is_some()).then(|| {
            [
                w(s, |w| &w.locality.region),
                w(s, |w| &w.locality.zone),
                w(d, |w| &w.locality.region),
                w(d, |w| &w.locality.zone),
            ]
        })),
    }
}

#[cfg(test)]
mod tests;
