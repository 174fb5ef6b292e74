//! OAuth 2.0 token introspection (RFC 7662). In: an
//! [`tollgate_api::policy::Introspection`] (per table) and a presented token (per request).
//! Out: the endpoint's JSON answer as the identity when it says `"active": true`.
//!
//! The call is `POST endpoint` with `token=…&token_type_hint=access_token` and HTTP Basic
//! client credentials (RFC 6749 §2.3.1: id and secret form-encoded first). Anything but a 200
//! with a JSON object, or no answer within the timeout, is an error and denies. Answers, active
//! or not, are cached for `cache_ms` (an active one no longer than its `exp`), keyed by a
//! SHA-256 of endpoint, client id and token; failures are not cached.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::Full;
use sha2::{Digest, Sha256};
use tollgate_api::policy::Introspection;

use super::metrics::Cache;
use super::{AuthBuildError, AuthShared, Failure};

/// A cached answer.
#[derive(Debug, Clone)]
pub(crate) struct CachedAnswer {
    /// `Some` (the answer JSON) when active.
    identity: Option<Arc<serde_json::Value>>,
    until: Instant,
}

/// The compiled introspection method.
#[derive(Clone)]
pub(crate) struct Introspector {
    endpoint: Uri,
    /// `Basic …`, marked sensitive.
    authorization: HeaderValue,
    cache_for: Duration,
    /// SHA-256 over endpoint and client id: the cache namespace.
    fingerprint: [u8; 32],
}

impl std::fmt::Debug for Introspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Introspector")
            .field("endpoint", &self.endpoint)
            .field("cache_for", &self.cache_for)
            .finish_non_exhaustive()
    }
}

impl Introspector {
    /// Compiles a method; the endpoint must be an absolute `http(s)` URI.
    pub fn compile(i: &Introspection, method: &str) -> Result<Self, AuthBuildError> {
        let endpoint = super::http_uri(&i.endpoint, method)?;
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let basic = STANDARD.encode(format!("{}:{}", enc(&i.client_id), enc(&i.client_secret)));
        let mut authorization =
            HeaderValue::from_str(&format!("Basic {basic}")).map_err(|_| AuthBuildError::Uri {
                method: method.to_owned(),
                uri: i.endpoint.clone(),
            })?;
        authorization.set_sensitive(true);
        let mut h = Sha256::new();
        h.update(b"introspection\0");
        h.update(i.endpoint.as_bytes());
        h.update(b"\0");
        h.update(i.client_id.as_bytes());
        Ok(Self {
            endpoint,
            authorization,
            cache_for: Duration::from_millis(i.cache_ms),
            fingerprint: h.finalize().into(),
        })
    }

    /// Introspects `token` (or answers from the cache).
    pub async fn verify(
        &self,
        token: &str,
        shared: &AuthShared,
    ) -> Result<Arc<serde_json::Value>, Failure> {
        let key = self.cache_key(token);
        if let Some(hit) = shared.introspections.get(&key) {
            if Instant::now() < hit.until {
                shared.metrics.cache_lookup(Cache::Introspection, true);
                return hit.identity.ok_or(Failure::Invalid("token not active"));
            }
            shared.introspections.remove(&key);
        }
        shared.metrics.cache_lookup(Cache::Introspection, false);
        let answer = self.call(token, shared).await;
        shared.metrics.introspection(answer.is_ok());
        let answer = answer.map_err(|e| {
            tracing::debug!(endpoint = %self.endpoint, error = %e, "auth: token introspection failed");
            Failure::Unavailable(e)
        })?;
        let active = answer.get("active") == Some(&serde_json::Value::Bool(true));
        let identity = active.then(|| Arc::new(answer));
        let ttl = match identity.as_deref().and_then(seconds_until_exp) {
            Some(left) => self.cache_for.min(left),
            None => self.cache_for,
        };
        if !ttl.is_zero() {
            shared.introspections.insert(
                key,
                CachedAnswer {
                    identity: identity.clone(),
                    until: Instant::now() + ttl,
                },
            );
        }
        identity.ok_or(Failure::Invalid("token not active"))
    }

    /// One call to the endpoint; the answer object, or why there is none (never the token).
    async fn call(&self, token: &str, shared: &AuthShared) -> Result<serde_json::Value, String> {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("token", token)
            .append_pair("token_type_hint", "access_token")
            .finish();
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let (status, body) = shared.http.send(req).await.map_err(|e| e.to_string())?;
        if status != StatusCode::OK {
            return Err(format!("status {status}"));
        }
        match serde_json::from_slice(&body) {
            Ok(v @ serde_json::Value::Object(_)) => Ok(v),
            Ok(_) => Err("answer is not a JSON object".into()),
            Err(e) => Err(format!("answer is not JSON: {e}")),
        }
    }

    fn cache_key(&self, token: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.fingerprint);
        h.update(token.as_bytes());
        h.finalize().into()
    }
}

/// Time left until the answer's `exp` (zero when past), if it has a numeric one.
fn seconds_until_exp(answer: &serde_json::Value) -> Option<Duration> {
    let exp = answer.get("exp")?.as_u64()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(exp.saturating_sub(now)))
}
