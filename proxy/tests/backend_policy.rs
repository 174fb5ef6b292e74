//! BackendPolicy settings over real sockets: outlier ejection and return, the most that may
//! be ejected, the panic threshold, the circuit breaker's cap on what reaches a backend, and
//! consistent hashing (a client kept on its endpoint by cookie, keys spread evenly, a key
//! moved when its endpoint goes away; by a CEL expression in `expression_hash`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "backend_policy/expression_hash.rs"]
mod expression_hash;
/// The policy tests' JWT and API-key fixtures.
#[path = "policy/support.rs"]
#[allow(dead_code)]
mod policy_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tollgate_api::backend::{BackendSettings, CircuitBreaker, HashOn, OutlierDetection};
use tollgate_api::{Backend, BackendProtocol, Endpoint, LoadBalancer};

/// A keep-alive backend answering every request with `status` and its own name; it counts
/// requests, and the most it held at once when `hold` makes it wait for the test.
struct Named {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    at_once: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

async fn named(name: &'static str, status: u16, hold: Option<Arc<tokio::sync::Notify>>) -> Named {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let n = Named {
        addr: listener.local_addr().unwrap(),
        hits: Arc::default(),
        at_once: Arc::default(),
        most: Arc::default(),
    };
    let (hits, at_once, most) = (n.hits.clone(), n.at_once.clone(), n.most.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (hits, at_once, most, hold) =
                (hits.clone(), at_once.clone(), most.clone(), hold.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => got.extend_from_slice(&buf[..k]),
                        }
                    }
                    hits.fetch_add(1, Ordering::SeqCst);
                    let now = at_once.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    if let Some(h) = &hold {
                        h.notified().await;
                    }
                    at_once.fetch_sub(1, Ordering::SeqCst);
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{name}",
                        name.len()
                    );
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    n
}

fn backend(addrs: &[SocketAddr], lb: LoadBalancer, settings: BackendSettings) -> Backend {
    Backend {
        protocol: BackendProtocol::Http1,
        load_balancer: lb,
        endpoints: addrs
            .iter()
            .map(|a| Endpoint {
                ip: a.ip().to_string(),
                port: a.port(),
            })
            .collect(),
        settings,
        tls: None,
    }
}

fn outlier(consecutive_5xx: u32, base_ms: u64, max_percent: u32) -> BackendSettings {
    BackendSettings {
        outlier: Some(OutlierDetection {
            consecutive_5xx: Some(consecutive_5xx),
            consecutive_gateway_errors: None,
            consecutive_local_origin_failures: None,
            interval_ms: 60_000,
            base_ejection_ms: base_ms,
            max_ejection_percent: max_percent,
        }),
        ..BackendSettings::default()
    }
}

async fn get_n(url: &str, n: usize) -> BTreeMap<u16, usize> {
    let c = h1_client();
    let mut by = BTreeMap::new();
    for _ in 0..n {
        *by.entry(get(&c, url).await.status.as_u16()).or_default() += 1;
    }
    by
}

#[tokio::test]
async fn an_endpoint_answering_503_is_ejected_and_comes_back_after_the_ejection_time() {
    let sick = named("sick", 503, None).await;
    let a = named("a", 200, None).await;
    let b = named("b", 200, None).await;
    let def = backend(
        &[sick.addr, a.addr, b.addr],
        LoadBalancer::RoundRobin,
        outlier(3, 1_500, 50),
    );
    let (_p, url, metrics) =
        proxy_with_metrics(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", def)]).await;
    let url = format!("{url}/");
    // Round robin: every third request meets the sick one until its third 503 ejects it.
    get_n(&url, 9).await;
    assert_eq!(sick.hits.load(Ordering::SeqCst), 3);
    assert!(
        metrics
            .encode()
            .contains("tollgate_upstream_ejections_total 1")
    );
    let by = get_n(&url, 30).await;
    assert_eq!(by.get(&503), None, "{by:?}");
    assert_eq!(sick.hits.load(Ordering::SeqCst), 3, "ejected: no traffic");
    let gauge = |n: usize| format!(r#"tollgate_backend_healthy_endpoints{{backend="b"}} {n}"#);
    assert!(metrics.encode().contains(&gauge(2)));
    // After the ejection time it is tried again (and, still failing, ejected again); the
    // gauge sees the ejection end without a request.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert!(eventually(|| metrics.encode().contains(&gauge(3))).await);
    let by = get_n(&url, 12).await;
    assert!(sick.hits.load(Ordering::SeqCst) > 3, "{by:?}");
    assert!(
        metrics
            .encode()
            .contains("tollgate_upstream_ejections_total 2")
    );
}

#[tokio::test]
async fn no_more_than_max_ejection_percent_are_ejected() {
    let s1 = named("s1", 500, None).await;
    let s2 = named("s2", 500, None).await;
    let a = named("a", 200, None).await;
    let b = named("b", 200, None).await;
    // 25% of four: one.
    let def = backend(
        &[s1.addr, s2.addr, a.addr, b.addr],
        LoadBalancer::RoundRobin,
        outlier(2, 60_000, 25),
    );
    let (_p, url, metrics) =
        proxy_with_metrics(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", def)]).await;
    let url = format!("{url}/");
    get_n(&url, 40).await;
    assert!(
        metrics
            .encode()
            .contains("tollgate_upstream_ejections_total 1")
    );
    let before = (
        s1.hits.load(Ordering::SeqCst),
        s2.hits.load(Ordering::SeqCst),
    );
    let by = get_n(&url, 30).await;
    let after = (
        s1.hits.load(Ordering::SeqCst),
        s2.hits.load(Ordering::SeqCst),
    );
    // One of the two sick ones is out, the other still served a share.
    let grew = [after.0 > before.0, after.1 > before.1];
    assert_eq!(
        grew.iter().filter(|g| **g).count(),
        1,
        "{before:?} {after:?} {by:?}"
    );
}

#[tokio::test]
async fn below_the_panic_threshold_ejected_endpoints_serve_again() {
    let s1 = named("s1", 502, None).await;
    let s2 = named("s2", 502, None).await;
    let a = named("a", 200, None).await;
    let mut settings = outlier(1, 60_000, 100);
    settings.panic_threshold_percent = 50;
    let def = backend(
        &[s1.addr, s2.addr, a.addr],
        LoadBalancer::RoundRobin,
        settings,
    );
    let (_p, url, metrics) =
        proxy_with_metrics(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", def)]).await;
    let url = format!("{url}/");
    get_n(&url, 6).await;
    assert!(
        metrics
            .encode()
            .contains("tollgate_upstream_ejections_total 2")
    );
    // One of three up (33%) is below 50%: all three take traffic again.
    let before = (
        s1.hits.load(Ordering::SeqCst),
        s2.hits.load(Ordering::SeqCst),
    );
    let by = get_n(&url, 30).await;
    assert!(by.get(&502).copied().unwrap_or(0) > 0, "{by:?}");
    assert!(s1.hits.load(Ordering::SeqCst) > before.0 && s2.hits.load(Ordering::SeqCst) > before.1);
}

#[tokio::test]
async fn the_circuit_breaker_caps_requests_at_the_backend_and_answers_503_beyond() {
    let release = Arc::new(tokio::sync::Notify::new());
    let held = named("held", 200, Some(release.clone())).await;
    let settings = BackendSettings {
        circuit_breaker: CircuitBreaker {
            max_connections: Some(3),
            max_pending_requests: Some(2),
            ..CircuitBreaker::default()
        },
        ..BackendSettings::default()
    };
    let def = backend(&[held.addr], LoadBalancer::LeastRequest, settings);
    let (_p, url, metrics) =
        proxy_with_metrics(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", def)]).await;
    let url = format!("{url}/");
    let mut calls = Vec::new();
    for _ in 0..10 {
        let url = url.clone();
        calls.push(tokio::spawn(
            async move { get(&h1_client(), &url).await.status },
        ));
    }
    // Three reach the backend, two wait for them, five are refused at once.
    assert!(
        eventually(|| held.at_once.load(Ordering::SeqCst) == 3
            && calls.iter().filter(|c| c.is_finished()).count() == 5)
        .await,
        "three at the backend and five answered"
    );
    // Let every held request go, round after round, until all are answered.
    while !calls.iter().all(|c| c.is_finished()) {
        release.notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut answered = BTreeMap::new();
    for c in calls {
        *answered.entry(c.await.unwrap().as_u16()).or_insert(0) += 1;
    }
    assert_eq!(
        held.most.load(Ordering::SeqCst),
        3,
        "never more than maxConnections at once"
    );
    assert_eq!(
        held.hits.load(Ordering::SeqCst),
        5,
        "three, then the two that waited"
    );
    assert_eq!(answered, BTreeMap::from([(200, 5), (503, 5)]));
    let text = metrics.encode();
    assert!(
        text.contains(
            r#"tollgate_circuit_breaker_rejections_total{limit="max_pending_requests"} 5"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_hash_cookie_keeps_a_client_on_its_endpoint_and_moves_it_when_that_one_goes() {
    let eps = [
        named("a", 200, None).await,
        named("b", 200, None).await,
        named("c", 200, None).await,
    ];
    let addrs: Vec<SocketAddr> = eps.iter().map(|e| e.addr).collect();
    let settings = BackendSettings {
        hash: Some(HashOn::Cookie {
            name: "sid".into(),
            ttl_secs: None,
        }),
        ..BackendSettings::default()
    };
    let proxy = tollgate_proxy::Proxy::new(tollgate_proxy::ProxyOptions::default());
    let apply = |v: u64, addrs: &[SocketAddr]| {
        table(
            v,
            vec![http_port(0, vec![route("r", "/", vec![wb("b", 1)])])],
            vec![(
                "b",
                backend(addrs, LoadBalancer::ConsistentHash, settings.clone()),
            )],
        )
    };
    proxy.apply(apply(1, &addrs)).await.unwrap();
    let url = format!("http://{}/", proxy.local_addr(0).unwrap());
    let c = h1_client();
    let first = get(&c, &url).await;
    let set = first.headers["set-cookie"].to_str().unwrap().to_owned();
    let cookie = set.split(';').next().unwrap().to_owned();
    let home = String::from_utf8(first.body.to_vec()).unwrap();
    let with_cookie = || {
        Request::get(&url)
            .header("cookie", &cookie)
            .body(Full::<Bytes>::default())
            .unwrap()
    };
    for _ in 0..100 {
        let a = send(&c, with_cookie()).await;
        assert_eq!(String::from_utf8(a.body.to_vec()).unwrap(), home);
        assert!(a.headers.get("set-cookie").is_none());
    }
    // Its endpoint leaves the Service: the client moves, and stays where it moved.
    let i = ["a", "b", "c"].iter().position(|n| *n == home).unwrap();
    let rest: Vec<SocketAddr> = addrs.iter().copied().filter(|a| *a != addrs[i]).collect();
    proxy.apply(apply(2, &rest)).await.unwrap();
    let moved = String::from_utf8(send(&c, with_cookie()).await.body.to_vec()).unwrap();
    assert_ne!(moved, home);
    for _ in 0..20 {
        let a = send(&c, with_cookie()).await;
        assert_eq!(String::from_utf8(a.body.to_vec()).unwrap(), moved);
    }
}

#[tokio::test]
async fn header_keys_spread_within_ten_percent_over_the_endpoints() {
    let eps = [
        named("a", 200, None).await,
        named("b", 200, None).await,
        named("c", 200, None).await,
    ];
    let addrs: Vec<SocketAddr> = eps.iter().map(|e| e.addr).collect();
    let settings = BackendSettings {
        hash: Some(HashOn::Header("x-user-id".into())),
        ..BackendSettings::default()
    };
    let def = backend(&addrs, LoadBalancer::ConsistentHash, settings);
    let (_p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", def)]).await;
    let c = h1_client();
    // Enough keys that their own sampling noise (about 1.3% of a third) leaves the ring's
    // unevenness to judge: the ring is placed by the endpoints' addresses, random ports here.
    let keys = 12_000;
    for k in 0..keys {
        let req = Request::get(format!("{url}/"))
            .header("x-user-id", format!("user-{k}"))
            .body(Full::<Bytes>::default())
            .unwrap();
        assert_eq!(send(&c, req).await.status, StatusCode::OK);
    }
    let fair = keys / 3;
    for e in &eps {
        let got = e.hits.load(Ordering::SeqCst);
        assert!(got.abs_diff(fair) * 10 <= fair, "{got} of {keys}");
    }
}

fn session_route(carrier: tollgate_api::backend::SessionCarrier) -> tollgate_api::Route {
    let mut r = route("r", "/", vec![wb("b", 1)]);
    r.session = Some(tollgate_api::backend::Session {
        name: "sid".into(),
        carrier,
        absolute_secs: None,
        idle_secs: None,
        permanent: false,
    });
    r.retry = Some(tollgate_api::Retry {
        attempts: 2,
        backoff_ms: 1,
        codes: vec![],
    });
    r
}

/// Session persistence (the route's `sessionPersistence`), by cookie and by header: a
/// client's 100 requests reach one endpoint; when that endpoint dies the next request is
/// retried elsewhere and the session moves with it, and stays there.
#[tokio::test]
async fn a_session_keeps_a_client_on_its_endpoint_and_moves_when_it_goes() {
    use tollgate_api::backend::SessionCarrier;
    for carrier in [SessionCarrier::Cookie, SessionCarrier::Header] {
        let eps = [
            named("a", 200, None).await,
            named("b", 200, None).await,
            named("c", 200, None).await,
        ];
        // A listener of the test's own that it closes stands for a dying endpoint: a fourth.
        let doomed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let doomed_addr = doomed.local_addr().unwrap();
        drop(doomed);
        let addrs: Vec<SocketAddr> = eps.iter().map(|e| e.addr).collect();
        let def = backend(
            &addrs,
            LoadBalancer::LeastRequest,
            BackendSettings::default(),
        );
        let (_p, url) = proxy_with(vec![session_route(carrier)], vec![("b", def)]).await;
        let url = format!("{url}/");
        let c = h1_client();
        let first = get(&c, &url).await;
        let field = |a: &Answer| match carrier {
            SessionCarrier::Cookie => a
                .headers
                .get("set-cookie")
                .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned()),
            SessionCarrier::Header => a.headers.get("sid").map(|v| v.to_str().unwrap().to_owned()),
        };
        let token = field(&first).unwrap_or_else(|| panic!("{carrier:?}: no session: {first:?}"));
        let home = String::from_utf8(first.body.to_vec()).unwrap();
        let with = |token: &str| {
            let b = Request::get(&url);
            let b = match carrier {
                SessionCarrier::Cookie => b.header("cookie", token),
                SessionCarrier::Header => b.header("sid", token),
            };
            b.body(Full::<Bytes>::default()).unwrap()
        };
        for _ in 0..100 {
            let a = send(&c, with(&token)).await;
            assert_eq!(
                String::from_utf8(a.body.to_vec()).unwrap(),
                home,
                "{carrier:?}"
            );
            assert_eq!(field(&a), None, "a session that goes on is not sent again");
        }
        // The home endpoint dies (the table still lists it, as Kubernetes would for a while):
        // a proxy whose table has a refusing address in its place, and a token naming that
        // address. The request is retried elsewhere and the session moves.
        let i = ["a", "b", "c"].iter().position(|n| *n == home).unwrap();
        let (_p2, url2) = proxy_with(
            vec![session_route(carrier)],
            vec![(
                "b",
                backend(
                    &[doomed_addr, eps[(i + 1) % 3].addr, eps[(i + 2) % 3].addr],
                    LoadBalancer::LeastRequest,
                    BackendSettings::default(),
                ),
            )],
        )
        .await;
        // A token naming the dead endpoint, as the old one named the live home endpoint.
        let dead_id = format!("{:016x}", fnv(&doomed_addr.to_string()));
        let rest = token.split_once('=').map_or(token.as_str(), |(_, v)| v);
        let forged_rest = rest.split_once('.').unwrap().1;
        let dead_token = match carrier {
            SessionCarrier::Cookie => format!("sid={dead_id}.{forged_rest}"),
            SessionCarrier::Header => format!("{dead_id}.{forged_rest}"),
        };
        let with2 = |token: &str| {
            let b = Request::get(format!("{url2}/"));
            let b = match carrier {
                SessionCarrier::Cookie => b.header("cookie", token),
                SessionCarrier::Header => b.header("sid", token),
            };
            b.body(Full::<Bytes>::default()).unwrap()
        };
        let moved = send(&c, with2(&dead_token)).await;
        assert_eq!(
            moved.status,
            StatusCode::OK,
            "{carrier:?}: retried elsewhere"
        );
        let new_token =
            field(&moved).unwrap_or_else(|| panic!("{carrier:?}: the session did not move"));
        let new_home = String::from_utf8(moved.body.to_vec()).unwrap();
        assert_ne!(new_home, home);
        for _ in 0..20 {
            let a = send(&c, with2(&new_token)).await;
            assert_eq!(String::from_utf8(a.body.to_vec()).unwrap(), new_home);
        }
    }
}

/// The endpoint hash a session token carries (FNV-1a, finalized), as the proxy computes it.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in s.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn breaker(max_connections: u32, max_pending: u32) -> BackendSettings {
    BackendSettings {
        circuit_breaker: CircuitBreaker {
            max_connections: Some(max_connections),
            max_pending_requests: Some(max_pending),
            ..CircuitBreaker::default()
        },
        ..BackendSettings::default()
    }
}

/// A WebSocket holds its upstream connection as long as it is open: it keeps its place
/// under `maxConnections` until it closes, not until the 101 is answered.
#[tokio::test]
async fn an_open_websocket_holds_its_place_under_max_connections() {
    let b = echo_backend("ws").await;
    let def = backend(&[b.addr], LoadBalancer::LeastRequest, breaker(1, 0));
    let (_p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", def)]).await;
    let addr = url.trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(format!("ws://{addr}/chat"), tcp)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    let c = h1_client();
    assert_eq!(
        get(&c, &format!("{url}/plain")).await.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the tunnel holds the one connection"
    );
    ws.close(None).await.unwrap();
    drop(ws);
    let mut answered = false;
    for _ in 0..100 {
        if get(&c, &format!("{url}/plain")).await.status == StatusCode::OK {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered, "the place came back when the tunnel closed");
}

/// A request waiting for the circuit breaker waits no longer than the route's request
/// timeout, and one that timed out waiting never reaches the backend.
#[tokio::test]
async fn a_wait_for_the_breaker_ends_with_the_request_timeout_and_sends_nothing() {
    let release = Arc::new(tokio::sync::Notify::new());
    let held = named("held", 200, Some(release.clone())).await;
    let def = backend(&[held.addr], LoadBalancer::LeastRequest, breaker(1, 5));
    // Two routes to one backend (one breaker): /slow without a timeout, /fast with 300ms.
    let slow = route("slow", "/slow", vec![wb("b", 1)]);
    let mut fast = route("fast", "/fast", vec![wb("b", 1)]);
    fast.timeouts.request_ms = Some(300);
    let (_p, url) = proxy_with(vec![slow, fast], vec![("b", def)]).await;
    let first = tokio::spawn({
        let url = format!("{url}/slow");
        async move { get(&h1_client(), &url).await.status }
    });
    assert!(eventually(|| held.at_once.load(Ordering::SeqCst) == 1).await);
    // The second waits for the first's connection, and times out waiting.
    assert_eq!(
        get(&h1_client(), &format!("{url}/fast")).await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    release.notify_waiters();
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        held.hits.load(Ordering::SeqCst),
        1,
        "the waiting request was never sent"
    );
}

/// A backend timeout counts against the endpoint for outlier detection (when the body was
/// sent whole): an endpoint that hangs is ejected.
#[tokio::test]
async fn an_endpoint_that_times_out_is_ejected() {
    let hang = Arc::new(tokio::sync::Notify::new());
    let stuck = named("stuck", 200, Some(hang)).await;
    let ok = named("ok", 200, None).await;
    let mut settings = outlier(2, 60_000, 50);
    if let Some(od) = settings.outlier.as_mut() {
        od.consecutive_5xx = None;
        od.consecutive_gateway_errors = Some(2);
    }
    let def = backend(&[stuck.addr, ok.addr], LoadBalancer::RoundRobin, settings);
    let mut r = route("r", "/", vec![wb("b", 1)]);
    r.timeouts.backend_request_ms = Some(200);
    let (_p, url, metrics) = proxy_with_metrics(vec![r], vec![("b", def)]).await;
    let by = get_n(&format!("{url}/"), 8).await;
    assert_eq!(by.get(&504), Some(&2), "{by:?}");
    assert!(
        metrics
            .encode()
            .contains("tollgate_upstream_ejections_total 1")
    );
}

/// One request the backend always answers 500, retried on 500 over four endpoints: the
/// repeats of the same answer on other endpoints are the request's doing, and eject none of
/// them; only the first endpoint's failure counts.
#[tokio::test]
async fn a_request_failing_alike_everywhere_does_not_eject_every_endpoint() {
    let eps = [
        named("a", 500, None).await,
        named("b", 500, None).await,
        named("c", 500, None).await,
        named("d", 500, None).await,
    ];
    let addrs: Vec<SocketAddr> = eps.iter().map(|e| e.addr).collect();
    let def = backend(&addrs, LoadBalancer::RoundRobin, outlier(1, 60_000, 100));
    let mut r = route("r", "/", vec![wb("b", 1)]);
    r.retry = Some(tollgate_api::Retry {
        attempts: 3,
        backoff_ms: 1,
        codes: vec![500],
    });
    let (_p, url, metrics) = proxy_with_metrics(vec![r], vec![("b", def)]).await;
    let a = get(&h1_client(), &format!("{url}/bad")).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    let total: usize = eps.iter().map(|e| e.hits.load(Ordering::SeqCst)).sum();
    assert_eq!(total, 4, "tried on all four");
    assert!(
        metrics
            .encode()
            .contains("tollgate_upstream_ejections_total 1"),
        "{}",
        metrics.encode()
    );
}
