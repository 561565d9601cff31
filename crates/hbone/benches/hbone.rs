//! In-process microbenchmarks of HBONE: round trips, new streams and throughput over a real
//! TLS + HTTP/2 tunnel on loopback, against an echo server and through the stream relay.
//!
//! Run: `cargo bench -p ambit-hbone` (add `-- --quick` for a fast pass).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ambit_hbone::Tunnel;
use ambit_hbone::testing::{EchoServer, RelayServer, echo_once, pool_for, pool_to, settings};
use ambit_identity::FakeCa;
use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime;

/// Round trips of `size` bytes through one tunnel.
fn roundtrips(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    id: BenchmarkId,
    tunnel: &mut Tunnel,
    size: usize,
) {
    let payload = Bytes::from(vec![7u8; size]);
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    echo_once(tunnel, &payload).await;
                }
                start.elapsed()
            })
        })
    });
}

/// 4 MiB sent and echoed back through one tunnel, both directions at once.
fn throughput(g: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, tunnel: &Tunnel) {
    const CHUNKS: usize = 16;
    let chunk = Bytes::from(vec![1u8; 256 * 1024]);
    g.throughput(Throughput::Bytes((CHUNKS * chunk.len()) as u64));
    g.bench_function("throughput_4MiB", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let stream = &tunnel.stream;
                    let sender = async {
                        for _ in 0..CHUNKS {
                            stream.send(&chunk).await.expect("send");
                        }
                    };
                    let receiver = async {
                        let mut got = 0;
                        while got < CHUNKS * chunk.len() {
                            let c = stream.recv().await.expect("open").expect("data");
                            got += c.len();
                        }
                    };
                    tokio::join!(sender, receiver);
                }
                start.elapsed()
            })
        })
    });
}

fn hbone(c: &mut Criterion) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let ca = Arc::new(FakeCa::generate());
    let server = rt.block_on(EchoServer::start(&ca, settings()));
    // The certificate manager's worker runs on this runtime.
    let _rt = rt.enter();
    let (pool, key) = pool_for(ca, &server, settings());
    let authority: SocketAddr = "10.0.0.2:8080".parse().expect("addr");
    let headers = http::HeaderMap::new();
    let mut g = c.benchmark_group("hbone");
    for size in [1usize, 1024] {
        let mut tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
        roundtrips(&mut g, &rt, BenchmarkId::new("roundtrip", size), &mut tunnel, size);
    }
    let tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
    throughput(&mut g, &rt, &tunnel);
    g.throughput(Throughput::Elements(1));
    let one = Bytes::from_static(b"x");
    g.bench_function("new_stream_roundtrip", |b| {
        b.to_async(&rt).iter(|| async {
            let mut t = pool.connect(&key, authority, &headers).await.expect("tunnel");
            echo_once(&mut t, &one).await;
        })
    });
    g.finish();
}

/// The stream relay (HTTP/2 stream <-> TCP) between a pooled tunnel and a TCP echo app.
fn relay(c: &mut Criterion) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let ca = Arc::new(FakeCa::generate());
    let server = rt.block_on(RelayServer::start(&ca, settings()));
    let _rt = rt.enter();
    let (pool, key) = pool_to(ca, server.addr, &server.identity, settings());
    let authority: SocketAddr = "10.0.0.2:8080".parse().expect("addr");
    let headers = http::HeaderMap::new();
    let mut g = c.benchmark_group("relay");
    let mut tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
    roundtrips(&mut g, &rt, BenchmarkId::new("roundtrip", 1), &mut tunnel, 1);
    let tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
    throughput(&mut g, &rt, &tunnel);
    g.finish();
}

criterion_group!(benches, hbone, relay);
criterion_main!(benches);
