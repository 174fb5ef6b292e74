//! Fixtures for the push tests: generated PKI written to a temp dir, an echo backend, route
//! tables, a tiny HTTP/1 GET, and polling helpers. Everything listens on 127.0.0.1.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tollgate::push::pki::{Ca, ClientTls, proxy_identity};
use tollgate::push::{PushServer, SyncState};
use tollgate_api::{
    Backend, BackendProtocol, Endpoint, ListenerConfig, LoadBalancer, ObjectKey, PathMatch,
    PortConfig, Protocol, Route, RouteMatch, RouteTable, Timeouts, VirtualHost, WeightedBackend,
};
use tollgate_proxy::subscribe::{self, SubscribeConfig, Subscription};
use tollgate_proxy::{Proxy, ProxyOptions};

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-{tag}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes tls.crt, tls.key and ca.crt of `tls` into a new directory.
pub fn tls_dir(tls: &ClientTls) -> PathBuf {
    let dir = temp_dir("tls");
    std::fs::write(dir.join("tls.crt"), &tls.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &tls.key_pem).unwrap();
    std::fs::write(dir.join("ca.crt"), &tls.ca_pem).unwrap();
    dir
}

pub fn gw() -> ObjectKey {
    ObjectKey::new("default", "gw")
}

/// A CA and a push server on 127.0.0.1:`port` (0 = ephemeral).
pub async fn server(ca: &Ca, port: u16) -> PushServer {
    let tls = ca.issue_server(&["localhost".into()]).unwrap();
    PushServer::start(SocketAddr::from(([127, 0, 0, 1], port)), tls)
        .await
        .unwrap()
}

/// A proxy subscribed to `server` for [`gw`] with a fresh client certificate.
pub async fn subscriber(
    ca: &Ca,
    addr: SocketAddr,
    state_dir: &std::path::Path,
) -> (Proxy, Subscription) {
    let tls = ca.issue_client(&proxy_identity("default", "gw")).unwrap();
    subscriber_with(tls_dir(&tls), addr, state_dir).await
}

pub async fn subscriber_with(
    tls_dir: PathBuf,
    addr: SocketAddr,
    state_dir: &std::path::Path,
) -> (Proxy, Subscription) {
    let proxy = Proxy::new(ProxyOptions::default());
    let mut config = SubscribeConfig::new(
        format!("https://{addr}"),
        gw(),
        "proxy-1",
        tls_dir,
        state_dir,
    );
    config.backoff_min = Duration::from_millis(20);
    config.backoff_max = Duration::from_millis(300);
    let sub = subscribe::spawn(proxy.clone(), config).await;
    (proxy, sub)
}

/// An HTTP/1 backend answering every request with its name.
pub async fn echo(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(move |_req| async move {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(name))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// A table for [`gw`]: port 0 on 127.0.0.1, `/` to backend `b` with `endpoints`.
pub fn table(endpoints: &[SocketAddr]) -> RouteTable {
    table_with_path(endpoints, PathMatch::PathPrefix("/".into()))
}

pub fn table_with_path(endpoints: &[SocketAddr], path: PathMatch) -> RouteTable {
    let route = Route {
        route: ObjectKey::new("default", "r"),
        rule_index: 0,
        rule_name: None,
        matcher: RouteMatch {
            path,
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
        version: 0,
        gateway: gw(),
        policies: BTreeMap::new(),
        closed: BTreeMap::new(),
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
                load_balancer: LoadBalancer::RoundRobin,
                settings: Default::default(),
                endpoints: endpoints
                    .iter()
                    .map(|a| Endpoint {
                        ip: a.ip().to_string(),
                        port: a.port(),
                    })
                    .collect(),
            },
        )]),
    }
}

/// GET `http://{proxy port 0}/` and returns the body (or the error as text).
pub async fn get(proxy: &Proxy) -> String {
    let Some(addr) = proxy.local_addr(0) else {
        return "no socket".into();
    };
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();
    match client.request(req).await {
        Ok(resp) => {
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8_lossy(&body).into_owned()
        }
        Err(e) => format!("error: {e}"),
    }
}

/// Polls `cond` every 10 ms for up to 10 s.
pub async fn eventually<F: std::future::Future<Output = bool>>(
    mut cond: impl FnMut() -> F,
) -> bool {
    for _ in 0..1000 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Waits until the server's sync state of [`gw`] satisfies `pred`; returns the last state.
pub async fn wait_sync(server: &PushServer, pred: impl Fn(&SyncState) -> bool) -> SyncState {
    let mut changes = server.changes();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = server.sync(&gw());
        if pred(&s) {
            return s;
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            panic!("sync state never matched; last: {s:?}");
        }
    }
}

/// GET `url`: (status, body), or `None` when it cannot connect.
pub async fn get_url(url: &str) -> Option<(u16, String)> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::get(url).body(Full::default()).unwrap();
    let resp = client.request(req).await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
