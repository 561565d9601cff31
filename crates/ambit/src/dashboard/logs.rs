//! The node proxies' access-log lines (`connection complete`, `connection failed`), read back
//! from the end of their log files into fields: the dashboard's recent connections of an edge.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How much of the end of each log is read.
pub const TAIL: u64 = 1 << 20;

/// The fields an access-log line has, in the order the proxy writes them.
const KEYS: [&str; 15] = [
    "src.addr",
    "src.workload",
    "src.namespace",
    "src.identity",
    "dst.addr",
    "dst.hbone_addr",
    "dst.service",
    "dst.workload",
    "dst.namespace",
    "dst.identity",
    "direction",
    "bytes_sent",
    "bytes_recv",
    "duration",
    "error",
];

/// One access-log line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Line {
    /// The node whose proxy wrote it.
    pub node: String,
    /// When (RFC 3339).
    pub time: String,
    /// Its fields, unquoted.
    pub fields: Vec<(&'static str, String)>,
}

impl Line {
    /// A field (`""` when absent).
    pub fn get(&self, key: &str) -> &str {
        self.fields.iter().find(|(k, _)| *k == key).map_or("", |(_, v)| v.as_str())
    }
}

/// The access-log lines at the end of `path`, oldest first.
pub fn tail(node: &str, path: &Path) -> Vec<Line> {
    let Ok(mut f) = std::fs::File::open(path) else { return Vec::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.take(TAIL).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    // The first line may be cut; it is not an access-log line's start unless whole.
    text.lines().skip(usize::from(len > TAIL)).filter_map(|l| parse(node, l)).collect()
}

/// One line, when it is an access-log line.
pub fn parse(node: &str, line: &str) -> Option<Line> {
    let (head, rest) = line
        .split_once(" access: connection complete ")
        .or_else(|| line.split_once(" access: connection failed "))?;
    let time = head.split_whitespace().next()?.to_owned();
    // Each field starts at ` key=`; a bare value (an error's words) runs to the next one.
    let rest = format!(" {rest}");
    let mut starts: Vec<(usize, &'static str)> =
        KEYS.iter().filter_map(|k| rest.find(&format!(" {k}=")).map(|i| (i, *k))).collect();
    starts.sort();
    let mut fields = Vec::new();
    for (i, (at, key)) in starts.iter().enumerate() {
        let from = at + key.len() + 2;
        let to = starts.get(i + 1).map_or(rest.len(), |(next, _)| *next);
        let value = rest.get(from..to).unwrap_or_default().trim();
        let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
        fields.push((*key, value.replace("\\\"", "\"")));
    }
    Some(Line { node: node.to_owned(), time, fields })
}

/// The IP of `ip:port` (or of `[ip]:port`).
pub fn ip_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_log_lines_read_back_into_fields() {
        let complete = "2026-12-07T07:28:17.695696Z  INFO access: connection complete src.addr=10.244.1.3:39086 \
            src.workload=\"client\" src.namespace=\"demo\" src.identity=\"spiffe://cluster.local/ns/demo/sa/client\" \
            dst.addr=10.244.1.4:8080 dst.hbone_addr=\"10.244.1.4:8080\" dst.service=\"server.demo.svc.cluster.local\" \
            dst.workload=\"server-0\" dst.namespace=\"demo\" dst.identity=\"spiffe://cluster.local/ns/demo/sa/server\" \
            direction=\"inbound\" bytes_sent=102 bytes_recv=28 duration=1ms";
        let l = parse("node1", complete).expect("an access-log line");
        assert_eq!(l.time, "2026-12-07T07:28:17.695696Z");
        assert_eq!(l.get("src.addr"), "10.244.1.3:39086");
        assert_eq!(l.get("src.identity"), "spiffe://cluster.local/ns/demo/sa/client");
        assert_eq!(l.get("dst.service"), "server.demo.svc.cluster.local");
        assert_eq!(l.get("direction"), "inbound");
        assert_eq!(l.get("bytes_sent"), "102");
        assert_eq!(l.get("duration"), "1ms");
        assert_eq!(l.get("error"), "");
        let failed = "2026-12-07T07:28:17.753776Z  WARN access: connection failed src.addr=10.244.2.3:57582 \
            src.workload=\"other\" src.identity=spiffe://cluster.local/ns/demo/sa/other dst.addr=10.244.1.4:8080 \
            dst.workload=\"server-0\" direction=\"inbound\" error=connection closed due to policy rejection: \
            allow policies exist, but none allowed";
        let l = parse("node1", failed).expect("an access-log line");
        assert_eq!(l.get("src.identity"), "spiffe://cluster.local/ns/demo/sa/other");
        assert_eq!(l.get("dst.workload"), "server-0");
        assert_eq!(
            l.get("error"),
            "connection closed due to policy rejection: allow policies exist, but none allowed"
        );
        assert_eq!(parse("node1", "2026-12-07T07:28:17Z  INFO ambit_proxy: ready"), None);
        assert_eq!(ip_of("10.244.1.3:39086"), "10.244.1.3");
        assert_eq!(ip_of("[fd00::1]:80"), "fd00::1");
    }
}
