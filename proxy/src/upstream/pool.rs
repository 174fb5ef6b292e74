//! HTTP/1.1 upstream connections, pooled per endpoint. In: a request already in origin form
//! (with its Host header) and the endpoint's [`EndpointPool`]. Out: the upstream's response,
//! whose body hands the connection back to the pool once it has been read to the end.
//!
//! Why not hyper-util's pooled client: it checks connections out of one map behind one mutex,
//! keyed by a SipHashed (scheme, authority), and spawns a task per request to wait until the
//! connection is idle again. Here each endpoint owns its idle stack (reached through the
//! endpoint the balancer picked: no key, no hash), the lock is held only for a push or a pop,
//! and the request's own task puts the connection back when the response body ends.
//!
//! Every exchange is the project's own HTTP/1.1 client (module `h1`), run by the request's
//! own task: a bodiless request by its lean exchange, a request with a body, an upgrade or
//! CONNECT by the streaming one (an upgraded connection never comes back). The idle stack is
//! LIFO, so a quiet period leaves the surplus at the bottom, where a sweeper closes what
//! stayed idle through two sweeps (30 to 60 s). A request that a reused connection refused
//! before writing a byte (the upstream closed it while idle) is sent again on another
//! connection (its body, if any, not yet polled). A request that may have been written is
//! sent twice only when it is idempotent, has no body, and the reused connection closed
//! without a byte of answer (the upstream's keep-alive timeout racing it): once more, on a
//! fresh connection. A body, once any of it was polled, is never sent again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::header::UPGRADE;
use http::request::Parts;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::net::TcpStream;
use tollgate_api::backend::Connection;

use crate::lifecycle::body::{BoxError, ProxyBody};
use crate::lifecycle::forward::Added;
use crate::upstream::h1::{self, H1Error, RawBody};
use crate::upstream::io::UpstreamIo;
use crate::upstream::tls::{TlsClient, TlsState};
use crate::upstream::{H2Client, h2c_client};

/// Idle connections kept per endpoint; more are closed when they come back.
const MAX_IDLE_PER_ENDPOINT: usize = 256;
/// How often idle connections are swept; one idle through two sweeps is closed.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// TCP keepalive of upstream connections: probes after this long without traffic...
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// ...every this long...
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ...and this many unanswered end the connection: a backend whose node died without a
/// reset, while a request waits for its answer, fails that request about a minute later
/// instead of holding it until TCP gives up (minutes to hours).
pub(crate) const KEEPALIVE_RETRIES: u32 = 3;
/// Data the backend has not acknowledged for this long ends the connection
/// (`TCP_USER_TIMEOUT`, Linux only): the same for a request still being sent.
#[cfg(target_os = "linux")]
const UNACKED_TIMEOUT: Duration = Duration::from_secs(60);

/// Sets [`KEEPALIVE_IDLE`] and the rest on an upstream socket.
pub(crate) fn dead_peer_detection(stream: &TcpStream, idle: Duration) -> std::io::Result<()> {
    let sock = socket2::SockRef::from(stream);
    sock.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_RETRIES),
    )?;
    #[cfg(target_os = "linux")]
    sock.set_tcp_user_timeout(Some(UNACKED_TIMEOUT))?;
    Ok(())
}

/// How long a TCP connect to an endpoint may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an upstream exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The TCP connect failed or timed out.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The HTTP/2 (h2c) client failed.
    #[error(transparent)]
    H2(#[from] hyper_util::client::legacy::Error),
    /// The HTTP/1.1 exchange (module `h1`) failed after connecting.
    #[error(transparent)]
    H1(#[from] H1Error),
    /// The TLS handshake with a backend failed (module `tls`): untrusted or misnamed
    /// certificate, a client certificate refused, no protocol in common.
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    /// An HTTP/2 exchange over TLS (module `tls`) failed after the request was handed over.
    #[error("upstream HTTP/2: {0}")]
    Http2(hyper::Error),
}

impl UpstreamError {
    /// True when no connection could be made (as opposed to one that failed later).
    pub fn is_connect(&self) -> bool {
        match self {
            Self::Connect(_) | Self::Tls(_) => true,
            Self::H1(_) | Self::Http2(_) => false,
            Self::H2(e) => e.is_connect(),
        }
    }

    /// True when a TLS handshake failed (a connect error too, counted apart).
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }
}

struct Idle<C> {
    conn: C,
    /// Already idle at the last sweep.
    swept: bool,
    /// When it came back (only read when the pool has an idle timeout).
    since: Option<std::time::Instant>,
}

/// Idle connections, the most recently used on top.
type Stack = Vec<Idle<h1::Conn>>;

/// The idle HTTP/1.1 connections to one endpoint address, with one backend's connection
/// settings (BackendPolicy `connection`) and TLS settings, for a TLS backend.
pub(crate) struct EndpointPool {
    addr: SocketAddr,
    idle: Mutex<Stack>,
    settings: Connection,
    /// TLS to the endpoint (module `tls`); `None`: plaintext.
    tls: Option<TlsState>,
    /// An h2c client of the endpoint's own, when `settings` shape its connections (else the
    /// shared one is used); built at the first h2c request, so HTTP/1.1 and TLS endpoints
    /// never carry one.
    h2c: OnceLock<H2Client>,
}

impl std::fmt::Debug for EndpointPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointPool")
            .field("addr", &self.addr)
            .field("idle", &self.lock().len())
            .field("tls", &self.tls)
            .finish()
    }
}

impl EndpointPool {
    fn new(addr: SocketAddr, settings: Connection, tls: Option<Arc<TlsClient>>) -> Self {
        Self {
            addr,
            idle: Mutex::new(Stack::new()),
            h2c: OnceLock::new(),
            settings,
            tls: tls.map(TlsState::new),
        }
    }

    /// The endpoint's own h2c client, when its settings shape connections.
    pub(crate) fn h2c(&self) -> Option<&H2Client> {
        let c = &self.settings;
        let shaped = c.connect_timeout_ms.is_some()
            || c.idle_timeout_ms.is_some()
            || c.tcp_keepalive_idle_ms.is_some();
        shaped.then(|| self.h2c.get_or_init(|| h2c_client(c)))
    }

    /// An idle connection past the pool's idle timeout is closed instead of used.
    fn expired(&self, since: Option<std::time::Instant>) -> bool {
        match (self.settings.idle_timeout_ms, since) {
            (Some(ms), Some(t)) => t.elapsed() >= Duration::from_millis(ms),
            _ => false,
        }
    }

    /// The endpoint's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The TLS settings the pool's connections are made with (`None`: plaintext).
    pub(crate) fn tls_client(&self) -> Option<&Arc<TlsClient>> {
        self.tls.as_ref().map(|t| &t.client)
    }

    /// Takes back a fresh connection (module `tls`, after learning the backend's pick).
    pub(crate) fn reuse_conn(&self, conn: h1::Conn) {
        self.push_raw(conn);
    }

    fn lock(&self) -> MutexGuard<'_, Stack> {
        // Nothing panics while the lock is held; a poisoned stack is still a valid stack.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pop_raw(&self) -> Option<h1::Conn> {
        let mut idle = self.lock();
        while let Some(i) = idle.pop() {
            if !self.expired(i.since) {
                return Some(i.conn);
            }
        }
        None
    }

    /// Takes back a connection whose exchange ended cleanly (unless it served its
    /// `max_requests_per_connection`).
    fn push_raw(&self, mut conn: h1::Conn) {
        conn.exchanges = conn.exchanges.saturating_add(1);
        if self
            .settings
            .max_requests_per_connection
            .is_some_and(|max| conn.exchanges >= max)
        {
            return;
        }
        let since = self
            .settings
            .idle_timeout_ms
            .map(|_| std::time::Instant::now());
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE_PER_ENDPOINT {
            idle.push(Idle {
                conn,
                swept: false,
                since,
            });
        }
    }

    /// Closes connections idle since the previous sweep, past the idle timeout, or closed
    /// by the peer.
    fn sweep(&self) {
        let mut idle = self.lock();
        idle.retain_mut(|i| !i.swept && !self.expired(i.since) && i.conn.is_usable());
        for i in idle.iter_mut() {
            i.swept = true;
        }
    }

    /// Idle connections now (for tests).
    #[cfg(test)]
    pub(crate) fn idle_len(&self) -> usize {
        self.lock().len()
    }

    /// [`Self::send_parts`] of a whole request.
    #[cfg(test)]
    pub async fn send(
        self: &Arc<Self>,
        req: http::Request<ProxyBody>,
        added: &Added<'_>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        self.send_parts(&mut parts, body, added).await
    }

    /// Sends a request on an idle connection, or a fresh one; it must be in origin form
    /// (authority form for CONNECT) and carry a Host header. The parts are borrowed: our
    /// exchange writes the request from them, and the answer takes their field map.
    pub async fn send_parts(
        self: &Arc<Self>,
        parts: &mut Parts,
        body: ProxyBody,
        added: &Added<'_>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        // Boxed: a plaintext request's future does not grow by the TLS exchanges'.
        if let Some(tls) = &self.tls {
            return Box::pin(self.send_tls(tls, parts, body, added)).await;
        }
        self.send_h1(parts, body, added).await
    }

    /// The HTTP/1.1 exchange of [`Self::send_parts`], on this pool's connections.
    pub(crate) async fn send_h1(
        self: &Arc<Self>,
        parts: &mut Parts,
        body: ProxyBody,
        added: &Added<'_>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let upgrade = parts.headers.contains_key(UPGRADE) || parts.method == http::Method::CONNECT;
        if body.is_end_stream() && !upgrade {
            return self.send_bodiless(parts, added).await;
        }
        self.send_streaming(parts, body, added, upgrade).await
    }

    /// [`Self::send`] for a request with a body, an upgrade or CONNECT (module `h1`'s
    /// [`h1::Conn::send`]) on an idle connection, or a fresh one.
    async fn send_streaming(
        self: &Arc<Self>,
        parts: &mut Parts,
        body: ProxyBody,
        added: &Added<'_>,
        upgrade: bool,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let mut out = h1::Outgoing::new(parts, body)?;
        // A body that fails at once (over the limit) fails before any upstream sees its head.
        out.first().await?;
        while let Some(mut conn) = self.pop_raw() {
            // Closed while idle (the peer's keep-alive timeout): try the next one.
            if !conn.is_usable() {
                continue;
            }
            match conn.send(parts, &mut out, added, self, upgrade).await {
                Ok(resp) => return Ok(resp.map(PooledBody::raw)),
                // Not a byte written, what was taken from the body still in `out`: safe to
                // send on a fresh connection.
                Err(H1Error::Unwritten(e)) => {
                    tracing::trace!(error = %e, "reused connection refused the request");
                    break;
                }
                // Written: some of the body went out, so the request is never sent again.
                Err(e) => return Err(e.into()),
            }
        }
        let conn = h1::Conn::new(self.connect_h1().await?);
        Ok(conn
            .send(parts, &mut out, added, self, upgrade)
            .await?
            .map(PooledBody::raw))
    }

    /// [`Self::send`] for a request without a body or upgrade: our own exchange (module
    /// `h1`) on an idle connection, or a fresh one.
    async fn send_bodiless(
        self: &Arc<Self>,
        parts: &mut Parts,
        added: &Added<'_>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        while let Some(mut conn) = self.pop_raw() {
            // Closed while idle (the peer's keep-alive timeout): try the next one.
            if !conn.is_usable() {
                continue;
            }
            match conn.exchange(parts, added, self).await {
                Ok(resp) => return Ok(resp.map(PooledBody::raw)),
                // Not written: safe to send on another connection.
                Err(H1Error::Unwritten(e)) => {
                    tracing::trace!(error = %e, "reused connection refused the request");
                }
                // Written, and the connection closed without a byte of answer: the upstream
                // closed it as the request arrived (its keep-alive timeout). An idempotent
                // request may be sent again (RFC 9110 9.2.2), once, on a fresh connection.
                Err(H1Error::NoAnswer(e)) if parts.method.is_idempotent() => {
                    tracing::debug!(error = %e, "reused connection closed without answering; sending the request again on a fresh connection");
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let conn = h1::Conn::new(self.connect_h1().await?);
        Ok(conn
            .exchange(parts, added, self)
            .await?
            .map(PooledBody::raw))
    }

    /// A fresh connection for HTTP/1.1: TCP, or TLS offering `http/1.1` alone.
    async fn connect_h1(&self) -> Result<UpstreamIo, UpstreamError> {
        if let Some(tls) = &self.tls {
            tls.client.usable()?;
        }
        let tcp = self.connect_tcp().await?;
        match &self.tls {
            None => Ok(UpstreamIo::Plain(tcp)),
            Some(tls) => tls.connect_h1(tcp, self.connect_timeout()).await,
        }
    }

    /// How long a TCP connect, and then a TLS handshake, may take each.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.settings
            .connect_timeout_ms
            .map_or(CONNECT_TIMEOUT, Duration::from_millis)
    }

    /// A TCP connection to the endpoint with the pool's connect timeout and keepalive.
    pub(crate) async fn connect_tcp(&self) -> Result<TcpStream, UpstreamError> {
        let timeout = self.connect_timeout();
        let stream = tokio::time::timeout(timeout, TcpStream::connect(self.addr))
            .await
            .map_err(|_| UpstreamError::Connect(std::io::ErrorKind::TimedOut.into()))?
            .map_err(UpstreamError::Connect)?;
        let _ = stream.set_nodelay(true);
        let idle = self
            .settings
            .tcp_keepalive_idle_ms
            .map_or(KEEPALIVE_IDLE, Duration::from_millis);
        let _ = dead_peer_detection(&stream, idle);
        Ok(stream)
    }
}

/// An upstream response body; for a pooled HTTP/1.1 connection, returns the connection to its
/// pool when the body has been read to the end. A body dropped early (client gone, error)
/// takes its connection with it (a [`RawBody`] drops its socket).
#[derive(Debug)]
pub(crate) struct PooledBody(Inner);

#[derive(Debug)]
enum Inner {
    /// HTTP/2 (h2c): hyper's, with no connection to return.
    Plain(Incoming),
    Raw(RawBody),
}

impl PooledBody {
    fn raw(body: RawBody) -> Self {
        Self(Inner::Raw(body))
    }

    /// The answer's head holds no hop-by-hop field: known only of our own HTTP/1 exchange
    /// ([`RawBody::clean_head`]); false for HTTP/2 answers.
    pub fn clean_head(&self) -> bool {
        matches!(&self.0, Inner::Raw(b) if b.clean_head())
    }

    /// A body with no connection to return (HTTP/2).
    pub fn plain(body: Incoming) -> Self {
        Self(Inner::Plain(body))
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.0 {
            Inner::Raw(b) => Pin::new(b).poll_frame(cx),
            Inner::Plain(b) => Pin::new(b)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Plain(b) => b.is_end_stream(),
            Inner::Raw(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Plain(b) => b.size_hint(),
            Inner::Raw(b) => b.size_hint(),
        }
    }
}

/// Pools by endpoint address and TLS settings, shared by every snapshot and backend naming
/// the address with the same settings, so connections survive table swaps and are never
/// used under other TLS settings (or in plaintext); a pool no endpoint refers to any more is
/// dropped (and its connections closed).
#[derive(Debug, Default)]
pub(crate) struct Pools {
    inner: Arc<Registry>,
}

/// An endpoint's address and the TLS settings its connections are made with.
type PoolKey = (SocketAddr, Connection, Option<Arc<TlsClient>>);

#[derive(Debug, Default)]
struct Registry {
    /// By address, connection settings and TLS settings: backends that share an address but
    /// not their settings keep their connections apart.
    by_addr: Mutex<HashMap<PoolKey, Weak<EndpointPool>>>,
    sweeping: std::sync::atomic::AtomicBool,
}

impl Pools {
    /// The plaintext pool of `addr` ([`Self::pool_with`] without TLS).
    #[cfg(test)]
    pub fn pool_for(&self, addr: SocketAddr, settings: &Connection) -> Arc<EndpointPool> {
        self.pool_with(addr, settings, None)
    }

    /// The pool of `addr` (at table build time, not per request) with `settings`, plaintext
    /// or under `tls`. Starts the sweeper on first use inside a runtime.
    pub fn pool_with(
        &self,
        addr: SocketAddr,
        settings: &Connection,
        tls: Option<Arc<TlsClient>>,
    ) -> Arc<EndpointPool> {
        // Slow start is the balancer's, not the pool's: it splits no pool.
        let settings = Connection {
            slow_start_ms: None,
            ..settings.clone()
        };
        let key = (addr, settings, tls);
        let pool = {
            let mut map = self
                .inner
                .by_addr
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match map.get(&key).and_then(Weak::upgrade) {
                Some(p) => p,
                None => {
                    let p = Arc::new(EndpointPool::new(addr, key.1.clone(), key.2.clone()));
                    map.insert(key, Arc::downgrade(&p));
                    p
                }
            }
        };
        self.start_sweeper();
        pool
    }

    fn start_sweeper(&self) {
        use std::sync::atomic::Ordering;
        if self.inner.sweeping.load(Ordering::Relaxed)
            || tokio::runtime::Handle::try_current().is_err()
            || self.inner.sweeping.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let registry = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                registry.sweep();
            }
        });
    }
}

impl Registry {
    fn sweep(&self) {
        let live: Vec<Arc<EndpointPool>> = {
            let mut map = self.by_addr.lock().unwrap_or_else(PoisonError::into_inner);
            map.retain(|_, p| p.strong_count() > 0);
            map.values().filter_map(Weak::upgrade).collect()
        };
        for p in live {
            p.sweep();
        }
    }
}

/// Takes a request's parts for a client that owns its request (hyper's HTTP/2 client),
/// leaving empty ones.
pub(crate) fn take_parts(parts: &mut Parts) -> Parts {
    std::mem::replace(parts, http::Request::new(()).into_parts().0)
}

impl h1::Reuse for EndpointPool {
    fn reuse(&self, conn: h1::Conn) {
        self.push_raw(conn);
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
