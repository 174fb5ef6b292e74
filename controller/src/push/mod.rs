//! Pushing route tables to proxies.
//!
//! INTERFACE STUB: owned by the table-distribution work; these signatures are the contract
//! the controller loop codes against.
//!
//! In: the latest table per Gateway ([`PushServer::publish`]). Out: an HTTP/2 stream over
//! mTLS per connected proxy carrying its Gateway's table at once and every new version; each
//! proxy ACKs or NACKs each version, which [`PushServer::sync`] reports.

use std::net::SocketAddr;

use tollgate_api::{ObjectKey, RouteTable};

pub mod pki;

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

/// The controller side of table distribution. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PushServer {
    _private: (),
}

impl PushServer {
    /// Binds `addr` and serves proxies whose client certificate chains to the CA in `tls`.
    pub async fn start(addr: SocketAddr, tls: pki::ServerTls) -> Result<Self, PushError> {
        let _ = (addr, tls);
        todo!("push")
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        todo!("push")
    }

    /// Publishes `table` for `gateway` if it differs from the last one published (ignoring
    /// `version`); assigns the next version and returns it.
    pub fn publish(&self, gateway: &ObjectKey, table: RouteTable) -> u64 {
        let _ = (gateway, table);
        todo!("push")
    }

    /// Forgets a Gateway; its proxies get no more tables.
    pub fn remove(&self, gateway: &ObjectKey) {
        let _ = gateway;
        todo!("push")
    }

    /// Sync state of one Gateway's proxies.
    pub fn sync(&self, gateway: &ObjectKey) -> SyncState {
        let _ = gateway;
        todo!("push")
    }

    /// A receiver that changes whenever any proxy connects, disconnects, ACKs or NACKs.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        todo!("push")
    }
}
