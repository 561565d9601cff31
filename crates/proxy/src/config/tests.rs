use super::*;
use ambit_identity::control::RootSource;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ProxyArgs,
}

/// A local file, no xDS, the in-process CA: what a development run uses.
const BASE: [&str; 6] = ["--local-xds-path", "/x.yaml", "--xds-address", "", "--fake-ca", "true"];

fn config(a: &ProxyArgs) -> Result<Config, ConfigError> {
    Config::from_args_env(a, &Env::new())
}

fn args(extra: &[&str]) -> ProxyArgs {
    let mut v = vec!["proxy"];
    v.extend_from_slice(extra);
    Cli::try_parse_from(v).expect("parse").args
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
    assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
    for bad in ["", "h", "10x", "-1s", "1e999s"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn worker_thread_rules() {
    assert_eq!(worker_threads(None, 2).ok(), Some(2));
    assert_eq!(worker_threads(None, 16).ok(), Some(4));
    assert_eq!(worker_threads(Some("0"), 8).ok(), Some(8));
    assert_eq!(worker_threads(Some("3"), 8).ok(), Some(3));
    assert_eq!(worker_threads(Some("50%"), 3).ok(), Some(2));
    assert!(worker_threads(Some("x"), 3).is_err());
    assert!(worker_threads(Some("0%"), 3).is_err());
}

#[test]
fn drain_deadlines() {
    assert_eq!(drain_deadline(None, None), Duration::from_secs(5));
    assert_eq!(drain_deadline(None, Some(30)), Duration::from_secs(25));
    assert_eq!(drain_deadline(None, Some(5)), Duration::from_secs(4));
    assert_eq!(drain_deadline(None, Some(0)), Duration::from_secs(1));
    assert_eq!(drain_deadline(Some(Duration::from_secs(2)), Some(30)), Duration::from_secs(2));
}

/// The limits' defaults are the ones documented in `--help`, README and ARCHITECTURE.md.
#[test]
fn limit_defaults() {
    let base = BASE;
    let c = config(&args(&base)).expect("valid");
    assert_eq!(c.hbone_handshake_timeout, Duration::from_secs(10));
    assert_eq!(c.hbone_preface_timeout, Duration::from_secs(10));
    assert_eq!(c.hbone_first_stream_timeout, Duration::from_secs(10));
    assert_eq!(c.hbone_idle_timeout, Duration::from_secs(600));
    assert_eq!(c.hbone_max_connections_per_peer, 256);
    assert_eq!(c.hbone_max_streams_per_peer, 1024);
    assert_eq!(c.hbone_peer_buffer_bytes, 32 << 20);
    assert_eq!(c.fd_reserve, None);
    assert_eq!(c.pod_fd_headroom, 64);
    let c = config(&args(&[&base[..], &["--hbone-preface-timeout", "2s", "--fd-reserve", "300"]].concat()))
        .expect("valid");
    assert_eq!((c.hbone_preface_timeout, c.fd_reserve), (Duration::from_secs(2), Some(300)));
}

#[test]
fn modes_and_errors() {
    let base = BASE;
    let mut a = args(&base);
    a.proxy_mode = "dedicated".into();
    assert!(matches!(config(&a), Err(ConfigError::MissingWorkloadInfo)));
    a.proxy_workload_info = Some("ns/name".into());
    assert!(matches!(config(&a), Err(ConfigError::WorkloadInfo(_))));
    a.proxy_workload_info = Some("ns/name/sa".into());
    let c = config(&a).expect("valid");
    assert_eq!(c.packet_mark, None);
    a.packet_mark = Some(0x539);
    assert_eq!(config(&a).expect("valid").packet_mark, Some(1337));
    a.proxy_mode = "bogus".into();
    assert!(matches!(config(&a), Err(ConfigError::Mode(_))));
    a.proxy_mode = "shared".into();
    a.packet_mark = None;
    assert_eq!(config(&a).expect("shared").packet_mark, Some(1337));
    assert_eq!(parse_u32("0x539"), Ok(1337));
}

fn env(pairs: &[(&str, &str)]) -> Env {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A root PEM file for the control plane, in a temporary directory that lives as long as it.
struct Roots {
    _dir: tempfile::TempDir,
    path: String,
    pem: String,
}

fn roots() -> Roots {
    let dir = tempfile::tempdir().expect("tempdir");
    let pem = ambit_identity::FakeCa::generate().root_pem().to_owned();
    let path = dir.path().join("root-cert.pem");
    std::fs::write(&path, &pem).expect("write");
    Roots { path: path.display().to_string(), _dir: dir, pem }
}

fn xds(c: &Config) -> &XdsSettings {
    c.xds.as_ref().expect("xDS configured")
}

fn remote_ca(c: &Config) -> &ControlSettings {
    match &c.ca {
        CaSource::Remote(ca) => ca,
        CaSource::Fake { .. } => panic!("expected a remote CA"),
    }
}

fn err(a: &ProxyArgs, e: &Env) -> String {
    Config::from_args_env(a, e).expect_err("must be refused").to_string()
}

/// The chart runs `ztunnel proxy ztunnel`: arguments after `proxy` are accepted and ignored;
/// the chart's own `ztunnel` silently, anything else noted once in the unsupported list.
#[test]
fn arguments_after_proxy_are_accepted_as_ztunnel_does() {
    let a = args(&[&BASE[..], &["ztunnel"]].concat());
    assert_eq!(a.extra_args, ["ztunnel"]);
    let c = config(&a).expect("valid");
    assert!(c.unsupported.is_empty(), "{:?}", c.unsupported);
    let a = args(&[&BASE[..], &["ztunnel", "--unknown", "x"]].concat());
    assert_eq!(a.extra_args, ["ztunnel", "--unknown", "x"]);
    let c = config(&a).expect("valid");
    assert_eq!(
        c.unsupported,
        [r#"arguments after `proxy` are ignored, as ztunnel ignores them: ["ztunnel", "--unknown", "x"]"#]
    );
}

#[test]
fn xds_address_defaults_follow_the_cluster_and_empty_disables_xds() {
    let r = roots();
    let a = args(&["--xds-root-ca", &r.path, "--fake-ca", "true"]);
    assert_eq!(xds(&config(&a).expect("valid")).control.address, "https://localhost:15012");
    let in_cluster = env(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")]);
    let c = Config::from_args_env(&a, &in_cluster).expect("valid");
    assert_eq!(xds(&c).control.address, "https://istiod.istio-system.svc:15012");
    assert_eq!(c.local_xds_path, None, "no local file is needed with xDS");

    let c = config(&args(&["--xds-address", "", "--fake-ca", "true"])).expect("valid");
    assert!(c.xds.is_none());
    assert_eq!(c.local_xds_path, None, "neither source: the proxy starts with no workloads");

    let a = args(&["--xds-address", "istiod-1-24.istio-system.svc:15012", "--xds-root-ca", &r.path]);
    let a = ProxyArgs {
        control: ambit_admin::ControlArgs { fake_ca: true, ..a.control.clone() },
        local_xds_path: Some("/x.yaml".into()),
        ..a
    };
    let c = config(&a).expect("local file and xDS combine");
    assert_eq!(xds(&c).control.address, "https://istiod-1-24.istio-system.svc:15012");
    assert_eq!(c.local_xds_path.as_deref(), Some(std::path::Path::new("/x.yaml")));

    let c =
        config(&args(&["--xds-address", "http://127.0.0.1:15010", "--fake-ca", "true"])).expect("plaintext");
    assert_eq!(xds(&c).control.address, "http://127.0.0.1:15010");
}

#[test]
fn xds_roots_alternate_name_token_and_headers() {
    let r = roots();
    let base = ["--fake-ca", "true", "--xds-address", "istiod:15012"];
    let c = config(&args(&[&base[..], &["--xds-root-ca", &r.path]].concat())).expect("file");
    assert_eq!(xds(&c).control.roots, RootSource::File(r.path.clone().into()));
    let c = config(&args(&[&base[..], &["--xds-root-ca", "SYSTEM"]].concat())).expect("system");
    assert_eq!(xds(&c).control.roots, RootSource::System);
    let c = config(&args(&[&base[..], &["--xds-root-ca", &r.pem]].concat())).expect("inline");
    assert_eq!(xds(&c).control.roots, RootSource::Inline(r.pem.clone()));
    assert_eq!(
        err(&args(&base), &Env::new()),
        "XDS_ROOT_CA=\"./var/run/secrets/istio/root-cert.pem\" is not an existing file, `SYSTEM`, or inline PEM certificates; set it to the file with the xDS server's root certificate (istiod's root-cert.pem)"
    );

    let a = args(
        &[
            &base[..],
            &[
                "--xds-root-ca",
                "SYSTEM",
                "--alt-xds-hostname",
                "istiod.istio-system.svc",
                "--auth-token",
                "tok",
            ],
        ]
        .concat(),
    );
    let e = env(&[
        ("XDS_HEADER_X_TENANT", "blue"),
        ("CA_HEADER_OTHER", "ca-only"),
        ("ISTIO_META_CLUSTER_ID", "east"),
    ]);
    let c = Config::from_args_env(&a, &e).expect("valid");
    let x = &xds(&c).control;
    assert_eq!(x.alt_hostname.as_deref(), Some("istiod.istio-system.svc"));
    assert_eq!(x.token, Some(TokenSource::Literal("tok".to_owned())));
    assert_eq!(x.headers, [("x_tenant".to_owned(), "blue".to_owned())]);
    assert_eq!(x.cluster_id, "east", "ISTIO_META_CLUSTER_ID wins over CLUSTER_ID");

    let a = args(&[&base[..], &["--xds-root-ca", "SYSTEM", "--alt-xds-hostname", "not a name"]].concat());
    assert_eq!(
        err(&a, &Env::new()),
        "ALT_XDS_HOSTNAME=\"not a name\" is not a valid TLS server name (DNS name or IP address)"
    );
    let a = args(&[&base[..], &["--xds-root-ca", "SYSTEM"]].concat());
    assert_eq!(
        err(&a, &env(&[("XDS_HEADER_BAD", "a\u{1}b")])),
        "XDS_HEADER_bad is not a valid gRPC metadata name with a visible ASCII value"
    );
    let a = args(&["--fake-ca", "true", "--xds-address", "ftp://istiod"]);
    assert_eq!(
        err(&a, &Env::new()),
        "XDS_ADDRESS=\"ftp://istiod\" is not a usable xDS server address: use https:// (or http:// for local development)"
    );
}

#[test]
fn on_demand_is_refused_with_the_dns_proxy() {
    let a = args(&["--fake-ca", "true", "--xds-address", "http://istiod:15010", "--xds-on-demand", "true"]);
    assert_eq!(
        err(&a, &Env::new()),
        "XDS_ON_DEMAND=true cannot be used with the DNS proxy (ISTIO_META_DNS_CAPTURE=true): the DNS proxy needs every address; turn one of them off"
    );
    let a = ProxyArgs { dns_capture: "false".into(), ..a };
    assert!(xds(&config(&a).expect("valid")).on_demand);
    // Without xDS, on-demand has nothing to do and is not an error.
    let a = args(&["--fake-ca", "true", "--xds-address", "", "--xds-on-demand", "true"]);
    assert!(config(&a).is_ok());
}

/// node-proxy.md §1.4: id and metadata as ztunnel sends them.
#[test]
fn node_id_and_metadata() {
    let a = args(&["--fake-ca", "true", "--xds-address", "http://istiod:15010"]);
    let c = config(&a).expect("valid");
    let node = &xds(&c).node;
    assert_eq!(node.id, "ztunnel~1.1.1.1~.~.svc.cluster.local");
    let keys: Vec<_> = node.metadata.keys().map(String::as_str).collect();
    assert_eq!(keys, ["INSTANCE_IPS", "NAME", "NAMESPACE", "NODE_NAME"]);
    assert_eq!(node.metadata["INSTANCE_IPS"], "1.1.1.1");

    let a = args(&[
        "--fake-ca",
        "true",
        "--xds-address",
        "http://istiod:15010",
        "--pod-name",
        "ztunnel-abcde",
        "--pod-namespace",
        "istio-system",
        "--instance-ip",
        "10.0.0.5",
        "--node-name",
        "node-1",
    ]);
    let e = env(&[
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("ISTIO_META_ISTIO_VERSION", "1.24.0"),
        ("ISTIO_METAJSON_LABELS", r#"{"app":"ztunnel","n":2}"#),
        ("ISTIO_METAJSON_BROKEN", "{not json"),
        ("ISTIO_META_", "empty key is skipped"),
    ]);
    let node = xds(&Config::from_args_env(&a, &e).expect("valid")).node.clone();
    assert_eq!(node.id, "ztunnel~10.0.0.5~ztunnel-abcde.istio-system~istio-system.svc.cluster.local");
    let expected = serde_json::json!({
        "CLUSTER_ID": "Kubernetes",
        "ISTIO_VERSION": "1.24.0",
        "LABELS": {"app": "ztunnel", "n": 2},
        "NAME": "ztunnel-abcde",
        "NAMESPACE": "istio-system",
        "INSTANCE_IPS": "10.0.0.5",
        "NODE_NAME": "node-1",
    });
    assert_eq!(serde_json::to_value(&node.metadata).expect("json"), expected);

    let proto = node.to_proto();
    assert_eq!(proto.id, node.id);
    assert_eq!((proto.cluster.as_str(), proto.build_version.as_str()), ("", ""));
    let fields = proto.metadata.expect("metadata").fields;
    use prost_types::value::Kind;
    assert_eq!(fields["NAME"].kind, Some(Kind::StringValue("ztunnel-abcde".into())));
    match &fields["LABELS"].kind {
        Some(Kind::StructValue(s)) => assert_eq!(s.fields["n"].kind, Some(Kind::NumberValue(2.0))),
        other => panic!("LABELS is {other:?}"),
    }
}

/// The CA takes the same forms: SYSTEM and inline roots, a literal token, ALT_CA_HOSTNAME.
#[test]
fn ca_settings() {
    let r = roots();
    let base = ["--xds-address", "", "--ca-address", "istiod.istio-system.svc:15012"];
    for (value, expected) in [
        ("SYSTEM", RootSource::System),
        (r.pem.as_str(), RootSource::Inline(r.pem.clone())),
        (r.path.as_str(), RootSource::File(r.path.clone().into())),
    ] {
        let c = config(&args(&[&base[..], &["--ca-root-ca", value]].concat())).expect("valid");
        assert_eq!(remote_ca(&c).roots, expected);
        assert_eq!(remote_ca(&c).address, "https://istiod.istio-system.svc:15012");
    }
    let a = args(
        &[
            &base[..],
            &["--ca-root-ca", "SYSTEM", "--auth-token", "literal", "--alt-ca-hostname", "istiod.example"],
        ]
        .concat(),
    );
    let c = Config::from_args_env(&a, &env(&[("CA_HEADER_X_A", "1")])).expect("valid");
    let ca = remote_ca(&c);
    assert_eq!(ca.token, Some(TokenSource::Literal("literal".to_owned())));
    assert_eq!(ca.alt_hostname.as_deref(), Some("istiod.example"));
    assert_eq!(ca.headers, [("x_a".to_owned(), "1".to_owned())]);
    assert_eq!(ca.cluster_id, "Kubernetes");
    let dump = serde_json::to_string(&c).expect("dump");
    assert!(!dump.contains("\"literal\""), "the token is not dumped: {dump}");

    let token = tempfile::NamedTempFile::new().expect("token");
    let a = args(
        &[&base[..], &["--ca-root-ca", "SYSTEM", "--auth-token", &token.path().display().to_string()]]
            .concat(),
    );
    assert_eq!(
        remote_ca(&config(&a).expect("valid")).token,
        Some(TokenSource::File(token.path().to_owned()))
    );

    assert_eq!(
        err(&args(&["--xds-address", "", "--ca-address", ""]), &Env::new()),
        "CA_ADDRESS is empty: set it to the Istio CA (istiod), or FAKE_CA=true for development"
    );
    assert_eq!(
        err(&args(&["--xds-address", ""]), &Env::new()),
        "CA_ROOT_CA=\"./var/run/secrets/istio/root-cert.pem\" is not an existing file, `SYSTEM`, or inline PEM certificates; set it to the file with the CA's root certificate (istiod's root-cert.pem)"
    );
    let c = Config::from_args_env(
        &args(&["--xds-address", "", "--ca-root-ca", "SYSTEM"]),
        &env(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")]),
    )
    .expect("valid");
    assert_eq!(remote_ca(&c).address, "https://istiod.istio-system.svc:15012");
}

#[test]
fn unsupported_settings_are_listed_once() {
    let e = env(&[
        ("TLS12_ENABLED", "true"),
        ("CRL_PATH", "/x"),
        ("INPOD_ENABLED", "true"),
        ("RUST_LOG", "info"),
    ]);
    let c = Config::from_args_env(&args(&BASE), &e).expect("valid");
    assert_eq!(
        c.unsupported,
        [
            "CRL_PATH is set but not supported by Ambit yet; it has no effect",
            "TLS12_ENABLED is set but not supported by Ambit yet; it has no effect",
        ]
    );
    let e = env(&[("PROXY_CONFIG", "{}")]);
    let c = Config::from_args_env(&args(&BASE), &e).expect("valid");
    assert_eq!(
        c.unsupported,
        [
            "the mesh config (./etc/istio/config/mesh, PROXY_CONFIG) is not read by Ambit yet: discoveryAddress, proxyMetadata and concurrency there have no effect; use XDS_ADDRESS, ISTIO_META_* and ZTUNNEL_WORKER_THREADS"
        ]
    );
}

/// The settings Istio's ztunnel chart gives ztunnel (node-proxy.md §8), as flags for what clap
/// reads from the environment and as the environment for the prefixed ones: accepted, and each
/// one lands where it should.
#[test]
fn the_ztunnel_chart_settings_are_honoured() {
    let r = roots();
    let a = args(&[
        "--ca-address",
        "istiod.istio-system.svc:15012",
        "--xds-address",
        "istiod.istio-system.svc:15012",
        "--ca-root-ca",
        &r.path,
        "--xds-root-ca",
        &r.path,
        "--rust-log",
        "info",
        "--termination-grace-period-seconds",
        "30",
        "--pod-name",
        "ztunnel-x",
        "--pod-namespace",
        "istio-system",
        "--node-name",
        "node-1",
        "--instance-ip",
        "10.0.0.9",
        "--service-account",
        "ztunnel",
        "--cpu-limit",
        "2",
        "ztunnel",
    ]);
    let e = env(&[
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("INPOD_ENABLED", "true"),
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
    ]);
    let c = Config::from_args_env(&a, &e).expect("the chart's settings start the proxy");
    assert_eq!(remote_ca(&c).address, "https://istiod.istio-system.svc:15012");
    let x = xds(&c);
    assert_eq!(x.control.address, "https://istiod.istio-system.svc:15012");
    assert_eq!(x.node.id, "ztunnel~10.0.0.9~ztunnel-x.istio-system~istio-system.svc.cluster.local");
    assert_eq!(c.cluster_id, "Kubernetes");
    assert_eq!(c.self_termination_deadline, Duration::from_secs(25));
    assert_eq!(c.local_node.as_deref(), Some("node-1"));
    assert_eq!(c.num_worker_threads, 2);
    assert!(c.unsupported.is_empty(), "the chart's own settings draw no warning: {:?}", c.unsupported);
}
