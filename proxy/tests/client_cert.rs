//! Socket tests of client-certificate validation on HTTPS ports (`PortConfig.client_validation`,
//! Gateway `spec.tls.frontend`) and of X.509 authentication on top of it: real TLS handshakes
//! with client certificates made by rcgen, an echo backend on 127.0.0.1.
//!
//! `AllowValidOnly` fails the handshake of a client without a certificate the port's CAs
//! verify. `AllowInsecureFallback` serves every client, but only a verified certificate ever
//! reaches X.509 authentication. In TLS 1.3 the client finishes its side of the handshake
//! before the server judges its certificate, so a refusal shows as the server's alert on the
//! client's first read; in TLS 1.2 it ends the client's handshake.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, ClientConfig, SupportedProtocolVersion};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tollgate_api::policy::{Auth, AuthnMethod, Credentials, DenyResponse, Method};
use tollgate_api::{
    Certificate, ClientCertMode, ClientValidation, ListenerConfig, ObjectKey, PolicySet,
    PortConfig, Protocol, RouteTable, VirtualHost,
};
use tollgate_proxy::{Proxy, ProxyOptions};

const HOST: &str = "gw.example";
const TLS13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
const TLS12: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];

// ---- PKI ----

/// A CA that signs server and client certificates.
struct Ca {
    pem: String,
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

/// A client certificate chain (leaf only) and its key.
struct ClientCert {
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
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

    fn server(&self, host: &str) -> Certificate {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![host.to_owned()])
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        Certificate {
            source: format!("default/{host}"),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn client(&self, cn: &str) -> ClientCert {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Shop");
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        ClientCert {
            chain: vec![cert.der().clone()],
            key_der: key.serialize_der(),
        }
    }

    fn validation(&self, mode: ClientCertMode) -> Option<ClientValidation> {
        Some(ClientValidation {
            ca_pem: self.pem.clone(),
            mode,
        })
    }
}

// ---- tables ----

/// The proxy's server certificate and the CA clients trust it by; the echo backend.
struct Fixture {
    server_ca: Ca,
    server_cert: Certificate,
    app: EchoBackend,
}

impl Fixture {
    async fn new() -> Self {
        let server_ca = Ca::new("server CA");
        let server_cert = server_ca.server(HOST);
        Self {
            server_ca,
            server_cert,
            app: echo_backend("app").await,
        }
    }

    /// Version `version`: one HTTPS port (0) validating clients as told, serving `/` to the
    /// echo backend, under the X.509 policy when `x509` is set.
    fn table(&self, version: u64, validation: Option<ClientValidation>, x509: bool) -> RouteTable {
        let mut r = route("app", "/", vec![wb("app", 1)]);
        if x509 {
            r.policy = Some("mtls".into());
        }
        let port = PortConfig {
            address: "127.0.0.1".into(),
            port: 0,
            protocol: Protocol::Https,
            listeners: vec![ListenerConfig {
                passthrough: false,
                name: "https".into(),
                hostname: None,
                certificates: vec![self.server_cert.clone()],
                virtual_hosts: vec![VirtualHost {
                    hostname: "*".into(),
                    routes: vec![r].into(),
                }],
            }],
            client_validation: validation,
            client: Default::default(),
        };
        let mut t = table(version, vec![port], vec![("app", backend_of(&[&self.app]))]);
        if x509 {
            t.policies.insert(
                "mtls".into(),
                PolicySet {
                    auth: Some(x509_auth()),
                    rate_limits: vec![],
                },
            );
        }
        t
    }

    async fn proxy(&self, validation: Option<ClientValidation>, x509: bool) -> (Proxy, SocketAddr) {
        let proxy = Proxy::new(ProxyOptions::default());
        proxy.apply(self.table(1, validation, x509)).await.unwrap();
        let addr = proxy.local_addr(0).unwrap();
        (proxy, addr)
    }

    fn client(
        &self,
        versions: &[&'static SupportedProtocolVersion],
        cert: Option<&ClientCert>,
    ) -> ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.server_ca.der.clone()).unwrap();
        let b =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots);
        match cert {
            Some(c) => b
                .with_client_auth_cert(
                    c.chain.clone(),
                    PrivateKeyDer::Pkcs8(c.key_der.clone().into()),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        }
    }
}

/// Presents a certificate but signs the handshake with another key: a client that copied
/// someone's (public) certificate.
#[derive(Debug)]
struct Impostor(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Impostor {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

impl Fixture {
    /// A client presenting `cert` without holding its key.
    fn impostor(
        &self,
        versions: &[&'static SupportedProtocolVersion],
        cert: &ClientCert,
    ) -> ClientConfig {
        let other_key = KeyPair::generate().unwrap().serialize_der();
        let signer =
            rustls::crypto::ring::sign::any_supported_type(&PrivateKeyDer::Pkcs8(other_key.into()))
                .unwrap();
        let key = rustls::sign::CertifiedKey::new(cert.chain.clone(), signer);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.server_ca.der.clone()).unwrap();
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_client_cert_resolver(Arc::new(Impostor(Arc::new(key))))
    }
}

/// AuthPolicy with one X.509 method; `x-client-cn` from the certificate's CN.
fn x509_auth() -> Auth {
    Auth {
        sources: vec![ObjectKey::new("default", "mtls")],
        when: vec![],
        authentication: vec![AuthnMethod {
            name: "client-cert".into(),
            policy: Default::default(),
            credentials: Credentials::AuthorizationHeader {
                prefix: String::new(),
            },
            method: Method::X509,
            when: vec![],
        }],
        authorization: vec![],
        success_headers: vec![("x-client-cn".into(), "auth.identity.cn".into())],
        unauthenticated: DenyResponse::unauthenticated(),
        unauthorized: DenyResponse::unauthorized(),
    }
}

// ---- clients ----

/// The rustls error somewhere in `e`'s chain (io → rustls).
fn rustls_error(e: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r.clone());
        }
        if let Some(r) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(r.clone());
        }
        cur = err.source();
    }
    None
}

async fn connect(
    addr: SocketAddr,
    config: ClientConfig,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(HOST).unwrap(), tcp)
        .await
}

/// One HTTP/1.1 `GET /who` over a fresh TLS connection, with `headers`; the handshake must
/// succeed.
async fn get_over(addr: SocketAddr, config: ClientConfig, headers: &[(&str, &str)]) -> Answer {
    let tls = connect(addr, config).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get("/who").header("host", HOST);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = send
        .send_request(req.body(Full::<Bytes>::default()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn get(addr: SocketAddr, config: ClientConfig) -> StatusCode {
    get_over(addr, config, &[]).await.status
}

/// The alert with which the server refuses the client's handshake. Under TLS 1.3 the client
/// is done before the server judges its certificate, so the alert arrives on the first read;
/// the client sends nothing, so the server closes cleanly after its alert.
async fn refused(addr: SocketAddr, config: ClientConfig) -> AlertDescription {
    let err = match connect(addr, config).await {
        Err(e) => e,
        Ok(mut tls) => {
            let mut buf = Vec::new();
            // A guard against a hang if the server wrongly accepts, not a timing assertion.
            match tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buf)).await {
                Ok(Err(e)) => e,
                Ok(Ok(n)) => panic!("server closed without an alert after {n} bytes"),
                Err(_) => panic!("server accepted the handshake"),
            }
        }
    };
    match rustls_error(&err) {
        Some(rustls::Error::AlertReceived(a)) => a,
        other => panic!("expected a TLS alert, got {other:?} ({err})"),
    }
}

// ---- AllowValidOnly ----

#[tokio::test]
async fn allow_valid_only_serves_only_a_certificate_the_cas_verify() {
    let f = Fixture::new().await;
    let (ca, other) = (Ca::new("client CA"), Ca::new("other CA"));
    let (alice, mallory) = (ca.client("alice"), other.client("mallory"));
    let (_p, addr) = f
        .proxy(ca.validation(ClientCertMode::AllowValidOnly), false)
        .await;

    for versions in [TLS13, TLS12] {
        assert_eq!(
            get(addr, f.client(versions, Some(&alice))).await,
            StatusCode::OK
        );
    }
    assert_eq!(
        refused(addr, f.client(TLS13, None)).await,
        AlertDescription::CertificateRequired
    );
    for versions in [TLS13, TLS12] {
        assert_eq!(
            refused(addr, f.client(versions, Some(&mallory))).await,
            AlertDescription::UnknownCA
        );
    }
    assert_eq!(f.app.hits(), 2, "only the verified clients were served");
}

#[tokio::test]
async fn a_new_client_ca_applies_to_new_connections() {
    let f = Fixture::new().await;
    let (a, b) = (Ca::new("CA a"), Ca::new("CA b"));
    let (from_a, from_b) = (a.client("alice"), b.client("bob"));
    let (p, addr) = f
        .proxy(a.validation(ClientCertMode::AllowValidOnly), false)
        .await;
    assert_eq!(
        get(addr, f.client(TLS13, Some(&from_a))).await,
        StatusCode::OK
    );

    p.apply(f.table(2, b.validation(ClientCertMode::AllowValidOnly), false))
        .await
        .unwrap();
    assert_eq!(
        refused(addr, f.client(TLS13, Some(&from_a))).await,
        AlertDescription::UnknownCA
    );
    assert_eq!(
        get(addr, f.client(TLS13, Some(&from_b))).await,
        StatusCode::OK
    );

    // Validation off: no certificate asked for, none needed.
    p.apply(f.table(3, None, false)).await.unwrap();
    assert_eq!(get(addr, f.client(TLS13, None)).await, StatusCode::OK);
}

#[tokio::test]
async fn a_client_ca_bundle_that_does_not_parse_rejects_the_table_and_keeps_the_old_one() {
    let f = Fixture::new().await;
    let ca = Ca::new("client CA");
    let (p, addr) = f
        .proxy(ca.validation(ClientCertMode::AllowValidOnly), false)
        .await;
    let bad = |pem: &str| {
        Some(ClientValidation {
            ca_pem: pem.into(),
            mode: ClientCertMode::AllowInsecureFallback,
        })
    };
    for pem in [
        "not a PEM bundle",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    ] {
        let err = p.apply(f.table(2, bad(pem), false)).await.unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("port 0: TLS: "), "{msg}");
        assert!(msg.contains("client CA"), "{msg}");
    }
    assert_eq!(p.version(), 1);
    assert_eq!(
        refused(addr, f.client(TLS13, None)).await,
        AlertDescription::CertificateRequired,
        "the old table, AllowValidOnly, still serves"
    );
}

// ---- AllowInsecureFallback ----

#[tokio::test]
async fn allow_insecure_fallback_serves_clients_without_a_valid_certificate() {
    let f = Fixture::new().await;
    let (ca, other) = (Ca::new("client CA"), Ca::new("other CA"));
    let (alice, mallory) = (ca.client("alice"), other.client("mallory"));
    let (_p, addr) = f
        .proxy(ca.validation(ClientCertMode::AllowInsecureFallback), false)
        .await;
    for versions in [TLS13, TLS12] {
        assert_eq!(
            get(addr, f.client(versions, None)).await,
            StatusCode::OK,
            "no certificate"
        );
        assert_eq!(
            get(addr, f.client(versions, Some(&alice))).await,
            StatusCode::OK,
            "valid certificate"
        );
        assert_eq!(
            get(addr, f.client(versions, Some(&mallory))).await,
            StatusCode::OK,
            "invalid certificate (another CA)"
        );
    }
    assert_eq!(f.app.hits(), 6);
}

// ---- X.509 authentication ----

#[tokio::test]
async fn x509_policy_admits_a_verified_certificate_and_its_cn_reaches_the_upstream() {
    let f = Fixture::new().await;
    let ca = Ca::new("client CA");
    let alice = ca.client("alice");
    for mode in [
        ClientCertMode::AllowValidOnly,
        ClientCertMode::AllowInsecureFallback,
    ] {
        let (_p, addr) = f.proxy(ca.validation(mode), true).await;
        for versions in [TLS13, TLS12] {
            let ok = get_over(
                addr,
                f.client(versions, Some(&alice)),
                &[("x-client-cn", "root")],
            )
            .await;
            assert_eq!(ok.status, StatusCode::OK, "{mode:?}");
            assert_eq!(
                ok.upstream_header("x-client-cn").as_deref(),
                Some("alice"),
                "{mode:?}: the certificate's CN replaces the client's header"
            );
        }
    }
    assert_eq!(f.app.hits(), 4);
}

#[tokio::test]
async fn x509_policy_refuses_a_missing_or_unverified_certificate_under_fallback() {
    let f = Fixture::new().await;
    let (ca, other) = (Ca::new("client CA"), Ca::new("other CA"));
    let mallory = other.client("mallory");
    let (_p, addr) = f
        .proxy(ca.validation(ClientCertMode::AllowInsecureFallback), true)
        .await;

    let none = get_over(addr, f.client(TLS13, None), &[("x-client-cn", "alice")]).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(&none.body[..], b"Unauthorized\n");
    assert!(
        !none.headers.contains_key("www-authenticate"),
        "X.509 has no HTTP challenge: {:?}",
        none.headers
    );
    // Served by the handshake, but never an identity.
    assert_eq!(
        get(addr, f.client(TLS13, Some(&mallory))).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(f.app.hits(), 0);
}

#[tokio::test]
async fn a_certificate_presented_without_its_key_fails_the_handshake_in_either_mode() {
    let f = Fixture::new().await;
    let ca = Ca::new("client CA");
    let alice = ca.client("alice");
    for mode in [
        ClientCertMode::AllowValidOnly,
        ClientCertMode::AllowInsecureFallback,
    ] {
        let (_p, addr) = f.proxy(ca.validation(mode), true).await;
        for versions in [TLS13, TLS12] {
            assert_eq!(
                refused(addr, f.impostor(versions, &alice)).await,
                AlertDescription::DecryptError,
                "{mode:?}"
            );
        }
    }
    assert_eq!(f.app.hits(), 0);
}

#[tokio::test]
async fn x509_policy_on_a_port_without_client_validation_always_refuses() {
    let f = Fixture::new().await;
    let ca = Ca::new("client CA");
    let alice = ca.client("alice");
    let (_p, addr) = f.proxy(None, true).await;
    // No certificate is asked for, so the client's is never sent, let alone verified.
    assert_eq!(
        get(addr, f.client(TLS13, Some(&alice))).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(addr, f.client(TLS13, None)).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(f.app.hits(), 0);
}

#[tokio::test]
async fn x509_identity_holds_for_every_request_of_an_http2_connection() {
    let f = Fixture::new().await;
    let ca = Ca::new("client CA");
    let alice = ca.client("alice");
    let (_p, addr) = f
        .proxy(ca.validation(ClientCertMode::AllowInsecureFallback), true)
        .await;
    let mut config = f.client(TLS13, Some(&alice));
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tls = connect(addr, config).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    for _ in 0..2 {
        let req = Request::get(format!("https://{HOST}/who"))
            .body(Full::<Bytes>::default())
            .unwrap();
        let resp = send.clone().send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["headers"]["x-client-cn"], "alice");
    }
    assert_eq!(f.app.hits(), 2);
}
