//! What a client connection knows about itself. In: the accepted socket (and its TLS
//! session). Out: [`ConnCtx`], shared by every request the connection carries.

use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderValue;

use crate::limits::Limits;

/// What a connection knows about itself.
#[derive(Debug)]
pub(crate) struct ConnCtx {
    /// Client address.
    pub peer: SocketAddr,
    /// Port the client connected to (differs from `table_port` only for port 0).
    pub local_port: u16,
    /// Port as the route table names it (what the router matches on).
    pub table_port: u16,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// The peer's IP as an `X-Forwarded-For` value, formatted once per connection; its text
    /// (`IpAddr`'s `Display`) is also `source.address` for policy expressions.
    pub peer_value: HeaderValue,
    /// The TLS server name the client sent (HTTPS only).
    pub sni: Option<Arc<str>>,
    /// This connection's limits: the proxy's, with its port's ClientPolicy overrides.
    pub limits: Limits,
    /// Leaf DER of the client certificate, only when the port's CAs verified it (for X.509
    /// authentication).
    pub peer_cert: Option<Arc<[u8]>>,
}
