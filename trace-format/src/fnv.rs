//! The stable hashes, once: FNV-1a, 64 bits — what the project's recorded values are built
//! on (a trace's content hash, [`crate::reader::content_hash`], capture's prefix block
//! hashes and session chains, replay's prompt hashes) — and SplitMix64, the mixing step and
//! the sampling draw every crate uses. Stable across machines, runs and versions: the hashes
//! are stored in traces and results, so none of this may change.

/// The offset basis: the hash of no bytes.
pub const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a of `bytes`, continuing from `h` ([`OFFSET`] to start).
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// SplitMix64's increment (the golden ratio's 64-bit fraction).
pub const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's finaliser: spreads `z` over all 64 bits (a bijection).
pub fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64 of `x`: its finaliser after the increment.
pub fn splitmix64(x: u64) -> u64 {
    finalize(x.wrapping_add(GOLDEN))
}

/// Whether `key` falls in a sample of `rate` (0..=1): SplitMix64 of the key spreads similar
/// keys, so a rate keeps about that share of any keys, the same ones on every run.
pub fn drawn(key: u64, rate: f64) -> bool {
    rate >= 1.0 || (splitmix64(key) as f64 / u64::MAX as f64) < rate
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published FNV-1a 64 test vectors.
    #[test]
    fn matches_the_reference_vectors() {
        assert_eq!(fnv1a(OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
        // Continuing is hashing the concatenation.
        assert_eq!(
            fnv1a(fnv1a(OFFSET, b"foo"), b"bar"),
            fnv1a(OFFSET, b"foobar")
        );
    }

    /// SplitMix64's published first outputs from seed 0 (the state advanced by the increment
    /// each step), and a draw keeps about its rate's share.
    #[test]
    fn splitmix64_matches_its_reference_and_draws_its_rate() {
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(GOLDEN), 0x6e78_9e6a_a1b9_65f4);
        let kept = (0..100_000u64).filter(|&k| drawn(k, 0.25)).count();
        assert!((24_000..26_000).contains(&kept), "{kept}");
        assert!((0..1000u64).all(|k| drawn(k, 1.0)));
        assert!(!(0..1000u64).any(|k| drawn(k, 0.0)));
    }
}
