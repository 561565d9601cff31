//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a normal
//! build): the parsers of what the kernel answers over netlink, which are private otherwise.

use crate::netlink::{Reply, ack_errno, split_messages};
use crate::{PodCapture, nfnl, render_nftables, routing};

/// One rtnetlink datagram as the kernel would send it: split into messages, each read as an
/// ack and as a policy-routing rule or route dump reply.
pub fn rtnetlink_reply(datagram: &[u8]) {
    let Ok(messages) = split_messages(datagram) else { return };
    for (kind, _flags, _seq, payload) in messages {
        let _ = ack_errno(&payload);
        let reply = Reply { kind, payload };
        let _ = routing::is_our_rule(&reply);
        let _ = routing::is_our_route(&reply, 1);
    }
}

/// One nf_tables datagram: split into messages, each read as a table, chain, rule and set
/// element reply; the chains and rules found are then compared with the spec's rule set.
pub fn nftables_reply(datagram: &[u8]) {
    let Ok(messages) = split_messages(datagram) else { return };
    let want = render_nftables(&PodCapture::default());
    let mut live = nfnl::LiveTable::default();
    let mut elements = Vec::new();
    let table = crate::POD_TABLES[0];
    for (_kind, _flags, _seq, payload) in messages {
        let _ = ack_errno(&payload);
        let _ = nfnl::reply_table_name(&payload);
        let _ = nfnl::reply_set_elements(&payload, &mut elements);
        if let Ok(Some(chain)) = nfnl::reply_chain(&payload, table) {
            live.chains.push(chain);
        }
        if let Ok(Some(rule)) = nfnl::reply_rule(&payload, table) {
            live.rules.push(rule);
        }
    }
    for t in want.tables.iter().filter(|t| t.name == table) {
        let _ = nfnl::compare_table(t, &live);
    }
}

/// Seeds for [`rtnetlink_reply`]: our own rule and route messages (a dump reply has their
/// layout), each alone and all in one datagram, and an ack.
pub fn rtnetlink_seeds() -> Vec<Vec<u8>> {
    use crate::Family;
    let mut requests = Vec::new();
    for family in [Family::V4, Family::V6] {
        requests.push(routing::rule(routing::RTM_NEWRULE, family, 0));
        requests.push(routing::route(routing::RTM_NEWROUTE, family, 1, 0));
    }
    let mut seeds = encoded(&requests);
    seeds.push(ack(7, 0));
    seeds.push(ack(7, -17));
    seeds
}

/// Seeds for [`nftables_reply`]: the messages that install the spec's rule set (tables,
/// chains, rules and sets have the layout of the kernel's dump replies), each alone and all
/// in one datagram, and set-element messages.
pub fn nftables_seeds() -> Vec<Vec<u8>> {
    let ruleset = render_nftables(&PodCapture::default());
    let mut requests = nfnl::ruleset_requests(&ruleset, nfnl::Rebuild::Replace, &[], &[]).unwrap_or_default();
    let ip = std::net::IpAddr::from([10, 244, 7, 2]);
    requests.push(nfnl::element_request(true, "ambit-host", "probe-v4", Some((ip, Some("uid-a")))));
    encoded(&requests)
}

/// Each request as its own message, then all of them in one datagram.
fn encoded(requests: &[crate::netlink::Request]) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    let mut seeds = Vec::new();
    for (seq, request) in (1u32..).zip(requests) {
        let mut one = Vec::new();
        request.encode(seq, 0x2, &mut one);
        all.extend_from_slice(&one);
        seeds.push(one);
    }
    seeds.push(all);
    seeds
}

/// An `NLMSG_ERROR` message for `seq` carrying `code` (0 = ack, else a negative errno).
fn ack(seq: u32, code: i32) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&36u32.to_ne_bytes());
    m.extend_from_slice(&2u16.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&code.to_ne_bytes());
    m.extend_from_slice(&[0; 16]);
    m
}
