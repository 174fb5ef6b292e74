//! The push server's sockets. In: a bound TCP listener, the [`ServerTls`] material and the
//! shared [`State`]. Out: one task per connection (TLS handshake with a required client
//! certificate, then HTTP/2) and one session per `POST /v1/tables` stream that forwards
//! frames from the Gateway's watch channel and feeds ACK/NACK lines back into the state.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame as BodyFrame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tollgate_api::ObjectKey;

use super::pki::{self, ServerTls};
use super::{PushError, State};

/// Limit for a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest ACK/NACK line accepted.
const MAX_ACK_LINE: usize = 64 * 1024;
/// HTTP/2 windows: tables can be several MB.
const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
const CONN_WINDOW: u32 = 8 * 1024 * 1024;

type RespBody = BoxBody<Bytes, Infallible>;

/// The running server.
#[derive(Debug)]
pub(crate) struct Handle {
    pub local_addr: SocketAddr,
    config: Arc<Mutex<Arc<ServerConfig>>>,
    /// `true` once shut down; level-triggered so no session can miss it.
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Handle {
    /// The last clone of the server gone: stop like [`Handle::shutdown`].
    fn drop(&mut self) {
        self.stop.send_replace(true);
        self.task.abort();
    }
}

/// Builds the rustls config: TLS 1.3/1.2, ALPN h2 only, client certificate required.
pub(crate) fn server_config(tls: &ServerTls) -> Result<Arc<ServerConfig>, PushError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in pki::parse_certs(&tls.ca_pem).map_err(PushError::Tls)? {
        roots
            .add(ca)
            .map_err(|e| PushError::Tls(format!("client CA: {e}")))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| PushError::Tls(format!("client verifier: {e}")))?;
    let chain = pki::parse_certs(&tls.cert_pem).map_err(PushError::Tls)?;
    let key = pki::parse_key(&tls.key_pem).map_err(PushError::Tls)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| PushError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| PushError::Tls(format!("server certificate: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

impl Handle {
    pub(crate) async fn start(
        addr: SocketAddr,
        tls: &ServerTls,
        state: Arc<State>,
        options: super::PushOptions,
    ) -> Result<Self, PushError> {
        let config = Arc::new(Mutex::new(server_config(tls)?));
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| PushError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| PushError::Bind { addr, source })?;
        let stop = watch::channel(false).0;
        let task = tokio::spawn(accept_loop(
            listener,
            config.clone(),
            state,
            stop.subscribe(),
            options,
        ));
        tracing::info!(%local_addr, "push server listening");
        Ok(Self {
            local_addr,
            config,
            stop,
            task,
        })
    }

    pub(crate) fn set_tls(&self, tls: &ServerTls) -> Result<(), PushError> {
        let fresh = server_config(tls)?;
        *self
            .config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
        Ok(())
    }

    pub(crate) fn shutdown(&self) {
        self.stop.send_replace(true);
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    config: Arc<Mutex<Arc<ServerConfig>>>,
    state: Arc<State>,
    stop: watch::Receiver<bool>,
    options: super::PushOptions,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "push accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = TlsAcceptor::from(
            config
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        );
        let (state, stop) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::info!(%peer, error = %e, "push TLS handshake refused");
                    return;
                }
                Err(_) => {
                    tracing::info!(%peer, "push TLS handshake timed out");
                    return;
                }
            };
            let identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|leaf| pki::common_name(leaf.as_ref()));
            let mut conn_stop = stop.clone();
            let svc = service_fn(move |req| {
                let (state, stop, identity) = (state.clone(), stop.clone(), identity.clone());
                async move { Ok::<_, Infallible>(handle(req, peer, identity.as_deref(), state, stop)) }
            });
            let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            builder
                .timer(TokioTimer::new())
                .keep_alive_interval(options.keepalive_interval)
                .keep_alive_timeout(options.keepalive_timeout)
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONN_WINDOW)
                .max_concurrent_streams(16);
            let conn = builder.serve_connection(TokioIo::new(tls), svc);
            tokio::select! {
                outcome = conn => {
                    if let Err(e) = outcome {
                        tracing::debug!(%peer, error = %e, "push connection ended");
                    }
                }
                // Shut down: drop the connection (closes the socket).
                _ = conn_stop.wait_for(|stopped| *stopped) => {}
            }
        });
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<RespBody> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    *r.status_mut() = status;
    r
}

/// Parses `gateway=NS/NAME&proxy=ID`.
fn parse_query(query: Option<&str>) -> Option<(ObjectKey, Option<String>)> {
    let mut gateway = None;
    let mut proxy = None;
    for pair in query?.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v)?;
        match k {
            "gateway" => gateway = Some(v),
            "proxy" if !v.is_empty() => proxy = Some(v),
            _ => {}
        }
    }
    let (ns, name) = gateway?
        .split_once('/')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))?;
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return None;
    }
    Some((ObjectKey::new(ns, name), proxy))
}

/// Decodes `%XX` escapes (and `+` as space); `None` on malformed input.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    identity: Option<&str>,
    state: Arc<State>,
    stop: watch::Receiver<bool>,
) -> Response<RespBody> {
    if req.uri().path() != "/v1/tables" {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let Some((gateway, id)) = parse_query(req.uri().query()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "query must be gateway=NAMESPACE/NAME[&proxy=ID]\n",
        );
    };
    if identity != Some(pki::proxy_identity(&gateway.namespace, &gateway.name).as_str()) {
        tracing::warn!(%peer, %gateway, ?identity, "push stream refused: certificate names another Gateway");
        return text(
            StatusCode::FORBIDDEN,
            "client certificate is not for this Gateway\n",
        );
    }
    if !*state.accepting.borrow() {
        let mut resp = text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this controller replica does not serve proxies (not the leader); retry\n",
        );
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        return resp;
    }
    let id = id.unwrap_or_else(|| peer.to_string());
    let reg = state.register(&gateway, id.clone());
    tracing::info!(%gateway, proxy = %id, %peer, "proxy connected");
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(session(state, gateway, id, reg, req.into_body(), tx, stop));
    let mut resp = Response::new(ChannelBody { rx }.boxed());
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-ndjson"),
    );
    resp
}

/// Unregisters a stream when its session ends, however it ends.
struct Registered {
    state: Arc<State>,
    gateway: ObjectKey,
    id: String,
    conn: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.state.unregister(&self.gateway, self.conn);
        tracing::info!(gateway = %self.gateway, proxy = %self.id, "proxy disconnected");
    }
}

/// An ACK or NACK line from a proxy.
#[derive(serde::Deserialize)]
struct Ack {
    version: u64,
    ack: bool,
    #[serde(default)]
    error: Option<String>,
}

async fn session(
    state: Arc<State>,
    gateway: ObjectKey,
    id: String,
    reg: super::Registration,
    mut body: Incoming,
    tx: mpsc::Sender<Bytes>,
    mut stop: watch::Receiver<bool>,
) {
    let super::Registration {
        conn,
        mut frames,
        kill,
    } = reg;
    let _registered = Registered {
        state: state.clone(),
        gateway: gateway.clone(),
        id: id.clone(),
        conn,
    };
    let mut accepting = state.accepting.subscribe();
    // The current frame is due at once, if there is one.
    let mut pending = frames.borrow_and_update().clone();
    let mut sent = 0u64;
    let mut acks = BytesMut::new();
    loop {
        tokio::select! {
            permit = tx.reserve(), if pending.is_some() => {
                let Ok(permit) = permit else { return };
                if let Some(frame) = pending.take()
                    && frame.version > sent {
                    sent = frame.version;
                    permit.send(frame.bytes.clone());
                }
            }
            changed = frames.changed() => {
                if changed.is_err() {
                    return; // Gateway removed.
                }
                pending = frames.borrow_and_update().clone();
            }
            frame = body.frame() => {
                let Some(Ok(frame)) = frame else { return };
                let Ok(data) = frame.into_data() else { continue };
                acks.extend_from_slice(&data);
                while let Some(pos) = acks.iter().position(|b| *b == b'\n') {
                    let line = acks.split_to(pos + 1);
                    match serde_json::from_slice::<Ack>(&line[..pos]) {
                        Ok(a) => {
                            if a.ack {
                                tracing::debug!(%gateway, proxy = %id, version = a.version, "ACK");
                                state.report(&gateway, conn, a.version, None);
                            } else {
                                let e = a.error.unwrap_or_default();
                                tracing::warn!(%gateway, proxy = %id, version = a.version, error = %e, "NACK");
                                state.report(&gateway, conn, a.version, Some(e));
                            }
                        }
                        Err(e) => tracing::warn!(%gateway, proxy = %id, error = %e, "malformed ACK line ignored"),
                    }
                }
                if acks.len() > MAX_ACK_LINE {
                    tracing::warn!(%gateway, proxy = %id, "ACK line too long; closing the stream");
                    return;
                }
            }
            () = kill.notified() => return,
            _ = stop.wait_for(|stopped| *stopped) => return,
            _ = accepting.wait_for(|a| !*a) => {
                tracing::info!(%gateway, proxy = %id, "ending the stream: this replica no longer serves proxies");
                return;
            }
            () = tx.closed() => return,
        }
    }
}

/// A streaming response body fed by a channel.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(BodyFrame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parses_gateway_and_proxy() {
        let (gw, id) = parse_query(Some("gateway=ns%2Fgw&proxy=pod-1")).unwrap();
        assert_eq!(gw, ObjectKey::new("ns", "gw"));
        assert_eq!(id.as_deref(), Some("pod-1"));
        let (gw, id) = parse_query(Some("proxy=&gateway=a/b")).unwrap();
        assert_eq!((gw, id), (ObjectKey::new("a", "b"), None));
        assert!(parse_query(Some("gateway=nons")).is_none());
        assert!(parse_query(Some("gateway=/x")).is_none());
        assert!(parse_query(Some("gateway=a/b/c")).is_none());
        assert!(parse_query(Some("gateway=a%zz/b")).is_none());
        assert!(parse_query(None).is_none());
    }
}
