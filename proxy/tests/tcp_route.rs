//! Socket tests of TCP ports (TCPRoutes): bytes copied both ways to the port's first route,
//! weighted backends, a client's half-close passed on (the backend still answers after the
//! client's FIN), the idle timeout, and connections nothing serves closed without a byte,
//! each counted in `tollgate_tcp_connections_total` by outcome and in
//! `tollgate_tcp_connections_active` while open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::metrics;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tollgate_api::{
    Backend, BackendProtocol, Endpoint, ListenerConfig, LoadBalancer, ObjectKey, PathMatch,
    PortConfig, Protocol, Route, RouteMatch, RouteTable, Timeouts, VirtualHost, WeightedBackend,
};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

/// A backend that answers each line with `<name> <line>`.
async fn line_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (r, mut w) = tcp.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if w.write_all(format!("{name} {line}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A backend that reads until the client's FIN, then answers with the byte count and closes.
async fn counting_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut got = Vec::new();
                if tcp.read_to_end(&mut got).await.is_ok() {
                    let _ = tcp
                        .write_all(format!("read {} bytes\n", got.len()).as_bytes())
                        .await;
                }
            });
        }
    });
    addr
}

fn backend(addrs: &[SocketAddr]) -> Backend {
    Backend {
        tls: None,
        protocol: BackendProtocol::Tcp,
        load_balancer: LoadBalancer::default(),
        settings: Default::default(),
        endpoints: addrs
            .iter()
            .map(|a| Endpoint {
                ip: a.ip().to_string(),
                port: a.port(),
            })
            .collect(),
    }
}

fn route(name: &str, backends: &[(&str, u32)]) -> Route {
    Route {
        route: ObjectKey::new("apps", name),
        rule_index: 0,
        rule_name: None,
        matcher: RouteMatch {
            path: PathMatch::PathPrefix("/".into()),
            method: None,
            headers: vec![],
            query_params: vec![],
        },
        filters: vec![],
        backends: backends
            .iter()
            .map(|(b, weight)| WeightedBackend {
                backend: Some((*b).to_owned()),
                weight: *weight,
                filters: vec![],
            })
            .collect(),
        timeouts: Timeouts::default(),
        policy: None,
        request_trailers: false,
        max_request_body_bytes: None,
        compression_disabled: false,
        grpc_web: false,
        cache: None,
        retry: None,
        session: None,
    }
}

/// A table with one TCP port whose one listener has `routes` (the first carries traffic).
fn table(routes: Vec<Route>, backends: Vec<(&str, Backend)>) -> RouteTable {
    RouteTable {
        version: 1,
        gateway: ObjectKey::new("apps", "gw"),
        policies: Default::default(),
        closed: Default::default(),
        ports: vec![PortConfig {
            address: "127.0.0.1".into(),
            port: 0,
            protocol: Protocol::Tcp,
            listeners: vec![ListenerConfig {
                name: "tcp".into(),
                hostname: None,
                certificates: vec![],
                passthrough: false,
                virtual_hosts: vec![VirtualHost {
                    hostname: "*".into(),
                    routes: routes.into(),
                }],
            }],
            client_validation: None,
            client: Default::default(),
        }],
        backends: backends
            .into_iter()
            .map(|(k, b)| (k.to_owned(), b))
            .collect(),
    }
}

struct Fixture {
    _proxy: Proxy,
    addr: SocketAddr,
    metrics: Arc<Metrics>,
}

async fn serve(table: RouteTable, stream_idle_timeout: Duration) -> Fixture {
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        stream_idle_timeout,
        ..ProxyOptions::default()
    });
    proxy.apply(table).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    Fixture {
        _proxy: proxy,
        addr,
        metrics,
    }
}

/// `older` splits 3:1 over `a` and `b`; `newer` (never used: only the first route of a TCP
/// listener carries traffic) goes to `c`; `empty` has no endpoints.
async fn fixture(stream_idle_timeout: Duration) -> Fixture {
    let (a, b, c) = (
        line_backend("a").await,
        line_backend("b").await,
        line_backend("c").await,
    );
    let t = table(
        vec![
            route("older", &[("a", 3), ("b", 1)]),
            route("newer", &[("c", 1)]),
        ],
        vec![
            ("a", backend(&[a])),
            ("b", backend(&[b])),
            ("c", backend(&[c])),
        ],
    );
    serve(t, stream_idle_timeout).await
}

fn default_idle() -> Duration {
    ProxyOptions::default().stream_idle_timeout
}

fn value(metrics: &Metrics, series: &str) -> u64 {
    let text = metrics.encode();
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn outcomes(metrics: &Metrics, outcome: &str) -> u64 {
    value(
        metrics,
        &format!("tollgate_tcp_connections_total{{outcome=\"{outcome}\"}}"),
    )
}

/// Sends `line` and reads the answer line.
async fn ask(addr: SocketAddr, line: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).await.unwrap();
    answer
}

#[tokio::test]
async fn bytes_are_copied_both_ways_over_one_connection() {
    let f = fixture(default_idle()).await;
    let mut s = TcpStream::connect(f.addr).await.unwrap();
    let (r, mut w) = s.split();
    let mut lines = BufReader::new(r).lines();
    let mut backend = None;
    for i in 0..20 {
        w.write_all(format!("n{i}\n").as_bytes()).await.unwrap();
        let line = lines.next_line().await.unwrap().unwrap();
        let (name, rest) = line.split_once(' ').unwrap();
        assert_eq!(rest, format!("n{i}"));
        // One connection, one backend: every line went to the one picked at connect.
        assert_eq!(*backend.get_or_insert(name.to_owned()), name);
    }
    assert_eq!(value(&f.metrics, "tollgate_tcp_connections_active"), 1);
    drop(lines);
    drop(s);
    assert!(common::eventually(|| outcomes(&f.metrics, "served") == 1).await);
    assert_eq!(value(&f.metrics, "tollgate_tcp_connections_active"), 0);
}

#[tokio::test]
async fn connections_split_by_weight_over_the_first_routes_backends() {
    let f = fixture(default_idle()).await;
    let (mut a, mut b) = (0u32, 0u32);
    for i in 0..400 {
        let answer = ask(f.addr, &format!("n{i}")).await;
        match answer.split_once(' ').map(|(n, _)| n) {
            Some("a") => a += 1,
            Some("b") => b += 1,
            other => panic!("connection {i} reached {other:?} ({answer:?})"),
        }
    }
    // 3:1 of 400 is 300:100; the binomial spread is about 9, so 240..360 is over 6 sigma.
    assert!((240..=360).contains(&a), "a {a}, b {b}");
    assert_eq!(a + b, 400);
}

#[tokio::test]
async fn a_half_close_reaches_the_backend_and_its_answer_the_client() {
    let counting = counting_backend().await;
    let t = table(
        vec![route("count", &[("count", 1)])],
        vec![("count", backend(&[counting]))],
    );
    let f = serve(t, default_idle()).await;
    let mut s = TcpStream::connect(f.addr).await.unwrap();
    let body = vec![b'x'; 100_000];
    s.write_all(&body).await.unwrap();
    // FIN: the backend answers only once it reads end of stream.
    s.shutdown().await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    assert_eq!(answer, "read 100000 bytes\n");
    assert!(common::eventually(|| outcomes(&f.metrics, "served") == 1).await);
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let f = fixture(Duration::from_millis(300)).await;
    let mut s = TcpStream::connect(f.addr).await.unwrap();
    s.write_all(b"hello\n").await.unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).await.unwrap();
    assert!(n > 0);
    // Nothing more is sent: the proxy closes the connection (EOF or reset).
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle connection was never closed");
    assert!(common::eventually(|| outcomes(&f.metrics, "idle") == 1).await);
    assert_eq!(value(&f.metrics, "tollgate_tcp_connections_active"), 0);
}

#[tokio::test]
async fn connections_nothing_serves_are_closed_without_a_byte() {
    // A route whose backend has no endpoints, one whose backend is unresolved (the compiler
    // leaves it None), and a backend that refuses connections.
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    for (routes, backends, outcome) in [
        (
            vec![route("empty", &[("empty", 1)])],
            vec![("empty", backend(&[]))],
            "no_backend",
        ),
        (
            vec![Route {
                backends: vec![WeightedBackend {
                    backend: None,
                    weight: 1,
                    filters: vec![],
                }],
                ..route("unresolved", &[])
            }],
            vec![],
            "no_backend",
        ),
        (
            vec![route("refused", &[("refused", 1)])],
            vec![("refused", backend(&[refused]))],
            "connect_failed",
        ),
        (vec![], vec![], "no_route"),
    ] {
        let f = serve(table(routes, backends), default_idle()).await;
        let mut s = TcpStream::connect(f.addr).await.unwrap();
        let _ = s.write_all(b"hello\n").await;
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("the connection was never closed");
        assert!(got.is_empty(), "{outcome}: {got:?}");
        assert!(
            common::eventually(|| outcomes(&f.metrics, outcome) == 1).await,
            "{outcome}: {}",
            f.metrics.encode()
        );
    }
}
