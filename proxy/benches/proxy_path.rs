//! Cost of the whole data path. In: an in-process HTTP/1.1 backend answering `ok`, and a
//! proxy with one route to it, both on 127.0.0.1. Out: criterion timings of one keep-alive
//! GET sent straight to the backend and the same GET through the proxy; the difference is
//! what the proxy adds (routing, header hygiene, balancing, pooled upstream, metrics).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::convert::Infallible;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tollgate_api::{
    Backend, BackendProtocol, Endpoint, ListenerConfig, LoadBalancer, ObjectKey, PathMatch,
    PortConfig, Protocol, Route, RouteMatch, RouteTable, Timeouts, VirtualHost, WeightedBackend,
};
use tollgate_proxy::{Proxy, ProxyOptions};

async fn backend() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn table(backend: std::net::SocketAddr) -> RouteTable {
    let route = Route {
        route: ObjectKey::new("bench", "r"),
        rule_index: 0,
        rule_name: None,
        matcher: RouteMatch {
            path: PathMatch::PathPrefix("/".into()),
            method: None,
            headers: vec![],
            query_params: vec![],
        },
        filters: vec![],
        backends: vec![WeightedBackend {
            backend: Some("b".into()),
            weight: 1,
            filters: vec![],
        }],
        timeouts: Timeouts::default(),
        policy: None,
        request_trailers: false,
        max_request_body_bytes: None,
        compression_disabled: false,
        grpc_web: false,
        cache: None,
        retry: None,
        session: None,
    };
    RouteTable {
        version: 1,
        gateway: ObjectKey::new("bench", "gw"),
        policies: Default::default(),
        closed: Default::default(),
        ports: vec![PortConfig {
            address: "127.0.0.1".into(),
            port: 0,
            protocol: Protocol::Http,
            listeners: vec![ListenerConfig {
                passthrough: false,
                name: "http".into(),
                hostname: None,
                certificates: vec![],
                virtual_hosts: vec![VirtualHost {
                    hostname: "*".into(),
                    routes: vec![route].into(),
                }],
            }],
            client_validation: None,
            client: Default::default(),
        }],
        backends: BTreeMap::from([(
            "b".to_owned(),
            Backend {
                tls: None,
                protocol: BackendProtocol::Http1,
                load_balancer: LoadBalancer::LeastRequest,
                settings: Default::default(),
                endpoints: vec![Endpoint {
                    ip: backend.ip().to_string(),
                    port: backend.port(),
                }],
            },
        )]),
    }
}

async fn get(client: &Client<HttpConnector, Full<Bytes>>, url: &str) {
    let resp = client
        .request(Request::get(url).body(Full::default()).unwrap())
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let _ = resp.into_body().collect().await.unwrap();
}

fn proxy_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (direct, proxied, _proxy) = rt.block_on(async {
        let b = backend().await;
        let proxy = Proxy::new(ProxyOptions::default());
        proxy.apply(table(b)).await.unwrap();
        let p = proxy.local_addr(0).unwrap();
        (format!("http://{b}/x"), format!("http://{p}/x"), proxy)
    });
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut g = c.benchmark_group("get_keepalive");
    g.bench_function("direct", |b| b.iter(|| rt.block_on(get(&client, &direct))));
    g.bench_function("via_proxy", |b| {
        b.iter(|| rt.block_on(get(&client, &proxied)))
    });
    g.finish();
}

criterion_group!(benches, proxy_path);
criterion_main!(benches);
