//! Anthropic Messages (`POST /v1/messages`) read event by event and whole, into the same
//! [`StreamEvent`]s, chunk text and usage as a chat stream (`docs/metrics.md`: a chunk is an
//! event that carries generated output).
//!
//! Streamed, every event's data is a JSON object with a `type`:
//! - `message_start`: [`StreamEvent::Started`] with the message's `id` and its `usage` (the
//!   prompt: `input_tokens` + `cache_read_input_tokens` + `cache_creation_input_tokens`, the
//!   cache read recorded apart as cached tokens);
//! - output: `content_block_delta` with a `text_delta` (answer), a `thinking_delta`
//!   (reasoning) or an `input_json_delta` (a tool call's arguments, by block `index`), and a
//!   `content_block_start` of a `tool_use` block (the call's `id` and `name`) or of a
//!   `redacted_thinking` block (reasoning without text); a `signature_delta` is not output;
//! - `message_delta`: [`StreamEvent::Usage`] (`output_tokens`, cumulative);
//! - `message_stop`: [`StreamEvent::Final`];
//! - `error` (`overloaded_error`, …, mid-stream): [`StreamEvent::Error`] with its message;
//! - `ping`: [`StreamEvent::Other`]; anything else: a chunk without output.

use serde::Deserialize;

use super::typed::{error_text, Piece, Str};
use super::{ChunkText, StreamEvent, Usage, Whole, WholeCall};

/// `usage` of a Messages response.
#[derive(Deserialize)]
pub(super) struct MsgUsage {
    #[serde(default)]
    input_tokens: Option<i64>,
    #[serde(default)]
    output_tokens: Option<i64>,
    #[serde(default)]
    cache_read_input_tokens: Option<i64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<i64>,
}

impl From<MsgUsage> for Usage {
    fn from(u: MsgUsage) -> Usage {
        let cached = u.cache_read_input_tokens;
        Usage {
            prompt_tokens: u
                .input_tokens
                .map(|i| i + cached.unwrap_or(0) + u.cache_creation_input_tokens.unwrap_or(0)),
            completion_tokens: u.output_tokens,
            reasoning_tokens: None,
            cached_tokens: cached,
        }
    }
}

#[derive(Deserialize, Default)]
struct Message<'a> {
    #[serde(default, borrow)]
    id: Str<'a>,
    #[serde(default)]
    usage: Option<MsgUsage>,
}

/// A content block as `content_block_start` opens it, or a delta.
#[derive(Deserialize, Default)]
struct Block<'a> {
    #[serde(rename = "type", default, borrow)]
    ty: Str<'a>,
    #[serde(default, borrow)]
    id: Str<'a>,
    #[serde(default, borrow)]
    name: Str<'a>,
    #[serde(default, borrow)]
    text: Str<'a>,
    #[serde(default, borrow)]
    thinking: Str<'a>,
    #[serde(default, borrow)]
    partial_json: Str<'a>,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    ty: Str<'a>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    message: Option<Message<'a>>,
    #[serde(default, borrow)]
    content_block: Option<Block<'a>>,
    #[serde(default, borrow)]
    delta: Option<Block<'a>>,
    #[serde(default)]
    usage: Option<MsgUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// One event of a Messages stream (its `data`), its generated text into `text` when given.
pub(super) fn read(data: &[u8], text: Option<&mut ChunkText>) -> StreamEvent {
    let Ok(ev) = serde_json::from_slice::<Event>(data) else {
        return StreamEvent::Invalid;
    };
    let piece = match ev.ty.as_str() {
        "content_block_delta" => match &ev.delta {
            Some(d) => match d.ty.as_str() {
                "text_delta" => Piece::Answer(d.text.as_str()),
                "thinking_delta" => Piece::Reasoning(Some(d.thinking.as_str())),
                "input_json_delta" => Piece::Call {
                    index: ev.index,
                    id: "",
                    name: "",
                    arguments: d.partial_json.as_str(),
                },
                _ => Piece::None,
            },
            None => Piece::None,
        },
        "content_block_start" => match &ev.content_block {
            Some(b) => match b.ty.as_str() {
                "tool_use" | "server_tool_use" => Piece::Call {
                    index: ev.index,
                    id: b.id.as_str(),
                    name: b.name.as_str(),
                    arguments: "",
                },
                "text" => Piece::Answer(b.text.as_str()),
                "thinking" => Piece::Reasoning(Some(b.thinking.as_str())),
                "redacted_thinking" => Piece::Reasoning(None),
                _ => Piece::None,
            },
            None => Piece::None,
        },
        "message_start" => {
            let (id, usage) = match ev.message {
                Some(m) => (m.id.0.map(|c| c.into_owned()), m.usage.map(Usage::from)),
                None => (None, None),
            };
            return StreamEvent::Started { id, usage };
        }
        "message_delta" => {
            return match ev.usage {
                Some(u) => StreamEvent::Usage(u.into()),
                None => StreamEvent::Other,
            }
        }
        "message_stop" => return StreamEvent::Final(None),
        "ping" => return StreamEvent::Other,
        "error" => return StreamEvent::Error(error_text(&Str::default(), ev.error)),
        _ => Piece::None,
    };
    piece.chunk(text)
}

/// `body` as a whole Messages response (`None`: not a JSON object).
pub(super) fn whole(body: &[u8]) -> Option<Whole> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object()?;
    let mut w = Whole {
        id: o.get("id").and_then(|x| x.as_str()).map(str::to_string),
        usage: o
            .get("usage")
            .and_then(|u| serde_json::from_value::<MsgUsage>(u.clone()).ok())
            .map(Usage::from),
        ..Whole::default()
    };
    if o.get("type").and_then(|t| t.as_str()) == Some("error") {
        w.failed = Some(error_text(&Str::default(), o.get("error").cloned()));
    }
    for b in o
        .get("content")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
    {
        let s = |k: &str| b.get(k).and_then(|t| t.as_str());
        match s("type") {
            Some("text") => {
                let t = s("text").unwrap_or("");
                w.output.push_str(t);
                w.answer.push_str(t);
            }
            Some("thinking") => {
                let t = s("thinking").unwrap_or("");
                w.output.push_str(t);
                w.reasoning.push_str(t);
            }
            Some("tool_use") | Some("server_tool_use") => {
                let call = WholeCall::of(s("id"), s("name"), b.get("input"));
                w.output.push_str(&call.name);
                w.output.push_str(&call.arguments);
                w.calls.push(call);
            }
            _ => {}
        }
    }
    Some(w)
}
