//! Shadow traffic, request by request: what a candidate did with the requests production was
//! serving (`capture --shadow`), each mirrored row laid beside its production row.
//!
//! A capture with a shadow holds both sides in one trace: production's rows, and for each
//! mirrored request a row whose `pair_request_id` is the production row's `request_id` and
//! whose `target` names the candidate. [`assess`] pairs them and, per candidate and per class
//! of request (endpoint, streamed or not), over the pairs that succeeded on both sides:
//! - per metric (TTFT, TPOT, mean ITL, E2EL, output tokens) the mean of candidate −
//!   production per request with a t-based 95% confidence interval ([`Delta`]), the
//!   geometric mean of candidate / production ([`Paired`]), and the interval an unpaired
//!   comparison of the same two samples gives (Welch's): the same prompts at the same
//!   instants remove the variance between requests, so the paired interval is narrower, and
//!   [`Delta::narrower`] says by how much (an unpaired comparison needs about its square times
//!   the requests for an interval as narrow);
//! - the outcomes side by side, and the requests whose outcome differed (ok in production and
//!   failed on the candidate, and the reverse);
//! - the candidate's verdict, PASS or FAIL against the SLOs (`results::run_verdict`, the rule a
//!   replay is judged by), each candidate row judged with what production did with the same
//!   request (a 4xx production also answered 4xx, a cancellation the client made, are the
//!   client's, as a replay's are), and production's verdict over the same requests.
//!
//! A production row with no pair for a candidate was not sampled or was dropped by the
//! mirror (capture's /metrics says which); a shadow row whose production row is not in the
//! input is counted and left out.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use replay::config::Slo;
use replay::metrics::{compute, itl_gaps_ms, tpot_ms, ttft_ms};
use results::run_verdict::RunVerdict;
use serde::Serialize;
use trace_format::{Outcome, TraceRecord};

pub use crate::paired::Paired;
use crate::paired::{mean_var, t975};

/// Requests listed by name among those whose outcome differed, per candidate.
pub const DIFFERED_LISTED: usize = 50;

/// What a shadow assessment found, per candidate.
#[derive(Debug, Clone, Serialize)]
pub struct ShadowReport {
    /// Production rows (rows without `pair_request_id`).
    pub production: usize,
    /// Shadow rows whose production row is not in the input (left out).
    pub orphans: usize,
    /// The percentile SLOs are judged at.
    pub slo_percentile: f64,
    /// The SLOs, as given (`ttft:500`).
    pub slos: Vec<String>,
    /// Each candidate, by name.
    pub candidates: Vec<Candidate>,
}

/// One candidate against production.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    /// Its name (the shadow rows' `target`).
    pub target: String,
    /// Requests mirrored to it: production rows with a pair.
    pub paired: usize,
    /// Production rows without a pair for it (not sampled, or dropped by the mirror).
    pub unpaired: usize,
    /// Outcomes side by side: (production outcome, candidate outcome) → requests.
    pub outcomes: Vec<OutcomePair>,
    /// Requests whose outcome differed: the first [`DIFFERED_LISTED`], by production arrival.
    pub differed: Vec<Differed>,
    /// How many requests' outcome differed in all.
    pub differed_total: usize,
    /// Per class, over the pairs that succeeded on both sides.
    pub classes: Vec<ClassShadow>,
    /// The candidate's verdict against the SLOs, over its mirrored rows.
    pub verdict: RunVerdict,
    /// Production's verdict over the same requests.
    pub production_verdict: RunVerdict,
}

/// How many requests had one pair of outcomes.
#[derive(Debug, Clone, Serialize)]
pub struct OutcomePair {
    /// Production's outcome.
    pub production: Outcome,
    /// The candidate's.
    pub candidate: Outcome,
    /// Requests.
    pub requests: usize,
}

/// A request whose outcome on the candidate was not production's.
#[derive(Debug, Clone, Serialize)]
pub struct Differed {
    /// Production's `request_id`.
    pub request_id: String,
    /// Production's outcome and status.
    pub production: (Outcome, Option<u16>),
    /// The candidate's outcome and status.
    pub candidate: (Outcome, Option<u16>),
    /// The candidate's error, if any.
    pub error: Option<String>,
}

/// One class of request (endpoint, streamed or not) on one candidate.
#[derive(Debug, Clone, Serialize)]
pub struct ClassShadow {
    /// The endpoint.
    pub endpoint: String,
    /// Streamed or not.
    pub stream: bool,
    /// Pairs that succeeded on both sides (the metrics' requests).
    pub both_ok: usize,
    /// Per metric.
    pub metrics: Vec<Delta>,
}

/// Candidate − production of one metric, per request.
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    /// `ttft`, `tpot`, `itl` (the request's mean gap), `e2el` (ms) or `output_tokens`.
    pub metric: String,
    /// Requests with a value on both sides.
    pub n: usize,
    /// Production's mean.
    pub production_mean: f64,
    /// The candidate's mean.
    pub candidate_mean: f64,
    /// Mean of candidate − production per request.
    pub mean_delta: f64,
    /// Its 95% confidence interval (paired t).
    pub ci: (f64, f64),
    /// The 95% interval of the difference of the means treating the two sides as
    /// independent samples (Welch): what a comparison without pairs could say.
    pub unpaired_ci: (f64, f64),
    /// Unpaired interval width / paired width (∞ when the paired one has none).
    pub narrower: f64,
    /// Geometric mean of candidate / production, with its interval.
    pub ratio: Option<Paired>,
    /// How it reads.
    pub reading: Reading,
}

/// How a difference reads, from its paired interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reading {
    /// The interval holds 0: no difference shown.
    NoDifference,
    /// The whole interval above 0: the candidate's value is higher (slower, for latencies).
    Higher,
    /// The whole interval below 0.
    Lower,
}

impl Delta {
    /// The difference of `pairs` (production, candidate); None without two pairs.
    pub fn of(metric: &str, pairs: &[(f64, f64)]) -> Option<Delta> {
        let pairs: Vec<(f64, f64)> = pairs
            .iter()
            .copied()
            .filter(|(a, b)| a.is_finite() && b.is_finite())
            .collect();
        let n = pairs.len();
        if n < 2 {
            return None;
        }
        let nf = n as f64;
        let (ms, vs) = mean_var(pairs.iter().map(|p| p.0));
        let (mc, vc) = mean_var(pairs.iter().map(|p| p.1));
        let (md, vd) = mean_var(pairs.iter().map(|p| p.1 - p.0));
        let half = t975(n - 1) * (vd / nf).sqrt();
        let se2 = vs / nf + vc / nf;
        // Welch–Satterthwaite degrees of freedom.
        let df = if se2 > 0.0 {
            se2 * se2 / ((vs / nf).powi(2) / (nf - 1.0) + (vc / nf).powi(2) / (nf - 1.0))
        } else {
            f64::INFINITY
        };
        let uhalf = t975(df.floor().clamp(1.0, 1e9) as usize) * se2.sqrt();
        let narrower = if half > 0.0 {
            uhalf / half
        } else {
            f64::INFINITY
        };
        let ci = (md - half, md + half);
        let reading = if ci.0 > 0.0 {
            Reading::Higher
        } else if ci.1 < 0.0 {
            Reading::Lower
        } else {
            Reading::NoDifference
        };
        Some(Delta {
            metric: metric.to_string(),
            n,
            production_mean: ms,
            candidate_mean: mc,
            mean_delta: md,
            ci,
            unpaired_ci: (md - uhalf, md + uhalf),
            narrower,
            ratio: Paired::of(pairs.iter().copied()),
            reading,
        })
    }

    /// Whether the unpaired interval would show the difference too.
    pub fn unpaired_shows(&self) -> bool {
        self.unpaired_ci.0 > 0.0 || self.unpaired_ci.1 < 0.0
    }
}

/// The request's mean ITL, ms (streamed, two chunks or more).
fn mean_itl_ms(r: &TraceRecord) -> Option<f64> {
    let gaps: Vec<f64> = itl_gaps_ms(r).collect();
    (!gaps.is_empty()).then(|| gaps.iter().sum::<f64>() / gaps.len() as f64)
}

/// The metrics compared, and how each is read off a row.
type Metric = (&'static str, fn(&TraceRecord) -> Option<f64>);
const METRICS: [Metric; 5] = [
    ("ttft", ttft_ms),
    ("tpot", tpot_ms),
    ("itl", mean_itl_ms),
    ("e2el", |r| r.e2el_us.map(|e| e as f64 / 1000.0)),
    ("output_tokens", |r| r.output_tokens.map(|t| t as f64)),
];

/// Pairs each candidate's rows with production's and assesses them (see the module).
/// Nothing to pair (no shadow row, or no production row) is an error naming what is missing.
pub fn assess(
    rows: &[TraceRecord],
    slos: &[Slo],
    slo_percentile: f64,
) -> Result<ShadowReport, NothingPaired> {
    let production: HashMap<&str, &TraceRecord> = rows
        .iter()
        .filter(|r| r.pair_request_id.is_none())
        .map(|r| (r.request_id.as_str(), r))
        .collect();
    let mut by_target: BTreeMap<String, Vec<(&TraceRecord, &TraceRecord)>> = BTreeMap::new();
    let mut orphans = 0;
    let mut shadows = 0;
    for r in rows {
        let Some(pair) = &r.pair_request_id else {
            continue;
        };
        shadows += 1;
        match production.get(pair.as_str()) {
            Some(p) => by_target
                .entry(r.target.clone().unwrap_or_else(|| "candidate".into()))
                .or_default()
                .push((p, r)),
            None => orphans += 1,
        }
    }
    if shadows == 0 {
        return Err(NothingPaired::NoShadowRows { rows: rows.len() });
    }
    if by_target.is_empty() {
        return Err(NothingPaired::NoProductionRows { orphans });
    }
    let candidates = by_target
        .into_iter()
        .map(|(target, mut pairs)| {
            pairs.sort_by_key(|(p, _)| (p.arrival_time_us, p.request_id.clone()));
            candidate(target, &pairs, production.len(), slos, slo_percentile)
        })
        .collect();
    Ok(ShadowReport {
        production: production.len(),
        orphans,
        slo_percentile,
        slos: slos.iter().map(|s| s.to_string()).collect(),
        candidates,
    })
}

/// Why nothing could be paired.
#[derive(Debug, thiserror::Error)]
pub enum NothingPaired {
    /// No row is a shadow row.
    #[error(
        "no shadow rows among the {rows} rows read: none has a pair_request_id (capture with --shadow NAME=URL writes them)"
    )]
    NoShadowRows {
        /// Rows read.
        rows: usize,
    },
    /// Shadow rows, but none of their production rows.
    #[error(
        "{orphans} shadow rows, but none of the production rows they mirror: read the whole capture (all its files)"
    )]
    NoProductionRows {
        /// Shadow rows read.
        orphans: usize,
    },
}

fn candidate(
    target: String,
    pairs: &[(&TraceRecord, &TraceRecord)],
    production: usize,
    slos: &[Slo],
    pct: f64,
) -> Candidate {
    let mut outcomes: HashMap<(Outcome, Outcome), usize> = HashMap::new();
    let mut differed = Vec::new();
    let mut differed_total = 0;
    for (p, c) in pairs {
        *outcomes.entry((p.outcome, c.outcome)).or_default() += 1;
        if p.outcome != c.outcome {
            differed_total += 1;
            if differed.len() < DIFFERED_LISTED {
                differed.push(Differed {
                    request_id: p.request_id.clone(),
                    production: (p.outcome, p.status),
                    candidate: (c.outcome, c.status),
                    error: c.error.clone(),
                });
            }
        }
    }
    let mut classes: BTreeMap<(String, bool), Vec<(&TraceRecord, &TraceRecord)>> = BTreeMap::new();
    for (p, c) in pairs {
        if p.outcome == Outcome::Ok && c.outcome == Outcome::Ok {
            classes
                .entry((p.endpoint.clone(), p.stream))
                .or_default()
                .push((p, c));
        }
    }
    let classes = classes
        .into_iter()
        .map(|((endpoint, stream), v)| ClassShadow {
            endpoint,
            stream,
            both_ok: v.len(),
            metrics: METRICS
                .iter()
                .filter_map(|(name, f)| {
                    let pairs: Vec<(f64, f64)> =
                        v.iter().filter_map(|(p, c)| Some((f(p)?, f(c)?))).collect();
                    Delta::of(name, &pairs)
                })
                .collect(),
        })
        .collect();
    // The candidate's rows judged as a replay's are: with what production did with the same
    // request as their captured outcome, so a 4xx production also got, or a cancellation its
    // client made, is the client's and not the candidate's failure. A shadow cancelled is
    // always capture's doing (its production request's client went away, or capture shut
    // down before the candidate finished), never the candidate's.
    let cand: Vec<TraceRecord> = pairs
        .iter()
        .map(|(p, c)| {
            let mut c = (*c).clone();
            c.captured_status = p.status;
            c.captured_outcome = Some(match c.outcome {
                Outcome::ClientCancelled => Outcome::ClientCancelled,
                _ => p.outcome,
            });
            c
        })
        .collect();
    let prod: Vec<TraceRecord> = pairs
        .iter()
        .map(|(p, _)| {
            let mut p = (*p).clone();
            p.captured_status = p.status;
            p.captured_outcome = Some(p.outcome);
            p
        })
        .collect();
    let verdict_of = |rows: &[TraceRecord]| {
        let start = rows.iter().map(|r| r.arrival_time_us).min().unwrap_or(0);
        let m = compute(rows, start, slos, &[pct]);
        results::run_verdict::judge_metrics(&m, slos, pct)
    };
    Candidate {
        target,
        paired: pairs.len(),
        unpaired: production.saturating_sub(pairs.len()),
        outcomes: {
            let mut v: Vec<OutcomePair> = outcomes
                .into_iter()
                .map(|((production, candidate), requests)| OutcomePair {
                    production,
                    candidate,
                    requests,
                })
                .collect();
            v.sort_by(|a, b| {
                b.requests.cmp(&a.requests).then_with(|| {
                    (a.production.as_str(), a.candidate.as_str())
                        .cmp(&(b.production.as_str(), b.candidate.as_str()))
                })
            });
            v
        },
        differed,
        differed_total,
        classes,
        verdict: verdict_of(&cand),
        production_verdict: verdict_of(&prod),
    }
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn unit(metric: &str) -> &'static str {
    if metric == "output_tokens" {
        " tokens"
    } else {
        " ms"
    }
}

impl fmt::Display for ShadowReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Shadow traffic: {} production requests{}",
            self.production,
            if self.orphans > 0 {
                format!(
                    "; {} shadow rows without their production row left out",
                    self.orphans
                )
            } else {
                String::new()
            }
        )?;
        for c in &self.candidates {
            writeln!(f)?;
            writeln!(
                f,
                "Candidate {}: {} requests mirrored, {} production requests without a pair (not sampled or dropped by the mirror)",
                c.target, c.paired, c.unpaired
            )?;
            for cl in &c.classes {
                let kind = if cl.stream {
                    "streamed"
                } else {
                    "not streamed"
                };
                if cl.metrics.is_empty() {
                    // A difference with a confidence interval needs two pairs at least.
                    writeln!(
                        f,
                        "  {} ({kind}), {} request{} ok on both sides — too few to compare (a confidence interval needs 2 pairs or more)",
                        cl.endpoint,
                        cl.both_ok,
                        if cl.both_ok == 1 { "" } else { "s" }
                    )?;
                    continue;
                }
                writeln!(
                    f,
                    "  {} ({kind}), {} requests ok on both sides — candidate − production per request, mean [95% CI]:",
                    cl.endpoint,
                    cl.both_ok
                )?;
                for d in &cl.metrics {
                    let u = unit(&d.metric);
                    writeln!(
                        f,
                        "    {:<13} {:>9}{u} → {:>9}{u}  Δ {:+}{u} [{:+} .. {:+}]{}  {}; unpaired [{:+} .. {:+}] ({}× wider)",
                        d.metric.to_uppercase(),
                        num(d.production_mean),
                        num(d.candidate_mean),
                        num(d.mean_delta),
                        num(d.ci.0),
                        num(d.ci.1),
                        d.ratio
                            .map(|r| format!(" ×{:.3}", r.ratio))
                            .unwrap_or_default(),
                        match d.reading {
                            Reading::NoDifference => "no difference shown",
                            Reading::Higher => "HIGHER on the candidate",
                            Reading::Lower => "lower on the candidate",
                        },
                        num(d.unpaired_ci.0),
                        num(d.unpaired_ci.1),
                        if d.narrower.is_finite() {
                            format!("{:.1}", d.narrower)
                        } else {
                            "∞".into()
                        }
                    )?;
                }
            }
            write!(f, "  outcomes (production → candidate):")?;
            for o in &c.outcomes {
                write!(
                    f,
                    " {} → {}: {};",
                    o.production.as_str(),
                    o.candidate.as_str(),
                    o.requests
                )?;
            }
            writeln!(f)?;
            if c.differed_total > 0 {
                writeln!(
                    f,
                    "  {} requests' outcome differed{}:",
                    c.differed_total,
                    if c.differed_total > c.differed.len() {
                        format!(" (the first {} listed)", c.differed.len())
                    } else {
                        String::new()
                    }
                )?;
                for d in &c.differed {
                    let side = |(o, s): (Outcome, Option<u16>)| match s {
                        Some(s) => format!("{} {s}", o.as_str()),
                        None => o.as_str().to_string(),
                    };
                    writeln!(
                        f,
                        "    {}: production {}, candidate {}{}",
                        d.request_id,
                        side(d.production),
                        side(d.candidate),
                        d.error
                            .as_ref()
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    )?;
                }
            }
            writeln!(
                f,
                "  production, same requests: {} — {}",
                if c.production_verdict.pass {
                    "PASS"
                } else {
                    "FAIL"
                },
                c.production_verdict.reason
            )?;
            writeln!(f, "{}", results::run_verdict::line(&c.target, &c.verdict))?;
        }
        Ok(())
    }
}

impl ShadowReport {
    /// Whether every candidate passed.
    pub fn all_pass(&self) -> bool {
        self.candidates.iter().all(|c| c.verdict.pass)
    }

    /// An HTML page: the text above, and per candidate, class and latency the distribution of
    /// production's and the candidate's values over the same requests, and of the per-request
    /// differences.
    pub fn render_html(&self, rows: &[TraceRecord], title: &str) -> String {
        use crate::svg::{cdf, Chart, Line, PALETTE};
        let production: HashMap<&str, &TraceRecord> = rows
            .iter()
            .filter(|r| r.pair_request_id.is_none())
            .map(|r| (r.request_id.as_str(), r))
            .collect();
        let mut body = String::new();
        for (i, c) in self.candidates.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()].to_string();
            let pairs: Vec<(&TraceRecord, &TraceRecord)> = rows
                .iter()
                .filter(|r| r.target.as_deref() == Some(c.target.as_str()))
                .filter_map(|r| Some((*production.get(r.pair_request_id.as_deref()?)?, r)))
                .filter(|(p, r)| p.outcome == Outcome::Ok && r.outcome == Outcome::Ok)
                .collect();
            for cl in &c.classes {
                for (name, f) in METRICS.iter().filter(|(n, _)| *n != "output_tokens") {
                    let v: Vec<(f64, f64)> = pairs
                        .iter()
                        .filter(|(p, _)| p.endpoint == cl.endpoint && p.stream == cl.stream)
                        .filter_map(|(p, r)| Some((f(p)?, f(r)?)))
                        .collect();
                    if v.len() < 2 {
                        continue;
                    }
                    let prod: Vec<f64> = v.iter().map(|x| x.0).collect();
                    let cand: Vec<f64> = v.iter().map(|x| x.1).collect();
                    let delta: Vec<f64> = v.iter().map(|x| x.1 - x.0).collect();
                    let line = |n: &str, v: &[f64], dashed: bool| Line {
                        name: format!("{n} ({} requests)", v.len()),
                        points: cdf(v, 400),
                        color: color.clone(),
                        dashed,
                        markers: false,
                    };
                    let class = format!(
                        "{} ({})",
                        cl.endpoint,
                        if cl.stream {
                            "streamed"
                        } else {
                            "not streamed"
                        }
                    );
                    let up = name.to_uppercase();
                    for chart in [
                        Chart {
                            title: format!("{} vs production — {class}: {up}", c.target),
                            x_label: format!("{up} (ms)"),
                            y_label: "fraction of requests ≤ x".into(),
                            lines: vec![
                                line("production", &prod, false),
                                line(&c.target, &cand, true),
                            ],
                            y_from_zero: true,
                            ..Default::default()
                        },
                        Chart {
                            title: format!("{} − production per request — {class}: {up}", c.target),
                            x_label: format!("Δ {up} (ms)"),
                            y_label: "fraction of requests ≤ x".into(),
                            lines: vec![line("candidate − production", &delta, false)],
                            y_from_zero: true,
                            ..Default::default()
                        },
                    ] {
                        body.push_str(&format!("<div class=\"chart\">{}</div>", chart.render()));
                    }
                }
            }
        }
        crate::html::text_page(title, &self.to_string(), &body)
    }
}

#[cfg(test)]
mod tests;
