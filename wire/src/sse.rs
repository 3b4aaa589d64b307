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

use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;

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
pub struct Usage {
    /// `usage.prompt_tokens`.
    #[serde(default)]
    pub prompt_tokens: Option<i64>,
    /// `usage.completion_tokens`.
    #[serde(default)]
    pub completion_tokens: Option<i64>,
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
    },
    /// A usage-only event (`choices` empty or absent, `usage` present).
    Usage(Usage),
    /// `[DONE]`.
    Done,
    /// An error object sent in the stream (`{"error": ...}`), with its message.
    Error(String),
    /// Valid JSON that is none of the above (e.g. empty `choices` without usage).
    Other,
    /// Not JSON.
    Invalid,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default, deserialize_with = "scan_choices")]
    choices: Option<Choices>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// What a `choices` array holds: how many, and whether any carries output.
#[derive(Debug, Clone, Copy, Default)]
struct Choices {
    count: usize,
    output: bool,
}

/// The fields of a choice that carry generated output, each read only as "present and not
/// empty" (no string is copied).
#[derive(Deserialize)]
struct RawChoice {
    #[serde(default, deserialize_with = "non_empty")]
    text: bool,
    #[serde(default)]
    delta: Option<RawDelta>,
}

#[derive(Deserialize)]
struct RawDelta {
    #[serde(default, deserialize_with = "non_empty")]
    content: bool,
    #[serde(default, deserialize_with = "non_empty")]
    reasoning_content: bool,
    #[serde(default, deserialize_with = "non_empty")]
    reasoning: bool,
    #[serde(default, deserialize_with = "non_empty")]
    tool_calls: bool,
    #[serde(default, deserialize_with = "non_empty")]
    function_call: bool,
}

impl RawChoice {
    fn output(&self) -> bool {
        self.text
            || self.delta.as_ref().is_some_and(|d| {
                d.content || d.reasoning_content || d.reasoning || d.tool_calls || d.function_call
            })
    }
}

/// A value that is there and not empty: a non-empty string or array, an object, a number or
/// `true`; `null`, `""`, `[]` and `false` are empty.
fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct NonEmpty;
    impl<'de> Visitor<'de> for NonEmpty {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_str<E>(self, v: &str) -> Result<bool, E> {
            Ok(!v.is_empty())
        }
        fn visit_bool<E>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
            Ok(true)
        }
        fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
            Ok(true)
        }
        fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
            Ok(true)
        }
        fn visit_unit<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_none<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
            let mut any = false;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                any = true;
            }
            Ok(any)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(true)
        }
    }
    d.deserialize_any(NonEmpty)
}

fn scan_choices<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Choices>, D::Error> {
    struct Scan;
    impl<'de> Visitor<'de> for Scan {
        type Value = Option<Choices>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array or null")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut c = Choices::default();
            while let Some(choice) = seq.next_element::<RawChoice>()? {
                c.count += 1;
                c.output |= choice.output();
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
    d.deserialize_any(Scan)
}

/// Classifies one SSE `data` payload.
pub fn classify(data: &[u8]) -> StreamEvent {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return StreamEvent::Done;
    }
    match serde_json::from_slice::<RawEvent>(trimmed) {
        Err(_) => StreamEvent::Invalid,
        Ok(RawEvent { error: Some(e), .. }) => StreamEvent::Error(error_message(&e)),
        Ok(RawEvent {
            choices: Some(c),
            usage,
            ..
        }) if c.count > 0 => StreamEvent::Chunk {
            usage,
            output: c.output,
        },
        Ok(RawEvent { usage: Some(u), .. }) => StreamEvent::Usage(u),
        Ok(_) => StreamEvent::Other,
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

/// Appends the generated text one streamed chunk carries (`data` is its SSE payload) to
/// `out`: completions `text`, chat `delta.content`, reasoning (`reasoning_content`,
/// `reasoning`) and tool-call arguments, over every choice — what a tokenizer counts when
/// the server sends no `usage`. Returns whether the payload was a JSON object.
pub fn append_output_text(data: &[u8], out: &mut String) -> bool {
    match serde_json::from_slice::<serde_json::Value>(data.trim_ascii()) {
        Ok(v) => {
            append_chunk_output_text(&v, out);
            v.is_object()
        }
        Err(_) => false,
    }
}

/// [`append_output_text`] of a payload already parsed.
pub fn append_chunk_output_text(v: &serde_json::Value, out: &mut String) {
    for c in v
        .get("choices")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
    {
        push_choice_text(c, "delta", out);
    }
}

/// The generated text of a whole (non-streamed) OpenAI response: `choices[].text` or
/// `choices[].message` (content, reasoning, tool-call arguments). None when the body is not
/// JSON.
pub fn response_text(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut out = String::new();
    for c in v
        .get("choices")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
    {
        push_choice_text(c, "message", &mut out);
    }
    Some(out)
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
        let mut t = String::new();
        assert!(append_output_text(
            br#"{"choices":[{"text":"Hel"}]}"#,
            &mut t
        ));
        append_output_text(
            br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            &mut t,
        );
        append_output_text(br#"{"choices":[{"delta":{"content":"lo"}}]}"#, &mut t);
        append_output_text(
            br#"{"choices":[{"delta":{"reasoning_content":" why"}}]}"#,
            &mut t,
        );
        append_output_text(
            br#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}"#,
            &mut t,
        );
        assert!(!append_output_text(b"[DONE]", &mut t));
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
                output: false
            }
        );
        let with_usage = br#"{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
        assert_eq!(
            classify(with_usage),
            StreamEvent::Chunk {
                usage: Some(Usage {
                    prompt_tokens: Some(3),
                    completion_tokens: Some(2)
                }),
                output: true
            }
        );
        let usage_only = br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#;
        assert_eq!(
            classify(usage_only),
            StreamEvent::Usage(Usage {
                prompt_tokens: Some(3),
                completion_tokens: Some(7)
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
