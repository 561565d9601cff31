use clap::Parser;

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: WaypointArgs,
}

/// A waypoint `gw-ns/waypoint` on 10.0.0.9 with the in-process CA and plaintext xDS.
const BASE: [&str; 12] = [
    "--pod-namespace",
    "gw-ns",
    "--service-account",
    "waypoint",
    "--instance-ip",
    "10.0.0.9",
    "--pod-name",
    "waypoint-7d9f",
    "--fake-ca",
    "true",
    "--xds-address",
    "http://istiod:15010",
];

fn args(extra: &[&str]) -> WaypointArgs {
    let mut v = vec!["waypoint"];
    v.extend_from_slice(&BASE);
    v.extend_from_slice(extra);
    Cli::try_parse_from(v).expect("parse").args
}

fn env(pairs: &[(&str, &str)]) -> Env {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn err(a: &WaypointArgs) -> String {
    Config::from_args_env(a, &Env::new()).expect_err("must be refused").to_string()
}

#[test]
fn identity_gateway_node_and_baggage() {
    let e = env(&[("ISTIO_META_CLUSTER_ID", "east"), ("ISTIO_META_ISTIO_VERSION", "1.24.0")]);
    let c = Config::from_args_env(&args(&["--node-name", "node-1"]), &e).expect("valid");
    assert_eq!(c.identity.to_string(), "spiffe://cluster.local/ns/gw-ns/sa/waypoint");
    assert_eq!(c.gateway, "gw-ns/waypoint");
    assert_eq!(c.node.id, "router~10.0.0.9~waypoint-7d9f.gw-ns~gw-ns.svc.cluster.local");
    assert_eq!(
        serde_json::to_value(&c.node.metadata).expect("json"),
        serde_json::json!({
            "CLUSTER_ID": "east",
            "INSTANCE_IPS": "10.0.0.9",
            "ISTIO_VERSION": "1.24.0",
            "NAME": "waypoint-7d9f",
            "NAMESPACE": "gw-ns",
            "NODE_NAME": "node-1",
            "SERVICE_ACCOUNT": "waypoint",
        })
    );
    assert_eq!(
        c.baggage,
        "k8s.cluster.name=east,k8s.namespace.name=gw-ns,k8s.deployment.name=waypoint,service.name=waypoint,service.version=latest"
    );
    assert_eq!(c.hbone_addr, "[::]:15008".parse().expect("addr"));
    assert_eq!(c.drain_deadline, Duration::from_secs(5));
    let c = Config::from_args_env(
        &args(&["--trust-domain", "corp.example"]),
        &env(&[("ISTIO_META_WORKLOAD_NAME", "wp-deploy")]),
    )
    .expect("valid");
    assert_eq!(c.identity.to_string(), "spiffe://corp.example/ns/gw-ns/sa/waypoint");
    assert!(c.baggage.contains("k8s.deployment.name=wp-deploy,service.name=waypoint"), "{}", c.baggage);
}

/// The test arguments with their control-plane flags changed by `f`.
fn with_control(f: impl FnOnce(&mut ambit_admin::ControlArgs)) -> WaypointArgs {
    let mut a = args(&[]);
    f(&mut a.control);
    a
}

#[test]
fn startup_errors_name_the_variable_and_the_value() {
    let mut a = args(&[]);
    a.pod_namespace = None;
    assert_eq!(err(&a), "POD_NAMESPACE is not set: the waypoint serves the Gateway of its namespace");
    let mut a = args(&[]);
    a.service_account = Some(String::new());
    assert_eq!(
        err(&a),
        "SERVICE_ACCOUNT is not set: the waypoint serves the Gateway its service account is named after"
    );
    let mut a = args(&[]);
    a.instance_ip = Some("10.0.0".into());
    assert_eq!(err(&a), "INSTANCE_IP=\"10.0.0\" is not an IP address");
    assert_eq!(
        err(&with_control(|c| c.xds_address = Some(String::new()))),
        "XDS_ADDRESS is empty: the waypoint's configuration comes only from xDS; set it to istiod (or `ambit control`)"
    );
    assert_eq!(
        err(&with_control(|c| (c.fake_ca, c.ca_address) = (false, Some(String::new())))),
        "CA_ADDRESS is empty: set it to the Istio CA (istiod), or FAKE_CA=true for development"
    );
    assert_eq!(
        err(&with_control(|c| c.xds_address = Some("ftp://istiod".into()))),
        "XDS_ADDRESS=\"ftp://istiod\" is not a usable xDS server address: use https:// (or http:// for local development)"
    );
    assert_eq!(err(&args(&["--log-format", "xml"])), "LOG_FORMAT=\"xml\" is not `plain` or `json`");
    assert_eq!(
        err(&WaypointArgs { node_token: true, ..with_control(|c| c.fake_ca = true) }),
        "AMBIT_NODE_TOKEN=true asks the CA for the certificate on the node's behalf, but FAKE_CA=true signs it in-process; set one of them"
    );
    let a = WaypointArgs { service_account: Some("a/b".into()), ..args(&[]) };
    assert_eq!(
        err(&a),
        "TRUST_DOMAIN=\"cluster.local\", POD_NAMESPACE=\"gw-ns\", SERVICE_ACCOUNT=\"a/b\" do not make a SPIFFE identity: identity \"spiffe://cluster.local/ns/gw-ns/sa/a/b\" is not of the form spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
    );
}
