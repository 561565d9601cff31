//! The rows `ambit inspect` prints, built from the proxies' and the control plane's JSON, and
//! the table they make for people (`-o json|yaml` print the same rows as objects).

use ambit_control::translate::explain;
use serde::Serialize;
use serde_json::Value;

/// A row of a table: its column titles and cells, and lines shown under it.
pub trait Row {
    /// The column titles.
    fn header() -> &'static [&'static str];
    /// The cells, one per title.
    fn cells(&self) -> Vec<String>;
    /// Lines shown under the row, indented (a policy's rules and warnings).
    fn details(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The rows as aligned columns.
pub fn table<R: Row>(rows: &[R]) -> String {
    if rows.is_empty() {
        return "(none)\n".to_owned();
    }
    let header: Vec<String> = R::header().iter().map(|h| (*h).to_owned()).collect();
    let cells: Vec<Vec<String>> = rows.iter().map(Row::cells).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out += c;
            } else {
                out += &format!("{c:<w$}  ");
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&header);
    for (row, cells) in rows.iter().zip(&cells) {
        out += &line(cells);
        for d in row.details() {
            out += &format!("    {d}\n");
        }
    }
    out
}

fn text(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
        .collect()
}

pub(super) fn dash(s: String) -> String {
    if s.is_empty() { "-".to_owned() } else { s }
}

/// A waypoint reference as `destination:port`.
fn gateway(v: &Value) -> String {
    if v.is_null() {
        return String::new();
    }
    let d = &v["destination"];
    let dest = match d {
        Value::String(s) => s.clone(),
        Value::Object(m) => m
            .get("hostname")
            .or_else(|| m.get("address"))
            .map_or_else(|| d.to_string(), |x| x.as_str().map_or_else(|| x.to_string(), str::to_owned)),
        other => other.to_string(),
    };
    format!("{dest}:{}", v["hbonePort"].as_u64().or(v["hboneMtlsPort"].as_u64()).unwrap_or(15008))
}

fn in_namespace(ns: Option<&str>, have: &str) -> bool {
    ns.is_none_or(|n| n == have)
}

/// One workload a proxy knows.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    node: String,
    namespace: String,
    name: String,
    addresses: Vec<String>,
    workload_node: String,
    protocol: String,
    identity: String,
    status: String,
    waypoint: String,
}

impl Row for Workload {
    fn header() -> &'static [&'static str] {
        &["PROXY", "NAMESPACE", "NAME", "ADDRESS", "NODE", "PROTOCOL", "IDENTITY", "STATUS", "WAYPOINT"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.namespace.clone(),
            self.name.clone(),
            dash(self.addresses.join(",")),
            dash(self.workload_node.clone()),
            self.protocol.clone(),
            dash(self.identity.clone()),
            self.status.clone(),
            dash(self.waypoint.clone()),
        ]
    }
}

/// The workloads of each proxy's dump.
pub fn workloads(dumps: &[(String, Value)], ns: Option<&str>) -> Vec<Workload> {
    let mut out = Vec::new();
    for (node, d) in dumps {
        for w in d["workloads"].as_array().into_iter().flatten() {
            let namespace = text(w, "namespace");
            if !in_namespace(ns, &namespace) {
                continue;
            }
            let sa = text(w, "serviceAccount");
            // Only a workload in the mesh (HBONE) has an identity on the wire.
            let identity = if sa.is_empty() || text(w, "protocol") != "HBONE" {
                String::new()
            } else {
                format!("spiffe://{}/ns/{namespace}/sa/{sa}", text(w, "trustDomain"))
            };
            out.push(Workload {
                node: node.clone(),
                name: text(w, "name"),
                namespace,
                addresses: strings(&w["workloadIps"]),
                workload_node: text(w, "node"),
                protocol: text(w, "protocol"),
                identity,
                status: text(w, "status"),
                waypoint: gateway(&w["waypoint"]),
            });
        }
    }
    out
}

/// One service a proxy knows.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    node: String,
    namespace: String,
    name: String,
    hostname: String,
    vips: Vec<String>,
    ports: Vec<String>,
    endpoints: usize,
    waypoint: String,
}

impl Row for Service {
    fn header() -> &'static [&'static str] {
        &["PROXY", "NAMESPACE", "NAME", "VIPS", "PORTS", "ENDPOINTS", "WAYPOINT"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.namespace.clone(),
            self.name.clone(),
            dash(self.vips.join(",")),
            dash(self.ports.join(",")),
            self.endpoints.to_string(),
            dash(self.waypoint.clone()),
        ]
    }
}

/// The services of each proxy's dump.
pub fn services(dumps: &[(String, Value)], ns: Option<&str>) -> Vec<Service> {
    let mut out = Vec::new();
    for (node, d) in dumps {
        for s in d["services"].as_array().into_iter().flatten() {
            let namespace = text(s, "namespace");
            if !in_namespace(ns, &namespace) {
                continue;
            }
            let ports = s["ports"]
                .as_object()
                .into_iter()
                .flatten()
                .map(
                    |(port, target)| {
                        if target.as_u64() == Some(0) { port.clone() } else { format!("{port}→{target}") }
                    },
                )
                .collect();
            out.push(Service {
                node: node.clone(),
                name: text(s, "name"),
                namespace,
                hostname: text(s, "hostname"),
                // `network/ip`: the default network is empty.
                vips: strings(&s["vips"]).into_iter().map(|v| v.trim_start_matches('/').to_owned()).collect(),
                ports,
                endpoints: s["endpoints"].as_object().map_or(0, serde_json::Map::len),
                waypoint: gateway(&s["waypoint"]),
            });
        }
    }
    out
}

/// One certificate a proxy holds.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    node: String,
    identity: String,
    state: String,
    serial_number: String,
    valid_from: String,
    expiration_time: String,
}

impl Row for Certificate {
    fn header() -> &'static [&'static str] {
        &["PROXY", "IDENTITY", "STATE", "SERIAL", "VALID FROM", "EXPIRES"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.identity.clone(),
            self.state.clone(),
            dash(self.serial_number.clone()),
            dash(self.valid_from.clone()),
            dash(self.expiration_time.clone()),
        ]
    }
}

/// The leaf certificate of each identity each proxy holds.
pub fn certificates(dumps: &[(String, Value)], ns: Option<&str>) -> Vec<Certificate> {
    let mut out = Vec::new();
    for (node, d) in dumps {
        for c in d["certificates"].as_array().into_iter().flatten() {
            let identity = text(c, "identity");
            let namespace =
                identity.split("/ns/").nth(1).and_then(|r| r.split('/').next()).unwrap_or_default();
            if !in_namespace(ns, namespace) {
                continue;
            }
            let leaf = &c["certChain"][0];
            out.push(Certificate {
                node: node.clone(),
                identity,
                state: text(c, "state"),
                serial_number: text(leaf, "serialNumber"),
                valid_from: text(leaf, "validFrom"),
                expiration_time: text(leaf, "expirationTime"),
            });
        }
    }
    out
}

/// One live inbound connection.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    node: String,
    src: String,
    src_identity: String,
    dst: String,
    dst_workload: String,
    bytes_sent: u64,
    bytes_received: u64,
    opened: String,
}

impl Row for Connection {
    fn header() -> &'static [&'static str] {
        &["PROXY", "SOURCE", "IDENTITY", "DESTINATION", "WORKLOAD", "BYTES IN", "BYTES OUT", "SINCE"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.src.clone(),
            if self.src_identity.is_empty() { "(plaintext)".into() } else { self.src_identity.clone() },
            self.dst.clone(),
            self.dst_workload.clone(),
            self.bytes_sent.to_string(),
            self.bytes_received.to_string(),
            self.opened.clone(),
        ]
    }
}

/// Each proxy's live connections.
pub fn connections(lists: &[(String, Value)], ns: Option<&str>) -> Vec<Connection> {
    let mut out = Vec::new();
    for (node, list) in lists {
        for c in list.as_array().into_iter().flatten() {
            let dst_workload = text(c, "dstWorkload");
            if !in_namespace(ns, dst_workload.split('/').next().unwrap_or_default()) {
                continue;
            }
            out.push(Connection {
                node: node.clone(),
                src: text(c, "src"),
                src_identity: text(c, "srcIdentity"),
                dst: text(c, "dst"),
                dst_workload,
                bytes_sent: c["bytesSent"].as_u64().unwrap_or_default(),
                bytes_received: c["bytesReceived"].as_u64().unwrap_or_default(),
                opened: text(c, "opened"),
            });
        }
    }
    out
}

/// One denied connection.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    node: String,
    time: String,
    src: String,
    src_identity: String,
    dst_workload: String,
    reason: String,
    policies: Vec<String>,
}

impl Row for Denial {
    fn header() -> &'static [&'static str] {
        &["PROXY", "TIME", "SOURCE", "IDENTITY", "WORKLOAD", "REASON", "POLICIES"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.time.clone(),
            self.src.clone(),
            if self.src_identity.is_empty() { "(plaintext)".into() } else { self.src_identity.clone() },
            self.dst_workload.clone(),
            self.reason.clone(),
            dash(self.policies.iter().map(|p| explain::origin(p)).collect::<Vec<_>>().join(", ")),
        ]
    }
}

/// Each proxy's recorded denials, oldest first.
pub fn denials(lists: &[(String, Value)], ns: Option<&str>) -> Vec<Denial> {
    let mut out = Vec::new();
    for (node, list) in lists {
        for d in list.as_array().into_iter().flatten() {
            let dst_workload = text(d, "dstWorkload");
            if !in_namespace(ns, dst_workload.split('/').next().unwrap_or_default()) {
                continue;
            }
            out.push(Denial {
                node: node.clone(),
                time: text(d, "time"),
                src: text(d, "srcAddr"),
                src_identity: text(d, "srcIdentity"),
                dst_workload,
                reason: text(d, "reason"),
                policies: strings(&d["policies"]),
            });
        }
    }
    out.sort_by(|a, b| a.time.cmp(&b.time));
    out
}

/// A proxy's log level.
#[derive(Debug, Serialize)]
pub struct LogLevel {
    /// The proxy.
    pub node: String,
    /// Its filter now.
    pub level: String,
}

impl Row for LogLevel {
    fn header() -> &'static [&'static str] {
        &["PROXY", "LEVEL"]
    }

    fn cells(&self) -> Vec<String> {
        vec![self.node.clone(), self.level.clone()]
    }
}

/// One xDS type of one proxy against the control plane.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sync {
    node: String,
    type_url: String,
    /// The last response the control plane sent this proxy (its nonce).
    sent: String,
    /// The last response the proxy took (its nonce).
    received: String,
    /// Resources the proxy holds.
    resources: u64,
    /// `SYNCED`, `STALE` (sent, not acknowledged yet), `NACK: …`, `NOT CONNECTED`.
    status: String,
}

impl Row for Sync {
    fn header() -> &'static [&'static str] {
        &["PROXY", "TYPE", "SENT", "RECEIVED", "RESOURCES", "STATUS"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.type_url.rsplit('/').next().unwrap_or_default().to_owned(),
            dash(self.sent.clone()),
            dash(self.received.clone()),
            self.resources.to_string(),
            self.status.clone(),
        ]
    }
}

/// Each proxy's xDS types against the control plane's streams (matched by node name).
pub fn sync(dumps: &[(String, Value)], control: &Value) -> Vec<Sync> {
    let mut out = Vec::new();
    for (node, d) in dumps {
        let proxy_node = text(&d["config"], "localNode");
        let name = if proxy_node.is_empty() { node.clone() } else { proxy_node };
        let stream =
            control["streams"].as_array().into_iter().flatten().find(|s| text(s, "node_name") == name);
        for t in d["xds"]["types"].as_array().into_iter().flatten() {
            let type_url = text(t, "type_url");
            let received = text(t, "last_nonce");
            let sent_type = stream.and_then(|s| {
                s["types"].as_array().into_iter().flatten().find(|x| text(x, "type_url") == type_url)
            });
            let sent = sent_type.map(|x| text(x, "last_nonce")).unwrap_or_default();
            let acked = sent_type.is_some_and(|x| {
                x["acked_nonces"].as_array().into_iter().flatten().any(|n| n.as_str() == Some(&sent))
            });
            let nack = text(t, "last_nack");
            let status = if stream.is_none() {
                "NOT CONNECTED".to_owned()
            } else if !nack.is_empty() {
                format!("NACK: {nack}")
            } else if sent == received && acked {
                "SYNCED".to_owned()
            } else {
                "STALE".to_owned()
            };
            out.push(Sync {
                node: node.clone(),
                type_url,
                sent,
                received,
                resources: t["resources"].as_u64().unwrap_or_default(),
                status,
            });
        }
    }
    out
}
