//! Prompt text of an exact length, deterministic per request and per shared block.
//!
//! With a tokenizer ([`PromptTokenizer`], `--tokenizer`), a prompt tokenizes to **exactly**
//! the length asked for, verified by re-tokenizing; what that length counts (the text, or
//! the text plus special tokens) is the request builder's business ([`crate::request`]).
//!
//! The text is drawn from a pool of common English words, each one token with its leading
//! space, checked at load time so that no two adjacent pool words merge across their
//! boundary. Each word is then exactly one token (and one whitespace word, so the sim, which
//! counts words, sees the same length). Without a tokenizer the prompt is the older filler of
//! common words joined by spaces ([`filler_prompt`]): exact for the sim (`words`),
//! approximate (typically within a few percent) for a real target's tokenizer.
//!
//! Determinism: the text depends only on (salt, request id, block hashes, length) and the
//! tokenizer file, never on the run or machine. Where the row has `prefix_hashes`, block `j`
//! (`block_size` tokens, from the trace's metadata: Mooncake 512, Qwen 16) is drawn from
//! (salt, hash `j`) only, so equal hashes give identical text, different hashes different
//! text, and blocks start and end on token boundaries; the rest is drawn from (salt, request
//! id), so unrelated requests share nothing. `--prompt-salt` (random per run by default)
//! changes every text, so a repeated run does not hit the previous run's prefix cache.

pub mod image;
mod tokenizer;
mod words;

pub use tokenizer::{PromptTokenizer, Verify};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use words::WORDS;

/// A stable 64-bit hash (FNV-1a, [`trace_format::fnv`]) of text, the same on every machine
/// and run.
pub fn stable_hash(s: &str) -> u64 {
    trace_format::fnv::fnv1a(trace_format::fnv::OFFSET, s.as_bytes())
}

fn mix(a: u64, b: u64) -> u64 {
    // splitmix64's finaliser of the pair.
    trace_format::fnv::finalize(a ^ b.rotate_left(32) ^ trace_format::fnv::GOLDEN)
}

/// Seed of the text of the block with prefix hash `h`.
fn block_seed(salt: u64, h: u64) -> u64 {
    mix(salt, mix(h, 0x5eed))
}

/// Seed of the text of a request's own (unshared) part.
fn request_seed(salt: u64, request_key: u64) -> u64 {
    mix(salt, request_key)
}

fn push_words(out: &mut String, key: u64, n: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(key);
    for _ in 0..n {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
}

/// A filler prompt of exactly `words` words, without a tokenizer (see the module doc): exact
/// for the sim, approximate for a BPE tokenizer.
pub fn filler_prompt(
    salt: u64,
    request_key: u64,
    words: usize,
    prefix: Option<(&[u64], usize)>,
) -> String {
    let mut out = String::with_capacity(words * 6);
    let mut written = 0;
    if let Some((hashes, block)) = prefix {
        if block > 0 {
            for h in hashes {
                if written >= words {
                    break;
                }
                let n = block.min(words - written);
                push_words(&mut out, block_seed(salt, *h), n);
                written += n;
            }
        }
    }
    push_words(&mut out, request_seed(salt, request_key), words - written);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_has_exact_word_count_and_is_deterministic() {
        for n in [0usize, 1, 2, 17, 1000] {
            let p = filler_prompt(1, 2, n, None);
            assert_eq!(p.split_whitespace().count(), n);
            assert_eq!(p, filler_prompt(1, 2, n, None));
        }
        assert_ne!(
            filler_prompt(1, 2, 50, None),
            filler_prompt(2, 2, 50, None),
            "salt changes text"
        );
        assert_ne!(filler_prompt(1, 2, 50, None), filler_prompt(1, 3, 50, None));
    }

    #[test]
    fn equal_block_hashes_share_text_and_differ_after() {
        let a = filler_prompt(9, 100, 40, Some((&[1, 2, 3], 10)));
        let b = filler_prompt(9, 200, 40, Some((&[1, 2, 4], 10)));
        let wa: Vec<&str> = a.split(' ').collect();
        let wb: Vec<&str> = b.split(' ').collect();
        assert_eq!(wa.len(), 40);
        assert_eq!(wa[..20], wb[..20]);
        assert_ne!(wa[20..30], wb[20..30]);
    }
}
