//! The iptables backend (§2.8.1, §2.8.2, §2.10): the rule set rendered as `iptables-restore`
//! input, an `iptables-save` parser, and verify / reconcile / cleanup built on them.

use std::os::fd::BorrowedFd;

use crate::capture::check_interface_name;
use crate::{
    DNS_CT_ZONE, DNS_PORT, Family, INBOUND_HBONE_PORT, INBOUND_PLAINTEXT_PORT, MARK_MASK, OUTBOUND_PORT,
    PodCapture, RedirectError, RuleBackend, TPROXY_MARK, Verification, ZTUNNEL_MARK, exec, handoff, in_netns,
    routing,
};

/// Chains the pod capture owns; cleanup never touches any other chain.
pub(crate) const POD_CHAINS: [&str; 2] = ["ISTIO_PRERT", "ISTIO_OUTPUT"];
/// Tables a restore input may mention, in the order they are written (alphabetical).
const TABLE_ORDER: [&str; 4] = ["filter", "mangle", "nat", "raw"];

/// The iptables binaries of one family: `<cmd>`, `<cmd>-save`, `<cmd>-restore` (§2.10.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xtables {
    /// The rule command, e.g. `iptables-nft`.
    pub cmd: String,
    /// The save command, e.g. `iptables-nft-save`.
    pub save: String,
    /// The restore command, e.g. `iptables-nft-restore`.
    pub restore: String,
    /// Legacy iptables ≥ 1.6.2: pass `--wait=30` to writing commands (§2.10.2).
    pub wait: bool,
}

/// The iptables-restore compatibility backend: `--noflush` restore of [`render_iptables`] output
/// per family, with the §2.8.2 verify/reconcile algorithm.
#[derive(Debug, Clone)]
pub struct IptablesBackend {
    v4: Xtables,
    v6: Xtables,
    reconcile: bool,
}

/// Renders the `iptables-restore` input for `family` (§2.8.1): tables in alphabetical order,
/// `-N` for every chain used or jumped to, jumps, then rules in append order, `COMMIT`.
pub fn render_iptables(capture: &PodCapture, family: Family) -> String {
    pod_plan(capture, family).restore_text()
}

impl Xtables {
    /// The binaries named `<base>`, `<base>-save`, `<base>-restore` (e.g. `iptables-nft`).
    pub fn named(base: &str) -> Self {
        Xtables {
            cmd: base.to_owned(),
            save: format!("{base}-save"),
            restore: format!("{base}-restore"),
            wait: false,
        }
    }

    /// Picks the binaries for `family` as §2.10.1 does (run once, in the host netns): legacy if
    /// it works and already holds rules, else nft if it works, else the plain name.
    pub fn detect(family: Family) -> Self {
        let base = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        let probe = |variant: &str| {
            let save = format!("{base}-{variant}-save");
            let out = exec::output(&save, &[], None).ok()?;
            if let Some(why) = unreadable(&save, &out) {
                tracing::warn!("{why}");
                return None;
            }
            let version =
                exec::output(&save, &["--version"], None).map(|o| exec::stdout(&o)).unwrap_or_default();
            Some((exec::stdout(&out).matches('\n').count() >= 3, version))
        };
        if let Some((true, version)) = probe("legacy") {
            let mut xt = Xtables::named(&format!("{base}-legacy"));
            xt.wait = legacy_needs_wait(&version);
            return xt;
        }
        if probe("nft").is_some() {
            return Xtables::named(&format!("{base}-nft"));
        }
        Xtables::named(base)
    }

    /// Extra arguments for writing commands (`--wait=30` on legacy).
    fn write_args(&self) -> &'static [&'static str] {
        if self.wait { &["--wait=30"] } else { &[] }
    }

    /// `<save>` output of the current netns.
    pub(crate) fn save_current(&self) -> Result<Saved, RedirectError> {
        let out = exec::run(&self.save, &[], None)?;
        Ok(Saved::parse(&exec::stdout(&out)))
    }

    /// `<restore> --noflush [-v]` of `input` in the current netns.
    pub(crate) fn restore_current(&self, input: &str) -> Result<(), RedirectError> {
        let mut args = vec!["--noflush"];
        args.extend_from_slice(self.write_args());
        exec::run(&self.restore, &args, Some(input)).map(drop)
    }

    /// `<cmd> -t table -C chain spec...`: does the kernel hold this exact rule?
    fn check_current(&self, table: &str, chain: &str, spec: &str) -> Result<bool, RedirectError> {
        let mut args = vec!["-t", table, "-C", chain];
        args.extend(spec.split_whitespace());
        args.extend_from_slice(self.write_args());
        Ok(exec::output(&self.cmd, &args, None)?.status.success())
    }
}

impl IptablesBackend {
    /// A backend with the detected binaries of both families (§2.10.1); call in the host netns.
    pub fn detect(reconcile: bool) -> Self {
        IptablesBackend::with_binaries(Xtables::detect(Family::V4), Xtables::detect(Family::V6), reconcile)
    }

    /// A backend with explicit binaries; `reconcile` rebuilds drifted rules (§2.8.2 step 3).
    pub fn with_binaries(v4: Xtables, v6: Xtables, reconcile: bool) -> Self {
        IptablesBackend { v4, v6, reconcile }
    }

    fn families(&self, capture: &PodCapture) -> Vec<(Family, &Xtables)> {
        let mut out = Vec::new();
        if capture.ipv4 {
            out.push((Family::V4, &self.v4));
        }
        if capture.ipv6 {
            out.push((Family::V6, &self.v6));
        }
        out
    }
}

impl RuleBackend for IptablesBackend {
    fn apply(&self, netns: BorrowedFd<'_>, capture: &PodCapture) -> Result<(), RedirectError> {
        check_capture(capture)?;
        in_netns(netns, || {
            routing::apply(capture)?;
            handoff::apply()?;
            for (family, xt) in self.families(capture) {
                apply_plan(xt, &pod_plan(capture, family), &POD_CHAINS, self.reconcile)?;
            }
            Ok(())
        })
    }

    fn verify(&self, netns: BorrowedFd<'_>, capture: &PodCapture) -> Result<Verification, RedirectError> {
        check_capture(capture)?;
        in_netns(netns, || {
            let (mut drift, mut present) = routing::verify(capture)?;
            drift.extend(handoff::verify()?);
            let mut missing_family = Vec::new();
            for (family, xt) in self.families(capture) {
                let state = compare(xt, &pod_plan(capture, family), &POD_CHAINS)?;
                if !state.residue {
                    missing_family.push(format!("{}: no capture rules", xt.cmd));
                }
                present |= state.residue;
                drift.extend(state.delta.into_iter().map(|d| format!("{}: {d}", xt.cmd)));
            }
            Ok(if !present {
                Verification::Absent
            } else if drift.is_empty() && missing_family.is_empty() {
                Verification::InSync
            } else {
                drift.extend(missing_family);
                Verification::Drift(drift)
            })
        })
    }

    fn remove(&self, netns: BorrowedFd<'_>, _capture: &PodCapture) -> Result<(), RedirectError> {
        in_netns(netns, || {
            // Both families always: a capture applied with IPv6 must go even if IPv6 is now off.
            for xt in [&self.v4, &self.v6] {
                cleanup(xt, &POD_CHAINS)?;
            }
            routing::remove()?;
            handoff::remove()
        })
    }
}

/// One rule: `-A chain spec` (or `-I chain 1 spec` when `insert`) in `table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) table: &'static str,
    pub(crate) chain: String,
    pub(crate) spec: String,
    pub(crate) insert: bool,
}

/// Jumps from built-in chains plus rules in our chains, both in append order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub(crate) jumps: Vec<Rule>,
    pub(crate) rules: Vec<Rule>,
}

impl Plan {
    pub(crate) fn jump(&mut self, table: &'static str, from: &str, to: &str) {
        self.jumps.push(Rule { table, chain: from.into(), spec: format!("-j {to}"), insert: false });
    }

    pub(crate) fn rule(&mut self, table: &'static str, chain: &str, spec: String) {
        self.rules.push(Rule { table, chain: chain.into(), spec, insert: false });
    }

    fn tables(&self) -> Vec<&'static str> {
        TABLE_ORDER
            .into_iter()
            .filter(|t| self.jumps.iter().chain(&self.rules).any(|r| r.table == *t))
            .collect()
    }

    /// Our chains of `table` in first-use order: chains holding rules, then jump targets.
    fn chains(&self, table: &str) -> Vec<String> {
        let mut chains: Vec<String> = Vec::new();
        let used = self.rules.iter().filter(|r| r.table == table).map(|r| r.chain.clone());
        let targets = self.jumps.iter().filter(|r| r.table == table).filter_map(|r| jump_target(&r.spec));
        for chain in used.chain(targets.map(str::to_owned)) {
            if !chains.contains(&chain) {
                chains.push(chain);
            }
        }
        chains
    }

    pub(crate) fn restore_text(&self) -> String {
        let mut text = String::new();
        for table in self.tables() {
            text.push_str(&format!("* {table}\n"));
            for chain in self.chains(table) {
                text.push_str(&format!("-N {chain}\n"));
            }
            for rule in self.jumps.iter().chain(&self.rules).filter(|r| r.table == table) {
                if rule.insert {
                    text.push_str(&format!("-I {} 1 {}\n", rule.chain, rule.spec));
                } else {
                    text.push_str(&format!("-A {} {}\n", rule.chain, rule.spec));
                }
            }
            text.push_str("COMMIT\n");
        }
        text
    }
}

/// The §2.8.1 rules for one family, in the builder's append order.
pub(crate) fn pod_plan(capture: &PodCapture, family: Family) -> Plan {
    let (lo, probe) = match family {
        Family::V4 => ("127.0.0.1/32".to_owned(), capture.probe_snat_v4.to_string()),
        Family::V6 => ("::1/128".to_owned(), capture.probe_snat_v6.to_string()),
    };
    let mark = format!("{ZTUNNEL_MARK:#x}/{MARK_MASK:#x}");
    let tproxy = format!("{TPROXY_MARK:#x}/{MARK_MASK:#x}");
    let (pre, out) = ("ISTIO_PRERT", "ISTIO_OUTPUT");
    let mut plan = Plan::default();

    plan.jump("mangle", "PREROUTING", pre);
    plan.jump("mangle", "OUTPUT", out);
    plan.jump("nat", "OUTPUT", out);
    if capture.dns {
        plan.jump("raw", "PREROUTING", pre);
        plan.jump("raw", "OUTPUT", out);
    }
    plan.jump("nat", "PREROUTING", pre);

    for iface in &capture.virtual_interfaces {
        plan.rule("nat", pre, format!("-i {iface} -p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}"));
        plan.rule("nat", pre, format!("-i {iface} -p tcp -j RETURN"));
    }
    plan.rule("mangle", pre, format!("-m mark --mark {mark} -j CONNMARK --set-xmark {tproxy}"));
    if !capture.ingress_mode {
        plan.rule("nat", pre, format!("-s {probe} -p tcp -m tcp -j ACCEPT"));
    }
    plan.rule("nat", out, format!("-d {probe} -p tcp -m tcp -j ACCEPT"));
    if !capture.ingress_mode {
        plan.rule(
            "nat",
            pre,
            format!(
                "! -d {lo} -p tcp ! --dport {INBOUND_HBONE_PORT} -m mark ! --mark {mark} \
                 -j REDIRECT --to-ports {INBOUND_PLAINTEXT_PORT}"
            ),
        );
    }
    plan.rule(
        "mangle",
        out,
        format!(
            "-m connmark --mark {tproxy} -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff"
        ),
    );
    if capture.dns {
        plan.rule(
            "nat",
            out,
            format!(
                "! -o lo -p udp -m mark ! --mark {mark} -m udp --dport 53 -j REDIRECT --to-port {DNS_PORT}"
            ),
        );
        plan.rule(
            "nat",
            out,
            format!("! -d {lo} -p tcp --dport 53 -m mark ! --mark {mark} -j REDIRECT --to-ports {DNS_PORT}"),
        );
        plan.rule(
            "raw",
            out,
            format!("-p udp -m mark --mark {mark} -m udp --dport 53 -j CT --zone {DNS_CT_ZONE}"),
        );
        plan.rule(
            "raw",
            pre,
            format!("-p udp -m mark ! --mark {mark} -m udp --sport 53 -j CT --zone {DNS_CT_ZONE}"),
        );
    }
    plan.rule("nat", out, format!("-p tcp -m mark --mark {tproxy} -j ACCEPT"));
    plan.rule("nat", out, format!("! -d {lo} -o lo -j ACCEPT"));
    plan.rule(
        "nat",
        out,
        format!("! -d {lo} -p tcp -m mark ! --mark {mark} -j REDIRECT --to-ports {OUTBOUND_PORT}"),
    );
    plan
}

/// Rejects captures whose interface names cannot be put into a rule safely.
pub(crate) fn check_capture(capture: &PodCapture) -> Result<(), RedirectError> {
    for name in &capture.virtual_interfaces {
        check_interface_name(name).map_err(|reason| RedirectError::InvalidValue {
            what: "interface name",
            value: name.clone(),
            reason,
        })?;
    }
    Ok(())
}

/// §2.8.2 in the current netns: restore when clean or drifted (reconciling first if asked),
/// nothing when already in sync.
pub(crate) fn apply_plan(
    xt: &Xtables,
    plan: &Plan,
    owned: &[&str],
    reconcile: bool,
) -> Result<(), RedirectError> {
    let state = compare(xt, plan, owned)?;
    if state.residue && state.delta.is_empty() {
        return Ok(());
    }
    if state.residue && reconcile {
        tracing::info!(binary = %xt.cmd, drift = ?state.delta, "reconciling drifted capture rules");
        add_guardrails(xt)?;
        let rebuilt = cleanup(xt, owned).and_then(|()| xt.restore_current(&plan.restore_text()));
        let lifted = remove_guardrails(xt);
        return rebuilt.and(lifted);
    }
    if state.residue {
        tracing::warn!(binary = %xt.cmd, drift = ?state.delta, "capture rules drifted and reconcile is off; applying anyway");
    }
    xt.restore_current(&plan.restore_text())
}

/// Result of comparing the live rules with a plan.
pub(crate) struct State {
    /// Some chain of ours, or a jump to one, exists.
    pub(crate) residue: bool,
    /// Differences found (empty = in sync).
    pub(crate) delta: Vec<String>,
}

/// Compares the live rules (one save, `-C` only for rules whose saved text differs) with `plan`.
pub(crate) fn compare(xt: &Xtables, plan: &Plan, owned: &[&str]) -> Result<State, RedirectError> {
    let saved = xt.save_current()?;
    let family = if xt.cmd.starts_with("ip6") { Family::V6 } else { Family::V4 };
    let is_owned = |chain: &str| owned.contains(&chain);
    let mut residue = false;
    let mut delta = Vec::new();
    for table in &saved.tables {
        for chain in &table.chains {
            if is_owned(chain) {
                residue = true;
                let expected =
                    plan.rules.iter().filter(|r| r.table == table.name && r.chain == *chain).count();
                let actual = table.rules.iter().filter(|(c, _)| c == chain).count();
                if !plan.chains(&table.name).contains(chain) {
                    delta.push(format!("unexpected chain {}/{chain}", table.name));
                } else if expected != actual {
                    delta.push(format!("{}/{chain} has {actual} rules, expected {expected}", table.name));
                }
            }
        }
        for (chain, spec) in &table.rules {
            if !is_owned(chain) && jump_target(spec).is_some_and(is_owned) {
                residue = true;
                let expected = plan
                    .jumps
                    .iter()
                    .filter(|j| j.table == table.name && &j.chain == chain && &j.spec == spec)
                    .count();
                let actual = table.rules.iter().filter(|(c, s)| c == chain && s == spec).count();
                if expected == 0 {
                    delta.push(format!("unexpected jump {}/{chain} {spec}", table.name));
                } else if actual > expected {
                    delta.push(format!("duplicate jump {}/{chain} {spec}", table.name));
                }
            }
        }
    }
    if !residue {
        return Ok(State { residue, delta });
    }
    for table in plan.tables() {
        let live = saved.tables.iter().find(|t| t.name == table);
        for chain in plan.chains(table) {
            if !live.is_some_and(|t| t.chains.contains(&chain)) {
                delta.push(format!("chain {table}/{chain} missing"));
            }
        }
        for rule in plan.jumps.iter().chain(&plan.rules).filter(|r| r.table == table) {
            let want = save_form(&rule.spec, family);
            let found = live.is_some_and(|t| t.rules.iter().any(|(c, s)| *c == rule.chain && *s == want));
            if !found && !xt.check_current(table, &rule.chain, &rule.spec)? {
                delta.push(format!("rule missing: -t {table} -A {} {}", rule.chain, rule.spec));
            }
        }
    }
    delta.dedup();
    Ok(State { residue, delta })
}

/// Removes every jump to an owned chain and flushes and deletes the owned chains, in one
/// `--noflush` restore (the operations of the spec's delete list, atomic per table).
pub(crate) fn cleanup(xt: &Xtables, owned: &[&str]) -> Result<(), RedirectError> {
    let saved = xt.save_current()?;
    let mut input = String::new();
    for table in &saved.tables {
        let chains: Vec<&String> = table.chains.iter().filter(|c| owned.contains(&c.as_str())).collect();
        let jumps: Vec<&(String, String)> = table
            .rules
            .iter()
            .filter(|(chain, spec)| {
                !owned.contains(&chain.as_str()) && jump_target(spec).is_some_and(|t| owned.contains(&t))
            })
            .collect();
        if chains.is_empty() && jumps.is_empty() {
            continue;
        }
        input.push_str(&format!("*{}\n", table.name));
        for (chain, spec) in jumps {
            input.push_str(&format!("-D {chain} {spec}\n"));
        }
        for chain in &chains {
            input.push_str(&format!("-F {chain}\n"));
        }
        for chain in &chains {
            input.push_str(&format!("-X {chain}\n"));
        }
        input.push_str("COMMIT\n");
    }
    if input.is_empty() { Ok(()) } else { xt.restore_current(&input) }
}

const GUARDRAILS: [(&str, &str); 6] = [
    ("INPUT", "-p tcp -j DROP"),
    ("INPUT", "-p udp -j DROP"),
    ("FORWARD", "-p tcp -j DROP"),
    ("FORWARD", "-p udp -j DROP"),
    ("OUTPUT", "-p tcp -j DROP"),
    ("OUTPUT", "-p udp -j DROP"),
];

/// Drops all TCP/UDP while rules are rebuilt, so no packet passes half-built capture.
fn add_guardrails(xt: &Xtables) -> Result<(), RedirectError> {
    let mut input = String::from("*filter\n");
    for (chain, spec) in GUARDRAILS {
        input.push_str(&format!("-I {chain} 1 {spec}\n"));
    }
    input.push_str("COMMIT\n");
    xt.restore_current(&input)
}

fn remove_guardrails(xt: &Xtables) -> Result<(), RedirectError> {
    let mut input = String::from("*filter\n");
    for (chain, spec) in GUARDRAILS {
        input.push_str(&format!("-D {chain} {spec}\n"));
    }
    input.push_str("COMMIT\n");
    xt.restore_current(&input)
}

/// Parsed `iptables-save` output.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Saved {
    pub(crate) tables: Vec<SavedTable>,
}

/// One `*table` section: declared chains and `-A chain spec` rules in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SavedTable {
    pub(crate) name: String,
    pub(crate) chains: Vec<String>,
    pub(crate) rules: Vec<(String, String)>,
}

impl Saved {
    /// Parses save output; unknown lines are ignored (save output comes from the local tool).
    pub(crate) fn parse(text: &str) -> Saved {
        let mut saved = Saved::default();
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('*') {
                saved.tables.push(SavedTable { name: name.trim().to_owned(), ..SavedTable::default() });
            } else if let Some(table) = saved.tables.last_mut() {
                if let Some(decl) = line.strip_prefix(':') {
                    if let Some(chain) = decl.split_whitespace().next() {
                        table.chains.push(chain.to_owned());
                    }
                } else if let Some(rule) = line.strip_prefix("-A ") {
                    let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
                    table.rules.push((chain.to_owned(), spec.trim().to_owned()));
                }
            }
        }
        saved
    }
}

/// The chain a `-j CHAIN` spec jumps to (the last `-j`).
fn jump_target(spec: &str) -> Option<&str> {
    let mut tokens = spec.split_whitespace();
    let mut target = None;
    while let Some(token) = tokens.next() {
        if token == "-j" {
            target = tokens.next();
        }
    }
    target
}

/// How `iptables-save` prints a rule given as restore input: host addresses get their prefix,
/// `--to-port` becomes `--to-ports`, and `-p P [!] --dport` gets the implicit `-m P`.
pub(crate) fn save_form(spec: &str, family: Family) -> String {
    let full = match family {
        Family::V4 => "/32",
        Family::V6 => "/128",
    };
    let tokens: Vec<&str> = spec.split_whitespace().collect();
    let mut out: Vec<String> = Vec::with_capacity(tokens.len() + 2);
    let mut i = 0;
    while i < tokens.len() {
        let token = tokens[i];
        match token {
            "-s" | "-d" if i + 1 < tokens.len() => {
                let addr = tokens[i + 1];
                out.push(token.to_owned());
                out.push(if addr.contains('/') { addr.to_owned() } else { format!("{addr}{full}") });
                i += 2;
                continue;
            }
            "--to-port" => out.push("--to-ports".to_owned()),
            "-p" if i + 1 < tokens.len() => {
                let proto = tokens[i + 1];
                out.push(token.to_owned());
                out.push(proto.to_owned());
                let next = tokens.get(i + 2).copied();
                let after = tokens.get(i + 3).copied();
                let port = |t: Option<&str>| matches!(t, Some("--dport" | "--sport"));
                if port(next) || (next == Some("!") && port(after)) {
                    out.push("-m".to_owned());
                    out.push(proto.to_owned());
                }
                i += 2;
                continue;
            }
            _ => out.push(token.to_owned()),
        }
        i += 1;
    }
    out.join(" ")
}

/// Legacy iptables ≥ 1.6.2 takes `--wait`: parses `v(\d+(\.\d+)+)` from `--version` output;
/// unparsable output counts as 0.0.0 (no wait), as upstream assumes.
/// Why a variant's rules could not be read, when its save command is there but was refused: the
/// node's rules may be in that variant's tables, and taking the other one would split pods' rules
/// from the node's. iptables-legacy needs CAP_NET_RAW (it opens a raw socket). Other failures (a
/// kernel without that variant's tables) mean no rules there, and are not said.
fn unreadable(save: &str, out: &std::process::Output) -> Option<String> {
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !err.contains("Permission denied") {
        return None;
    }
    Some(format!(
        "cannot read the node's rules with {save} ({}: {}); the other variant is used, which splits pods' \
         rules from the node's if the node's are in this one (iptables-legacy needs CAP_NET_RAW)",
        out.status,
        err.trim()
    ))
}

fn legacy_needs_wait(version_output: &str) -> bool {
    let Some(start) = version_output.find(" v") else { return false };
    let digits: String =
        version_output[start + 2..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let parts: Vec<u32> = digits.split('.').filter_map(|p| p.parse().ok()).collect();
    let version = (parts.first().copied(), parts.get(1).copied(), parts.get(2).copied().unwrap_or(0));
    match version {
        (Some(major), Some(minor), patch) => (major, minor, patch) >= (1, 6, 2),
        _ => false,
    }
}

#[cfg(test)]
mod detect_tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{ExitStatus, Output};

    use super::unreadable;

    /// A save command that is there but refused (iptables-legacy without CAP_NET_RAW) is said,
    /// not taken silently as "no rules of that variant".
    #[test]
    fn a_refused_save_is_said() {
        let out = |code: i32, stderr: &str| Output {
            status: ExitStatus::from_raw(code << 8),
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        };
        assert_eq!(unreadable("iptables-legacy-save", &out(0, "")), None);
        let no_tables = "iptables-legacy-save v1.8.9 (legacy): Cannot initialize: Table does not exist (do you need to insmod?)";
        assert_eq!(unreadable("iptables-legacy-save", &out(1, no_tables)), None);
        assert_eq!(
            unreadable(
                "iptables-legacy-save",
                &out(
                    1,
                    "iptables-save v1.8.9 (legacy): Cannot initialize: Permission denied (you must be root)\n"
                )
            )
            .as_deref(),
            Some(
                "cannot read the node's rules with iptables-legacy-save (exit status: 1: iptables-save v1.8.9 \
                 (legacy): Cannot initialize: Permission denied (you must be root)); the other variant is used, which \
                 splits pods' rules from the node's if the node's are in this one (iptables-legacy needs CAP_NET_RAW)"
            )
        );
    }
}
