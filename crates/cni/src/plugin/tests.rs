#![allow(clippy::unwrap_used)]

use super::*;

fn conf(extra: &str) -> NetConf {
    NetConf::parse(
        format!(r#"{{"cniVersion":"1.0.0","name":"n","pod_namespace":"ambit-system","exclude_namespaces":["kube-system"]{extra}}}"#)
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
        netns: Some("/var/run/netns/cni-test".into()),
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
        ("K8S_POD_NAME=ambit-agent-x7k2;K8S_POD_NAMESPACE=ambit-system", Decision::AgentPod),
        // The prefix alone or the namespace alone is not enough.
        ("K8S_POD_NAME=ambit-agent-x7k2;K8S_POD_NAMESPACE=demo", ask("ambit-agent-x7k2", "demo")),
        ("K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=ambit-system", ask("web-0", "ambit-system")),
        ("K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=demo", ask("web-0", "demo")),
    ];
    for (a, want) in cases {
        assert_eq!(decide(&c, &args(a)).unwrap(), want, "{a}");
    }
    let err = decide(&c, &args("K8S_POD_NAME=web-0")).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidEnvironment);
}

#[test]
fn own_pod_shortcut_needs_pod_namespace() {
    let c = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n"}"#).unwrap();
    let a = args("K8S_POD_NAME=ambit-agent-1;K8S_POD_NAMESPACE=ambit-system");
    assert!(matches!(decide(&c, &a).unwrap(), Decision::AskAgent { .. }));
    let c = conf(r#","agent_pod_prefix":"node-""#);
    let a = args("K8S_POD_NAME=node-1;K8S_POD_NAMESPACE=ambit-system");
    assert_eq!(decide(&c, &a).unwrap(), Decision::AgentPod);
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
