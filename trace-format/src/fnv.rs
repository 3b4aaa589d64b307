//! FNV-1a, 64 bits: the one stable hash the project's recorded values are built on — a
//! trace's content hash ([`crate::reader::content_hash`]), capture's prefix block hashes and
//! session chains, replay's prompt hashes. Stable across machines, runs and versions: the
//! hashes are stored in traces and results, so this must never change.

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
}
