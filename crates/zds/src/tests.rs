//! Unit tests of the codec (no sockets; see `tests/` for the transport).

#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

use ambit_api::workload::zds as proto;
use proptest::prelude::*;
use prost::Message;

use super::*;

fn netns_fd() -> OwnedFd {
    File::open("/proc/self/ns/net").expect("/proc/self/ns/net is readable without privileges").into()
}

fn regular_fd() -> (tempfile::NamedTempFile, OwnedFd) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let fd = File::open(file.path()).expect("open temp file").into();
    (file, fd)
}

fn info() -> WorkloadInfo {
    WorkloadInfo { name: "n".into(), namespace: "ns".into(), service_account: "sa".into() }
}

fn raw_add(uid: &str, info: Option<proto::WorkloadInfo>) -> Vec<u8> {
    proto::WorkloadRequest {
        payload: Some(proto::workload_request::Payload::Add(proto::AddWorkload {
            uid: uid.into(),
            workload_info: info,
        })),
    }
    .encode_to_vec()
}

// Byte-for-byte examples of node-agent.md §3.2.
#[test]
fn encoders_match_golden_bytes() {
    assert_eq!(encode_hello(), [0x08, 0x01]);
    assert_eq!(encode_snapshot_sent(), [0x1a, 0x00]);
    assert_eq!(encode_ack(&Ack::Ok), [0x0a, 0x00]);
    assert_eq!(encode_ack(&Ack::nack("e")), [0x0a, 0x03, 0x0a, 0x01, 0x65]);
    assert_eq!(encode_del("u1").unwrap(), [0x12, 0x04, 0x12, 0x02, 0x75, 0x31]);
    assert_eq!(encode_keep("u1").unwrap(), [0x2a, 0x04, 0x0a, 0x02, 0x75, 0x31]);
    assert_eq!(
        encode_add("u1", &info()).unwrap(),
        [
            0x0a, 0x11, 0x0a, 0x02, 0x75, 0x31, 0x12, 0x0b, 0x0a, 0x01, 0x6e, 0x12, 0x02, 0x6e, 0x73, 0x1a,
            0x02, 0x73, 0x61
        ]
    );
}

#[test]
fn decodes_every_request_kind() {
    let add = decode_request(&encode_add("u1", &info()).unwrap(), vec![netns_fd()]).unwrap();
    let Request::Add { uid, info: got, netns } = add else {
        panic!("expected Add, got {add:?}");
    };
    assert_eq!((uid.as_str(), &got), ("u1", &info()));
    assert!(ambit_netns::is_netns(netns.as_fd()));
    assert!(netns.is_own());
    assert!(matches!(
        decode_request(&encode_keep("k").unwrap(), vec![]),
        Ok(Request::Keep { uid }) if uid == "k"
    ));
    assert!(matches!(
        decode_request(&encode_del("d").unwrap(), vec![]),
        Ok(Request::Del { uid }) if uid == "d"
    ));
    assert!(matches!(decode_request(&encode_snapshot_sent(), vec![]), Ok(Request::SnapshotSent)));
    assert_eq!(decode_response(&[0x0a, 0x00], vec![]).unwrap(), Ack::Ok);
    assert_eq!(decode_response(&[0x0a, 0x03, 0x0a, 0x01, 0x65], vec![]).unwrap(), Ack::nack("e"));
    assert_eq!(decode_hello(&[0x08, 0x01], vec![]).unwrap(), 1);
    assert_eq!(decode_hello(&[], vec![]).unwrap(), 0);
}

#[test]
fn rejects_invalid_requests() {
    let add = encode_add("u1", &info()).unwrap();
    let err = decode_request(&add, vec![]).unwrap_err();
    assert!(matches!(err, ProtocolError::AddWithoutFd), "{err}");

    let err = decode_request(&add, vec![netns_fd(), netns_fd()]).unwrap_err();
    assert!(matches!(err, ProtocolError::TooManyFds(2)), "{err}");

    let err = decode_request(&raw_add("u1", None), vec![netns_fd()]).unwrap_err();
    assert!(matches!(&err, ProtocolError::AddWithoutWorkloadInfo { uid } if uid == "u1"));
    assert!(err.is_fatal());

    let (_file, fd) = regular_fd();
    let err = decode_request(&add, vec![fd]).unwrap_err();
    assert!(matches!(&err, ProtocolError::NotANetns { uid, .. } if uid == "u1"), "{err}");
    assert!(!err.is_fatal());

    let err = decode_request(&encode_keep("k").unwrap(), vec![netns_fd()]).unwrap_err();
    assert!(matches!(err, ProtocolError::UnexpectedFd), "{err}");

    let err = decode_request(&[0xff, 0xff, 0xff], vec![]).unwrap_err();
    assert!(matches!(err, ProtocolError::Decode(_)), "{err}");

    // An empty record and an unknown oneof field (number 4, unused) both lack a payload.
    for bytes in [&[][..], &[0x22, 0x00][..]] {
        let err = decode_request(bytes, vec![]).unwrap_err();
        assert!(matches!(err, ProtocolError::EmptyPayload), "{err}");
    }

    let err =
        decode_request(&raw_add("", Some(proto::WorkloadInfo::default())), vec![netns_fd()]).unwrap_err();
    assert!(matches!(err, ProtocolError::EmptyUid), "{err}");
    let keep = proto::WorkloadRequest {
        payload: Some(proto::workload_request::Payload::Keep(proto::KeepWorkload::default())),
    };
    let err = decode_request(&keep.encode_to_vec(), vec![]).unwrap_err();
    assert!(matches!(err, ProtocolError::EmptyUid), "{err}");
}

#[test]
fn ack_converts_from_results_and_back() {
    assert_eq!(Ack::from(Ok(())), Ack::Ok);
    assert_eq!(Ack::from(Err("no room".to_owned())), Ack::nack("no room"));
    assert_eq!(Ack::nack("no room").into_result(), Err("no room".to_owned()));
    assert_eq!(Ack::Ok.reason(), None);
    assert_eq!(Ack::nack("no room").to_string(), "NACK: no room");
    assert!(Ack::Ok.is_ok() && !Ack::nack("x").is_ok());
}

#[test]
fn rejects_invalid_responses() {
    let err = decode_response(&[0x0a, 0x00], vec![netns_fd()]).unwrap_err();
    assert!(matches!(err, ProtocolError::UnexpectedFd), "{err}");
    let err = decode_response(&[], vec![]).unwrap_err();
    assert!(matches!(err, ProtocolError::EmptyPayload), "{err}");
    let err = decode_hello(&[0x08, 0x01], vec![netns_fd()]).unwrap_err();
    assert!(matches!(err, ProtocolError::UnexpectedFd), "{err}");
}

#[test]
fn oversized_messages_are_refused_before_sending() {
    let long = "x".repeat(MAX_MESSAGE);
    assert!(matches!(encode_keep(&long), Err(ProtocolError::TooLarge(n)) if n > MAX_MESSAGE));
    assert!(matches!(encode_del(&long), Err(ProtocolError::TooLarge(_))));
    let big = WorkloadInfo { name: long, ..info() };
    assert!(matches!(encode_add("u1", &big), Err(ProtocolError::TooLarge(_))));
    assert!(matches!(encode_add("", &info()), Err(ProtocolError::EmptyUid)));
    // The limit is inclusive: a message of exactly MAX_MESSAGE bytes is fine (3 bytes of
    // envelope: tag, two-byte length; then tag, two-byte length).
    let exact = "y".repeat(MAX_MESSAGE - 6);
    assert_eq!(encode_keep(&exact).unwrap().len(), MAX_MESSAGE);
}

#[test]
fn ack_errors_are_cut_to_fit_and_never_empty() {
    let long = "é".repeat(MAX_MESSAGE);
    let bytes = encode_ack(&Ack::Nack { reason: long });
    assert!(bytes.len() <= MAX_MESSAGE, "{} bytes", bytes.len());
    let Ack::Nack { reason } = decode_response(&bytes, vec![]).unwrap() else {
        panic!("a NACK must stay a NACK");
    };
    assert!(reason.chars().all(|c| c == 'é') && reason.len() > MAX_MESSAGE - 16);
    let empty = decode_response(&encode_ack(&Ack::Nack { reason: String::new() }), vec![]).unwrap();
    assert_eq!(empty, Ack::nack("unspecified error"));
}

fn arb_info() -> impl Strategy<Value = WorkloadInfo> {
    (".{0,40}", ".{0,40}", ".{0,40}").prop_map(|(name, namespace, service_account)| WorkloadInfo {
        name,
        namespace,
        service_account,
    })
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..=MAX_MESSAGE),
        with_fd in any::<bool>(),
    ) {
        let fds = || if with_fd { vec![netns_fd()] } else { vec![] };
        let _ = decode_request(&bytes, fds());
        let _ = decode_response(&bytes, fds());
        let _ = decode_hello(&bytes, fds());
    }

    #[test]
    fn add_round_trips(uid in ".{1,60}", info in arb_info()) {
        let bytes = encode_add(&uid, &info).unwrap();
        prop_assert!(bytes.len() <= MAX_MESSAGE);
        match decode_request(&bytes, vec![netns_fd()]) {
            Ok(Request::Add { uid: got_uid, info: got_info, .. }) => {
                prop_assert_eq!(got_uid, uid);
                prop_assert_eq!(got_info, info);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn ack_round_trips(error in ".{0,200}") {
        let ack = if error.is_empty() { Ack::Ok } else { Ack::Nack { reason: error } };
        prop_assert_eq!(decode_response(&encode_ack(&ack), vec![]).unwrap(), ack);
    }
}
