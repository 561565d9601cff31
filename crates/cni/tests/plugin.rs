//! End-to-end tests: exec the built `ambit-cni` with a CNI environment and stdin, against a fake
//! node agent on a unix socket.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{FakeAgent, Mode, conf, exec, pod_env, without};

/// The spec's example event (node-agent.md §1.5), byte for byte.
const GOLDEN_EVENT: &str = r#"{"Netns":"/var/run/netns/cni-5f1c","PodName":"web-0","PodNamespace":"demo","IPs":[{"Interface":0,"Address":{"IP":"10.244.1.5","Mask":"////AA=="},"Gateway":"10.244.1.1"}]}"#;

/// A 1.0.0 prevResult as bridge + host-local print it (whitespace kept on purpose).
const PREV_1_0: &str = r#"{
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "cni0", "mac": "6e:1c:2a:4f:11:02"},
        {"name": "vethb5a1", "mac": "ae:9f:12:30:7b:01"},
        {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/var/run/netns/cni-5f1c"}
    ],
    "ips": [{"interface": 0, "address": "10.244.1.5/24", "gateway": "10.244.1.1"}],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
    "dns": {}
}"#;

fn prev_for(version: &str) -> String {
    if version.starts_with("0.") {
        format!(
            r#"{{ "cniVersion":"{version}", "interfaces":[{{"name":"eth0","sandbox":"/var/run/netns/cni-5f1c"}}],
                 "ips":[ {{"version":"4","interface":0,"address":"10.244.1.5/24","gateway":"10.244.1.1"}} ],
                 "dns":{{}} }}"#
        )
    } else {
        PREV_1_0.replace("1.0.0", version)
    }
}

#[test]
fn add_sends_the_golden_event_and_prints_prev_result_verbatim() {
    let agent = FakeAgent::start(Mode::ok());
    let stdin = conf("1.0.0", agent.run_dir(), &format!(r#","prevResult":{PREV_1_0}"#));
    let run = exec(&pod_env("ADD", "web-0", "demo"), &stdin);
    assert_eq!(run.assert_success(), PREV_1_0);
    let (connections, seen) = agent.finish();
    assert_eq!(connections, 1);
    assert_eq!(seen[0].body, GOLDEN_EVENT);
    let head = &seen[0].head;
    assert!(head.starts_with("POST /cmdadd HTTP/1.1\r\n"), "{head}");
    assert!(head.contains("Content-Type: application/json\r\n"), "{head}");
}

#[test]
fn prev_result_passes_through_for_every_version() {
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let agent = FakeAgent::start(Mode::ok());
        let prev = prev_for(version);
        let stdin = conf(version, agent.run_dir(), &format!(r#","prevResult":{prev}"#));
        let run = exec(&pod_env("ADD", "web-0", "demo"), &stdin);
        assert_eq!(run.assert_success(), prev.trim(), "{version}");
        let (_, seen) = agent.finish();
        let event: serde_json::Value = serde_json::from_str(&seen[0].body).unwrap();
        assert_eq!(event["IPs"][0]["Address"]["IP"], "10.244.1.5", "{version}");
    }
}

#[test]
fn prev_result_in_another_version_is_converted() {
    let agent = FakeAgent::start(Mode::ok());
    let stdin = conf("0.4.0", agent.run_dir(), &format!(r#","prevResult":{PREV_1_0}"#));
    let out: serde_json::Value =
        serde_json::from_str(exec(&pod_env("ADD", "web-0", "demo"), &stdin).assert_success()).unwrap();
    assert_eq!(out["cniVersion"], "0.4.0");
    assert_eq!(out["ips"][0]["version"], "4");
    agent.finish();
}

#[test]
fn add_without_prev_result_sends_null_ips() {
    for (version, printed) in
        [("1.1.0", r#"{"cniVersion":"1.1.0"}"#), ("0.3.1", r#"{"cniVersion":"0.3.1","dns":{}}"#)]
    {
        let agent = FakeAgent::start(Mode::ok());
        let run = exec(&pod_env("ADD", "web-0", "demo"), &conf(version, agent.run_dir(), ""));
        assert_eq!(run.assert_success(), printed);
        let (_, seen) = agent.finish();
        assert!(seen[0].body.ends_with(r#""IPs":null}"#), "{}", seen[0].body);
    }
}

#[test]
fn fast_paths_never_contact_the_agent() {
    let cases = [
        ("not kubernetes", pod_env("ADD", "", "")),
        ("empty CNI_ARGS", {
            let mut e = without(pod_env("ADD", "", ""), "CNI_ARGS");
            e.push(("CNI_ARGS".into(), String::new()));
            e
        }),
        ("excluded namespace", pod_env("ADD", "coredns-6f4b", "kube-system")),
        ("agent's own pod", pod_env("ADD", "ambit-agent-x7k2p", "ambit-system")),
        ("node proxy's pod", pod_env("ADD", "ztunnel-b4n7q", "ambit-system")),
    ];
    for (what, env) in cases {
        // An agent that would refuse everything: success proves it was not asked.
        let agent =
            FakeAgent::start(Mode::Reply { status: 500, body: "must not be asked", delay: Duration::ZERO });
        let stdin = conf("1.0.0", agent.run_dir(), &format!(r#","prevResult":{PREV_1_0}"#));
        let run = exec(&env, &stdin);
        assert_eq!(run.assert_success(), PREV_1_0, "{what}");
        let (connections, _) = agent.finish();
        assert_eq!(connections, 0, "{what}: the agent was contacted");
    }
}

#[test]
fn fast_paths_work_with_no_agent_at_all() {
    let dir = tempfile::tempdir().unwrap();
    for (pod, ns) in [
        ("", ""),
        ("coredns-6f4b", "kube-system"),
        ("ambit-agent-x7k2p", "ambit-system"),
        ("ztunnel-b4n7q", "ambit-system"),
    ] {
        exec(&pod_env("ADD", pod, ns), &conf("1.1.0", dir.path(), "")).assert_success();
    }
}

#[test]
fn agent_down_fails_closed_with_try_again_later() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pluginevent.sock");
    let run = exec(&pod_env("ADD", "web-0", "demo"), &conf("1.0.0", dir.path(), ""));
    assert_eq!(run.error_code(), 11);
    let msg = run.error_msg();
    assert!(msg.contains(&socket.display().to_string()), "{msg}");
    assert!(msg.contains("must be running"), "{msg}");
    assert_eq!(run.error()["cniVersion"], "1.0.0");

    // A stale socket file (agent exited) refuses connections: same outcome.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let run = exec(&pod_env("ADD", "web-0", "demo"), &conf("1.0.0", dir.path(), ""));
    assert_eq!(run.error_code(), 11, "{run:?}");
}

#[test]
fn agent_killed_mid_request_fails_the_add() {
    let agent = FakeAgent::start(Mode::Hangup);
    let run = exec(&pod_env("ADD", "web-0", "demo"), &conf("1.0.0", agent.run_dir(), ""));
    assert_eq!(run.error_code(), 11, "{run:?}");
    assert_eq!(agent.finish().0, 1);
}

#[test]
fn agent_error_status_is_reported_with_its_message() {
    let agent = FakeAgent::start(Mode::Reply {
        status: 500,
        body: "failed to create in-pod rules: nft: permission denied\n",
        delay: Duration::ZERO,
    });
    let run = exec(&pod_env("ADD", "web-0", "demo"), &conf("1.1.0", agent.run_dir(), ""));
    assert_eq!(run.error_code(), 999);
    let msg = run.error_msg();
    assert!(msg.contains("demo/web-0"), "{msg}");
    assert!(msg.contains("HTTP 500"), "{msg}");
    assert!(msg.ends_with("failed to create in-pod rules: nft: permission denied"), "{msg}");
    agent.finish();

    let agent =
        FakeAgent::start(Mode::Reply { status: 503, body: "no proxy connected", delay: Duration::ZERO });
    let run = exec(&pod_env("ADD", "web-0", "demo"), &conf("1.1.0", agent.run_dir(), ""));
    assert_eq!(run.error_code(), 11);
    assert!(run.error_msg().contains("no proxy connected"));
    agent.finish();
}

#[test]
fn slow_agent_times_out() {
    let agent = FakeAgent::start(Mode::Reply { status: 200, body: "", delay: Duration::from_millis(1500) });
    let run =
        exec(&pod_env("ADD", "web-0", "demo"), &conf("1.0.0", agent.run_dir(), r#","agent_timeout_ms":300"#));
    assert_eq!(run.error_code(), 11, "{run:?}");
    assert!(run.error_msg().contains("did not answer"), "{}", run.error_msg());
    assert!(run.took < Duration::from_millis(1200), "took {:?}", run.took);
    agent.finish();
}

#[test]
fn del_check_gc_succeed_silently_without_the_agent() {
    let agent = FakeAgent::start(Mode::Reply { status: 500, body: "no", delay: Duration::ZERO });
    let with_prev = conf("1.1.0", agent.run_dir(), &format!(r#","prevResult":{}"#, prev_for("1.1.0")));
    for (command, env) in [
        ("DEL", pod_env("DEL", "web-0", "demo")),
        (
            "DEL without netns or args",
            without(without(pod_env("DEL", "web-0", "demo"), "CNI_NETNS"), "CNI_ARGS"),
        ),
        ("CHECK", pod_env("CHECK", "web-0", "demo")),
        ("GC", vec![("CNI_COMMAND".to_owned(), "GC".to_owned())]),
    ] {
        let run = exec(&env, &with_prev);
        assert_eq!(run.assert_success(), "", "{command}");
    }
    // DEL twice for a pod never added: still fine.
    exec(&pod_env("DEL", "ghost", "demo"), &conf("1.1.0", agent.run_dir(), "")).assert_success();
    assert_eq!(agent.finish().0, 0);
}

#[test]
fn check_and_gc_need_new_enough_versions() {
    let dir = tempfile::tempdir().unwrap();
    let run = exec(&pod_env("CHECK", "web-0", "demo"), &conf("0.3.1", dir.path(), ""));
    assert_eq!(run.error_code(), 1);
    let run = exec(&[("CNI_COMMAND".to_owned(), "GC".to_owned())], &conf("1.0.0", dir.path(), ""));
    assert_eq!(run.error_code(), 1);
}

#[test]
fn status_reports_whether_the_agent_listens() {
    let agent = FakeAgent::start(Mode::ok());
    let status = [("CNI_COMMAND".to_owned(), "STATUS".to_owned())];
    assert_eq!(exec(&status, &conf("1.1.0", agent.run_dir(), "")).assert_success(), "");
    agent.finish();
    let dir = tempfile::tempdir().unwrap();
    let run = exec(&status, &conf("1.1.0", dir.path(), ""));
    assert_eq!(run.error_code(), 50);
    assert!(run.error_msg().contains("pluginevent.sock"), "{}", run.error_msg());
}

#[test]
fn version_lists_supported_versions() {
    let run = exec(&[("CNI_COMMAND".to_owned(), "VERSION".to_owned())], r#"{"cniVersion":"1.1.0"}"#);
    let v: serde_json::Value = serde_json::from_str(run.assert_success()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn no_command_prints_about_to_stderr() {
    let run = exec(&[], "");
    assert_eq!(run.assert_success(), "");
    assert!(run.stderr.contains("CNI plugin ambit-cni"), "{}", run.stderr);
}

#[test]
fn bad_input_gets_the_right_error_code() {
    let dir = tempfile::tempdir().unwrap();
    let good = conf("1.0.0", dir.path(), "");
    let cases: Vec<(&str, common::EnvList, String, u64)> = vec![
        ("malformed stdin", pod_env("ADD", "web-0", "demo"), r#"{"cniVersion": "1.0.0", "name":"#.into(), 6),
        ("empty stdin", pod_env("ADD", "web-0", "demo"), String::new(), 6),
        ("unsupported version", pod_env("ADD", "web-0", "demo"), good.replace("1.0.0", "0.2.0"), 1),
        ("no version", pod_env("ADD", "web-0", "demo"), r#"{"name":"n"}"#.into(), 1),
        ("no name", pod_env("ADD", "web-0", "demo"), r#"{"cniVersion":"1.0.0"}"#.into(), 7),
        ("wrong type", pod_env("ADD", "web-0", "demo"), good.replace(r#"["kube-system"]"#, "7"), 7),
        (
            "bad prevResult",
            pod_env("ADD", "web-0", "demo"),
            conf(
                "1.0.0",
                dir.path(),
                r#","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1"}]}"#,
            ),
            6,
        ),
        ("missing CNI_NETNS", without(pod_env("ADD", "web-0", "demo"), "CNI_NETNS"), good.clone(), 4),
        ("missing CNI_ARGS", without(pod_env("ADD", "web-0", "demo"), "CNI_ARGS"), good.clone(), 4),
        (
            "missing CNI_CONTAINERID",
            without(pod_env("ADD", "web-0", "demo"), "CNI_CONTAINERID"),
            good.clone(),
            4,
        ),
        (
            "unknown CNI_ARGS key",
            {
                let mut e = without(pod_env("ADD", "web-0", "demo"), "CNI_ARGS");
                e.push(("CNI_ARGS".into(), "K8S_POD_NAME=a;K8S_POD_NAMESPACE=b;FOO=1".into()));
                e
            },
            good.clone(),
            4,
        ),
        ("unknown command", pod_env("FROB", "web-0", "demo"), good.clone(), 4),
        (
            "host netns",
            {
                let mut e =
                    without(without(pod_env("ADD", "web-0", "demo"), "CNI_NETNS"), "CNI_NETNS_OVERRIDE");
                e.push(("CNI_NETNS".into(), "/proc/self/ns/net".into()));
                e
            },
            good.clone(),
            8,
        ),
    ];
    for (what, env, stdin, code) in cases {
        let run = exec(&env, &stdin);
        assert_eq!(run.error_code(), code, "{what}: {run:?}");
        assert!(!run.error_msg().is_empty(), "{what}");
    }
    let run = exec(&without(pod_env("ADD", "web-0", "demo"), "CNI_NETNS"), &good);
    assert!(run.error_msg().contains("CNI_NETNS"), "{}", run.error_msg());
}

/// Without `CNI_NETNS_OVERRIDE` the plugin refuses (code 8, exact message) a traversal path, a
/// path it cannot stat and its own namespace, and never asks the agent; an existing path that
/// is not its namespace goes to the agent.
#[test]
fn netns_checks_without_override() {
    let with_netns = |netns: &str| {
        let mut e = without(without(pod_env("ADD", "web-0", "demo"), "CNI_NETNS"), "CNI_NETNS_OVERRIDE");
        e.push(("CNI_NETNS".into(), netns.into()));
        e
    };
    let cases = [
        (
            "/var/run/netns/../../proc/1/ns/net",
            r#"CNI_NETNS "/var/run/netns/../../proc/1/ns/net" has a '.' or '..' component; the runtime must pass the namespace's own path, not one that walks elsewhere"#,
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
        let agent = FakeAgent::start(Mode::ok());
        let run = exec(&with_netns(netns), &conf("1.0.0", agent.run_dir(), ""));
        assert_eq!((run.error_code(), run.error_msg()), (8, msg.to_owned()), "{netns}");
        assert_eq!(agent.finish().0, 0, "{netns}: the agent was asked");
    }
    let agent = FakeAgent::start(Mode::ok());
    exec(&with_netns("/dev/null"), &conf("1.0.0", agent.run_dir(), "")).assert_success();
    let (connections, seen) = agent.finish();
    assert_eq!(connections, 1);
    assert!(seen[0].body.starts_with(r#"{"Netns":"/dev/null","#), "{}", seen[0].body);
}

/// The node can always start its own pods: with no agent and no enrollment cache (a node reboot
/// empties the run dir), the agent's and the proxy's DaemonSet pods named in `system_pods` start;
/// a look-alike name and every other pod fail closed with code 11.
#[test]
fn system_pods_start_with_no_agent_and_no_cache() {
    let dir = tempfile::tempdir().unwrap();
    let stdin = conf("1.0.0", dir.path(), &format!(r#","prevResult":{PREV_1_0}"#));
    for (pod, ns) in [("ambit-agent-q9zr2", "ambit-system"), ("ztunnel-b4n7q", "ambit-system")] {
        assert_eq!(exec(&pod_env("ADD", pod, ns), &stdin).assert_success(), PREV_1_0, "{ns}/{pod}");
    }
    for (pod, ns) in [("ambit-agent-debug", "ambit-system"), ("ambit-agent-q9zr2", "demo"), ("web-0", "demo")]
    {
        let run = exec(&pod_env("ADD", pod, ns), &stdin);
        assert_eq!(run.error_code(), 11, "{ns}/{pod}: {run:?}");
        assert!(run.error_msg().starts_with("cannot reach the node agent on "), "{}", run.error_msg());
        let details = run.error()["details"].as_str().unwrap().to_owned();
        assert!(details.contains("no enrollment cache at "), "{details}");
    }
}
