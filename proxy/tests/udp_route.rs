//! Socket tests of UDP ports (UDPRoutes): a client address is a flow pinned to one endpoint
//! of the port's first route (weighted across flows), answers come back from the port's own
//! address, an idle flow is forgotten, the flow table is bounded, and datagrams nothing
//! serves are dropped, each counted (`tollgate_udp_datagrams_total`,
//! `tollgate_udp_dropped_total`, `tollgate_udp_flows_active`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::metrics;
use tokio::net::UdpSocket;
use tollgate_api::{
    Backend, BackendProtocol, Endpoint, ListenerConfig, LoadBalancer, ObjectKey, PathMatch,
    PortConfig, Protocol, Route, RouteMatch, RouteTable, Timeouts, VirtualHost, WeightedBackend,
};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

/// A UDP backend that answers each datagram with `<name> ` and the datagram.
async fn echo(name: &'static str) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let mut answer = format!("{name} ").into_bytes();
            answer.extend_from_slice(&buf[..n]);
            let _ = socket.send_to(&answer, from).await;
        }
    });
    addr
}

fn backend(addrs: &[SocketAddr]) -> Backend {
    Backend {
        tls: None,
        protocol: BackendProtocol::Udp,
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

fn table(routes: Vec<Route>, backends: Vec<(&str, Backend)>) -> RouteTable {
    RouteTable {
        version: 1,
        gateway: ObjectKey::new("apps", "gw"),
        policies: Default::default(),
        closed: Default::default(),
        ports: vec![PortConfig {
            address: "127.0.0.1".into(),
            port: 0,
            protocol: Protocol::Udp,
            listeners: vec![ListenerConfig {
                name: "udp".into(),
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

async fn serve(table: RouteTable, opts: ProxyOptions) -> Fixture {
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..opts
    });
    proxy.apply(table).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    Fixture {
        _proxy: proxy,
        addr,
        metrics,
    }
}

/// `older` splits 3:1 over `a` and `b`; `newer` (never used: only the first route of a UDP
/// listener carries traffic) goes to `c`.
async fn fixture(opts: ProxyOptions) -> Fixture {
    let (a, b, c) = (echo("a").await, echo("b").await, echo("c").await);
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
    serve(t, opts).await
}

fn value(metrics: &Metrics, series: &str) -> u64 {
    let text = metrics.encode();
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn dropped(metrics: &Metrics, reason: &str) -> u64 {
    value(
        metrics,
        &format!("tollgate_udp_dropped_total{{reason=\"{reason}\"}}"),
    )
}

fn flows(metrics: &Metrics) -> u64 {
    value(metrics, "tollgate_udp_flows_active")
}

/// A client socket connected to the proxy.
async fn client(proxy: SocketAddr) -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.connect(proxy).await.unwrap();
    s
}

/// Sends `payload` and waits (at most 10 s) for the answer.
async fn ask(s: &UdpSocket, payload: &[u8]) -> Vec<u8> {
    s.send(payload).await.unwrap();
    let mut buf = vec![0u8; 65_536];
    let n = tokio::time::timeout(Duration::from_secs(10), s.recv(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap();
    buf.truncate(n);
    buf
}

fn backend_of(answer: &[u8]) -> String {
    let text = String::from_utf8_lossy(answer);
    text.split(' ').next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_flow_keeps_its_endpoint_and_answers_come_from_the_port() {
    let f = fixture(ProxyOptions::default()).await;
    let s = client(f.addr).await;
    let mut first = None;
    for i in 0..20 {
        let answer = ask(&s, format!("n{i}").as_bytes()).await;
        let name = backend_of(&answer);
        assert_eq!(answer, format!("{name} n{i}").as_bytes());
        assert_eq!(*first.get_or_insert(name.clone()), name, "datagram {i}");
        assert_ne!(name, "c", "only the first route carries traffic");
    }
    assert_eq!(flows(&f.metrics), 1);
    assert_eq!(
        value(
            &f.metrics,
            "tollgate_udp_datagrams_total{direction=\"to_backend\"}"
        ),
        20
    );
    assert_eq!(
        value(
            &f.metrics,
            "tollgate_udp_datagrams_total{direction=\"to_client\"}"
        ),
        20
    );
}

#[tokio::test]
async fn flows_split_by_weight_and_large_datagrams_pass_whole() {
    let f = fixture(ProxyOptions::default()).await;
    let (mut a, mut b) = (0u32, 0u32);
    for i in 0..400 {
        let s = client(f.addr).await;
        match backend_of(&ask(&s, format!("n{i}").as_bytes()).await).as_str() {
            "a" => a += 1,
            "b" => b += 1,
            other => panic!("flow {i} reached {other:?}"),
        }
    }
    // 3:1 of 400 is 300:100; the binomial spread is about 9, so 240..360 is over 6 sigma.
    assert!((240..=360).contains(&a), "a {a}, b {b}");
    let s = client(f.addr).await;
    let big: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
    let answer = ask(&s, &big).await;
    assert_eq!(&answer[2..], &big[..]);
}

#[tokio::test]
async fn an_idle_flow_is_forgotten_and_a_new_one_opens() {
    let f = fixture(ProxyOptions {
        udp_flow_idle_timeout: Duration::from_millis(200),
        ..ProxyOptions::default()
    })
    .await;
    let s = client(f.addr).await;
    ask(&s, b"one").await;
    assert_eq!(flows(&f.metrics), 1);
    assert!(
        common::eventually(|| flows(&f.metrics) == 0).await,
        "the idle flow was never forgotten"
    );
    // The same client address again: a new flow, answered.
    let answer = ask(&s, b"two").await;
    assert!(answer.ends_with(b" two"), "{answer:?}");
    assert_eq!(flows(&f.metrics), 1);
}

#[tokio::test]
async fn the_flow_table_is_bounded_and_datagrams_past_it_are_dropped() {
    let f = fixture(ProxyOptions {
        udp_max_flows: 3,
        ..ProxyOptions::default()
    })
    .await;
    let mut clients = Vec::new();
    for i in 0..3 {
        let s = client(f.addr).await;
        ask(&s, format!("held {i}").as_bytes()).await;
        clients.push(s);
    }
    // Two more client addresses: no room, so their datagrams are dropped and counted.
    for _ in 0..2 {
        let s = client(f.addr).await;
        s.send(b"no room").await.unwrap();
        clients.push(s);
    }
    assert!(
        common::eventually(|| dropped(&f.metrics, "flow_limit") == 2).await,
        "{}",
        f.metrics.encode()
    );
    assert_eq!(flows(&f.metrics), 3);
    // The flows held keep working.
    let answer = ask(&clients[0], b"still").await;
    assert!(answer.ends_with(b" still"));
}

#[tokio::test]
async fn datagrams_nothing_serves_are_dropped_and_counted() {
    for (routes, backends, reason) in [
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
        (vec![], vec![], "no_route"),
    ] {
        let f = serve(table(routes, backends), ProxyOptions::default()).await;
        let s = client(f.addr).await;
        s.send(b"hello").await.unwrap();
        assert!(
            common::eventually(|| dropped(&f.metrics, reason) == 1).await,
            "{reason}: {}",
            f.metrics.encode()
        );
        assert_eq!(flows(&f.metrics), 0, "{reason}");
    }
}

#[tokio::test]
async fn a_port_removed_and_added_again_binds_while_its_flows_were_open() {
    let a = echo("a").await;
    // A fixed port: the table names it, so the second apply binds the same address.
    let free = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let mut t = table(vec![route("r", &[("a", 1)])], vec![("a", backend(&[a]))]);
    t.ports[0].port = port;
    let proxy = Proxy::new(ProxyOptions::default());
    proxy.apply(t.clone()).await.unwrap();
    let addr = proxy.local_addr(port).unwrap();
    let s = client(addr).await;
    ask(&s, b"one").await;
    // The port goes while its flow is open (idle timeout: a minute away)...
    let mut empty = t.clone();
    empty.version = 2;
    empty.ports.clear();
    proxy.apply(empty).await.unwrap();
    // ...and comes back: its address is free again, and served.
    t.version = 3;
    proxy.apply(t).await.unwrap();
    let answer = ask(&s, b"two").await;
    assert_eq!(answer, b"a two");
}
