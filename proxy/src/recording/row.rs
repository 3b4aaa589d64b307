//! One request's record from arrival to its end, and the response body that streams the
//! upstream's frames to the client while observing them.
//!
//! [`Recording`] owns the row being built. Whatever ends a request finishes it exactly once:
//! the end of the upstream body, an upstream error or timeout, or being dropped (the client
//! went away, so hyper dropped the handler or the body: outcome `client_cancelled` with the
//! chunks seen so far, and dropping the upstream body cancels the upstream request).
//! Finishing updates the metrics and queues the row for the writer; nothing here waits.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Sleep;
use trace_format::tokens::{self, Reasoning};
use trace_format::{Outcome, TokenSource, TraceRecord};
use wire::api::Api;
use wire::response_verdict::{self, judge_stream, judge_whole, End, Rules};

use crate::capture_metrics::Metrics;
use crate::linking::agents::{CallsSeen, Seen};
use crate::linking::sessions::TextHash;
use crate::phases::{PhaseLog, Phases};
use crate::recording::observe::{StreamObserver, Strip};
use crate::recording::prompts::PendingPrompt;
use crate::recording::writer::{Generated, OutputText, Sink};
use crate::upstream::{BoxError, UpstreamBody};

/// Bytes of a non-streamed response kept to read its usage or error message.
const WHOLE_BODY_CAP: usize = 8 * 1024 * 1024;

/// Microseconds from `t0` to `t`.
pub(crate) fn us_since(t0: Instant, t: Instant) -> i64 {
    t.saturating_duration_since(t0).as_micros() as i64
}

/// Where finished rows go, shared by every [`Recording`]: the metrics, the writer's queue,
/// and the shutdown state that names a cut request's error.
pub(crate) struct Recorder {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) sink: Sink,
    /// Set when the drain timeout passed and connections are being cut.
    pub(crate) hard_stop: AtomicBool,
    /// Notified when the last recorded request in flight finishes.
    pub(crate) idle: Notify,
    /// Each request's phase stamps, when `--phase-log` asked for them.
    pub(crate) phases: Option<PhaseLog>,
}

/// The row of one recorded request, finished exactly once.
pub(crate) struct Recording {
    recorder: Arc<Recorder>,
    /// The API of the request (from its path).
    pub(crate) api: Api,
    /// When the request headers were read.
    pub(crate) t0: Instant,
    /// The row being built.
    pub(crate) rec: TraceRecord,
    /// Where its time went inside the proxy ([`crate::phases`]).
    pub(crate) phases: Phases,
    /// The prompt's tokenization, running on a prompt runner ([`crate::recording::prompts`]) (sampled rows only).
    pub(crate) prompt: Option<PendingPrompt>,
    /// What the writer thread still has to count of the response (texts without usage).
    output: Generated,
    /// What linking needs of the response (its answer's [`TextHash`], its tool calls) and
    /// who sent the request ([`crate::linking::agents::client_key`]).
    pub(crate) seen: Seen,
    /// Capture started the request's trace (the client sent no valid `traceparent`): the
    /// row's `span_id` is capture's own span, not the client's.
    pub(crate) trace_started: bool,
    /// Called once with the finished row, before it is queued (a mirrored request's: its
    /// shadows' cancellation; a shadow's: its candidate's counters, see [`crate::shadow`]).
    pub(crate) on_finish: Option<FinishHook>,
    /// The error of this row when it is dropped unfinished, in place of "client disconnected"
    /// (a shadow's: its production request was cancelled).
    pub(crate) cancel_note: Option<&'static str>,
    sampled: bool,
    done: bool,
}

/// What [`Recording::on_finish`] holds.
pub(crate) type FinishHook = Box<dyn FnOnce(&TraceRecord) + Send>;

impl Recording {
    /// Starts a record (counts it in flight).
    pub(crate) fn new(
        recorder: Arc<Recorder>,
        t0: Instant,
        rec: TraceRecord,
        sampled: bool,
    ) -> Self {
        recorder.metrics.in_flight.fetch_add(1, Relaxed);
        Recording {
            recorder,
            api: Api::of_endpoint(&rec.endpoint).unwrap_or(Api::Chat),
            t0,
            rec,
            phases: Phases::new(t0),
            prompt: None,
            output: Generated::default(),
            seen: Seen::default(),
            trace_started: false,
            on_finish: None,
            cancel_note: None,
            sampled,
            done: false,
        }
    }

    /// Whether this row will be written.
    pub(crate) fn sampled(&self) -> bool {
        self.sampled
    }

    /// Finishes the row with `outcome` at `end`: E2EL by the rule replay records it with
    /// ([`Outcome::e2el_us`]), metrics, and the writer queue.
    pub(crate) fn finish(&mut self, outcome: Outcome, error: Option<String>, end: Instant) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(log) = &self.recorder.phases {
            log.push(&self.phases);
        }
        let r = &mut self.rec;
        r.outcome = outcome;
        if r.error.is_none() {
            r.error = error;
        }
        if r.ttft_us.is_none() {
            r.ttft_us = r.chunk_times_us.first().copied();
        }
        if r.e2el_us.is_none() {
            r.e2el_us = outcome.e2el_us(r.chunk_times_us.last().copied(), us_since(self.t0, end));
        }
        let m = &self.recorder.metrics;
        m.count_outcome(outcome);
        m.request_bytes.fetch_add(r.request_bytes as u64, Relaxed);
        m.response_bytes.fetch_add(r.response_bytes as u64, Relaxed);
        if outcome == Outcome::Ok {
            if let Some(t) = r.ttft_us {
                m.ttft.observe(t as f64 / 1e6);
            }
            if let Some(e) = r.e2el_us {
                m.e2el.observe(e as f64 / 1e6);
            }
            for w in r.chunk_times_us.windows(2) {
                m.itl.observe((w[1] - w[0]) as f64 / 1e6);
            }
            m.otel_duration.observe(us_since(self.t0, end) as f64 / 1e6);
            if let Some(p) = r.prompt_tokens {
                m.otel_input_tokens.observe(p as f64);
            }
            if let Some(o) = r.output_tokens {
                m.otel_output_tokens.observe(o as f64);
            }
        }
        if let Some(hook) = self.on_finish.take() {
            hook(r);
        }
        if self.sampled {
            let rec = std::mem::replace(r, TraceRecord::new(String::new(), 0, String::new()));
            self.recorder.sink.send(
                rec,
                self.prompt.take(),
                std::mem::take(&mut self.output),
                std::mem::take(&mut self.seen),
                self.trace_started,
            );
        }
        if m.in_flight.fetch_sub(1, Relaxed) == 1 {
            self.recorder.idle.notify_waiters();
        }
    }

    /// The error of a request cut short by the client (or by a forced shutdown): outcome
    /// `client_cancelled`.
    fn cancelled(&self) -> String {
        if self.recorder.hard_stop.load(Relaxed) {
            "cut by the proxy's shutdown after the drain timeout".into()
        } else if let Some(note) = self.cancel_note {
            note.into()
        } else {
            "client disconnected".into()
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if !self.done {
            let e = self.cancelled();
            let e = if self.rec.status.is_none() {
                format!("{e} before the response headers")
            } else {
                e
            };
            self.finish(Outcome::ClientCancelled, Some(e), Instant::now());
        }
    }
}

/// The [`TextHash`] of a whole response's answer and the tool calls it made (None when it
/// is not JSON).
fn answer_of_body(api: Api, body: &[u8]) -> Option<(u64, CallsSeen)> {
    let w = wire::sse::read_whole(api, body)?;
    Some((TextHash::of(&w.answer), CallsSeen::of_whole(&w)))
}

enum Mode {
    Sse(Box<StreamObserver>),
    Whole { copy: Vec<u8>, bytes: u64 },
}

/// The response body of a recorded request: forwards each upstream frame as it arrives and
/// observes it on the way.
pub(crate) struct ObservedBody {
    inner: UpstreamBody,
    mode: Mode,
    queue: VecDeque<Bytes>,
    rec: Recording,
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    last_frame: Instant,
    ended: bool,
}

impl ObservedBody {
    /// Wraps the upstream body; `sse` selects SSE observation (with `strip`).
    pub(crate) fn new(
        inner: UpstreamBody,
        sse: bool,
        strip: Strip,
        rec: Recording,
        idle_timeout: Duration,
        max_event: usize,
    ) -> Self {
        let cap = rec
            .rec
            .max_tokens
            .map_or(256, |m| m.clamp(1, 8192) as usize + 2);
        let mode = if sse {
            let mut o = StreamObserver::with_max_event(strip, cap, max_event);
            o.set_api(rec.api);
            if rec.sampled() {
                o.keep_output_text();
                o.keep_answer_hash();
                o.keep_tool_calls();
            }
            Mode::Sse(Box::new(o))
        } else {
            Mode::Whole {
                copy: Vec::new(),
                bytes: 0,
            }
        };
        let now = Instant::now();
        ObservedBody {
            inner,
            mode,
            queue: VecDeque::with_capacity(4),
            rec,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            idle_timeout,
            last_frame: now,
            ended: false,
        }
    }

    /// Cuts the response now as timed out with `why` (a shadow past its `--shadow-timeout`,
    /// [`crate::shadow`]): the row is finished with what was observed, outcome `timeout`.
    pub(crate) fn time_out(&mut self, why: String) {
        if !self.ended {
            self.end(End::TimedOut(why), Instant::now());
            self.ended = true;
        }
    }

    /// The upstream body ended normally at `now`.
    fn complete(&mut self, now: Instant) {
        if let Mode::Sse(o) = &mut self.mode {
            o.finish(&mut self.queue);
        }
        self.end(End::Complete, now);
        self.ended = true;
    }

    /// Moves what was observed into the row and finishes it, with the response verdict
    /// replay judges by too ([`wire::response_verdict`], capture's [`Rules`]).
    fn end(&mut self, how: End, end: Instant) {
        if self.rec.done {
            return;
        }
        let status = self.rec.rec.status.unwrap_or(0);
        let v = match &mut self.mode {
            Mode::Sse(o) => {
                let oversized = o.oversized_events();
                if oversized > 0 {
                    self.rec
                        .recorder
                        .metrics
                        .sse_oversized_events
                        .fetch_add(oversized, Relaxed);
                }
                let v = judge_stream(status, o, how);
                let r = &mut self.rec.rec;
                r.response_bytes = o.bytes_out as i64;
                r.chunk_times_us = std::mem::take(&mut o.chunk_times_us);
                // E2EL is the last chunk of any kind (as vLLM's client times it), TTFT the
                // first with output (`finish` takes it from chunk_times_us).
                if let Some(last) = o.last_chunk_us {
                    r.e2el_us = Some(last);
                }
                r.ttfat_us = o.first_answer_us;
                // No usage: the writer thread counts what was seen by the one rule
                // (trace_format::tokens): the text with the tokenizer, else the chunks.
                let output = v
                    .completion_tokens
                    .is_none()
                    .then(|| tokens::Seen::streamed(r.chunk_times_us.len(), o.output_text.take()));
                self.rec.output.reasoning = match v.reasoning_tokens {
                    Some(n) => Some(Reasoning::Reported(n)),
                    None if o.reasoning_chunks == 0 => Some(Reasoning::Absent),
                    None => None,
                };
                let reasoning =
                    self.rec.output.reasoning.is_none().then(|| {
                        tokens::Seen::streamed(o.reasoning_chunks, o.reasoning_text.take())
                    });
                if output.is_some() || reasoning.is_some() {
                    self.rec.output.text = Some(OutputText::Text { output, reasoning });
                }
                self.rec.seen.answer = o.answer.map(|h| h.finish());
                self.rec.seen.calls = o.calls.take().map(CallsSeen::finish);
                v
            }
            Mode::Whole { copy, bytes } => {
                self.rec.rec.response_bytes = *bytes as i64;
                let api = self.rec.api;
                let v = judge_whole(api, status, copy, self.rec.rec.stream, how, Rules::CAPTURE);
                if v.outcome == response_verdict::Outcome::Ok {
                    // Embeddings, rerank and score generate nothing: no answer, calls or
                    // reasoning to read.
                    if self.rec.sampled && api.generates() {
                        let (answer, calls) = answer_of_body(api, copy).unzip();
                        self.rec.seen.answer = answer;
                        self.rec.seen.calls = calls.map(CallsSeen::finish);
                        // Reasoning text is looked for only where the body names it (one
                        // SIMD search), so plain answers are not read again.
                        let reasoning = v.reasoning_tokens.is_none()
                            && memchr::memmem::find(copy, api.reasoning_marker()).is_some();
                        self.rec.output.reasoning = match v.reasoning_tokens {
                            Some(n) => Some(Reasoning::Reported(n)),
                            None if !reasoning => Some(Reasoning::Absent),
                            None => None,
                        };
                        let output = v.completion_tokens.is_none();
                        if output || reasoning {
                            // No usage: the writer thread counts the texts with the tokenizer.
                            self.rec.output.text = Some(OutputText::Body {
                                api,
                                body: std::mem::take(copy),
                                output,
                                reasoning,
                            });
                        }
                    }
                    // Not streamed: E2EL only; there is no first token to time.
                    self.rec.rec.e2el_us = Some(us_since(self.rec.t0, end));
                }
                v
            }
        };
        if self.rec.api == Api::Responses {
            self.rec.seen.response_id = v
                .response_id
                .as_deref()
                .map(crate::linking::responses::id_hash);
        }
        let r = &mut self.rec.rec;
        r.prompt_tokens = v.prompt_tokens;
        r.cached_tokens = v.cached_tokens;
        r.output_tokens = v.completion_tokens;
        r.prompt_tokens_source = r.prompt_tokens.map(|_| TokenSource::Usage);
        r.output_tokens_source = r.output_tokens.map(|_| TokenSource::Usage);
        r.chunk_tokens = v.chunk_tokens;
        self.rec.finish(v.outcome.into(), v.error, end);
    }
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match this.inner.poll_frame(cx) {
                Poll::Pending => {
                    // Lazy idle timer: re-armed only when it fires early.
                    loop {
                        if this.idle.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        let deadline = this.last_frame + this.idle_timeout;
                        let now = Instant::now();
                        if deadline > now {
                            this.idle
                                .as_mut()
                                .reset(tokio::time::Instant::from_std(deadline));
                            continue;
                        }
                        let msg = format!("no data from the upstream for {:?}", this.idle_timeout);
                        this.end(End::TimedOut(msg.clone()), now);
                        this.ended = true;
                        return Poll::Ready(Some(Err(msg.into())));
                    }
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let now = Instant::now();
                    this.last_frame = now;
                    let data = match frame.into_data() {
                        Ok(d) => d,
                        Err(other) => return Poll::Ready(Some(Ok(other))),
                    };
                    if data.is_empty() {
                        continue;
                    }
                    // Handed to the client's connection in this same poll.
                    this.rec.phases.first_byte.get_or_insert(now);
                    match &mut this.mode {
                        Mode::Sse(o) => {
                            o.observe(us_since(this.rec.t0, now), data, &mut this.queue);
                        }
                        Mode::Whole { copy, bytes } => {
                            *bytes += data.len() as u64;
                            if copy.len() + data.len() <= WHOLE_BODY_CAP {
                                copy.extend_from_slice(&data);
                            }
                            this.queue.push_back(data);
                        }
                    }
                    // A body of known length is complete now, and the server may drop us
                    // without polling again once it has written that many bytes.
                    if this.inner.is_end_stream() {
                        this.complete(now);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    let now = Instant::now();
                    this.end(End::Broken(format!("upstream body: {e}")), now);
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => this.complete(Instant::now()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.queue.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.mode {
            Mode::Whole { .. } => self.inner.size_hint(),
            Mode::Sse(_) => SizeHint::default(),
        }
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        if !self.rec.done {
            let e = self.rec.cancelled();
            self.end(End::Cancelled(e), Instant::now());
        }
    }
}
