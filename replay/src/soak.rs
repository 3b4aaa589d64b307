//! Soak and drift: replaying a trace repeatedly (`--loop N`, or `--loop inf` until
//! `--duration`) and cutting a run into time slices (`--slice 30s`), so that degradation over
//! an hour — memory growth, KV-cache fragmentation, throttling — shows as a trend in the
//! JSON and on the report's timeline instead of vanishing into one percentile.
//!
//! Looping happens on the trace rows before the schedule is built: pass `k` is the trace
//! read again ([`Looped`], never a copy held in memory) and shifted by `k` periods (the
//! trace's span plus one mean inter-arrival gap), with `~k` appended to request and session
//! ids. Synthesized prompts are keyed by request id, so every pass sends fresh prompt text
//! while shared prefixes (`prefix_hashes`) stay shared — the cache behaviour of production
//! traffic, not of a replay of identical prompts. The selection (`--start-offset`,
//! `--duration`, `--max-requests`) then applies to the looped trace: with `--loop`,
//! `--duration` is the soak's length in trace time.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use trace_format::stats::percentile;
use trace_format::{Outcome, TraceRecord};

use crate::config::{Loops, Slo};
use crate::error::ReplayError;
use crate::metrics::{itl_gaps_ms, meets_slos, tpot_ms, ttft_ms};
use crate::source::{ArrivalSpan, RecordSource, Records};

/// At most this many looped rows when the run keeps every row in memory
/// ([`crate::ReplayConfig::keep_rows`]; a guard against `--loop inf --duration 1000h`).
pub const MAX_LOOPED_ROWS: usize = 20_000_000;

/// The period of one pass: the span of the trace plus one mean inter-arrival gap (1 s for a
/// trace without rows), so a pass's first request never lands on the previous pass's last.
pub fn period_us(span: Option<ArrivalSpan>) -> i64 {
    let Some(s) = span else {
        return 1_000_000;
    };
    let span = s.last_us - s.first_us;
    let gap = if s.rows > 1 {
        span / (s.rows as i64 - 1)
    } else {
        0
    };
    (span + gap).max(1_000) // ≥ 1 ms, even for a trace whose rows all arrive at once
}

/// Passes needed: `Count(n)` is n; `UntilDuration` covers `start_offset + duration` of trace
/// time. `bounded`: the rows are kept in memory, so at most [`MAX_LOOPED_ROWS`].
pub fn passes(
    span: Option<ArrivalSpan>,
    loops: Loops,
    start_offset: Duration,
    duration: Option<Duration>,
    bounded: bool,
) -> Result<usize, ReplayError> {
    let n = match loops {
        Loops::Count(n) => n,
        Loops::UntilDuration => {
            let Some(d) = duration else {
                return Err(ReplayError::Config(
                    "--loop inf replays until --duration: give --duration (e.g. 1h)".into(),
                ));
            };
            let want = (start_offset + d).as_micros() as f64;
            (want / period_us(span) as f64).ceil().max(1.0) as usize
        }
    };
    let rows = span.map_or(0, |s| s.rows);
    if bounded && n.saturating_mul(rows) > MAX_LOOPED_ROWS {
        return Err(ReplayError::Config(format!(
            "--loop: {n} passes of {rows} rows exceed {MAX_LOOPED_ROWS} requests kept in memory"
        )));
    }
    Ok(n)
}

fn suffixed(id: &str, pass: usize) -> String {
    if pass == 0 {
        id.to_string()
    } else {
        format!("{id}~{pass}")
    }
}

/// A source read `passes` times back to back: pass `k` shifted by `k` periods, its request
/// and session ids suffixed with `~k` (pass 0 keeps the recorded ids).
pub struct Looped<'a> {
    inner: &'a dyn RecordSource,
    passes: usize,
    period: i64,
    span: Option<ArrivalSpan>,
}

impl<'a> Looped<'a> {
    /// `passes` passes of `inner`, whose arrival span is `span`.
    pub fn new(inner: &'a dyn RecordSource, passes: usize, span: Option<ArrivalSpan>) -> Self {
        Looped {
            inner,
            passes,
            period: period_us(span),
            span,
        }
    }
}

impl RecordSource for Looped<'_> {
    fn records(&self) -> Result<Records<'_>, ReplayError> {
        if self.passes == 0 {
            return Ok(Box::new(std::iter::empty()));
        }
        let first = self.inner.records()?;
        let (inner, period) = (self.inner, self.period);
        let later = (1..self.passes).flat_map(move |k| -> Records<'_> {
            match inner.records() {
                Ok(rows) => Box::new(shifted(rows, k, period)),
                Err(ReplayError::Trace(e)) => Box::new(std::iter::once(Err(e))),
                Err(e) => Box::new(std::iter::once(Err(trace_format::Error::Invalid(
                    e.to_string(),
                )))),
            }
        });
        Ok(Box::new(shifted(first, 0, period).chain(later)))
    }

    fn rows_hint(&self) -> Option<usize> {
        self.inner.rows_hint().map(|n| n * self.passes)
    }

    fn arrival_span(&self) -> Result<Option<ArrivalSpan>, ReplayError> {
        Ok(self.span.filter(|_| self.passes > 0).map(|s| ArrivalSpan {
            first_us: s.first_us,
            last_us: s.last_us + self.period * (self.passes as i64 - 1),
            rows: s.rows * self.passes,
        }))
    }
}

/// Pass `k` of `rows`: shifted by `k` periods, ids suffixed.
fn shifted(
    rows: Records<'_>,
    k: usize,
    period: i64,
) -> impl Iterator<Item = trace_format::Result<TraceRecord>> + Send + '_ {
    let shift = period * k as i64;
    rows.map(move |r| {
        r.map(|mut c| {
            c.arrival_time_us += shift;
            if k > 0 {
                c.request_id = suffixed(&c.request_id, k);
                c.session_id = c.session_id.as_deref().map(|s| suffixed(s, k));
            }
            c
        })
    })
}

/// `passes` copies of `records` (sorted by arrival) back to back, as [`Looped`] reads them.
pub fn loop_records(records: &[TraceRecord], passes: usize) -> Vec<TraceRecord> {
    let span = records.arrival_span().unwrap_or_default();
    Looped::new(&records, passes, span)
        .records()
        .map(|rows| rows.filter_map(Result::ok).collect())
        .unwrap_or_default()
}

/// Passes a run's rows came from (1 + the largest `~k` suffix of their request ids).
pub fn passes_replayed(records: &[TraceRecord]) -> usize {
    1 + records
        .iter()
        .filter_map(|r| r.request_id.rsplit_once('~')?.1.parse::<usize>().ok())
        .max()
        .unwrap_or(0)
}

/// p50/p95/p99 of one metric in one slice (None when no request had a value).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlicePercentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

fn pcts(mut v: Vec<f64>) -> Option<SlicePercentiles> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(SlicePercentiles {
        p50: percentile(&v, 50.0),
        p95: percentile(&v, 95.0),
        p99: percentile(&v, 99.0),
    })
}

/// The metrics of one time slice of a run. Requests belong to the slice their send (t0)
/// falls in; `completed_per_s` counts completions by their end time instead, so it is the
/// rate the server actually finished work at during the slice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Slice {
    /// Slice start, seconds from the run's start.
    pub start_s: f64,
    /// Slice end, seconds from the run's start.
    pub end_s: f64,
    /// Requests sent in the slice.
    pub requests: usize,
    /// Of which completed.
    pub completed: usize,
    /// Of which failed.
    pub failed: usize,
    /// Requests sent per second.
    pub sent_per_s: f64,
    /// Requests that finished (successfully) in the slice, per second.
    pub completed_per_s: f64,
    /// Output tokens of the requests that finished in the slice, per second.
    pub output_tokens_per_s: f64,
    /// Of the requests sent in the slice, the fraction meeting every SLO (None without SLOs).
    pub slo_attainment: Option<f64>,
    /// TTFT, ms.
    pub ttft_ms: Option<SlicePercentiles>,
    /// TPOT, ms.
    pub tpot_ms: Option<SlicePercentiles>,
    /// ITL, ms (pooled).
    pub itl_ms: Option<SlicePercentiles>,
    /// E2EL, ms.
    pub e2el_ms: Option<SlicePercentiles>,
}

/// Metrics per `width` slice of a run that started at `run_start_us` (epoch µs). Slices run
/// from 0 to the last send or completion; empty slices are kept (a stall is a finding).
pub fn slices(
    records: &[TraceRecord],
    run_start_us: i64,
    width: Duration,
    slos: &[Slo],
) -> Vec<Slice> {
    let w = width.as_micros().max(1) as i64;
    let rel = |t: i64| (t - run_start_us).max(0);
    let end_of = |r: &TraceRecord| r.e2el_us.map(|e| rel(r.arrival_time_us) + e.max(0));
    let last = records
        .iter()
        .map(|r| end_of(r).unwrap_or(0).max(rel(r.arrival_time_us)))
        .max();
    let Some(last) = last else {
        return Vec::new();
    };
    let n = ((last / w) + 1).min(1_000_000) as usize;
    let idx = |t: i64| ((t / w) as usize).min(n - 1);
    let mut by_send: Vec<Vec<&TraceRecord>> = vec![Vec::new(); n];
    let mut done = vec![0usize; n];
    let mut tokens = vec![0i64; n];
    for r in records {
        by_send[idx(rel(r.arrival_time_us))].push(r);
        if r.outcome == Outcome::Ok {
            if let Some(e) = end_of(r) {
                done[idx(e)] += 1;
                tokens[idx(e)] += r.output_tokens.unwrap_or(0).max(0);
            }
        }
    }
    let secs = w as f64 / 1e6;
    by_send
        .iter()
        .enumerate()
        .map(|(i, rs)| {
            let ok: Vec<&&TraceRecord> = rs.iter().filter(|r| r.outcome == Outcome::Ok).collect();
            let ms = |us: i64| us as f64 / 1e3;
            // The last slice may end early (end_s says where); rates stay per full width, so
            // a few ms of tail never read as a burst.
            let end_s = if i + 1 == n {
                ((last - i as i64 * w) as f64 / 1e6).clamp(0.0, secs)
            } else {
                secs
            };
            let width_s = secs;
            Slice {
                start_s: i as f64 * secs,
                end_s: i as f64 * secs + end_s,
                requests: rs.len(),
                completed: ok.len(),
                failed: rs.len() - ok.len(),
                sent_per_s: rs.len() as f64 / width_s,
                completed_per_s: done[i] as f64 / width_s,
                output_tokens_per_s: tokens[i] as f64 / width_s,
                slo_attainment: (!slos.is_empty() && !rs.is_empty()).then(|| {
                    rs.iter().filter(|r| meets_slos(r, slos)).count() as f64 / rs.len() as f64
                }),
                ttft_ms: pcts(ok.iter().filter_map(|r| ttft_ms(r)).collect()),
                tpot_ms: pcts(ok.iter().filter_map(|r| tpot_ms(r)).collect()),
                itl_ms: pcts(ok.iter().flat_map(|r| itl_gaps_ms(r)).collect()),
                e2el_ms: pcts(ok.iter().filter_map(|r| r.e2el_us.map(ms)).collect()),
            }
        })
        .collect()
}

/// The trend of one per-slice series: least-squares slope, and last against first slice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Trend {
    /// Slices with a value.
    pub slices: usize,
    /// Value in the first slice with one.
    pub first: f64,
    /// Value in the last slice with one.
    pub last: f64,
    /// last / first.
    pub ratio: f64,
    /// Least-squares slope, units per hour.
    pub slope_per_hour: f64,
}

/// The trend of `(slice midpoint s, value)` points (None with fewer than 2).
pub fn trend(points: &[(f64, f64)]) -> Option<Trend> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let (first, last) = (pts[0].1, pts[pts.len() - 1].1);
    Some(Trend {
        slices: pts.len(),
        first,
        last,
        ratio: if first > 0.0 { last / first } else { f64::NAN },
        slope_per_hour: slope * 3600.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, at_us: i64, ttft_ms: i64, e2el_ms: i64, out: i64) -> TraceRecord {
        let mut r = TraceRecord::new(id, at_us, "/v1/completions");
        r.stream = true;
        r.ttft_us = Some(ttft_ms * 1000);
        r.e2el_us = Some(e2el_ms * 1000);
        r.output_tokens = Some(out);
        r.outcome = Outcome::Ok;
        r.chunk_times_us = (0..out)
            .map(|k| at_us + ttft_ms * 1000 + k * (e2el_ms - ttft_ms) * 1000 / (out - 1).max(1))
            .collect();
        r
    }

    #[test]
    fn loops_parse_and_reject_garbage() {
        assert_eq!("3".parse::<Loops>().unwrap(), Loops::Count(3));
        assert_eq!("inf".parse::<Loops>().unwrap(), Loops::UntilDuration);
        assert!("0".parse::<Loops>().is_err());
        assert!("forever".parse::<Loops>().is_err());
    }

    #[test]
    fn looped_passes_shift_by_the_period_and_get_their_own_ids() {
        let mut rs = vec![rec("a", 0, 1, 2, 2), rec("b", 2_000_000, 1, 2, 2)];
        rs[1].session_id = Some("s".into());
        let span = rs.arrival_span().unwrap();
        assert_eq!(period_us(span), 4_000_000); // span 2 s + mean gap 2 s
        let l = loop_records(&rs, 3);
        assert_eq!(l.len(), 6);
        let at: Vec<i64> = l.iter().map(|r| r.arrival_time_us).collect();
        assert_eq!(
            at,
            vec![0, 2_000_000, 4_000_000, 6_000_000, 8_000_000, 10_000_000]
        );
        let ids: Vec<&str> = l.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids, vec!["a", "b", "a~1", "b~1", "a~2", "b~2"]);
        assert_eq!(l[3].session_id.as_deref(), Some("s~1"));
        // Until a duration: 10 s of trace time needs 3 passes of 4 s.
        let n = passes(
            span,
            Loops::UntilDuration,
            Duration::ZERO,
            Some(Duration::from_secs(10)),
            true,
        );
        assert_eq!(n.unwrap(), 3);
        assert!(passes(span, Loops::UntilDuration, Duration::ZERO, None, true).is_err());
        assert_eq!(
            passes(span, Loops::Count(5), Duration::ZERO, None, true).unwrap(),
            5
        );
        // Kept in memory, the looped rows are capped; streamed to a sink, they are not.
        let many = Loops::Count(MAX_LOOPED_ROWS / 2 + 1);
        assert!(passes(span, many, Duration::ZERO, None, true).is_err());
        assert!(passes(span, many, Duration::ZERO, None, false).is_ok());
        // The looped source is read again per pass, and says so in its span and size.
        let looped = Looped::new(&rs, 3, span);
        assert_eq!(looped.rows_hint(), Some(6));
        assert_eq!(
            looped.arrival_span().unwrap(),
            Some(ArrivalSpan {
                first_us: 0,
                last_us: 10_000_000,
                rows: 6
            })
        );
        let again: Vec<TraceRecord> = looped.records().unwrap().map(Result::unwrap).collect();
        assert_eq!(
            again.iter().map(|r| &r.request_id).collect::<Vec<_>>(),
            l.iter().map(|r| &r.request_id).collect::<Vec<_>>()
        );
    }

    #[test]
    fn slices_aggregate_by_send_time_and_count_completions_by_end() {
        let t0 = 1_000_000_000;
        // Slice 0 (0-10 s): two requests, TTFT 100 and 300 ms, one meets ttft:200.
        // Slice 1 (10-20 s): one request that fails, one that ends in slice 2.
        // Slice 2 (20-30 s): nothing sent.
        let mut fail = rec("f", t0 + 12_000_000, 0, 0, 0);
        fail.outcome = Outcome::HttpError;
        fail.ttft_us = None;
        fail.e2el_us = None;
        fail.chunk_times_us.clear();
        let rs = vec![
            rec("a", t0 + 1_000_000, 100, 1_100, 11),
            rec("b", t0 + 9_500_000, 300, 1_300, 11),
            fail,
            rec("c", t0 + 19_000_000, 500, 5_500, 6),
        ];
        let slos = vec!["ttft:200".parse().unwrap()];
        let s = slices(&rs, t0, Duration::from_secs(10), &slos);
        assert_eq!(s.len(), 3, "{s:#?}"); // c ends at 24.5 s
        assert_eq!((s[0].requests, s[0].completed, s[0].failed), (2, 2, 0));
        assert_eq!((s[1].requests, s[1].completed, s[1].failed), (2, 1, 1));
        assert_eq!(s[2].requests, 0);
        assert_eq!(s[0].slo_attainment, Some(0.5));
        assert_eq!(s[1].slo_attainment, Some(0.0));
        assert_eq!(s[2].slo_attainment, None);
        let ttft = s[0].ttft_ms.unwrap();
        assert_eq!((ttft.p50, ttft.p95), (200.0, 290.0));
        assert_eq!(s[0].tpot_ms.unwrap().p50, 100.0); // (1100-100)/10
        assert_eq!(s[1].ttft_ms.unwrap().p50, 500.0);
        assert!(s[2].ttft_ms.is_none());
        // Completions by end time: a (2.1 s) and b (10.8 s) and c (24.5 s).
        assert_eq!(s[0].completed_per_s, 0.1);
        assert_eq!(s[1].completed_per_s, 0.1);
        // The last slice ends early (20-24.5 s); its rates are still per 10 s.
        assert!((s[2].end_s - 24.5).abs() < 1e-9, "{}", s[2].end_s);
        assert!((s[2].completed_per_s - 0.1).abs() < 1e-9);
        assert!((s[2].output_tokens_per_s - 0.6).abs() < 1e-9);
        assert_eq!(s[0].sent_per_s, 0.2);
    }

    #[test]
    fn trend_is_a_least_squares_slope_per_hour() {
        let t = trend(&[(0.0, 10.0), (1800.0, 15.0), (3600.0, 20.0)]).unwrap();
        assert!((t.slope_per_hour - 10.0).abs() < 1e-9);
        assert_eq!((t.first, t.last, t.ratio), (10.0, 20.0, 2.0));
        assert!(trend(&[(0.0, 1.0)]).is_none());
        assert!(slices(&[], 0, Duration::from_secs(1), &[]).is_empty());
    }
}
