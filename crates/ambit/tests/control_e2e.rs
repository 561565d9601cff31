//! End to end on the real control plane: `ambit control` reads a folder of Kubernetes and Istio
//! YAML; two nodes each run `ambit agent` and a shared-mode `ambit proxy` whose only settings
//! are `XDS_ADDRESS`, `CA_ADDRESS`, the mesh root and their node's token (no local config, no
//! FAKE_CA); pods are created through each node's CNI chain.
//!
//! Needs root (under `CI=true` a missing privilege fails instead of skipping).

mod common;
mod mesh;

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use mesh::*;

const MARKER: &[u8] = b"AMBIT-CONTROL-E2E-MARKER-3b9e";

/// The Service VIP (10.96.0.0/12 is left free by the harness).
const VIP: &str = "10.96.0.10";

/// How long a change may take to reach both proxies in the checks that do not measure it.
const CONVERGE: Duration = Duration::from_secs(10);

/// Samples of `istio_tcp_connections_opened_total` reported by the destination with these
/// label values (all must be present on the line).
fn opened(body: &str, labels: &[(&str, &str)]) -> u64 {
    body.lines()
        .filter(|l| {
            l.starts_with("istio_tcp_connections_opened_total{") && l.contains("reporter=\"destination\"")
        })
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// One connection that is denied by the destination's proxy, or `Err` saying what happened.
fn try_denied(from: &Pod, dst: SocketAddr, c: &ControlCluster, dst_node: usize) -> Result<(), String> {
    let before = denied_count(&c.proxy_metrics(dst_node));
    let mut s = from.connect_tcp(dst).map_err(|e| format!("connect: {e}"))?;
    let _ = s.write_all(MARKER);
    let (reply, _) = expect_close(&mut s, DENY_CLOSE_BOUND)?;
    if !reply.is_empty() {
        return Err(format!("{} bytes came back: allowed", reply.len()));
    }
    let after = denied_count(&c.proxy_metrics(dst_node));
    if after != before + 1 {
        return Err(format!("closed, but the deny counter went {before} → {after}"));
    }
    Ok(())
}

fn wait_workloads(c: &ControlCluster, uids: &[String], present: bool) {
    for i in 0..c.nodes.len() {
        for uid in uids {
            let ok = wait_for(|| c.proxy_has_workload(i, uid) == present, CONVERGE);
            assert!(
                ok,
                "node {i}'s proxy: workload {uid} present={}, want {present}\n{}",
                !present,
                c.logs()
            );
        }
    }
}

#[test]
fn two_nodes_on_the_control_plane() {
    if !require_root() {
        return;
    }
    let mut c = ControlCluster::new(2);
    c.write_namespace("demo", true);
    c.write_namespace("plain", false);
    c.write(
        "svc-echo.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: echo\n  namespace: demo\nspec:\n  selector:\n    app: server\n  clusterIP: {VIP}\n  clusterIPs: [\"{VIP}\"]\n  ports:\n  - name: tcp-echo\n    port: 80\n    targetPort: echo\n"
        ),
    );
    c.start_control();
    c.start_node(0);
    c.start_node(1);
    c.route_nodes();

    let server_a = c.add_pod(0, PodSpec::new("demo", "server-a", "server").label("app", "server"));
    let server_b = c.add_pod(1, PodSpec::new("demo", "server-b", "server").label("app", "server"));
    let client = c.add_pod(0, PodSpec::new("demo", "client", "client"));
    let other = c.add_pod(1, PodSpec::new("demo", "other", "other"));
    let outsider = c.add_pod(0, PodSpec::new("plain", "outsider", "default"));
    let echo_a = server_a.pod().echo_server(8080);
    let echo_b = server_b.pod().echo_server(8080);
    let all: Vec<String> =
        [&server_a, &server_b, &client, &other, &outsider].iter().map(|p| p.uid()).collect();
    wait_workloads(&c, &all, true);

    // mTLS with certificates from the control plane, same node and across nodes: the
    // destination proxy reports the client's identity and mutual TLS.
    for (server, node, what) in [(&server_a, 0, "same node"), (&server_b, 1, "across nodes")] {
        let labels =
            [("connection_security_policy", "mutual_tls"), ("source_principal", &*client.identity())];
        let before = opened(&c.proxy_metrics(node), &labels);
        assert_echo(&client.pod(), ControlCluster::echo_addr(server, 8080), what);
        let ok = wait_for(|| opened(&c.proxy_metrics(node), &labels) == before + 1, Duration::from_secs(3));
        assert!(
            ok,
            "{what}: no mTLS connection from {} counted:\n{}",
            client.identity(),
            c.proxy_metrics(node)
        );
    }
    let (status, metrics) = c.control_get("/metrics");
    assert_eq!(status, 200);
    let issued = metric(&metrics, "ambit_ca_certificates_signed_total").unwrap_or_default();
    assert!(
        issued >= 4.0,
        "the control plane signed {issued} certificates (want one per enrolled pod):\n{metrics}"
    );
    // No pod's certificate was refused on the way, though each proxy asked as its pod started,
    // possibly before the control plane's poll had the pod (the CA waits for its index).
    let refused = metric(&metrics, "ambit_ca_requests_refused_total{reason=\"impersonation\"}");
    assert_eq!(refused.unwrap_or_default(), 0.0, "impersonation refused:\n{metrics}");

    // What the control plane shows: both node proxies connected, with what they acked; the
    // translated workloads; the xDS metrics.
    let (status, body) = c.control_get("/debug/connections");
    assert_eq!(status, 200, "{body}");
    let conns: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(conns["connected"], 2, "{body}");
    let mut nodes: Vec<&str> =
        conns["streams"].as_array().into_iter().flatten().filter_map(|s| s["node_name"].as_str()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["node", "node2"], "{body}");
    for stream in conns["streams"].as_array().into_iter().flatten() {
        for t in stream["types"].as_array().into_iter().flatten() {
            assert!(!t["acked_nonces"].as_array().is_none_or(Vec::is_empty), "nothing acked on {t}");
        }
    }
    let (status, body) = c.control_get(&format!("/debug/config_dump?type=address&name={}", client.uid()));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&client.ip4().to_string()) && body.contains("HBONE"), "{body}");
    assert_eq!(c.control_get("/debug/config_dump?type=routes").0, 400);
    let pushes: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("pilot_xds_pushes{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(pushes >= 4.0, "pilot_xds_pushes: {pushes}\n{metrics}");
    assert!(metrics.contains("pilot_xds{"), "no pilot_xds gauge:\n{metrics}");

    // The Service VIP reaches both endpoints (the named target port resolved per pod).
    let vip: SocketAddr = format!("{VIP}:80").parse().expect("vip");
    for n in 0..20 {
        assert_echo(&client.pod(), vip, &format!("VIP connection {n}"));
    }
    assert!(
        !echo_a.peers().is_empty() && !echo_b.peers().is_empty(),
        "the VIP did not reach both endpoints: a {:?}, b {:?}",
        echo_a.peers(),
        echo_b.peers()
    );

    // A policy file edit changes enforcement within 1 s.
    let deny = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-client\n  namespace: demo\nspec:\n  selector:\n    matchLabels:\n      app: server\n  action: DENY\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/demo/sa/client\"]\n";
    let dst = ControlCluster::echo_addr(&server_a, 8080);
    let t0 = Instant::now();
    c.write("ap-deny-client.yaml", deny);
    let mut last = String::new();
    let enforced = wait_for(
        || match try_denied(&client.pod(), dst, &c, 0) {
            Ok(()) => true,
            Err(e) => {
                last = e;
                false
            }
        },
        Duration::from_secs(5),
    );
    let took = t0.elapsed();
    assert!(enforced, "the DENY policy was not enforced within 5 s (last attempt: {last})\n{}", c.logs());
    assert!(took <= Duration::from_secs(1), "the DENY policy took {took:?} to be enforced (bound 1 s)");
    println!("policy edit → enforced in {took:?}");
    assert_echo(&other.pod(), dst, "another identity is still allowed");
    c.remove("ap-deny-client.yaml");
    let lifted = wait_for(
        || {
            client
                .pod()
                .connect_tcp(dst)
                .ok()
                .is_some_and(|mut s| echo_roundtrip(&mut s, MARKER).is_ok_and(|r| r == MARKER))
        },
        Duration::from_secs(5),
    );
    assert!(lifted, "removing the policy file did not lift the denial\n{}", c.logs());

    // PeerAuthentication STRICT refuses plaintext to its pods: the outsider (not in the mesh)
    // is allowed before, denied after.
    assert_echo(&outsider.pod(), dst, "plaintext before STRICT");
    c.write(
        "pa-strict.yaml",
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: strict\n  namespace: demo\nspec:\n  mtls:\n    mode: STRICT\n",
    );
    let strict = wait_for(|| try_denied(&outsider.pod(), dst, &c, 0).is_ok(), Duration::from_secs(5));
    assert!(strict, "plaintext to a STRICT pod was not denied\n{}", c.logs());
    assert_echo(&client.pod(), dst, "mTLS to a STRICT pod is allowed");

    // Deleting a pod's YAML removes it from both proxies.
    let gone = other.uid();
    c.delete_pod(other);
    wait_workloads(&c, &[gone], false);
    wait_workloads(&c, &all[..3], true);
}
