//! The capacity answer: from a series of load levels (a sweep, or several result files of one
//! configuration) to the sentence an infrastructure team asks for — the highest level at which
//! the chosen percentile of every SLO is met, the first level that breaks and why, the knee
//! (where goodput stops following throughput or latency leaves its flat region) — and the
//! capacity plan (replicas and cost for a target load).
//!
//! A level is a setting (`--request-rate 4`, `--speedup 2`); the load it put on the target is
//! its **offered load**: the requests due per second over its schedule, from the first due to
//! the last (`replay::served::Served::offered_rps`, mean over runs, [`LevelPoint::offered_rps`]).
//! A short Poisson level set to 4 req/s may offer 2.9: the capacity answer is the highest
//! offered load that met the SLO ([`CapacityAnswer::capacity_rps`]), never a setting.
//!
//! Everything here works on [`LevelPoint`]s read from vLLM-style result JSON, so the console
//! at the end of a sweep, `llmreplay compare` and `llmreplay report` all reach the same answer
//! from the same numbers. The rules are constants below and are printed with every answer.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use trace_format::stats::percentile_label;

use replay::config::{Slo, SloMetric};
pub use results::level::{
    check_level, pct_key, LevelPoint, SloCheck, Stat, CLIENT_OWN_KEY, MAX_ERROR_FRACTION,
    OFFERED_KEY, SERVER_FAILED_KEY, STEADY_KEY,
};
use results::ResultDoc;

/// Goodput below this fraction of request throughput means goodput stopped following it.
pub const GOODPUT_FOLLOW_FRACTION: f64 = 0.9;
/// p50 TTFT or TPOT above this multiple of its lowest-level value leaves the flat region.
pub const FLAT_LATENCY_FACTOR: f64 = 2.0;
/// Latency rises below this many ms are never called a bend (timer and scheduling jitter).
pub const FLAT_LATENCY_FLOOR_MS: f64 = 10.0;
/// Throughput must reach at least this fraction of the offered load times the lower levels'
/// median throughput per unit of load (rate and speedup axes).
pub const LOAD_FOLLOW_FRACTION: f64 = 0.7;
/// Raising concurrency must gain at least this fraction of the proportional throughput gain.
pub const THROUGHPUT_FOLLOW_FRACTION: f64 = 0.5;

/// What a sweep varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Axis {
    /// `--max-concurrency` levels.
    MaxConcurrency,
    /// `--request-rate` levels (req/s).
    RequestRate,
    /// `--speedup` levels (multiples of the captured load).
    Speedup,
}

impl Axis {
    /// The flag name without dashes, as in `--sweep max-concurrency=...`.
    pub fn key(self) -> &'static str {
        match self {
            Axis::MaxConcurrency => "max-concurrency",
            Axis::RequestRate => "request-rate",
            Axis::Speedup => "speedup",
        }
    }

    /// Parses [`Axis::key`].
    pub fn from_key(s: &str) -> Option<Axis> {
        match s {
            "max-concurrency" | "concurrency" => Some(Axis::MaxConcurrency),
            "request-rate" | "rate" => Some(Axis::RequestRate),
            "speedup" => Some(Axis::Speedup),
            _ => None,
        }
    }

    /// A level's setting as people read it: `concurrency 16`, `request-rate 4`, `2.5x the
    /// captured load`. Not the load it offered: see [`load_text`].
    pub fn level_label(self, level: f64) -> String {
        match self {
            Axis::MaxConcurrency => format!("concurrency {}", fmt_num(level)),
            Axis::RequestRate => format!("request-rate {}", fmt_num(level)),
            Axis::Speedup => format!("{}x the captured load", fmt_num(level)),
        }
    }

    /// Short label for table headers and plot axes (the setting).
    pub fn short(self) -> &'static str {
        match self {
            Axis::MaxConcurrency => "max concurrency",
            Axis::RequestRate => "--request-rate (req/s set)",
            Axis::Speedup => "speedup (x captured load)",
        }
    }

    /// Whether a level of this axis offers a load of its own (an open loop: rate, speedup);
    /// a concurrency level's load is whatever the target serves.
    pub fn offers_load(self) -> bool {
        self != Axis::MaxConcurrency
    }
}

/// A level as the answer states it: the load it offered and the setting that offered it
/// (`2.93 req/s offered (request-rate 4)`); concurrency levels by their setting alone.
pub fn load_text(axis: Axis, level: f64, offered_rps: Option<f64>) -> String {
    match (axis.offers_load(), offered_rps) {
        (true, Some(o)) => format!("{o:.2} req/s offered ({})", axis.level_label(level)),
        (true, None) => format!("{} (no offered load recorded)", axis.level_label(level)),
        (false, _) => axis.level_label(level),
    }
}

pub use results::pct::fmt_num;

/// The first level that breaks the SLO, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Break {
    /// The level (its setting).
    pub level: f64,
    /// The load it offered, req/s ([`LevelPoint::offered_rps`]).
    pub offered_rps: Option<f64>,
    /// Every SLO at that level.
    pub checks: Vec<SloCheck>,
    /// Failed fraction at that level.
    pub failed_fraction: f64,
    /// What broke first: `ttft`, `tpot`, `e2el` or `errors`.
    pub first: String,
    /// What that means.
    pub why: String,
}

/// Where the curves bend.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Knee {
    /// The last level before the bend (the answer the seed takes to the infrastructure team).
    pub level: f64,
    /// The load that level offered, req/s ([`LevelPoint::offered_rps`]).
    pub offered_rps: Option<f64>,
    /// The first bent level.
    pub bent_level: f64,
    /// What bent there, one clause each.
    pub reasons: Vec<String>,
    /// Request throughput at the knee level, req/s.
    pub served_rps: Option<f64>,
}

/// The capacity answer of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityAnswer {
    /// Which configuration.
    pub name: String,
    /// The axis.
    pub axis: Axis,
    /// The percentile SLOs are judged at.
    pub slo_percentile: f64,
    /// The SLOs (`ttft` → ms).
    pub slos: BTreeMap<String, f64>,
    /// Highest level (contiguous from the lowest) at which every SLO is met (its setting).
    pub max_ok_level: Option<f64>,
    /// The capacity answer on the rate and speedup axes: the load that level offered, req/s
    /// ([`LevelPoint::offered_rps`]): the highest load actually offered that met the SLO.
    pub max_ok_offered_rps: Option<f64>,
    /// Request throughput that level sustained, req/s (mean over runs): its steady state
    /// (see [`LevelPoint::served_rps`]).
    pub max_ok_request_throughput: Option<f64>,
    /// Goodput at that level, req/s.
    pub max_ok_goodput: Option<f64>,
    /// Level where the breaking metric crosses its limit, by linear interpolation between the
    /// last good and the first broken level (an estimate, not a measurement).
    pub interpolated_level: Option<f64>,
    /// The same interpolation between the two levels' offered loads, req/s.
    pub interpolated_offered_rps: Option<f64>,
    /// The first level that breaks.
    pub first_break: Option<Break>,
    /// Levels above the first break that pass again (noise; rerun with --num-runs).
    pub passes_above_break: Vec<f64>,
    /// The knee.
    pub knee: Option<Knee>,
    /// The answer in one sentence.
    pub sentence: String,
}

impl CapacityAnswer {
    /// The capacity, req/s: on the rate and speedup axes the highest load actually offered
    /// that met the SLO ([`CapacityAnswer::max_ok_offered_rps`]); on the concurrency axis (or
    /// for results that lack the offered load) what that level served.
    pub fn capacity_rps(&self) -> Option<f64> {
        self.max_ok_offered_rps
            .filter(|_| self.axis.offers_load())
            .or(self.max_ok_request_throughput)
    }
}

fn why(metric: &str) -> &'static str {
    match metric {
        "ttft" => "TTFT climbed first: prefill queueing (new requests wait for admission behind running ones)",
        "tpot" => "TPOT climbed first: decode batches too large (every step carries more sequences and KV reads)",
        "e2el" => "end-to-end latency broke first (prefill and decode together)",
        _ => "the server failed requests (5xx, 429, resets or timeouts)",
    }
}

/// Finds the knee: the last level before goodput stops following throughput, latency leaves
/// its flat region, or throughput stops following load.
pub fn knee(points: &[LevelPoint], axis: Axis, have_slos: bool) -> Option<Knee> {
    let base = points.first()?;
    let b_ttft = base.mean("median_ttft_ms");
    let b_tpot = base.mean("median_tpot_ms");
    for w in 1..points.len() {
        let (prev, p) = (&points[w - 1], &points[w]);
        let mut reasons = Vec::new();
        let thr = p.mean("request_throughput").unwrap_or(0.0);
        if have_slos {
            if let Some(g) = p.mean("request_goodput") {
                if thr > 0.0 && g < GOODPUT_FOLLOW_FRACTION * thr {
                    reasons.push(format!(
                        "goodput fell to {} of request throughput ({:.2} of {:.2} req/s)",
                        results::pct::fmt_share(g / thr),
                        g,
                        thr
                    ));
                }
            }
        }
        for (name, key, b) in [
            ("TTFT", "median_ttft_ms", b_ttft),
            ("TPOT", "median_tpot_ms", b_tpot),
        ] {
            if let (Some(b), Some(v)) = (b, p.mean(key)) {
                if b > 0.0 && v > FLAT_LATENCY_FACTOR * b && v - b > FLAT_LATENCY_FLOOR_MS {
                    reasons.push(format!(
                        "p50 {name} left its flat region ({v:.1} ms, {:.1}x its {:.1} ms at the lowest level)",
                        v / b,
                        b
                    ));
                }
            }
        }
        // Load-following is judged on what each level sustained (its steady state).
        let thr = p.served_rps().unwrap_or(0.0);
        let prev_thr = prev.served_rps().unwrap_or(0.0);
        match axis {
            Axis::RequestRate | Axis::Speedup => {
                // Throughput per unit of offered load (what each level's schedule really offered,
                // else its setting), against the median of the lower levels (short levels end
                // with a drain tail, and a few Poisson arrivals are noisy).
                let load = |q: &LevelPoint| q.offered_rps().unwrap_or(q.level);
                let mut ratios: Vec<f64> = points[..w]
                    .iter()
                    .filter(|q| load(q) > 0.0)
                    .filter_map(|q| Some(q.served_rps()? / load(q)))
                    .collect();
                ratios.sort_by(f64::total_cmp);
                let typical = ratios
                    .get(ratios.len().saturating_sub(1) / 2)
                    .copied()
                    .unwrap_or(0.0);
                let expected = typical * load(p);
                if expected > 0.0 && thr < LOAD_FOLLOW_FRACTION * expected {
                    reasons.push(format!(
                        "throughput stopped following the offered load ({thr:.2} req/s where {expected:.2} was expected)"
                    ));
                }
            }
            Axis::MaxConcurrency => {
                let ideal = prev_thr * (p.level / prev.level.max(1e-9) - 1.0);
                if ideal > 0.0 && thr - prev_thr < THROUGHPUT_FOLLOW_FRACTION * ideal {
                    reasons.push(format!(
                        "throughput stopped scaling with concurrency ({prev_thr:.2} -> {thr:.2} req/s for {}x the concurrency)",
                        fmt_num(p.level / prev.level.max(1e-9))
                    ));
                }
            }
        }
        if !reasons.is_empty() {
            return Some(Knee {
                level: prev.level,
                offered_rps: prev.offered_rps(),
                bent_level: p.level,
                reasons,
                served_rps: prev.served_rps(),
            });
        }
    }
    None
}

/// Computes the capacity answer of one configuration's levels (sorted by level here).
pub fn answer(
    name: &str,
    axis: Axis,
    points: &[LevelPoint],
    slos: &[Slo],
    pct: f64,
) -> CapacityAnswer {
    let mut pts: Vec<&LevelPoint> = points.iter().collect();
    pts.sort_by(|a, b| a.level.total_cmp(&b.level));
    let sorted: Vec<LevelPoint> = pts.iter().map(|p| (*p).clone()).collect();
    let knee = knee(&sorted, axis, !slos.is_empty());
    let mut max_ok: Option<&LevelPoint> = None;
    let mut first_break = None;
    let mut passes_above = Vec::new();
    let mut interpolated = None;
    let mut interpolated_offered = None;
    if !slos.is_empty() {
        for p in &sorted {
            let (checks, ok) = check_level(p, slos, pct);
            match (&first_break, ok) {
                (None, true) => max_ok = Some(p),
                (None, false) => {
                    let errors_broke = p.failed_fraction > MAX_ERROR_FRACTION;
                    let first = if errors_broke {
                        "errors".to_string()
                    } else {
                        checks
                            .iter()
                            .filter(|c| !c.ok)
                            .max_by(|a, b| {
                                let r = |c: &SloCheck| {
                                    c.value_ms
                                        .map_or(f64::INFINITY, |v| v / c.limit_ms.max(1e-9))
                                };
                                r(a).total_cmp(&r(b))
                            })
                            .map_or("errors".into(), |c| c.metric.clone())
                    };
                    if let (Some(ok_p), false) = (max_ok, errors_broke) {
                        let k = pct_key(pct, &first);
                        let limit = slos
                            .iter()
                            .find(|s| s.metric.key() == first)
                            .map(|s| s.limit_ms);
                        if let (Some(v0), Some(v1), Some(l)) = (ok_p.mean(&k), p.mean(&k), limit) {
                            let at = |x0: f64, x1: f64| x0 + (l - v0) / (v1 - v0) * (x1 - x0);
                            if v1 > v0 && p.level.is_finite() {
                                interpolated = Some(at(ok_p.level, p.level));
                                if let (Some(o0), Some(o1)) = (ok_p.offered_rps(), p.offered_rps())
                                {
                                    interpolated_offered = Some(at(o0, o1));
                                }
                            }
                        }
                    }
                    first_break = Some(Break {
                        level: p.level,
                        offered_rps: p.offered_rps(),
                        why: why(&first).to_string(),
                        first,
                        checks,
                        failed_fraction: p.failed_fraction,
                    });
                }
                (Some(_), true) => passes_above.push(p.level),
                (Some(_), false) => {}
            }
        }
    }
    let slo_map: BTreeMap<String, f64> = slos
        .iter()
        .map(|s| (s.metric.key().to_string(), s.limit_ms))
        .collect();
    let mut a = CapacityAnswer {
        name: name.to_string(),
        axis,
        slo_percentile: pct,
        slos: slo_map,
        max_ok_level: max_ok.map(|p| p.level),
        max_ok_offered_rps: max_ok.and_then(LevelPoint::offered_rps),
        max_ok_request_throughput: max_ok.and_then(LevelPoint::served_rps),
        max_ok_goodput: max_ok.and_then(|p| p.mean("request_goodput")),
        interpolated_level: interpolated,
        interpolated_offered_rps: interpolated_offered,
        first_break,
        passes_above_break: passes_above,
        knee,
        sentence: String::new(),
    };
    a.sentence = sentence(&a, slos);
    a
}

/// The SLOs as people read them: `p95 TTFT <= 500 ms, p95 TPOT <= 50 ms`.
pub(crate) fn slo_text(slos: &[Slo], pct: f64) -> String {
    slos.iter()
        .map(|s| {
            format!(
                "p{} {} <= {} ms",
                percentile_label(pct),
                s.metric.key().to_uppercase(),
                fmt_num(s.limit_ms)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn sentence(a: &CapacityAnswer, slos: &[Slo]) -> String {
    let mut s = String::new();
    let pct = a.slo_percentile;
    let load = |l: f64, o: Option<f64>| load_text(a.axis, l, o);
    if slos.is_empty() {
        let _ = write!(
            s,
            "{}: no --goodput SLO given, so no capacity answer; ",
            a.name
        );
    } else {
        match (a.max_ok_level, &a.first_break) {
            (Some(l), _) => {
                if a.axis == Axis::Speedup {
                    let _ = write!(
                        s,
                        "{} holds {}x the captured load{} within the SLO ({})",
                        a.name,
                        fmt_num(l),
                        a.max_ok_offered_rps
                            .map_or(String::new(), |o| format!(", {o:.2} req/s offered,")),
                        slo_text(slos, pct)
                    );
                } else {
                    let _ = write!(
                        s,
                        "{} meets the SLO ({}) up to {}",
                        a.name,
                        slo_text(slos, pct),
                        load(l, a.max_ok_offered_rps)
                    );
                }
                if let Some(t) = a.max_ok_request_throughput {
                    let _ = write!(s, " ({t:.2} req/s served");
                    if let Some(g) = a.max_ok_goodput {
                        let _ = write!(s, ", goodput {g:.2} req/s");
                    }
                    s.push(')');
                }
            }
            (None, Some(_)) => {
                let _ = write!(
                    s,
                    "{} misses the SLO ({}) already at the lowest level tested",
                    a.name,
                    slo_text(slos, pct)
                );
            }
            (None, None) => {
                let _ = write!(s, "{} has no levels", a.name);
            }
        }
        match &a.first_break {
            Some(b) => {
                let what = if b.first == "errors" {
                    format!(
                        "{:.1}% of the requests the server was asked to serve failed by the server",
                        b.failed_fraction * 100.0
                    )
                } else {
                    let c = b.checks.iter().find(|c| c.metric == b.first);
                    match c.and_then(|c| c.value_ms.map(|v| (v, c.limit_ms))) {
                        Some((v, l)) => format!(
                            "p{} {} {:.1} ms > {} ms",
                            percentile_label(pct),
                            b.first.to_uppercase(),
                            v,
                            fmt_num(l)
                        ),
                        None => format!("no p{} {} in the results", percentile_label(pct), b.first),
                    }
                };
                let _ = write!(
                    s,
                    "; it breaks at {}: {what} — {}",
                    load(b.level, b.offered_rps),
                    b.why
                );
                if let (true, Some(i)) = (a.axis.offers_load(), a.interpolated_offered_rps) {
                    let _ = write!(
                        s,
                        " (the limit is crossed near {i:.2} req/s offered, interpolated)"
                    );
                } else if let Some(i) = a.interpolated_level {
                    let _ = write!(
                        s,
                        " (the limit is crossed near {}, interpolated)",
                        if a.axis == Axis::Speedup {
                            format!("{:.2}x", i)
                        } else {
                            fmt_num((i * 100.0).round() / 100.0)
                        }
                    );
                }
            }
            None if a.max_ok_level.is_some() => {
                let _ = write!(
                    s,
                    "; no tested level breaks it (extend the sweep to find the limit)"
                );
            }
            None => {}
        }
        if !a.passes_above_break.is_empty() {
            let _ = write!(
                s,
                "; note: {} passes again above the break (noise: repeat with --num-runs)",
                a.passes_above_break
                    .iter()
                    .map(|l| fmt_num(*l))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        s.push_str("; ");
    }
    match &a.knee {
        Some(k) => {
            let _ = write!(
                s,
                "knee at {}{} ({} at {}).",
                load(k.level, k.offered_rps),
                k.served_rps
                    .map(|t| format!(", {t:.2} req/s served"))
                    .unwrap_or_default(),
                k.reasons.join("; "),
                a.axis.level_label(k.bent_level)
            );
        }
        None => s.push_str("no knee within the tested levels (the curves stay flat)."),
    }
    s
}

/// The rules behind every answer, printed with it.
pub fn rules_text(pct: f64) -> String {
    format!(
        "Rules: a level meets the SLO when the mean over runs of its p{p} of every --goodput metric is within its limit \
and at most {err}% of the requests the server was asked to serve failed by the server (the client's own, recorded cancellations \
and 4xx as captured, apart); capacity = the load offered by the highest level meeting it, with every lower \
level meeting it too (a level's offered load: its requests due per second over its schedule, first due to last; on the \
concurrency axis, what the level served). \
Knee = the last level before goodput < {gf}% of request throughput, p50 TTFT/TPOT > {lf}x the lowest level's \
(and > {fl} ms above it), or throughput stops following load. A level's throughput is its steady state: requests that \
ended between its median E2EL after the start (ramp-up over) and its last send (drain after), when that window holds \
at least a quarter of the sending period; else the whole run's.",
        p = percentile_label(pct),
        err = MAX_ERROR_FRACTION * 100.0,
        gf = GOODPUT_FOLLOW_FRACTION * 100.0,
        lf = FLAT_LATENCY_FACTOR,
        fl = FLAT_LATENCY_FLOOR_MS,
    )
}

/// The SLOs recorded in a result (`llmreplay.goodput_slos`).
pub fn slos_of(result: &ResultDoc) -> Vec<Slo> {
    let mut out = Vec::new();
    if let Some(o) = &result.llmreplay {
        for (k, &limit_ms) in &o.goodput_slos {
            let metric = match k.as_str() {
                "ttft" => SloMetric::Ttft,
                "tpot" => SloMetric::Tpot,
                "e2el" => SloMetric::E2el,
                _ => continue,
            };
            out.push(Slo { metric, limit_ms });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, LoadSource};
    use serde_json::json;

    /// A synthetic level: throughput, goodput, p50/p95 TTFT and TPOT.
    fn lvl(level: f64, thr: f64, good: f64, ttft: (f64, f64), tpot: (f64, f64)) -> LevelPoint {
        let v = json!({
            "num_prompts": 100, "failed": 0,
            "request_throughput": thr, "request_goodput": good,
            "median_ttft_ms": ttft.0, "p95_ttft_ms": ttft.1,
            "median_tpot_ms": tpot.0, "p95_tpot_ms": tpot.1,
        });
        LevelPoint::from_results(level, &[&ResultDoc::from_value(&v).unwrap()])
    }

    fn slos() -> Vec<Slo> {
        vec!["ttft:500".parse().unwrap(), "tpot:50".parse().unwrap()]
    }

    #[test]
    fn short_levels_are_judged_on_their_steady_state_not_ramp_and_drain() {
        // The demo's shape: 2 and 4 req/s offered, whole-run throughput 1.47 and 2.61 (ramp-up
        // and drain counted), steady state 1.98 and 3.95, latency flat.
        let mk = |level: f64, whole: f64, steady: f64| {
            let v = json!({
                "num_prompts": 40, "failed": 0,
                "request_throughput": whole, "request_goodput": whole,
                "median_ttft_ms": 40.0, "p95_ttft_ms": 60.0,
                "median_tpot_ms": 20.0, "p95_tpot_ms": 22.0,
                "llmreplay": {"served": {"steady": {"request_throughput": steady}}},
            });
            LevelPoint::from_results(level, &[&ResultDoc::from_value(&v).unwrap()])
        };
        let pts = vec![mk(1.0, 0.8, 0.99), mk(2.0, 1.47, 1.98), mk(4.0, 2.61, 3.95)];
        let a = answer("sim", Axis::RequestRate, &pts, &slos(), 95.0);
        assert_eq!(a.max_ok_request_throughput, Some(3.95));
        assert!(
            a.knee.is_none(),
            "throughput followed the load: {:?}",
            a.knee
        );
        let p = plan(&a, 10.0, LoadSource::TargetQps, 1, None).unwrap();
        assert_eq!(p.replicas, 3, "10 / 3.95, not 10 / 2.61 = 4");
        // A result without a steady state falls back to the whole run's throughput.
        assert_eq!(
            lvl(1.0, 0.8, 0.8, (1.0, 1.0), (1.0, 1.0)).served_rps(),
            Some(0.8)
        );
    }

    #[test]
    fn ttft_breaking_first_means_prefill_queueing() {
        let pts = vec![
            lvl(1.0, 1.0, 1.0, (40.0, 60.0), (22.0, 24.0)),
            lvl(2.0, 2.0, 2.0, (42.0, 80.0), (24.0, 27.0)),
            lvl(3.0, 2.9, 2.8, (60.0, 300.0), (27.0, 31.0)),
            lvl(4.0, 3.0, 1.2, (900.0, 2100.0), (30.0, 36.0)),
            lvl(6.0, 3.0, 0.4, (3000.0, 6000.0), (31.0, 38.0)),
        ];
        let a = answer("sim", Axis::RequestRate, &pts, &slos(), 95.0);
        assert_eq!(a.max_ok_level, Some(3.0));
        assert_eq!(a.max_ok_request_throughput, Some(2.9));
        let b = a.first_break.as_ref().unwrap();
        assert_eq!((b.level, b.first.as_str()), (4.0, "ttft"));
        assert!(b.why.contains("prefill queueing"));
        let i = a.interpolated_level.unwrap();
        assert!(i > 3.0 && i < 4.0, "{i}");
        let k = a.knee.as_ref().unwrap();
        assert_eq!((k.level, k.bent_level), (3.0, 4.0), "{k:?}");
        // Results without an offered load (older ones) name the setting, never "offered".
        assert!(
            a.sentence
                .contains("up to request-rate 3 (no offered load recorded)"),
            "{}",
            a.sentence
        );
        assert!(
            a.sentence.contains("breaks at request-rate 4"),
            "{}",
            a.sentence
        );
        assert!(
            a.sentence.contains("knee at request-rate 3"),
            "{}",
            a.sentence
        );
        assert!(!a.sentence.contains("req/s offered"), "{}", a.sentence);
    }

    /// Issue 39, finding 3: a demo level set to 4 req/s was due at 2.93 req/s, and "meets the
    /// SLO up to 4 req/s offered" overstated capacity by 27%. The answer is the load the
    /// level actually offered (due over its schedule), the setting only beside it.
    #[test]
    fn the_capacity_is_the_load_actually_offered_not_the_setting() {
        let mk = |level: f64, offered: f64, p95_ttft: f64| {
            let v = json!({
                "num_prompts": 40, "failed": 0,
                "request_throughput": offered * 0.8, "request_goodput": offered * 0.8,
                "median_ttft_ms": 40.0, "p95_ttft_ms": p95_ttft,
                "median_tpot_ms": 20.0, "p95_tpot_ms": 22.0,
                "llmreplay": {"served": {
                    "offered_rps": offered,
                    "steady": {"request_throughput": offered * 0.99},
                }},
            });
            LevelPoint::from_results(level, &[&ResultDoc::from_value(&v).unwrap()])
        };
        let pts = vec![
            mk(2.0, 1.71, 60.0),
            mk(4.0, 2.93, 80.0),
            mk(6.0, 5.22, 900.0),
        ];
        let a = answer("sim", Axis::RequestRate, &pts, &slos(), 95.0);
        assert_eq!(a.max_ok_level, Some(4.0), "the setting is still recorded");
        assert_eq!(a.capacity_rps(), Some(2.93));
        assert!(
            a.sentence
                .contains("up to 2.93 req/s offered (request-rate 4)"),
            "{}",
            a.sentence
        );
        assert!(
            a.sentence
                .contains("breaks at 5.22 req/s offered (request-rate 6)"),
            "{}",
            a.sentence
        );
        assert!(!a.sentence.contains(" 4 req/s offered"), "{}", a.sentence);
        assert!(!a.sentence.contains(" 6 req/s offered"), "{}", a.sentence);
        // Interpolated between the offered loads, not the settings (2.93 + 420/820 × 2.29).
        let i = a.interpolated_offered_rps.unwrap();
        assert!(
            (i - (2.93 + 420.0 / 820.0 * (5.22 - 2.93))).abs() < 1e-9,
            "{i}"
        );
        // The plan divides by the capacity: 10 / 2.93 = 4 replicas (10 / 4 would be 3).
        let p = plan(&a, 10.0, LoadSource::TargetQps, 1, None).unwrap();
        assert_eq!((p.per_replica_rps, p.replicas), (2.93, 4));
    }

    #[test]
    fn tpot_breaking_first_means_decode_batches_too_large() {
        let pts = vec![
            lvl(1.0, 0.5, 0.5, (40.0, 45.0), (20.0, 21.0)),
            lvl(8.0, 3.8, 3.8, (45.0, 60.0), (30.0, 35.0)),
            lvl(16.0, 6.0, 2.0, (60.0, 120.0), (50.0, 75.0)),
        ];
        let a = answer("awq", Axis::MaxConcurrency, &pts, &slos(), 95.0);
        assert_eq!(a.max_ok_level, Some(8.0));
        let b = a.first_break.unwrap();
        assert_eq!(b.first, "tpot");
        assert!(b.why.contains("decode batches too large"));
        // Knee: at 16, goodput 2.0 < 90% of 6.0.
        assert_eq!(a.knee.unwrap().level, 8.0);
    }

    #[test]
    fn errors_break_a_level_with_good_latencies() {
        let mut bad = lvl(4.0, 4.0, 4.0, (40.0, 45.0), (20.0, 21.0));
        bad.failed_fraction = 0.2;
        let pts = vec![lvl(2.0, 2.0, 2.0, (40.0, 45.0), (20.0, 21.0)), bad];
        let a = answer("x", Axis::RequestRate, &pts, &slos(), 95.0);
        assert_eq!(a.max_ok_level, Some(2.0));
        assert_eq!(a.first_break.unwrap().first, "errors");
    }

    #[test]
    fn speedup_capacity_is_a_multiple_of_the_captured_load() {
        let pts = vec![
            lvl(1.0, 2.0, 2.0, (40.0, 50.0), (20.0, 21.0)),
            lvl(2.0, 4.0, 4.0, (41.0, 60.0), (20.0, 22.0)),
            lvl(3.0, 5.0, 2.0, (400.0, 900.0), (25.0, 30.0)),
        ];
        let a = answer("h100", Axis::Speedup, &pts, &slos(), 95.0);
        assert!(
            a.sentence.starts_with("h100 holds 2x the captured load"),
            "{}",
            a.sentence
        );
        assert!(a.sentence.contains("interpolated"), "{}", a.sentence);
    }

    #[test]
    fn never_breaking_and_no_slos_say_so() {
        let pts = vec![
            lvl(1.0, 1.0, 1.0, (40.0, 45.0), (20.0, 21.0)),
            lvl(2.0, 2.0, 2.0, (41.0, 46.0), (20.0, 21.0)),
        ];
        let a = answer("x", Axis::RequestRate, &pts, &slos(), 95.0);
        assert!(a.first_break.is_none() && a.knee.is_none());
        assert!(
            a.sentence.contains("no tested level breaks it"),
            "{}",
            a.sentence
        );
        let a = answer("x", Axis::RequestRate, &pts, &[], 95.0);
        assert_eq!(a.max_ok_level, None);
        assert!(a.sentence.contains("no --goodput SLO"), "{}", a.sentence);
    }

    #[test]
    fn concurrency_knee_from_throughput_plateau_without_slos() {
        let pts = vec![
            lvl(1.0, 1.0, 1.0, (40.0, 45.0), (20.0, 21.0)),
            lvl(2.0, 1.9, 1.9, (40.0, 45.0), (21.0, 22.0)),
            lvl(4.0, 3.6, 3.6, (41.0, 46.0), (22.0, 24.0)),
            lvl(8.0, 3.9, 3.9, (42.0, 46.0), (23.0, 25.0)),
        ];
        let k = knee(&pts, Axis::MaxConcurrency, false).unwrap();
        assert_eq!((k.level, k.bent_level), (4.0, 8.0));
        assert!(k.reasons[0].contains("stopped scaling"), "{:?}", k.reasons);
    }

    #[test]
    fn plan_counts_replicas_with_redundancy_and_cost() {
        let pts = vec![
            lvl(1.0, 2.5, 2.5, (40.0, 45.0), (20.0, 21.0)),
            lvl(2.0, 3.0, 0.5, (900.0, 1000.0), (20.0, 21.0)),
        ];
        let a = answer("x", Axis::RequestRate, &pts, &slos(), 95.0);
        let p = plan(&a, 11.0, LoadSource::TargetQps, 2, Some(2.5)).unwrap();
        assert_eq!((p.replicas_for_load, p.replicas), (5, 10));
        assert_eq!(p.monthly_cost, Some(10.0 * 2.5 * 730.0));
        assert!(p.sentence.contains("10 replicas"), "{}", p.sentence);
        let none = answer("x", Axis::RequestRate, &pts[1..], &slos(), 95.0);
        assert!(plan(&none, 11.0, LoadSource::TargetQps, 2, None).is_none());
    }

    #[test]
    fn stats_have_spread_only_with_repeats() {
        assert_eq!(Stat::of(&[3.0]).unwrap().std, None);
        let s = Stat::of(&[1.0, 3.0]).unwrap();
        assert_eq!(s.mean, 2.0);
        assert!((s.std.unwrap() - 2f64.sqrt()).abs() < 1e-12);
    }
}
