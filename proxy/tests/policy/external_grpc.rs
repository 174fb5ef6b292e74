//! AuthPolicy `external` authorization over gRPC against a real Envoy ext_authz service:
//! `extauthz-grpc` (e2e/extauthz, Go, on go-control-plane's published
//! `envoy.service.auth.v3` protos), built by `e2e/extauthz.sh build` (test-all.sh runs it
//! first). Allow (its headers added upstream and downstream), deny (its status, headers and
//! body), the decision cache, that the service really was called (its `/count`), and that
//! a hostile allowing answer cannot set Host, framing or hop-by-hop headers.
//!
//! The binary is `$TOLLGATE_EXTAUTHZ`, else the build of this checkout's e2e/extauthz
//! (`e2e/extauthz.sh current`); when there is none the tests say so loudly and pass without
//! running (build it with `e2e/extauthz.sh build`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tollgate_api::external::{ExternalAuthz, ExternalProtocol};
use tollgate_api::{Backend, BackendProtocol};

use crate::common::*;
use crate::external_support::{get_with, proxy_with_external, proxy_with_filter};

/// A running extauthz-grpc, killed on drop.
pub struct ExtAuthz {
    child: Child,
    pub addr: SocketAddr,
    count_url: String,
}

impl Drop for ExtAuthz {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `$TOLLGATE_EXTAUTHZ`, else this checkout's build (`e2e/extauthz.sh current`: the one
/// built from this e2e/extauthz, whatever another checkout sharing the cache built last).
fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOLLGATE_EXTAUTHZ") {
        return Some(PathBuf::from(p));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/extauthz.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg("current")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && path.exists()).then_some(path)
}

impl ExtAuthz {
    async fn start() -> Option<Self> {
        Self::start_with(&[]).await
    }

    /// Started with these arguments besides `-listen` and `-count` (e.g. `-tls-cert`).
    pub async fn start_with(args: &[&str]) -> Option<Self> {
        let Some(bin) = binary() else {
            eprintln!(
                "\n*** SKIPPED: extauthz-grpc is not built from this checkout's e2e/extauthz; \
                 run `e2e/extauthz.sh build` (test-all.sh does) to test the gRPC external \
                 authorization ***\n"
            );
            return None;
        };
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let count: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new(bin)
            .args(["-listen", &addr.to_string(), "-count", &count.to_string()])
            .args(args)
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
    pub async fn count(&self) -> u64 {
        let a = get(&h1_client(), &self.count_url).await;
        std::str::from_utf8(&a.body)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// How the last Check call came: `tls alpn=h2 sni=NAME`, `plaintext`, or `none`.
    pub async fn peer(&self) -> String {
        let url = self.count_url.replace("/count", "/peer");
        let a = get(&h1_client(), &url).await;
        String::from_utf8(a.body.to_vec())
            .unwrap()
            .trim()
            .to_owned()
    }
}

/// The service at `addr`, spoken to over h2c (a Service port with `appProtocol:
/// kubernetes.io/h2c`, as the compiler resolves a gRPC service).
pub fn h2c_at(addr: SocketAddr) -> Backend {
    Backend {
        protocol: BackendProtocol::H2c,
        ..backend_at(addr)
    }
}

/// GET `/orders` on `url` with `x-allow: VALUE`.
pub async fn ask(client: &TestClient, url: &str, allow: &str) -> Answer {
    send(
        client,
        get_with(&format!("{url}/orders"), &[("x-allow", allow)]),
    )
    .await
}

/// Asserts extauthz-grpc allowed `a`: its `ok_response` header upstream, its
/// `response_headers_to_add` header to the client.
#[track_caller]
pub fn assert_allowed(a: &Answer) {
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-ext-user").as_deref(), Some("alice"));
    assert_eq!(a.headers["x-ext-client"], "hello");
}

pub fn grpc_rule(cache_ttl_ms: Option<u64>) -> ExternalAuthz {
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

async fn proxy_to(
    svc: &ExtAuthz,
    app: &EchoBackend,
    rule: ExternalAuthz,
) -> (
    tollgate_proxy::Proxy,
    String,
    std::sync::Arc<tollgate_proxy::Metrics>,
) {
    let b = h2c_at(svc.addr);
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

    let a = ask(&client, &url, "no").await;
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
        let a = ask(&client, &url, "yes").await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.upstream_header("x-ext-user").as_deref(), Some("alice"));
    }
    assert_eq!(svc.count().await, 1);
    let a = ask(&client, &url, "no").await;
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
    let b = h2c_at(addr);
    let (_p, url, m) = proxy_with_external(&app, b, grpc_rule(None)).await;
    let a = ask(&h1_client(), &url, "yes").await;
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
    let b = h2c_at(svc.addr);
    let (_p, url) = proxy_with_filter(&app, b, grpc_rule(None)).await;
    let client = h1_client();
    let a = ask(&client, &url, "yes").await;
    assert_allowed(&a);
    let a = send(&client, get_with(&format!("{url}/orders"), &[])).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(&a.body[..], b"denied by extauthz\n");
    assert_eq!(svc.count().await, 2);
}

#[tokio::test]
async fn an_answer_never_sets_host_framing_or_hop_by_hop_headers() {
    // The service (x-allow: hostile) sets Host, Content-Length, Transfer-Encoding, Connection
    // and Upgrade upstream, removes Host, and adds Content-Length, Transfer-Encoding and
    // Connection to the client's response.
    let Some(svc) = ExtAuthz::start().await else {
        return;
    };
    let app = echo_backend("app").await;
    let (_p, url, _m) = proxy_to(&svc, &app, grpc_rule(None)).await;
    let client = h1_client();
    let post = || {
        Request::post(format!("{url}/orders"))
            .header("x-allow", "hostile")
            .body(Full::new(Bytes::from_static(b"hello world")))
            .unwrap()
    };
    let a = send(&client, post()).await;
    assert_eq!(a.status, StatusCode::OK);
    let host = url.trim_start_matches("http://");
    assert_eq!(a.upstream_header("host").as_deref(), Some(host));
    assert_eq!(a.upstream_header("x-ext-user").as_deref(), Some("alice"));
    // The body as the client framed it, whole.
    assert_eq!(a.json()["body"], "hello world");
    assert_eq!(a.upstream_header("content-length").as_deref(), Some("11"));
    for name in ["transfer-encoding", "upgrade", "connection"] {
        assert_eq!(a.upstream_header(name), None, "{name} upstream");
    }
    // The client's answer is framed by the gateway alone.
    assert_eq!(a.headers["x-ext-client"], "hello");
    assert_eq!(
        a.headers.get_all("content-length").iter().count(),
        1,
        "{:?}",
        a.headers
    );
    assert_eq!(a.headers["content-length"], a.body.len().to_string());
    for name in ["transfer-encoding", "connection"] {
        assert!(a.headers.get(name).is_none(), "{name} to the client");
    }
    // The connection is still good for the next request.
    assert_eq!(send(&client, post()).await.status, StatusCode::OK);
    assert_eq!(app.hits(), 2);
}
