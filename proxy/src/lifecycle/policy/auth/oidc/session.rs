//! What the cookies hold, and the token endpoint. In: a session cookie's opened payload, or
//! the answer of the token endpoint to a code or refresh grant. Out: a [`Session`] (the
//! identity for `auth.identity` and what renews it), a [`Login`] in progress, or why there is
//! none.
//!
//! A session keeps only what the proxy needs: the ID token's claims (verified at login or
//! refresh, so not verified again per request), its expiry, the refresh token and the ID
//! token itself (the `id_token_hint` of a logout). Access tokens are not kept: the upstream
//! learns the identity from the policy's success headers.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::Full;
use serde::{Deserialize, Serialize};

use super::super::AuthShared;
use super::discovery::Provider;

/// A logged-in session, as sealed in the session cookie.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Session {
    /// The ID token's claims: `auth.identity`.
    #[serde(rename = "c", serialize_with = "ser_arc", deserialize_with = "de_arc")]
    pub claims: Arc<serde_json::Value>,
    /// Seconds since the epoch after which the session must be refreshed (the ID token's
    /// `exp`, or sooner when the access token expires sooner).
    #[serde(rename = "e")]
    pub exp: u64,
    /// The refresh token, when the issuer gave one.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// The raw ID token, for `id_token_hint` at logout.
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub id_token: Option<String>,
}

fn ser_arc<S: serde::Serializer>(v: &Arc<serde_json::Value>, s: S) -> Result<S::Ok, S::Error> {
    v.as_ref().serialize(s)
}

fn de_arc<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Arc<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Arc::new)
}

/// A login in progress, as sealed in the login cookie.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Login {
    /// `state` sent to the issuer.
    #[serde(rename = "s")]
    pub state: String,
    /// `nonce` sent to the issuer, expected in the ID token.
    #[serde(rename = "n")]
    pub nonce: String,
    /// The PKCE code verifier.
    #[serde(rename = "v")]
    pub verifier: String,
    /// Where to go back to: a path (and query) on this host.
    #[serde(rename = "u")]
    pub return_to: String,
    /// Seconds since the epoch when it began.
    #[serde(rename = "t")]
    pub started: u64,
}

/// The token endpoint's answer (RFC 6749 §5.1; `id_token` of OpenID Connect Core §3.1.3.3).
#[derive(Debug, Deserialize)]
pub(super) struct TokenAnswer {
    #[serde(default)]
    pub id_token: Option<String>,
    #[serde(default)]
    pub refresh_token: Option<String>,
    #[serde(default)]
    pub expires_in: Option<u64>,
}

/// Why a token call gave no tokens.
#[derive(Debug, thiserror::Error)]
pub(super) enum TokenError {
    /// The endpoint could not be reached or answered garbage: a gateway problem.
    #[error("token endpoint unavailable: {0}")]
    Unavailable(String),
    /// The endpoint refused the grant (an expired or reused code, a revoked refresh token).
    #[error("token endpoint refused the grant: {0}")]
    Refused(String),
}

/// The client's credentials at the token endpoint.
pub(super) struct Client<'a> {
    pub id: &'a str,
    pub secret: &'a str,
}

/// Calls the token endpoint with the grant `params`, authenticating as the client the way the
/// issuer supports.
pub(super) async fn token_call(
    provider: &Provider,
    client: &Client<'_>,
    params: &[(&str, &str)],
    shared: &AuthShared,
) -> Result<TokenAnswer, TokenError> {
    // Built whole before the first await: the serializer is not `Send`.
    let form = {
        let mut form = form_urlencoded::Serializer::new(String::new());
        for (k, v) in params {
            form.append_pair(k, v);
        }
        if !provider.basic_auth {
            form.append_pair("client_id", client.id);
            form.append_pair("client_secret", client.secret);
        }
        form.finish()
    };
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(provider.token_endpoint.clone())
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(ACCEPT, "application/json");
    if provider.basic_auth {
        // RFC 6749 §2.3.1: id and secret form-encoded before they are joined.
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let basic = STANDARD.encode(format!("{}:{}", enc(client.id), enc(client.secret)));
        let mut value = HeaderValue::try_from(format!("Basic {basic}"))
            .map_err(|_| TokenError::Unavailable("client credentials are not a header".into()))?;
        value.set_sensitive(true);
        req = req.header(AUTHORIZATION, value);
    }
    let req = req
        .body(Full::new(Bytes::from(form)))
        .map_err(|e| TokenError::Unavailable(e.to_string()))?;
    let (status, body) = shared
        .http
        .send(req)
        .await
        .map_err(|e| TokenError::Unavailable(e.to_string()))?;
    if status == StatusCode::BAD_REQUEST || status == StatusCode::UNAUTHORIZED {
        // RFC 6749 §5.2: `{"error": ...}`; the code, never the body (it may echo tokens).
        let error = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| format!("status {status}"));
        return Err(TokenError::Refused(error));
    }
    if status != StatusCode::OK {
        return Err(TokenError::Unavailable(format!("status {status}")));
    }
    serde_json::from_slice(&body)
        .map_err(|e| TokenError::Unavailable(format!("answer is not a token response: {e}")))
}

/// `exp` of verified claims, as whole seconds.
pub(super) fn exp_of(claims: &serde_json::Value) -> Option<u64> {
    let exp = claims.get("exp")?;
    exp.as_u64().or_else(|| {
        exp.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            // Truncation is the point: the session must not outlive the token.
            .map(|f| f as u64)
    })
}

/// When a session from these tokens must be refreshed: the ID token's `exp`, or sooner when
/// the access token expires sooner.
pub(super) fn session_exp(claims: &serde_json::Value, expires_in: Option<u64>) -> Option<u64> {
    let exp = exp_of(claims)?;
    Some(match expires_in {
        Some(secs) => exp.min(unix_now().saturating_add(secs)),
        None => exp,
    })
}

/// Seconds since the epoch (0 if the clock is before it, which only makes sessions expire).
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
