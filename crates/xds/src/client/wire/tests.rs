use std::collections::VecDeque;

use ambit_api::xds::{DeltaDiscoveryResponse, Resource};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::StreamBody;
use hyper::body::Frame;
use prost::Message;
use tonic::body::Body;
use tonic::{Code, Status};

use super::{PREFIX, Responses, Take};

fn response(nonce: &str, payload: usize) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        nonce: nonce.into(),
        type_url: "t".into(),
        resources: vec![Resource {
            name: "r".into(),
            version: "1".into(),
            resource: Some(prost_types::Any { type_url: "t".into(), value: vec![7; payload] }),
            ..Resource::default()
        }],
        ..DeltaDiscoveryResponse::default()
    }
}

/// A result with its status as (code, message), which compare.
fn got(
    r: Result<Option<DeltaDiscoveryResponse>, Status>,
) -> Result<Option<DeltaDiscoveryResponse>, (Code, String)> {
    r.map_err(|e| (e.code(), e.message().to_owned()))
}

/// `message` with its gRPC prefix.
fn framed(message: &DeltaDiscoveryResponse) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_u8(0);
    out.put_u32(message.encoded_len() as u32);
    message.encode(&mut out).expect("encode");
    out.to_vec()
}

fn trailers(status: Code, message: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    Status::new(status, message).add_header(&mut headers).expect("status headers");
    headers
}

/// Responses reading `chunks` as DATA frames, then `end` as trailers (none: the body just ends).
fn responses(chunks: Vec<Vec<u8>>, end: Option<HeaderMap>, limit: usize) -> Responses {
    let mut frames: Vec<Result<Frame<Bytes>, Status>> =
        chunks.into_iter().map(|c| Ok(Frame::data(Bytes::from(c)))).collect();
    frames.extend(end.map(|t| Ok(Frame::trailers(t))));
    let body = Body::new(StreamBody::new(tokio_stream::iter(frames)));
    Responses { body, parts: VecDeque::new(), buffered: 0, next: None, limit, ended: false }
}

#[tokio::test]
async fn messages_cut_anywhere_are_decoded_and_nothing_stays_buffered() {
    let (a, b) = (response("a", 300), response("b", 5));
    let mut wire = framed(&a);
    wire.extend(framed(&b));
    // Every cut: the prefix, the body and the boundary between the two messages split across
    // frames of every size from 1 byte up.
    for size in [1, 2, 3, 4, 5, 6, 7, 64, 301, wire.len()] {
        let chunks = wire.chunks(size).map(<[u8]>::to_vec).collect();
        let mut r = responses(chunks, Some(trailers(Code::Ok, "")), 1 << 20);
        assert_eq!(got(r.message().await), Ok(Some(a.clone())), "frames of {size}");
        assert_eq!(got(r.message().await), Ok(Some(b.clone())), "frames of {size}");
        assert_eq!(got(r.message().await), Ok(None), "frames of {size}");
        assert!(r.parts.is_empty() && r.buffered == 0, "frames of {size}: {} bytes kept", r.buffered);
    }
}

#[tokio::test]
async fn a_large_message_leaves_no_buffer_behind() {
    let big = response("big", 4 << 20);
    let chunks = framed(&big).chunks(16 * 1024).map(<[u8]>::to_vec).collect();
    let mut r = responses(chunks, Some(trailers(Code::Ok, "")), 8 << 20);
    assert_eq!(got(r.message().await), Ok(Some(big)));
    assert_eq!((r.parts.len(), r.parts.capacity() < 1024, r.buffered), (0, true, 0));
}

#[tokio::test]
async fn a_message_over_the_limit_is_refused_before_it_is_read() {
    let chunks = vec![framed(&response("big", 4096))];
    let mut r = responses(chunks, None, 1024);
    let e = r.message().await.expect_err("over the limit");
    assert_eq!(e.code(), Code::OutOfRange);
    assert!(e.message().starts_with("Error, decoded message length too large: found 4"), "{}", e.message());
    assert!(e.message().ends_with("bytes, the limit is: 1024 bytes"), "{}", e.message());
}

#[tokio::test]
async fn how_a_stream_ends_is_its_status() {
    // An error status in the trailers.
    let mut r = responses(vec![], Some(trailers(Code::Unavailable, "transport is closing")), 1024);
    assert_eq!(got(r.message().await), Err((Code::Unavailable, "transport is closing".to_owned())));
    // No trailers at all: a truncated stream.
    let mut r = responses(vec![], None, 1024);
    let e = r.message().await.expect_err("no status");
    assert_eq!(e.code(), Code::Unknown);
    assert!(e.message().starts_with("protocol error: missing grpc-status trailer"), "{}", e.message());
    // OK, but in the middle of a message.
    let half = framed(&response("a", 100))[..50].to_vec();
    let mut r = responses(vec![half], Some(trailers(Code::Ok, "")), 1024);
    assert_eq!(got(r.message().await), Err((Code::Internal, "Unexpected EOF decoding stream.".to_owned())));
    // A compressed message (never asked for).
    let mut compressed = framed(&response("a", 10));
    compressed[0] = 1;
    let mut r = responses(vec![compressed], Some(trailers(Code::Ok, "")), 1024);
    let e = r.message().await.expect_err("compressed");
    assert_eq!(e.code(), Code::Internal);
    assert!(e.message().contains("invalid compression flag: 1"), "{}", e.message());
    // Bytes that are not the message: prost's error, and nothing of it is left for the next.
    let mut garbage = vec![0, 0, 0, 0, 3, 0xff, 0xff, 0xff];
    garbage.extend(framed(&response("b", 1)));
    let mut r = responses(vec![garbage], Some(trailers(Code::Ok, "")), 1024);
    assert_eq!(r.message().await.map_err(|e| e.code()), Err(Code::Internal));
    assert_eq!(got(r.message().await), Ok(Some(response("b", 1))));
}

#[test]
fn take_reads_across_chunks_and_shares_within_one() {
    let mut parts: VecDeque<Bytes> = [&b"ab"[..], b"cde", b"f"].into_iter().map(Bytes::from_static).collect();
    let mut t = Take { parts: &mut parts, left: PREFIX };
    assert_eq!(t.chunk(), b"ab");
    assert_eq!(t.copy_to_bytes(1), Bytes::from_static(b"a"));
    assert_eq!(t.copy_to_bytes(3), Bytes::from_static(b"bcd"));
    assert_eq!(t.remaining(), 1);
    assert_eq!(t.chunk(), b"e");
    t.advance(1);
    assert_eq!(t.remaining(), 0);
    assert_eq!(parts, [Bytes::from_static(b"f")]);
}
