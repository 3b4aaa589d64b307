//! Whole (non-streamed) responses of every API read once: their id, a failure a 2xx reports,
//! usage, and the generated, answer and reasoning text.

use serde::Deserialize;

use super::{messages, responses, Usage};
use crate::api::Api;

/// The `message` of an OpenAI error object, or its JSON text.
pub fn error_message(e: &serde_json::Value) -> String {
    match e.get("message").and_then(|m| m.as_str()) {
        Some(m) => m.to_string(),
        None => match e.as_str() {
            Some(s) => s.to_string(),
            None => e.to_string(),
        },
    }
}

/// The generated text of a whole (non-streamed) OpenAI response: `choices[].text` or
/// `choices[].message` (content, reasoning, tool-call arguments). None when the body is not
/// JSON.
pub fn response_text(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(choices_text(&v))
}

fn choices_text(v: &serde_json::Value) -> String {
    let mut out = String::new();
    for c in v
        .get("choices")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
    {
        push_choice_text(c, "message", &mut out);
    }
    out
}

pub(super) fn push_choice_text(choice: &serde_json::Value, inner: &str, out: &mut String) {
    let mut push = |v: Option<&serde_json::Value>| {
        if let Some(s) = v.and_then(|v| v.as_str()) {
            out.push_str(s);
        }
    };
    push(choice.get("text"));
    if let Some(d) = choice.get(inner) {
        push(d.get("reasoning_content"));
        push(d.get("reasoning"));
        push(d.get("content"));
        for t in d
            .get("tool_calls")
            .and_then(|t| t.as_array())
            .into_iter()
            .flatten()
        {
            push(t.pointer("/function/name"));
            push(t.pointer("/function/arguments"));
        }
        if let Some(f) = d.get("function_call") {
            push(f.get("name"));
            push(f.get("arguments"));
        }
    }
}

/// The reasoning text of a whole (non-streamed) OpenAI response:
/// `choices[].message.reasoning_content` and `.reasoning`, in order (empty when it has none).
/// None when the body is not JSON.
pub fn response_reasoning_text(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(choices_reasoning(&v))
}

fn choices_reasoning(v: &serde_json::Value) -> String {
    let mut out = String::new();
    for c in v
        .get("choices")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
    {
        for k in ["reasoning_content", "reasoning"] {
            if let Some(s) = c.pointer(&format!("/message/{k}")).and_then(|t| t.as_str()) {
                out.push_str(s);
            }
        }
    }
    out
}

/// What a whole (non-streamed) response of any generation API says, read once.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Whole {
    /// The response's `id` (Responses and Messages: what a later turn's
    /// `previous_response_id` or tool results name).
    pub id: Option<String>,
    /// A failure the body reports with a 2xx (a Responses `status: "failed"`, a Messages
    /// `"type": "error"` body), with its message.
    pub failed: Option<String>,
    /// Its usage.
    pub usage: Option<Usage>,
    /// Every generated text (answer, reasoning, tool-call names and arguments), what a
    /// tokenizer counts when the server reports no usage.
    pub output: String,
    /// The answer text a client shows and resends.
    pub answer: String,
    /// The reasoning text.
    pub reasoning: String,
    /// The tool calls it made, in order: chat's first choice's `message.tool_calls`,
    /// Responses' `function_call` items, Messages' `tool_use` blocks.
    pub calls: Vec<WholeCall>,
}

/// One tool call of a whole response.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WholeCall {
    /// Its id (chat's `id`, Responses' `call_id`, Messages' `id`), what the tool result
    /// that answers it names.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text (Messages' `input` object serialized).
    pub arguments: String,
}

impl WholeCall {
    pub(super) fn of(
        id: Option<&str>,
        name: Option<&str>,
        arguments: Option<&serde_json::Value>,
    ) -> Self {
        WholeCall {
            id: id.unwrap_or("").to_string(),
            name: name.unwrap_or("").to_string(),
            arguments: match arguments {
                Some(serde_json::Value::String(a)) => a.clone(),
                Some(serde_json::Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            },
        }
    }
}

/// `body` read as a whole response of `api`; `None` when it is not JSON (not a JSON object,
/// for Responses and Messages).
pub fn read_whole(api: Api, body: &[u8]) -> Option<Whole> {
    match api {
        Api::Responses => responses::whole(body),
        Api::Messages => messages::whole(body),
        _ => {
            let v: serde_json::Value = serde_json::from_slice(body).ok()?;
            let calls = v
                .pointer("/choices/0/message/tool_calls")
                .and_then(|c| c.as_array())
                .into_iter()
                .flatten()
                .map(|c| {
                    let s = |p: &str| c.pointer(p).and_then(|x| x.as_str());
                    WholeCall::of(
                        s("/id"),
                        s("/function/name"),
                        c.pointer("/function/arguments"),
                    )
                })
                .collect();
            let answer = v
                .pointer("/choices/0/message/content")
                .or_else(|| v.pointer("/choices/0/text"))
                .and_then(|s| s.as_str())
                .unwrap_or("")
                .to_string();
            Some(Whole {
                id: v.get("id").and_then(|s| s.as_str()).map(str::to_string),
                failed: None,
                usage: v.get("usage").and_then(|u| Usage::deserialize(u).ok()),
                output: choices_text(&v),
                answer,
                reasoning: choices_reasoning(&v),
                calls,
            })
        }
    }
}

/// Reads `usage` from a whole (non-streamed) OpenAI response body.
pub fn response_usage(body: &[u8]) -> Option<Usage> {
    #[derive(Deserialize)]
    struct Resp {
        usage: Option<Usage>,
    }
    serde_json::from_slice::<Resp>(body)
        .ok()
        .and_then(|r| r.usage)
}
