//! Stream ports: TLS (Gateway API protocol `TLS`, TLSRoutes) and TCP (protocol `TCP`,
//! TCPRoutes). In: an accepted TCP connection on a
//! [`Protocol::Tls`](tollgate_api::Protocol::Tls) port and the port's [`crate::downstream::tls::TlsPort`], or on a
//! [`Protocol::Tcp`](tollgate_api::Protocol::Tcp) port. Out: the connection copied both ways
//! to one endpoint of the route its SNI selects (TLS) or of the port's route (TCP:
//! [`serve_tcp`], steps 2 and 3 below without a name, counted in
//! `tollgate_tcp_connections_total` and `tollgate_tcp_connections_active`).
//!
//! Per connection:
//!
//! 1. The ClientHello is buffered (at most [`MAX_CLIENT_HELLO`] bytes, within
//!    [`HELLO_TIMEOUT`]) and its SNI read by [`sni::parse`], nothing consumed.
//! 2. The SNI picks the listener and virtual host by the same rules as Host on HTTP ports
//!    ([`crate::lifecycle::router::Router::route`]); no SNI is served only by a listener without a
//!    hostname whose routes take any name. The first route there names weighted backends;
//!    one is chosen by weight, then an endpoint by the backend's balancer.
//! 3. A passthrough listener connects to the endpoint, replays the buffered bytes and copies
//!    both ways: the client's TLS ends at the backend. Any other listener terminates TLS here
//!    with its certificates (chosen by SNI among the port's terminating listeners, no ALPN),
//!    then connects and copies the plaintext.
//!
//! A connection nothing serves (malformed or oversized ClientHello, an SNI no route takes, a
//! backend without endpoints, a failed connect or handshake) is closed: a TLS client cannot
//! be answered 404 or 503 before a handshake. Every such close is logged at debug level with
//! its reason and counted in `tollgate_tls_connections_total` by outcome. A stream with no
//! byte in either direction for [`ProxyOptions::stream_idle_timeout`](crate::ProxyOptions)
//! is closed (outcome `idle`). Stopping the listener (port removed, shutdown) closes its open
//! streams.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{HeaderMap, Method};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::downstream::conn::ConnCtx;
use crate::downstream::sni::{self, MAX_CLIENT_HELLO, Sni};
use crate::error::Result;
use crate::metrics::StreamOutcome;
use crate::state::{PortState, Shared};
use crate::upstream::pick_weighted;

/// How long a client may take to send its ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS handshake (terminating listeners) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to an endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Each direction's copy buffer: larger than tokio's 8 KiB default, so a bulk stream takes
/// fewer reads and writes per byte (`e2e/bench/tcp.sh`), at twice this per open stream.
const COPY_BUFFER: usize = 32 * 1024;

/// Serves one connection of a TLS port until either side closes or `stop` fires.
pub(crate) async fn serve<C: crate::upgrade::Io>(
    shared: &Arc<Shared>,
    mut client: C,
    conn: ConnCtx,
    mut stop: watch::Receiver<bool>,
) {
    let idle = shared.limits.stream_idle_timeout;
    let outcome = tokio::select! {
        o = serve_inner(shared, &mut client, &conn, idle) => o,
        _ = stop.changed() => Outcome::closed(StreamOutcome::Stopped, "listener stopped"),
    };
    shared.metrics.tls_connection(outcome.kind);
    if let Some(why) = outcome.why {
        tracing::debug!(peer = %conn.peer, port = conn.table_port, reason = %why, "TLS connection closed");
    }
}

/// How a connection ended, and why when it was not served.
pub(crate) struct Outcome {
    pub kind: StreamOutcome,
    pub why: Option<String>,
}

impl Outcome {
    fn closed(kind: StreamOutcome, why: impl Into<String>) -> Self {
        Self {
            kind,
            why: Some(why.into()),
        }
    }
}

async fn serve_inner<C: crate::upgrade::Io>(
    shared: &Arc<Shared>,
    client: &mut C,
    conn: &ConnCtx,
    idle: Duration,
) -> Outcome {
    let mut hello = Vec::with_capacity(2048);
    let sni = match tokio::time::timeout(HELLO_TIMEOUT, read_hello(client, &mut hello)).await {
        Ok(Ok(sni)) => sni,
        Ok(Err(why)) => return Outcome::closed(StreamOutcome::BadHello, why),
        Err(_) => return Outcome::closed(StreamOutcome::BadHello, "no ClientHello in time"),
    };
    // The table live now, after the ClientHello, decides everything: the port's listeners
    // (modes, certificates) and the route come from the same snapshot.
    let name = sni.as_deref().unwrap_or_default();
    let (port, target) = match pick(shared, conn.table_port, name) {
        Ok((PortState::Tls(port), target)) => (port, target),
        Ok(_) => {
            return Outcome::closed(StreamOutcome::NoRoute, "the port is no longer a TLS port");
        }
        Err(outcome) => return outcome,
    };
    let (addr, passthrough) = (target.addr, target.passthrough);

    if passthrough {
        let mut upstream = match connect(addr).await {
            Ok(s) => s,
            Err(e) => return Outcome::closed(StreamOutcome::ConnectFailed, format!("{addr}: {e}")),
        };
        if let Err(e) = upstream.write_all(&hello).await {
            return Outcome::closed(StreamOutcome::ConnectFailed, format!("{addr}: {e}"));
        }
        copy(client, &mut upstream, idle).await
    } else {
        let Some(config) = port.terminate.clone() else {
            return Outcome::closed(StreamOutcome::NoRoute, "no terminating listener");
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        // The ClientHello was read already: hand it to rustls before the handshake reads on.
        // `None`: rustls made no session (the handshake below reports why).
        let mut fed = None;
        let mut accept = acceptor.accept_with(client, |conn| fed = Some(feed(conn, &hello)));
        if let Some(Err(alert)) = fed {
            // Tell the client why, as rustls does for what it reads from the socket itself.
            if let Some(client) = accept.get_mut() {
                let _ = client.write_all(&alert).await;
            }
            return Outcome::closed(
                StreamOutcome::HandshakeFailed,
                "ClientHello refused by rustls",
            );
        }
        let mut tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return Outcome::closed(StreamOutcome::HandshakeFailed, e.to_string()),
            Err(_) => {
                return Outcome::closed(StreamOutcome::HandshakeFailed, "handshake timed out");
            }
        };
        let mut upstream = match connect(addr).await {
            Ok(s) => s,
            Err(e) => return Outcome::closed(StreamOutcome::ConnectFailed, format!("{addr}: {e}")),
        };
        copy(&mut tls, &mut upstream, idle).await
    }
}

/// Where a connection goes: its endpoint, and whether its listener passes TLS through.
pub(crate) struct Target {
    pub addr: std::net::SocketAddr,
    pub passthrough: bool,
}

/// Picks, in the table live now, the state of `table_port` and an endpoint of a backend of
/// the first route `name` (the SNI, or empty) selects on it.
pub(crate) fn pick(
    shared: &Shared,
    table_port: u16,
    name: &str,
) -> std::result::Result<(PortState, Target), Outcome> {
    let Some(snapshot) = shared.snapshot.load_full() else {
        return Err(Outcome::closed(StreamOutcome::NoRoute, "no route table"));
    };
    let Some(port) = snapshot.ports.get(&table_port).cloned() else {
        return Err(Outcome::closed(
            StreamOutcome::NoRoute,
            "the port is no longer served",
        ));
    };
    let empty = HeaderMap::new();
    let Some(found) = snapshot
        .router
        .route(table_port, name, &Method::GET, "/", &empty)
    else {
        return Err(Outcome::closed(
            StreamOutcome::NoRoute,
            format!("no route for name {name:?}"),
        ));
    };
    let passthrough = found.passthrough;
    let backend = pick_weighted(&found.route.api.backends).and_then(|b| b.backend.as_deref());
    let Some(balancer) = backend.and_then(|k| snapshot.backends.get(k)).cloned() else {
        return Err(Outcome::closed(
            StreamOutcome::NoBackend,
            format!("route {} has no usable backend", found.route.label),
        ));
    };
    drop(snapshot);
    let Some(endpoint) = balancer.pick() else {
        return Err(Outcome::closed(
            StreamOutcome::NoBackend,
            "backend has no endpoints",
        ));
    };
    let addr = endpoint.endpoint().addr;
    Ok((port, Target { addr, passthrough }))
}

/// Serves one connection of a TCP port (TCPRoutes) until either side closes or `stop` fires:
/// connects to an endpoint of a backend of the port's first route and copies both ways (a
/// half-close is passed on, so a client may end its request with a FIN and still read the
/// answer).
pub(crate) async fn serve_tcp<C: crate::upgrade::Io>(
    shared: &Arc<Shared>,
    mut client: C,
    conn: ConnCtx,
    mut stop: watch::Receiver<bool>,
) {
    let _open = shared.metrics.tcp_opened();
    let idle = shared.limits.stream_idle_timeout;
    let outcome = tokio::select! {
        o = serve_tcp_inner(shared, &mut client, &conn, idle) => o,
        _ = stop.changed() => Outcome::closed(StreamOutcome::Stopped, "listener stopped"),
    };
    shared.metrics.tcp_connection(outcome.kind);
    if let Some(why) = outcome.why {
        tracing::debug!(peer = %conn.peer, port = conn.table_port, reason = %why, "TCP connection closed");
    }
}

async fn serve_tcp_inner<C: crate::upgrade::Io>(
    shared: &Arc<Shared>,
    client: &mut C,
    conn: &ConnCtx,
    idle: Duration,
) -> Outcome {
    let addr = match pick(shared, conn.table_port, "") {
        Ok((PortState::Tcp, target)) => target.addr,
        Ok(_) => {
            return Outcome::closed(StreamOutcome::NoRoute, "the port is no longer a TCP port");
        }
        Err(outcome) => return outcome,
    };
    let mut upstream = match connect(addr).await {
        Ok(s) => s,
        Err(e) => return Outcome::closed(StreamOutcome::ConnectFailed, format!("{addr}: {e}")),
    };
    copy(client, &mut upstream, idle).await
}

/// Gives rustls the bytes already read from the client and lets it process them (so its
/// answer is queued and the handshake goes on from the socket). When it refuses them: the
/// alert it queued for the client.
fn feed(conn: &mut rustls::ServerConnection, mut bytes: &[u8]) -> Result<(), Vec<u8>> {
    let mut accepted = true;
    while accepted && !bytes.is_empty() {
        accepted = matches!(conn.read_tls(&mut bytes), Ok(n) if n > 0);
    }
    if accepted && conn.process_new_packets().is_ok() {
        return Ok(());
    }
    let mut alert = Vec::new();
    let _ = conn.write_tls(&mut alert);
    Err(alert)
}

async fn connect(addr: std::net::SocketAddr) -> io::Result<TcpStream> {
    let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Copies both ways until either side closes, or nothing was read from either side for `idle`.
async fn copy<A, B>(a: &mut A, b: &mut B, idle: Duration) -> Outcome
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let activity = Activity::new();
    let mut a = Tracked {
        inner: a,
        activity: &activity,
    };
    let mut b = Tracked {
        inner: b,
        activity: &activity,
    };
    let copying =
        tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, COPY_BUFFER, COPY_BUFFER);
    tokio::pin!(copying);
    loop {
        let wait = idle.saturating_sub(activity.quiet_for());
        if wait.is_zero() {
            return Outcome::closed(StreamOutcome::Idle, format!("no traffic for {idle:?}"));
        }
        tokio::select! {
            r = &mut copying => return match r {
                Ok(_) => Outcome {
                    kind: StreamOutcome::Served,
                    why: None,
                },
                // A reset after bytes flowed is how many TLS peers end; it was still served.
                Err(e) => Outcome {
                    kind: StreamOutcome::Served,
                    why: Some(format!("copy ended: {e}")),
                },
            },
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// When a stream last read a byte, in milliseconds since it started.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long since the last byte was read (or since the start).
    fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// A stream that records in [`Activity`] every read that returned bytes.
struct Tracked<'a, S: ?Sized> {
    inner: &'a mut S,
    activity: &'a Activity,
}

impl<S: AsyncRead + Unpin + ?Sized> AsyncRead for Tracked<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut *this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin + ?Sized> AsyncWrite for Tracked<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Reads until `buf` holds a whole ClientHello; returns its SNI (`None` without one).
async fn read_hello<C: crate::upgrade::Io>(
    client: &mut C,
    buf: &mut Vec<u8>,
) -> std::result::Result<Option<String>, String> {
    let mut chunk = [0u8; 4096];
    loop {
        let room = MAX_CLIENT_HELLO.saturating_sub(buf.len()).min(chunk.len());
        if room == 0 {
            return Err(format!("ClientHello over {MAX_CLIENT_HELLO} bytes"));
        }
        let n = client
            .read(&mut chunk[..room])
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before a whole ClientHello".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        // Parse only once the first record is whole: a client trickling its ClientHello a
        // byte at a time must not cost a parse per byte.
        // (Only for a handshake record header; anything else is judged by the parser now.)
        if let [22, 3, _, hi, lo, ..] = buf[..] {
            let record = 5 + usize::from(u16::from_be_bytes([hi, lo]));
            if buf.len() < record && record <= MAX_CLIENT_HELLO {
                continue;
            }
        }
        match sni::parse(buf) {
            Sni::Found(name) => return Ok(Some(name)),
            Sni::Missing => return Ok(None),
            Sni::Incomplete => {}
            Sni::Invalid => return Err("not a TLS ClientHello".into()),
        }
    }
}
