//! ClientPolicy limits on the wire (`ports[].client.limits` of the table): head size and
//! field count (431), body size (413, declared or streamed; a route's own limit replacing
//! the port's), connections per client address (closed unanswered beyond, counted), the
//! header, idle, body and request deadlines of a port (set short here), and the HTTP/2
//! stream cap it announces. Limits of a port leave other ports at the proxy's own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::raw_h1::{ask, read_answer};
use common::raw_h2::{PREFACE, SETTINGS, frame, read_frame};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_api::client::{ClientLimits, ClientSettings};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

/// A proxy with two ports to an echo backend: the first with `limits`, the second without.
async fn proxy(limits: ClientLimits) -> (EchoBackend, Proxy, SocketAddr, SocketAddr, Arc<Metrics>) {
    let b = echo_backend("b").await;
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    let (p1, p2) = (free_port(), free_port());
    let mut limited = http_port(p1, vec![route("api", "/", vec![wb("b", 1)])]);
    limited.client = ClientSettings {
        limits,
        ..ClientSettings::default()
    };
    let plain = http_port(p2, vec![route("api", "/", vec![wb("b", 1)])]);
    proxy
        .apply(table(
            1,
            vec![limited, plain],
            vec![("b", backend_of(&[&b]))],
        ))
        .await
        .unwrap();
    let a1 = proxy.local_addr(p1).unwrap();
    let a2 = proxy.local_addr(p2).unwrap();
    (b, proxy, a1, a2, metrics)
}

fn status(head: &str) -> &str {
    head.split(' ').nth(1).unwrap_or("")
}

async fn ask_on(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    ask(&mut s, &mut Vec::new(), request).await.0
}

/// What the proxy writes on `s` until it closes it (EOF or reset).
async fn closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the connection was not closed; got {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

fn with_fields(n: usize) -> Vec<u8> {
    let mut r = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 1..n {
        r.extend_from_slice(format!("x-f{i}: v\r\n").as_bytes());
    }
    r.extend_from_slice(b"\r\n");
    r
}

#[tokio::test]
async fn a_head_over_the_ports_size_or_field_count_is_431() {
    let (_b, _p, limited, plain, _) = proxy(ClientLimits {
        max_request_headers_bytes: Some(2048),
        max_request_headers: Some(5),
        ..ClientLimits::default()
    })
    .await;
    assert_eq!(status(&ask_on(limited, &with_fields(5)).await), "200");
    assert_eq!(status(&ask_on(limited, &with_fields(6)).await), "431");
    assert_eq!(
        status(&ask_on(plain, &with_fields(6)).await),
        "200",
        "the other port"
    );

    let big = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nx-big: {}\r\n\r\n",
        "v".repeat(3000)
    );
    assert_eq!(status(&ask_on(limited, big.as_bytes()).await), "431");
    assert_eq!(status(&ask_on(plain, big.as_bytes()).await), "200");
}

#[tokio::test]
async fn a_body_over_the_ports_size_is_413_declared_or_streamed() {
    let (b, _p, limited, plain, _) = proxy(ClientLimits {
        max_request_body_bytes: Some(10),
        ..ClientLimits::default()
    })
    .await;
    let post = |body: &str| {
        format!(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    assert_eq!(
        status(&ask_on(limited, post("0123456789").as_bytes()).await),
        "200"
    );
    let hits = b.hits();
    assert_eq!(
        status(&ask_on(limited, post("0123456789x").as_bytes()).await),
        "413"
    );
    assert_eq!(
        b.hits(),
        hits,
        "a declared length over the limit never goes upstream"
    );
    let chunked = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n012345\r\n6\r\n6789ab\r\n0\r\n\r\n";
    assert_eq!(status(&ask_on(limited, chunked).await), "413");
    assert_eq!(status(&ask_on(plain, chunked).await), "200");
}

#[tokio::test]
async fn a_client_past_its_connections_is_closed_unanswered() {
    let (_b, _p, limited, plain, metrics) = proxy(ClientLimits {
        max_connections_per_client: Some(2),
        ..ClientLimits::default()
    })
    .await;
    let get = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut one = TcpStream::connect(limited).await.unwrap();
    let mut two = TcpStream::connect(limited).await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(status(&ask(&mut one, &mut buf, get).await.0), "200");
    let mut buf2 = Vec::new();
    assert_eq!(status(&ask(&mut two, &mut buf2, get).await.0), "200");
    // The third, while both are open: closed without an answer.
    let mut three = TcpStream::connect(limited).await.unwrap();
    let _ = three.write_all(get).await;
    assert!(closed(&mut three).await.is_empty());
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_connections_refused_total{reason="per_client_limit"} 1"#),
        "{}",
        metrics.encode()
    );
    // The other port does not count them.
    for _ in 0..3 {
        assert_eq!(status(&ask_on(plain, get).await), "200");
    }
    // One closed: a new one is served once the proxy has seen the close.
    drop(one);
    let mut served = false;
    for _ in 0..100 {
        let mut s = TcpStream::connect(limited).await.unwrap();
        let _ = s.write_all(get).await;
        let mut b = Vec::new();
        if let Ok((head, _)) =
            tokio::time::timeout(Duration::from_millis(500), read_answer(&mut s, &mut b)).await
            && status(&head) == "200"
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "a closed connection gives its place back");
    drop(two);
}

#[tokio::test]
async fn a_head_slower_than_the_ports_header_timeout_closes_the_connection() {
    let (_b, _p, limited, _plain, _) = proxy(ClientLimits {
        request_header_timeout_ms: Some(200),
        idle_timeout_ms: Some(10_000),
        ..ClientLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(limited).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await.unwrap();
    // The rest never comes: the connection ends.
    assert!(!String::from_utf8_lossy(&closed(&mut s).await).contains("200"));
    // A whole head within it is served.
    assert_eq!(
        status(&ask_on(limited, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await),
        "200"
    );
}

#[tokio::test]
async fn a_connection_idle_past_the_ports_idle_timeout_is_closed() {
    let (_b, _p, limited, _plain, _) = proxy(ClientLimits {
        idle_timeout_ms: Some(200),
        ..ClientLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(limited).await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        status(
            &ask(&mut s, &mut buf, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .0
        ),
        "200"
    );
    // No next request: closed.
    assert!(closed(&mut s).await.is_empty());
}

#[tokio::test]
async fn a_body_slower_than_the_ports_body_timeout_is_408() {
    let (_b, _p, limited, _plain, _) = proxy(ClientLimits {
        request_body_timeout_ms: Some(300),
        ..ClientLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(limited).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0")
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&closed(&mut s).await).into_owned();
    assert_eq!(status(&answer), "408", "{answer}");
}

#[tokio::test]
async fn a_routes_body_limit_replaces_the_ports() {
    let b = echo_backend("b").await;
    let proxy = Proxy::new(ProxyOptions::default());
    let mut upload = route("upload", "/upload", vec![wb("b", 1)]);
    upload.max_request_body_bytes = Some(100);
    let mut tight = route("tight", "/tight", vec![wb("b", 1)]);
    tight.max_request_body_bytes = Some(4);
    let mut port = http_port(0, vec![upload, tight, route("api", "/", vec![wb("b", 1)])]);
    port.client = ClientSettings {
        limits: ClientLimits {
            max_request_body_bytes: Some(10),
            ..ClientLimits::default()
        },
        ..ClientSettings::default()
    };
    proxy
        .apply(table(1, vec![port], vec![("b", backend_of(&[&b]))]))
        .await
        .unwrap();
    let addr = proxy.local_addr(0).unwrap();
    let body = "x".repeat(50);
    let post =
        |path: &str| format!("POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 50\r\n\r\n{body}");
    assert_eq!(
        status(&ask_on(addr, post("/upload").as_bytes()).await),
        "200"
    );
    assert_eq!(status(&ask_on(addr, post("/").as_bytes()).await), "413");
    let five = "POST /tight HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n12345";
    assert_eq!(status(&ask_on(addr, five.as_bytes()).await), "413");
    // Streamed (chunked): the route's limit holds too.
    let chunked = format!(
        "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n32\r\n{body}\r\n32\r\n{body}\r\n32\r\n{body}\r\n0\r\n\r\n"
    );
    assert_eq!(status(&ask_on(addr, chunked.as_bytes()).await), "413");
}

#[tokio::test]
async fn a_request_slower_than_the_ports_request_timeout_is_504() {
    let slow = slow_backend("slow", 3_000).await;
    let proxy = Proxy::new(ProxyOptions::default());
    let mut port = http_port(0, vec![route("api", "/", vec![wb("b", 1)])]);
    port.client = ClientSettings {
        limits: ClientLimits {
            request_timeout_ms: Some(200),
            ..ClientLimits::default()
        },
        ..ClientSettings::default()
    };
    proxy
        .apply(table(1, vec![port], vec![("b", backend_of(&[&slow]))]))
        .await
        .unwrap();
    let addr = proxy.local_addr(0).unwrap();
    assert_eq!(
        status(&ask_on(addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await),
        "504"
    );
}

/// The HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS a port announces.
async fn announced_streams(addr: SocketAddr) -> Option<u32> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    let settings = loop {
        let (kind, flags, _, payload) = read_frame(&mut s).await.expect("no SETTINGS");
        if kind == SETTINGS && flags & 1 == 0 {
            break payload;
        }
    };
    settings
        .chunks(6)
        .find(|c| c[..2] == [0, 3])
        .map(|c| u32::from_be_bytes([c[2], c[3], c[4], c[5]]))
}

#[tokio::test]
async fn a_port_announces_its_own_http2_stream_cap() {
    let (_b, _p, limited, plain, _) = proxy(ClientLimits {
        http2_max_concurrent_streams: Some(7),
        ..ClientLimits::default()
    })
    .await;
    assert_eq!(announced_streams(limited).await, Some(7));
    assert_eq!(
        announced_streams(plain).await,
        Some(100),
        "the proxy's default"
    );
}

#[tokio::test]
async fn a_head_begun_after_waiting_still_has_only_the_header_timeout() {
    // The idle wait arms the connection's timer for the long idle deadline; the head that
    // then begins must still be cut at the short header deadline.
    let (_b, _p, limited, _plain, _) = proxy(ClientLimits {
        request_header_timeout_ms: Some(200),
        idle_timeout_ms: Some(60_000),
        ..ClientLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(limited).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"G").await.unwrap();
    assert!(
        closed(&mut s).await.is_empty(),
        "closed long before the idle deadline"
    );
}

#[tokio::test]
async fn an_upgraded_connection_keeps_its_place_in_the_count() {
    use futures_util::{SinkExt as _, StreamExt as _};
    let (_b, _p, limited, _plain, metrics) = proxy(ClientLimits {
        max_connections_per_client: Some(2),
        ..ClientLimits::default()
    })
    .await;
    let mut sockets = Vec::new();
    for _ in 0..2 {
        let tcp = TcpStream::connect(limited).await.unwrap();
        let (mut ws, resp) = tokio_tungstenite::client_async(format!("ws://{limited}/chat"), tcp)
            .await
            .unwrap();
        assert_eq!(resp.status(), http::StatusCode::SWITCHING_PROTOCOLS);
        ws.send(tokio_tungstenite::tungstenite::Message::text("hi"))
            .await
            .unwrap();
        assert!(ws.next().await.is_some());
        sockets.push(ws);
    }
    // Two WebSockets open: a third connection is over the limit.
    let mut third = TcpStream::connect(limited).await.unwrap();
    let _ = third.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert!(closed(&mut third).await.is_empty());
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_connections_refused_total{reason="per_client_limit"} 1"#)
    );
}
