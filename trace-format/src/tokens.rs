//! Which token count a row takes, and from where: one rule for capture and replay, so the
//! same response gives the same `output_tokens` and `reasoning_tokens` on both sides (an A/A
//! fidelity report pairs them per request).
//!
//! Best first: the server's `usage` (`completion_tokens`,
//! `completion_tokens_details.reasoning_tokens`, or each API's names for them); else the
//! generated text counted by the tokenizer (capture's `--tokenizer`, replay's `--tokenizer`
//! or the capture's own, from the trace's metadata); else an estimate: for a stream, the
//! chunks that carried it (a chunk may carry several tokens); for a whole body, its text's
//! bytes / [`ESTIMATE_BYTES_PER_TOKEN`]. Capture takes the estimate too for a row whose count
//! it shed (its writer behind) or whose text it did not keep (past its bound).
//!
//! Reasoning is part of the output: a reasoning model's `completion_tokens` count its
//! reasoning and its answer, and the answer's tokens are `output_tokens - reasoning_tokens`.
//! A response that carried no reasoning has 0, known as well as its output is known.

use crate::{TokenSource, TraceRecord};

/// Bytes of text per token where no tokenizer counted it (an estimate).
pub const ESTIMATE_BYTES_PER_TOKEN: usize = 4;

/// `text`'s tokens estimated without a tokenizer: [`ESTIMATE_BYTES_PER_TOKEN`] bytes each.
pub fn estimate_text(text: &str) -> usize {
    text.len().div_ceil(ESTIMATE_BYTES_PER_TOKEN)
}

/// What was seen of one kind of a response's generated output (all of it, or its reasoning).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// Its text, when kept.
    pub text: Option<String>,
    /// The stream's events that carried it (0 for a whole body).
    pub chunks: usize,
    /// Whether it was streamed.
    pub streamed: bool,
}

impl Seen {
    /// Seen in a stream: `chunks` events carried it, its text if kept.
    pub fn streamed(chunks: usize, text: Option<String>) -> Self {
        Seen {
            text,
            chunks,
            streamed: true,
        }
    }

    /// Read from a whole body.
    pub fn whole(text: Option<String>) -> Self {
        Seen {
            text,
            chunks: 0,
            streamed: false,
        }
    }

    /// Whether anything was generated (a chunk, or some text of a whole body).
    pub fn any(&self) -> bool {
        self.chunks > 0 || self.text.as_deref().is_some_and(|t| !t.is_empty())
    }

    /// Its tokens without usage: the text counted by `count` (None: no tokenizer, or the
    /// count was shed), else the estimate (the chunks of a stream, a whole text's bytes / 4);
    /// None when nothing was generated.
    pub fn count(&self, count: impl FnOnce(&str) -> Option<usize>) -> Option<(usize, TokenSource)> {
        if !self.any() {
            return None;
        }
        if let Some(n) = self.text.as_deref().and_then(count) {
            return Some((n, TokenSource::Tokenizer));
        }
        let estimate = match (self.streamed, self.text.as_deref()) {
            (true, _) => self.chunks,
            (false, Some(t)) => estimate_text(t),
            (false, None) => return None,
        };
        Some((estimate, TokenSource::Estimate))
    }
}

/// Sets `output_tokens` and its source on `rec` by the rule: the server's count (`usage`),
/// else what was `seen` counted (see [`Seen::count`]). Untouched when neither gives one.
pub fn fill_output(
    rec: &mut TraceRecord,
    usage: Option<i64>,
    seen: &Seen,
    count: impl FnOnce(&str) -> Option<usize>,
) {
    let n = match usage {
        Some(n) => Some((n, TokenSource::Usage)),
        None => seen.count(count).map(|(n, s)| (n as i64, s)),
    };
    if let Some((n, source)) = n {
        rec.output_tokens = Some(n);
        rec.output_tokens_source = Some(source);
    }
}

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
    /// The reasoning by the rule: the server's count (`reported`), else none when no
    /// reasoning was `seen`, else the reasoning seen counted (see [`Seen::count`]).
    pub fn of(
        reported: Option<i64>,
        seen: &Seen,
        count: impl FnOnce(&str) -> Option<usize>,
    ) -> Reasoning {
        if let Some(n) = reported {
            return Reasoning::Reported(n);
        }
        match seen.count(count) {
            None => Reasoning::Absent,
            Some((n, TokenSource::Tokenizer)) => Reasoning::Counted(n),
            Some((n, _)) => Reasoning::Estimated(n),
        }
    }

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

    #[test]
    fn usage_then_the_tokenizer_then_chunks_or_bytes() {
        let words = |t: &str| Some(t.split_whitespace().count());
        let none = |_: &str| None;
        let mut r = TraceRecord::new("a", 0, "/v1/chat/completions");
        let stream = Seen::streamed(3, Some("one two three four five six".into()));
        fill_output(&mut r, Some(9), &stream, words);
        assert_eq!(
            (r.output_tokens, r.output_tokens_source),
            (Some(9), Some(TokenSource::Usage))
        );
        fill_output(&mut r, None, &stream, words);
        assert_eq!(
            (r.output_tokens, r.output_tokens_source),
            (Some(6), Some(TokenSource::Tokenizer))
        );
        // No tokenizer (or the count shed), and a stream whose text was not kept: its chunks.
        fill_output(&mut r, None, &stream, none);
        assert_eq!(
            (r.output_tokens, r.output_tokens_source),
            (Some(3), Some(TokenSource::Estimate))
        );
        fill_output(&mut r, None, &Seen::streamed(3, None), words);
        assert_eq!(r.output_tokens, Some(3));
        // A whole body: its bytes / 4.
        let whole = Seen::whole(Some("x".repeat(10)));
        assert_eq!(whole.count(none), Some((3, TokenSource::Estimate)));
        assert_eq!(whole.count(words), Some((1, TokenSource::Tokenizer)));
        // Nothing generated: no count, and a row's count is left alone.
        let mut r = TraceRecord::new("b", 0, "/v1/chat/completions");
        fill_output(&mut r, None, &Seen::streamed(0, None), words);
        fill_output(&mut r, None, &Seen::whole(Some(String::new())), words);
        assert_eq!(r.output_tokens, None);
    }

    #[test]
    fn reasoning_by_the_same_rule() {
        let words = |t: &str| Some(t.split_whitespace().count());
        let none = |_: &str| None;
        assert_eq!(
            Reasoning::of(Some(4), &Seen::default(), words),
            Reasoning::Reported(4)
        );
        assert_eq!(
            Reasoning::of(None, &Seen::streamed(0, None), words),
            Reasoning::Absent
        );
        assert_eq!(
            Reasoning::of(None, &Seen::whole(None), words),
            Reasoning::Absent
        );
        let seen = Seen::streamed(2, Some("a b c".into()));
        assert_eq!(Reasoning::of(None, &seen, words), Reasoning::Counted(3));
        assert_eq!(Reasoning::of(None, &seen, none), Reasoning::Estimated(2));
        let whole = Seen::whole(Some("abcdefgh".into()));
        assert_eq!(Reasoning::of(None, &whole, none), Reasoning::Estimated(2));
    }
}
