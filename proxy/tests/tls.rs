//! Socket tests of HTTPS listeners: SNI certificate choice across listeners on one port,
//! HTTP/2 and HTTP/1.1 over ALPN, the TLS versions offered, and request framing over TLS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ProtocolVersion, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tollgate_api::{Certificate, ListenerConfig, PortConfig, Protocol, VirtualHost};
use tollgate_proxy::{Proxy, ProxyOptions};

/// Accepts any certificate: the tests compare the presented certificate themselves.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

struct Pem {
    cert: Certificate,
    der: Vec<u8>,
}

fn make_cert(name: &str) -> Pem {
    let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    Pem {
        cert: Certificate {
            source: format!("default/{name}"),
            cert_pem: ck.cert.pem(),
            key_pem: ck.signing_key.serialize_pem(),
        },
        der: ck.cert.der().to_vec(),
    }
}

fn listener(name: &str, hostname: Option<&str>, cert: &Pem) -> ListenerConfig {
    ListenerConfig {
        passthrough: false,
        name: name.into(),
        hostname: hostname.map(str::to_owned),
        certificates: vec![cert.cert.clone()],
        virtual_hosts: vec![VirtualHost {
            hostname: "*".into(),
            routes: vec![route(name, "/", vec![wb("b", 1)])].into(),
        }],
    }
}

fn client_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    c
}

async fn connect(
    addr: std::net::SocketAddr,
    sni: &str,
    config: ClientConfig,
) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .unwrap()
}

fn peer_cert(s: &TlsStream<TcpStream>) -> Vec<u8> {
    s.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

struct Fixture {
    _proxy: Proxy,
    addr: std::net::SocketAddr,
    a: Pem,
    b: Pem,
    default: Pem,
    backend: EchoBackend,
}

async fn fixture() -> Fixture {
    let backend = echo_backend("b").await;
    let (a, b, default) = (
        make_cert("a.example"),
        make_cert("*.b.example"),
        make_cert("default"),
    );
    let port = PortConfig {
        address: "127.0.0.1".into(),
        port: 0,
        protocol: Protocol::Https,
        listeners: vec![
            listener("a", Some("a.example"), &a),
            listener("b", Some("*.b.example"), &b),
            listener("any", None, &default),
        ],
        client_validation: None,
        client: Default::default(),
    };
    let proxy = Proxy::new(ProxyOptions::default());
    proxy
        .apply(table(1, vec![port], vec![("b", backend_of(&[&backend]))]))
        .await
        .unwrap();
    let addr = proxy.local_addr(0).unwrap();
    Fixture {
        _proxy: proxy,
        addr,
        a,
        b,
        default,
        backend,
    }
}

#[tokio::test]
async fn sni_picks_exact_then_wildcard_then_default_certificate() {
    let f = fixture().await;
    let tls13 = || client_config(&[&rustls::version::TLS13], &[b"http/1.1"]);
    assert_eq!(
        peer_cert(&connect(f.addr, "a.example", tls13()).await),
        f.a.der
    );
    assert_eq!(
        peer_cert(&connect(f.addr, "x.y.b.example", tls13()).await),
        f.b.der
    );
    assert_eq!(
        peer_cert(&connect(f.addr, "other.example", tls13()).await),
        f.default.der
    );
    assert_eq!(f.backend.hits(), 0);
}

#[tokio::test]
async fn serves_http2_over_alpn_with_forwarded_proto_https() {
    let f = fixture().await;
    let tls = connect(
        f.addr,
        "a.example",
        client_config(&[&rustls::version::TLS13], &[b"h2", b"http/1.1"]),
    )
    .await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("https://a.example/secure")
        .body(Full::<Bytes>::default())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["path"], "/secure");
    assert_eq!(v["headers"]["x-forwarded-proto"], "https");
    assert_eq!(v["headers"]["x-forwarded-host"], "a.example");
}

#[tokio::test]
async fn serves_http1_over_tls12_and_offers_only_tls12_and_13() {
    let f = fixture().await;
    let tls = connect(
        f.addr,
        "a.example",
        client_config(&[&rustls::version::TLS12], &[b"http/1.1"]),
    )
    .await;
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(ProtocolVersion::TLSv1_2)
    );
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/one")
        .header("host", "a.example")
        .body(Full::<Bytes>::default())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    let tls = connect(
        f.addr,
        "a.example",
        client_config(&[&rustls::version::TLS13], &[]),
    )
    .await;
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(ProtocolVersion::TLSv1_3)
    );
}

/// A hand-made TLS 1.1 ClientHello (no supported_versions extension, one CBC suite).
fn tls11_client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x02]; // client_version TLS 1.1
    body.extend([7u8; 32]); // random
    body.push(0); // session id
    body.extend([0x00, 0x02, 0x00, 0x2f]); // TLS_RSA_WITH_AES_128_CBC_SHA
    body.extend([0x01, 0x00]); // null compression
    let mut hs = vec![0x01, 0, 0, u8::try_from(body.len()).unwrap()];
    hs.extend(body);
    let mut rec = vec![0x16, 0x03, 0x01, 0, u8::try_from(hs.len()).unwrap()];
    rec.extend(hs);
    rec
}

#[tokio::test]
async fn refuses_a_tls11_client_hello() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = fixture().await;
    let mut s = TcpStream::connect(f.addr).await.unwrap();
    s.write_all(&tls11_client_hello()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), s.read_to_end(&mut out)).await;
    // A fatal alert record (0x15, level 2), never a ServerHello (0x16): handshake_failure (40)
    // or protocol_version (70), depending on which check rustls makes first.
    assert_eq!(out.first(), Some(&0x15), "{out:?}");
    assert_eq!(out.get(5), Some(&2), "{out:?}");
    assert!(matches!(out.get(6), Some(40 | 70)), "{out:?}");
}

#[tokio::test]
async fn bad_certificate_rejects_the_table_and_keeps_the_old_one() {
    let f = fixture().await;
    let mut broken = make_cert("x");
    broken.cert.key_pem = "not a key".into();
    let port = PortConfig {
        address: "127.0.0.1".into(),
        port: 0,
        protocol: Protocol::Https,
        listeners: vec![listener("x", None, &broken)],
        client_validation: None,
        client: Default::default(),
    };
    let err = f
        ._proxy
        .apply(table(2, vec![port], vec![]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
    assert_eq!(f._proxy.version(), 1);
    assert_eq!(
        peer_cert(
            &connect(
                f.addr,
                "a.example",
                client_config(&[&rustls::version::TLS13], &[])
            )
            .await
        ),
        f.a.der
    );
}

/// The status of `GET /` with `Host: host` on a new TLS connection made for `sni`.
async fn status_on(f: &Fixture, sni: &str, host: &str) -> StatusCode {
    let tls = connect(
        f.addr,
        sni,
        client_config(&[&rustls::version::TLS13], &[b"http/1.1"]),
    )
    .await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/")
        .header("host", host)
        .body(Full::<Bytes>::default())
        .unwrap();
    send.send_request(req).await.unwrap().status()
}

#[tokio::test]
async fn a_request_for_another_listener_than_the_sni_is_misdirected() {
    // GatewayHTTPSListenerDetectMisdirectedRequests: the SNI and the Host must pick the same
    // listener of the port (exact, then wildcard, then the one without hostname).
    let f = fixture().await;
    for (sni, host, want) in [
        ("a.example", "a.example", StatusCode::OK),
        ("a.example", "A.Example:443", StatusCode::OK),
        ("a.example", "x.b.example", StatusCode::MISDIRECTED_REQUEST),
        (
            "a.example",
            "other.example",
            StatusCode::MISDIRECTED_REQUEST,
        ),
        ("x.b.example", "y.b.example", StatusCode::OK),
        ("x.b.example", "a.example", StatusCode::MISDIRECTED_REQUEST),
        ("other.example", "elsewhere.example", StatusCode::OK),
        (
            "other.example",
            "a.example",
            StatusCode::MISDIRECTED_REQUEST,
        ),
    ] {
        assert_eq!(
            status_on(&f, sni, host).await,
            want,
            "SNI {sni}, Host {host}"
        );
    }
    assert_eq!(f.backend.hits(), 4);
}

/// Over TLS our HTTP/1 server reads every head (module `h1serve`), with the same framing
/// checks as on plain ports: a length with a leading zero, `chunked` twice, a length beside
/// chunks and a bare LF are 400, and nothing of them reaches the backend.
#[tokio::test]
async fn ambiguous_framing_over_https_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = fixture().await;
    for (request, want) in [
        (
            &b"POST /x HTTP/1.1\r\nHost: a.example\r\nContent-Length: 03\r\nConnection: close\r\n\r\nabc"[..],
            "HTTP/1.1 400 ",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked, chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "HTTP/1.1 400 ",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "HTTP/1.1 400 ",
        ),
        (
            b"GET /x HTTP/1.1\nHost: a.example\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 400 ",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            "HTTP/1.1 200 ",
        ),
    ] {
        let mut tls = connect(
            f.addr,
            "a.example",
            client_config(&[&rustls::version::TLS13], &[b"http/1.1"]),
        )
        .await;
        // After a clean request: the refused head is not the connection's first.
        let first = b"GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n";
        tls.write_all(&[&first[..], request].concat()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), tls.read_to_end(&mut out))
            .await;
        let out = String::from_utf8_lossy(&out);
        let sent = String::from_utf8_lossy(request);
        let last = out.rfind("HTTP/1.1 ").map_or("", |i| &out[i..]);
        assert!(out.starts_with("HTTP/1.1 200 "), "{sent:?}: {out:?}");
        assert!(last.starts_with(want), "{sent:?}: {out:?}");
    }
    assert_eq!(f.backend.hits(), 6, "only the clean requests went upstream");
}

/// HTTP/1.1 over TLS is our own server's too: bodies by length and in chunks reach the
/// backend on one connection, and a refused head is answered 400 even as the connection's
/// first (hyper's server, which read TLS connections before, closed those without a word).
#[tokio::test]
async fn bodies_over_https_stream_and_a_refused_first_head_gets_400() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = fixture().await;
    let mut tls = connect(
        f.addr,
        "a.example",
        client_config(&[&rustls::version::TLS13], &[b"http/1.1"]),
    )
    .await;
    tls.write_all(
        b"POST /x HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n\r\nhello\
          POST /y HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), tls.read_to_end(&mut out))
        .await
        .expect("closed after the second answer");
    let out = String::from_utf8_lossy(&out);
    assert_eq!(out.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{out}");
    assert!(out.contains(r#""body":"hello""#), "{out}");
    assert!(out.contains(r#""body":"abcde""#), "{out}");
    assert!(out.contains(r#""x-forwarded-proto":"https""#), "{out}");
    assert_eq!(f.backend.hits(), 2);

    let mut tls = connect(
        f.addr,
        "a.example",
        client_config(&[&rustls::version::TLS13], &[]),
    )
    .await;
    tls.write_all(b"POST /x HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ =
        tokio::time::timeout(std::time::Duration::from_secs(2), tls.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 400 "), "{out:?}");
    assert_eq!(f.backend.hits(), 2, "nothing of it went upstream");
}
