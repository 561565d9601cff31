//! ZDS over real `SOCK_SEQPACKET` sockets: golden bytes, the full sequence, and bad input.

#![allow(clippy::unwrap_used)]

mod common;

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use ambit_netns::{NetnsId, is_netns};
use ambit_zds::{Ack, MAX_MESSAGE, ProtocolError, RecvError, Request, ZdsClient, ZdsListener};
use common::{Agent, info, netns_fd, raw_recv, regular_fd};
use tokio_seqpacket::{UnixSeqpacket, UnixSeqpacketListener};

const ADD_U1: [u8; 19] = [
    0x0a, 0x11, 0x0a, 0x02, 0x75, 0x31, 0x12, 0x0b, 0x0a, 0x01, 0x6e, 0x12, 0x02, 0x6e, 0x73, 0x1a, 0x02,
    0x73, 0x61,
];

/// Each server request, read raw on the other end, is the §3.2 example; acks flow back raw.
#[tokio::test]
async fn server_requests_have_golden_bytes() {
    let agent = Agent::new();
    let raw = UnixSeqpacket::connect(agent.path()).await.unwrap();
    let mut server = agent.listener.accept().await.unwrap();
    raw.send(&[0x08, 0x01]).await.unwrap();
    assert_eq!(server.recv_hello().await.unwrap(), 1);

    let netns = netns_fd();
    let peer = async {
        let mut seen = Vec::new();
        for ack in [&[0x0a, 0x00][..], &[0x0a, 0x03, 0x0a, 0x01, 0x65], &[0x0a, 0x00], &[0x0a, 0x00]] {
            seen.push(raw_recv(&raw).await);
            raw.send(ack).await.unwrap();
        }
        seen
    };
    let ops = async {
        [
            server.add("u1", &info("n"), netns.as_fd()).await.unwrap(),
            server.keep("u1").await.unwrap(),
            server.del("u1").await.unwrap(),
            server.snapshot_sent().await.unwrap(),
        ]
    };
    let (seen, acks) = tokio::join!(peer, ops);
    assert_eq!(
        seen,
        [
            (ADD_U1.to_vec(), 1),
            (vec![0x2a, 0x04, 0x0a, 0x02, 0x75, 0x31], 0),
            (vec![0x12, 0x04, 0x12, 0x02, 0x75, 0x31], 0),
            (vec![0x1a, 0x00], 0),
        ]
    );
    assert_eq!(acks, [Ack::Ok, Ack::nack("e"), Ack::Ok, Ack::Ok]);
}

/// The client's hello and acks, read raw by a bare listener, are the §3.2 examples.
#[tokio::test]
async fn client_messages_have_golden_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zds.sock");
    let mut listener = UnixSeqpacketListener::bind(&path).unwrap();
    let mut client = ZdsClient::connect(&path).await.unwrap();
    let raw = listener.accept().await.unwrap();
    assert_eq!(raw_recv(&raw).await, (vec![0x08, 0x01], 0));
    client.ack(Ack::Ok).await.unwrap();
    assert_eq!(raw_recv(&raw).await, (vec![0x0a, 0x00], 0));
    client.ack(Ack::nack("e")).await.unwrap();
    assert_eq!(raw_recv(&raw).await, (vec![0x0a, 0x03, 0x0a, 0x01, 0x65], 0));
}

/// hello → snapshot (add with fd, keep) → snapshot_sent → add/del, each acked.
#[tokio::test]
async fn full_sequence() {
    let agent = Agent::new();
    let (mut server, mut client) = agent.connect().await;
    let netns = netns_fd();
    let expected_id = NetnsId::of(netns.as_fd()).unwrap();

    let proxy = async {
        let mut log = Vec::new();
        while let Some(request) = client.recv().await.unwrap() {
            let line = match &request {
                Request::Add { uid, info, netns } => {
                    assert!(is_netns(netns.as_fd()));
                    assert_eq!(netns.id(), expected_id);
                    format!("add {uid} {}/{}/{}", info.namespace, info.name, info.service_account)
                }
                Request::Keep { uid } => format!("keep {uid}"),
                Request::Del { uid } => format!("del {uid}"),
                Request::SnapshotSent => "snapshot".to_owned(),
            };
            // NACK the second add to show the error text travels back.
            let result =
                if line.starts_with("add pod-b") { Ack::nack("listeners failed to bind") } else { Ack::Ok };
            client.ack(result).await.unwrap();
            log.push(line);
        }
        log
    };
    let agent_side = async {
        let mut acks = vec![
            server.add("pod-a", &info("a"), netns.as_fd()).await.unwrap(),
            server.keep("pod-k").await.unwrap(),
            server.snapshot_sent().await.unwrap(),
            server.add("pod-b", &info("b"), netns.as_fd()).await.unwrap(),
            server.del("pod-a").await.unwrap(),
        ];
        assert!(server.check_idle(Duration::from_millis(10)).await.unwrap());
        acks.push(server.del("pod-b").await.unwrap());
        drop(server);
        acks
    };
    let (log, acks) = tokio::join!(proxy, agent_side);
    assert_eq!(
        log,
        ["add pod-a ns/a/sa", "keep pod-k", "snapshot", "add pod-b ns/b/sa", "del pod-a", "del pod-b"]
    );
    assert_eq!(acks, [Ack::Ok, Ack::Ok, Ack::Ok, Ack::nack("listeners failed to bind"), Ack::Ok, Ack::Ok]);
}

/// Sends one raw record and returns what the client makes of it; the client then NACKs and the
/// server must read that NACK, proving the connection survives a bad record.
async fn client_verdict(
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<Option<Request>, RecvError> {
    let agent = Agent::new();
    let (mut server, mut client) = agent.connect().await;
    server.send_raw(bytes, fds).await.unwrap();
    let verdict = client.recv().await;
    if let Err(e) = &verdict {
        client.ack(Ack::nack(e)).await.unwrap();
        let nack = server.recv_ack().await.unwrap();
        assert_eq!(nack, Ack::nack(e));
    }
    verdict
}

fn protocol_error(verdict: Result<Option<Request>, RecvError>) -> ProtocolError {
    match verdict {
        Err(RecvError::Protocol(e)) => e,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[tokio::test]
async fn oversized_packet_is_truncated() {
    let bytes = vec![0u8; MAX_MESSAGE + 1];
    let netns = netns_fd();
    let err = protocol_error(client_verdict(&bytes, &[netns.as_fd()]).await);
    assert!(matches!(err, ProtocolError::Truncated), "{err}");
    assert!(!err.is_fatal());
}

#[tokio::test]
async fn add_without_fd() {
    let err = protocol_error(client_verdict(&ADD_U1, &[]).await);
    assert!(matches!(err, ProtocolError::AddWithoutFd), "{err}");
}

#[tokio::test]
async fn fd_on_keep() {
    let keep = ambit_zds::encode_keep("u1").unwrap();
    let netns = netns_fd();
    let err = protocol_error(client_verdict(&keep, &[netns.as_fd()]).await);
    assert!(matches!(err, ProtocolError::UnexpectedFd), "{err}");
}

#[tokio::test]
async fn two_fds() {
    let (a, b) = (netns_fd(), netns_fd());
    let err = protocol_error(client_verdict(&ADD_U1, &[a.as_fd(), b.as_fd()]).await);
    assert!(matches!(err, ProtocolError::TooManyFds(2)), "{err}");
}

#[tokio::test]
async fn many_fds_overflowing_the_control_buffer() {
    let fds: Vec<_> = (0..40).map(|_| netns_fd()).collect();
    let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
    let err = protocol_error(client_verdict(&ADD_U1, &borrowed).await);
    assert!(matches!(err, ProtocolError::ControlTruncated), "{err}");
}

#[tokio::test]
async fn garbage_bytes() {
    let err = protocol_error(client_verdict(&[0xff, 0xff, 0xff, 0xff], &[]).await);
    assert!(matches!(err, ProtocolError::Decode(_)), "{err}");
}

#[tokio::test]
async fn add_without_workload_info() {
    // AddWorkload{uid:"u1"} only.
    let bytes = [0x0a, 0x04, 0x0a, 0x02, 0x75, 0x31];
    let netns = netns_fd();
    let err = protocol_error(client_verdict(&bytes, &[netns.as_fd()]).await);
    assert!(matches!(&err, ProtocolError::AddWithoutWorkloadInfo { uid } if uid == "u1"), "{err}");
    assert!(err.is_fatal());
}

#[tokio::test]
async fn add_with_regular_file_fd() {
    let (_file, fd) = regular_fd();
    let err = protocol_error(client_verdict(&ADD_U1, &[fd.as_fd()]).await);
    assert!(matches!(&err, ProtocolError::NotANetns { uid, .. } if uid == "u1"), "{err}");
    assert!(!err.is_fatal());
}

#[tokio::test]
async fn eof_is_none() {
    let agent = Agent::new();
    let (server, mut client) = agent.connect().await;
    drop(server);
    assert!(client.recv().await.unwrap().is_none());
}

#[tokio::test]
async fn server_side_errors() {
    let agent = Agent::new();
    let (mut server, client) = agent.connect().await;

    // Too long: refused before sending, so the next request is the first the client sees.
    let long = "x".repeat(MAX_MESSAGE);
    let netns = netns_fd();
    let err = server.add(&long, &info("n"), netns.as_fd()).await.unwrap_err();
    assert!(matches!(err, RecvError::Protocol(ProtocolError::TooLarge(_))), "{err}");
    let err = server.keep("").await.unwrap_err();
    assert!(matches!(err, RecvError::Protocol(ProtocolError::EmptyUid)), "{err}");

    // No ack within the deadline.
    server.set_timeout(Duration::from_millis(50));
    let err = server.del("u1").await.unwrap_err();
    assert!(matches!(&err, RecvError::Io(e) if e.kind() == io::ErrorKind::TimedOut), "{err}");
    let mut client = client;
    assert!(matches!(client.recv().await.unwrap(), Some(Request::Del { uid }) if uid == "u1"));

    // Unsolicited data while idle.
    client.ack(Ok(())).await.unwrap();
    let err = server.check_idle(Duration::from_millis(50)).await.unwrap_err();
    assert!(matches!(err, RecvError::Protocol(ProtocolError::Unsolicited)), "{err}");

    // The proxy goes away: idle check sees it, an ack read fails with UnexpectedEof.
    drop(client);
    assert!(!server.check_idle(Duration::from_millis(50)).await.unwrap());
    let err = server.recv_ack().await.unwrap_err();
    assert!(matches!(&err, RecvError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof), "{err}");
}

#[tokio::test]
async fn hello_errors() {
    let agent = Agent::new();
    let raw = UnixSeqpacket::connect(agent.path()).await.unwrap();
    let mut server = agent.listener.accept().await.unwrap();
    server.set_timeout(Duration::from_millis(50));
    let err = server.recv_hello().await.unwrap_err();
    assert!(matches!(&err, RecvError::Io(e) if e.kind() == io::ErrorKind::TimedOut), "{err}");
    raw.send(&[0x08]).await.unwrap();
    let err = server.recv_hello().await.unwrap_err();
    assert!(matches!(err, RecvError::Protocol(ProtocolError::Decode(_))), "{err}");
    drop(raw);
    let err = server.recv_hello().await.unwrap_err();
    assert!(matches!(&err, RecvError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof), "{err}");
}

#[tokio::test]
async fn bind_replaces_stale_socket_and_reports_peer() {
    let agent = Agent::new();
    let path = agent.path();
    drop(agent.listener);
    // The old socket file is still there; a new listener takes its place.
    assert!(path.exists());
    let listener = ZdsListener::bind(&path).unwrap();
    let _client = ZdsClient::connect(&path).await.unwrap();
    let server = listener.accept().await.unwrap();
    let cred = server.peer_cred().unwrap();
    assert_eq!(cred.uid, nix::unistd::getuid().as_raw());
    assert_eq!(cred.pid, Some(std::process::id().cast_signed()));
}

#[tokio::test]
async fn connect_failure_names_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = ZdsClient::connect(&path).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains("absent.sock"), "{err}");
}
