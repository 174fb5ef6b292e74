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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tollgate_api::backend_tls::{SubjectAltName, Trust};
use tollgate_api::{Backend, BackendProtocol, BackendTls, Certificate, Endpoint, LoadBalancer};

// ---- PKI ----

struct Ca {
    pem: String,
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key.
struct Leaf {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
    key_pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for these DNS names, and these URIs as subject alternative names.
    fn leaf(&self, dns: &[&str], uris: &[&str]) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>())
                .unwrap();
        for u in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*u).try_into().unwrap()));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, dns.first().copied().unwrap_or("client"));
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
            key_pem: key.serialize_pem(),
        }
    }
}

// ---- the TLS backend ----

/// A TLS echo backend: answers JSON with what it saw (path, HTTP version, SNI, whether a
/// client certificate came); records the first byte of every TCP connection.
struct TlsBackend {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    first_bytes: Arc<Mutex<Vec<u8>>>,
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
    };
    let (connections, requests, first_bytes) = (
        b.connections.clone(),
        b.requests.clone(),
        b.first_bytes.clone(),
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
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (_, conn) = tls.get_ref();
                let sni = conn.server_name().map(str::to_owned);
                let client_cert = conn.peer_certificates().is_some_and(|c| !c.is_empty());
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    requests.fetch_add(1, Ordering::SeqCst);
                    let body = json!({
                        "path": req.uri().path(),
                        "version": format!("{:?}", req.version()),
                        "sni": sni,
                        "clientCert": client_cert,
                        "authority": req.uri().authority().map(|a| a.to_string()),
                        "host": req.headers().get("host").and_then(|h| h.to_str().ok()),
                    });
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            body.to_string(),
                        ))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    b
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
