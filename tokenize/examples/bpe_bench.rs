//! Tokenizer throughput on the same text: tiktoken-rs against GitHub's `bpe-openai`, for
//! cl100k_base and o200k_base, and a check that both give identical ids.
//!
//! `cargo run --release -p tokenize --example bpe_bench [-- TOKENS_PER_TEXT SECONDS]`
//!
//! The text is English-like prose with punctuation, digits, code and some non-ASCII, made
//! deterministic from a seed, cut into prompts of about `TOKENS_PER_TEXT` tokens (default
//! 1,000). Prints tokens/s per encoder (one thread) and the ratio.

use std::time::{Duration, Instant};

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "tokenization",
    "latency",
    "throughput",
    "prefix",
    "cache",
    "request",
    "stream",
    "engine",
    "benchmark",
    "Rust",
    "fn main() {",
    "let x = 42;",
    "}",
    "// comment",
    "naïve",
    "café",
    "日本語",
    "Ünïcödé",
    "1234567",
    "3.14159",
    "e-mail:",
    "user@example.com",
    "https://example.com/a?b=c",
    "\n\n",
    "  ",
    "\t",
    "—",
    "“quoted”",
    "don't",
    "it's",
    "we'll",
    "They've",
    "(parenthesis)",
    "!!!",
];

fn text(seed: u64, words: usize) -> String {
    let mut s = seed | 1;
    let mut out = String::new();
    for i in 0..words {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if i > 0 && s % 7 != 0 {
            out.push(' ');
        }
        out.push_str(WORDS[(s % WORDS.len() as u64) as usize]);
        if s % 17 == 0 {
            out.push_str(". ");
        }
    }
    out
}

fn rate(texts: &[String], budget: Duration, mut f: impl FnMut(&str) -> usize) -> f64 {
    let t0 = Instant::now();
    let mut tokens = 0usize;
    let mut i = 0;
    while t0.elapsed() < budget {
        tokens += f(&texts[i % texts.len()]);
        i += 1;
    }
    tokens as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let per_text: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let budget = Duration::from_secs_f64(secs);
    for (name, tk, bp) in [
        (
            "cl100k_base",
            tiktoken_rs::cl100k_base_singleton(),
            bpe_openai::cl100k_base(),
        ),
        (
            "o200k_base",
            tiktoken_rs::o200k_base_singleton(),
            bpe_openai::o200k_base(),
        ),
    ] {
        // About 0.8 words per token for this text.
        let texts: Vec<String> = (0..64).map(|i| text(i + 1, per_text * 4 / 5)).collect();
        let mut mismatched = 0;
        let mut n = 0usize;
        for t in &texts {
            let a = tk.encode_ordinary(t);
            let b = bp.encode(t.as_str());
            n += a.len();
            if a != b {
                mismatched += 1;
            }
        }
        let avg = n / texts.len();
        let r_tk = rate(&texts, budget, |t| tk.encode_ordinary(t).len());
        let r_bp = rate(&texts, budget, |t| bp.encode(t).len());
        let r_bp_count = rate(&texts, budget, |t| bp.count(t));
        println!(
            "{name}: {avg} tokens/text; tiktoken-rs {:.2} M tokens/s, bpe-openai encode {:.2} M tokens/s ({:.1}x), count {:.2} M tokens/s; texts with different ids: {mismatched}/{}",
            r_tk / 1e6,
            r_bp / 1e6,
            r_bp / r_tk,
            r_bp_count / 1e6,
            texts.len()
        );
    }
}
