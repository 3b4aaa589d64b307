//! `llmreplay inspect`: the figures an infrastructure team needs before benchmarking, read off
//! its own traffic: arrival rate and concurrency (requests in flight), prompt and output
//! lengths, outcomes, streaming share, sessions, endpoints and models, and how much of its
//! prompt a prefix cache could serve ([`crate::prefix_cache`]).
//!
//! [`summarize`] computes a [`TraceSummary`]; it prints as a console block (`Display`) and
//! serializes to JSON (`serde::Serialize`).

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, SecondsFormat};
use serde::Serialize;

use crate::prefix_cache::{PrefixCacheSim, PrefixCacheSummary};
use crate::reader::Trace;
use crate::schema::Outcome;
use crate::sessions::{SessionStats, SessionSummary};
use crate::stats::percentile;

/// Key used for requests without a model in [`TraceSummary::models`].
pub const UNKNOWN_MODEL: &str = "(unknown)";

/// Summary of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceSummary {
    /// Number of requests.
    pub rows: usize,
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
}

impl TokenStats {
    fn of(values: impl Iterator<Item = i64>) -> Option<TokenStats> {
        let mut v: Vec<i64> = values.collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let sum = v.iter().fold(0i64, |a, &b| a.saturating_add(b));
        let sorted: Vec<f64> = v.iter().map(|&x| x as f64).collect();
        Some(TokenStats {
            known: v.len(),
            sum,
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p50: percentile(&sorted, 50.0),
            p95: percentile(&sorted, 95.0),
            p99: percentile(&sorted, 99.0),
        })
    }
}

/// RFC 3339 (µs, `Z`) of a time in µs since the epoch.
pub fn rfc3339(us: i64) -> String {
    DateTime::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, true))
        .unwrap_or_else(|| format!("{us} µs since the epoch (out of range)"))
}

/// Computes the summary of a trace (its records need not be sorted), with the prefix-cache hit
/// rate of an unbounded cache only.
pub fn summarize(trace: &Trace) -> TraceSummary {
    summarize_with(trace, &[])
}

/// [`summarize`], with the prefix-cache hit rate also for LRU caches of `cache_blocks` blocks.
pub fn summarize_with(trace: &Trace, cache_blocks: &[u64]) -> TraceSummary {
    let recs = &trace.records;
    let rows = recs.len();

    let mut producers = BTreeMap::new();
    for f in &trace.files {
        *producers.entry(f.meta.producer.to_string()).or_insert(0) += 1;
    }

    let mut arrivals: Vec<i64> = recs.iter().map(|r| r.arrival_time_us).collect();
    arrivals.sort_unstable();
    let first = arrivals.first().copied();
    let last = arrivals.last().copied();
    let duration_s = match (first, last) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e6,
        _ => 0.0,
    };

    let mut outcomes: BTreeMap<String, usize> =
        Outcome::ALL.iter().map(|o| (o.to_string(), 0)).collect();
    let mut endpoints = BTreeMap::new();
    let mut models = BTreeMap::new();
    let mut sessions = SessionStats::new();
    let mut streamed = 0;
    for r in recs {
        *outcomes.entry(r.outcome.to_string()).or_insert(0) += 1;
        *endpoints.entry(r.endpoint.clone()).or_insert(0) += 1;
        let model = r.model.as_deref().unwrap_or(UNKNOWN_MODEL);
        *models.entry(model.to_string()).or_insert(0) += 1;
        sessions.add(r);
        streamed += usize::from(r.stream);
    }

    TraceSummary {
        rows,
        files: trace.files.len(),
        producers,
        first_arrival: first.map(rfc3339),
        last_arrival: last.map(rfc3339),
        duration_s,
        arrival_rate: arrival_rate(&arrivals),
        in_flight: in_flight(trace),
        prompt_tokens: TokenStats::of(recs.iter().filter_map(|r| r.prompt_tokens)),
        output_tokens: TokenStats::of(recs.iter().filter_map(|r| r.output_tokens)),
        outcomes,
        streamed,
        streamed_share: if rows == 0 {
            0.0
        } else {
            streamed as f64 / rows as f64
        },
        sessions: sessions.finish(),
        endpoints,
        models,
        prefix_cache: prefix_cache(trace, cache_blocks),
    }
}

/// The cache simulation over the rows with prefix hashes, in arrival order.
fn prefix_cache(trace: &Trace, sizes: &[u64]) -> Option<PrefixCacheSummary> {
    let mut blocks = trace.files.iter().map(|f| f.meta.block_size);
    let block_size = blocks.next()??;
    if blocks.any(|b| b != Some(block_size)) {
        return None;
    }
    let mut order: Vec<usize> = (0..trace.records.len())
        .filter(|&i| {
            trace.records[i]
                .prefix_hashes
                .as_ref()
                .is_some_and(|h| !h.is_empty())
        })
        .collect();
    order.sort_by_key(|&i| trace.records[i].arrival_time_us);
    let mut sim = PrefixCacheSim::new(block_size, sizes);
    for i in order {
        let r = &trace.records[i];
        sim.observe(r.prefix_hashes.as_deref().unwrap_or(&[]), r.prompt_tokens);
    }
    sim.finish()
}

/// Arrivals per 1-second bucket from sorted arrival times.
fn arrival_rate(sorted: &[i64]) -> Option<ArrivalRate> {
    let (&first, &last) = (sorted.first()?, sorted.last()?);
    let bucket = |t: i64| t.saturating_sub(first) / 1_000_000;
    let buckets = bucket(last).saturating_add(1);
    let (mut peak, mut peak_bucket) = (0u64, 0i64);
    let mut i = 0;
    while i < sorted.len() {
        let b = bucket(sorted[i]);
        let mut n = 0u64;
        while i < sorted.len() && bucket(sorted[i]) == b {
            n += 1;
            i += 1;
        }
        if n > peak {
            (peak, peak_bucket) = (n, b);
        }
    }
    Some(ArrivalRate {
        mean_per_s: sorted.len() as f64 / buckets as f64,
        peak_per_s: peak,
        peak_at: rfc3339(first.saturating_add(peak_bucket.saturating_mul(1_000_000))),
    })
}

/// Requests in flight from arrivals and end-to-end latencies (rows without one ignored).
fn in_flight(trace: &Trace) -> Option<InFlight> {
    let mut events: Vec<(i64, i8)> = Vec::new();
    let mut busy_us: i128 = 0;
    for r in &trace.records {
        if let Some(e) = r.e2el_us {
            let e = e.max(0);
            events.push((r.arrival_time_us, 1));
            events.push((r.arrival_time_us.saturating_add(e), -1));
            busy_us += i128::from(e);
        }
    }
    if events.is_empty() {
        return None;
    }
    // Ends (-1) sort before starts (+1) at the same instant: intervals are half-open.
    events.sort_unstable();
    let start = events.iter().filter(|e| e.1 == 1).map(|e| e.0).min()?;
    let end = events.iter().map(|e| e.0).max()?;
    let (mut cur, mut peak, mut peak_at) = (0i64, 0i64, start);
    for (t, d) in &events {
        cur += i64::from(*d);
        if cur > peak {
            (peak, peak_at) = (cur, *t);
        }
    }
    let window = end.saturating_sub(start);
    Some(InFlight {
        mean: if window > 0 {
            busy_us as f64 / window as f64
        } else {
            0.0
        },
        peak: peak as u64,
        peak_at: rfc3339(peak_at),
        rows_counted: events.len() / 2,
    })
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
        Some(t) => writeln!(
            f,
            "{name:<14} p50 {:.0}  p95 {:.0}  p99 {:.0}  mean {:.1}  sum {}  ({} of {rows} rows)",
            t.p50, t.p95, t.p99, t.mean, t.sum, t.known
        ),
    }
}

impl fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        match (&self.first_arrival, &self.last_arrival) {
            (Some(a), Some(b)) => writeln!(
                f,
                "{:<14} {a} → {b} ({:.3} s)",
                "time span", self.duration_s
            )?,
            _ => writeln!(f, "{:<14} empty", "time span")?,
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
                let size = c
                    .cache_blocks
                    .map_or("unbounded".to_string(), |n| format!("LRU {n} blocks"));
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
                 {} distinct of {} blocks; a replay's default prompt salt keeps this reuse within \
                 the run, not from earlier runs)",
                "", p.rows_with_hashes, self.rows, p.block_size, p.distinct_blocks, p.blocks
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_meta::FileMeta;
    use crate::reader::TraceFile;
    use crate::schema::{Producer, TraceRecord};

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
