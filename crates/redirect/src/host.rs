//! Host-netns kubelet probe SNAT (§2.9): probe-target address sets keyed by pod UID comments and
//! the nat POSTROUTING rule, in an nftables variant (kubelet UID match) and an iptables + ipset
//! variant. Every function takes the netns to act in (the host's, `/proc/1/ns/net`, in production).

use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::iptables::{Plan, Xtables, apply_plan, cleanup};
use crate::netlink::Netlink;
use crate::nftables::{BaseChain, ChainKind, Hook, L4Proto, NftChain};
use crate::nftables::{Match, NftAction, NftRule, NftRuleset, NftSet, NftTable, SetType};
use crate::{Family, PROBE_SNAT_V4, PROBE_SNAT_V6, RedirectError, exec, in_netns, nfnl};

/// Probe-target set, IPv4.
pub const PROBE_SET_V4: &str = "istio-inpod-probes-v4";
/// Probe-target set, IPv6.
pub const PROBE_SET_V6: &str = "istio-inpod-probes-v6";
/// Host nftables table holding the sets and the postrouting chain.
pub const HOST_NFT_TABLE: &str = "istio-ambient-nat";
/// Host iptables chain (nat table) holding the SNAT rule.
pub const HOST_CHAIN: &str = "ISTIO_POSTRT";

/// What removing a pod's probe entry found (§2.9.1 remove-for-pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeEntryRemoval {
    /// The entry carried this pod's UID and was deleted.
    Removed,
    /// No entry for the address.
    Absent,
    /// The entry belongs to another pod (its UID); it was left in place.
    Foreign(String),
}

/// Renders the §2.9.3 host table: sets, `postrouting` (nat, priority 100) and the SNAT rules.
pub fn render_host_nftables(ipv6: bool, kubelet_uid: u32) -> NftRuleset {
    let comment = "kubelet probe targets: pod IPs, element comment = pod UID".to_owned();
    let mut sets =
        vec![NftSet { name: PROBE_SET_V4.into(), kind: SetType::Ipv4Addr, comment: comment.clone() }];
    let mut targets = vec![(Family::V4, PROBE_SET_V4, IpAddr::from(PROBE_SNAT_V4))];
    if ipv6 {
        sets.push(NftSet { name: PROBE_SET_V6.into(), kind: SetType::Ipv6Addr, comment });
        targets.push((Family::V6, PROBE_SET_V6, IpAddr::from(PROBE_SNAT_V6)));
    }
    let rules = targets
        .into_iter()
        .map(|(family, set, snat)| NftRule {
            chain: "postrouting".into(),
            matches: vec![
                Match::L4Proto(L4Proto::Tcp),
                Match::SkUid(kubelet_uid),
                Match::DaddrInSet { family, set: set.into() },
            ],
            action: NftAction::Snat(snat),
        })
        .collect();
    let chain = NftChain {
        name: "postrouting".into(),
        base: Some(BaseChain { kind: ChainKind::Nat, hook: Hook::Postrouting, priority: 100 }),
    };
    NftRuleset { tables: vec![NftTable { name: HOST_NFT_TABLE.into(), sets, chains: vec![chain], rules }] }
}

/// Renders the §2.9.2 host rule as `iptables-restore` input for `family`.
pub fn render_host_iptables(family: Family) -> String {
    host_plan(family).restore_text()
}

fn host_plan(family: Family) -> Plan {
    let (set, snat) = match family {
        Family::V4 => (PROBE_SET_V4, IpAddr::from(PROBE_SNAT_V4)),
        Family::V6 => (PROBE_SET_V6, IpAddr::from(PROBE_SNAT_V6)),
    };
    let mut plan = Plan::default();
    plan.jump("nat", "POSTROUTING", HOST_CHAIN);
    if let Some(jump) = plan.jumps.last_mut() {
        jump.insert = true;
    }
    plan.rule(
        "nat",
        HOST_CHAIN,
        format!("-m owner --socket-exists -p tcp -m set --match-set {set} dst -j SNAT --to-source {snat}"),
    );
    plan
}

/// The nftables variant of the host probe SNAT (§2.9.3).
#[derive(Debug, Clone)]
pub struct NftProbeSnat {
    /// Also manage the IPv6 set and rule.
    pub ipv6: bool,
    /// UID of the kubelet process; only its sockets are SNATed.
    pub kubelet_uid: u32,
}

impl NftProbeSnat {
    /// A probe SNAT manager talking nf_tables netlink.
    pub fn new(ipv6: bool, kubelet_uid: u32) -> Self {
        NftProbeSnat { ipv6, kubelet_uid }
    }

    /// Creates the table, sets and rule (one transaction; existing set elements are kept).
    pub fn install(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        let ruleset = render_host_nftables(self.ipv6, self.kubelet_uid);
        in_netns(netns, || {
            let mut nl = Netlink::netfilter()?;
            let existing = nfnl::table_names(&mut nl)?;
            nl.batch(&nfnl::ruleset_requests(&ruleset, nfnl::Rebuild::KeepSets, &existing, &[])?)
        })
    }

    /// Adds `ip` with comment `uid`, replacing an existing entry's owner (last writer wins).
    pub fn upsert(&self, netns: BorrowedFd<'_>, ip: IpAddr, uid: &str) -> Result<(), RedirectError> {
        check_comment(uid)?;
        let (set, ip) = self.set_for(ip);
        let add = nfnl::element_request(true, HOST_NFT_TABLE, set, Some((ip, Some(uid))));
        in_netns(netns, || {
            let mut nl = Netlink::netfilter()?;
            // Usually the address is new: a pure addition (no deletion to wait for).
            match nl.batch(&[nfnl::exclusive(add.clone())]) {
                Err(RedirectError::Kernel { errno: nix::errno::Errno::EEXIST, .. }) => {}
                other => return other,
            }
            let entries = nfnl::set_elements(&mut nl, HOST_NFT_TABLE, set)?;
            if entries.iter().any(|(addr, owner)| *addr == ip && owner.as_deref() == Some(uid)) {
                return Ok(());
            }
            // Another pod's (stale) entry: replace it in one transaction (last writer wins).
            nl.batch(&[nfnl::element_request(false, HOST_NFT_TABLE, set, Some((ip, None))), add])
        })
    }

    /// Deletes `ip` only if its comment is `uid`; reports a foreign owner instead of deleting.
    pub fn remove_for_pod(
        &self,
        netns: BorrowedFd<'_>,
        ip: IpAddr,
        uid: &str,
    ) -> Result<ProbeEntryRemoval, RedirectError> {
        let (set, ip) = self.set_for(ip);
        in_netns(netns, || {
            let mut nl = Netlink::netfilter()?;
            if let Some(keep) = keep_entry(nfnl::set_elements(&mut nl, HOST_NFT_TABLE, set)?, ip, uid) {
                return Ok(keep);
            }
            nl.batch(&[nfnl::element_request(false, HOST_NFT_TABLE, set, Some((ip, None)))])?;
            Ok(ProbeEntryRemoval::Removed)
        })
    }

    /// All entries of both sets: address and comment (pod UID).
    pub fn entries(&self, netns: BorrowedFd<'_>) -> Result<Vec<(IpAddr, Option<String>)>, RedirectError> {
        in_netns(netns, || {
            let mut nl = Netlink::netfilter()?;
            let mut all = nfnl::set_elements(&mut nl, HOST_NFT_TABLE, PROBE_SET_V4)?;
            if self.ipv6 {
                all.extend(nfnl::set_elements(&mut nl, HOST_NFT_TABLE, PROBE_SET_V6)?);
            }
            Ok(all)
        })
    }

    /// Empties the sets (startup, before the snapshot sync).
    pub fn flush_sets(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        let mut requests = vec![nfnl::element_request(false, HOST_NFT_TABLE, PROBE_SET_V4, None)];
        if self.ipv6 {
            requests.push(nfnl::element_request(false, HOST_NFT_TABLE, PROBE_SET_V6, None));
        }
        in_netns(netns, || Netlink::netfilter()?.batch(&requests))
    }

    /// Removes the SNAT rule, keeping the sets (`flush table`).
    pub fn delete_rules(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        let requests = nfnl::flush_rules_requests(HOST_NFT_TABLE);
        in_netns(netns, || Netlink::netfilter()?.batch(&requests))
    }

    /// Deletes the table with its sets; ok when it is already gone.
    pub fn destroy(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        in_netns(netns, || {
            let mut nl = Netlink::netfilter()?;
            let existing = nfnl::table_names(&mut nl)?;
            if !existing.iter().any(|t| t == HOST_NFT_TABLE) {
                return Ok(());
            }
            nl.batch(&nfnl::ruleset_requests(
                &NftRuleset::default(),
                nfnl::Rebuild::Replace,
                &existing,
                &[HOST_NFT_TABLE],
            )?)
        })
    }

    fn set_for(&self, ip: IpAddr) -> (&'static str, IpAddr) {
        match ip.to_canonical() {
            ip @ IpAddr::V4(_) => (PROBE_SET_V4, ip),
            ip @ IpAddr::V6(_) => (PROBE_SET_V6, ip),
        }
    }
}

/// Why the entry for `ip` must not be deleted for pod `uid` (absent, or another pod's), or
/// `None` when it is this pod's.
fn keep_entry(entries: Vec<(IpAddr, Option<String>)>, ip: IpAddr, uid: &str) -> Option<ProbeEntryRemoval> {
    match entries.into_iter().find(|(addr, _)| *addr == ip) {
        None => Some(ProbeEntryRemoval::Absent),
        Some((_, owner)) => {
            let owner = owner.unwrap_or_default();
            (owner != uid).then_some(ProbeEntryRemoval::Foreign(owner))
        }
    }
}

/// The iptables + ipset variant of the host probe SNAT (§2.9.1, §2.9.2).
#[derive(Debug, Clone)]
pub struct IptablesProbeSnat {
    /// Also manage the IPv6 set and ip6tables rule.
    pub ipv6: bool,
    v4: Xtables,
    v6: Xtables,
}

impl IptablesProbeSnat {
    /// A manager using the given iptables binaries and `ipset` from `PATH`.
    pub fn new(ipv6: bool, v4: Xtables, v6: Xtables) -> Self {
        IptablesProbeSnat { ipv6, v4, v6 }
    }

    fn families(&self) -> Vec<(Family, &Xtables, &'static str, &'static str)> {
        let mut out = vec![(Family::V4, &self.v4, PROBE_SET_V4, "inet")];
        if self.ipv6 {
            out.push((Family::V6, &self.v6, PROBE_SET_V6, "inet6"));
        }
        out
    }

    /// Creates the sets ("exists" tolerated), then applies the rule with the §2.8.2 algorithm
    /// (reconcile off, as upstream's host config).
    pub fn install(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        in_netns(netns, || {
            for (family, xt, set, ipset_family) in self.families() {
                let args = ["create", set, "hash:ip", "family", ipset_family, "comment", "-exist"];
                exec::run("ipset", &args, None)?;
                apply_plan(xt, &host_plan(family), &[HOST_CHAIN], false)?;
            }
            Ok(())
        })
    }

    /// Adds `ip` with comment `uid`, replacing an existing entry's comment.
    pub fn upsert(&self, netns: BorrowedFd<'_>, ip: IpAddr, uid: &str) -> Result<(), RedirectError> {
        check_comment(uid)?;
        let ip = ip.to_canonical();
        let set = if ip.is_ipv4() { PROBE_SET_V4 } else { PROBE_SET_V6 };
        let ip = ip.to_string();
        in_netns(netns, || exec::run("ipset", &["add", set, &ip, "comment", uid, "-exist"], None).map(drop))
    }

    /// Deletes `ip` only if its comment is `uid`; reports a foreign owner instead of deleting.
    pub fn remove_for_pod(
        &self,
        netns: BorrowedFd<'_>,
        ip: IpAddr,
        uid: &str,
    ) -> Result<ProbeEntryRemoval, RedirectError> {
        let ip = ip.to_canonical();
        let set = if ip.is_ipv4() { PROBE_SET_V4 } else { PROBE_SET_V6 };
        in_netns(netns, || {
            let out = exec::run("ipset", &["save", set], None)?;
            if let Some(keep) = keep_entry(parse_ipset_save(&exec::stdout(&out)), ip, uid) {
                return Ok(keep);
            }
            exec::run("ipset", &["del", set, &ip.to_string(), "-exist"], None)?;
            Ok(ProbeEntryRemoval::Removed)
        })
    }

    /// All entries of the sets: address and comment (pod UID).
    pub fn entries(&self, netns: BorrowedFd<'_>) -> Result<Vec<(IpAddr, Option<String>)>, RedirectError> {
        in_netns(netns, || {
            let mut all = Vec::new();
            for (_, _, set, _) in self.families() {
                all.extend(parse_ipset_save(&exec::stdout(&exec::run("ipset", &["save", set], None)?)));
            }
            Ok(all)
        })
    }

    /// Empties the sets.
    pub fn flush_sets(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        in_netns(netns, || {
            for (_, _, set, _) in self.families() {
                exec::run("ipset", &["flush", set], None)?;
            }
            Ok(())
        })
    }

    /// Removes the jump and the `ISTIO_POSTRT` chain (the builder's cleanup list); sets stay.
    pub fn delete_rules(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        in_netns(netns, || {
            for xt in [&self.v4, &self.v6] {
                cleanup(xt, &[HOST_CHAIN])?;
            }
            Ok(())
        })
    }

    /// Removes the rules, then destroys the sets; ok when they are already gone.
    pub fn destroy(&self, netns: BorrowedFd<'_>) -> Result<(), RedirectError> {
        self.delete_rules(netns)?;
        in_netns(netns, || {
            for set in [PROBE_SET_V4, PROBE_SET_V6] {
                let out = exec::output("ipset", &["destroy", set], None)?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                if !out.status.success() && !stderr.contains("does not exist") {
                    return Err(exec::failure("ipset", &["destroy", set], &out));
                }
            }
            Ok(())
        })
    }
}

/// Finds the kubelet's real UID under `proc_root` (§2.9.3): `comm` kubelet (argv mentions
/// kubelet), else kubelite (same check), else k3s.
pub fn kubelet_uid(proc_root: &Path) -> Result<u32, RedirectError> {
    let io = |path: &Path, source| RedirectError::Io { path: path.display().to_string(), source };
    let mut candidates: Vec<(usize, u32)> = Vec::new();
    for entry in std::fs::read_dir(proc_root).map_err(|e| io(proc_root, e))? {
        let Ok(entry) = entry else { continue };
        let dir = entry.path();
        if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // Processes come and go during the scan: unreadable entries are skipped.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else { continue };
        let argv_mentions_kubelet = || {
            std::fs::read(dir.join("cmdline"))
                .map(|raw| String::from_utf8_lossy(&raw).to_ascii_lowercase().contains("kubelet"))
                .unwrap_or(false)
        };
        let rank = match comm.trim() {
            "kubelet" if argv_mentions_kubelet() => 0,
            "kubelite" if argv_mentions_kubelet() => 1,
            "k3s" => 2,
            _ => continue,
        };
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else { continue };
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(uid) = uid {
            candidates.push((rank, uid));
        }
    }
    candidates
        .into_iter()
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, uid)| uid)
        .ok_or_else(|| RedirectError::KubeletNotFound(proc_root.display().to_string()))
}

/// Pod UIDs go into quoted rule comments: refuse anything that could break the quoting.
fn check_comment(uid: &str) -> Result<(), RedirectError> {
    let ok = !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(RedirectError::InvalidValue {
            what: "set element comment",
            value: uid.to_owned(),
            reason: "pod UIDs are 1-128 ASCII letters, digits and - _ . :",
        })
    }
}

/// Elements from `ipset save SET`: `add SET ADDR [comment "UID"]` lines; others are ignored.
pub(crate) fn parse_ipset_save(text: &str) -> Vec<(IpAddr, Option<String>)> {
    text.lines()
        .filter_map(|line| {
            let mut tokens = line.split_whitespace();
            if tokens.next() != Some("add") {
                return None;
            }
            let _set = tokens.next()?;
            let addr = tokens.next()?.parse::<IpAddr>().ok()?;
            let comment = line.split_once(" comment ").map(|(_, c)| c.trim().trim_matches('"').to_owned());
            Some((addr, comment))
        })
        .collect()
}
