//! Packet capture with tcpdump in a namespace, and a minimal pcap reader for TCP payloads.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::run_in;

/// A running `tcpdump -w` in a namespace; [`Capture::stop`] returns the pcap file bytes.
pub struct Capture {
    child: Option<Child>,
    dir: tempfile::TempDir,
    stderr: Option<std::thread::JoinHandle<String>>,
}

/// One captured TCP segment with a non-empty payload: (source, destination, payload).
pub type Segment = (SocketAddr, SocketAddr, Vec<u8>);

impl Capture {
    /// Starts tcpdump on `iface` inside `netns` and returns once it is capturing.
    pub fn start(netns: &str, iface: &str) -> Capture {
        // The namespace must exist; fail with a clear message rather than a tcpdump error.
        run_in(netns, || ());
        let dir = tempfile::Builder::new()
            .prefix("ambit-pcap-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for tcpdump: {e}"));
        let file = dir.path().join("capture.pcap");
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", netns, "tcpdump", "-i", iface, "-n", "-U"])
            .args(["--immediate-mode", "-s", "0", "-Z", "root", "-w"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tcpdump (is it installed?): {e}"));
        let (ready_tx, ready_rx) = mpsc::channel();
        let stderr = child.stderr.take().map(|pipe| {
            std::thread::spawn(move || {
                let mut text = String::new();
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if line.contains("listening on") {
                        let _ = ready_tx.send(());
                    }
                    text.push_str(&line);
                    text.push('\n');
                }
                text
            })
        });
        let mut capture = Capture { child: Some(child), dir, stderr };
        if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
            capture.finish();
            let text = capture.stderr.take().and_then(|t| t.join().ok()).unwrap_or_default();
            panic!("tcpdump on {iface} in {netns} did not start capturing: {text}");
        }
        capture
    }

    /// Stops tcpdump (after a short grace period for in-flight packets) and returns the pcap.
    pub fn stop(mut self) -> Vec<u8> {
        std::thread::sleep(Duration::from_millis(200));
        self.finish();
        let path = self.dir.path().join("capture.pcap");
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read capture {}: {e}", path.display()))
    }

    fn finish(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
            let _ = kill(pid, Signal::SIGTERM);
            for _ in 0..200 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.finish();
    }
}

/// True when `needle` occurs in `haystack` (an empty needle always does).
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// TCP segments with a payload from a pcap file (Ethernet with VLAN tags, Linux cooked v1/v2,
/// raw IP or BSD loopback; IPv4 and IPv6). Truncated or unknown records are skipped; reading
/// stops at the first malformed record header.
pub fn pcap_payloads(pcap: &[u8]) -> Vec<Segment> {
    let mut segments = Vec::new();
    let Some(magic) = pcap.get(..4) else {
        return segments;
    };
    let big_endian = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => false,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => true,
        _ => return segments,
    };
    let read_u32 = |at: usize| -> Option<u32> {
        let bytes: [u8; 4] = pcap.get(at..at + 4)?.try_into().ok()?;
        Some(if big_endian { u32::from_be_bytes(bytes) } else { u32::from_le_bytes(bytes) })
    };
    let Some(linktype) = read_u32(20) else {
        return segments;
    };
    let mut at = 24;
    while let Some(incl) = read_u32(at + 8) {
        let start = at + 16;
        let Some(frame) = usize::try_from(incl).ok().and_then(|len| pcap.get(start..start.checked_add(len)?))
        else {
            break;
        };
        if let Some(segment) = link_payload(linktype, frame).and_then(|(ethertype, ip)| ip_tcp(ethertype, ip))
        {
            segments.push(segment);
        }
        at = start + frame.len();
    }
    segments
}

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;

/// Strips the link-layer header; returns the ethertype and the network-layer bytes.
fn link_payload(linktype: u32, frame: &[u8]) -> Option<(u16, &[u8])> {
    match linktype {
        // Ethernet, skipping 802.1Q / 802.1ad tags.
        1 => {
            let mut at = 12;
            loop {
                let ethertype = be16(frame, at)?;
                if ethertype == 0x8100 || ethertype == 0x88a8 {
                    at += 4;
                } else {
                    return Some((ethertype, frame.get(at + 2..)?));
                }
            }
        }
        // Linux cooked capture v1 (`-i any` on older tcpdump).
        113 => Some((be16(frame, 14)?, frame.get(16..)?)),
        // Linux cooked capture v2.
        276 => Some((be16(frame, 0)?, frame.get(20..)?)),
        // Raw IP: the version nibble tells the family.
        12 | 14 | 101 => {
            let ethertype = match frame.first()? >> 4 {
                4 => ETHERTYPE_IPV4,
                6 => ETHERTYPE_IPV6,
                _ => return None,
            };
            Some((ethertype, frame))
        }
        // BSD loopback: 4-byte address family in host order (2 = inet, 10/24/28/30 = inet6).
        0 => {
            let family = frame.get(..4)?;
            let ethertype = if family.contains(&2) { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 };
            Some((ethertype, frame.get(4..)?))
        }
        _ => None,
    }
}

/// Parses IPv4/IPv6 + TCP; returns the segment if it carries payload.
fn ip_tcp(ethertype: u16, ip: &[u8]) -> Option<Segment> {
    let (src, dst, tcp) = match ethertype {
        ETHERTYPE_IPV4 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(be16(ip, 2)?);
            let fragment_offset = be16(ip, 6)? & 0x1fff;
            if *ip.get(9)? != 6 || fragment_offset != 0 || ihl < 20 {
                return None;
            }
            let src = IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(ip.get(12..16)?).ok()?));
            let dst = IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(ip.get(16..20)?).ok()?));
            // Trim Ethernet padding; tolerate TSO-sized records whose length field is 0.
            let end = if total == 0 { ip.len() } else { total.min(ip.len()) };
            (src, dst, ip.get(ihl..end)?)
        }
        ETHERTYPE_IPV6 => {
            let payload_len = usize::from(be16(ip, 4)?);
            let src = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(8..24)?).ok()?));
            let dst = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(24..40)?).ok()?));
            let end = if payload_len == 0 { ip.len() } else { (40 + payload_len).min(ip.len()) };
            let mut next = *ip.get(6)?;
            let mut at = 40;
            // Hop-by-hop, routing and destination options headers.
            while matches!(next, 0 | 43 | 60) {
                next = *ip.get(at)?;
                at += (usize::from(*ip.get(at + 1)?) + 1) * 8;
            }
            if next != 6 {
                return None;
            }
            (src, dst, ip.get(at..end)?)
        }
        _ => return None,
    };
    let src_port = be16(tcp, 0)?;
    let dst_port = be16(tcp, 2)?;
    let data_offset = usize::from(tcp.get(12)? >> 4) * 4;
    let payload = tcp.get(data_offset.max(20)..)?;
    if payload.is_empty() {
        return None;
    }
    Some((SocketAddr::new(src, src_port), SocketAddr::new(dst, dst_port), payload.to_vec()))
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}
