//! The pieces of the external authorization tests: an HTTP authorization service written
//! here (hyper on 127.0.0.1, plaintext or TLS, recording every check it is asked), the rules
//! as the compiler emits them, and [`Setup`]: the echo backend, the service and a proxy whose
//! `/orders` route carries a rule as an AuthPolicy rule or an ExternalAuth filter.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tollgate_api::external::{AllowStatus, ExternalAuthz, ExternalProtocol, HttpCheck};
use tollgate_api::policy::{AuthzRule, PolicySet};
use tollgate_api::{Backend, ObjectKey};
pub use tollgate_proxy::policy::decisions::Outcome;
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
/// `x-auth-user`, `x-auth-client` and `x-unlisted`); `Bearer nocontent` gets 204 (a 2xx that
/// is not 200); `Bearer hostile` gets 200 with the headers of `good` plus Host, `Keep-Alive`,
/// `TE` and `Trailer`; `Bearer huge` gets 200 with a 1 MiB body; `Bearer drip` gets 200
/// with a body that never ends (a byte every 20 ms); `Bearer broken` gets 500; `x-slow: yes` waits 2 s first; anything
/// else gets 401 with a challenge and a body. Served over TLS when started with a config:
/// then the SNI of every handshake it completed is recorded.
pub struct AuthService {
    pub addr: SocketAddr,
    pub checks: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// TCP connections accepted.
    pub connections: Arc<AtomicUsize>,
    /// The SNI of each TLS handshake completed.
    pub handshakes: Arc<Mutex<Vec<Option<String>>>>,
}

impl AuthService {
    pub async fn start() -> Self {
        Self::serve(None).await
    }

    /// The service speaking only TLS with `config`.
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> Self {
        Self::serve(Some(tokio_rustls::TlsAcceptor::from(config))).await
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = Self {
            addr: listener.local_addr().unwrap(),
            checks: Arc::default(),
            seen: Arc::default(),
            connections: Arc::default(),
            handshakes: Arc::default(),
        };
        let (checks, seen) = (s.checks.clone(), s.seen.clone());
        let (connections, handshakes) = (s.connections.clone(), s.handshakes.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                connections.fetch_add(1, Ordering::SeqCst);
                let (checks, seen) = (checks.clone(), seen.clone());
                let (tls, handshakes) = (tls.clone(), handshakes.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(checks.clone(), seen.clone(), req));
                    let server = auto::Builder::new(TokioExecutor::new());
                    let _ = match tls {
                        None => server.serve_connection(TokioIo::new(stream), svc).await,
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let sni = stream.get_ref().1.server_name().map(str::to_owned);
                            handshakes.lock().unwrap().push(sni);
                            server.serve_connection(TokioIo::new(stream), svc).await
                        }
                    };
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
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
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
    let allowed = || {
        Response::builder()
            .header("x-auth-user", "alice")
            .header("x-auth-client", "hi")
            .header("x-unlisted", "nope")
    };
    let resp = match authz.as_deref() {
        Some("Bearer good") => allowed().body(full(b"")),
        Some("Bearer nocontent") => allowed().status(StatusCode::NO_CONTENT).body(full(b"")),
        Some("Bearer hostile") => allowed()
            .header("host", "evil.test")
            .header("keep-alive", "timeout=1")
            .header("te", "trailers")
            .header("trailer", "x-checksum")
            .body(full(b"")),
        // An allowing head with a body larger than any answer the gateway reads.
        Some("Bearer huge") => allowed().body(Full::new(Bytes::from(vec![b'x'; 1 << 20])).boxed()),
        // An allowing head, then a body that never ends: a byte every 20 ms.
        Some("Bearer drip") => allowed().body(
            StreamBody::new(futures_util::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Some((Ok(Frame::data(Bytes::from_static(b"x"))), ()))
            }))
            .boxed(),
        ),
        Some("Bearer broken") => Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(full(b"boom\n")),
        _ => Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Bearer realm=\"ext\"")
            .header("content-type", "text/plain")
            .body(full(b"go away\n")),
    };
    Ok(resp.unwrap())
}

fn full(b: &'static [u8]) -> BoxBody<Bytes, Infallible> {
    Full::new(Bytes::from_static(b)).boxed()
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
            ..HttpCheck::default()
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
        policy: ObjectKey::new("default", "authz"),
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

pub fn get_with(url: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::default()).unwrap()
}

/// One test's pieces: the echo backend `app`, the HTTP authorization service, and a proxy
/// whose `/orders` route carries the rule (as an AuthPolicy rule or an ExternalAuth filter).
pub struct Setup {
    pub app: EchoBackend,
    pub svc: AuthService,
    pub url: String,
    pub metrics: Option<Arc<Metrics>>,
    pub client: TestClient,
    _proxy: Proxy,
}

impl Setup {
    /// `rule` as an AuthPolicy rule, to the plaintext service reached as `service(svc.addr)`.
    pub async fn policy_to(
        rule: ExternalAuthz,
        service: impl FnOnce(SocketAddr) -> Backend,
    ) -> Self {
        let svc = AuthService::start().await;
        let backend = service(svc.addr);
        Self::policy_on(svc, backend, rule).await
    }

    /// `rule` as an AuthPolicy rule, to `svc` reached as `backend`.
    pub async fn policy_on(svc: AuthService, backend: Backend, rule: ExternalAuthz) -> Self {
        let app = echo_backend("app").await;
        let (proxy, url, m) = proxy_with_external(&app, backend, rule).await;
        Self::of(app, svc, proxy, url, Some(m))
    }

    /// `rule` as an AuthPolicy rule, to the plaintext HTTP/1 service.
    pub async fn policy(rule: ExternalAuthz) -> Self {
        Self::policy_to(rule, backend_at).await
    }

    /// `rule` as the route's ExternalAuth filter, to the plaintext HTTP/1 service.
    pub async fn filter(rule: ExternalAuthz) -> Self {
        let (app, svc) = (echo_backend("app").await, AuthService::start().await);
        let (proxy, url) = proxy_with_filter(&app, backend_at(svc.addr), rule).await;
        Self::of(app, svc, proxy, url, None)
    }

    fn of(
        app: EchoBackend,
        svc: AuthService,
        proxy: Proxy,
        url: String,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self {
            app,
            svc,
            url,
            metrics,
            client: h1_client(),
            _proxy: proxy,
        }
    }

    /// GET `path` with `headers`.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let req = get_with(&format!("{}{path}", self.url), headers);
        send(&self.client, req).await
    }

    /// GET `/orders` with `Authorization: Bearer TOKEN`.
    pub async fn bearer(&self, token: &str) -> Answer {
        self.get("/orders", &[("authorization", &format!("Bearer {token}"))])
            .await
    }

    /// Decisions of the rule counted in `tollgate_policy_decisions_total` with `outcome`.
    pub fn decided(&self, outcome: Outcome) -> u64 {
        let m = self.metrics.as_ref().expect("an AuthPolicy rule's metrics");
        m.policy_decisions()
            .count("default/authz", "authorization.check", outcome)
    }

    /// Checks of outcome `outcome` the policy counted.
    pub fn counted(&self, outcome: &'static str) -> u64 {
        let m = self.metrics.as_ref().expect("an AuthPolicy rule's metrics");
        m.auth().external_count("http", outcome)
    }
}
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

/// The filter's HTTP form without `allowedResponseHeaders`, as the compiler emits it: every
/// header of the answer goes upstream, and only a 200 allows.
pub fn filter_rule() -> ExternalAuthz {
    let mut r = http_rule(2_000, false, None);
    r.protocol = ExternalProtocol::Http(HttpCheck {
        path_prefix: "/check".into(),
        headers_to_upstream: vec![],
        headers_to_client: vec![],
        all_headers_to_upstream: true,
        allow: AllowStatus::Only200,
    });
    r.forward_headers = vec!["authorization".into()];
    r
}
