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
/// FNV-1a 64's offset basis (also the seed of [`crate::sessions`]' message chain).
pub(crate) use trace_format::fnv::OFFSET as FNV_OFFSET;

/// Chains tokens into block hashes.
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
    if let Some(messages) = req.get("messages").and_then(Value::as_array) {
        for m in messages {
            if let Some(role) = m.get("role").and_then(Value::as_str) {
                b.mark(role.as_bytes());
            }
            match m.get("content") {
                Some(Value::String(s)) => b.text(tok, s)?,
                Some(Value::Array(parts)) => {
                    for p in parts {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            b.text(tok, t)?;
                        }
                    }
                }
                _ => {}
            }
        }
    } else {
        let prompt = req.get("prompt")?;
        let first = match prompt {
            Value::Array(a) if a.first().is_some_and(|v| v.is_string() || v.is_array()) => {
                a.first()?
            }
            other => other,
        };
        match first {
            Value::String(s) => b.text(tok, s)?,
            Value::Array(ids) => {
                for id in ids {
                    b.token(id.as_u64()?);
                }
            }
            _ => return None,
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
