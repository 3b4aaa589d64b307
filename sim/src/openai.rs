//! The OpenAI wire format as vLLM's server speaks it: parsing and validating completion and
//! chat requests, and writing responses, SSE chunks and errors byte for byte like vLLM.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Map, Value};

use crate::metrics::FinishReason;
use crate::tokens::{push_output_text, push_words, token_id_hash};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/completions`.
    Completion,
    /// `/v1/chat/completions`.
    Chat,
}

/// A validated generation request.
#[derive(Debug)]
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
}

/// An error answered in OpenAI's JSON error shape.
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
}

/// OpenAI's default `max_tokens` for `/v1/completions`.
pub(crate) const DEFAULT_MAX_TOKENS_COMPLETION: u32 = 16;
/// Default `max_tokens` for chat when the request gives none.
pub(crate) const DEFAULT_MAX_TOKENS_CHAT: u32 = 256;

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be a boolean"))),
    }
}

fn opt_max_tokens(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, ApiError> {
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

/// Parses and validates a request body for `kind`.
pub(crate) fn parse(kind: Kind, body: &[u8]) -> Result<GenRequest, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?;
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad_request(
            "The request body must be a JSON object",
        ));
    };
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let (include_usage, continuous_usage) = match obj.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(so)) => (
            opt_bool(so, "include_usage")?.unwrap_or(false),
            opt_bool(so, "continuous_usage_stats")?.unwrap_or(false),
        ),
        Some(_) => return Err(ApiError::bad_request("`stream_options` must be an object")),
    };
    let ignore_eos = opt_bool(obj, "ignore_eos")?.unwrap_or(false);
    let max_tokens = match kind {
        Kind::Chat => match opt_max_tokens(obj, "max_completion_tokens")? {
            Some(v) => Some(v),
            None => opt_max_tokens(obj, "max_tokens")?,
        },
        Kind::Completion => opt_max_tokens(obj, "max_tokens")?,
    };
    let default = match kind {
        Kind::Chat => DEFAULT_MAX_TOKENS_CHAT,
        Kind::Completion => DEFAULT_MAX_TOKENS_COMPLETION,
    };
    let mut prompt = Vec::new();
    match kind {
        Kind::Completion => parse_prompt(obj, &mut prompt)?,
        Kind::Chat => parse_messages(obj, &mut prompt)?,
    }
    Ok(GenRequest {
        stream,
        include_usage,
        continuous_usage,
        max_tokens: max_tokens.unwrap_or(default),
        max_tokens_given: max_tokens.is_some(),
        ignore_eos,
        prompt,
    })
}

fn token_id(v: &Value) -> Option<u64> {
    v.as_u64()
}

fn parse_prompt(obj: &Map<String, Value>, out: &mut Vec<u64>) -> Result<(), ApiError> {
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

fn parse_messages(obj: &Map<String, Value>, out: &mut Vec<u64>) -> Result<(), ApiError> {
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

/// Writes the JSON of one response (SSE chunks or the whole body) for one request.
#[derive(Debug)]
pub(crate) struct Formatter {
    kind: Kind,
    /// `{"id":..,"object":..,"created":..,"model":..,` for stream chunks.
    chunk_prefix: String,
    id: String,
    created: u64,
    model_json: String,
    prompt_tokens: u32,
    text_start: u64,
    continuous_usage: bool,
    /// Output tokens `0..reasoning` are reasoning (`reasoning_content`), the rest answer.
    reasoning: u32,
    /// `usage` says how many were reasoning.
    reasoning_details: bool,
}

impl Formatter {
    pub(crate) fn new(
        kind: Kind,
        id_suffix: &str,
        created: u64,
        model: &str,
        prompt_tokens: u32,
        text_start: u64,
        continuous_usage: bool,
    ) -> Self {
        let id = match kind {
            Kind::Chat => format!("chatcmpl-{id_suffix}"),
            Kind::Completion => format!("cmpl-{id_suffix}"),
        };
        let object = match kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let model_json = Value::from(model).to_string();
        let chunk_prefix = format!(
            "{{\"id\":\"{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},"
        );
        Formatter {
            kind,
            chunk_prefix,
            id,
            created,
            model_json,
            prompt_tokens,
            text_start,
            continuous_usage,
            reasoning: 0,
            reasoning_details: false,
        }
    }

    /// The first `tokens` output tokens are reasoning ([`crate::Reasoning`]), counted apart
    /// in `usage` when `details`.
    pub(crate) fn with_reasoning(mut self, tokens: u32, details: bool) -> Self {
        self.reasoning = tokens;
        self.reasoning_details = details;
        self
    }

    fn usage_json(&self, completion: u32) -> String {
        let details = if self.reasoning > 0 && self.reasoning_details {
            format!(
                ",\"completion_tokens_details\":{{\"reasoning_tokens\":{}}}",
                self.reasoning.min(completion)
            )
        } else {
            String::new()
        };
        format!(
            "{{\"prompt_tokens\":{},\"total_tokens\":{},\"completion_tokens\":{}{details}}}",
            self.prompt_tokens,
            u64::from(self.prompt_tokens) + u64::from(completion),
            completion
        )
    }

    /// The JSON strings of output tokens `from..to`: (reasoning, answer), each None when
    /// the range has none of it.
    fn texts(&self, from: u32, to: u32) -> (Option<String>, Option<String>) {
        let split = self.reasoning.clamp(from, to);
        let text = |a: u32, b: u32| {
            (a < b).then(|| {
                let mut t = String::new();
                push_output_text(self.text_start, a, b, &mut t);
                Value::from(t).to_string()
            })
        };
        (text(from, split), text(split, to))
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
        let choice = match self.kind {
            Kind::Chat => format!(
                "{{\"index\":0,\"delta\":{{{delta}}},\"logprobs\":null,\"finish_reason\":{fin}}}"
            ),
            Kind::Completion => {
                format!("{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":{fin}}}")
            }
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

    /// The whole non-streamed response.
    pub(crate) fn full_response(&self, completion: u32, finish: FinishReason) -> Bytes {
        let (reasoning, answer) = self.texts(0, completion);
        let text = answer.unwrap_or_else(|| "\"\"".into());
        let reasoning = reasoning.map_or(String::new(), |r| format!("\"reasoning_content\":{r},"));
        let (object, choice) = match self.kind {
            Kind::Chat => (
                "chat.completion",
                format!(
                    "{{\"index\":0,\"message\":{{\"role\":\"assistant\",{reasoning}\"content\":{text},\"tool_calls\":[]}},\"logprobs\":null,\"finish_reason\":\"{}\",\"stop_reason\":null}}",
                    finish.as_str()
                ),
            ),
            Kind::Completion => (
                "text_completion",
                format!(
                    "{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":\"{}\",\"stop_reason\":null,\"prompt_logprobs\":null}}",
                    finish.as_str()
                ),
            ),
        };
        Bytes::from(format!(
            "{{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},\"choices\":[{choice}],\"usage\":{}}}",
            self.id,
            self.created,
            self.model_json,
            self.usage_json(completion)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prompt_shapes() {
        let r = parse(Kind::Completion, br#"{"prompt":"a b  c","max_tokens":5}"#).unwrap();
        assert_eq!(r.prompt.len(), 3);
        assert_eq!(r.max_tokens, 5);
        let r = parse(Kind::Completion, br#"{"prompt":["a b","c"]}"#).unwrap();
        assert_eq!(r.prompt.len(), 3);
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS_COMPLETION);
        let r = parse(Kind::Completion, br#"{"prompt":[1,2,3,4]}"#).unwrap();
        assert_eq!(r.prompt.len(), 4);
        let r = parse(
            Kind::Chat,
            br#"{"messages":[{"role":"system","content":"x y"},{"role":"user","content":[{"type":"text","text":"a b c"},{"type":"image_url","image_url":{}}]}],"max_completion_tokens":3,"max_tokens":9}"#,
        )
        .unwrap();
        assert_eq!(r.prompt.len(), 5);
        assert_eq!(r.max_tokens, 3);
    }

    #[test]
    fn rejects_malformed() {
        for (kind, body) in [
            (Kind::Completion, &b"not json"[..]),
            (Kind::Completion, b"[]"),
            (Kind::Completion, b"{}"),
            (Kind::Completion, br#"{"prompt":5}"#),
            (Kind::Completion, br#"{"prompt":[-1]}"#),
            (Kind::Completion, br#"{"prompt":"a","max_tokens":0}"#),
            (Kind::Completion, br#"{"prompt":"a","max_tokens":-3}"#),
            (Kind::Completion, br#"{"prompt":"a","max_tokens":1.5}"#),
            (Kind::Completion, br#"{"prompt":"a","stream":"yes"}"#),
            (Kind::Chat, br#"{"prompt":"a"}"#),
            (Kind::Chat, br#"{"messages":"hi"}"#),
            (Kind::Chat, br#"{"messages":[{"content":"hi"}]}"#),
            (Kind::Chat, br#"{"messages":[{"role":"user","content":5}]}"#),
        ] {
            let e = parse(kind, body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body:?}");
        }
    }

    #[test]
    fn chunks_are_json() {
        let f = Formatter::new(Kind::Chat, "x", 1, "m\"q", 3, 0, true);
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
