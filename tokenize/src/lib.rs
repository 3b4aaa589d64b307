//! Tokenizers: a Hugging Face `tokenizer.json`, a built-in tiktoken encoding, or the sim's
//! one-token-per-word stand-in, behind one [`Tokenizer`] type.
//!
//! `--tokenizer SPEC` takes:
//! - `cl100k_base` or `o200k_base`: OpenAI's BPE ranks, embedded in the binary; nothing is
//!   downloaded at run time. Text is encoded and counted with GitHub's `bpe-openai` (about
//!   2.5× faster than tiktoken-rs for cl100k_base and 1.6× for o200k_base here, see
//!   `examples/bpe_bench.rs`; the same ids, checked against tiktoken-rs in the tests),
//!   decoded with tiktoken-rs;
//! - `words`: one token per whitespace-separated word, exactly what `llmreplay sim` counts;
//! - anything else: a path to a Hugging Face `tokenizer.json` (the `tokenizers` crate, with the
//!   `fancy-regex` engine, which gives the same ids as onig). Truncation and padding configured
//!   in the file are switched off, so counts are never capped.
//!
//! [`Tokenizer::count`] and [`Tokenizer::encode`] count the text itself, without the special
//! tokens a tokenizer's post-processor adds around a sequence (a BOS for Llama 3, nothing for
//! Qwen or tiktoken). [`Tokenizer::special_tokens_added`] says how many a server adds on top
//! when it tokenizes a completions prompt, so a prompt meant to be `N` tokens by the server's
//! count has `N - special_tokens_added()` tokens of text.
//!
//! Tokenizing is not cheap (µs per hundred tokens); callers do it once per request, never per
//! streamed chunk.
//!
//! A crate of its own so that only what counts tokens (capture, replay's prompts, the
//! importers) builds the `tokenizers`, `bpe-openai` and `tiktoken-rs` crates.
#![deny(missing_docs)]

use std::fmt;
use std::path::Path;

pub mod error;

pub use error::{Error, Result};

/// Names accepted by [`Tokenizer::load`] besides a file path.
pub const BUILTIN: &[&str] = &["words", "cl100k_base", "o200k_base"];

/// A loaded tokenizer. Cheap to share behind an `Arc`; every method takes `&self` and is
/// safe to call from several threads.
pub struct Tokenizer {
    name: String,
    kind: Kind,
    special_added: usize,
}

enum Kind {
    Words,
    /// One of OpenAI's encodings: encoded and counted by `bpe-openai`, decoded by tiktoken-rs
    /// (loaded on the first decode).
    Tiktoken {
        fast: &'static bpe_openai::Tokenizer,
        core: fn() -> &'static tiktoken_rs::CoreBPE,
    },
    Hf(Box<tokenizers::Tokenizer>),
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("name", &self.name)
            .field("kind", &self.kind_name())
            .finish()
    }
}

impl Tokenizer {
    /// Loads a tokenizer from `spec`: a built-in name (see [`BUILTIN`]) or a path to a
    /// Hugging Face `tokenizer.json`.
    ///
    /// Errors: [`Error::Io`] when the file cannot be read, [`Error::Invalid`] when it is not a
    /// tokenizer.json, or when `spec` is neither a known name nor an existing file.
    pub fn load(spec: &str) -> Result<Tokenizer> {
        match spec {
            "words" => return Ok(Tokenizer::words()),
            "cl100k_base" => {
                return Ok(Tokenizer::tiktoken(
                    "cl100k_base",
                    bpe_openai::cl100k_base(),
                    tiktoken_rs::cl100k_base_singleton,
                ))
            }
            "o200k_base" => {
                return Ok(Tokenizer::tiktoken(
                    "o200k_base",
                    bpe_openai::o200k_base(),
                    tiktoken_rs::o200k_base_singleton,
                ))
            }
            _ => {}
        }
        let path = Path::new(spec);
        if !path.exists() {
            return Err(Error::Invalid(format!(
                "--tokenizer {spec:?}: not a built-in tokenizer ({}) and no such file \
                 (give the path of a Hugging Face tokenizer.json)",
                BUILTIN.join(", ")
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Tokenizer::from_json_bytes(spec, &bytes)
    }

    /// A tokenizer from the bytes of a `tokenizer.json`; `name` identifies it in reports.
    pub fn from_json_bytes(name: &str, bytes: &[u8]) -> Result<Tokenizer> {
        let mut tok = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| {
            Error::Invalid(format!("{name}: not a Hugging Face tokenizer.json: {e}"))
        })?;
        tok.with_truncation(None)
            .map_err(|e| Error::Invalid(format!("{name}: disabling truncation: {e}")))?;
        tok.with_padding(None);
        let mut t = Tokenizer {
            name: name.to_string(),
            kind: Kind::Hf(Box::new(tok)),
            special_added: 0,
        };
        if let Kind::Hf(tok) = &t.kind {
            let with = tok
                .encode_fast("a", true)
                .map_err(|e| Error::Invalid(format!("{name}: {e}")))?
                .len();
            let without = tok
                .encode_fast("a", false)
                .map_err(|e| Error::Invalid(format!("{name}: {e}")))?
                .len();
            t.special_added = with.saturating_sub(without);
        }
        Ok(t)
    }

    /// The sim's tokenizer: one token per whitespace-separated word.
    pub fn words() -> Tokenizer {
        Tokenizer {
            name: "words".into(),
            kind: Kind::Words,
            special_added: 0,
        }
    }

    fn tiktoken(
        name: &str,
        fast: &'static bpe_openai::Tokenizer,
        core: fn() -> &'static tiktoken_rs::CoreBPE,
    ) -> Tokenizer {
        Tokenizer {
            name: name.into(),
            kind: Kind::Tiktoken { fast, core },
            special_added: 0,
        }
    }

    /// The spec it was loaded from (`cl100k_base`, `words`, or the file path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `words`, `tiktoken` or `huggingface`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Words => "words",
            Kind::Tiktoken { .. } => "tiktoken",
            Kind::Hf(_) => "huggingface",
        }
    }

    /// Whether this is the sim's one-token-per-word tokenizer.
    pub fn is_words(&self) -> bool {
        matches!(self.kind, Kind::Words)
    }

    /// Special tokens the tokenizer adds around one sequence (e.g. 1 for a BOS), which a
    /// server counts in `usage.prompt_tokens` of a completions request; 0 for tiktoken and
    /// `words`.
    pub fn special_tokens_added(&self) -> usize {
        self.special_added
    }

    /// Number of tokens of `text` (no special tokens added).
    pub fn count(&self, text: &str) -> Result<usize> {
        match &self.kind {
            Kind::Words => Ok(text.split_whitespace().count()),
            Kind::Tiktoken { fast, .. } => Ok(fast.count(text)),
            Kind::Hf(tok) => Ok(tok.encode_fast(text, false).map_err(|e| self.err(e))?.len()),
        }
    }

    /// Token ids of `text` (no special tokens added). For `words`, an id is a 32-bit hash of
    /// the word (see [`Tokenizer::decode`]).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.kind {
            Kind::Words => Ok(text.split_whitespace().map(word_id).collect()),
            Kind::Tiktoken { fast, .. } => Ok(fast.encode(text)),
            Kind::Hf(tok) => Ok(tok
                .encode_fast(text, false)
                .map_err(|e| self.err(e))?
                .get_ids()
                .to_vec()),
        }
    }

    /// Token ids of `text` as a server tokenizes a completions prompt: with the special
    /// tokens of the post-processor (a BOS for Llama 3); the same as [`Tokenizer::encode`]
    /// for tiktoken and `words`.
    pub fn encode_with_special(&self, text: &str) -> Result<Vec<u32>> {
        match &self.kind {
            Kind::Hf(tok) => Ok(tok
                .encode_fast(text, true)
                .map_err(|e| self.err(e))?
                .get_ids()
                .to_vec()),
            _ => self.encode(text),
        }
    }

    /// The text of token ids. Errors for an id the vocabulary does not have, for bytes that
    /// are not UTF-8 on their own (a split multi-byte character), and always for `words`,
    /// whose ids are hashes.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.kind {
            Kind::Words => Err(Error::Invalid(
                "the words tokenizer cannot decode: its ids are hashes of words".into(),
            )),
            Kind::Tiktoken { core, .. } => {
                let bytes = core().decode_bytes(ids).map_err(|e| {
                    Error::Invalid(format!("{}: unknown token id {}", self.name, e.token))
                })?;
                String::from_utf8(bytes).map_err(|e| {
                    Error::Invalid(format!("{}: decoded bytes are not UTF-8: {e}", self.name))
                })
            }
            Kind::Hf(tok) => tok.decode(ids, false).map_err(|e| self.err(e)),
        }
    }

    fn err(&self, e: impl fmt::Display) -> Error {
        Error::Invalid(format!("tokenizer {}: {e}", self.name))
    }
}

/// The `words` tokenizer's id of a word: FNV-1a, 32 bits.
fn word_id(w: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in w.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Where the tests find the real `tokenizer.json` that `scripts/fetch-tokenizers.sh` fetches
/// (`target/tokenizers/<name>/tokenizer.json` under the workspace root), or `None` with a
/// loud message on stderr when it is missing.
#[doc(hidden)]
pub fn test_tokenizer_json(name: &str) -> Option<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|p| p.join("Cargo.lock").exists())
        .unwrap_or(Path::new(env!("CARGO_MANIFEST_DIR")))
        .to_path_buf();
    let p = std::env::var_os("LLMREPLAY_TOKENIZERS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target").join("tokenizers"))
        .join(name)
        .join("tokenizer.json");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "\n*** SKIPPED: {} is missing; run `bash scripts/fetch-tokenizers.sh` first ***\n",
            p.display()
        );
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_tiktoken_counts_known_strings() {
        let t = Tokenizer::load("cl100k_base").unwrap();
        // Reference ids from OpenAI's tiktoken.
        assert_eq!(t.encode("hello world").unwrap(), vec![15339, 1917]);
        assert_eq!(t.count(" the cat sat").unwrap(), 3);
        assert_eq!(t.decode(&[15339, 1917]).unwrap(), "hello world");
        assert_eq!(t.special_tokens_added(), 0);
        let o = Tokenizer::load("o200k_base").unwrap();
        assert_eq!(o.encode("hello world").unwrap(), vec![24912, 2375]);
        assert_eq!(o.name(), "o200k_base");
    }

    #[test]
    fn words_counts_whitespace_words() {
        let t = Tokenizer::load("words").unwrap();
        assert!(t.is_words());
        assert_eq!(t.count("  one two\tthree\nfour ").unwrap(), 4);
        assert_eq!(t.encode("a b a").unwrap()[0], t.encode("a").unwrap()[0]);
        assert!(t.decode(&[1]).is_err());
    }

    #[test]
    fn unknown_spec_and_bad_file_are_clear_errors() {
        let e = Tokenizer::load("gpt5_magic").unwrap_err().to_string();
        assert!(
            e.contains("cl100k_base") && e.contains("tokenizer.json"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer.json");
        std::fs::write(&p, b"{\"not\": \"a tokenizer\"}").unwrap();
        let e = Tokenizer::load(p.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a Hugging Face tokenizer.json"), "{e}");
    }

    #[test]
    fn huggingface_tokenizer_json_round_trips() {
        let Some(p) = test_tokenizer_json("qwen3") else {
            return;
        };
        let t = Tokenizer::load(p.to_str().unwrap()).unwrap();
        assert_eq!(t.kind_name(), "huggingface");
        // Qwen3 shares cl100k's pre-tokenizer regex; "hello world" is two tokens.
        let ids = t.encode("hello world").unwrap();
        assert_eq!(ids, vec![14990, 1879]);
        assert_eq!(t.decode(&ids).unwrap(), "hello world");
        assert_eq!(t.count(" the cat sat").unwrap(), 3);
        assert_eq!(t.special_tokens_added(), 0);
    }
}
