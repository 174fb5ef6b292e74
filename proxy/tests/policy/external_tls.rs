//! External authorization over TLS, as a BackendTLSPolicy on the service's port makes the
//! compiler emit it (`Backend.tls`: the policy's CA as PEM, its hostname as SNI and the name
//! to verify, ALPN `h2` and `http/1.1` for an HTTP service, `h2` alone for gRPC). The
//! services here speak only TLS, with certificates from a CA made in the test: the HTTP
//! service written here (hyper over rustls) and extauthz-grpc with `-tls-cert`
//! (grpc-go, which refuses a client that does not offer ALPN `h2`).
//!
//! What must hold: a service whose chain leads to the CA and whose certificate carries the
//! name is asked over TLS; a service with a certificate from another CA or for another name
//! is never asked (the handshake fails): the request is denied with 403 and never reaches
//! the backend, unless the rule sets `failOpen`, which lets it through without the service's
//! headers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use http::StatusCode;
use tollgate_api::backend_tls::Trust;
use tollgate_api::{Backend, BackendProtocol, BackendTls};

use crate::common::pki::{Ca, Leaf};
use crate::common::*;
use crate::external_grpc::{ExtAuthz, ask, assert_allowed, grpc_rule};
use crate::external_support::*;

const NAME: &str = "authz.test";

/// The service at `addr` over TLS, trusting `ca`, verifying `NAME`, as the compiler emits a
/// BackendTLSPolicy with `caCertificateRefs` and `hostname: authz.test`.
fn over_tls(addr: SocketAddr, ca: &Ca, protocol: BackendProtocol) -> Backend {
    let alpn: &[&str] = match protocol {
        BackendProtocol::H2c => &["h2"],
        _ => &["h2", "http/1.1"],
    };
    Backend {
        tls: Some(BackendTls {
            source: "default/authz-tls".into(),
            server_name: NAME.into(),
            subject_alt_names: vec![],
            trust: Trust::Pem(ca.pem.clone()),
            alpn: alpn.iter().map(|a| (*a).to_owned()).collect(),
            client_certificate: None,
        }),
        protocol,
        ..backend_at(addr)
    }
}

/// The HTTP rule's policy to an HTTP service over TLS serving `leaf`, the proxy trusting
/// `trusted`.
async fn http_over_tls(leaf: &Leaf, trusted: &Ca, fail_open: bool) -> Setup {
    let svc = AuthService::start_tls(leaf.server_config(&["h2", "http/1.1"])).await;
    let backend = over_tls(svc.addr, trusted, BackendProtocol::Http1);
    Setup::policy_on(svc, backend, http_rule(2_000, fail_open, None)).await
}

#[tokio::test]
async fn an_http_service_is_asked_over_tls_with_the_policy_name() {
    let ca = Ca::new("authz CA");
    let s = http_over_tls(&ca.leaf(&[NAME], &[]), &ca, false).await;
    let a = s.bearer("good").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
    assert_eq!(a.headers["x-auth-client"], "hi");
    // The service speaks only TLS: the check came through a handshake, with the SNI.
    assert_eq!(s.svc.checks(), 1);
    assert_eq!(s.svc.last().path, "/check/orders");
    assert_eq!(*s.svc.handshakes.lock().unwrap(), [Some(NAME.to_owned())]);
    assert_eq!(s.counted("allowed"), 1);
    // A denial over TLS reaches the client as the service wrote it.
    assert_eq!(s.bearer("bad").await.status, StatusCode::UNAUTHORIZED);
}

/// A service the proxy must not trust: denied with 403 and never asked; with `failOpen`,
/// let through without the service's headers.
async fn assert_untrusted_http(leaf: &Leaf, trusted: &Ca) {
    let s = http_over_tls(leaf, trusted, false).await;
    let a = s.bearer("good").await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(&a.body[..], b"Forbidden\n");
    assert_eq!(s.app.hits(), 0, "never upstream");
    assert!(s.svc.connections.load(Ordering::SeqCst) >= 1, "dialed");
    assert!(s.svc.handshakes.lock().unwrap().is_empty(), "no handshake");
    assert_eq!(s.svc.checks(), 0, "never asked");
    assert_eq!(s.counted("error"), 1);

    let s = http_over_tls(leaf, trusted, true).await;
    let a = s.bearer("good").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-auth-user"), None);
    assert_eq!(s.svc.checks(), 0);
    assert_eq!(s.app.hits(), 1);
    assert_eq!(s.counted("fail_open"), 1);
}

#[tokio::test]
async fn an_http_service_with_a_certificate_from_another_ca_is_never_asked() {
    let (ca, rogue) = (Ca::new("authz CA"), Ca::new("rogue CA"));
    assert_untrusted_http(&rogue.leaf(&[NAME], &[]), &ca).await;
}

#[tokio::test]
async fn an_http_service_with_a_certificate_for_another_name_is_never_asked() {
    let ca = Ca::new("authz CA");
    assert_untrusted_http(&ca.leaf(&["other.test"], &[]), &ca).await;
}

// ---- gRPC: extauthz-grpc over TLS ----

/// `leaf` written to two files for extauthz-grpc (removed on drop).
struct PemFiles(PathBuf, PathBuf);

impl PemFiles {
    fn new(leaf: &Leaf) -> Self {
        let dir = std::env::temp_dir();
        let tag = format!("{}-{}", std::process::id(), free_port());
        let files = Self(
            dir.join(format!("tollgate-extauthz-{tag}.crt")),
            dir.join(format!("tollgate-extauthz-{tag}.key")),
        );
        std::fs::write(&files.0, &leaf.cert_pem).unwrap();
        std::fs::write(&files.1, &leaf.key_pem).unwrap();
        files
    }
}

impl Drop for PemFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(&self.1);
    }
}

/// extauthz-grpc serving `leaf` over TLS; `None` when it is not built.
async fn grpc_over_tls(leaf: &Leaf) -> Option<(ExtAuthz, PemFiles)> {
    let pem = PemFiles::new(leaf);
    let args = [
        "-tls-cert",
        pem.0.to_str().unwrap(),
        "-tls-key",
        pem.1.to_str().unwrap(),
    ];
    Some((ExtAuthz::start_with(&args).await?, pem))
}

#[tokio::test]
async fn a_grpc_service_is_asked_over_tls_with_alpn_h2() {
    let ca = Ca::new("authz CA");
    let Some((svc, _pem)) = grpc_over_tls(&ca.leaf(&[NAME], &[])).await else {
        return;
    };
    let app = echo_backend("app").await;
    let backend = over_tls(svc.addr, &ca, BackendProtocol::H2c);
    let (_p, url, m) = proxy_with_external(&app, backend, grpc_rule(None)).await;
    let client = h1_client();
    let a = ask(&client, &url, "yes").await;
    assert_allowed(&a);
    // The service saw the call come over TLS, HTTP/2 agreed by ALPN, with the policy's SNI.
    assert_eq!(svc.peer().await, format!("tls alpn=h2 sni={NAME}"));
    assert_eq!(svc.count().await, 1);
    let a = ask(&client, &url, "no").await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(&a.body[..], b"denied by extauthz\n");
    assert_eq!(m.auth().external_count("grpc", "allowed"), 1);
    assert_eq!(m.auth().external_count("grpc", "denied"), 1);
}

/// A gRPC service the proxy must not trust: 403 and never asked; with `failOpen`, let
/// through without its headers.
async fn assert_untrusted_grpc(leaf: &Leaf, trusted: &Ca) {
    let Some((svc, _pem)) = grpc_over_tls(leaf).await else {
        return;
    };
    for fail_open in [false, true] {
        let app = echo_backend("app").await;
        let mut rule = grpc_rule(None);
        rule.fail_open = fail_open;
        let backend = over_tls(svc.addr, trusted, BackendProtocol::H2c);
        let (_p, url, m) = proxy_with_external(&app, backend, rule).await;
        let a = ask(&h1_client(), &url, "yes").await;
        if fail_open {
            assert_eq!(a.status, StatusCode::OK);
            assert_eq!(a.upstream_header("x-ext-user"), None);
            assert_eq!(app.hits(), 1);
            assert_eq!(m.auth().external_count("grpc", "fail_open"), 1);
        } else {
            assert_eq!(a.status, StatusCode::FORBIDDEN);
            assert_eq!(app.hits(), 0, "never upstream");
            assert_eq!(m.auth().external_count("grpc", "error"), 1);
        }
    }
    assert_eq!(svc.count().await, 0, "never asked");
}

#[tokio::test]
async fn a_grpc_service_with_a_certificate_from_another_ca_is_never_asked() {
    let (ca, rogue) = (Ca::new("authz CA"), Ca::new("rogue CA"));
    assert_untrusted_grpc(&rogue.leaf(&[NAME], &[]), &ca).await;
}

#[tokio::test]
async fn a_grpc_service_with_a_certificate_for_another_name_is_never_asked() {
    let ca = Ca::new("authz CA");
    assert_untrusted_grpc(&ca.leaf(&["other.test"], &[]), &ca).await;
}
