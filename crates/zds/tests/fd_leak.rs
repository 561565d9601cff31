//! No fd leaks: counts `/proc/self/fd`, so this binary holds a single test (nothing else
//! opens or closes fds concurrently).

#![allow(clippy::unwrap_used)]

mod common;

use std::os::fd::AsFd;

use ambit_zds::{Ack, ProtocolError, RecvError, Request};
use common::{Agent, fd_count, info, netns_fd, regular_fd};

#[tokio::test]
async fn received_fds_are_never_leaked() {
    let agent = Agent::new();
    let (mut server, mut client) = agent.connect().await;
    let netns = netns_fd();
    let (_file, regular) = regular_fd();
    let second = netns_fd();
    let baseline = fd_count();

    // 100 adds: each received fd lives exactly as long as the request that carries it.
    let pod = info("n");
    for i in 0..100 {
        let uid = format!("pod-{i}");
        let proxy = async {
            let request = client.recv().await.unwrap();
            assert!(matches!(&request, Some(Request::Add { uid: got, .. }) if *got == uid));
            assert_eq!(fd_count(), baseline + 1);
            client.ack(Ack::Ok).await.unwrap();
        };
        let (ack, ()) = tokio::join!(server.add(&uid, &pod, netns.as_fd()), proxy);
        assert_eq!(ack.unwrap(), Ack::Ok);
        assert_eq!(fd_count(), baseline, "after add {i}");
    }

    // Every rejected record closes the fds that came with it.
    let keep = ambit_zds::encode_keep("u1").unwrap();
    let add = ambit_zds::encode_add("u1", &info("n")).unwrap();
    let cases: [(&[u8], Vec<_>); 5] = [
        (&keep, vec![netns.as_fd()]),
        (&add, vec![netns.as_fd(), second.as_fd()]),
        (&add, vec![regular.as_fd()]),
        (&[0xff; 4], vec![netns.as_fd()]),
        (&[0u8; 2000], vec![netns.as_fd()]),
    ];
    for (bytes, fds) in cases {
        server.send_raw(bytes, &fds).await.unwrap();
        let err = client.recv().await.unwrap_err();
        assert!(matches!(err, RecvError::Protocol(_)), "{err}");
        assert_eq!(fd_count(), baseline, "after {err}");
        client.ack(Ack::nack(&err)).await.unwrap();
        assert!(!server.recv_ack().await.unwrap().is_ok());
    }

    // The control-buffer overflow path closes what the kernel did deliver.
    let many: Vec<_> = (0..40).map(|_| netns_fd()).collect();
    let borrowed: Vec<_> = many.iter().map(|fd| fd.as_fd()).collect();
    server.send_raw(&add, &borrowed).await.unwrap();
    let err = client.recv().await.unwrap_err();
    assert!(matches!(err, RecvError::Protocol(ProtocolError::ControlTruncated)), "{err}");
    drop(borrowed);
    drop(many);
    assert_eq!(fd_count(), baseline);
}
