//! The nftables backend (§2.8.3): the rule set as typed data, its `nft -f` transaction text, the
//! `nft list` text it must read back as, and the backend applying it atomically per pod over
//! nf_tables netlink ([`crate::nfnl`]).

use std::fmt::Write as _;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

use crate::iptables::check_capture;
use crate::netlink::Netlink;
use crate::{
    DNS_CT_ZONE, DNS_PORT, Family, INBOUND_HBONE_PORT, INBOUND_PLAINTEXT_PORT, MARK_MASK, OUTBOUND_PORT,
    PodCapture, RedirectError, RuleBackend, TPROXY_MARK, Verification, ZTUNNEL_MARK, handoff, in_netns, nfnl,
    routing,
};

/// The three `inet` tables of the pod capture, in creation order.
pub const POD_TABLES: [&str; 3] = ["istio-ambient-nat", "istio-ambient-mangle", "istio-ambient-raw"];

/// A set of `inet` tables; each table is rebuilt whole by [`NftRuleset::script`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NftRuleset {
    /// Tables in creation order.
    pub tables: Vec<NftTable>,
}

/// One `inet` table: sets, chains (in creation order) and rules (in append order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftTable {
    /// Table name (family is always `inet`).
    pub name: String,
    /// Named sets.
    pub sets: Vec<NftSet>,
    /// Base and regular chains.
    pub chains: Vec<NftChain>,
    /// Rules; each names its chain.
    pub rules: Vec<NftRule>,
}

/// A named address set with a comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftSet {
    /// Set name.
    pub name: String,
    /// Element type.
    pub kind: SetType,
    /// Set comment.
    pub comment: String,
}

/// Element type of an [`NftSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetType {
    /// `ipv4_addr`.
    Ipv4Addr,
    /// `ipv6_addr`.
    Ipv6Addr,
}

/// A chain; base chains carry their hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftChain {
    /// Chain name.
    pub name: String,
    /// Hook of a base chain; `None` for a regular chain.
    pub base: Option<BaseChain>,
}

/// Type, hook and priority of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseChain {
    /// Chain type.
    pub kind: ChainKind,
    /// Netfilter hook.
    pub hook: Hook,
    /// Numeric priority.
    pub priority: i32,
}

/// nftables chain type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainKind {
    /// `filter`.
    Filter,
    /// `nat`.
    Nat,
    /// `route` (re-routes when the mark changes on output).
    Route,
}

/// Netfilter hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `prerouting`.
    Prerouting,
    /// `output`.
    Output,
    /// `postrouting`.
    Postrouting,
}

/// One rule: matches, then `counter`, then the action (every rule counts, §2.8.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    /// The chain the rule is appended to.
    pub chain: String,
    /// Matches, in order.
    pub matches: Vec<Match>,
    /// What a matching packet gets.
    pub action: NftAction,
}

/// Transport protocol of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// A rule match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// `iifname "NAME"`.
    IifName(String),
    /// `oifname [!=] "NAME"`.
    OifName {
        /// Interface name.
        name: String,
        /// `!=` instead of equality.
        negated: bool,
    },
    /// `meta l4proto P`.
    L4Proto(L4Proto),
    /// `ip|ip6 saddr|daddr [!=] ADDR[/LEN]`.
    Addr {
        /// Source (`saddr`) or destination (`daddr`).
        source: bool,
        /// `!=` instead of equality.
        negated: bool,
        /// Address (its family picks `ip` or `ip6`).
        addr: IpAddr,
        /// Prefix length as written (`None` writes the bare address).
        prefix: Option<u8>,
    },
    /// `ip|ip6 daddr @SET`.
    DaddrInSet {
        /// Address family of the set.
        family: Family,
        /// Set name.
        set: String,
    },
    /// `tcp|udp sport|dport [!=] PORT`.
    Port {
        /// Protocol header.
        proto: L4Proto,
        /// Source (`sport`) or destination (`dport`).
        source: bool,
        /// `!=` instead of equality.
        negated: bool,
        /// Port.
        port: u16,
    },
    /// `meta mark and MASK ==|!= VALUE`.
    MetaMark {
        /// Mask.
        mask: u32,
        /// Value.
        value: u32,
        /// `!=` instead of `==`.
        negated: bool,
    },
    /// `ct mark and MASK == VALUE`.
    CtMark {
        /// Mask.
        mask: u32,
        /// Value.
        value: u32,
    },
    /// `meta skuid UID`.
    SkUid(u32),
}

/// What a matching packet gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftAction {
    /// `jump CHAIN`.
    Jump(String),
    /// `accept`.
    Accept,
    /// `return`.
    Return,
    /// `redirect to :PORT`.
    Redirect(u16),
    /// `ct mark set ct mark and KEEP or SET`.
    CtMarkSet {
        /// Bits of the connmark kept.
        keep: u32,
        /// Bits set.
        set: u32,
    },
    /// `meta mark set ct mark`.
    MetaMarkFromCt,
    /// `ct zone set ZONE`.
    CtZoneSet(u16),
    /// `snat ip|ip6 to ADDR`.
    Snat(IpAddr),
}

/// The nftables backend: one nf_tables netlink transaction per apply or remove, sent from a
/// thread inside the pod netns (no `nft` binary involved).
#[derive(Debug, Clone, Default)]
pub struct NftablesBackend {
    _private: (),
}

/// Renders the §2.8.3 pod rule set: nat, mangle and (with DNS capture) raw tables.
pub fn render_nftables(capture: &PodCapture) -> NftRuleset {
    let (pre, out) = ("istio-prerouting", "istio-output");
    let lo4: IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
    let lo6: IpAddr = std::net::Ipv6Addr::LOCALHOST.into();
    let mut families = Vec::new();
    if capture.ipv4 {
        families.push((Family::V4, lo4, 32, IpAddr::from(capture.probe_snat_v4)));
    }
    if capture.ipv6 {
        families.push((Family::V6, lo6, 128, IpAddr::from(capture.probe_snat_v6)));
    }
    let tcp = Match::L4Proto(L4Proto::Tcp);
    let not_ztunnel = Match::MetaMark { mask: MARK_MASK, value: ZTUNNEL_MARK, negated: true };
    let not_lo =
        |lo: IpAddr, len: u8| Match::Addr { source: false, negated: true, addr: lo, prefix: Some(len) };
    let rule = |chain: &str, matches: Vec<Match>, action: NftAction| NftRule {
        chain: chain.into(),
        matches,
        action,
    };
    let jump = |from: &str, to: &str| rule(from, vec![], NftAction::Jump(to.into()));

    let mut nat = pod_table(POD_TABLES[0], ChainKind::Nat, -100, ChainKind::Nat, -100);
    nat.rules.push(jump("output", out));
    nat.rules.push(jump("prerouting", pre));
    for iface in &capture.virtual_interfaces {
        let m = vec![Match::IifName(iface.clone()), tcp.clone()];
        nat.rules.push(rule(pre, m.clone(), NftAction::Redirect(OUTBOUND_PORT)));
        nat.rules.push(rule(pre, m, NftAction::Return));
    }
    let probe = |source: bool, addr: IpAddr| Match::Addr { source, negated: false, addr, prefix: None };
    if !capture.ingress_mode {
        for &(_, _, _, snat) in &families {
            nat.rules.push(rule(pre, vec![tcp.clone(), probe(true, snat)], NftAction::Accept));
        }
    }
    for &(_, _, _, snat) in &families {
        nat.rules.push(rule(out, vec![tcp.clone(), probe(false, snat)], NftAction::Accept));
    }
    if !capture.ingress_mode {
        for &(_, lo, len, _) in &families {
            let hbone =
                Match::Port { proto: L4Proto::Tcp, source: false, negated: true, port: INBOUND_HBONE_PORT };
            let m = vec![not_lo(lo, len), hbone, not_ztunnel.clone()];
            nat.rules.push(rule(pre, m, NftAction::Redirect(INBOUND_PLAINTEXT_PORT)));
        }
    }
    let dns_port = |proto| Match::Port { proto, source: false, negated: false, port: 53 };
    if capture.dns {
        let m = vec![
            Match::OifName { name: "lo".into(), negated: true },
            not_ztunnel.clone(),
            dns_port(L4Proto::Udp),
        ];
        nat.rules.push(rule(out, m, NftAction::Redirect(DNS_PORT)));
        for &(_, lo, len, _) in &families {
            let m = vec![not_lo(lo, len), dns_port(L4Proto::Tcp), not_ztunnel.clone()];
            nat.rules.push(rule(out, m, NftAction::Redirect(DNS_PORT)));
        }
    }
    let tproxy = Match::MetaMark { mask: MARK_MASK, value: TPROXY_MARK, negated: false };
    nat.rules.push(rule(out, vec![tcp.clone(), tproxy], NftAction::Accept));
    for &(_, lo, len, _) in &families {
        let m = vec![Match::OifName { name: "lo".into(), negated: false }, not_lo(lo, len)];
        nat.rules.push(rule(out, m, NftAction::Accept));
    }
    for &(_, lo, len, _) in &families {
        let m = vec![tcp.clone(), not_lo(lo, len), not_ztunnel.clone()];
        nat.rules.push(rule(out, m, NftAction::Redirect(OUTBOUND_PORT)));
    }

    let mut mangle = pod_table(POD_TABLES[1], ChainKind::Filter, -150, ChainKind::Route, -150);
    mangle.rules.push(jump("prerouting", pre));
    mangle.rules.push(jump("output", out));
    let ztunnel = Match::MetaMark { mask: MARK_MASK, value: ZTUNNEL_MARK, negated: false };
    let keep = !MARK_MASK;
    mangle.rules.push(rule(pre, vec![ztunnel.clone()], NftAction::CtMarkSet { keep, set: TPROXY_MARK }));
    let ct = Match::CtMark { mask: MARK_MASK, value: TPROXY_MARK };
    mangle.rules.push(rule(out, vec![ct], NftAction::MetaMarkFromCt));

    let mut ruleset = NftRuleset { tables: vec![nat, mangle] };
    if capture.dns {
        let mut raw = pod_table(POD_TABLES[2], ChainKind::Filter, -300, ChainKind::Filter, -300);
        raw.rules.push(jump("prerouting", pre));
        raw.rules.push(jump("output", out));
        let src53 = Match::Port { proto: L4Proto::Udp, source: true, negated: false, port: 53 };
        raw.rules.push(rule(out, vec![dns_port(L4Proto::Udp), ztunnel], NftAction::CtZoneSet(DNS_CT_ZONE)));
        raw.rules.push(rule(pre, vec![src53, not_ztunnel], NftAction::CtZoneSet(DNS_CT_ZONE)));
        ruleset.tables.push(raw);
    }
    ruleset
}

fn pod_table(name: &str, pre_kind: ChainKind, pre_prio: i32, out_kind: ChainKind, out_prio: i32) -> NftTable {
    let base = |name: &str, kind, hook, priority| NftChain {
        name: name.into(),
        base: Some(BaseChain { kind, hook, priority }),
    };
    let regular = |name: &str| NftChain { name: name.into(), base: None };
    NftTable {
        name: name.into(),
        sets: Vec::new(),
        chains: vec![
            base("prerouting", pre_kind, Hook::Prerouting, pre_prio),
            base("output", out_kind, Hook::Output, out_prio),
            regular("istio-prerouting"),
            regular("istio-output"),
        ],
        rules: Vec::new(),
    }
}

impl NftRuleset {
    /// The `nft -f` transaction: per table `add table`, `flush table`, `add set`, `add chain`,
    /// `add rule`; then `add`+`delete` for each name in `absent` (idempotent removal).
    pub fn script(&self, absent: &[&str]) -> String {
        let mut s = String::new();
        for table in &self.tables {
            let t = format!("inet {}", table.name);
            let _ = writeln!(s, "add table {t}");
            let _ = writeln!(s, "flush table {t}");
            for set in &table.sets {
                let _ = writeln!(
                    s,
                    "add set {t} {} {{ type {} ; comment \"{}\" ; }}",
                    set.name,
                    set.kind.keyword(),
                    set.comment
                );
            }
            for chain in &table.chains {
                match chain.base {
                    Some(b) => {
                        let _ = writeln!(
                            s,
                            "add chain {t} {} {{ type {} hook {} priority {} ; }}",
                            chain.name,
                            b.kind.keyword(),
                            b.hook.keyword(),
                            b.priority
                        );
                    }
                    None => {
                        let _ = writeln!(s, "add chain {t} {}", chain.name);
                    }
                }
            }
            for rule in &table.rules {
                let _ = writeln!(s, "add rule {t} {} {}", rule.chain, rule.text(false));
            }
        }
        for name in absent {
            let _ = writeln!(s, "add table inet {name}");
            let _ = writeln!(s, "delete table inet {name}");
        }
        s
    }

    /// How `nft list ruleset` (nftables 1.0.x) prints these tables' chains, one trimmed line
    /// each, counters as a bare `counter`; sets are not included.
    pub fn listing(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for table in &self.tables {
            lines.push(format!("table inet {} {{", table.name));
            for chain in &table.chains {
                lines.push(format!("chain {} {{", chain.name));
                if let Some(b) = chain.base {
                    lines.push(format!(
                        "type {} hook {} priority {}; policy accept;",
                        b.kind.keyword(),
                        b.hook.keyword(),
                        b.priority_name()
                    ));
                }
                for rule in table.rules.iter().filter(|r| r.chain == chain.name) {
                    lines.push(rule.text(true));
                }
                lines.push("}".into());
            }
            lines.push("}".into());
        }
        lines
    }

    /// One table by name.
    pub fn table(&self, name: &str) -> Option<&NftTable> {
        self.tables.iter().find(|t| t.name == name)
    }
}

impl NftRule {
    /// The rule text after `add rule inet TABLE CHAIN` (`listing`: as `nft list` prints it).
    pub fn text(&self, listing: bool) -> String {
        let mut parts: Vec<String> = self.matches.iter().map(|m| m.text(listing)).collect();
        parts.push("counter".into());
        parts.push(self.action.text(listing));
        parts.join(" ")
    }
}

impl Match {
    fn text(&self, listing: bool) -> String {
        let neg = |negated: bool| if negated { "!= " } else { "" };
        let masked = |what: &str, mask: u32, value: u32, op: &str| {
            if listing {
                format!("{what} & {mask:#010x} {op} {value:#010x}")
            } else {
                format!("{what} and {mask:#x} {op} {value:#x}")
            }
        };
        match self {
            Match::IifName(name) => format!("iifname \"{name}\""),
            Match::OifName { name, negated } => format!("oifname {}\"{name}\"", neg(*negated)),
            Match::L4Proto(p) => format!("meta l4proto {}", p.keyword()),
            Match::Addr { source, negated, addr, prefix } => {
                let family = if addr.is_ipv4() { "ip" } else { "ip6" };
                let dir = if *source { "saddr" } else { "daddr" };
                let full = if addr.is_ipv4() { 32 } else { 128 };
                let addr = match prefix {
                    Some(len) if !(listing && *len == full) => format!("{addr}/{len}"),
                    _ => addr.to_string(),
                };
                format!("{family} {dir} {}{addr}", neg(*negated))
            }
            Match::DaddrInSet { family, set } => {
                let family = if *family == Family::V4 { "ip" } else { "ip6" };
                format!("{family} daddr @{set}")
            }
            Match::Port { proto, source, negated, port } => {
                let dir = if *source { "sport" } else { "dport" };
                format!("{} {dir} {}{port}", proto.keyword(), neg(*negated))
            }
            Match::MetaMark { mask, value, negated } => {
                masked("meta mark", *mask, *value, if *negated { "!=" } else { "==" })
            }
            Match::CtMark { mask, value } => masked("ct mark", *mask, *value, "=="),
            Match::SkUid(uid) => format!("meta skuid {uid}"),
        }
    }
}

impl NftAction {
    fn text(&self, listing: bool) -> String {
        match self {
            NftAction::Jump(chain) => format!("jump {chain}"),
            NftAction::Accept => "accept".into(),
            NftAction::Return => "return".into(),
            NftAction::Redirect(port) => format!("redirect to :{port}"),
            // nft folds `(x & keep) | set` into `x & (keep | set) | set` when it lists the rule.
            NftAction::CtMarkSet { keep, set } if listing => {
                format!("ct mark set ct mark & {:#010x} | {set:#010x}", keep | set)
            }
            NftAction::CtMarkSet { keep, set } => format!("ct mark set ct mark and {keep:#x} or {set:#x}"),
            NftAction::MetaMarkFromCt => "meta mark set ct mark".into(),
            NftAction::CtZoneSet(zone) => format!("ct zone set {zone}"),
            NftAction::Snat(addr) => {
                format!("snat {} to {addr}", if addr.is_ipv4() { "ip" } else { "ip6" })
            }
        }
    }
}

impl L4Proto {
    fn keyword(self) -> &'static str {
        match self {
            L4Proto::Tcp => "tcp",
            L4Proto::Udp => "udp",
        }
    }
}

impl SetType {
    fn keyword(self) -> &'static str {
        match self {
            SetType::Ipv4Addr => "ipv4_addr",
            SetType::Ipv6Addr => "ipv6_addr",
        }
    }
}

impl ChainKind {
    fn keyword(self) -> &'static str {
        match self {
            ChainKind::Filter => "filter",
            ChainKind::Nat => "nat",
            ChainKind::Route => "route",
        }
    }
}

impl Hook {
    fn keyword(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }
}

impl BaseChain {
    /// nft prints standard priorities by name where the hook allows that name.
    fn priority_name(&self) -> String {
        match (self.priority, self.hook) {
            (-300, _) => "raw".into(),
            (-150, _) => "mangle".into(),
            (0, _) => "filter".into(),
            (-100, Hook::Prerouting) => "dstnat".into(),
            (100, Hook::Postrouting) => "srcnat".into(),
            (p, _) => p.to_string(),
        }
    }
}

impl RuleBackend for NftablesBackend {
    fn apply(&self, netns: BorrowedFd<'_>, capture: &PodCapture) -> Result<(), RedirectError> {
        check_capture(capture)?;
        let ruleset = render_nftables(capture);
        in_netns(netns, || {
            routing::apply(capture)?;
            handoff::apply()?;
            let mut nl = Netlink::netfilter()?;
            let existing = nfnl::table_names(&mut nl)?;
            // A table the capture no longer needs (e.g. raw after DNS capture was turned off)
            // goes in the same transaction.
            let absent: Vec<&str> = POD_TABLES
                .into_iter()
                .filter(|n| ruleset.table(n).is_none() && existing.iter().any(|e| e == n))
                .collect();
            nl.batch(&nfnl::ruleset_requests(&ruleset, nfnl::Rebuild::Replace, &existing, &absent)?)
        })
    }

    fn verify(&self, netns: BorrowedFd<'_>, capture: &PodCapture) -> Result<Verification, RedirectError> {
        check_capture(capture)?;
        let expected = render_nftables(capture);
        in_netns(netns, || {
            let (mut drift, mut present) = routing::verify(capture)?;
            drift.extend(handoff::verify()?);
            let mut nl = Netlink::netfilter()?;
            let tables = nfnl::table_names(&mut nl)?;
            for name in POD_TABLES {
                let live = tables.iter().any(|t| t == name);
                present |= live;
                match (expected.table(name), live) {
                    (None, false) => {}
                    (Some(_), false) => drift.push(format!("table inet {name} missing")),
                    (None, true) => drift.push(format!("unexpected table inet {name}")),
                    (Some(want), true) => {
                        drift.extend(nfnl::compare_table(want, &nfnl::live_table(&mut nl, name)?)?)
                    }
                }
            }
            Ok(if !present {
                Verification::Absent
            } else if drift.is_empty() {
                Verification::InSync
            } else {
                Verification::Drift(drift)
            })
        })
    }

    fn remove(&self, netns: BorrowedFd<'_>, _capture: &PodCapture) -> Result<(), RedirectError> {
        in_netns(netns, || {
            let mut nl = Netlink::netfilter()?;
            let existing = nfnl::table_names(&mut nl)?;
            let ours: Vec<&str> =
                POD_TABLES.into_iter().filter(|n| existing.iter().any(|e| e == n)).collect();
            nl.batch(&nfnl::ruleset_requests(
                &NftRuleset::default(),
                nfnl::Rebuild::Replace,
                &existing,
                &ours,
            )?)?;
            routing::remove()?;
            handoff::remove()
        })
    }
}

#[cfg(test)]
/// Extracts `table inet NAME { ... }` blocks for `names` from `nft list ruleset` output, as
/// trimmed non-empty lines with counters reduced to `counter`.
pub(crate) fn listed_tables(ruleset: &str, names: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut tables = Vec::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for raw in ruleset.lines() {
        if let Some(rest) = raw.strip_prefix("table inet ") {
            let name = rest.trim_end_matches('{').trim();
            if names.contains(&name) {
                current = Some((name.to_owned(), Vec::new()));
            }
        }
        if let Some((_, lines)) = current.as_mut() {
            let line = raw.trim();
            if !line.is_empty() {
                lines.push(strip_counter_values(line));
            }
            if raw == "}" {
                tables.extend(current.take());
            }
        }
    }
    tables
}

#[cfg(test)]
/// `counter packets N bytes M` → `counter`.
fn strip_counter_values(line: &str) -> String {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        out.push(tokens[i]);
        if tokens[i] == "counter"
            && tokens.get(i + 1) == Some(&"packets")
            && tokens.get(i + 3) == Some(&"bytes")
        {
            i += 5;
        } else {
            i += 1;
        }
    }
    out.join(" ")
}
