//! The end of a stream reaches the app right behind its last bytes, both ways: a client that
//! closes as soon as it holds a whole answer must see the server's FIN first, as it does without
//! the mesh (closing first leaves its side in TIME_WAIT, and enough of those make every connect
//! of that client search the port range: the connection-churn collapse).

use std::io::Read;
use std::time::Duration;

use ambit_identity::FakeCa;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::driver::deliver;
use super::tests::cfg;
use super::*;
use crate::testing::{RawPeer, RelayServer, TestBudget, settings, wire};

/// A client connection's state with stream 1 open and relayed to an app socket, and the app's
/// peer as a non-blocking std socket (what the app would read).
async fn client_relaying_stream_1() -> (State, Proto, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let app = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (peer, _) = l.accept().expect("accept");
    peer.set_nonblocking(true).expect("non-blocking");
    app.set_nonblocking(true).expect("non-blocking");
    let app = TcpStream::from_std(app).expect("tokio socket");
    // The runtime has seen it writable, as a relay's socket has been long before data comes.
    app.writable().await.expect("writable");
    let cfg = cfg();
    let mut st = State::new(Role::Client, tls::Sealer::for_fuzzing(), &cfg);
    let stream = Stream {
        send_window: 65_535,
        recv_window: i64::from(cfg.stream_window),
        app: Some(Arc::new(app)),
        ..Stream::default()
    };
    st.streams.insert(1, stream);
    st.next_id = 3;
    let mut proto = Proto::new(Role::Client, &cfg, Proto::max_block(&cfg));
    let mut block = Vec::new();
    st.encoder.response(&mut block, 200, &HeaderMap::new());
    let mut head = wire::frame(kind::SETTINGS, 0, 0, &[]);
    head.extend(wire::frame(kind::HEADERS, flag::END_HEADERS, 1, &block));
    feed(&mut st, &mut proto, &head);
    (st, proto, peer)
}

/// The driver's handling of one read of `plain` (frames after TLS).
fn feed(st: &mut State, proto: &mut Proto, plain: &[u8]) {
    let mut reader = frame::Reader::new(frame::DEFAULT_MAX_FRAME, 1 << 20);
    let mut input = plain;
    let mut pending = Vec::new();
    while let Some(ev) = reader.next(&mut input) {
        proto.event(st, ev.expect("a well-formed frame"), &mut pending).expect("accepted");
    }
    deliver(st, &pending);
}

/// What the app can read now, without waiting: the bytes, and whether its FIN is there.
fn readable_now(peer: &mut std::net::TcpStream) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match peer.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (got, false),
            Err(e) => panic!("reading the app's side: {e}"),
        }
    }
}

#[tokio::test]
async fn the_last_data_and_end_stream_in_one_read_reach_the_app_with_its_fin_at_once() {
    let (mut st, mut proto, mut peer) = client_relaying_stream_1().await;
    // No relay task runs here: what the app has is what the driver did in this one read.
    feed(&mut st, &mut proto, &wire::frame(kind::DATA, flag::END_STREAM, 1, b"answer"));
    assert_eq!(readable_now(&mut peer), (b"answer".to_vec(), true));
}

#[tokio::test]
async fn an_end_stream_after_the_data_sends_the_apps_fin_in_the_read_that_brings_it() {
    let (mut st, mut proto, mut peer) = client_relaying_stream_1().await;
    feed(&mut st, &mut proto, &wire::frame(kind::DATA, 0, 1, b"answer"));
    assert_eq!(readable_now(&mut peer), (b"answer".to_vec(), false));
    feed(&mut st, &mut proto, &wire::frame(kind::DATA, flag::END_STREAM, 1, b""));
    assert_eq!(readable_now(&mut peer), (Vec::new(), true));
    // The relay, when it gets there, does not send a second one (it is told the FIN is sent).
    let s = st.streams.get(&1).expect("stream 1");
    assert!(s.app_fin, "the FIN is recorded as sent");
}

#[tokio::test]
async fn data_the_app_did_not_take_holds_the_fin_until_it_is_written() {
    let (mut st, mut proto, mut peer) = client_relaying_stream_1().await;
    st.streams.get_mut(&1).expect("stream 1").queue.push_back(bytes::Bytes::from_static(b"earlier "));
    st.streams.get_mut(&1).expect("stream 1").queued = 8;
    feed(&mut st, &mut proto, &wire::frame(kind::DATA, flag::END_STREAM, 1, b"answer"));
    // Behind queued bytes the driver writes nothing: order first, the relay ends it.
    assert_eq!(readable_now(&mut peer), (Vec::new(), false));
    assert!(!st.streams.get(&1).expect("stream 1").app_fin);
}

/// An app that answers each connection with `answer` and closes at once.
async fn app_answering_and_closing(answer: &'static [u8]) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(answer).await;
            let _ = s.shutdown().await;
            // Held open for reading until the test ends; its FIN is out.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                drop(s);
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_apps_answer_and_fin_that_arrive_together_leave_in_one_data_frame_with_end_stream() {
    let ca = FakeCa::generate();
    let app = app_answering_and_closing(b"answer").await;
    let cfg = crate::server::ServerConfig::new(settings());
    let server = RelayServer::start_with(&ca, cfg, TestBudget::unlimited(settings()), app).await;
    let identity = ambit_identity::Identity::new("cluster.local", "default", "client");
    let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("issue");
    let mut peer = RawPeer::connect(&cert, server.addr, &server.identity).await.expect("tls");
    let mut hello = wire::client_preface();
    hello.extend(wire::frame(kind::HEADERS, flag::END_HEADERS, 1, &wire::connect_block("10.0.0.2:8080")));
    let hello = peer.data(&hello);
    let ended =
        peer.send_reading(&hello, Duration::from_secs(10), |s| s.data.iter().any(|d| d.0 == 1 && d.2)).await;
    assert!(ended, "stream 1 ended; seen {:?}", peer.seen.data);
    assert_eq!(peer.seen.data, vec![(1, 6, true)], "one DATA frame: the answer, ending the stream");
}

#[tokio::test]
async fn an_answer_that_came_before_the_relay_began_leaves_with_its_fin_in_the_relays_first_write() {
    let ca = std::sync::Arc::new(FakeCa::generate());
    // A server that answers at once: 200, the answer and END_STREAM before the client relays
    // (with the client's first bytes sent along with its CONNECT, answers come back that fast).
    let addr = super::stream_io_tests::server(&ca, settings(), |req: crate::ConnectRequest| async move {
        if req.stream.respond(200, &HeaderMap::new(), false).is_ok()
            && req.stream.send(b"answer").await.is_ok()
        {
            let _ = req.stream.finish();
            let _ = std::future::poll_fn(|cx| req.stream.poll_gone(cx)).await;
        }
    })
    .await;
    let (pool, key) = crate::testing::pool_to(ca, addr, &crate::testing::server_identity(), settings());
    let authority = "10.0.0.2:8080".parse().expect("addr");
    let tunnel = pool.connect(&key, authority, &HeaderMap::new()).await.expect("connect");
    let handle = tunnel.stream;
    // The answer and its END_STREAM are queued on the stream, no app attached yet.
    let queued = async {
        loop {
            {
                let st = handle.shared.lock();
                let s = st.streams.get(&1).expect("stream 1");
                if s.recv_done && s.queued == 6 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), queued).await.expect("the answer queued");
    // The app, attached as the relay attaches it.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let app = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (mut peer, _) = l.accept().expect("accept");
    peer.set_nonblocking(true).expect("non-blocking");
    app.set_nonblocking(true).expect("non-blocking");
    let app = Arc::new(TcpStream::from_std(app).expect("tokio socket"));
    app.writable().await.expect("writable");
    handle.shared.lock().streams.get_mut(&1).expect("stream 1").app = Some(app.clone());
    // The relay's first write: the answer, and the FIN with it, not a call later.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let r = handle.poll_to_app(&app, &mut cx);
    assert!(matches!(r, std::task::Poll::Ready(Ok(false))), "the FIN is not left to the caller: {r:?}");
    assert_eq!(readable_now(&mut peer), (b"answer".to_vec(), true));
}
