//! API keys. In: the table's SHA-256 digests (built once per table) and a presented key (per
//! request). Out: the identity of the matching Secret (its metadata JSON, never the key).
//!
//! The presented key is hashed and compared with every digest in constant time, without an
//! early exit, so neither the position nor the prefix of a match shows in the timing.
//! Nothing is cached outside the compiled table: revoking a key is a new table without it.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tollgate_api::policy::ApiKeys;

use super::AuthBuildError;

/// The compiled keys of one method.
#[derive(Clone)]
pub(crate) struct ApiKeyVerifier {
    keys: Arc<[([u8; 32], Arc<serde_json::Value>)]>,
}

impl std::fmt::Debug for ApiKeyVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyVerifier")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl ApiKeyVerifier {
    /// Decodes the digests; a digest that is not 64 hex digits is a build error.
    pub fn compile(keys: &ApiKeys, method: &str) -> Result<Self, AuthBuildError> {
        let keys = keys
            .keys
            .iter()
            .enumerate()
            .map(|(index, k)| {
                let digest =
                    decode_hex32(&k.sha256).ok_or_else(|| AuthBuildError::ApiKeyDigest {
                        method: method.to_owned(),
                        index,
                    })?;
                Ok((digest, Arc::new(k.identity.clone())))
            })
            .collect::<Result<Vec<_>, AuthBuildError>>()?;
        Ok(Self { keys: keys.into() })
    }

    /// The identity of the key `presented`, if it is one of ours.
    pub fn verify(&self, presented: &str) -> Option<Arc<serde_json::Value>> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (d, identity) in self.keys.iter() {
            if bool::from(d.ct_eq(&digest)) && found.is_none() {
                found = Some(identity);
            }
        }
        found.cloned()
    }
}

/// 64 hex digits (either case) into 32 bytes.
fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(hi << 4 | lo).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tollgate_api::policy::ApiKey;

    pub(crate) fn hex_sha256(s: &str) -> String {
        Sha256::digest(s.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn keys(pairs: &[(&str, &str)]) -> ApiKeys {
        ApiKeys {
            keys: pairs
                .iter()
                .map(|(key, name)| ApiKey {
                    sha256: hex_sha256(key),
                    identity: json!({"metadata": {"name": name}}),
                })
                .collect(),
        }
    }

    #[test]
    fn a_known_key_yields_its_secret_identity() {
        let v =
            ApiKeyVerifier::compile(&keys(&[("k-alice", "alice"), ("k-bob", "bob")]), "m").unwrap();
        assert_eq!(
            *v.verify("k-bob").unwrap(),
            json!({"metadata": {"name": "bob"}})
        );
        assert_eq!(v.verify("k-carol"), None);
        assert_eq!(v.verify(""), None);
    }

    #[test]
    fn digests_are_read_in_either_case() {
        let mut k = keys(&[("secret", "s")]);
        k.keys[0].sha256 = k.keys[0].sha256.to_uppercase();
        let v = ApiKeyVerifier::compile(&k, "m").unwrap();
        assert!(v.verify("secret").is_some());
    }

    #[test]
    fn malformed_digests_are_refused() {
        for bad in ["abc", &"g".repeat(64), &"a".repeat(63)] {
            let k = ApiKeys {
                keys: vec![ApiKey {
                    sha256: bad.to_owned(),
                    identity: json!({}),
                }],
            };
            assert!(matches!(
                ApiKeyVerifier::compile(&k, "m"),
                Err(AuthBuildError::ApiKeyDigest { index: 0, .. })
            ));
        }
    }
}
