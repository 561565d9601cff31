//! The ADS stream on the client side, with the response messages read without tonic's decode
//! buffer.
//!
//! tonic's `Streaming` copies each message into one buffer, reserved to the message's length,
//! which keeps that capacity for the stream's life. After a 100 000-workload initial sync
//! (one ~38 MB Address response) that was 37.6 MiB resident on every node until the stream
//! ended (its own mapping in `/proc/<pid>/smaps`; BENCHMARKS.md). Here a message's bytes stay
//! the HTTP/2 DATA chunks they arrived in, prost decodes across them, and they are freed once
//! the message is decoded. The rest is tonic's: the channel (TLS, HTTP/2), `Status` from
//! headers, trailers and transport errors, the same codes and messages for the same cases.
//!
//! Hand-written protocol code (ARCHITECTURE.md): gRPC's message framing, a 5-byte prefix (a
//! compression flag and a big-endian length) before each message.

use std::collections::VecDeque;

use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::client::GrpcService;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The ADS method's path.
const PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// A gRPC message's prefix: the compression flag and the length.
const PREFIX: usize = 5;

/// Opens the stream: `requests` go out as they come, the answer's headers are checked.
pub(super) async fn open(
    mut channel: Channel,
    requests: mpsc::Receiver<DeltaDiscoveryRequest>,
    metadata: MetadataMap,
    limit: usize,
) -> Result<Responses, Status> {
    let frames = ReceiverStream::new(requests).map(|r| Ok::<_, Status>(Frame::data(encode(&r))));
    let mut request = http::Request::new(Body::new(StreamBody::new(frames)));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static(PATH);
    *request.headers_mut() = metadata.into_headers();
    let headers = request.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    std::future::poll_fn(|cx| GrpcService::poll_ready(&mut channel, cx)).await.map_err(transport)?;
    let response = GrpcService::call(&mut channel, request).await.map_err(transport)?;
    let (head, body) = response.into_parts();
    // A status in the headers is a trailers-only answer: the stream ends there.
    let ended = match Status::from_header_map(&head.headers) {
        Some(status) if status.code() != Code::Ok => return Err(status),
        Some(_) => true,
        None if head.status != StatusCode::OK => return Err(missing_status(head.status)),
        None => false,
    };
    Ok(Responses { body, parts: VecDeque::new(), buffered: 0, next: None, limit, ended })
}

/// The server's responses.
pub(super) struct Responses {
    body: Body,
    /// Received bytes not yet decoded, as they arrived.
    parts: VecDeque<Bytes>,
    buffered: usize,
    /// The length of the message being received, once its prefix is in.
    next: Option<usize>,
    limit: usize,
    ended: bool,
}

impl Responses {
    /// The next response; `Ok(None)` when the server ended the stream with an OK status.
    /// Cancel-safe: what arrived stays buffered.
    pub(super) async fn message(&mut self) -> Result<Option<DeltaDiscoveryResponse>, Status> {
        loop {
            if let Some(message) = self.decode()? {
                return Ok(Some(message));
            }
            if self.ended {
                return if self.buffered > 0 {
                    Err(Status::internal("Unexpected EOF decoding stream."))
                } else {
                    Ok(None)
                };
            }
            match self.body.frame().await {
                None => return Err(missing_status(StatusCode::OK)),
                Some(Err(e)) => return Err(Status::from_error(e.into())),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => {
                        self.buffered += data.len();
                        self.parts.push_back(data);
                    }
                    Err(frame) => {
                        let trailers = frame.into_trailers().unwrap_or_default();
                        match Status::from_header_map(&trailers) {
                            Some(status) if status.code() == Code::Ok => self.ended = true,
                            Some(status) => return Err(status),
                            None => return Err(missing_status(StatusCode::OK)),
                        }
                    }
                },
            }
        }
    }

    /// Decodes the next message if all of it is in.
    fn decode(&mut self) -> Result<Option<DeltaDiscoveryResponse>, Status> {
        let len = match self.next {
            Some(len) => len,
            None if self.buffered < PREFIX => return Ok(None),
            None => {
                let mut prefix = Take { parts: &mut self.parts, left: PREFIX };
                let compressed = prefix.get_u8();
                let len = prefix.get_u32() as usize;
                self.buffered -= PREFIX;
                if compressed != 0 {
                    return Err(Status::internal(format!(
                        "protocol error: received message with invalid compression flag: {compressed} \
                         (no compression was asked for)"
                    )));
                }
                if len > self.limit {
                    return Err(Status::out_of_range(format!(
                        "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                        self.limit
                    )));
                }
                self.next = Some(len);
                len
            }
        };
        if self.buffered < len {
            return Ok(None);
        }
        self.next = None;
        self.buffered -= len;
        let mut body = Take { parts: &mut self.parts, left: len };
        let message = DeltaDiscoveryResponse::decode(&mut body).map_err(|e| Status::internal(e.to_string()));
        // A message prost stopped in the middle of leaves nothing of itself behind.
        body.advance(body.left);
        message.map(Some)
    }
}

/// The first `left` bytes of `parts`, consumed as read.
struct Take<'a> {
    parts: &'a mut VecDeque<Bytes>,
    left: usize,
}

impl Buf for Take<'_> {
    fn remaining(&self) -> usize {
        self.left
    }

    fn chunk(&self) -> &[u8] {
        match self.parts.front() {
            Some(front) => &front[..front.len().min(self.left)],
            None => &[],
        }
    }

    fn advance(&mut self, mut n: usize) {
        n = n.min(self.left);
        self.left -= n;
        while n > 0 {
            let Some(front) = self.parts.front_mut() else { return };
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.parts.pop_front();
        }
        while self.parts.front().is_some_and(Bytes::is_empty) {
            self.parts.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        // Within one chunk, share it rather than copy.
        match self.parts.front_mut() {
            Some(front) if front.len() >= len && self.left >= len => {
                let out = front.split_to(len);
                self.left -= len;
                if front.is_empty() {
                    self.parts.pop_front();
                }
                out
            }
            _ => {
                let mut out = BytesMut::with_capacity(len);
                out.put((&mut *self).take(len));
                out.freeze()
            }
        }
    }
}

/// One request with its prefix.
fn encode(request: &DeltaDiscoveryRequest) -> Bytes {
    let len = request.encoded_len();
    let mut out = BytesMut::with_capacity(PREFIX + len);
    out.put_u8(0);
    out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    request.encode_raw(&mut out);
    out.freeze()
}

/// A transport error as tonic's client reports it.
fn transport(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Status {
    Status::from_error(e.into())
}

/// The status of a stream that ended without one, as tonic infers it from the HTTP status.
fn missing_status(http: StatusCode) -> Status {
    let code = match http {
        StatusCode::OK => {
            return Status::unknown(
                "protocol error: missing grpc-status trailer, stream was terminated without a final status",
            );
        }
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("grpc-status header missing, mapped from HTTP status code {}", http.as_u16()))
}

#[cfg(test)]
mod tests;
