use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

/// Refuses the first `refuse` patches (403), then accepts; records every attempt.
#[derive(Default)]
struct Scripted {
    refuse: AtomicU32,
    hang: std::sync::atomic::AtomicBool,
    attempts: Mutex<Vec<(String, Option<&'static str>)>>,
}

impl Annotate for Scripted {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), AnnotateError>> {
        self.attempts.lock().expect("lock").push((pod.name.clone(), value));
        let refuse =
            self.refuse.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        let hang = self.hang.load(Ordering::SeqCst);
        let pod = format!("{}/{}", pod.namespace, pod.name);
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            if refuse {
                Err(AnnotateError::Refused { pod, code: 403, message: "forbidden".into() })
            } else {
                Ok(())
            }
        })
    }
}

fn pod(uid: &str, name: &str) -> Pod {
    Pod { uid: uid.into(), name: name.into(), namespace: "demo".into(), ..Default::default() }
}

const FAST: Retry = Retry {
    first: Duration::from_millis(5),
    max: Duration::from_millis(20),
    timeout: Duration::from_millis(200),
};

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn refused_patches_are_counted_and_retried_until_they_pass() {
    let api = Arc::new(Scripted { refuse: AtomicU32::new(3), ..Default::default() });
    let a = Annotations::new(api.clone(), FAST, Counter::default());
    tokio::spawn(a.clone().run());
    a.set(&pod("u1", "web"), Some("enabled"));
    until("the patch passes", || a.pending() == 0).await;
    assert_eq!(a.failures(), 3);
    assert_eq!(*api.attempts.lock().expect("lock"), vec![("web".to_owned(), Some("enabled")); 4]);
}

#[tokio::test]
async fn a_newer_value_replaces_one_not_written_and_deleted_pods_are_dropped() {
    let api = Arc::new(Scripted { refuse: AtomicU32::new(u32::MAX), ..Default::default() });
    let a = Annotations::new(api.clone(), FAST, Counter::default());
    tokio::spawn(a.clone().run());
    a.set(&pod("u1", "web"), Some("pending"));
    until("a first failure", || a.failures() >= 1).await;
    a.set(&pod("u1", "web"), Some("enabled"));
    until("the newer value tried", || {
        api.attempts.lock().expect("lock").iter().any(|(_, v)| *v == Some("enabled"))
    })
    .await;
    assert_eq!(a.pending(), 1, "one pod, one wanted value");
    a.forget("u1");
    assert_eq!(a.pending(), 0);
    let tried = api.attempts.lock().expect("lock").len();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(api.attempts.lock().expect("lock").len(), tried, "a forgotten pod is not patched again");
}

#[tokio::test]
async fn a_hung_api_times_out_and_counts() {
    let api = Arc::new(Scripted { hang: true.into(), ..Default::default() });
    let a = Annotations::new(api.clone(), FAST, Counter::default());
    tokio::spawn(a.clone().run());
    a.set(&pod("u1", "web"), Some("enabled"));
    until("a timeout", || a.failures() >= 1).await;
    assert_eq!(a.pending(), 1);
}

#[test]
fn backoff_doubles_to_the_cap() {
    let r = Retry { first: Duration::from_secs(1), max: Duration::from_secs(60), timeout: Duration::ZERO };
    let waits: Vec<u64> = (1..=8).map(|n| backoff(r, n).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(backoff(r, u32::MAX), Duration::from_secs(60));
}
