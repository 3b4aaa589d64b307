//! `sim --from-trace`: a mock that answers each request with a recorded row's timing and
//! outcome, so a gateway, client library or router can be tested against production's
//! timing with no GPU.
//!
//! # Matching
//! Each request is matched to a row of the trace by the methods of [`MatchBy`], tried in the
//! order given (default: all three):
//! - [`MatchBy::Id`]: the request's `x-request-id` header (what `llmreplay replay` sends: the
//!   row's `request_id`; a soak pass's `~k` suffix is taken off) names a row. A row may be
//!   answered any number of times by id.
//! - [`MatchBy::Prompt`]: the request's prompt (`messages` for chat and Messages, `prompt`
//!   for completions, `input` for Responses and embeddings, compared as JSON) is that of a
//!   row whose body was recorded (`capture --record-bodies full`): the first such row not
//!   answered yet, else the first.
//! - [`MatchBy::Order`]: the earliest row by arrival not answered yet.
//!
//! A request that matches nothing is answered 404 with an error naming why, and counted
//! ([`MatchCounts::unmatched`]).
//!
//! # Answer
//! From t0 (the request's headers read), a streamed row's chunks go out at their recorded
//! offsets (`chunk_times_us`) carrying the recorded tokens (`chunk_tokens`, else the output
//! tokens spread evenly), `usage` reports the recorded `prompt_tokens` and `output_tokens`;
//! a non-streamed row is answered whole at its recorded E2EL. How it ends follows its outcome
//! ([`Ending`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use trace_format::{Outcome, TraceRecord};

/// Header naming how a request was matched (`id`, `prompt`, `order`, or `unmatched`).
pub const MATCH_HEADER: &str = "x-llmreplay-match";
/// Header naming the recorded row a request was answered with (its `request_id`).
pub const ROW_HEADER: &str = "x-llmreplay-row";

/// The header a request id is read from (`llmreplay replay` sends each row's id in it).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// How a request is matched to a recorded row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchBy {
    /// By the `x-request-id` header.
    Id,
    /// By the prompt, against rows whose body was recorded.
    Prompt,
    /// The next row by arrival not answered yet.
    Order,
}

impl MatchBy {
    /// All three, in the default order.
    pub const ALL: [MatchBy; 3] = [MatchBy::Id, MatchBy::Prompt, MatchBy::Order];

    /// The name in `--match` and in the `x-llmreplay-match` header.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchBy::Id => "id",
            MatchBy::Prompt => "prompt",
            MatchBy::Order => "order",
        }
    }

    /// Parses a comma-separated list (`id,prompt,order`), each at most once.
    pub fn parse_list(s: &str) -> Result<Vec<MatchBy>, FromTraceError> {
        let mut v = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let m = match part {
                "id" => MatchBy::Id,
                "prompt" => MatchBy::Prompt,
                "order" => MatchBy::Order,
                other => {
                    return Err(FromTraceError::Match(format!(
                        "unknown method {other:?} (expected id, prompt or order)"
                    )))
                }
            };
            if v.contains(&m) {
                return Err(FromTraceError::Match(format!("{part} given twice")));
            }
            v.push(m);
        }
        if v.is_empty() {
            return Err(FromTraceError::Match("no method given".into()));
        }
        Ok(v)
    }
}

/// Errors building a mock from a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FromTraceError {
    /// The trace has no rows.
    #[error("the trace has no rows to answer with")]
    Empty,
    /// The matching methods are invalid.
    #[error("--match: {0}")]
    Match(String),
}

/// How a recorded answer ends, from the row's outcome and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// A complete response: every chunk, then `usage` and `[DONE]` (`ok`).
    Complete {
        /// `finish_reason` is `length` (the output reached `max_tokens`), else `stop`.
        length: bool,
    },
    /// An HTTP error with the recorded status and error text, at the recorded E2EL
    /// (`http_error`, or any outcome recorded with a non-2xx status).
    Status {
        /// The HTTP status.
        status: u16,
        /// The recorded error text.
        error: Option<String>,
    },
    /// The stream stops (`upstream_error`): the recorded chunks, then the connection is
    /// dropped at the recorded E2EL with no `[DONE]`; with no status recorded, the
    /// connection is dropped without any response.
    Reset {
        /// Whether the recorded response had begun (a 2xx status was recorded).
        began: bool,
    },
    /// The recorded client gave up (`client_cancelled`, `timeout`): the recorded chunks, then
    /// nothing more until the client goes away (at most an hour), so the client's own
    /// cancellation or timeout ends it as it did.
    Hold {
        /// Whether the recorded response had begun (headers are sent).
        began: bool,
    },
}

/// What the mock answers for one recorded row.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedAnswer {
    /// The row's `request_id`.
    pub request_id: String,
    /// The prompt's key (see [`prompt_key`]), when the body was recorded.
    pub prompt_key: Option<u64>,
    /// Whether the row was streamed.
    pub stream: bool,
    /// Recorded prompt tokens (reported in `usage`; the request's words when unknown).
    pub prompt_tokens: Option<u32>,
    /// Each chunk's offset from t0 and its tokens (at least 1 each), in order; a
    /// non-streamed row has one chunk, at its E2EL.
    pub chunks: Vec<(Duration, u32)>,
    /// The recorded end-to-end latency.
    pub e2el: Duration,
    /// Output tokens in all: the chunks' sum.
    pub output_tokens: u32,
    /// How it ends.
    pub ending: Ending,
}

fn us(v: i64) -> Duration {
    Duration::from_micros(u64::try_from(v).unwrap_or(0))
}

fn count(v: Option<i64>) -> Option<u32> {
    v.filter(|n| *n >= 0)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Chunk times without a recorded per-chunk timing: a streamed row's `n` tokens spread from
/// its TTFT to its E2EL, one chunk each (at most 4,096 chunks); else one chunk at E2EL.
fn spread(ttft: Option<Duration>, e2el: Duration, n: u32, stream: bool) -> Vec<Duration> {
    match ttft.filter(|_| stream && n > 1) {
        Some(first) => {
            let k = n.min(4096);
            let span = e2el.saturating_sub(first);
            (0..k).map(|i| first + span * i / (k - 1)).collect()
        }
        None => vec![ttft.filter(|_| stream).unwrap_or(e2el)],
    }
}

/// Tokens per chunk: the recorded ones when they are known for every chunk, each at least
/// one and summing to `total`; else `total` spread evenly (at least one each).
fn tokens_per_chunk(recorded: Option<&[i32]>, n: usize, total: u32) -> Vec<u32> {
    if let Some(t) = recorded {
        let ok = t.len() == n && t.iter().all(|&k| k >= 1);
        let sum: i64 = t.iter().map(|&k| i64::from(k)).sum();
        if ok && sum == i64::from(total) {
            return t.iter().map(|&k| k as u32).collect();
        }
    }
    let n32 = u32::try_from(n).unwrap_or(u32::MAX).max(1);
    let total = total.max(n32);
    let (base, extra) = (total / n32, total % n32);
    (0..n32).map(|i| base + u32::from(i < extra)).collect()
}

impl RecordedAnswer {
    /// The answer that reproduces `r`.
    pub fn from_record(r: &TraceRecord) -> RecordedAnswer {
        let ttft = r.ttft_us.map(us);
        let mut times: Vec<Duration> = r.chunk_times_us.iter().map(|&t| us(t)).collect();
        // Offsets never go back (a clock step in the recording must not reorder chunks).
        for i in 1..times.len() {
            times[i] = times[i].max(times[i - 1]);
        }
        let e2el = r
            .e2el_us
            .map(us)
            .or(times.last().copied())
            .or(ttft)
            .unwrap_or_default();
        let began = r.status.is_some_and(|s| (200..300).contains(&s));
        let ending = match (r.outcome, r.status) {
            (_, Some(s)) if !(200..300).contains(&s) => Ending::Status {
                status: s,
                error: r.error.clone(),
            },
            (Outcome::Ok, _) => Ending::Complete {
                length: r
                    .max_tokens
                    .zip(r.output_tokens)
                    .is_some_and(|(m, o)| o >= m),
            },
            (Outcome::HttpError, _) => Ending::Status {
                status: 500,
                error: r.error.clone(),
            },
            (Outcome::UpstreamError, _) => Ending::Reset { began },
            (Outcome::ClientCancelled | Outcome::Timeout, _) => Ending::Hold { began },
        };
        let recorded_out = count(r.output_tokens)
            .or_else(|| {
                r.chunk_tokens
                    .as_ref()
                    .map(|t| t.iter().map(|&k| k.max(0) as u32).sum())
            })
            .unwrap_or(u32::try_from(times.len()).unwrap_or(u32::MAX));
        let complete = matches!(ending, Ending::Complete { .. });
        if times.is_empty() && (complete || !r.stream) {
            times = spread(ttft, e2el, recorded_out.max(1), r.stream);
        }
        let (chunks, output_tokens) = if times.is_empty() {
            (Vec::new(), 0)
        } else if !r.stream {
            // One whole answer at E2EL, whatever the chunks were.
            (vec![(e2el, recorded_out.max(1))], recorded_out.max(1))
        } else {
            let toks = tokens_per_chunk(r.chunk_tokens.as_deref(), times.len(), recorded_out);
            let sum = toks.iter().sum();
            (times.into_iter().zip(toks).collect(), sum)
        };
        RecordedAnswer {
            request_id: r.request_id.clone(),
            prompt_key: r.body.as_deref().and_then(|b| prompt_key(b.as_bytes())),
            stream: r.stream,
            prompt_tokens: count(r.prompt_tokens),
            chunks,
            e2el,
            output_tokens,
            ending,
        }
    }
}

/// The key a prompt is matched by: FNV-1a ([`trace_format::fnv`]) of the JSON of the body's
/// `messages` (chat) or `prompt` (completions) as serde_json writes it, so a replay that
/// rewrites the model or `stream_options` still matches. `None` for a body that is not a
/// JSON object with either.
pub fn prompt_key(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object()?;
    let (tag, p): (&[u8], _) = match (obj.get("messages"), obj.get("prompt"), obj.get("input")) {
        (Some(m), _, _) => (b"messages", m),
        (None, Some(p), _) => (b"prompt", p),
        // Responses, embeddings.
        (None, None, Some(i)) => (b"input", i),
        (None, None, None) => return None,
    };
    use trace_format::fnv::{fnv1a, OFFSET};
    Some(fnv1a(fnv1a(OFFSET, tag), p.to_string().as_bytes()))
}

/// How many requests each method matched, and how many matched nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MatchCounts {
    /// Matched by `x-request-id`.
    pub id: u64,
    /// Matched by prompt.
    pub prompt: u64,
    /// Matched in order.
    pub order: u64,
    /// Matched nothing (answered 404).
    pub unmatched: u64,
}

impl fmt::Display for MatchCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests answered from the trace ({} by request id, {} by prompt, {} in order), {} matched nothing",
            self.id + self.prompt + self.order,
            self.id,
            self.prompt,
            self.order,
            self.unmatched
        )
    }
}

#[derive(Debug, Default)]
struct State {
    answered: Vec<bool>,
    /// Rows before it were all answered (the in-order scan starts here).
    cursor: usize,
    counts: MatchCounts,
}

/// A trace loaded to answer from, and what it has answered ([`crate::Timing::Trace`]).
pub struct TraceMock {
    rows: Vec<RecordedAnswer>,
    by_id: HashMap<String, usize>,
    by_prompt: HashMap<u64, Vec<usize>>,
    methods: Vec<MatchBy>,
    state: Mutex<State>,
}

impl fmt::Debug for TraceMock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceMock")
            .field("rows", &self.rows.len())
            .field("methods", &self.methods)
            .finish()
    }
}

/// Why a request matched no row: one clause per method tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmatched(pub String);

impl TraceMock {
    /// A mock answering with `records` (in arrival order for [`MatchBy::Order`]), matched by
    /// `methods` in that order.
    pub fn new(records: &[TraceRecord], methods: &[MatchBy]) -> Result<TraceMock, FromTraceError> {
        if records.is_empty() {
            return Err(FromTraceError::Empty);
        }
        if methods.is_empty() {
            return Err(FromTraceError::Match("no method given".into()));
        }
        let mut sorted: Vec<&TraceRecord> = records.iter().collect();
        sorted.sort_by_key(|r| r.arrival_time_us);
        let rows: Vec<RecordedAnswer> = sorted
            .into_iter()
            .map(RecordedAnswer::from_record)
            .collect();
        let mut by_id = HashMap::with_capacity(rows.len());
        let mut by_prompt: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            by_id.entry(r.request_id.clone()).or_insert(i);
            if let Some(k) = r.prompt_key {
                by_prompt.entry(k).or_default().push(i);
            }
        }
        Ok(TraceMock {
            state: Mutex::new(State {
                answered: vec![false; rows.len()],
                ..State::default()
            }),
            rows,
            by_id,
            by_prompt,
            methods: methods.to_vec(),
        })
    }

    /// The rows, in arrival order.
    pub fn rows(&self) -> &[RecordedAnswer] {
        &self.rows
    }

    /// What has been answered so far.
    pub fn counts(&self) -> MatchCounts {
        self.lock().counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn by_id(&self, id: &str) -> Option<usize> {
        if let Some(&i) = self.by_id.get(id) {
            return Some(i);
        }
        // A soak pass sends row `r` as `r~k`.
        let (base, k) = id.rsplit_once('~')?;
        k.parse::<u64>().ok()?;
        self.by_id.get(base).copied()
    }

    /// The row a request with this `x-request-id` and prompt key is answered with, and the
    /// method that found it; the row is marked answered and counted. `Err` says why none
    /// matched (counted as unmatched).
    pub fn find(
        &self,
        request_id: Option<&str>,
        prompt: Option<u64>,
    ) -> Result<(&RecordedAnswer, MatchBy), Unmatched> {
        let mut st = self.lock();
        let mut why = Vec::new();
        for &m in &self.methods {
            let found = match m {
                MatchBy::Id => match request_id {
                    None => {
                        why.push(format!("no {REQUEST_ID_HEADER} header"));
                        None
                    }
                    Some(id) => {
                        let f = self.by_id(id);
                        if f.is_none() {
                            why.push(format!("{REQUEST_ID_HEADER} {id:?} is not in the trace"));
                        }
                        f
                    }
                },
                MatchBy::Prompt => {
                    let rows = prompt.and_then(|k| self.by_prompt.get(&k));
                    let f = rows.map(|rows| {
                        rows.iter()
                            .copied()
                            .find(|&i| !st.answered[i])
                            .unwrap_or(rows[0])
                    });
                    if f.is_none() {
                        why.push("no recorded body has this prompt".to_string());
                    }
                    f
                }
                MatchBy::Order => {
                    let start = st.cursor;
                    let f = (start..self.rows.len()).find(|&i| !st.answered[i]);
                    if f.is_none() {
                        why.push(format!(
                            "all {} rows were answered already",
                            self.rows.len()
                        ));
                    }
                    f
                }
            };
            if let Some(i) = found {
                st.answered[i] = true;
                while st.cursor < st.answered.len() && st.answered[st.cursor] {
                    st.cursor += 1;
                }
                match m {
                    MatchBy::Id => st.counts.id += 1,
                    MatchBy::Prompt => st.counts.prompt += 1,
                    MatchBy::Order => st.counts.order += 1,
                }
                return Ok((&self.rows[i], m));
            }
        }
        st.counts.unmatched += 1;
        Err(Unmatched(format!(
            "llmreplay sim --from-trace: no recorded request matches ({}; matching by {})",
            why.join("; "),
            self.methods
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(",")
        )))
    }

    /// The counts as Prometheus text, appended to the sim's `/metrics`.
    pub fn render_metrics(&self) -> String {
        let c = self.counts();
        let mut s = String::from(
            "# HELP llmreplay_sim_trace_requests_total Requests answered from the trace, by how they were matched (unmatched: answered 404).\n# TYPE llmreplay_sim_trace_requests_total counter\n",
        );
        for (m, v) in [
            ("id", c.id),
            ("prompt", c.prompt),
            ("order", c.order),
            ("unmatched", c.unmatched),
        ] {
            s.push_str(&format!(
                "llmreplay_sim_trace_requests_total{{match=\"{m}\"}} {v}\n"
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, at: i64, outcome: Outcome, status: Option<u16>) -> TraceRecord {
        let mut r = TraceRecord::new(id.to_string(), at, "/v1/completions");
        r.stream = true;
        r.outcome = outcome;
        r.status = status;
        r.ttft_us = Some(40_000);
        r.chunk_times_us = vec![40_000, 50_000, 65_000];
        r.e2el_us = Some(65_000);
        r.output_tokens = Some(5);
        r
    }

    #[test]
    fn answers_keep_recorded_timing_tokens_and_outcome() {
        let ok = RecordedAnswer::from_record(&row("a", 0, Outcome::Ok, Some(200)));
        let times: Vec<u128> = ok.chunks.iter().map(|c| c.0.as_millis()).collect();
        assert_eq!(times, [40, 50, 65]);
        assert_eq!(ok.chunks.iter().map(|c| c.1).sum::<u32>(), 5);
        assert_eq!(ok.ending, Ending::Complete { length: false });
        let e = RecordedAnswer::from_record(&row("b", 0, Outcome::HttpError, Some(503)));
        assert!(matches!(e.ending, Ending::Status { status: 503, .. }));
        let r = RecordedAnswer::from_record(&row("c", 0, Outcome::UpstreamError, None));
        assert_eq!(r.ending, Ending::Reset { began: false });
    }

    #[test]
    fn matches_by_id_then_prompt_then_order_and_counts_the_rest() {
        let mut rows = vec![
            row("a", 2, Outcome::Ok, Some(200)),
            row("b", 1, Outcome::Ok, Some(200)),
        ];
        rows[0].body = Some(r#"{"model":"x","prompt":"hello there"}"#.into());
        let m = TraceMock::new(&rows, &MatchBy::ALL).unwrap();
        let (r, how) = m.find(Some("a~3"), None).unwrap();
        assert_eq!((r.request_id.as_str(), how), ("a", MatchBy::Id));
        let key = prompt_key(br#"{"prompt":"hello there","model":"y","stream":true}"#);
        let (r, how) = m.find(None, key).unwrap();
        assert_eq!((r.request_id.as_str(), how), ("a", MatchBy::Prompt));
        let (r, how) = m.find(Some("zzz"), None).unwrap();
        assert_eq!((r.request_id.as_str(), how), ("b", MatchBy::Order));
        let e = m.find(Some("zzz"), None).unwrap_err();
        assert!(e.0.contains("\"zzz\" is not in the trace"), "{}", e.0);
        assert_eq!(
            m.counts(),
            MatchCounts {
                id: 1,
                prompt: 1,
                order: 1,
                unmatched: 1
            }
        );
        assert!(TraceMock::new(&[], &MatchBy::ALL).is_err());
        assert!(MatchBy::parse_list("id,bogus").is_err());
    }
}
