//! Pushing route tables to proxies.
//!
//! In: the latest table per Gateway ([`PushServer::publish`]). Out: an HTTP/2 stream over
//! mTLS per connected proxy carrying its Gateway's table at once and every new version; each
//! proxy ACKs or NACKs each version, which [`PushServer::sync`] reports and
//! [`PushServer::changes`] signals.
//!
//! # Protocol (contract version 1)
//!
//! Transport: TLS 1.3 or 1.2, ALPN `h2` only, HTTP/2. The server certificate chains to the
//! push CA (see [`pki`]); the proxy must present a client certificate chaining to the same
//! CA whose subject CN is the Gateway identity `NAMESPACE/NAME` ([`pki::proxy_identity`]). A
//! proxy may only subscribe to the Gateway its certificate names (tables carry TLS keys).
//!
//! ```text
//! POST /v1/tables?gateway=NS/NAME&proxy=ID      (ID: pod name; defaults to the peer address)
//! request body  (proxy -> controller, streaming, never ends while the proxy lives):
//!     {"version":N,"ack":true}\n
//!     {"version":N,"ack":false,"error":"why"}\n
//! 200 response body (controller -> proxy, streaming):
//!     <RouteTable as compact JSON, version set>\n       one line per version
//! ```
//!
//! The first line is the current table, sent as soon as one is published (at once if one
//! already is). After that each new version follows; a proxy that reads slowly skips
//! intermediate versions and gets the latest (tables are whole snapshots). Compact JSON never
//! contains a raw newline, so `\n` frames it. Errors before streaming: 400 (bad query), 403
//! (certificate names another Gateway), 404/405 (other paths and methods).
//!
//! Liveness: HTTP/2 PING every 10 s, connection closed when unanswered for 20 s (see
//! [`PushOptions`]); a proxy
//! whose connection ends is dropped from [`SyncState`]. A second stream with the same proxy
//! id replaces the first (a reconnect that beat the dead-peer detection).
//!
//! # Versions
//!
//! `version = max(previous + 1, unix time in ms)`: strictly increasing per Gateway within a
//! process, and, because it follows the wall clock, a restarted controller (or a Gateway
//! deleted and re-created) continues above what proxies saw before, unless the clock steps
//! back. Two controller replicas publish the same table under different versions; proxies
//! treat the version as an identifier and apply whatever a fresh stream sends.
//!
//! Each version is serialized once into a shared [`bytes::Bytes`] that every proxy stream of
//! the Gateway clones.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{Notify, watch};
use tollgate_api::{ObjectKey, RouteTable};

pub mod pki;
mod server;

/// Errors of the push server.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The listening socket could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// TLS material could not be loaded.
    #[error("TLS: {0}")]
    Tls(String),
}

/// How in sync the proxies of one Gateway are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncState {
    /// Version of the latest table published for the Gateway (0 = none).
    pub version: u64,
    /// Proxies connected for the Gateway.
    pub connected: u32,
    /// Proxies that ACKed `version`.
    pub in_sync: u32,
    /// The latest NACK message per proxy that rejected `version`, by proxy id.
    pub nacks: Vec<(String, String)>,
}

/// One serialized version, shared by every stream of its Gateway.
#[derive(Debug)]
pub(crate) struct Frame {
    pub version: u64,
    /// The table as one line of compact JSON, `\n` included.
    pub bytes: Bytes,
}

/// One connected proxy stream.
#[derive(Debug)]
struct ProxyConn {
    id: String,
    acked: u64,
    nack: Option<(u64, String)>,
    /// Notified to end the stream (replaced by a newer stream with the same id).
    kill: Arc<Notify>,
}

#[derive(Debug)]
struct GatewayState {
    /// The last published table (its `version` set), for change detection.
    table: Option<RouteTable>,
    version: u64,
    frames: watch::Sender<Option<Arc<Frame>>>,
    /// Streams by connection number.
    proxies: HashMap<u64, ProxyConn>,
}

impl GatewayState {
    fn new() -> Self {
        Self {
            table: None,
            version: 0,
            frames: watch::channel(None).0,
            proxies: HashMap::new(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct State {
    gateways: Mutex<HashMap<ObjectKey, GatewayState>>,
    changes: watch::Sender<u64>,
    next_conn: std::sync::atomic::AtomicU64,
    /// Whether proxies are served ([`PushServer::set_accepting`]); open streams end when it
    /// turns false.
    pub(crate) accepting: watch::Sender<bool>,
}

/// What a new stream gets: its connection number, the frame receiver and its kill switch.
pub(crate) struct Registration {
    pub conn: u64,
    pub frames: watch::Receiver<Option<Arc<Frame>>>,
    pub kill: Arc<Notify>,
}

impl State {
    fn new() -> Self {
        Self {
            gateways: Mutex::new(HashMap::new()),
            changes: watch::channel(0).0,
            next_conn: std::sync::atomic::AtomicU64::new(1),
            accepting: watch::channel(true).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectKey, GatewayState>> {
        // A panic while holding the lock cannot leave the map inconsistent in a way that
        // matters more than stopping distribution would: keep going.
        self.gateways
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Registers a stream of proxy `id` for `gateway`, replacing an older one with that id.
    pub(crate) fn register(&self, gateway: &ObjectKey, id: String) -> Registration {
        let conn = self
            .next_conn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let kill = Arc::new(Notify::new());
        let frames = {
            let mut gateways = self.lock();
            let gw = gateways
                .entry(gateway.clone())
                .or_insert_with(GatewayState::new);
            gw.proxies.retain(|_, p| {
                if p.id == id {
                    p.kill.notify_one();
                    false
                } else {
                    true
                }
            });
            gw.proxies.insert(
                conn,
                ProxyConn {
                    id,
                    acked: 0,
                    nack: None,
                    kill: kill.clone(),
                },
            );
            gw.frames.subscribe()
        };
        self.bump();
        Registration { conn, frames, kill }
    }

    /// Drops a stream; forgets a Gateway with neither table nor proxies.
    pub(crate) fn unregister(&self, gateway: &ObjectKey, conn: u64) {
        let removed = {
            let mut gateways = self.lock();
            let Some(gw) = gateways.get_mut(gateway) else {
                return;
            };
            let removed = gw.proxies.remove(&conn).is_some();
            if gw.proxies.is_empty() && gw.table.is_none() {
                gateways.remove(gateway);
            }
            removed
        };
        if removed {
            self.bump();
        }
    }

    /// Records an ACK (`error` = None) or NACK of `version` by stream `conn`.
    pub(crate) fn report(
        &self,
        gateway: &ObjectKey,
        conn: u64,
        version: u64,
        error: Option<String>,
    ) {
        {
            let mut gateways = self.lock();
            let Some(p) = gateways
                .get_mut(gateway)
                .and_then(|g| g.proxies.get_mut(&conn))
            else {
                return;
            };
            match error {
                None => {
                    p.acked = version;
                    p.nack = None;
                }
                Some(e) => p.nack = Some((version, e)),
            }
        }
        self.bump();
    }
}

/// Tunables of the push server.
#[derive(Debug, Clone, Copy)]
pub struct PushOptions {
    /// HTTP/2 PING interval on every connection. Default 10 s.
    pub keepalive_interval: std::time::Duration,
    /// A connection whose PING stays unanswered this long is closed and its proxy dropped
    /// from [`SyncState`]. Default 20 s.
    pub keepalive_timeout: std::time::Duration,
}

impl Default for PushOptions {
    fn default() -> Self {
        Self {
            keepalive_interval: std::time::Duration::from_secs(10),
            keepalive_timeout: std::time::Duration::from_secs(20),
        }
    }
}

/// The controller side of table distribution. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PushServer {
    state: Arc<State>,
    server: Arc<server::Handle>,
}

impl PushServer {
    /// Binds `addr` and serves proxies whose client certificate chains to the CA in `tls`.
    pub async fn start(addr: SocketAddr, tls: pki::ServerTls) -> Result<Self, PushError> {
        Self::start_with(addr, tls, PushOptions::default()).await
    }

    /// [`PushServer::start`] with explicit [`PushOptions`].
    pub async fn start_with(
        addr: SocketAddr,
        tls: pki::ServerTls,
        options: PushOptions,
    ) -> Result<Self, PushError> {
        let state = Arc::new(State::new());
        let server = server::Handle::start(addr, &tls, state.clone(), options).await?;
        Ok(Self {
            state,
            server: Arc::new(server),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr
    }

    /// Replaces the server certificate and client CA bundle (after a CA rotation or a renewal).
    /// Open streams keep their connection; new connections use the new material.
    pub fn set_tls(&self, tls: pki::ServerTls) -> Result<(), PushError> {
        self.server.set_tls(&tls)
    }

    /// Whether proxies are served (the default). A controller that is not the leader sets
    /// `false`: its status writes are off, so a proxy streaming from it would never count
    /// towards `Programmed`. Then new streams get 503 and open ones end, and the proxies
    /// reconnect until they reach the replica that serves (the leader).
    pub fn set_accepting(&self, accepting: bool) {
        let changed = self.state.accepting.send_if_modified(|a| {
            let changed = *a != accepting;
            *a = accepting;
            changed
        });
        if changed {
            tracing::info!(
                accepting,
                "push server {}",
                if accepting {
                    "serves proxies"
                } else {
                    "turns proxies away"
                }
            );
        }
    }

    /// Stops accepting proxies and ends every open stream. Clones stop too.
    pub fn shutdown(&self) {
        self.server.shutdown();
    }

    /// Publishes `table` for `gateway` if it differs from the last one published (ignoring
    /// `version`); assigns the next version and returns it.
    pub fn publish(&self, gateway: &ObjectKey, mut table: RouteTable) -> u64 {
        let version = {
            let mut gateways = self.state.lock();
            let gw = gateways
                .entry(gateway.clone())
                .or_insert_with(GatewayState::new);
            // Every field but the version: destructured so a new field cannot be forgotten.
            let RouteTable {
                version: _,
                gateway: new_gateway,
                ports,
                backends,
                policies,
                closed,
            } = &table;
            if let Some(old) = &gw.table
                && old.gateway == *new_gateway
                && old.ports == *ports
                && old.backends == *backends
                && old.policies == *policies
                && old.closed == *closed
            {
                return gw.version;
            }
            let version = next_version(gw.version, now_ms());
            table.version = version;
            let mut bytes = match serde_json::to_vec(&table) {
                Ok(b) => b,
                Err(e) => {
                    // Not reachable with the plain serde types of the contract.
                    tracing::error!(%gateway, error = %e, "route table does not serialize");
                    return gw.version;
                }
            };
            bytes.push(b'\n');
            gw.version = version;
            gw.table = Some(table);
            gw.frames.send_replace(Some(Arc::new(Frame {
                version,
                bytes: Bytes::from(bytes),
            })));
            version
        };
        tracing::debug!(%gateway, version, "route table published");
        self.state.bump();
        version
    }

    /// Forgets a Gateway; its proxies get no more tables.
    pub fn remove(&self, gateway: &ObjectKey) {
        let removed = self.state.lock().remove(gateway);
        if let Some(gw) = removed {
            for p in gw.proxies.values() {
                p.kill.notify_one();
            }
            self.state.bump();
        }
    }

    /// Sync state of one Gateway's proxies.
    pub fn sync(&self, gateway: &ObjectKey) -> SyncState {
        let gateways = self.state.lock();
        let Some(gw) = gateways.get(gateway) else {
            return SyncState::default();
        };
        let version = gw.version;
        let mut nacks: Vec<(String, String)> = gw
            .proxies
            .values()
            .filter_map(|p| match &p.nack {
                Some((v, e)) if *v == version && version > 0 => Some((p.id.clone(), e.clone())),
                _ => None,
            })
            .collect();
        nacks.sort();
        SyncState {
            version,
            connected: u32::try_from(gw.proxies.len()).unwrap_or(u32::MAX),
            in_sync: u32::try_from(
                gw.proxies
                    .values()
                    .filter(|p| version > 0 && p.acked == version)
                    .count(),
            )
            .unwrap_or(u32::MAX),
            nacks,
        }
    }

    /// A receiver that changes whenever any proxy connects, disconnects, ACKs or NACKs.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.state.changes.subscribe()
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The version after `previous`, following the wall clock so it survives restarts.
fn next_version(previous: u64, now_ms: u64) -> u64 {
    previous.saturating_add(1).max(now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_the_clock_and_never_repeat() {
        assert_eq!(next_version(0, 1_000), 1_000);
        assert_eq!(next_version(1_000, 1_000), 1_001);
        assert_eq!(next_version(1_001, 1_000), 1_002);
        assert_eq!(next_version(5, 0), 6);
        assert_eq!(next_version(u64::MAX, 0), u64::MAX);
    }
}
