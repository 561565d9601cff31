use super::*;
use crate::dashboard::collect::{Service, Workload};

fn pod(
    ns: &str,
    pod: &str,
    workload: &str,
    sa: &str,
    ip: &str,
    services: &[&str],
    enrolled: bool,
) -> Workload {
    Workload {
        namespace: ns.into(),
        pod: pod.into(),
        workload: workload.into(),
        identity: if sa.is_empty() {
            String::new()
        } else {
            format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
        },
        addresses: vec![ip.into()],
        node: "node1".into(),
        services: services.iter().map(|s| format!("{ns}/{s}.{ns}.svc.cluster.local")).collect(),
        policies: Vec::new(),
        enrolled,
        status: "HEALTHY".into(),
    }
}

fn service(ns: &str, name: &str, waypoint: Option<&str>) -> Service {
    Service {
        namespace: ns.into(),
        name: name.into(),
        hostname: format!("{name}.{ns}.svc.cluster.local"),
        addresses: Vec::new(),
        ports: Vec::new(),
        waypoint: waypoint.map(str::to_owned),
    }
}

/// A series: `labels` as `k=v` pairs; `src`/`dst` as `ns/workload`, `svc` as `ns/name` or "".
fn series(
    family: Family,
    reporter: &str,
    src: &str,
    svc: &str,
    dst: &str,
    extra: &[(&str, &str)],
    value: f64,
) -> Series {
    let (sns, sw) = src.split_once('/').unwrap_or(("unknown", "unknown"));
    let (dns, dw) = dst.split_once('/').unwrap_or(("unknown", "unknown"));
    let (vns, vn) = svc.split_once('/').unwrap_or(("unknown", "unknown"));
    let mut labels: BTreeMap<String, String> = [
        ("reporter", reporter),
        ("source_workload_namespace", sns),
        ("source_workload", sw),
        ("destination_workload_namespace", dns),
        ("destination_workload", dw),
        ("destination_service_namespace", vns),
        ("destination_service_name", vn),
        ("response_flags", "-"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in extra {
        labels.insert((*k).to_owned(), (*v).to_owned());
    }
    Series { family, labels, value }
}

const MTLS: (&str, &str) = ("connection_security_policy", "mutual_tls");
const PLAIN: (&str, &str) = ("connection_security_policy", "unknown");
const CLIENT: (&str, &str) = ("source_principal", "spiffe://cluster.local/ns/demo/sa/client");
const OTHER: (&str, &str) = ("source_principal", "spiffe://cluster.local/ns/demo/sa/other");
const DENY: (&str, &str) = ("response_flags", "DENY");

/// The demo's shape: what its flows leave in the proxies' and the waypoint's counters.
fn demo(scale: f64) -> Snapshot {
    use Family::*;
    Snapshot {
        workloads: vec![
            pod("demo", "client", "client", "client", "10.244.1.3", &[], true),
            pod("demo", "other", "other", "other", "10.244.2.3", &[], true),
            pod("demo", "server-0", "server", "server", "10.244.1.4", &["server"], true),
            pod("demo", "server-1", "server", "server", "10.244.2.4", &["server"], true),
            pod("demo", "api-v1-0", "api-v1", "api", "10.244.1.2", &["api", "api-v1"], true),
            pod("demo", "waypoint-0", "waypoint", "waypoint", "10.244.1.5", &["waypoint"], true),
            pod("plain", "outsider", "outsider", "default", "10.244.1.6", &[], false),
            pod("plain", "web", "web", "default", "10.244.2.5", &[], false),
        ],
        services: vec![
            service("demo", "server", None),
            service("demo", "api", Some("demo/waypoint")),
            service("demo", "api-v1", None),
            service("demo", "waypoint", None),
        ],
        series: vec![
            series(
                Opened,
                "destination",
                "demo/client",
                "demo/server",
                "demo/server",
                &[MTLS, CLIENT],
                6.0 * scale,
            ),
            // The same connections as the client's proxy counted them: not counted twice.
            series(
                Opened,
                "source",
                "demo/client",
                "demo/server",
                "demo/server",
                &[MTLS, CLIENT],
                6.0 * scale,
            ),
            series(
                Sent,
                "destination",
                "demo/client",
                "demo/server",
                "demo/server",
                &[MTLS, CLIENT],
                600.0 * scale,
            ),
            series(
                Received,
                "destination",
                "demo/client",
                "demo/server",
                "demo/server",
                &[MTLS, CLIENT],
                100.0,
            ),
            // A pod's address dialed: the source's proxy knows no Service, the destination's does.
            series(Opened, "source", "demo/client", "", "demo/server", &[MTLS, CLIENT], 2.0),
            // Out of the mesh: only the source's proxy saw it.
            series(Opened, "source", "demo/client", "", "plain/web", &[PLAIN], 1.0),
            series(
                Failed,
                "destination",
                "demo/other",
                "demo/server",
                "demo/server",
                &[MTLS, OTHER, DENY],
                1.0,
            ),
            series(
                Failed,
                "destination",
                "plain/outsider",
                "demo/server",
                "demo/server",
                &[PLAIN, DENY],
                1.0,
            ),
            // Not a denial: a failed dial.
            series(
                Failed,
                "source",
                "demo/client",
                "",
                "demo/other",
                &[MTLS, CLIENT, ("response_flags", "CONNECT")],
                4.0,
            ),
            series(
                Requests,
                "waypoint",
                "x/x",
                "demo/api",
                "demo/api-v1",
                &[MTLS, CLIENT, ("response_code", "200")],
                91.0,
            ),
            series(
                Requests,
                "waypoint",
                "x/x",
                "demo/api",
                "",
                &[MTLS, CLIENT, ("response_code", "403"), ("response_flags", "RBAC")],
                1.0,
            ),
        ],
        ..Snapshot::default()
    }
}

fn find<'a>(g: &'a Graph, id: &str) -> &'a Edge {
    g.edges.iter().find(|e| e.id == id).unwrap_or_else(|| {
        panic!("no edge {id}; edges: {:?}", g.edges.iter().map(|e| &e.id).collect::<Vec<_>>())
    })
}

#[test]
fn the_demo_s_counters_draw_its_flows_once_each_through_their_services() {
    let g = build(&demo(1.0), |_| 0, &mut Previous::default(), 2);
    let kinds: Vec<(&str, &str)> = g.nodes.iter().map(|n| (n.id.as_str(), n.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            ("service/demo/api", "service"),
            ("service/demo/api-v1", "service"),
            ("service/demo/server", "service"),
            ("workload/demo/api-v1", "workload"),
            ("workload/demo/client", "workload"),
            ("workload/demo/other", "workload"),
            ("workload/demo/server", "workload"),
            ("workload/demo/waypoint", "waypoint"),
            ("workload/plain/outsider", "workload"),
            ("workload/plain/web", "workload"),
        ],
        "the waypoint's own Service is not drawn, the waypoint is; the waypoint's source is known \
         by its identity, so nothing is outside"
    );
    let e = find(&g, "workload/demo/client->service/demo/server");
    assert_eq!((e.connections, e.bytes, e.mtls, e.denied), (6, 700, "all", 0));
    assert_eq!(e.identities, vec!["spiffe://cluster.local/ns/demo/sa/client".to_owned()]);
    let e = find(&g, "service/demo/server->workload/demo/server");
    assert_eq!(
        (e.connections, e.denied, e.mtls),
        (6, 2, "all"),
        "the plaintext attempt was denied: no traffic"
    );
    assert!(e.identities.is_empty(), "the second hop does not repeat the identity");
    let e = find(&g, "workload/demo/other->service/demo/server");
    assert_eq!((e.connections, e.denied, e.mtls), (0, 1, "all"));
    let e = find(&g, "workload/plain/outsider->service/demo/server");
    assert_eq!((e.denied, e.mtls), (1, "none"));
    let e = find(&g, "workload/demo/client->workload/plain/web");
    assert_eq!((e.connections, e.mtls), (1, "none"));
    assert!(
        !g.edges.iter().any(|e| e.id == "workload/demo/client->workload/demo/server"),
        "the source's view of a pair the destination reported is not drawn"
    );
    let e = find(&g, "workload/demo/client->workload/demo/other");
    assert_eq!((e.connections, e.denied), (0, 0), "a failed dial is not a denial");
    let e = find(&g, "workload/demo/client->service/demo/api");
    assert_eq!((e.requests, e.errors, e.denied, e.mtls), (92, 1, 1, "all"));
    let e = find(&g, "service/demo/api->workload/demo/api-v1");
    assert_eq!((e.requests, e.errors, e.denied), (91, 0, 0));
    let server = g.nodes.iter().find(|n| n.id == "workload/demo/server").expect("server");
    assert_eq!((server.pods, server.denied), (2, 2), "both denials landed on the server's pods");
    let svc = g.nodes.iter().find(|n| n.id == "service/demo/server").expect("service");
    assert_eq!((svc.pods, svc.denied), (2, 2));
    let api = g.nodes.iter().find(|n| n.id == "service/demo/api").expect("api");
    assert_eq!(api.waypoint.as_deref(), Some("demo/waypoint"));
    let ns: Vec<(&str, bool)> = g.namespaces.iter().map(|n| (n.name.as_str(), n.ambient)).collect();
    assert_eq!(ns, vec![("demo", true), ("plain", false)]);
}

#[test]
fn rates_are_the_growth_since_the_previous_refresh() {
    let mut previous = Previous::default();
    let first = build(&demo(1.0), |_| 0, &mut previous, 2);
    assert_eq!(find(&first, "workload/demo/client->service/demo/server").connections_per_second, 0.0);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = build(&demo(3.0), |_| 0, &mut previous, 2);
    let e = find(&second, "workload/demo/client->service/demo/server");
    assert_eq!(e.connections, 18);
    assert!(e.connections_per_second > 0.0 && e.bytes_per_second > 0.0, "{e:?}");
    // A proxy that restarted counts from zero again: no negative rate.
    let third = build(&demo(1.0), |_| 0, &mut previous, 2);
    assert_eq!(find(&third, "workload/demo/client->service/demo/server").connections_per_second, 0.0);
}
