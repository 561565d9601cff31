use super::*;
use ambit_zds::{Ack, Request, ZdsClient};

fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo { name: name.into(), namespace: "demo".into(), service_account: "sa".into() }
}

fn own_netns() -> Arc<Netns> {
    Arc::new(Netns::own().expect("own netns"))
}

async fn next(client: &mut ZdsClient) -> Request {
    client.recv().await.expect("recv").expect("not EOF")
}

#[tokio::test]
async fn snapshot_then_adds_to_newest_and_deletes_to_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("zds.sock");
    let listener = ZdsListener::bind(&path).expect("bind");
    let server = ZdsServer::new(&path);
    let pods = vec![
        PodEntry { uid: "u1".into(), info: info("a"), netns: Some(own_netns()) },
        PodEntry { uid: "u2".into(), info: info("b"), netns: None },
    ];
    let snapshot: Snapshot = Arc::new(move || pods.clone());
    tokio::spawn(server.clone().run(listener, snapshot));

    assert!(matches!(
        server.add(PodEntry { uid: "x".into(), info: info("x"), netns: None }).await,
        Err(ZdsError::NoProxy(_))
    ));

    let mut old = ZdsClient::connect(&path).await.expect("connect");
    assert!(matches!(next(&mut old).await, Request::Add { uid, .. } if uid == "u1"));
    old.ack(Ok(())).await.expect("ack");
    assert!(matches!(next(&mut old).await, Request::Keep { uid } if uid == "u2"));
    old.ack(Ok(())).await.expect("ack");
    assert!(matches!(next(&mut old).await, Request::SnapshotSent));
    old.ack(Ok(())).await.expect("ack");

    let mut new = ZdsClient::connect(&path).await.expect("connect");
    for _ in 0..3 {
        let _ = next(&mut new).await;
        new.ack(Ok(())).await.expect("ack");
    }
    // A new pod goes to the newest proxy only.
    let s = server.clone();
    let add = tokio::spawn(async move {
        s.add(PodEntry { uid: "u3".into(), info: info("c"), netns: Some(own_netns()) }).await
    });
    assert!(matches!(next(&mut new).await, Request::Add { uid, .. } if uid == "u3"));
    new.ack(Ack::nack("no room")).await.expect("nack");
    let err = add.await.expect("join").expect_err("nacked");
    assert!(matches!(&err, ZdsError::Nack { uid, reason } if uid == "u3" && reason == "no room"), "{err}");
    assert_eq!(err.to_string(), "the node proxy refused pod u3: no room");
    // A delete goes to both.
    let s = server.clone();
    let del = tokio::spawn(async move { s.del("u1").await });
    assert!(matches!(next(&mut new).await, Request::Del { uid } if uid == "u1"));
    new.ack(Ok(())).await.expect("ack");
    assert!(matches!(next(&mut old).await, Request::Del { uid } if uid == "u1"));
    old.ack(Ok(())).await.expect("ack");
    del.await.expect("join").expect("deleted everywhere");
    assert_eq!(server.connected(), 2);
    drop(new);
    // The newest connection closed: adds fall back to the previous one.
    tokio::time::timeout(Duration::from_secs(10), async {
        while server.connected() != 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("disconnect noticed");
    let s = server.clone();
    let add =
        tokio::spawn(async move { s.add(PodEntry { uid: "u4".into(), info: info("d"), netns: None }).await });
    assert!(matches!(next(&mut old).await, Request::Keep { uid } if uid == "u4"));
    old.ack(Ok(())).await.expect("ack");
    add.await.expect("join").expect("added");
}
