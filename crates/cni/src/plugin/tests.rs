#![allow(clippy::unwrap_used)]

use super::*;

const SYSTEM_PODS: &str = r#","system_pods":[{"role":"agent","namespace":"ambit-system","generateName":"ambit-agent-"},{"role":"proxy","namespace":"ambit-system","generateName":"ztunnel-"}]"#;

fn conf(extra: &str) -> NetConf {
    NetConf::parse(
        format!(r#"{{"cniVersion":"1.0.0","name":"n","pod_namespace":"ambit-system","exclude_namespaces":["kube-system"]{SYSTEM_PODS}{extra}}}"#)
            .as_bytes(),
    )
    .unwrap()
}

fn args(s: &str) -> K8sArgs {
    s.parse().unwrap()
}

fn env(command: &str) -> Env {
    Env {
        command: Some(command.into()),
        container_id: Some("abc123".into()),
        // Exists and is not this process's namespace: passes the plugin's own checks.
        netns: Some("/dev/null".into()),
        ifname: Some("eth0".into()),
        args: Some(String::new()),
        path: Some("/opt/cni/bin".into()),
        ..Env::default()
    }
}

fn run_with(env: &Env, stdin: &str) -> Result<Output, CniError> {
    run(env, &mut stdin.as_bytes())
}

#[test]
fn decision_table() {
    let c = conf("");
    let ask = |name: &str, ns: &str| Decision::AskAgent { name: name.into(), namespace: ns.into() };
    let cases = [
        ("", Decision::NotKubernetes),
        ("IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=x", Decision::NotKubernetes),
        ("K8S_POD_NAME=coredns-1;K8S_POD_NAMESPACE=kube-system", Decision::ExcludedNamespace),
        (
            "K8S_POD_NAME=ambit-agent-x7k2p;K8S_POD_NAMESPACE=ambit-system",
            Decision::SystemPod(SystemRole::Agent),
        ),
        ("K8S_POD_NAME=ztunnel-b4n7q;K8S_POD_NAMESPACE=ambit-system", Decision::SystemPod(SystemRole::Proxy)),
        // The prefix alone or the namespace alone is not enough, nor a name the API server did
        // not generate from the prefix.
        ("K8S_POD_NAME=ambit-agent-x7k2p;K8S_POD_NAMESPACE=demo", ask("ambit-agent-x7k2p", "demo")),
        (
            "K8S_POD_NAME=ambit-agent-x7k2;K8S_POD_NAMESPACE=ambit-system",
            ask("ambit-agent-x7k2", "ambit-system"),
        ),
        (
            "K8S_POD_NAME=ambit-agent-debug-shell;K8S_POD_NAMESPACE=ambit-system",
            ask("ambit-agent-debug-shell", "ambit-system"),
        ),
        ("K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=ambit-system", ask("web-0", "ambit-system")),
        ("K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=demo", ask("web-0", "demo")),
    ];
    for (a, want) in cases {
        assert_eq!(decide(&c, &args(a)).unwrap(), want, "{a}");
    }
    let err = decide(&c, &args("K8S_POD_NAME=web-0")).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidEnvironment);
}

/// Only what the installer wrote admits a pod: no built-in prefix (the old `ambit-agent-`
/// default) and no `agent_pod_prefix` key.
#[test]
fn system_pods_come_only_from_the_config() {
    let c = NetConf::parse(
        br#"{"cniVersion":"1.0.0","name":"n","pod_namespace":"ambit-system","agent_pod_prefix":"ambit-agent-"}"#,
    )
    .unwrap();
    let a = args("K8S_POD_NAME=ambit-agent-x7k2p;K8S_POD_NAMESPACE=ambit-system");
    assert!(matches!(decide(&c, &a).unwrap(), Decision::AskAgent { .. }));
    let c = conf("");
    assert_eq!(decide(&c, &a).unwrap(), Decision::SystemPod(SystemRole::Agent));
}

#[test]
fn container_ids_and_ifnames() {
    for ok in ["abc", "A1_b.c-d", "0"] {
        validate_container_id(ok).unwrap();
    }
    for bad in ["", "-a", "a b", "a/b", "é"] {
        assert!(validate_container_id(bad).is_err(), "{bad:?}");
    }
    for ok in ["eth0", "net1", "a-very-long-nam"] {
        validate_ifname(ok).unwrap();
    }
    for bad in ["a-very-long-name", ".", "..", "eth/0", "eth:0", "eth 0"] {
        assert!(validate_ifname(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn error_codes_of_run() {
    let dir = tempfile::tempdir().unwrap();
    let ok_conf =
        format!(r#"{{"cniVersion":"1.0.0","name":"n","cni_agent_run_dir":"{}"}}"#, dir.path().display());
    let cases: Vec<(Env, String, ErrorCode)> = vec![
        (env("BOGUS"), ok_conf.clone(), ErrorCode::InvalidEnvironment),
        (Env { netns: None, ..env("ADD") }, ok_conf.clone(), ErrorCode::InvalidEnvironment),
        (Env { args: None, ..env("ADD") }, ok_conf.clone(), ErrorCode::InvalidEnvironment),
        (
            Env { args: Some("K8S_POD_NAME".into()), ..env("ADD") },
            ok_conf.clone(),
            ErrorCode::InvalidEnvironment,
        ),
        (
            Env { container_id: Some("a b".into()), ..env("DEL") },
            ok_conf.clone(),
            ErrorCode::InvalidEnvironment,
        ),
        (Env { not_unicode: vec!["CNI_ARGS"], ..env("ADD") }, ok_conf.clone(), ErrorCode::InvalidEnvironment),
        (env("ADD"), "{".into(), ErrorCode::Decoding),
        (env("ADD"), r#"{"cniVersion":"9.9.9","name":"n"}"#.into(), ErrorCode::IncompatibleVersion),
        (env("ADD"), r#"{"cniVersion":"1.0.0","name":"n","prevResult":[]}"#.into(), ErrorCode::Decoding),
        (env("CHECK"), ok_conf.replace("1.0.0", "0.3.1"), ErrorCode::IncompatibleVersion),
        (env("GC"), ok_conf.clone(), ErrorCode::IncompatibleVersion),
        (env("STATUS"), ok_conf.replace("1.0.0", "1.1.0"), ErrorCode::PluginNotAvailable),
        (
            Env { args: Some("K8S_POD_NAME=a;K8S_POD_NAMESPACE=b".into()), ..env("ADD") },
            ok_conf.clone(),
            ErrorCode::TryAgainLater,
        ),
        (
            Env {
                args: Some("K8S_POD_NAME=a;K8S_POD_NAMESPACE=b".into()),
                netns: Some("/proc/self/ns/net".into()),
                ..env("ADD")
            },
            ok_conf.clone(),
            ErrorCode::InvalidNetns,
        ),
    ];
    for (env, stdin, code) in cases {
        let err = run_with(&env, &stdin).unwrap_err();
        assert_eq!(err.code, code, "{env:?} {stdin}: {err}");
    }
}

#[test]
fn successes_of_run() {
    let c = r#"{"cniVersion":"1.1.0","name":"n","cni_agent_run_dir":"/nonexistent"}"#;
    assert_eq!(run_with(&Env::default(), "").unwrap(), Output::About(about()));
    assert!(matches!(run_with(&env("VERSION"), "garbage").unwrap(), Output::Stdout(_)));
    assert_eq!(run_with(&env("ADD"), c).unwrap(), Output::Stdout(r#"{"cniVersion":"1.1.0"}"#.into()));
    for command in ["DEL", "CHECK", "GC"] {
        assert_eq!(run_with(&env(command), c).unwrap(), Output::Nothing, "{command}");
    }
    // DEL needs no CNI_NETNS; GC needs no container.
    assert_eq!(run_with(&Env { netns: None, ..env("DEL") }, c).unwrap(), Output::Nothing);
    assert_eq!(run_with(&Env { command: Some("GC".into()), ..Env::default() }, c).unwrap(), Output::Nothing);
}

#[test]
fn errors_report_the_config_version() {
    let err =
        run_with(&Env { args: None, ..env("ADD") }, r#"{"cniVersion":"0.4.0","name":"n"}"#).unwrap_err();
    assert!(err.to_json().starts_with(r#"{"cniVersion":"0.4.0","code":4,"#), "{}", err.to_json());
}

#[test]
fn panics_become_cni_errors() {
    let err = catch_panics::<()>(|| panic!("boom {}", 42)).unwrap_err();
    assert_eq!(err.code, ErrorCode::Internal);
    assert_eq!(err.details, "boom 42");
    let err = catch_panics::<()>(|| std::panic::panic_any(7u8)).unwrap_err();
    assert_eq!(err.details, "unknown panic");
    assert_eq!(catch_panics(|| Ok(5)), Ok(5));
}

/// The plugin's netns checks, each with its exact code and message; `CNI_NETNS_OVERRIDE=1` skips
/// them (the agent checks again), so the request then reaches the (absent) agent: code 11.
#[test]
fn netns_checks_and_override() {
    let dir = tempfile::tempdir().unwrap();
    let c = format!(r#"{{"cniVersion":"1.0.0","name":"n","cni_agent_run_dir":"{}"}}"#, dir.path().display());
    let pod = |netns: &str, over: Option<&str>| Env {
        args: Some("K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=demo".into()),
        netns: Some(netns.into()),
        netns_override: over.map(Into::into),
        ..env("ADD")
    };
    let cases = [
        (
            "/var/run/netns/../../proc/1/ns/net",
            "CNI_NETNS \"/var/run/netns/../../proc/1/ns/net\" has a '.' or '..' component; the runtime must pass the namespace's own path, not one that walks elsewhere",
        ),
        (
            "relative/netns",
            "CNI_NETNS \"relative/netns\" is not an absolute path; the runtime must pass the namespace's path",
        ),
        (
            "/var/run/netns/ambit-test-missing",
            "cannot stat CNI_NETNS /var/run/netns/ambit-test-missing: No such file or directory (os error 2)",
        ),
        (
            "/proc/self/ns/net",
            "CNI_NETNS /proc/self/ns/net is the plugin's own (host) network namespace; refusing to hand it to the node agent for capture",
        ),
    ];
    for (netns, msg) in cases {
        let err = run_with(&pod(netns, None), &c).unwrap_err();
        assert_eq!((err.code, err.msg.as_str()), (ErrorCode::InvalidNetns, msg), "{netns}");
        for over in ["1", "true"] {
            let err = run_with(&pod(netns, Some(over)), &c).unwrap_err();
            assert_eq!(err.code, ErrorCode::TryAgainLater, "{netns} with CNI_NETNS_OVERRIDE={over}: {err}");
            assert!(err.msg.starts_with("cannot reach the node agent on "), "{err}");
        }
    }
}
