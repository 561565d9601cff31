//! The cluster network, built for real (root): nodes reach each other's pod CIDRs through the
//! fabric, hosts reach every node, and teardown leaves no namespace behind.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use ambit_cluster::ip;
use ambit_cluster::testing::require_root;
use ambit_cluster::topology::{NetworkError, NetworkSpec, remove_tagged};

fn spec(tag: &str) -> NetworkSpec {
    NetworkSpec {
        tag: tag.into(),
        nodes: vec!["node1".into(), "node2".into()],
        hosts: vec!["control".into()],
        segment: (250, rand::random()),
        pods: 244,
    }
}

fn netns(name: &str) -> ambit_netns::Netns {
    ambit_netns::Netns::open(&ip::netns_path(name)).expect("open netns")
}

/// Whether a TCP connection from namespace `from` reaches a listener bound in `to` on `addr`.
fn reaches(from: &str, to: &str, addr: Ipv4Addr) -> bool {
    let listener = netns(to)
        .run_in_thread(|| TcpListener::bind(SocketAddr::from((addr, 0))))
        .expect("enter")
        .expect("bind");
    let target = listener.local_addr().expect("addr");
    netns(from)
        .run_in_thread(|| TcpStream::connect_timeout(&target, Duration::from_secs(2)).is_ok())
        .expect("enter")
}

/// Tears the network down also when the test fails.
struct Guard(ambit_cluster::topology::Network);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.teardown();
    }
}

#[test]
fn nodes_route_to_each_others_pods_and_teardown_removes_everything() {
    if !require_root() {
        return;
    }
    let tag = format!("ambc{}1", std::process::id());
    let net = Guard(spec(&tag).build().expect("build"));
    let net = &net.0;
    let (n1, n2, control) = (&net.nodes[0], &net.nodes[1], &net.hosts[0]);
    assert!(reaches(&n1.netns, &n2.netns, n2.ip), "node1 cannot reach node2 on the segment");
    assert!(reaches(&control.netns, &n1.netns, n1.ip), "control cannot reach node1");
    // A pod address on node2 (stand-in: node2 holds its gateway on a dummy link).
    let gw = n2.pods.expect("pods").gateway;
    ip::inside(&n2.netns, &["link", "add", "cni0", "type", "bridge"]).expect("dummy");
    ip::inside(&n2.netns, &["addr", "add", &format!("{gw}/24"), "dev", "cni0"]).expect("addr");
    ip::inside(&n2.netns, &["link", "set", "cni0", "up"]).expect("up");
    assert!(reaches(&n1.netns, &n2.netns, gw), "node1 has no route to node2's pods");
    assert!(reaches(&control.netns, &n2.netns, gw), "control has no route to node2's pods");

    // The same tag again is refused, naming the namespace in the way.
    let again = spec(&tag).build().expect_err("tag in use");
    assert!(matches!(&again, NetworkError::Exists(ns) if *ns == format!("{tag}-fabric")), "{again}");

    assert!(net.teardown().is_empty());
    assert!(ip::netns_with_prefix(&format!("{tag}-")).is_empty(), "namespaces left behind");
    // Idempotent: nothing left to remove is not an error.
    assert!(net.teardown().is_empty());
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&tag));
}

#[test]
fn a_failed_build_removes_what_it_made_and_leftovers_are_found_by_tag() {
    if !require_root() {
        return;
    }
    let tag = format!("ambc{}2", std::process::id());
    // A leftover member namespace makes the build fail before anything is created.
    ip::add_netns(&format!("{tag}-node2")).expect("leftover");
    let err = spec(&tag).build().expect_err("node2 exists");
    assert_eq!(
        err.to_string(),
        format!(
            "network namespace {tag}-node2 already exists (a cluster with this tag is up, or was not torn down: `ambit down`)"
        )
    );
    assert_eq!(
        ip::netns_with_prefix(&format!("{tag}-")),
        [format!("{tag}-node2")],
        "the build created something"
    );
    let (removed, errors) = remove_tagged(&tag);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(removed, [format!("{tag}-node2")]);
    assert!(ip::netns_with_prefix(&format!("{tag}-")).is_empty());
}
