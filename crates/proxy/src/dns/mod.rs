//! The per-pod DNS proxy (port 15053, UDP and TCP): answers A/AAAA queries for mesh services
//! from the mesh state and forwards everything else to the upstream resolvers.
//!
//! The proxy never creates sockets on its own: listeners are handed to
//! [`DnsProxy::serve_udp`]/[`DnsProxy::serve_tcp`], and upstream sockets come from an
//! [`UpstreamSockets`] factory, so that in-pod proxies can create both inside the pod's network
//! namespace, marked.

mod config;
mod forward;
mod lookup;
mod serve;

#[cfg(test)]
mod tests;

/// Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a normal build).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Checks `reply` as an upstream resolver's answer to an `example.test. A` query whose id is
    /// the reply's own (so the checks past the id run too).
    pub fn upstream_reply(reply: &[u8]) {
        let Ok(name) = Name::from_ascii("example.test.") else { return };
        let question = Query::query(name, RecordType::A);
        let id = reply.get(..2).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
        let upstream = SocketAddr::from(([127, 0, 0, 53], 53));
        let _ = forward::check(upstream, reply, id, Some(&question));
    }
}

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hickory_proto::op::{Edns, Header, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use crate::metrics::{DnsLabels, DnsMetrics, Label};
use crate::state::StateStore;

pub use config::DnsConfig;
pub use forward::ForwardError;

use lookup::{Family, Names};

/// TTL of locally answered records.
pub const TTL_SECONDS: u32 = 30;
/// How long an upstream exchange (TCP connect included) may take.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);
/// Smallest UDP payload every client accepts (RFC 1035).
const MIN_UDP_PAYLOAD: u16 = 512;

/// Who is asking: the pod the DNS proxy serves (namespace and network drive visibility/preference).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsClient {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's network (VIPs on other networks are not returned).
    pub network: String,
    /// The pod itself, when known: its workload's canonical service and revision label the
    /// `istio_dns_*` metrics.
    pub workload: Option<ambit_zds::WorkloadInfo>,
}

/// Creates upstream sockets (so the caller can create them in the right netns, marked).
pub trait UpstreamSockets: Send + Sync + 'static {
    /// A UDP socket to reach `upstream`; bound or connected as the caller likes (the proxy
    /// connects it to `upstream` itself before use).
    fn udp(&self, upstream: SocketAddr) -> std::io::Result<tokio::net::UdpSocket>;
    /// A TCP connection to `upstream` (the proxy bounds it by `UPSTREAM_TIMEOUT`).
    fn tcp(&self, upstream: SocketAddr) -> BoxFuture<'_, std::io::Result<tokio::net::TcpStream>>;
}

/// Transport a query arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Datagrams; answers are truncated to the client's payload size.
    Udp,
    /// Length-prefixed messages on a stream.
    Tcp,
}

/// The DNS proxy of one pod.
pub struct DnsProxy {
    state: StateStore,
    cfg: Arc<DnsConfig>,
    client: DnsClient,
    names: Names,
    forwarder: forward::Forwarder,
    metrics: DnsMetrics,
}

impl DnsProxy {
    /// A proxy answering for `client` from `state`, forwarding through `upstream` sockets and
    /// counting into `metrics`.
    pub fn new(
        state: StateStore,
        cfg: Arc<DnsConfig>,
        client: DnsClient,
        upstream: Arc<dyn UpstreamSockets>,
        metrics: DnsMetrics,
    ) -> Arc<DnsProxy> {
        Arc::new(Self::build(state, cfg, client, upstream, UPSTREAM_TIMEOUT, metrics))
    }

    fn build(
        state: StateStore,
        cfg: Arc<DnsConfig>,
        client: DnsClient,
        upstream: Arc<dyn UpstreamSockets>,
        timeout: Duration,
        metrics: DnsMetrics,
    ) -> DnsProxy {
        let names = Names::new(&cfg, &client);
        let forwarder = forward::Forwarder::new(cfg.upstreams.clone(), upstream, timeout);
        DnsProxy { state, cfg, client, names, forwarder, metrics }
    }

    /// The DnsLabels of a query of `query_type` over `protocol` from this proxy's pod.
    fn labels(&self, query_type: RecordType, protocol: Protocol) -> DnsLabels {
        let source = self
            .client
            .workload
            .as_ref()
            .and_then(|w| self.state.current().find_local(&w.namespace, &w.name, &w.service_account));
        DnsLabels {
            request_query_type: query_type.to_string().to_ascii_lowercase(),
            request_protocol: protocol.to_string(),
            source_canonical_service: Label(
                source.as_ref().map(|w| w.canonical_name.to_string()).unwrap_or_default(),
            ),
            source_canonical_revision: Label(
                source.as_ref().map(|w| w.canonical_revision.to_string()).unwrap_or_default(),
            ),
        }
    }

    /// Answers one query message (bytes in, bytes out) — the core, used by both loops and by tests.
    ///
    /// `None` means the input is not a DNS message (no reply on UDP, close on TCP).
    pub async fn answer(&self, query: &[u8], protocol: Protocol) -> Option<Vec<u8>> {
        let metadata = read_metadata(query)?;
        if metadata.message_type == MessageType::Response {
            return error(&metadata, None, ResponseCode::FormErr);
        }
        if metadata.op_code != OpCode::Query {
            return error(&metadata, None, ResponseCode::NotImp);
        }
        let request = Message::from_vec(query).ok()?;
        let limit = match protocol {
            Protocol::Udp => {
                request.edns.as_ref().map_or(MIN_UDP_PAYLOAD, |e| e.max_payload().max(MIN_UDP_PAYLOAD))
            }
            Protocol::Tcp => u16::MAX,
        };
        let [question] = request.queries.as_slice() else {
            return error(&metadata, Some(&request), ResponseCode::FormErr);
        };
        let labels = self.labels(question.query_type(), protocol);
        self.metrics.request(&labels);
        if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            return error(&metadata, Some(&request), ResponseCode::BADVERS);
        }
        let family = match (question.query_class(), question.query_type()) {
            (DNSClass::IN, RecordType::A) => Some(Family::V4),
            (DNSClass::IN, RecordType::AAAA) => Some(Family::V6),
            _ => None,
        };
        let local = family.and_then(|f| self.local(&request, question, f));
        let bytes = match local {
            Some(bytes) => bytes,
            None => match self.forward(&request, protocol, &labels).await {
                Ok(bytes) => {
                    self.log(question, "forwarded", 0);
                    bytes
                }
                Err(e) => {
                    self.log(question, &format!("forwarding failed ({e})"), 0);
                    return error(&metadata, Some(&request), ResponseCode::ServFail);
                }
            },
        };
        if bytes.len() > usize::from(limit) {
            return truncated(&request);
        }
        Some(bytes)
    }

    /// Forwards `request` upstream, recording the `istio_dns_upstream_*` metrics.
    async fn forward(
        &self,
        request: &Message,
        protocol: Protocol,
        labels: &DnsLabels,
    ) -> Result<Vec<u8>, ForwardError> {
        let start = std::time::Instant::now();
        let result = self.forwarder.forward(request, protocol).await;
        self.metrics.upstream(labels, start.elapsed(), result.is_err());
        result
    }

    /// The authoritative answer for a mesh name; `None` if the name is not in the mesh.
    fn local(&self, request: &Message, question: &Query, family: Family) -> Option<Vec<u8>> {
        let state = self.state.current();
        let labels = lookup::query_labels(question.name().iter())?;
        let found = lookup::find(&state, &self.cfg, &self.names, &self.client, &labels)?;
        let addrs = lookup::addresses(&state, &self.cfg, &self.client, &found.service, family);

        let mut response = respond(request);
        response.metadata.authoritative = true;
        if !addrs.is_empty() {
            let mut owner = question.name().clone();
            if let Some(kept) = found.cname_labels {
                let stripped = Name::from_labels(question.name().iter().take(kept)).ok()?;
                response.add_answer(Record::from_rdata(
                    owner,
                    TTL_SECONDS,
                    RData::CNAME(CNAME(stripped.clone())),
                ));
                owner = stripped;
            }
            for ip in &addrs {
                let rdata = match ip {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                response.add_answer(Record::from_rdata(owner.clone(), TTL_SECONDS, rdata));
            }
        }
        let result = if addrs.is_empty() { "no records" } else { "success" };
        self.log(question, result, addrs.len());
        response.to_vec().ok()
    }

    fn log(&self, question: &Query, result: &str, endpoints: usize) {
        tracing::debug!(
            target: "dns",
            query = %question.query_type(),
            src.namespace = %self.client.namespace,
            domain = %question.name(),
            result,
            endpoints,
        );
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Udp => "udp",
            Protocol::Tcp => "tcp",
        })
    }
}

impl fmt::Debug for DnsProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnsProxy")
            .field("client", &self.client)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// The header alone, so that responses and other opcodes are refused even when the body is
/// something hickory cannot decode.
fn read_metadata(bytes: &[u8]) -> Option<Metadata> {
    Header::read(&mut BinDecoder::new(bytes)).ok().map(|h| h.metadata)
}

/// An empty response to `request`: same id, opcode, RD/CD and question, RA set, EDNS echoed.
fn respond(request: &Message) -> Message {
    let mut response = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
    response.metadata = Metadata::response_from_request(&request.metadata);
    response.metadata.recursion_available = true;
    response.add_queries(request.queries.iter().cloned());
    if let Some(req) = &request.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(req.max_payload().max(MIN_UDP_PAYLOAD));
        edns.set_dnssec_ok(req.flags().dnssec_ok);
        response.set_edns(edns);
    }
    response
}

/// An error response; the question and EDNS are echoed when the request could be decoded.
fn error(metadata: &Metadata, request: Option<&Message>, code: ResponseCode) -> Option<Vec<u8>> {
    let mut response = match request {
        Some(r) => respond(r),
        None => {
            let mut m = Message::new(metadata.id, MessageType::Response, metadata.op_code);
            m.metadata = Metadata::response_from_request(metadata);
            m.metadata.recursion_available = true;
            m
        }
    };
    response.metadata.response_code = code;
    if code == ResponseCode::BADVERS && response.edns.is_none() {
        response.set_edns(Edns::new());
    }
    response.to_vec().ok()
}

/// A header-only response with TC set, telling a UDP client to retry over TCP.
fn truncated(request: &Message) -> Option<Vec<u8>> {
    let mut response = respond(request);
    response.metadata.truncation = true;
    response.to_vec().ok()
}
