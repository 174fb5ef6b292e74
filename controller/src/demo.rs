//! A tiny echo backend for the quickstart and for tests of `tollgate run`.
//!
//! In: HTTP/1.1 or HTTP/2 (prior knowledge) requests on one socket. Out: a JSON document
//! describing the request as the backend saw it (method, path, host, headers) and the
//! backend's name, so a user can see what the gateway forwarded and where.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// Binds `addr` and serves the echo backend until the task is dropped.
/// Returns the bound address (useful with port 0) and the serving task.
pub async fn spawn(
    addr: SocketAddr,
    name: &str,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let name: Arc<str> = Arc::from(name);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let name = name.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| echo(req, name.clone(), peer));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((local, task))
}

async fn echo(
    req: Request<Incoming>,
    name: Arc<str>,
    peer: SocketAddr,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let doc = serde_json::json!({
        "backend": &*name,
        "method": parts.method.as_str(),
        "path": parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        "host": host,
        "protocol": format!("{:?}", parts.version),
        "headers": headers,
        "bodyBytes": body.len(),
        "peer": peer.to_string(),
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
