//! Socket tests of the proxy's lifecycle: atomic table swaps under load, sockets opened and
//! closed with the table, failed applies, the admin endpoints, and shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use http::StatusCode;
use tollgate_api::{PathMatch, RouteTable};
use tollgate_proxy::{Proxy, ProxyError, ProxyOptions, serve_admin};

fn one_route_table(version: u64, port: u16, key: &str, backend: &EchoBackend) -> RouteTable {
    table(
        version,
        vec![http_port(port, vec![route("r", "/", vec![wb(key, 1)])])],
        vec![(key, backend_of(&[backend]))],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_swaps_under_load_fail_no_request() {
    let (one, two) = (echo_backend("one").await, echo_backend("two").await);
    let proxy = Proxy::new(ProxyOptions::default());
    proxy
        .apply(one_route_table(1, 0, "one", &one))
        .await
        .unwrap();
    let addr = proxy.local_addr(0).unwrap();
    let url = format!("http://{addr}/");

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (stop, failures, total, seen, url) = (
            stop.clone(),
            failures.clone(),
            total.clone(),
            seen.clone(),
            url.clone(),
        );
        clients.push(tokio::spawn(async move {
            let c = h1_client();
            while !stop.load(Ordering::Relaxed) {
                let resp = c
                    .request(http::Request::get(&url).body(Default::default()).unwrap())
                    .await;
                total.fetch_add(1, Ordering::Relaxed);
                match resp {
                    Ok(r) if r.status() == StatusCode::OK => {
                        let b = r.headers()["x-backend"].to_str().unwrap().to_owned();
                        let _ = http_body_util::BodyExt::collect(r.into_body()).await;
                        seen.lock().unwrap().insert(b);
                    }
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for i in 0..100u64 {
        let t = if i % 2 == 0 {
            one_route_table(i + 2, 0, "two", &two)
        } else {
            one_route_table(i + 2, 0, "one", &one)
        };
        proxy.apply(t).await.unwrap();
        assert_eq!(proxy.version(), i + 2);
        assert_eq!(
            proxy.local_addr(0),
            Some(addr),
            "socket must persist across swaps"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert!(
        total.load(Ordering::Relaxed) >= 100,
        "load too light to mean anything"
    );
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    let seen = seen.lock().unwrap();
    assert!(seen.contains("one") && seen.contains("two"), "{seen:?}");
}

#[tokio::test]
async fn sockets_follow_the_table_ports() {
    let b = echo_backend("b").await;
    let (p1, p2) = (free_port(), free_port());
    let both = table(
        1,
        vec![
            http_port(p1, vec![route("r", "/", vec![wb("b", 1)])]),
            http_port(p2, vec![route("r", "/", vec![wb("b", 1)])]),
        ],
        vec![("b", backend_of(&[&b]))],
    );
    let proxy = Proxy::new(ProxyOptions::default());
    proxy.apply(both.clone()).await.unwrap();
    let c = h1_client();
    assert_eq!(
        get(&c, &format!("http://127.0.0.1:{p1}/")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, &format!("http://127.0.0.1:{p2}/")).await.status,
        StatusCode::OK
    );

    proxy.apply(one_route_table(2, p1, "b", &b)).await.unwrap();
    assert!(proxy.local_addr(p2).is_none());
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", p2))
            .await
            .is_err(),
        "p2 still open"
    );
    assert_eq!(
        get(&c, &format!("http://127.0.0.1:{p1}/")).await.status,
        StatusCode::OK
    );

    let mut again = both;
    again.version = 3;
    proxy.apply(again).await.unwrap();
    assert_eq!(
        get(&h1_client(), &format!("http://127.0.0.1:{p2}/"))
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn failed_apply_keeps_the_live_table() {
    let b = echo_backend("b").await;
    let proxy = Proxy::new(ProxyOptions::default());
    proxy.apply(one_route_table(1, 0, "b", &b)).await.unwrap();
    let url = format!("http://{}/", proxy.local_addr(0).unwrap());

    let mut bad = one_route_table(2, 0, "b", &b);
    std::sync::Arc::make_mut(&mut bad.ports[0].listeners[0].virtual_hosts[0].routes)[0]
        .matcher
        .path = PathMatch::RegularExpression("(".into());
    assert!(matches!(proxy.apply(bad).await, Err(ProxyError::Router(_))));

    // A port that cannot be bound (already taken by someone else) fails the same way.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut busy = one_route_table(3, 0, "b", &b);
    busy.ports
        .push(http_port(taken.local_addr().unwrap().port(), vec![]));
    assert!(matches!(
        proxy.apply(busy).await,
        Err(ProxyError::Bind { .. })
    ));

    assert_eq!(proxy.version(), 1);
    assert_eq!(get(&h1_client(), &url).await.status, StatusCode::OK);
}

#[tokio::test]
async fn admin_serves_metrics_health_and_readiness() {
    let b = echo_backend("b").await;
    let metrics = metrics();
    let opts = ProxyOptions {
        metrics: metrics.clone(),
        access_log: true,
        ..ProxyOptions::default()
    };
    let dead = free_port();
    let dead_backend = backend_at(([127, 0, 0, 1], dead).into());
    let (_p, url) = proxy_with_options(
        opts,
        vec![
            route("r", "/ok", vec![wb("b", 1)]),
            route("dead", "/dead", vec![wb("d", 1)]),
        ],
        vec![("b", backend_of(&[&b])), ("d", dead_backend)],
    )
    .await;
    let c = h1_client();
    get(&c, &format!("{url}/ok")).await;
    get(&c, &format!("{url}/nothing")).await;
    assert_eq!(
        get(&c, &format!("{url}/dead")).await.status,
        StatusCode::BAD_GATEWAY
    );

    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_url = format!("http://{}", admin.local_addr().unwrap());
    let ready = Arc::new(AtomicBool::new(false));
    let r = ready.clone();
    tokio::spawn(serve_admin(admin, metrics.clone(), move || {
        r.load(Ordering::Relaxed)
    }));

    assert!(eventually(|| metrics.encode().contains(r#"code_class="5xx""#)).await);
    let m = get(&c, &format!("{admin_url}/metrics")).await;
    assert_eq!(m.status, StatusCode::OK);
    assert!(
        m.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = String::from_utf8(m.body.to_vec()).unwrap();
    for needle in [
        r#"tollgate_requests_total{route="default/r",code_class="2xx"} 1"#,
        r#"tollgate_requests_total{route="none",code_class="4xx"} 1"#,
        r#"tollgate_requests_total{route="default/dead",code_class="5xx"} 1"#,
        r#"tollgate_upstream_errors_total{kind="connect"} 1"#,
        r#"tollgate_request_duration_seconds_count{route="default/r"} 1"#,
        "tollgate_route_table_version 1",
        "tollgate_active_connections",
        "tollgate_access_log_dropped_total 0",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    assert_eq!(
        get(&c, &format!("{admin_url}/healthz")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, &format!("{admin_url}/readyz")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    ready.store(true, Ordering::Relaxed);
    assert_eq!(
        get(&c, &format!("{admin_url}/readyz")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, &format!("{admin_url}/nope")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn shutdown_closes_sockets_and_refuses_applies() {
    let b = echo_backend("b").await;
    let proxy = Proxy::new(ProxyOptions::default());
    proxy.apply(one_route_table(1, 0, "b", &b)).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    assert_eq!(
        get(&h1_client(), &format!("http://{addr}/")).await.status,
        StatusCode::OK
    );
    proxy.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    assert!(matches!(
        proxy.apply(one_route_table(2, 0, "b", &b)).await,
        Err(ProxyError::Shutdown)
    ));
}

#[tokio::test]
async fn in_flight_request_finishes_on_the_snapshot_it_started_with() {
    let old = slow_backend("old", 300).await;
    let new = echo_backend("new").await;
    let proxy = Proxy::new(ProxyOptions::default());
    proxy
        .apply(one_route_table(1, 0, "old", &old))
        .await
        .unwrap();
    let url = format!("http://{}/", proxy.local_addr(0).unwrap());
    let slow = tokio::spawn({
        let url = url.clone();
        async move { get(&h1_client(), &url).await }
    });
    assert!(eventually(|| old.hits() == 1).await);
    // The new table no longer knows the old backend at all.
    proxy
        .apply(one_route_table(2, 0, "new", &new))
        .await
        .unwrap();
    assert_eq!(get(&h1_client(), &url).await.json()["backend"], "new");
    let a = slow.await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["backend"], "old");
}

/// Shutting down closes an idle keep-alive connection at once (gracefully: nothing is in
/// flight) instead of leaving it to the 30 s header read timeout. Paused time: a connection
/// left open would meet the 20 s guard first, which the runtime reaches by skipping ahead.
#[tokio::test(start_paused = true)]
async fn shutdown_closes_idle_keep_alive_connections() {
    use tokio::io::AsyncReadExt;
    let (proxy, _b, mut s) = proxy_and_connection_after_a_404_request().await;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 404");
    let shutdown = tokio::spawn(async move { proxy.shutdown().await });
    let mut rest = Vec::new();
    let read =
        tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    shutdown.await.unwrap();
}

#[tokio::test]
async fn each_route_counts_into_its_own_series_across_table_swaps() {
    let b = echo_backend("b").await;
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    let t = |version, names: &[&str]| {
        let routes = names
            .iter()
            .map(|n| route(n, &format!("/{n}"), vec![wb("b", 1)]))
            .collect();
        table(
            version,
            vec![http_port(0, routes)],
            vec![("b", backend_of(&[&b]))],
        )
    };
    let c = h1_client();
    let hit = |url: String, times: usize| {
        let c = c.clone();
        async move {
            for _ in 0..times {
                assert_eq!(get(&c, &url).await.status, StatusCode::OK);
            }
        }
    };
    proxy.apply(t(1, &["a", "c"])).await.unwrap();
    let url = format!("http://{}", proxy.local_addr(0).unwrap());
    hit(format!("{url}/a"), 1).await;
    hit(format!("{url}/c"), 2).await;
    // A route added in between: the virtual host is built again; `a` and `c` keep their
    // series, `n` gets its own.
    proxy.apply(t(2, &["a", "n", "c"])).await.unwrap();
    hit(format!("{url}/a"), 1).await;
    hit(format!("{url}/n"), 4).await;
    hit(format!("{url}/c"), 3).await;
    // `a` gone, then back: its series goes on from the registry.
    proxy.apply(t(3, &["c"])).await.unwrap();
    let t4 = t(4, &["a", "c"]);
    proxy.apply(t4.clone()).await.unwrap();
    hit(format!("{url}/a"), 1).await;
    let want = [
        r#"tollgate_requests_total{route="default/a",code_class="2xx"} 3"#,
        r#"tollgate_requests_total{route="default/n",code_class="2xx"} 4"#,
        r#"tollgate_requests_total{route="default/c",code_class="2xx"} 5"#,
    ];
    let done = eventually(|| {
        let text = metrics.encode();
        want.iter().all(|w| text.contains(w))
    })
    .await;
    assert!(done, "want {want:?} in\n{}", metrics.encode());
    // A table that shares the virtual host's route list: the router keeps the built host,
    // and with it the routes' handles, which still count into the same series.
    let mut t5 = t4;
    t5.version = 5;
    proxy.apply(t5).await.unwrap();
    hit(format!("{url}/a"), 1).await;
    let want = r#"tollgate_requests_total{route="default/a",code_class="2xx"} 4"#;
    let done = eventually(|| metrics.encode().contains(want)).await;
    assert!(done, "want {want} in\n{}", metrics.encode());
}
