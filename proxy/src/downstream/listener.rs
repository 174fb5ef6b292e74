//! Sockets and connections. In: a bound [`TcpListener`] for one table port. Out: an accept
//! loop that serves HTTP/1 with our own server, [`crate::downstream::h1serve`] (plain ports, and HTTPS
//! ports behind rustls when ALPN chose `http/1.1` or nothing), and HTTP/2 with hyper's
//! server, here (ALPN `h2`, and the h2c preface `h1serve` hands over); a TLS (TLSRoute)
//! port hands each connection to [`crate::downstream::stream`].
//! Each connection's [`ConnCtx`] carries its client certificate (leaf DER) only when the
//! port validates client certificates and this one verified ([`crate::downstream::tls::PortTls`]).
//!
//! A port whose ClientPolicy asks for the PROXY protocol reads the header first (module
//! `proxy_protocol`): its source becomes the connection's peer, and a connection without a
//! valid one, where it is required, is closed unanswered (`tollgate_proxy_protocol_refused_total`).
//!
//! The TLS config is looked up per connection, so a certificate change applies to new
//! connections without rebinding. Stopping a listener closes its socket and asks its open
//! connections to finish gracefully (in-flight requests complete).
//!
//! Slow and idle clients on hyper's (HTTP/2) connections: HTTP/2 streams past
//! `http2_max_concurrent_streams` are refused by hyper, HTTP/2 requests past
//! `max_upstream_requests_per_connection` wait for a slot (module `inflight`), and a
//! connection with nothing in flight for `http2_idle_timeout` is shut down gracefully
//! (GOAWAY on HTTP/2), as hyper has no idle timeout of its own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::downstream::client_body::ClientBody;
use crate::downstream::conn::ConnCtx;
use crate::downstream::inflight::{HeldBody, InFlight};
use crate::downstream::per_client;
use crate::downstream::proxy_protocol::{self, Header};
use crate::lifecycle::client::ProxyStep;
use crate::lifecycle::service;
use crate::limits::Limits;
use crate::metrics::ClientTimeoutKind;
use crate::state::{PortState, Shared};
use crate::upgrade::Upgraded;
use bytes::Bytes;

/// How long a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a PROXY protocol header may take to arrive, whole.
const PROXY_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A running accept loop.
#[derive(Debug)]
pub(crate) struct ListenerHandle {
    /// The bound address.
    pub local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ListenerHandle {
    /// A handle of a loop started elsewhere (UDP ports: [`crate::downstream::udp`]).
    pub(crate) fn new(
        local_addr: SocketAddr,
        stop: watch::Sender<bool>,
        task: JoinHandle<()>,
    ) -> Self {
        Self {
            local_addr,
            stop,
            task,
        }
    }

    /// Stops accepting (closing the socket) and tells open connections to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Builds the HTTP/2 server once per proxy, from the limits (HTTP/1 is module `h1serve`'s).
pub(crate) fn server_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let max_header_bytes = limits.max_header_bytes;
    let mut b = auto::Builder::new(TokioExecutor::new()).http2_only();
    // Streams past the cap are refused (REFUSED_STREAM: never processed, so clients retry
    // them). hyper has no idle timeout of its own: `serve` closes idle connections.
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX));
    b
}

/// Starts the accept loop for `table_port` on a bound listener.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    listener: TcpListener,
    table_port: u16,
) -> std::io::Result<ListenerHandle> {
    let local_addr = listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(accept_loop(shared, listener, table_port, stop_rx));
    Ok(ListenerHandle {
        local_addr,
        stop,
        task,
    })
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    table_port: u16,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let local_port = stream.local_addr().map_or(table_port, |a| a.port());
                let conn = ConnCtx {
                    peer,
                    local_port,
                    table_port,
                    scheme: "http",
                    peer_value: crate::lifecycle::forward::peer_value(peer.ip()),
                    sni: None,
                    limits: shared.limits,
                    peer_cert: None,
                };
                tokio::spawn(serve_connection(shared.clone(), stream, conn, stop.clone()));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, port = table_port, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    mut stream: TcpStream,
    mut conn: ConnCtx,
    stop: watch::Receiver<bool>,
) {
    let _open = shared.metrics.connection_opened();
    shared.connections.fetch_add(1, Ordering::AcqRel);
    let (port, proxy_protocol) = {
        let snapshot = shared.snapshot.load();
        let s = snapshot.as_deref();
        let client = s.and_then(|s| s.client(conn.table_port));
        if let Some(c) = client {
            conn.limits = shared.limits.with(&c.limits);
        }
        (
            s.and_then(|s| s.ports.get(&conn.table_port).cloned()),
            client
                .and_then(|c| c.proxy_protocol.as_ref())
                .map(|pp| pp.step(conn.peer.ip())),
        )
    };
    match (port, proxy_protocol) {
        // The port left the table between accept and now.
        (None, _) => {}
        (Some(port), None | Some(ProxyStep::Skip)) => {
            serve_socket(&shared, stream, Bytes::new(), conn, port, stop).await;
        }
        (Some(_), Some(ProxyStep::Refuse)) => {
            shared.metrics.proxy_protocol_refused("untrusted_peer");
            tracing::debug!(peer = %conn.peer, port = conn.table_port, "PROXY protocol header required from a peer not in trustedCIDRs");
        }
        (Some(port), Some(ProxyStep::Read { required })) => {
            let timeout = conn.limits.header_read_timeout.min(PROXY_HEADER_TIMEOUT);
            match proxy_protocol::read_header(&mut stream, required, timeout).await {
                Ok((header, rest)) => {
                    if let Some(Header::Proxied { source, .. }) = header {
                        // An IPv4 client written as IPv6 is the IPv4 client.
                        conn.peer = SocketAddr::new(source.ip().to_canonical(), source.port());
                        conn.peer_value = crate::lifecycle::forward::peer_value(conn.peer.ip());
                    }
                    serve_socket(&shared, stream, rest, conn, port, stop).await;
                }
                Err(e) => {
                    shared.metrics.proxy_protocol_refused(e.reason());
                    tracing::debug!(error = %e, peer = %conn.peer, port = conn.table_port, "PROXY protocol header refused");
                }
            }
        }
    }
    done(&shared);
}

/// Serves the socket once the client's address is known: counted against its share of the
/// port when the port limits that (the count travels with the socket, into an upgrade too),
/// with `rest`, bytes read already (past a PROXY header), read again first.
async fn serve_socket(
    shared: &Arc<Shared>,
    stream: TcpStream,
    rest: Bytes,
    conn: ConnCtx,
    port: PortState,
    stop: watch::Receiver<bool>,
) {
    let Some(slot) = admit(shared, &conn) else {
        return;
    };
    match slot {
        Some(slot) => {
            let io = Upgraded::holding(stream, rest, slot);
            dispatch(shared, io, conn, port, stop).await;
        }
        None if rest.is_empty() => dispatch(shared, stream, conn, port, stop).await,
        None => dispatch(shared, Upgraded::new(stream, rest), conn, port, stop).await,
    }
}

/// A connection ends.
fn done(shared: &Shared) {
    if shared.connections.fetch_sub(1, Ordering::AcqRel) == 1 {
        shared.idle.notify_waiters();
    }
}

/// Counts the connection against its client's share of the port, when the port limits it;
/// `None` refuses it (the caller closes it unanswered).
fn admit(shared: &Arc<Shared>, conn: &ConnCtx) -> Option<Option<per_client::Slot>> {
    let Some(max) = conn.limits.max_connections_per_client else {
        return Some(None);
    };
    match shared
        .per_client
        .enter(conn.table_port, conn.peer.ip(), max)
    {
        Some(slot) => Some(Some(slot)),
        None => {
            shared.metrics.connection_refused("per_client_limit");
            tracing::debug!(peer = %conn.peer, port = conn.table_port, max, "too many connections from one client");
            None
        }
    }
}

/// Serves a connection by its port's protocol.
async fn dispatch<I: crate::upgrade::Io>(
    shared: &Arc<Shared>,
    stream: I,
    mut conn: ConnCtx,
    port: PortState,
    stop: watch::Receiver<bool>,
) {
    match port {
        PortState::Http => {
            crate::downstream::h1serve::serve(shared, stream, Arc::new(conn), stop, true).await
        }
        PortState::Tls(_) => crate::downstream::stream::serve(shared, stream, conn, stop).await,
        PortState::Tcp => crate::downstream::stream::serve_tcp(shared, stream, conn, stop).await,
        // UDP ports have no TCP socket; a connection cannot arrive here.
        PortState::Udp => {}
        PortState::Https(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls_stream)) => {
                    conn.scheme = "https";
                    conn.sni = tls_stream.get_ref().1.server_name().map(Arc::from);
                    conn.peer_cert = tls.verified_peer_cert(tls_stream.get_ref().1);
                    let conn = Arc::new(conn);
                    if tls_stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        serve(shared, TokioIo::new(tls_stream), conn, stop).await;
                    } else {
                        // ALPN `http/1.1`, or none: HTTP/1 (no h2c preface over TLS).
                        crate::downstream::h1serve::serve(shared, tls_stream, conn, stop, false)
                            .await;
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, peer = %conn.peer, "TLS handshake failed")
                }
                Err(_) => tracing::debug!(peer = %conn.peer, "TLS handshake timed out"),
            }
        }
    }
}

/// Serves an HTTP/2 connection with hyper's server (ALPN `h2`, or the h2c preface
/// [`crate::downstream::h1serve`] found).
pub(crate) async fn serve<I>(
    shared: &Arc<Shared>,
    io: I,
    conn: Arc<ConnCtx>,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc_shared = shared.clone();
    let conn_limits = conn.limits;
    let inflight = InFlight::new(conn_limits.max_upstream_requests_per_connection);
    let idle_timeout = conn_limits.http2_idle_timeout;
    let svc_inflight = inflight.clone();
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (shared, conn, inflight) = (svc_shared.clone(), conn.clone(), svc_inflight.clone());
        async move {
            // HTTP/2 carries several requests at once: they are capped.
            let held = inflight.enter(true).await;
            let resp = service::handle(shared, conn, req.map(ClientBody::Hyper)).await?;
            Ok::<_, Infallible>(resp.map(|body| HeldBody::new(body, held)))
        }
    });
    // A port whose ClientPolicy changes the HTTP/2 settings gets a server of its own.
    let own;
    let server = if conn_limits.http2_max_concurrent_streams
        == shared.limits.http2_max_concurrent_streams
        && conn_limits.max_header_bytes == shared.limits.max_header_bytes
    {
        &shared.server
    } else {
        own = server_builder(&conn_limits);
        &own
    };
    let c = server.serve_connection(io, svc);
    tokio::pin!(c);
    // The connection until it ends, the listener stops or it stays idle. Not `select!`: that
    // polled the stop signal's waiter (a lock in `Notify`) on every wake-up of the
    // connection, ~320 instructions per request (callgrind). The waiter and the idle timer
    // are polled once per waker (a tokio task keeps its waker), and otherwise a version
    // check and the timer's state tell whether they fired.
    let probe = stop.clone();
    let mut stopped = std::pin::pin!(stop.changed());
    let mut idle = std::pin::pin!(tokio::time::sleep(idle_timeout));
    let mut registered: Option<Waker> = None;
    let ended = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = c.as_mut().poll(cx) {
            return Poll::Ready(End::Done(r));
        }
        if registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            // A closed sender stops the connection too, as `changed` would.
            if probe.has_changed().unwrap_or(true) {
                return Poll::Ready(End::Stop);
            }
            if idle.is_elapsed() && idle_for(&inflight, idle.as_mut(), idle_timeout, cx) {
                return Poll::Ready(End::Idle);
            }
        } else {
            if stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(End::Stop);
            }
            if idle_for(&inflight, idle.as_mut(), idle_timeout, cx) {
                return Poll::Ready(End::Idle);
            }
            registered = Some(cx.waker().clone());
        }
        Poll::Pending
    })
    .await;
    match ended {
        End::Done(Err(e)) => tracing::debug!(error = %e, "connection ended with an error"),
        End::Done(Ok(())) => {}
        End::Stop | End::Idle => {
            if matches!(ended, End::Idle) {
                shared
                    .metrics
                    .client_timeout(ClientTimeoutKind::ConnectionIdle);
            }
            c.as_mut().graceful_shutdown();
            let _ = c.await;
        }
    }
}

/// How [`serve`]'s connection ended.
enum End<E> {
    /// On its own.
    Done(Result<(), E>),
    /// The listener stopped.
    Stop,
    /// Nothing in flight for the idle timeout.
    Idle,
}

/// True once the connection has had nothing in flight for `timeout`; otherwise re-arms
/// `idle` for the earliest instant that can be so (and registers it with `cx`).
fn idle_for(
    inflight: &InFlight,
    mut idle: Pin<&mut tokio::time::Sleep>,
    timeout: Duration,
    cx: &mut std::task::Context<'_>,
) -> bool {
    while idle.as_mut().poll(cx).is_ready() {
        let now = tokio::time::Instant::now();
        match inflight.idle_since() {
            Some(since) if since + timeout <= now => return true,
            Some(since) => idle.as_mut().reset(since + timeout),
            // Busy: nothing to check before a whole timeout from now.
            None => idle.as_mut().reset(now + timeout),
        }
    }
    false
}
