//! vLLM-compatible metrics from per-request results (docs/metrics.md).
//!
//! Inputs are the result rows themselves (integer microseconds), added one at a time to a
//! [`MetricsBuilder`] in any order: every value is converted to milliseconds once, and
//! percentiles are exact over all values (numpy's linear interpolation) up to
//! [`EXACT_CAP`](trace_format::quantiles::EXACT_CAP) values a metric, then estimates within
//! [`RELATIVE_ERROR`](trace_format::quantiles::RELATIVE_ERROR) that their
//! [`Summary::estimate`] names; counts, sums, means and std stay exact. Memory is bounded
//! whatever the number of rows (see [`MetricsBuilder`]).

use std::collections::BTreeMap;

use serde::Serialize;
use trace_format::quantiles::Quantiles;
use trace_format::stats::Summary;
use trace_format::{Cause, CauseCounts, Outcome, TraceRecord};

use crate::config::{Slo, SloMetric};

mod overlap;
pub use overlap::max_overlap;
use overlap::Overlap;
#[cfg(test)]
use overlap::{Events, EVENT_BUCKETS};
#[cfg(test)]
use trace_format::quantiles::EXACT_CAP;

/// The aggregate metrics of one run against one target.
#[derive(Debug, Clone, Serialize)]
pub struct Metrics {
    /// Requests sent.
    pub num_prompts: usize,
    /// Requests with outcome `ok`.
    pub completed: usize,
    /// All others (whoever caused them: see `causes`).
    pub failed: usize,
    /// Requests per cause of their outcome (`trace_format::cause`): the server's failures
    /// over the requests it was asked to serve are the error budget; the client's and the
    /// replay's are left out of every verdict and shown beside it.
    pub causes: CauseCounts,
    /// From the scheduled start of the first request to the end of the last one, s.
    pub duration_s: f64,
    /// Σ prompt tokens of completed requests.
    pub total_input_tokens: i64,
    /// Σ output tokens of completed requests.
    pub total_output_tokens: i64,
    /// completed / duration.
    pub request_throughput: f64,
    /// Requests per second served meeting every SLO (None without SLOs).
    pub request_goodput: Option<f64>,
    /// Σ output tokens / duration.
    pub output_throughput: f64,
    /// (Σ prompt + Σ output tokens) / duration.
    pub total_token_throughput: f64,
    /// Most requests in flight at once: exact up to [`EXACT_CAP`](trace_format::quantiles::EXACT_CAP) requests, then an upper
    /// bound from start and end counts per time bucket (over by at most the requests that
    /// started in one bucket, 1/2^19 of the run's span rounded up to a power of two µs).
    pub max_concurrent_requests: usize,
    /// TTFT, ms, over completed streamed requests (a request that is not streamed has no
    /// observable first token).
    pub ttft: Summary,
    /// Time to first answer token, ms, over completed streamed requests: the first output
    /// that is not reasoning ([`ttfat_ms`]); None when no completed request reasoned (it
    /// would equal TTFT).
    pub ttfat: Option<Summary>,
    /// Σ reasoning tokens of completed requests (part of `total_output_tokens`), when some
    /// completed request reasoned.
    pub total_reasoning_tokens: Option<i64>,
    /// TPOT, ms, over completed streamed requests with more than one output token.
    pub tpot: Summary,
    /// ITL, ms, pooled chunk gaps of completed streamed requests.
    pub itl: Summary,
    /// E2EL, ms, over completed requests, streamed or not.
    pub e2el: Summary,
    /// How many completed requests each latency metric covers.
    pub coverage: Coverage,
    /// Chunk gap per token of the later chunk, ms, when per-chunk token counts are known.
    pub itl_per_token: Option<Summary>,
    /// Fraction of the requests the server was asked to serve (`causes.asked()`) that were
    /// served meeting every SLO (None without SLOs).
    pub slo_attainment: Option<f64>,
    /// Actual send − when the request was due (its scheduled send, or the moment it got a
    /// concurrency slot or its turn in a burst), minus connect time, ms.
    pub dispatch_lag: Summary,
    /// How late a send may be before it could change the reported numbers, ms. Latencies are
    /// timed from each request's actual send, so lateness only changes the load: on a
    /// schedule it shifts arrivals (10% of the mean gap between requests), where requests
    /// were all due at once it leaves a concurrency slot idle (10% of the median E2EL).
    /// Never under 1 ms.
    pub lag_allowance_ms: f64,
    /// Requests sent later than `lag_allowance_ms` after they were due.
    pub late_dispatches: usize,
    /// The offered load against what was served: steady-state throughput, overload.
    pub served: crate::served::Served,
    /// Latency per class of request (endpoint, streamed or not), when the run mixes classes.
    pub by_class: Vec<ClassMetrics>,
    /// Client queue time: waiting for a concurrency slot, or for the requests due at the same
    /// instant that were sent before it, ms.
    pub queue: Summary,
    /// Connect time of requests that opened a connection, ms.
    pub connect: Summary,
    /// Requests that opened a new connection.
    pub new_connections: usize,
    /// Requests per outcome.
    pub outcomes: BTreeMap<String, usize>,
    /// The most frequent error texts of failed requests (at most [`TOP_ERRORS`]), most
    /// frequent first, each with whose it is (the server's, the client's own, the
    /// replay's: `trace_format::cause`).
    pub top_errors: Vec<ErrorCount>,
    /// Completed requests per output-token source.
    pub output_token_sources: BTreeMap<String, usize>,
    /// The workload the run replayed (`trace_format::inspect_card`): its rows' lengths,
    /// endpoint mix, sessions and tool calls, what `compare` checks before calling one run
    /// better than another.
    pub workload: trace_format::inspect_card::WorkloadCard,
}

pub use crate::coverage::Coverage;

/// The latencies of one class of request: one endpoint, streamed or not.
#[derive(Debug, Clone, Serialize)]
pub struct ClassMetrics {
    /// Request path.
    pub endpoint: String,
    /// Streamed (TTFT, ITL and TPOT apply) or not (E2EL only).
    pub stream: bool,
    /// Requests of the class.
    pub requests: usize,
    /// Of which succeeded.
    pub completed: usize,
    /// Σ output tokens of the completed ones.
    pub output_tokens: i64,
    /// TTFT, ms (None when not streamed: it does not apply).
    pub ttft: Option<Summary>,
    /// TTFAT, ms (None when not streamed, or when no request of the run reasoned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttfat: Option<Summary>,
    /// TPOT, ms (None when not streamed).
    pub tpot: Option<Summary>,
    /// ITL, ms (None when not streamed).
    pub itl: Option<Summary>,
    /// E2EL, ms.
    pub e2el: Summary,
}

/// Share of the scale (gap between requests, or E2EL) a send may be late by before it counts.
pub const LAG_FRACTION: f64 = 0.1;
/// The floor of the lag allowance, ms.
pub const LAG_FLOOR_MS: f64 = 1.0;

/// The lag allowance (see [`Metrics::lag_allowance_ms`]) of a run whose schedule spaces
/// requests `gap_ms` apart on average (None: all due at once) and whose median E2EL is
/// `e2el_ms`.
pub fn lag_allowance_ms(gap_ms: Option<f64>, e2el_ms: Option<f64>) -> f64 {
    match gap_ms.or(e2el_ms) {
        Some(scale) => (LAG_FRACTION * scale).max(LAG_FLOOR_MS),
        None => LAG_FLOOR_MS,
    }
}

/// How many distinct error texts a result lists.
pub const TOP_ERRORS: usize = 5;
/// Longest error text kept in the list, characters.
const ERROR_TEXT: usize = 300;

fn ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

/// Whether a completed request meets every SLO that applies to it (vLLM's goodput rule):
/// TTFT and TPOT apply to streamed requests only (one that is not streamed has no first
/// token to time), E2EL to every request; a request with one output token passes TPOT.
pub fn meets_slos(r: &TraceRecord, slos: &[Slo]) -> bool {
    if r.outcome != Outcome::Ok {
        return false;
    }
    slos.iter().all(|s| match s.metric {
        SloMetric::Ttft | SloMetric::Ttfat | SloMetric::Tpot if !r.stream => true,
        SloMetric::Ttft => ttft_ms(r).is_some_and(|v| v <= s.limit_ms),
        SloMetric::Ttfat => ttfat_ms(r).is_some_and(|v| v <= s.limit_ms),
        SloMetric::E2el => r.e2el_us.map(ms).is_some_and(|v| v <= s.limit_ms),
        SloMetric::Tpot => tpot_ms(r).unwrap_or(0.0) <= s.limit_ms,
    })
}

/// TTFT of one request, ms: streamed requests only (one that is not streamed has no first
/// token to time; older traces recorded its E2EL as TTFT).
pub fn ttft_ms(r: &TraceRecord) -> Option<f64> {
    if !r.stream {
        return None;
    }
    r.ttft_us.map(ms)
}

/// Time to first answer token of one request, ms: streamed requests only. A row without
/// `ttfat_us` that had no reasoning (or was recorded before schema 1.4) answered with its
/// first token; one that reasoned and never answered has none.
pub fn ttfat_ms(r: &TraceRecord) -> Option<f64> {
    if !r.stream {
        return None;
    }
    match r.ttfat_us {
        Some(t) => Some(ms(t)),
        None if r.reasoning_tokens.unwrap_or(0) == 0 => r.ttft_us.map(ms),
        None => None,
    }
}

/// Whether a row reasoned before (or instead of) answering.
pub fn reasoned(r: &TraceRecord) -> bool {
    r.reasoning_tokens.is_some_and(|n| n > 0) || (r.ttfat_us.is_some() && r.ttfat_us != r.ttft_us)
}

/// The chunk gaps (ITL) of one request, ms: streamed requests only.
pub fn itl_gaps_ms(r: &TraceRecord) -> impl Iterator<Item = f64> + '_ {
    let chunks: &[i64] = if r.stream { &r.chunk_times_us } else { &[] };
    chunks.windows(2).map(|w| ms(w[1] - w[0]))
}

/// TPOT of one request, ms: (E2EL − TTFT) / (output_tokens − 1), when output_tokens > 1, for
/// streamed requests only.
pub fn tpot_ms(r: &TraceRecord) -> Option<f64> {
    if !r.stream {
        return None;
    }
    let out = r.output_tokens?;
    if out <= 1 {
        return None;
    }
    Some(ms(r.e2el_us? - r.ttft_us?) / (out - 1) as f64)
}

/// Computes the metrics of `records`, a run that started at `run_start_us` (epoch µs).
pub fn compute(
    records: &[TraceRecord],
    run_start_us: i64,
    slos: &[Slo],
    percentiles: &[f64],
) -> Metrics {
    let mut b = MetricsBuilder::new(run_start_us, slos, percentiles);
    records.iter().for_each(|r| b.add(r));
    b.finish()
}

/// Builds a run's [`Metrics`] from its rows added one at a time, in any order (completion
/// order in practice), without keeping them.
///
/// Memory is bounded whatever the number of rows: eight latency samples ([`Quantiles`]:
/// at most [`EXACT_CAP`](trace_format::quantiles::EXACT_CAP) values, 8 MiB, each, then ~100 KiB of buckets) and four more per
/// class of request when the run mixes classes (endpoints × streamed or not: the trace's,
/// not the rows'), the (start, end) of up to [`EXACT_CAP`](trace_format::quantiles::EXACT_CAP) requests (16 MiB) then 4 MiB of
/// event counts, [`served`](crate::served::ServedBuilder)'s sample (at most 12 MiB), and at
/// most [`ERROR_KEYS`] error texts. [`retained`](Self::retained) counts what it holds.
pub struct MetricsBuilder {
    run_start_us: i64,
    slos: Vec<Slo>,
    percentiles: Vec<f64>,
    requests: usize,
    completed: usize,
    streamed_ok: usize,
    single_token: usize,
    itl_requests: usize,
    end_us: i64,
    total_input_tokens: i64,
    total_output_tokens: i64,
    good: usize,
    causes: CauseCounts,
    ttft: Quantiles,
    ttfat: Quantiles,
    reasoned: usize,
    total_reasoning_tokens: i64,
    tpot: Quantiles,
    itl: Quantiles,
    e2el: Quantiles,
    itl_tok: Quantiles,
    have_tokens: bool,
    lag: Quantiles,
    queue: Quantiles,
    connect: Quantiles,
    new_connections: usize,
    scheduled: (i64, i64),
    outcomes: BTreeMap<String, usize>,
    output_token_sources: BTreeMap<String, usize>,
    errors: TopErrors,
    classes: Classes,
    overlap: Overlap,
    served: crate::served::ServedBuilder,
    card: trace_format::inspect_card::CardBuilder,
}

impl MetricsBuilder {
    /// The metrics of a run that started at `run_start_us` (epoch µs), against `slos`, with
    /// `percentiles` (0–100) of TTFT, TPOT, ITL and E2EL.
    pub fn new(run_start_us: i64, slos: &[Slo], percentiles: &[f64]) -> MetricsBuilder {
        MetricsBuilder {
            run_start_us,
            slos: slos.to_vec(),
            percentiles: percentiles.to_vec(),
            requests: 0,
            completed: 0,
            streamed_ok: 0,
            single_token: 0,
            itl_requests: 0,
            end_us: run_start_us,
            total_input_tokens: 0,
            total_output_tokens: 0,
            good: 0,
            causes: CauseCounts::default(),
            ttft: Quantiles::new(),
            ttfat: Quantiles::new(),
            reasoned: 0,
            total_reasoning_tokens: 0,
            tpot: Quantiles::new(),
            itl: Quantiles::new(),
            e2el: Quantiles::new(),
            itl_tok: Quantiles::new(),
            have_tokens: false,
            lag: Quantiles::new(),
            queue: Quantiles::new(),
            connect: Quantiles::new(),
            new_connections: 0,
            scheduled: (i64::MAX, i64::MIN),
            outcomes: BTreeMap::new(),
            output_token_sources: BTreeMap::new(),
            errors: TopErrors::default(),
            classes: Classes::default(),
            overlap: Overlap::default(),
            served: crate::served::ServedBuilder::new(run_start_us),
            card: trace_format::inspect_card::CardBuilder::unordered(None),
        }
    }

    /// Adds one row of the run.
    pub fn add(&mut self, r: &TraceRecord) {
        self.card.add(r);
        // Before the run-wide samples take this row: they may seed the first class's.
        self.classes.add(
            r,
            [&self.ttft, &self.tpot, &self.itl, &self.e2el, &self.ttfat],
        );
        self.requests += 1;
        let span = r
            .e2el_us
            .or_else(|| r.chunk_times_us.last().copied())
            .unwrap_or(0)
            .max(0);
        self.end_us = self.end_us.max(r.arrival_time_us + span);
        self.overlap
            .add(r.arrival_time_us, r.arrival_time_us + span);
        self.served.add(r);
        if let Some(o) = r.scheduled_offset_us {
            self.scheduled = (self.scheduled.0.min(o), self.scheduled.1.max(o));
        }
        if let Some(l) = r.dispatch_lag_us {
            self.lag.add(ms(l));
        }
        if let Some(q) = r.queue_us {
            self.queue.add(ms(q));
        }
        if r.new_connection == Some(true) {
            self.new_connections += 1;
            if let Some(c) = r.connect_us {
                self.connect.add(ms(c));
            }
        }
        let cause = Cause::of(r);
        self.causes.add(cause);
        if cause == Cause::Served && !self.slos.is_empty() && meets_slos(r, &self.slos) {
            self.good += 1;
        }
        count(&mut self.outcomes, r.outcome.as_str());
        if r.outcome != Outcome::Ok {
            self.errors.add(r);
            return;
        }
        self.completed += 1;
        self.total_input_tokens += r.prompt_tokens.unwrap_or(0);
        self.total_output_tokens += r.output_tokens.unwrap_or(0);
        self.total_reasoning_tokens += r.reasoning_tokens.unwrap_or(0);
        self.reasoned += usize::from(reasoned(r));
        count(
            &mut self.output_token_sources,
            r.output_tokens_source.map_or("unknown", |s| s.as_str()),
        );
        if let Some(e) = r.e2el_us {
            self.e2el.add(ms(e));
        }
        // TTFT, TPOT and ITL over streamed requests only: a request that is not streamed has
        // no first token (older traces recorded its E2EL as TTFT, which this also leaves out).
        if !r.stream {
            return;
        }
        self.streamed_ok += 1;
        if r.output_tokens.is_some_and(|n| n <= 1) {
            self.single_token += 1;
        }
        if let Some(t) = ttft_ms(r) {
            self.ttft.add(t);
        }
        if let Some(t) = ttfat_ms(r) {
            self.ttfat.add(t);
        }
        if let Some(t) = tpot_ms(r) {
            self.tpot.add(t);
        }
        if r.chunk_times_us.len() >= 2 {
            self.itl_requests += 1;
        }
        for (i, w) in r.chunk_times_us.windows(2).enumerate() {
            let gap = ms(w[1] - w[0]);
            self.itl.add(gap);
            if let Some(ct) = &r.chunk_tokens {
                self.have_tokens = true;
                if let Some(&n) = ct.get(i + 1) {
                    if n > 0 {
                        self.itl_tok.add(gap / f64::from(n));
                    }
                }
            }
        }
    }

    /// Rows added.
    pub fn len(&self) -> usize {
        self.requests
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.requests == 0
    }

    /// Values, buckets, intervals and sampled rows held: bounded whatever the number of rows
    /// added (see [`MetricsBuilder`]).
    pub fn retained(&self) -> usize {
        [
            &self.ttft,
            &self.ttfat,
            &self.tpot,
            &self.itl,
            &self.e2el,
            &self.itl_tok,
            &self.lag,
            &self.queue,
            &self.connect,
        ]
        .iter()
        .map(|q| q.retained())
        .sum::<usize>()
            + self.classes.retained()
            + self.overlap.retained()
            + self.served.retained()
            + self.errors.by.len()
    }

    /// The metrics of the rows added.
    pub fn finish(mut self) -> Metrics {
        let n = self.requests;
        let duration_s = ((self.end_us - self.run_start_us).max(1)) as f64 / 1e6;
        let good = (!self.slos.is_empty()).then_some(self.good);
        let p = self.percentiles.as_slice();
        let (lo, hi) = self.scheduled;
        let gap = (n >= 2 && hi > lo).then(|| ms(hi - lo) / (n - 1) as f64);
        let median_e2el = (!self.e2el.is_empty()).then(|| self.e2el.quantile(50.0));
        let lag_allowance = lag_allowance_ms(gap, median_e2el);
        let summary = |q: &Quantiles, p: &[f64]| Summary::from_quantiles(q, p);
        let (total_input_tokens, total_output_tokens) =
            (self.total_input_tokens, self.total_output_tokens);
        Metrics {
            num_prompts: n,
            completed: self.completed,
            failed: n - self.completed,
            causes: self.causes,
            duration_s,
            total_input_tokens,
            total_output_tokens,
            request_throughput: self.completed as f64 / duration_s,
            request_goodput: good.map(|g| g as f64 / duration_s),
            output_throughput: total_output_tokens as f64 / duration_s,
            total_token_throughput: (total_input_tokens + total_output_tokens) as f64 / duration_s,
            max_concurrent_requests: self.overlap.max(),
            ttft: summary(&self.ttft, p),
            ttfat: (self.reasoned > 0).then(|| summary(&self.ttfat, p)),
            total_reasoning_tokens: (self.reasoned > 0).then_some(self.total_reasoning_tokens),
            tpot: summary(&self.tpot, p),
            itl: summary(&self.itl, p),
            e2el: summary(&self.e2el, p),
            coverage: Coverage {
                ttft: self.ttft.len(),
                tpot: self.tpot.len(),
                itl: self.itl_requests,
                e2el: self.e2el.len(),
                not_streamed: self.completed - self.streamed_ok,
                single_token: self.single_token,
            },
            itl_per_token: self.have_tokens.then(|| summary(&self.itl_tok, p)),
            slo_attainment: good.map(|g| match self.causes.asked() {
                0 => 0.0,
                asked => g as f64 / asked as f64,
            }),
            lag_allowance_ms: lag_allowance,
            late_dispatches: self.lag.count_above(lag_allowance),
            served: self.served.finish(),
            by_class: self.classes.finish(p, self.reasoned > 0),
            dispatch_lag: summary(&self.lag, &[50.0, 99.0]),
            queue: summary(&self.queue, &[50.0, 99.0]),
            new_connections: self.new_connections,
            connect: summary(&self.connect, &[50.0, 99.0]),
            outcomes: self.outcomes,
            top_errors: self.errors.top(),
            output_token_sources: self.output_token_sources,
            workload: self.card.finish(),
        }
    }
}

fn count(map: &mut BTreeMap<String, usize>, key: &str) {
    match map.get_mut(key) {
        Some(c) => *c += 1,
        None => {
            map.insert(key.to_string(), 1);
        }
    }
}

/// Most distinct (outcome, error text) pairs counted. Exact while a run has no more; past
/// it the least frequent is replaced and its count inherited (Space-Saving: a listed count
/// is over by at most the smallest count held), so the most frequent texts still surface.
pub const ERROR_KEYS: usize = 1000;

/// One error text of [`Metrics::top_errors`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorCount {
    /// Whose the outcome is: a cancellation replayed at its recorded point, or a 4xx as
    /// captured, is the client's own, not a failure of the server.
    pub cause: Cause,
    /// The outcome.
    pub outcome: String,
    /// The error text (at most 300 characters).
    pub text: String,
    /// Requests with it.
    pub requests: usize,
}

/// Error texts of the failed requests and how often each occurred.
#[derive(Default)]
struct TopErrors {
    /// (cause's name, outcome, text) → requests.
    by: BTreeMap<(&'static str, String, String), usize>,
}

/// The cause named `name` ([`Cause::as_str`]).
fn cause_named(name: &str) -> Cause {
    [Cause::Served, Cause::Server, Cause::Client, Cause::Replay]
        .into_iter()
        .find(|c| c.as_str() == name)
        .unwrap_or(Cause::Server)
}

impl TopErrors {
    fn add(&mut self, r: &TraceRecord) {
        let text = r.error.as_deref().unwrap_or("(no error text)");
        let text: String = text.chars().take(ERROR_TEXT).collect();
        let key = (Cause::of(r).as_str(), r.outcome.to_string(), text);
        if let Some(c) = self.by.get_mut(&key) {
            *c += 1;
            return;
        }
        let mut inherited = 0;
        if self.by.len() >= ERROR_KEYS {
            let least = self
                .by
                .iter()
                .min_by_key(|(_, &c)| c)
                .map(|(k, &c)| (k.clone(), c));
            if let Some((k, c)) = least {
                self.by.remove(&k);
                inherited = c;
            }
        }
        self.by.insert(key, inherited + 1);
    }

    /// The most frequent (cause, outcome, error text), most frequent first (ties by text).
    fn top(self) -> Vec<ErrorCount> {
        let mut v: Vec<ErrorCount> = self
            .by
            .into_iter()
            .map(|((cause, outcome, text), requests)| ErrorCount {
                cause: cause_named(cause),
                outcome,
                text,
                requests,
            })
            .collect();
        v.sort_by(|a, b| {
            b.requests
                .cmp(&a.requests)
                .then_with(|| a.text.cmp(&b.text))
        });
        v.truncate(TOP_ERRORS);
        v
    }
}

/// The latencies of one class as they are added.
#[derive(Default, Clone)]
struct ClassAcc {
    requests: usize,
    completed: usize,
    output_tokens: i64,
    /// TTFT, TPOT, ITL, E2EL, TTFAT.
    samples: [Quantiles; 5],
}

/// Rows by (endpoint, streamed). While the run has one class its latencies are the
/// run-wide ones, so none are kept twice: when a second class appears, the first one's are
/// copied from the run-wide samples (which hold only its rows so far).
#[derive(Default)]
struct Classes {
    by: BTreeMap<String, [Option<ClassAcc>; 2]>,
    mixed: bool,
}

impl Classes {
    fn add(&mut self, r: &TraceRecord, run_wide: [&Quantiles; 5]) {
        if !self.by.contains_key(r.endpoint.as_str()) {
            self.by.insert(r.endpoint.clone(), [None, None]);
        }
        let first = !self.mixed && self.by.values().any(|s| s.iter().any(Option::is_some));
        let Some(slots) = self.by.get_mut(r.endpoint.as_str()) else {
            return;
        };
        let slot = &mut slots[usize::from(r.stream)];
        if slot.is_none() {
            *slot = Some(ClassAcc::default());
            if first {
                self.mixed = true;
                // The class seen so far: every row added before this one.
                if let Some(c) = self
                    .by
                    .values_mut()
                    .flat_map(|s| s.iter_mut().flatten())
                    .find(|c| c.requests > 0)
                {
                    c.samples = run_wide.map(Quantiles::clone);
                }
            }
        }
        let mixed = self.mixed;
        let Some(c) = self
            .by
            .get_mut(r.endpoint.as_str())
            .and_then(|s| s[usize::from(r.stream)].as_mut())
        else {
            return;
        };
        c.requests += 1;
        if r.outcome != Outcome::Ok {
            return;
        }
        c.completed += 1;
        c.output_tokens += r.output_tokens.unwrap_or(0);
        if !mixed {
            return;
        }
        let [ttft, tpot, itl, e2el, ttfat] = &mut c.samples;
        if let Some(v) = ttft_ms(r) {
            ttft.add(v);
        }
        if let Some(v) = ttfat_ms(r) {
            ttfat.add(v);
        }
        if let Some(v) = tpot_ms(r) {
            tpot.add(v);
        }
        itl_gaps_ms(r).for_each(|g| itl.add(g));
        if let Some(e) = r.e2el_us {
            e2el.add(ms(e));
        }
    }

    fn retained(&self) -> usize {
        let each = |c: &ClassAcc| c.samples.iter().map(Quantiles::retained).sum::<usize>();
        self.by
            .values()
            .flat_map(|s| s.iter().flatten())
            .map(each)
            .sum()
    }

    /// The classes' metrics; `reasoned`: some request of the run reasoned (TTFAT shown).
    fn finish(self, p: &[f64], reasoned: bool) -> Vec<ClassMetrics> {
        if !self.mixed {
            return Vec::new();
        }
        // The console's table shows P99 whatever --metric-percentiles asks for.
        let mut p = p.to_vec();
        if !p.contains(&99.0) {
            p.push(99.0);
        }
        let p = p.as_slice();
        let mut out = Vec::new();
        for (endpoint, slots) in self.by {
            for (stream, c) in [false, true].into_iter().zip(slots) {
                let Some(c) = c else { continue };
                let [ttft, tpot, itl, e2el, ttfat] = &c.samples;
                let summary = |q: &Quantiles| Summary::from_quantiles(q, p);
                out.push(ClassMetrics {
                    endpoint: endpoint.clone(),
                    stream,
                    requests: c.requests,
                    completed: c.completed,
                    output_tokens: c.output_tokens,
                    ttft: stream.then(|| summary(ttft)),
                    ttfat: (stream && reasoned).then(|| summary(ttfat)),
                    tpot: stream.then(|| summary(tpot)),
                    itl: stream.then(|| summary(itl)),
                    e2el: summary(e2el),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_format::stats::percentile;
    use trace_format::TokenSource;

    fn ok(start_ms: i64, chunks_ms: &[i64], out: i64) -> TraceRecord {
        let mut r = TraceRecord::new(format!("r{start_ms}"), start_ms * 1000, "/v1/completions");
        r.chunk_times_us = chunks_ms.iter().map(|c| c * 1000).collect();
        r.ttft_us = r.chunk_times_us.first().copied();
        r.e2el_us = r.chunk_times_us.last().copied();
        r.stream = true;
        r.output_tokens = Some(out);
        r.output_tokens_source = Some(TokenSource::Usage);
        r.prompt_tokens = Some(10);
        r
    }

    #[test]
    fn vllm_definitions_on_a_known_run() {
        // Two completed requests, one failed.
        let a = ok(0, &[100, 110, 120, 130], 4); // TPOT (130-100)/3 = 10
        let b = ok(1000, &[200, 240], 5); // coalesced chunks: TPOT (240-200)/4 = 10, one ITL of 40
        let mut c = TraceRecord::new("c", 500_000, "/v1/completions");
        c.outcome = Outcome::HttpError;
        let m = compute(&[a, b, c], 0, &["ttft:150".parse().unwrap()], &[50.0, 99.0]);
        assert_eq!((m.completed, m.failed), (2, 1));
        assert!((m.duration_s - 1.24).abs() < 1e-9);
        assert_eq!(
            m.total_output_tokens, 9,
            "tokens from usage, not chunk count (6)"
        );
        assert_eq!(m.total_input_tokens, 20);
        assert_eq!(m.ttft.mean, 150.0);
        assert_eq!(m.tpot.mean, 10.0);
        assert_eq!(m.itl.count, 4);
        assert_eq!(m.itl.max, 40.0);
        assert_eq!(m.e2el.median, 185.0);
        // Goodput: only a (TTFT 100 ≤ 150) passes; b's TTFT is 200.
        assert!((m.request_goodput.unwrap() - 1.0 / 1.24).abs() < 1e-9);
        assert!((m.slo_attainment.unwrap() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(m.outcomes["http_error"], 1);
    }

    /// Issue 39: a replayed cancellation and a 4xx that was a 4xx in the capture are the
    /// client's; a synthesized body where the capture had a 4xx is the replay's: SLO
    /// attainment and goodput are over the requests the server was asked to serve, and the
    /// excluded ones are counted, not dropped.
    #[test]
    fn attainment_is_over_the_requests_the_server_was_asked_to_serve() {
        let served: Vec<TraceRecord> = (0..6).map(|i| ok(i * 100, &[10, 20], 2)).collect();
        let mut cancelled = TraceRecord::new("x", 0, "/v1/completions");
        cancelled.outcome = Outcome::ClientCancelled;
        cancelled.captured_outcome = Some(Outcome::ClientCancelled);
        let mut bad = TraceRecord::new("y", 0, "/v1/completions");
        (bad.outcome, bad.status) = (Outcome::HttpError, Some(400));
        (bad.captured_outcome, bad.captured_status) = (Some(Outcome::HttpError), Some(400));
        bad.synthesized_body = Some(false);
        let mut changed = ok(700, &[10, 20], 2);
        (changed.captured_outcome, changed.captured_status) = (Some(Outcome::HttpError), Some(400));
        changed.synthesized_body = Some(true);
        let mut broken = TraceRecord::new("z", 0, "/v1/completions");
        (broken.outcome, broken.status) = (Outcome::HttpError, Some(503));
        let mut rows = served;
        rows.extend([cancelled, bad, changed, broken]);
        let m = compute(&rows, 0, &["ttft:150".parse().unwrap()], &[50.0]);
        assert_eq!(
            m.causes,
            CauseCounts {
                served: 6,
                server: 1,
                client: 2,
                replay: 1
            }
        );
        // 6 served within the SLO of the 7 the server was asked to serve (not 6 of 10).
        assert!((m.slo_attainment.unwrap() - 6.0 / 7.0).abs() < 1e-9);
        assert_eq!((m.completed, m.failed), (7, 3));
    }

    #[test]
    fn failures_are_listed_by_their_most_frequent_texts() {
        let fail = |id: &str, o: Outcome, e: &str| {
            let mut r = TraceRecord::new(id, 0, "/v1/completions");
            r.outcome = o;
            r.error = Some(e.into());
            r
        };
        let rs = vec![
            fail("a", Outcome::HttpError, "HTTP 501: not implemented"),
            fail(
                "b",
                Outcome::Timeout,
                "no response headers within the timeout",
            ),
            fail("c", Outcome::HttpError, "HTTP 501: not implemented"),
            ok(0, &[1, 2], 2),
        ];
        let m = compute(&rs, 0, &[], &[50.0]);
        let top: Vec<(Cause, &str, &str, usize)> = m
            .top_errors
            .iter()
            .map(|e| (e.cause, e.outcome.as_str(), e.text.as_str(), e.requests))
            .collect();
        assert_eq!(
            top,
            vec![
                (Cause::Server, "http_error", "HTTP 501: not implemented", 2),
                (
                    Cause::Server,
                    "timeout",
                    "no response headers within the timeout",
                    1
                ),
            ]
        );
    }

    /// A request that is not streamed counts in E2EL, throughput and goodput (against the
    /// E2EL SLO only), never in TTFT, TPOT or ITL, whatever its row says (older rows carry
    /// its E2EL as TTFT).
    #[test]
    fn requests_that_are_not_streamed_have_no_ttft_tpot_or_itl() {
        let mut streamed = ok(0, &[100, 110, 120, 130], 4);
        streamed.stream = true;
        let mut whole = ok(0, &[], 50);
        whole.stream = false;
        whole.e2el_us = Some(600_000);
        whole.ttft_us = Some(600_000); // as older traces recorded it
        let slos = ["ttft:150".parse().unwrap(), "tpot:50".parse().unwrap()];
        let m = compute(&[streamed.clone(), whole.clone()], 0, &slos, &[50.0]);
        assert_eq!((m.ttft.count, m.ttft.mean), (1, 100.0));
        assert_eq!((m.tpot.count, m.tpot.mean), (1, 10.0));
        assert_eq!(m.itl.count, 3);
        assert_eq!(m.e2el.count, 2);
        assert_eq!(
            m.coverage,
            Coverage {
                ttft: 1,
                tpot: 1,
                itl: 1,
                e2el: 2,
                not_streamed: 1,
                single_token: 0
            }
        );
        assert_eq!(m.total_output_tokens, 54);
        // TTFT and TPOT SLOs do not apply to it; E2EL does.
        assert!(meets_slos(&whole, &slos));
        assert!(!meets_slos(&whole, &["e2el:500".parse().unwrap()]));
        assert!((m.slo_attainment.unwrap() - 1.0).abs() < 1e-9);
    }

    /// A streamed request with one output token is in TTFT and E2EL, not TPOT, and the
    /// coverage says why.
    #[test]
    fn single_token_streams_are_counted_apart() {
        let m = compute(&[ok(0, &[100], 1), ok(0, &[100, 120], 2)], 0, &[], &[50.0]);
        assert_eq!((m.coverage.tpot, m.coverage.single_token), (1, 1));
        assert_eq!(
            m.coverage.left_out("tpot", m.completed),
            vec![(
                1,
                "with a single output token: no time per token after the first"
            )]
        );
    }

    #[test]
    fn tpot_slo_passes_single_token_requests() {
        let r = ok(0, &[100], 1);
        assert!(meets_slos(&r, &["tpot:0".parse().unwrap()]));
        assert_eq!(tpot_ms(&r), None);
    }

    #[test]
    fn per_token_itl_uses_chunk_token_counts() {
        let mut r = ok(0, &[10, 30, 50], 9);
        r.chunk_tokens = Some(vec![1, 4, 4]);
        let m = compute(&[r], 0, &[], &[50.0]);
        let pt = m.itl_per_token.unwrap();
        assert_eq!((pt.count, pt.mean), (2, 5.0));
    }

    #[test]
    fn overlap_counts_concurrency() {
        assert_eq!(max_overlap(&mut [(0, 10), (5, 15), (10, 20), (30, 40)]), 2);
        assert_eq!(max_overlap(&mut []), 0);
    }

    /// splitmix64: a fixed pseudo-random sequence.
    fn mix(i: usize) -> u64 {
        let mut z = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Two endpoints, streamed and not, failures with texts, lags, queues and connects.
    fn mixed_run(n: usize) -> Vec<TraceRecord> {
        (0..n)
            .map(|i| {
                let c = |k: usize| (mix(i) % k as u64) as i64;
                let mut r = ok(
                    i as i64 * 7,
                    &[20 + c(13), 40 + c(17), 60 + c(29)],
                    2 + c(5),
                );
                if i % 3 == 0 {
                    r.endpoint = "/v1/chat/completions".into();
                }
                r.stream = i % 4 != 0;
                if i % 11 == 0 {
                    r.outcome = Outcome::HttpError;
                    r.error = Some(format!("HTTP 50{}", c(3)));
                }
                r.scheduled_offset_us = Some(r.arrival_time_us - c(500));
                r.dispatch_lag_us = Some(c(3000));
                r.queue_us = Some(c(200));
                r.new_connection = Some(i % 10 == 0);
                r.connect_us = Some(300 + c(1000));
                if i % 6 == 0 {
                    r.chunk_tokens = Some(vec![1, 2, 1]);
                }
                r
            })
            .collect()
    }

    #[test]
    fn rows_in_any_order_give_the_same_metrics() {
        let rs = mixed_run(500);
        let slos = ["ttft:30".parse().unwrap(), "e2el:60".parse().unwrap()];
        let p = [50.0, 90.0, 99.0];
        let want = serde_json::to_value(compute(&rs, 0, &slos, &p)).unwrap();
        assert_eq!(want["by_class"].as_array().unwrap().len(), 4);
        let mut by_end = rs.clone();
        by_end.sort_by_key(|r| r.arrival_time_us + r.e2el_us.unwrap_or(0));
        assert_ne!(by_end, rs);
        for order in [by_end, rs.iter().rev().cloned().collect()] {
            let mut b = MetricsBuilder::new(0, &slos, &p);
            order.iter().for_each(|r| b.add(r));
            assert_eq!(b.len(), rs.len());
            assert_eq!(serde_json::to_value(b.finish()).unwrap(), want);
        }
    }

    /// Each class's latencies are those of its own rows alone, the first class's too (taken
    /// from the run-wide samples when the second class appears).
    #[test]
    fn each_class_is_measured_on_its_own_rows() {
        let rs = mixed_run(400);
        let first = |r: &TraceRecord| r.endpoint == "/v1/completions" && r.stream;
        let (a, rest): (Vec<TraceRecord>, Vec<TraceRecord>) = rs.into_iter().partition(first);
        let rs: Vec<TraceRecord> = a[..60]
            .iter()
            .chain(&rest)
            .chain(&a[60..])
            .cloned()
            .collect();
        let m = compute(&rs, 0, &[], &[50.0]);
        assert_eq!(m.by_class.len(), 4);
        for c in &m.by_class {
            let own: Vec<TraceRecord> = rs
                .iter()
                .filter(|r| r.endpoint == c.endpoint && r.stream == c.stream)
                .cloned()
                .collect();
            let alone = compute(&own, 0, &[], &[50.0, 99.0]);
            assert!(alone.by_class.is_empty());
            assert_eq!((c.requests, c.completed), (own.len(), alone.completed));
            assert_eq!(c.output_tokens, alone.total_output_tokens);
            assert_eq!(c.e2el, alone.e2el, "{} {}", c.endpoint, c.stream);
            if c.stream {
                assert_eq!(c.ttft.as_ref(), Some(&alone.ttft));
                assert_eq!(c.tpot.as_ref(), Some(&alone.tpot));
                assert_eq!(c.itl.as_ref(), Some(&alone.itl));
                assert!(alone.itl.count > 0);
            } else {
                assert!(c.ttft.is_none() && c.itl.is_none());
            }
        }
    }

    /// Past the cap the peak concurrency from bucket counts is an upper bound, over by at most
    /// the requests started in one bucket, whatever order the rows come in.
    #[test]
    fn peak_concurrency_from_buckets_is_a_close_upper_bound() {
        // 20,000 requests over 1,000 s (width 2,048 µs), 0.1 to 30 s long, added in reverse.
        let iv: Vec<(i64, i64)> = (0..20_000)
            .map(|i| {
                let s = (mix(i) % 1_000_000_000) as i64;
                (s, s + 100_000 + (mix(i + 7) % 30_000_000) as i64)
            })
            .collect();
        let mut sorted = iv.clone();
        sorted.sort_unstable();
        let truth = max_overlap(&mut iv.clone());
        for order in [iv.clone(), sorted.iter().rev().copied().collect()] {
            let mut ev = Events::default();
            order.iter().for_each(|&(s, e)| ev.add(s, e));
            assert!(ev.counts.len() <= EVENT_BUCKETS);
            let w = ev.width;
            assert_eq!(w, 2048);
            let most_in_a_bucket = (0..sorted.len())
                .map(|k| {
                    sorted[k..]
                        .iter()
                        .take_while(|x| x.0 < sorted[k].0 + w)
                        .count()
                })
                .max()
                .unwrap();
            let est = ev.max();
            assert!(
                est >= truth && est <= truth + most_in_a_bucket,
                "{est} vs {truth} (+{most_in_a_bucket})"
            );
        }
    }

    /// Millions of rows: what the builder holds stays bounded, percentiles are estimates
    /// within the stated error, counts exact, the most frequent error still first.
    #[test]
    fn millions_of_rows_in_bounded_memory() {
        use crate::served::SERVED_CAP;
        use trace_format::quantiles::RELATIVE_ERROR;
        const N: usize = 3_000_000;
        let p = [50.0, 99.0, 99.9];
        let mut b = MetricsBuilder::new(0, &["e2el:500".parse().unwrap()], &p);
        let mut r = ok(0, &[10, 20, 30], 3);
        let (mut e2el, mut lags, mut iv) = (Vec::new(), Vec::new(), Vec::new());
        let (mut peak, mut good) = (0, 0);
        for i in 0..N {
            // 1,000 requests a second, E2EL 20 ms to 2 s, one in 100 failing.
            let x = mix(i);
            let e = 20_000 + (x % 1_980_000) as i64;
            r.arrival_time_us = i as i64 * 1000;
            r.scheduled_offset_us = Some(r.arrival_time_us);
            r.chunk_times_us.clear();
            r.chunk_times_us.extend([e / 4, e / 2, e]);
            (r.ttft_us, r.e2el_us) = (Some(e / 4), Some(e));
            r.dispatch_lag_us = Some(((x >> 32) % 3000) as i64);
            lags.push(((x >> 32) % 3000) as f64 / 1000.0);
            iv.push((r.arrival_time_us, r.arrival_time_us + e));
            if i % 100 == 0 {
                r.outcome = Outcome::HttpError;
                r.error = Some(if i % 300 == 0 {
                    "HTTP 503: busy".into()
                } else {
                    format!("HTTP 500: request {i}")
                });
            } else {
                r.outcome = Outcome::Ok;
                r.error = None;
                e2el.push(e as f64 / 1000.0);
                good += usize::from(e <= 500_000);
            }
            b.add(&r);
            if i % 50_000 == 0 {
                peak = peak.max(b.retained());
            }
        }
        let held = b.retained();
        let m = b.finish();
        assert!(
            peak <= 9 * EXACT_CAP + SERVED_CAP + ERROR_KEYS,
            "held {peak} at most"
        );
        assert!(
            held <= EVENT_BUCKETS + SERVED_CAP + ERROR_KEYS + 8 * 20_000,
            "held {held} at the end"
        );
        assert_eq!((m.num_prompts, m.completed), (N, e2el.len()));
        assert_eq!(m.slo_attainment, Some(good as f64 / N as f64));
        e2el.sort_by(f64::total_cmp);
        assert_eq!(m.e2el.estimate, Some(RELATIVE_ERROR));
        assert_eq!(m.e2el.count, e2el.len());
        for q in p {
            let (est, truth) = (m.e2el.get(q).unwrap(), percentile(&e2el, q));
            assert!(
                (est - truth).abs() <= RELATIVE_ERROR * truth,
                "p{q}: {est} vs {truth}"
            );
        }
        let mean = e2el.iter().sum::<f64>() / e2el.len() as f64;
        assert!((m.e2el.mean - mean).abs() < 1e-9 * mean);
        assert_eq!(m.e2el.min, e2el[0]);
        // The allowance is 1 ms (10% of the 1 ms gap, floored): lags of exactly 1 ms may fall
        // either side of it.
        assert_eq!(m.lag_allowance_ms, 1.0);
        let late = lags.iter().filter(|&&l| l > 1.0).count();
        let at = lags.iter().filter(|&&l| l == 1.0).count();
        assert!(
            m.late_dispatches.abs_diff(late) <= at,
            "{}",
            m.late_dispatches
        );
        let truth = max_overlap(&mut iv);
        let c = m.max_concurrent_requests;
        assert!(c >= truth && c <= truth + 10, "{c} vs {truth}");
        assert!((m.served.offered_rps.unwrap() - 1000.0).abs() < 1e-9);
        let steady = m.served.steady.expect("steady");
        assert!(
            (steady.request_throughput / 990.0 - 1.0).abs() < 0.02,
            "{steady:?}"
        );
        assert!(m.served.overload.is_none());
        let (o, text, n) = (
            &m.top_errors[0].outcome,
            &m.top_errors[0].text,
            &m.top_errors[0].requests,
        );
        assert_eq!(
            (o.as_str(), text.as_str()),
            ("http_error", "HTTP 503: busy")
        );
        assert!((10_000..10_100).contains(n), "{n}");
    }
}
