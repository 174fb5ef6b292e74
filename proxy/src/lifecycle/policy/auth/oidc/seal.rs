//! Sealed cookies. In: the policy's cookie keys (once per table) and, per request, the
//! `Cookie` header fields or a payload to seal. Out: the opened payload (or nothing when no
//! key opens it), and `Set-Cookie` values, split into chunks when one cookie would be too big.
//!
//! A sealed value is `base64url(version ‖ key id ‖ nonce ‖ AES-256-GCM(payload) ‖ tag)`:
//! - each configured key goes through HKDF-SHA256 into an AES-256-GCM key and a 4-byte key
//!   id, so any string of 32 bytes or more is a key, and the id picks the key that opens a
//!   cookie without trying them all;
//! - the first key seals, every key opens: rotation adds a new key first, and cookies sealed
//!   with the old one keep working until it is removed;
//! - the associated data binds a cookie to its kind (session or login in progress) and to
//!   the policy (issuer, client id, cookie name), so a cookie of one kind or policy never
//!   opens as another;
//! - the nonce is 96 random bits per sealing.
//!
//! A session cookie larger than [`CHUNK`] is split: `<name>` holds the first part, `<name>_1`
//! to `<name>_7` the rest, read back in order until one is missing.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// Format version, the first byte of a sealed value.
const VERSION: u8 = 1;
/// Key id length.
const KID_LEN: usize = 4;
/// Largest cookie value per `Set-Cookie`: with its name and attributes under the 4096
/// bytes browsers keep per cookie.
pub(super) const CHUNK: usize = 3800;
/// At most this many chunks (about 30 KB of cookies).
pub(super) const MAX_CHUNKS: usize = 8;

/// Attributes of every cookie the method sets.
const ATTRIBUTES: &str = "; Path=/; Secure; HttpOnly; SameSite=Lax";

/// Why keys could not be derived (not reached with keys the compiler checked).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SealError {
    /// No key.
    #[error("no cookie key")]
    NoKey,
    /// HKDF refused the output length (a ring invariant).
    #[error("cookie key derivation failed")]
    Derive,
}

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// The cookie keys of one method: the first seals, all open.
pub(crate) struct CookieKeys {
    keys: Vec<([u8; KID_LEN], LessSafeKey)>,
    rng: SystemRandom,
}

impl std::fmt::Debug for CookieKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieKeys")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl CookieKeys {
    /// Derives the keys from the configured strings.
    pub fn derive(raw: &[String]) -> Result<Self, SealError> {
        if raw.is_empty() {
            return Err(SealError::NoKey);
        }
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"tollgate oidc cookie");
        let keys = raw
            .iter()
            .map(|k| {
                let prk = salt.extract(k.as_bytes());
                let mut kid = [0u8; KID_LEN];
                prk.expand(&[b"key id"], Len(KID_LEN))
                    .and_then(|okm| okm.fill(&mut kid))
                    .map_err(|_| SealError::Derive)?;
                let aead: UnboundKey = prk
                    .expand(&[b"aes-256-gcm"], &AES_256_GCM)
                    .map_err(|_| SealError::Derive)?
                    .into();
                Ok((kid, LessSafeKey::new(aead)))
            })
            .collect::<Result<Vec<_>, SealError>>()?;
        Ok(Self {
            keys,
            rng: SystemRandom::new(),
        })
    }

    /// Seals `payload` with the first key, bound to `aad`. `None` only when the OS gives no
    /// randomness.
    pub fn seal(&self, aad: &[u8], payload: &[u8]) -> Option<String> {
        let (kid, key) = self.keys.first()?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(1 + KID_LEN + NONCE_LEN + payload.len() + 16);
        out.push(VERSION);
        out.extend_from_slice(kid);
        out.extend_from_slice(&nonce);
        let start = out.len();
        out.extend_from_slice(payload);
        let mut body = out.split_off(start);
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut body,
        )
        .ok()?;
        out.extend_from_slice(&body);
        Some(URL_SAFE_NO_PAD.encode(out))
    }

    /// Opens a sealed value bound to `aad`; `None` when it is malformed, its key is not
    /// configured (any more), or it was altered.
    pub fn open(&self, aad: &[u8], sealed: &str) -> Option<Vec<u8>> {
        let mut raw = URL_SAFE_NO_PAD.decode(sealed).ok()?;
        if raw.len() < 1 + KID_LEN + NONCE_LEN + 16 || raw[0] != VERSION {
            return None;
        }
        let (_, key) = self
            .keys
            .iter()
            .find(|(kid, _)| kid[..] == raw[1..1 + KID_LEN])?;
        let nonce =
            Nonce::try_assume_unique_for_key(&raw[1 + KID_LEN..1 + KID_LEN + NONCE_LEN]).ok()?;
        let body = &mut raw[1 + KID_LEN + NONCE_LEN..];
        let plain = key.open_in_place(nonce, Aad::from(aad), body).ok()?;
        Some(plain.to_vec())
    }
}

/// The method's cookies in a request.
#[derive(Debug, Default)]
pub(super) struct RequestCookies {
    /// The session value, its chunks joined; `None` without `<name>`.
    pub session: Option<String>,
    /// Chunks present (`<name>` and `<name>_N`), to clear the ones a new value leaves over.
    pub chunks: usize,
    /// The login in progress (`<name>_login`).
    pub login: Option<String>,
}

/// Reads the cookies named after `name` from every `Cookie` field.
pub(super) fn request_cookies(headers: &HeaderMap, name: &str) -> RequestCookies {
    let mut parts: [Option<&str>; MAX_CHUNKS] = [None; MAX_CHUNKS];
    let mut login = None;
    for field in headers.get_all(http::header::COOKIE) {
        let Ok(field) = field.to_str() else { continue };
        for pair in field.split(';') {
            let Some((k, v)) = pair.trim().split_once('=') else {
                continue;
            };
            let Some(rest) = k.strip_prefix(name) else {
                continue;
            };
            if rest.is_empty() {
                parts[0] = Some(v);
            } else if rest == "_login" {
                login = Some(v.to_owned());
            } else if let Some(i) = rest
                .strip_prefix('_')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|i| (1..MAX_CHUNKS).contains(i))
            {
                parts[i] = Some(v);
            }
        }
    }
    let chunks = parts.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    let session = parts[0].map(|first| {
        let mut s = first.to_owned();
        for p in parts[1..].iter().map_while(|p| *p) {
            s.push_str(p);
        }
        s
    });
    RequestCookies {
        session,
        chunks,
        login,
    }
}

/// `Set-Cookie` values carrying `sealed` as `<name>`, `<name>_1`, ..., and clearing chunks
/// `had` says the client holds beyond them. `None` when it needs more than [`MAX_CHUNKS`].
pub(super) fn set_session(name: &str, sealed: &str, had: usize) -> Option<Vec<HeaderValue>> {
    let pieces: Vec<&str> = sealed
        .as_bytes()
        .chunks(CHUNK)
        // base64url is ASCII: every split is on a character boundary.
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    if pieces.len() > MAX_CHUNKS {
        return None;
    }
    let mut out = Vec::with_capacity(pieces.len().max(had));
    for (i, p) in pieces.iter().enumerate() {
        out.push(HeaderValue::try_from(format!("{}={p}{ATTRIBUTES}", chunk_name(name, i))).ok()?);
    }
    for i in pieces.len()..had {
        out.push(clear(&chunk_name(name, i))?);
    }
    Some(out)
}

/// `Set-Cookie` values removing the session (`had` chunks, at least the first).
pub(super) fn clear_session(name: &str, had: usize) -> Vec<HeaderValue> {
    (0..had.max(1))
        .filter_map(|i| clear(&chunk_name(name, i)))
        .collect()
}

/// A `Set-Cookie` for the login in progress, readable only on the redirect path, for at most
/// `max_age` seconds.
pub(super) fn set_login(name: &str, sealed: &str, path: &str, max_age: u64) -> Option<HeaderValue> {
    HeaderValue::try_from(format!(
        "{name}_login={sealed}; Path={path}; Max-Age={max_age}; Secure; HttpOnly; SameSite=Lax"
    ))
    .ok()
}

/// A `Set-Cookie` removing the login in progress.
pub(super) fn clear_login(name: &str, path: &str) -> Option<HeaderValue> {
    HeaderValue::try_from(format!(
        "{name}_login=; Path={path}; Max-Age=0; Secure; HttpOnly; SameSite=Lax"
    ))
    .ok()
}

fn chunk_name(name: &str, i: usize) -> String {
    if i == 0 {
        name.to_owned()
    } else {
        format!("{name}_{i}")
    }
}

fn clear(cookie: &str) -> Option<HeaderValue> {
    HeaderValue::try_from(format!("{cookie}=; Max-Age=0{ATTRIBUTES}")).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn keys(k: &[&str]) -> CookieKeys {
        CookieKeys::derive(&k.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    const OLD: &str = "old key, at least thirty-two bytes long";
    const NEW: &str = "new key, at least thirty-two bytes long";

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = keys(&[OLD]);
        let sealed = old.seal(b"s", b"payload").unwrap();
        assert_eq!(old.open(b"s", &sealed).unwrap(), b"payload");
        let rotated = keys(&[NEW, OLD]);
        assert_eq!(rotated.open(b"s", &sealed).unwrap(), b"payload");
        let resealed = rotated.seal(b"s", b"payload").unwrap();
        assert!(
            old.open(b"s", &resealed).is_none(),
            "sealed with the new key"
        );
        assert!(keys(&[NEW]).open(b"s", &sealed).is_none(), "old key gone");
    }

    #[test]
    fn altered_values_and_other_contexts_do_not_open() {
        let k = keys(&[OLD]);
        let sealed = k.seal(b"session", b"payload").unwrap();
        assert!(k.open(b"login", &sealed).is_none());
        let mut raw = URL_SAFE_NO_PAD.decode(&sealed).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        assert!(k.open(b"session", &URL_SAFE_NO_PAD.encode(&raw)).is_none());
        assert!(k.open(b"session", "not base64!").is_none());
        assert!(k.open(b"session", "").is_none());
    }

    #[test]
    fn big_values_are_chunked_and_read_back_in_order() {
        let value = "a".repeat(CHUNK * 2 + 10);
        let set = set_session("s", &value, 5).unwrap();
        assert_eq!(set.len(), 5, "3 chunks and 2 cleared");
        assert!(set[3].to_str().unwrap().starts_with("s_3=; Max-Age=0"));
        let cookie = set[..3]
            .iter()
            .rev()
            .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join("; ");
        let mut h = HeaderMap::new();
        h.insert(http::header::COOKIE, HeaderValue::try_from(cookie).unwrap());
        h.append(
            http::header::COOKIE,
            HeaderValue::from_static("other=1; s_login=x"),
        );
        let got = request_cookies(&h, "s");
        assert_eq!(got.session.as_deref(), Some(value.as_str()));
        assert_eq!(got.chunks, 3);
        assert_eq!(got.login.as_deref(), Some("x"));
        assert!(set_session("s", &"a".repeat(CHUNK * MAX_CHUNKS + 1), 0).is_none());
    }
}
