//! Was the offered load served? The steady-state throughput of a run (ramp-up and drain left
//! out) and the overload verdict (the target fell behind its schedule: requests waiting
//! piled up and latency grew with them).
//!
//! Both are read from the rows alone, on the run's own clock: a request's *due* time is the
//! run's start plus its scheduled offset; it *ends* at send + E2EL (a request without an end,
//! such as a connect failure, ends when it was sent). [`ServedBuilder`] takes them one at a
//! time in bounded memory ([`SERVED_CAP`]).

use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};
use trace_format::{Outcome, TraceRecord};

/// Fewest requests for either judgement: below this a run is too short to have a shape.
pub const MIN_REQUESTS: usize = 20;
/// The steady window must span at least this fraction of the sending period.
const MIN_STEADY_FRACTION: f64 = 0.25;
/// Fewest completions inside the steady window.
const MIN_STEADY_COMPLETIONS: usize = 10;
/// Overloaded when, over the second half of the schedule, completions fell below this
/// fraction of the requests due...
const SERVED_FRACTION: f64 = 0.9;
/// ...and requests due in the last quarter waited this many times longer than those of the
/// first quarter...
const SOJOURN_GROWTH: f64 = 1.5;
/// ...and at least this much longer, ms (a 2 ms → 4 ms change is noise, not a queue).
const SOJOURN_GROWTH_FLOOR_MS: f64 = 50.0;

/// What the run served against what it offered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Served {
    /// The run's **offered load**: requests due per second over its schedule, from the first
    /// due to the last ((n − 1) / span). The one figure every report calls "offered" and the
    /// capacity answer uses; not the `--request-rate` setting (a short Poisson schedule set to
    /// 4 req/s may offer 2.9). None when every request was due at once: a closed loop or
    /// `--request-rate inf`.
    pub offered_rps: Option<f64>,
    /// Throughput over the steady state, when the run had one.
    pub steady: Option<Steady>,
    /// Why no steady state could be measured (None when `steady` is set).
    pub steady_missing: Option<String>,
    /// Set when the target did not serve the offered load.
    pub overload: Option<Overload>,
}

/// Throughput over the run's steady state: from the median E2EL after the run's start
/// (by then the pipeline is full: ramp-up is over) to the last request sent (after it, the
/// drain), so a short level is not read as slower than it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Steady {
    /// Start of the window, s after the run's start.
    pub start_s: f64,
    /// End of the window, s after the run's start.
    pub end_s: f64,
    /// Successful requests that ended inside the window.
    pub completed: usize,
    /// Successful requests per second inside the window.
    pub request_throughput: f64,
    /// Output tokens per second of the requests that ended inside the window.
    pub output_throughput: f64,
}

/// The target fell behind the schedule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Overload {
    /// From about when (s of the schedule) requests kept waiting longer.
    pub from_s: f64,
    /// Requests due per second over the second half of the schedule: the overload test's own
    /// window, not the run's offered load ([`Served::offered_rps`]).
    pub offered_rps: f64,
    /// Requests that ended per second over the same half.
    pub served_rps: f64,
    /// Requests due but not yet ended at the last scheduled send.
    pub waiting_at_end: usize,
    /// Median time from due to end of the requests due in the first quarter, ms.
    pub early_sojourn_ms: f64,
    /// The same for the last quarter, ms.
    pub late_sojourn_ms: f64,
    /// Run wall time over the schedule's span.
    pub run_over_schedule: f64,
}

impl Overload {
    /// One sentence for people.
    pub fn message(&self) -> String {
        format!(
            "OVERLOADED: the target did not serve the offered load from t≈{:.1} s of the schedule: \
             over its second half it completed {:.2} req/s, under {:.0}% of the requests due then; \
             {} requests were waiting at the last send, \
             and time from due to done grew from {:.0} ms to {:.0} ms; the run took {:.1}× the \
             schedule. Its latencies measure a growing queue, not the target's steady state: \
             lower the load (--request-rate, --speedup) to find what it sustains.",
            self.from_s,
            self.served_rps,
            SERVED_FRACTION * 100.0,
            self.waiting_at_end,
            self.early_sojourn_ms,
            self.late_sojourn_ms,
            self.run_over_schedule
        )
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(trace_format::stats::percentile(v, 50.0))
}

/// Most rows [`ServedBuilder`] keeps (48 bytes each: 12 MiB). Below it the judgement is
/// exact; above it is made on a uniform sample, 1 row in 2^k (by a hash of the request id
/// and send time), its counts scaled by 2^k: half a million rows or more, where every window
/// counted holds thousands of sampled rows, a sampling error of about 1%.
pub const SERVED_CAP: usize = 1 << 18;

/// One row on the run's clock, µs after its start.
struct Row {
    due: i64,
    sent: i64,
    end: i64,
    ok: bool,
    output_tokens: i64,
    /// Decides whether the row stays in the sample.
    key: u64,
}

/// Judges a run from rows added one at a time, in any order, in bounded memory: at most
/// [`SERVED_CAP`] rows (a uniform sample past it) and the exact count, first and last due,
/// last send and last end.
pub struct ServedBuilder {
    run_start_us: i64,
    rows: Vec<Row>,
    /// The sample keeps rows whose key has its low `shift` bits zero.
    shift: u32,
    n: usize,
    first_due: i64,
    last_due: i64,
    last_sent: i64,
    last_end: i64,
}

impl ServedBuilder {
    /// A run started at `run_start_us` (epoch µs).
    pub fn new(run_start_us: i64) -> ServedBuilder {
        ServedBuilder {
            run_start_us,
            rows: Vec::new(),
            shift: 0,
            n: 0,
            first_due: i64::MAX,
            last_due: i64::MIN,
            last_sent: i64::MIN,
            last_end: i64::MIN,
        }
    }

    /// Adds one row of the run.
    pub fn add(&mut self, r: &TraceRecord) {
        let sent = r.arrival_time_us - self.run_start_us;
        let span = r
            .e2el_us
            .or_else(|| r.chunk_times_us.last().copied())
            .unwrap_or(0)
            .max(0);
        let due = r.scheduled_offset_us.unwrap_or(sent);
        let end = sent + span;
        self.n += 1;
        self.first_due = self.first_due.min(due);
        self.last_due = self.last_due.max(due);
        self.last_sent = self.last_sent.max(sent);
        self.last_end = self.last_end.max(end);
        let mut h = std::hash::DefaultHasher::new();
        (&r.request_id, r.arrival_time_us).hash(&mut h);
        let key = h.finish();
        if !self.keeps(key) {
            return;
        }
        self.rows.push(Row {
            due,
            sent,
            end,
            ok: r.outcome == Outcome::Ok,
            output_tokens: r.output_tokens.unwrap_or(0),
            key,
        });
        while self.rows.len() > SERVED_CAP {
            self.shift += 1;
            let shift = self.shift;
            self.rows.retain(|r| r.key.trailing_zeros() >= shift);
        }
    }

    fn keeps(&self, key: u64) -> bool {
        key.trailing_zeros() >= self.shift
    }

    /// Rows kept (at most [`SERVED_CAP`]).
    pub fn retained(&self) -> usize {
        self.rows.len()
    }

    /// The verdict.
    pub fn finish(self) -> Served {
        let n = self.n;
        let (first_due, last_due) = if n == 0 {
            (0, 0)
        } else {
            (self.first_due, self.last_due)
        };
        let span_us = last_due - first_due;
        let offered_rps = (n >= 2 && span_us > 0).then(|| (n - 1) as f64 / (span_us as f64 / 1e6));
        let sample = Sample {
            rows: &self.rows,
            weight: 1usize << self.shift,
        };
        let (steady, steady_missing) = match sample.steady(n, self.last_sent) {
            Ok(s) => (Some(s), None),
            Err(why) => (None, Some(why)),
        };
        let overload = if offered_rps.is_some() && n >= MIN_REQUESTS {
            sample.overload(first_due, last_due, self.last_end)
        } else {
            None
        };
        Served {
            offered_rps,
            steady,
            steady_missing,
            overload,
        }
    }
}

/// Judges a run (rows of one target, started at `run_start_us`, epoch µs).
pub fn analyse(records: &[TraceRecord], run_start_us: i64) -> Served {
    let mut b = ServedBuilder::new(run_start_us);
    records.iter().for_each(|r| b.add(r));
    b.finish()
}

/// The rows kept, each standing for `weight` rows of the run.
struct Sample<'a> {
    rows: &'a [Row],
    weight: usize,
}

impl Sample<'_> {
    /// Rows of the run matching `f` (estimated from the sample).
    fn count(&self, f: impl Fn(&Row) -> bool) -> usize {
        self.rows.iter().filter(|r| f(r)).count() * self.weight
    }

    /// `n` rows in all, the last sent at `last_sent`.
    fn steady(&self, n: usize, last_sent: i64) -> Result<Steady, String> {
        if n < MIN_REQUESTS {
            return Err(format!("fewer than {MIN_REQUESTS} requests"));
        }
        let mut e2el: Vec<f64> = self
            .rows
            .iter()
            .filter(|r| r.ok)
            .map(|r| (r.end - r.sent) as f64)
            .collect();
        let Some(start) = median(&mut e2el) else {
            return Err("no request succeeded".into());
        };
        let end = last_sent as f64;
        if end <= 0.0 || end - start < MIN_STEADY_FRACTION * end {
            return Err(format!(
                "the requests' median E2EL ({:.0} ms) is too close to the sending period ({:.0} ms): \
                 the level is too short to have one",
                start / 1e3,
                end / 1e3
            ));
        }
        let inside = |r: &Row| r.ok && (r.end as f64) > start && (r.end as f64) <= end;
        let completed = self.count(inside);
        if completed < MIN_STEADY_COMPLETIONS {
            return Err(format!(
                "fewer than {MIN_STEADY_COMPLETIONS} requests ended inside it"
            ));
        }
        let tokens: i64 = self
            .rows
            .iter()
            .filter(|r| inside(r))
            .map(|r| r.output_tokens)
            .sum();
        let secs = (end - start) / 1e6;
        Ok(Steady {
            start_s: start / 1e6,
            end_s: end / 1e6,
            completed,
            request_throughput: completed as f64 / secs,
            output_throughput: (tokens * self.weight as i64) as f64 / secs,
        })
    }

    fn overload(&self, first_due: i64, last_due: i64, last_end: i64) -> Option<Overload> {
        let span = (last_due - first_due) as f64;
        let at = |f: f64| first_due + (span * f) as i64;
        let (half, end) = (at(0.5), last_due);
        let due_2nd = self.count(|r| r.due > half && r.due <= end);
        let done_2nd = self.count(|r| r.end > half && r.end <= end);
        let half_s = (end - half) as f64 / 1e6;
        if half_s <= 0.0 || (done_2nd as f64) >= SERVED_FRACTION * due_2nd as f64 {
            return None;
        }
        let sojourn = |r: &Row| (r.end - r.due) as f64 / 1e3;
        let rows = self.rows;
        let mut early: Vec<f64> = rows
            .iter()
            .filter(|r| r.due <= at(0.25))
            .map(sojourn)
            .collect();
        let mut late: Vec<f64> = rows
            .iter()
            .filter(|r| r.due >= at(0.75))
            .map(sojourn)
            .collect();
        let (e, l) = (median(&mut early)?, median(&mut late)?);
        if l < SOJOURN_GROWTH * e || l - e < SOJOURN_GROWTH_FLOOR_MS {
            return None;
        }
        // From when: the earliest of 20 window starts since which the target never caught
        // up: from there to every later window end, fewer than 90% of the requests due
        // ended. (A batching server slows every request in flight, so the early requests' own
        // waits do not date the overload; the completions falling behind do.)
        let windows = 20;
        let edge = |k: usize| first_due + (span * k as f64 / windows as f64) as i64;
        let count = |a: i64, b: i64| {
            let due = self.count(|r| r.due > a && r.due <= b);
            let done = self.count(|r| r.end > a && r.end <= b);
            (due, done)
        };
        let behind_since = |w: usize| {
            (w + 1..=windows).all(|k| {
                let (due, done) = count(edge(w), edge(k));
                due == 0 || (done as f64) < SERVED_FRACTION * due as f64
            })
        };
        let from = (0..windows).find(|&w| behind_since(w)).map_or(half, edge);
        let waiting_at_end = self
            .count(|r| r.due <= end)
            .saturating_sub(self.count(|r| r.end <= end));
        let wall = last_end - first_due;
        Some(Overload {
            from_s: (from - first_due) as f64 / 1e6,
            offered_rps: due_2nd as f64 / half_s,
            served_rps: done_2nd as f64 / half_s,
            waiting_at_end,
            early_sojourn_ms: e,
            late_sojourn_ms: l,
            run_over_schedule: wall as f64 / span.max(1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request due at `due_ms`, sent on time, ending `e2el_ms` later.
    fn req(i: usize, due_ms: f64, e2el_ms: f64) -> TraceRecord {
        let due = (due_ms * 1e3) as i64;
        let mut r = TraceRecord::new(format!("r{i}"), due, "/v1/completions");
        r.scheduled_offset_us = Some(due);
        r.e2el_us = Some((e2el_ms * 1e3) as i64);
        r.output_tokens = Some(10);
        r
    }

    /// `n` requests at `rate`/s through a single server that takes `service_ms` each, FIFO.
    fn single_server(n: usize, rate: f64, service_ms: f64) -> Vec<TraceRecord> {
        let mut free_at = 0.0f64;
        (0..n)
            .map(|i| {
                let due = i as f64 * 1e3 / rate;
                let done = free_at.max(due) + service_ms;
                free_at = done;
                req(i, due, done - due)
            })
            .collect()
    }

    #[test]
    fn a_server_that_keeps_up_is_not_overloaded_and_its_steady_rate_is_the_offered_one() {
        // 10 req/s for 6 s, 40 ms each: never behind; the steady window gives the offered rate.
        let recs = single_server(60, 10.0, 40.0);
        let s = analyse(&recs, 0);
        assert!(s.overload.is_none(), "{s:?}");
        assert!((s.offered_rps.unwrap() - 10.0).abs() < 1e-9);
        let st = s.steady.expect("steady");
        assert!((st.request_throughput - 10.0).abs() < 0.5, "{st:?}");
        assert!(
            (st.start_s - 0.04).abs() < 1e-6,
            "window starts at the median E2EL"
        );
    }

    #[test]
    fn a_short_level_with_long_requests_reports_the_rate_it_sustained_not_the_ramp() {
        // 2 req/s for 20 s, each request 4 s long (concurrent server: no queue). Whole run:
        // 40 requests over 23.5 s = 1.70 req/s; steady window [4 s, 19.5 s] gives 2.
        let recs: Vec<TraceRecord> = (0..40).map(|i| req(i, i as f64 * 500.0, 4000.0)).collect();
        let s = analyse(&recs, 0);
        assert!(
            s.overload.is_none(),
            "long latency alone is not a queue: {s:?}"
        );
        let st = s.steady.expect("steady");
        assert!((st.request_throughput - 2.0).abs() < 0.15, "{st:?}");
    }

    #[test]
    fn a_queue_that_grows_is_named_with_its_start() {
        // Offered 10 req/s, served 5 req/s (200 ms each, one at a time) from the start.
        let recs = single_server(100, 10.0, 200.0);
        let o = analyse(&recs, 0).overload.expect("overloaded");
        assert!((o.served_rps - 5.0).abs() < 0.6, "{o:?}");
        assert!((o.offered_rps - 10.0).abs() < 0.6, "{o:?}");
        assert!(o.from_s < 1.0, "from the start: {o:?}");
        assert!(o.waiting_at_end > 40, "{o:?}");
        assert!(o.run_over_schedule > 1.8, "{o:?}");
        assert!(o.message().starts_with("OVERLOADED"), "{}", o.message());

        // Kept up for 6 s at 4 req/s, then 20 req/s for 4 s: behind from t≈6 s.
        let mut free_at = 0.0f64;
        let mut dues: Vec<f64> = (0..24).map(|i| i as f64 * 250.0).collect();
        dues.extend((0..80).map(|i| 6000.0 + i as f64 * 50.0));
        let recs: Vec<TraceRecord> = dues
            .iter()
            .enumerate()
            .map(|(i, &due)| {
                let done = free_at.max(due) + 100.0;
                free_at = done;
                req(i, due, done - due)
            })
            .collect();
        let o = analyse(&recs, 0).overload.expect("overloaded");
        assert!(
            (5.5..7.5).contains(&o.from_s),
            "the queue starts growing at 6 s: {o:?}"
        );
    }

    #[test]
    fn all_at_once_and_tiny_runs_are_not_judged() {
        let recs: Vec<TraceRecord> = (0..50).map(|i| req(i, 0.0, 100.0 * i as f64)).collect();
        let s = analyse(&recs, 0);
        assert!(s.offered_rps.is_none());
        assert!(s.overload.is_none());
        let s = analyse(&single_server(5, 10.0, 500.0), 0);
        assert!(s.overload.is_none() && s.steady.is_none());
        assert!(s.steady_missing.unwrap().contains("fewer than"));
    }
}
