//! OpenAI Responses (`POST /v1/responses`) read event by event and whole, into the same
//! [`StreamEvent`]s, chunk text and usage as a chat stream (`docs/metrics.md`: a chunk is an
//! event that carries generated output).
//!
//! Streamed, every event is a JSON object with a `type`:
//! - output: `response.output_text.delta` and `response.refusal.delta` (answer text),
//!   `response.reasoning_text.delta` and `response.reasoning_summary_text.delta` (reasoning),
//!   a `function_call` item added (`response.output_item.added`: the call's `call_id` and
//!   `name`) and `response.function_call_arguments.delta` (its arguments, by `output_index`);
//! - `response.created` / `response.in_progress`: [`StreamEvent::Started`] with the
//!   response's `id`;
//! - `response.completed` / `response.incomplete`: [`StreamEvent::Final`] with `usage`
//!   (`input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens`,
//!   `output_tokens_details.reasoning_tokens`); an incomplete response (its
//!   `max_output_tokens` reached, as a chat `finish_reason: length`) ended as the server
//!   meant it to;
//! - `response.failed` and `error`: [`StreamEvent::Error`] with the message;
//! - anything else (`….done`, parts added, queued): a chunk without output, which moves the
//!   response's last event.

use serde::Deserialize;

use super::typed::{Piece, Str};
use super::{ChunkText, StreamEvent, TokenDetails, Usage, Whole, WholeCall};

/// `usage` of a Responses response.
#[derive(Deserialize)]
pub(super) struct RespUsage {
    #[serde(default)]
    input_tokens: Option<i64>,
    #[serde(default)]
    output_tokens: Option<i64>,
    #[serde(default)]
    input_tokens_details: Option<TokenDetails>,
    #[serde(default)]
    output_tokens_details: Option<TokenDetails>,
}

impl From<RespUsage> for Usage {
    fn from(u: RespUsage) -> Usage {
        Usage {
            prompt_tokens: u.input_tokens,
            completion_tokens: u.output_tokens,
            reasoning_tokens: u.output_tokens_details.and_then(|d| d.reasoning_tokens),
            cached_tokens: u.input_tokens_details.and_then(|d| d.cached_tokens),
        }
    }
}

/// The `response` object of a lifecycle event: only what is read of it (its `output` is
/// skipped unparsed).
#[derive(Deserialize, Default)]
struct Resp<'a> {
    #[serde(default, borrow)]
    id: Str<'a>,
    #[serde(default)]
    usage: Option<RespUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// An output item, as `response.output_item.added` announces it.
#[derive(Deserialize, Default)]
struct Item<'a> {
    #[serde(rename = "type", default, borrow)]
    ty: Str<'a>,
    #[serde(default, borrow)]
    call_id: Str<'a>,
    #[serde(default, borrow)]
    name: Str<'a>,
    #[serde(default, borrow)]
    arguments: Str<'a>,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    ty: Str<'a>,
    #[serde(default, borrow)]
    delta: Str<'a>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default, borrow)]
    item: Option<Item<'a>>,
    #[serde(default, borrow)]
    response: Option<Resp<'a>>,
    #[serde(default, borrow)]
    message: Str<'a>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// One event of a Responses stream (its `data`), its generated text into `text` when given.
pub(super) fn read(data: &[u8], text: Option<&mut ChunkText>) -> StreamEvent {
    let Ok(ev) = serde_json::from_slice::<Event>(data) else {
        return StreamEvent::Invalid;
    };
    let piece = match ev.ty.as_str() {
        "response.output_text.delta" | "response.refusal.delta" => Piece::Answer(ev.delta.as_str()),
        "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
            Piece::Reasoning(Some(ev.delta.as_str()))
        }
        "response.function_call_arguments.delta" => Piece::Call {
            index: ev.output_index,
            id: "",
            name: "",
            arguments: ev.delta.as_str(),
        },
        "response.output_item.added" => match &ev.item {
            Some(i) if i.ty.as_str() == "function_call" => Piece::Call {
                index: ev.output_index,
                id: i.call_id.as_str(),
                name: i.name.as_str(),
                arguments: i.arguments.as_str(),
            },
            _ => Piece::None,
        },
        "response.created" | "response.in_progress" => {
            let id = ev.response.and_then(|r| r.id.0).map(|c| c.into_owned());
            return StreamEvent::Started { id, usage: None };
        }
        "response.completed" | "response.incomplete" => {
            return StreamEvent::Final(ev.response.and_then(|r| r.usage).map(Usage::from));
        }
        "response.failed" => {
            let msg = ev
                .response
                .and_then(|r| r.error)
                .map(|e| super::error_message(&e))
                .unwrap_or_else(|| "response.failed".into());
            return StreamEvent::Error(msg);
        }
        "error" => return StreamEvent::Error(super::typed::error_text(&ev.message, ev.error)),
        _ => Piece::None,
    };
    piece.chunk(text)
}

/// `body` as a whole Responses response (`None`: not a JSON object).
pub(super) fn whole(body: &[u8]) -> Option<Whole> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object()?;
    let s = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let mut w = Whole {
        id: s(&v, "id"),
        usage: o
            .get("usage")
            .and_then(|u| serde_json::from_value::<RespUsage>(u.clone()).ok())
            .map(Usage::from),
        ..Whole::default()
    };
    if s(&v, "status").as_deref() == Some("failed") || o.get("error").is_some_and(|e| !e.is_null())
    {
        w.failed = Some(
            o.get("error")
                .filter(|e| !e.is_null())
                .map(super::error_message)
                .unwrap_or_else(|| "response failed".into()),
        );
    }
    for item in o
        .get("output")
        .and_then(|x| x.as_array())
        .into_iter()
        .flatten()
    {
        match item.get("type").and_then(|t| t.as_str()) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(|c| c.as_array())
                    .into_iter()
                    .flatten()
                {
                    for k in ["text", "refusal"] {
                        if let Some(t) = part.get(k).and_then(|t| t.as_str()) {
                            w.output.push_str(t);
                            w.answer.push_str(t);
                        }
                    }
                }
            }
            Some("reasoning") => {
                for k in ["summary", "content"] {
                    for part in item.get(k).and_then(|c| c.as_array()).into_iter().flatten() {
                        if let Some(t) = part.get("text").and_then(|t| t.as_str()) {
                            w.output.push_str(t);
                            w.reasoning.push_str(t);
                        }
                    }
                }
            }
            Some("function_call") => {
                for k in ["name", "arguments"] {
                    if let Some(t) = item.get(k).and_then(|t| t.as_str()) {
                        w.output.push_str(t);
                    }
                }
                let s = |k: &str| item.get(k).and_then(|t| t.as_str());
                w.calls.push(WholeCall::of(
                    s("call_id"),
                    s("name"),
                    item.get("arguments"),
                ));
            }
            _ => {}
        }
    }
    Some(w)
}
