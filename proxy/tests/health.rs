//! Socket tests of active health checks (BackendPolicy `healthCheck.active`): real backends
//! on loopback whose health answer the test flips (an HTTP `/healthz`, a gRPC
//! `grpc.health.v1.Health/Check`, a listener closed and opened again), a proxy that probes
//! them, and the traffic and metrics that show which endpoints it takes out and brings back.
//! Every wait polls real state until a deadline; nothing asserts how long anything took.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tollgate_api::backend::{BackendSettings, HealthCheck, OutlierDetection, Probe};
use tollgate_api::{Backend, BackendProtocol, Endpoint, LoadBalancer};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

/// A health-check request as the backend saw it.
#[derive(Debug, Clone)]
struct Seen {
    version: String,
    /// Host (HTTP/1.1) or `:authority` (HTTP/2).
    host: String,
    connection: Option<String>,
    /// The service a gRPC check asked about.
    service: Option<String>,
}

/// A backend on loopback (HTTP/1.1 and h2c) whose health answer the test flips: `/healthz`
/// answers 200 or 503, `grpc.health.v1.Health/Check` SERVING or NOT_SERVING; any other
/// path is traffic, answered with the backend's name.
#[derive(Clone)]
struct Flip {
    addr: SocketAddr,
    name: &'static str,
    healthy: Arc<AtomicBool>,
    checks: Arc<Mutex<Vec<Seen>>>,
    traffic: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    accept: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Flip {
    async fn start(name: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let f = Self {
            addr: listener.local_addr().unwrap(),
            name,
            healthy: Arc::new(AtomicBool::new(true)),
            checks: Arc::default(),
            traffic: Arc::default(),
            connections: Arc::default(),
            accept: Arc::default(),
        };
        f.serve(listener);
        f
    }

    fn serve(&self, listener: TcpListener) {
        let state = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(state.clone(), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        *self.accept.lock().unwrap() = Some(task);
    }

    /// Stops listening: connects are refused from when this returns.
    async fn close(&self) {
        let task = self.accept.lock().unwrap().take().unwrap();
        task.abort();
        let _ = task.await;
    }

    /// Listens again on the same address.
    async fn reopen(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }
    fn checks(&self) -> Vec<Seen> {
        self.checks.lock().unwrap().clone()
    }
    fn checked(&self) -> usize {
        self.checks.lock().unwrap().len()
    }
    fn traffic(&self) -> usize {
        self.traffic.load(Ordering::SeqCst)
    }
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            ip: self.addr.ip().to_string(),
            port: self.addr.port(),
        }
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

async fn answer(state: Flip, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let healthy = state.healthy.load(Ordering::SeqCst);
    let header = |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
    let mut seen = Seen {
        version: format!("{:?}", req.version()),
        host: header("host")
            .or_else(|| req.uri().authority().map(|a| a.to_string()))
            .unwrap_or_default(),
        connection: header("connection"),
        service: None,
    };
    match req.uri().path() {
        "/healthz" => {
            state.checks.lock().unwrap().push(seen);
            let status = if healthy { 200 } else { 503 };
            Ok(Response::builder()
                .status(status)
                .body(full("health"))
                .unwrap())
        }
        "/grpc.health.v1.Health/Check" => {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            // A HealthCheckRequest: the 5-byte frame header, then field 1 (0x0a), a short
            // length, the name; or nothing for the server as a whole.
            seen.service = Some(match body.get(5..) {
                Some([0x0a, n, name @ ..]) if name.len() == usize::from(*n) => {
                    String::from_utf8(name.to_vec()).unwrap()
                }
                _ => String::new(),
            });
            let unknown = seen.service.as_deref() == Some("unknown.Service");
            state.checks.lock().unwrap().push(seen);
            if unknown {
                // As grpc-go's health server: Trailers-Only NOT_FOUND (5).
                return Ok(Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "5")
                    .body(full(Bytes::new()))
                    .unwrap());
            }
            let status = if healthy { 1 } else { 2 };
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from(vec![0, 0, 0, 0, 2, 0x08, status]))),
                Ok(Frame::trailers(trailers)),
            ];
            Ok(Response::builder()
                .header("content-type", "application/grpc")
                .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
                .unwrap())
        }
        _ => {
            state.traffic.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(full(state.name)))
        }
    }
}

fn http_check(host: Option<&str>) -> HealthCheck {
    checking(Probe::Http {
        path: "/healthz".into(),
        host: host.map(str::to_owned),
        expected_statuses: vec![200, 204],
    })
}

/// Checks every 50 ms; two results in a row change a verdict.
fn checking(probe: Probe) -> HealthCheck {
    HealthCheck {
        probe,
        interval_ms: 50,
        timeout_ms: 2_000,
        unhealthy_threshold: 2,
        healthy_threshold: 2,
    }
}

fn backend(protocol: BackendProtocol, eps: &[&Flip], check: Option<HealthCheck>) -> Backend {
    Backend {
        protocol,
        load_balancer: LoadBalancer::RoundRobin,
        endpoints: eps.iter().map(|f| f.endpoint()).collect(),
        settings: BackendSettings {
            health_check: check,
            ..BackendSettings::default()
        },
        tls: None,
    }
}

/// A proxy routing `/` to backend `web`, and its metrics.
async fn proxy(backends: Vec<(&str, Backend)>) -> (Proxy, String, Arc<Metrics>) {
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    let routes = vec![route("r", "/", vec![wb("web", 1)])];
    proxy
        .apply(table(1, vec![http_port(0, routes)], backends))
        .await
        .unwrap();
    let url = format!("http://{}/", proxy.local_addr(0).unwrap());
    (proxy, url, metrics)
}

/// The value of one series (`name{labels}`), if it is there.
fn value(m: &Metrics, series: &str) -> Option<f64> {
    m.encode().lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.parse().ok()
    })
}

fn healthy_endpoints(m: &Metrics, backend: &str) -> Option<f64> {
    value(
        m,
        &format!(r#"tollgate_backend_healthy_endpoints{{backend="{backend}"}}"#),
    )
}

/// Polls `cond` until it holds or 10 s have passed; true if it held.
async fn until(mut cond: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond().await
}

/// Sends `n` requests to `url`; the names of the backends that answered.
async fn names(client: &TestClient, url: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let a = get(client, url).await;
        assert_eq!(a.status, 200);
        out.push(String::from_utf8(a.body.to_vec()).unwrap());
    }
    out
}

#[tokio::test]
async fn a_failing_http_check_takes_an_endpoint_out_and_passing_again_brings_it_back() {
    let (a, b, c) = (
        Flip::start("a").await,
        Flip::start("b").await,
        Flip::start("c").await,
    );
    let web = backend(
        BackendProtocol::Http1,
        &[&a, &b, &c],
        Some(http_check(None)),
    );
    let (_proxy, url, m) = proxy(vec![("web", web)]).await;
    assert!(until(async || a.checked() >= 3 && b.checked() >= 3 && c.checked() >= 3).await);
    assert_eq!(healthy_endpoints(&m, "web"), Some(3.0));
    // HTTP/1.1, Host the endpoint's address, on a fresh connection each time (no traffic
    // yet: every connection is a check's).
    for f in [&a, &b, &c] {
        let checks = f.checks();
        for s in &checks {
            assert_eq!(s.version, "HTTP/1.1");
            assert_eq!(s.host, f.addr.to_string());
            assert_eq!(s.connection.as_deref(), Some("close"));
        }
        assert!(f.connections.load(Ordering::SeqCst) >= checks.len());
    }

    a.set_healthy(false);
    assert!(until(async || healthy_endpoints(&m, "web") == Some(2.0)).await);
    assert_eq!(
        value(
            &m,
            r#"tollgate_health_check_transitions_total{to="unhealthy"}"#
        ),
        Some(1.0)
    );
    let client = h1_client();
    let answered = names(&client, &url, 30).await;
    assert!(answered.iter().all(|n| n != "a"), "{answered:?}");
    assert_eq!(a.traffic(), 0);
    assert_eq!(b.traffic() + c.traffic(), 30);

    a.set_healthy(true);
    assert!(until(async || healthy_endpoints(&m, "web") == Some(3.0)).await);
    assert!(until(async || names(&client, &url, 3).await.iter().any(|n| n == "a")).await);
    assert_eq!(
        value(
            &m,
            r#"tollgate_health_check_transitions_total{to="healthy"}"#
        ),
        Some(1.0)
    );
    let fails = value(&m, r#"tollgate_health_checks_total{result="fail"}"#).unwrap();
    assert!(fails >= 2.0, "{fails}");
    let passes = value(&m, r#"tollgate_health_checks_total{result="pass"}"#).unwrap();
    assert!(passes >= 9.0 + 2.0, "{passes}");
}

#[tokio::test]
async fn an_h2c_backend_is_checked_over_http2_with_the_host_the_policy_gives() {
    let h = Flip::start("h").await;
    let web = backend(
        BackendProtocol::H2c,
        &[&h],
        Some(http_check(Some("health.example"))),
    );
    let (_proxy, _url, m) = proxy(vec![("web", web)]).await;
    assert!(until(async || h.checked() >= 2).await);
    for s in h.checks() {
        assert_eq!(
            (s.version.as_str(), s.host.as_str()),
            ("HTTP/2.0", "health.example")
        );
    }
    assert!(value(&m, r#"tollgate_health_checks_total{result="pass"}"#).unwrap() >= 2.0);
    assert_eq!(
        value(&m, r#"tollgate_health_checks_total{result="fail"}"#),
        None
    );
}

#[tokio::test]
async fn grpc_health_checks_follow_the_serving_status() {
    let (g1, g2) = (Flip::start("g1").await, Flip::start("g2").await);
    let check = checking(Probe::Grpc {
        service: "shop.Cart".into(),
    });
    let web = backend(BackendProtocol::H2c, &[&g1, &g2], Some(check));
    let (_proxy, url, m) = proxy(vec![("web", web)]).await;
    assert!(until(async || g1.checked() >= 2 && g2.checked() >= 2).await);
    for s in g1.checks() {
        assert_eq!(s.version, "HTTP/2.0");
        assert_eq!(s.service.as_deref(), Some("shop.Cart"));
    }

    g1.set_healthy(false);
    assert!(until(async || healthy_endpoints(&m, "web") == Some(1.0)).await);
    let client = h1_client();
    let answered = names(&client, &url, 20).await;
    assert!(answered.iter().all(|n| n == "g2"), "{answered:?}");

    g1.set_healthy(true);
    assert!(until(async || healthy_endpoints(&m, "web") == Some(2.0)).await);
    assert!(until(async || names(&client, &url, 2).await.iter().any(|n| n == "g1")).await);
}

#[tokio::test]
async fn a_grpc_check_of_a_service_the_server_does_not_know_fails() {
    let g = Flip::start("g").await;
    let check = checking(Probe::Grpc {
        service: "unknown.Service".into(),
    });
    let web = backend(BackendProtocol::H2c, &[&g], Some(check));
    let (_proxy, _url, m) = proxy(vec![("web", web)]).await;
    assert!(until(async || healthy_endpoints(&m, "web") == Some(0.0)).await);
    assert_eq!(
        value(
            &m,
            r#"tollgate_health_check_transitions_total{to="unhealthy"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&m, r#"tollgate_health_checks_total{result="pass"}"#),
        None
    );
}

#[tokio::test]
async fn tcp_checks_take_out_a_closed_listener_until_it_listens_again() {
    let (t1, t2) = (Flip::start("t1").await, Flip::start("t2").await);
    let web = backend(
        BackendProtocol::Http1,
        &[&t1, &t2],
        Some(checking(Probe::Tcp)),
    );
    let (_proxy, url, m) = proxy(vec![("web", web)]).await;
    let client = h1_client();
    assert!(until(async || names(&client, &url, 2).await.iter().any(|n| n == "t1")).await);

    t1.close().await;
    assert!(until(async || healthy_endpoints(&m, "web") == Some(1.0)).await);
    let answered = names(&client, &url, 20).await;
    assert!(answered.iter().all(|n| n == "t2"), "{answered:?}");

    t1.reopen().await;
    assert!(until(async || healthy_endpoints(&m, "web") == Some(2.0)).await);
    assert!(until(async || names(&client, &url, 2).await.iter().any(|n| n == "t1")).await);
    assert!(
        value(
            &m,
            r#"tollgate_health_check_transitions_total{to="healthy"}"#
        )
        .unwrap()
            >= 1.0
    );
}

#[tokio::test]
async fn a_table_without_the_check_stops_the_probing_and_lets_the_endpoint_back() {
    let (x, y, witness) = (
        Flip::start("x").await,
        Flip::start("y").await,
        Flip::start("w").await,
    );
    let checked = backend(BackendProtocol::Http1, &[&x, &y], Some(http_check(None)));
    // Outlier detection stays: the balancer still reads the endpoints' health.
    let mut unchecked = backend(BackendProtocol::Http1, &[&x, &y], None);
    unchecked.settings.outlier = Some(outlier());
    let other = backend(BackendProtocol::Http1, &[&witness], Some(http_check(None)));
    let (proxy, url, m) = proxy(vec![("web", checked), ("other", other.clone())]).await;
    x.set_healthy(false);
    assert!(until(async || healthy_endpoints(&m, "web") == Some(1.0)).await);

    let routes = vec![route("r", "/", vec![wb("web", 1)])];
    proxy
        .apply(table(
            2,
            vec![http_port(0, routes)],
            vec![("web", unchecked), ("other", other)],
        ))
        .await
        .unwrap();
    let (x_at_swap, y_at_swap, w_at_swap) = (x.checked(), y.checked(), witness.checked());
    // The verdict went with the check.
    assert_eq!(healthy_endpoints(&m, "web"), Some(2.0));
    // The witness, still checked, shows time passing: five more checks of it.
    assert!(until(async || witness.checked() >= w_at_swap + 5).await);
    // At most one check that was on its way when the table changed.
    assert!(
        x.checked() <= x_at_swap + 1,
        "{} > {x_at_swap} + 1",
        x.checked()
    );
    assert!(
        y.checked() <= y_at_swap + 1,
        "{} > {y_at_swap} + 1",
        y.checked()
    );
    // x takes traffic again, though its /healthz still fails.
    let client = h1_client();
    assert!(until(async || names(&client, &url, 2).await.iter().any(|n| n == "x")).await);
}

fn outlier() -> OutlierDetection {
    OutlierDetection {
        consecutive_5xx: Some(5),
        consecutive_gateway_errors: None,
        consecutive_local_origin_failures: None,
        interval_ms: 10_000,
        base_ejection_ms: 30_000,
        max_ejection_percent: 50,
    }
}

#[tokio::test]
async fn a_backend_with_only_outlier_detection_shows_its_available_endpoints() {
    let (a, b) = (Flip::start("a").await, Flip::start("b").await);
    let mut web = backend(BackendProtocol::Http1, &[&a, &b], None);
    web.settings.outlier = Some(outlier());
    let plain = backend(BackendProtocol::Http1, &[&a], None);
    let (_proxy, _url, m) = proxy(vec![("web", web), ("plain", plain)]).await;
    assert_eq!(healthy_endpoints(&m, "web"), Some(2.0));
    assert_eq!(healthy_endpoints(&m, "plain"), None);
}
