//! The push protocol end to end, in process: a [`PushServer`] with generated PKI on
//! 127.0.0.1, real proxies subscribed over mTLS HTTP/2, echo backends behind them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod push_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use push_support::*;
use tollgate::push::pki::{Ca, proxy_identity};
use tollgate_api::PathMatch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_serves_acks_and_nacks_published_tables() {
    let ca = Ca::generate().unwrap();
    let server = server(&ca, 0).await;
    let (one, two) = (echo("one").await, echo("two").await);
    let state = temp_dir("state");
    let (proxy, sub) = subscriber(&ca, server.local_addr(), &state).await;
    assert!(
        !sub.status().ready(),
        "nothing to serve before the first table"
    );

    let v1 = server.publish(&gw(), table(&[one]));
    let s = wait_sync(&server, |s| s.in_sync == 1).await;
    assert_eq!((s.version, s.connected, s.in_sync), (v1, 1, 1));
    assert_eq!(proxy.version(), v1);
    assert_eq!(get(&proxy).await, "one");
    assert!(sub.status().ready());
    assert_eq!(
        server.publish(&gw(), table(&[one])),
        v1,
        "an identical table is not a version"
    );

    let v2 = server.publish(&gw(), table(&[two]));
    assert!(v2 > v1);
    let s = wait_sync(&server, |s| s.version == v2 && s.in_sync == 1).await;
    assert!(s.nacks.is_empty());
    assert_eq!(get(&proxy).await, "two");

    // A regex the router refuses: NACKed, v2 keeps serving.
    let v3 = server.publish(
        &gw(),
        table_with_path(&[one], PathMatch::RegularExpression("/(unclosed".into())),
    );
    let s = wait_sync(&server, |s| s.version == v3 && !s.nacks.is_empty()).await;
    assert_eq!((s.connected, s.in_sync), (1, 0));
    assert_eq!(s.nacks[0].0, "proxy-1");
    assert!(
        s.nacks[0].1.contains("unclosed") || !s.nacks[0].1.is_empty(),
        "{s:?}"
    );
    assert_eq!(proxy.version(), v2);
    assert_eq!(get(&proxy).await, "two");
    assert_eq!(sub.status().nacks(), 1);

    // The last applied table is on disk.
    let saved: tollgate_api::RouteTable =
        serde_json::from_slice(&std::fs::read(state.join("table.json")).unwrap()).unwrap();
    assert_eq!(saved.version, v2);

    // Disconnect drops the proxy from sync.
    drop(sub);
    proxy.shutdown().await;
    let s = wait_sync(&server, |s| s.connected == 0).await;
    assert_eq!(s.in_sync, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_share_a_version_and_remove_ends_streams() {
    let ca = Ca::generate().unwrap();
    let server = server(&ca, 0).await;
    let one = echo("one").await;
    let v1 = server.publish(&gw(), table(&[one]));
    let (p1, _s1) = subscriber(&ca, server.local_addr(), &temp_dir("a")).await;
    let tls = ca.issue_client(&proxy_identity("default", "gw")).unwrap();
    let proxy2 = tollgate_proxy::Proxy::new(Default::default());
    let mut cfg = tollgate_proxy::subscribe::SubscribeConfig::new(
        format!("https://{}", server.local_addr()),
        gw(),
        "proxy-2",
        tls_dir(&tls),
        temp_dir("b"),
    );
    cfg.backoff_max = Duration::from_millis(300);
    let _s2 = tollgate_proxy::subscribe::spawn(proxy2.clone(), cfg).await;
    let s = wait_sync(&server, |s| s.in_sync == 2).await;
    assert_eq!((s.version, s.connected), (v1, 2));
    assert_eq!(get(&p1).await, "one");
    assert_eq!(get(&proxy2).await, "one");
    server.remove(&gw());
    assert_eq!(server.sync(&gw()).version, 0);
}

/// Opens a stream with `config` and returns the response status, or the error.
async fn try_stream(
    config: rustls::ClientConfig,
    addr: std::net::SocketAddr,
) -> Result<u16, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| format!("h2: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::post(format!(
        "https://{addr}/v1/tables?gateway=default%2Fgw&proxy=x"
    ))
    .body(Empty::<bytes::Bytes>::new())
    .unwrap();
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    drop(resp.into_body().collect());
    Ok(status)
}

fn client_config(ca_pem: &str, cert: Option<(&str, &str)>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut c = match cert {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                rustls_pemfile::certs(&mut cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                rustls_pemfile::private_key(&mut key.as_bytes())
                    .unwrap()
                    .unwrap(),
            )
            .unwrap(),
    };
    c.alpn_protocols = vec![b"h2".to_vec()];
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_certificate_of_our_ca_are_refused() {
    let ca = Ca::generate().unwrap();
    let server = server(&ca, 0).await;
    server.publish(&gw(), table(&[echo("one").await]));
    let addr = server.local_addr();

    let good = ca.issue_client(&proxy_identity("default", "gw")).unwrap();
    assert_eq!(
        try_stream(
            client_config(&good.ca_pem, Some((&good.cert_pem, &good.key_pem))),
            addr
        )
        .await,
        Ok(200)
    );
    let none = try_stream(client_config(ca.cert_pem(), None), addr).await;
    assert!(none.is_err(), "no client certificate: {none:?}");
    let other_ca = Ca::generate().unwrap();
    let foreign = other_ca
        .issue_client(&proxy_identity("default", "gw"))
        .unwrap();
    let foreign = try_stream(
        client_config(ca.cert_pem(), Some((&foreign.cert_pem, &foreign.key_pem))),
        addr,
    )
    .await;
    assert!(foreign.is_err(), "certificate of another CA: {foreign:?}");
    let other_gw = ca
        .issue_client(&proxy_identity("default", "other"))
        .unwrap();
    assert_eq!(
        try_stream(
            client_config(ca.cert_pem(), Some((&other_gw.cert_pem, &other_gw.key_pem))),
            addr
        )
        .await,
        Ok(403),
        "a certificate for another Gateway"
    );

    // The subscriber with a foreign certificate never connects.
    let (_proxy, sub) = subscriber(&other_ca, addr, &temp_dir("s")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!sub.status().connected() && !sub.status().ready());
    wait_sync(&server, |s| s.connected == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_serve_proxies_turns_them_away_and_they_come_back() {
    let ca = Ca::generate().unwrap();
    let server = server(&ca, 0).await;
    let one = echo("one").await;
    let v1 = server.publish(&gw(), table(&[one]));
    let (proxy, sub) = subscriber(&ca, server.local_addr(), &temp_dir("s")).await;
    wait_sync(&server, |s| s.in_sync == 1).await;

    // Not the leader any more: the open stream ends, new ones get 503.
    server.set_accepting(false);
    let s = wait_sync(&server, |s| s.connected == 0).await;
    assert_eq!(s.in_sync, 0);
    let good = ca.issue_client(&proxy_identity("default", "gw")).unwrap();
    let config = || client_config(&good.ca_pem, Some((&good.cert_pem, &good.key_pem)));
    assert_eq!(try_stream(config(), server.local_addr()).await, Ok(503));
    // The proxy keeps serving its last table meanwhile.
    assert_eq!(get(&proxy).await, "one");
    assert_eq!(proxy.version(), v1);

    // Leading again: the proxy's retries (kept short after a 503) get through.
    server.set_accepting(true);
    let s = wait_sync(&server, |s| s.in_sync == 1).await;
    assert_eq!((s.version, s.connected), (v1, 1));
    assert!(sub.status().connected());
    assert_eq!(try_stream(config(), server.local_addr()).await, Ok(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_outlives_the_controller_and_restarts_from_its_state_dir() {
    let ca = Ca::generate().unwrap();
    let server1 = server(&ca, 0).await;
    let addr = server1.local_addr();
    let (one, two) = (echo("one").await, echo("two").await);
    let state = temp_dir("state");
    let (proxy, sub) = subscriber(&ca, addr, &state).await;
    let v1 = server1.publish(&gw(), table(&[one]));
    wait_sync(&server1, |s| s.in_sync == 1).await;

    // Controller gone: the proxy keeps serving.
    server1.shutdown();
    drop(server1);
    assert!(eventually(|| async { !sub.status().connected() }).await);
    assert_eq!(get(&proxy).await, "one");

    // Proxy restarted while the controller is down: serves the table from its state dir.
    drop(sub);
    proxy.shutdown().await;
    let (proxy, sub) = subscriber(&ca, addr, &state).await;
    assert!(sub.status().ready(), "ready from the state dir");
    assert_eq!(proxy.version(), v1);
    assert_eq!(get(&proxy).await, "one");

    // Controller back on the same address with a newer table: the proxy reconnects.
    let server2 = server(&ca, addr.port()).await;
    let v2 = server2.publish(&gw(), table(&[two]));
    assert!(
        v2 > v1,
        "versions keep increasing across a controller restart"
    );
    wait_sync(&server2, |s| s.in_sync == 1).await;
    assert_eq!(get(&proxy).await, "two");
    assert_eq!(proxy.version(), v2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_changes_reach_the_proxy_latency() {
    let ca = Ca::generate().unwrap();
    let server = server(&ca, 0).await;
    let one = echo("one").await;
    let (proxy, _sub) = subscriber(&ca, server.local_addr(), &temp_dir("state")).await;
    server.publish(&gw(), table(&[one]));
    wait_sync(&server, |s| s.in_sync == 1).await;

    let mut endpoints = vec![one];
    let mut applied = Vec::new();
    let mut acked = Vec::new();
    for i in 0..100u16 {
        // A new (unused) endpoint, as an EndpointSlice change would add.
        endpoints.push(std::net::SocketAddr::from(([127, 0, 0, 2], 10_000 + i)));
        let start = Instant::now();
        let v = server.publish(&gw(), table(&endpoints));
        // Every change must reach the proxy; the bound only keeps a lost one from hanging.
        while proxy.version() != v {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "change {i} (version {v}) never reached the proxy"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        applied.push(start.elapsed());
        wait_sync(&server, |s| s.version == v && s.in_sync == 1).await;
        acked.push(start.elapsed());
    }
    let pct = |v: &mut Vec<Duration>, p: usize| {
        v.sort();
        v[(v.len() * p / 100).min(v.len() - 1)]
    };
    println!(
        "publish->applied over 100 endpoint changes: p50 {:?} p99 {:?}; publish->ACK p50 {:?} p99 {:?}",
        pct(&mut applied, 50),
        pct(&mut applied, 99),
        pct(&mut acked, 50),
        pct(&mut acked, 99)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_with_a_certificate_of_the_previous_ca_connects_after_rotation() {
    let old = Ca::generate().unwrap();
    let new = old.rotate().unwrap();
    let server = server(&new, 0).await;
    server.publish(&gw(), table(&[echo("one").await]));
    // Client certificate still from the old CA, bundle already refreshed.
    let mut tls = old.issue_client(&proxy_identity("default", "gw")).unwrap();
    tls.ca_pem = new.trust_bundle();
    let (proxy, _sub) = subscriber_with(tls_dir(&tls), server.local_addr(), &temp_dir("s")).await;
    wait_sync(&server, |s| s.in_sync == 1).await;
    assert_eq!(get(&proxy).await, "one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_several_megabytes_streams_intact() {
    let ca = Ca::generate().unwrap();
    let server = server(&ca, 0).await;
    let one = echo("one").await;
    let (proxy, _sub) = subscriber(&ca, server.local_addr(), &temp_dir("s")).await;
    let mut big = table(&[one]);
    let endpoints: Vec<tollgate_api::Endpoint> = (0..200_000u32)
        .map(|i| tollgate_api::Endpoint {
            ip: format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
            port: 8080,
        })
        .collect();
    let mut extra = big.backends["b"].clone();
    extra.endpoints = endpoints;
    big.backends.insert("big".into(), extra);
    let size = serde_json::to_vec(&big).unwrap().len();
    assert!(size > 5_000_000, "{size} bytes");
    let start = Instant::now();
    let v = server.publish(&gw(), big);
    wait_sync(&server, |s| s.version == v && s.in_sync == 1).await;
    println!(
        "{size}-byte table published->ACKed in {:?}",
        start.elapsed()
    );
    assert_eq!(get(&proxy).await, "one");
}

/// A TCP relay to `upstream` that can freeze: stop forwarding without closing anything, as a
/// proxy whose node vanished would look.
async fn freezable_relay(
    upstream: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let frozen = Arc::new(AtomicBool::new(false));
    let f = frozen.clone();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let up = tokio::net::TcpStream::connect(upstream).await.unwrap();
            let (dr, dw) = down.into_split();
            let (ur, uw) = up.into_split();
            for (mut r, mut w, f) in [
                (
                    Box::new(dr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                    Box::new(uw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                    f.clone(),
                ),
                (Box::new(ur) as _, Box::new(dw) as _, f.clone()),
            ] {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match r.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if f.load(Ordering::SeqCst) {
                            // Hold both sockets open, forward nothing.
                            std::future::pending::<()>().await;
                        }
                        if w.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    (addr, frozen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_stops_answering_pings_is_dropped_from_sync() {
    let ca = Ca::generate().unwrap();
    let tls = ca.issue_server(&[]).unwrap();
    let options = tollgate::push::PushOptions {
        keepalive_interval: Duration::from_millis(200),
        keepalive_timeout: Duration::from_millis(500),
    };
    let server =
        tollgate::push::PushServer::start_with("127.0.0.1:0".parse().unwrap(), tls, options)
            .await
            .unwrap();
    let (relay, frozen) = freezable_relay(server.local_addr()).await;
    server.publish(&gw(), table(&[echo("one").await]));
    let (proxy, _sub) = subscriber(&ca, relay, &temp_dir("s")).await;
    wait_sync(&server, |s| s.in_sync == 1).await;
    frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    let start = Instant::now();
    wait_sync(&server, |s| s.connected == 0).await;
    println!("dead proxy dropped after {:?}", start.elapsed());
    assert_eq!(get(&proxy).await, "one", "the proxy itself keeps serving");
}
