//! In-process tests of the HBONE pool and server over real TLS on loopback.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ambit_identity::{FakeCa, Identity};
use bytes::Bytes;

use super::TunnelError;
use crate::testing::{EchoServer, echo_once, pool_for, settings};

fn authority() -> std::net::SocketAddr {
    "10.0.0.2:8080".parse().expect("addr")
}

#[tokio::test]
async fn tunnels_share_a_connection_up_to_the_stream_cap() {
    let ca = Arc::new(FakeCa::generate());
    let mut s = settings();
    s.max_streams = 2;
    let server = EchoServer::start(&ca, s).await;
    let (pool, key) = pool_for(ca, &server, s);
    let h = http::HeaderMap::new();
    let mut t1 = pool.connect(&key, authority(), &h).await.expect("t1");
    let mut t2 = pool.connect(&key, authority(), &h).await.expect("t2");
    assert_eq!(pool.connections(), 1, "two streams fit one connection");
    let mut t3 = pool.connect(&key, authority(), &h).await.expect("t3");
    assert_eq!(pool.connections(), 2, "the third stream needs a second connection");
    for t in [&mut t1, &mut t2, &mut t3] {
        echo_once(t, &Bytes::from_static(b"hello")).await;
    }
    drop((t1, t2, t3));
    // Slots were released: a new stream reuses a pooled connection.
    let _t4 = pool.connect(&key, authority(), &h).await.expect("t4");
    assert_eq!(server.accepted.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn wrong_server_identity_fails_tls() {
    let ca = Arc::new(FakeCa::generate());
    let server = EchoServer::start(&ca, settings()).await;
    let (pool, mut key) = pool_for(ca, &server, settings());
    key.dst_identities = vec![Identity::new("cluster.local", "default", "someone-else")];
    let err = pool.connect(&key, authority(), &http::HeaderMap::new()).await.err().expect("must fail");
    assert!(matches!(err, TunnelError::Tls(_)), "{err}");
    assert!(err.to_string().contains("someone-else"), "{err}");
}

#[tokio::test]
async fn draining_peer_streams_move_to_a_fresh_connection() {
    let ca = Arc::new(FakeCa::generate());
    let server = EchoServer::start(&ca, settings()).await;
    let (pool, key) = pool_for(ca, &server, settings());
    let h = http::HeaderMap::new();
    let mut held = pool.connect(&key, authority(), &h).await.expect("first");
    // The peer starts draining: GOAWAY on its connections; the held stream keeps working.
    server.drain.clone().begin();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fresh = pool.connect(&key, authority(), &h).await.expect("a new stream after GOAWAY");
    echo_once(&mut fresh, &Bytes::from_static(b"new")).await;
    echo_once(&mut held, &Bytes::from_static(b"old")).await;
    assert_eq!(server.accepted.load(Ordering::Relaxed), 2, "the new stream used a fresh connection");
}

#[tokio::test]
async fn idle_connections_are_released() {
    let ca = Arc::new(FakeCa::generate());
    let server = EchoServer::start(&ca, settings()).await;
    let signer: Arc<dyn ambit_identity::CertSigner> = ca;
    let certs = ambit_identity::CertManager::new(signer, Duration::from_secs(3600));
    let pool =
        super::Pool::new(certs, Box::new(crate::testing::TcpDialer), settings(), Duration::from_millis(50));
    let key = super::PoolKey {
        src_identity: Identity::new("cluster.local", "default", "client"),
        dst_identities: vec![server.identity.clone()],
        dst: server.addr,
        src_ip: std::net::Ipv4Addr::LOCALHOST.into(),
    };
    let t = pool.connect(&key, authority(), &http::HeaderMap::new()).await.expect("tunnel");
    tokio::time::sleep(Duration::from_millis(100)).await;
    pool.release_idle();
    assert_eq!(pool.connections(), 1, "a connection with an open stream is kept");
    drop(t);
    pool.release_idle();
    assert_eq!(pool.connections(), 0, "an idle connection is released");
}
