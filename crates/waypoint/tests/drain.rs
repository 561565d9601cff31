//! The waypoint's drain as its clients see it: a request already on its way when the drain
//! begins is answered (with `Connection: close`), an idle HTTP/1.1 connection is closed after the
//! grace, and HTTP/2 gets GOAWAY at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ambit_api::waypoint as api;
use ambit_identity::FakeCa;
use ambit_waypoint::testing::{Harness, endpoint, service, text};
use http::StatusCode;

mod common;
use common::*;

/// How long the drain waits for requests on HTTP/1.1 connections in these tests.
const GRACE: Duration = Duration::from_millis(800);

async fn harness() -> (Harness, Vec<ambit_waypoint::testing::Backend>, ambit_waypoint::testing::NodeProxy) {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let mut settings = Harness::settings();
    settings.limits.drain_grace = GRACE;
    // Longer than the grace: hyper's head timeout also ends an idle keep-alive connection.
    settings.limits.header_read_timeout = Duration::from_secs(5);
    let h = Harness::start(ca, settings, node.addr).await;
    let svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    let errors = h.configure(&[named("app-ns/svc", svc)], &[]);
    assert!(errors.is_empty(), "{errors:?}");
    (h, backends, node)
}

/// Sends `GET /` and returns the status, the `Connection` header and the body.
async fn answer(
    c: &mut hyper::client::conn::http1::SendRequest<ambit_waypoint::Body>,
) -> Result<(StatusCode, String, String), String> {
    c.ready().await.map_err(|e| format!("not ready: {e}"))?;
    let resp = tokio::time::timeout(T, c.send_request(get("/")))
        .await
        .map_err(|_| "no answer in time".to_owned())?
        .map_err(|e| e.to_string())?;
    let connection = resp.headers().get("connection").map(|v| v.to_str().unwrap_or("?").to_owned());
    let (status, body) = text(resp).await;
    Ok((status, connection.unwrap_or_default(), body))
}

#[tokio::test]
async fn requests_on_their_way_as_the_drain_begins_are_answered_and_told_to_close() {
    let (h, backends, _node) = harness().await;
    let vip = sock("10.0.0.10:80");
    // A new connection whose first request is not sent yet, and a keep-alive one, idle after
    // one answer.
    let mut fresh = h.http1(vip).await;
    let mut kept = h.http1(vip).await;
    assert_eq!(answer(&mut kept).await, Ok((StatusCode::OK, String::new(), "a".to_owned())));
    h.drain.begin();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Both requests arrive after the drain began: answered, each with `Connection: close`.
    assert_eq!(answer(&mut fresh).await, Ok((StatusCode::OK, "close".to_owned(), "a".to_owned())));
    assert_eq!(answer(&mut kept).await, Ok((StatusCode::OK, "close".to_owned(), "a".to_owned())));
    assert_eq!(backends[0].requests(), 3);
    // The waypoint closed both after those answers.
    for c in [&mut fresh, &mut kept] {
        let closed = tokio::time::timeout(T, std::future::poll_fn(|cx| c.poll_ready(cx))).await;
        assert!(matches!(closed, Ok(Err(ref e)) if e.is_closed()), "{closed:?}");
    }
}

#[tokio::test]
async fn an_idle_http1_connection_is_closed_after_the_grace_and_http2_gets_goaway_at_once() {
    let (h, _backends, _node) = harness().await;
    let vip = sock("10.0.0.10:80");
    let mut idle = h.http1(vip).await;
    assert_eq!(answer(&mut idle).await, Ok((StatusCode::OK, String::new(), "a".to_owned())));
    let mut h2 = h.http2(vip).await;
    let first = h2.send_request(get("/")).await.expect("HTTP/2 answer");
    assert_eq!(text(first).await, (StatusCode::OK, "a".to_owned()));
    let began = Instant::now();
    h.drain.begin();
    // HTTP/2: the GOAWAY closes the connection for new requests well before the grace ends.
    tokio::time::timeout(GRACE / 2, async {
        while h2.ready().await.is_ok() && !h2.is_closed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the HTTP/2 connection was not told to go away before the HTTP/1.1 grace ended");
    // HTTP/1.1: still open for requests during the grace, closed by the waypoint once it ends.
    assert!(!idle.is_closed(), "the idle HTTP/1.1 connection was closed at once");
    tokio::time::timeout(T, async {
        while !idle.is_closed() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the idle HTTP/1.1 connection was not closed after the grace");
    let after = began.elapsed();
    assert!(
        after >= GRACE,
        "the idle connection was closed {after:?} after the drain began, before the grace"
    );
}
