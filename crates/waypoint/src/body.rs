//! An endpoint's response body on its way downstream: it keeps the endpoint's count of requests
//! in flight (least-request balancing) until it ends, and fails once the request's total timeout
//! runs out, so `request_timeout_ms` bounds the whole response as Envoy's route timeout does,
//! not only its head.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
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

/// A gRPC response whose status comes in its trailers: `istio_requests_total` is counted when
/// the body ends (or is dropped, when the client went away), with the trailers' `grpc-status`,
/// as Envoy's Istio stats count a stream at its end.
pub(crate) struct CountAtEnd {
    inner: crate::upstream::Body,
    pending: Option<(Arc<crate::server::Shared>, crate::metrics::RequestLabels)>,
    started: Instant,
}

impl CountAtEnd {
    pub(crate) fn new(
        inner: crate::upstream::Body,
        shared: Arc<crate::server::Shared>,
        labels: crate::metrics::RequestLabels,
        started: Instant,
    ) -> CountAtEnd {
        CountAtEnd { inner, pending: Some((shared, labels)), started }
    }

    fn count(&mut self) {
        if let Some((shared, labels)) = self.pending.take() {
            shared.counters.request(&labels, self.started.elapsed());
        }
    }
}

impl Drop for CountAtEnd {
    fn drop(&mut self) {
        self.count();
    }
}

impl hyper::body::Body for CountAtEnd {
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
                if let Some(status) = frame.trailers_ref().and_then(|t| t.get("grpc-status"))
                    && let Some((_, labels)) = &mut this.pending
                {
                    labels.grpc_response_status =
                        crate::metrics::Label(String::from_utf8_lossy(status.as_bytes()).into_owned());
                    this.count();
                }
            }
            Poll::Ready(_) => this.count(),
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
