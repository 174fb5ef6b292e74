//! Consistent hashing for the `ConsistentHash` balancer. In: a backend's endpoints, and a
//! request's key bytes (a header, a cookie, the client address, a CEL value). Out: the
//! endpoint order on a hash ring from the key's point, which the balancer walks for the
//! first endpoint that is available and under its bounded load.
//!
//! Each endpoint has many points on the ring, placed by a hash of its address only, so every
//! proxy replica builds the same ring and adding or removing one of N endpoints moves about
//! 1/N of the keys. The hash is FNV-1a with a 64-bit finalizer: stable across builds and
//! platforms (std's hasher promises neither).

/// Points on the ring for all endpoints together, about: few endpoints get many points each,
/// so that each one's share of the keys is even (within a few percent).
const RING_POINTS: usize = 16_384;
/// Fewest and most points per endpoint.
const MIN_POINTS: usize = 64;
const MAX_POINTS: usize = 2_048;

/// The ring: points sorted by hash, each naming an endpoint by index.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// A ring over endpoints whose identities are `keys` (their addresses), by index.
    pub fn build<K: AsRef<[u8]>>(keys: &[K]) -> Self {
        if keys.is_empty() {
            return Self::default();
        }
        let per = (RING_POINTS / keys.len()).clamp(MIN_POINTS, MAX_POINTS);
        let mut points = Vec::with_capacity(per * keys.len());
        for (i, k) in keys.iter().enumerate() {
            let base = hash(k.as_ref());
            let idx = u32::try_from(i).unwrap_or(u32::MAX);
            for p in 0..per as u64 {
                points.push((mix(base ^ mix(p + 1)), idx));
            }
        }
        points.sort_unstable();
        Self { points }
    }

    /// Endpoint indices in ring order from `key`'s point (repeats included: the walker
    /// skips what it has seen).
    pub fn walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.points.partition_point(|&(h, _)| h < key);
        self.points[start..]
            .iter()
            .chain(&self.points[..start])
            .map(|&(_, i)| i as usize)
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
        for n in [2, 3, 5, 10] {
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
        let n = 5;
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
        // The ideal is 1/6 and 1/5 of the keys; only those move (within a few percent).
        assert!((on_add - 1.0 / 6.0).abs() < 0.03, "{on_add}");
        assert!((on_remove - 1.0 / 5.0).abs() < 0.03, "{on_remove}");
    }

    #[test]
    fn the_hash_is_stable() {
        // Pinned: every replica, on every build, must agree.
        assert_eq!(hash(b"alice"), hash(b"alice"));
        assert_eq!(hash(b""), mix(0xcbf2_9ce4_8422_2325));
        assert_ne!(hash(b"alice"), hash(b"alicf"));
    }
}
