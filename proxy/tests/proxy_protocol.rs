//! PROXY protocol on a port (ClientPolicy `clientIP.proxyProtocol`), sent by the test as an
//! L4 balancer sends it: v1 text and v2 binary headers before the client's bytes, in one
//! write or dribbled, required or optional. The address the header gives is the client's:
//! the upstream's `X-Forwarded-For` and per-client rate limits show it. A connection without
//! a valid header on a port that requires one is closed unanswered and counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::raw_h1::{ask, field, json};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_api::PolicySet;
use tollgate_api::client::{ClientSettings, ProxyProtocol};
use tollgate_api::policy::{Rate, RateLimit};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

const GET: &[u8] = b"GET /api HTTP/1.1\r\nHost: a\r\n\r\n";

/// A proxy whose port reads PROXY headers (`required` or not), routing `/api` to an echo
/// backend under two requests a minute per `source.address`.
async fn proxy(required: bool) -> (EchoBackend, Proxy, SocketAddr, Arc<Metrics>) {
    proxy_trusting(required, vec![]).await
}

/// [`proxy`], taking the header only from peers in `trusted` (empty: any).
async fn proxy_trusting(
    required: bool,
    trusted: Vec<String>,
) -> (EchoBackend, Proxy, SocketAddr, Arc<Metrics>) {
    let b = echo_backend("b").await;
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    let mut r = route("api", "/api", vec![wb("b", 1)]);
    r.policy = Some("p".into());
    let mut port = http_port(0, vec![r]);
    port.client = ClientSettings {
        proxy_protocol: Some(ProxyProtocol {
            required,
            trusted_cidrs: trusted,
        }),
        ..ClientSettings::default()
    };
    let mut t = table(1, vec![port], vec![("b", backend_of(&[&b]))]);
    t.policies.insert(
        "p".into(),
        PolicySet {
            auth: None,
            rate_limits: vec![RateLimit {
                id: "default/limits/per-source".into(),
                rates: vec![Rate {
                    limit: 2,
                    window_ms: 60_000,
                }],
                algorithm: Default::default(),
                counters: vec!["source.address".into()],
                when: vec![],
                cost: None,
                cost_max_body_bytes: None,
                mode: Default::default(),
            }],
        },
    );
    proxy.apply(t).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    (b, proxy, addr, metrics)
}

fn v1(src: &str, sport: u16) -> Vec<u8> {
    let family = if src.contains(':') { "TCP6" } else { "TCP4" };
    let dst = if src.contains(':') {
        "::1"
    } else {
        "127.0.0.1"
    };
    format!("PROXY {family} {src} {dst} {sport} 80\r\n").into_bytes()
}

fn v2(src: SocketAddr) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    match src {
        SocketAddr::V4(a) => {
            h.push(0x11); // AF_INET, STREAM
            h.extend_from_slice(&12u16.to_be_bytes());
            h.extend_from_slice(&a.ip().octets());
            h.extend_from_slice(&[127, 0, 0, 1]);
            h.extend_from_slice(&a.port().to_be_bytes());
            h.extend_from_slice(&80u16.to_be_bytes());
        }
        SocketAddr::V6(a) => {
            h.push(0x21); // AF_INET6, STREAM
            h.extend_from_slice(&36u16.to_be_bytes());
            h.extend_from_slice(&a.ip().octets());
            h.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
            h.extend_from_slice(&a.port().to_be_bytes());
            h.extend_from_slice(&80u16.to_be_bytes());
        }
    }
    h
}

/// Sends `prefix` then asks `GET /api` on a fresh connection; the answer's status and body.
async fn ask_after(addr: SocketAddr, prefix: &[u8]) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(prefix).await.unwrap();
    ask(&mut s, &mut Vec::new(), GET).await
}

fn status(head: &str) -> &str {
    head.split(' ').nth(1).unwrap_or("")
}

/// True when the proxy closes `s` without writing a byte.
async fn closed_unanswered(mut s: TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn a_v1_header_gives_the_client_address() {
    let (b, _p, addr, _) = proxy(true).await;
    let (head, body) = ask_after(addr, &v1("203.0.113.9", 5555)).await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "203.0.113.9");
    assert_eq!(b.hits(), 1);
    let (head, body) = ask_after(addr, &v1("2001:db8::9", 5555)).await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "2001:db8::9");
}

#[tokio::test]
async fn a_v2_header_gives_the_client_address() {
    let (_b, _p, addr, _) = proxy(true).await;
    for src in [
        "198.51.100.4:40000",
        "[2001:db8::4]:40000",
        "[::ffff:198.51.100.5]:1",
    ] {
        let src: SocketAddr = src.parse().unwrap();
        let (head, body) = ask_after(addr, &v2(src)).await;
        assert_eq!(status(&head), "200", "{src}: {head}");
        let want = src.ip().to_canonical().to_string();
        assert_eq!(
            json(&body)["headers"]["x-forwarded-for"],
            want.as_str(),
            "{src}"
        );
    }
}

#[tokio::test]
async fn clients_behind_the_balancer_have_their_own_counters() {
    let (_b, _p, addr, _) = proxy(true).await;
    for _ in 0..2 {
        assert_eq!(
            status(&ask_after(addr, &v1("203.0.113.1", 1)).await.0),
            "200"
        );
    }
    assert_eq!(
        status(&ask_after(addr, &v1("203.0.113.1", 2)).await.0),
        "429"
    );
    let (head, _) = ask_after(addr, &v1("203.0.113.2", 1)).await;
    assert_eq!(status(&head), "200");
    assert_eq!(field(&head, "x-ratelimit-remaining").as_deref(), Some("1"));
}

#[tokio::test]
async fn the_header_may_come_a_byte_at_a_time_or_with_the_request() {
    let (_b, _p, addr, _) = proxy(true).await;
    // Dribbled, then the request in its own write.
    let mut s = TcpStream::connect(addr).await.unwrap();
    for byte in v1("192.0.2.33", 7) {
        s.write_all(&[byte]).await.unwrap();
        s.flush().await.unwrap();
    }
    let (head, body) = ask(&mut s, &mut Vec::new(), GET).await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "192.0.2.33");
    // Header and request in one write; a second request on the same connection keeps the
    // address.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut first = v2("192.0.2.34:9".parse().unwrap());
    first.extend_from_slice(GET);
    s.write_all(&first).await.unwrap();
    let mut buf = Vec::new();
    let (head, body) = common::raw_h1::read_answer(&mut s, &mut buf).await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "192.0.2.34");
    let (head, body) = ask(&mut s, &mut buf, GET).await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "192.0.2.34");
}

#[tokio::test]
async fn without_the_header_a_port_that_requires_it_closes_unanswered() {
    let (b, _p, addr, metrics) = proxy(true).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(GET).await.unwrap();
    assert!(closed_unanswered(s).await);
    // A malformed header, and a header naming a UNIX socket: closed too.
    for bad in [
        &b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n"[..],
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n",
        b"\r\n\r\n\0\r\nQUIT\n\x21\x31\x00\x00",
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(bad).await.unwrap();
        s.write_all(GET).await.unwrap();
        assert!(closed_unanswered(s).await, "{bad:?}");
    }
    assert_eq!(b.hits(), 0, "nothing reached the upstream");
    let text = metrics.encode();
    assert!(
        text.contains(r#"tollgate_proxy_protocol_refused_total{reason="missing"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"reason="v1_spacing""#), "{text}");
    assert!(text.contains(r#"reason="v1_port""#), "{text}");
}

#[tokio::test]
async fn an_optional_header_serves_connections_with_and_without_it() {
    let (_b, _p, addr, _) = proxy(false).await;
    let (head, body) = ask_after(addr, &v1("203.0.113.77", 1)).await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "203.0.113.77");
    let (head, body) = ask_after(addr, b"").await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "127.0.0.1");
}

#[tokio::test]
async fn a_local_header_keeps_the_connections_own_address() {
    let (_b, _p, addr, _) = proxy(true).await;
    // v2 LOCAL (a balancer's health check), and v1 UNKNOWN.
    let local = b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00";
    for prefix in [&local[..], b"PROXY UNKNOWN\r\n"] {
        let (head, body) = ask_after(addr, prefix).await;
        assert_eq!(status(&head), "200", "{head}");
        assert_eq!(json(&body)["headers"]["x-forwarded-for"], "127.0.0.1");
    }
}

#[tokio::test]
async fn only_trusted_peers_may_send_the_header() {
    // The test's peer is 127.0.0.1: outside 10.0.0.0/8.
    let (b, _p, addr, metrics) = proxy_trusting(true, vec!["10.0.0.0/8".into()]).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(&v1("10.1.2.3", 1)).await;
    let _ = s.write_all(GET).await;
    assert!(
        closed_unanswered(s).await,
        "a required header from an untrusted peer"
    );
    assert_eq!(b.hits(), 0);
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_proxy_protocol_refused_total{reason="untrusted_peer"} 1"#),
        "{}",
        metrics.encode()
    );
    // Optional: an untrusted peer is served as it is, its header read as HTTP (400).
    let (_b, _p2, addr, _) = proxy_trusting(false, vec!["10.0.0.0/8".into()]).await;
    let (head, body) = ask_after(addr, b"").await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "127.0.0.1");
    let (head, _) = ask_after(addr, &v1("10.1.2.3", 1)).await;
    assert_eq!(status(&head), "400", "{head}");
    // A trusted peer's header is read.
    let (_b, _p3, addr, _) = proxy_trusting(true, vec!["127.0.0.0/8".into()]).await;
    let (head, body) = ask_after(addr, &v1("10.1.2.3", 1)).await;
    assert_eq!(status(&head), "200", "{head}");
    assert_eq!(json(&body)["headers"]["x-forwarded-for"], "10.1.2.3");
}
