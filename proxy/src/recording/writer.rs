//! The record sink: a bounded queue to the trace-format [`TraceWriter`] running on its own
//! thread, so writing never slows the proxy. The thread drains the queue every
//! [`DRAIN_EVERY`] (or half flush interval, if shorter), so queueing a record never wakes it.
//! A full queue drops the record (counted in `records_dropped_total` and logged) instead of
//! waiting.
//!
//! The trace directory never stops the traffic: the writer deals with a full disk itself
//! (see `trace_format::writer`), this thread mirrors its counters into [`Metrics`] (rows
//! that never reach a file are in `records_dropped_total`, exactly) and logs its errors
//! rate-limited: the first at once, then a summary with a count at most every
//! [`LOG_EVERY`], and once when writes succeed again.
//!
//! A row arrives with the tokenization of its prompt still running on a prompt runner
//! ([`PendingPrompt`]); the writer thread waits for it (within the shed budget) and fills in
//! `prefix_hashes`, and `prompt_tokens` (source `tokenizer`) when the upstream reported none.
//! When the upstream sent no usage, it also counts the generated text with the tokenizer
//! (`output_tokens`, source `tokenizer`), off the request path.
//!
//! This thread never falls behind for tokenizing: a row queued longer than the shed budget
//! gets estimates (source `estimate`) instead of counts, a prompt the runners shed comes
//! without hashes (`prefix_hashes` null, `prompt_tokens` from usage or estimated), a prompt
//! not ready when the row's budget is spent is not waited for (no hashes, no chat chain,
//! `prompt_tokens` from usage or null), and
//! each shed piece of work is counted (`recorder_shed_total{work}`). Every queued row's
//! queueing time is kept in [`crate::capture_metrics::RecorderQueue`], whose oldest is the lag on
//! /metrics (`recorder_lag_seconds`).
//!
//! Every finished row also goes to the recorder's taps ([`Tap`]: any number of further
//! outputs, e.g. the OTLP exporter), as the trace writer gets it. A tap must not wait: it
//! takes rows through its own bounded queue, so a slow exporter never slows this thread
//! (which would fill the queue above and cost rows in the trace).
//!
//! Rows reach this thread in the order their requests finished, so it also links chat turns
//! into sessions ([`crate::linking::sessions::Linker`]): a turn's parent finished before the turn was
//! sent, and is always linked first. The row gets `session_id` (the header's, else the
//! conversation's first request id), `parent_request_id`, `think_time_us` and `parent_link`;
//! an agent's tool results and sub-agents are linked by tool call first
//! ([`crate::linking::agents::Links`]), and the tool columns filled ([`crate::linking::agents::fill_tools`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokenize::Tokenizer;
use trace_format::tokens::{self, Reasoning};
use trace_format::writer::{CloseReport, RecoveryReport, WriterStats};
use trace_format::{TokenSource, TraceRecord, TraceWriter, WriterConfig};

use crate::capture_metrics::Metrics;
use crate::error::{ProxyError, Result};
use crate::linking::agents::{fill_tools, link_keys, Links, Seen, ToolNaming};
use crate::linking::completions::CompletionLinker;
use crate::prefix::prompt_tokens;
use crate::recording::apis::chat_view;
use crate::recording::prompts::PendingPrompt;
use trace_format::keyed::HashKey;
use trace_format::privacy::{Grade, Loss};
use wire::api::Api;

/// Longest time a queued record waits for the writer thread: the queue's default 16 Ki
/// records then absorb over 300k records/s.
const DRAIN_EVERY: Duration = Duration::from_millis(50);

/// Shortest time between two log lines about the trace directory.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// Shortest wait of the writer thread for one prompt's tokenization (a row queued past the
/// shed budget still gets this long; a starved runner cannot stall the writer beyond it).
const PROMPT_WAIT_MIN: Duration = Duration::from_millis(1);

/// What was seen of a response's generated output whose usage did not count it, for the
/// writer thread to count by the one rule ([`trace_format::tokens`]).
#[derive(Debug)]
pub(crate) enum OutputText {
    /// A stream's: its output (None: usage counted it) and its reasoning (None: nothing to
    /// count), each with the chunks that carried it and its text if kept.
    Text {
        output: Option<tokens::Seen>,
        reasoning: Option<tokens::Seen>,
    },
    /// A whole (non-streamed) JSON response body of `api`, and which of its texts to count.
    Body {
        api: Api,
        body: Vec<u8>,
        output: bool,
        reasoning: bool,
    },
}

impl OutputText {
    /// What was seen of (the output, the reasoning) to count.
    fn seen(self) -> (Option<tokens::Seen>, Option<tokens::Seen>) {
        match self {
            OutputText::Text { output, reasoning } => (output, reasoning),
            OutputText::Body {
                api,
                body,
                output,
                reasoning,
            } => {
                let w = wire::sse::read_whole(api, &body);
                let (out, reason) = w.map(|w| (w.output, w.reasoning)).unzip();
                (
                    output.then(|| tokens::Seen::whole(out)),
                    reasoning.then(|| tokens::Seen::whole(reason)),
                )
            }
        }
    }
}

/// What a finished response generated, as far as the writer thread still has to count it.
#[derive(Debug, Default)]
pub(crate) struct Generated {
    /// Texts for the tokenizer (none when the usage counted everything).
    pub(crate) text: Option<OutputText>,
    /// The reasoning tokens as decided where the response was observed (reported, absent,
    /// estimated); None: count the reasoning text, if any.
    pub(crate) reasoning: Option<Reasoning>,
}

/// A further output of the recorder: every row written (or dropped by the writer), in the
/// order written, on the writer thread. It must return at once (queue the row, or drop it
/// and count); it is closed after the trace files.
pub(crate) trait Tap: Send {
    /// One finished row; `trace_started`: capture started its trace (its `span_id` is
    /// capture's own), else any ids are the client's.
    fn row(&mut self, rec: &TraceRecord, trace_started: bool);
    /// The recorder is closing: no row follows. Returns a line for the log, if any.
    fn close(self: Box<Self>) -> Option<String> {
        None
    }
}

struct Queued {
    rec: TraceRecord,
    /// Capture started the request's trace.
    trace_started: bool,
    prompt: Option<PendingPrompt>,
    output: Generated,
    /// What linking needs of the response (its answer's hash, its tool calls, its client).
    seen: Seen,
    /// When it was queued for this thread.
    queued_at: Instant,
}

enum Msg {
    Record(Box<Queued>),
    Close,
}

/// What the writer keeps of the content: the grade, and the key every content hash it
/// writes is made under (the prompt runners' hashes are unkeyed chains, kept in memory).
#[derive(Debug, Clone)]
pub(crate) struct Keep {
    pub(crate) grade: Grade,
    pub(crate) key: Arc<HashKey>,
    /// Arrival times are rounded down to a multiple of this many µs (0: not rounded).
    pub(crate) time_bucket_us: i64,
    /// Where a `full` body's images are stored once ([`trace_format::blobs`]; None: inline).
    pub(crate) blobs: Option<std::path::PathBuf>,
    /// The capture's id and start (µs since the epoch), on every row.
    pub(crate) capture: Option<(String, i64)>,
}

impl Keep {
    /// How the grade names tools.
    fn naming(&self) -> ToolNaming<'_> {
        match self.grade {
            Grade::Perf => ToolNaming::Omit,
            Grade::Hashes => ToolNaming::Keyed(&self.key),
            Grade::Full => ToolNaming::Plain,
        }
    }
}

/// What the writer thread needs to finish a row.
struct Resolver<'a> {
    keep: Keep,
    tokenizer: &'a Tokenizer,
    /// A row queued longer than this gets estimates instead of token counts.
    shed_after: Duration,
    metrics: &'a Metrics,
    links: Links,
    /// Completions turns ([`crate::linking::completions`]).
    completions: CompletionLinker,
}

impl Resolver<'_> {
    /// The row with what its prompt's tokenization gave (or its estimates, when the work was
    /// shed), linked into its session.
    fn resolve(&mut self, q: Queued) -> TraceRecord {
        let Queued {
            mut rec,
            prompt,
            output,
            seen,
            queued_at,
            trace_started: _,
        } = q;
        let behind = queued_at.elapsed() > self.shed_after;
        let shed = &self.metrics.shed;
        let (output_seen, reasoning_seen) = output.text.map(OutputText::seen).unwrap_or_default();
        // Counted with the tokenizer unless the row is behind (then estimated).
        let count = |t: &str| {
            let counted = (!behind).then(|| self.tokenizer.count(t).ok()).flatten();
            if counted.is_none() {
                shed.output_tokens.fetch_add(1, Relaxed);
            }
            counted
        };
        if let (None, Some(seen)) = (rec.output_tokens, &output_seen) {
            tokens::fill_output(&mut rec, None, seen, count);
        }
        // Reasoning tokens by the same rule, once the output's count (which a response
        // without reasoning takes its 0's source from) is known.
        let reasoning = output
            .reasoning
            .or_else(|| Some(Reasoning::of(None, &reasoning_seen?, count)));
        if let Some(r) = reasoning {
            r.fill(&mut rec);
        }
        // The prompt is waited for until the row's shed budget is spent: a runner starved of
        // CPU costs the row its hashes (and counts), never the writer its pace.
        let wait = self
            .shed_after
            .saturating_sub(queued_at.elapsed())
            .max(PROMPT_WAIT_MIN);
        let mut late = false;
        let info = prompt
            .and_then(|rx| {
                rx.recv_timeout(wait)
                    .map_err(|e| late = matches!(e, mpsc::RecvTimeoutError::Timeout))
                    .ok()
            })
            .unwrap_or_default();
        let keep_hashes = self.keep.grade.hashes();
        if late {
            if keep_hashes {
                shed.prefix_hashes.fetch_add(1, Relaxed);
            }
            if rec.prompt_tokens.is_none() {
                shed.prompt_tokens.fetch_add(1, Relaxed);
            }
        }
        if let Some(p) = info.blocks {
            if keep_hashes {
                let key = &self.keep.key;
                rec.prefix_hashes = Some(p.hashes.iter().map(|&h| key.hash_u64(h)).collect());
            }
            if rec.prompt_tokens.is_none() {
                rec.prompt_tokens = Some(p.tokens as i64);
                rec.prompt_tokens_source = Some(TokenSource::Tokenizer);
            }
        }
        if let Some(s) = info.shed {
            // Queued untokenized (no hashes kept): counted here only when the upstream
            // reported no usage and this thread keeps up.
            let counted = s
                .body
                .as_ref()
                .filter(|_| rec.prompt_tokens.is_none() && !behind)
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
                .and_then(|v| match v {
                    serde_json::Value::Object(o) => Some(o),
                    _ => None,
                })
                .and_then(|o| {
                    let api = Api::of_endpoint(&rec.endpoint).unwrap_or(Api::Chat);
                    prompt_tokens(&chat_view(api, o), self.tokenizer)
                });
            if keep_hashes && s.body.is_none() && s.estimate.is_some() {
                shed.prefix_hashes.fetch_add(1, Relaxed);
            }
            if rec.prompt_tokens.is_none() {
                if let Some(n) = counted {
                    rec.prompt_tokens = Some(n as i64);
                    rec.prompt_tokens_source = Some(TokenSource::Tokenizer);
                } else if let Some(n) = s.estimate {
                    shed.prompt_tokens.fetch_add(1, Relaxed);
                    rec.prompt_tokens = Some(n as i64);
                    rec.prompt_tokens_source = Some(TokenSource::Estimate);
                }
            }
        }
        if let Some(m) = &info.media {
            let int32 = |n: usize| n.min(i32::MAX as usize) as i32;
            rec.images = Some(int32(m.images));
            rec.image_bytes = Some(m.image_bytes.min(i64::MAX as u64) as i64);
            rec.image_dims = Some(m.image_dims.clone());
            rec.audio_inputs = Some(int32(m.audio));
            rec.audio_bytes = Some(m.audio_bytes.min(i64::MAX as u64) as i64);
        }
        fill_tools(
            &mut rec,
            info.tools.as_ref(),
            seen.calls.as_ref(),
            &self.keep.naming(),
        );
        // Linked by the keys it writes (keyed: the fleet pass over several captures' rows
        // finds what this thread found), written unless the grade keeps no hashes.
        let key = &self.keep.key;
        let keys = link_keys(info.chain.as_ref(), info.tools.as_ref(), &seen, |h| {
            key.hash_u64(h)
        });
        self.links.link(&mut rec, &keys);
        if self.keep.grade.hashes() {
            rec.link_keys = keys;
        }
        if let Some((id, started)) = &self.keep.capture {
            rec.capture_id = Some(id.clone());
            rec.capture_started_us = Some(*started);
        }
        if let Some(p) = info.completion.filter(|_| info.chain.is_none()) {
            crate::linking::completions::link(&mut rec, &p, seen.answer, &mut self.completions);
        }
        if let (Some(dir), Some(body)) = (&self.keep.blobs, &rec.body) {
            // On an I/O error (a full disk) the body keeps its images: nothing is lost.
            if let Ok(Some(b)) = trace_format::blobs::store(body, dir, &self.keep.key) {
                rec.body = Some(b);
            }
        }
        rec.error = rec
            .error
            .map(|e| trace_format::privacy::error_text(self.keep.grade, e));
        // After linking (think times are measured on the exact times).
        let b = self.keep.time_bucket_us;
        if b > 0 {
            rec.arrival_time_us -= rec.arrival_time_us.rem_euclid(b);
        }
        rec
    }
}

/// The sending side; cheap to share.
#[derive(Debug, Clone)]
pub(crate) struct Sink {
    tx: SyncSender<Msg>,
    metrics: Arc<Metrics>,
}

/// The writer thread; [`WriterThread::close`] finishes the files.
#[derive(Debug)]
pub(crate) struct WriterThread {
    tx: SyncSender<Msg>,
    handle: JoinHandle<CloseReport>,
}

/// Opens the writer (recovering journals a crash left in the directory) and starts its
/// thread.
pub(crate) fn start(
    cfg: WriterConfig,
    capacity: usize,
    keep: Keep,
    shed_after: Duration,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    taps: Vec<Box<dyn Tap>>,
) -> Result<(Sink, WriterThread, RecoveryReport)> {
    let tick = cfg.flush_interval / 2;
    metrics
        .crash_window_us
        .store(cfg.flush_interval.as_micros() as u64, Relaxed);
    let (writer, report) = TraceWriter::open(cfg)?;
    let (tx, rx) = mpsc::sync_channel(capacity.max(1));
    let m = metrics.clone();
    let handle = std::thread::Builder::new()
        .name("llmreplay-writer".into())
        .spawn(move || {
            crate::runtime::threads::background();
            let resolver = Resolver {
                keep,
                tokenizer: &tokenizer,
                shed_after,
                metrics: &m,
                links: Links::default(),
                completions: CompletionLinker::new(crate::linking::completions::DEFAULT_MAX_KEYS),
            };
            run(writer, rx, tick, resolver, &m, taps)
        })?;
    Ok((
        Sink {
            tx: tx.clone(),
            metrics,
        },
        WriterThread { tx, handle },
        report,
    ))
}

fn run(
    mut writer: TraceWriter,
    rx: Receiver<Msg>,
    tick: Duration,
    mut resolver: Resolver<'_>,
    metrics: &Metrics,
    mut taps: Vec<Box<dyn Tap>>,
) -> CloseReport {
    let mut lost = LossCount::new(metrics, tick * 2);
    let tick = tick.max(Duration::from_millis(1));
    let mut last_tick = Instant::now();
    let mut mirror = Mirror::default();
    let mut log = ErrorLog::default();
    // A record is either written or counted by the writer (`stats`), so the result of an
    // append needs no handling here.
    let mut append = |writer: &mut TraceWriter,
                      lost: &mut LossCount,
                      taps: &mut Vec<Box<dyn Tap>>,
                      q: Box<Queued>| {
        let started = q.trace_started;
        let rec = resolver.resolve(*q);
        for t in taps.iter_mut() {
            t.row(&rec, started);
        }
        // The row may close a file: its manifest says what was lost until now.
        lost.update(writer, metrics);
        let _ = writer.append(rec);
        metrics.recorder_queue.pop();
    };
    loop {
        mirror.sync(writer.stats(), metrics);
        for n in writer.take_notices() {
            eprintln!("llmreplay capture: {n}");
        }
        if let Some(line) = log.observe(writer.stats(), metrics, Instant::now()) {
            eprintln!("{line}");
        }
        // The thread wakes on its own clock (or at close), not once per record: a send never
        // wakes it, and every record queued is handed to the OS by the tick that follows,
        // within the loss window.
        let until_tick = tick.saturating_sub(last_tick.elapsed());
        std::thread::park_timeout(until_tick.min(DRAIN_EVERY));
        loop {
            match rx.try_recv() {
                Ok(Msg::Record(q)) => append(&mut writer, &mut lost, &mut taps, q),
                Ok(Msg::Close) | Err(TryRecvError::Disconnected) => {
                    // Anything still queued was sent before Close: keep it.
                    while let Ok(Msg::Record(q)) = rx.try_recv() {
                        append(&mut writer, &mut lost, &mut taps, q);
                    }
                    let mut notices = writer.take_notices();
                    LossCount::new(metrics, lost.window()).update(&mut writer, metrics);
                    let report = writer.finish();
                    mirror.sync(&report.stats, metrics);
                    notices.extend(report.notices.iter().cloned());
                    notices.extend(report_notices(&report));
                    notices.extend(taps.drain(..).filter_map(|t| t.close()));
                    for n in notices {
                        eprintln!("llmreplay capture: {n}");
                    }
                    return report;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        if last_tick.elapsed() >= tick {
            last_tick = Instant::now();
            lost.update(&mut writer, metrics);
            // Errors are counted in the writer's stats and logged by `log`.
            let _ = writer.tick();
        }
    }
}

/// What the capture knows it lost, for the manifest of each file as it closes
/// ([`trace_format::privacy::Loss`]): copied from the metrics into the writer whenever it
/// changed (a few loads per row; the pass-through paths are read only when their count moved).
struct LossCount {
    last: Loss,
}

impl LossCount {
    fn new(metrics: &Metrics, flush_interval: Duration) -> LossCount {
        LossCount {
            last: Loss {
                capture: metrics.capture_id.clone(),
                crash_window_ms: flush_interval.as_millis() as u64,
                // Differs from any count: the first update sets the writer's.
                unrecorded: u64::MAX,
                ..Loss::default()
            },
        }
    }

    fn window(&self) -> Duration {
        Duration::from_millis(self.last.crash_window_ms)
    }

    fn update(&mut self, writer: &mut TraceWriter, m: &Metrics) {
        let unrecorded = m.passthrough.load(Relaxed);
        let now = Loss {
            queue_full: m.records_dropped_queue_full.load(Relaxed),
            shed_prefix_hashes: m.shed.prefix_hashes.load(Relaxed),
            shed_prompt_tokens: m.shed.prompt_tokens.load(Relaxed),
            shed_output_tokens: m.shed.output_tokens.load(Relaxed),
            unrecorded,
            unrecorded_paths: Vec::new(),
            ..self.last.clone()
        };
        let moved = unrecorded != self.last.unrecorded;
        let same = Loss {
            unrecorded_paths: Vec::new(),
            ..self.last.clone()
        };
        if now == same {
            return;
        }
        let paths = if moved {
            m.unrecorded
                .counts()
                .0
                .into_iter()
                .map(|(method, path, n)| {
                    (
                        method,
                        trace_format::redact::redact_text(&path).into_owned(),
                        n,
                    )
                })
                .collect()
        } else {
            std::mem::take(&mut self.last.unrecorded_paths)
        };
        self.last = Loss {
            unrecorded_paths: paths,
            ..now
        };
        writer.set_loss(self.last.clone());
    }
}

/// Log lines for what closing left unfinished.
fn report_notices(r: &CloseReport) -> Vec<String> {
    r.journals_left
        .iter()
        .map(|d| {
            format!(
                "{} ({} records) could not be finished ({}); kept for the next start",
                d.journal.display(),
                d.records,
                d.reason
            )
        })
        .collect()
}

/// Mirrors the writer's counters into the metrics (by differences, since the queue also
/// counts drops).
#[derive(Default)]
struct Mirror {
    last: WriterStats,
}

impl Mirror {
    fn sync(&mut self, st: &WriterStats, m: &Metrics) {
        let add = |a: &std::sync::atomic::AtomicU64, new: u64, old: u64| {
            if new > old {
                a.fetch_add(new - old, Relaxed);
            }
        };
        let l = &self.last;
        add(&m.records_written, st.written, l.written);
        add(&m.records_dropped, st.dropped, l.dropped);
        add(&m.record_errors, st.errors, l.errors);
        add(
            &m.records_recovered,
            st.recovered_records,
            l.recovered_records,
        );
        add(&m.journal_lines_damaged, st.damaged_lines, l.damaged_lines);
        add(&m.journal_lines_torn, st.torn_lines, l.torn_lines);
        add(&m.journal_files_set_aside, st.set_aside, l.set_aside);
        m.trace_write_failing.store(u64::from(st.failing), Relaxed);
        m.journals_pending
            .store(st.journals_pending as u64, Relaxed);
        if self.last != *st {
            self.last = st.clone();
        }
    }
}

/// Rate-limited log of the writer's errors: the first at once, then at most one line per
/// [`LOG_EVERY`] with the count since the previous line, and one when writes succeed again.
#[derive(Default)]
struct ErrorLog {
    last_line: Option<Instant>,
    errors_logged: u64,
    /// An error was logged and no "succeed again" since.
    reported_failing: bool,
}

impl ErrorLog {
    /// The line to log now, if any.
    fn observe(&mut self, st: &WriterStats, m: &Metrics, now: Instant) -> Option<String> {
        let unlogged = st.errors.saturating_sub(self.errors_logged);
        let may = self.last_line.is_none_or(|t| now - t >= LOG_EVERY);
        if !may {
            return None;
        }
        let dropped = m.records_dropped.load(Relaxed);
        let last = st.last_error.as_deref().unwrap_or("unknown error");
        if unlogged > 0 {
            let line = if self.last_line.is_none() {
                format!(
                    "llmreplay capture: trace write failed: {last}. Capture keeps serving; rows that cannot be written are dropped and counted in records_dropped_total ({dropped} so far); further errors are summarized every {}s",
                    LOG_EVERY.as_secs()
                )
            } else {
                format!(
                    "llmreplay capture: {unlogged} more trace write error(s); last: {last}; {dropped} rows dropped so far, {} journal(s) waiting to be finished",
                    st.journals_pending
                )
            };
            self.errors_logged = st.errors;
            self.last_line = Some(now);
            self.reported_failing = true;
            Some(line)
        } else if self.reported_failing && !st.failing {
            self.reported_failing = false;
            self.last_line = Some(now);
            Some(format!(
                "llmreplay capture: trace writes succeed again; {dropped} rows dropped so far"
            ))
        } else {
            None
        }
    }
}

impl Sink {
    /// Queues a record (with its prompt's pending tokenization and what linking needs of its
    /// response), or drops and counts it when the queue is full.
    pub(crate) fn send(
        &self,
        rec: TraceRecord,
        prompt: Option<PendingPrompt>,
        output: Generated,
        seen: Seen,
        trace_started: bool,
    ) {
        let queued_at = Instant::now();
        let msg = Msg::Record(Box::new(Queued {
            rec,
            trace_started,
            prompt,
            output,
            seen,
            queued_at,
        }));
        // Full or disconnected (closing): the row is dropped and counted.
        let queued = self.metrics.recorder_queue.push_with(queued_at, || {
            !matches!(
                self.tx.try_send(msg),
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_))
            )
        });
        if !queued {
            self.metrics.records_dropped.fetch_add(1, Relaxed);
            let n = self
                .metrics
                .records_dropped_queue_full
                .fetch_add(1, Relaxed)
                + 1;
            if n.is_power_of_two() || n % 1000 == 0 {
                eprintln!("llmreplay capture: trace writer queue full, {n} records dropped so far");
            }
        }
    }
}

impl WriterThread {
    /// Finishes the files (after everything queued before this call) and says what it
    /// finished and what it left.
    pub(crate) fn close(self) -> Result<CloseReport> {
        let _ = self.tx.send(Msg::Close);
        drop(self.tx);
        self.handle.thread().unpark();
        self.handle
            .join()
            .map_err(|_| ProxyError::WriterThread("panicked".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_format::{Outcome, ParentLink};

    fn test_keep() -> Keep {
        Keep {
            time_bucket_us: 0,
            blobs: None,
            grade: Grade::Hashes,
            key: Arc::new(HashKey::random()),
            capture: None,
        }
    }

    fn links() -> Links {
        use crate::linking::{agents::Agents, responses::ResponseIds, sessions::Linker};
        Links {
            sessions: Linker::new(100),
            agents: Agents::new(100),
            responses: ResponseIds::new(100),
        }
    }

    fn answered(answer: Option<u64>) -> Seen {
        Seen {
            answer,
            ..Default::default()
        }
    }

    fn chat(id: &str, at: i64, e2el: i64, outcome: Outcome) -> TraceRecord {
        let mut r = TraceRecord::new(id, at, "/v1/chat/completions");
        r.e2el_us = Some(e2el);
        r.outcome = outcome;
        r
    }

    /// The writer thread's linking: a turn continues the ok request whose answer it carries
    /// (think time from the end of that response); a failed or cancelled request leaves no
    /// answer to continue; a row without a chat chain is not given a session; a header
    /// session stays.
    #[test]
    fn rows_are_linked_in_the_order_they_finish() {
        use crate::linking::sessions::{chat_keys, TextHash};
        let body = |msgs: &[(&str, &str)]| {
            let m: Vec<serde_json::Value> = msgs
                .iter()
                .map(|(r, t)| serde_json::json!({"role": r, "content": t}))
                .collect();
            chat_keys(serde_json::json!({"messages": m}).as_object().unwrap()).unwrap()
        };
        let mut l = links();
        let t1 = body(&[("user", "hi")]);
        let t2 = body(&[("user", "hi"), ("assistant", "hello"), ("user", "more")]);
        let answer = Some(TextHash::of("hello"));

        let mut first = chat("a1", 1_000, 2_000, Outcome::Ok);
        l.link(
            &mut first,
            &link_keys(Some(&t1), None, &answered(answer), |h| h),
        );
        assert_eq!(first.session_id.as_deref(), Some("a1"));
        let mut second = chat("a2", 3_500, 1_000, Outcome::Ok);
        l.link(
            &mut second,
            &link_keys(Some(&t2), None, &answered(None), |h| h),
        );
        assert_eq!(
            (
                second.session_id.as_deref(),
                second.parent_request_id.as_deref()
            ),
            (Some("a1"), Some("a1"))
        );
        assert_eq!(second.think_time_us, Some(500), "3.5 ms − (1 ms + 2 ms)");
        assert_eq!(second.parent_link, Some(ParentLink::ChatPrefix));
        assert_eq!(first.parent_link, None);

        let mut l = links();
        for (id, outcome) in [
            ("b0", Outcome::UpstreamError),
            ("b1", Outcome::ClientCancelled),
        ] {
            let mut failed = chat(id, 0, 100, outcome);
            l.link(
                &mut failed,
                &link_keys(Some(&t1), None, &answered(answer), |h| h),
            );
        }
        let mut next = chat("b2", 1_000, 100, Outcome::Ok);
        l.link(
            &mut next,
            &link_keys(Some(&t2), None, &answered(None), |h| h),
        );
        assert_eq!(
            next.parent_request_id, None,
            "a failed answer is not continued"
        );

        let mut completion = TraceRecord::new("c1", 0, "/v1/completions");
        l.link(
            &mut completion,
            &link_keys(None, None, &answered(answer), |h| h),
        );
        assert_eq!(completion.session_id, None);
        let mut named = chat("d1", 0, 10, Outcome::Ok);
        named.session_id = Some("H".into());
        l.link(
            &mut named,
            &link_keys(Some(&t1), None, &answered(answer), |h| h),
        );
        assert_eq!(named.session_id.as_deref(), Some("H"));
    }

    /// A row whose prompt is still tokenizing counts in the recorder's queue (its lag) until
    /// the writer has it; then it is written with what the runner gave (its hashes keyed),
    /// and the queue is empty again.
    #[test]
    fn a_row_waiting_for_its_prompt_counts_in_the_lag() {
        use crate::prefix::PromptBlocks;
        use crate::recording::prompts::PromptInfo;
        let dir = tempfile::tempdir().unwrap();
        let meta = trace_format::FileMeta::new(trace_format::Producer::Capture, "test");
        let mut cfg = WriterConfig::new(dir.path(), "t", meta);
        cfg.flush_interval = Duration::from_millis(20);
        let m = Arc::new(Metrics::default());
        let tok = Arc::new(Tokenizer::words());
        let keep = test_keep();
        let key = keep.key.clone();
        let (sink, writer, _) = start(
            cfg,
            16,
            keep,
            Duration::from_secs(3600),
            tok,
            m.clone(),
            Vec::new(),
        )
        .unwrap();
        let (tx, rx) = mpsc::sync_channel(1);
        sink.send(
            chat("a", 0, 10, Outcome::Ok),
            Some(rx),
            Generated::default(),
            Seen::default(),
            false,
        );
        assert_eq!(m.recorder_queue.len(), 1);
        let later = Instant::now() + Duration::from_secs(5);
        assert!(m.recorder_queue.lag(later) >= Duration::from_secs(5));
        tx.send(PromptInfo {
            blocks: Some(PromptBlocks {
                hashes: vec![7, 8],
                tokens: 33,
            }),
            ..Default::default()
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !m.recorder_queue.is_empty() {
            assert!(Instant::now() < deadline, "the row was never written");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(m.recorder_queue.lag(later), Duration::ZERO);
        writer.close().unwrap();
        let rows = trace_format::read_traces(&[dir.path().to_str().unwrap()])
            .unwrap()
            .records;
        assert_eq!(rows.len(), 1);
        // Written under the key, never as the runner's unkeyed chain.
        assert_eq!(
            rows[0].prefix_hashes,
            Some(vec![key.hash_u64(7), key.hash_u64(8)])
        );
        assert_eq!(rows[0].prompt_tokens, Some(33));
        assert_eq!(m.shed.prefix_hashes.load(Relaxed), 0);
    }

    /// A prompt a starved runner never delivers does not hold the writer up past the row's
    /// shed budget: the row is written without hashes or a prompt count, and the shed work
    /// is counted, on /metrics and in the file's manifest. (Before, the writer waited 10 s
    /// per such prompt and counted nothing.)
    #[test]
    fn a_prompt_not_ready_within_the_budget_is_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let mut meta = trace_format::FileMeta::new(trace_format::Producer::Capture, "test");
        meta.privacy = Some(trace_format::privacy::Manifest::new(
            Grade::Hashes,
            None,
            16,
            "words",
        ));
        let mut cfg = WriterConfig::new(dir.path(), "t", meta);
        cfg.flush_interval = Duration::from_millis(20);
        let m = Arc::new(Metrics::default());
        let tok = Arc::new(Tokenizer::words());
        let budget = Duration::from_millis(20);
        let (sink, writer, _) =
            start(cfg, 16, test_keep(), budget, tok, m.clone(), Vec::new()).unwrap();
        let (tx, rx) = mpsc::sync_channel::<crate::recording::prompts::PromptInfo>(1);
        sink.send(
            chat("a", 0, 10, Outcome::Ok),
            Some(rx),
            Generated::default(),
            Seen::default(),
            false,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while m.shed.prefix_hashes.load(Relaxed) == 0 {
            assert!(Instant::now() < deadline, "the writer is still waiting");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(m.shed.prompt_tokens.load(Relaxed), 1);
        writer.close().unwrap();
        drop(tx);
        let rows = trace_format::read_traces(&[dir.path().to_str().unwrap()])
            .unwrap()
            .records;
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].prefix_hashes.as_ref(), rows[0].prompt_tokens),
            (None, None)
        );
        let t = trace_format::read_traces(&[dir.path().to_str().unwrap()]).unwrap();
        let loss = t.files[0].meta.privacy.as_ref().unwrap().loss.clone();
        let loss = loss.expect("the loss counts");
        assert_eq!(
            (
                loss.shed_prefix_hashes,
                loss.shed_prompt_tokens,
                loss.queue_full,
                loss.crash_window_ms
            ),
            (1, 1, 0, 20)
        );
        assert_eq!(loss.capture, m.capture_id);
    }

    /// A disk failing on every tick (every 25 ms) for a minute: the first error at once,
    /// then one summary line per 10 s with the count, and one line when writes succeed.
    #[test]
    fn writer_errors_are_logged_first_then_summarized_every_10s() {
        let m = Metrics::default();
        let mut log = ErrorLog::default();
        let mut st = WriterStats::default();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        for i in 0..2400u32 {
            st.errors += 1;
            st.failing = true;
            st.last_error = Some("No space left on device".into());
            let now = t0 + Duration::from_millis(25) * i;
            lines.extend(log.observe(&st, &m, now));
        }
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert!(lines[0].contains("trace write failed: No space left on device"));
        // About 10 s of errors at 40 a second, counted.
        assert!(
            lines[1].contains("399 more trace write error(s)")
                || lines[1].contains("400 more trace write error(s)"),
            "{}",
            lines[1]
        );
        st.failing = false;
        // The errors since the last line are summarized first, then the recovery is said.
        let later = t0 + Duration::from_secs(61);
        let rest = log.observe(&st, &m, later).expect("the last errors");
        assert!(rest.contains("more trace write error(s)"), "{rest}");
        let later = later + LOG_EVERY;
        let back = log
            .observe(&st, &m, later)
            .expect("a line when writes succeed");
        assert!(back.contains("succeed again"), "{back}");
        assert_eq!(log.observe(&st, &m, later + LOG_EVERY), None);
    }
}
