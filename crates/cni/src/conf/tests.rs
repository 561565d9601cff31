#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

#[test]
fn minimal_config_gets_defaults() {
    let conf =
        NetConf::parse(br#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"ambit-cni"}"#).unwrap();
    assert_eq!(conf.cni_version, CniVersion::V1_0_0);
    assert_eq!(conf.name, "k8s-pod-network");
    assert!(conf.prev_result.is_none());
    assert_eq!(conf.event_socket(), Path::new("/var/run/ambit/pluginevent.sock"));
    assert!(conf.exclude_namespaces.is_empty());
    assert_eq!(conf.pod_namespace, None);
    assert!(conf.system_pods.is_empty());
    assert_eq!(conf.agent_timeout, Duration::from_secs(10));
}

#[test]
fn istio_style_entry_with_all_keys() {
    let conf = NetConf::parse(
        br#"{
          "ambient_enabled": true,
          "cni_agent_run_dir": "/run/ambit-test",
          "dns": {},
          "enable_ambient_detection_retry": false,
          "enablement_selectors": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}],
          "exclude_namespaces": ["kube-system", "ambit-system"],
          "ipam": {},
          "name": "ambit-cni",
          "native_nftables": false,
          "plugin_log_level": "info",
          "pod_namespace": "ambit-system",
          "agent_pod_prefix": "ignored-now-",
          "system_pods": [{"role": "agent", "namespace": "ambit-system", "generateName": "node-agent-"},
                          {"role": "proxy", "namespace": "ambit-system", "generateName": "node-proxy-"}],
          "agent_timeout_ms": 250,
          "type": "ambit-cni",
          "cniVersion": "0.3.1",
          "prevResult": {"cniVersion": "0.3.1", "ips": []}
        }"#,
    )
    .unwrap();
    assert_eq!(conf.cni_version, CniVersion::V0_3_1);
    assert_eq!(conf.agent_run_dir(), Path::new("/run/ambit-test"));
    assert_eq!(conf.exclude_namespaces, ["kube-system", "ambit-system"]);
    assert_eq!(conf.pod_namespace.as_deref(), Some("ambit-system"));
    assert_eq!(conf.system_pods.len(), 2);
    assert!(conf.system_pods[0].matches("ambit-system", "node-agent-x7k2p"));
    assert_eq!(conf.system_pods[1].role, crate::system::SystemRole::Proxy);
    assert_eq!(conf.agent_timeout, Duration::from_millis(250));
    assert_eq!(conf.prev_result.as_deref().map(RawValue::get), Some(r#"{"cniVersion": "0.3.1", "ips": []}"#));
}

#[test]
fn null_exclude_namespaces_and_prev_result() {
    let conf = NetConf::parse(
        br#"{"cniVersion":"1.1.0","name":"n","exclude_namespaces":null,"prevResult":null,"pod_namespace":""}"#,
    )
    .unwrap();
    assert!(conf.exclude_namespaces.is_empty());
    assert!(conf.prev_result.is_none());
    assert_eq!(conf.pod_namespace, None);
}

#[test]
fn errors_by_kind() {
    type Check = fn(&ConfError) -> bool;
    let cases: &[(&[u8], Check)] = &[
        (b"", |e| matches!(e, ConfError::Syntax(_))),
        (b"{", |e| matches!(e, ConfError::Syntax(_))),
        (b"not json", |e| matches!(e, ConfError::Syntax(_))),
        (b"[]", |e| matches!(e, ConfError::Type(_))),
        (br#"{"cniVersion":"1.0.0","name":"n","exclude_namespaces":"kube-system"}"#, |e| {
            matches!(e, ConfError::Type(_))
        }),
        (br#"{"cniVersion":1,"name":"n"}"#, |e| matches!(e, ConfError::Type(_))),
        (br#"{"name":"n"}"#, |e| matches!(e, ConfError::MissingVersion)),
        (br#"{"cniVersion":"0.2.0","name":"n"}"#, |e| matches!(e, ConfError::UnsupportedVersion(_))),
        (br#"{"cniVersion":"1.0.0"}"#, |e| matches!(e, ConfError::MissingName)),
        (br#"{"cniVersion":"1.0.0","name":""}"#, |e| matches!(e, ConfError::MissingName)),
        (br#"{"cniVersion":"1.0.0","name":"-bad"}"#, |e| matches!(e, ConfError::InvalidName(_))),
        (br#"{"cniVersion":"1.0.0","name":"a b"}"#, |e| matches!(e, ConfError::InvalidName(_))),
        (br#"{"cniVersion":"1.0.0","name":"n","cni_agent_run_dir":"relative"}"#, |e| {
            matches!(e, ConfError::Invalid { key: "cni_agent_run_dir", .. })
        }),
        (br#"{"cniVersion":"1.0.0","name":"n","agent_timeout_ms":0}"#, |e| {
            matches!(e, ConfError::Invalid { key: "agent_timeout_ms", .. })
        }),
        (br#"{"cniVersion":"1.0.0","name":"n","agent_timeout_ms":600001}"#, |e| {
            matches!(e, ConfError::Invalid { key: "agent_timeout_ms", .. })
        }),
        (br#"{"cniVersion":"1.0.0","name":"n","agent_timeout_ms":-5}"#, |e| matches!(e, ConfError::Type(_))),
        (br#"{"cniVersion":"1.0.0","name":"n","system_pods":{}}"#, |e| matches!(e, ConfError::Type(_))),
        (br#"{"cniVersion":"1.0.0","name":"n","system_pods":[{"role":"agent","namespace":"a"}]}"#, |e| {
            matches!(e, ConfError::Type(_))
        }),
        (br#"{"cniVersion":"1.0.0","name":"n","system_pods":[{"role":"admin","namespace":"a","generateName":"x-"}]}"#, |e| {
            matches!(e, ConfError::Type(_))
        }),
        (br#"{"cniVersion":"1.0.0","name":"n","system_pods":[{"role":"agent","namespace":"a","generateName":""}]}"#, |e| {
            matches!(e, ConfError::Invalid { key: "system_pods", .. })
        }),
    ];
    for (input, check) in cases {
        let err = NetConf::parse(input).unwrap_err();
        assert!(check(&err), "{}: got {err:?}", String::from_utf8_lossy(input));
    }
}

#[test]
fn socket_path_must_fit_sun_path() {
    let long = format!("/{}", "d".repeat(100));
    let json = format!(r#"{{"cniVersion":"1.0.0","name":"n","cni_agent_run_dir":"{long}"}}"#);
    assert!(matches!(
        NetConf::parse(json.as_bytes()),
        Err(ConfError::Invalid { key: "cni_agent_run_dir", .. })
    ));
    let fits = format!("/{}", "d".repeat(106 - EVENT_SOCKET.len() - 1));
    let json = format!(r#"{{"cniVersion":"1.0.0","name":"n","cni_agent_run_dir":"{fits}"}}"#);
    let conf = NetConf::parse(json.as_bytes()).unwrap();
    assert_eq!(conf.event_socket().as_os_str().len(), MAX_SOCKET_PATH);
}

#[test]
fn network_names() {
    for ok in ["a", "k8s-pod-network", "net_1.2", "0"] {
        assert!(valid_name(ok), "{ok:?}");
    }
    for bad in ["", "-a", ".a", "a/b", "a:b", "né"] {
        assert!(!valid_name(bad), "{bad:?}");
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::String),
        prop::sample::select(vec!["1.0.0", "0.3.1", "/var/run/x", "kube-system", ""])
            .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(key(), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "cniVersion",
            "name",
            "prevResult",
            "cni_agent_run_dir",
            "exclude_namespaces",
            "pod_namespace",
            "system_pods",
            "agent_timeout_ms",
            "ips",
            "address",
        ])
        .prop_map(str::to_owned),
        "[a-z]{1,6}",
    ]
}

proptest! {
    #[test]
    fn parse_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = NetConf::parse(&bytes);
    }

    #[test]
    fn parse_never_panics_on_json(fields in prop::collection::btree_map(key(), json_value(), 0..8)) {
        let object = serde_json::Value::Object(fields.into_iter().collect());
        let bytes = serde_json::to_vec(&object).unwrap();
        if let Ok(conf) = NetConf::parse(&bytes) {
            // Whatever parsed is usable: the socket path fits and the timeout is in range.
            prop_assert!(conf.event_socket().as_os_str().len() <= MAX_SOCKET_PATH);
            prop_assert!(!conf.agent_timeout.is_zero());
            // And the ADD path over it never panics either.
            if let Some(raw) = conf.prev_result.as_deref()
                && let Ok(prev) = crate::result::PrevResult::parse(raw)
            {
                let _ = prev.event_ips();
                let _ = prev.render(conf.cni_version);
            }
        }
    }
}

/// What the agent's installer writes is what the plugin reads.
#[test]
fn ambit_keys_round_trip_through_the_plugin() {
    let keys = AmbitKeys {
        cni_agent_run_dir: Some("/var/run/ambit".into()),
        exclude_namespaces: Some(vec!["kube-system".into()]),
        pod_namespace: Some("ambit-system".into()),
        system_pods: Some(vec![crate::system::SystemPod {
            role: crate::system::SystemRole::Proxy,
            namespace: "ambit-system".into(),
            generate_name: "ambit-proxy-".into(),
        }]),
        agent_timeout_ms: None,
    };
    let mut entry = serde_json::to_value(&keys).unwrap();
    assert!(entry.get("agent_timeout_ms").is_none(), "None is left out: {entry}");
    entry["cniVersion"] = "1.0.0".into();
    entry["name"] = "k8s-pod-network".into();
    let conf = NetConf::parse(entry.to_string().as_bytes()).unwrap();
    assert_eq!(conf.agent_run_dir(), Path::new("/var/run/ambit"));
    assert_eq!(conf.exclude_namespaces, ["kube-system"]);
    assert_eq!(conf.pod_namespace.as_deref(), Some("ambit-system"));
    assert_eq!(Some(conf.system_pods), keys.system_pods);
}
