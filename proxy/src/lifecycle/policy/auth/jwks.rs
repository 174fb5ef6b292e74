//! JSON Web Key Sets. In: JWKS JSON (inline in the table, or fetched from a `jwks_uri`). Out:
//! verification keys, each tied to the algorithms it may verify.
//!
//! A fetched set lives in a [`RemoteJwks`] owned by the [`super::AuthState`] and shared by
//! every table naming the same URI, so a table swap costs no refetch. Readers load the current
//! set without locking ([`ArcSwap`]); fetches are single-flight (one per URI at a time):
//! - an unknown `kid` triggers a refetch, at most one per
//!   [`super::AuthOptions::jwks_min_refetch_interval`] (the first after a fetch is served at
//!   once, so a rotation is picked up by its first token); with no keys yet, any request
//!   fetches, again at most once per interval;
//! - a set older than [`super::AuthOptions::jwks_max_age`] is refreshed in the background;
//! - a failed fetch keeps the last keys; with no keys ever fetched the caller gets
//!   [`JwksUnavailable`] (and denies).
//!
//! Keys that cannot verify anything are dropped when parsed (encryption keys, unknown key
//! types or curves, a JWK `alg` we do not support), so one odd key does not hide the others.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::Full;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey};

use super::AuthShared;

/// One verification key.
pub(crate) struct Key {
    kid: Option<String>,
    /// The JWK's own `alg`, when it names one: the only algorithm the key may verify.
    alg: Option<Algorithm>,
    kind: KeyKind,
    key: DecodingKey,
}

/// What a key is, which decides the algorithms it may verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
    Hmac,
}

impl Key {
    /// True when this key may verify a token signed with `alg`: the algorithm must belong to
    /// the key's type and curve, and match the JWK `alg` when one is given.
    fn fits(&self, alg: Algorithm) -> bool {
        if self.alg.is_some_and(|a| a != alg) {
            return false;
        }
        use Algorithm::*;
        match self.kind {
            KeyKind::Rsa => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            KeyKind::P256 => alg == ES256,
            KeyKind::P384 => alg == ES384,
            KeyKind::Ed25519 => alg == EdDSA,
            KeyKind::Hmac => matches!(alg, HS256 | HS384 | HS512),
        }
    }

    /// The decoding key.
    pub fn decoding_key(&self) -> &DecodingKey {
        &self.key
    }
}

/// A parsed key set.
#[derive(Default)]
pub(crate) struct KeySet {
    keys: Vec<Key>,
    /// When a remote set was fetched (its age is checked without locking).
    fetched: Option<Instant>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<_> = self.keys.iter().map(|k| k.kid.as_deref()).collect();
        f.debug_struct("KeySet").field("kids", &kids).finish()
    }
}

/// Why a JWKS document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JwksParseError {
    /// Not JSON, or no `keys` array.
    #[error("not a JWKS document: {0}")]
    Malformed(String),
    /// No key in it can verify a signature.
    #[error("no usable signature verification key")]
    NoUsableKey,
}

impl KeySet {
    /// Parses a JWKS document, keeping the keys that can verify signatures.
    pub fn parse(json: &[u8]) -> Result<Self, JwksParseError> {
        #[derive(serde::Deserialize)]
        struct Doc {
            keys: Vec<serde_json::Value>,
        }
        let doc: Doc =
            serde_json::from_slice(json).map_err(|e| JwksParseError::Malformed(e.to_string()))?;
        let keys: Vec<Key> = doc.keys.into_iter().filter_map(key).collect();
        if keys.is_empty() {
            return Err(JwksParseError::NoUsableKey);
        }
        Ok(Self {
            keys,
            fetched: None,
        })
    }

    /// Keys that may verify a token with this header `kid` and `alg`. With a `kid`, only keys
    /// carrying that `kid`; without, every key that fits.
    pub fn candidates(&self, kid: Option<&str>, alg: Algorithm) -> impl Iterator<Item = &Key> {
        self.keys
            .iter()
            .filter(move |k| kid.is_none_or(|kid| k.kid.as_deref() == Some(kid)) && k.fits(alg))
    }

    /// True when the set can answer for `kid` (any key when `kid` is `None`).
    fn knows(&self, kid: Option<&str>) -> bool {
        match kid {
            Some(kid) => self.keys.iter().any(|k| k.kid.as_deref() == Some(kid)),
            None => !self.keys.is_empty(),
        }
    }
}

/// One JWK into a [`Key`], or `None` when it cannot verify signatures.
fn key(value: serde_json::Value) -> Option<Key> {
    let alg = match value.get("alg") {
        None | Some(serde_json::Value::Null) => None,
        Some(a) => Some(Algorithm::from_str(a.as_str()?).ok()?),
    };
    let jwk: Jwk = serde_json::from_value(value).ok()?;
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
    {
        return None;
    }
    let kind = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => KeyKind::Rsa,
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => KeyKind::P256,
            EllipticCurve::P384 => KeyKind::P384,
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) => match p.curve {
            EllipticCurve::Ed25519 => KeyKind::Ed25519,
            _ => return None,
        },
        AlgorithmParameters::OctetKey(_) => KeyKind::Hmac,
        _ => return None,
    };
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    let k = Key {
        kid: jwk.common.key_id,
        alg,
        kind,
        key,
    };
    // A JWK `alg` of another family (say an RSA key marked ES256) can verify nothing.
    k.alg.is_none_or(|a| k.fits(a)).then_some(k)
}

/// No keys are available for a remote set (never fetched successfully).
#[derive(Debug, Clone, thiserror::Error)]
#[error("no keys available from {uri}: {reason}")]
pub(crate) struct JwksUnavailable {
    /// The JWKS URI.
    pub uri: String,
    /// The last fetch error.
    pub reason: String,
}

/// A fetched key set, shared by every table that names its URI.
pub(crate) struct RemoteJwks {
    uri: Uri,
    keys: ArcSwap<KeySet>,
    fetch: tokio::sync::Mutex<FetchState>,
}

impl std::fmt::Debug for RemoteJwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteJwks")
            .field("uri", &self.uri)
            .field("keys", &*self.keys.load())
            .finish()
    }
}

#[derive(Debug, Default)]
struct FetchState {
    /// Start of the last fetch, successful or not.
    last_attempt: Option<Instant>,
    /// Start of the last fetch triggered by an unknown `kid` while keys were present.
    last_refetch: Option<Instant>,
    /// End of the last successful fetch (staleness).
    last_success: Option<Instant>,
    /// Why the last fetch failed, for [`JwksUnavailable`].
    last_error: Option<String>,
}

impl RemoteJwks {
    /// An empty set for `uri`; keys arrive with the first fetch.
    pub fn new(uri: Uri) -> Self {
        Self {
            uri,
            keys: ArcSwap::from_pointee(KeySet::default()),
            fetch: tokio::sync::Mutex::new(FetchState::default()),
        }
    }

    /// The current keys, fetching first when they cannot answer for `kid` (rate-limited).
    pub async fn keys_for(
        self: &Arc<Self>,
        kid: Option<&str>,
        shared: &Arc<AuthShared>,
    ) -> Result<Arc<KeySet>, JwksUnavailable> {
        let current = self.keys.load_full();
        if current.knows(kid) {
            if current
                .fetched
                .is_none_or(|t| t.elapsed() >= shared.options.jwks_max_age)
            {
                self.refresh_if_stale(shared);
            }
            return Ok(current);
        }
        let mut state = self.fetch.lock().await;
        // Another request may have fetched while this one waited.
        let current = self.keys.load_full();
        if current.knows(kid) {
            return Ok(current);
        }
        // Rate limit: with keys, unknown-kid refetches (so the first new kid after a
        // rotation is served at once); without, any attempt (so a dead endpoint is not
        // called by every request).
        let last = if state.last_success.is_some() {
            state.last_refetch
        } else {
            state.last_attempt
        };
        if last.is_some_and(|t| t.elapsed() < shared.options.jwks_min_refetch_interval) {
            return self.unavailable_unless_any(current, &state);
        }
        if state.last_success.is_some() {
            state.last_refetch = Some(Instant::now());
        }
        self.fetch_into(&mut state, shared).await;
        let current = self.keys.load_full();
        if current.knows(kid) {
            Ok(current)
        } else {
            self.unavailable_unless_any(current, &state)
        }
    }

    /// The first fetch, unless one already succeeded or was attempted within the refetch
    /// interval (table build calls this so the first request finds keys).
    pub async fn prefetch(self: Arc<Self>, shared: Arc<AuthShared>) {
        let mut state = self.fetch.lock().await;
        let min_interval = shared.options.jwks_min_refetch_interval;
        if state.last_success.is_some()
            || state
                .last_attempt
                .is_some_and(|t| t.elapsed() < min_interval)
        {
            return;
        }
        self.fetch_into(&mut state, &shared).await;
    }

    /// Keys when there are any (the token just names an unknown `kid`), else an error.
    fn unavailable_unless_any(
        &self,
        current: Arc<KeySet>,
        state: &FetchState,
    ) -> Result<Arc<KeySet>, JwksUnavailable> {
        if state.last_success.is_some() {
            Ok(current)
        } else {
            Err(JwksUnavailable {
                uri: self.uri.to_string(),
                reason: state
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "not fetched yet".into()),
            })
        }
    }

    /// Starts a background refresh when the keys are older than the maximum age and no
    /// fetch is running or was attempted within the refetch interval. Called only for a set
    /// already seen to be stale, so fresh sets cost no lock.
    fn refresh_if_stale(self: &Arc<Self>, shared: &Arc<AuthShared>) {
        let Ok(mut state) = self.fetch.try_lock() else {
            return;
        };
        let stale = state
            .last_success
            .is_none_or(|t| t.elapsed() >= shared.options.jwks_max_age);
        let limited = state
            .last_attempt
            .is_some_and(|t| t.elapsed() < shared.options.jwks_min_refetch_interval);
        if !stale || limited {
            return;
        }
        // Claim the attempt now so concurrent requests do not spawn more refreshes.
        state.last_attempt = Some(Instant::now());
        drop(state);
        let (this, shared) = (self.clone(), shared.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut state = this.fetch.lock().await;
                this.fetch_into(&mut state, &shared).await;
            });
        }
    }

    /// One fetch; on success the new keys replace the old, on failure the old stay.
    async fn fetch_into(&self, state: &mut FetchState, shared: &AuthShared) {
        state.last_attempt = Some(Instant::now());
        match self.fetch_once(shared).await {
            Ok(mut set) => {
                tracing::debug!(uri = %self.uri, keys = set.keys.len(), "auth: JWKS fetched");
                set.fetched = Some(Instant::now());
                self.keys.store(Arc::new(set));
                state.last_success = Some(Instant::now());
                state.last_error = None;
                shared.metrics.jwks_fetch(true);
            }
            Err(reason) => {
                tracing::warn!(uri = %self.uri, error = %reason, "auth: JWKS fetch failed; keeping the last keys");
                state.last_error = Some(reason);
                shared.metrics.jwks_fetch(false);
            }
        }
    }

    async fn fetch_once(&self, shared: &AuthShared) -> Result<KeySet, String> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(self.uri.clone())
            .header(
                http::header::ACCEPT,
                "application/json, application/jwk-set+json",
            )
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let (status, body) = shared.http.send(req).await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("status {status}"));
        }
        KeySet::parse(&body).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(keys: serde_json::Value) -> Result<KeySet, JwksParseError> {
        KeySet::parse(json!({ "keys": keys }).to_string().as_bytes())
    }

    fn kids(s: &KeySet, kid: Option<&str>, alg: Algorithm) -> Vec<Option<String>> {
        s.candidates(kid, alg).map(|k| k.kid.clone()).collect()
    }

    #[test]
    fn keys_are_tied_to_their_type_curve_and_alg() {
        let s = set(json!([
            {"kty": "RSA", "kid": "r", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "r256", "alg": "RS256", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "kid": "p256", "crv": "P-256", "x": "AQAB", "y": "AQAB"},
            {"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AQAB", "y": "AQAB"},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "AQAB"},
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},
        ]))
        .unwrap();
        assert_eq!(
            kids(&s, None, Algorithm::RS256),
            [Some("r".into()), Some("r256".into())]
        );
        assert_eq!(
            kids(&s, None, Algorithm::RS384),
            [Some("r".into())],
            "alg pins the key"
        );
        assert_eq!(kids(&s, None, Algorithm::ES256), [Some("p256".into())]);
        assert_eq!(kids(&s, None, Algorithm::ES384), [Some("p384".into())]);
        assert_eq!(kids(&s, None, Algorithm::EdDSA), [Some("ed".into())]);
        assert_eq!(kids(&s, None, Algorithm::HS256), [Some("h".into())]);
        assert_eq!(
            kids(&s, Some("r"), Algorithm::HS256),
            Vec::<Option<String>>::new()
        );
        assert_eq!(
            kids(&s, Some("p256"), Algorithm::ES256),
            [Some("p256".into())]
        );
        assert!(s.knows(Some("ed")) && !s.knows(Some("nope")) && s.knows(None));
    }

    #[test]
    fn keys_that_cannot_verify_are_dropped() {
        let s = set(json!([
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "oaep", "alg": "RSA-OAEP", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "mismatch", "alg": "ES256", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "kid": "p521", "crv": "P-521", "x": "AQAB", "y": "AQAB"},
            {"kty": "OKP", "kid": "x", "crv": "X25519", "x": "AQAB"},
            {"kty": "weird", "kid": "w"},
            {"kty": "RSA", "kid": "ok", "use": "sig", "n": "AQAB", "e": "AQAB"},
        ]))
        .unwrap();
        assert_eq!(format!("{s:?}"), r#"KeySet { kids: [Some("ok")] }"#);
    }

    #[test]
    fn documents_without_usable_keys_are_refused() {
        assert_eq!(set(json!([])).unwrap_err(), JwksParseError::NoUsableKey);
        assert!(matches!(
            KeySet::parse(b"{\"nokeys\": 1}"),
            Err(JwksParseError::Malformed(_))
        ));
        assert!(matches!(
            KeySet::parse(b"<html>"),
            Err(JwksParseError::Malformed(_))
        ));
    }
}
