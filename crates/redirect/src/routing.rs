//! Policy routing for replies to ztunnel-accepted connections: `fwmark 0x111/0xfff lookup 100`
//! and a `local` default route on `lo` in table 100 (§2.8.1), programmed over rtnetlink in the
//! current thread's network namespace.

use nix::errno::Errno;

use crate::netlink::{
    Attrs, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, Netlink, Reply, Request, find, parse_attrs,
};
use crate::{Family, MARK_MASK, PodCapture, ROUTE_TABLE, RULE_PRIORITY, RedirectError, TPROXY_MARK};

pub(crate) const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;
pub(crate) const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const RTM_GETRULE: u16 = 34;
const RTA_OIF: u16 = 4;
const RTA_TABLE: u16 = 15;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const RTN_LOCAL: u8 = 2;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_HOST: u8 = 254;
const RT_SCOPE_NOWHERE: u8 = 255;
const FR_ACT_TO_TBL: u8 = 1;
/// Size of `struct rtmsg` and of `struct fib_rule_hdr`.
const HEADER_LEN: usize = 12;

/// Adds the table-100 routes, then the fwmark rules. Must run inside the pod netns.
pub(crate) fn apply(capture: &PodCapture) -> Result<(), RedirectError> {
    let mut nl = Netlink::route()?;
    let lo = lo_index();
    if capture.ipv4 {
        nl.call(&route(RTM_NEWROUTE, Family::V4, lo, NLM_F_CREATE | NLM_F_REPLACE))?;
    }
    if capture.ipv6 && lo_has_ipv6() {
        nl.call(&route(RTM_NEWROUTE, Family::V6, lo, NLM_F_CREATE | NLM_F_REPLACE))?;
    }
    for family in families(capture) {
        match nl.call(&rule(RTM_NEWRULE, family, NLM_F_CREATE | NLM_F_EXCL)) {
            Err(RedirectError::Kernel { errno: Errno::EEXIST, .. }) => {}
            other => other?,
        }
    }
    Ok(())
}

/// Deletes the fwmark rules and table-100 routes of both families; absent ones are fine.
pub(crate) fn remove() -> Result<(), RedirectError> {
    let mut nl = Netlink::route()?;
    let lo = lo_index();
    let mut requests: Vec<Request> = [Family::V4, Family::V6].map(|f| rule(RTM_DELRULE, f, 0)).into();
    requests.extend([Family::V4, Family::V6].map(|f| route(RTM_DELROUTE, f, lo, 0)));
    for request in &requests {
        match nl.call(request) {
            Err(RedirectError::Kernel {
                errno: Errno::ENOENT | Errno::ESRCH | Errno::EAFNOSUPPORT, ..
            }) => {}
            other => other?,
        }
    }
    Ok(())
}

/// Differences between the live policy routing and what `capture` needs (empty = in sync), and
/// whether any of ours is present at all.
pub(crate) fn verify(capture: &PodCapture) -> Result<(Vec<String>, bool), RedirectError> {
    let mut nl = Netlink::route()?;
    let lo = lo_index();
    let mut drift = Vec::new();
    let mut present = false;
    for family in [Family::V4, Family::V6] {
        let flag = flag(family);
        let wanted = match family {
            Family::V4 => capture.ipv4,
            Family::V6 => capture.ipv6,
        };
        let rules = dump(&mut nl, RTM_GETRULE, family, "ip rule show")?;
        let has_rule = rules.iter().any(is_our_rule);
        let routes = dump(&mut nl, RTM_GETROUTE, family, "ip route show table all")?;
        let has_route = routes.iter().any(|r| is_our_route(r, lo));
        present |= has_rule || has_route;
        if wanted && !has_rule {
            drift.push(format!(
                "ip {flag} rule `fwmark {TPROXY_MARK:#x}/{MARK_MASK:#x} lookup {ROUTE_TABLE} pref {RULE_PRIORITY}` missing"
            ));
        }
        let route_wanted = wanted && (family == Family::V4 || lo_has_ipv6());
        if route_wanted && !has_route {
            drift.push(format!("ip {flag} route `local default dev lo table {ROUTE_TABLE}` missing"));
        }
    }
    Ok((drift, present))
}

fn families(capture: &PodCapture) -> Vec<Family> {
    let mut families = Vec::new();
    if capture.ipv4 {
        families.push(Family::V4);
    }
    if capture.ipv6 {
        families.push(Family::V6);
    }
    families
}

fn flag(family: Family) -> &'static str {
    match family {
        Family::V4 => "-4",
        Family::V6 => "-6",
    }
}

fn af(family: Family) -> u8 {
    match family {
        Family::V4 => nix::libc::AF_INET as u8,
        Family::V6 => nix::libc::AF_INET6 as u8,
    }
}

/// `ip -4|-6 route replace|del local default dev lo table 100` as a request.
pub(crate) fn route(kind: u16, family: Family, lo: u32, flags: u16) -> Request {
    let scope = match (kind, family) {
        (RTM_DELROUTE, _) => RT_SCOPE_NOWHERE,
        (_, Family::V4) => RT_SCOPE_HOST,
        (_, Family::V6) => RT_SCOPE_UNIVERSE,
    };
    let protocol = if kind == RTM_NEWROUTE { RTPROT_BOOT } else { 0 };
    let header = vec![af(family), 0, 0, 0, ROUTE_TABLE as u8, protocol, scope, RTN_LOCAL, 0, 0, 0, 0];
    let mut attrs = Attrs::default();
    attrs.ne32(RTA_TABLE, ROUTE_TABLE).ne32(RTA_OIF, lo);
    let op = if kind == RTM_NEWROUTE { "replace" } else { "del" };
    let label = format!("ip {} route {op} local default dev lo table {ROUTE_TABLE}", flag(family));
    Request { kind, flags, header, attrs, label }
}

/// `ip -4|-6 rule add|del fwmark 0x111/0xfff lookup 100 pref 32764` as a request.
pub(crate) fn rule(kind: u16, family: Family, flags: u16) -> Request {
    let header = vec![af(family), 0, 0, 0, ROUTE_TABLE as u8, 0, 0, FR_ACT_TO_TBL, 0, 0, 0, 0];
    let mut attrs = Attrs::default();
    attrs
        .ne32(FRA_PRIORITY, RULE_PRIORITY)
        .ne32(FRA_FWMARK, TPROXY_MARK)
        .ne32(FRA_FWMASK, MARK_MASK)
        .ne32(FRA_TABLE, ROUTE_TABLE);
    let op = if kind == RTM_NEWRULE { "add" } else { "del" };
    let label = format!(
        "ip {} rule {op} fwmark {TPROXY_MARK:#x}/{MARK_MASK:#x} lookup {ROUTE_TABLE} pref {RULE_PRIORITY}",
        flag(family)
    );
    Request { kind, flags, header, attrs, label }
}

fn dump(nl: &mut Netlink, kind: u16, family: Family, label: &str) -> Result<Vec<Reply>, RedirectError> {
    let mut header = vec![0; HEADER_LEN];
    header[0] = af(family);
    let request = Request {
        kind,
        flags: 0,
        header,
        attrs: Attrs::default(),
        label: format!("{label} ({})", flag(family)),
    };
    match nl.dump(&request) {
        // No IPv6 in this kernel or namespace: nothing of that family can be present.
        Err(RedirectError::Kernel { errno: Errno::EAFNOSUPPORT, .. }) => Ok(Vec::new()),
        other => other,
    }
}

/// Header bytes and attributes of an rtnetlink reply, or `None` when it is malformed.
fn split(reply: &Reply) -> Option<(&[u8], Vec<crate::netlink::Attr<'_>>)> {
    let header = reply.payload.get(..HEADER_LEN)?;
    Some((header, parse_attrs(&reply.payload[HEADER_LEN..]).ok()?))
}

fn table_of(header: &[u8], attrs: &[crate::netlink::Attr<'_>], kind: u16) -> u32 {
    find(attrs, kind).and_then(|a| a.ne32()).unwrap_or(u32::from(header[4]))
}

pub(crate) fn is_our_rule(reply: &Reply) -> bool {
    let Some((header, attrs)) = split(reply).filter(|_| reply.kind == RTM_NEWRULE) else { return false };
    let get = |kind| find(&attrs, kind).and_then(|a| a.ne32());
    header[7] == FR_ACT_TO_TBL
        && get(FRA_PRIORITY) == Some(RULE_PRIORITY)
        && get(FRA_FWMARK) == Some(TPROXY_MARK)
        && get(FRA_FWMASK) == Some(MARK_MASK)
        && table_of(header, &attrs, FRA_TABLE) == ROUTE_TABLE
}

pub(crate) fn is_our_route(reply: &Reply, lo: u32) -> bool {
    let Some((header, attrs)) = split(reply).filter(|_| reply.kind == RTM_NEWROUTE) else { return false };
    header[1] == 0
        && header[7] == RTN_LOCAL
        && table_of(header, &attrs, RTA_TABLE) == ROUTE_TABLE
        && find(&attrs, RTA_OIF).and_then(|a| a.ne32()) == Some(lo)
}

/// Index of `lo` in the current netns (1 in every namespace, asked anyway).
fn lo_index() -> u32 {
    nix::net::if_::if_nametoindex("lo").unwrap_or(1)
}

/// `lo` takes IPv6 routes unless `disable_ipv6` is `1`; a read error still tries (as upstream).
/// /proc/sys/net shows the namespace of the reading thread.
fn lo_has_ipv6() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
        .map(|v| v.trim() != "1")
        .unwrap_or(true)
}
