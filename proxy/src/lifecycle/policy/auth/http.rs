//! The outbound HTTP(S) client of the auth module (JWKS fetches, token introspection). In: a
//! request. Out: the status and a size-limited body, or a [`FetchError`], within one overall
//! timeout (connect, send and body read together), so a stalled peer costs at most that.
//!
//! One pooled client per [`super::AuthState`], on rustls with the ring provider like the rest
//! of the proxy. Trust roots come from the system (`SSL_CERT_FILE`/`SSL_CERT_DIR` are
//! honoured) unless [`super::AuthOptions::tls`] provides a config. `http://` URIs work too, for
//! in-cluster endpoints and tests.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::ClientConfig;

/// Largest response body read from a JWKS or introspection endpoint.
pub(crate) const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Why an outbound call failed. Messages never contain request bodies (tokens) or
/// credentials.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// No answer within the timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Could not connect or the exchange failed.
    #[error("request failed: {0}")]
    Request(String),
    /// The body was larger than [`MAX_RESPONSE_BYTES`] or could not be read.
    #[error("response body: {0}")]
    Body(String),
}

/// A pooled client with an overall timeout.
#[derive(Clone)]
pub(crate) struct HttpClient {
    /// `None` when no TLS client config could be built: every call fails (and so denies).
    client: Option<Client<HttpsConnector<HttpConnector>, Full<Bytes>>>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// Builds the client. Without `tls`, system roots are loaded; when none can be loaded
    /// HTTPS calls fail (and so deny) instead of the proxy failing to start.
    pub fn new(timeout: Duration, tls: Option<Arc<ClientConfig>>) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let client = tls_config(tls).map(|config| {
            let https = HttpsConnectorBuilder::new()
                .with_tls_config(config)
                .https_or_http()
                .enable_http1()
                .wrap_connector(http);
            Client::builder(TokioExecutor::new())
                .timer(TokioTimer::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(8)
                .build(https)
        });
        Self { client, timeout }
    }

    /// Sends `req` and reads the whole body, all within the timeout.
    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), FetchError> {
        let Some(client) = &self.client else {
            return Err(FetchError::Request("no TLS client configuration".into()));
        };
        let exchange = async {
            let resp = client
                .request(req)
                .await
                .map_err(|e| FetchError::Request(error_chain(&e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| FetchError::Body(e.to_string()))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| FetchError::Timeout(self.timeout))?
    }
}

/// The given config, else one trusting the system roots (ring provider, TLS 1.2 and 1.3).
fn tls_config(tls: Option<Arc<ClientConfig>>) -> Option<ClientConfig> {
    if let Some(c) = tls {
        return Some((*c).clone());
    }
    let mut roots = rustls::RootCertStore::empty();
    let loaded = rustls_native_certs::load_native_certs();
    for e in &loaded.errors {
        tracing::warn!(error = %e, "auth: loading system trust roots");
    }
    let (added, _ignored) = roots.add_parsable_certificates(loaded.certs);
    if added == 0 {
        tracing::warn!("auth: no system trust roots; HTTPS JWKS and introspection calls will fail");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    match ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions() {
        Ok(b) => Some(b.with_root_certificates(roots).with_no_client_auth()),
        Err(e) => {
            tracing::error!(error = %e, "auth: TLS client config; JWKS and introspection calls will fail");
            None
        }
    }
}

/// The error and its sources, one line (hyper-util's own message is just "client error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}
