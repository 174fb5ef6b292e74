//! A tiny echo backend for the quickstart and for tests of `tollgate run`.
//!
//! In: HTTP/1.1 or HTTP/2 (prior knowledge) requests on one socket. Out: a JSON document
//! describing the request as the backend saw it (method, path, host, headers) and the
//! backend's name, so a user can see what the gateway forwarded and where.
//!
//! `POST /introspect` is answered instead by a DEMO token introspection endpoint
//! ([`introspect`]), so that examples/introspection needs nothing but `tollgate run`; any
//! request under `/authz/` by a DEMO external authorization service ([`authz`]), for
//! examples/ext-authz.
//!
//! The same port number answers UDP too (examples/udp): each datagram gets a JSON document
//! with the backend's name, the sender's address and the datagram's text. When that UDP port
//! cannot be bound, the HTTP backend runs alone (a warning says so).

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
use tokio::net::{TcpListener, UdpSocket};

pub mod authz;
pub mod introspect;

/// Binds `addr` and serves the echo backend until the task is dropped.
/// Returns the bound address (useful with port 0) and the serving task.
pub async fn spawn(
    addr: SocketAddr,
    name: &str,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let name: Arc<str> = Arc::from(name);
    let udp = match UdpSocket::bind(local).await {
        Ok(socket) => Some(socket),
        Err(e) => {
            tracing::warn!(address = %local, error = %e, "demo backend: no UDP echo on this port");
            None
        }
    };
    let udp_name = name.clone();
    let task = tokio::spawn(async move {
        if let Some(socket) = udp {
            tokio::spawn(udp_echo(socket, udp_name));
        }
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

/// Answers each datagram with a JSON document: the backend's name, the sender, the text.
async fn udp_echo(socket: UdpSocket, name: Arc<str>) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let answer = serde_json::json!({
            "backend": &*name,
            "protocol": "UDP",
            "peer": peer.to_string(),
            "bytes": n,
            "text": String::from_utf8_lossy(&buf[..n]),
        });
        let mut out = serde_json::to_vec_pretty(&answer).unwrap_or_default();
        out.push(b'\n');
        let _ = socket.send_to(&out, peer).await;
    }
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
    if parts.method == http::Method::POST && parts.uri.path() == introspect::PATH {
        return Ok(introspection(&parts, &body));
    }
    if parts.uri.path().starts_with(authz::PREFIX) {
        let (status, headers, body) = authz::answer(
            parts.uri.path(),
            parts
                .headers
                .get(http::header::AUTHORIZATION)
                .map(http::HeaderValue::as_bytes),
        );
        let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *resp.status_mut() = status;
        for (k, v) in headers {
            resp.headers_mut()
                .insert(k, http::HeaderValue::from_static(v));
        }
        return Ok(resp);
    }
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
    Ok(json_response(http::StatusCode::OK, &doc))
}

/// The demo introspection endpoint's answer to `POST /introspect`.
fn introspection(parts: &http::request::Parts, body: &[u8]) -> Response<Full<Bytes>> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let authorization = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes);
    let (status, doc) = introspect::answer(authorization, body, now);
    let mut resp = json_response(status, &doc);
    if status == http::StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Basic realm=\"demo-introspection\""),
        );
    }
    resp
}

fn json_response(status: http::StatusCode, doc: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut text = serde_json::to_string_pretty(doc).unwrap_or_default();
    text.push('\n');
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// One HTTP/1.1 exchange with the backend at `addr`; the raw response.
    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    fn post(path: &str, authorization: &str, body: &str) -> String {
        format!(
            "POST {path} HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\
             Authorization: {authorization}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn post_introspect_is_answered_by_the_demo_endpoint_and_the_rest_echoed() {
        use base64::Engine as _;
        let (addr, task) = spawn("127.0.0.1:0".parse().unwrap(), "t").await.unwrap();
        let good = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("demo-client:demo-secret")
        );

        let ok = exchange(addr, &post("/introspect", &good, "token=demo-token-alice")).await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("\"sub\": \"alice\""), "{ok}");

        let refused = exchange(addr, &post("/introspect", "Basic eDp5", "token=x")).await;
        assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
        assert!(
            refused
                .to_ascii_lowercase()
                .contains("www-authenticate: basic realm=\"demo-introspection\""),
            "{refused}"
        );

        // Any other request, a GET of the same path included, is echoed.
        let echoed = exchange(
            addr,
            "GET /introspect HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(echoed.contains("\"backend\": \"t\""), "{echoed}");
        task.abort();
    }
}
