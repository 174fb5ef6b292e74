//! Socket tests of TLS ports (TLSRoutes): passthrough (the client's TLS reaches the backend
//! untouched, SNI included), termination (the backend gets plaintext), both modes on one port
//! chosen by SNI, and connections nothing serves (unknown SNI, not TLS, no endpoints) closed
//! without a byte and counted by outcome.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::metrics;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tollgate_api::{
    Backend, BackendProtocol, Certificate, Endpoint, ListenerConfig, LoadBalancer, ObjectKey,
    PathMatch, PortConfig, Protocol, Route, RouteMatch, RouteTable, Timeouts, VirtualHost,
    WeightedBackend,
};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

#[derive(Clone)]
struct Cert {
    der: Vec<u8>,
    cert_pem: String,
    key_der: Vec<u8>,
    key_pem: String,
}

fn cert(name: &str) -> Cert {
    let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    Cert {
        der: ck.cert.der().to_vec(),
        cert_pem: ck.cert.pem(),
        key_der: ck.signing_key.serialize_der(),
        key_pem: ck.signing_key.serialize_pem(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS backend: answers each line with `tls <sni> <line>`.
async fn tls_backend(cert: &Cert) -> SocketAddr {
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_der.clone())),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("-").to_owned();
                echo_lines(tls, format!("tls {sni}")).await;
            });
        }
    });
    addr
}

/// A plain TCP backend: answers each line with `plain <line>`.
async fn plain_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(echo_lines(tcp, "plain".to_owned()));
        }
    });
    addr
}

async fn echo_lines<S>(stream: S, prefix: String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (r, mut w) = tokio::io::split(stream);
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if w.write_all(format!("{prefix} {line}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

fn route(name: &str, backend: &str) -> Route {
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
        backends: vec![WeightedBackend {
            backend: Some(backend.to_owned()),
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
    }
}

fn tcp_backend(addrs: &[SocketAddr]) -> Backend {
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

struct Fixture {
    proxy: Proxy,
    /// The table it serves.
    table: RouteTable,
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    /// The certificate of the passthrough backend (abc.example.com).
    backend_cert: Cert,
    /// The certificate the terminating listener serves (tls.example.com).
    gateway_cert: Cert,
}

/// One TLS port, shaped after TLSRouteMixedTerminationSameNamespace: `terminate`
/// (tls.example.com, the gateway's certificate, plaintext backend) and `passthrough`
/// (*.example.com; abc.example.com to the TLS backend, empty.example.com to a backend without
/// endpoints).
async fn fixture() -> Fixture {
    fixture_with(ProxyOptions::default().stream_idle_timeout).await
}

async fn fixture_with(stream_idle_timeout: Duration) -> Fixture {
    let backend_cert = cert("abc.example.com");
    let gateway_cert = cert("tls.example.com");
    let tls_addr = tls_backend(&backend_cert).await;
    let plain_addr = plain_backend().await;
    let port = PortConfig {
        address: "127.0.0.1".into(),
        port: 0,
        protocol: Protocol::Tls,
        listeners: vec![
            ListenerConfig {
                name: "terminate".into(),
                hostname: Some("tls.example.com".into()),
                certificates: vec![Certificate {
                    source: "apps/gateway-cert".into(),
                    cert_pem: gateway_cert.cert_pem.clone(),
                    key_pem: gateway_cert.key_pem.clone(),
                }],
                passthrough: false,
                virtual_hosts: vec![VirtualHost {
                    hostname: "tls.example.com".into(),
                    routes: vec![route("terminated", "plain")].into(),
                }],
            },
            ListenerConfig {
                name: "passthrough".into(),
                hostname: Some("*.example.com".into()),
                certificates: vec![],
                passthrough: true,
                virtual_hosts: vec![
                    VirtualHost {
                        hostname: "abc.example.com".into(),
                        routes: vec![route("passed", "tls")].into(),
                    },
                    VirtualHost {
                        hostname: "empty.example.com".into(),
                        routes: vec![route("empty", "none")].into(),
                    },
                ],
            },
        ],
        client_validation: None,
        client: Default::default(),
    };
    let table = RouteTable {
        version: 1,
        gateway: ObjectKey::new("apps", "gw"),
        policies: Default::default(),
        closed: Default::default(),
        ports: vec![port],
        backends: [
            ("plain".to_owned(), tcp_backend(&[plain_addr])),
            ("tls".to_owned(), tcp_backend(&[tls_addr])),
            ("none".to_owned(), tcp_backend(&[])),
        ]
        .into_iter()
        .collect(),
    };
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        stream_idle_timeout,
        ..ProxyOptions::default()
    });
    proxy.apply(table.clone()).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    Fixture {
        proxy,
        table,
        addr,
        metrics,
        backend_cert,
        gateway_cert,
    }
}

/// A client that trusts only `trusted`.
fn client(trusted: &Cert) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(trusted.der.clone()))
        .unwrap();
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// Connects over TLS with `sni`, trusting `trusted`, sends `line` and reads the answer line.
async fn ask(addr: SocketAddr, sni: &str, trusted: &Cert, line: &str) -> std::io::Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = client(trusted)
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await?;
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    assert_eq!(
        presented, trusted.der,
        "the certificate the client verified"
    );
    tls.write_all(format!("{line}\n").as_bytes()).await?;
    let mut answer = String::new();
    BufReader::new(tls).read_line(&mut answer).await?;
    Ok(answer)
}

fn count(metrics: &Metrics, outcome: &str) -> u64 {
    let text = metrics.encode();
    let prefix = format!("tollgate_tls_connections_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Reads until the proxy closes the connection; returns what arrived.
async fn read_to_close(mut s: TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    // A reset counts as closed too.
    let _ = s.read_to_end(&mut got).await;
    got
}

#[tokio::test]
async fn passthrough_hands_the_clients_tls_to_the_backend() {
    let f = fixture().await;
    // The client verified the backend's certificate (not the gateway's) and the backend saw
    // the client's SNI: the TLS session ends at the backend.
    let answer = ask(f.addr, "abc.example.com", &f.backend_cert, "hello")
        .await
        .unwrap();
    assert_eq!(answer, "tls abc.example.com hello\n");
}

#[tokio::test]
async fn terminate_serves_the_gateway_certificate_and_sends_plaintext() {
    let f = fixture().await;
    let answer = ask(f.addr, "tls.example.com", &f.gateway_cert, "hello")
        .await
        .unwrap();
    assert_eq!(answer, "plain hello\n");
}

#[tokio::test]
async fn both_modes_share_the_port_concurrently() {
    let f = fixture().await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let addr = f.addr;
        let (sni, cert, want) = if i % 2 == 0 {
            (
                "abc.example.com",
                &f.backend_cert,
                format!("tls abc.example.com n{i}\n"),
            )
        } else {
            ("tls.example.com", &f.gateway_cert, format!("plain n{i}\n"))
        };
        let cert = cert.clone();
        tasks.push(tokio::spawn(async move {
            assert_eq!(ask(addr, sni, &cert, &format!("n{i}")).await.unwrap(), want);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn a_closed_connection_is_counted_as_served() {
    let f = fixture().await;
    let answer = ask(f.addr, "tls.example.com", &f.gateway_cert, "x")
        .await
        .unwrap();
    assert_eq!(answer, "plain x\n");
    // `ask` dropped its stream: the proxy sees the close and counts the connection.
    assert!(common::eventually(|| count(&f.metrics, "served") == 1).await);
}

#[tokio::test]
async fn an_sni_no_route_takes_is_closed_without_an_answer() {
    let f = fixture().await;
    for sni in ["other.test", "example.com"] {
        let err = ask(f.addr, sni, &f.backend_cert, "hello").await;
        assert!(err.is_err(), "{sni}: {err:?}");
    }
    assert!(common::eventually(|| count(&f.metrics, "no_route") == 2).await);
}

#[tokio::test]
async fn bytes_that_are_not_tls_are_closed_without_an_answer() {
    let f = fixture().await;
    let mut s = TcpStream::connect(f.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: abc.example.com\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_to_close(s).await, b"");
    assert!(common::eventually(|| count(&f.metrics, "bad_hello") == 1).await);
}

#[tokio::test]
async fn a_client_hello_over_the_size_limit_is_closed() {
    let f = fixture().await;
    // A handshake record announcing a ClientHello of 16 MiB: the proxy buffers at most
    // 16 KiB + 5 of it, then closes instead of reading on.
    let mut s = TcpStream::connect(f.addr).await.unwrap();
    let mut record = vec![22, 3, 1, 0x40, 0x00, 1, 0xff, 0xff, 0xff];
    record.resize(5 + 0x4000, 0);
    let mut sent = 0;
    for _ in 0..4 {
        // The proxy may close while this is still writing: stop at the first error.
        if s.write_all(&record).await.is_err() {
            break;
        }
        sent += record.len();
    }
    assert!(sent > 0);
    assert_eq!(read_to_close(s).await, b"");
    assert!(common::eventually(|| count(&f.metrics, "bad_hello") == 1).await);
}

#[tokio::test]
async fn a_backend_without_endpoints_closes_the_connection() {
    let f = fixture().await;
    let err = ask(f.addr, "empty.example.com", &f.backend_cert, "hello").await;
    assert!(err.is_err(), "{err:?}");
    assert!(common::eventually(|| count(&f.metrics, "no_backend") == 1).await);
}

#[tokio::test]
async fn a_client_hello_split_over_many_writes_is_reassembled() {
    let f = fixture().await;
    // Record the ClientHello a real client sends, then replay it to the proxy a few bytes at
    // a time: the proxy must wait for all of it, route on it and replay it unchanged.
    let (hello, mut from_client, client_side) =
        captured_hello(&f.backend_cert, "abc.example.com").await;
    let mut to_proxy = TcpStream::connect(f.addr).await.unwrap();
    to_proxy.set_nodelay(true).unwrap();
    for chunk in hello.chunks(7) {
        to_proxy.write_all(chunk).await.unwrap();
        to_proxy.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    // Splice the two sockets so the real client finishes its handshake with the backend.
    let splice = tokio::spawn(async move {
        let _ = tokio::io::copy_bidirectional(&mut from_client, &mut to_proxy).await;
    });
    let mut tls = client_side.await.unwrap().unwrap();
    tls.write_all(b"split\n").await.unwrap();
    let mut answer = String::new();
    BufReader::new(&mut tls)
        .read_line(&mut answer)
        .await
        .unwrap();
    assert_eq!(answer, "tls abc.example.com split\n");
    drop(tls);
    let _ = splice.await;
}

/// The ClientHello a real client (trusting `ca`) sends for `name`, read from a socket of the
/// test's own; also that socket and the client's handshake, to finish it elsewhere.
async fn captured_hello(
    ca: &Cert,
    name: &str,
) -> (
    Vec<u8>,
    TcpStream,
    tokio::task::JoinHandle<std::io::Result<tokio_rustls::client::TlsStream<TcpStream>>>,
) {
    let capture = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let capture_addr = capture.local_addr().unwrap();
    let connector = client(ca);
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let client_side = tokio::spawn(async move {
        let tcp = TcpStream::connect(capture_addr).await.unwrap();
        connector.connect(name, tcp).await
    });
    let (mut from_client, _) = capture.accept().await.unwrap();
    let mut hello = vec![0u8; 16 * 1024];
    let n = from_client.read(&mut hello).await.unwrap();
    hello.truncate(n);
    (hello, from_client, client_side)
}

/// A ClientHello that routes (its SNI names the terminating listener) but that rustls refuses
/// (it offers no cipher suite the proxy has) is answered with rustls's alert, then closed.
#[tokio::test]
async fn a_client_hello_rustls_refuses_is_answered_with_an_alert() {
    let f = fixture().await;
    let (mut hello, _from_client, _client_side) =
        captured_hello(&f.gateway_cert, "tls.example.com").await;
    // Record header (5), handshake header (4), version (2), random (32), session id.
    let sid = 43;
    let suites = sid + 1 + usize::from(hello[sid]);
    let len = usize::from(u16::from_be_bytes([hello[suites], hello[suites + 1]]));
    for pair in hello[suites + 2..suites + 2 + len].chunks_mut(2) {
        // TLS_RSA_WITH_RC4_128_SHA: no TLS stack of today offers it.
        pair.copy_from_slice(&[0x00, 0x05]);
    }
    let mut s = TcpStream::connect(f.addr).await.unwrap();
    s.write_all(&hello).await.unwrap();
    let answer = read_to_close(s).await;
    assert_eq!(answer.first(), Some(&21), "an alert record: {answer:?}");
    assert!(common::eventually(|| count(&f.metrics, "handshake_failed") == 1).await);
}

/// Connects to the terminating listener and returns the open stream after one exchange.
async fn open_terminated(f: &Fixture) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(f.addr).await.unwrap();
    let mut tls = client(&f.gateway_cert)
        .connect(ServerName::try_from("tls.example.com").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"first\n").await.unwrap();
    let mut line = vec![0u8; 64];
    let n = tls.read(&mut line).await.unwrap();
    assert_eq!(&line[..n], b"plain first\n");
    tls
}

#[tokio::test]
async fn an_idle_stream_is_closed_after_the_idle_timeout() {
    let f = fixture_with(Duration::from_millis(300)).await;
    let mut tls = open_terminated(&f).await;
    // Nothing more is sent: the proxy closes the stream (EOF or reset), counted as idle.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut rest))
        .await
        .expect("the idle stream was never closed");
    assert!(rest.is_empty(), "{rest:?}");
    assert!(common::eventually(|| count(&f.metrics, "idle") == 1).await);
}

#[tokio::test]
async fn a_stream_with_traffic_outlives_the_idle_timeout() {
    let idle = Duration::from_millis(800);
    let f = fixture_with(idle).await;
    let mut tls = open_terminated(&f).await;
    // Traffic every 50 ms for twice the idle timeout: every line is answered.
    let start = std::time::Instant::now();
    let mut i = 0;
    while start.elapsed() < idle * 2 {
        tls.write_all(format!("n{i}\n").as_bytes()).await.unwrap();
        let mut line = vec![0u8; 64];
        let n = tls.read(&mut line).await.unwrap();
        assert_eq!(&line[..n], format!("plain n{i}\n").as_bytes());
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&f.metrics, "idle"), 0);
}

#[tokio::test]
async fn the_table_live_after_the_client_hello_decides_the_mode() {
    // Connected while the port only passes through; the ClientHello arrives after a table
    // that adds the terminating listener: it is terminated by the new table, not refused by
    // the port as it was at accept time.
    let f = fixture().await;
    let mut only_passthrough = f.table.clone();
    only_passthrough.version = 2;
    only_passthrough.ports[0]
        .listeners
        .retain(|l| l.name == "passthrough");
    f.proxy.apply(only_passthrough).await.unwrap();
    let tcp = TcpStream::connect(f.addr).await.unwrap();
    // Accepted on the passthrough-only port; now the terminating listener comes back.
    assert!(
        common::eventually(|| f.metrics.encode().contains("tollgate_active_connections 1")).await
    );
    let mut both = f.table.clone();
    both.version = 3;
    f.proxy.apply(both).await.unwrap();
    let mut tls = client(&f.gateway_cert)
        .connect(ServerName::try_from("tls.example.com").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"late\n").await.unwrap();
    let mut answer = String::new();
    BufReader::new(tls).read_line(&mut answer).await.unwrap();
    assert_eq!(answer, "plain late\n");
}
