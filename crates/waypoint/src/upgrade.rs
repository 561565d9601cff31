//! HTTP/1.1 upgrades (WebSocket, and any other `Upgrade` protocol) through the waypoint, which
//! Istio enables on its routes: the request keeps its `Connection: upgrade` and `Upgrade` on the
//! way to the endpoint (always over HTTP/1.1), and when the endpoint answers 101 the two
//! connections are joined and bytes flow both ways until either side ends.

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// An upgrade the client asked for.
pub(crate) struct Upgrade {
    protocol: HeaderValue,
    downstream: OnUpgrade,
}

impl Upgrade {
    /// The upgrade `req` asks for (HTTP/1.1, `Connection` naming `upgrade`, an `Upgrade`), if any.
    pub(crate) fn requested(req: &mut Request<Incoming>) -> Option<Upgrade> {
        if req.version() != Version::HTTP_11 {
            return None;
        }
        let asks = req
            .headers()
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
        let protocol = req.headers().get(UPGRADE)?.clone();
        asks.then(|| Upgrade { protocol, downstream: hyper::upgrade::on(req) })
    }

    /// Puts the upgrade request back on headers that lost their hop-by-hop fields.
    pub(crate) fn restore(&self, headers: &mut HeaderMap) {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, self.protocol.clone());
    }

    /// When `resp` switches protocols: joins the two connections once both are handed over, and
    /// returns the headers the downstream 101 needs.
    pub(crate) fn splice(self, resp: &mut Response<Incoming>) -> Option<HeaderMap> {
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return None;
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, resp.headers().get(UPGRADE).cloned().unwrap_or(self.protocol));
        let upstream = hyper::upgrade::on(resp);
        let downstream = self.downstream;
        tokio::spawn(async move {
            let (up, down) = tokio::join!(upstream, downstream);
            let (Ok(up), Ok(down)) = (up, down) else {
                tracing::debug!("an upgrade did not complete on both sides");
                return;
            };
            let (mut up, mut down) = (TokioIo::new(up), TokioIo::new(down));
            if let Err(e) = tokio::io::copy_bidirectional(&mut down, &mut up).await {
                tracing::debug!(error = %e, "upgraded connection ended");
            }
        });
        Some(headers)
    }
}
