//! The admin server. In: a bound listener, the proxy's [`Metrics`] and a readiness probe.
//! Out: `GET /metrics` (OpenMetrics text), `GET /healthz` (always 200 while serving) and
//! `GET /readyz` (200 when `ready()` says so, else 503). Everything else is 404.

use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::metrics::Metrics;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the admin endpoints on `listener` until the task is dropped.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: impl Fn() -> bool + Send + Sync + 'static,
) -> std::io::Result<()> {
    let ready: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(ready);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let resp = answer(&req, &metrics, ready.as_ref());
                async move { Ok::<_, std::convert::Infallible>(resp) }
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
