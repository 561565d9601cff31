//! The in-pod traffic capture rules of node-agent spec §2.8 (iptables §2.8.1, nftables §2.8.3),
//! applied to a test pod the way istio-cni does it.

use std::io::Write;
use std::process::Stdio;

use super::netns::Pod;

/// Mark the proxy sets on its in-pod sockets (`SO_MARK`), matched with mask 0xfff.
pub const PROXY_MARK: u32 = 0x539;
/// Connmark / fwmark for connections accepted by the proxy, matched with mask 0xfff.
pub const TPROXY_MARK: u32 = 0x111;
/// Outbound capture port.
pub const OUTBOUND_PORT: u16 = 15001;
/// Inbound plaintext capture port.
pub const INBOUND_PLAINTEXT_PORT: u16 = 15006;
/// Inbound HBONE port (never redirected).
pub const INBOUND_HBONE_PORT: u16 = 15008;
/// DNS capture port.
pub const DNS_PORT: u16 = 15053;
/// Kubelet probe SNAT address (IPv4).
pub const PROBE_SNAT_V4: &str = "169.254.7.127";
/// Kubelet probe SNAT address (IPv6).
pub const PROBE_SNAT_V6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

/// Routing table for marked traffic and the priority of its rule.
const ROUTE_TABLE: &str = "100";
const RULE_PRIORITY: &str = "32764";

/// §2.8.1 default rule set (DNS capture on, no overrides), as fed to `iptables-restore`.
const IPTABLES_V4: &str = "\
* mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
* nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
* raw
-N ISTIO_OUTPUT
-N ISTIO_PRERT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";

/// The §2.8.1 IPv4 `iptables-restore` input.
pub fn iptables_v4_rules() -> String {
    IPTABLES_V4.to_owned()
}

/// The §2.8.1 IPv6 `ip6tables-restore` input (loopback and probe SNAT addresses substituted).
pub fn iptables_v6_rules() -> String {
    IPTABLES_V4.replace("127.0.0.1/32", "::1/128").replace(PROBE_SNAT_V4, PROBE_SNAT_V6)
}

/// The §2.8.3 nftables transaction (default rules, v4 and v6, DNS capture on).
pub fn nft_rules() -> String {
    let nat = "inet istio-ambient-nat";
    let mangle = "inet istio-ambient-mangle";
    let raw = "inet istio-ambient-raw";
    let v4lo = "127.0.0.1/32";
    let v6lo = "::1/128";
    let not_proxy = "meta mark and 0xfff != 0x539";
    let lines = [
        format!("add table {nat}"),
        format!("flush table {nat}"),
        format!("add chain {nat} prerouting {{ type nat hook prerouting priority -100 ; }}"),
        format!("add chain {nat} output {{ type nat hook output priority -100 ; }}"),
        format!("add chain {nat} istio-prerouting"),
        format!("add chain {nat} istio-output"),
        format!("add rule {nat} output counter jump istio-output"),
        format!("add rule {nat} prerouting counter jump istio-prerouting"),
        format!("add rule {nat} istio-prerouting meta l4proto tcp ip saddr {PROBE_SNAT_V4} counter accept"),
        format!("add rule {nat} istio-prerouting meta l4proto tcp ip6 saddr {PROBE_SNAT_V6} counter accept"),
        format!("add rule {nat} istio-output meta l4proto tcp ip daddr {PROBE_SNAT_V4} counter accept"),
        format!("add rule {nat} istio-output meta l4proto tcp ip6 daddr {PROBE_SNAT_V6} counter accept"),
        format!(
            "add rule {nat} istio-prerouting ip daddr != {v4lo} tcp dport != 15008 {not_proxy} counter redirect to :15006"
        ),
        format!(
            "add rule {nat} istio-prerouting ip6 daddr != {v6lo} tcp dport != 15008 {not_proxy} counter redirect to :15006"
        ),
        format!(
            "add rule {nat} istio-output oifname != \"lo\" {not_proxy} udp dport 53 counter redirect to :15053"
        ),
        format!(
            "add rule {nat} istio-output ip daddr != {v4lo} tcp dport 53 {not_proxy} counter redirect to :15053"
        ),
        format!(
            "add rule {nat} istio-output ip6 daddr != {v6lo} tcp dport 53 {not_proxy} counter redirect to :15053"
        ),
        format!("add rule {nat} istio-output meta l4proto tcp meta mark and 0xfff == 0x111 counter accept"),
        format!("add rule {nat} istio-output oifname \"lo\" ip daddr != {v4lo} counter accept"),
        format!("add rule {nat} istio-output oifname \"lo\" ip6 daddr != {v6lo} counter accept"),
        format!(
            "add rule {nat} istio-output meta l4proto tcp ip daddr != {v4lo} {not_proxy} counter redirect to :15001"
        ),
        format!(
            "add rule {nat} istio-output meta l4proto tcp ip6 daddr != {v6lo} {not_proxy} counter redirect to :15001"
        ),
        format!("add table {mangle}"),
        format!("flush table {mangle}"),
        format!("add chain {mangle} prerouting {{ type filter hook prerouting priority -150 ; }}"),
        format!("add chain {mangle} output {{ type route hook output priority -150 ; }}"),
        format!("add chain {mangle} istio-prerouting"),
        format!("add chain {mangle} istio-output"),
        format!("add rule {mangle} prerouting counter jump istio-prerouting"),
        format!("add rule {mangle} output counter jump istio-output"),
        format!(
            "add rule {mangle} istio-prerouting meta mark and 0xfff == 0x539 counter ct mark set ct mark and 0xfffff000 or 0x111"
        ),
        format!("add rule {mangle} istio-output ct mark and 0xfff == 0x111 counter meta mark set ct mark"),
        format!("add table {raw}"),
        format!("flush table {raw}"),
        format!("add chain {raw} prerouting {{ type filter hook prerouting priority -300 ; }}"),
        format!("add chain {raw} output {{ type filter hook output priority -300 ; }}"),
        format!("add chain {raw} istio-prerouting"),
        format!("add chain {raw} istio-output"),
        format!("add rule {raw} prerouting counter jump istio-prerouting"),
        format!("add rule {raw} output counter jump istio-output"),
        format!(
            "add rule {raw} istio-output udp dport 53 meta mark and 0xfff == 0x539 counter ct zone set 1"
        ),
        format!(
            "add rule {raw} istio-prerouting udp sport 53 meta mark and 0xfff != 0x539 counter ct zone set 1"
        ),
    ];
    let mut script = lines.join("\n");
    script.push('\n');
    script
}

impl Pod {
    /// Applies the §2.8.1 capture (policy routes and rules, then iptables-restore --noflush for
    /// v4 and ip6tables-restore for v6) inside the pod; panics if any step fails.
    pub fn capture(&self) {
        self.capture_routes();
        self.restore("iptables-restore", &iptables_v4_rules());
        self.restore("ip6tables-restore", &iptables_v6_rules());
    }

    /// Applies the §2.8.3 nftables variant of the capture (same routes and rules).
    pub fn capture_nft(&self) {
        self.capture_routes();
        self.feed("nft", &["-f", "-"], &nft_rules());
    }

    /// Removes the capture like `DeleteInpodRules` (iptables and nftables), errors ignored.
    pub fn uncapture(&self) {
        for ipt in ["iptables", "ip6tables"] {
            for (table, chain, target) in [
                ("mangle", "PREROUTING", "ISTIO_PRERT"),
                ("mangle", "OUTPUT", "ISTIO_OUTPUT"),
                ("nat", "OUTPUT", "ISTIO_OUTPUT"),
                ("raw", "PREROUTING", "ISTIO_PRERT"),
                ("raw", "OUTPUT", "ISTIO_OUTPUT"),
                ("nat", "PREROUTING", "ISTIO_PRERT"),
            ] {
                self.quiet(ipt, &["-t", table, "-D", chain, "-j", target]);
            }
            for op in ["-F", "-X"] {
                for table in ["mangle", "nat", "raw"] {
                    for chain in ["ISTIO_PRERT", "ISTIO_OUTPUT"] {
                        self.quiet(ipt, &["-t", table, op, chain]);
                    }
                }
            }
        }
        for table in ["istio-ambient-nat", "istio-ambient-mangle", "istio-ambient-raw"] {
            self.quiet("nft", &["delete", "table", "inet", table]);
        }
        for family in ["-4", "-6"] {
            self.quiet(
                "ip",
                &[
                    family,
                    "rule",
                    "del",
                    "fwmark",
                    "0x111/0xfff",
                    "lookup",
                    ROUTE_TABLE,
                    "pref",
                    RULE_PRIORITY,
                ],
            );
        }
        self.quiet("ip", &["-4", "route", "del", "local", "0.0.0.0/0", "dev", "lo", "table", ROUTE_TABLE]);
        self.quiet("ip", &["-6", "route", "del", "local", "::/0", "dev", "lo", "table", ROUTE_TABLE]);
    }

    /// The output of `iptables-save` / `ip6tables-save` / `nft list ruleset` in the pod.
    pub fn ruleset(&self, tool: &str) -> String {
        let args: &[&str] = if tool == "nft" { &["list", "ruleset"] } else { &[] };
        String::from_utf8_lossy(&self.run_cmd(tool, args).stdout).into_owned()
    }

    /// Policy routing for connections accepted by the proxy: executed before the rules.
    fn capture_routes(&self) {
        self.run_cmd(
            "ip",
            &[
                "-4",
                "route",
                "replace",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
                "table",
                ROUTE_TABLE,
                "scope",
                "host",
            ],
        );
        self.run_cmd("ip", &["-6", "route", "replace", "local", "::/0", "dev", "lo", "table", ROUTE_TABLE]);
        for family in ["-4", "-6"] {
            let out = self
                .exec(
                    "ip",
                    &[
                        family,
                        "rule",
                        "add",
                        "fwmark",
                        "0x111/0xfff",
                        "lookup",
                        ROUTE_TABLE,
                        "pref",
                        RULE_PRIORITY,
                    ],
                )
                .output()
                .unwrap_or_else(|e| panic!("cannot run ip rule add: {e}"));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() || stderr.contains("File exists"),
                "ip {family} rule add failed in pod {}: {}",
                self.name,
                stderr.trim()
            );
        }
    }

    fn restore(&self, tool: &str, rules: &str) {
        self.feed(tool, &["--noflush", "-v"], rules);
    }

    /// Runs `tool args` in the pod with `input` on stdin; panics with stderr on failure.
    fn feed(&self, tool: &str, args: &[&str], input: &str) {
        let mut cmd = self.exec(tool, args);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes()).unwrap_or_else(|e| panic!("cannot write rules to {tool}: {e}"));
        }
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("cannot wait for {tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} failed in pod {} ({}): {}\ninput was:\n{input}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    fn quiet(&self, program: &str, args: &[&str]) {
        let _ = self.exec(program, args).output();
    }
}
