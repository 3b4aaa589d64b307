//! The proxy's own metrics, rendered in the Prometheus text format on the admin listener.
//!
//! Everything is an atomic updated once per request when its record is finished (never per
//! chunk, never under a lock). Latency histograms use vLLM's bucket bounds under the
//! `llmreplay_capture_` prefix, so they line up with a vLLM server's own; the OpenTelemetry
//! GenAI client metrics (`gen_ai_client_operation_duration_seconds`,
//! `gen_ai_client_token_usage`) use the bucket bounds the semantic conventions advise. No
//! label carries request data (model names, headers), but the method and path of what is
//! forwarded without being recorded ([`Unrecorded`]: the first [`UNRECORDED_PATHS`]
//! distinct ones, then `other`): cardinality stays bounded and no secret can leak into a
//! scrape (a path has no query or header).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use trace_format::Outcome;

use wire::prometheus::{self, escape_label};
use wire::vllm_metrics::{ITL_BUCKETS, REQUEST_LATENCY_BUCKETS as E2E_BUCKETS, TTFT_BUCKETS};

/// OpenTelemetry GenAI advice for `gen_ai.client.operation.duration`.
pub const OTEL_DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// OpenTelemetry GenAI advice for `gen_ai.client.token.usage`.
pub const OTEL_TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// A fixed-bucket histogram of atomics; the sum is kept in millionths of the unit.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum_micro: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micro: AtomicU64::new(0),
        }
    }

    /// Adds one observation.
    pub fn observe(&self, v: f64) {
        let v = if v.is_finite() && v > 0.0 { v } else { 0.0 };
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micro.fetch_add((v * 1e6) as u64, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, help: &str, head: bool) {
        if head {
            prometheus::head(out, name, help, "histogram");
        }
        let counts = self.counts.iter().map(|c| c.load(Relaxed));
        let sum = self.sum_micro.load(Relaxed) as f64 / 1e6;
        let count = self.count.load(Relaxed);
        prometheus::histogram(out, name, labels, self.bounds, counts, sum, count);
    }
}

/// When each record still queued for the writer thread was queued, oldest first: the
/// recorder's lag (`recorder_lag_seconds`) is the age of the front. A record is pushed when it
/// is queued and popped once it is written (or counted as not written), so a record the writer
/// is waiting on (its prompt still tokenizing) counts until it is done.
#[derive(Debug, Default)]
pub struct RecorderQueue {
    queued: Mutex<VecDeque<Instant>>,
}

impl RecorderQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Instant>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `send` (queueing one record queued at `at`) under the lock, so the times stay in
    /// queue order; the record counts when `send` says it was queued.
    pub(crate) fn push_with(&self, at: Instant, send: impl FnOnce() -> bool) -> bool {
        let mut q = self.lock();
        let queued = send();
        if queued {
            q.push_back(at);
        }
        queued
    }

    /// One record left the queue (written, or counted as not written).
    pub(crate) fn pop(&self) {
        self.lock().pop_front();
    }

    /// The age of the oldest record queued, zero when none is.
    pub fn lag(&self, now: Instant) -> Duration {
        self.lock()
            .front()
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(*t))
    }

    /// Records queued and not yet written.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is queued.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// Recording work left undone to keep up (the row is written without it; see docs/internals.md,
/// "What the recorder sheds"), by kind.
#[derive(Debug, Default)]
pub struct ShedWork {
    /// Prompts not tokenized into `prefix_hashes` (the row has none).
    pub prefix_hashes: AtomicU64,
    /// Prompt token counts estimated instead of counted (`prompt_tokens_source` `estimate`).
    pub prompt_tokens: AtomicU64,
    /// Output token counts estimated instead of counted (`output_tokens_source` `estimate`).
    pub output_tokens: AtomicU64,
}

/// Distinct method and path pairs counted apart in `unrecorded_requests_total`; the rest
/// count as `other`.
pub const UNRECORDED_PATHS: usize = 32;

/// What capture forwards without recording it, by method and path: the first
/// [`UNRECORDED_PATHS`] distinct pairs, then `other`. Touched once per pass-through request
/// (never on a recorded one), under a lock.
#[derive(Debug, Default)]
pub struct Unrecorded {
    seen: Mutex<UnrecordedCounts>,
}

/// (method, path, requests) for the pairs counted apart, and the requests of all others.
type UnrecordedCounts = (Vec<(String, String, u64)>, u64);

impl Unrecorded {
    /// Counts one request; true the first time this method and path is seen (when it is
    /// counted apart: the caller says so in the log once).
    pub fn count(&self, method: &str, path: &str) -> bool {
        let mut g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (paths, other) = &mut *g;
        if let Some(e) = paths.iter_mut().find(|e| e.0 == method && e.1 == path) {
            e.2 += 1;
            return false;
        }
        if paths.len() >= UNRECORDED_PATHS {
            *other += 1;
            return false;
        }
        paths.push((method.to_string(), path.to_string(), 1));
        true
    }

    /// (method, path, count) of each pair counted apart, then the `other` count.
    pub fn counts(&self) -> (Vec<(String, String, u64)>, u64) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// All of the proxy's metrics.
#[derive(Debug)]
pub struct Metrics {
    requests: [AtomicU64; 5],
    /// Requests forwarded without a record (not a recorded API).
    pub passthrough: AtomicU64,
    /// Those requests by method and path.
    pub unrecorded: Unrecorded,
    /// Recorded requests not yet finished.
    pub in_flight: AtomicI64,
    /// Records handed to the OS in a journal (they reach a Parquet file at rotation, or by
    /// recovery when the directory could not take the Parquet file then).
    pub records_written: AtomicU64,
    /// Records that will never reach a trace file, whatever the reason: the writer's queue
    /// was full, or the trace directory could not take them (full disk, I/O error). Exact.
    pub records_dropped: AtomicU64,
    /// The part of `records_dropped` whose writer queue was full.
    pub records_dropped_queue_full: AtomicU64,
    /// The journal's flush interval, µs: what a `kill -9` can lose, uncounted (the rows of
    /// requests that ended within it, and those in flight).
    pub crash_window_us: AtomicU64,
    /// This capture's id in the manifests' loss counts (random per start).
    pub capture_id: String,
    /// Failed writes to the trace directory (journal lines, new journals, Parquet files,
    /// retries of journals not finished). The rows they cost are in `records_dropped`.
    pub record_errors: AtomicU64,
    /// 1 while the last write of records to the trace directory failed, else 0.
    pub trace_write_failing: AtomicU64,
    /// Journals the directory could not take the Parquet file of yet: kept, retried.
    pub journals_pending: AtomicU64,
    /// Records finished from journals (a previous run's at start, deferred ones later).
    pub records_recovered: AtomicU64,
    /// Damaged journal lines found by recovery (their journal is set aside).
    pub journal_lines_damaged: AtomicU64,
    /// Torn final journal lines dropped by recovery (the crash loss window).
    pub journal_lines_torn: AtomicU64,
    /// Journals with damaged lines renamed aside (`<name>.damaged-<utc>`, never deleted).
    pub journal_files_set_aside: AtomicU64,
    /// Request body bytes of recorded requests.
    pub request_bytes: AtomicU64,
    /// Response body bytes sent to clients for recorded requests.
    pub response_bytes: AtomicU64,
    /// Connections closed because no request began within the first-byte timeout.
    pub client_first_byte_timeouts: AtomicU64,
    /// Connections closed because a request head was not complete within its timeout.
    pub client_header_timeouts: AtomicU64,
    /// Keep-alive connections closed after idling past their timeout.
    pub client_keepalive_timeouts: AtomicU64,
    /// Requests answered 408 because their body came too slowly.
    pub client_body_timeouts: AtomicU64,
    /// Failed accepts (e.g. EMFILE: out of descriptors), each followed by a back-off.
    pub accept_errors: AtomicU64,
    /// SSE events larger than the bound, forwarded unobserved.
    pub sse_oversized_events: AtomicU64,
    /// 1 while the last check reached the upstream, 0 while it did not (or before the first
    /// check), -1 when it is not checked (no `upstream_check_interval`; not shown).
    pub upstream_up: AtomicI64,
    /// Records queued for the writer thread, with when they were queued (the lag).
    pub recorder_queue: RecorderQueue,
    /// Work the recorder shed to keep up.
    pub shed: ShedWork,
    /// Time to first chunk.
    pub ttft: Histogram,
    /// Gaps between consecutive chunks of successful streams.
    pub itl: Histogram,
    /// End-to-end latency of successful requests.
    pub e2el: Histogram,
    /// OTel `gen_ai.client.operation.duration`.
    pub otel_duration: Histogram,
    /// OTel `gen_ai.client.token.usage`, input.
    pub otel_input_tokens: Histogram,
    /// OTel `gen_ai.client.token.usage`, output.
    pub otel_output_tokens: Histogram,
    /// The OTLP exporter's counters, when `--otlp-endpoint` is given (shown then only).
    pub otlp: std::sync::OnceLock<std::sync::Arc<telemetry::ExportStats>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Default::default(),
            passthrough: AtomicU64::new(0),
            unrecorded: Unrecorded::default(),
            in_flight: AtomicI64::new(0),
            records_written: AtomicU64::new(0),
            records_dropped: AtomicU64::new(0),
            records_dropped_queue_full: AtomicU64::new(0),
            crash_window_us: AtomicU64::new(0),
            capture_id: trace_format::privacy::Loss::new_capture_id(),
            record_errors: AtomicU64::new(0),
            trace_write_failing: AtomicU64::new(0),
            journals_pending: AtomicU64::new(0),
            records_recovered: AtomicU64::new(0),
            journal_lines_damaged: AtomicU64::new(0),
            journal_lines_torn: AtomicU64::new(0),
            journal_files_set_aside: AtomicU64::new(0),
            request_bytes: AtomicU64::new(0),
            response_bytes: AtomicU64::new(0),
            client_first_byte_timeouts: AtomicU64::new(0),
            client_header_timeouts: AtomicU64::new(0),
            client_keepalive_timeouts: AtomicU64::new(0),
            client_body_timeouts: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            sse_oversized_events: AtomicU64::new(0),
            upstream_up: AtomicI64::new(-1),
            recorder_queue: RecorderQueue::default(),
            shed: ShedWork::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2el: Histogram::new(E2E_BUCKETS),
            otel_duration: Histogram::new(OTEL_DURATION_BUCKETS),
            otel_input_tokens: Histogram::new(OTEL_TOKEN_BUCKETS),
            otel_output_tokens: Histogram::new(OTEL_TOKEN_BUCKETS),
            otlp: std::sync::OnceLock::new(),
        }
    }
}

fn outcome_index(o: Outcome) -> usize {
    Outcome::ALL.iter().position(|x| *x == o).unwrap_or(0)
}

impl Metrics {
    /// Counts one finished recorded request.
    pub fn count_outcome(&self, o: Outcome) {
        self.requests[outcome_index(o)].fetch_add(1, Relaxed);
    }

    /// Finished recorded requests with this outcome.
    pub fn requests(&self, o: Outcome) -> u64 {
        self.requests[outcome_index(o)].load(Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(16 * 1024);
        let p = "llmreplay_capture";
        let name = format!("{p}_requests_total");
        prometheus::head(&mut s, &name, "Recorded requests by outcome.", "counter");
        for o in Outcome::ALL {
            let outcome = format!("outcome=\"{o}\"");
            prometheus::sample(&mut s, &name, &outcome, self.requests(*o));
        }
        self.render_counters(&mut s, p);
        self.render_unrecorded(&mut s, p);
        self.render_otlp(&mut s, p);
        let up = self.upstream_up.load(Relaxed);
        if up >= 0 {
            let name = format!("{p}_upstream_up");
            let help = "1 while the last check reached the upstream (a TCP connection to its host and port), else 0.";
            prometheus::single(&mut s, &name, help, "gauge", "", up);
        }
        let name = format!("{p}_client_timeouts_total");
        let help = "Client connections closed by a client-side timeout, by phase.";
        prometheus::head(&mut s, &name, help, "counter");
        for (phase, v) in [
            ("first_byte", &self.client_first_byte_timeouts),
            ("header", &self.client_header_timeouts),
            ("keepalive", &self.client_keepalive_timeouts),
        ] {
            let phase = format!("phase=\"{phase}\"");
            prometheus::sample(&mut s, &name, &phase, v.load(Relaxed));
        }
        let lag = self.recorder_queue.lag(Instant::now()).as_secs_f64();
        let crash_window = self.crash_window_us.load(Relaxed) as f64 / 1e6;
        let gauges: [(&str, &str, String); 4] = [
            (
                "crash_window_seconds",
                "What a kill -9 loses, uncounted: the rows of requests that ended within this long before it (the journal's flush interval), and those in flight.",
                format!("{crash_window:.3}"),
            ),
            (
                "recorder_lag_seconds",
                "Age of the oldest record queued for the trace writer (its prompt may still be tokenizing).",
                format!("{lag:.6}"),
            ),
            (
                "recorder_queued_records",
                "Records queued for the trace writer.",
                self.recorder_queue.len().to_string(),
            ),
            (
                "requests_in_flight",
                "Recorded requests in flight.",
                self.in_flight.load(Relaxed).to_string(),
            ),
        ];
        for (name, help, v) in gauges {
            let name = format!("{p}_{name}");
            prometheus::single(&mut s, &name, help, "gauge", "", v);
        }
        let name = format!("{p}_recorder_shed_total");
        let help =
            "Recording work left undone to keep up, by kind (the row is written without it).";
        prometheus::head(&mut s, &name, help, "counter");
        for (work, v) in [
            ("prefix_hashes", &self.shed.prefix_hashes),
            ("prompt_tokens", &self.shed.prompt_tokens),
            ("output_tokens", &self.shed.output_tokens),
        ] {
            let work = format!("work=\"{work}\"");
            prometheus::sample(&mut s, &name, &work, v.load(Relaxed));
        }
        self.render_histograms(&mut s, p);
        s
    }

    /// Pass-through requests by method and path ([`Unrecorded`]).
    fn render_unrecorded(&self, s: &mut String, p: &str) {
        let name = format!("{p}_unrecorded_requests_total");
        let help = format!("Requests forwarded without a record, by method and path (the first {UNRECORDED_PATHS} distinct ones; then method and path \"other\").");
        prometheus::head(s, &name, &help, "counter");
        let (paths, other) = self.unrecorded.counts();
        for (method, path, n) in paths {
            let labels = format!(
                "method=\"{}\",path=\"{}\"",
                escape_label(&method),
                escape_label(&path)
            );
            prometheus::sample(s, &name, &labels, n);
        }
        if other > 0 {
            prometheus::sample(s, &name, "method=\"other\",path=\"other\"", other);
        }
    }

    /// The OTLP exporter's span counts, while exporting (`--otlp-endpoint`).
    fn render_otlp(&self, s: &mut String, p: &str) {
        if let Some(o) = self.otlp.get() {
            let name = format!("{p}_otlp_spans_total");
            let help = "Recorded rows sent to --otlp-endpoint as spans, by result (dropped: the exporter's queue was full; failed: lost in a failed export).";
            prometheus::head(s, &name, help, "counter");
            for (result, v) in [
                ("exported", &o.spans_exported),
                ("dropped", &o.spans_dropped),
                ("failed", &o.spans_failed),
            ] {
                let result = format!("result=\"{result}\"");
                prometheus::sample(s, &name, &result, v.load(Relaxed));
            }
        }
    }

    /// The plain counters and gauges of the exposition, each with its help.
    fn render_counters(&self, s: &mut String, p: &str) {
        let counters: [(&str, &str, &AtomicU64); 14] = [
            (
                "passthrough_requests_total",
                "Requests forwarded without a record (not a recorded API: see unrecorded_requests_total).",
                &self.passthrough,
            ),
            (
                "records_written_total",
                "Records handed to the OS in a trace journal.",
                &self.records_written,
            ),
            (
                "records_dropped_total",
                "Records that will never reach a trace file (writer queue full, or the trace directory could not take them).",
                &self.records_dropped,
            ),
            (
                "records_dropped_queue_full_total",
                "The part of records_dropped_total dropped because the trace writer's queue was full (the rest: the trace directory could not take them).",
                &self.records_dropped_queue_full,
            ),
            (
                "record_errors_total",
                "Failed writes to the trace directory (the rows they cost are in records_dropped_total).",
                &self.record_errors,
            ),
            (
                "records_recovered_total",
                "Records finished from journals left by a previous run or deferred by a full disk.",
                &self.records_recovered,
            ),
            (
                "journal_lines_damaged_total",
                "Damaged journal lines found by recovery (the journal is set aside).",
                &self.journal_lines_damaged,
            ),
            (
                "journal_lines_torn_total",
                "Torn final journal lines dropped by recovery (a crash's loss window).",
                &self.journal_lines_torn,
            ),
            (
                "journal_files_set_aside_total",
                "Journals with damaged lines renamed aside to <name>.damaged-<utc> (never deleted).",
                &self.journal_files_set_aside,
            ),
            (
                "request_bytes_total",
                "Request body bytes of recorded requests.",
                &self.request_bytes,
            ),
            (
                "response_bytes_total",
                "Response body bytes sent to clients for recorded requests.",
                &self.response_bytes,
            ),
            (
                "client_body_timeouts_total",
                "Requests answered 408 because their body came too slowly.",
                &self.client_body_timeouts,
            ),
            (
                "accept_errors_total",
                "Failed accepts on the proxy and admin listeners (e.g. out of descriptors), each backed off.",
                &self.accept_errors,
            ),
            (
                "sse_oversized_events_total",
                "SSE events over the size bound, forwarded as they arrived without being observed or stripped.",
                &self.sse_oversized_events,
            ),
        ];
        for (name, help, v) in counters {
            let name = format!("{p}_{name}");
            prometheus::single(s, &name, help, "counter", "", v.load(Relaxed));
        }
        let gauges: [(&str, &str, &AtomicU64); 2] = [
            (
                "trace_write_failing",
                "1 while the last write of records to the trace directory failed (rows are being dropped).",
                &self.trace_write_failing,
            ),
            (
                "journals_pending",
                "Journals not finished into Parquet yet (the directory could not take them); kept and retried.",
                &self.journals_pending,
            ),
        ];
        for (name, help, v) in gauges {
            let name = format!("{p}_{name}");
            prometheus::single(s, &name, help, "gauge", "", v.load(Relaxed));
        }
    }

    /// The latency and token histograms of the exposition (vLLM's and OpenTelemetry's).
    fn render_histograms(&self, s: &mut String, p: &str) {
        self.ttft.render(
            s,
            &format!("{p}_time_to_first_token_seconds"),
            "",
            "Time from request arrival to the first chunk (vLLM buckets).",
            true,
        );
        self.itl.render(
            s,
            &format!("{p}_inter_token_latency_seconds"),
            "",
            "Gap between consecutive chunks of successful streams (vLLM buckets).",
            true,
        );
        self.e2el.render(
            s,
            &format!("{p}_e2e_request_latency_seconds"),
            "",
            "End-to-end latency of successful requests (vLLM buckets).",
            true,
        );
        self.otel_duration.render(
            s,
            "gen_ai_client_operation_duration_seconds",
            "",
            "GenAI operation duration seen by the proxy (OpenTelemetry GenAI).",
            true,
        );
        self.otel_input_tokens.render(
            s,
            "gen_ai_client_token_usage",
            "gen_ai_token_type=\"input\"",
            "Tokens used per request (OpenTelemetry GenAI).",
            true,
        );
        self.otel_output_tokens.render(
            s,
            "gen_ai_client_token_usage",
            "gen_ai_token_type=\"output\"",
            "",
            false,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pass-through requests are counted by method and path, the first UNRECORDED_PATHS
    /// pairs apart and the rest as `other`; each pair is new once; label values escaped.
    #[test]
    fn unrecorded_paths_are_counted_with_a_bounded_label_set() {
        let m = Metrics::default();
        assert!(m.unrecorded.count("GET", "/v1/models"));
        assert!(!m.unrecorded.count("GET", "/v1/models"));
        assert!(m.unrecorded.count("POST", "/v1/models"));
        assert!(m.unrecorded.count("GET", "/odd\"path\\"));
        for i in 0..100 {
            m.unrecorded
                .count("GET", &format!("/v1/responses/resp_{i}"));
        }
        let (paths, other) = m.unrecorded.counts();
        assert_eq!(paths.len(), UNRECORDED_PATHS);
        assert_eq!(other, 100 - (UNRECORDED_PATHS as u64 - 3));
        let text = m.render();
        for line in [
            "llmreplay_capture_unrecorded_requests_total{method=\"GET\",path=\"/v1/models\"} 2",
            "llmreplay_capture_unrecorded_requests_total{method=\"POST\",path=\"/v1/models\"} 1",
            "llmreplay_capture_unrecorded_requests_total{method=\"GET\",path=\"/odd\\\"path\\\\\"} 1",
            "llmreplay_capture_unrecorded_requests_total{method=\"other\",path=\"other\"} 71",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }

    #[test]
    fn renders_cumulative_buckets() {
        let m = Metrics::default();
        m.ttft.observe(0.003);
        m.ttft.observe(0.05);
        m.count_outcome(Outcome::ClientCancelled);
        let s = m.render();
        assert!(s.contains("llmreplay_capture_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
        assert!(s.contains("llmreplay_capture_time_to_first_token_seconds_bucket{le=\"0.06\"} 2"));
        assert!(s.contains("llmreplay_capture_time_to_first_token_seconds_count 2"));
        assert!(s.contains("llmreplay_capture_requests_total{outcome=\"client_cancelled\"} 1"));
        assert!(s.contains(
            "gen_ai_client_token_usage_bucket{gen_ai_token_type=\"output\",le=\"1.0\"} 0"
        ));
    }

    /// The lag is the age of the oldest record still queued; a record refused by the queue
    /// is not counted; the gauge and the shed counters are rendered.
    #[test]
    fn the_lag_is_the_age_of_the_oldest_queued_record() {
        let m = Metrics::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert!(m.recorder_queue.push_with(t0, || true));
        assert!(m.recorder_queue.push_with(t0 + s(2), || true));
        assert!(!m.recorder_queue.push_with(t0 + s(3), || false));
        assert_eq!(m.recorder_queue.len(), 2);
        assert_eq!(m.recorder_queue.lag(t0 + s(5)), s(5));
        m.recorder_queue.pop();
        assert_eq!(m.recorder_queue.lag(t0 + s(5)), s(3));
        m.recorder_queue.pop();
        assert_eq!(m.recorder_queue.lag(t0 + s(5)), Duration::ZERO);
        m.shed.prefix_hashes.store(4, Relaxed);
        let text = m.render();
        for line in [
            "# TYPE llmreplay_capture_recorder_lag_seconds gauge",
            "llmreplay_capture_recorder_lag_seconds 0.000000",
            "llmreplay_capture_recorder_queued_records 0",
            "llmreplay_capture_recorder_shed_total{work=\"prefix_hashes\"} 4",
            "llmreplay_capture_recorder_shed_total{work=\"output_tokens\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn renders_the_trace_directory_counters_and_gauges() {
        let m = Metrics::default();
        m.records_dropped.store(7, Relaxed);
        m.trace_write_failing.store(1, Relaxed);
        m.journal_lines_damaged.store(2, Relaxed);
        let s = m.render();
        for line in [
            "llmreplay_capture_records_dropped_total 7",
            "# TYPE llmreplay_capture_trace_write_failing gauge",
            "llmreplay_capture_trace_write_failing 1",
            "llmreplay_capture_journals_pending 0",
            "llmreplay_capture_journal_lines_damaged_total 2",
            "llmreplay_capture_journal_lines_torn_total 0",
            "llmreplay_capture_journal_files_set_aside_total 0",
            "llmreplay_capture_records_recovered_total 0",
        ] {
            assert!(s.lines().any(|l| l == line), "no {line:?} in\n{s}");
        }
    }

    /// The upstream gauge shows only while a checker sets it.
    #[test]
    fn renders_the_upstream_gauge_while_checked() {
        let m = Metrics::default();
        assert!(!m.render().contains("upstream_up"));
        m.upstream_up.store(0, Relaxed);
        let s = m.render();
        assert!(
            s.contains("# TYPE llmreplay_capture_upstream_up gauge\n"),
            "{s}"
        );
        assert!(
            s.lines().any(|l| l == "llmreplay_capture_upstream_up 0"),
            "{s}"
        );
    }
}
