//! Every API's request read in the one shape the prompt code reads: chat's.
//!
//! Prefix hashes ([`crate::prefix`]), the message chain ([`crate::linking::sessions`]), the
//! tools offered and the tool results a request carries ([`crate::linking::agents`]) are
//! read from a chat request's `messages` (a completion's `prompt`). A request of another API
//! is put in that shape once, on the prompt runner ([`chat_view`]), so that one walk serves
//! every API and a conversation hashes the same way whichever API carries it:
//! - Responses: `instructions` is a `system` message; `input` a string is a `user` message;
//!   of `input`'s items, a message (`role`, `content` a string or parts) is that message
//!   with its `input_text` / `output_text` / `refusal` parts as text parts; a
//!   `function_call` is a tool call of the `assistant` message before it (of an empty one
//!   when none is); a `function_call_output` is a `tool` message answering its `call_id`;
//!   reasoning items and anything else carry no prompt text here;
//! - Anthropic Messages: `system` (a string or text blocks) is a `system` message; of each
//!   message's content blocks, `text` is a text part, `tool_use` a tool call of that
//!   (assistant) message, `tool_result` a `tool` message answering its `tool_use_id` (before
//!   the rest of its message), `thinking` not prompt text (as a chat answer's reasoning is
//!   not resent as content); images and documents stay parts (not text);
//! - embeddings' `input`, rerank's `query`, score's `text_1`: the `prompt`, hashed as a
//!   completion's.
//!
//! Members the conversion does not read stay as they were (`tools`, `previous_response_id`).

use serde_json::{json, Map, Value};
use wire::api::Api;

/// The unkeyed prefix hashes capture makes of the request `body` sent to `endpoint`
/// ([`crate::prefix`] over [`chat_view`]), as `rekey` derives a `full` trace's again: None
/// when the endpoint is no recorded API's or the body holds no prompt this reads.
pub fn prefix_hashes_of_body(
    endpoint: &str,
    body: &str,
    block_size: u32,
    tokenizer: &tokenize::Tokenizer,
) -> Option<Vec<u64>> {
    let api = Api::of_endpoint(endpoint)?;
    let Ok(Value::Object(obj)) = serde_json::from_str(body) else {
        return None;
    };
    crate::prefix::prefix_hashes(&chat_view(api, obj), block_size, tokenizer)
}

/// `obj`, a request body of `api`, in chat's shape (see the module).
pub(crate) fn chat_view(api: Api, mut obj: Map<String, Value>) -> Map<String, Value> {
    let mut messages = Vec::new();
    match api {
        Api::Chat | Api::Completions => return obj,
        Api::Embeddings | Api::Rerank | Api::Score => {
            let from = match api {
                Api::Embeddings => "input",
                Api::Rerank => "query",
                _ => "text_1",
            };
            if let Some(p) = obj.remove(from) {
                obj.insert("prompt".into(), p);
            }
            return obj;
        }
        Api::Responses => {
            if let Some(i) = obj.remove("instructions").filter(|i| !i.is_null()) {
                messages.push(message("system", i));
            }
            match obj.remove("input") {
                Some(Value::String(s)) => messages.push(message("user", Value::String(s))),
                Some(Value::Array(items)) => {
                    for item in items {
                        responses_item(&mut messages, item);
                    }
                }
                _ => {}
            }
        }
        Api::Messages => {
            if let Some(s) = obj.remove("system").filter(|s| !s.is_null()) {
                messages.push(message("system", text_parts(s)));
            }
            if let Some(Value::Array(ms)) = obj.remove("messages") {
                for m in ms {
                    anthropic_message(&mut messages, m);
                }
            }
        }
    }
    obj.insert("messages".into(), Value::Array(messages));
    obj
}

fn message(role: &str, content: Value) -> Value {
    json!({"role": role, "content": content})
}

/// A chat tool call.
fn call(id: Value, name: Value, arguments: Value) -> Value {
    let arguments = match arguments {
        Value::String(s) => Value::String(s),
        Value::Null => Value::String(String::new()),
        other => Value::String(other.to_string()),
    };
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// Content in chat's parts: a string stays one; of an array, the parts that carry text
/// (`text`, `input_text`, `output_text`, `refusal`) become `{"type":"text","text":…}`, the
/// rest stay as they are (images, audio, files: not text).
fn text_parts(content: Value) -> Value {
    let Value::Array(parts) = content else {
        return content;
    };
    Value::Array(
        parts
            .into_iter()
            .map(|p| {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                let key = match kind {
                    "refusal" => "refusal",
                    "text" | "input_text" | "output_text" => "text",
                    _ => return p,
                };
                match p.get(key) {
                    Some(Value::String(t)) => json!({"type": "text", "text": t}),
                    _ => p,
                }
            })
            .collect(),
    )
}

/// The last message, when it is the assistant's (a tool call joins it).
fn last_assistant(messages: &mut [Value]) -> Option<&mut Map<String, Value>> {
    let m = messages.last_mut()?.as_object_mut()?;
    (m.get("role").and_then(Value::as_str) == Some("assistant")).then_some(m)
}

/// Adds `c` to the tool calls of the assistant message at the end of `messages` (an empty
/// one when the last message is not the assistant's).
fn push_call(messages: &mut Vec<Value>, c: Value) {
    if last_assistant(messages).is_none() {
        messages.push(message("assistant", Value::String(String::new())));
    }
    if let Some(m) = last_assistant(messages) {
        match m.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(c),
            _ => {
                m.insert("tool_calls".into(), Value::Array(vec![c]));
            }
        }
    }
}

/// One item of a Responses `input`.
fn responses_item(messages: &mut Vec<Value>, mut item: Value) {
    let Some(o) = item.as_object_mut() else {
        return;
    };
    let kind = o.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind.to_string().as_str() {
        "message" => {
            let Some(Value::String(role)) = o.remove("role") else {
                return;
            };
            let content = o.remove("content").unwrap_or(Value::Null);
            messages.push(message(&role, text_parts(content)));
        }
        "function_call" => {
            let mut take = |k: &str| o.remove(k).unwrap_or(Value::Null);
            let (id, name, args) = (take("call_id"), take("name"), take("arguments"));
            push_call(messages, call(id, name, args));
        }
        "function_call_output" => {
            let id = o.remove("call_id").unwrap_or(Value::Null);
            let output = o.remove("output").unwrap_or(Value::Null);
            messages
                .push(json!({"role": "tool", "tool_call_id": id, "content": text_parts(output)}));
        }
        _ => {}
    }
}

/// One message of an Anthropic Messages request: its tool results first (as `tool`
/// messages), then the message with its text and other parts and its tool calls.
fn anthropic_message(messages: &mut Vec<Value>, mut m: Value) {
    let Some(o) = m.as_object_mut() else {
        return;
    };
    let role = match o.remove("role") {
        Some(Value::String(r)) => r,
        _ => return,
    };
    let blocks = match o.remove("content") {
        Some(Value::Array(b)) => b,
        Some(other) => {
            messages.push(message(&role, other));
            return;
        }
        None => Vec::new(),
    };
    let (mut parts, mut calls, mut results) = (Vec::new(), Vec::new(), false);
    for mut b in blocks {
        let Some(bo) = b.as_object_mut() else {
            continue;
        };
        let kind = bo.get("type").and_then(Value::as_str).unwrap_or("");
        match kind.to_string().as_str() {
            "tool_use" | "server_tool_use" => {
                let mut take = |k: &str| bo.remove(k).unwrap_or(Value::Null);
                let (id, name, input) = (take("id"), take("name"), take("input"));
                calls.push(call(id, name, input));
            }
            "tool_result" => {
                results = true;
                let id = bo.remove("tool_use_id").unwrap_or(Value::Null);
                let content = text_parts(bo.remove("content").unwrap_or(Value::Null));
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            "thinking" | "redacted_thinking" => {}
            _ => parts.push(b),
        }
    }
    // A user message that only carries tool results is those results.
    if parts.is_empty() && calls.is_empty() && results {
        return;
    }
    messages.push(message(&role, text_parts(Value::Array(parts))));
    for c in calls {
        push_call(messages, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(api: Api, body: Value) -> Value {
        Value::Object(chat_view(api, body.as_object().unwrap().clone()))
    }

    /// A Responses request with every kind of input item reads as the chat request a
    /// client of chat would send for the same conversation.
    #[test]
    fn a_responses_request_in_chats_shape() {
        let got = view(
            Api::Responses,
            json!({"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_1",
            "tools": [{"type": "function", "name": "lookup"}],
            "input": [
                {"role": "user", "content": "What is 2+2?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
                {"type": "function_call", "call_id": "call_a", "name": "lookup", "arguments": "{\"q\":1}"},
                {"type": "function_call", "call_id": "call_b", "name": "lookup", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_a", "output": "4"},
                {"role": "user", "content": [{"type": "input_text", "text": "And"}, {"type": "input_image", "image_url": "https://x/y.png"}]}
            ]}),
        );
        assert_eq!(
            got,
            json!({"model": "m", "previous_response_id": "resp_1",
            "tools": [{"type": "function", "name": "lookup"}],
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}], "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":1}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_a", "content": "4"},
                {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "input_image", "image_url": "https://x/y.png"}]}
            ]})
        );
        // A bare string input; calls with no assistant message before them.
        let got = view(
            Api::Responses,
            json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}),
        );
        assert_eq!(got["messages"][0]["role"], "assistant");
        assert_eq!(got["messages"][0]["content"], "");
        assert_eq!(got["messages"][0]["tool_calls"][0]["id"], "c");
        let got = view(Api::Responses, json!({"input": "hi"}));
        assert_eq!(got["messages"], json!([{"role": "user", "content": "hi"}]));
    }

    /// An Anthropic tool-use loop's third request: system blocks, a tool_use answer with its
    /// thinking, the tool results and a text block in one user message.
    #[test]
    fn an_anthropic_messages_request_in_chats_shape() {
        let got = view(
            Api::Messages,
            json!({"model": "claude", "max_tokens": 100,
            "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in SF?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "SF"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "15C"}]},
                    {"type": "text", "text": "Thanks"}
                ]}
            ]}),
        );
        assert_eq!(
            got["messages"],
            json!([
                {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
                {"role": "user", "content": "Weather in SF?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"SF\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "text", "text": "15C"}]},
                {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}
            ])
        );
        // A user message of tool results only is those results.
        let got = view(
            Api::Messages,
            json!({"messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]}),
        );
        assert_eq!(
            got["messages"],
            json!([{"role": "tool", "tool_call_id": "t", "content": "ok"}])
        );
    }

    #[test]
    fn non_generation_inputs_are_the_prompt() {
        for (api, key) in [
            (Api::Embeddings, "input"),
            (Api::Rerank, "query"),
            (Api::Score, "text_1"),
        ] {
            let got = view(api, json!({"model": "e", key: "some text"}));
            assert_eq!(got, json!({"model": "e", "prompt": "some text"}), "{api}");
        }
        let chat = json!({"messages": [{"role": "user", "content": "x"}]});
        assert_eq!(view(Api::Chat, chat.clone()), chat);
    }
}
