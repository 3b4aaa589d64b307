//! The one response verdict capture and replay share: what became of a response (its
//! outcome), the error text, its usage and the tokens of each output chunk, from its status,
//! what was observed of its body and how the body ended. The fidelity report compares exactly
//! these between a capture and its replay, so both sides judge with this one code.
//!
//! A stream is observed event by event into a [`StreamTally`] ([`StreamTally::note`], on the
//! per-chunk path: no allocation beyond its vectors' growth); a whole (non-streamed) body is
//! read to its end and judged from the bytes kept of it. [`judge_stream`] and [`judge_whole`]
//! then give the [`Verdict`]. How the body ended ([`End`]) is worded by the side that saw it
//! (capture: the client went away, the upstream's idle timeout; replay: the recorded
//! cancellation, the request timeout). The one thing the two sides word differently, an
//! HTTP error's text, is an explicit input of [`judge_whole`] ([`Rules`]).
//!
//! The outcomes are the trace's (`trace-format`'s `Outcome` converts from [`Outcome`] variant
//! by variant), so the names written to traces and read by its outcome taxonomy do not change.

use crate::api::Api;
use crate::sse::{error_message, read_whole, StreamEvent, Usage};

/// What became of a request: the trace's outcomes, variant for variant (trace-format's
/// `Outcome` converts from it and a test there holds the two together); here, what the
/// verdict gives each for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A 2xx whose body ended as it should.
    Ok,
    /// Any other status.
    HttpError,
    /// [`End::Broken`]; an error event or no `[DONE]` in a stream; a 2xx that is not what
    /// was asked for (see [`judge_whole`] and [`judge_stream`]).
    UpstreamError,
    /// [`End::Cancelled`].
    ClientCancelled,
    /// [`End::TimedOut`].
    Timeout,
}

/// How a response's body ended, with the error text of an end other than its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The body ended where its framing says (or the stream's connection closed it).
    Complete,
    /// The connection failed mid-body: `upstream_error`.
    Broken(String),
    /// A timeout passed first: `timeout`.
    TimedOut(String),
    /// The client cancelled (capture: it went away; replay: at the recorded point):
    /// `client_cancelled`.
    Cancelled(String),
}

impl End {
    /// The outcome and error text of an end that is not the body's own.
    fn failure(self) -> Option<(Outcome, String)> {
        match self {
            End::Complete => None,
            End::Broken(e) => Some((Outcome::UpstreamError, e)),
            End::TimedOut(e) => Some((Outcome::Timeout, e)),
            End::Cancelled(e) => Some((Outcome::ClientCancelled, e)),
        }
    }
}

/// What an HTTP error's text carries after `HTTP {status}: `.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorText {
    /// The body as sent (lossy UTF-8), all the bytes the caller kept of it.
    AsSent,
    /// The JSON error object's message, or else the first 512 bytes of the body as sent.
    Message,
}

/// What capture and replay deliberately word differently: only an error's text. Every
/// outcome is judged by one rule on both sides, so a fidelity report never reads a difference
/// of rules as drift.
///
/// A 2xx is `ok` only when it is what was asked for, on both sides (both judge only
/// generation requests, `POST …/completions`): JSON for a request not streamed (else "response
/// is not JSON"), an event stream for a streamed one (else "streamed request answered without
/// text/event-stream"), and a stream with no output chunk must have had some JSON event (else
/// "N events were not JSON"); all `upstream_error`. Capture judged such a 2xx `ok` until
/// 2026-12 (its client got a 200): the same response then read `ok` in the capture and
/// `upstream_error` in its replay, which `fidelity` called drift, and an HTML error page from a
/// gateway in front of the engine counted as served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// What an HTTP error's text says.
    pub http_error_text: ErrorText,
}

impl Rules {
    /// Capture keeps the whole error body, so its text is the error's message.
    pub const CAPTURE: Rules = Rules {
        http_error_text: ErrorText::Message,
    };
    /// Replay keeps only the first KiB of an error body (bounded memory), so its text is the
    /// body as sent.
    pub const REPLAY: Rules = Rules {
        http_error_text: ErrorText::AsSent,
    };
}

/// What a finished response is, ready for its trace row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What became of it.
    pub outcome: Outcome,
    /// Why, when it is not `ok`.
    pub error: Option<String>,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<i64>,
    /// `usage.completion_tokens` (of a stream: the last usage's, or else the last cumulative
    /// count of an output chunk).
    pub completion_tokens: Option<i64>,
    /// Tokens of each output chunk, when every output chunk carried cumulative usage.
    pub chunk_tokens: Option<Vec<i32>>,
    /// `usage.completion_tokens_details.reasoning_tokens`, when the server reported it.
    pub reasoning_tokens: Option<i64>,
    /// The part of the prompt read from the server's prefix cache, when it reported it.
    pub cached_tokens: Option<i64>,
    /// The response's id (Responses, Messages; a chat completion's too).
    pub response_id: Option<String>,
}

impl Verdict {
    fn of(outcome: Outcome, error: Option<String>) -> Verdict {
        Verdict {
            outcome,
            error,
            prompt_tokens: None,
            completion_tokens: None,
            chunk_tokens: None,
            reasoning_tokens: None,
            cached_tokens: None,
            response_id: None,
        }
    }
}

/// What one SSE response said, event by event: the per-chunk record both sides keep.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamTally {
    /// Offset from t0 of every chunk that carried generated output, µs (a role-only or
    /// empty chunk is not one: TTFT is the first output).
    pub chunk_times_us: Vec<i64>,
    /// Offset from t0 of the last chunk of any kind, µs (E2EL).
    pub last_chunk_us: Option<i64>,
    /// Offset from t0 of the first chunk carrying answer output (content, text or a call),
    /// µs: the time to first answer token (TTFAT). Equal to the first output chunk's when
    /// no reasoning came before the answer.
    pub first_answer_us: Option<i64>,
    /// Output chunks that carried reasoning only (no answer output).
    pub reasoning_chunks: usize,
    /// Cumulative `completion_tokens` of every output chunk that carried usage.
    pub cumulative_tokens: Vec<i64>,
    /// The usage seen, each report's counts over the earlier ones' (chunk, usage-only,
    /// start or final event).
    pub usage: Option<Usage>,
    /// `[DONE]` was seen, or a typed stream's final event.
    pub done: bool,
    /// The stream is typed events (a start event was seen: Responses, Messages).
    pub typed: bool,
    /// The response's id, from its start event.
    pub response_id: Option<String>,
    /// The first error event's message.
    pub stream_error: Option<String>,
    /// Events whose data was not JSON.
    pub invalid: usize,
}

impl StreamTally {
    /// A tally with room for `chunks` output chunks, so it rarely grows on the per-chunk path.
    pub fn with_capacity(chunks: usize) -> Self {
        StreamTally {
            chunk_times_us: Vec::with_capacity(chunks),
            ..Default::default()
        }
    }

    /// Notes one event received `t_us` after t0; true when it is a chunk carrying output
    /// (whose text the caller may keep).
    #[inline]
    pub fn note(&mut self, t_us: i64, event: StreamEvent) -> bool {
        match event {
            StreamEvent::Chunk {
                usage,
                output,
                answer,
            } => {
                self.last_chunk_us = Some(t_us);
                if output {
                    self.chunk_times_us.push(t_us);
                    if !answer {
                        self.reasoning_chunks += 1;
                    } else if self.first_answer_us.is_none() {
                        self.first_answer_us = Some(t_us);
                    }
                }
                if let Some(u) = usage {
                    // Tokens of a chunk without output count with the next one that has some.
                    if let (true, Some(c)) = (output, u.completion_tokens) {
                        self.cumulative_tokens.push(c);
                    }
                    self.merge_usage(u);
                }
                return output;
            }
            StreamEvent::Usage(u) => self.merge_usage(u),
            StreamEvent::Done => self.done = true,
            StreamEvent::Started { id, usage } => {
                self.typed = true;
                if self.response_id.is_none() {
                    self.response_id = id;
                }
                if let Some(u) = usage {
                    self.merge_usage(u);
                }
            }
            StreamEvent::Final(usage) => {
                self.typed = true;
                self.done = true;
                self.last_chunk_us = Some(t_us);
                if let Some(u) = usage {
                    self.merge_usage(u);
                }
            }
            StreamEvent::Error(m) => {
                self.stream_error.get_or_insert(m);
            }
            StreamEvent::Other => {}
            StreamEvent::Invalid => self.invalid += 1,
        }
        false
    }

    fn merge_usage(&mut self, u: Usage) {
        self.usage = Some(match self.usage {
            Some(before) => before.merged(u),
            None => u,
        });
    }

    /// Tokens of each output chunk: the differences of the cumulative counts, when every
    /// output chunk carried one.
    pub fn chunk_tokens(&self) -> Option<Vec<i32>> {
        let c = &self.cumulative_tokens;
        if c.is_empty() || c.len() != self.chunk_times_us.len() {
            return None;
        }
        let mut prev = 0;
        Some(
            c.iter()
                .map(|&c| {
                    let d = (c - prev).clamp(0, i64::from(i32::MAX)) as i32;
                    prev = c;
                    d
                })
                .collect(),
        )
    }
}

fn is_ok_status(status: u16) -> bool {
    (200..300).contains(&status)
}

/// The verdict on a streamed (`text/event-stream`) response with HTTP `status`, observed
/// into `tally`, that ended as `end`. Its usage and chunk tokens are kept whatever the
/// outcome: what arrived before a cut is still what the server sent.
pub fn judge_stream(status: u16, tally: &StreamTally, end: End) -> Verdict {
    let n = tally.chunk_times_us.len();
    let (outcome, error) = match end.failure() {
        Some((o, e)) => (o, Some(e)),
        None if !is_ok_status(status) => (Outcome::HttpError, Some(format!("HTTP {status}"))),
        None => match &tally.stream_error {
            Some(m) => (
                Outcome::UpstreamError,
                Some(format!("error event in stream: {m}")),
            ),
            None if !tally.done && tally.typed => (
                Outcome::UpstreamError,
                Some(format!(
                    "stream ended without its final event after {n} chunks"
                )),
            ),
            None if !tally.done => (
                Outcome::UpstreamError,
                Some(format!("stream ended without [DONE] after {n} chunks")),
            ),
            None if tally.invalid > 0 && n == 0 => (
                Outcome::UpstreamError,
                Some(format!("{} events were not JSON", tally.invalid)),
            ),
            None => (Outcome::Ok, None),
        },
    };
    let usage = tally.usage.unwrap_or_default();
    Verdict {
        outcome,
        error,
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage
            .completion_tokens
            .or_else(|| tally.cumulative_tokens.last().copied()),
        chunk_tokens: tally.chunk_tokens(),
        reasoning_tokens: usage.reasoning_tokens,
        cached_tokens: usage.cached_tokens,
        response_id: tally.response_id.clone(),
    }
}

/// The verdict on a response of `api` read whole (not an event stream) with HTTP `status`:
/// `body` is what the caller kept of it (all of a 2xx; a bounded prefix of an error),
/// `stream_asked` whether the request asked for a stream. A cut body has no usage.
pub fn judge_whole(
    api: Api,
    status: u16,
    body: &[u8],
    stream_asked: bool,
    end: End,
    rules: Rules,
) -> Verdict {
    if let Some((o, e)) = end.failure() {
        return Verdict::of(o, Some(e));
    }
    if !is_ok_status(status) {
        let text = match rules.http_error_text {
            ErrorText::AsSent => String::from_utf8_lossy(body).into_owned(),
            ErrorText::Message => serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get("error").map(error_message))
                .unwrap_or_else(|| {
                    String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned()
                }),
        };
        return Verdict::of(Outcome::HttpError, Some(format!("HTTP {status}: {text}")));
    }
    if stream_asked {
        return Verdict::of(
            Outcome::UpstreamError,
            Some("streamed request answered without text/event-stream".into()),
        );
    }
    let Some(w) = read_whole(api, body) else {
        return Verdict::of(Outcome::UpstreamError, Some("response is not JSON".into()));
    };
    let u = w.usage.unwrap_or_default();
    let (outcome, error) = match w.failed {
        Some(m) => (
            Outcome::UpstreamError,
            Some(format!("response failed: {m}")),
        ),
        None => (Outcome::Ok, None),
    };
    Verdict {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        reasoning_tokens: u.reasoning_tokens,
        cached_tokens: u.cached_tokens,
        response_id: w.id,
        ..Verdict::of(outcome, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{read_event, SseParser};

    /// A stream's tally, fed as capture and replay feed it: parsed event by event, each
    /// event stamped with its position.
    fn tally(stream: &str) -> StreamTally {
        let mut parser = SseParser::new();
        let mut t = StreamTally::with_capacity(4);
        let mut at = 0;
        parser.feed(stream.as_bytes(), |ev| {
            at += 10;
            t.note(at, read_event(ev, None));
        });
        t
    }

    fn both(f: impl Fn(Rules) -> Verdict) -> (Verdict, Verdict) {
        (f(Rules::CAPTURE), f(Rules::REPLAY))
    }

    const CHAT_USAGE: &str = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":0}}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n\
data: {\"choices\":[{\"delta\":{}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":5}}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":5}}\n\n\
data: [DONE]\n\n";

    /// A complete stream with cumulative usage: ok; role-only and empty chunks are no output
    /// chunks (but the last chunk of any kind is E2EL's); tokens per output chunk.
    #[test]
    fn ok_stream_with_role_only_and_empty_chunks() {
        let t = tally(CHAT_USAGE);
        assert_eq!(t.chunk_times_us, vec![20, 40]);
        assert_eq!(t.last_chunk_us, Some(40));
        assert!(t.done);
        let c = judge_stream(200, &t, End::Complete);
        assert_eq!(
            c,
            Verdict {
                outcome: Outcome::Ok,
                error: None,
                prompt_tokens: Some(5),
                completion_tokens: Some(5),
                chunk_tokens: Some(vec![2, 3]),
                reasoning_tokens: None,
                cached_tokens: None,
                response_id: None,
            }
        );
        assert_eq!((t.first_answer_us, t.reasoning_chunks), (Some(20), 0));
    }

    /// A reasoning model's stream: reasoning chunks are output (TTFT is the first of them),
    /// the answer starts later (TTFAT), and the reasoning tokens come from the usage's
    /// details; a stream cut before any answer has no answer time.
    #[test]
    fn reasoning_before_the_answer() {
        let stream = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"Let\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"reasoning_content\":\" me think\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"4\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\".\"}}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":6,\"completion_tokens_details\":{\"reasoning_tokens\":4}}}\n\n\
data: [DONE]\n\n";
        let t = tally(stream);
        assert_eq!(t.chunk_times_us, vec![20, 30, 40, 50]);
        assert_eq!((t.first_answer_us, t.reasoning_chunks), (Some(40), 2));
        let c = judge_stream(200, &t, End::Complete);
        assert_eq!(
            (c.completion_tokens, c.reasoning_tokens),
            (Some(6), Some(4))
        );
        let cut = stream
            .split("data: {\"choices\":[{\"delta\":{\"content")
            .next()
            .unwrap();
        let t = tally(cut);
        assert_eq!((t.first_answer_us, t.reasoning_chunks), (None, 2));
    }

    /// Without usage nothing is counted here (the callers count the text); with usage only
    /// in the last (usage-only) event there are no per-chunk tokens but the totals are.
    #[test]
    fn no_usage_and_a_usage_only_last_event() {
        let plain = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n";
        let v = judge_stream(200, &tally(plain), End::Complete);
        assert_eq!(v, Verdict::of(Outcome::Ok, None));
        let last = plain.replace(
            "data: [DONE]",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]",
        );
        let c = judge_stream(200, &tally(&last), End::Complete);
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(3), Some(2)));
        assert_eq!(c.chunk_tokens, None, "no output chunk carried usage");
        assert_eq!(c.outcome, Outcome::Ok);
    }

    /// A last usage without `completion_tokens` leaves the last cumulative count standing.
    #[test]
    fn completion_tokens_fall_back_to_the_last_cumulative_count() {
        let s = "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"completion_tokens\":1}}\n\n\
data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"completion_tokens\":2}}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n";
        let c = judge_stream(200, &tally(s), End::Complete);
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(3), Some(2)));
        assert_eq!(c.chunk_tokens, Some(vec![1, 1]));
    }

    /// A stream without `[DONE]`, or with an error event, is the server's failure; so is a
    /// stream cut by the connection. What arrived before still counts.
    #[test]
    fn missing_done_error_events_and_cut_streams() {
        let no_done = CHAT_USAGE.replace("data: [DONE]\n\n", "");
        let c = judge_stream(200, &tally(&no_done), End::Complete);
        assert_eq!(c.outcome, Outcome::UpstreamError);
        assert_eq!(
            c.error.as_deref(),
            Some("stream ended without [DONE] after 2 chunks")
        );
        assert_eq!(c.chunk_tokens, Some(vec![2, 3]));

        let err = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\ndata: [DONE]\n\n";
        let c = judge_stream(200, &tally(err), End::Complete);
        assert_eq!(c.outcome, Outcome::UpstreamError);
        assert_eq!(
            c.error.as_deref(),
            Some("error event in stream: overloaded")
        );

        let cut = &CHAT_USAGE[..CHAT_USAGE
            .find("data: {\"choices\":[{\"delta\":{}}]}")
            .unwrap()];
        let t = tally(cut);
        let c = judge_stream(
            200,
            &t,
            End::Broken("stream broken after 1 chunks: reset".into()),
        );
        assert_eq!(c.outcome, Outcome::UpstreamError);
        assert_eq!(
            c.error.as_deref(),
            Some("stream broken after 1 chunks: reset")
        );
        assert_eq!(
            (c.completion_tokens, c.chunk_tokens),
            (Some(2), Some(vec![2]))
        );
    }

    /// A client's cancellation and a timeout take the outcome and text of their end, over
    /// anything the stream said (here: no [DONE] yet), for a stream and a whole body alike.
    #[test]
    fn cancellation_and_timeout_take_their_end() {
        let t =
            tally("data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"completion_tokens\":1}}\n\n");
        for (end, outcome) in [
            (
                End::Cancelled("client disconnected".into()),
                Outcome::ClientCancelled,
            ),
            (End::TimedOut("no data for 1s".into()), Outcome::Timeout),
        ] {
            let c = judge_stream(200, &t, end.clone());
            assert_eq!(
                (c.outcome, c.error.clone()),
                (outcome, end.clone().failure().map(|f| f.1))
            );
            assert_eq!(c.chunk_tokens, Some(vec![1]));
            let (c, r) = both(|rules| {
                judge_whole(Api::Chat, 200, b"{\"usage\":{", false, end.clone(), rules)
            });
            assert_eq!(c, r);
            assert_eq!(c, Verdict::of(outcome, end.clone().failure().map(|f| f.1)));
        }
    }

    /// A non-2xx status is an HTTP error, whatever the body (an event stream too).
    #[test]
    fn http_errors_with_json_and_other_bodies() {
        let json = br#"{"error":{"message":"model not found","code":404}}"#;
        let (c, r) = both(|rules| judge_whole(Api::Chat, 404, json, false, End::Complete, rules));
        assert_eq!(c.outcome, Outcome::HttpError);
        assert_eq!(c.error.as_deref(), Some("HTTP 404: model not found"));
        assert_eq!(r.outcome, Outcome::HttpError);
        assert_eq!(
            r.error.as_deref(),
            Some("HTTP 404: {\"error\":{\"message\":\"model not found\",\"code\":404}}")
        );
        let html = "<html>".to_string() + &"x".repeat(600);
        let (c, r) =
            both(|rules| judge_whole(Api::Chat, 503, html.as_bytes(), true, End::Complete, rules));
        assert_eq!(c.outcome, Outcome::HttpError);
        assert_eq!(c.error, Some(format!("HTTP 503: {}", &html[..512])));
        assert_eq!(r.error, Some(format!("HTTP 503: {html}")));
        let plain = br#"{"error":"busy"}"#;
        let c = judge_whole(Api::Chat, 429, plain, false, End::Complete, Rules::CAPTURE);
        assert_eq!(c.error.as_deref(), Some("HTTP 429: busy"));
        let t = tally(CHAT_USAGE);
        let c = judge_stream(500, &t, End::Complete);
        assert_eq!(
            (c.outcome, c.error.as_deref()),
            (Outcome::HttpError, Some("HTTP 500"))
        );
    }

    /// A complete JSON response: ok with its usage, or without any.
    #[test]
    fn ok_whole_responses() {
        let body =
            br#"{"choices":[{"text":"x"}],"usage":{"prompt_tokens":10,"completion_tokens":4}}"#;
        let (c, r) = both(|rules| judge_whole(Api::Chat, 200, body, false, End::Complete, rules));
        assert_eq!(c, r);
        assert_eq!(
            (
                c.outcome,
                c.prompt_tokens,
                c.completion_tokens,
                c.chunk_tokens
            ),
            (Outcome::Ok, Some(10), Some(4), None)
        );
        let (c, r) = both(|rules| {
            judge_whole(
                Api::Chat,
                200,
                br#"{"choices":[]}"#,
                false,
                End::Complete,
                rules,
            )
        });
        assert_eq!(c, r);
        assert_eq!(c, Verdict::of(Outcome::Ok, None));
    }

    /// A 2xx that is not what was asked for is the server's failure on both sides (capture
    /// judged it `ok`, replay `upstream_error`: the same response read as drift).
    #[test]
    fn a_2xx_that_is_not_what_was_asked_for_fails_on_both_sides() {
        let (c, r) =
            both(|rules| judge_whole(Api::Chat, 200, b"<html>", false, End::Complete, rules));
        assert_eq!(c, r);
        assert_eq!(
            c,
            Verdict::of(Outcome::UpstreamError, Some("response is not JSON".into()))
        );
        let json = br#"{"choices":[{"text":"x"}]}"#;
        let (c, r) = both(|rules| judge_whole(Api::Chat, 200, json, true, End::Complete, rules));
        assert_eq!(c, r);
        assert_eq!(
            c,
            Verdict::of(
                Outcome::UpstreamError,
                Some("streamed request answered without text/event-stream".into())
            )
        );
        let t =
            tally("data: nope\n\ndata: {\"choices\":[]}\n\ndata: still not\n\ndata: [DONE]\n\n");
        assert_eq!(t.invalid, 2);
        let c = judge_stream(200, &t, End::Complete);
        assert_eq!(
            (c.outcome, c.error.as_deref()),
            (Outcome::UpstreamError, Some("2 events were not JSON"))
        );
        // With an output chunk, events that are not JSON are passed over by both.
        let t = tally("data: nope\n\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n");
        assert_eq!(judge_stream(200, &t, End::Complete).outcome, Outcome::Ok);
        // An error is the one thing worded differently.
        let (c, r) = both(|rules| {
            judge_whole(
                Api::Chat,
                503,
                br#"{"error":{"message":"busy"}}"#,
                false,
                End::Complete,
                rules,
            )
        });
        assert_eq!(
            (c.outcome, r.outcome),
            (Outcome::HttpError, Outcome::HttpError)
        );
        assert_eq!(c.error.as_deref(), Some("HTTP 503: busy"));
    }

    /// A tally notes only what it is told, and says which events carry output.
    #[test]
    fn note_says_which_events_carry_output() {
        let mut t = StreamTally::default();
        assert!(!t.note(
            1,
            StreamEvent::Chunk {
                usage: None,
                output: false,
                answer: false,
            }
        ));
        assert!(t.note(
            2,
            StreamEvent::Chunk {
                usage: None,
                output: true,
                answer: true,
            }
        ));
        assert!(!t.note(3, StreamEvent::Error("a".into())));
        assert!(!t.note(4, StreamEvent::Error("b".into())));
        assert!(!t.note(5, StreamEvent::Invalid));
        assert!(!t.note(6, StreamEvent::Other));
        assert_eq!(t.chunk_times_us, vec![2]);
        assert_eq!(t.last_chunk_us, Some(2));
        assert_eq!(t.stream_error.as_deref(), Some("a"));
        assert_eq!((t.invalid, t.done), (1, false));
    }
}
