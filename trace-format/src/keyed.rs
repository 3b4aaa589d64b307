//! The keyed hash, once: every content-derived value capture writes (a prefix block's hash, a
//! tool's name) goes through [`HashKey`] under the operator's key. Under one key equal
//! contents give equal values, so linking, prefix sharing and the prefix-cache hit rate work
//! as before; without the key a value cannot be recomputed from a guessed prompt, and under
//! two keys no value is equal.
//!
//! The value written is a keyed *permutation* of the content's unkeyed 64-bit hash
//! ([`crate::fnv`]): a 64-bit block cipher, an 8-round Feistel network whose round function is
//! SipHash-2-4 under the key (Luby–Rackoff; a tool name's and a block's values are two
//! different permutations). It is a PRF to whoever lacks the key, exactly as a keyed hash is,
//! and it is what makes a trace re-keyable by the holder of its key ([`HashKey::rekey_u64`],
//! `llmreplay rekey`) although its unkeyed values are never written.
//!
//! Capture keeps its cheap unkeyed chains in memory and finalizes each value it writes here.
//! A trace names its key by [`KeyId`] (the PRF of a fixed label under the key), never by the
//! key. The key lives in a file ([`HashKey::load_or_create`]): 64 hex digits (32 bytes),
//! created 0600 when missing.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use rand::RngCore;

/// What can go wrong with a key file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or created.
    #[error("hash key file {path}: {cause}")]
    Io {
        /// The key file.
        path: PathBuf,
        /// The cause (in the message, so not also a `source`: a chain printer such as
        /// anyhow's would print it twice).
        cause: std::io::Error,
    },
    /// The file does not hold a key.
    #[error(
        "hash key file {path}: {reason} (expected 64 hex digits, e.g. from `openssl rand -hex 32`)"
    )]
    Malformed {
        /// The key file.
        path: PathBuf,
        /// What is wrong (never the file's content).
        reason: String,
    },
}

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;

/// Domain tags, so a tool name's value and a block's come from different permutations, and
/// neither from the key id's PRF.
const TAG_KEY_ID: u8 = 0;
const TAG_U64: u8 = 1;
const TAG_BYTES: u8 = 2;
/// The Feistel round function's inputs.
const TAG_ROUND: u8 = 3;
/// The two halves of a blob's id.
const TAG_BLOB: [u8; 2] = [4, 5];
/// The label whose PRF is a key's id. `v2`: values are the Feistel permutation; `v1`'s
/// (2026-12, a PRF of the unkeyed hash) cannot be re-keyed, and their different key id keeps
/// the two from ever being compared.
const KEY_ID_LABEL: &[u8] = b"llmreplay.key_id.v2";
/// Rounds of the Feistel network.
const ROUNDS: u8 = 8;

/// Which content a keyed value was made from, so a value is re-keyed by its own permutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// A prefix block's chained hash (`prefix_hashes`).
    Block,
    /// A string's (a tool's name: `tool_names`, `tool_call_names` as `h:` and 16 hex digits).
    Bytes,
}

impl Domain {
    fn tag(self) -> u8 {
        match self {
            Domain::Block => TAG_U64,
            Domain::Bytes => TAG_BYTES,
        }
    }
}

/// A hash key: 32 secret bytes, folded into SipHash's 128-bit key. Its `Debug` shows only
/// its [`KeyId`]; it is never serialized.
#[derive(Clone)]
pub struct HashKey {
    k0: u64,
    k1: u64,
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HashKey({})", self.id())
    }
}

/// A key's public name in a trace: 16 hex digits, the PRF of a fixed label under the key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub String);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

impl HashKey {
    /// The key of 32 bytes (its two halves folded into SipHash's 128-bit key).
    pub fn from_bytes(b: &[u8; KEY_BYTES]) -> HashKey {
        HashKey {
            k0: le(&b[0..8]) ^ le(&b[16..24]),
            k1: le(&b[8..16]) ^ le(&b[24..32]),
        }
    }

    /// A fresh random key from the OS, with its bytes (to be kept in a file).
    pub fn generate() -> ([u8; KEY_BYTES], HashKey) {
        let mut b = [0u8; KEY_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut b);
        let k = HashKey::from_bytes(&b);
        (b, k)
    }

    /// A fresh random key kept nowhere (a capture whose hashes need compare with no other).
    pub fn random() -> HashKey {
        HashKey::generate().1
    }

    /// The key in `path` (64 hex digits, surrounding whitespace ignored).
    pub fn load(path: &Path) -> Result<HashKey, KeyError> {
        let text = std::fs::read(path).map_err(|cause| KeyError::Io {
            path: path.to_path_buf(),
            cause,
        })?;
        parse_hex(text.trim_ascii())
            .map(|b| HashKey::from_bytes(&b))
            .map_err(|reason| KeyError::Malformed {
                path: path.to_path_buf(),
                reason,
            })
    }

    /// The key in `path`, created there (32 random bytes as 64 hex digits, mode 0600, never
    /// overwriting a file) when there is none; `true` when it was created.
    pub fn load_or_create(path: &Path) -> Result<(HashKey, bool), KeyError> {
        let io = |cause| KeyError::Io {
            path: path.to_path_buf(),
            cause,
        };
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        match o.open(path) {
            Ok(mut f) => {
                let (bytes, key) = HashKey::generate();
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                f.write_all(format!("{hex}\n").as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(io)?;
                Ok((key, true))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok((HashKey::load(path)?, false))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The key's id, as traces record it.
    pub fn id(&self) -> KeyId {
        KeyId(format!("{:016x}", self.tagged(TAG_KEY_ID, KEY_ID_LABEL)))
    }

    /// The id this key had under the first keyed hash (2026-12, `v1`), to recognise its
    /// traces.
    pub fn id_v1(&self) -> KeyId {
        KeyId(format!(
            "{:016x}",
            self.tagged(TAG_KEY_ID, b"llmreplay.key_id.v1")
        ))
    }

    /// The keyed value of an (unkeyed, internal) 64-bit content hash: a prefix block's.
    pub fn hash_u64(&self, h: u64) -> u64 {
        self.permute(Domain::Block, h)
    }

    /// The keyed value of a content string: a tool's name (the permutation of its unkeyed
    /// FNV-1a 64, so the holder of the key can re-key it).
    pub fn hash_bytes(&self, b: &[u8]) -> u64 {
        self.permute(Domain::Bytes, crate::fnv::fnv1a(crate::fnv::OFFSET, b))
    }

    /// The id of a stored blob ([`crate::blobs`]): 32 hex digits, a 128-bit PRF of its bytes
    /// (two SipHash-2-4 under the key), so no one without the key can make two contents
    /// share one.
    pub fn blob_id(&self, b: &[u8]) -> String {
        format!(
            "{:016x}{:016x}",
            self.tagged(TAG_BLOB[0], b),
            self.tagged(TAG_BLOB[1], b)
        )
    }

    /// The keyed value of the unkeyed hash `h` of `domain`'s content.
    pub fn permute(&self, domain: Domain, h: u64) -> u64 {
        let (mut l, mut r) = ((h >> 32) as u32, h as u32);
        for i in 0..ROUNDS {
            (l, r) = (r, l ^ self.round(domain, i, r));
        }
        u64::from(l) << 32 | u64::from(r)
    }

    /// The unkeyed hash a keyed value of `domain` was made from ([`HashKey::permute`]'s
    /// inverse): only the key's holder can compute it.
    pub fn unpermute(&self, domain: Domain, v: u64) -> u64 {
        let (mut l, mut r) = ((v >> 32) as u32, v as u32);
        for i in (0..ROUNDS).rev() {
            (l, r) = (r ^ self.round(domain, i, l), l);
        }
        u64::from(l) << 32 | u64::from(r)
    }

    /// `v`, a value of `domain` under this key, as it is under `to`.
    pub fn rekey_u64(&self, to: &HashKey, domain: Domain, v: u64) -> u64 {
        to.permute(domain, self.unpermute(domain, v))
    }

    fn round(&self, domain: Domain, i: u8, half: u32) -> u32 {
        let mut b = [0u8; 6];
        b[0] = domain.tag();
        b[1] = i;
        b[2..].copy_from_slice(&half.to_le_bytes());
        self.tagged(TAG_ROUND, &b) as u32
    }

    fn tagged(&self, tag: u8, b: &[u8]) -> u64 {
        let mut s = SipHash24::new(self.k0, self.k1);
        s.write(&[tag]);
        s.write(b);
        s.finish()
    }
}

/// A tool's name as a `hashes` trace writes it: `h:` and the 16 hex digits of its keyed value.
pub fn keyed_name(v: u64) -> String {
    format!("h:{v:016x}")
}

fn parse_hex(t: &[u8]) -> Result<[u8; KEY_BYTES], String> {
    if t.len() != 2 * KEY_BYTES {
        return Err(format!("{} characters", t.len()));
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; KEY_BYTES];
    for (i, pair) in t.chunks_exact(2).enumerate() {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(a), Some(b)) => out[i] = a << 4 | b,
            _ => return Err(format!("a character that is no hex digit at {}", 2 * i)),
        }
    }
    Ok(out)
}

/// SipHash-2-4 (Aumasson and Bernstein), streaming over byte slices.
struct SipHash24 {
    v: [u64; 4],
    tail: u64,
    ntail: usize,
    len: u64,
}

impl SipHash24 {
    fn new(k0: u64, k1: u64) -> Self {
        SipHash24 {
            v: [
                k0 ^ 0x736f_6d65_7073_6575,
                k1 ^ 0x646f_7261_6e64_6f6d,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
            tail: 0,
            ntail: 0,
            len: 0,
        }
    }

    fn round(&mut self) {
        let v = &mut self.v;
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }

    fn block(&mut self, m: u64) {
        self.v[3] ^= m;
        self.round();
        self.round();
        self.v[0] ^= m;
    }

    fn write(&mut self, b: &[u8]) {
        self.len += b.len() as u64;
        for &x in b {
            self.tail |= u64::from(x) << (8 * self.ntail);
            self.ntail += 1;
            if self.ntail == 8 {
                let m = std::mem::take(&mut self.tail);
                self.ntail = 0;
                self.block(m);
            }
        }
    }

    fn finish(mut self) -> u64 {
        let b = self.tail | (self.len & 0xff) << 56;
        self.block(b);
        self.v[2] ^= 0xff;
        for _ in 0..4 {
            self.round();
        }
        self.v[0] ^ self.v[1] ^ self.v[2] ^ self.v[3]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sip(k: &[u8; 16], m: &[u8]) -> u64 {
        let mut s = SipHash24::new(le(&k[0..8]), le(&k[8..16]));
        s.write(m);
        s.finish()
    }

    /// The paper's vectors (key 00..0f; messages 00..n-1), and std's SipHasher (2-4) over
    /// every length to 64, written in pieces.
    #[test]
    fn siphash24_matches_its_reference() {
        let k: [u8; 16] = std::array::from_fn(|i| i as u8);
        let m: Vec<u8> = (0..64u8).collect();
        assert_eq!(sip(&k, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(sip(&k, &m[..15]), 0xa129_ca61_49be_45e5);
        for n in 0..=64 {
            #[allow(deprecated)]
            let mut std = std::hash::SipHasher::new_with_keys(le(&k[0..8]), le(&k[8..16]));
            std::hash::Hasher::write(&mut std, &m[..n]);
            let mut s = SipHash24::new(le(&k[0..8]), le(&k[8..16]));
            let (a, b) = m[..n].split_at(n / 3);
            s.write(a);
            s.write(b);
            assert_eq!(s.finish(), std::hash::Hasher::finish(&std), "length {n}");
        }
    }

    /// Equal under one key, different under another; the id names the key, not its bytes;
    /// the debug form shows only the id.
    #[test]
    fn one_key_agrees_two_keys_differ() {
        let (b1, k1) = HashKey::generate();
        let k1b = HashKey::from_bytes(&b1);
        let k2 = HashKey::random();
        assert_eq!(k1.hash_u64(42), k1b.hash_u64(42));
        assert_eq!(k1.hash_bytes(b"read_file"), k1b.hash_bytes(b"read_file"));
        assert_ne!(k1.hash_u64(42), k2.hash_u64(42));
        assert_ne!(k1.hash_u64(42), k1.hash_u64(43));
        assert_eq!(k1.id(), k1b.id());
        assert_ne!(k1.id(), k2.id());
        assert_eq!(k1.id().0.len(), 16);
        let hex: String = b1.iter().map(|b| format!("{b:02x}")).collect();
        let dbg = format!("{k1:?}");
        assert!(
            !dbg.contains(&hex[..16]) && dbg.contains(&k1.id().0),
            "{dbg}"
        );
    }

    /// The permutation inverts, differs per domain and key, and re-keys to exactly what the
    /// new key makes of the same content.
    #[test]
    fn values_invert_and_rekey_under_the_holders_key() {
        let (a, b) = (HashKey::random(), HashKey::random());
        for h in [0u64, 1, 42, u64::MAX, 0x0123_4567_89ab_cdef] {
            for d in [Domain::Block, Domain::Bytes] {
                let v = a.permute(d, h);
                assert_ne!(v, h);
                assert_eq!(a.unpermute(d, v), h);
                assert_eq!(a.rekey_u64(&b, d, v), b.permute(d, h));
                assert_ne!(b.unpermute(d, v), h, "another key does not invert it");
            }
            assert_ne!(a.permute(Domain::Block, h), a.permute(Domain::Bytes, h));
        }
        let t = a.hash_bytes(b"read_file");
        assert_eq!(
            a.rekey_u64(&b, Domain::Bytes, t),
            b.hash_bytes(b"read_file")
        );
        // A bijection: 10,000 consecutive inputs give 10,000 values.
        let vals: std::collections::HashSet<u64> = (0..10_000u64).map(|h| a.hash_u64(h)).collect();
        assert_eq!(vals.len(), 10_000);
    }

    /// A missing file is created 0600 and read back as the same key; a malformed one is
    /// refused without echoing its content.
    #[test]
    fn key_file_created_once_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        let (a, created) = HashKey::load_or_create(&p).unwrap();
        assert!(created);
        let (b, created) = HashKey::load_or_create(&p).unwrap();
        assert!(!created);
        assert_eq!(a.id(), b.id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&p, "secret-but-not-hex").unwrap();
        let e = HashKey::load(&p).unwrap_err().to_string();
        assert!(e.contains("18 characters") && !e.contains("secret"), "{e}");
        std::fs::write(&p, format!("{}\n", "zz".repeat(32))).unwrap();
        assert!(HashKey::load(&p).is_err());
    }
}
