//! Pods made as a container runtime makes them, on a real cluster network (root): a sandbox,
//! then the node's CNI network (the reference bridge and host-local plugins) from its
//! configuration directory; the pod gets an address of its node's pod CIDR, is reachable from
//! another node, and DEL plus removal leave nothing behind.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ambit_cluster::cni::{self, PluginPath, Runtime};
use ambit_cluster::ip;
use ambit_cluster::sandbox::{Sandbox, cgroup2_mount};
use ambit_cluster::testing::require_root;
use ambit_cluster::topology::{Network, NetworkSpec};

struct Guard(Network, Vec<Sandbox>);

impl Drop for Guard {
    fn drop(&mut self) {
        for sb in &mut self.1 {
            let _ = sb.remove();
        }
        self.0.teardown();
    }
}

fn netns(name: &str) -> ambit_netns::Netns {
    ambit_netns::Netns::open(&ip::netns_path(name)).expect("open netns")
}

#[test]
fn a_pod_gets_its_nodes_cidr_through_the_cni_chain_and_is_reachable_across_nodes() {
    if !require_root() {
        return;
    }
    let tag = format!("ambc{}3", std::process::id());
    let spec = NetworkSpec {
        tag: tag.clone(),
        nodes: vec!["node1".into(), "node2".into()],
        hosts: vec![],
        segment: (251, rand::random()),
        pods: 245,
    };
    let mut guard = Guard(spec.build().expect("network"), Vec::new());
    let node = guard.0.nodes[0].clone();
    let pods = node.pods.expect("pod cidr");
    let dir = tempfile::tempdir().expect("tmp");
    let conf_dir = dir.path().join("net.d");
    std::fs::create_dir_all(&conf_dir).expect("conf dir");
    let network = cni::bridge_network(
        "ambit",
        "cni0",
        &pods.cidr(),
        &pods.gateway.to_string(),
        &dir.path().join("ipam"),
    );
    std::fs::write(conf_dir.join("10-ambit.conflist"), network.to_string()).expect("conflist");
    let rt = Runtime {
        node_netns: Some(node.netns.clone()),
        conf_dir,
        path: PluginPath::with_reference_plugins(&[])
            .expect("reference plugins (containernetworking-plugins)"),
        cache_dir: dir.path().join("cache"),
        timeout: cni::PLUGIN_TIMEOUT,
    };
    let cgroups = cgroup2_mount().expect("cgroup2").join(format!("{tag}.slice"));
    let sb = Sandbox::create(&format!("{tag}-pod-web"), "demo", "web", None, &cgroups).expect("sandbox");
    let pid = sb.pause_pid();
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup of pause");
    assert!(cgroup.contains(&format!("pod{}", sb.pod.uid.replace('-', "_"))), "{cgroup}");
    guard.1.push(sb);
    let sb = &guard.1[0];

    let (result, runs) = rt.add(&sb.pod).expect("CNI ADD");
    let plugins: Vec<&str> = runs.iter().map(|r| r.plugin.as_str()).collect();
    assert_eq!(plugins, ["loopback", "bridge"]);
    let ip4 = cni::result_ipv4(&result).expect("an IPv4 address");
    assert!(pods.contains(ip4), "{ip4} is not in {}", pods.cidr());
    rt.check(&sb.pod).expect("CNI CHECK");

    // From the other node, through the fabric and node1's route.
    let listener = netns(&sb.netns)
        .run_in_thread(|| TcpListener::bind(SocketAddr::from((ip4, 0))))
        .expect("enter")
        .expect("bind in the pod");
    let target = listener.local_addr().expect("addr");
    let reached = netns(&guard.0.nodes[1].netns)
        .run_in_thread(|| TcpStream::connect_timeout(&target, Duration::from_secs(2)).is_ok())
        .expect("enter");
    assert!(reached, "node2 cannot reach the pod {ip4} on node1");

    rt.del(&sb.pod).expect("CNI DEL");
    rt.del(&sb.pod).expect("a second DEL is fine");
    assert_eq!(rt.result(&sb.pod), None);
    let mut sb = guard.1.pop().expect("sandbox");
    sb.remove().expect("remove");
    assert!(!ip::netns_exists(&sb.netns));
    assert!(!sb.cgroup.exists(), "cgroup left behind");
    let _ = std::fs::remove_dir(&cgroups);
}
