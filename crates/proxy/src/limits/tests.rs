//! Unit tests of the descriptor budget and the per-peer caps.

use std::net::{IpAddr, Ipv4Addr};

use super::peers::{PeerConn, Windows};
use super::*;

fn ip(last: u8) -> IpAddr {
    Ipv4Addr::new(10, 0, 0, last).into()
}

fn limits(max_connections: u32, max_streams: u32, buffer_bytes: u64) -> PeerLimits {
    PeerLimits {
        max_connections,
        max_streams,
        buffer_bytes,
        stream_window: 4 << 20,
        connection_window: 16 << 20,
    }
}

#[test]
fn connections_beyond_the_budget_are_refused_and_released_on_drop() {
    let m = LimitMetrics::default();
    let fds = FdBudget::new(100, Some(20), 8, 0, &m);
    let held: Vec<FdPermit> = (0..80).map(|_| fds.try_acquire(1).expect("within the budget")).collect();
    assert_eq!(fds.in_use(), 80);
    assert!(fds.try_acquire(1).is_none(), "the 81st descriptor is beyond limit 100 minus reserve 20");
    drop(held);
    assert_eq!(fds.in_use(), 0);
    assert!(fds.try_acquire(80).is_some());
}

#[test]
fn default_reserve_is_an_eighth_of_the_limit_up_to_1024() {
    let m = LimitMetrics::default();
    assert_eq!(FdBudget::new(512, None, 8, 64, &m).dump().reserve, 64);
    assert_eq!(FdBudget::new(20_000, None, 8, 64, &m).dump().reserve, 1024);
    assert_eq!(
        FdBudget::new(10, Some(50), 8, 64, &m).dump().budget,
        0,
        "a reserve above the limit leaves nothing"
    );
}

#[test]
fn pods_are_admitted_up_to_capacity_with_a_clear_error_beyond() {
    let m = LimitMetrics::default();
    // 512 - 64 = 448 descriptors, 8 + 64 per pod: 6 pods.
    let fds = FdBudget::new(512, Some(64), 8, 64, &m);
    assert_eq!(fds.dump().pod_capacity, 6);
    let pods: Vec<PodPermit> = (0..6).map(|_| fds.admit_pod().expect("within capacity")).collect();
    assert_eq!(fds.in_use(), 48, "pods hold their fixed descriptors");
    let err = fds.admit_pod().err().expect("the 7th pod is beyond capacity");
    assert_eq!(
        err,
        CapacityError::Pods {
            capacity: 6,
            limit: 512,
            reserve: 64,
            budget: 448,
            per_pod: 72,
            fixed: 8,
            headroom: 64
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("capacity of 6 pods") && text.contains("RLIMIT_NOFILE") && text.contains("512"),
        "{text}"
    );
    // Connections may use what pods do not hold; a pod needs its fixed part free to be admitted.
    drop(pods);
    let conns = fds.try_acquire(445).expect("448 free");
    assert_eq!(fds.admit_pod().err(), Some(CapacityError::Exhausted { in_use: 445, budget: 448, fixed: 8 }));
    drop(conns);
    let pod = fds.admit_pod().expect("capacity is back once connections close");
    assert_eq!(fds.dump().pods, 1);
    drop(pod);
    assert_eq!((fds.dump().pods, fds.in_use()), (0, 0));
}

#[test]
fn a_peer_is_capped_in_connections_and_streams_others_are_not() {
    let peers = Peers::new(limits(3, 2, 64 << 20), LimitMetrics::default());
    let a: Vec<PeerConn> = (0..3).map(|_| peers.connect(ip(1)).expect("under the cap")).collect();
    assert_eq!(peers.connect(ip(1)).err(), Some(Refusal::Connections { ip: ip(1), max: 3 }));
    let b = peers.connect(ip(2)).expect("another peer is not affected");
    let s1 = a[0].open_stream().expect("stream 1");
    let s2 = a[1].open_stream().expect("stream 2 on another connection");
    assert_eq!(a[2].open_stream().err(), Some(Refusal::Streams { ip: ip(1), max: 2 }));
    let _sb = b.open_stream().expect("another peer's stream");
    drop(s1);
    let _s3 = a[2].open_stream().expect("a slot was freed");
    drop(a);
    assert_eq!(peers.dump().peers, 2, "the peer is kept while its stream is open");
    drop((s2, _s3));
    assert_eq!(peers.dump().peers, 1);
    let _again = peers.connect(ip(1)).expect("the peer starts over");
}

#[test]
fn windows_of_a_peer_never_sum_above_its_budget_and_shrink_as_it_nears_it() {
    let budget = 32u64 << 20;
    let peers = Peers::new(limits(256, 1024, budget), LimitMetrics::default());
    let mut conns = Vec::new();
    let mut last = u32::MAX;
    let mut first = None;
    let mut total = 0u64;
    for _ in 0..256 {
        let mut c = peers.connect(ip(1)).expect("under the cap");
        let w = c.windows();
        assert!(w.connection <= last, "a later connection got a larger window");
        assert!(w.connection >= peers::MIN_WINDOW && w.stream <= w.connection, "{w:?}");
        last = w.connection;
        first.get_or_insert(w);
        total += u64::from(w.connection);
        conns.push(c);
    }
    assert!(total <= budget, "{total} bytes of windows granted over a budget of {budget}");
    assert_eq!(peers.dump().window_bytes, i64::try_from(total).expect("fits"));
    assert_eq!(
        conns.first().map(|c| c.open_stream().is_ok()),
        Some(true),
        "the peer's streams are still admitted"
    );
    let other = peers.connect(ip(2)).map(|mut c| c.windows()).expect("other peer");
    assert_eq!(Some(other), first, "another peer's budget is its own");
    drop(conns);
    assert_eq!(peers.dump().window_bytes, 0, "every window share returns when its connection closes");
}

#[test]
fn a_small_connection_grows_when_the_budget_has_room_again() {
    let peers = Peers::new(limits(4, 1024, 4 << 20), LimitMetrics::default());
    let mut big = peers.connect(ip(1)).expect("first");
    let first = big.windows();
    let mut small = peers.connect(ip(1)).expect("second");
    let before = small.windows();
    assert!(before.connection < first.connection, "{before:?} vs {first:?}");
    drop(big);
    let after = small.grow().expect("room again");
    assert!(after.connection > before.connection, "{after:?} vs {before:?}");
    assert!(peers.dump().window_bytes <= 4 << 20);
}

#[test]
fn the_connection_cap_fits_the_minimum_windows_into_the_budget() {
    let cfg = crate::testing::config();
    let fit = PeerLimits::from_config(&Config { hbone_peer_buffer_bytes: 10 * 65_535, ..cfg });
    assert_eq!(fit.max_connections, 10);
}

#[test]
fn unlimited_peers_get_the_configured_windows() {
    let peers = Peers::unlimited(4 << 20, 16 << 20);
    let mut c = peers.connect(ip(1)).expect("never refused");
    assert_eq!(c.windows(), Windows { stream: 4 << 20, connection: 16 << 20 });
    assert!(c.grow().is_none());
}

#[test]
fn the_log_limiter_lets_one_line_through_per_second() {
    let l = LogLimiter::default();
    assert!(l.allow());
    assert!(!l.allow(), "a second line in the same second is only counted");
}
