//! Socket tests of the upstream side: weighted backend split, endpoint balancing, HTTP/2
//! upstreams, WebSocket upgrades, request mirroring and the backend's reason phrase.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::*;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::Full;
use tokio_tungstenite::tungstenite::Message;
use tollgate_api::{BackendProtocol, Filter, LoadBalancer, Mirror};

#[tokio::test]
async fn weighted_split_sends_to_both_and_never_to_weight_zero() {
    let (a, b, z) = (
        echo_backend("a").await,
        echo_backend("b").await,
        echo_backend("z").await,
    );
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("a", 3), wb("b", 1), wb("z", 0)])],
        vec![
            ("a", backend_of(&[&a])),
            ("b", backend_of(&[&b])),
            ("z", backend_of(&[&z])),
        ],
    )
    .await;
    let c = h1_client();
    for _ in 0..200 {
        assert_eq!(get(&c, &format!("{url}/")).await.status, StatusCode::OK);
    }
    assert!(
        a.hits() > 0 && b.hits() > 0,
        "a={} b={}",
        a.hits(),
        b.hits()
    );
    assert_eq!(z.hits(), 0);
    assert_eq!(a.hits() + b.hits(), 200);
    assert!(
        a.hits() > b.hits(),
        "3:1 split came out a={} b={}",
        a.hits(),
        b.hits()
    );
}

#[tokio::test]
async fn round_robin_visits_endpoints_in_turn() {
    let (x, y, z) = (
        echo_backend("x").await,
        echo_backend("y").await,
        echo_backend("z").await,
    );
    let mut be = backend_of(&[&x, &y, &z]);
    be.load_balancer = LoadBalancer::RoundRobin;
    let (_p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", be)]).await;
    let c = h1_client();
    for _ in 0..30 {
        get(&c, &format!("{url}/")).await;
    }
    assert_eq!((x.hits(), y.hits(), z.hits()), (10, 10, 10));
}

#[tokio::test]
async fn least_request_prefers_the_endpoint_with_fewer_in_flight() {
    let slow = slow_backend("slow", 300).await;
    let fast = echo_backend("fast").await;
    let mut be = backend_of(&[&slow, &fast]);
    be.load_balancer = LoadBalancer::LeastRequest;
    let (_p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", be)]).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let c = h1_client();
            for _ in 0..10 {
                assert_eq!(get(&c, &format!("{url}/")).await.status, StatusCode::OK);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(slow.hits() + fast.hits(), 40);
    assert!(
        fast.hits() > slow.hits(),
        "slow={} fast={}",
        slow.hits(),
        fast.hits()
    );
}

#[tokio::test]
async fn h2c_backend_gets_http2() {
    let h2 = h2_backend("h2").await;
    let mut be = backend_of(&[&h2]);
    be.protocol = BackendProtocol::H2c;
    let (_p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", be)]).await;
    let c = h1_client();
    for _ in 0..3 {
        let a = get_host(&c, &format!("{url}/grpcish"), "svc.example").await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.json()["version"], "HTTP/2.0");
        assert_eq!(a.json()["path"], "/grpcish");
        assert_eq!(
            a.upstream_header("x-forwarded-host").as_deref(),
            Some("svc.example")
        );
        assert_eq!(a.upstream_header("host").as_deref(), Some("svc.example"));
    }
}

/// Upstream connections, HTTP/1.1 and h2c alike, have TCP keepalive armed (first probe 30 s
/// after their last traffic): a backend that vanishes without a reset while a request waits
/// is noticed after the probes go unanswered (about a minute), not when TCP gives up. Read
/// from the kernel's own view of the proxy's sockets (`/proc/net/tcp`: timer 2 is keepalive,
/// in 1/100 s). (h2c connections are not PINGed: gRPC servers answer frequent PINGs with
/// GOAWAY.)
#[tokio::test]
async fn upstream_connections_probe_a_silent_backend() {
    for protocol in [BackendProtocol::Http1, BackendProtocol::H2c] {
        assert_keepalive_armed(protocol, None, 3_000).await;
    }
}

/// A BackendPolicy's `connection.tcpKeepaliveIdle` reaches HTTP/1.1 and h2c sockets alike
/// (h2c connections come from a client of the endpoint's own, made with its settings).
#[tokio::test]
async fn the_policy_keepalive_reaches_http1_and_h2c_connections() {
    for protocol in [BackendProtocol::Http1, BackendProtocol::H2c] {
        assert_keepalive_armed(protocol, Some(4_000), 400).await;
    }
}

/// Sends one request through a proxy to a `protocol` backend (with `keepalive_ms` as its
/// BackendPolicy's keepalive idle, if any) and asserts the proxy's upstream sockets have a
/// keepalive timer armed within `within` hundredths of a second.
async fn assert_keepalive_armed(protocol: BackendProtocol, keepalive_ms: Option<u64>, within: u64) {
    let b = echo_backend("b").await;
    let mut be = backend_of(&[&b]);
    be.protocol = protocol;
    be.settings.connection.tcp_keepalive_idle_ms = keepalive_ms;
    let (_p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", be)]).await;
    assert_eq!(
        get(&h1_client(), &format!("{url}/")).await.status,
        StatusCode::OK
    );
    let peer = format!("0100007F:{:04X}", b.addr.port());
    let timers = || {
        let rows = std::fs::read_to_string("/proc/net/tcp").unwrap();
        rows.lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // rem_address, state ESTABLISHED: the proxy's end of the upstream connection.
                (f.get(2) == Some(&peer.as_str()) && f.get(3) == Some(&"01")).then(|| {
                    let (tr, when) = f[5].split_once(':').unwrap();
                    (
                        u32::from_str_radix(tr, 16).unwrap(),
                        u64::from_str_radix(when, 16).unwrap(),
                    )
                })
            })
            .collect::<Vec<_>>()
    };
    // Right after the exchange another timer (a delayed ACK) may still be pending.
    let armed = eventually(|| {
        let t = timers();
        !t.is_empty()
            && t.iter()
                .all(|&(tr, when)| tr == 2 && when > 0 && when <= within)
    })
    .await;
    assert!(
        armed,
        "{protocol:?} upstream sockets (timer, 1/100 s left): {:?}",
        timers()
    );
}

#[tokio::test]
async fn websocket_upgrade_is_spliced_end_to_end() {
    let b = echo_backend("ws").await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let addr = url.trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(format!("ws://{addr}/chat"), tcp)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert!(resp.headers().contains_key("x-request-id"));
    for text in ["hello", "world"] {
        ws.send(Message::text(text)).await.unwrap();
        let echoed = ws.next().await.unwrap().unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), text);
    }
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn mirror_gets_a_copy_and_the_client_gets_the_main_answer() {
    let main = echo_backend("main").await;
    let shadow = echo_backend("shadow").await;
    let mirrored = with_filters(
        route("mirrored", "/m", vec![wb("main", 1)]),
        vec![mirror_to("shadow", 1_000_000)],
    );
    let unsampled = with_filters(
        route("unsampled", "/never", vec![wb("main", 1)]),
        vec![mirror_to("shadow", 0)],
    );
    let (_p, url) = proxy_with(
        vec![mirrored, unsampled],
        vec![
            ("main", backend_of(&[&main])),
            ("shadow", backend_of(&[&shadow])),
        ],
    )
    .await;
    let c = h1_client();
    let a = get(&c, &format!("{url}/m/get")).await;
    assert_eq!(a.json()["backend"], "main");
    let post = Request::post(format!("{url}/m/post"))
        .header("x-trace", "t1")
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    let a = send(&c, post).await;
    assert_eq!(a.json()["backend"], "main");
    assert_eq!(a.json()["body"], "payload");
    for _ in 0..5 {
        get(&c, &format!("{url}/never")).await;
    }
    assert!(eventually(|| shadow.seen.lock().unwrap().len() == 2).await);
    let seen = shadow.seen.lock().unwrap().clone();
    let post = seen.iter().find(|v| v["path"] == "/m/post").unwrap();
    assert_eq!(post["body"], "payload");
    assert_eq!(post["headers"]["x-trace"], "t1");
    assert_eq!(post["method"], "POST");
    assert!(seen.iter().any(|v| v["path"] == "/m/get"));
}

/// A mirror backend that answers only after 5 s, with room for 3 copies in flight: of 8
/// requests, 3 are mirrored and 5 copies are dropped and counted; every client is answered by
/// the main backend; once those copies end, mirroring resumes.
#[tokio::test]
async fn mirror_copies_in_flight_are_bounded() {
    let (main, shadow, r) = mirrored_to_a_slow_backend().await;
    let metrics = metrics();
    let opts = tollgate_proxy::ProxyOptions {
        metrics: metrics.clone(),
        max_mirrors_in_flight: 3,
        ..tollgate_proxy::ProxyOptions::default()
    };
    let (_p, url) = proxy_with_options(
        opts,
        vec![r],
        vec![
            ("main", backend_of(&[&main])),
            ("shadow", backend_of(&[&shadow])),
        ],
    )
    .await;
    let c = h1_client();
    for i in 0..8 {
        let a = get(&c, &format!("{url}/{i}")).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.json()["backend"], "main");
    }
    assert_eq!(main.hits(), 8);
    let overload = r#"tollgate_upstream_errors_total{kind="mirror_overload"} 5"#;
    assert!(metrics.encode().contains(overload), "{}", metrics.encode());
    assert!(eventually(|| shadow.hits() == 3).await);
    // The three copies end after 5 s and free their slots.
    tokio::time::sleep(std::time::Duration::from_millis(5_500)).await;
    assert_eq!(
        get(&c, &format!("{url}/again")).await.status,
        StatusCode::OK
    );
    assert!(eventually(|| shadow.hits() == 4).await, "{}", shadow.hits());
    assert!(metrics.encode().contains(overload), "{}", metrics.encode());
}

#[tokio::test]
async fn slow_mirror_does_not_delay_the_main_response() {
    let (main, shadow, mut r) = mirrored_to_a_slow_backend().await;
    // Were the mirror awaited, this request would time out.
    r.timeouts.request_ms = Some(2_000);
    let (_p, url) = proxy_with(
        vec![r],
        vec![
            ("main", backend_of(&[&main])),
            ("shadow", backend_of(&[&shadow])),
        ],
    )
    .await;
    let a = get(&h1_client(), &format!("{url}/x")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["backend"], "main");
    assert!(eventually(|| shadow.hits() == 1).await);
}

/// A main backend, a mirror backend answering after 5 s, and a route to main mirroring every
/// request to it (backend keys `main` and `shadow`).
async fn mirrored_to_a_slow_backend() -> (EchoBackend, EchoBackend, tollgate_api::Route) {
    let main = echo_backend("main").await;
    let shadow = slow_backend("shadow", 5_000).await;
    let r = with_filters(
        route("r", "/", vec![wb("main", 1)]),
        vec![mirror_to("shadow", 1_000_000)],
    );
    (main, shadow, r)
}

/// A backend that answers the first request of each connection and closes the connection on
/// reading the next, without a byte of answer: its keep-alive timeout racing the proxy's
/// reuse of the connection. Counts connections and requests read.
async fn closes_after_one_answer() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (conns, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c, r) = (conns.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for second in [false, true] {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.clear();
                    r.fetch_add(1, Ordering::SeqCst);
                    if second {
                        return; // closed unanswered
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, conns, requests)
}

#[tokio::test]
async fn a_get_the_backend_dropped_on_a_reused_connection_is_answered_and_a_post_gets_502() {
    use std::sync::atomic::Ordering;
    let (addr, conns, requests) = closes_after_one_answer().await;
    let be = backend_at(addr);
    let metrics = metrics();
    let opts = tollgate_proxy::ProxyOptions {
        metrics: metrics.clone(),
        ..tollgate_proxy::ProxyOptions::default()
    };
    let (_p, url) = proxy_with_options(
        opts,
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", be)],
    )
    .await;
    let c = h1_client();
    let counts = || {
        (
            conns.load(Ordering::SeqCst),
            requests.load(Ordering::SeqCst),
        )
    };
    assert_eq!(get(&c, &format!("{url}/")).await.status, StatusCode::OK);
    assert_eq!(counts(), (1, 1));
    // Reuses the first connection, which the backend closes unanswered: sent again on a
    // fresh one, and answered.
    let a = get(&c, &format!("{url}/")).await;
    assert_eq!((a.status, &a.body[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(counts(), (2, 3));
    // A POST on the second connection, closed unanswered too: not sent again.
    let post = Request::post(format!("{url}/"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(&c, post).await.status, StatusCode::BAD_GATEWAY);
    assert_eq!(counts(), (2, 4));
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_upstream_errors_total{kind="reset"} 1"#),
        "only the POST counts as an upstream error"
    );
}

/// A backend that answers every request with `status_line`, a 2-byte body, keeping the
/// connection (it reads a Content-Length body before answering).
async fn answers_with(status_line: &'static str) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // The request read whole: its head, then the Content-Length body.
                    let whole = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| {
                        let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                        let body: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        i + 4 + body
                    });
                    let Some(len) = whole.filter(|&n| buf.len() >= n) else {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    buf.drain(..len);
                    let answer = format!("{status_line}\r\ncontent-length: 2\r\n\r\nok");
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn the_client_reads_the_backends_own_reason_phrase() {
    for (backend_says, client_reads) in [
        ("HTTP/1.1 200 Fine", "HTTP/1.1 200 Fine\r\n"),
        ("HTTP/1.1 404 Gone Fishing", "HTTP/1.1 404 Gone Fishing\r\n"),
        ("HTTP/1.1 404 Not Found", "HTTP/1.1 404 Not Found\r\n"),
        // An empty phrase stays empty (RFC 9112 allows it; nginx relays it so too).
        ("HTTP/1.1 503 ", "HTTP/1.1 503 \r\n"),
    ] {
        let be = backend_at(answers_with(backend_says).await);
        let (_p, url) = proxy_with(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", be)]).await;
        // Without a body (the proxy's own HTTP/1 exchange) and with one (hyper's client).
        for request in [
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        ] {
            let out = raw(&url, request.as_bytes()).await;
            assert!(
                out.starts_with(client_reads),
                "backend {backend_says:?}, request {request:?}: {out:?}"
            );
            assert!(out.ends_with("\r\n\r\nok"), "{out:?}");
        }
    }
}

/// The forwarding fields and the request id reach the backend once each, replacing the
/// client's own, on every way upstream: our HTTP/1 exchange (no body), hyper's client (a
/// body), h2c, and a mirror's copy (the proxy adds them after the request's own fields on the
/// first way, into its header map on the others).
#[tokio::test]
async fn forwarding_fields_replace_the_clients_on_every_way_upstream() {
    let h1 = echo_backend("h1").await;
    let h2 = h2_backend("h2").await;
    let shadow = echo_backend("shadow").await;
    let mut h2c = backend_of(&[&h2]);
    h2c.protocol = BackendProtocol::H2c;
    let mirrored = with_filters(
        route("m", "/m", vec![wb("h1", 1)]),
        vec![mirror_to("shadow", 1_000_000)],
    );
    let (_p, url) = proxy_with(
        vec![
            route("one", "/h1", vec![wb("h1", 1)]),
            route("two", "/h2", vec![wb("h2c", 1)]),
            mirrored,
        ],
        vec![
            ("h1", backend_of(&[&h1])),
            ("h2c", h2c),
            ("shadow", backend_of(&[&shadow])),
        ],
    )
    .await;
    let c = h1_client();
    let check = |what: &str, headers: &serde_json::Value| {
        let field = |name: &str| headers[name].as_str().unwrap_or_default().to_owned();
        assert_eq!(field("x-forwarded-for"), "10.0.0.1, 127.0.0.1", "{what}");
        assert_eq!(field("x-forwarded-proto"), "http", "{what}");
        assert_eq!(field("x-forwarded-host"), "shop.example", "{what}");
        assert_eq!(field("host"), "shop.example", "{what}");
        let id = field("x-request-id");
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{what}: request id {id:?}"
        );
        id
    };
    for (path, body) in [
        ("/h1", ""),
        ("/h1", "payload"),
        ("/h2", ""),
        ("/h2", "payload"),
        ("/m", ""),
    ] {
        let method = if body.is_empty() { "GET" } else { "POST" };
        let req = Request::builder()
            .method(method)
            .uri(format!("{url}{path}"))
            .header("host", "shop.example")
            .header("x-forwarded-for", "10.0.0.1")
            .header("x-forwarded-proto", "gopher")
            .header("x-forwarded-host", "evil.example")
            .header("x-request-id", "not a sane id")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let a = send(&c, req).await;
        assert_eq!(a.status, StatusCode::OK, "{method} {path}");
        assert_eq!(a.json()["body"], body, "{method} {path}");
        let what = format!("{method} {path}");
        let id = check(&what, &a.json()["headers"]);
        assert_eq!(a.headers["x-request-id"], id.as_str(), "{what}");
    }
    assert!(eventually(|| shadow.seen.lock().unwrap().len() == 1).await);
    let copy = shadow.seen.lock().unwrap()[0].clone();
    check("the mirror's copy", &copy["headers"]);
}

/// A RequestMirror filter copying `per_million` of the requests to `backend`.
fn mirror_to(backend: &str, per_million: u32) -> Filter {
    Filter::RequestMirror(Mirror {
        backend: Some(backend.into()),
        per_million,
        sampler: Default::default(),
    })
}
