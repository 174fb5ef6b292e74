//! Socket tests of TLS to backends (`Backend.tls`, BackendTLSPolicy): a real rustls backend
//! on 127.0.0.1 with certificates from a CA made in the test (rcgen), the proxy in front.
//!
//! What must hold: a backend whose chain leads to the policy's CAs and whose certificate
//! carries the name asked for is served (over HTTP/1.1 or, when it picks it by ALPN, HTTP/2);
//! anything else fails the handshake, the client gets 502, the failure is counted as `tls`,
//! and not a byte of the request reaches the backend in plaintext. The Gateway's client
//! certificate is presented to backends that ask for one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::pki::{Ca, Leaf};
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tollgate_api::backend::{BackendSettings, HealthCheck, Probe};
use tollgate_api::backend_tls::{SubjectAltName, Trust};
use tollgate_api::{Backend, BackendProtocol, BackendTls, Certificate, Endpoint, LoadBalancer};

// ---- the TLS backend ----

/// A TLS echo backend: answers JSON with what it saw (path, HTTP version, SNI, whether a
/// client certificate came); records the first byte of every TCP connection.
/// The HTTP version, SNI and Host (or `:authority`) of a health check a backend served.
type Seen = (String, Option<String>, Option<String>);

struct TlsBackend {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    first_bytes: Arc<Mutex<Vec<u8>>>,
    /// What `/healthz` and the gRPC health check answer: 200 and SERVING, or 503 and
    /// NOT_SERVING.
    healthy: Arc<AtomicBool>,
    /// The HTTP version and SNI of every health check served.
    checks: Arc<Mutex<Vec<Seen>>>,
}

/// Starts a backend serving `leaf`, offering `alpn`; `client_ca`: require a client
/// certificate that CA signed.
async fn tls_backend(leaf: &Leaf, alpn: &[&str], client_ca: Option<&Ca>) -> TlsBackend {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.der.clone()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(
            vec![leaf.cert_der.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_der.clone())),
        )
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = TlsBackend {
        addr: listener.local_addr().unwrap(),
        connections: Arc::default(),
        requests: Arc::default(),
        first_bytes: Arc::default(),
        healthy: Arc::new(AtomicBool::new(true)),
        checks: Arc::default(),
    };
    let (connections, requests, first_bytes, healthy, checks) = (
        b.connections.clone(),
        b.requests.clone(),
        b.first_bytes.clone(),
        b.healthy.clone(),
        b.checks.clone(),
    );
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            connections.fetch_add(1, Ordering::SeqCst);
            let mut byte = [0u8; 1];
            if let Ok(1) = tcp.peek(&mut byte).await {
                first_bytes.lock().unwrap().push(byte[0]);
            }
            let acceptor = acceptor.clone();
            let requests = requests.clone();
            let (healthy, checks) = (healthy.clone(), checks.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (_, conn) = tls.get_ref();
                let sni = conn.server_name().map(str::to_owned);
                let client_cert = conn.peer_certificates().is_some_and(|c| !c.is_empty());
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    if let Some(answer) = health_answer(&req, &healthy, &checks, sni.as_deref()) {
                        return std::future::ready(Ok::<_, std::convert::Infallible>(answer));
                    }
                    requests.fetch_add(1, Ordering::SeqCst);
                    let body = json!({
                        "path": req.uri().path(),
                        "version": format!("{:?}", req.version()),
                        "sni": sni,
                        "clientCert": client_cert,
                        "authority": req.uri().authority().map(|a| a.to_string()),
                        "host": req.headers().get("host").and_then(|h| h.to_str().ok()),
                    });
                    std::future::ready(Ok(Response::new(Full::new(Bytes::from(body.to_string())))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    b
}

/// The answer to a health check (`/healthz`, or gRPC's `Health/Check` with the status in
/// the headers, as a Trailers-Only answer carries it), recorded; `None` for other requests.
fn health_answer(
    req: &Request<hyper::body::Incoming>,
    healthy: &AtomicBool,
    checks: &Mutex<Vec<Seen>>,
    sni: Option<&str>,
) -> Option<Response<Full<Bytes>>> {
    let up = healthy.load(Ordering::SeqCst);
    let answer = match req.uri().path() {
        "/healthz" => Response::builder()
            .status(if up { 200 } else { 503 })
            .body(Full::new(Bytes::new())),
        "/grpc.health.v1.Health/Check" => Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "0")
            // HealthCheckResponse { status: SERVING (1) | NOT_SERVING (2) }
            .body(Full::new(Bytes::from_static(if up {
                &[0, 0, 0, 0, 2, 0x08, 1]
            } else {
                &[0, 0, 0, 0, 2, 0x08, 2]
            }))),
        _ => return None,
    };
    let host = req.uri().authority().map(|a| a.to_string()).or_else(|| {
        let h = req.headers().get("host")?;
        h.to_str().ok().map(str::to_owned)
    });
    checks
        .lock()
        .unwrap()
        .push((format!("{:?}", req.version()), sni.map(str::to_owned), host));
    answer.ok()
}

// ---- the proxy ----

fn settings(ca: &Ca, server_name: &str) -> BackendTls {
    BackendTls {
        source: "default/policy".into(),
        server_name: server_name.into(),
        subject_alt_names: vec![],
        trust: Trust::Pem(ca.pem.clone()),
        alpn: vec!["h2".into(), "http/1.1".into()],
        client_certificate: None,
    }
}

fn tls_backend_def(addr: SocketAddr, tls: BackendTls, protocol: BackendProtocol) -> Backend {
    Backend {
        tls: Some(tls),
        protocol,
        load_balancer: LoadBalancer::default(),
        settings: Default::default(),
        endpoints: vec![Endpoint {
            ip: addr.ip().to_string(),
            port: addr.port(),
        }],
    }
}

/// A proxy routing `/` to backend `b`, and its metrics.
async fn proxy(b: Backend) -> (tollgate_proxy::Proxy, String, Arc<tollgate_proxy::Metrics>) {
    proxy_with_metrics(vec![route("r", "/", vec![wb("b", 1)])], vec![("b", b)]).await
}

async fn get_json(url: &str) -> (StatusCode, serde_json::Value) {
    let a = get_host(&h1_client(), &format!("{url}/hello"), "shop.example").await;
    let v = serde_json::from_slice(&a.body).unwrap_or(serde_json::Value::Null);
    (a.status, v)
}

/// Asserts the request was refused with 502, counted as a TLS failure, and that the
/// backend saw only TLS (a ClientHello first) and served nothing.
#[track_caller]
fn assert_refused(status: StatusCode, b: &TlsBackend, metrics: &tollgate_proxy::Metrics) {
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(b.requests.load(Ordering::SeqCst), 0, "nothing served");
    let firsts = b.first_bytes.lock().unwrap().clone();
    assert!(!firsts.is_empty(), "the proxy did dial the backend");
    // 0x16: a TLS handshake record. A plaintext request would start with a method.
    assert!(firsts.iter().all(|&b| b == 0x16), "{firsts:?}");
    let text = metrics.encode();
    assert!(
        text.contains(r#"tollgate_upstream_errors_total{kind="tls"}"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_verified_backend_is_served_over_http1_with_the_policy_sni() {
    let ca = Ca::new("backend CA");
    let b = tls_backend(&ca.leaf(&["backend.test"], &[]), &["http/1.1"], None).await;
    let (_p, url, _m) = proxy(tls_backend_def(
        b.addr,
        settings(&ca, "backend.test"),
        BackendProtocol::Http1,
    ))
    .await;
    for _ in 0..3 {
        let (status, v) = get_json(&url).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["sni"], "backend.test");
        assert_eq!(v["version"], "HTTP/1.1");
        assert_eq!(v["path"], "/hello");
        // The request's own Host goes through; the SNI is the policy's.
        assert_eq!(v["host"], "shop.example");
        assert_eq!(v["clientCert"], false);
    }
    // Pooled: three requests, one TLS connection.
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let ca = Ca::new("backend CA");
    let b = tls_backend(&ca.leaf(&["other.test"], &[]), &["http/1.1"], None).await;
    let (_p, url, m) = proxy(tls_backend_def(
        b.addr,
        settings(&ca, "backend.test"),
        BackendProtocol::Http1,
    ))
    .await;
    let (status, _) = get_json(&url).await;
    assert_refused(status, &b, &m);
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_is_refused() {
    let ca = Ca::new("backend CA");
    let rogue = Ca::new("rogue CA");
    let b = tls_backend(&rogue.leaf(&["backend.test"], &[]), &["http/1.1"], None).await;
    let (_p, url, m) = proxy(tls_backend_def(
        b.addr,
        settings(&ca, "backend.test"),
        BackendProtocol::Http1,
    ))
    .await;
    let (status, _) = get_json(&url).await;
    assert_refused(status, &b, &m);
}

#[tokio::test]
async fn subject_alt_names_replace_the_hostname() {
    let ca = Ca::new("backend CA");
    // The certificate does not carry the SNI name at all.
    let leaf = ca.leaf(&["api.internal"], &["spiffe://td/ns/shop/sa/api"]);
    for (sans, ok) in [
        (
            vec![SubjectAltName::Uri("spiffe://td/ns/shop/sa/api".into())],
            true,
        ),
        (vec![SubjectAltName::Hostname("api.internal".into())], true),
        (
            vec![
                SubjectAltName::Uri("spiffe://td/ns/shop/sa/other".into()),
                SubjectAltName::Hostname("api.internal".into()),
            ],
            true,
        ),
        (
            vec![SubjectAltName::Uri("spiffe://td/ns/shop/sa/other".into())],
            false,
        ),
        (
            vec![SubjectAltName::Hostname("nope.internal".into())],
            false,
        ),
    ] {
        let b = tls_backend(&leaf, &["http/1.1"], None).await;
        let mut s = settings(&ca, "backend.test");
        s.subject_alt_names = sans.clone();
        let (_p, url, m) = proxy(tls_backend_def(b.addr, s, BackendProtocol::Http1)).await;
        let (status, v) = get_json(&url).await;
        if ok {
            assert_eq!(status, StatusCode::OK, "{sans:?}: {v}");
            assert_eq!(v["sni"], "backend.test", "{sans:?}");
        } else {
            assert_refused(status, &b, &m);
        }
    }
    // A chain from an unknown CA is refused even when a name matches.
    let rogue = Ca::new("rogue CA");
    let b = tls_backend(&rogue.leaf(&["api.internal"], &[]), &["http/1.1"], None).await;
    let mut s = settings(&ca, "backend.test");
    s.subject_alt_names = vec![SubjectAltName::Hostname("api.internal".into())];
    let (_p, url, m) = proxy(tls_backend_def(b.addr, s, BackendProtocol::Http1)).await;
    let (status, _) = get_json(&url).await;
    assert_refused(status, &b, &m);
}

#[tokio::test]
async fn the_client_certificate_is_presented_to_a_backend_that_asks() {
    let ca = Ca::new("backend CA");
    let client_ca = Ca::new("gateway client CA");
    let leaf = ca.leaf(&["backend.test"], &[]);
    let client = client_ca.leaf(&["gateway"], &[]);
    let with_cert = |s: BackendTls| BackendTls {
        client_certificate: Some(Certificate {
            source: "infra/gateway-client".into(),
            cert_pem: client.cert_pem.clone(),
            key_pem: client.key_pem.clone(),
        }),
        ..s
    };
    let b = tls_backend(&leaf, &["http/1.1"], Some(&client_ca)).await;
    let (_p, url, _m) = proxy(tls_backend_def(
        b.addr,
        with_cert(settings(&ca, "backend.test")),
        BackendProtocol::Http1,
    ))
    .await;
    let (status, v) = get_json(&url).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["clientCert"], true);
    // Without it, the backend refuses the handshake.
    let b = tls_backend(&leaf, &["http/1.1"], Some(&client_ca)).await;
    let (_p, url, m) = proxy(tls_backend_def(
        b.addr,
        settings(&ca, "backend.test"),
        BackendProtocol::Http1,
    ))
    .await;
    let (status, _) = get_json(&url).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(b.requests.load(Ordering::SeqCst), 0);
    assert!(
        m.encode()
            .contains(r#"tollgate_upstream_errors_total{kind="#)
    );
}

#[tokio::test]
async fn http2_when_the_backend_picks_it_by_alpn() {
    let ca = Ca::new("backend CA");
    let leaf = ca.leaf(&["backend.test"], &[]);
    // Offered both, picks h2: one multiplexed connection.
    let b = tls_backend(&leaf, &["h2", "http/1.1"], None).await;
    let (_p, url, _m) = proxy(tls_backend_def(
        b.addr,
        settings(&ca, "backend.test"),
        BackendProtocol::Http1,
    ))
    .await;
    for _ in 0..3 {
        let (status, v) = get_json(&url).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["version"], "HTTP/2.0");
        assert_eq!(v["sni"], "backend.test");
        // HTTP/2's :authority carries the request's Host.
        assert_eq!(v["authority"], "shop.example");
        assert_eq!(v["path"], "/hello");
    }
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);
    // The same offer to a backend that speaks HTTP/1.1 only: HTTP/1.1, pooled.
    let b = tls_backend(&leaf, &["http/1.1"], None).await;
    let (_p, url, _m) = proxy(tls_backend_def(
        b.addr,
        settings(&ca, "backend.test"),
        BackendProtocol::Http1,
    ))
    .await;
    for _ in 0..3 {
        let (status, v) = get_json(&url).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["version"], "HTTP/1.1");
    }
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_backend_that_must_get_http2_gets_it_over_tls() {
    // gRPC backends: the compiler offers h2 alone and the route's protocol is HTTP/2.
    let ca = Ca::new("backend CA");
    let b = tls_backend(&ca.leaf(&["backend.test"], &[]), &["h2"], None).await;
    let mut s = settings(&ca, "backend.test");
    s.alpn = vec!["h2".into()];
    let (_p, url, _m) = proxy(tls_backend_def(b.addr, s, BackendProtocol::H2c)).await;
    let (status, v) = get_json(&url).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["version"], "HTTP/2.0");
    assert_eq!(v["sni"], "backend.test");
}

#[tokio::test]
async fn settings_that_cannot_be_built_fail_closed() {
    // A CA that is not PEM (the compiler refuses it; a hand-written table may not).
    let ca = Ca::new("backend CA");
    let b = tls_backend(&ca.leaf(&["backend.test"], &[]), &["http/1.1"], None).await;
    let mut s = settings(&ca, "backend.test");
    s.trust = Trust::Pem("not a certificate".into());
    let (_p, url, m) = proxy(tls_backend_def(b.addr, s, BackendProtocol::Http1)).await;
    let (status, _) = get_json(&url).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    // Never dialled in plaintext (nor at all).
    assert_eq!(b.connections.load(Ordering::SeqCst), 0);
    assert!(
        m.encode()
            .contains(r#"tollgate_upstream_errors_total{kind="tls"} 1"#)
    );
}

#[tokio::test]
async fn connections_are_never_shared_between_tls_settings() {
    let ca = Ca::new("backend CA");
    // One backend process answering for two names.
    let b = tls_backend(&ca.leaf(&["a.test", "b.test"], &[]), &["http/1.1"], None).await;
    let a_def = tls_backend_def(b.addr, settings(&ca, "a.test"), BackendProtocol::Http1);
    let b_def = tls_backend_def(b.addr, settings(&ca, "b.test"), BackendProtocol::Http1);
    let plain = backend_at(b.addr);
    let (_p, url, m) = proxy_with_metrics(
        vec![
            route("a", "/a", vec![wb("a", 1)]),
            route("b", "/b", vec![wb("b", 1)]),
            route("plain", "/plain", vec![wb("plain", 1)]),
        ],
        vec![("a", a_def), ("b", b_def), ("plain", plain)],
    )
    .await;
    let client = h1_client();
    for _ in 0..2 {
        for (path, sni) in [("/a", "a.test"), ("/b", "b.test")] {
            let a = get(&client, &format!("{url}{path}")).await;
            assert_eq!(a.status, StatusCode::OK);
            assert_eq!(a.json()["sni"], sni, "{path}");
        }
    }
    // One connection per settings, each reused.
    assert_eq!(b.connections.load(Ordering::SeqCst), 2);
    // The same address as a plaintext backend gets a connection of its own, in plaintext
    // (the TLS backend refuses it): the TLS pools are not borrowed.
    let a = get(&client, &format!("{url}/plain")).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert_eq!(b.connections.load(Ordering::SeqCst), 3);
    assert_eq!(b.requests.load(Ordering::SeqCst), 4);
    assert!(m.encode().contains("tollgate_upstream_errors_total"));
}

// ---- health checks over TLS ----

/// Checks every 50 ms; two results in a row change a verdict.
fn checking(probe: Probe) -> BackendSettings {
    BackendSettings {
        health_check: Some(HealthCheck {
            probe,
            interval_ms: 50,
            timeout_ms: 2_000,
            unhealthy_threshold: 2,
            healthy_threshold: 2,
        }),
        ..BackendSettings::default()
    }
}

fn http_probe() -> Probe {
    Probe::Http {
        path: "/healthz".into(),
        host: None,
        expected_statuses: vec![200],
    }
}

/// The `tollgate_backend_healthy_endpoints` gauge of backend `b`.
fn healthy_endpoints(m: &tollgate_proxy::Metrics) -> Option<f64> {
    m.encode().lines().find_map(|l| {
        l.strip_prefix(r#"tollgate_backend_healthy_endpoints{backend="b"} "#)?
            .parse()
            .ok()
    })
}

/// Polls `cond` until it holds or 10 s have passed; true if it held.
async fn until(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// Two endpoints of one TLS backend behind `alpn`, checked with `probe`; the first is made
/// to fail its checks and then to pass them again, and the healthy-endpoints gauge must
/// follow. Returns the checks the first endpoint saw.
async fn flip_over_tls(alpn: &[&str], protocol: BackendProtocol, probe: Probe) -> Vec<Seen> {
    let ca = Ca::new("backend CA");
    let leaf = ca.leaf(&["backend.test"], &[]);
    let a = tls_backend(&leaf, alpn, None).await;
    let other = tls_backend(&leaf, alpn, None).await;
    let mut def = tls_backend_def(a.addr, settings(&ca, "backend.test"), protocol);
    def.endpoints.push(Endpoint {
        ip: other.addr.ip().to_string(),
        port: other.addr.port(),
    });
    def.settings = checking(probe);
    let (_p, _url, m) = proxy(def).await;
    assert!(
        until(|| healthy_endpoints(&m) == Some(2.0)).await,
        "{}",
        m.encode()
    );
    assert!(
        until(|| a.checks.lock().unwrap().len() >= 2).await,
        "checks reach the endpoint"
    );
    a.healthy.store(false, Ordering::SeqCst);
    assert!(
        until(|| healthy_endpoints(&m) == Some(1.0)).await,
        "{}",
        m.encode()
    );
    a.healthy.store(true, Ordering::SeqCst);
    assert!(
        until(|| healthy_endpoints(&m) == Some(2.0)).await,
        "{}",
        m.encode()
    );
    // Every check came over TLS (a ClientHello first), none in plaintext.
    let firsts = a.first_bytes.lock().unwrap().clone();
    assert!(firsts.iter().all(|&b| b == 0x16), "{firsts:?}");
    assert_eq!(
        a.requests.load(Ordering::SeqCst),
        0,
        "only checks reached it"
    );
    a.checks.lock().unwrap().clone()
}

/// Every check came as `version`, with the policy's hostname as SNI and as Host.
#[track_caller]
fn assert_checks(checks: &[Seen], version: &str) {
    assert!(
        checks.iter().all(|(v, sni, host)| v == version
            && sni.as_deref() == Some("backend.test")
            && host.as_deref() == Some("backend.test")),
        "{checks:?}"
    );
}

#[tokio::test]
async fn http_health_checks_of_a_tls_backend_are_made_over_verified_tls() {
    let checks = flip_over_tls(&["http/1.1"], BackendProtocol::Http1, http_probe()).await;
    assert_checks(&checks, "HTTP/1.1");
}

#[tokio::test]
async fn http_health_checks_speak_http2_to_a_tls_backend_that_picks_it() {
    let checks = flip_over_tls(&["h2", "http/1.1"], BackendProtocol::Http1, http_probe()).await;
    assert_checks(&checks, "HTTP/2.0");
}

#[tokio::test]
async fn grpc_health_checks_of_a_tls_backend_are_made_over_tls() {
    let probe = Probe::Grpc {
        service: String::new(),
    };
    let checks = flip_over_tls(&["h2"], BackendProtocol::H2c, probe).await;
    assert_checks(&checks, "HTTP/2.0");
}

#[tokio::test]
async fn a_tls_backend_whose_certificate_the_policy_refuses_fails_its_checks() {
    let ca = Ca::new("backend CA");
    // Serves a certificate for another name than the policy's.
    let b = tls_backend(&ca.leaf(&["other.test"], &[]), &["http/1.1"], None).await;
    let mut def = tls_backend_def(
        b.addr,
        settings(&ca, "backend.test"),
        BackendProtocol::Http1,
    );
    def.settings = checking(http_probe());
    let (_p, _url, m) = proxy(def).await;
    assert!(
        until(|| b.connections.load(Ordering::SeqCst) >= 2).await,
        "checks dial it"
    );
    assert!(
        until(|| healthy_endpoints(&m) == Some(0.0)).await,
        "{}",
        m.encode()
    );
    assert!(
        b.checks.lock().unwrap().is_empty(),
        "no check got past the handshake"
    );
    let text = m.encode();
    let counted = |result: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(&format!(
                r#"tollgate_health_checks_total{{result="{result}"}} "#
            ))?
            .parse::<f64>()
            .ok()
        })
    };
    assert!(counted("fail").is_some_and(|n| n >= 2.0), "{text}");
    assert_eq!(counted("pass").unwrap_or(0.0), 0.0, "{text}");
}

// ---- connection settings ----

/// A TLS backend that accepts the TCP connection but never answers the ClientHello: the
/// handshake ends at the BackendPolicy's connect timeout (502, a TLS failure), well within
/// the route's request timeout (which would answer 504), and nothing is sent in plaintext.
#[tokio::test]
async fn a_stalled_handshake_ends_at_the_policy_connect_timeout() {
    let ca = Ca::new("backend CA");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            keep.lock().unwrap().push(tcp);
        }
    });
    let mut def = tls_backend_def(addr, settings(&ca, "backend.test"), BackendProtocol::Http1);
    def.settings.connection.connect_timeout_ms = Some(200);
    let mut r = route("r", "/", vec![wb("b", 1)]);
    r.timeouts.request_ms = Some(3_000);
    let (_p, url, m) = proxy_with_metrics(vec![r], vec![("b", def)]).await;
    let a = get_host(&h1_client(), &format!("{url}/hello"), "shop.example").await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert!(!held.lock().unwrap().is_empty(), "the proxy did connect");
    let text = m.encode();
    assert!(
        text.contains(r#"tollgate_upstream_errors_total{kind="tls"}"#),
        "{text}"
    );
}
