//! Conformance of the xDS server against a scripted client: the raw tonic client stub sends
//! each request and the test asserts each response.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ambit_api::xds::{DeltaDiscoveryRequest, Status as WireStatus};
use ambit_xds::BoxFuture;
use ambit_xds::server::{Authenticate, Principal, ServerConfig, ServerResource};
use common::ads::*;
use common::*;
use tonic::{Request, Status};

#[tokio::test]
async fn first_request_without_node_is_invalid_argument() {
    let s = start(fast(), None).await;
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(req(A)).await;
    let err = c.recv_err().await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.message(), "missing node information");
}

#[tokio::test]
async fn wildcard_subscribe_ack_pushes_only_changes_and_removals_in_type_order() {
    let s = start(fast(), None).await;
    s.resources
        .publish([upsert(A, vec![r("a1", "one"), r("a2", "two")]), upsert(B, vec![r("b1", "bee")])])
        .unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let first = c.recv().await;
    assert_eq!(first.type_url, A);
    assert_eq!(
        contents(&first),
        BTreeMap::from([
            ("a1".into(), (version("one"), "one".into())),
            ("a2".into(), (version("two"), "two".into()))
        ])
    );
    assert!(first.removed_resources.is_empty());
    assert!(first.resources.iter().all(|r| r.aliases.is_empty()));
    assert_eq!(first.system_version_info, "1");
    c.wildcard(B, &[]).await;
    let second = c.recv().await;
    assert_eq!((second.type_url.as_str(), names(&second)), (B, strings(&["b1"])));
    assert_ne!(first.nonce, second.nonce);

    // A plain ACK gets nothing.
    c.ack(&first).await;
    c.ack(&second).await;
    c.quiet(200).await;

    // Only the changed resource is pushed.
    s.resources.publish([upsert(A, vec![r("a1", "one-b"), r("a2", "two")])]).unwrap();
    let p = c.recv().await;
    assert_eq!(contents(&p), BTreeMap::from([("a1".into(), (version("one-b"), "one-b".into()))]));
    c.ack(&p).await;

    // A removal is pushed as removed_resources.
    s.resources.publish([remove(A, &["a2"])]).unwrap();
    let p = c.recv().await;
    assert!(p.resources.is_empty());
    assert_eq!(p.removed_resources, strings(&["a2"]));
    c.ack(&p).await;

    // Both types in one publish: Address-like first type, then the second, each its own nonce.
    s.resources.publish([upsert(B, vec![r("b2", "b-two")]), upsert(A, vec![r("a3", "three")])]).unwrap();
    let p1 = c.recv().await;
    let p2 = c.recv().await;
    assert_eq!((p1.type_url.as_str(), names(&p1)), (A, strings(&["a3"])));
    assert_eq!((p2.type_url.as_str(), names(&p2)), (B, strings(&["b2"])));
    c.ack(&p1).await;
    c.ack(&p2).await;

    // A publish that changes nothing pushes nothing.
    s.resources.publish([upsert(A, vec![r("a3", "three")])]).unwrap();
    c.quiet(200).await;

    let st = s.ads.status();
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].node_id, "ztunnel~10.0.0.1~p.ns~ns.svc.cluster.local");
    assert_eq!(st[0].types.len(), 2);
    assert!(st[0].types[0].wildcard);
    assert_eq!(st[0].types[0].acked_nonces.last(), Some(&p1.nonce));
    assert_eq!(st[0].types[0].responses, 4);
}

#[tokio::test]
async fn nacked_version_is_not_resent_and_stale_nonces_are_ignored() {
    let s = start(fast(), None).await;
    s.resources.publish([upsert(A, vec![r("a1", "one"), r("a2", "two")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let first = c.recv().await;
    c.ack(&first).await;

    s.resources.publish([upsert(A, vec![r("a1", "one-bad")])]).unwrap();
    let p = c.recv().await;
    c.send(DeltaDiscoveryRequest {
        response_nonce: p.nonce.clone(),
        error_detail: Some(WireStatus { code: 0, message: "a1: bad".into(), details: vec![] }),
        ..req(A)
    })
    .await;
    // No resend, no loop.
    c.quiet(300).await;

    // A request carrying a stale nonce is ignored entirely, subscription change included.
    c.send(DeltaDiscoveryRequest {
        response_nonce: first.nonce.clone(),
        resource_names_subscribe: strings(&["zzz"]),
        ..req(A)
    })
    .await;
    c.quiet(200).await;

    // The next change carries only what changed, not the NACKed resource.
    s.resources.publish([upsert(A, vec![r("a2", "two-b")])]).unwrap();
    let p2 = c.recv().await;
    assert_eq!(names(&p2), strings(&["a2"]));

    let st = s.ads.status();
    let nacks = &st[0].types[0].nacks;
    assert_eq!(nacks.len(), 1);
    assert_eq!((nacks[0].nonce.as_str(), nacks[0].message.as_str()), (p.nonce.as_str(), "a1: bad"));
}

#[tokio::test]
async fn reconnect_with_initial_versions_gets_only_the_difference() {
    let s = start(fast(), None).await;
    s.resources.publish([upsert(A, vec![r("a1", "one"), r("a2", "two"), r("a3", "three")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    let v1 = version("one");
    c.wildcard(A, &[("a1", &v1), ("a2", "old"), ("gone", "x")]).await;
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["a2", "a3"]));
    assert_eq!(p.removed_resources, strings(&["gone"]));

    // Empty state still answers (with an empty response).
    s.resources.publish([remove(A, &["a1", "a2", "a3"])]).unwrap();
    let mut c2 = Client::open(&s.url, None).await.unwrap();
    c2.wildcard(B, &[]).await;
    let p = c2.recv().await;
    assert!(p.resources.is_empty() && p.removed_resources.is_empty());
}

#[tokio::test]
async fn on_demand_by_name_alias_also_not_found_and_unsubscribe() {
    let s = start(fast(), None).await;
    let mut w1 = r("uid-1", "w1");
    w1.aliases = strings(&["net/10.0.0.1"]);
    let mut svc = r("ns/svc", "svc");
    svc.also = strings(&["uid-2"]);
    s.resources.publish([upsert(A, vec![w1, svc, r("uid-2", "w2"), r("uid-3", "w3")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(DeltaDiscoveryRequest {
        node: Some(node("n")),
        resource_names_subscribe: strings(&["*"]),
        resource_names_unsubscribe: strings(&["*"]),
        ..req(A)
    })
    .await;
    let p = c.recv().await;
    assert!(p.resources.is_empty() && p.removed_resources.is_empty(), "{p:?}");
    c.ack(&p).await;

    let demand = |name: &str| DeltaDiscoveryRequest { resource_names_subscribe: strings(&[name]), ..req(A) };
    // By alias: sent under its real name with its aliases, not echoed as removed.
    c.send(demand("net/10.0.0.1")).await;
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["uid-1"]));
    assert_eq!(p.resources[0].aliases, strings(&["net/10.0.0.1"]));
    assert!(p.removed_resources.is_empty());
    c.ack(&p).await;
    // Not found: echoed as removed.
    c.send(demand("net/10.9.9.9")).await;
    let p = c.recv().await;
    assert!(p.resources.is_empty());
    assert_eq!(p.removed_resources, strings(&["net/10.9.9.9"]));
    c.ack(&p).await;
    // A service brings its `also` names.
    c.send(demand("ns/svc")).await;
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["ns/svc", "uid-2"]));
    c.ack(&p).await;

    // Pushes cover the subscription only (uid-3 was never asked for).
    s.resources.publish([upsert(A, vec![r("uid-3", "w3-b")])]).unwrap();
    c.quiet(200).await;
    s.resources.publish([upsert(A, vec![r("uid-2", "w2-b")])]).unwrap();
    let p = c.recv().await;
    assert_eq!(contents(&p), BTreeMap::from([("uid-2".into(), (version("w2-b"), "w2-b".into()))]));
    c.ack(&p).await;

    let st = s.ads.status();
    assert!(!st[0].types[0].wildcard);
    assert_eq!(
        st[0].types[0].subscriptions,
        strings(&["net/10.0.0.1", "net/10.9.9.9", "ns/svc", "uid-1", "uid-2"])
    );

    // Unsubscribe: no answer, and later changes are not pushed.
    c.send(DeltaDiscoveryRequest { resource_names_unsubscribe: strings(&["uid-2"]), ..req(A) }).await;
    c.quiet(100).await;
    s.resources.publish([upsert(A, vec![r("uid-2", "w2-c")])]).unwrap();
    c.quiet(200).await;
    // A removal of a subscribed name is pushed.
    s.resources.publish([remove(A, &["uid-1"])]).unwrap();
    let p = c.recv().await;
    assert_eq!(p.removed_resources, strings(&["uid-1"]));

    // Reconnect of an on-demand client: its names come back, minus those it holds at the same version.
    let mut c2 = Client::open(&s.url, None).await.unwrap();
    let vs = version("svc");
    c2.send(DeltaDiscoveryRequest {
        node: Some(node("n")),
        resource_names_subscribe: strings(&["*"]),
        resource_names_unsubscribe: strings(&["*"]),
        initial_resource_versions: HashMap::from([("ns/svc".into(), vs), ("uid-1".into(), "v".into())]),
        ..req(A)
    })
    .await;
    let p = c2.recv().await;
    assert_eq!(names(&p), strings(&["uid-2"]));
    assert_eq!(p.removed_resources, strings(&["uid-1"]));
}

struct Token;

impl Authenticate for Token {
    fn authenticate<'a>(&'a self, req: &'a Request<()>) -> BoxFuture<'a, Result<Principal, Status>> {
        let token = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
        Box::pin(async move {
            match token.as_deref() {
                Some("Bearer good") => Ok(Principal {
                    name: "spiffe://cluster.local/ns/ns/sa/ztunnel".into(),
                    identities: vec!["spiffe://cluster.local/ns/ns/sa/ztunnel".parse().unwrap()],
                }),
                _ => Err(Status::unauthenticated("authentication failure")),
            }
        })
    }
}

#[tokio::test]
async fn authenticator_refuses_a_bad_token() {
    let s = start(fast(), Some(Arc::new(Token))).await;
    let err = Client::open(&s.url, Some("bad")).await.err().expect("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.message(), "authentication failure");
    let err = Client::open(&s.url, None).await.err().expect("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(s.ads.status().is_empty());

    let mut c = Client::open(&s.url, Some("good")).await.unwrap();
    c.wildcard(A, &[]).await;
    c.recv().await;
    let st = s.ads.status();
    assert_eq!(st[0].principal.as_ref().unwrap().name, "spiffe://cluster.local/ns/ns/sa/ztunnel");
}

#[tokio::test]
async fn max_streams_is_enforced() {
    let s = start(ServerConfig { max_streams: 1, ..fast() }, None).await;
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    c.recv().await;
    let err = Client::open(&s.url, None).await.err().expect("refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(err.message(), "this xDS server already serves 1 streams; retry later");
}

#[tokio::test]
async fn subscribed_names_are_capped() {
    let s = start(ServerConfig { max_subscribed_names: 3, ..fast() }, None).await;
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(DeltaDiscoveryRequest {
        node: Some(node("n")),
        resource_names_subscribe: strings(&["a", "b"]),
        ..req(A)
    })
    .await;
    let p = c.recv().await;
    assert_eq!(p.removed_resources, strings(&["a", "b"]));
    c.send(DeltaDiscoveryRequest { resource_names_subscribe: strings(&["c", "d"]), ..req(A) }).await;
    let err = c.recv_err().await;
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(err.message(), "this stream subscribes to 4 names, more than the server's limit of 3");
}

#[tokio::test]
async fn debounce_merges_a_burst_and_last_state_wins() {
    let s =
        start(ServerConfig { debounce_after: Duration::from_millis(100), ..Default::default() }, None).await;
    s.resources.publish([upsert(A, vec![r("a1", "v-start")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let p = c.recv().await;
    c.ack(&p).await;

    let started = std::time::Instant::now();
    for i in 0..10_000 {
        s.resources
            .publish([upsert(
                A,
                vec![r("a1", &format!("v-{i}")), r(&format!("n-{}", i % 50), &format!("{i}"))],
            )])
            .unwrap();
        if i % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let burst = started.elapsed();
    let pushes = drain(&mut c, 500).await;
    eprintln!("10000 publishes in {burst:?} → {} pushes", pushes.len());
    assert!(burst < Duration::from_secs(1), "the burst took {burst:?}");
    assert!((1..=3).contains(&pushes.len()), "{} pushes", pushes.len());
    let last = pushes.iter().flat_map(contents).rfind(|(n, _)| n == "a1").unwrap();
    assert_eq!(last.1.1, "v-9999");
}

#[tokio::test]
async fn debounce_max_bounds_the_delay_under_constant_churn() {
    let cfg = ServerConfig {
        debounce_after: Duration::from_millis(100),
        debounce_max: Duration::from_millis(300),
        ..Default::default()
    };
    let s = start(cfg, None).await;
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let p = c.recv().await;
    c.ack(&p).await;
    let resources = s.resources.clone();
    // One change every 20 ms for 1.5 s: never 100 ms of quiet, so only debounce_max pushes.
    let churn = tokio::spawn(async move {
        for i in 0..75 {
            resources.publish([upsert(A, vec![r("a1", &format!("v-{i}"))])]).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut pushes = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1400);
    while let Ok(Ok(Some(p))) = tokio::time::timeout_at(deadline, c.rx.message()).await {
        c.ack(&p).await;
        pushes.push(p);
    }
    churn.await.unwrap();
    // 1.4 s / 300 ms ⇒ about 4 pushes during the churn, none held back until it stops.
    assert!((3..=6).contains(&pushes.len()), "{} pushes during the churn", pushes.len());
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[tokio::test]
async fn a_client_that_never_reads_holds_only_a_set_of_names() {
    let s = start(
        ServerConfig {
            debounce_after: Duration::from_millis(1),
            debounce_max: Duration::from_millis(5),
            ..Default::default()
        },
        None,
    )
    .await;
    let big = |name: &str, round: usize| ServerResource {
        name: name.into(),
        aliases: vec![],
        resource: any(A, format!("{round:08}{}", "x".repeat(64 * 1024)).as_bytes()),
        also: vec![],
        node: None,
    };
    s.resources.publish([upsert(A, (0..100).map(|i| big(&format!("r{i}"), 0)).collect())]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    // The client reads nothing from here on.
    let before = rss_bytes();
    // 200 rounds × 100 resources × 64 KiB ≈ 1.3 GB of changes published.
    for round in 1..=200 {
        s.resources.publish([upsert(A, (0..100).map(|i| big(&format!("r{i}"), round)).collect())]).unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = rss_bytes();
    let st = s.ads.status();
    eprintln!(
        "pending names {}, RSS growth {} MiB",
        st[0].pending_names,
        (after.saturating_sub(before)) >> 20
    );
    assert!(st[0].pending_names <= 100, "{}", st[0].pending_names);
    assert!(after.saturating_sub(before) < 200 << 20, "RSS grew by {} MiB", (after - before) >> 20);

    // When it finally reads, it converges on the last state.
    let mut latest = BTreeMap::new();
    while latest.len() < 100 || latest.values().any(|p: &String| !p.starts_with("00000200")) {
        let p = c.recv().await;
        for (n, (_, payload)) in contents(&p) {
            latest.insert(n, payload);
        }
        c.ack(&p).await;
    }
}

/// A publish that changes only the names a resource brings along (a service's members) pushes
/// nothing to anyone; the next subscriber gets the new list.
#[tokio::test]
async fn a_change_of_also_alone_is_stored_and_pushed_to_nobody() {
    let s = start(fast(), None).await;
    let mut svc = r("ns/svc", "svc");
    svc.also = strings(&["uid-1"]);
    s.resources.publish([upsert(A, vec![svc.clone(), r("uid-1", "w1"), r("uid-2", "w2")])]).unwrap();
    let on_demand = |name: &str| DeltaDiscoveryRequest {
        node: Some(node("n")),
        resource_names_subscribe: strings(&[name]),
        ..req(A)
    };
    let mut wild = Client::open(&s.url, None).await.unwrap();
    wild.wildcard(A, &[]).await;
    let p = wild.recv().await;
    wild.ack(&p).await;
    let mut first = Client::open(&s.url, None).await.unwrap();
    first.send(on_demand("ns/svc")).await;
    let p = first.recv().await;
    assert_eq!(names(&p), strings(&["ns/svc", "uid-1"]));
    first.ack(&p).await;

    svc.also = strings(&["uid-1", "uid-2"]);
    s.resources.publish([upsert(A, vec![svc])]).unwrap();
    wild.quiet(200).await;
    first.quiet(0).await;

    let mut second = Client::open(&s.url, None).await.unwrap();
    second.send(on_demand("ns/svc")).await;
    let p = second.recv().await;
    assert_eq!(names(&p), strings(&["ns/svc", "uid-1", "uid-2"]));
}

#[tokio::test]
async fn a_response_over_the_size_limit_goes_in_parts_each_acked_on_its_own() {
    // Each resource encodes to a little over 1 000 bytes: two fit in a part, three do not.
    let cfg = ServerConfig { max_response_bytes: 4096 + 2500, ..fast() };
    let s = start(cfg, None).await;
    let payload = |i: usize| format!("{i}{}", "x".repeat(1000));
    let all: Vec<ServerResource> = (0..5).map(|i| r(&format!("a{i}"), &payload(i))).collect();
    s.resources.publish([upsert(A, all)]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let parts = [c.recv().await, c.recv().await, c.recv().await];
    c.quiet(200).await;
    let versions: Vec<&str> = parts.iter().map(|p| p.system_version_info.as_str()).collect();
    assert_eq!(versions, ["1 part 1/3", "1 part 2/3", "1 part 3/3"]);
    let sent: Vec<Vec<String>> = parts.iter().map(names).collect();
    let mut every: Vec<String> = sent.concat();
    every.sort();
    assert_eq!(every, strings(&["a0", "a1", "a2", "a3", "a4"]));
    assert!(sent.iter().all(|p| p.len() <= 2), "{sent:?}");
    let nonces: Vec<String> = parts.iter().map(|p| p.nonce.clone()).collect();
    assert_eq!(nonces.iter().collect::<std::collections::HashSet<_>>().len(), 3);

    // Every part's ACK counts (none is stale), in the order they come.
    for p in &parts {
        c.ack(p).await;
    }
    c.quiet(200).await;
    let st = s.ads.status();
    assert_eq!(st[0].types[0].acked_nonces, nonces);
    assert_eq!(st[0].types[0].responses, 3);

    // A change that fits is one whole response again, and the parts' nonces are stale now.
    s.resources.publish([upsert(A, vec![r("a0", "small")])]).unwrap();
    let p = c.recv().await;
    assert_eq!((p.system_version_info.as_str(), names(&p)), ("2", strings(&["a0"])));
    c.send(DeltaDiscoveryRequest {
        response_nonce: nonces[0].clone(),
        resource_names_subscribe: strings(&["zzz"]),
        ..req(A)
    })
    .await;
    c.quiet(200).await;
    c.ack(&p).await;
    c.quiet(200).await;
    assert_eq!(s.ads.status()[0].types[0].acked_nonces.last(), Some(&p.nonce));
    assert_eq!(s.ads.status()[0].types[0].acked_nonces.len(), 4);
}
