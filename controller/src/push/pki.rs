//! The CA, server and client certificates of table distribution.
//!
//! INTERFACE STUB: owned by the table-distribution work.

/// What the push server needs: its certificate chain and key, and the CA that signs proxies.
#[derive(Clone)]
pub struct ServerTls {
    /// PEM chain of the server certificate.
    pub cert_pem: String,
    /// PEM key of the server certificate.
    pub key_pem: String,
    /// PEM of the CA that client certificates must chain to.
    pub ca_pem: String,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}
