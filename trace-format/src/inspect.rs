//! `llmreplay inspect`: the figures an infrastructure team needs before benchmarking, read off
//! its own traffic: arrival rate and concurrency (requests in flight), prompt and output
//! lengths, outcomes, streaming share, sessions, endpoints and models, and how much of its
//! prompt a prefix cache could serve ([`crate::prefix_cache`]).
//!
//! [`summarize`] computes a [`TraceSummary`]; it prints as a console block (`Display`) and
//! serializes to JSON (`serde::Serialize`). Its figures are production's: shadow rows (a
//! `--shadow` candidate's answers, with `pair_request_id`) are only counted, per candidate.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;

use serde::Serialize;

use crate::error::Result;
use crate::prefix_cache::{PrefixCacheSim, PrefixCacheSummary};
use crate::quantiles::Quantiles;
use crate::reader::{Trace, TraceFile};
use crate::schema::{Outcome, TraceRecord};
use crate::sessions::{SessionStats, SessionSummary};
use crate::stream::TraceStream;

/// Key used for requests without a model in [`TraceSummary::models`].
pub const UNKNOWN_MODEL: &str = "(unknown)";

/// Summary of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceSummary {
    /// The files' privacy manifests, each distinct one once ([`crate::privacy`]; empty when
    /// no file has one: not a capture, or one from before manifests).
    pub privacy: Vec<crate::privacy::Manifest>,
    /// Number of requests (production's: shadow rows are not among them).
    pub rows: usize,
    /// Shadow rows (with `pair_request_id`: a `capture --shadow` candidate's answer to a
    /// production request) per candidate (`target`); left out of every other figure.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub shadow_rows: BTreeMap<String, usize>,
    /// Number of files read.
    pub files: usize,
    /// Files per producer (`capture`, `import`, …).
    pub producers: BTreeMap<String, usize>,
    /// First arrival, RFC 3339 UTC (None when empty).
    pub first_arrival: Option<String>,
    /// Last arrival, RFC 3339 UTC (None when empty).
    pub last_arrival: Option<String>,
    /// Last arrival − first arrival, seconds.
    pub duration_s: f64,
    /// Arrivals per 1-second bucket (None when empty).
    pub arrival_rate: Option<ArrivalRate>,
    /// Requests in flight (None when no row has an end-to-end latency).
    pub in_flight: Option<InFlight>,
    /// Prompt token lengths (None when no row has them).
    pub prompt_tokens: Option<TokenStats>,
    /// Output token lengths (None when no row has them).
    pub output_tokens: Option<TokenStats>,
    /// Requests per outcome, every outcome listed.
    pub outcomes: BTreeMap<String, usize>,
    /// Streamed requests.
    pub streamed: usize,
    /// Streamed requests / rows (0 when empty).
    pub streamed_share: f64,
    /// Sessions: how many, turns per session, think time, multi-turn share (absent when no
    /// row has a session id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionSummary>,
    /// Requests per endpoint.
    pub endpoints: BTreeMap<String, usize>,
    /// Requests per model ([`UNKNOWN_MODEL`] for requests without one).
    pub models: BTreeMap<String, usize>,
    /// The theoretical prefix-cache hit rate (absent when no row has prefix hashes, or the
    /// files' block sizes are unknown or differ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCacheSummary>,
    /// The workload card ([`crate::inspect_card`]): what `compare` and `shadow` check two
    /// runs against before calling one better.
    pub workload: crate::inspect_card::WorkloadCard,
    /// The captures the rows came from: rows and span of each, the spread of their clock
    /// offsets (absent when no row names a capture).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captures: Option<crate::captures::CaptureSummary>,
}

/// Arrival rate over 1-second buckets starting at the first arrival.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArrivalRate {
    /// Requests per second: rows / number of buckets from the first to the last arrival.
    pub mean_per_s: f64,
    /// Most requests in one bucket.
    pub peak_per_s: u64,
    /// Start of the first bucket with the peak, RFC 3339.
    pub peak_at: String,
}

/// Requests in flight, from each request's arrival to arrival + `e2el_us` (half-open: a
/// request ending when another starts does not overlap it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InFlight {
    /// Time-weighted mean from the first arrival to the last completion (Σ e2el / window).
    pub mean: f64,
    /// Most requests in flight at once.
    pub peak: u64,
    /// When the peak was first reached, RFC 3339.
    pub peak_at: String,
    /// Rows with a known `e2el_us` (only those are counted).
    pub rows_counted: usize,
}

/// Distribution of a token count over the rows that have it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenStats {
    /// Rows with a value.
    pub known: usize,
    /// Sum of the values.
    pub sum: i64,
    /// Mean.
    pub mean: f64,
    /// Median (linear interpolation, as numpy).
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// None when the percentiles are exact (up to
    /// [`EXACT_CAP`](crate::quantiles::EXACT_CAP) rows with a value); else the bound on
    /// their relative error. Known, sum and mean are exact either way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<f64>,
}

/// A token count's running figures, in memory bounded by [`Quantiles`].
#[derive(Debug, Default)]
struct TokenAcc {
    sum: i64,
    /// The exact sum, for the mean (every integer sum is exact in an `i128`).
    exact_sum: i128,
    values: Quantiles,
}

impl TokenAcc {
    fn add(&mut self, v: i64) {
        self.sum = self.sum.saturating_add(v);
        self.exact_sum += i128::from(v);
        self.values.add(v as f64);
    }

    fn finish(&self) -> Option<TokenStats> {
        let known = self.values.len();
        if known == 0 {
            return None;
        }
        Some(TokenStats {
            known,
            sum: self.sum,
            mean: self.exact_sum as f64 / known as f64,
            p50: self.values.quantile(50.0),
            p95: self.values.quantile(95.0),
            p99: self.values.quantile(99.0),
            estimate: (!self.values.is_exact()).then(|| self.values.relative_error()),
        })
    }
}

/// RFC 3339 (µs, `Z`) of a time in µs since the epoch.
pub use crate::utc::rfc3339;

/// Computes the summary of a trace (its records need not be sorted), with the prefix-cache hit
/// rate of an unbounded cache only.
pub fn summarize(trace: &Trace) -> TraceSummary {
    summarize_with(trace, &[])
}

/// [`summarize`], with the prefix-cache hit rate also for LRU caches of `cache_blocks` blocks.
pub fn summarize_with(trace: &Trace, cache_blocks: &[u64]) -> TraceSummary {
    let mut s = Summarizer::new(&trace.files, cache_blocks);
    let recs = &trace.records;
    if recs.is_sorted_by_key(|r| r.arrival_time_us) {
        recs.iter().for_each(|r| s.add(r));
    } else {
        let mut order: Vec<usize> = (0..recs.len()).collect();
        order.sort_by_key(|&i| recs[i].arrival_time_us);
        order.into_iter().for_each(|i| s.add(&recs[i]));
    }
    s.finish()
}

/// [`summarize_with`] over a [`TraceStream`], read once, in memory bounded independently of
/// the number of rows (see [`Summarizer`]).
pub fn summarize_stream(stream: &TraceStream, cache_blocks: &[u64]) -> Result<TraceSummary> {
    let mut s = Summarizer::new(stream.files(), cache_blocks);
    for r in stream.records() {
        s.add(&r?);
    }
    Ok(s.finish())
}

/// A [`TraceSummary`] built from records fed one at a time in arrival order. What it holds
/// does not grow with the rows:
/// - token percentiles: [`Quantiles`] (exact up to
///   [`EXACT_CAP`](crate::quantiles::EXACT_CAP) values each, 8 bytes a value, then estimates
///   within [`RELATIVE_ERROR`](crate::quantiles::RELATIVE_ERROR), which the summary states);
/// - arrival rate: the current 1-second bucket;
/// - requests in flight: the end times of the requests in flight (exact; 8 bytes per request
///   in flight at the peak);
/// - sessions: see [`SessionStats`] (a hash and a count per distinct session id: grows with
///   the sessions, not the rows);
/// - endpoints, models, outcomes: one count per distinct value;
/// - the prefix cache: see [`PrefixCacheSim`] (the unbounded cache is capped).
pub struct Summarizer {
    privacy: Vec<crate::privacy::Manifest>,
    files: usize,
    producers: BTreeMap<String, usize>,
    rows: usize,
    shadow_rows: BTreeMap<String, usize>,
    first: Option<i64>,
    last: Option<i64>,
    rate: RateAcc,
    in_flight: InFlightAcc,
    prompt: TokenAcc,
    output: TokenAcc,
    outcomes: BTreeMap<String, usize>,
    endpoints: BTreeMap<String, usize>,
    models: BTreeMap<String, usize>,
    sessions: SessionStats,
    streamed: usize,
    prefix: Option<PrefixCacheSim>,
    card: crate::inspect_card::CardBuilder,
    captures: crate::captures::CaptureCounter,
}

impl Summarizer {
    /// A summary of rows from `files`, with the prefix-cache hit rate of an unbounded cache
    /// and of LRU caches of `cache_blocks` blocks (when every file records the same block
    /// size).
    pub fn new(files: &[TraceFile], cache_blocks: &[u64]) -> Summarizer {
        let mut producers = BTreeMap::new();
        for f in files {
            *producers.entry(f.meta.producer.to_string()).or_insert(0) += 1;
        }
        let mut blocks = files.iter().map(|f| f.meta.block_size);
        let block_size = blocks
            .next()
            .flatten()
            .filter(|&b| blocks.all(|o| o == Some(b)));
        let privacy = crate::privacy::Manifest::distinct(
            files.iter().filter_map(|f| f.meta.privacy.as_ref()),
        );
        Summarizer {
            privacy,
            files: files.len(),
            producers,
            rows: 0,
            shadow_rows: BTreeMap::new(),
            first: None,
            last: None,
            rate: RateAcc::default(),
            in_flight: InFlightAcc::default(),
            prompt: TokenAcc::default(),
            output: TokenAcc::default(),
            outcomes: Outcome::ALL.iter().map(|o| (o.to_string(), 0)).collect(),
            endpoints: BTreeMap::new(),
            models: BTreeMap::new(),
            sessions: SessionStats::new(),
            streamed: 0,
            prefix: block_size.map(|b| PrefixCacheSim::new(b, cache_blocks)),
            card: crate::inspect_card::CardBuilder::new(block_size),
            captures: crate::captures::CaptureCounter::new(files),
        }
    }

    /// One record; records come in arrival order. A shadow row is only counted.
    pub fn add(&mut self, r: &TraceRecord) {
        if r.pair_request_id.is_some() {
            count(
                &mut self.shadow_rows,
                r.target.as_deref().unwrap_or("(unnamed)"),
            );
            return;
        }
        self.card.add(r);
        self.captures.add(r);
        let at = r.arrival_time_us;
        self.rows += 1;
        self.first.get_or_insert(at);
        self.last = Some(self.last.map_or(at, |l| l.max(at)));
        self.rate.add(at);
        if let Some(e) = r.e2el_us {
            self.in_flight.add(at, e);
        }
        if let Some(v) = r.prompt_tokens {
            self.prompt.add(v);
        }
        if let Some(v) = r.output_tokens {
            self.output.add(v);
        }
        *self.outcomes.entry(r.outcome.to_string()).or_insert(0) += 1;
        count(&mut self.endpoints, &r.endpoint);
        count(
            &mut self.models,
            r.model.as_deref().unwrap_or(UNKNOWN_MODEL),
        );
        self.sessions.add(r);
        self.streamed += usize::from(r.stream);
        if let (Some(sim), Some(h)) = (&mut self.prefix, &r.prefix_hashes) {
            if !h.is_empty() {
                sim.observe(h, r.prompt_tokens);
            }
        }
    }

    /// The summary.
    pub fn finish(self) -> TraceSummary {
        let rows = self.rows;
        let duration_s = match (self.first, self.last) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e6,
            _ => 0.0,
        };
        TraceSummary {
            privacy: self.privacy,
            rows,
            shadow_rows: self.shadow_rows,
            files: self.files,
            producers: self.producers,
            first_arrival: self.first.map(rfc3339),
            last_arrival: self.last.map(rfc3339),
            duration_s,
            arrival_rate: self.rate.finish(rows),
            in_flight: self.in_flight.finish(),
            prompt_tokens: self.prompt.finish(),
            output_tokens: self.output.finish(),
            outcomes: self.outcomes,
            streamed: self.streamed,
            streamed_share: if rows == 0 {
                0.0
            } else {
                self.streamed as f64 / rows as f64
            },
            sessions: self.sessions.finish(),
            endpoints: self.endpoints,
            models: self.models,
            prefix_cache: self.prefix.and_then(PrefixCacheSim::finish),
            workload: self.card.finish(),
            captures: self.captures.finish(),
        }
    }
}

fn count(m: &mut BTreeMap<String, usize>, key: &str) {
    match m.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            m.insert(key.to_string(), 1);
        }
    }
}

/// Arrivals per 1-second bucket from the first arrival, from arrivals in order.
#[derive(Debug, Default)]
struct RateAcc {
    first: Option<i64>,
    /// The current bucket and its count.
    bucket: i64,
    n: u64,
    /// The first bucket with the most arrivals, and that count.
    peak: u64,
    peak_bucket: i64,
}

impl RateAcc {
    fn add(&mut self, t: i64) {
        let first = *self.first.get_or_insert(t);
        let b = t.saturating_sub(first) / 1_000_000;
        if b != self.bucket {
            self.close();
            (self.bucket, self.n) = (b, 0);
        }
        self.n += 1;
    }

    fn close(&mut self) {
        if self.n > self.peak {
            (self.peak, self.peak_bucket) = (self.n, self.bucket);
        }
    }

    fn finish(mut self, rows: usize) -> Option<ArrivalRate> {
        let first = self.first?;
        self.close();
        let buckets = self.bucket.saturating_add(1);
        Some(ArrivalRate {
            mean_per_s: rows as f64 / buckets as f64,
            peak_per_s: self.peak,
            peak_at: rfc3339(first.saturating_add(self.peak_bucket.saturating_mul(1_000_000))),
        })
    }
}

/// Requests in flight from arrivals in order and end-to-end latencies: the end times of the
/// requests in flight, in a heap. Intervals are half-open (a request ending when another
/// starts does not overlap it; one of zero length is never in flight).
#[derive(Debug, Default)]
struct InFlightAcc {
    ends: BinaryHeap<Reverse<i64>>,
    rows: usize,
    busy_us: i128,
    start: Option<i64>,
    end: i64,
    peak: usize,
    peak_at: i64,
}

impl InFlightAcc {
    fn add(&mut self, at: i64, e2el_us: i64) {
        let e = e2el_us.max(0);
        let end = at.saturating_add(e);
        self.rows += 1;
        self.busy_us += i128::from(e);
        self.start.get_or_insert(at);
        self.end = if self.rows == 1 {
            end
        } else {
            self.end.max(end)
        };
        while self.ends.peek().is_some_and(|Reverse(t)| *t <= at) {
            self.ends.pop();
        }
        if end > at {
            self.ends.push(Reverse(end));
        }
        if self.ends.len() > self.peak {
            (self.peak, self.peak_at) = (self.ends.len(), at);
        }
    }

    fn finish(&self) -> Option<InFlight> {
        let start = self.start?;
        let window = self.end.saturating_sub(start);
        Some(InFlight {
            mean: if window > 0 {
                self.busy_us as f64 / window as f64
            } else {
                0.0
            },
            peak: self.peak as u64,
            peak_at: rfc3339(if self.peak == 0 { start } else { self.peak_at }),
            rows_counted: self.rows,
        })
    }
}

fn counts(f: &mut fmt::Formatter<'_>, m: &BTreeMap<String, usize>, all: bool) -> fmt::Result {
    let mut v: Vec<(&String, &usize)> = m.iter().filter(|(_, &n)| all || n > 0).collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let shown = 10;
    for (i, (k, n)) in v.iter().take(shown).enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        write!(f, "{sep}{k} {n}")?;
    }
    if v.len() > shown {
        write!(f, ", … {} more", v.len() - shown)?;
    }
    Ok(())
}

fn tokens(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    t: &Option<TokenStats>,
    rows: usize,
) -> fmt::Result {
    match t {
        None => writeln!(f, "{name:<14} unknown"),
        Some(t) => {
            write!(
                f,
                "{name:<14} p50 {:.0}  p95 {:.0}  p99 {:.0}  mean {:.1}  sum {}  ({} of {rows} rows)",
                t.p50, t.p95, t.p99, t.mean, t.sum, t.known
            )?;
            match t.estimate {
                Some(e) => writeln!(f, " (percentiles estimated, within {}%)", e * 100.0),
                None => writeln!(f),
            }
        }
    }
}

impl fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.privacy.iter().enumerate() {
            for (j, line) in m.lines().iter().enumerate() {
                let label = if i == 0 && j == 0 { "privacy" } else { "" };
                writeln!(f, "{label:<14} {line}")?;
            }
        }
        if self.privacy.is_empty() {
            writeln!(
                f,
                "{:<14} no manifest (not a capture, or a capture before manifests)",
                "privacy"
            )?;
        }
        let plural = if self.files == 1 { "" } else { "s" };
        write!(
            f,
            "{:<14} {} rows in {} file{plural}",
            "trace", self.rows, self.files
        )?;
        if !self.producers.is_empty() {
            write!(f, " (")?;
            counts(f, &self.producers, false)?;
            write!(f, ")")?;
        }
        writeln!(f)?;
        if !self.shadow_rows.is_empty() {
            let n: usize = self.shadow_rows.values().sum();
            write!(f, "{:<14} {n} left out of every figure (", "shadow rows")?;
            counts(f, &self.shadow_rows, true)?;
            writeln!(
                f,
                "): --shadow candidates' answers, not production's requests"
            )?;
        }
        match (&self.first_arrival, &self.last_arrival) {
            (Some(a), Some(b)) => writeln!(
                f,
                "{:<14} {a} → {b} ({:.3} s)",
                "time span", self.duration_s
            )?,
            _ => writeln!(f, "{:<14} empty", "time span")?,
        }
        for (i, line) in self.captures.iter().flat_map(|c| c.lines()).enumerate() {
            let label = if i == 0 { "captures" } else { "" };
            writeln!(f, "{label:<14} {line}")?;
        }
        match &self.arrival_rate {
            Some(r) => writeln!(
                f,
                "{:<14} mean {:.2} req/s, peak {} req/s at {} (1 s buckets)",
                "arrival rate", r.mean_per_s, r.peak_per_s, r.peak_at
            )?,
            None => writeln!(f, "{:<14} unknown", "arrival rate")?,
        }
        match &self.in_flight {
            Some(c) => writeln!(
                f,
                "{:<14} mean {:.2}, peak {} at {} (from {} of {} rows with e2el)",
                "in flight", c.mean, c.peak, c.peak_at, c.rows_counted, self.rows
            )?,
            None => writeln!(f, "{:<14} unknown (no row has e2el)", "in flight")?,
        }
        tokens(f, "prompt tokens", &self.prompt_tokens, self.rows)?;
        tokens(f, "output tokens", &self.output_tokens, self.rows)?;
        write!(f, "{:<14} ", "outcomes")?;
        counts(f, &self.outcomes, false)?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<14} {} ({:.1}%)",
            "streamed",
            self.streamed,
            self.streamed_share * 100.0
        )?;
        if let Some(s) = &self.sessions {
            writeln!(f, "{:<14} {s}", "sessions")?;
        }
        write!(f, "{:<14} {} (", "endpoints", self.endpoints.len())?;
        counts(f, &self.endpoints, true)?;
        writeln!(f, ")")?;
        write!(f, "{:<14} {} (", "models", self.models.len())?;
        counts(f, &self.models, true)?;
        writeln!(f, ")")?;
        if let Some(p) = &self.prefix_cache {
            write!(f, "{:<14} ", "prefix cache")?;
            for (i, c) in p.caches.iter().enumerate() {
                let size = match (c.cache_blocks, p.unbounded_capped_at) {
                    (Some(n), _) => format!("LRU {n} blocks"),
                    (None, None) => "unbounded".to_string(),
                    (None, Some(cap)) => {
                        format!("unbounded (at least; it kept the first {cap} distinct blocks)")
                    }
                };
                let sep = if i == 0 { "" } else { "; " };
                write!(
                    f,
                    "{sep}{size}: {:.1}% of prompt tokens",
                    c.token_hit_rate * 100.0
                )?;
            }
            writeln!(f)?;
            writeln!(
                f,
                "{:<14} (theoretical, in arrival order: {} of {} rows with {}-token block hashes, \
                 {}{} distinct of {} blocks; a replay's default prompt salt keeps this reuse within \
                 the run, not from earlier runs)",
                "",
                p.rows_with_hashes,
                self.rows,
                p.block_size,
                if p.unbounded_capped_at.is_some() { "at least " } else { "" },
                p.distinct_blocks,
                p.blocks
            )?;
        }
        write!(f, "{}", self.workload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_meta::FileMeta;
    use crate::schema::Producer;

    const T0: i64 = 1_700_000_000_000_000; // 2023-11-14T22:13:20Z

    fn rec(id: &str, at_ms: i64, e2el_ms: Option<i64>) -> TraceRecord {
        let mut r = TraceRecord::new(id, T0 + at_ms * 1000, "/v1/chat/completions");
        r.e2el_us = e2el_ms.map(|e| e * 1000);
        r
    }

    /// A: [0, 3 s), B: [0.5, 1.5), C: [1.0, 1.5), D: [1.5, 4.0).
    fn four() -> Trace {
        let mut a = rec("a", 0, Some(3000));
        let mut b = rec("b", 500, Some(1000));
        let mut c = rec("c", 1000, Some(500));
        let mut d = rec("d", 1500, Some(2500));
        for (r, p, o) in [
            (&mut a, 10, Some(5)),
            (&mut b, 20, Some(6)),
            (&mut c, 30, Some(7)),
            (&mut d, 40, None),
        ] {
            r.prompt_tokens = Some(p);
            r.output_tokens = o;
        }
        a.stream = true;
        b.stream = true;
        a.session_id = Some("s1".into());
        b.session_id = Some("s1".into());
        c.session_id = Some("s2".into());
        a.model = Some("m1".into());
        b.model = Some("m1".into());
        c.model = Some("m2".into());
        d.outcome = Outcome::Timeout;
        d.endpoint = "/v1/completions".into();
        Trace {
            records: vec![a, b, c, d],
            files: vec![TraceFile {
                path: "x.parquet".into(),
                meta: FileMeta::new(Producer::Capture, "test"),
                rows: 4,
                schema_version: "1.0".into(),
                tool_version: None,
                assumed: None,
            }],
        }
    }

    #[test]
    fn hand_computed_figures() {
        let s = summarize(&four());
        assert_eq!(s.rows, 4);
        assert_eq!(s.files, 1);
        assert_eq!(s.producers.get("capture"), Some(&1));
        assert_eq!(
            s.first_arrival.as_deref(),
            Some("2023-11-14T22:13:20.000000Z")
        );
        assert_eq!(
            s.last_arrival.as_deref(),
            Some("2023-11-14T22:13:21.500000Z")
        );
        assert_eq!(s.duration_s, 1.5);

        // Buckets [0,1): a, b; [1,2): c, d.
        let r = s.arrival_rate.as_ref().unwrap();
        assert_eq!(r.mean_per_s, 2.0);
        assert_eq!(r.peak_per_s, 2);
        assert_eq!(r.peak_at, "2023-11-14T22:13:20.000000Z");

        // At 1.0 s: a, b, c. At 1.5 s b and c end as d starts: 2, not 4.
        let c = s.in_flight.as_ref().unwrap();
        assert_eq!(c.peak, 3);
        assert_eq!(c.peak_at, "2023-11-14T22:13:21.000000Z");
        // Σ e2el = 7 s over [0, 4 s).
        assert_eq!(c.mean, 1.75);
        assert_eq!(c.rows_counted, 4);

        let p = s.prompt_tokens.as_ref().unwrap();
        assert_eq!((p.known, p.sum, p.mean, p.p50), (4, 100, 25.0, 25.0));
        assert!(
            (p.p95 - 38.5).abs() < 1e-9 && (p.p99 - 39.7).abs() < 1e-9,
            "{p:?}"
        );
        let o = s.output_tokens.as_ref().unwrap();
        assert_eq!((o.known, o.sum, o.mean, o.p50), (3, 18, 6.0, 6.0));

        assert_eq!(s.outcomes.get("ok"), Some(&3));
        assert_eq!(s.outcomes.get("timeout"), Some(&1));
        assert_eq!(s.outcomes.get("http_error"), Some(&0));
        assert_eq!((s.streamed, s.streamed_share), (2, 0.5));
        let sessions = s.sessions.as_ref().expect("sessions");
        assert_eq!((sessions.sessions, sessions.multi_turn_sessions), (2, 1));
        assert_eq!(s.endpoints.get("/v1/chat/completions"), Some(&3));
        assert_eq!(s.models.get("m1"), Some(&2));
        assert_eq!(s.models.get(UNKNOWN_MODEL), Some(&1));

        let text = s.to_string();
        assert!(text.contains("peak 3"), "{text}");
        assert!(text.contains("timeout 1"), "{text}");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["in_flight"]["peak"], 3);
        assert_eq!(json["arrival_rate"]["peak_per_s"], 2);
    }

    /// A capture with `--shadow`: each production row has a candidate's row beside it (same
    /// arrival, its own outcome, tokens and latency). The figures are production's alone,
    /// the shadow rows counted per candidate.
    #[test]
    fn shadow_rows_are_counted_apart_from_production() {
        let prod = four();
        let mut t = four();
        for (i, p) in prod.records.iter().enumerate() {
            for target in ["next", "other"].iter().take(1 + i % 2) {
                let mut s = p.clone();
                s.request_id = format!("{}-{target}", p.request_id);
                s.target = Some(target.to_string());
                s.pair_request_id = Some(p.request_id.clone());
                s.outcome = Outcome::Timeout;
                s.e2el_us = Some(60_000_000);
                s.prompt_tokens = Some(1000);
                s.session_id = None;
                s.model = Some("cand-model".into());
                t.records.push(s);
            }
        }
        let (want, got) = (summarize(&prod), summarize(&t));
        assert_eq!(
            got.shadow_rows,
            BTreeMap::from([("next".to_string(), 4), ("other".to_string(), 2)])
        );
        assert_eq!(
            TraceSummary {
                shadow_rows: BTreeMap::new(),
                ..got.clone()
            },
            want
        );
        let text = got.to_string();
        assert!(
            text.contains("shadow rows    6 left out of every figure (next 4, other 2)"),
            "{text}"
        );
        assert!(text.contains("4 rows in 1 file"), "{text}");
        assert_eq!(
            serde_json::to_value(&got).unwrap()["shadow_rows"]["next"],
            4
        );
        assert!(serde_json::to_value(&want)
            .unwrap()
            .get("shadow_rows")
            .is_none());
    }

    /// The old whole-trace figure: every start and end as an event, sorted (ends first at
    /// an instant), counted.
    fn in_flight_by_events(recs: &[TraceRecord]) -> Option<(u64, i64, f64)> {
        let mut events: Vec<(i64, i8)> = Vec::new();
        let mut busy: i128 = 0;
        for r in recs {
            if let Some(e) = r.e2el_us {
                let e = e.max(0);
                events.push((r.arrival_time_us, 1));
                events.push((r.arrival_time_us + e, -1));
                busy += i128::from(e);
            }
        }
        events.sort_unstable();
        let start = events.iter().filter(|e| e.1 == 1).map(|e| e.0).min()?;
        let end = events.iter().map(|e| e.0).max()?;
        let (mut cur, mut peak, mut at) = (0i64, 0i64, start);
        for (t, d) in &events {
            cur += i64::from(*d);
            if cur > peak {
                (peak, at) = (cur, *t);
            }
        }
        let w = end - start;
        Some((
            peak as u64,
            at,
            if w > 0 { busy as f64 / w as f64 } else { 0.0 },
        ))
    }

    proptest::proptest! {
        /// The heap of end times gives the event count's figures exactly, ties, zero and
        /// negative lengths included.
        #[test]
        fn in_flight_from_ends_in_flight_is_the_event_count(
            rows in proptest::collection::vec((0i64..30, proptest::option::of(-2i64..12)), 0..40)
        ) {
            let mut recs: Vec<TraceRecord> = rows
                .iter()
                .enumerate()
                .map(|(i, &(at, e))| rec(&format!("r{i}"), at, e))
                .collect();
            recs.sort_by_key(|r| r.arrival_time_us);
            let trace = Trace { records: recs.clone(), files: vec![] };
            let got = summarize(&trace).in_flight;
            match in_flight_by_events(&recs) {
                None => proptest::prop_assert!(got.is_none()),
                Some((peak, at, mean)) => {
                    let got = got.unwrap();
                    proptest::prop_assert_eq!(got.peak, peak);
                    proptest::prop_assert_eq!(got.peak_at, rfc3339(at));
                    proptest::prop_assert_eq!(got.mean, mean);
                }
            }
        }
    }

    /// Over a stream of several files (one capture-like, out of order), the summary is the
    /// whole trace's.
    #[test]
    fn the_summary_of_a_stream_is_the_summary_of_the_trace() {
        let dir = tempfile::tempdir().unwrap();
        let mut names = Vec::new();
        for f in 0..3i64 {
            let mut rows: Vec<TraceRecord> = (0..400)
                .map(|i| {
                    let mut r = rec(&format!("f{f}-{i}"), i * 7 + f, Some((i * 31) % 900));
                    r.prompt_tokens = Some(100 + (i * 13) % 57);
                    r.output_tokens = (i % 5 != 0).then_some(i % 17);
                    r.session_id = Some(format!("s{}", i % 11));
                    r.prefix_hashes = Some(vec![(i % 4) as u64, i as u64]);
                    r
                })
                .collect();
            if f == 1 {
                rows.sort_by_key(|r| r.arrival_time_us + r.e2el_us.unwrap_or(0));
            }
            let p = dir.path().join(format!("{f}.parquet"));
            let mut meta = FileMeta::new(Producer::Capture, "test");
            meta.block_size = Some(16);
            crate::write_trace_file(&p, &rows, &meta).unwrap();
            names.push(p.to_str().unwrap().to_string());
        }
        let trace = crate::read_traces(&names).unwrap();
        let stream = TraceStream::open(&names).unwrap();
        let whole = summarize_with(&trace, &[8]);
        let streamed = summarize_stream(&stream, &[8]).unwrap();
        assert_eq!(streamed, whole);
        assert!(whole.prefix_cache.is_some() && whole.in_flight.is_some());
        assert_eq!(whole.sessions.as_ref().map(|s| s.sessions), Some(11));
        // Unsorted records summarize the same.
        let mut shuffled = trace.clone();
        shuffled.records.reverse();
        assert_eq!(summarize_with(&shuffled, &[8]), whole);
    }

    /// Past the exact cap the token percentiles are estimates and say so; sum and mean stay
    /// exact.
    #[test]
    fn token_percentiles_past_the_cap_are_estimates_that_say_so() {
        let mut acc = TokenAcc::default();
        let n = crate::quantiles::EXACT_CAP as i64 + 1000;
        for v in 0..n {
            acc.add(v % 1000 + 1);
        }
        let t = acc.finish().unwrap();
        assert_eq!(t.estimate, Some(crate::quantiles::RELATIVE_ERROR));
        assert_eq!(t.known as i64, n);
        assert!((t.p50 - 500.5).abs() <= 500.5 * 0.002, "{}", t.p50);
        let sum: i64 = (0..n).map(|v| v % 1000 + 1).sum();
        assert_eq!(t.sum, sum);
        assert_eq!(t.mean, sum as f64 / n as f64);
        let mut s = summarize(&Trace::default());
        s.prompt_tokens = Some(t);
        assert!(
            s.to_string()
                .contains("(percentiles estimated, within 0.1%)"),
            "{s}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["prompt_tokens"]["estimate"], 0.001);
        let mut exact = TokenAcc::default();
        exact.add(3);
        let json = serde_json::to_value(exact.finish().unwrap()).unwrap();
        assert!(json.get("estimate").is_none(), "{json}");
    }

    #[test]
    fn unknown_latency_and_empty_trace() {
        let mut t = four();
        for r in &mut t.records {
            r.e2el_us = None;
            r.prompt_tokens = None;
        }
        let s = summarize(&t);
        assert!(s.in_flight.is_none() && s.prompt_tokens.is_none());
        let text = s.to_string();
        assert!(text.contains("in flight      unknown"), "{text}");
        assert!(text.contains("prompt tokens  unknown"), "{text}");

        let s = summarize(&Trace::default());
        assert_eq!(s.rows, 0);
        assert!(s.arrival_rate.is_none() && s.first_arrival.is_none());
        assert_eq!(s.streamed_share, 0.0);
        assert!(s.to_string().contains("empty"));
        assert!(s.sessions.is_none() && !s.to_string().contains("sessions"));
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("sessions").is_none(), "{json}");
    }
}
