//! What outlives a table. In: [`AuthOptions`] and the proxy's [`AuthMetrics`] (once per
//! proxy). Out: an [`AuthState`] holding the outbound HTTP client, the fetched JWKS sets by
//! URI, and the verified-token and introspection caches, handed to every
//! [`super::CompiledAuth::build`] so that a table swap keeps keys and cached answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use http::Uri;

use super::AuthBuildError;
use super::http::HttpClient;
use super::introspect::CachedAnswer;
use super::jwks::RemoteJwks;
use super::jwt::CachedToken;
use super::metrics::AuthMetrics;

/// Tunables of [`AuthState`]; the defaults suit production.
#[derive(Debug, Clone)]
pub struct AuthOptions {
    /// Overall timeout of one JWKS fetch or introspection call (connect, send, read). 5 s.
    pub http_timeout: Duration,
    /// At most one unknown-`kid` refetch per JWKS URI in this interval (and, while no keys
    /// were ever fetched, at most one attempt). 10 s.
    pub jwks_min_refetch_interval: Duration,
    /// A fetched JWKS older than this is refreshed in the background. 5 min.
    pub jwks_max_age: Duration,
    /// Verified JWTs kept, across all policies. 10 000.
    pub token_cache_capacity: usize,
    /// Introspection answers kept, across all policies. 10 000.
    pub introspection_cache_capacity: usize,
    /// TLS client config for JWKS and introspection endpoints; `None` = system roots.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The `realm` of `WWW-Authenticate` challenges. `tollgate`.
    pub realm: String,
}

impl Default for AuthOptions {
    fn default() -> Self {
        Self {
            http_timeout: Duration::from_secs(5),
            jwks_min_refetch_interval: Duration::from_secs(10),
            jwks_max_age: Duration::from_secs(300),
            token_cache_capacity: 10_000,
            introspection_cache_capacity: 10_000,
            tls: None,
            realm: "tollgate".into(),
        }
    }
}

/// What outlives a table: the HTTP client, fetched key sets (by URI) and the answer caches.
/// Create one per proxy and pass it to every [`super::CompiledAuth::build`]; cloning is cheap.
#[derive(Debug, Clone)]
pub struct AuthState {
    pub(super) shared: Arc<AuthShared>,
}

/// The inside of [`AuthState`], shared with every compiled policy.
pub(crate) struct AuthShared {
    pub(super) options: AuthOptions,
    pub(super) metrics: AuthMetrics,
    pub(super) http: HttpClient,
    /// Key sets by URI; weak so a URI no table names any more is dropped with its last table.
    jwks: Mutex<HashMap<String, Weak<RemoteJwks>>>,
    pub(super) tokens: quick_cache::sync::Cache<super::jwt::TokenKey, CachedToken>,
    pub(super) introspections: quick_cache::sync::Cache<[u8; 32], CachedAnswer>,
}

impl std::fmt::Debug for AuthShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthShared")
            .field("options", &self.options)
            .field("tokens", &self.tokens.len())
            .field("introspections", &self.introspections.len())
            .finish_non_exhaustive()
    }
}

impl AuthState {
    /// A state with default options; `metrics` is what the proxy registered.
    pub fn new(metrics: AuthMetrics) -> Self {
        Self::with_options(metrics, AuthOptions::default())
    }

    /// A state with explicit options.
    pub fn with_options(metrics: AuthMetrics, options: AuthOptions) -> Self {
        let http = HttpClient::new(options.http_timeout, options.tls.clone());
        Self {
            shared: Arc::new(AuthShared {
                tokens: quick_cache::sync::Cache::new(options.token_cache_capacity.max(1)),
                introspections: quick_cache::sync::Cache::new(
                    options.introspection_cache_capacity.max(1),
                ),
                jwks: Mutex::new(HashMap::new()),
                http,
                metrics,
                options,
            }),
        }
    }

    /// The counters.
    pub fn metrics(&self) -> &AuthMetrics {
        &self.shared.metrics
    }
}

impl AuthShared {
    /// The shared key set of `uri`, created on first use.
    pub(super) fn remote_jwks(
        &self,
        uri: &str,
        method: &str,
    ) -> Result<Arc<RemoteJwks>, AuthBuildError> {
        let parsed = http_uri(uri, method)?;
        let mut sets = self.jwks.lock().unwrap_or_else(|e| e.into_inner());
        sets.retain(|_, w| w.strong_count() > 0);
        if let Some(set) = sets.get(uri).and_then(Weak::upgrade) {
            return Ok(set);
        }
        let set = Arc::new(RemoteJwks::new(parsed));
        sets.insert(uri.to_owned(), Arc::downgrade(&set));
        Ok(set)
    }
}

/// An absolute `http` or `https` URI.
pub(crate) fn http_uri(uri: &str, method: &str) -> Result<Uri, AuthBuildError> {
    let bad = || AuthBuildError::Uri {
        method: method.to_owned(),
        uri: uri.to_owned(),
    };
    let parsed: Uri = uri.parse().map_err(|_| bad())?;
    match (parsed.scheme_str(), parsed.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(parsed),
        _ => Err(bad()),
    }
}
