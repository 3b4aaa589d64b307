//! Responses and Anthropic Messages answers, streamed as the typed events OpenAI's and
//! Anthropic's references print (each `event: TYPE` + `data: {"type":TYPE,…}`) and whole.
//!
//! Responses: `response.created`, `response.in_progress`; per output item its
//! `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
//! `response.content_part.added` + `response.output_text.delta`,
//! `response.function_call_arguments.delta`) and its `….done` events; then
//! `response.completed` (or `response.incomplete` when `max_output_tokens` ended it) with the
//! whole response and its usage (`input_tokens_details.cached_tokens`,
//! `output_tokens_details.reasoning_tokens`).
//!
//! Messages: `message_start` (the prompt's usage), `ping`; per content block (thinking, text,
//! tool_use) its `content_block_start`, deltas (`thinking_delta` then a `signature_delta`,
//! `text_delta`, `input_json_delta`) and `content_block_stop`; then `message_delta` (its
//! `stop_reason`, the output's usage) and `message_stop`.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use wire::api::Api;

use crate::engine_metrics::FinishReason;
use crate::output::Gen;
use crate::store::Store;

/// A response kept for later `previous_response_id`s: the store and the prompt's tokens (the
/// output's are added when it completes).
pub(crate) struct Keep {
    pub(crate) store: Arc<Store>,
    pub(crate) prompt: Vec<u64>,
}

/// What an output item (Responses) or content block (Messages) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Reasoning,
    Answer,
}

/// A Responses or Messages answer being written.
pub(crate) struct Typed {
    g: Gen,
    /// Responses: the next `sequence_number`.
    seq: u64,
    /// The item or block open, its index, and the tokens it covers so far.
    open: Option<(Part, u32, Range<u32>)>,
    /// Items or blocks opened so far.
    opened: u32,
    /// Responses: `previous_response_id`.
    previous: Option<String>,
    /// Responses: the response is stored (`store`), and where, until it completes.
    stored: bool,
    keep: Option<Keep>,
    max_tokens: u32,
}

fn sse(ty: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {ty}\ndata: {data}\n\n"))
}

impl Typed {
    /// A writer of `g` (Responses or Messages), asked for at most `max_tokens`; `previous`
    /// and `keep`: a Responses turn's parent, and where it is kept when it completes.
    pub(crate) fn new(
        g: Gen,
        max_tokens: u32,
        previous: Option<String>,
        keep: Option<Keep>,
    ) -> Typed {
        Typed {
            g,
            seq: 0,
            open: None,
            opened: 0,
            previous,
            stored: keep.is_some(),
            keep,
            max_tokens,
        }
    }

    fn responses(&self) -> bool {
        self.g.api == Api::Responses
    }

    /// A Responses event: its type and members, with its sequence number.
    fn event(&mut self, ty: &str, mut v: Value) -> Bytes {
        if let Some(o) = v.as_object_mut() {
            o.insert("type".into(), ty.into());
            if self.g.api == Api::Responses {
                o.insert("sequence_number".into(), self.seq.into());
                self.seq += 1;
            }
        }
        sse(ty, &v)
    }

    fn item_id(&self, part: Part) -> String {
        let s = &self.g.suffix;
        match (part, &self.g.call) {
            (Part::Reasoning, _) => format!("rs_{s}"),
            (Part::Answer, None) => format!("msg_{s}"),
            (Part::Answer, Some(_)) => format!("fc_{s}"),
        }
    }

    /// The usage of a response of `n` output tokens, in the API's shape.
    fn usage(&self, n: u32) -> Value {
        let p = self.g.prompt_tokens;
        match self.g.api {
            Api::Responses => json!({
                "input_tokens": p,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": n,
                "output_tokens_details": {"reasoning_tokens": self.g.reasoning.min(n)},
                "total_tokens": u64::from(p) + u64::from(n),
            }),
            _ => json!({
                "input_tokens": p,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": n,
            }),
        }
    }

    /// An item (Responses) or block (Messages) of `part` whole, covering tokens `r` of a
    /// response of `n`.
    fn item(&self, part: Part, r: Range<u32>, n: u32) -> Value {
        let id = self.item_id(part);
        let responses = self.responses();
        match (part, &self.g.call) {
            (Part::Reasoning, _) if responses => json!({
                "id": id, "type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": self.g.text(r)}],
            }),
            (Part::Reasoning, _) => json!({
                "type": "thinking", "thinking": self.g.text(r), "signature": self.signature(),
            }),
            (Part::Answer, None) if responses => json!({
                "id": id, "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": self.g.text(r), "annotations": [], "logprobs": []}],
            }),
            (Part::Answer, None) => json!({"type": "text", "text": self.g.text(r)}),
            (Part::Answer, Some(c)) if responses => json!({
                "id": id, "type": "function_call", "status": "completed", "call_id": c.id,
                "name": c.name, "arguments": self.g.answer_piece(r, n),
            }),
            (Part::Answer, Some(c)) => {
                let args = self.g.answer_piece(r, n);
                json!({
                    "type": "tool_use", "id": c.id, "name": c.name,
                    "input": serde_json::from_str::<Value>(&args).unwrap_or(Value::String(args)),
                })
            }
        }
    }

    fn signature(&self) -> String {
        format!("sig_{}", self.g.suffix)
    }

    /// Every item or block of a response of `n` output tokens.
    fn output(&self, n: u32) -> Vec<Value> {
        let (r, a) = self.g.split(0, n);
        let mut out = Vec::new();
        if !r.is_empty() {
            out.push(self.item(Part::Reasoning, r, n));
        }
        if !a.is_empty() || (self.g.call.is_some() && n > 0) {
            out.push(self.item(Part::Answer, a, n));
        }
        out
    }

    /// The Responses response object with `status`, its output and usage after `n` tokens
    /// (`None`: not started).
    fn response(&self, status: &str, n: Option<u32>) -> Value {
        json!({
            "id": self.g.id,
            "object": "response",
            "created_at": self.g.created,
            "status": status,
            "error": null,
            "incomplete_details": (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            "max_output_tokens": self.max_tokens,
            "model": self.g.model,
            "output": n.map_or_else(Vec::new, |n| self.output(n)),
            "previous_response_id": self.previous,
            "store": self.stored,
            "usage": n.map(|n| self.usage(n)),
            "metadata": {},
        })
    }

    /// The Messages message with its content and usage after `n` tokens (`None`: the
    /// start, no content yet, and its `stop_reason`).
    fn message(&self, n: Option<u32>, stop: Option<&str>) -> Value {
        json!({
            "id": self.g.id,
            "type": "message",
            "role": "assistant",
            "model": self.g.model,
            "content": n.map_or_else(Vec::new, |n| self.output(n)),
            "stop_reason": stop,
            "stop_sequence": null,
            "usage": self.usage(n.unwrap_or(1)),
        })
    }

    /// How the response ended, as its API says it: (Responses status, Messages stop reason).
    fn ending(&self, finish: FinishReason) -> (&'static str, &'static str) {
        match (finish, &self.g.call) {
            (_, Some(_)) => ("completed", "tool_use"),
            (FinishReason::Length, None) => ("incomplete", "max_tokens"),
            _ => ("completed", "end_turn"),
        }
    }

    /// The events that open the stream, before any output.
    pub(crate) fn start(&mut self, q: &mut VecDeque<Bytes>) {
        if self.responses() {
            for (ty, status) in [
                ("response.created", "in_progress"),
                ("response.in_progress", "in_progress"),
            ] {
                let r = self.response(status, None);
                let e = self.event(ty, json!({ "response": r }));
                q.push_back(e);
            }
        } else {
            let m = self.message(None, None);
            let e = self.event("message_start", json!({ "message": m }));
            q.push_back(e);
            q.push_back(self.event("ping", json!({})));
        }
    }

    /// Opens an item or block of `part` at token `at`.
    fn open(&mut self, q: &mut VecDeque<Bytes>, part: Part, at: u32) {
        let index = self.opened;
        self.opened += 1;
        self.open = Some((part, index, at..at));
        let id = self.item_id(part);
        let e = match (self.responses(), part, &self.g.call) {
            (true, Part::Reasoning, _) => json!({"output_index": index, "item": {
                "id": id, "type": "reasoning", "summary": [], "content": []}}),
            (true, Part::Answer, None) => json!({"output_index": index, "item": {
                "id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
            (true, Part::Answer, Some(c)) => json!({"output_index": index, "item": {
                "id": id, "type": "function_call", "status": "in_progress", "call_id": c.id,
                "name": c.name, "arguments": ""}}),
            (false, Part::Reasoning, _) => json!({"index": index, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}),
            (false, Part::Answer, None) => {
                json!({"index": index, "content_block": {"type": "text", "text": ""}})
            }
            (false, Part::Answer, Some(c)) => json!({"index": index, "content_block": {
                "type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
        };
        let ty = if self.responses() {
            "response.output_item.added"
        } else {
            "content_block_start"
        };
        let e = self.event(ty, e);
        q.push_back(e);
        if self.responses() && part == Part::Answer && self.g.call.is_none() {
            let e = self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            q.push_back(e);
        }
    }

    /// Closes the item or block open, if any, at the end of a response of `n` tokens.
    fn close(&mut self, q: &mut VecDeque<Bytes>, n: u32) {
        let Some((part, index, r)) = self.open.take() else {
            return;
        };
        let id = self.item_id(part);
        let item = self.item(part, r.clone(), n);
        if !self.responses() {
            if part == Part::Reasoning {
                let sig = self.signature();
                let e = self.event(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "signature_delta", "signature": sig}}),
                );
                q.push_back(e);
            }
            let e = self.event("content_block_stop", json!({ "index": index }));
            q.push_back(e);
            return;
        }
        let mut done = Vec::new();
        match (part, &self.g.call) {
            (Part::Reasoning, _) => done.push((
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": self.g.text(r)}),
            )),
            (Part::Answer, None) => {
                let text = self.g.text(r);
                done.push((
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                ));
                done.push((
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "part": {"type": "output_text", "text": text, "annotations": []}}),
                ));
            }
            (Part::Answer, Some(_)) => done.push((
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": self.g.answer_piece(r, n)}),
            )),
        }
        done.push((
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        for (ty, v) in done {
            let e = self.event(ty, v);
            q.push_back(e);
        }
    }

    /// The delta of tokens `r` of `part` (of a response of `n`), opening its item first
    /// when it is not open.
    fn delta(&mut self, q: &mut VecDeque<Bytes>, part: Part, r: Range<u32>, n: u32) {
        if r.is_empty() {
            return;
        }
        if self.open.as_ref().is_none_or(|(p, _, _)| *p != part) {
            self.close(q, n);
            self.open(q, part, r.start);
        }
        let Some((_, index, covered)) = self.open.as_mut() else {
            return;
        };
        covered.end = r.end;
        let index = *index;
        let id = self.item_id(part);
        let (ty, v) = match (self.responses(), part, &self.g.call) {
            (true, Part::Reasoning, _) => (
                "response.reasoning_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": self.g.text(r)}),
            ),
            (true, Part::Answer, None) => (
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": self.g.text(r), "logprobs": []}),
            ),
            (true, Part::Answer, Some(_)) => (
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": self.g.answer_piece(r, n)}),
            ),
            (false, Part::Reasoning, _) => (
                "content_block_delta",
                json!({"index": index, "delta": {"type": "thinking_delta", "thinking": self.g.text(r)}}),
            ),
            (false, Part::Answer, None) => (
                "content_block_delta",
                json!({"index": index, "delta": {"type": "text_delta", "text": self.g.text(r)}}),
            ),
            (false, Part::Answer, Some(_)) => (
                "content_block_delta",
                json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": self.g.answer_piece(r, n)}}),
            ),
        };
        let e = self.event(ty, v);
        q.push_back(e);
    }

    /// The events of output tokens `from..to` of a response of at most `n` tokens.
    pub(crate) fn tokens(&mut self, q: &mut VecDeque<Bytes>, (from, to): (u32, u32), n: u32) {
        let (r, a) = self.g.split(from, to);
        self.delta(q, Part::Reasoning, r, n);
        self.delta(q, Part::Answer, a, n);
    }

    /// The events that end a stream of `n` output tokens.
    pub(crate) fn end(&mut self, q: &mut VecDeque<Bytes>, n: u32, finish: FinishReason) {
        self.close(q, n);
        self.kept(n);
        let (status, stop) = self.ending(finish);
        if self.responses() {
            let r = self.response(status, Some(n));
            let e = self.event(&format!("response.{status}"), json!({ "response": r }));
            q.push_back(e);
        } else {
            let usage = json!({"output_tokens": n});
            let e = self.event(
                "message_delta",
                json!({"delta": {"stop_reason": stop, "stop_sequence": null}, "usage": usage}),
            );
            q.push_back(e);
            q.push_back(self.event("message_stop", json!({})));
        }
    }

    /// The whole response of `n` output tokens.
    pub(crate) fn whole(&mut self, n: u32, finish: FinishReason) -> Bytes {
        self.kept(n);
        let (status, stop) = self.ending(finish);
        let v = if self.responses() {
            self.response(status, Some(n))
        } else {
            self.message(Some(n), Some(stop))
        };
        Bytes::from(v.to_string())
    }

    /// The response completed with `n` output tokens: kept for later turns when asked.
    fn kept(&mut self, n: u32) {
        if let Some(Keep { store, mut prompt }) = self.keep.take() {
            let (r, a) = self.g.whole(n);
            crate::tokens::push_words(&r, &mut prompt);
            crate::tokens::push_words(&a, &mut prompt);
            store.put(&self.g.id, prompt);
        }
    }
}
