//! AuthPolicy `external` authorization over gRPC against a real Envoy ext_authz service:
//! `extauthz-grpc` (e2e/extauthz, Go, on go-control-plane's published
//! `envoy.service.auth.v3` protos), built by `e2e/extauthz.sh build` (test-all.sh runs it
//! first). Allow (its headers added upstream and downstream), deny (its status, headers and
//! body), the decision cache, and that the service really was called (its `/count`).
//!
//! The binary is `$TOLLGATE_EXTAUTHZ`, else `$TOLLGATE_BIN_DIR/extauthz-grpc`, else
//! `$HOME/.cache/tollgate/bin/extauthz-grpc`; when none exists the tests say so loudly and
//! pass without running (build it with `e2e/extauthz.sh build`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tollgate_api::BackendProtocol;
use tollgate_api::external::{ExternalAuthz, ExternalProtocol};

use crate::common::*;
use crate::external_http::proxy_with_external;

/// A running extauthz-grpc, killed on drop.
struct ExtAuthz {
    child: Child,
    addr: SocketAddr,
    count_url: String,
}

impl Drop for ExtAuthz {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("TOLLGATE_EXTAUTHZ").map(PathBuf::from),
        std::env::var_os("TOLLGATE_BIN_DIR").map(|d| PathBuf::from(d).join("extauthz-grpc")),
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/tollgate/bin/extauthz-grpc")),
    ];
    candidates.into_iter().flatten().find(|p| p.exists())
}

impl ExtAuthz {
    async fn start() -> Option<Self> {
        let Some(bin) = binary() else {
            eprintln!(
                "\n*** SKIPPED: extauthz-grpc is not built; run `e2e/extauthz.sh build` \
                 (test-all.sh does) to test the gRPC external authorization ***\n"
            );
            return None;
        };
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let count: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new(bin)
            .args(["-listen", &addr.to_string(), "-count", &count.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let s = Self {
            child,
            addr,
            count_url: format!("http://{count}/count"),
        };
        // Ready when both listeners accept.
        for _ in 0..500 {
            if tokio::net::TcpStream::connect(addr).await.is_ok()
                && tokio::net::TcpStream::connect(count).await.is_ok()
            {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("extauthz-grpc did not start listening on {addr}");
    }

    /// Check calls the service has answered.
    async fn count(&self) -> u64 {
        let a = get(&h1_client(), &self.count_url).await;
        std::str::from_utf8(&a.body)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

fn grpc_rule(cache_ttl_ms: Option<u64>) -> ExternalAuthz {
    ExternalAuthz {
        id: "default/ext/opa".into(),
        backend: "authz".into(),
        protocol: ExternalProtocol::Grpc,
        forward_headers: vec![],
        max_body_bytes: None,
        timeout_ms: 2_000,
        fail_open: false,
        cache_ttl_ms,
    }
}

fn get_with(url: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::default()).unwrap()
}

async fn proxy_to(
    svc: &ExtAuthz,
    app: &EchoBackend,
    rule: ExternalAuthz,
) -> (
    tollgate_proxy::Proxy,
    String,
    std::sync::Arc<tollgate_proxy::Metrics>,
) {
    let mut b = backend_at(svc.addr);
    b.protocol = BackendProtocol::H2c;
    proxy_with_external(app, b, rule).await
}

#[tokio::test]
async fn the_ext_authz_service_allows_with_its_headers_and_denies_with_its_answer() {
    let Some(svc) = ExtAuthz::start().await else {
        return;
    };
    let app = echo_backend("app").await;
    let (_p, url, m) = proxy_to(&svc, &app, grpc_rule(None)).await;
    let client = h1_client();

    let a = send(
        &client,
        get_with(&format!("{url}/orders?page=2"), &[("x-allow", "yes")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    // ok_response.headers upstream (x-ext-path echoes attributes.request.http.path).
    assert_eq!(a.upstream_header("x-ext-user").as_deref(), Some("alice"));
    assert_eq!(
        a.upstream_header("x-ext-path").as_deref(),
        Some("/orders?page=2")
    );
    // response_headers_to_add downstream.
    assert_eq!(a.headers["x-ext-client"], "hello");
    assert_eq!(svc.count().await, 1);

    let a = send(
        &client,
        get_with(&format!("{url}/orders"), &[("x-allow", "no")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(a.headers["x-ext-denied"], "yes");
    assert_eq!(&a.body[..], b"denied by extauthz\n");
    assert_eq!(
        app.hits(),
        1,
        "the denied request never reached the backend"
    );
    assert_eq!(svc.count().await, 2);
    assert_eq!(m.auth().external_count("grpc", "allowed"), 1);
    assert_eq!(m.auth().external_count("grpc", "denied"), 1);
}

#[tokio::test]
async fn grpc_decisions_are_cached_for_the_ttl() {
    let Some(svc) = ExtAuthz::start().await else {
        return;
    };
    let app = echo_backend("app").await;
    let (_p, url, _m) = proxy_to(&svc, &app, grpc_rule(Some(60_000))).await;
    let client = h1_client();
    for _ in 0..4 {
        let a = send(
            &client,
            get_with(&format!("{url}/orders"), &[("x-allow", "yes")]),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.upstream_header("x-ext-user").as_deref(), Some("alice"));
    }
    assert_eq!(svc.count().await, 1);
    let a = send(
        &client,
        get_with(&format!("{url}/orders"), &[("x-allow", "no")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(svc.count().await, 2, "other headers, another check");
}

#[tokio::test]
async fn a_stopped_grpc_service_denies() {
    let Some(svc) = ExtAuthz::start().await else {
        return;
    };
    let app = echo_backend("app").await;
    let addr = svc.addr;
    drop(svc);
    let mut b = backend_at(addr);
    b.protocol = BackendProtocol::H2c;
    let (_p, url, m) = proxy_with_external(&app, b, grpc_rule(None)).await;
    let a = send(
        &h1_client(),
        get_with(&format!("{url}/orders"), &[("x-allow", "yes")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(app.hits(), 0);
    assert_eq!(m.auth().external_count("grpc", "error"), 1);
}

#[tokio::test]
async fn the_external_auth_filter_asks_the_ext_authz_service() {
    let Some(svc) = ExtAuthz::start().await else {
        return;
    };
    let app = echo_backend("app").await;
    let mut b = backend_at(svc.addr);
    b.protocol = BackendProtocol::H2c;
    let (_p, url) = crate::external_http::proxy_with_filter(&app, b, grpc_rule(None)).await;
    let client = h1_client();
    let a = send(
        &client,
        get_with(&format!("{url}/orders"), &[("x-allow", "yes")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-ext-user").as_deref(), Some("alice"));
    assert_eq!(a.headers["x-ext-client"], "hello");
    let a = send(&client, get_with(&format!("{url}/orders"), &[])).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(&a.body[..], b"denied by extauthz\n");
    assert_eq!(svc.count().await, 2);
}
