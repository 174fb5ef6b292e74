//! Tests of module `pool`: real sockets on 127.0.0.1.

use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use http::Request;

use super::*;
use crate::lifecycle::body::empty;

/// A backend answering `n` requests per connection, then closing; counts connections.
async fn backend(per_conn: usize) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = conns.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                for _ in 0..per_conn {
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                }
            });
        }
    });
    (addr, conns)
}

fn get() -> Request<ProxyBody> {
    Request::builder()
        .uri("/")
        .header("host", "t")
        .body(empty())
        .unwrap()
}

/// A request with a body: module `h1`'s streaming exchange.
fn post() -> Request<ProxyBody> {
    Request::builder()
        .method("POST")
        .uri("/")
        .header("host", "t")
        .header("content-length", "1")
        .body(crate::lifecycle::body::full("x"))
        .unwrap()
}

async fn roundtrip(pool: &Arc<EndpointPool>) {
    roundtrip_with(pool, get()).await;
}

async fn roundtrip_with(pool: &Arc<EndpointPool>, req: Request<ProxyBody>) {
    let resp = pool.send(req, &Added::default()).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
}

#[tokio::test]
async fn reuses_one_connection_for_sequential_requests() {
    let (addr, conns) = backend(usize::MAX).await;
    let pool = Pools::default().pool_for(addr, &Default::default());
    for _ in 0..5 {
        roundtrip(&pool).await;
    }
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(pool.idle_len(), 1);
}

#[tokio::test]
async fn requests_with_and_without_bodies_share_one_connection() {
    let (addr, conns) = backend(usize::MAX).await;
    let pool = Pools::default().pool_for(addr, &Default::default());
    for _ in 0..3 {
        roundtrip_with(&pool, post()).await;
    }
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    roundtrip(&pool).await;
    roundtrip_with(&pool, post()).await;
    roundtrip(&pool).await;
    // One HTTP/1 client now: every exchange on the one connection, back on one stack.
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(pool.idle_len(), 1);
}

#[tokio::test]
async fn connection_closed_by_peer_is_replaced() {
    let (addr, conns) = backend(1).await;
    let pool = Pools::default().pool_for(addr, &Default::default());
    for _ in 0..3 {
        roundtrip(&pool).await;
        // Let the driver see the close.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn sweep_closes_connections_idle_through_two_sweeps() {
    let (addr, _) = backend(usize::MAX).await;
    let pool = Pools::default().pool_for(addr, &Default::default());
    roundtrip(&pool).await;
    roundtrip_with(&pool, post()).await;
    // Two at once, so two connections.
    let none = Added::default();
    let (a, b) = tokio::join!(pool.send(get(), &none), pool.send(post(), &none));
    for r in [a, b] {
        r.unwrap().into_body().collect().await.unwrap();
    }
    pool.sweep();
    assert_eq!(pool.idle_len(), 2);
    pool.sweep();
    assert_eq!(pool.idle_len(), 0);
}

#[tokio::test]
async fn same_address_shares_a_pool_until_dropped() {
    let pools = Pools::default();
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let a = pools.pool_for(addr, &Default::default());
    assert!(Arc::ptr_eq(&a, &pools.pool_for(addr, &Default::default())));
    let weak = Arc::downgrade(&a);
    drop(a);
    assert!(weak.upgrade().is_none());
}

#[tokio::test]
async fn refused_connect_is_a_connect_error() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let pool = Pools::default().pool_for(addr, &Default::default());
    let err = pool.send(get(), &Added::default()).await.unwrap_err();
    assert!(err.is_connect(), "{err}");
}

#[tokio::test]
async fn a_connection_serves_at_most_its_requests_and_idles_at_most_its_timeout() {
    let (addr, conns) = backend(usize::MAX).await;
    let pools = Pools::default();
    let capped = Connection {
        max_requests_per_connection: Some(2),
        ..Connection::default()
    };
    let pool = pools.pool_for(addr, &capped);
    assert!(!Arc::ptr_eq(
        &pool,
        &pools.pool_for(addr, &Connection::default())
    ));
    for _ in 0..6 {
        roundtrip(&pool).await;
    }
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 3);
    let (addr, conns) = backend(usize::MAX).await;
    let short = Connection {
        idle_timeout_ms: Some(50),
        ..Connection::default()
    };
    let pool = pools.pool_for(addr, &short);
    roundtrip(&pool).await;
    roundtrip(&pool).await;
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(120)).await;
    roundtrip(&pool).await;
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 2);
}
