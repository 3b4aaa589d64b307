//! Prefix hashes of a prompt: the hash of every full block of `block_size` tokens, each
//! chained to the one before (as vLLM's prefix cache keys blocks), so a replay can rebuild
//! which requests shared a prefix without any prompt text being kept.
//!
//! **Tokenizer placeholder:** the workspace has no real tokenizer yet, so tokens are
//! whitespace-separated words ([`Tokenizer::Whitespace`], recorded as `tokenizer=whitespace`
//! in the file metadata), the same unit the simulator counts. A completion prompt given as
//! token ids uses the ids. Chat prompts hash each message's role and its text content in
//! order (no chat template). Hashes are FNV-1a 64 over the parent hash and the tokens, stable
//! across builds and platforms.

use serde_json::{Map, Value};

/// How prompt tokens are counted for block hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Tokenizer {
    /// One token per whitespace-separated word (placeholder until a real tokenizer exists).
    #[default]
    Whitespace,
}

impl Tokenizer {
    /// The name written into the file metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            Tokenizer::Whitespace => "whitespace",
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Chains tokens into block hashes.
struct Blocks {
    block_size: usize,
    parent: u64,
    cur: u64,
    in_block: usize,
    out: Vec<u64>,
}

impl Blocks {
    fn new(block_size: usize) -> Self {
        Blocks {
            block_size: block_size.max(1),
            parent: 0,
            cur: fnv(FNV_OFFSET, &0u64.to_le_bytes()),
            in_block: 0,
            out: Vec::new(),
        }
    }

    fn token(&mut self, bytes: &[u8], tag: u8) {
        self.cur = fnv(self.cur, &[tag]);
        self.cur = fnv(self.cur, bytes);
        self.in_block += 1;
        if self.in_block == self.block_size {
            self.parent = self.cur;
            self.out.push(self.cur);
            self.cur = fnv(FNV_OFFSET, &self.parent.to_le_bytes());
            self.in_block = 0;
        }
    }

    fn words(&mut self, text: &str) {
        for w in text.split_whitespace() {
            self.token(w.as_bytes(), 1);
        }
    }
}

/// The prefix hashes of a generation request's prompt, or `None` when the body has no prompt
/// this can read.
pub fn prefix_hashes(
    req: &Map<String, Value>,
    block_size: u32,
    tokenizer: Tokenizer,
) -> Option<Vec<u64>> {
    let Tokenizer::Whitespace = tokenizer;
    let mut b = Blocks::new(block_size as usize);
    if let Some(messages) = req.get("messages").and_then(Value::as_array) {
        for m in messages {
            if let Some(role) = m.get("role").and_then(Value::as_str) {
                b.token(role.as_bytes(), 2);
            }
            match m.get("content") {
                Some(Value::String(s)) => b.words(s),
                Some(Value::Array(parts)) => {
                    for p in parts {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            b.words(t);
                        }
                    }
                }
                _ => {}
            }
        }
        return Some(b.out);
    }
    let prompt = req.get("prompt")?;
    let first = match prompt {
        Value::Array(a) if a.first().is_some_and(|v| v.is_string() || v.is_array()) => a.first()?,
        other => other,
    };
    match first {
        Value::String(s) => b.words(s),
        Value::Array(ids) => {
            for id in ids {
                b.token(&id.as_u64()?.to_le_bytes(), 3);
            }
        }
        _ => return None,
    }
    Some(b.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(v: Value, bs: u32) -> Vec<u64> {
        prefix_hashes(v.as_object().unwrap(), bs, Tokenizer::Whitespace).unwrap()
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
        assert_eq!(chat.len(), 2);
        assert_eq!(
            hashes(serde_json::json!({"prompt": [1, 2, 3, 4]}), 2).len(),
            2
        );
    }
}
