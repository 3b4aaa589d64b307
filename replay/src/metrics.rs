//! vLLM-compatible metrics from per-request results (../shared/docs/metrics.md).
//!
//! Inputs are the result rows themselves (integer microseconds), so aggregation loses
//! nothing: every value is converted to milliseconds once, percentiles are exact over all
//! values (numpy's linear interpolation), never from a histogram.

use std::collections::BTreeMap;

use serde::Serialize;
use trace_format::stats::Summary;
use trace_format::{Outcome, TraceRecord};

use crate::config::{Slo, SloMetric};

/// The aggregate metrics of one run against one target.
#[derive(Debug, Clone, Serialize)]
pub struct Metrics {
    /// Requests sent.
    pub num_prompts: usize,
    /// Requests with outcome `ok`.
    pub completed: usize,
    /// All others.
    pub failed: usize,
    /// From the scheduled start of the first request to the end of the last one, s.
    pub duration_s: f64,
    /// Σ prompt tokens of completed requests.
    pub total_input_tokens: i64,
    /// Σ output tokens of completed requests.
    pub total_output_tokens: i64,
    /// completed / duration.
    pub request_throughput: f64,
    /// Requests per second meeting every SLO (None without SLOs).
    pub request_goodput: Option<f64>,
    /// Σ output tokens / duration.
    pub output_throughput: f64,
    /// (Σ prompt + Σ output tokens) / duration.
    pub total_token_throughput: f64,
    /// Most requests in flight at once.
    pub max_concurrent_requests: usize,
    /// TTFT, ms, over completed streamed requests (a request that is not streamed has no
    /// observable first token).
    pub ttft: Summary,
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
    /// Fraction of all requests meeting every SLO (None without SLOs).
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
    /// frequent first: (outcome, text, requests).
    pub top_errors: Vec<(String, String, usize)>,
    /// Completed requests per output-token source.
    pub output_token_sources: BTreeMap<String, usize>,
}

/// How many completed requests each latency metric covers: TTFT, ITL and TPOT exist only for
/// streamed requests; E2EL, throughput and goodput count every one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// Completed streamed requests with a first output chunk.
    pub ttft: usize,
    /// Completed streamed requests with more than one output token.
    pub tpot: usize,
    /// Completed streamed requests with two or more output chunks (one gap or more).
    pub itl: usize,
    /// Completed requests with an end time.
    pub e2el: usize,
    /// Completed requests that were not streamed (in E2EL, throughput and goodput only).
    pub not_streamed: usize,
}

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

fn by_class(records: &[TraceRecord], p: &[f64]) -> Vec<ClassMetrics> {
    // The console's table shows P99 whatever --metric-percentiles asks for.
    let mut p = p.to_vec();
    if !p.contains(&99.0) {
        p.push(99.0);
    }
    let p = p.as_slice();
    let mut classes: BTreeMap<(String, bool), Vec<&TraceRecord>> = BTreeMap::new();
    for r in records {
        classes
            .entry((r.endpoint.clone(), r.stream))
            .or_default()
            .push(r);
    }
    if classes.len() < 2 {
        return Vec::new();
    }
    classes
        .into_iter()
        .map(|((endpoint, stream), rs)| {
            let ok: Vec<&TraceRecord> = rs
                .iter()
                .copied()
                .filter(|r| r.outcome == Outcome::Ok)
                .collect();
            let summary = |mut v: Vec<f64>| Summary::from_values(&mut v, p);
            ClassMetrics {
                endpoint,
                stream,
                requests: rs.len(),
                completed: ok.len(),
                output_tokens: ok.iter().filter_map(|r| r.output_tokens).sum(),
                ttft: stream.then(|| summary(ok.iter().filter_map(|r| ttft_ms(r)).collect())),
                tpot: stream.then(|| summary(ok.iter().filter_map(|r| tpot_ms(r)).collect())),
                itl: stream.then(|| summary(ok.iter().flat_map(|r| itl_gaps_ms(r)).collect())),
                e2el: summary(ok.iter().filter_map(|r| r.e2el_us.map(ms)).collect()),
            }
        })
        .collect()
}

/// How many distinct error texts a result lists.
pub const TOP_ERRORS: usize = 5;
/// Longest error text kept in the list, characters.
const ERROR_TEXT: usize = 300;

/// The most frequent (outcome, error text) of the failed requests, most frequent first (ties
/// by text).
fn top_errors(records: &[TraceRecord]) -> Vec<(String, String, usize)> {
    let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.outcome != Outcome::Ok) {
        let text = r.error.as_deref().unwrap_or("(no error text)");
        let text: String = text.chars().take(ERROR_TEXT).collect();
        *by.entry((r.outcome.to_string(), text)).or_insert(0) += 1;
    }
    let mut v: Vec<(String, String, usize)> = by.into_iter().map(|((o, t), n)| (o, t, n)).collect();
    v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
    v.truncate(TOP_ERRORS);
    v
}

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
        SloMetric::Ttft | SloMetric::Tpot if !r.stream => true,
        SloMetric::Ttft => ttft_ms(r).is_some_and(|v| v <= s.limit_ms),
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
    let ok: Vec<&TraceRecord> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .collect();
    let mut end_us = run_start_us;
    let mut intervals: Vec<(i64, i64)> = Vec::with_capacity(records.len());
    for r in records {
        let span = r
            .e2el_us
            .or_else(|| r.chunk_times_us.last().copied())
            .unwrap_or(0)
            .max(0);
        end_us = end_us.max(r.arrival_time_us + span);
        intervals.push((r.arrival_time_us, r.arrival_time_us + span));
    }
    let duration_s = ((end_us - run_start_us).max(1)) as f64 / 1e6;

    let total_input_tokens: i64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
    let total_output_tokens: i64 = ok.iter().filter_map(|r| r.output_tokens).sum();

    // TTFT, TPOT and ITL over streamed requests only: a request that is not streamed has
    // no first token (older traces recorded its E2EL as TTFT, which this also leaves out).
    let streamed: Vec<&TraceRecord> = ok.iter().copied().filter(|r| r.stream).collect();
    let mut ttft: Vec<f64> = streamed.iter().filter_map(|r| ttft_ms(r)).collect();
    let mut e2el: Vec<f64> = ok.iter().filter_map(|r| r.e2el_us.map(ms)).collect();
    let mut tpot: Vec<f64> = streamed.iter().filter_map(|r| tpot_ms(r)).collect();
    let coverage = Coverage {
        ttft: ttft.len(),
        tpot: tpot.len(),
        itl: streamed
            .iter()
            .filter(|r| r.chunk_times_us.len() >= 2)
            .count(),
        e2el: e2el.len(),
        not_streamed: ok.len() - streamed.len(),
    };
    let mut itl = Vec::new();
    let mut itl_tok = Vec::new();
    let mut have_tokens = false;
    for r in &streamed {
        for (i, w) in r.chunk_times_us.windows(2).enumerate() {
            let gap = ms(w[1] - w[0]);
            itl.push(gap);
            if let Some(ct) = &r.chunk_tokens {
                have_tokens = true;
                if let Some(&n) = ct.get(i + 1) {
                    if n > 0 {
                        itl_tok.push(gap / f64::from(n));
                    }
                }
            }
        }
    }
    let mut lag: Vec<f64> = records
        .iter()
        .filter_map(|r| r.dispatch_lag_us.map(ms))
        .collect();
    let mut queue: Vec<f64> = records.iter().filter_map(|r| r.queue_us.map(ms)).collect();
    let mut connect: Vec<f64> = records
        .iter()
        .filter(|r| r.new_connection == Some(true))
        .filter_map(|r| r.connect_us.map(ms))
        .collect();

    let good = if slos.is_empty() {
        None
    } else {
        Some(records.iter().filter(|r| meets_slos(r, slos)).count())
    };
    let mut outcomes = BTreeMap::new();
    for r in records {
        *outcomes.entry(r.outcome.to_string()).or_insert(0) += 1;
    }
    let mut output_token_sources = BTreeMap::new();
    for r in &ok {
        let k = r
            .output_tokens_source
            .map_or("unknown".to_string(), |s| s.to_string());
        *output_token_sources.entry(k).or_insert(0) += 1;
    }
    let p = percentiles;
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        (!v.is_empty()).then(|| Summary::from_values(&mut v, &[]).median)
    };
    let (lo, hi) = records
        .iter()
        .filter_map(|r| r.scheduled_offset_us)
        .fold((i64::MAX, i64::MIN), |(a, b), o| (a.min(o), b.max(o)));
    let gap = (records.len() >= 2 && hi > lo).then(|| ms(hi - lo) / (records.len() - 1) as f64);
    let lag_allowance = lag_allowance_ms(gap, median(&e2el));
    Metrics {
        num_prompts: records.len(),
        completed: ok.len(),
        failed: records.len() - ok.len(),
        duration_s,
        total_input_tokens,
        total_output_tokens,
        request_throughput: ok.len() as f64 / duration_s,
        request_goodput: good.map(|g| g as f64 / duration_s),
        output_throughput: total_output_tokens as f64 / duration_s,
        total_token_throughput: (total_input_tokens + total_output_tokens) as f64 / duration_s,
        max_concurrent_requests: max_overlap(&mut intervals),
        ttft: Summary::from_values(&mut ttft, p),
        tpot: Summary::from_values(&mut tpot, p),
        itl: Summary::from_values(&mut itl, p),
        e2el: Summary::from_values(&mut e2el, p),
        coverage,
        itl_per_token: have_tokens.then(|| Summary::from_values(&mut itl_tok, p)),
        slo_attainment: good.map(|g| {
            if records.is_empty() {
                0.0
            } else {
                g as f64 / records.len() as f64
            }
        }),
        lag_allowance_ms: lag_allowance,
        late_dispatches: lag.iter().filter(|&&l| l > lag_allowance).count(),
        served: crate::served::analyse(records, run_start_us),
        by_class: by_class(records, p),
        dispatch_lag: Summary::from_values(&mut lag, &[50.0, 99.0]),
        queue: Summary::from_values(&mut queue, &[50.0, 99.0]),
        new_connections: records
            .iter()
            .filter(|r| r.new_connection == Some(true))
            .count(),
        connect: Summary::from_values(&mut connect, &[50.0, 99.0]),
        outcomes,
        top_errors: top_errors(records),
        output_token_sources,
    }
}

/// Most intervals overlapping at one instant (an end at t frees its slot before a start at t).
pub fn max_overlap(intervals: &mut [(i64, i64)]) -> usize {
    let mut ev: Vec<(i64, i32)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e) in intervals.iter() {
        ev.push((s, 1));
        ev.push((e.max(s), -1));
    }
    ev.sort_unstable();
    let (mut cur, mut best) = (0i64, 0i64);
    for (_, d) in ev {
        cur += i64::from(d);
        best = best.max(cur);
    }
    best as usize
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(
            m.top_errors,
            vec![
                ("http_error".into(), "HTTP 501: not implemented".into(), 2),
                (
                    "timeout".into(),
                    "no response headers within the timeout".into(),
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
                not_streamed: 1
            }
        );
        assert_eq!(m.total_output_tokens, 54);
        // TTFT and TPOT SLOs do not apply to it; E2EL does.
        assert!(meets_slos(&whole, &slos));
        assert!(!meets_slos(&whole, &["e2el:500".parse().unwrap()]));
        assert!((m.slo_attainment.unwrap() - 1.0).abs() < 1e-9);
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
}
