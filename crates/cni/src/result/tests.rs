#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

const V1: &str = r#"{
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/var/run/netns/cni-1", "mtu": 1500}],
    "ips": [{"interface": 0, "address": "10.244.1.5/24", "gateway": "10.244.1.1"},
            {"interface": 0, "address": "fd00:10:244:1::5/64"}],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {}
}"#;

const V04: &str = r#"{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/cni-1"}],"ips":[{"version":"4","interface":0,"address":"10.244.1.5/24","gateway":"10.244.1.1"}],"dns":{},"x-vendor":{"keep":true}}"#;

#[test]
fn same_version_is_printed_verbatim() {
    for (text, version) in [
        (V1.to_owned(), CniVersion::V1_0_0),
        (V04.to_owned(), CniVersion::V0_4_0),
        (V04.replace("0.4.0", "0.3.0"), CniVersion::V0_3_0),
        (V04.replace("0.4.0", "0.3.1"), CniVersion::V0_3_1),
        (V1.replace("1.0.0", "1.1.0"), CniVersion::V1_1_0),
    ] {
        let r = raw(&text);
        let prev = PrevResult::parse(&r).unwrap();
        assert_eq!(prev.render(version), text);
    }
}

#[test]
fn missing_version_is_inserted_keeping_bytes() {
    let r = raw(r#"{"ips": [], "dns": {}}"#);
    let out = PrevResult::parse(&r).unwrap().render(CniVersion::V1_0_0);
    assert_eq!(out, r#"{"cniVersion":"1.0.0","ips": [], "dns": {}}"#);
    let r = raw("{ }");
    let out = PrevResult::parse(&r).unwrap().render(CniVersion::V0_4_0);
    assert_eq!(out, r#"{"cniVersion":"0.4.0" }"#);
    let _: Value = serde_json::from_str(&out).unwrap();
}

#[test]
fn same_layout_changes_only_the_version() {
    let r = raw(V1);
    let out = PrevResult::parse(&r).unwrap().render(CniVersion::V1_1_0);
    let mut want: Value = serde_json::from_str(V1).unwrap();
    want["cniVersion"] = json!("1.1.0");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), want);
}

#[test]
fn legacy_to_current_drops_ip_version() {
    let r = raw(V04);
    let out: Value =
        serde_json::from_str(&PrevResult::parse(&r).unwrap().render(CniVersion::V1_0_0)).unwrap();
    assert_eq!(
        out,
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1"}],
            "ips": [{"interface": 0, "address": "10.244.1.5/24", "gateway": "10.244.1.1"}],
            "dns": {},
            "x-vendor": {"keep": true}
        })
    );
}

#[test]
fn current_to_legacy_adds_ip_version_and_trims_interfaces() {
    let r = raw(V1);
    let out: Value =
        serde_json::from_str(&PrevResult::parse(&r).unwrap().render(CniVersion::V0_3_1)).unwrap();
    assert_eq!(
        out,
        json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/var/run/netns/cni-1"}],
            "ips": [{"version": "4", "interface": 0, "address": "10.244.1.5/24", "gateway": "10.244.1.1"},
                    {"version": "6", "interface": 0, "address": "fd00:10:244:1::5/64"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    );
}

#[test]
fn empty_results() {
    assert_eq!(empty_result(CniVersion::V1_1_0), r#"{"cniVersion":"1.1.0"}"#);
    assert_eq!(empty_result(CniVersion::V0_3_0), r#"{"cniVersion":"0.3.0","dns":{}}"#);
}

#[test]
fn event_ips_from_result() {
    let r = raw(V1);
    let ips = PrevResult::parse(&r).unwrap().event_ips().unwrap();
    assert_eq!(ips.len(), 2);
    assert_eq!(ips[0].interface, Some(0));
    assert_eq!(ips[0].address, IpNet::parse_cidr("10.244.1.5/24").unwrap());
    assert_eq!(ips[0].gateway, Some("10.244.1.1".parse().unwrap()));
    assert_eq!(ips[1].gateway, None);
    let r = raw(r#"{"cniVersion":"1.0.0"}"#);
    assert!(PrevResult::parse(&r).unwrap().event_ips().unwrap().is_empty());
}

#[test]
fn rejects_bad_results() {
    type Check = fn(&ResultError) -> bool;
    let cases: &[(&str, Check)] = &[
        ("[]", |e| matches!(e, ResultError::NotObject)),
        ("\"x\"", |e| matches!(e, ResultError::NotObject)),
        (r#"{"cniVersion":"0.2.0","ip4":{}}"#, |e| matches!(e, ResultError::Version(_))),
        (r#"{"cniVersion":7}"#, |e| matches!(e, ResultError::Version(_))),
    ];
    for (text, check) in cases {
        let r = raw(text);
        let err = PrevResult::parse(&r).unwrap_err();
        assert!(check(&err), "{text}: {err:?}");
    }
    for ips in [
        r#""x""#,
        r#"[1]"#,
        r#"[{}]"#,
        r#"[{"address":"10.0.0.1"}]"#,
        r#"[{"address":"10.0.0.1/24","gateway":"nope"}]"#,
        r#"[{"address":"10.0.0.1/24","gateway":5}]"#,
        r#"[{"address":"10.0.0.1/24","interface":"0"}]"#,
        r#"[{"address":"10.0.0.1/24","interface":1.5}]"#,
    ] {
        let r = raw(&format!(r#"{{"cniVersion":"1.0.0","ips":{ips}}}"#));
        let prev = PrevResult::parse(&r).unwrap();
        assert!(matches!(prev.event_ips(), Err(ResultError::Ips(_))), "{ips}");
    }
}
