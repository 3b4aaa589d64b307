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

use std::borrow::Cow;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

mod messages;
mod responses;
mod tools;
mod typed;
#[cfg(test)]
mod typed_tests;

pub use tools::ToolCallPiece;
use tools::{CallPiece, CallRanges};

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

fn parse_event(data: &[u8], text: Option<&mut ChunkText>) -> StreamEvent {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return StreamEvent::Done;
    }
    let mut de = serde_json::Deserializer::from_slice(trimmed);
    let parsed = EventSeed { text }
        .deserialize(&mut de)
        .and_then(|ev| de.end().map(|()| ev));
    match parsed {
        Err(_) => StreamEvent::Invalid,
        Ok(RawEvent { error: Some(e), .. }) => StreamEvent::Error(error_message(&e)),
        Ok(RawEvent {
            choices: Some(c),
            usage,
            ..
        }) if c.count > 0 => StreamEvent::Chunk {
            usage,
            output: c.output,
            answer: c.answer,
        },
        Ok(RawEvent { usage: Some(u), .. }) => StreamEvent::Usage(u),
        Ok(_) => StreamEvent::Other,
    }
}

#[derive(Default)]
struct RawEvent {
    choices: Option<Choices>,
    usage: Option<Usage>,
    error: Option<serde_json::Value>,
}

/// What a `choices` array holds: how many, and whether any carries output, and answer
/// output.
#[derive(Debug, Clone, Copy, Default)]
struct Choices {
    count: usize,
    output: bool,
    answer: bool,
}

/// A key of an object, as its position in `names` (None: another key); escaped keys too.
struct Field(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Field {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Field {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|n| *n == v))
    }
}

/// Fails on a key seen twice, as a derived `Deserialize` does (the payload is then not an
/// event we read: [`StreamEvent::Invalid`]).
fn once<E: serde::de::Error>(seen: &mut u8, i: usize, names: &[&'static str]) -> Result<(), E> {
    if *seen & (1 << i) != 0 {
        return Err(E::duplicate_field(names[i]));
    }
    *seen |= 1 << i;
    Ok(())
}

struct EventSeed<'t> {
    text: Option<&'t mut ChunkText>,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = RawEvent;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = RawEvent;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        const NAMES: &[&str] = &["choices", "usage", "error"];
        let mut ev = RawEvent::default();
        let mut text = self.text;
        let mut seen = 0u8;
        while let Some(key) = map.next_key_seed(Field(NAMES))? {
            match key {
                Some(i) => once(&mut seen, i, NAMES)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            }
            match key {
                Some(0) => {
                    ev.choices = map.next_value_seed(ChoicesSeed {
                        text: text.as_deref_mut(),
                    })?
                }
                Some(1) => ev.usage = map.next_value()?,
                _ => ev.error = map.next_value()?,
            }
        }
        Ok(ev)
    }
}

struct ChoicesSeed<'t> {
    text: Option<&'t mut ChunkText>,
}

impl<'de> DeserializeSeed<'de> for ChoicesSeed<'_> {
    type Value = Option<Choices>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ChoicesSeed<'_> {
    type Value = Option<Choices>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array or null")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut c = Choices::default();
        let mut text = self.text;
        while let Some((output, answer)) = seq.next_element_seed(ChoiceSeed {
            text: text.as_deref_mut(),
        })? {
            c.count += 1;
            c.output |= output;
            c.answer |= answer;
        }
        Ok(Some(c))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// One choice: says whether it carries output and answer output, and adds its text to
/// `text`.
struct ChoiceSeed<'t> {
    text: Option<&'t mut ChunkText>,
}

impl<'de> DeserializeSeed<'de> for ChoiceSeed<'_> {
    type Value = (bool, bool);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ChoiceSeed<'_> {
    type Value = (bool, bool);
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a choice object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(bool, bool), A::Error> {
        const NAMES: &[&str] = &["text", "delta", "message", "index"];
        let collect = self.text.is_some();
        let mut seen = 0u8;
        let mut text = LenientVal::default();
        let mut delta: Option<Delta<'de>> = None;
        let mut message: Option<Cow<'de, str>> = None;
        let mut index = 0u64;
        while let Some(key) = map.next_key_seed(Field(NAMES))? {
            match key {
                Some(0) => {
                    once(&mut seen, 0, NAMES)?;
                    text = map.next_value_seed(Lenient::Text(collect))?;
                }
                Some(1) => {
                    once(&mut seen, 1, NAMES)?;
                    delta = map.next_value_seed(DeltaSeed(collect))?;
                }
                // Read leniently, as a JSON pointer would: anything else is no text.
                Some(2) => message = map.next_value_seed(Lenient::Content(collect))?.text,
                Some(_) => index = map.next_value_seed(Lenient::Index)?.index,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let output = text.non_empty || delta.as_ref().is_some_and(|d| d.output);
        let answer = text.non_empty || delta.as_ref().is_some_and(|d| d.answer);
        if let Some(t) = self.text {
            // A chunk without output keeps none of this (see read_event).
            let out = &mut t.output;
            out.extend(text.text.as_deref());
            if let Some(d) = &delta {
                out.extend(
                    [&d.reasoning_content, &d.reasoning, &d.content]
                        .into_iter()
                        .flatten()
                        .chain(
                            d.calls
                                .iter()
                                .flat_map(|c| [&c.name, &c.arguments])
                                .flatten(),
                        )
                        .chain(d.function_call.iter().flatten())
                        .map(|t| &**t),
                );
                t.reasoning.extend(
                    [&d.reasoning_content, &d.reasoning]
                        .into_iter()
                        .flatten()
                        .map(|t| &**t),
                );
            }
            if index == 0 {
                let answer = &mut t.answer;
                answer.extend(delta.as_ref().and_then(|d| d.content.as_deref()));
                answer.extend(message.as_deref());
                answer.extend(text.text.as_deref());
                for c in delta.iter().flat_map(|d| &d.calls) {
                    t.push_call(c);
                }
            }
        }
        Ok((output, answer))
    }
}

/// A choice's `delta`: whether it carries output, and answer output (content or a call),
/// and its texts.
#[derive(Default)]
struct Delta<'de> {
    output: bool,
    answer: bool,
    content: Option<Cow<'de, str>>,
    reasoning_content: Option<Cow<'de, str>>,
    reasoning: Option<Cow<'de, str>>,
    /// The `tool_calls` elements (when collected): names and arguments, in order.
    calls: Vec<CallPiece<'de>>,
    /// The function call's name and arguments (when collected).
    function_call: [Option<Cow<'de, str>>; 2],
}

struct DeltaSeed(bool);

impl<'de> DeserializeSeed<'de> for DeltaSeed {
    type Value = Option<Delta<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for DeltaSeed {
    type Value = Option<Delta<'de>>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a delta object or null")
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        const NAMES: &[&str] = &[
            "content",
            "reasoning_content",
            "reasoning",
            "tool_calls",
            "function_call",
        ];
        let collect = self.0;
        let mut d = Delta::default();
        let mut seen = 0u8;
        while let Some(key) = map.next_key_seed(Field(NAMES))? {
            let Some(i) = key else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            once(&mut seen, i, NAMES)?;
            let v = match i {
                0..=2 => {
                    let v = map.next_value_seed(Lenient::Text(collect))?;
                    match i {
                        0 => {
                            d.content = v.text;
                            d.answer |= v.non_empty;
                        }
                        1 => d.reasoning_content = v.text,
                        _ => d.reasoning = v.text,
                    }
                    v.non_empty
                }
                3 => {
                    let v = map.next_value_seed(Lenient::ToolCalls(collect))?;
                    d.calls = v.call.map(|c| c.calls).unwrap_or_default();
                    d.answer |= v.non_empty;
                    v.non_empty
                }
                _ => {
                    let v = map.next_value_seed(Lenient::FunctionCall(collect))?;
                    let non_empty = v.non_empty;
                    d.function_call = v.name_and_arguments();
                    d.answer |= non_empty;
                    non_empty
                }
            };
            d.output |= v;
        }
        Ok(Some(d))
    }
}

/// Values read as a JSON pointer into a tree would read them: the wanted member when the
/// value has the expected shape, nothing otherwise (never an error), and whether the value
/// is "present and not empty" (a non-empty string or array, an object, a number or `true`;
/// `null`, `""`, `[]` and `false` are empty).
#[derive(Clone, Copy)]
enum Lenient {
    /// A string: its text when collected.
    Text(bool),
    /// A choice's `index`: a u64, else 0.
    Index,
    /// `message`: its `content` string.
    Content(bool),
    /// `tool_calls`: every element's `function.name` and `function.arguments` (and, when
    /// collected, each element as a [`CallPiece`]).
    ToolCalls(bool),
    /// A tool call: its `function`'s `name` and `arguments`, its `index` and `id`.
    ToolCall(bool),
    /// `function_call` (or a tool call's `function`): its `name` and `arguments`.
    FunctionCall(bool),
}

#[derive(Default)]
struct LenientVal<'de> {
    non_empty: bool,
    index: u64,
    text: Option<Cow<'de, str>>,
    /// A tool call's `index` was given (`index` holds it).
    indexed: bool,
    /// A tool call's (or a function call's) pieces, and `tool_calls`' elements, when
    /// collected: boxed, so the value every member of every chunk is read into stays small
    /// (it is moved once a member; calls are rare).
    call: Option<Box<CallVal<'de>>>,
}

/// The parts of [`LenientVal`] only tool and function calls have.
#[derive(Default)]
struct CallVal<'de> {
    name: Option<Cow<'de, str>>,
    arguments: Option<Cow<'de, str>>,
    calls: Vec<CallPiece<'de>>,
}

impl<'de> LenientVal<'de> {
    /// The call's parts, made when first needed.
    fn call(&mut self) -> &mut CallVal<'de> {
        self.call.get_or_insert_with(Default::default)
    }

    /// (name, arguments) of a tool or function call.
    fn name_and_arguments(self) -> [Option<Cow<'de, str>>; 2] {
        self.call.map_or([None, None], |c| [c.name, c.arguments])
    }
}

impl LenientVal<'_> {
    fn flag(non_empty: bool) -> Self {
        LenientVal {
            non_empty,
            ..Default::default()
        }
    }
}

impl<'de> DeserializeSeed<'de> for Lenient {
    type Value = LenientVal<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Lenient {
    type Value = LenientVal<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(LenientVal {
            text: matches!(self, Lenient::Text(true)).then_some(Cow::Borrowed(v)),
            ..LenientVal::flag(!v.is_empty())
        })
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LenientVal {
            text: matches!(self, Lenient::Text(true)).then(|| Cow::Owned(v.to_owned())),
            ..LenientVal::flag(!v.is_empty())
        })
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(v))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(true))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(LenientVal {
            index: v,
            ..LenientVal::flag(true)
        })
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(true))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(false))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(false))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut v = LenientVal::default();
        match self {
            Lenient::ToolCalls(collect) => {
                while let Some(mut call) = seq.next_element_seed(Lenient::ToolCall(collect))? {
                    v.non_empty = true;
                    if collect {
                        let index = call.indexed.then_some(call.index);
                        let id = call.text.take();
                        let [name, arguments] = call.name_and_arguments();
                        v.call().calls.push(CallPiece {
                            index,
                            id,
                            name,
                            arguments,
                        });
                    }
                }
            }
            _ => {
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    v.non_empty = true;
                }
            }
        }
        Ok(v)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut v = LenientVal::flag(true);
        let (names, collect): (&'static [&'static str], bool) = match self {
            Lenient::Content(c) => (&["content"], c),
            Lenient::ToolCall(c) => (&["function", "index", "id"], c),
            Lenient::FunctionCall(c) => (&["name", "arguments"], c),
            Lenient::Text(_) | Lenient::Index | Lenient::ToolCalls(_) => (&[], false),
        };
        // The last of a repeated key counts, as in a tree.
        let mut name = None;
        let mut arguments = None;
        while let Some(key) = map.next_key_seed(Field(names))? {
            match (self, key) {
                (Lenient::Content(_), Some(_)) => {
                    v.text = map.next_value_seed(Lenient::Text(collect))?.text
                }
                (Lenient::ToolCall(_), Some(0)) => {
                    let f = map.next_value_seed(Lenient::FunctionCall(collect))?;
                    let [name, arguments] = f.name_and_arguments();
                    if name.is_some() || arguments.is_some() {
                        let c = v.call();
                        (c.name, c.arguments) = (name, arguments);
                    } else if let Some(c) = v.call.as_mut() {
                        (c.name, c.arguments) = (None, None);
                    }
                }
                (Lenient::ToolCall(_), Some(1)) => {
                    v.index = map.next_value_seed(Lenient::Index)?.index;
                    v.indexed = true;
                }
                (Lenient::ToolCall(_), Some(_)) => {
                    v.text = map.next_value_seed(Lenient::Text(collect))?.text
                }
                (Lenient::FunctionCall(_), Some(0)) => {
                    name = map.next_value_seed(Lenient::Text(collect))?.text
                }
                (Lenient::FunctionCall(_), Some(_)) => {
                    arguments = map.next_value_seed(Lenient::Text(collect))?.text
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if matches!(self, Lenient::FunctionCall(_)) && (name.is_some() || arguments.is_some()) {
            let c = v.call();
            (c.name, c.arguments) = (name, arguments);
        }
        Ok(v)
    }
}

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

fn push_choice_text(choice: &serde_json::Value, inner: &str, out: &mut String) {
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
    fn of(id: Option<&str>, name: Option<&str>, arguments: Option<&serde_json::Value>) -> Self {
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
            let answer = v
                .pointer("/choices/0/message/content")
                .or_else(|| v.pointer("/choices/0/text"))
                .and_then(|s| s.as_str())
                .unwrap_or("")
                .to_string();
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

#[cfg(test)]
mod tests {
    use super::*;

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
