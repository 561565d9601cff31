use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use tokio::sync::Semaphore;
use tokio::time::sleep;

use super::*;
use crate::FakeCa;

const TTL: Duration = Duration::from_secs(100);

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa)
}

/// A FakeCa that records calls, can fail on demand and can hold calls until permits are added.
struct TestSigner {
    ca: FakeCa,
    calls: std::sync::Mutex<Vec<Identity>>,
    failing: AtomicBool,
    gate: Option<Semaphore>,
}

impl TestSigner {
    fn new() -> Arc<Self> {
        Arc::new(TestSigner {
            ca: FakeCa::generate(),
            calls: Default::default(),
            failing: AtomicBool::new(false),
            gate: None,
        })
    }

    fn gated() -> Arc<Self> {
        Arc::new(TestSigner {
            ca: FakeCa::generate(),
            calls: Default::default(),
            failing: AtomicBool::new(false),
            gate: Some(Semaphore::new(0)),
        })
    }

    fn calls(&self) -> Vec<Identity> {
        self.calls.lock().expect("lock").clone()
    }

    fn release(&self, n: usize) {
        self.gate.as_ref().expect("gated signer").add_permits(n);
    }

    fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

impl CertSigner for TestSigner {
    fn sign(
        &self,
        csr_pem: String,
        identity: &Identity,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<String>, CaError>> {
        let identity = identity.clone();
        Box::pin(async move {
            self.calls.lock().expect("lock").push(identity.clone());
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("open").forget();
            }
            if self.failing.load(Ordering::SeqCst) {
                return Err(CaError::Status {
                    address: "test".to_owned(),
                    code: tonic::Code::Unavailable,
                    message: "CA down".to_owned(),
                });
            }
            self.ca.sign_csr(&csr_pem, &identity, ttl)
        })
    }
}

/// Lets the worker and the CA-call tasks run until they block.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

fn state_of(manager: &CertManager, identity: &Identity) -> Option<String> {
    manager.dump().into_iter().find(|d| d.identity == identity.to_string()).map(|d| d.state)
}

#[tokio::test(start_paused = true)]
async fn caches_certificate() {
    let signer = TestSigner::new();
    let manager = CertManager::new(signer.clone(), TTL);
    let a = manager.fetch(&id("web")).await.expect("first");
    let b = manager.fetch(&id("web")).await.expect("second");
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.identity(), &id("web"));
    assert_eq!(signer.calls(), vec![id("web")]);

    let dump = manager.dump();
    assert_eq!(dump.len(), 1);
    assert_eq!(dump[0].identity, "spiffe://cluster.local/ns/default/sa/web");
    assert_eq!(dump[0].state, "Available");
    assert_eq!(dump[0].cert_chain.len(), 1);
    assert_eq!(dump[0].root_certs.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn renews_at_half_life() {
    let signer = TestSigner::new();
    let manager = CertManager::new(signer.clone(), TTL);
    let first = manager.fetch(&id("web")).await.expect("first");
    sleep(Duration::from_secs(48)).await;
    assert_eq!(signer.calls().len(), 1, "renewed too early");
    sleep(Duration::from_secs(4)).await;
    settle().await;
    assert_eq!(signer.calls().len(), 2, "not renewed at 50%");
    let second = manager.fetch(&id("web")).await.expect("second");
    assert!(!Arc::ptr_eq(&first, &second));
    // The next renewal is half a lifetime after the new certificate. Validity times have
    // whole-second precision, so each renewal lands in the second before its half-life.
    sleep(Duration::from_secs(45)).await; // t = 97 s
    assert_eq!(signer.calls().len(), 2);
    sleep(Duration::from_secs(4)).await; // t = 101 s
    settle().await;
    assert_eq!(signer.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn backs_off_after_failures_without_a_certificate() {
    let signer = TestSigner::new();
    signer.fail(true);
    let manager = CertManager::new(signer.clone(), TTL);
    let err = manager.fetch(&id("web")).await.expect_err("CA down");
    assert!(matches!(err, CertError::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("CA down"), "{err}");
    let state = state_of(&manager, &id("web")).expect("state");
    assert!(state.starts_with("Unavailable: "), "{state}");

    // Waiters get the error immediately; no new CA call until the backoff expires.
    manager.fetch(&id("web")).await.expect_err("still down");
    assert_eq!(signer.calls().len(), 1);

    // First retry after 1 s ± 20 %.
    sleep(Duration::from_millis(790)).await;
    assert_eq!(signer.calls().len(), 1);
    sleep(Duration::from_millis(420)).await; // t = 1.21 s
    settle().await;
    assert_eq!(signer.calls().len(), 2);

    // Second retry 2 s ± 20 % after the first: within t ∈ [2.4 s, 3.6 s].
    sleep(Duration::from_millis(1180)).await; // t = 2.39 s
    assert_eq!(signer.calls().len(), 2);
    sleep(Duration::from_millis(1220)).await; // t = 3.61 s
    settle().await;
    assert_eq!(signer.calls().len(), 3);

    // Third retry 4 s ± 20 % later (t ≤ 8.4 s) succeeds.
    signer.fail(false);
    sleep(Duration::from_millis(4800)).await;
    settle().await;
    assert_eq!(signer.calls().len(), 4);
    assert_eq!(state_of(&manager, &id("web")).as_deref(), Some("Available"));
    manager.fetch(&id("web")).await.expect("recovered");
    assert_eq!(signer.calls().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn keeps_serving_a_valid_certificate_while_renewal_fails() {
    let signer = TestSigner::new();
    let manager = CertManager::new(signer.clone(), TTL);
    let cert = manager.fetch(&id("web")).await.expect("first");
    signer.fail(true);
    sleep(Duration::from_secs(49)).await;
    assert_eq!(signer.calls().len(), 1);
    // The renewal falls in (49 s, 50 s]; its first retry 1 s ± 20 % later.
    sleep(Duration::from_secs(1)).await;
    settle().await;
    assert!(signer.calls().len() >= 2, "renewal attempted");
    let still = manager.fetch(&id("web")).await.expect("old cert served");
    assert!(Arc::ptr_eq(&cert, &still));
    assert_eq!(state_of(&manager, &id("web")).as_deref(), Some("Available"));
    sleep(Duration::from_millis(1300)).await; // t = 51.3 s
    settle().await;
    assert_eq!(signer.calls().len(), 3, "retried after backoff");

    // Retries are capped at the expiry; once expired and still failing, fetch fails.
    sleep(Duration::from_secs(50)).await;
    settle().await;
    let err = manager.fetch(&id("web")).await.expect_err("expired");
    assert!(matches!(err, CertError::Unavailable { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn at_most_eight_concurrent_requests() {
    let signer = TestSigner::gated();
    let manager = CertManager::new(signer.clone(), TTL);
    for i in 0..10 {
        manager.prefetch(&id(&format!("w{i}")));
    }
    settle().await;
    assert_eq!(signer.calls().len(), 8);
    assert_eq!(state_of(&manager, &id("w0")).as_deref(), Some("Initializing"));
    signer.release(100);
    settle().await;
    assert_eq!(signer.calls().len(), 10);
    assert!(manager.dump().iter().all(|d| d.state == "Available"));
}

#[tokio::test(start_paused = true)]
async fn realtime_goes_before_warmup_and_background() {
    let signer = TestSigner::gated();
    let manager = CertManager::new(signer.clone(), TTL);
    signer.release(1);
    manager.fetch(&id("renewing")).await.expect("first");

    // Fill every slot with blocked warmups, then queue more work.
    for i in 0..8 {
        manager.prefetch(&id(&format!("w{i}")));
    }
    settle().await;
    assert_eq!(signer.calls().len(), 9);
    manager.prefetch(&id("late-warmup"));
    sleep(Duration::from_secs(60)).await; // "renewing" is now due, with Background priority
    let realtime = tokio::spawn({
        let manager = manager.clone();
        async move { manager.fetch(&id("realtime")).await }
    });
    settle().await;
    assert_eq!(signer.calls().len(), 9, "all slots busy");

    signer.release(1);
    settle().await;
    assert_eq!(signer.calls()[9], id("realtime"));
    signer.release(1);
    settle().await;
    assert_eq!(signer.calls()[10], id("late-warmup"));
    signer.release(1);
    settle().await;
    assert_eq!(signer.calls()[11], id("renewing"));
    signer.release(100);
    let cert = realtime.await.expect("join").expect("realtime cert");
    assert_eq!(cert.identity(), &id("realtime"));
}

#[tokio::test(start_paused = true)]
async fn fetch_bumps_a_queued_prefetch() {
    let signer = TestSigner::gated();
    let manager = CertManager::new(signer.clone(), TTL);
    for i in 0..8 {
        manager.prefetch(&id(&format!("w{i}")));
    }
    settle().await;
    manager.prefetch(&id("first"));
    manager.prefetch(&id("second"));
    let bumped = tokio::spawn({
        let manager = manager.clone();
        async move { manager.fetch(&id("second")).await }
    });
    settle().await;
    signer.release(1);
    settle().await;
    assert_eq!(signer.calls()[8], id("second"));
    signer.release(100);
    settle().await;
    assert_eq!(signer.calls()[9], id("first"));
    bumped.await.expect("join").expect("cert");
}

#[tokio::test(start_paused = true)]
async fn forget_discards_in_flight_result_and_wakes_waiters() {
    let signer = TestSigner::gated();
    let manager = CertManager::new(signer.clone(), TTL);
    let waiter = tokio::spawn({
        let manager = manager.clone();
        async move { manager.fetch(&id("web")).await }
    });
    settle().await;
    assert_eq!(signer.calls().len(), 1);
    manager.forget(&id("web"));
    let err = waiter.await.expect("join").expect_err("forgotten");
    assert!(matches!(err, CertError::Forgotten(_)), "{err}");

    signer.release(1);
    settle().await;
    assert!(manager.dump().is_empty(), "late result must be discarded");

    // A later fetch starts afresh, and forgetting an available certificate drops it.
    signer.release(100);
    let cert = manager.fetch(&id("web")).await.expect("refetch");
    assert_eq!(signer.calls().len(), 2);
    manager.forget(&id("web"));
    assert!(manager.dump().is_empty());
    let again = manager.fetch(&id("web")).await.expect("refetch");
    assert!(!Arc::ptr_eq(&cert, &again));
    assert_eq!(signer.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn dump_is_sorted_by_identity() {
    let signer = TestSigner::new();
    let manager = CertManager::new(signer, TTL);
    for sa in ["zeta", "alpha", "mid"] {
        manager.fetch(&id(sa)).await.expect("cert");
    }
    let names: Vec<_> = manager.dump().into_iter().map(|d| d.identity).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(names.len(), 3);
}

#[tokio::test]
async fn end_to_end_with_grpc_ca() {
    use crate::testing::TestCaServer;
    use crate::{CaClient, CaClientConfig};
    let server = TestCaServer::start(Arc::new(FakeCa::generate())).await;
    let mut cfg = CaClientConfig::plain(server.address());
    cfg.impersonate = true;
    let client = CaClient::new(cfg).expect("client");
    let manager = CertManager::new(Arc::new(client), Duration::from_secs(3600));
    let cert = manager.fetch(&id("web")).await.expect("cert");
    assert_eq!(cert.identity(), &id("web"));
    assert_eq!(server.requests().len(), 1);
    assert_eq!(server.requests()[0].validity_duration, 3600);
}
