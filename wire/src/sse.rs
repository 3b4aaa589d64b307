//! The one OpenAI/SSE stream parser that capture and replay share.
//!
//! [`SseParser`] turns bytes, fed as they arrive in arbitrary pieces, into the `data`
//! payloads of complete server-sent events (CRLF, LF and CR line ends, multi-line data,
//! comments and other fields ignored). [`classify`] reads one payload the way
//! ../shared/docs/metrics.md counts chunks: an event whose JSON has a non-empty `choices`
//! array is a chunk; `[DONE]` and a usage-only final event are not. A chunk also says whether
//! it carries generated output (text, content, reasoning content or a tool call): the
//! role-only first chunk of a chat stream (`{"role":"assistant","content":""}`), which some
//! servers send before queueing and prefill, and empty chunks carry none, so TTFT is the
//! arrival of the first chunk that does.
//!
//! Both sit on the per-chunk path, so neither allocates once its buffers have grown, and
//! `classify` parses the JSON without building a tree (the `choices` array is only counted).
//! [`read_event`] also reads the chunk's text (for token counting and session linking) in
//! that same one parse, borrowing the strings from the payload.
//!
//! Every API's events come out as the same [`StreamEvent`]s ([`read_event_of`]): OpenAI
//! chunks (`chat`), Responses events (`responses`) and Anthropic Messages events
//! (`messages`); whole responses of each are read once by [`read_whole`] (`whole`).

use serde::Deserialize;

mod chat;
mod messages;
mod responses;
mod tools;
mod typed;
#[cfg(test)]
mod typed_tests;
mod whole;

use chat::parse_event;
use tools::CallRanges;
pub use tools::ToolCallPiece;
pub use whole::{
    error_message, read_whole, response_reasoning_text, response_text, response_usage, Whole,
    WholeCall,
};

use crate::api::Api;

/// Default bound on the bytes of one event a parser holds ([`SseParser::with_max_event`]).
pub const DEFAULT_MAX_EVENT: usize = 1024 * 1024;

/// Incremental SSE parser; reuse one per response.
///
/// It holds at most `max_event` bytes of one event (its line in progress and its data): an
/// event larger than that is skipped to its terminating blank line without being held or
/// reported, and counted ([`SseParser::oversized_events`]), so memory follows the bound,
/// not the server.
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of the line in progress.
    line: Vec<u8>,
    /// Data of the event in progress (`data:` lines joined with `\n`).
    data: Vec<u8>,
    /// Whether the event in progress has seen a `data` field.
    has_data: bool,
    /// The previous piece ended in CR: a leading LF in the next piece belongs to it.
    skip_lf: bool,
    /// Total bytes fed.
    bytes: u64,
    /// Most bytes of one event held.
    max_event: usize,
    /// Inside an oversized event: skipping to its blank line.
    skipping: bool,
    /// While skipping: the current line has content (so its end is not a blank line).
    skip_line_content: bool,
    /// Events skipped for their size.
    oversized: u64,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_max_event(DEFAULT_MAX_EVENT)
    }
}

impl SseParser {
    /// A new parser holding at most [`DEFAULT_MAX_EVENT`] bytes of an event.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new parser holding at most `max_event` bytes of one event.
    pub fn with_max_event(max_event: usize) -> Self {
        SseParser {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            skip_lf: false,
            bytes: 0,
            max_event: max_event.max(1),
            skipping: false,
            skip_line_content: false,
            oversized: 0,
        }
    }

    /// Events skipped because they were larger than the bound.
    pub fn oversized_events(&self) -> u64 {
        self.oversized
    }

    /// The event in progress outgrew the bound: drop what is held (and its memory) and skip
    /// to its end.
    fn start_skipping(&mut self, line_has_content: bool) {
        self.skipping = true;
        self.skip_line_content = line_has_content;
        self.oversized += 1;
        self.line = Vec::new();
        self.data = Vec::new();
        self.has_data = false;
    }

    /// Feeds bytes; `on_event` gets the data of every event completed by them.
    pub fn feed(&mut self, mut bytes: &[u8], mut on_event: impl FnMut(&[u8])) {
        self.bytes += bytes.len() as u64;
        // An empty read says nothing about the CR-LF pairing: a CR that ended the previous
        // piece still pairs with an LF that starts the next one.
        if bytes.is_empty() {
            return;
        }
        if self.skip_lf {
            self.skip_lf = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while !bytes.is_empty() {
            match memchr::memchr2(b'\n', b'\r', bytes) {
                None => {
                    if self.skipping {
                        self.skip_line_content = true;
                    } else if self.line.len() + self.data.len() + bytes.len() > self.max_event {
                        self.start_skipping(true);
                    } else {
                        self.line.extend_from_slice(bytes);
                    }
                    return;
                }
                Some(i) => {
                    let end_len = if bytes[i] == b'\r' {
                        match bytes.get(i + 1) {
                            Some(b'\n') => 2,
                            Some(_) => 1,
                            None => {
                                self.skip_lf = true;
                                1
                            }
                        }
                    } else {
                        1
                    };
                    if self.skipping {
                        // A blank line ends the skipped event.
                        let blank = i == 0 && !self.skip_line_content;
                        self.skip_line_content = false;
                        if blank {
                            self.skipping = false;
                        }
                        bytes = &bytes[i + end_len..];
                        continue;
                    }
                    if self.line.len() + self.data.len() + i > self.max_event {
                        self.start_skipping(false);
                        bytes = &bytes[i + end_len..];
                        continue;
                    }
                    if self.line.is_empty() {
                        self.process_line_slice(&bytes[..i], &mut on_event);
                    } else {
                        self.line.extend_from_slice(&bytes[..i]);
                        let line = std::mem::take(&mut self.line);
                        self.process_line_slice(&line, &mut on_event);
                        self.line = line;
                        self.line.clear();
                    }
                    bytes = &bytes[i + end_len..];
                }
            }
        }
    }

    fn process_line_slice(&mut self, line: &[u8], on_event: &mut impl FnMut(&[u8])) {
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
            }
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return; // comment
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
    }

    /// True when bytes of an unfinished event are pending: the stream ended mid-event.
    pub fn has_partial(&self) -> bool {
        self.has_data || !self.line.is_empty() || self.skipping
    }

    /// Total bytes fed so far.
    pub fn bytes_fed(&self) -> u64 {
        self.bytes
    }
}

/// Token counts of an OpenAI `usage` object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "RawUsage")]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<i64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<i64>,
    /// `usage.completion_tokens_details.reasoning_tokens`: the part of `completion_tokens`
    /// spent on reasoning, when the server reports it (OpenAI, and servers that copy it).
    pub reasoning_tokens: Option<i64>,
    /// The part of `prompt_tokens` the server read from its prefix cache, when it reports it
    /// (`usage.prompt_tokens_details.cached_tokens`; Responses'
    /// `input_tokens_details.cached_tokens`; Messages' `cache_read_input_tokens`).
    pub cached_tokens: Option<i64>,
}

impl Usage {
    /// `self` with every count `later` reports put over it: a stream's usage as it grows
    /// (Messages report the prompt in `message_start` and the output in `message_delta`).
    pub fn merged(self, later: Usage) -> Usage {
        Usage {
            prompt_tokens: later.prompt_tokens.or(self.prompt_tokens),
            completion_tokens: later.completion_tokens.or(self.completion_tokens),
            reasoning_tokens: later.reasoning_tokens.or(self.reasoning_tokens),
            cached_tokens: later.cached_tokens.or(self.cached_tokens),
        }
    }
}

/// `usage` as sent: the reasoning tokens sit one object down.
#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<i64>,
    #[serde(default)]
    completion_tokens: Option<i64>,
    #[serde(default)]
    completion_tokens_details: Option<TokenDetails>,
    #[serde(default)]
    prompt_tokens_details: Option<TokenDetails>,
}

/// `*_tokens_details` of any of the APIs: the members any of them uses.
#[derive(Deserialize)]
pub(crate) struct TokenDetails {
    #[serde(default)]
    pub(crate) reasoning_tokens: Option<i64>,
    #[serde(default)]
    pub(crate) cached_tokens: Option<i64>,
}

impl From<RawUsage> for Usage {
    fn from(u: RawUsage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            reasoning_tokens: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
            cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        }
    }
}

/// What one SSE `data` payload of an OpenAI-style stream is.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A chunk: non-empty `choices`; `usage` is present with `continuous_usage_stats`.
    Chunk {
        /// Usage carried by the chunk, cumulative.
        usage: Option<Usage>,
        /// Some choice carries generated output: non-empty `text`, `delta.content`,
        /// `delta.reasoning_content` / `delta.reasoning`, or a `delta.tool_calls` /
        /// `delta.function_call`. A role-only or empty chunk does not.
        output: bool,
        /// Some choice carries answer output: output other than reasoning (non-empty `text`,
        /// `delta.content`, a tool call or a function call). A chunk with `output` and
        /// without `answer` carries reasoning only: the answer has not begun (TTFAT).
        answer: bool,
    },
    /// A usage-only event (`choices` empty or absent, `usage` present).
    Usage(Usage),
    /// `[DONE]`.
    Done,
    /// The opening event of a typed stream (Responses' `response.created` /
    /// `response.in_progress`, Messages' `message_start`): the response's `id` (what a later
    /// `previous_response_id` names) and the usage it already reports (Messages: the prompt).
    Started {
        /// The response's id.
        id: Option<String>,
        /// Usage reported at the start.
        usage: Option<Usage>,
    },
    /// The terminal event of a typed stream: Responses' `response.completed` and
    /// `response.incomplete` (with the final usage), Messages' `message_stop`. The response
    /// ended as the server meant it to, as `[DONE]` says of a chat stream, and this event's
    /// arrival is the response's end (E2EL).
    Final(Option<Usage>),
    /// An error object sent in the stream (`{"error": ...}`), with its message.
    Error(String),
    /// Valid JSON that is none of the above (e.g. empty `choices` without usage).
    Other,
    /// Not JSON.
    Invalid,
}

/// The text of one chunk, read by [`read_event`] in the same parse that classifies it: a
/// buffer to reuse from event to event (every read clears it first), so the per-chunk path
/// allocates nothing once it has grown.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChunkText {
    /// The generated text over every choice, in the order [`response_text`] reads a whole
    /// response's (`text`, reasoning, content, tool-call names and arguments): what a
    /// tokenizer counts when the server sends no usage.
    pub output: String,
    /// The answer a client shows and resends: the first choice's (`index` 0)
    /// `delta.content`, `message.content` and `text`.
    pub answer: String,
    /// The reasoning text over every choice (`delta.reasoning_content`, `delta.reasoning`):
    /// what a tokenizer counts as reasoning tokens when the server reports none.
    pub reasoning: String,
    /// The pieces of the first choice's tool calls in this chunk (`delta.tool_calls`), as
    /// ranges of `tool_text`: read them with [`ChunkText::tool_calls`].
    calls: Vec<CallRanges>,
    /// The ids, names and arguments the `calls` ranges point into.
    tool_text: String,
}

/// Classifies one SSE `data` payload.
pub fn classify(data: &[u8]) -> StreamEvent {
    read_event(data, None)
}

/// [`classify`], and into `text` (when given) the text of a chunk that carries output
/// (nothing for any other payload), in the same one parse: no tree is built and no
/// unescaped string is copied but into `text`.
pub fn read_event(data: &[u8], mut text: Option<&mut ChunkText>) -> StreamEvent {
    if let Some(t) = text.as_deref_mut() {
        t.clear();
    }
    let kind = parse_event(data, text.as_deref_mut());
    if !matches!(kind, StreamEvent::Chunk { output: true, .. }) {
        if let Some(t) = text {
            t.clear();
        }
    }
    kind
}

/// [`read_event`] for a stream of `api`: Responses and Messages streams are typed events
/// ([`Api::typed_events`]), read into the same [`StreamEvent`]s and text; any other API's
/// stream is read as OpenAI chunks.
pub fn read_event_of(api: Api, data: &[u8], mut text: Option<&mut ChunkText>) -> StreamEvent {
    let typed: fn(&[u8], Option<&mut ChunkText>) -> StreamEvent = match api {
        Api::Responses => responses::read,
        Api::Messages => messages::read,
        _ => return read_event(data, text),
    };
    if let Some(t) = text.as_deref_mut() {
        t.clear();
    }
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        // Some servers end a typed stream as they end a chat stream, after its final event.
        return StreamEvent::Done;
    }
    let kind = typed(data, text.as_deref_mut());
    if !matches!(kind, StreamEvent::Chunk { output: true, .. }) {
        if let Some(t) = text {
            t.clear();
        }
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;
    use whole::push_choice_text;

    fn events(pieces: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for piece in pieces {
            p.feed(piece, |d| out.push(String::from_utf8_lossy(d).into_owned()));
        }
        out
    }

    #[test]
    fn output_text_of_chunks_and_whole_responses() {
        let text = |j: &str| {
            let mut text = ChunkText::default();
            let kind = read_event(j.as_bytes(), Some(&mut text));
            assert!(matches!(kind, StreamEvent::Chunk { .. }), "{j}");
            text.output
        };
        let t = [
            r#"{"choices":[{"text":"Hel"}]}"#,
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":" why"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}"#,
        ]
        .map(text)
        .concat();
        let mut reused = ChunkText {
            output: "left from before".into(),
            answer: "x".into(),
            reasoning: "y".into(),
            ..Default::default()
        };
        assert_eq!(read_event(b"[DONE]", Some(&mut reused)), StreamEvent::Done);
        assert_eq!(reused, ChunkText::default());
        assert_eq!(t, "Hello whyf{}");
        assert_eq!(
            response_text(
                br#"{"choices":[{"message":{"role":"assistant","content":"Hi there"}}]}"#
            )
            .as_deref(),
            Some("Hi there")
        );
        assert_eq!(
            response_text(br#"{"choices":[{"text":"abc"}],"usage":null}"#).as_deref(),
            Some("abc")
        );
        assert_eq!(response_text(b"not json"), None);
    }

    /// Tool calls stream as pieces: the first of each call (by `index`) carries its id and
    /// name, the arguments follow in pieces; only the first choice's are read, escapes
    /// unescaped, and the buffer is reused clean.
    #[test]
    fn tool_call_pieces_of_the_first_choice() {
        let mut t = ChunkText::default();
        let pieces = |j: &str, t: &mut ChunkText| {
            let kind = read_event(j.as_bytes(), Some(t));
            let got: Vec<_> = t
                .tool_calls()
                .map(|p| {
                    (
                        p.index,
                        p.id.to_string(),
                        p.name.to_string(),
                        p.arguments.to_string(),
                    )
                })
                .collect();
            (kind, got)
        };
        let (kind, got) = pieces(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"task","arguments":""}},{"id":"c\u0032","function":{"arguments":"{\"p\":\"a\\\"b\"}","name":"read"},"index":1}]}}]}"#,
            &mut t,
        );
        assert!(
            matches!(kind, StreamEvent::Chunk { output: true, .. }),
            "{kind:?}"
        );
        assert_eq!(
            got,
            vec![
                (Some(0), "call_1".into(), "task".into(), "".into()),
                (
                    Some(1),
                    "c2".into(),
                    "read".into(),
                    r#"{"p":"a\"b"}"#.into()
                ),
            ]
        );
        assert_eq!(t.output, r#"taskread{"p":"a\"b"}"#);
        let (_, got) = pieces(
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\"x\""}}]},"index":0},{"index":1,"delta":{"tool_calls":[{"index":0,"id":"other","function":{"name":"no"}}]}}]}"#,
            &mut t,
        );
        assert_eq!(got, vec![(None, "".into(), "".into(), r#"{"x""#.into())]);
        let (_, got) = pieces(r#"{"choices":[{"delta":{"content":"hi"}}]}"#, &mut t);
        assert!(got.is_empty(), "{got:?}");
        assert_eq!(read_event(b"[DONE]", Some(&mut t)), StreamEvent::Done);
        assert_eq!(t, ChunkText::default());
    }

    #[test]
    fn parses_events_split_anywhere() {
        let stream =
            b"data: {\"a\":1}\n\n: comment\nevent: x\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
        let whole = events(&[stream]);
        assert_eq!(whole, vec!["{\"a\":1}", "one\ntwo", "[DONE]"]);
        for cut in 0..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(events(&[a, b]), whole, "cut at {cut}");
        }
        let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(events(&bytewise), whole);
    }

    /// Found by `tests/fuzz_inputs.rs`: an empty piece between the CR and the LF of one CRLF
    /// dropped the pairing, so the LF read as a blank line and ended the event early.
    #[test]
    fn an_empty_piece_between_cr_and_lf_keeps_them_one_line_end() {
        let whole = events(&[b"data: a\r\ndata: b\r\n\r\n"]);
        assert_eq!(whole, vec!["a\nb"]);
        assert_eq!(events(&[b"data: a\r", b"", b"\ndata: b\r\n\r\n"]), whole);
        assert_eq!(
            events(&[b"data: a\r", b"", b"", b"\n", b"data: b\r\n\r\n"]),
            whole
        );
    }

    #[test]
    fn handles_crlf_and_cr_line_ends_across_pieces() {
        assert_eq!(events(&[b"data: x\r\n\r\ndata: y\r\r"]), vec!["x", "y"]);
        assert_eq!(events(&[b"data: x\r", b"\n\r", b"\n"]), vec!["x"]);
        assert_eq!(events(&[b"data:nospace\n\n"]), vec!["nospace"]);
    }

    /// An event over the bound is skipped to its blank line, whatever the pieces, and the
    /// parser holds no more than the bound meanwhile; the events around it are intact.
    #[test]
    fn an_oversized_event_is_skipped_and_counted() {
        let big = format!("data: {}\n\n", "x".repeat(5000));
        let stream = format!(
            "data: a\n\n{big}data: b\n\n: c\ndata: {}\ndata: yyyyyyyyyyyy\n\ndata: [DONE]\n\n",
            "z".repeat(90)
        );
        for piece in [1usize, 7, 100, 4096, stream.len()] {
            let mut p = SseParser::with_max_event(100);
            let mut out = Vec::new();
            for part in stream.as_bytes().chunks(piece) {
                p.feed(part, |d| out.push(String::from_utf8_lossy(d).into_owned()));
                assert!(
                    p.line.capacity() + p.data.capacity() <= 2 * 256,
                    "piece {piece}"
                );
            }
            assert_eq!(out, vec!["a", "b", "[DONE]"], "piece {piece}");
            assert_eq!(p.oversized_events(), 2, "piece {piece}");
            assert!(!p.has_partial());
        }
    }

    #[test]
    fn partial_event_is_reported() {
        let mut p = SseParser::new();
        p.feed(b"data: {\"choices\":[", |_| panic!("no event yet"));
        assert!(p.has_partial());
        p.feed(b"1]}\n\n", |_| {});
        assert!(!p.has_partial());
    }

    #[test]
    fn classifies_like_metrics_md() {
        let chat_role =
            br#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert_eq!(
            classify(chat_role),
            StreamEvent::Chunk {
                usage: None,
                output: false,
                answer: false,
            }
        );
        let with_usage = br#"{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
        assert_eq!(
            classify(with_usage),
            StreamEvent::Chunk {
                usage: Some(Usage {
                    prompt_tokens: Some(3),
                    completion_tokens: Some(2),
                    reasoning_tokens: None,
                    cached_tokens: None,
                }),
                output: true,
                answer: true,
            }
        );
        let usage_only = br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#;
        assert_eq!(
            classify(usage_only),
            StreamEvent::Usage(Usage {
                prompt_tokens: Some(3),
                completion_tokens: Some(7),
                reasoning_tokens: None,
                cached_tokens: None,
            })
        );
        assert_eq!(classify(b" [DONE] "), StreamEvent::Done);
        assert_eq!(classify(br#"{"choices":[]}"#), StreamEvent::Other);
        assert_eq!(
            classify(br#"{"choices":null,"usage":null}"#),
            StreamEvent::Other
        );
        assert_eq!(classify(b"not json"), StreamEvent::Invalid);
        assert_eq!(
            classify(br#"{"error":{"message":"boom","code":500}}"#),
            StreamEvent::Error("boom".into())
        );
    }

    /// What the one-pass parse must agree with: the payload read as a tree (serde_json's
    /// `Value`), its kind by the rules of [`classify`], its text by [`push_choice_text`]
    /// its answer by the first choice's `delta.content`, `message.content` and `text`, and
    /// its reasoning by every choice's `delta.reasoning_content` and `delta.reasoning`.
    fn tree_reading(p: &str) -> (StreamEvent, String, String, String) {
        let invalid = (
            StreamEvent::Invalid,
            String::new(),
            String::new(),
            String::new(),
        );
        let Ok(v) = serde_json::from_str::<serde_json::Value>(p) else {
            return invalid;
        };
        let Some(obj) = v.as_object() else {
            return invalid;
        };
        let non_empty = |v: &serde_json::Value| match v {
            serde_json::Value::Null => false,
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::String(s) => !s.is_empty(),
            serde_json::Value::Array(a) => !a.is_empty(),
            _ => true,
        };
        let choices = match obj.get("choices") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Array(a)) => Some(a),
            Some(_) => return invalid,
        };
        let (mut output, mut answer_out) = (false, false);
        for c in choices.into_iter().flatten() {
            let Some(c) = c.as_object() else {
                return invalid;
            };
            let text = c.get("text").is_some_and(non_empty);
            output |= text;
            answer_out |= text;
            match c.get("delta") {
                None | Some(serde_json::Value::Null) => {}
                Some(serde_json::Value::Object(d)) => {
                    let has = |k: &&str| d.get(*k).is_some_and(non_empty);
                    let answers = ["content", "tool_calls", "function_call"];
                    answer_out |= answers.iter().any(has);
                    output |= answers
                        .iter()
                        .chain(&["reasoning_content", "reasoning"])
                        .any(has);
                }
                Some(_) => return invalid,
            }
        }
        let Ok(usage) = obj.get("usage").map_or(Ok(None), |u| {
            serde_json::from_value::<Option<Usage>>(u.clone())
        }) else {
            return invalid;
        };
        let kind = match (obj.get("error"), choices, usage) {
            (Some(e), _, _) if !e.is_null() => StreamEvent::Error(error_message(e)),
            (_, Some(c), usage) if !c.is_empty() => StreamEvent::Chunk {
                usage,
                output,
                answer: answer_out,
            },
            (_, _, Some(u)) => StreamEvent::Usage(u),
            _ => StreamEvent::Other,
        };
        let (mut text, mut answer, mut reasoning) = (String::new(), String::new(), String::new());
        if let StreamEvent::Chunk { output: true, .. } = kind {
            for c in choices.into_iter().flatten() {
                push_choice_text(c, "delta", &mut text);
                for ptr in ["/delta/reasoning_content", "/delta/reasoning"] {
                    reasoning.push_str(c.pointer(ptr).and_then(|t| t.as_str()).unwrap_or(""));
                }
                if c.get("index").and_then(|i| i.as_u64()).unwrap_or(0) == 0 {
                    for ptr in ["/delta/content", "/message/content", "/text"] {
                        answer.push_str(c.pointer(ptr).and_then(|t| t.as_str()).unwrap_or(""));
                    }
                }
            }
        }
        (kind, text, answer, reasoning)
    }

    /// The one-pass parse reads every payload as the tree does: thousands of chunks drawn
    /// from the shapes servers send (and shapes they should not), strings with escapes,
    /// members in any order, unknown members, values of the wrong type.
    #[test]
    fn one_pass_reads_chunks_as_the_tree_does() {
        let strs = [
            "",
            "a",
            "\"q\\\"\"",
            "\"\\u00e9\\n\"",
            "\"\"",
            "\"hi there\"",
            "null",
            "5",
            "true",
            "false",
            "[]",
            "[1]",
            "{}",
            "{\"x\":1}",
            "1.5",
        ];
        let strs: Vec<String> = strs
            .iter()
            .map(|s| {
                if *s == "a" {
                    "\"a\"".to_string()
                } else {
                    s.to_string()
                }
            })
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut pick = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut checked = 0;
        let mut with_text = 0;
        // One buffer for every payload, as the observers use it.
        let mut text = ChunkText::default();
        for _ in 0..20_000 {
            let member = |pick: &mut dyn FnMut(usize) -> usize, name: &str| {
                let v = &strs[pick(strs.len())];
                if v.is_empty() {
                    None
                } else {
                    Some(format!("\"{name}\":{v}"))
                }
            };
            let mut choices = Vec::new();
            for _ in 0..pick(3) {
                let mut fields: Vec<String> = Vec::new();
                fields.extend(member(&mut pick, "text"));
                let tools = [
                    "",
                    "\"tool_calls\":[]",
                    "\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]",
                    "\"tool_calls\":[{\"function\":{\"arguments\":\"1}\"}},{\"function\":\"x\"},3]",
                    "\"tool_calls\":\"x\"",
                    "\"function_call\":{\"arguments\":\"{}\",\"name\":\"g\"}",
                    "\"function_call\":{}",
                    "\"function_call\":\"f\"",
                ];
                match pick(6) {
                    0 => {}
                    1 => fields.push("\"delta\":null".into()),
                    2 => fields.push("\"delta\":\"x\"".into()),
                    _ => {
                        let mut d: Vec<String> = Vec::new();
                        if pick(2) == 0 {
                            d.push("\"role\":\"assistant\"".into());
                        }
                        for k in ["content", "reasoning_content", "reasoning"] {
                            if pick(2) == 0 {
                                d.extend(member(&mut pick, k));
                            }
                        }
                        let t = tools[pick(tools.len())];
                        if !t.is_empty() {
                            d.push(t.into());
                        }
                        let n = d.len();
                        d.rotate_left(pick(n + 1).min(n));
                        fields.push(format!("\"delta\":{{{}}}", d.join(",")));
                    }
                }
                match pick(4) {
                    0 => fields.push("\"message\":{\"content\":\"m\\u0041\"}".into()),
                    1 => fields.push("\"message\":\"m\"".into()),
                    _ => {}
                }
                match pick(6) {
                    0 => fields.push("\"index\":0".into()),
                    1 => fields.push("\"index\":1".into()),
                    2 => fields.push("\"index\":\"1\"".into()),
                    3 => fields.push("\"index\":1.0".into()),
                    _ => {}
                }
                if pick(3) == 0 {
                    fields.push("\"finish_reason\":\"stop\",\"logprobs\":null".into());
                }
                let n = fields.len();
                fields.rotate_left(pick(n + 1).min(n));
                choices.push(format!("{{{}}}", fields.join(",")));
            }
            let mut top = Vec::new();
            match pick(5) {
                0 => {}
                1 => top.push("\"choices\":null".to_string()),
                _ => top.push(format!("\"choices\":[{}]", choices.join(","))),
            }
            match pick(5) {
                0 => top.push("\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}".into()),
                1 if pick(2) == 0 => top.push(
                    "\"usage\":{\"completion_tokens\":9,\"completion_tokens_details\":{\"reasoning_tokens\":7}}"
                        .into(),
                ),
                1 => top.push("\"usage\":null".into()),
                2 => top.push("\"usage\":\"x\"".into()),
                _ => {}
            }
            if pick(8) == 0 {
                top.push("\"error\":{\"message\":\"boom\"}".into());
            }
            top.push("\"id\":\"c-1\",\"object\":\"chat.completion.chunk\"".into());
            let n = top.len();
            top.rotate_left(pick(n + 1).min(n));
            let p = format!("{{{}}}", top.join(","));
            let kind = read_event(p.as_bytes(), Some(&mut text));
            let (want_kind, want_text, want_answer, want_reasoning) = tree_reading(&p);
            assert_eq!(kind, want_kind, "{p}");
            assert_eq!(classify(p.as_bytes()), want_kind, "{p}");
            assert_eq!(text.output, want_text, "{p}");
            assert_eq!(text.answer, want_answer, "{p}");
            assert_eq!(text.reasoning, want_reasoning, "{p}");
            checked += 1;
            with_text += usize::from(!want_text.is_empty());
        }
        assert_eq!(checked, 20_000);
        assert!(with_text > 2_000, "too few payloads with text: {with_text}");
        // A repeated member is not an event we read (as a derived Deserialize says); the
        // tree would keep the last.
        for p in [
            r#"{"choices":[{"text":"a"}],"choices":[]}"#,
            r#"{"choices":[{"text":"a","text":"b"}]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
        ] {
            text.answer.push_str("from before");
            let kind = read_event(p.as_bytes(), Some(&mut text));
            assert_eq!(kind, StreamEvent::Invalid, "{p}");
            assert_eq!(text, ChunkText::default(), "{p}");
        }
        // Not an object.
        for p in [
            "[1,2]",
            "\"x\"",
            "3",
            "{\"choices\":[1]}",
            "{\"choices\":{}}",
            "{} x",
        ] {
            assert_eq!(classify(p.as_bytes()), StreamEvent::Invalid, "{p}");
        }
    }

    /// Output is text, content, reasoning or a tool call; a role-only, empty or
    /// finish-only chunk carries none (and is still a chunk).
    #[test]
    fn a_chunk_says_whether_it_carries_output() {
        let output = |j: &str| match classify(j.as_bytes()) {
            StreamEvent::Chunk { output, .. } => output,
            other => panic!("{j}: {other:?}"),
        };
        for j in [
            r#"{"choices":[{"index":0,"text":"a"}]}"#,
            r#"{"choices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"hmm","content":null}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"delta":{"function_call":{"name":"f"}}}]}"#,
            r#"{"choices":[{"delta":{}},{"delta":{"content":"\u00e9"}}]}"#,
        ] {
            assert!(output(j), "{j}");
        }
        for j in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
            r#"{"choices":[{"delta":{"content":null},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"text":"","finish_reason":"length"}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            r#"{"choices":[{"index":0,"logprobs":null}]}"#,
        ] {
            assert!(!output(j), "{j}");
        }
    }

    /// Answer output is text, content or a call; reasoning alone is output but no answer,
    /// and its text is read apart.
    #[test]
    fn a_chunk_says_whether_it_carries_answer_output() {
        let read = |j: &str| {
            let mut t = ChunkText::default();
            match read_event(j.as_bytes(), Some(&mut t)) {
                StreamEvent::Chunk { output, answer, .. } => (output, answer, t.reasoning),
                other => panic!("{j}: {other:?}"),
            }
        };
        let reasoning_only = [
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"hmm","content":null}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"hm","reasoning":"m","content":""}}]}"#,
        ];
        for j in reasoning_only {
            let (output, answer, reasoning) = read(j);
            assert!(output && !answer, "{j}");
            assert!(reasoning.starts_with("hm"), "{j}: {reasoning:?}");
        }
        for j in [
            r#"{"choices":[{"text":"a"}]}"#,
            r#"{"choices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"x","content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"delta":{"function_call":{"name":"f"}}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"x"}},{"delta":{"content":"y"}}]}"#,
        ] {
            let (output, answer, _) = read(j);
            assert!(output && answer, "{j}");
        }
        let (output, answer, reasoning) = read(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#);
        assert!(!output && !answer && reasoning.is_empty());
    }

    #[test]
    fn reasoning_tokens_from_usage_details() {
        let body = br#"{"choices":[{"message":{"reasoning_content":"let me think","content":"4"}}],
            "usage":{"prompt_tokens":10,"completion_tokens":40,"completion_tokens_details":{"reasoning_tokens":38}}}"#;
        let u = response_usage(body).unwrap();
        assert_eq!(
            (u.completion_tokens, u.reasoning_tokens),
            (Some(40), Some(38))
        );
        assert_eq!(
            response_reasoning_text(body).as_deref(),
            Some("let me think")
        );
        let plain = br#"{"choices":[{"message":{"content":"4"}}],"usage":{"completion_tokens":1,"completion_tokens_details":null}}"#;
        assert_eq!(response_usage(plain).unwrap().reasoning_tokens, None);
        assert_eq!(response_reasoning_text(plain).as_deref(), Some(""));
        assert_eq!(response_reasoning_text(b"<html>"), None);
    }

    #[test]
    fn whole_response_usage() {
        let body =
            br#"{"choices":[{"text":"x"}],"usage":{"prompt_tokens":10,"completion_tokens":4}}"#;
        assert_eq!(
            response_usage(body).and_then(|u| u.completion_tokens),
            Some(4)
        );
        assert_eq!(response_usage(b"<html>"), None);
    }
}
