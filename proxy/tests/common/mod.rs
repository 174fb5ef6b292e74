//! Shared fixtures for the socket tests: in-process hyper echo backends, route-table
//! builders and small clients. Everything listens on 127.0.0.1.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod pki;
pub mod raw_h1;
pub mod raw_h2;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tollgate_api::{
    Backend, BackendProtocol, Endpoint, Filter, ListenerConfig, LoadBalancer, ObjectKey, PathMatch,
    PortConfig, Protocol, Route, RouteMatch, RouteTable, Timeouts, VirtualHost, WeightedBackend,
};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

/// A running echo backend.
#[derive(Clone)]
pub struct EchoBackend {
    pub addr: SocketAddr,
    pub name: String,
    pub hits: Arc<AtomicUsize>,
    /// Every request seen, as the JSON it answered.
    pub seen: Arc<Mutex<Vec<Value>>>,
}

impl EchoBackend {
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            ip: self.addr.ip().to_string(),
            port: self.addr.port(),
        }
    }
}

/// Starts an echo backend speaking h1 and h2c (auto). It answers every request with JSON
/// `{backend, method, path, version, headers, body}`. A request header `x-delay-ms: MS`
/// makes it sleep first. A WebSocket
/// upgrade is accepted and messages are echoed back.
pub async fn echo_backend(name: &str) -> EchoBackend {
    spawn_backend(name, false, 0).await
}

/// An echo backend that sleeps `delay_ms` before every answer.
pub async fn slow_backend(name: &str, delay_ms: u64) -> EchoBackend {
    spawn_backend(name, false, delay_ms).await
}

/// An echo backend that speaks HTTP/2 only (prior knowledge).
pub async fn h2_backend(name: &str) -> EchoBackend {
    spawn_backend(name, true, 0).await
}

async fn spawn_backend(name: &str, h2_only: bool, delay_ms: u64) -> EchoBackend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = EchoBackend {
        addr: listener.local_addr().unwrap(),
        name: name.to_owned(),
        hits: Arc::default(),
        seen: Arc::default(),
    };
    let state = b.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| echo(state.clone(), delay_ms, req));
                let mut builder = auto::Builder::new(TokioExecutor::new());
                if h2_only {
                    builder = builder.http2_only();
                }
                let _ = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    b
}

async fn echo(
    state: EchoBackend,
    delay_ms: u64,
    mut req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    state.hits.fetch_add(1, Ordering::SeqCst);
    if delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    if let Some(ms) = req.headers().get("x-delay-ms") {
        let ms: u64 = ms.to_str().unwrap().parse().unwrap();
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(key) = req.headers().get("sec-websocket-key") {
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let mut ws =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            while let Some(Ok(msg)) = ws.next().await {
                if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                    return;
                }
            }
        });
        return Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-accept", accept)
            .body(Full::new(Bytes::new()))
            .unwrap());
    }
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let version = format!("{:?}", req.version());
    let headers = headers_json(req.headers());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let v = json!({
        "backend": state.name,
        "method": method,
        "path": path,
        "version": version,
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    });
    state.seen.lock().unwrap().push(v.clone());
    Ok(Response::builder()
        .header("content-type", "application/json")
        .header("x-backend", state.name.as_str())
        .header("connection", "x-hop")
        .header("x-hop", "secret")
        .header("keep-alive", "timeout=5")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap())
}

fn headers_json(h: &HeaderMap) -> Value {
    let mut m = serde_json::Map::new();
    for name in h.keys() {
        let joined = h
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(", ");
        m.insert(name.to_string(), Value::String(joined));
    }
    Value::Object(m)
}

// ---- route-table builders ----

pub fn backend_of(backends: &[&EchoBackend]) -> Backend {
    Backend {
        tls: None,
        protocol: BackendProtocol::Http1,
        load_balancer: LoadBalancer::default(),
        settings: Default::default(),
        endpoints: backends.iter().map(|b| b.endpoint()).collect(),
    }
}

/// An HTTP/1 backend of one endpoint at `addr` (a listener of the test's own, or none).
pub fn backend_at(addr: SocketAddr) -> Backend {
    Backend {
        tls: None,
        protocol: BackendProtocol::Http1,
        load_balancer: LoadBalancer::default(),
        settings: Default::default(),
        endpoints: vec![Endpoint {
            ip: addr.ip().to_string(),
            port: addr.port(),
        }],
    }
}

pub fn wb(key: &str, weight: u32) -> WeightedBackend {
    WeightedBackend {
        backend: Some(key.to_owned()),
        weight,
        filters: vec![],
    }
}

pub fn route(name: &str, prefix: &str, backends: Vec<WeightedBackend>) -> Route {
    Route {
        route: ObjectKey::new("default", name),
        rule_index: 0,
        rule_name: None,
        matcher: RouteMatch {
            path: PathMatch::PathPrefix(prefix.to_owned()),
            method: None,
            headers: vec![],
            query_params: vec![],
        },
        filters: vec![],
        backends,
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

pub fn with_filters(mut r: Route, filters: Vec<Filter>) -> Route {
    r.filters = filters;
    r
}

/// A plain HTTP port with one catch-all listener and virtual host.
pub fn http_port(port: u16, routes: Vec<Route>) -> PortConfig {
    PortConfig {
        address: "127.0.0.1".into(),
        port,
        protocol: Protocol::Http,
        listeners: vec![ListenerConfig {
            passthrough: false,
            name: "http".into(),
            hostname: None,
            certificates: vec![],
            virtual_hosts: vec![VirtualHost {
                hostname: "*".into(),
                routes: routes.into(),
            }],
        }],
        client_validation: None,
        client: Default::default(),
    }
}

pub fn table(version: u64, ports: Vec<PortConfig>, backends: Vec<(&str, Backend)>) -> RouteTable {
    RouteTable {
        version,
        gateway: ObjectKey::new("default", "gw"),
        policies: BTreeMap::new(),
        closed: BTreeMap::new(),
        ports,
        backends: backends
            .into_iter()
            .map(|(k, b)| (k.to_owned(), b))
            .collect::<BTreeMap<_, _>>(),
    }
}

/// A proxy with default options, serving one plain port 0 with `routes`.
pub async fn proxy_with(routes: Vec<Route>, backends: Vec<(&str, Backend)>) -> (Proxy, String) {
    proxy_with_options(ProxyOptions::default(), routes, backends).await
}

/// A proxy routing only `/api`, and a raw TCP connection to it that has sent
/// `GET /nope` (which the proxy answers itself with a 404, no upstream involved): for tests of
/// what happens to a keep-alive connection after an answer. The echo backend is kept alive
/// with the proxy.
#[allow(dead_code)]
pub async fn proxy_and_connection_after_a_404_request()
-> (Proxy, EchoBackend, tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let b = echo_backend("b").await;
    let (proxy, url) = proxy_with(
        vec![route("api", "/api", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let mut s = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    s.write_all(NOPE_REQUEST).await.unwrap();
    (proxy, b, s)
}

/// The request [`proxy_and_connection_after_a_404_request`] sends.
#[allow(dead_code)]
pub const NOPE_REQUEST: &[u8] = b"GET /nope HTTP/1.1\r\nHost: a\r\n\r\n";

pub async fn proxy_with_options(
    opts: ProxyOptions,
    routes: Vec<Route>,
    backends: Vec<(&str, Backend)>,
) -> (Proxy, String) {
    let proxy = Proxy::new(opts);
    proxy
        .apply(table(1, vec![http_port(0, routes)], backends))
        .await
        .unwrap();
    let addr = proxy.local_addr(0).unwrap();
    (proxy, format!("http://{addr}"))
}

pub fn metrics() -> Arc<Metrics> {
    Arc::new(Metrics::new())
}

/// [`proxy_with`], and the metrics it records into.
pub async fn proxy_with_metrics(
    routes: Vec<Route>,
    backends: Vec<(&str, Backend)>,
) -> (Proxy, String, Arc<Metrics>) {
    let metrics = metrics();
    let opts = ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    };
    let (p, url) = proxy_with_options(opts, routes, backends).await;
    (p, url, metrics)
}

// ---- clients ----

/// A gRPC call as a client makes it: POST, `te: trailers`, one empty message, with the
/// `content-type` given.
pub fn grpc_call(url: &str, content_type: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap()
}

/// A child process killed (and reaped) when dropped.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub type TestClient = Client<HttpConnector, Full<Bytes>>;

pub fn h1_client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn h2c_client() -> TestClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// One HTTP/2 (prior knowledge) connection to the proxy at `url`, for requests whose body
/// the test drives frame by frame; the connection runs in a task of its own.
pub async fn h2_connection<B>(url: &str) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    sender
}

/// A response read to the end.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    /// A header the backend received.
    pub fn upstream_header(&self, name: &str) -> Option<String> {
        self.json()["headers"][name].as_str().map(str::to_owned)
    }
}

pub async fn send(client: &TestClient, req: Request<Full<Bytes>>) -> Answer {
    let resp = client.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(client: &TestClient, url: &str) -> Answer {
    send(client, Request::get(url).body(Full::default()).unwrap()).await
}

/// GET with a Host header.
pub async fn get_host(client: &TestClient, url: &str, host: &str) -> Answer {
    send(
        client,
        Request::get(url)
            .header("host", host)
            .body(Full::default())
            .unwrap(),
    )
    .await
}

/// Writes raw bytes on a fresh connection and returns everything read until close or 2 s.
pub async fn raw(addr: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = addr.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A free port on 127.0.0.1 (bind 0, read, drop; the race is acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `cond` every 10 ms for up to 5 s.
pub async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}
