//! What one generation's output is, whichever API it is written in: its id, model and
//! prompt, and the shape of its output tokens (reasoning first, then the answer's text or a
//! tool call's arguments). Each API's writer ([`crate::openai::Formatter`] for completions
//! and chat, [`crate::typed`] for Responses and Messages) turns token ranges of it into its
//! own events and bodies (`writer.rs` picks the writer).

use std::ops::Range;

use serde_json::Value;
use wire::api::Api;

use crate::tokens::push_output_text;

/// A tool call the answer is: its id and the tool's name; its arguments are the answer's
/// tokens as `{"input":"<words>"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    /// `call_…` (Responses, chat) or `toolu_…` (Messages).
    pub(crate) id: String,
    /// The tool called (the first the request offered).
    pub(crate) name: String,
}

/// Opening and closing of a call's arguments around its words.
const ARGS_OPEN: &str = "{\"input\":\"";
const ARGS_CLOSE: &str = "\"}";

/// One generation's output, as every writer sees it.
#[derive(Debug)]
pub(crate) struct Gen {
    pub(crate) api: Api,
    /// The id's suffix, unique to the response (item ids are made from it).
    pub(crate) suffix: String,
    /// The response's id, with its API's prefix (`chatcmpl-`, `cmpl-`, `resp_`, `msg_`).
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    /// `model` as a JSON string.
    pub(crate) model_json: String,
    pub(crate) prompt_tokens: u32,
    /// Seed of the output words.
    pub(crate) text_start: u64,
    /// Output tokens `0..reasoning` are reasoning, the rest the answer.
    pub(crate) reasoning: u32,
    /// The answer is this tool call's arguments, not text.
    pub(crate) call: Option<Call>,
}

impl Gen {
    /// A generation of `api` whose id ends in `suffix`.
    pub(crate) fn new(
        api: Api,
        suffix: &str,
        created: u64,
        model: &str,
        prompt_tokens: u32,
        text_start: u64,
    ) -> Gen {
        let prefix = match api {
            Api::Chat => "chatcmpl-",
            Api::Completions => "cmpl-",
            Api::Responses => "resp_",
            Api::Messages => "msg_",
            Api::Embeddings => "embd-",
            Api::Rerank => "rerank-",
            Api::Score => "score-",
        };
        Gen {
            api,
            suffix: suffix.to_string(),
            id: format!("{prefix}{suffix}"),
            created,
            model: model.to_string(),
            model_json: Value::from(model).to_string(),
            prompt_tokens,
            text_start,
            reasoning: 0,
            call: None,
        }
    }

    /// The first `tokens` output tokens are reasoning.
    pub(crate) fn with_reasoning(mut self, tokens: u32) -> Gen {
        self.reasoning = tokens;
        self
    }

    /// The answer is a call of `tool` (`None`: text).
    pub(crate) fn with_call(mut self, tool: Option<&str>) -> Gen {
        self.call = tool.map(|name| Call {
            id: match self.api {
                Api::Messages => format!("toolu_{}", self.suffix),
                _ => format!("call_{}", self.suffix),
            },
            name: name.to_string(),
        });
        self
    }

    /// Output tokens `from..to` split into their reasoning and answer parts (either may be
    /// empty).
    pub(crate) fn split(&self, from: u32, to: u32) -> (Range<u32>, Range<u32>) {
        let at = self.reasoning.clamp(from, to);
        (from..at, at..to)
    }

    /// The words of output tokens `r`.
    pub(crate) fn text(&self, r: Range<u32>) -> String {
        let mut t = String::new();
        push_output_text(self.text_start, r.start, r.end, &mut t);
        t
    }

    /// The piece of the answer tokens `r` of a response of `n` tokens: their words, or, for a
    /// call, the piece of its arguments (opened with the first answer token, closed with the
    /// last).
    pub(crate) fn answer_piece(&self, r: Range<u32>, n: u32) -> String {
        if self.call.is_none() {
            return self.text(r);
        }
        let mut t = String::new();
        if r.start <= self.reasoning {
            t.push_str(ARGS_OPEN);
        }
        push_output_text(self.text_start, r.start, r.end, &mut t);
        if r.end >= n {
            t.push_str(ARGS_CLOSE);
        }
        t
    }

    /// The reasoning and the answer (text, or a call's whole arguments) of a response of `n`
    /// output tokens.
    pub(crate) fn whole(&self, n: u32) -> (String, String) {
        let (r, a) = self.split(0, n);
        let answer = if self.call.is_some() || !a.is_empty() {
            self.answer_piece(a, n)
        } else {
            String::new()
        };
        (self.text(r), answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_arguments_are_json_however_they_are_split() {
        let g = Gen::new(Api::Responses, "x", 0, "m", 3, 7)
            .with_reasoning(2)
            .with_call(Some("lookup"));
        let n = 9;
        let (r, whole) = g.whole(n);
        assert_eq!(r.split_whitespace().count(), 2);
        let v: Value = serde_json::from_str(&whole).unwrap();
        assert_eq!(v["input"].as_str().unwrap().split_whitespace().count(), 7);
        let pieces: String = [(2, 3), (3, 6), (6, 9)]
            .iter()
            .map(|&(a, b)| g.answer_piece(a..b, n))
            .collect();
        assert_eq!(pieces, whole);
        assert_eq!(g.call.as_ref().unwrap().id, "call_x");
        assert_eq!(g.split(0, 5), (0..2, 2..5));
        assert_eq!(g.split(3, 5), (3..3, 3..5));
    }
}
