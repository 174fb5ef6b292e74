//! Signed JWTs. In: a [`tollgate_api::policy::Jwt`] (per table) and a presented token (per
//! request). Out: the token's claims as the identity, or why it was refused.
//!
//! Verification, with [`jsonwebtoken`]:
//! - the header `alg` must be one we verify (RS/PS 256/384/512, ES256/384, EdDSA, HS256/384/512;
//!   `none` does not parse) and must fit the key: its type and curve, and the JWK `alg` when
//!   the key names one, so a public key can never be used as an HMAC secret;
//! - the signature must verify with a key of the JWKS (by `kid` when the header has one);
//! - `exp` is required; `exp` and `nbf` are checked with [`LEEWAY_SECS`] of leeway, and a
//!   claim of the wrong JSON type is refused (not ignored);
//! - `iss` must equal the issuer; `aud` must contain one of the audiences when any are set.
//!
//! A verified token is cached until its `exp`, and at most
//! [`super::AuthOptions::jwks_max_age`], keyed by the verifier's configuration (a SHA-256
//! fingerprint computed once per table) and the token itself, compared in full: a repeat
//! caller costs one fast hash of the token, a lookup and a comparison, and a token verified for
//! one issuer/audience/key source is never accepted for another. Only verified tokens enter
//! the cache, which is bounded by [`super::AuthOptions::token_cache_capacity`].

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, Validation};
use sha2::{Digest, Sha256};
use tollgate_api::policy::Jwt;

use super::jwks::{KeySet, RemoteJwks};
use super::{AuthBuildError, AuthShared, Failure};

/// Clock skew tolerated on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 30;

/// At most this many keys are tried for a token without `kid`.
const MAX_KEYS_TRIED: usize = 8;

/// Where a verifier's keys come from.
#[derive(Debug, Clone)]
enum Keys {
    /// Inline in the table: parsed at build.
    Inline(Arc<KeySet>),
    /// Fetched and shared through the [`super::AuthState`].
    Remote(Arc<RemoteJwks>),
}

/// A verified token, as cached.
#[derive(Debug, Clone)]
pub(crate) struct CachedToken {
    claims: Arc<serde_json::Value>,
    /// `exp`, seconds since the epoch.
    exp: u64,
    /// Verified at most `jwks_max_age` ago: a key removed from the JWKS stops being honoured
    /// through the cache within the same bound as through the key set.
    until: Instant,
}

/// The compiled JWT method.
#[derive(Debug, Clone)]
pub(crate) struct JwtVerifier {
    keys: Keys,
    validation: Validation,
    /// SHA-256 over issuer, audiences and key source: the cache namespace.
    fingerprint: [u8; 32],
}

impl JwtVerifier {
    /// Compiles a method: inline keys parsed, a remote set looked up (or created) in the state.
    pub fn compile(
        jwt: &Jwt,
        method: &str,
        shared: &Arc<AuthShared>,
    ) -> Result<Self, AuthBuildError> {
        let keys = match (&jwt.jwks, &jwt.jwks_uri) {
            (Some(inline), _) => {
                Keys::Inline(Arc::new(KeySet::parse(inline.as_bytes()).map_err(|e| {
                    AuthBuildError::Jwks {
                        method: method.to_owned(),
                        message: e.to_string(),
                    }
                })?))
            }
            (None, Some(uri)) => Keys::Remote(shared.remote_jwks(uri, method)?),
            (None, None) => {
                return Err(AuthBuildError::Jwks {
                    method: method.to_owned(),
                    message: "neither jwks nor jwksUri is set".into(),
                });
            }
        };
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = LEEWAY_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_issuer(&[&jwt.issuer]);
        let mut required = vec!["exp", "iss"];
        if jwt.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&jwt.audiences);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);

        let mut h = Sha256::new();
        h.update(b"jwt\0");
        h.update(jwt.issuer.as_bytes());
        for a in &jwt.audiences {
            h.update(b"\0aud\0");
            h.update(a.as_bytes());
        }
        match (&jwt.jwks, &jwt.jwks_uri) {
            (Some(inline), _) => {
                h.update(b"\0inline\0");
                h.update(inline.as_bytes());
            }
            (None, uri) => {
                h.update(b"\0uri\0");
                h.update(uri.as_deref().unwrap_or_default().as_bytes());
            }
        }
        Ok(Self {
            keys,
            validation,
            fingerprint: h.finalize().into(),
        })
    }

    /// Starts fetching remote keys so the first request finds them (no-op for inline keys or
    /// outside a runtime).
    pub fn prefetch(&self, shared: &Arc<AuthShared>) {
        if let (Keys::Remote(remote), Ok(rt)) = (&self.keys, tokio::runtime::Handle::try_current())
        {
            rt.spawn(remote.clone().prefetch(shared.clone()));
        }
    }

    /// Verifies `token`; the claims on success.
    pub async fn verify(
        &self,
        token: &str,
        shared: &Arc<AuthShared>,
    ) -> Result<Arc<serde_json::Value>, Failure> {
        let lookup = TokenRef {
            fingerprint: &self.fingerprint,
            token,
        };
        let now = unix_now();
        if let Some(hit) = shared.tokens.get(&lookup) {
            if now < hit.exp && Instant::now() < hit.until {
                shared
                    .metrics
                    .cache_lookup(super::metrics::Cache::Jwt, true);
                return Ok(hit.claims);
            }
            shared.tokens.remove(&lookup);
        }
        shared
            .metrics
            .cache_lookup(super::metrics::Cache::Jwt, false);

        let header =
            jsonwebtoken::decode_header(token).map_err(|_| Failure::Invalid("malformed token"))?;
        let alg = header.alg;
        let kid = header.kid.as_deref();
        let keys = match &self.keys {
            Keys::Inline(k) => k.clone(),
            Keys::Remote(r) => r
                .keys_for(kid, shared)
                .await
                .map_err(|e| Failure::Unavailable(e.to_string()))?,
        };
        let mut validation = self.validation.clone();
        validation.algorithms = vec![alg];
        let mut last = Failure::Invalid("no key for the token's kid and alg");
        for key in keys.candidates(kid, alg).take(MAX_KEYS_TRIED) {
            match jsonwebtoken::decode::<serde_json::Value>(token, key.decoding_key(), &validation)
            {
                Ok(data) => {
                    let claims = Arc::new(data.claims);
                    if let Some(exp) = exp_of(&claims) {
                        shared.tokens.insert(
                            TokenKey {
                                fingerprint: self.fingerprint,
                                token: token.into(),
                            },
                            CachedToken {
                                claims: claims.clone(),
                                exp,
                                until: Instant::now() + shared.options.jwks_max_age,
                            },
                        );
                    }
                    return Ok(claims);
                }
                Err(e) => {
                    last = Failure::Invalid(reason(e.kind()));
                    // Claims failing validation will fail with every key.
                    if !matches!(
                        e.kind(),
                        jsonwebtoken::errors::ErrorKind::InvalidSignature
                            | jsonwebtoken::errors::ErrorKind::InvalidKeyFormat
                            | jsonwebtoken::errors::ErrorKind::InvalidEcdsaKey
                            | jsonwebtoken::errors::ErrorKind::InvalidEddsaKey
                            | jsonwebtoken::errors::ErrorKind::InvalidRsaKey(_)
                    ) {
                        break;
                    }
                }
            }
        }
        Err(last)
    }
}

/// The key of a cached token: the verifier's fingerprint and the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenKey {
    fingerprint: [u8; 32],
    token: Box<str>,
}

/// A [`TokenKey`] as a request looks it up, without copying the token.
#[derive(Debug, Clone, Copy)]
struct TokenRef<'a> {
    fingerprint: &'a [u8; 32],
    token: &'a str,
}

impl TokenRef<'_> {
    fn hash_into<H: Hasher>(self, state: &mut H) {
        state.write(self.fingerprint);
        state.write(self.token.as_bytes());
    }
}

impl Hash for TokenKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        TokenRef {
            fingerprint: &self.fingerprint,
            token: &self.token,
        }
        .hash_into(state);
    }
}

impl Hash for TokenRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.hash_into(state);
    }
}

impl quick_cache::Equivalent<TokenKey> for TokenRef<'_> {
    fn equivalent(&self, key: &TokenKey) -> bool {
        *self.fingerprint == key.fingerprint && self.token == &*key.token
    }
}

/// `exp` as whole seconds (validated present and numeric before this is called).
fn exp_of(claims: &serde_json::Value) -> Option<u64> {
    let exp = claims.get("exp")?;
    exp.as_u64().or_else(|| {
        exp.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            // Truncation is the point: the cache must not outlive the token.
            .map(|f| f as u64)
    })
}

/// A short, fixed reason for logs (never the token).
fn reason(kind: &jsonwebtoken::errors::ErrorKind) -> &'static str {
    use jsonwebtoken::errors::ErrorKind as K;
    match kind {
        K::InvalidSignature => "bad signature",
        K::ExpiredSignature => "expired",
        K::ImmatureSignature => "not yet valid",
        K::InvalidIssuer => "wrong issuer",
        K::InvalidAudience => "wrong audience",
        K::MissingRequiredClaim(_) => "missing required claim",
        K::InvalidClaimFormat(_) => "malformed claim",
        K::InvalidAlgorithm => "algorithm not allowed",
        _ => "invalid token",
    }
}

/// Seconds since the epoch (0 if the clock is before it, which only makes tokens look expired).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
