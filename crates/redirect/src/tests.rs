//! Unit tests: golden and snapshot renderings, annotation parsing, parsers.
//!
//! Snapshots are plain files under `testdata/` compared byte for byte (regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p ambit-redirect`, then review the diff). Plain files rather than
//! insta because the spec's rule block must be stored verbatim as the golden (no insta header),
//! and the same files are what an operator would feed to `iptables-restore` / `nft -f`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::host::{parse_ipset_save, render_host_iptables, render_host_nftables};
use crate::iptables::{Saved, save_form};
use crate::nftables::listed_tables;
use crate::*;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap_or_else(|e| panic!("cannot read testdata/{name}: {e}"))
}

/// Compares with a snapshot file, or rewrites it under `UPDATE_GOLDEN=1`.
fn snapshot(name: &str, actual: &str) {
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::write(testdata(name), actual).unwrap_or_else(|e| panic!("cannot write {name}: {e}"));
        return;
    }
    let expected = read(name);
    assert!(
        expected == actual,
        "snapshot testdata/{name} differs:\n--- expected\n{expected}\n--- actual\n{actual}"
    );
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The six upstream cases: (name, annotations, global DNS).
fn cases() -> Vec<(&'static str, BTreeMap<String, String>, bool)> {
    vec![
        ("default", annotations(&[]), true),
        ("ingress", annotations(&[(ANNOTATION_BYPASS_INBOUND, "true")]), false),
        ("virtual-interfaces", annotations(&[(ANNOTATION_VIRTUAL_INTERFACES, "en1, en2,,")]), false),
        (
            "ingress-virtual-interfaces",
            annotations(&[(ANNOTATION_BYPASS_INBOUND, "1"), (ANNOTATION_VIRTUAL_INTERFACES, "en1")]),
            false,
        ),
        ("dns-pod-enabled-global-off", annotations(&[(ANNOTATION_DNS_CAPTURE, "True")]), false),
        ("dns-pod-disabled-global-on", annotations(&[(ANNOTATION_DNS_CAPTURE, "F")]), true),
    ]
}

#[test]
fn default_v4_equals_spec_byte_for_byte() {
    let capture = PodCapture::default();
    assert_eq!(render_iptables(&capture, Family::V4), read("spec-default-v4.rules"));
}

#[test]
fn default_v6_equals_spec_substitution() {
    // §2.8.1: the v6 set is the v4 set with loopback and probe SNAT addresses substituted.
    let expected = read("spec-default-v4.rules")
        .replace("127.0.0.1/32", "::1/128")
        .replace("169.254.7.127", "fd16:9254:7127:1337:ffff:ffff:ffff:ffff");
    let capture = PodCapture { ipv6: true, ..PodCapture::default() };
    assert_eq!(render_iptables(&capture, Family::V6), expected);
}

#[test]
fn host_iptables_equals_spec() {
    assert_eq!(render_host_iptables(Family::V4), read("spec-host-v4.rules"));
    let v6 = render_host_iptables(Family::V6);
    assert!(v6.contains(
        "--match-set istio-inpod-probes-v6 dst -j SNAT --to-source fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
    ));
}

#[test]
fn upstream_cases_iptables_snapshots() {
    for (name, ann, global_dns) in cases() {
        for (family, suffix) in [(Family::V4, "v4"), (Family::V6, "v6")] {
            let capture = PodCapture::from_annotations(&ann, global_dns, true);
            snapshot(&format!("iptables/{name}-{suffix}.rules"), &render_iptables(&capture, family));
        }
    }
}

#[test]
fn upstream_cases_nftables_snapshots() {
    for (name, ann, global_dns) in cases() {
        for (ipv6, suffix) in [(false, "v4"), (true, "dual")] {
            let capture = PodCapture::from_annotations(&ann, global_dns, ipv6);
            let ruleset = render_nftables(&capture);
            snapshot(&format!("nftables/{name}-{suffix}.nft"), &ruleset.script(&[]));
        }
    }
}

/// §2.8.3's rule list, in order, as this crate writes it: `meta mark and` for the spec's
/// `mark and` / `meta mark &`, `and`/`or` for `&`/`|`, interface names quoted.
#[test]
fn nftables_contains_spec_rule_list_in_order() {
    let capture = PodCapture { ipv6: true, virtual_interfaces: vec!["X".into()], ..PodCapture::default() };
    let script = render_nftables(&capture).script(&[]);
    let v6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";
    let nat = "add rule inet istio-ambient-nat";
    let mangle = "add rule inet istio-ambient-mangle";
    let raw = "add rule inet istio-ambient-raw";
    let not_zt = "meta mark and 0xfff != 0x539";
    let expected = [
        format!("{nat} output counter jump istio-output"),
        format!("{nat} prerouting counter jump istio-prerouting"),
        format!("{nat} istio-prerouting iifname \"X\" meta l4proto tcp counter redirect to :15001"),
        format!("{nat} istio-prerouting iifname \"X\" meta l4proto tcp counter return"),
        format!("{nat} istio-prerouting meta l4proto tcp ip saddr 169.254.7.127 counter accept"),
        format!("{nat} istio-prerouting meta l4proto tcp ip6 saddr {v6} counter accept"),
        format!("{nat} istio-output meta l4proto tcp ip daddr 169.254.7.127 counter accept"),
        format!("{nat} istio-output meta l4proto tcp ip6 daddr {v6} counter accept"),
        format!(
            "{nat} istio-prerouting ip daddr != 127.0.0.1/32 tcp dport != 15008 {not_zt} counter redirect to :15006"
        ),
        format!(
            "{nat} istio-prerouting ip6 daddr != ::1/128 tcp dport != 15008 {not_zt} counter redirect to :15006"
        ),
        format!("{nat} istio-output oifname != \"lo\" {not_zt} udp dport 53 counter redirect to :15053"),
        format!(
            "{nat} istio-output ip daddr != 127.0.0.1/32 tcp dport 53 {not_zt} counter redirect to :15053"
        ),
        format!("{nat} istio-output ip6 daddr != ::1/128 tcp dport 53 {not_zt} counter redirect to :15053"),
        format!("{nat} istio-output meta l4proto tcp meta mark and 0xfff == 0x111 counter accept"),
        format!("{nat} istio-output oifname \"lo\" ip daddr != 127.0.0.1/32 counter accept"),
        format!("{nat} istio-output oifname \"lo\" ip6 daddr != ::1/128 counter accept"),
        format!(
            "{nat} istio-output meta l4proto tcp ip daddr != 127.0.0.1/32 {not_zt} counter redirect to :15001"
        ),
        format!(
            "{nat} istio-output meta l4proto tcp ip6 daddr != ::1/128 {not_zt} counter redirect to :15001"
        ),
        format!("{mangle} prerouting counter jump istio-prerouting"),
        format!("{mangle} output counter jump istio-output"),
        format!(
            "{mangle} istio-prerouting meta mark and 0xfff == 0x539 counter ct mark set ct mark and 0xfffff000 or 0x111"
        ),
        format!("{mangle} istio-output ct mark and 0xfff == 0x111 counter meta mark set ct mark"),
        format!("{raw} prerouting counter jump istio-prerouting"),
        format!("{raw} output counter jump istio-output"),
        format!("{raw} istio-output udp dport 53 meta mark and 0xfff == 0x539 counter ct zone set 1"),
        format!("{raw} istio-prerouting udp sport 53 {not_zt} counter ct zone set 1"),
    ];
    let rules: Vec<&str> = script.lines().filter(|l| l.starts_with("add rule")).collect();
    assert_eq!(rules, expected);
    // Tables and chains of §2.8.3's table.
    for line in [
        "add chain inet istio-ambient-nat prerouting { type nat hook prerouting priority -100 ; }",
        "add chain inet istio-ambient-nat output { type nat hook output priority -100 ; }",
        "add chain inet istio-ambient-mangle prerouting { type filter hook prerouting priority -150 ; }",
        "add chain inet istio-ambient-mangle output { type route hook output priority -150 ; }",
        "add chain inet istio-ambient-raw prerouting { type filter hook prerouting priority -300 ; }",
        "add chain inet istio-ambient-raw output { type filter hook output priority -300 ; }",
    ] {
        assert!(script.contains(line), "missing `{line}` in\n{script}");
    }
}

#[test]
fn nftables_dns_off_drops_raw_table_and_dns_rules() {
    let capture = PodCapture { dns: false, ..PodCapture::default() };
    let ruleset = render_nftables(&capture);
    assert!(ruleset.table("istio-ambient-raw").is_none());
    let script = ruleset.script(&[]);
    assert!(!script.contains("dport 53") && !script.contains("sport 53"));
}

#[test]
fn host_nftables_rules() {
    let script = render_host_nftables(true, 1234).script(&[]);
    assert!(script.contains(
        "add rule inet istio-ambient-nat postrouting meta l4proto tcp meta skuid 1234 ip daddr @istio-inpod-probes-v4 counter snat ip to 169.254.7.127"
    ));
    assert!(script.contains(
        "ip6 daddr @istio-inpod-probes-v6 counter snat ip6 to fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
    ));
    assert!(script.contains(
        "add chain inet istio-ambient-nat postrouting { type nat hook postrouting priority 100 ; }"
    ));
    assert!(!render_host_nftables(false, 0).script(&[]).contains("v6"));
}

#[test]
fn annotations_follow_go_parse_bool() {
    for (value, parsed) in [("1", Some(true)), ("T", Some(true)), ("TRUE", Some(true)), ("f", Some(false))] {
        assert_eq!(parse_go_bool(value), parsed);
    }
    for invalid in ["yes", "tRUE", " true", "", "2"] {
        assert_eq!(parse_go_bool(invalid), None, "{invalid:?}");
    }
    // Invalid values count as absent: global DNS wins, inbound capture stays on.
    let ann = annotations(&[(ANNOTATION_DNS_CAPTURE, "yes"), (ANNOTATION_BYPASS_INBOUND, "nope")]);
    let capture = PodCapture::from_annotations(&ann, true, false);
    assert!(capture.dns && !capture.ingress_mode);
    let capture = PodCapture::from_annotations(&ann, false, true);
    assert!(!capture.dns && capture.ipv6);
}

#[test]
fn virtual_interfaces_are_trimmed_and_checked() {
    let ann = annotations(&[(ANNOTATION_VIRTUAL_INTERFACES, " a ,, b.1 ,bad\"name,waytoolonginterface,c")]);
    let capture = PodCapture::from_annotations(&ann, true, false);
    assert_eq!(capture.virtual_interfaces, vec!["a", "b.1", "c"]);
}

#[test]
fn save_form_matches_iptables_save_output() {
    let cases = [
        (
            "-s 169.254.7.127 -p tcp -m tcp -j ACCEPT",
            Family::V4,
            "-s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT",
        ),
        (
            "! -d ::1/128 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006",
            Family::V6,
            "! -d ::1/128 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006",
        ),
        (
            "! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053",
            Family::V4,
            "! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053",
        ),
        (
            "-d fd16::1 -p tcp --dport 53 -j ACCEPT",
            Family::V6,
            "-d fd16::1/128 -p tcp -m tcp --dport 53 -j ACCEPT",
        ),
    ];
    for (input, family, saved) in cases {
        assert_eq!(save_form(input, family), saved);
    }
}

#[test]
fn parses_iptables_save() {
    let text = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:ISTIO_PRERT - [0:0]\n\
                -A PREROUTING -j ISTIO_PRERT\n-A ISTIO_PRERT -s 1.2.3.4/32 -j ACCEPT\nCOMMIT\n*raw\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
    let saved = Saved::parse(text);
    assert_eq!(saved.tables.len(), 2);
    assert_eq!(saved.tables[0].name, "nat");
    assert_eq!(saved.tables[0].chains, vec!["PREROUTING", "ISTIO_PRERT"]);
    assert_eq!(saved.tables[0].rules[1], ("ISTIO_PRERT".to_owned(), "-s 1.2.3.4/32 -j ACCEPT".to_owned()));
    assert!(saved.tables[1].rules.is_empty());
    // Garbage does not panic.
    let _ = Saved::parse("-A\n*\n:\n-A X\n");
}

#[test]
fn listing_extraction_strips_counters() {
    let ruleset = "table ip filter {\n}\ntable inet istio-ambient-raw {\n\tchain output {\n\t\ttype filter hook output priority raw; policy accept;\n\t\tcounter packets 3 bytes 180 jump istio-output\n\t}\n}\n";
    let tables = listed_tables(ruleset, &POD_TABLES);
    assert_eq!(tables.len(), 1);
    assert_eq!(
        tables[0].1,
        vec![
            "table inet istio-ambient-raw {",
            "chain output {",
            "type filter hook output priority raw; policy accept;",
            "counter jump istio-output",
            "}",
            "}"
        ]
    );
}

#[test]
fn parses_ipset_save_listings() {
    let save = "create istio-inpod-probes-v4 hash:ip family inet hashsize 1024 maxelem 65536 comment\nadd istio-inpod-probes-v4 10.0.0.5 comment \"uid-1\"\nadd istio-inpod-probes-v4 10.0.0.6\n";
    let entries = parse_ipset_save(save);
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0], ("10.0.0.5".parse().expect("address"), Some("uid-1".to_owned())));
}
