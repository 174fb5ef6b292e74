//! `kubectl logs`: the kubelet's `/containerLogs/{namespace}/{pod}/{container}` endpoint,
//! served over HTTPS on the bridge address (the API server connects to the Node's InternalIP
//! at `status.daemonEndpoints.kubeletEndpoint.Port` and, without
//! `--kubelet-certificate-authority`, does not verify the certificate: a self-signed one
//! made at start-up). Supports `tailLines`, `limitBytes` and `follow`; no authentication
//! (the address is only reachable from the host and its pods).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result, io};

/// (namespace, pod name) -> the pod's logs directory, kept by the pod loop.
pub type LogIndex = Arc<RwLock<HashMap<(String, String), PathBuf>>>;

type Body = BoxBody<Bytes, Infallible>;

fn tls_config(ip: &str) -> Result<Arc<ServerConfig>> {
    let tls = |e: String| Error::Pod(format!("kubelet endpoint certificate: {e}"));
    let cert =
        rcgen::generate_simple_self_signed(vec![ip.to_owned()]).map_err(|e| tls(e.to_string()))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
    let chain = vec![CertificateDer::from(cert.cert.der().to_vec())];
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| tls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub async fn serve(addr: SocketAddr, index: LogIndex) -> Result<()> {
    let acceptor = TlsAcceptor::from(tls_config(&addr.ip().to_string())?);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(io(format!("listening on {addr}")))?;
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, index) = (acceptor.clone(), index.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = hyper::service::service_fn(move |req| {
                let index = index.clone();
                async move { Ok::<_, Infallible>(handle(req, index).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}

fn text(code: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(msg)).boxed());
    *r.status_mut() = code;
    r
}

fn query(req: &Request<Incoming>, key: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| v.to_owned())
    })
}

/// The last `n` lines of `data`.
pub fn tail(data: &[u8], n: usize) -> &[u8] {
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let start = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(n.saturating_sub(1))
        .map(|(i, _)| i + 1)
        .unwrap_or(0);
    if n == 0 {
        &data[data.len()..]
    } else {
        &data[start..]
    }
}

async fn handle(req: Request<Incoming>, index: LogIndex) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["containerLogs", ns, pod, container] = parts.as_slice() else {
        return text(
            StatusCode::NOT_FOUND,
            format!("{path}: only /containerLogs/NS/POD/CONTAINER is served\n"),
        );
    };
    let key = (ns.to_string(), pod.to_string());
    let Some(dir) = index.read().ok().and_then(|m| m.get(&key).cloned()) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} does not run on this node\n"),
        );
    };
    let file = dir.join(format!("{container}.log"));
    let data = match tokio::fs::read(&file).await {
        Ok(d) => d,
        Err(e) => {
            return text(
                StatusCode::NOT_FOUND,
                format!("container {container}: {e}\n"),
            );
        }
    };
    let mut out: Vec<u8> = match query(&req, "tailLines").and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => tail(&data, n).to_vec(),
        None => data.clone(),
    };
    if let Some(limit) = query(&req, "limitBytes").and_then(|n| n.parse::<usize>().ok()) {
        out.truncate(limit);
    }
    if query(&req, "follow").as_deref() != Some("true") {
        return Response::new(Full::new(Bytes::from(out)).boxed());
    }
    // Follow: what is there, then whatever is appended, until the pod stops on this node.
    let state = (Some(Bytes::from(out)), data.len() as u64, file, index, key);
    let stream =
        futures_util::stream::unfold(state, |(first, mut offset, file, index, key)| async move {
            if let Some(b) = first {
                return Some((
                    Ok::<_, Infallible>(Frame::data(b)),
                    (None, offset, file, index, key),
                ));
            }
            loop {
                if index.read().map(|m| !m.contains_key(&key)).unwrap_or(true) {
                    return None;
                }
                if let Ok(mut f) = tokio::fs::File::open(&file).await
                    && f.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
                {
                    let mut buf = Vec::new();
                    if f.read_to_end(&mut buf).await.is_ok() && !buf.is_empty() {
                        offset += buf.len() as u64;
                        return Some((
                            Ok(Frame::data(Bytes::from(buf))),
                            (None, offset, file, index, key),
                        ));
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    Response::new(StreamBody::new(stream).boxed())
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_lines() {
        assert_eq!(tail(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(tail(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(tail(b"a\nb\n", 0), b"");
    }
}
