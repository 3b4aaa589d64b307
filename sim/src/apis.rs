//! Requests of the APIs beyond completions and chat, read into the same [`GenRequest`]:
//! OpenAI Responses (`input`, `instructions`, `max_output_tokens`, `previous_response_id`,
//! `store`), Anthropic Messages (`system`, `messages` of content blocks, `max_tokens`,
//! required as Anthropic's API requires it), and the pooling APIs answered whole
//! (embeddings `input`, rerank `query` + `documents`, score `text_1` + `text_2`).
//!
//! Tokens are counted as for chat: one per whitespace-separated word of every text the
//! prompt carries (instructions, input text, tool results and the calls' arguments fed back),
//! nothing for images or audio.

use serde_json::{Map, Value};
use wire::api::Api;

use crate::openai::{
    self, opt_bool, opt_max_tokens, ApiError, GenRequest, DEFAULT_MAX_TOKENS_CHAT,
    DEFAULT_MAX_TOKENS_COMPLETION,
};
use crate::tokens::{push_words, token_id_hash};

/// Parses and validates a request body for `api`.
pub(crate) fn parse(api: Api, body: &[u8]) -> Result<GenRequest, ApiError> {
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
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return Err(ApiError::bad_request("`model` must be a string")),
    };
    let mut g = GenRequest {
        stream,
        include_usage,
        continuous_usage,
        ignore_eos: opt_bool(obj, "ignore_eos")?.unwrap_or(false),
        model,
        store: true,
        ..GenRequest::default()
    };
    let max_tokens = match api {
        Api::Chat => match opt_max_tokens(obj, "max_completion_tokens")? {
            Some(v) => Some(v),
            None => opt_max_tokens(obj, "max_tokens")?,
        },
        Api::Responses => opt_max_tokens(obj, "max_output_tokens")?,
        _ => opt_max_tokens(obj, "max_tokens")?,
    };
    let default = match api {
        Api::Completions => DEFAULT_MAX_TOKENS_COMPLETION,
        Api::Embeddings | Api::Rerank | Api::Score => 1,
        _ => DEFAULT_MAX_TOKENS_CHAT,
    };
    g.max_tokens = max_tokens.unwrap_or(default);
    g.max_tokens_given = max_tokens.is_some();
    match api {
        Api::Completions => openai::parse_prompt(obj, &mut g.prompt)?,
        Api::Chat => {
            openai::parse_messages(obj, &mut g.prompt)?;
            g.tool = first_tool(obj);
            g.after_tool_result = obj
                .get("messages")
                .and_then(Value::as_array)
                .and_then(|m| m.last())
                .and_then(|m| m.get("role"))
                .and_then(Value::as_str)
                == Some("tool");
        }
        Api::Responses => parse_responses(obj, &mut g)?,
        Api::Messages => parse_anthropic(obj, &mut g)?,
        Api::Embeddings | Api::Rerank | Api::Score => parse_pooling(api, obj, &mut g)?,
    }
    Ok(g)
}

/// The name of the first tool a request offers (`tools`: Responses' and Messages'
/// `{"name"}`, chat's `{"function":{"name"}}`).
pub(crate) fn first_tool(obj: &Map<String, Value>) -> Option<String> {
    let t = obj.get("tools")?.as_array()?.first()?;
    t.get("name")
        .or_else(|| t.pointer("/function/name"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Words of a text value: a string, or the `text` of each part of an array of parts.
fn push_text(v: &Value, out: &mut Vec<u64>) {
    match v {
        Value::String(s) => push_words(s, out),
        Value::Array(parts) => {
            for p in parts {
                match p {
                    Value::String(s) => push_words(s, out),
                    Value::Object(o) => {
                        for k in ["text", "thinking"] {
                            if let Some(Value::String(s)) = o.get(k) {
                                push_words(s, out);
                            }
                        }
                        // A Messages tool_result carries its output as `content`.
                        if let Some(c) = o.get("content") {
                            push_text(c, out);
                        }
                        // A tool call fed back: its arguments.
                        if let Some(i) = o.get("input").filter(|i| i.is_object()) {
                            push_words(&i.to_string(), out);
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// A Responses request: `instructions`, `input` (a string, or items: messages, function
/// calls and their outputs), `previous_response_id`, `store`, `tools`.
pub(crate) fn parse_responses(
    obj: &Map<String, Value>,
    g: &mut GenRequest,
) -> Result<(), ApiError> {
    if let Some(i) = obj.get("instructions").filter(|v| !v.is_null()) {
        push_text(i, &mut g.prompt);
    }
    match obj.get("input") {
        None | Some(Value::Null) => return Err(ApiError::bad_request("`input` is required")),
        Some(Value::String(s)) => push_words(s, &mut g.prompt),
        Some(Value::Array(items)) => {
            for item in items {
                let Some(o) = item.as_object() else {
                    return Err(ApiError::bad_request("each `input` item must be an object"));
                };
                match o.get("type").and_then(Value::as_str) {
                    Some("function_call_output") => {
                        if let Some(out) = o.get("output") {
                            push_text(out, &mut g.prompt);
                        }
                    }
                    Some("function_call") => {
                        if let Some(Value::String(a)) = o.get("arguments") {
                            push_words(a, &mut g.prompt);
                        }
                    }
                    Some("reasoning") => {}
                    _ => match o.get("content") {
                        Some(c @ (Value::String(_) | Value::Array(_))) => {
                            push_text(c, &mut g.prompt)
                        }
                        _ => {
                            return Err(ApiError::bad_request(
                                "an `input` message needs a `content` string or array of parts",
                            ))
                        }
                    },
                }
            }
            g.after_tool_result = items
                .last()
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str)
                == Some("function_call_output");
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "`input` must be a string or an array of items",
            ))
        }
    }
    g.previous_response_id = match obj.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`previous_response_id` must be a string",
            ))
        }
    };
    g.store = opt_bool(obj, "store")?.unwrap_or(true);
    g.tool = first_tool(obj);
    Ok(())
}

/// An Anthropic Messages request: `system`, `messages` (each a `role` and `content`, a
/// string or blocks: text, tool_use, tool_result, thinking, image), `max_tokens` (required),
/// `tools`.
pub(crate) fn parse_anthropic(
    obj: &Map<String, Value>,
    g: &mut GenRequest,
) -> Result<(), ApiError> {
    if !g.max_tokens_given {
        return Err(ApiError::bad_request("max_tokens: Field required"));
    }
    if let Some(s) = obj.get("system").filter(|v| !v.is_null()) {
        push_text(s, &mut g.prompt);
    }
    let Some(Value::Array(messages)) = obj.get("messages") else {
        return Err(ApiError::bad_request(
            "messages: Field required (an array of messages)",
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages: at least one message is required",
        ));
    }
    for m in messages {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(ApiError::bad_request("each message needs a string `role`"));
        };
        if !matches!(role, "user" | "assistant") {
            return Err(ApiError::bad_request(format!(
                "messages: role must be user or assistant, got {role:?}"
            )));
        }
        match m.get("content") {
            Some(c @ (Value::String(_) | Value::Array(_))) => push_text(c, &mut g.prompt),
            _ => {
                return Err(ApiError::bad_request(
                    "message `content` must be a string or an array of blocks",
                ))
            }
        }
    }
    g.after_tool_result = messages
        .last()
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .is_some_and(|blocks| {
            blocks
                .iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        });
    g.tool = first_tool(obj);
    Ok(())
}

/// Each entry of an embeddings `input` (a string, strings, token ids, or arrays of ids)
/// into `out`; returns how many entries.
fn push_inputs(v: &Value, out: &mut Vec<u64>) -> Result<u32, ApiError> {
    let bad =
        || ApiError::bad_request("`input` must be a string, strings, token ids or arrays of ids");
    Ok(match v {
        Value::String(s) => {
            push_words(s, out);
            1
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            for id in items {
                out.push(token_id_hash(id.as_u64().ok_or_else(bad)?));
            }
            1
        }
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::String(s) => push_words(s, out),
                    Value::Array(ids) => {
                        for id in ids {
                            out.push(token_id_hash(id.as_u64().ok_or_else(bad)?));
                        }
                    }
                    _ => return Err(bad()),
                }
            }
            u32::try_from(items.len()).unwrap_or(u32::MAX)
        }
        _ => return Err(bad()),
    })
}

/// A pooling request, answered whole: embeddings (`input`), rerank (`query` and
/// `documents`), score (`text_1` and `text_2`, each a string or strings).
pub(crate) fn parse_pooling(
    api: Api,
    obj: &Map<String, Value>,
    g: &mut GenRequest,
) -> Result<(), ApiError> {
    let need = |k: &str| {
        obj.get(k)
            .filter(|v| !v.is_null())
            .ok_or_else(|| ApiError::bad_request(format!("`{k}` is required")))
    };
    g.entries = match api {
        Api::Rerank => {
            push_text(need("query")?, &mut g.prompt);
            let docs = need("documents")?
                .as_array()
                .ok_or_else(|| ApiError::bad_request("`documents` must be an array"))?;
            for d in docs {
                push_text(d, &mut g.prompt);
                if let Some(t) = d.get("text") {
                    push_text(t, &mut g.prompt);
                }
            }
            u32::try_from(docs.len()).unwrap_or(u32::MAX)
        }
        Api::Score => {
            let a = push_inputs(need("text_1")?, &mut g.prompt)?;
            let b = push_inputs(need("text_2")?, &mut g.prompt)?;
            a.max(b)
        }
        _ => push_inputs(need("input")?, &mut g.prompt)?,
    };
    // Answered whole, at once: the prompt is read (prefilled) and one step taken.
    g.stream = false;
    g.max_tokens = 1;
    g.ignore_eos = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_and_messages_prompts_count_every_text_they_carry() {
        let r = parse(
            Api::Responses,
            br#"{"model":"m","instructions":"be brief","input":[
                {"role":"user","content":"a b c"},
                {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"q\":1}"},
                {"type":"function_call_output","call_id":"c1","output":"x y"}],
                "max_output_tokens":9,"previous_response_id":"resp_1","store":false,
                "tools":[{"type":"function","name":"lookup"}]}"#,
        )
        .unwrap();
        assert_eq!(r.prompt.len(), 2 + 3 + 1 + 2);
        assert_eq!((r.max_tokens, r.max_tokens_given), (9, true));
        assert_eq!(r.previous_response_id.as_deref(), Some("resp_1"));
        assert!(!r.store && r.after_tool_result);
        assert_eq!(r.tool.as_deref(), Some("lookup"));
        let r = parse(Api::Responses, br#"{"input":"one two"}"#).unwrap();
        assert_eq!(
            (r.prompt.len(), r.store, r.max_tokens_given),
            (2, true, false)
        );

        let m = parse(
            Api::Messages,
            br#"{"model":"claude","max_tokens":5,"system":[{"type":"text","text":"sys tem"}],
                "messages":[{"role":"user","content":"a b"},
                {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"q":"z"}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r s t"},
                    {"type":"image","source":{"type":"base64","data":"AAAA"}}]}],
                "tools":[{"name":"get_weather","input_schema":{}}]}"#,
        )
        .unwrap();
        assert_eq!(m.prompt.len(), 2 + 2 + 1 + 3);
        assert!(m.after_tool_result);
        assert_eq!(m.tool.as_deref(), Some("get_weather"));
        for bad in [
            &br#"{"messages":[{"role":"user","content":"a"}]}"#[..],
            br#"{"max_tokens":3,"messages":[]}"#,
            br#"{"max_tokens":3,"messages":[{"role":"system","content":"a"}]}"#,
        ] {
            assert!(parse(Api::Messages, bad).is_err());
        }
        assert!(parse(Api::Responses, br#"{"model":"m"}"#).is_err());
        assert!(parse(Api::Responses, br#"{"input":"a","previous_response_id":5}"#).is_err());
    }

    #[test]
    fn pooling_requests_count_their_entries() {
        let e = parse(Api::Embeddings, br#"{"input":["a b","c"]}"#).unwrap();
        assert_eq!((e.prompt.len(), e.entries, e.stream), (3, 2, false));
        let e = parse(Api::Embeddings, br#"{"input":[1,2,3]}"#).unwrap();
        assert_eq!((e.prompt.len(), e.entries), (3, 1));
        let r = parse(Api::Rerank, br#"{"query":"q w","documents":["a","b c"]}"#).unwrap();
        assert_eq!((r.prompt.len(), r.entries), (5, 2));
        let s = parse(Api::Score, br#"{"text_1":"a","text_2":["b","c d"]}"#).unwrap();
        assert_eq!((s.prompt.len(), s.entries), (4, 2));
        assert!(parse(Api::Embeddings, br#"{"input":{}}"#).is_err());
        assert!(parse(Api::Rerank, br#"{"query":"q"}"#).is_err());
    }
}
