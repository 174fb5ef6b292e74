//! The proxy's one error type. In: failures while building a snapshot (router, TLS, policies,
//! balancers, addresses) or binding sockets. Out: [`ProxyError`], returned by
//! [`crate::Proxy::apply`]; the live snapshot is untouched whenever one is returned.
//! Per-request failures never become a `ProxyError`: they are answered with a status code in
//! [`crate::lifecycle::service`].

use std::net::SocketAddr;

use crate::lifecycle::router::RouterError;

/// Why a route table could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The router rejected the table (e.g. a regex that does not compile).
    #[error(transparent)]
    Router(#[from] RouterError),
    /// A port's client settings (ClientPolicy) cannot be served.
    #[error(transparent)]
    Client(#[from] crate::lifecycle::client::ClientSettingsError),
    /// A policy of the table does not compile.
    #[error(transparent)]
    Policy(#[from] crate::lifecycle::policy::PolicyError),
    /// A backend's consistent-hash expression does not compile.
    #[error("backend {backend}: consistent hash: {source}")]
    HashExpression {
        /// The table's backend key.
        backend: String,
        /// Why.
        #[source]
        source: crate::lifecycle::policy::cel::CelError,
    },
    /// A port's `address` is not an IP address.
    #[error("port {port}: invalid bind address {address:?}")]
    Address {
        /// The address as the table gave it.
        address: String,
        /// The port.
        port: u16,
    },
    /// An HTTPS port's certificates could not be loaded.
    #[error("port {port}: TLS: {message}")]
    Tls {
        /// The port.
        port: u16,
        /// What went wrong (never key material).
        message: String,
    },
    /// A socket could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The proxy has been shut down.
    #[error("proxy is shut down")]
    Shutdown,
}

/// Boxed error of proxy bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `Result` with [`ProxyError`].
pub type Result<T, E = ProxyError> = std::result::Result<T, E>;
