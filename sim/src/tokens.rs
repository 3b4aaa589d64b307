//! The simulator's stand-in for a tokenizer: one token per whitespace-separated word, a hash
//! per token (for the prefix cache), and the deterministic output vocabulary.

/// Output vocabulary: token `i` of a response is one of these words (each with its leading
/// space, as a BPE tokenizer would produce).
pub const VOCAB: [&str; 16] = [
    " lorem",
    " ipsum",
    " dolor",
    " sit",
    " amet",
    " consectetur",
    " adipiscing",
    " elit",
    " sed",
    " do",
    " eiusmod",
    " tempor",
    " incididunt",
    " ut",
    " labore",
    " et",
];

/// SplitMix64: a cheap, well-mixed 64-bit hash step ([`trace_format::fnv::splitmix64`]).
pub use trace_format::fnv::splitmix64 as mix;

/// Combines a running hash with one more value.
pub fn combine(h: u64, x: u64) -> u64 {
    mix(h ^ mix(x))
}

/// FNV-1a over bytes, then mixed.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    mix(trace_format::fnv::fnv1a(trace_format::fnv::OFFSET, bytes))
}

/// Appends one hash per whitespace-separated word of `text` to `out`.
pub fn push_words(text: &str, out: &mut Vec<u64>) {
    out.extend(text.split_whitespace().map(|w| hash_bytes(w.as_bytes())));
}

/// Hash of a token id (prompts given as token-id arrays).
pub fn token_id_hash(id: u64) -> u64 {
    mix(id ^ 0x746f_6b65_6e5f_6964)
}

/// Chained hashes of the full `block_size`-token blocks of a prompt: block `j`'s hash covers
/// the previous block's hash and the tokens of block `j`, so equal hashes mean equal prefixes.
pub fn block_hashes(tokens: &[u64], block_size: u32) -> Vec<u64> {
    let bs = block_size.max(1) as usize;
    let mut prev = 0x626c_6f63_6b5f_6830u64;
    tokens
        .chunks_exact(bs)
        .map(|block| {
            let mut h = prev;
            for &t in block {
                h = combine(h, t);
            }
            prev = h;
            h
        })
        .collect()
}

/// Hash of a whole token sequence (used to make outputs deterministic per request content).
pub fn content_hash(tokens: &[u64]) -> u64 {
    tokens
        .iter()
        .fold(0x636f_6e74_656e_7400u64 ^ tokens.len() as u64, |h, &t| {
            combine(h, t)
        })
}

/// Output length of a request without `ignore_eos`: pseudo-random in `[1, max_tokens]`,
/// fixed by the request content and the seed.
pub fn output_len(seed: u64, content: u64, max_tokens: u32) -> u32 {
    let max = u64::from(max_tokens.max(1));
    let r = combine(combine(mix(seed), content), max);
    // r % max < max <= u32::MAX, so the cast is lossless.
    1 + (r % max) as u32
}

/// Appends the text of output tokens `from..to` of a response whose stream starts at `start`.
pub fn push_output_text(start: u64, from: u32, to: u32, out: &mut String) {
    for i in from..to {
        let idx = (start.wrapping_add(u64::from(i)) % VOCAB.len() as u64) as usize;
        out.push_str(VOCAB[idx]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_count_and_blocks_chain() {
        let mut a = Vec::new();
        push_words("  one two\tthree\nfour  ", &mut a);
        assert_eq!(a.len(), 4);
        let mut b = Vec::new();
        push_words("one two three five", &mut b);
        let ha = block_hashes(&a, 2);
        let hb = block_hashes(&b, 2);
        assert_eq!(ha.len(), 2);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_eq!(block_hashes(&a, 3).len(), 1);
    }

    #[test]
    fn output_len_in_range_and_deterministic() {
        for m in 1..50 {
            let n = output_len(7, 99, m);
            assert!((1..=m).contains(&n));
            assert_eq!(n, output_len(7, 99, m));
        }
    }
}
