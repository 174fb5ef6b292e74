//! AuthPolicy `external` authorization over HTTP, end to end: a proxy whose route carries an
//! external rule, an authorization service written here (hyper on 127.0.0.1, recording every
//! check it is asked), and the echo backend. Allowed answers add the listed headers upstream
//! and downstream; denials carry the service's status, headers and body; a slow, failing or
//! unreachable service denies (403) unless `failOpen`; decisions are cached per forwarded
//! attributes; bodies are forwarded up to the limit and refused (413) beyond it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tollgate_api::external::{ExternalAuthz, ExternalProtocol, HttpCheck};
use tollgate_api::policy::{AuthzRule, PolicySet};
use tollgate_api::{Backend, BackendProtocol};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

use crate::common::*;
use crate::support::*;

/// One check request as the service saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// The authorization service: `Authorization: Bearer good` is allowed (with headers
/// `x-auth-user`, `x-auth-client` and `x-unlisted`); `Bearer broken` gets 500; `x-slow: yes`
/// waits 2 s first; anything else gets 401 with a challenge and a body.
pub struct AuthService {
    pub addr: SocketAddr,
    pub checks: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl AuthService {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = Self {
            addr: listener.local_addr().unwrap(),
            checks: Arc::default(),
            seen: Arc::default(),
        };
        let (checks, seen) = (s.checks.clone(), s.seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (checks, seen) = (checks.clone(), seen.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(checks.clone(), seen.clone(), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        s
    }

    pub fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    pub fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }
}

async fn answer(
    checks: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    checks.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().unwrap().to_string(),
        headers: parts.headers.clone(),
        body,
    });
    if parts.headers.get("x-slow").is_some() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let authz = parts
        .headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned());
    let resp = match authz.as_deref() {
        Some("Bearer good") => Response::builder()
            .header("x-auth-user", "alice")
            .header("x-auth-client", "hi")
            .header("x-unlisted", "nope")
            .body(Full::default()),
        Some("Bearer broken") => Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Full::new(Bytes::from_static(b"boom\n"))),
        _ => Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Bearer realm=\"ext\"")
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(b"go away\n"))),
    };
    Ok(resp.unwrap())
}

/// An HTTP external rule to the backend `authz`.
pub fn http_rule(timeout_ms: u64, fail_open: bool, cache_ttl_ms: Option<u64>) -> ExternalAuthz {
    ExternalAuthz {
        id: "default/ext/check".into(),
        backend: "authz".into(),
        protocol: ExternalProtocol::Http(HttpCheck {
            path_prefix: "/check".into(),
            headers_to_upstream: vec!["x-auth-user".into()],
            headers_to_client: vec!["x-auth-client".into()],
            all_headers_to_upstream: false,
        }),
        forward_headers: vec!["authorization".into(), "x-slow".into()],
        max_body_bytes: None,
        timeout_ms,
        fail_open,
        cache_ttl_ms,
    }
}

/// A proxy whose `/orders` route carries `rule`, the service reached as the backend `authz`
/// (`service`), and the metrics it records into.
pub async fn proxy_with_external(
    app: &EchoBackend,
    service: Backend,
    rule: ExternalAuthz,
) -> (Proxy, String, Arc<Metrics>) {
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    let mut a = auth(vec![]);
    a.authorization = vec![AuthzRule {
        name: "check".into(),
        predicate: String::new(),
        external: Some(rule),
        when: vec![],
    }];
    let mut t = table(
        1,
        vec![http_port(0, vec![guarded("orders", "/orders", "p")])],
        vec![("app", backend_of(&[app])), ("authz", service)],
    );
    t.policies.insert(
        "p".into(),
        PolicySet {
            auth: Some(a),
            ..PolicySet::default()
        },
    );
    proxy.apply(t).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    (proxy, format!("http://{addr}"), metrics)
}

fn get_with(url: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::default()).unwrap()
}

#[tokio::test]
async fn an_allowing_answer_adds_the_listed_headers_upstream_and_downstream() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let (_p, url, _m) =
        proxy_with_external(&app, backend_at(svc.addr), http_rule(2_000, false, None)).await;
    let a = send(
        &h1_client(),
        get_with(
            &format!("{url}/orders?page=1"),
            &[
                ("authorization", "Bearer good"),
                ("x-other", "not forwarded"),
                ("x-auth-user", "mallory"),
            ],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    // Upstream: the service's listed header replaces the client's; the unlisted one is not
    // copied.
    assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
    assert_eq!(a.upstream_header("x-unlisted"), None);
    assert_eq!(a.upstream_header("x-auth-client"), None);
    // Downstream: the listed client header.
    assert_eq!(a.headers["x-auth-client"], "hi");
    assert!(a.headers.get("x-auth-user").is_none());
    // The check: method, prefixed path with the query, the forwarded header only, and the
    // forwarding headers.
    let seen = svc.last();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.path, "/check/orders?page=1");
    assert_eq!(seen.headers["authorization"], "Bearer good");
    assert!(seen.headers.get("x-other").is_none());
    assert_eq!(seen.headers["x-forwarded-method"], "GET");
    assert_eq!(seen.headers["x-forwarded-uri"], "/orders?page=1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["host"], "127.0.0.1");
    assert_eq!(svc.checks(), 1);
}

#[tokio::test]
async fn a_denying_answer_reaches_the_client_with_its_status_headers_and_body() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let (_p, url, m) =
        proxy_with_external(&app, backend_at(svc.addr), http_rule(2_000, false, None)).await;
    let a = send(
        &h1_client(),
        get_with(&format!("{url}/orders"), &[("authorization", "Bearer bad")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.headers["www-authenticate"], "Bearer realm=\"ext\"");
    assert_eq!(&a.body[..], b"go away\n");
    assert_eq!(app.hits(), 0, "a denied request never reaches the backend");
    assert_eq!(m.auth().external_count("http", "denied"), 1);
}

#[tokio::test]
async fn a_slow_service_denies_unless_the_rule_fails_open() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let slow = [("authorization", "Bearer good"), ("x-slow", "yes")];
    let (_p, url, m) =
        proxy_with_external(&app, backend_at(svc.addr), http_rule(100, false, None)).await;
    let a = send(&h1_client(), get_with(&format!("{url}/orders"), &slow)).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(app.hits(), 0);
    assert_eq!(m.auth().external_count("http", "error"), 1);

    let (_p2, url2, m2) =
        proxy_with_external(&app, backend_at(svc.addr), http_rule(100, true, None)).await;
    let a = send(&h1_client(), get_with(&format!("{url2}/orders"), &slow)).await;
    assert_eq!(a.status, StatusCode::OK);
    // Let through without the service's headers: it never answered.
    assert_eq!(a.upstream_header("x-auth-user"), None);
    assert_eq!(app.hits(), 1);
    assert_eq!(m2.auth().external_count("http", "fail_open"), 1);
}

#[tokio::test]
async fn a_failing_or_unreachable_service_denies_with_403() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let (_p, url, m) =
        proxy_with_external(&app, backend_at(svc.addr), http_rule(2_000, false, None)).await;
    let a = send(
        &h1_client(),
        get_with(
            &format!("{url}/orders"),
            &[("authorization", "Bearer broken")],
        ),
    )
    .await;
    assert_eq!(
        a.status,
        StatusCode::FORBIDDEN,
        "a 5xx is a failure, not a denial"
    );
    assert_eq!(&a.body[..], b"Forbidden\n");
    assert_eq!(m.auth().external_count("http", "error"), 1);

    let closed: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (_p2, url2, _m2) =
        proxy_with_external(&app, backend_at(closed), http_rule(2_000, false, None)).await;
    let a = send(
        &h1_client(),
        get_with(
            &format!("{url2}/orders"),
            &[("authorization", "Bearer good")],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(app.hits(), 0);
}

#[tokio::test]
async fn decisions_are_cached_per_forwarded_attributes() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let (_p, url, m) = proxy_with_external(
        &app,
        backend_at(svc.addr),
        http_rule(2_000, false, Some(60_000)),
    )
    .await;
    let client = h1_client();
    for _ in 0..5 {
        let a = send(
            &client,
            get_with(
                &format!("{url}/orders"),
                &[("authorization", "Bearer good")],
            ),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
        // A cached allow still adds its headers.
        assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
        assert_eq!(a.headers["x-auth-client"], "hi");
    }
    assert_eq!(svc.checks(), 1, "five identical requests, one check");
    assert_eq!(m.auth().external_count("http", "cache_hit"), 4);
    // Another credential is never served the cached decision.
    for _ in 0..3 {
        let a = send(
            &client,
            get_with(&format!("{url}/orders"), &[("authorization", "Bearer bad")]),
        )
        .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(svc.checks(), 2, "a denial is cached too");
    // Another path is another decision.
    let a = send(
        &client,
        get_with(
            &format!("{url}/orders/7"),
            &[("authorization", "Bearer good")],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(svc.checks(), 3);
}

#[tokio::test]
async fn without_a_cache_ttl_every_request_is_checked() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let (_p, url, _m) =
        proxy_with_external(&app, backend_at(svc.addr), http_rule(2_000, false, None)).await;
    let client = h1_client();
    for _ in 0..3 {
        send(
            &client,
            get_with(
                &format!("{url}/orders"),
                &[("authorization", "Bearer good")],
            ),
        )
        .await;
    }
    assert_eq!(svc.checks(), 3);
}

#[tokio::test]
async fn the_body_is_forwarded_up_to_the_limit_and_refused_beyond_it() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let mut rule = http_rule(2_000, false, None);
    rule.max_body_bytes = Some(16);
    let (_p, url, _m) = proxy_with_external(&app, backend_at(svc.addr), rule).await;
    let client = h1_client();
    let post = |body: &'static [u8]| {
        Request::post(format!("{url}/orders"))
            .header("authorization", "Bearer good")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    };
    let a = send(&client, post(b"{\"qty\": 2}")).await;
    assert_eq!(a.status, StatusCode::OK);
    let seen = svc.last();
    assert_eq!(seen.method, "POST");
    assert_eq!(&seen.body[..], b"{\"qty\": 2}");
    // The backend still gets the whole body.
    assert_eq!(a.json()["body"], "{\"qty\": 2}");

    let a = send(&client, post(b"a body longer than sixteen bytes")).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        svc.checks(),
        1,
        "a body over the limit is refused before any check"
    );
    assert_eq!(app.hits(), 1);
}

#[tokio::test]
async fn an_h2c_service_is_asked_over_http2() {
    // The same HTTP check to a service port spoken to over h2c (appProtocol kubernetes.io/h2c).
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let mut b = backend_at(svc.addr);
    b.protocol = BackendProtocol::H2c;
    let (_p, url, _m) = proxy_with_external(&app, b, http_rule(2_000, false, None)).await;
    let a = send(
        &h1_client(),
        get_with(
            &format!("{url}/orders"),
            &[("authorization", "Bearer good")],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
    assert_eq!(svc.last().path, "/check/orders");
}

// ---- the HTTPRoute ExternalAuth filter (GEP-1494): the same check, from the route ----

/// A proxy whose `/orders` route carries an ExternalAuth filter `rule` (no policy).
pub async fn proxy_with_filter(
    app: &EchoBackend,
    service: Backend,
    rule: ExternalAuthz,
) -> (Proxy, String) {
    let r = with_filters(
        route("orders", "/orders", vec![wb("app", 1)]),
        vec![tollgate_api::Filter::ExternalAuth(rule)],
    );
    proxy_with(
        vec![r],
        vec![("app", backend_of(&[app])), ("authz", service)],
    )
    .await
}

/// The filter's HTTP form without `allowedResponseHeaders`: every header of the answer goes
/// upstream.
fn filter_rule() -> ExternalAuthz {
    let mut r = http_rule(2_000, false, None);
    r.protocol = ExternalProtocol::Http(HttpCheck {
        path_prefix: "/check".into(),
        headers_to_upstream: vec![],
        headers_to_client: vec![],
        all_headers_to_upstream: true,
    });
    r.forward_headers = vec!["authorization".into()];
    r
}

#[tokio::test]
async fn the_external_auth_filter_copies_the_allowing_answer_upstream() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let (_p, url) = proxy_with_filter(&app, backend_at(svc.addr), filter_rule()).await;
    let a = send(
        &h1_client(),
        get_with(
            &format!("{url}/orders"),
            &[("authorization", "Bearer good")],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    for (name, value) in [
        ("x-auth-user", "alice"),
        ("x-auth-client", "hi"),
        ("x-unlisted", "nope"),
    ] {
        assert_eq!(a.upstream_header(name).as_deref(), Some(value), "{name}");
    }
    // Not the answer's own framing or content headers.
    assert_eq!(a.json()["method"], "GET");
    assert_eq!(svc.last().path, "/check/orders");
}

#[tokio::test]
async fn the_external_auth_filter_denies_with_the_answer_and_fails_closed() {
    let app = echo_backend("app").await;
    let svc = AuthService::start().await;
    let (_p, url) = proxy_with_filter(&app, backend_at(svc.addr), filter_rule()).await;
    let a = send(
        &h1_client(),
        get_with(&format!("{url}/orders"), &[("authorization", "Bearer bad")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(&a.body[..], b"go away\n");

    // A backend the compiler could not resolve (empty key): 403, never open.
    let mut unresolved = filter_rule();
    unresolved.backend = String::new();
    let (_p2, url2) = proxy_with_filter(&app, backend_at(svc.addr), unresolved).await;
    let a = send(
        &h1_client(),
        get_with(
            &format!("{url2}/orders"),
            &[("authorization", "Bearer good")],
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(app.hits(), 0);
}
