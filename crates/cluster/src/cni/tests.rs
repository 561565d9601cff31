use std::os::unix::fs::PermissionsExt;

use super::*;

fn plugin(dir: &Path, name: &str, script: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write plugin");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A runtime in this process's namespace whose plugins are shell scripts in `bin`, each
/// appending `<command> <type> <prevResult address or -> <CNI_ARGS>` to `bin/log` and answering
/// ADD with an address numbered by the log's length.
fn runtime(tmp: &Path) -> Runtime {
    let bin = tmp.join("bin");
    let conf = tmp.join("net.d");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(&conf).expect("conf");
    let body = |name: &str| {
        format!(
            r#"conf=$(cat)
prev=$(printf '%s' "$conf" | sed -n 's/.*"prevResult":{{[^}}]*"address":"\([^"]*\)".*/\1/p')
log="$(dirname "$0")/log"
echo "$CNI_COMMAND {name} ${{prev:--}} $CNI_ARGS" >> "$log"
if [ "$CNI_COMMAND" = ADD ]; then
  printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.0.0.%s/24"}}]}}' "$(wc -l < "$log" | tr -d ' ')"
fi
exit 0"#
        )
    };
    for name in ["loopback", "first", "second"] {
        plugin(&bin, name, &body(name));
    }
    std::fs::write(
        conf.join("10-net.conflist"),
        r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"first"},{"type":"second"}]}"#,
    )
    .expect("conflist");
    Runtime {
        node_netns: None,
        conf_dir: conf,
        path: PluginPath(vec![bin]),
        cache_dir: tmp.join("cache"),
        timeout: Duration::from_secs(10),
    }
}

fn pod(tmp: &Path) -> PodRef {
    PodRef {
        namespace: "demo".into(),
        name: "web".into(),
        uid: "0000-uid".into(),
        container_id: "c0ffee".into(),
        netns: tmp.join("netns"),
    }
}

fn log(rt: &Runtime) -> Vec<String> {
    let text = std::fs::read_to_string(rt.path.0[0].join("log")).unwrap_or_default();
    text.lines().map(str::to_owned).collect()
}

const ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=0000-uid";

#[test]
fn add_chains_results_and_del_runs_backwards_with_the_cached_result() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime(tmp.path());
    let pod = pod(tmp.path());
    let (result, runs) = rt.add(&pod).expect("ADD");
    assert_eq!(result_ipv4(&result), Some("10.0.0.3".parse().expect("ip")));
    let order: Vec<_> = runs.iter().map(|r| (r.command, r.plugin.as_str())).collect();
    assert_eq!(order, [("ADD", "loopback"), ("ADD", "first"), ("ADD", "second")]);
    assert_eq!(
        log(&rt),
        [
            format!("ADD loopback - {ARGS}"),
            // The list's first plugin gets no prevResult; the second gets the first's.
            format!("ADD first - {ARGS}"),
            format!("ADD second 10.0.0.2/24 {ARGS}"),
        ]
    );
    assert_eq!(rt.result(&pod), Some(result));
    rt.check(&pod).expect("CHECK");
    assert_eq!(
        log(&rt)[3..],
        [
            format!("CHECK loopback - {ARGS}"),
            format!("CHECK first 10.0.0.3/24 {ARGS}"),
            format!("CHECK second 10.0.0.3/24 {ARGS}")
        ]
    );

    // The network changes (an agent chains a plugin in): DEL still runs the network ADD used.
    std::fs::write(
        rt.conf_dir.join("10-net.conflist"),
        r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"first"},{"type":"second"},{"type":"third"}]}"#,
    )
    .expect("rewrite");
    rt.del(&pod).expect("DEL");
    assert_eq!(
        log(&rt)[6..],
        [
            format!("DEL second 10.0.0.3/24 {ARGS}"),
            format!("DEL first 10.0.0.3/24 {ARGS}"),
            format!("DEL loopback - {ARGS}"),
        ]
    );
    assert_eq!(rt.result(&pod), None, "the cache goes with DEL");
    assert!(matches!(rt.check(&pod), Err(CniError::NotAdded(p)) if p == "demo/web"));
    // A second DEL (nothing cached) uses the directory's network, where `third` is missing.
    let err = rt.del(&pod).expect_err("third is not installed");
    assert!(matches!(&err, CniError::PluginMissing { plugin, .. } if plugin == "third"), "{err}");
}

#[test]
fn a_plugin_error_object_is_reported_with_its_code_message_and_stderr() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime(tmp.path());
    plugin(
        &rt.path.0[0],
        "second",
        r#"cat >/dev/null; echo 'agent down' >&2; printf '{"cniVersion":"1.0.0","code":999,"msg":"no agent","details":"dial unix: refused"}'; exit 1"#,
    );
    let err = rt.add(&pod(tmp.path())).expect_err("second fails");
    assert_eq!(
        err.to_string(),
        "CNI ADD of demo/web: plugin second failed (code 999): no agent — dial unix: refused [stderr: agent down]"
    );
    assert_eq!(rt.result(&pod(tmp.path())), None, "a failed ADD caches nothing");
}

#[test]
fn a_plugin_that_hangs_is_killed_at_the_bound() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut rt = runtime(tmp.path());
    rt.timeout = Duration::from_millis(300);
    plugin(&rt.path.0[0], "first", "exec sleep 30");
    let started = Instant::now();
    let err = rt.add(&pod(tmp.path())).expect_err("times out");
    assert!(matches!(err, CniError::Timeout { ref plugin, .. } if plugin == "first"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "not killed promptly: {:?}", started.elapsed());
}

#[test]
fn non_json_success_output_is_an_error() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime(tmp.path());
    plugin(&rt.path.0[0], "first", "cat >/dev/null; echo hello");
    let err = rt.add(&pod(tmp.path())).expect_err("not JSON");
    assert_eq!(
        err.to_string(),
        "CNI ADD of demo/web: plugin first failed: succeeded but its output is not JSON"
    );
}

#[test]
fn the_first_file_in_lexical_order_is_the_network_and_a_bad_one_is_not_skipped() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    assert!(matches!(NetworkList::load_dir(dir), Err(CniError::NoNetwork(_))));
    std::fs::write(dir.join("20-b.conflist"), r#"{"name":"b","plugins":[{"type":"bridge"}]}"#).expect("b");
    std::fs::write(dir.join("10-a.conf"), r#"{"cniVersion":"0.4.0","name":"a","type":"ptp"}"#).expect("a");
    std::fs::write(dir.join("00-notes.txt"), "not a network").expect("txt");
    let list = NetworkList::load_dir(dir).expect("a");
    assert_eq!((list.name.as_str(), list.cni_version.as_str(), list.types()), ("a", "0.4.0", vec!["ptp"]));
    std::fs::write(dir.join("05-broken.conflist"), "{").expect("broken");
    let err = NetworkList::load_dir(dir).expect_err("broken first");
    let prefix = format!("CNI configuration {}: not JSON: ", dir.join("05-broken.conflist").display());
    assert!(err.to_string().starts_with(&prefix), "{err}");
    for (text, problem) in [
        (r#"[1]"#, "not a JSON object"),
        (r#"{"plugins":[]}"#, "no \"name\""),
        (r#"{"name":"x","plugins":{}}"#, "\"plugins\" is not a list"),
        (r#"{"name":"x","plugins":[]}"#, "\"plugins\" is empty"),
        (r#"{"name":"x","plugins":[{"type":"a"},{}]}"#, "plugin 1 has no \"type\""),
    ] {
        let err = NetworkList::parse(Path::new("f"), text).expect_err(text);
        assert_eq!(err.to_string(), format!("CNI configuration f: {problem}"), "{text}");
    }
}

#[test]
fn a_missing_plugin_names_where_it_looked_and_the_package() {
    let path = PluginPath(vec!["/nonexistent/a".into(), "/nonexistent/b".into()]);
    assert_eq!(
        path.find("bridge").expect_err("missing").to_string(),
        "CNI plugin \"bridge\" not found in /nonexistent/a:/nonexistent/b (install the containernetworking-plugins package)"
    );
    assert_eq!(
        path.find("ambit-cni").expect_err("missing").to_string(),
        "CNI plugin \"ambit-cni\" not found in /nonexistent/a:/nonexistent/b"
    );
    // A type is a file name, never a path.
    assert!(PluginPath(vec!["/usr".into()]).find("bin/sh").is_err());
}
