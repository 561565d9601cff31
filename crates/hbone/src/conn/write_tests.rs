//! The shared socket writes: records sealed while another task writes go out with that task's
//! next write (one write for what was ready together), and the driver wakes the streams it
//! delivered to only after it released the connection's lock.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::task::Wake;
use std::time::Duration;

use ambit_identity::FakeCa;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::stream_io_tests::{echo, server};
use super::*;
use crate::testing::{pool_to, server_identity, settings};

const T: Duration = Duration::from_secs(20);

/// Two streams of one pooled connection to an echo server.
async fn two_streams(ca: Arc<FakeCa>, addr: SocketAddr) -> (StreamIo, StreamIo) {
    let (pool, key) = pool_to(ca, addr, &server_identity(), settings());
    let authority: SocketAddr = "10.0.0.2:8080".parse().expect("addr");
    let a = pool.connect(&key, authority, &HeaderMap::new()).await.expect("connect").into_io();
    let b = pool.connect(&key, authority, &HeaderMap::new()).await.expect("connect").into_io();
    assert!(Arc::ptr_eq(&a.handle().shared, &b.handle().shared), "one connection");
    (a, b)
}

#[tokio::test]
async fn records_sealed_while_a_task_writes_go_out_in_its_next_write() {
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, settings(), echo).await;
    let (mut a, mut b) = two_streams(ca, addr).await;
    let shared = a.handle().shared.clone();
    // Another task is in the middle of a write (as a worker thread in `send` would be).
    shared.lock().writing = true;
    let before = shared.writes.load(Ordering::Relaxed);
    // Both writes return at once, their records queued behind it: no socket write, no wait.
    tokio::time::timeout(Duration::from_secs(1), a.write_all(b"one")).await.expect("no wait").expect("write");
    tokio::time::timeout(Duration::from_secs(1), b.write_all(b"two")).await.expect("no wait").expect("write");
    assert_eq!(shared.writes.load(Ordering::Relaxed), before, "written while another task writes");
    let queued = shared.lock().out.len();
    assert_eq!(queued, 2 * (tls::OVERHEAD + frame::HEADER_LEN + 3), "two records queued");
    // The writer's write is done: it writes both records, with one write.
    shared.write_queued(shared.lock());
    assert_eq!(shared.writes.load(Ordering::Relaxed), before + 1, "one write for both records");
    assert!(!shared.lock().writing, "the writer gave its role up");
    let (mut got_a, mut got_b) = ([0u8; 3], [0u8; 3]);
    tokio::time::timeout(T, a.read_exact(&mut got_a)).await.expect("in time").expect("echo a");
    tokio::time::timeout(T, b.read_exact(&mut got_b)).await.expect("in time").expect("echo b");
    assert_eq!((&got_a, &got_b), (b"one", b"two"));
    // With no writer, a task writes its own records at once.
    let before = shared.writes.load(Ordering::Relaxed);
    a.write_all(b"three").await.expect("write");
    assert_eq!(shared.writes.load(Ordering::Relaxed), before + 1);
    let mut got = [0u8; 5];
    tokio::time::timeout(T, a.read_exact(&mut got)).await.expect("in time").expect("echo");
    assert_eq!(&got, b"three");
}

/// A waker that notes whether the connection's lock was free when it was woken.
struct LockProbe {
    shared: Arc<Shared>,
    free: std::sync::Mutex<Option<bool>>,
    woken: tokio::sync::Notify,
}

impl Wake for LockProbe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let free = self.shared.state.try_lock().is_ok();
        *self.free.lock().expect("probe") = Some(free);
        self.woken.notify_one();
    }
}

#[tokio::test]
async fn a_stream_is_woken_for_its_bytes_after_the_driver_released_the_lock() {
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, settings(), echo).await;
    let (mut a, _b) = two_streams(ca, addr).await;
    let probe = Arc::new(LockProbe {
        shared: a.handle().shared.clone(),
        free: std::sync::Mutex::new(None),
        woken: tokio::sync::Notify::new(),
    });
    // The reader waits (nothing was sent yet) with the probe as its waker.
    let waker = std::task::Waker::from(probe.clone());
    let mut cx = Context::from_waker(&waker);
    let mut buf = [0u8; 4];
    let mut rb = tokio::io::ReadBuf::new(&mut buf);
    assert!(Pin::new(&mut a).poll_read(&mut cx, &mut rb).is_pending());
    a.write_all(b"ping").await.expect("write");
    tokio::time::timeout(T, probe.woken.notified()).await.expect("woken in time");
    assert_eq!(*probe.free.lock().expect("probe"), Some(true), "woken while the driver held the lock");
    let mut got = [0u8; 4];
    tokio::time::timeout(T, a.read_exact(&mut got)).await.expect("in time").expect("echo");
    assert_eq!(&got, b"ping");
}
