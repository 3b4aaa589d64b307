//! Fitting a tokenizer: its pool of one-token words, checked so that no two adjacent pool
//! words merge, and prompts of an exact token length drawn from it (see the module doc of
//! [`crate::prompt`]).

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokenize::Tokenizer;

use super::words::{MORE_WORDS, WORDS};
use super::{block_seed, mix, request_seed};
use crate::error::ReplayError;

/// Most pool words tried (a pool of a few hundred words makes equal text by chance
/// impossible in practice: 256^16 sequences for a 16-token block).
const MAX_POOL: usize = 256;
/// Fewest pool words for the fast exact path.
const MIN_POOL: usize = 32;

/// A tokenizer with its pool of prompt words: synthesizes prompts of an exact token length.
///
/// Building one tokenizes every candidate word and every ordered pair of pool words once
/// (a de Bruijn sequence of up to 256² words): tens of milliseconds. When every pool word is one
/// token and no pair merges (true for byte-level BPEs with a word-splitting pre-tokenizer:
/// tiktoken's encodings, Qwen, Llama 3, DeepSeek), the tokenization of a prompt is the
/// concatenation of its words' tokens ("separable"), and a prompt of `n` words has `n`
/// tokens; each prompt is still re-tokenized once to verify it. Otherwise (tokenizers whose
/// merges cross word boundaries) each prompt is fitted by re-tokenizing and adjusting its
/// tail until exact.
pub struct PromptTokenizer {
    tok: Arc<Tokenizer>,
    /// Pool words with their leading space, each one token.
    pool: Vec<String>,
    separable: bool,
    verify: Verify,
    /// Segments (seed, words) already re-tokenized to their length.
    verified: std::sync::Mutex<std::collections::HashSet<(u64, usize)>>,
}

/// How a synthesized prompt is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Re-tokenize the whole prompt.
    Full,
    /// For a word-separable tokenizer, re-tokenize each distinct segment (a hashed block or a
    /// request's own tail) once and add up; prompts sharing blocks are verified once per block
    /// (several times faster on Mooncake-like traces). Falls back to `Full` otherwise.
    Segments,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTokenizer")
            .field("tokenizer", &self.tok.name())
            .field("pool", &self.pool.len())
            .field("separable", &self.separable)
            .finish()
    }
}

impl PromptTokenizer {
    /// Loads the tokenizer `spec` (see [`Tokenizer::load`]) and builds its word pool.
    pub fn load(spec: &str) -> Result<PromptTokenizer, ReplayError> {
        let tok = Tokenizer::load(spec).map_err(|e| ReplayError::Config(e.to_string()))?;
        PromptTokenizer::new(Arc::new(tok))
    }

    /// Builds the word pool of `tok`.
    pub fn new(tok: Arc<Tokenizer>) -> Result<PromptTokenizer, ReplayError> {
        let err = |e: tokenize::Error| ReplayError::Config(e.to_string());
        let mut seen_ids = std::collections::HashSet::new();
        let mut seen_words = std::collections::HashSet::new();
        let mut pool = Vec::new();
        for w in WORDS.iter().chain(MORE_WORDS) {
            if pool.len() >= MAX_POOL || !seen_words.insert(*w) {
                continue;
            }
            let piece = format!(" {w}");
            let ids = tok.encode(&piece).map_err(err)?;
            if ids.len() == 1 && seen_ids.insert(ids[0]) {
                pool.push(piece);
            }
        }
        if pool.len() < 2 {
            return Err(ReplayError::Config(format!(
                "tokenizer {}: fewer than two common English words are single tokens; it \
                 cannot synthesize prompts",
                tok.name()
            )));
        }
        // Drop words that merge with a neighbour, until every ordered pair is clean.
        let mut separable = false;
        for _ in 0..64 {
            match first_merging_pair(&tok, &pool).map_err(err)? {
                None => {
                    separable = pool.len() >= MIN_POOL;
                    break;
                }
                Some(i) => {
                    pool.remove(i);
                    if pool.len() < MIN_POOL {
                        break;
                    }
                }
            }
        }
        Ok(PromptTokenizer {
            tok,
            pool,
            separable,
            verify: Verify::Segments,
            verified: Default::default(),
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The tokenizer as shared.
    pub fn tokenizer_arc(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    /// Number of words in the pool.
    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }

    /// Whether prompts are exact by construction (verified once each) rather than fitted.
    pub fn is_separable(&self) -> bool {
        self.separable
    }

    /// Appends `n` pool words drawn from `seed` to `out`.
    fn push_pool(&self, out: &mut String, seed: u64, n: usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..n {
            out.push_str(&self.pool[rng.gen_range(0..self.pool.len())]);
        }
    }

    /// A prompt whose text has exactly `tokens` tokens (no special tokens), verified by
    /// re-tokenizing. `prefix` is the row's block hashes and block size (see the module doc).
    /// `tokens` = 0 gives the empty string.
    pub fn synthesize(
        &self,
        salt: u64,
        request_key: u64,
        tokens: usize,
        prefix: Option<(&[u64], usize)>,
    ) -> Result<String, String> {
        let avg = self.pool.iter().map(String::len).sum::<usize>() / self.pool.len();
        let mut out = String::with_capacity(tokens * (avg + 1));
        // Segments (seed, words, byte range): the hashed blocks, then the request's own tail.
        let mut segments: Vec<(u64, usize, std::ops::Range<usize>)> = Vec::new();
        let mut written = 0;
        if let Some((hashes, block)) = prefix {
            if block > 0 {
                for h in hashes {
                    if written >= tokens {
                        break;
                    }
                    let n = block.min(tokens - written);
                    let seed = block_seed(salt, *h);
                    let start = out.len();
                    self.push_pool(&mut out, seed, n);
                    segments.push((seed, n, start..out.len()));
                    written += n;
                }
            }
        }
        let tail_start = out.len();
        let tail_seed = request_seed(salt, request_key);
        self.push_pool(&mut out, tail_seed, tokens - written);
        segments.push((tail_seed, tokens - written, tail_start..out.len()));
        let count = if self.separable && self.verify == Verify::Segments {
            // Word-separable: the prompt's tokens are its segments' tokens (every boundary is
            // a pool-word pair, all of which were checked), so re-tokenizing each distinct
            // segment once is re-tokenizing the prompt.
            let mut sum = 0;
            for (seed, n, range) in &segments {
                let verified = self
                    .verified
                    .lock()
                    .map(|v| v.contains(&(*seed, *n)))
                    .unwrap_or(false);
                if verified {
                    sum += n;
                    continue;
                }
                let c = self.count(&out[range.clone()])?;
                if c == *n {
                    if let Ok(mut v) = self.verified.lock() {
                        v.insert((*seed, *n));
                    }
                }
                sum += c;
            }
            if sum == tokens {
                return Ok(out);
            }
            self.count(&out)?
        } else {
            self.count(&out)?
        };
        if count == tokens {
            return Ok(out);
        }
        self.fit(out, tail_start, tail_seed, tokens, count)
    }

    /// Re-tokenize every prompt whole ([`Verify::Full`]) instead of each distinct segment
    /// once ([`Verify::Segments`], the default).
    pub fn with_verify(mut self, verify: Verify) -> Self {
        self.verify = verify;
        self
    }

    fn count(&self, text: &str) -> Result<usize, String> {
        self.tok.count(text).map_err(|e| e.to_string())
    }

    /// Adjusts the tail of `text` (from byte `tail_start`) until it has `target` tokens.
    fn fit(
        &self,
        mut text: String,
        tail_start: usize,
        tail_seed: u64,
        target: usize,
        mut count: usize,
    ) -> Result<String, String> {
        // Extra words come from a stream of their own, so refits stay deterministic.
        let mut rng = ChaCha8Rng::seed_from_u64(mix(tail_seed, 0xf17));
        for _ in 0..32 {
            if count < target {
                for _ in 0..target - count {
                    text.push_str(&self.pool[rng.gen_range(0..self.pool.len())]);
                }
            } else {
                // Remove whole words from the end (into the blocks only when the tail is
                // used up: a prompt shorter than its blocks keeps them as far as it goes).
                for _ in 0..count - target {
                    match text.rfind(' ') {
                        Some(i) => text.truncate(i),
                        None => text.clear(),
                    }
                }
            }
            count = self.count(&text)?;
            if count == target {
                return Ok(text);
            }
        }
        // Oscillating (one word adds or removes two tokens): try every pool word last.
        let base = text.rfind(' ').unwrap_or(0).max(tail_start.min(text.len()));
        for extra in [0usize, 1] {
            let mut stem = text[..base].to_string();
            if extra == 1 {
                stem.push_str(&self.pool[0]);
            }
            for w in &self.pool {
                let candidate = format!("{stem}{w}");
                if self.count(&candidate)? == target {
                    return Ok(candidate);
                }
            }
        }
        Err(format!(
            "tokenizer {}: could not fit a prompt of exactly {target} tokens (got {count});              its merges cross word boundaries",
            self.tok.name()
        ))
    }
}

/// Tokenizes every ordered pair of pool words (a de Bruijn sequence of order 2) and returns
/// the index of a word involved in the first merge or split, or `None` when the sequence
/// tokenizes word by word.
fn first_merging_pair(tok: &Tokenizer, pool: &[String]) -> Result<Option<usize>, tokenize::Error> {
    let k = pool.len();
    // de Bruijn B(k, 2) from Lyndon words of length 1 and 2: a, (a b) for b > a ...
    let mut seq = Vec::with_capacity(k * k + 1);
    for a in 0..k {
        seq.push(a);
        for b in a + 1..k {
            seq.push(a);
            seq.push(b);
        }
    }
    seq.push(0);
    let ids_of: Vec<u32> = pool
        .iter()
        .map(|w| tok.encode(w).map(|v| v[0]))
        .collect::<Result<_, _>>()?;
    let text: String = seq.iter().map(|&i| pool[i].as_str()).collect();
    let got = tok.encode(&text)?;
    let want: Vec<u32> = seq.iter().map(|&i| ids_of[i]).collect();
    if got == want {
        return Ok(None);
    }
    let at = got
        .iter()
        .zip(&want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    // The token at `at` differs: the word there merged with (or split towards) its
    // neighbour; drop the word itself (at 0) or the one before it.
    Ok(Some(seq[at.min(seq.len() - 1)]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn shared_prefix_case(pt: &PromptTokenizer, block: usize) {
        let tok = pt.tokenizer();
        // Share the first 3 hash ids, differ from the 4th on.
        let a_h = [10u64, 11, 12, 13, 14];
        let b_h = [10u64, 11, 12, 99, 14];
        let n = block * 5 - block / 2; // last block partial
        let a = pt.synthesize(5, 1, n, Some((&a_h, block))).unwrap();
        let b = pt.synthesize(5, 2, n, Some((&b_h, block))).unwrap();
        let (ta, tb) = (tok.encode(&a).unwrap(), tok.encode(&b).unwrap());
        assert_eq!((ta.len(), tb.len()), (n, n));
        let shared = 3 * block;
        assert_eq!(
            ta[..shared],
            tb[..shared],
            "{}: first 3 blocks shared",
            tok.name()
        );
        // The 4th block differs (and, by chance, in most of its positions).
        let next = &ta[shared..shared + block];
        let other = &tb[shared..shared + block];
        let differing = next.iter().zip(other).filter(|(x, y)| x != y).count();
        assert!(
            differing * 2 > block,
            "{}: 4th block differs in {differing}/{block}",
            tok.name()
        );
        // The 5th has equal hash ids but another prefix; here the text is equal by design
        // (hash ids of real traces are chained, so equal ids never follow different blocks).
        // Block boundaries are token boundaries: the blocks' own tokenizations concatenate.
        let mut rebuilt = Vec::new();
        let mut rest = a.as_str();
        for _ in 0..5 {
            // Each block is `block` words (the last one fewer).
            let words = rest
                .match_indices(' ')
                .map(|(i, _)| i)
                .nth(block)
                .unwrap_or(rest.len());
            rebuilt.extend(tok.encode(&rest[..words]).unwrap());
            rest = &rest[words..];
        }
        assert_eq!(rebuilt, ta);
        // Deterministic, and the salt changes everything.
        assert_eq!(a, pt.synthesize(5, 1, n, Some((&a_h, block))).unwrap());
        let c = pt.synthesize(6, 1, n, Some((&a_h, block))).unwrap();
        assert_ne!(tok.encode(&c).unwrap()[..block], ta[..block]);
        // Equal hashes across requests give equal blocks even at other lengths.
        let short = pt.synthesize(5, 3, block + 1, Some((&a_h, block))).unwrap();
        assert_eq!(tok.encode(&short).unwrap()[..block], ta[..block]);
    }

    #[test]
    fn shared_hash_ids_share_exactly_their_blocks() {
        let pt = PromptTokenizer::load("cl100k_base").unwrap();
        shared_prefix_case(&pt, 16);
        shared_prefix_case(&pt, 512);
        if let Some(p) = tokenize::test_tokenizer_json("qwen3") {
            let pt = PromptTokenizer::load(p.to_str().unwrap()).unwrap();
            shared_prefix_case(&pt, 16);
            shared_prefix_case(&pt, 512);
        }
    }

    #[test]
    fn a_tokenizer_that_merges_words_is_fitted_exactly() {
        // A byte-level BPE without a pre-tokenizer whose merges join " the" and " of" across
        // words: the pool loses the merging words, or prompts are fitted by re-tokenizing.
        let json = merging_tokenizer_json();
        let tok = Arc::new(Tokenizer::from_json_bytes("merging", json.as_bytes()).unwrap());
        let pt = PromptTokenizer::new(tok.clone()).unwrap();
        assert!(!pt.pool.contains(&" of".to_string()) || !pt.pool.contains(&" the".to_string()));
        for n in [1usize, 2, 3, 10, 57, 300] {
            let p = pt.synthesize(1, 2, n, Some((&[1, 2, 3], 16))).unwrap();
            assert_eq!(tok.count(&p).unwrap(), n, "{pt:?}");
        }
        // Forced onto the fitting path with both merging words in a small pool.
        let forced = PromptTokenizer {
            tok: tok.clone(),
            pool: vec![" the".into(), " of".into(), " and".into()],
            separable: false,
            verify: Verify::Full,
            verified: Default::default(),
        };
        let mut fitted = 0;
        for n in [1usize, 2, 3, 10, 57, 300, 1000] {
            for salt in 0..5 {
                let p = forced
                    .synthesize(salt, 2, n, Some((&[1, 2, 3], 16)))
                    .unwrap();
                assert_eq!(tok.count(&p).unwrap(), n, "n={n} salt={salt}");
                fitted += usize::from(p.split_whitespace().count() != n);
            }
        }
        assert!(
            fitted > 10,
            "the merging pair was exercised ({fitted} prompts fitted)"
        );
    }

    /// A tiny word-level-ish BPE: single letters and space, merges building a few words, and
    /// one merge across a word boundary (" the" + " of" -> " the of").
    fn merging_tokenizer_json() -> String {
        let mut vocab = serde_json::Map::new();
        let mut merges: Vec<[String; 2]> = Vec::new();
        let add = |t: &str, vocab: &mut serde_json::Map<String, Value>| {
            let n = vocab.len();
            vocab.entry(t.to_string()).or_insert(json!(n));
        };
        for c in " abcdefghijklmnopqrstuvwxyz".chars() {
            add(&c.to_string(), &mut vocab);
        }
        let build =
            |w: &str, vocab: &mut serde_json::Map<String, Value>, merges: &mut Vec<[String; 2]>| {
                // Left-to-right merges: " " + "w", " w" + "o", ...
                let chars: Vec<String> = w.chars().map(|c| c.to_string()).collect();
                let mut acc = chars[0].clone();
                for c in &chars[1..] {
                    merges.push([acc.clone(), c.clone()]);
                    acc.push_str(c);
                    let n = vocab.len();
                    vocab.entry(acc.clone()).or_insert(json!(n));
                }
            };
        for w in WORDS.iter().chain(MORE_WORDS).take(120) {
            build(&format!(" {w}"), &mut vocab, &mut merges);
        }
        merges.push([" the".to_string(), " of".to_string()]);
        let n = vocab.len();
        vocab.insert(" the of".into(), json!(n));
        json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merges}
        })
        .to_string()
    }

    /// Timing of a Mooncake-like workload (run with `--release --ignored --nocapture`).
    #[test]
    #[ignore]
    fn synthesis_throughput() {
        let mut specs = vec!["cl100k_base".to_string()];
        if let Some(p) = tokenize::test_tokenizer_json("qwen3") {
            specs.push(p.to_string_lossy().into_owned());
        }
        for spec in specs {
            for verify in [Verify::Full, Verify::Segments] {
                let t0 = std::time::Instant::now();
                let pt = PromptTokenizer::load(&spec).unwrap().with_verify(verify);
                let load = t0.elapsed();
                let t1 = std::time::Instant::now();
                let p = pt.synthesize(1, 1, 100_000, None).unwrap();
                let one = t1.elapsed();
                assert_eq!(pt.tokenizer().count(&p).unwrap(), 100_000);
                // 400 requests of 16k tokens sharing a 8k-token prefix in pairs (512-blocks).
                let t2 = std::time::Instant::now();
                let mut total = 0;
                for r in 0..400u64 {
                    let hashes: Vec<u64> = (0..32)
                        .map(|b| {
                            if b < 16 {
                                (r / 2) * 1000 + b
                            } else {
                                r * 1000 + b
                            }
                        })
                        .collect();
                    pt.synthesize(7, r, 16_384, Some((&hashes, 512))).unwrap();
                    total += 16_384;
                }
                eprintln!(
                    "{spec} {verify:?}: load {load:?}; one 100k-token prompt {one:?}; {total} tokens in 400 prompts {:?}",
                    t2.elapsed()
                );
            }
        }
    }
}
