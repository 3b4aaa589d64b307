//! Building the request a trace row stands for.
//!
//! A row with a recorded body is sent as recorded (the model may be rewritten, and a
//! streamed request gets `stream_options.include_usage` so output tokens come from usage).
//! A row without one gets a built completions or chat request whose prompt is synthesized to
//! the recorded length, and whose `max_tokens` follows `--output-len`.
//!
//! # Prompt synthesis
//!
//! With a tokenizer ([`RequestOptions::tokenizer`], `--tokenizer`), the prompt tokenizes to
//! **exactly** the recorded `prompt_tokens` with it, verified by re-tokenizing
//! ([`PromptTokenizer`]):
//! - completions: the server's count, i.e. the text's tokens plus the special tokens the
//!   tokenizer adds (a BOS for Llama 3, none for Qwen or tiktoken) equal `prompt_tokens`;
//! - chat: the **content** of the single user message has exactly `prompt_tokens` tokens.
//!   The server's `usage.prompt_tokens` adds its chat template (role markers, BOS, a default
//!   system prompt): a few tokens to a few dozen depending on the model (ChatML/Qwen: 9,
//!   Llama 3 with its date header: ~25); that overhead is not compensated.
//!
//! The text is drawn from a pool of common English words, each one token with its leading
//! space, checked at load time so that no two adjacent pool words merge across their
//! boundary. Each word is then exactly one token (and one whitespace word, so the sim, which
//! counts words, sees the same length). Without a tokenizer the prompt is the older filler of
//! common words joined by spaces: exact for the sim (`words`), approximate (typically within a
//! few percent) for a real target's tokenizer.
//!
//! Determinism: the text depends only on (salt, request id, block hashes, length) and the
//! tokenizer file, never on the run or machine. Where the row has `prefix_hashes`, block `j`
//! (`block_size` tokens, from the trace's metadata: Mooncake 512, Qwen 16) is drawn from
//! (salt, hash `j`) only, so equal hashes give identical text, different hashes different
//! text, and blocks start and end on token boundaries; the rest is drawn from (salt, request
//! id), so unrelated requests share nothing. `--prompt-salt` (random per run by default)
//! changes every text, so a repeated run does not hit the previous run's prefix cache.

use std::sync::Arc;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use tokenize::Tokenizer;
use trace_format::TraceRecord;

use crate::config::{EndpointKind, OutputLen, RequestOptions};

/// Common English words; each is a single token (with its leading space) in the usual BPE
/// vocabularies.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other", "its", "may",
    "these", "what", "them", "than", "some", "him", "time", "into", "only", "do", "could", "new",
    "about", "two", "first", "then", "also", "any", "like", "our", "my", "said", "over", "such",
    "us", "made", "many", "after", "most", "should", "out", "way", "even", "each", "very", "well",
    "those", "work", "life", "just", "where", "people", "before", "through", "good", "much", "how",
    "state", "year", "world", "great", "still", "part", "long", "same", "back", "day", "might",
    "own", "under", "never", "being", "last", "water", "house", "light", "school", "small",
    "order", "point", "place", "line", "city", "power", "group", "number", "money", "system",
    "market", "music", "paper", "field", "table", "river", "story", "model", "plant", "road",
    "color", "heart", "board", "stone",
];

/// More common words: candidates for the synthesis pool besides [`WORDS`] (a word that is
/// not one token for a tokenizer is left out of its pool).
const MORE_WORDS: &[&str] = &[
    "area",
    "book",
    "business",
    "case",
    "child",
    "company",
    "country",
    "eye",
    "fact",
    "family",
    "government",
    "hand",
    "home",
    "job",
    "lot",
    "man",
    "mother",
    "night",
    "office",
    "problem",
    "program",
    "question",
    "right",
    "room",
    "side",
    "student",
    "study",
    "thing",
    "week",
    "woman",
    "word",
    "game",
    "member",
    "law",
    "car",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "face",
    "level",
    "health",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "food",
    "door",
    "policy",
    "process",
    "music",
    "service",
    "land",
    "street",
    "doctor",
    "plan",
    "letter",
    "energy",
    "floor",
    "window",
    "picture",
    "garden",
    "summer",
    "winter",
    "spring",
    "autumn",
    "island",
    "forest",
    "mountain",
    "ocean",
    "valley",
    "bridge",
    "castle",
    "engine",
    "machine",
    "signal",
    "circle",
    "square",
    "market",
    "village",
    "kitchen",
    "library",
    "station",
    "harbor",
    "planet",
    "silver",
    "golden",
    "yellow",
    "purple",
    "orange",
    "green",
    "blue",
    "red",
    "black",
    "white",
    "brown",
    "gray",
    "quiet",
    "simple",
    "strong",
    "bright",
    "early",
    "late",
    "young",
    "old",
    "happy",
    "clear",
    "fresh",
    "warm",
    "cold",
    "dark",
    "deep",
    "wide",
    "high",
    "low",
    "fast",
    "slow",
    "full",
    "free",
    "open",
    "close",
    "real",
    "sure",
    "true",
    "whole",
    "main",
    "major",
    "local",
    "public",
    "social",
    "national",
    "special",
    "human",
    "natural",
    "central",
    "common",
    "private",
    "single",
    "recent",
    "final",
    "future",
    "modern",
    "current",
    "general",
    "political",
    "economic",
    "medical",
    "physical",
    "financial",
    "legal",
    "basic",
    "final",
    "ready",
    "easy",
    "hard",
    "short",
    "big",
    "little",
    "large",
    "different",
    "important",
    "possible",
    "able",
    "better",
    "best",
    "known",
    "based",
    "given",
    "taken",
    "found",
    "shown",
    "built",
    "left",
    "began",
    "became",
    "brought",
    "kept",
    "held",
    "stood",
    "turned",
    "moved",
    "lived",
    "played",
    "called",
    "asked",
    "worked",
    "seemed",
    "looked",
    "wanted",
    "used",
    "needed",
    "added",
    "began",
    "walk",
    "talk",
    "read",
    "write",
    "sing",
    "draw",
    "build",
    "grow",
    "speak",
    "learn",
    "teach",
    "travel",
    "dance",
    "cook",
    "drive",
    "swim",
    "paint",
    "listen",
    "watch",
    "carry",
    "follow",
    "create",
    "offer",
    "serve",
    "send",
    "pay",
    "meet",
    "include",
    "continue",
    "set",
    "lead",
    "understand",
    "reach",
    "remain",
    "suggest",
    "raise",
    "pass",
    "sell",
    "require",
    "report",
    "decide",
    "pull",
    "return",
    "explain",
    "hope",
    "develop",
    "receive",
    "agree",
    "support",
    "hit",
    "produce",
    "eat",
    "cover",
    "catch",
    "choose",
    "wait",
    "fall",
    "cut",
    "apple",
    "bread",
    "cheese",
    "coffee",
    "honey",
    "lemon",
    "milk",
    "rice",
    "salt",
    "sugar",
    "tea",
    "wine",
    "horse",
    "bird",
    "fish",
    "dog",
    "cat",
    "wolf",
    "bear",
    "lion",
    "tiger",
    "eagle",
    "tree",
    "flower",
    "leaf",
    "grass",
    "seed",
    "root",
    "rain",
    "snow",
    "wind",
    "cloud",
    "storm",
    "sun",
    "moon",
    "star",
    "sky",
    "sea",
    "lake",
    "hill",
    "rock",
    "sand",
    "fire",
    "iron",
    "gold",
    "glass",
    "wood",
    "cloth",
    "silk",
    "wool",
    "coal",
    "oil",
    "gas",
    "steel",
];

/// A stable 64-bit hash (FNV-1a) of text, the same on every machine and run.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 of the pair.
    let mut z = a ^ b.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
    pub fn load(spec: &str) -> Result<PromptTokenizer, String> {
        let tok = Tokenizer::load(spec).map_err(|e| e.to_string())?;
        PromptTokenizer::new(Arc::new(tok))
    }

    /// Builds the word pool of `tok`.
    pub fn new(tok: Arc<Tokenizer>) -> Result<PromptTokenizer, String> {
        let err = |e: tokenize::Error| e.to_string();
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
            return Err(format!(
                "tokenizer {}: fewer than two common English words are single tokens;                  it cannot synthesize prompts",
                tok.name()
            ));
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

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct BuiltRequest {
    /// Path, e.g. `/v1/completions`.
    pub endpoint: String,
    /// Whether the response will be streamed.
    pub stream: bool,
    /// The JSON body.
    pub body: Bytes,
    /// `max_tokens` sent, when known.
    pub max_tokens: Option<i64>,
    /// Where the recorded client cancelled it, to cancel the replayed one at the same point.
    pub cancel: Option<CancelAt>,
}

/// Where a request the recorded client cancelled is cancelled again: after as many output
/// chunks as the recorded client received, or, when it received none, after the time from
/// send to its cancellation. The candidate then sees the load production saw: the request,
/// and its end at the same point, not a full generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelAt {
    /// Output chunks received before cancelling.
    pub after_chunks: Option<usize>,
    /// Time from send to cancelling.
    pub after: Option<std::time::Duration>,
}

impl CancelAt {
    /// The recorded cancellation point of `rec`, if it was cancelled by its client and the
    /// point is known.
    pub fn of(rec: &TraceRecord) -> Option<CancelAt> {
        if rec.outcome != trace_format::Outcome::ClientCancelled {
            return None;
        }
        if !rec.chunk_times_us.is_empty() {
            return Some(CancelAt {
                after_chunks: Some(rec.chunk_times_us.len()),
                after: None,
            });
        }
        let us = rec.e2el_us.filter(|&u| u >= 0)?;
        Some(CancelAt {
            after_chunks: None,
            after: Some(std::time::Duration::from_micros(us as u64)),
        })
    }
}

/// Builds the request for `rec`. `model` is the name to use when neither `--model` nor the
/// row gives one; `block_size` is the trace's prefix-hash block size.
pub fn build_request(
    rec: &TraceRecord,
    opts: &RequestOptions,
    model: &str,
    block_size: Option<usize>,
) -> Result<BuiltRequest, String> {
    if let Some(body) = &rec.body {
        return Ok(rebuild_recorded(rec, body, opts));
    }
    let prompt_tokens = rec.prompt_tokens.filter(|n| *n >= 0).ok_or_else(|| {
        format!(
            "request {}: no body and no prompt_tokens to build one from",
            rec.request_id
        )
    })?;
    let (max_tokens, ignore_eos) = match opts.output_len {
        OutputLen::Fixed(n) => (i64::from(n), true),
        OutputLen::Recorded => (
            rec.output_tokens.or(rec.max_tokens).ok_or_else(|| {
                format!(
                    "request {}: no output_tokens or max_tokens recorded (use --output-len N)",
                    rec.request_id
                )
            })?,
            true,
        ),
        OutputLen::Request => (
            rec.max_tokens.or(rec.output_tokens).ok_or_else(|| {
                format!(
                    "request {}: no max_tokens recorded (use --output-len N)",
                    rec.request_id
                )
            })?,
            false,
        ),
    };
    // A recorded failure with 0 output tokens still sends a request: ask for one token.
    let max_tokens = max_tokens.max(1);
    let prefix = rec.prefix_hashes.as_deref().zip(block_size);
    let endpoint = opts.endpoint_for(&rec.endpoint);
    let prompt = synthesize_prompt(opts, endpoint, &rec.request_id, prompt_tokens, prefix)?;
    let model = opts
        .model
        .as_deref()
        .or(rec.model.as_deref())
        .unwrap_or(model);
    let mut body = match endpoint {
        EndpointKind::Completions => json!({ "model": model, "prompt": prompt }),
        EndpointKind::Chat => {
            json!({ "model": model, "messages": [{"role": "user", "content": prompt}] })
        }
    };
    let obj = body.as_object_mut().expect("built as an object");
    obj.insert("max_tokens".into(), json!(max_tokens));
    if ignore_eos {
        obj.insert("ignore_eos".into(), json!(true));
    }
    // Built requests stream as the row did, unless streaming is turned off.
    let stream = opts.stream && rec.stream;
    obj.insert("stream".into(), json!(stream));
    if stream {
        obj.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(BuiltRequest {
        endpoint: endpoint.path().to_string(),
        stream,
        body: Bytes::from(serde_json::to_vec(&body).expect("JSON values serialize")),
        max_tokens: Some(max_tokens),
        cancel: CancelAt::of(rec),
    })
}

/// What replay sends for the rows of a trace, as one console note: their recorded bodies
/// (`--record-bodies full`, ShareGPT), or prompts it synthesizes — word filler without a
/// `--tokenizer` (`tokenizer` = None), exact lengths with one — counted over `records`.
/// None when there is nothing worth saying (no rows; every prompt built with a tokenizer).
pub fn prompt_source_note(records: &[TraceRecord], tokenizer: Option<&str>) -> Option<String> {
    let n = records.len();
    let bodies = records.iter().filter(|r| r.body.is_some()).count();
    let synth = n - bodies;
    let filler = "word filler, so their token lengths on the target are approximate (give --tokenizer for exact ones)";
    match (bodies, synth, tokenizer) {
        (_, _, _) if n == 0 => None,
        (_, 0, t) => Some(format!(
            "note: replaying the recorded bodies of all {n} rows; no prompts are synthesized{}",
            if t.is_some() { " (--tokenizer is not used)" } else { "" }
        )),
        (0, _, None) => Some(format!(
            "note: no --tokenizer: the {n} rows have no recorded body, so their prompts are synthesized as {filler}"
        )),
        (0, _, Some(_)) => None,
        (b, s, t) => Some(format!(
            "note: replaying the recorded bodies of {b} of {n} rows; the {s} rows without a body get synthesized prompts: {}",
            match t {
                None => filler.to_string(),
                Some(t) => format!("their recorded lengths in tokenizer {t}"),
            }
        )),
    }
}

/// The prompt text of a row without a body: `prompt_tokens` long by `opts.tokenizer` (see
/// the module doc for what is counted), or the word filler without a tokenizer. At least one
/// token: an empty prompt is not a request any server accepts.
pub fn synthesize_prompt(
    opts: &RequestOptions,
    endpoint: EndpointKind,
    request_id: &str,
    prompt_tokens: i64,
    prefix: Option<(&[u64], usize)>,
) -> Result<String, String> {
    let key = stable_hash(request_id);
    let n = usize::try_from(prompt_tokens.max(1)).unwrap_or(usize::MAX);
    match &opts.tokenizer {
        None => Ok(filler_prompt(opts.prompt_salt, key, n, prefix)),
        Some(pt) => {
            let text_tokens = match endpoint {
                EndpointKind::Completions => n
                    .saturating_sub(pt.tokenizer().special_tokens_added())
                    .max(1),
                EndpointKind::Chat => n,
            };
            pt.synthesize(opts.prompt_salt, key, text_tokens, prefix)
                .map_err(|e| format!("request {request_id}: {e}"))
        }
    }
}

fn rebuild_recorded(rec: &TraceRecord, body: &str, opts: &RequestOptions) -> BuiltRequest {
    let endpoint = rec.endpoint.clone();
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(mut obj)) => {
            if let Some(m) = &opts.model {
                obj.insert("model".into(), json!(m));
            }
            let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
            if stream {
                let so = obj.entry("stream_options").or_insert_with(|| json!({}));
                if let Some(so) = so.as_object_mut() {
                    so.entry("include_usage").or_insert(json!(true));
                }
            }
            let max_tokens = obj
                .get("max_tokens")
                .or_else(|| obj.get("max_completion_tokens"))
                .and_then(Value::as_i64);
            BuiltRequest {
                endpoint,
                stream,
                body: Bytes::from(
                    serde_json::to_vec(&Value::Object(obj)).expect("JSON values serialize"),
                ),
                max_tokens,
                cancel: CancelAt::of(rec),
            }
        }
        // Not a JSON object: send the recorded bytes untouched; the outcome records the rest.
        _ => BuiltRequest {
            endpoint,
            stream: rec.stream,
            body: Bytes::from(body.to_string()),
            max_tokens: rec.max_tokens,
            cancel: CancelAt::of(rec),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn opts() -> RequestOptions {
        RequestOptions {
            endpoint: None,
            model: None,
            output_len: OutputLen::Recorded,
            stream: true,
            prompt_salt: 7,
            tokenizer: None,
            headers: vec![],
            api_key: None,
            timeout: Duration::from_secs(5),
            ca_cert: None,
            connect_timeout: Duration::from_secs(10),
            pool_idle_timeout: Duration::from_secs(4),
        }
    }

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

    #[test]
    fn built_request_has_recorded_lengths() {
        let mut rec = TraceRecord::new("r1", 0, "/v1/completions");
        rec.stream = true;
        rec.prompt_tokens = Some(12);
        rec.output_tokens = Some(34);
        let b = build_request(&rec, &opts(), "m", None).unwrap();
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["prompt"].as_str().unwrap().split(' ').count(), 12);
        assert_eq!(v["max_tokens"], 34);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        rec.prompt_tokens = None;
        assert!(build_request(&rec, &opts(), "m", None)
            .unwrap_err()
            .contains("no body"));
    }

    /// Lengths from 1 to 100,000 tokens: small ones densely, block edges, and a few large.
    const LENGTHS: &[usize] = &[
        1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 64, 100, 255, 511, 512, 513, 1000, 1023, 2048, 4097,
        8191, 12_345, 31_999, 65_536, 100_000,
    ];

    fn check_exact(pt: &Arc<PromptTokenizer>, lengths: &[usize]) {
        let tok = pt.tokenizer();
        let started = std::time::Instant::now();
        let mut total = 0;
        for (i, &n) in lengths.iter().enumerate() {
            // Alternate rows with and without prefix hashes (16- and 512-token blocks).
            let hashes: Vec<u64> = (0..(n / 16 + 1) as u64)
                .map(|h| h * 7 + i as u64 % 3)
                .collect();
            let prefix = match i % 3 {
                0 => None,
                1 => Some((&hashes[..], 16)),
                _ => Some((&hashes[..], 512)),
            };
            let mut rec = TraceRecord::new(format!("r{i}"), 0, "/v1/completions");
            rec.prompt_tokens = Some(n as i64);
            rec.output_tokens = Some(1);
            rec.prefix_hashes = prefix.map(|(h, _)| h.to_vec());
            let mut o = opts();
            o.tokenizer = Some(pt.clone());
            let b = build_request(&rec, &o, "m", prefix.map(|(_, b)| b)).unwrap();
            let v: Value = serde_json::from_slice(&b.body).unwrap();
            let prompt = v["prompt"].as_str().unwrap();
            assert_eq!(
                tok.encode_with_special(prompt).unwrap().len(),
                n,
                "{}: prompt for {n} tokens",
                tok.name()
            );
            // Every pool word is one token and one whitespace word: the sim agrees.
            assert_eq!(
                prompt.split_whitespace().count(),
                n,
                "{}: words",
                tok.name()
            );
            total += n;
        }
        eprintln!(
            "{}: {} prompts, {total} tokens synthesized and verified in {:?}",
            tok.name(),
            lengths.len(),
            started.elapsed()
        );
    }

    #[test]
    fn synthesized_prompts_have_exact_length_with_cl100k_and_o200k() {
        for name in ["cl100k_base", "o200k_base"] {
            let pt = Arc::new(PromptTokenizer::load(name).unwrap());
            assert!(pt.is_separable(), "{pt:?}");
            assert!(pt.pool_len() >= 200, "{pt:?}");
            check_exact(&pt, LENGTHS);
        }
    }

    #[test]
    fn synthesized_prompts_have_exact_length_with_a_tokenizer_json() {
        let Some(p) = tokenize::test_tokenizer_json("qwen3") else {
            return;
        };
        let pt = Arc::new(PromptTokenizer::load(p.to_str().unwrap()).unwrap());
        assert!(pt.is_separable(), "{pt:?}");
        check_exact(&pt, LENGTHS);
    }

    #[test]
    fn words_tokenizer_synthesis_is_exact_too() {
        let pt = Arc::new(PromptTokenizer::load("words").unwrap());
        check_exact(&pt, &LENGTHS[..20]);
    }

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
    fn chat_content_is_exact_and_synthesis_is_deterministic() {
        let pt = Arc::new(PromptTokenizer::load("cl100k_base").unwrap());
        let mut rec = TraceRecord::new("chat-1", 0, "/v1/chat/completions");
        rec.prompt_tokens = Some(300);
        rec.output_tokens = Some(5);
        let mut o = opts();
        o.endpoint = Some(EndpointKind::Chat);
        o.tokenizer = Some(pt.clone());
        let b1 = build_request(&rec, &o, "m", None).unwrap();
        let b2 = build_request(&rec, &o, "m", None).unwrap();
        assert_eq!(b1.body, b2.body);
        let v: Value = serde_json::from_slice(&b1.body).unwrap();
        let content = v["messages"][0]["content"].as_str().unwrap();
        assert_eq!(pt.tokenizer().count(content).unwrap(), 300);
        // A 0-token row still sends one token.
        rec.prompt_tokens = Some(0);
        let v: Value =
            serde_json::from_slice(&build_request(&rec, &o, "m", None).unwrap().body).unwrap();
        assert_eq!(
            pt.tokenizer()
                .count(v["messages"][0]["content"].as_str().unwrap())
                .unwrap(),
            1
        );
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

    #[test]
    fn recorded_body_is_kept_with_model_rewrite_and_usage() {
        let mut rec = TraceRecord::new("r1", 0, "/v1/chat/completions");
        rec.body = Some(r#"{"model":"a","messages":[{"role":"user","content":"hi"}],"stream":true,"temperature":0.5}"#.into());
        let mut o = opts();
        o.model = Some("b".into());
        let b = build_request(&rec, &o, "m", None).unwrap();
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(
            (v["model"].as_str(), v["temperature"].as_f64()),
            (Some("b"), Some(0.5))
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(b.stream);
        rec.body = Some("not json".into());
        assert_eq!(
            &build_request(&rec, &o, "m", None).unwrap().body[..],
            b"not json"
        );
    }
}
