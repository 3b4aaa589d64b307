//! The workload card: what a trace (or the rows a run replayed) asked of a server, in one
//! small document — rows, span, arrival shape, prompt and output length distributions, the
//! API and endpoint mix, sessions, turns and think times, tool calls, and where prefix hashes
//! exist the theoretical prefix-cache hit rate at 16-, 64- and 512-token blocks. `inspect`
//! prints it, every result carries it (`llmreplay.workload`), and `compare` and `shadow`
//! refuse to call one run better than another when their cards differ beyond
//! [`Tolerance`] ([`differences`]), naming the dimension: two runs of different workloads
//! measure the workloads, not the servers.
//!
//! Production's rows only: shadow rows (with `pair_request_id`) are no load anyone sent.
//! Bounded memory apart from the prefix-cache sets (see [`crate::prefix_cache`]'s cap).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::quantiles::Quantiles;
use crate::schema::TraceRecord;

/// Percentiles of a length distribution, tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lengths {
    /// Rows with a known length.
    pub known: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Lengths {
    fn of(q: &Quantiles) -> Option<Lengths> {
        (!q.is_empty()).then(|| Lengths {
            known: q.len() as u64,
            mean: q.mean(),
            p50: q.quantile(50.0),
            p90: q.quantile(90.0),
            p99: q.quantile(99.0),
        })
    }
}

/// The workload card (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkloadCard {
    /// Production rows.
    pub rows: u64,
    /// First to last arrival, s.
    pub span_s: f64,
    /// Rows / span, req/s.
    pub mean_rps: f64,
    /// Busiest second (of the clock, UTC), req/s.
    pub peak_rps: f64,
    /// Coefficient of variation of the gaps between arrivals (1 = Poisson, below 1 more
    /// regular, above burstier); None with fewer than 3 rows, rows out of order, or a card
    /// of rows taken in the order they finished ([`CardBuilder::unordered`]).
    pub gap_cv: Option<f64>,
    /// Prompt tokens.
    pub prompt_tokens: Option<Lengths>,
    /// Output tokens.
    pub output_tokens: Option<Lengths>,
    /// Share of rows per endpoint path (the API mix: completions, chat, ...).
    pub endpoints: BTreeMap<String, f64>,
    /// Share of rows streamed.
    pub streamed_share: f64,
    /// Sessions (distinct `session_id`), 0 when none is recorded.
    pub sessions: u64,
    /// Mean rows per session (turns).
    pub turns_per_session: Option<f64>,
    /// Median think time between a turn and the answer it follows, s.
    pub think_time_p50_s: Option<f64>,
    /// Share of rows whose response made tool calls.
    pub tool_call_share: f64,
    /// Theoretical prefix-cache hit rate (unbounded cache, share of prompt tokens) by block
    /// size in tokens, at the block sizes [`CARD_BLOCKS`] that are whole multiples of the
    /// trace's own; empty without prefix hashes.
    pub prefix_hit_rate: BTreeMap<u32, f64>,
}

/// The block sizes the card gives the prefix-cache hit rate at, tokens.
pub const CARD_BLOCKS: [u32; 3] = [16, 64, 512];

/// Most one-second buckets counted for the peak (11.6 days); later arrivals count in the last.
const PEAK_BUCKETS: usize = 1_000_000;

/// Most distinct sessions counted (about 64 MB of ids at most); later ones are not.
const MAX_SESSIONS: usize = 1 << 20;

/// Builds a [`WorkloadCard`] one row at a time.
#[derive(Debug, Default)]
pub struct CardBuilder {
    block_size: Option<u32>,
    rows: u64,
    first_us: i64,
    last_us: i64,
    /// Arrivals per second of the clock (at most [`PEAK_BUCKETS`] seconds kept).
    per_second: BTreeMap<i64, u32>,
    ordered: bool,
    gaps: Quantiles,
    prompt: Quantiles,
    output: Quantiles,
    endpoints: BTreeMap<String, u64>,
    streamed: u64,
    sessions: HashMap<String, u64>,
    think: Quantiles,
    tool_rows: u64,
    /// Per card block size: blocks seen, and (hit tokens, prompt tokens) of rows with hashes.
    cache: BTreeMap<u32, (HashSet<u64>, u64, u64)>,
}

impl CardBuilder {
    /// A card for rows whose `prefix_hashes` name blocks of `block_size` tokens (None: no
    /// hit rate).
    pub fn new(block_size: Option<u32>) -> CardBuilder {
        CardBuilder {
            block_size,
            ordered: true,
            first_us: i64::MAX,
            last_us: i64::MIN,
            ..Default::default()
        }
    }

    /// A card of rows taken in any order (a run's rows as they finish): the same card
    /// whatever the order, without the gaps' variation.
    pub fn unordered(block_size: Option<u32>) -> CardBuilder {
        CardBuilder {
            ordered: false,
            ..CardBuilder::new(block_size)
        }
    }

    /// Counts a row (a shadow row is left out).
    pub fn add(&mut self, r: &TraceRecord) {
        if r.pair_request_id.is_some() {
            return;
        }
        self.rows += 1;
        let at = r.arrival_time_us;
        if self.ordered && self.rows > 1 {
            if at < self.last_us {
                self.ordered = false;
            } else {
                self.gaps.add((at - self.last_us) as f64);
            }
        }
        self.first_us = self.first_us.min(at);
        self.last_us = self.last_us.max(at);
        let second = at.div_euclid(1_000_000);
        if let Some(n) = self.per_second.get_mut(&second) {
            *n += 1;
        } else if self.per_second.len() < PEAK_BUCKETS {
            self.per_second.insert(second, 1);
        }
        if let Some(t) = r.prompt_tokens.filter(|t| *t >= 0) {
            self.prompt.add(t as f64);
        }
        if let Some(t) = r.output_tokens.filter(|t| *t >= 0) {
            self.output.add(t as f64);
        }
        match self.endpoints.get_mut(&r.endpoint) {
            Some(n) => *n += 1,
            None => {
                self.endpoints.insert(r.endpoint.clone(), 1);
            }
        }
        self.streamed += u64::from(r.stream);
        if let Some(s) = &r.session_id {
            // Bounded: past MAX_SESSIONS distinct sessions, only those already seen count.
            if let Some(n) = self.sessions.get_mut(s) {
                *n += 1;
            } else if self.sessions.len() < MAX_SESSIONS {
                self.sessions.insert(s.clone(), 1);
            }
        }
        if let Some(t) = r.think_time_us.filter(|t| *t >= 0) {
            self.think.add(t as f64 / 1e6);
        }
        self.tool_rows += u64::from(r.tool_calls.is_some_and(|n| n > 0));
        self.add_prefix(r);
    }

    /// The row's blocks at each card block size that is a whole multiple of the trace's:
    /// hashes are chained, so the `k`-th hash of every `B / b` names the prefix up to it.
    fn add_prefix(&mut self, r: &TraceRecord) {
        let (Some(b), Some(hashes)) = (self.block_size.filter(|b| *b > 0), &r.prefix_hashes) else {
            return;
        };
        let prompt = r.prompt_tokens.unwrap_or(0).max(0) as u64;
        for size in CARD_BLOCKS.into_iter().filter(|s| s % b == 0) {
            let step = (size / b) as usize;
            let (seen, hit, total) = self.cache.entry(size).or_default();
            let mut leading = true;
            let mut hit_blocks = 0u64;
            for h in hashes.iter().skip(step - 1).step_by(step) {
                let known = seen.contains(h);
                // Past the cap no block is added: the rate becomes a lower bound.
                if !known && seen.len() < crate::prefix_cache::UNBOUNDED_CAP_BLOCKS {
                    seen.insert(*h);
                }
                if leading && known {
                    hit_blocks += 1;
                } else {
                    leading = false;
                }
            }
            *hit += (hit_blocks * u64::from(size)).min(prompt);
            *total += prompt;
        }
    }

    /// The card.
    pub fn finish(self) -> WorkloadCard {
        let rows = self.rows;
        let span_s = if rows == 0 {
            0.0
        } else {
            (self.last_us - self.first_us) as f64 / 1e6
        };
        let share = |n: u64| {
            if rows == 0 {
                0.0
            } else {
                n as f64 / rows as f64
            }
        };
        let gap_cv = (self.ordered && self.gaps.len() >= 2 && self.gaps.mean() > 0.0)
            .then(|| self.gaps.std() / self.gaps.mean());
        WorkloadCard {
            rows,
            span_s,
            mean_rps: if span_s > 0.0 {
                rows as f64 / span_s
            } else {
                0.0
            },
            peak_rps: f64::from(self.per_second.values().copied().max().unwrap_or(0)),
            gap_cv,
            prompt_tokens: Lengths::of(&self.prompt),
            output_tokens: Lengths::of(&self.output),
            endpoints: self
                .endpoints
                .iter()
                .map(|(k, n)| (k.clone(), share(*n)))
                .collect(),
            streamed_share: share(self.streamed),
            sessions: self.sessions.len() as u64,
            turns_per_session: (!self.sessions.is_empty())
                .then(|| self.sessions.values().sum::<u64>() as f64 / self.sessions.len() as f64),
            think_time_p50_s: (!self.think.is_empty()).then(|| self.think.quantile(50.0)),
            tool_call_share: share(self.tool_rows),
            prefix_hit_rate: self
                .cache
                .iter()
                .filter(|(_, (_, _, total))| *total > 0)
                .map(|(size, (_, hit, total))| (*size, *hit as f64 / *total as f64))
                .collect(),
        }
    }
}

/// How far two cards may differ and still describe the same workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative difference of a length percentile (p50, p90) or mean.
    pub lengths: f64,
    /// Difference of a share (an endpoint's, streamed, tool calls), in points of 1.
    pub shares: f64,
}

/// Lengths within 10%, shares within 10 points: what two replays of the same trace stay
/// within (a server's own token counts differ from the recorded ones by a few percent).
pub const TOLERANCE: Tolerance = Tolerance {
    lengths: 0.10,
    shares: 0.10,
};

impl Tolerance {
    /// The tolerance in words, for the output that applies it.
    pub fn text(&self) -> String {
        format!(
            "token lengths (p50, p90, mean) within {:.0}%, endpoint, streamed and tool-call shares within {:.0} points",
            self.lengths * 100.0,
            self.shares * 100.0
        )
    }
}

/// Where `b`'s card differs from `a`'s beyond `tol`, one clause per dimension, naming it
/// (`prompt tokens p50: 128 vs 512 (+300%)`); empty when they describe the same workload.
/// The arrival rate is not compared: runs at different loads are what a sweep compares.
pub fn differences(a: &WorkloadCard, b: &WorkloadCard, tol: Tolerance) -> Vec<String> {
    let mut out = Vec::new();
    for (name, x, y) in [
        ("prompt tokens", a.prompt_tokens, b.prompt_tokens),
        ("output tokens", a.output_tokens, b.output_tokens),
    ] {
        let (Some(x), Some(y)) = (x, y) else { continue };
        for (p, u, v) in [
            ("p50", x.p50, y.p50),
            ("p90", x.p90, y.p90),
            ("mean", x.mean, y.mean),
        ] {
            let rel = if u > 0.0 { v / u - 1.0 } else { f64::INFINITY };
            if (u - v).abs() > 2.0 && rel.abs() > tol.lengths {
                out.push(format!(
                    "{name} {p}: {u:.0} vs {v:.0} ({:+.0}%)",
                    rel * 100.0
                ));
            }
        }
    }
    let mut paths: Vec<&String> = a.endpoints.keys().chain(b.endpoints.keys()).collect();
    paths.sort();
    paths.dedup();
    for p in paths {
        let (u, v) = (
            a.endpoints.get(p).copied().unwrap_or(0.0),
            b.endpoints.get(p).copied().unwrap_or(0.0),
        );
        if (u - v).abs() > tol.shares {
            out.push(format!(
                "endpoint mix {p}: {:.0}% vs {:.0}% of requests",
                u * 100.0,
                v * 100.0
            ));
        }
    }
    for (name, u, v) in [
        ("streamed share", a.streamed_share, b.streamed_share),
        ("tool-call share", a.tool_call_share, b.tool_call_share),
    ] {
        if (u - v).abs() > tol.shares {
            out.push(format!("{name}: {:.0}% vs {:.0}%", u * 100.0, v * 100.0));
        }
    }
    out
}

impl std::fmt::Display for WorkloadCard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Workload card ({} production rows):", self.rows)?;
        writeln!(
            f,
            "  arrivals:  {:.1} s, mean {:.2} req/s, peak {:.0} req/s (1 s){}",
            self.span_s,
            self.mean_rps,
            self.peak_rps,
            self.gap_cv
                .map_or(String::new(), |c| format!(", gap CV {c:.2} (1 = Poisson)"))
        )?;
        for (name, l) in [
            ("prompt", self.prompt_tokens),
            ("output", self.output_tokens),
        ] {
            if let Some(l) = l {
                writeln!(
                    f,
                    "  {name:<9}  tokens p50 {:.0}, p90 {:.0}, p99 {:.0}, mean {:.1} ({} rows)",
                    l.p50, l.p90, l.p99, l.mean, l.known
                )?;
            }
        }
        let mix: Vec<String> = self
            .endpoints
            .iter()
            .map(|(k, s)| format!("{k} {:.0}%", s * 100.0))
            .collect();
        writeln!(
            f,
            "  API mix:   {}; streamed {:.0}%; tool calls in {:.0}% of responses",
            mix.join(", "),
            self.streamed_share * 100.0,
            self.tool_call_share * 100.0
        )?;
        if self.sessions > 0 {
            writeln!(
                f,
                "  sessions:  {}, {:.1} turns each{}",
                self.sessions,
                self.turns_per_session.unwrap_or(0.0),
                self.think_time_p50_s
                    .map_or(String::new(), |t| format!(", think time p50 {t:.1} s"))
            )?;
        }
        if !self.prefix_hit_rate.is_empty() {
            let rates: Vec<String> = self
                .prefix_hit_rate
                .iter()
                .map(|(b, r)| format!("{:.1}% at {b}-token blocks", r * 100.0))
                .collect();
            writeln!(
                f,
                "  prefix cache (theoretical, unbounded): {}",
                rates.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: i64, prompt: i64, endpoint: &str) -> TraceRecord {
        let mut r = TraceRecord::new(format!("r{i}"), i * 250_000, endpoint);
        r.prompt_tokens = Some(prompt);
        r.output_tokens = Some(64);
        r.stream = i % 2 == 0;
        r
    }

    #[test]
    fn the_card_counts_production_rows_and_names_what_differs() {
        let mut a = CardBuilder::new(None);
        let mut b = CardBuilder::new(None);
        for i in 0..40 {
            a.add(&row(i, 100 + i % 5, "/v1/completions"));
            b.add(&row(i, 400 + i % 5, "/v1/completions"));
            let mut shadow = row(i, 9_999, "/v1/chat/completions");
            shadow.pair_request_id = Some(format!("r{i}"));
            a.add(&shadow);
        }
        let (a, b) = (a.finish(), b.finish());
        assert_eq!((a.rows, a.peak_rps), (40, 4.0));
        assert_eq!(a.endpoints.len(), 1, "the shadow rows are no load");
        assert_eq!(a.streamed_share, 0.5);
        assert!((a.span_s - 9.75).abs() < 1e-9);
        assert!(a.gap_cv.unwrap() < 1e-9, "evenly spaced");
        assert!(differences(&a, &a.clone(), TOLERANCE).is_empty());
        let d = differences(&a, &b, TOLERANCE);
        assert!(
            d[0].starts_with("prompt tokens p50: 102 vs 402 (+294%)"),
            "{d:?}"
        );
        assert!(d.iter().all(|x| x.starts_with("prompt tokens")), "{d:?}");
    }

    /// Chained hashes of 16-token blocks give the 64-token blocks (every 4th hash): two
    /// requests sharing their first 64 tokens hit 64 of 128 at both sizes, none at 512.
    #[test]
    fn prefix_hit_rates_at_coarser_blocks_from_chained_hashes() {
        let mut c = CardBuilder::new(Some(16));
        for i in 0..2 {
            let mut r = row(i, 128, "/v1/completions");
            // Blocks 1-4 shared, 5-8 the request's own.
            r.prefix_hashes = Some(
                (1..=8u64)
                    .map(|k| if k <= 4 { k } else { k + 100 * (i as u64 + 1) })
                    .collect(),
            );
            c.add(&r);
        }
        let card = c.finish();
        assert_eq!(card.prefix_hit_rate.get(&16), Some(&0.25));
        assert_eq!(card.prefix_hit_rate.get(&64), Some(&0.25));
        assert_eq!(card.prefix_hit_rate.get(&512), Some(&0.0));
    }
}
