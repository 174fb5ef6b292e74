//! The admin server. In: a bound listener, the proxy's [`Metrics`], a readiness probe and,
//! with [`serve_admin_with`], the proxies `/debug/explain` may explain. Out: `GET /metrics`
//! (OpenMetrics text), `GET /healthz` (always 200 while serving), `GET /readyz` (200 when
//! `ready()` says so, else 503) and `GET /debug/explain?host=..&path=..` (the
//! [`crate::explain::Explanation`] of a request on the live table, as JSON). Everything else
//! is 404.
//!
//! `/debug/explain` shows routes, policies and endpoints, so it answers only callers on
//! loopback (on a pod: `kubectl port-forward`), unless a token is configured: then every
//! caller must send `Authorization: Bearer <token>`, compared in constant time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::Proxy;
use crate::explain::ExplainRequest;
use crate::metrics::Metrics;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/debug/explain` may explain and who may ask.
#[derive(Clone, Default)]
pub struct ExplainAccess {
    /// The proxies by Gateway (`namespace/name`); `tollgate run` updates it as Gateways come
    /// and go.
    pub proxies: Arc<RwLock<BTreeMap<String, Proxy>>>,
    /// The bearer token callers must send; `None`: loopback callers only, without one.
    /// `POST /cache/purge` is refused without one.
    pub token: Option<Arc<str>>,
    /// The shared cache `POST /cache/purge` empties (module `admin_purge`).
    pub cache: Option<Arc<crate::HttpCache>>,
}

/// Why an admin token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    /// It cannot be read.
    #[error("--admin-token-file {path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It holds no token.
    #[error("--admin-token-file {0}: empty")]
    Empty(std::path::PathBuf),
}

/// The token in `path` (surrounding whitespace dropped); an empty file is an error, never
/// an empty token every caller would match.
pub fn read_admin_token(path: &std::path::Path) -> Result<Arc<str>, AdminTokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| AdminTokenError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(AdminTokenError::Empty(path.to_path_buf()));
    }
    Ok(token.into())
}

/// Serves the admin endpoints on `listener` until the task is dropped (`/debug/explain`
/// answers 404: nothing to explain).
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: impl Fn() -> bool + Send + Sync + 'static,
) -> std::io::Result<()> {
    serve_admin_with(listener, metrics, ready, ExplainAccess::default()).await
}

/// [`serve_admin`], with `/debug/explain` over `explain`'s proxies.
pub async fn serve_admin_with(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: impl Fn() -> bool + Send + Sync + 'static,
    explain: ExplainAccess,
) -> std::io::Result<()> {
    let ready: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(ready);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        let explain = explain.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let path = req.uri().path();
                let resp = if path == "/debug/explain" || path == "/cache/purge" {
                    Err((req, explain.clone()))
                } else {
                    Ok(answer(&req, &metrics, ready.as_ref()))
                };
                async move {
                    Ok::<_, std::convert::Infallible>(match resp {
                        Ok(r) => r,
                        Err((req, access)) if req.uri().path() == "/cache/purge" => {
                            crate::admin_purge::purge(
                                req,
                                access.cache.as_ref(),
                                access.token.as_deref(),
                            )
                            .await
                        }
                        Err((req, access)) => debug_explain(&req, peer, &access).await,
                    })
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn answer(
    req: &Request<Incoming>,
    metrics: &Metrics,
    ready: &(dyn Fn() -> bool + Send + Sync),
) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = code;
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(metrics.encode())));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn plain(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// `GET /debug/explain?gateway=&method=&host=&path=&header=name:value&source_ip=&listener=&port=`.
async fn debug_explain(
    req: &Request<Incoming>,
    peer: SocketAddr,
    access: &ExplainAccess,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        );
    }
    if !allowed(req.headers(), peer, access.token.as_deref()) {
        return plain(
            StatusCode::FORBIDDEN,
            "forbidden: /debug/explain answers loopback callers, or a configured token\n".into(),
        );
    }
    let mut er = ExplainRequest::default();
    let mut gateway = None;
    for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes()) {
        match &*k {
            "gateway" => gateway = Some(v.into_owned()),
            "method" => er.method = v.into_owned(),
            "host" => er.host = v.into_owned(),
            "path" => er.path = v.into_owned(),
            "listener" => er.listener = Some(v.into_owned()),
            "header" => match v.split_once(':') {
                Some((n, val)) => er.headers.push((n.trim().into(), val.trim().into())),
                None => {
                    return plain(
                        StatusCode::BAD_REQUEST,
                        format!("header {v:?}: expected name:value\n"),
                    );
                }
            },
            "port" => match v.parse() {
                Ok(p) => er.port = Some(p),
                Err(_) => return plain(StatusCode::BAD_REQUEST, format!("port {v:?}\n")),
            },
            "source_ip" => match v.parse() {
                Ok(ip) => er.source_ip = Some(ip),
                Err(_) => return plain(StatusCode::BAD_REQUEST, format!("source_ip {v:?}\n")),
            },
            other => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!("unknown parameter {other:?}\n"),
                );
            }
        }
    }
    let proxy = {
        let proxies = match access.proxies.read() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        match (&gateway, proxies.len()) {
            (Some(g), _) => proxies.get(g).cloned(),
            (None, 1) => proxies.values().next().cloned(),
            (None, 0) => None,
            (None, _) => {
                let names: Vec<&str> = proxies.keys().map(String::as_str).collect();
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "several Gateways ({}): name one with gateway=\n",
                        names.join(", ")
                    ),
                );
            }
        }
    };
    let Some(proxy) = proxy else {
        return plain(
            StatusCode::NOT_FOUND,
            "no such Gateway served here\n".into(),
        );
    };
    match proxy.explain(&er).await {
        None => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "no route table yet\n".into(),
        ),
        Some(Err(e)) => plain(StatusCode::BAD_REQUEST, format!("{e}\n")),
        Some(Ok(e)) => match serde_json::to_vec_pretty(&e) {
            Ok(body) => {
                let mut r = Response::new(Full::new(Bytes::from(body)));
                r.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r
            }
            Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        },
    }
}

/// A caller may ask: with a token, by sending it (constant-time compare); without, from
/// loopback only.
fn allowed(headers: &http::HeaderMap, peer: SocketAddr, token: Option<&str>) -> bool {
    match token {
        Some(token) => headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|sent| {
                use subtle::ConstantTimeEq;
                bool::from(sent.as_bytes().ct_eq(token.as_bytes()))
            }),
        None => peer.ip().to_canonical().is_loopback(),
    }
}

#[cfg(test)]
mod tests {
    use super::allowed;

    fn bearer(token: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}")
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        h
    }

    #[test]
    fn without_a_token_only_loopback_callers_are_answered() {
        let none = http::HeaderMap::new();
        for peer in ["127.0.0.1:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
            assert!(
                allowed(&none, peer.parse().unwrap_or_else(|_| unreachable!()), None),
                "{peer}"
            );
        }
        for peer in ["10.0.0.1:5000", "[2001:db8::1]:5000", "192.168.1.2:1"] {
            let peer = peer.parse().unwrap_or_else(|_| unreachable!());
            assert!(!allowed(&none, peer, None), "{peer}");
            assert!(!allowed(&bearer("anything"), peer, None), "{peer}");
        }
    }

    #[test]
    fn with_a_token_every_caller_must_send_it() {
        let remote = "10.0.0.1:5000".parse().unwrap_or_else(|_| unreachable!());
        let local = "127.0.0.1:5000".parse().unwrap_or_else(|_| unreachable!());
        assert!(allowed(&bearer("s3cret"), remote, Some("s3cret")));
        assert!(!allowed(&bearer("s3cre"), remote, Some("s3cret")));
        assert!(!allowed(&bearer("s3cret-and-more"), remote, Some("s3cret")));
        assert!(!allowed(&http::HeaderMap::new(), local, Some("s3cret")));
        let mut basic = http::HeaderMap::new();
        basic.insert(
            http::header::AUTHORIZATION,
            "Basic s3cret".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert!(!allowed(&basic, remote, Some("s3cret")));
    }
}
