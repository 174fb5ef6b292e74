//! API keys. In: the table's SHA-256 digests (built once per table) and a presented key (per
//! request). Out: the identity of the matching Secret (its metadata JSON, never the key).
//!
//! The presented key is hashed and compared with every digest in constant time, without an
//! early exit, so neither the position nor the prefix of a match shows in the timing.
//!
//! A key found once is remembered by its SipHash-1-3 (128 bits) under a secret drawn from the
//! OS when the table is built, so a repeat caller costs that hash and a lookup instead of a
//! SHA-256 and a scan. Neither form holds the key itself; only keys that matched are
//! remembered, so the memo never outgrows the key list; it belongs to the compiled table:
//! revoking a key is a new table without it, and with it a new, empty memo.

use std::sync::{Arc, PoisonError, RwLock};

use sha2::{Digest, Sha256};
use siphasher::sip128::SipHasher13;
use subtle::ConstantTimeEq;
use tollgate_api::policy::ApiKeys;

use super::AuthBuildError;
use crate::FastMap;

/// The compiled keys of one method.
#[derive(Clone)]
pub(crate) struct ApiKeyVerifier {
    keys: Arc<[([u8; 32], Arc<serde_json::Value>)]>,
    /// Keys that matched before: their keyed hash → index in `keys`.
    memo: Arc<Memo>,
}

struct Memo {
    hasher: SipHasher13,
    found: RwLock<FastMap<u128, usize>>,
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
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| AuthBuildError::Random(e.to_string()))?;
        Ok(Self {
            keys: keys.into(),
            memo: Arc::new(Memo {
                hasher: SipHasher13::new_with_key(&secret),
                found: RwLock::new(FastMap::default()),
            }),
        })
    }

    /// The identity of the key `presented`, if it is one of ours.
    pub fn verify(&self, presented: &str) -> Option<Arc<serde_json::Value>> {
        let memo_key = self.memo.hasher.hash(presented.as_bytes()).as_u128();
        let seen = self
            .memo
            .found
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&memo_key)
            .copied();
        if let Some(i) = seen {
            return self.keys.get(i).map(|(_, identity)| identity.clone());
        }
        let index = self.scan(presented)?;
        self.memo
            .found
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(memo_key, index);
        self.keys.get(index).map(|(_, identity)| identity.clone())
    }

    /// The index of the key whose digest is the presented key's, compared with every digest.
    fn scan(&self, presented: &str) -> Option<usize> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (i, (d, _)) in self.keys.iter().enumerate() {
            if bool::from(d.ct_eq(&digest)) && found.is_none() {
                found = Some(i);
            }
        }
        found
    }

    /// How many keys are remembered (tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.memo
            .found
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
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
    fn only_keys_that_matched_are_remembered_and_a_remembered_key_still_answers() {
        let v =
            ApiKeyVerifier::compile(&keys(&[("k-alice", "alice"), ("k-bob", "bob")]), "m").unwrap();
        for _ in 0..3 {
            assert_eq!(v.verify("k-carol"), None);
            assert_eq!(
                *v.verify("k-alice").unwrap(),
                json!({"metadata": {"name": "alice"}})
            );
        }
        assert_eq!(v.remembered(), 1);
        assert_eq!(
            *v.verify("k-bob").unwrap(),
            json!({"metadata": {"name": "bob"}})
        );
        assert_eq!(v.remembered(), 2);
        // A near miss of a remembered key is not it.
        assert_eq!(v.verify("k-alicf"), None);
        assert_eq!(v.verify("k-alice "), None);
        // Another table's verifier (the key revoked) remembers nothing of this one.
        let revoked = ApiKeyVerifier::compile(&keys(&[("k-bob", "bob")]), "m").unwrap();
        assert_eq!(revoked.verify("k-alice"), None);
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
