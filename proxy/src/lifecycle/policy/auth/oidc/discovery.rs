//! The issuer's discovery document. In: the issuer URL (once per table) and, when a login,
//! callback, refresh or logout needs the endpoints, the shared HTTP client. Out: a
//! [`Provider`]: the authorization, token and end-session endpoints, how the client
//! authenticates at the token endpoint, and a JWT verifier for ID tokens (the issuer's JWKS
//! through the shared key sets of [`super::super::AuthState`], `aud` = the client id).
//!
//! The document (`<issuer>/.well-known/openid-configuration`) must name the configured
//! issuer (OpenID Connect Discovery §4.3). It is fetched on first use, kept for
//! [`super::super::AuthOptions::jwks_max_age`], then refetched; a failed refetch keeps the
//! last good document. With none, at most one attempt per
//! [`super::super::AuthOptions::jwks_min_refetch_interval`] is made and every caller in
//! between fails (and so denies).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::header::ACCEPT;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::Full;
use serde::Deserialize;
use tollgate_api::policy::Jwt;

use super::super::jwt::JwtVerifier;
use super::super::{AuthBuildError, AuthShared};

/// What a client needs of the issuer.
#[derive(Debug)]
pub(super) struct Provider {
    pub authorization_endpoint: String,
    pub token_endpoint: Uri,
    pub end_session_endpoint: Option<String>,
    /// `client_secret_basic` (the default of RFC 6749 and OpenID Connect) unless the issuer
    /// supports only `client_secret_post`.
    pub basic_auth: bool,
    /// ID tokens: signature by the issuer's JWKS, `iss`, `aud` = client id, `exp`.
    pub verifier: JwtVerifier,
}

/// The fields of the document we read.
#[derive(Debug, Deserialize)]
struct Document {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    end_session_endpoint: Option<String>,
    #[serde(default)]
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
}

#[derive(Debug, Default)]
struct Cached {
    provider: Option<(Arc<Provider>, Instant)>,
    last_failure: Option<Instant>,
}

/// The discovery state of one method.
#[derive(Debug)]
pub(super) struct Discovery {
    url: Uri,
    issuer: String,
    client_id: String,
    method: String,
    cached: Mutex<Cached>,
    /// One fetch at a time; the others wait for its result.
    fetching: tokio::sync::Mutex<()>,
}

impl Discovery {
    /// The discovery URL of `issuer` must be an absolute http(s) URI.
    pub fn new(issuer: &str, client_id: &str, method: &str) -> Result<Self, AuthBuildError> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        Ok(Self {
            url: super::super::http_uri(&url, method)?,
            issuer: issuer.to_owned(),
            client_id: client_id.to_owned(),
            method: method.to_owned(),
            cached: Mutex::new(Cached::default()),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    /// The provider, fetched or refreshed when needed; `Err` (why, for logs) when there is
    /// none to use.
    pub async fn provider(&self, shared: &Arc<AuthShared>) -> Result<Arc<Provider>, String> {
        if let Some(p) = self.fresh(shared) {
            return Ok(p);
        }
        let _one = self.fetching.lock().await;
        if let Some(p) = self.fresh(shared) {
            return Ok(p);
        }
        let (stale, recent_failure) = {
            let c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
            (
                c.provider.as_ref().map(|(p, _)| p.clone()),
                c.last_failure
                    .is_some_and(|t| t.elapsed() < shared.options.jwks_min_refetch_interval),
            )
        };
        if recent_failure {
            return stale.ok_or_else(|| "discovery failed recently; not retried yet".into());
        }
        match self.fetch(shared).await {
            Ok(p) => {
                let p = Arc::new(p);
                let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
                c.provider = Some((p.clone(), Instant::now()));
                c.last_failure = None;
                Ok(p)
            }
            Err(e) => {
                tracing::warn!(method = %self.method, url = %self.url, error = %e, "auth: OIDC discovery failed");
                let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
                c.last_failure = Some(Instant::now());
                stale.ok_or(e)
            }
        }
    }

    fn fresh(&self, shared: &AuthShared) -> Option<Arc<Provider>> {
        let c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        c.provider
            .as_ref()
            .filter(|(_, at)| at.elapsed() < shared.options.jwks_max_age)
            .map(|(p, _)| p.clone())
    }

    async fn fetch(&self, shared: &Arc<AuthShared>) -> Result<Provider, String> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(self.url.clone())
            .header(ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let (status, body) = shared.http.send(req).await.map_err(|e| e.to_string())?;
        if status != StatusCode::OK {
            return Err(format!("status {status}"));
        }
        let doc: Document =
            serde_json::from_slice(&body).map_err(|e| format!("not a discovery document: {e}"))?;
        if doc.issuer.trim_end_matches('/') != self.issuer.trim_end_matches('/') {
            return Err(format!(
                "the document names the issuer {:?}, not {:?}",
                doc.issuer, self.issuer
            ));
        }
        let token_endpoint =
            super::super::http_uri(&doc.token_endpoint, &self.method).map_err(|e| e.to_string())?;
        super::super::http_uri(&doc.authorization_endpoint, &self.method)
            .map_err(|e| e.to_string())?;
        let basic_auth = doc
            .token_endpoint_auth_methods_supported
            .as_ref()
            .is_none_or(|m| {
                m.iter().any(|a| a == "client_secret_basic")
                    || !m.iter().any(|a| a == "client_secret_post")
            });
        let verifier = JwtVerifier::compile(
            &Jwt {
                issuer: doc.issuer.clone(),
                audiences: vec![self.client_id.clone()],
                jwks_uri: Some(doc.jwks_uri.clone()),
                jwks: None,
            },
            &self.method,
            shared,
        )
        .map_err(|e| e.to_string())?;
        verifier.prefetch(shared);
        Ok(Provider {
            authorization_endpoint: doc.authorization_endpoint,
            token_endpoint,
            end_session_endpoint: doc
                .end_session_endpoint
                .filter(|e| super::super::http_uri(e, &self.method).is_ok()),
            basic_auth,
            verifier,
        })
    }
}
