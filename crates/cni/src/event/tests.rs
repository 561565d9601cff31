#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

/// The spec's example body (node-agent.md §1.5), byte for byte.
const GOLDEN: &str = r#"{"Netns":"/var/run/netns/cni-5f1c","PodName":"web-0","PodNamespace":"demo","IPs":[{"Interface":0,"Address":{"IP":"10.244.1.5","Mask":"////AA=="},"Gateway":"10.244.1.1"}]}"#;

fn golden_event() -> PluginEvent {
    PluginEvent {
        netns: "/var/run/netns/cni-5f1c".into(),
        pod_name: "web-0".into(),
        pod_namespace: "demo".into(),
        ips: vec![EventIp {
            interface: Some(0),
            address: IpNet::parse_cidr("10.244.1.5/24").unwrap(),
            gateway: Some("10.244.1.1".parse().unwrap()),
        }],
    }
}

#[test]
fn golden_body() {
    assert_eq!(golden_event().to_json(), GOLDEN);
    assert_eq!(PluginEvent::from_json(GOLDEN.as_bytes()).unwrap(), golden_event());
}

#[test]
fn go_nil_values() {
    let event = PluginEvent {
        netns: "/var/run/netns/x".into(),
        pod_name: "p".into(),
        pod_namespace: "ns".into(),
        ips: vec![EventIp {
            interface: None,
            address: IpNet::parse_cidr("fd00::5/64").unwrap(),
            gateway: None,
        }],
    };
    assert_eq!(
        event.to_json(),
        r#"{"Netns":"/var/run/netns/x","PodName":"p","PodNamespace":"ns","IPs":[{"Interface":null,"Address":{"IP":"fd00::5","Mask":"//////////8AAAAAAAAAAA=="},"Gateway":""}]}"#
    );
    let empty = PluginEvent { ips: Vec::new(), ..event };
    assert!(empty.to_json().ends_with(r#""IPs":null}"#));
}

#[test]
fn decodes_go_variants() {
    // Missing IPs, null mask and gateway, IPv4-mapped address.
    let e = PluginEvent::from_json(br#"{"Netns":"n","PodName":"p","PodNamespace":"ns"}"#).unwrap();
    assert!(e.ips.is_empty());
    let e = PluginEvent::from_json(
        br#"{"Netns":"n","PodName":"p","PodNamespace":"ns","IPs":[{"Address":{"IP":"::ffff:10.0.0.1","Mask":null},"Gateway":null}]}"#,
    )
    .unwrap();
    assert_eq!(e.ips[0].address.mask, Vec::<u8>::new());
    assert_eq!(e.ips[0].gateway, None);
    assert_eq!(e.ips[0].interface, None);
    for bad in [
        &br#"{"Netns":"n","PodName":"p","PodNamespace":"ns","IPs":[{"Address":{"IP":"x","Mask":""}}]}"#[..],
        br#"{"Netns":"n","PodName":"p","PodNamespace":"ns","IPs":[{"Address":{"IP":"1.2.3.4","Mask":"!"}}]}"#,
        br#"{"Netns":"n","PodName":"p","PodNamespace":"ns","IPs":[{"Address":{"IP":"1.2.3.4","Mask":""},"Gateway":"g"}]}"#,
        br#"{"Netns":"n","PodName":"p"}"#,
    ] {
        assert!(PluginEvent::from_json(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn mapped_addresses_print_as_ipv4_like_go() {
    let net = IpNet::parse_cidr("::ffff:10.0.0.1/120").unwrap();
    assert_eq!(net.mask.len(), 16);
    let json = serde_json::to_string(&net).unwrap();
    assert_eq!(json, r#"{"IP":"10.0.0.1","Mask":"////////////////////AA=="}"#);
}

#[test]
fn cidr_table() {
    let ok: &[(&str, &[u8], u8)] = &[
        ("10.244.1.5/24", &[255, 255, 255, 0], 24),
        ("10.0.0.1/32", &[255; 4], 32),
        ("0.0.0.0/0", &[0; 4], 0),
        ("10.1.2.3/17", &[255, 255, 128, 0], 17),
    ];
    for (s, mask, prefix) in ok {
        let net = IpNet::parse_cidr(s).unwrap();
        assert_eq!(&net.mask[..], *mask, "{s}");
        assert_eq!(net.prefix_len(), Some(*prefix), "{s}");
    }
    assert_eq!(IpNet::parse_cidr("fd00::1/128").unwrap().prefix_len(), Some(128));
    for bad in
        ["10.0.0.1", "10.0.0.1/33", "10.0.0.1/", "/24", "10.0.0.1/+4", "fd00::/129", "x/1", "10.0.0.1/0024"]
    {
        assert!(IpNet::parse_cidr(bad).is_err(), "{bad}");
    }
    let odd = IpNet { ip: "10.0.0.1".parse().unwrap(), mask: vec![255, 0, 255, 0] };
    assert_eq!(odd.prefix_len(), None);
}

proptest! {
    #[test]
    fn from_json_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = PluginEvent::from_json(&bytes);
    }

    #[test]
    fn round_trips(
        v4 in any::<[u8; 4]>(),
        prefix in 0u8..=32,
        iface in proptest::option::of(any::<i64>()),
        gw in proptest::option::of(any::<[u8; 16]>()),
        name in "[a-z0-9-]{1,20}",
    ) {
        let event = PluginEvent {
            netns: format!("/var/run/netns/{name}"),
            pod_name: name.clone(),
            pod_namespace: name,
            ips: vec![EventIp {
                interface: iface,
                address: IpNet::parse_cidr(&format!("{}/{prefix}", std::net::Ipv4Addr::from(v4))).unwrap(),
                // Mapped addresses print as IPv4 (Go does too) and so come back as IPv4.
                gateway: gw.map(|g| std::net::Ipv6Addr::from(g).to_canonical()),
            }],
        };
        let back = PluginEvent::from_json(event.to_json().as_bytes()).unwrap();
        prop_assert_eq!(back, event);
    }
}

/// The agent's parse: what istio-cni sends, and each way a body is refused.
#[test]
fn agent_side_parse() {
    let ev = PluginEvent::parse(GOLDEN.as_bytes()).unwrap();
    assert_eq!(ev.pod_ips(), vec!["10.244.1.5".parse::<IpAddr>().unwrap()]);
    let mapped = PluginEvent::parse(
        br#"{"Netns":"/x","PodName":"p","PodNamespace":"n","IPs":[{"Address":{"IP":"::ffff:10.0.0.1"}}]}"#,
    )
    .unwrap();
    assert_eq!(mapped.pod_ips(), vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    assert!(matches!(PluginEvent::parse(b""), Err(EventError::Empty)));
    assert!(matches!(PluginEvent::parse(b"{"), Err(EventError::Json(_))));
    assert!(matches!(PluginEvent::parse(br#"{"PodName":"p","PodNamespace":"n"}"#), Err(EventError::Json(_))));
    let err = PluginEvent::parse(br#"{"Netns":"","PodName":"p","PodNamespace":"n"}"#).unwrap_err();
    assert_eq!(err.to_string(), "CNI plugin event has an empty Netns");
    let err = PluginEvent::parse(
        br#"{"Netns":"/var/run/netns/../../etc/passwd","PodName":"p","PodNamespace":"n"}"#,
    )
    .unwrap_err();
    assert!(matches!(err, EventError::Netns(NetnsPathError::Traversal(_))), "{err}");
}

#[test]
fn netns_path_forms() {
    for ok in ["/var/run/netns/cni-1", "/proc/123/ns/net", "//var/run/netns/x", "/a/..b/c.", "/a/.../b"] {
        assert_eq!(check_netns_path(ok), Ok(Path::new(ok)), "{ok}");
    }
    for (bad, want) in [
        ("var/run/netns/x", NetnsPathError::NotAbsolute("var/run/netns/x".into())),
        ("", NetnsPathError::NotAbsolute(String::new())),
        (
            "/var/run/netns/../../proc/1/ns/net",
            NetnsPathError::Traversal("/var/run/netns/../../proc/1/ns/net".into()),
        ),
        ("/var/run/netns/./x", NetnsPathError::Traversal("/var/run/netns/./x".into())),
        ("/var/run/netns/x/..", NetnsPathError::Traversal("/var/run/netns/x/..".into())),
        ("/var/run/\0x", NetnsPathError::Unusable),
    ] {
        assert_eq!(check_netns_path(bad), Err(want), "{bad:?}");
    }
    assert_eq!(check_netns_path(&format!("/{}", "a".repeat(MAX_NETNS_PATH))), Err(NetnsPathError::Unusable));
}

#[test]
fn retry_statuses() {
    assert!(is_retry_status(STATUS_RETRY) && is_retry_status(429));
    for s in [200, 400, 404, 500, 502] {
        assert!(!is_retry_status(s), "{s}");
    }
}

proptest! {
    /// The agent's parse never panics, and whatever it accepts has a usable netns path.
    #[test]
    fn agent_parse_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        netns in "[/.a-z]{0,24}",
    ) {
        let _ = PluginEvent::parse(&bytes);
        let body = format!(r#"{{"Netns":{},"PodName":"p","PodNamespace":"n"}}"#, serde_json::Value::String(netns.clone()));
        if let Ok(ev) = PluginEvent::parse(body.as_bytes()) {
            prop_assert!(ev.netns.starts_with('/'));
            prop_assert!(!ev.netns.split('/').any(|c| c == "." || c == ".."));
        }
    }
}
