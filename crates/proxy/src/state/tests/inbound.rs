//! §4.13 inbound conformance table and CONNECT authority parsing.

use super::*;

const CLIENT_POD_IP: &str = "10.0.0.1";
const SERVER_POD_IP: &str = "10.0.0.2";
const SERVER_SVC_IP: &str = "10.10.0.1";
const WAYPOINT_POD_IP: &str = "10.0.0.3";
const WAYPOINT_SVC_IP: &str = "10.10.0.2";
const SERVER_HOST: &str = "server.default.svc.cluster.local";

#[derive(Clone, Copy)]
enum Wp {
    None,
    /// Service-attached waypoint at this address, optional PROXY tunnel on the waypoint.
    Service(&'static str, bool),
    /// Workload-attached waypoint at this address, optional PROXY tunnel on the waypoint.
    Workload(&'static str, bool),
}

fn setup(wp: Wp) -> State {
    let (svc_wp, wl_wp, tunnel) = match wp {
        Wp::None => (None, None, false),
        Wp::Service(a, t) => (Some(gw_addr(a, 15008)), None, t),
        Wp::Workload(a, t) => (None, Some(gw_addr(a, 15008)), t),
    };
    let mut services = Vec::new();
    for (name, vip) in [("waypoint", WAYPOINT_SVC_IP), ("server", SERVER_SVC_IP)] {
        let mut s = svc(&format!("{name}.default.svc.cluster.local"), &[vip], &[(80, 8080)]);
        s.endpoints.insert(
            format!("cluster1//v1/Pod/default/{name}"),
            Endpoint {
                workload_uid: format!("cluster1//v1/Pod/default/{name}").into(),
                port: BTreeMap::new().into(),
                status: HealthStatus::Healthy,
            },
        );
        if name == "server" {
            s.waypoint = svc_wp.clone();
        }
        services.push(s);
    }
    let mut workloads = Vec::new();
    for (name, addr) in [("waypoint", WAYPOINT_POD_IP), ("client", CLIENT_POD_IP), ("server", SERVER_POD_IP)]
    {
        let mut w = wl(&format!("cluster1//v1/Pod/default/{name}"), &[addr]);
        w.protocol = Protocol::Hbone;
        w.service_account = format!("sa-{name}").into();
        if name == "server" {
            w.waypoint = wl_wp.clone();
        }
        if name == "waypoint" && tunnel {
            w.application_tunnel =
                Some(ApplicationTunnel { protocol: AppTunnelProtocol::Proxy, port: Some(15088) });
        }
        workloads.push(w);
    }
    state(workloads, services)
}

fn upstream(wp: Wp, conn_dst: &str, authority: &str) -> Result<SocketAddr, InboundError> {
    let st = setup(wp);
    let local = st.workload_by_addr("", ip(conn_dst)).unwrap();
    let authority: Authority = authority.parse().unwrap();
    st.inbound_upstream(&local, ip(conn_dst), &authority)
}

#[test]
fn conformance_table() {
    let host = format!("{SERVER_HOST}:80");
    let ok = |r: Result<SocketAddr, InboundError>, want: &str| assert_eq!(r, Ok(sa(want)));
    // Server, no waypoint: by pod IP and by service hostname.
    ok(upstream(Wp::None, SERVER_POD_IP, "10.0.0.2:8080"), "10.0.0.2:8080");
    ok(upstream(Wp::None, SERVER_POD_IP, &host), "10.0.0.2:8080");
    // Waypoint sandwich: workload- or service-attached, referenced by pod IP or VIP.
    for wp in [Wp::Workload(WAYPOINT_POD_IP, false), Wp::Workload(WAYPOINT_SVC_IP, false)] {
        ok(upstream(wp, WAYPOINT_POD_IP, "10.0.0.2:8080"), "10.0.0.3:8080");
    }
    for wp in [Wp::Service(WAYPOINT_POD_IP, false), Wp::Service(WAYPOINT_SVC_IP, false)] {
        ok(upstream(wp, WAYPOINT_POD_IP, "10.10.0.1:8080"), "10.0.0.3:8080");
    }
    // Waypoint with a PROXY application tunnel on port 15088.
    ok(upstream(Wp::Workload(WAYPOINT_SVC_IP, true), WAYPOINT_POD_IP, "10.0.0.2:8080"), "10.0.0.3:15088");
    ok(upstream(Wp::Service(WAYPOINT_SVC_IP, true), WAYPOINT_POD_IP, "10.10.0.1:8080"), "10.0.0.3:15088");
}

#[test]
fn conformance_rejections() {
    let mismatch = |r: Result<SocketAddr, InboundError>| {
        let e = r.unwrap_err();
        assert!(matches!(e, InboundError::IpMismatch(..)), "{e:?}");
        assert_eq!(e.http_status(), 400);
    };
    // The server pod asked to forward to the client's IP.
    mismatch(upstream(Wp::None, SERVER_POD_IP, "10.0.0.1:8080"));
    // A waypoint that is not attached to the target.
    mismatch(upstream(Wp::None, WAYPOINT_POD_IP, "10.0.0.1:8080"));
    // Attached to the service, but the pod was addressed (and vice versa).
    mismatch(upstream(Wp::Service(WAYPOINT_POD_IP, false), WAYPOINT_POD_IP, "10.0.0.2:8080"));
    mismatch(upstream(Wp::Workload(WAYPOINT_POD_IP, false), WAYPOINT_POD_IP, "10.10.0.1:8080"));
    assert_eq!(
        InboundError::IpMismatch(ip("10.0.0.2"), ip("10.0.0.1")).to_string(),
        "ip mismatch: 10.0.0.2 != 10.0.0.1"
    );
}

#[test]
fn hostname_authority_errors() {
    let r = upstream(Wp::None, SERVER_POD_IP, "unknown.example:80");
    assert_eq!(r, Err(InboundError::NoHostname("unknown.example".into())));
    let r = upstream(Wp::None, SERVER_POD_IP, &format!("{SERVER_HOST}:81"));
    assert_eq!(r, Err(InboundError::NoPortForService(SERVER_HOST.into(), 81)));
    assert_eq!(r.unwrap_err().http_status(), 503);
}

#[test]
fn authority_parsing() {
    assert_eq!("10.0.0.2:8080".parse::<Authority>(), Ok(Authority::Addr(sa("10.0.0.2:8080"))));
    assert_eq!("[ff06::c3]:80".parse::<Authority>(), Ok(Authority::Addr(sa("[ff06::c3]:80"))));
    assert_eq!("example.com:80".parse::<Authority>(), Ok(Authority::Host("example.com".into(), 80)));
    let a: Authority = "[::1]:15008".parse().unwrap();
    assert_eq!(a.to_string(), "[::1]:15008");
    assert_eq!(a.port(), 15008);
    for bad in [
        "",
        ":80",
        "example.com",
        "example.com:",
        "example.com:0",
        "10.0.0.1:0",
        "example.com:65536",
        "example.com:+80",
        "ff06::c3:80",
        "[ff06::c3]",
        "http://example.com:80",
        "exa mple.com:80",
        "a..b:80",
        "user@host:80",
        "host/path:80",
        // Non-canonical ports: one port, one spelling.
        "10.0.0.2:008080",
        "10.0.0.2:08080",
        "[ff06::c3]:0080",
        "example.com:080",
        "example.com:00",
        "10.0.0.2:+80",
        "10.0.0.2:000000080",
    ] {
        assert!(bad.parse::<Authority>().is_err(), "{bad:?} accepted");
    }
    assert_eq!(
        "10.0.0.2:008080".parse::<Authority>().unwrap_err().to_string(),
        "no valid authority pseudo header: \"10.0.0.2:008080\" (want ip:port, [ipv6]:port or host:port, \
         the port in decimal without leading zeros)"
    );
    // A huge authority is quoted only in part.
    let huge = format!("{}:80", "a".repeat(60_000));
    let e = huge.parse::<Authority>().unwrap_err().to_string();
    assert!(e.len() < 512, "{} bytes", e.len());
    assert!(e.contains("60003 bytes"), "{e}");
}

#[test]
fn guess_service_by_target_port() {
    let s1 = svc("one.example", &["10.10.0.5"], &[(80, 8080)]);
    let s2 = svc("two.example", &["10.10.0.6"], &[(90, 0)]);
    let mut w = endpoint_of(wl("c//Pod/default/p", &["10.0.0.5"]), "default/one.example", &[]);
    w = endpoint_of(w, "default/two.example", &[(90, 9090)]);
    let st = state(vec![w], vec![s1, s2]);
    let w = st.workload_by_uid("c//Pod/default/p").unwrap();
    assert_eq!(st.guess_service(&w, 8080).unwrap().hostname, "one.example");
    assert_eq!(st.guess_service(&w, 9090).unwrap().hostname, "two.example");
    assert!(st.guess_service(&w, 1234).is_none());
}
