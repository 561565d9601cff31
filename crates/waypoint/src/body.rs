//! An endpoint's response body on its way downstream: it keeps the endpoint's count of requests
//! in flight (least-request balancing) until it ends, and fails once the request's total timeout
//! runs out, so `request_timeout_ms` bounds the whole response as Envoy's route timeout does,
//! not only its head.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::config::Endpoint;
use crate::upstream::BoxError;

/// A request in flight to an endpoint, for as long as it lives.
pub(crate) struct Active(Arc<Endpoint>);

impl Active {
    pub(crate) fn new(endpoint: Arc<Endpoint>) -> Active {
        endpoint.active.fetch_add(1, Ordering::Relaxed);
        Active(endpoint)
    }
}

impl Active {
    /// The endpoint.
    pub(crate) fn endpoint(&self) -> &Arc<Endpoint> {
        &self.0
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The response body of an endpoint, with its in-flight count and the request's deadline.
pub(crate) struct UpstreamBody {
    inner: Incoming,
    active: Option<Active>,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl UpstreamBody {
    pub(crate) fn new(inner: Incoming, active: Active, deadline: Option<Instant>) -> UpstreamBody {
        UpstreamBody {
            inner,
            active: Some(active),
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
        }
    }
}

impl hyper::body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.active = None;
            this.deadline = None;
            return Poll::Ready(Some(Err(
                "upstream request timeout: the response did not complete in time".into()
            )));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.active = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.active = None;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Sizes as Istio's stats count them: header bytes (every name and value, pseudo-headers
/// included, as Envoy's header map sizes them) plus body bytes, trailers included.
pub(crate) fn header_bytes(headers: &http::HeaderMap) -> u64 {
    headers.iter().map(|(n, v)| (n.as_str().len() + v.len()) as u64).sum()
}

/// A request body that counts the bytes read from downstream into a shared counter.
pub(crate) struct Counting<B> {
    inner: B,
    read: Arc<AtomicU64>,
}

impl<B> Counting<B> {
    pub(crate) fn new(inner: B, read: Arc<AtomicU64>) -> Counting<B> {
        Counting { inner, read }
    }
}

impl<B: hyper::body::Body<Data = Bytes> + Unpin> hyper::body::Body for Counting<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            let n = match (frame.data_ref(), frame.trailers_ref()) {
                (Some(data), _) => data.len() as u64,
                (None, Some(trailers)) => header_bytes(trailers),
                (None, None) => 0,
            };
            this.read.fetch_add(n, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What one request's telemetry needs once its answer ends.
pub(crate) struct Pending {
    pub(crate) shared: Arc<crate::server::Shared>,
    pub(crate) downstream: Arc<crate::proxy::Downstream>,
    /// Everything of its labels but the downstream's.
    pub(crate) outcome: crate::series::Outcome,
    pub(crate) started: Instant,
    /// The request's head, in bytes.
    pub(crate) request_head: u64,
    /// The request's body and trailers read so far, in bytes.
    pub(crate) request_body: Arc<AtomicU64>,
    /// `grpc-status` is still to come, in the trailers.
    pub(crate) grpc_status_pending: bool,
}

/// An answer on its way downstream: `istio_requests_total`, the duration and both sizes are
/// recorded when its body ends (or is dropped, when the client went away), as Envoy's Istio stats
/// record a stream at its end; a gRPC answer's status is read from its trailers.
pub(crate) struct Telemetry {
    inner: crate::upstream::Body,
    pending: Option<Pending>,
    sent: u64,
}

impl Telemetry {
    /// `response_head`: the answer's head, in bytes.
    pub(crate) fn new(inner: crate::upstream::Body, pending: Pending, response_head: u64) -> Telemetry {
        Telemetry { inner, pending: Some(pending), sent: response_head }
    }

    fn record(&mut self) {
        if let Some(p) = self.pending.take() {
            let request = p.request_head + p.request_body.load(Ordering::Relaxed);
            p.downstream.series(&p.shared, &p.outcome).record(p.started.elapsed(), request, self.sent);
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.record();
    }
}

impl hyper::body::Body for Telemetry {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.sent += data.len() as u64;
                }
                if let Some(trailers) = frame.trailers_ref() {
                    this.sent += header_bytes(trailers);
                    if let Some(p) = &mut this.pending
                        && p.grpc_status_pending
                        && let Some(status) = trailers.get("grpc-status")
                    {
                        p.outcome.grpc_status = Some(String::from_utf8_lossy(status.as_bytes()).into_owned());
                    }
                }
                if this.inner.is_end_stream() {
                    this.record();
                }
            }
            Poll::Ready(_) => this.record(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
