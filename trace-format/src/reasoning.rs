//! Reasoning tokens of a row, from what capture or replay observed of the response: one
//! rule for both (schema 1.4's `reasoning_tokens` and `reasoning_tokens_source`).
//!
//! Reasoning is part of the output: a reasoning model's `completion_tokens` count its
//! reasoning and its answer, and the answer's tokens are `output_tokens - reasoning_tokens`.
//! Where the count comes from, best first: the server's `usage.completion_tokens_details.
//! reasoning_tokens`; the reasoning text (`reasoning_content` / `reasoning`) counted by the
//! tokenizer; the reasoning-only chunks (an estimate: a chunk may carry several tokens). A
//! response that carried no reasoning has 0, known as well as its output is known.

use crate::{TokenSource, TraceRecord};

/// What was observed of a response's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    /// The server reported it (`usage.completion_tokens_details.reasoning_tokens`).
    Reported(i64),
    /// No reasoning came (no reasoning-only chunk; no reasoning text in a whole body).
    Absent,
    /// The reasoning text, counted by the tokenizer.
    Counted(usize),
    /// An estimate (reasoning-only chunks, or the text's length when counting was shed).
    Estimated(usize),
}

impl Reasoning {
    /// Sets `reasoning_tokens` and its source on `rec`, whose output tokens (and their
    /// source) are already set: a response without reasoning has 0 reasoning tokens when
    /// its output is known, and none when its output is not.
    pub fn fill(self, rec: &mut TraceRecord) {
        let (n, source) = match self {
            Reasoning::Reported(n) => (Some(n), Some(TokenSource::Usage)),
            Reasoning::Absent => match rec.output_tokens {
                Some(_) => (Some(0), rec.output_tokens_source),
                None => (None, None),
            },
            Reasoning::Counted(n) => (Some(n as i64), Some(TokenSource::Tokenizer)),
            Reasoning::Estimated(n) => (Some(n as i64), Some(TokenSource::Estimate)),
        };
        rec.reasoning_tokens = n;
        rec.reasoning_tokens_source = source;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_observation_fills_count_and_source() {
        let mut r = TraceRecord::new("a", 0, "/v1/chat/completions");
        Reasoning::Absent.fill(&mut r);
        assert_eq!(
            (r.reasoning_tokens, r.reasoning_tokens_source),
            (None, None)
        );
        r.output_tokens = Some(12);
        r.output_tokens_source = Some(TokenSource::Usage);
        Reasoning::Absent.fill(&mut r);
        assert_eq!(
            (r.reasoning_tokens, r.reasoning_tokens_source),
            (Some(0), Some(TokenSource::Usage))
        );
        Reasoning::Reported(9).fill(&mut r);
        assert_eq!(
            (r.reasoning_tokens, r.reasoning_tokens_source),
            (Some(9), Some(TokenSource::Usage))
        );
        Reasoning::Counted(7).fill(&mut r);
        assert_eq!(r.reasoning_tokens_source, Some(TokenSource::Tokenizer));
        Reasoning::Estimated(3).fill(&mut r);
        assert_eq!(
            (r.reasoning_tokens, r.reasoning_tokens_source),
            (Some(3), Some(TokenSource::Estimate))
        );
    }
}
