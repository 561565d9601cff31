//! In-process microbenchmarks of HBONE: round trips, new streams and throughput over a real
//! TLS + HTTP/2 tunnel on loopback, against an echo server and through the stream relay.
//!
//! Run: `cargo bench -p ambit-hbone` (add `-- --quick` for a fast pass).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ambit_hbone::testing::{EchoServer, RelayServer, echo_once, pool_for, pool_to, settings};
use ambit_identity::FakeCa;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

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
        let payload = Bytes::from(vec![7u8; size]);
        let mut tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::new("roundtrip", size), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        echo_once(&mut tunnel, &payload).await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    const CHUNKS: usize = 16;
    let chunk = Bytes::from(vec![1u8; 256 * 1024]);
    let tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
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
    let payload = Bytes::from_static(b"x");
    let mut tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
    g.throughput(Throughput::Bytes(1));
    g.bench_function("roundtrip_1", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    echo_once(&mut tunnel, &payload).await;
                }
                start.elapsed()
            })
        })
    });
    const CHUNKS: usize = 16;
    let chunk = Bytes::from(vec![1u8; 256 * 1024]);
    let tunnel = rt.block_on(pool.connect(&key, authority, &headers)).expect("tunnel");
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
    g.finish();
}

criterion_group!(benches, hbone, relay);
criterion_main!(benches);
