//! Observing an OpenAI-style SSE response as it streams through, and removing what the
//! proxy itself caused (injected usage) so the client sees the upstream's bytes as they would
//! have been without the proxy.
//!
//! [`StreamObserver::observe`] takes each response frame with the one timestamp taken for it
//! and hands back the bytes to forward: the frame itself (a refcounted `Bytes`, no copy) when
//! nothing is stripped, or slices of it around what is cut. It records the chunk times
//! (offsets from t0, µs), cumulative usage and stream state in vectors owned by the record, so
//! the per-chunk path takes no lock and allocates nothing once those vectors have grown.
//!
//! # Stripping (only when the proxy injected usage)
//! Events are framed on raw bytes (blank-line terminated; CRLF, LF or CR). Each complete event
//! is classified with [`wire::sse::classify`]:
//! - a usage-only event (`choices` empty, `usage` set) is dropped whole when
//!   [`Strip::usage_events`] (we injected `stream_options.include_usage`): vLLM's and OpenAI's
//!   final `{"choices":[],"usage":{...}}` event, so `data: [DONE]` follows the last chunk as
//!   it would have;
//! - in a chunk, the top-level `"usage"` member (an object with vLLM's
//!   `continuous_usage_stats`, `null` in OpenAI's chunks under `include_usage`) is cut out
//!   byte-exactly when [`Strip::chunk_usage`]: from the end of the previous member's value to
//!   the end of the usage value, so `…]},"usage":{…}}` becomes `…]}}` with every other byte
//!   untouched. An event whose JSON spans several `data:` lines is forwarded untouched.
//!
//! While stripping, an event is forwarded when its terminating blank line has arrived: bytes
//! of an unfinished event are held (an SSE client cannot act on them before that anyway).
//! vLLM, SGLang and OpenAI write whole events per frame, so nothing is held in practice.
//!
//! # Memory
//! At most `max_event` bytes of one event are held (by the stripping path and by the
//! parser): an event that grows past that is forwarded as it arrives, untouched, neither
//! classified nor stripped, and counted ([`StreamObserver::oversized_events`]). One client's
//! stream cannot make the proxy hold more than that, however long its server writes
//! without a blank line.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use wire::api::Api;
use wire::response_verdict::StreamTally;
use wire::sse::{read_event_of, ChunkText, SseParser, StreamEvent, DEFAULT_MAX_EVENT};

use crate::linking::agents::CallsSeen;
use crate::linking::sessions::TextHash;
use crate::recording::jsonscan::member_removal_range;

/// What to remove from a stream because the proxy injected it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Strip {
    /// Drop usage-only events (the proxy added `stream_options.include_usage`).
    pub usage_events: bool,
    /// Cut the top-level `usage` member out of chunks (the proxy added usage to chunks).
    pub chunk_usage: bool,
}

impl Strip {
    /// True when anything is stripped.
    pub fn any(self) -> bool {
        self.usage_events || self.chunk_usage
    }
}

/// Observes one SSE response; one per response.
#[derive(Debug, Default)]
pub struct StreamObserver {
    parser: SseParser,
    strip: Strip,
    /// Bytes of an unfinished raw event from earlier frames (stripping only).
    pending: BytesMut,
    /// Most bytes of one event held.
    max_event: usize,
    /// Inside an event that outgrew `max_event`: forwarding it untouched to its end
    /// (stripping only).
    passing: bool,
    /// Events forwarded unobserved for their size (stripping only; the parser counts its
    /// own otherwise).
    oversized: u64,
    /// The current raw line has content (stripping only).
    line_has_content: bool,
    /// The previous frame ended in CR: a leading LF in the next one belongs to it.
    cr_pending: bool,
    /// That CR ended an event: `Some(dropped)`. Its LF then goes with it (forwarded alone,
    /// or dropped); otherwise the LF belongs to the event in progress.
    cr_event_end: Option<bool>,
    /// The API whose events the stream carries ([`StreamObserver::set_api`]; None: chat).
    api: Option<Api>,
    /// The text of the event being read (a buffer reused from event to event).
    text_buf: ChunkText,
    /// What the stream said, event by event (chunk times, usage, `[DONE]`, error events),
    /// as replay's client records it too: read through the observer (`Deref`).
    tally: StreamTally,
    /// Bytes handed back for the client.
    pub bytes_out: u64,
    /// Events dropped or cut by stripping.
    pub stripped: u64,
    /// The generated text so far (see [`StreamObserver::keep_output_text`]): what the
    /// tokenizer counts when the upstream sends no usage. None when not kept, or once it
    /// passed [`OUTPUT_TEXT_CAP`].
    pub output_text: Option<String>,
    /// The reasoning text so far, kept with the output text (same bound): what the
    /// tokenizer counts as reasoning tokens when the upstream reports none.
    pub reasoning_text: Option<String>,
    /// The hash of the answer so far (see [`StreamObserver::keep_answer_hash`]): what session
    /// linking needs of the answer, without its text.
    pub answer: Option<TextHash>,
    /// The first choice's tool calls so far (see [`StreamObserver::keep_tool_calls`]).
    pub calls: Option<CallsSeen>,
}

/// Most generated text kept per stream for counting, bytes (~250k tokens): past it the text
/// is dropped and the row has no output token count unless the upstream sent usage.
pub const OUTPUT_TEXT_CAP: usize = 1 << 20;

/// What to do with one complete raw event.
enum Action {
    Forward,
    Drop,
    Cut(usize, usize),
}

impl StreamObserver {
    /// An observer that strips what `strip` says; `chunk_capacity` pre-sizes the chunk vector
    /// (e.g. from `max_tokens`) so it rarely grows on the per-chunk path.
    pub fn new(strip: Strip, chunk_capacity: usize) -> Self {
        Self::with_max_event(strip, chunk_capacity, DEFAULT_MAX_EVENT)
    }

    /// [`StreamObserver::new`] holding at most `max_event` bytes of one event.
    pub fn with_max_event(strip: Strip, chunk_capacity: usize, max_event: usize) -> Self {
        let max_event = max_event.max(1);
        StreamObserver {
            strip,
            parser: SseParser::with_max_event(max_event),
            max_event,
            tally: StreamTally::with_capacity(chunk_capacity),
            line_has_content: false,
            ..Default::default()
        }
    }

    /// Read the stream's events as `api`'s ([`wire::sse::read_event_of`]: Responses and
    /// Messages streams are typed events); chat's chunks by default.
    pub fn set_api(&mut self, api: Api) {
        self.api = Some(api);
    }

    /// Keep the generated text of output chunks (bounded by [`OUTPUT_TEXT_CAP`]).
    pub fn keep_output_text(&mut self) {
        self.output_text = Some(String::new());
        self.reasoning_text = Some(String::new());
    }

    /// Hash the answer's content as it streams ([`crate::linking::sessions::push_answer_text`]), for
    /// session linking; no text is kept for it.
    pub fn keep_answer_hash(&mut self) {
        self.answer = Some(TextHash::default());
    }

    /// Gather the first choice's tool calls as they stream (ids, names, arguments up to
    /// [`crate::linking::agents::ARGS_CAP`] a call), for the tool columns and agent linking.
    pub fn keep_tool_calls(&mut self) {
        self.calls = Some(CallsSeen::default());
    }

    /// Observes one frame received `t_us` after t0 and pushes the bytes to forward onto `out`
    /// (the frame itself when nothing is stripped).
    pub fn observe(&mut self, t_us: i64, frame: Bytes, out: &mut VecDeque<Bytes>) {
        if !self.strip.any() {
            self.feed_noting(&frame, t_us, |_| {});
            self.bytes_out += frame.len() as u64;
            out.push_back(frame);
            return;
        }
        self.observe_stripping(t_us, frame, out);
    }

    /// The stream ended: hands back any held bytes of an unfinished event, untouched.
    pub fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        if !self.pending.is_empty() {
            let rest = self.pending.split().freeze();
            self.parser.feed(&rest, |_| {});
            self.bytes_out += rest.len() as u64;
            out.push_back(rest);
        }
    }

    /// True when the stream ended inside an event.
    pub fn has_partial(&self) -> bool {
        self.parser.has_partial() || !self.pending.is_empty() || self.passing
    }

    /// Events too large to observe, forwarded untouched as they arrived.
    pub fn oversized_events(&self) -> u64 {
        if self.strip.any() {
            self.oversized
        } else {
            self.parser.oversized_events()
        }
    }

    /// Forwards `bytes` of an event passed through unobserved (the parser still sees them,
    /// to stay in step; it holds none of an oversized event).
    fn pass(&mut self, bytes: Bytes, out: &mut VecDeque<Bytes>) {
        if bytes.is_empty() {
            return;
        }
        self.parser.feed(&bytes, |_| {});
        self.bytes_out += bytes.len() as u64;
        out.push_back(bytes);
    }

    fn observe_stripping(&mut self, t_us: i64, frame: Bytes, out: &mut VecDeque<Bytes>) {
        let buf: &[u8] = &frame;
        let mut i = 0usize;
        let mut event_start = 0usize;
        if self.cr_pending {
            self.cr_pending = false;
            if buf.first() == Some(&b'\n') {
                i = 1;
                if let Some(dropped) = self.cr_event_end {
                    // The LF of the CRLF that ended the previous event goes with that event.
                    self.parser.feed(b"\n", |_| {});
                    event_start = 1;
                    if !dropped {
                        self.bytes_out += 1;
                        out.push_back(frame.slice(..1));
                    }
                }
            }
        }
        self.cr_event_end = None;
        while i < buf.len() {
            let Some(j) = memchr::memchr2(b'\n', b'\r', &buf[i..]) else {
                self.line_has_content = true;
                break;
            };
            let at = i + j;
            if j > 0 {
                self.line_has_content = true;
            }
            let end = if buf[at] == b'\r' {
                match buf.get(at + 1) {
                    Some(b'\n') => at + 2,
                    Some(_) => at + 1,
                    None => {
                        self.cr_pending = true;
                        at + 1
                    }
                }
            } else {
                at + 1
            };
            i = end;
            if self.line_has_content {
                self.line_has_content = false;
                continue;
            }
            // An empty line: the raw event ends here.
            if self.passing {
                // The end of an oversized event: forwarded as the rest of it was.
                self.passing = false;
                self.pass(frame.slice(event_start..end), out);
                event_start = end;
                if self.cr_pending {
                    self.cr_event_end = Some(false);
                }
                continue;
            }
            let raw = if self.pending.is_empty() {
                frame.slice(event_start..end)
            } else {
                self.pending.extend_from_slice(&buf[event_start..end]);
                self.pending.split().freeze()
            };
            event_start = end;
            let action = self.decide(t_us, &raw);
            if self.cr_pending {
                self.cr_event_end = Some(matches!(action, Action::Drop));
            }
            match action {
                Action::Forward => {
                    self.bytes_out += raw.len() as u64;
                    out.push_back(raw);
                }
                Action::Drop => {
                    self.stripped += 1;
                }
                Action::Cut(a, b) => {
                    self.stripped += 1;
                    self.bytes_out += (raw.len() - (b - a)) as u64;
                    out.push_back(raw.slice(..a));
                    out.push_back(raw.slice(b..));
                }
            }
        }
        if event_start < buf.len() {
            let rest = buf.len() - event_start;
            if !self.passing && self.pending.len() + rest > self.max_event {
                // Too large to hold: from here on it goes out as it arrives.
                self.passing = true;
                self.oversized += 1;
                let held = std::mem::take(&mut self.pending).freeze();
                self.pass(held, out);
            }
            if self.passing {
                self.pass(frame.slice(event_start..), out);
            } else {
                self.pending.extend_from_slice(&buf[event_start..]);
            }
        }
    }

    /// Feeds `bytes` (received `t_us` after t0) to the parser and records what each complete
    /// event says, after `on_kind` has seen it: one parse per event, its text read into the
    /// reused buffer when output text or the answer's hash is kept.
    fn feed_noting(&mut self, bytes: &[u8], t_us: i64, mut on_kind: impl FnMut(&StreamEvent)) {
        let Self {
            parser,
            api,
            tally,
            output_text,
            reasoning_text,
            answer,
            calls,
            text_buf,
            ..
        } = self;
        let api = api.unwrap_or(Api::Chat);
        let keep = output_text.is_some()
            || reasoning_text.is_some()
            || answer.is_some()
            || calls.is_some();
        parser.feed(bytes, |ev| {
            let kind = read_event_of(api, ev, keep.then_some(&mut *text_buf));
            on_kind(&kind);
            if tally.note(t_us, kind) {
                keep_text(text_buf, [output_text, reasoning_text], answer);
                if let Some(c) = calls.as_mut() {
                    text_buf.tool_calls().for_each(|p| c.piece(p));
                }
            }
        });
    }

    /// Classifies one complete raw event (recording what it says) and decides its fate.
    fn decide(&mut self, t_us: i64, raw: &[u8]) -> Action {
        if raw.len() > self.max_event {
            // Arrived whole in one frame, but over the bound all the same: not observed.
            self.parser.feed(raw, |_| {});
            self.oversized += 1;
            return Action::Forward;
        }
        let strip = self.strip;
        let mut action = Action::Forward; // no data: comments, blank lines
        self.feed_noting(raw, t_us, |kind| {
            action = match kind {
                StreamEvent::Usage(_) if strip.usage_events => Action::Drop,
                StreamEvent::Chunk { .. } if strip.chunk_usage => usage_cut(raw),
                _ => Action::Forward,
            };
        });
        action
    }
}

/// Where the top-level `usage` member of a one-line `data:` event is, as a cut of `raw`.
fn usage_cut(raw: &[u8]) -> Action {
    let Some(rest) = raw.strip_prefix(b"data:") else {
        return Action::Forward;
    };
    let mut start = raw.len() - rest.len();
    if raw.get(start) == Some(&b' ') {
        start += 1;
    }
    // The scanner compares raw key bytes: without them there is nothing to cut (most chunks
    // of a server that sends usage only at the end), and one SIMD search saves the walk.
    if memchr::memmem::find(&raw[start..], b"\"usage\"").is_none() {
        return Action::Forward;
    }
    match member_removal_range(raw, start, b"usage") {
        Some((a, b)) => Action::Cut(a, b),
        None => Action::Forward,
    }
}

/// Keeps the text of an output chunk: its generated text and its reasoning (each up to
/// [`OUTPUT_TEXT_CAP`]) and its answer's hash, when kept.
fn keep_text(
    text: &ChunkText,
    [output_text, reasoning_text]: [&mut Option<String>; 2],
    answer: &mut Option<TextHash>,
) {
    for (kept, piece) in [
        (output_text, &text.output),
        (reasoning_text, &text.reasoning),
    ] {
        if let Some(out) = kept.as_mut() {
            out.push_str(piece);
            if out.len() > OUTPUT_TEXT_CAP {
                *kept = None;
            }
        }
    }
    if let Some(h) = answer.as_mut() {
        h.push(&text.answer);
    }
}

impl std::ops::Deref for StreamObserver {
    type Target = StreamTally;
    fn deref(&self) -> &StreamTally {
        &self.tally
    }
}

impl std::ops::DerefMut for StreamObserver {
    fn deref_mut(&mut self) -> &mut StreamTally {
        &mut self.tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strip: Strip, pieces: &[&[u8]]) -> (Vec<u8>, StreamObserver) {
        let mut o = StreamObserver::new(strip, 8);
        let mut q = VecDeque::new();
        for (n, p) in pieces.iter().enumerate() {
            o.observe(n as i64, Bytes::copy_from_slice(p), &mut q);
        }
        o.finish(&mut q);
        let out: Vec<u8> = q.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(out.len() as u64, o.bytes_out);
        (out, o)
    }

    const VLLM_USAGE: &[u8] = b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\" a\"}],\"usage\":{\"prompt_tokens\":3,\"total_tokens\":4,\"completion_tokens\":1}}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\" b\"}],\"usage\":{\"prompt_tokens\":3,\"total_tokens\":5,\"completion_tokens\":2}}\n\n\
data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"total_tokens\":5,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";
    const VLLM_PLAIN: &[u8] =
        b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\" a\"}]}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\" b\"}]}\n\n\
data: [DONE]\n\n";

    #[test]
    fn passes_through_when_not_stripping() {
        let (out, o) = run(Strip::default(), &[VLLM_USAGE]);
        assert_eq!(out, VLLM_USAGE);
        assert_eq!(o.chunk_times_us.len(), 2);
        assert_eq!(o.cumulative_tokens, vec![1, 2]);
        assert!(o.done);
    }

    #[test]
    fn strips_injected_usage_byte_exactly_at_any_split() {
        let strip = Strip {
            usage_events: true,
            chunk_usage: true,
        };
        for cut in 0..VLLM_USAGE.len() {
            let (a, b) = VLLM_USAGE.split_at(cut);
            let (out, o) = run(strip, &[a, b]);
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(VLLM_PLAIN),
                "cut at {cut}"
            );
            assert_eq!(o.cumulative_tokens, vec![1, 2]);
            assert_eq!(o.usage.and_then(|u| u.completion_tokens), Some(2));
            assert!(o.done);
        }
    }

    /// An event over the bound goes out as it arrives (byte-exact, unstripped), nothing of
    /// it is held, and the events around it are still stripped.
    #[test]
    fn an_oversized_event_is_forwarded_as_it_arrives() {
        let strip = Strip {
            usage_events: true,
            chunk_usage: true,
        };
        let big = format!(
            "data: {{\"choices\":[{{\"text\":\"{}\"}}],\"usage\":{{\"completion_tokens\":9}}}}\n\n",
            "x".repeat(3000)
        );
        let mut stream = VLLM_USAGE[..VLLM_USAGE.len() - 14].to_vec();
        stream.extend_from_slice(big.as_bytes());
        stream.extend_from_slice(b"data: [DONE]\n\n");
        let mut want = VLLM_PLAIN[..VLLM_PLAIN.len() - 14].to_vec();
        want.extend_from_slice(big.as_bytes());
        want.extend_from_slice(b"data: [DONE]\n\n");
        for piece in [1usize, 5, 64, 1000, stream.len()] {
            let mut o = StreamObserver::with_max_event(strip, 8, 512);
            let mut q = VecDeque::new();
            let mut out = Vec::new();
            for (n, p) in stream.chunks(piece).enumerate() {
                o.observe(n as i64, Bytes::copy_from_slice(p), &mut q);
                assert!(
                    o.pending.len() <= 512,
                    "piece {piece}: held {}",
                    o.pending.len()
                );
                out.extend(q.drain(..).flat_map(|b| b.to_vec()));
            }
            o.finish(&mut q);
            out.extend(q.drain(..).flat_map(|b| b.to_vec()));
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "piece {piece}"
            );
            assert_eq!(o.oversized_events(), 1, "piece {piece}");
            assert_eq!(
                o.chunk_times_us.len(),
                2,
                "the oversized chunk is not observed"
            );
            assert!(o.done);
        }
    }

    #[test]
    fn crlf_events_drop_cleanly() {
        let s = b"data: {\"choices\":[{\"t\":1}]}\r\n\r\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\r\n\r\ndata: [DONE]\r\n\r\n";
        let want = b"data: {\"choices\":[{\"t\":1}]}\r\n\r\ndata: [DONE]\r\n\r\n";
        let strip = Strip {
            usage_events: true,
            chunk_usage: false,
        };
        for cut in 0..s.len() {
            let (a, b) = s.split_at(cut);
            let (out, _) = run(strip, &[a, b]);
            assert_eq!(out, want, "cut at {cut}");
        }
    }
}
