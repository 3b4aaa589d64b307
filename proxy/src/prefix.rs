//! Prefix hashes of a prompt: the hash of every full block of `block_size` tokens, each
//! chained to the one before (as vLLM's prefix cache keys blocks), so a replay can rebuild
//! which requests shared a prefix without any prompt text being kept.
//!
//! Tokens are counted with the configured [`Tokenizer`] (`--tokenizer`: `words`, the
//! simulator's one token per whitespace-separated word and the default, `cl100k_base`,
//! `o200k_base`, or a Hugging Face `tokenizer.json`); its name and the block size are written
//! into the file metadata (`llmreplay.meta.tokenizer`, `llmreplay.block_size`). A completion
//! prompt given as token ids uses the ids, and hashes exactly as the same ids tokenized from
//! text. Chat prompts tokenize each message's text content in order; the role is mixed into
//! the hash without counting as a token (no chat template is applied). Hashes are FNV-1a 64
//! over the parent hash and the token ids, stable across builds and platforms.
//!
//! Tokenizing a long prompt with a real tokenizer takes milliseconds, so the proxy never does
//! it on the request path: see [`prompt_blocks`] and the record sink.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokenize::Tokenizer;

/// What tokenizing one prompt gives the trace row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptBlocks {
    /// The hash of every full block of the prompt, chained.
    pub hashes: Vec<u64>,
    /// Tokens of the prompt by the tokenizer (text only: no template, no special tokens).
    pub tokens: usize,
}

/// FNV-1a 64 of `bytes`, continuing from `h` (the trace's one hash, [`trace_format::fnv`]).
pub(crate) use trace_format::fnv::fnv1a as fnv;
/// FNV-1a 64's offset basis (also the seed of [`crate::linking::sessions`]' message chain).
pub(crate) use trace_format::fnv::OFFSET as FNV_OFFSET;

/// Chains tokens into block hashes.
#[derive(Debug, Clone)]
struct Blocks {
    block_size: usize,
    parent: u64,
    cur: u64,
    in_block: usize,
    tokens: usize,
    out: Vec<u64>,
}

impl Blocks {
    fn new(block_size: usize) -> Self {
        Blocks {
            block_size: block_size.max(1),
            parent: 0,
            cur: fnv(FNV_OFFSET, &0u64.to_le_bytes()),
            in_block: 0,
            tokens: 0,
            out: Vec::new(),
        }
    }

    /// Mixes `bytes` into the current block without counting a token (a chat role).
    fn mark(&mut self, bytes: &[u8]) {
        self.cur = fnv(self.cur, &[2]);
        self.cur = fnv(self.cur, bytes);
    }

    fn token(&mut self, id: u64) {
        self.cur = fnv(self.cur, &[1]);
        self.cur = fnv(self.cur, &id.to_le_bytes());
        self.in_block += 1;
        self.tokens += 1;
        if self.in_block == self.block_size {
            self.parent = self.cur;
            self.out.push(self.cur);
            self.cur = fnv(FNV_OFFSET, &self.parent.to_le_bytes());
            self.in_block = 0;
        }
    }

    /// Tokenizes `text`; `None` when the tokenizer fails on it.
    fn text(&mut self, tok: &Tokenizer, text: &str) -> Option<()> {
        for id in tok.encode(text).ok()? {
            self.token(u64::from(id));
        }
        Some(())
    }
}

/// One piece of a generation request's prompt, in order.
enum Piece<'a> {
    /// A chat message's role (hashed, not counted).
    Role(&'a str),
    /// Text to tokenize.
    Text(&'a str),
    /// A completion prompt's token ids.
    Ids(&'a [Value]),
}

/// Walks one chat message piece by piece: its role, then the text of its content.
fn walk_message<'a>(m: &'a Value, each: &mut impl FnMut(Piece<'a>) -> Option<()>) -> Option<()> {
    if let Some(role) = m.get("role").and_then(Value::as_str) {
        each(Piece::Role(role))?;
    }
    match m.get("content") {
        Some(Value::String(s)) => each(Piece::Text(s))?,
        Some(Value::Array(parts)) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    each(Piece::Text(t))?;
                }
            }
        }
        _ => {}
    }
    Some(())
}

/// Walks a generation request's prompt piece by piece; `None` when the body has no prompt
/// this can read (or `each` gives up).
fn walk<'a>(
    req: &'a Map<String, Value>,
    mut each: impl FnMut(Piece<'a>) -> Option<()>,
) -> Option<()> {
    if let Some(messages) = req.get("messages").and_then(Value::as_array) {
        for m in messages {
            walk_message(m, &mut each)?;
        }
        return Some(());
    }
    let prompt = req.get("prompt")?;
    let first = match prompt {
        Value::Array(a) if a.first().is_some_and(|v| v.is_string() || v.is_array()) => a.first()?,
        other => other,
    };
    match first {
        Value::String(s) => each(Piece::Text(s)),
        Value::Array(ids) => each(Piece::Ids(ids)),
        _ => None,
    }
}

/// Feeds one piece of a prompt into `b`.
fn feed(b: &mut Blocks, tok: &Tokenizer, piece: Piece<'_>) -> Option<()> {
    match piece {
        Piece::Role(r) => {
            b.mark(r.as_bytes());
            Some(())
        }
        Piece::Text(t) => b.text(tok, t),
        Piece::Ids(ids) => {
            for id in ids {
                b.token(id.as_u64()?);
            }
            Some(())
        }
    }
}

/// Tokenizes a generation request's prompt with `tok` into block hashes and a token count,
/// or `None` when the body has no prompt this can read.
///
/// This costs about a microsecond per few tokens with a real tokenizer: call it off the
/// request path (the proxy runs it on its prompt runners and joins it on the writer thread).
pub fn prompt_blocks(
    req: &Map<String, Value>,
    block_size: u32,
    tok: &Tokenizer,
) -> Option<PromptBlocks> {
    let mut b = Blocks::new(block_size as usize);
    walk(req, |piece| feed(&mut b, tok, piece))?;
    Some(PromptBlocks {
        hashes: b.out,
        tokens: b.tokens,
    })
}

// Bytes of text per token in [`estimate_tokens`] (about what cl100k_base and o200k_base give
// for English prose), by the one token-count rule.
pub use trace_format::tokens::{estimate_text, ESTIMATE_BYTES_PER_TOKEN};

/// A prompt's tokens estimated without a tokenizer: [`ESTIMATE_BYTES_PER_TOKEN`] bytes of
/// text per token (rounded up per piece of text), and token ids counted. What a row gets
/// (source `estimate`) when the recorder shed its tokenizing; `None` when the body has no
/// prompt this can read.
pub fn estimate_tokens(req: &Map<String, Value>) -> Option<usize> {
    let mut n = 0;
    walk(req, |piece| {
        match piece {
            Piece::Role(_) => {}
            Piece::Text(t) => n += estimate_text(t),
            Piece::Ids(ids) => n += ids.len(),
        }
        Some(())
    })?;
    Some(n)
}

/// A prompt's tokens counted with `tok` (text tokenized, token ids counted), without the
/// block hashes; `None` when the body has no prompt this can read or the tokenizer fails.
pub fn prompt_tokens(req: &Map<String, Value>, tok: &Tokenizer) -> Option<usize> {
    let mut n = 0;
    walk(req, |piece| {
        match piece {
            Piece::Role(_) => {}
            Piece::Text(t) => n += tok.count(t).ok()?,
            Piece::Ids(ids) => n += ids.len(),
        }
        Some(())
    })?;
    Some(n)
}

/// Most block hashes a [`PrefixCache`] keeps (8 bytes each): 16 MiB.
pub const PREFIX_CACHE_HASHES: usize = 2 << 20;

/// The block state after the first messages of chat prompts, so that a prefix is tokenized
/// once, not once per request: the next turn of a conversation repeats the previous request's
/// messages (kept: the state after its last message), and many conversations open with the
/// same system prompt (kept: the state after the first message). Keyed by the exact role and
/// text of the messages (not [`crate::linking::sessions`]' whitespace-tolerant hash), so a hit gives
/// exactly the hashes tokenizing would. Bounded by the hashes it holds; the oldest entries go
/// first.
#[derive(Debug)]
pub struct PrefixCache {
    inner: Mutex<CacheInner>,
    max_hashes: usize,
    hits: AtomicU64,
}

#[derive(Debug, Default)]
struct CacheInner {
    map: HashMap<u64, Arc<Blocks>>,
    order: VecDeque<u64>,
    hashes: usize,
}

impl PrefixCache {
    /// A cache holding at most `max_hashes` block hashes.
    pub fn new(max_hashes: usize) -> Self {
        PrefixCache {
            inner: Mutex::new(CacheInner::default()),
            max_hashes,
            hits: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prompts that started from a cached prefix.
    pub fn hits(&self) -> u64 {
        self.hits.load(Relaxed)
    }

    fn get(&self, key: u64) -> Option<Arc<Blocks>> {
        self.lock().map.get(&key).cloned()
    }

    fn put(&self, key: u64, b: &Blocks) {
        let cost = b.out.len() + 1;
        if cost > self.max_hashes {
            return;
        }
        let mut c = self.lock();
        if c.map.contains_key(&key) {
            return;
        }
        c.map.insert(key, Arc::new(b.clone()));
        c.order.push_back(key);
        c.hashes += cost;
        while c.hashes > self.max_hashes {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(gone) = c.map.remove(&old) {
                c.hashes -= gone.out.len() + 1;
            }
        }
    }
}

/// The exact key of a chat prompt's messages up to `m`, chained from `parent`'s: every piece
/// [`walk_message`] feeds the tokenizer, with its kind. None for a message without a string
/// role (not cached).
fn message_key(parent: u64, m: &Value) -> Option<u64> {
    m.get("role").and_then(Value::as_str)?;
    let mut h = fnv(parent, &[3]);
    walk_message(m, &mut |piece| {
        match piece {
            Piece::Role(r) => h = fnv(fnv(h, &[4]), r.as_bytes()),
            Piece::Text(t) => {
                h = fnv(
                    fnv(fnv(h, &[5]), &(t.len() as u64).to_le_bytes()),
                    t.as_bytes(),
                )
            }
            Piece::Ids(_) => {}
        }
        Some(())
    })?;
    Some(h)
}

/// [`prompt_blocks`], starting a chat prompt from the longest prefix of its messages found in
/// `cache` and leaving its own states there (after its first and its last message). The
/// result is exactly [`prompt_blocks`]'.
pub fn prompt_blocks_cached(
    req: &Map<String, Value>,
    block_size: u32,
    tok: &Tokenizer,
    cache: &PrefixCache,
) -> Option<PromptBlocks> {
    let Some(messages) = req.get("messages").and_then(Value::as_array) else {
        return prompt_blocks(req, block_size, tok);
    };
    let mut keys = Vec::with_capacity(messages.len());
    let mut h = fnv(FNV_OFFSET, &block_size.to_le_bytes());
    for m in messages {
        let Some(k) = message_key(h, m) else { break };
        keys.push(k);
        h = k;
    }
    let cached = keys
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, k)| cache.get(*k).map(|b| (i + 1, b)));
    let (start, mut b) = match cached {
        Some((n, b)) => {
            cache.hits.fetch_add(1, Relaxed);
            (n, Blocks::clone(&b))
        }
        None => (0, Blocks::new(block_size as usize)),
    };
    for (i, m) in messages.iter().enumerate().skip(start) {
        walk_message(m, &mut |piece| feed(&mut b, tok, piece))?;
        if i < keys.len() && (i == 0 || i + 1 == messages.len()) {
            cache.put(keys[i], &b);
        }
    }
    Some(PromptBlocks {
        hashes: b.out,
        tokens: b.tokens,
    })
}

/// The prefix hashes of a generation request's prompt (see [`prompt_blocks`]), or `None` when
/// the body has no prompt this can read.
pub fn prefix_hashes(
    req: &Map<String, Value>,
    block_size: u32,
    tokenizer: &Tokenizer,
) -> Option<Vec<u64>> {
    prompt_blocks(req, block_size, tokenizer).map(|p| p.hashes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(v: Value, bs: u32) -> Vec<u64> {
        prefix_hashes(v.as_object().unwrap(), bs, &Tokenizer::words()).unwrap()
    }

    #[test]
    fn shared_prefixes_share_hashes() {
        let a = hashes(serde_json::json!({"prompt": "a b c d e f g"}), 2);
        let b = hashes(serde_json::json!({"prompt": "a b c d x f g h"}), 2);
        assert_eq!(a.len(), 3);
        assert_eq!(b.len(), 4);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Chained: an equal block after a different prefix hashes differently.
        let c = hashes(serde_json::json!({"prompt": "z z a b"}), 2);
        assert_ne!(c[1], a[0]);
        let chat = hashes(
            serde_json::json!({"messages":[{"role":"user","content":"a b c"}]}),
            2,
        );
        assert_eq!(
            chat.len(),
            1,
            "the role is hashed but not counted as a token"
        );
        assert_eq!(
            hashes(serde_json::json!({"prompt": [1, 2, 3, 4]}), 2).len(),
            2
        );
    }

    /// A conversation's turns through the prefix cache give exactly the uncached blocks;
    /// from the second turn on each starts from the previous turn's state (a hit), and a
    /// second conversation with the same system prompt starts from its state. Messages that
    /// differ only in whitespace (equal for session linking) are not taken for each other.
    #[test]
    fn cached_chat_prefixes_give_exactly_the_uncached_blocks() {
        let tok = Tokenizer::load("cl100k_base").unwrap();
        let cache = PrefixCache::new(PREFIX_CACHE_HASHES);
        let system =
            serde_json::json!({"role": "system", "content": "You are terse. Answer in one line."});
        let mut msgs = vec![system.clone()];
        for turn in 0..6 {
            msgs.push(serde_json::json!({"role": "user", "content": format!("Question {turn}: why is the sky blue at noon?")}));
            let req = serde_json::json!({ "messages": msgs });
            let req = req.as_object().unwrap();
            let want = prompt_blocks(req, 4, &tok).unwrap();
            assert_eq!(
                prompt_blocks_cached(req, 4, &tok, &cache),
                Some(want),
                "turn {turn}"
            );
            assert_eq!(cache.hits(), turn, "turn {turn}");
            msgs.push(serde_json::json!({"role": "assistant", "content": [{"type": "text", "text": format!("Rayleigh scattering ({turn}).")}]}));
        }
        let other =
            serde_json::json!({"messages": [system, {"role": "user", "content": "Hello there"}]});
        let other = other.as_object().unwrap();
        let hits = cache.hits();
        assert_eq!(
            prompt_blocks_cached(other, 4, &tok, &cache),
            prompt_blocks(other, 4, &tok)
        );
        assert_eq!(cache.hits(), hits + 1, "the shared system prompt");
        let spaced = serde_json::json!({"messages": [
            {"role": "system", "content": "You are terse. Answer in one line.  "},
            {"role": "user", "content": "Hello there"},
        ]});
        let spaced = spaced.as_object().unwrap();
        assert_eq!(
            prompt_blocks_cached(spaced, 4, &tok, &cache),
            prompt_blocks(spaced, 4, &tok)
        );
        // A cache too small for any state keeps nothing and still gives the same blocks.
        let tiny = PrefixCache::new(1);
        assert_eq!(
            prompt_blocks_cached(other, 4, &tok, &tiny),
            prompt_blocks(other, 4, &tok)
        );
        assert_eq!(tiny.lock().map.len(), 0);
    }

    /// With a real tokenizer (cl100k_base): two prompts sharing a prefix share the hashes of
    /// every block that lies wholly inside it and differ from the block where they diverge.
    #[test]
    fn real_tokenizer_shared_prefix_shares_leading_blocks_only() {
        let tok = Tokenizer::load("cl100k_base").unwrap();
        let shared = "You are a helpful assistant. Answer every question about the history \
                      of the Roman Empire with care, cite your sources, and keep it short.";
        let a_text = format!("{shared} Who was the first emperor of Rome and when did he rule?");
        let b_text =
            format!("{shared} Why did the western half fall while the eastern half survived?");
        // The suffixes start with a space-led word, so the BPE split does not cross the seam.
        let n_shared = tok.count(shared).unwrap();
        assert_eq!(
            tok.encode(&a_text).unwrap()[..n_shared],
            tok.encode(shared).unwrap()[..]
        );
        let bs = 8;
        let run = |t: &str| {
            prompt_blocks(
                serde_json::json!({"prompt": t}).as_object().unwrap(),
                bs,
                &tok,
            )
            .unwrap()
        };
        let (a, b) = (run(&a_text), run(&b_text));
        assert_eq!(a.tokens, tok.count(&a_text).unwrap());
        assert_eq!(a.hashes.len(), a.tokens / bs as usize);
        let k = n_shared / bs as usize; // blocks wholly inside the shared prefix
        assert!(
            k >= 2 && a.hashes.len() > k && b.hashes.len() > k,
            "{a:?} {b:?}"
        );
        assert_eq!(a.hashes[..k], b.hashes[..k]);
        for j in k..a.hashes.len().min(b.hashes.len()) {
            assert_ne!(a.hashes[j], b.hashes[j], "block {j}");
        }
        // Token ids hash as the text they came from; a different tokenizer gives other blocks.
        let ids = tok.encode(&a_text).unwrap();
        let by_ids = prompt_blocks(
            serde_json::json!({ "prompt": ids }).as_object().unwrap(),
            bs,
            &tok,
        )
        .unwrap();
        assert_eq!(by_ids, a);
        let words = prompt_blocks(
            serde_json::json!({"prompt": a_text}).as_object().unwrap(),
            bs,
            &Tokenizer::words(),
        )
        .unwrap();
        assert_ne!(words.hashes[0], a.hashes[0]);
        // Chat: the same shared text in a user message shares its leading blocks too, and the
        // role changes the hashes.
        let chat = |role: &str, t: &str| {
            prompt_blocks(
                serde_json::json!({"messages": [{"role": role, "content": t}]})
                    .as_object()
                    .unwrap(),
                bs,
                &tok,
            )
            .unwrap()
        };
        let (ca, cb) = (chat("user", &a_text), chat("user", &b_text));
        assert_eq!(ca.hashes[..k], cb.hashes[..k]);
        assert_ne!(ca.hashes[k], cb.hashes[k]);
        assert_eq!(ca.tokens, a.tokens);
        assert_ne!(chat("system", &a_text).hashes[0], ca.hashes[0]);
    }
}
