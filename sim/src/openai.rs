//! The OpenAI wire format as vLLM's server speaks it: parsing and validating completion and
//! chat requests (the other APIs' are read into the same [`GenRequest`] by `apis`), and
//! writing completion and chat responses, SSE chunks and errors byte for
//! byte like vLLM.

use std::collections::VecDeque;

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Map, Value};
use wire::api::Api;

use crate::engine_metrics::FinishReason;
use crate::output::Gen;
use crate::tokens::{push_words, token_id_hash};

/// A validated request of any API.
#[derive(Debug, Default)]
pub(crate) struct GenRequest {
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) continuous_usage: bool,
    pub(crate) max_tokens: u32,
    /// False when `max_tokens` was absent and the default applies.
    pub(crate) max_tokens_given: bool,
    pub(crate) ignore_eos: bool,
    /// One hash per prompt token.
    pub(crate) prompt: Vec<u64>,
    /// The `model` named, if any.
    pub(crate) model: Option<String>,
    /// Responses: the response this one continues (`previous_response_id`).
    pub(crate) previous_response_id: Option<String>,
    /// Responses: the response is kept for a later `previous_response_id` (`store`,
    /// default true).
    pub(crate) store: bool,
    /// The first tool the request offers, if any.
    pub(crate) tool: Option<String>,
    /// The request ends with a tool's result (chat `tool` message, Responses
    /// `function_call_output`, Messages `tool_result`).
    pub(crate) after_tool_result: bool,
    /// Embeddings: the inputs; rerank: the documents; score: the pairs (entries answered).
    pub(crate) entries: u32,
}

/// An error answered in OpenAI's JSON error shape (Anthropic's for Messages:
/// [`ApiError::body_for`]).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) code: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code: None,
        }
    }

    /// 404 for a model the server does not serve, as vLLM answers it.
    pub(crate) fn unknown_model(model: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "NotFoundError",
            code: None,
        }
    }

    /// 404 for a `previous_response_id` the server does not hold, as OpenAI and vLLM answer
    /// it.
    pub(crate) fn unknown_response(id: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("Previous response with id '{id}' not found."),
            kind: "invalid_request_error",
            code: Some("previous_response_not_found"),
        }
    }

    pub(crate) fn body(&self) -> Bytes {
        let v = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.code,
            }
        });
        Bytes::from(v.to_string())
    }

    /// The body in `api`'s shape: Anthropic's `{"type":"error","error":{…}}` for Messages,
    /// OpenAI's otherwise.
    pub(crate) fn body_for(&self, api: Api) -> Bytes {
        if api != Api::Messages {
            return self.body();
        }
        let kind = match self.status.as_u16() {
            400 | 422 => "invalid_request_error",
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            529 | 503 => "overloaded_error",
            _ => "api_error",
        };
        let v = serde_json::json!({
            "type": "error",
            "error": {"type": kind, "message": self.message},
        });
        Bytes::from(v.to_string())
    }
}

/// OpenAI's default `max_tokens` for `/v1/completions`.
pub(crate) const DEFAULT_MAX_TOKENS_COMPLETION: u32 = 16;
/// Default `max_tokens` for chat when the request gives none.
pub(crate) const DEFAULT_MAX_TOKENS_CHAT: u32 = 256;

pub(crate) fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be a boolean"))),
    }
}

pub(crate) fn opt_max_tokens(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v >= 1 => Ok(Some(u32::try_from(v).unwrap_or(u32::MAX))),
            _ => Err(ApiError::bad_request(format!(
                "`{key}` must be an integer >= 1, got {n}"
            ))),
        },
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be an integer"))),
    }
}

fn token_id(v: &Value) -> Option<u64> {
    v.as_u64()
}

pub(crate) fn parse_prompt(obj: &Map<String, Value>, out: &mut Vec<u64>) -> Result<(), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "`prompt` must be a string, an array of strings, or an array of token ids",
        )
    };
    match obj.get("prompt") {
        None | Some(Value::Null) => Err(ApiError::bad_request("`prompt` is required")),
        Some(Value::String(s)) => {
            push_words(s, out);
            Ok(())
        }
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(s) => push_words(s, out),
                    Value::Number(_) => out.push(token_id_hash(token_id(item).ok_or_else(bad)?)),
                    Value::Array(ids) => {
                        for id in ids {
                            out.push(token_id_hash(token_id(id).ok_or_else(bad)?));
                        }
                    }
                    _ => return Err(bad()),
                }
            }
            Ok(())
        }
        Some(_) => Err(bad()),
    }
}

pub(crate) fn parse_messages(obj: &Map<String, Value>, out: &mut Vec<u64>) -> Result<(), ApiError> {
    let Some(Value::Array(messages)) = obj.get("messages") else {
        return Err(ApiError::bad_request(
            "`messages` is required and must be an array",
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` must not be empty"));
    }
    for m in messages {
        let Some(m) = m.as_object() else {
            return Err(ApiError::bad_request("each message must be an object"));
        };
        match m.get("role") {
            Some(Value::String(_)) => {}
            _ => return Err(ApiError::bad_request("each message needs a string `role`")),
        }
        match m.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => push_words(s, out),
            Some(Value::Array(parts)) => {
                for p in parts {
                    let Some(p) = p.as_object() else {
                        return Err(ApiError::bad_request("content parts must be objects"));
                    };
                    if p.get("type").and_then(Value::as_str) == Some("text") {
                        match p.get("text") {
                            Some(Value::String(s)) => push_words(s, out),
                            _ => {
                                return Err(ApiError::bad_request(
                                    "a text content part needs a string `text`",
                                ))
                            }
                        }
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::bad_request(
                    "message `content` must be a string or an array of parts",
                ))
            }
        }
    }
    Ok(())
}

/// Writes the JSON of one completions or chat response (SSE chunks or the whole body).
#[derive(Debug)]
pub(crate) struct Formatter {
    g: Gen,
    /// `{"id":..,"object":..,"created":..,"model":..,` for stream chunks.
    chunk_prefix: String,
    continuous_usage: bool,
    /// A streamed response ends with a usage-only chunk.
    include_usage: bool,
    /// `usage` says how many were reasoning.
    reasoning_details: bool,
}

impl Formatter {
    /// A writer of `g` (completions or chat) with the stream options asked for.
    pub(crate) fn new(g: Gen, continuous_usage: bool, include_usage: bool) -> Self {
        let object = match g.api {
            Api::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        let chunk_prefix = format!(
            "{{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},",
            g.id, g.created, g.model_json
        );
        Formatter {
            g,
            chunk_prefix,
            continuous_usage,
            include_usage,
            reasoning_details: false,
        }
    }

    /// The reasoning tokens are counted apart in `usage` ([`crate::Reasoning::details`]).
    pub(crate) fn with_reasoning_details(mut self, details: bool) -> Self {
        self.reasoning_details = details;
        self
    }

    fn chat(&self) -> bool {
        self.g.api == Api::Chat
    }

    fn usage_json(&self, completion: u32) -> String {
        let details = if self.g.reasoning > 0 && self.reasoning_details {
            format!(
                ",\"completion_tokens_details\":{{\"reasoning_tokens\":{}}}",
                self.g.reasoning.min(completion)
            )
        } else {
            String::new()
        };
        format!(
            "{{\"prompt_tokens\":{},\"total_tokens\":{},\"completion_tokens\":{}{details}}}",
            self.g.prompt_tokens,
            u64::from(self.g.prompt_tokens) + u64::from(completion),
            completion
        )
    }

    /// The JSON strings of output tokens `from..to`: (reasoning, answer), each None when
    /// the range has none of it.
    fn texts(&self, from: u32, to: u32) -> (Option<String>, Option<String>) {
        let (r, a) = self.g.split(from, to);
        let text = |r: std::ops::Range<u32>| {
            (!r.is_empty()).then(|| Value::from(self.g.text(r)).to_string())
        };
        (text(r), text(a))
    }

    fn sse(&self, choices: &str, usage: Option<u32>) -> Bytes {
        let mut s = String::with_capacity(self.chunk_prefix.len() + choices.len() + 128);
        s.push_str("data: ");
        s.push_str(&self.chunk_prefix);
        s.push_str("\"choices\":[");
        s.push_str(choices);
        s.push(']');
        if let Some(c) = usage {
            s.push_str(",\"usage\":");
            s.push_str(&self.usage_json(c));
        }
        s.push_str("}\n\n");
        Bytes::from(s)
    }

    /// The role-only first chunk of a chat stream.
    pub(crate) fn role_chunk(&self) -> Bytes {
        self.sse(
            "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}",
            self.continuous_usage.then_some(0),
        )
    }

    /// A content chunk carrying output tokens `from..to`.
    pub(crate) fn content_chunk(&self, from: u32, to: u32, finish: Option<FinishReason>) -> Bytes {
        let (reasoning, answer) = self.texts(from, to);
        let fin = match finish {
            Some(f) => format!("\"{}\",\"stop_reason\":null", f.as_str()),
            None => "null".to_owned(),
        };
        let delta = match (&reasoning, &answer) {
            (Some(r), Some(a)) => format!("\"reasoning_content\":{r},\"content\":{a}"),
            (Some(r), None) => format!("\"reasoning_content\":{r}"),
            (None, a) => format!("\"content\":{}", a.as_deref().unwrap_or("\"\"")),
        };
        let text = answer.unwrap_or_else(|| "\"\"".into());
        let choice = if self.chat() {
            format!(
                "{{\"index\":0,\"delta\":{{{delta}}},\"logprobs\":null,\"finish_reason\":{fin}}}"
            )
        } else {
            format!("{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":{fin}}}")
        };
        self.sse(&choice, self.continuous_usage.then_some(to))
    }

    /// The usage-only final chunk (`"choices": []`).
    pub(crate) fn usage_chunk(&self, completion: u32) -> Bytes {
        self.sse("", Some(completion))
    }

    /// The stream terminator.
    pub(crate) fn done() -> Bytes {
        Bytes::from_static(b"data: [DONE]\n\n")
    }

    /// The events of output tokens `from..to` (the first ones of the stream when `first`).
    pub(crate) fn tokens(
        &self,
        q: &mut VecDeque<Bytes>,
        (from, to): (u32, u32),
        first: bool,
        finish: Option<FinishReason>,
    ) {
        // The role-only chunk goes out with the first token, as vLLM sends it (after
        // queueing and prefill), never before.
        if self.chat() && first {
            q.push_back(self.role_chunk());
        }
        q.push_back(self.content_chunk(from, to, finish));
    }

    /// The end of a stream of `completion` tokens: the usage chunk when asked for, `[DONE]`.
    pub(crate) fn end(&self, q: &mut VecDeque<Bytes>, completion: u32) {
        if self.include_usage {
            q.push_back(self.usage_chunk(completion));
        }
        q.push_back(Formatter::done());
    }

    /// The whole non-streamed response.
    pub(crate) fn full_response(&self, completion: u32, finish: FinishReason) -> Bytes {
        let (reasoning, answer) = self.texts(0, completion);
        let text = answer.unwrap_or_else(|| "\"\"".into());
        let reasoning = reasoning.map_or(String::new(), |r| format!("\"reasoning_content\":{r},"));
        let (object, choice) = if self.chat() {
            (
                "chat.completion",
                format!(
                    "{{\"index\":0,\"message\":{{\"role\":\"assistant\",{reasoning}\"content\":{text},\"tool_calls\":[]}},\"logprobs\":null,\"finish_reason\":\"{}\",\"stop_reason\":null}}",
                    finish.as_str()
                ),
            )
        } else {
            (
                "text_completion",
                format!(
                    "{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":\"{}\",\"stop_reason\":null,\"prompt_logprobs\":null}}",
                    finish.as_str()
                ),
            )
        };
        Bytes::from(format!(
            "{{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},\"choices\":[{choice}],\"usage\":{}}}",
            self.g.id,
            self.g.created,
            self.g.model_json,
            self.usage_json(completion)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::parse;

    #[test]
    fn parses_prompt_shapes() {
        let r = parse(Api::Completions, br#"{"prompt":"a b  c","max_tokens":5}"#).unwrap();
        assert_eq!(r.prompt.len(), 3);
        assert_eq!(r.max_tokens, 5);
        let r = parse(Api::Completions, br#"{"prompt":["a b","c"]}"#).unwrap();
        assert_eq!(r.prompt.len(), 3);
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS_COMPLETION);
        let r = parse(Api::Completions, br#"{"prompt":[1,2,3,4]}"#).unwrap();
        assert_eq!(r.prompt.len(), 4);
        let r = parse(
            Api::Chat,
            br#"{"messages":[{"role":"system","content":"x y"},{"role":"user","content":[{"type":"text","text":"a b c"},{"type":"image_url","image_url":{}}]}],"max_completion_tokens":3,"max_tokens":9}"#,
        )
        .unwrap();
        assert_eq!(r.prompt.len(), 5);
        assert_eq!(r.max_tokens, 3);
    }

    #[test]
    fn rejects_malformed() {
        for (kind, body) in [
            (Api::Completions, &b"not json"[..]),
            (Api::Completions, b"[]"),
            (Api::Completions, b"{}"),
            (Api::Completions, br#"{"prompt":5}"#),
            (Api::Completions, br#"{"prompt":[-1]}"#),
            (Api::Completions, br#"{"prompt":"a","max_tokens":0}"#),
            (Api::Completions, br#"{"prompt":"a","max_tokens":-3}"#),
            (Api::Completions, br#"{"prompt":"a","max_tokens":1.5}"#),
            (Api::Completions, br#"{"prompt":"a","stream":"yes"}"#),
            (Api::Chat, br#"{"prompt":"a"}"#),
            (Api::Chat, br#"{"messages":"hi"}"#),
            (Api::Chat, br#"{"messages":[{"content":"hi"}]}"#),
            (Api::Chat, br#"{"messages":[{"role":"user","content":5}]}"#),
        ] {
            let e = parse(kind, body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body:?}");
        }
    }

    #[test]
    fn chunks_are_json() {
        let f = Formatter::new(Gen::new(Api::Chat, "x", 1, "m\"q", 3, 0), true, true);
        for b in [
            f.role_chunk(),
            f.content_chunk(0, 2, None),
            f.content_chunk(2, 3, Some(FinishReason::Length)),
            f.usage_chunk(3),
        ] {
            let s = std::str::from_utf8(&b).unwrap();
            let json = s
                .strip_prefix("data: ")
                .unwrap()
                .strip_suffix("\n\n")
                .unwrap();
            let v: Value = serde_json::from_str(json).unwrap();
            assert_eq!(v["model"], "m\"q");
        }
        let v: Value = serde_json::from_slice(&f.full_response(3, FinishReason::Stop)).unwrap();
        assert_eq!(v["usage"]["total_tokens"], 6);
    }
}
