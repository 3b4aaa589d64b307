//! `llmreplay compare A.json B.json ...` and the end of a multi-target run: configurations
//! side by side, the difference of each from the first (the baseline), SLO pass/fail per
//! configuration, and whether each difference exceeds run-to-run noise.
//!
//! The noise rule, stated with every table: with repeats (`--num-runs` ≥ 2 on both sides) a
//! difference counts when it exceeds twice the combined spread, √(s_a² + s_b²), and 1% of the
//! baseline; without repeats no spread is measured, so a difference counts only when it
//! exceeds [`NOISE_FRACTION_WITHOUT_REPEATS`] of the baseline.

use std::fmt::Write as _;

use serde::Serialize;
use trace_format::stats::percentile_label;

use crate::capacity::{self, fmt_num, LevelPoint, Stat};
use crate::results::Series;

/// Without repeats, differences smaller than this fraction of the baseline are "within noise".
pub const NOISE_FRACTION_WITHOUT_REPEATS: f64 = 0.10;
/// With repeats: a difference must exceed this many combined standard deviations...
pub const NOISE_SIGMAS: f64 = 2.0;
/// ...and this fraction of the baseline.
pub const NOISE_FLOOR_FRACTION: f64 = 0.01;

/// How a difference reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Not distinguishable from run-to-run noise.
    WithinNoise,
    /// Beyond noise, in the good direction.
    Better,
    /// Beyond noise, in the bad direction: a regression.
    Worse,
}

impl Verdict {
    /// As printed.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::WithinNoise => "within noise",
            Verdict::Better => "better",
            Verdict::Worse => "REGRESSION",
        }
    }
}

/// Judges `other` against `base`.
pub fn judge(base: &Stat, other: &Stat, higher_is_better: bool) -> Verdict {
    let d = other.mean - base.mean;
    let threshold = match (base.std, other.std) {
        (Some(a), Some(b)) => {
            (NOISE_SIGMAS * (a * a + b * b).sqrt()).max(NOISE_FLOOR_FRACTION * base.mean.abs())
        }
        _ => NOISE_FRACTION_WITHOUT_REPEATS * base.mean.abs(),
    };
    if d.abs() <= threshold {
        Verdict::WithinNoise
    } else if (d > 0.0) == higher_is_better {
        Verdict::Better
    } else {
        Verdict::Worse
    }
}

/// The rule as printed under each table.
pub fn noise_rule() -> String {
    format!(
        "Noise rule: with --num-runs >= 2 on both sides, a difference counts when it exceeds {NOISE_SIGMAS} x sqrt(s_a^2 + s_b^2) \
(s = standard deviation over runs) and {:.0}% of the baseline; without repeats no spread is measured, and differences \
under {:.0}% of the baseline are called within noise.",
        NOISE_FLOOR_FRACTION * 100.0,
        NOISE_FRACTION_WITHOUT_REPEATS * 100.0
    )
}

/// One compared figure.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// vLLM key.
    pub key: String,
    /// As printed.
    pub label: String,
    /// Higher is better (throughputs) or lower (latencies).
    pub higher_is_better: bool,
    /// Per configuration: value (None when absent), relative difference to the baseline,
    /// verdict (None for the baseline itself).
    pub cells: Vec<(Option<Stat>, Option<f64>, Option<Verdict>)>,
}

/// A comparison at one level.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// The level (None when every configuration has a single result).
    pub level: Option<f64>,
    /// Configuration names, baseline first.
    pub names: Vec<String>,
    /// Rows.
    pub rows: Vec<Row>,
    /// SLO verdict per configuration: Some(true) pass, Some(false) fail, None without SLOs;
    /// with the failing metrics.
    pub slo: Vec<(Option<bool>, Vec<String>)>,
}

fn figures(pct: f64) -> Vec<(String, String, bool)> {
    let p = percentile_label(pct);
    let mut v = vec![
        ("request_throughput".into(), "req/s".into(), true),
        ("request_goodput".into(), "goodput req/s".into(), true),
        ("output_throughput".into(), "output tok/s".into(), true),
        // From zero, any failure is beyond noise.
        ("failed".into(), "failed requests".into(), false),
    ];
    for (m, name) in [
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("itl", "ITL"),
        ("e2el", "E2EL"),
    ] {
        v.push((format!("median_{m}_ms"), format!("{name} p50 ms"), false));
        if pct != 50.0 && pct != 99.0 {
            v.push((capacity::pct_key(pct, m), format!("{name} p{p} ms"), false));
        }
        v.push((capacity::pct_key(99.0, m), format!("{name} p99 ms"), false));
    }
    v
}

fn table_at(level: Option<f64>, series: &[&Series], points: &[Option<&LevelPoint>]) -> Table {
    let pct = series.first().map_or(95.0, |s| s.slo_percentile);
    let mut rows = Vec::new();
    for (key, label, hib) in figures(pct) {
        let base = points[0].and_then(|p| p.stat(&key)).copied();
        let cells: Vec<_> = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let v = p.and_then(|p| p.stat(&key)).copied();
                if i == 0 {
                    return (v, None, None);
                }
                match (base, v) {
                    (Some(b), Some(o)) => (
                        Some(o),
                        (b.mean != 0.0).then(|| o.mean / b.mean - 1.0),
                        Some(judge(&b, &o, hib)),
                    ),
                    _ => (v, None, None),
                }
            })
            .collect();
        if cells.iter().any(|c| c.0.is_some()) {
            rows.push(Row {
                key,
                label,
                higher_is_better: hib,
                cells,
            });
        }
    }
    let slo = series
        .iter()
        .zip(points)
        .map(|(s, p)| match p {
            Some(p) if !s.slos.is_empty() => {
                let (checks, ok) = capacity::check_level(p, &s.slos, s.slo_percentile);
                let mut bad: Vec<String> = checks
                    .iter()
                    .filter(|c| !c.ok)
                    .map(|c| {
                        format!(
                            "{} p{} {}",
                            c.metric.to_uppercase(),
                            percentile_label(s.slo_percentile),
                            c.value_ms.map_or("missing".into(), |v| format!(
                                "{v:.1} > {}",
                                fmt_num(c.limit_ms)
                            ))
                        )
                    })
                    .collect();
                if p.failed_fraction > capacity::MAX_ERROR_FRACTION {
                    bad.push(format!("{:.1}% failed", p.failed_fraction * 100.0));
                }
                (Some(ok), bad)
            }
            _ => (None, Vec::new()),
        })
        .collect();
    Table {
        level,
        names: series.iter().map(|s| s.name.clone()).collect(),
        rows,
        slo,
    }
}

/// Builds the comparison of `series` (the first is the baseline): one table per level of the
/// baseline, matching levels by value; configurations with a single result compare at it.
pub fn compare(series: &[Series]) -> Vec<Table> {
    let refs: Vec<&Series> = series.iter().collect();
    let Some(base) = refs.first() else {
        return Vec::new();
    };
    let all_single = refs.iter().all(|s| s.points.len() == 1);
    if all_single {
        let pts: Vec<Option<&LevelPoint>> = refs.iter().map(|s| s.points.first()).collect();
        return vec![table_at(None, &refs, &pts)];
    }
    base.points
        .iter()
        .map(|bp| {
            let pts: Vec<Option<&LevelPoint>> = refs
                .iter()
                .map(|s| {
                    if s.points.len() == 1 {
                        s.points.first()
                    } else {
                        s.points
                            .iter()
                            .find(|p| p.level.to_bits() == bp.level.to_bits())
                    }
                })
                .collect();
            table_at(Some(bp.level), &refs, &pts)
        })
        .collect()
}

fn cell(v: &(Option<Stat>, Option<f64>, Option<Verdict>)) -> (String, String) {
    let val = match v.0 {
        Some(s) => match s.std {
            Some(sd) => format!("{:.2}±{:.2}", s.mean, sd),
            None => format!("{:.2}", s.mean),
        },
        None => "-".into(),
    };
    let diff = match (v.1, v.2) {
        (Some(r), Some(vd)) => format!("{:+.1}% {}", r * 100.0, vd.label()),
        (None, Some(vd)) => vd.label().to_string(),
        _ => String::new(),
    };
    (val, diff)
}

/// The console rendering of a comparison.
pub fn render(series: &[Series], tables: &[Table]) -> String {
    let mut out = String::new();
    let w = 30usize;
    for t in tables {
        let title = match (t.level, series.first()) {
            (Some(l), Some(s)) => format!(" Compare at {} ", s.axis.level_label(l)),
            _ => " Compare ".to_string(),
        };
        let _ = writeln!(
            out,
            "{:=^width$}",
            title,
            width = 18 + (w + 1) * t.names.len()
        );
        let _ = write!(out, "{:<18}", "");
        for (i, n) in t.names.iter().enumerate() {
            let head = if i == 0 {
                format!("{n} (baseline)")
            } else {
                n.clone()
            };
            let _ = write!(out, " {:<w$}", truncate(&head, w));
        }
        out.push('\n');
        for r in &t.rows {
            let _ = write!(out, "{:<18}", r.label);
            for c in &r.cells {
                let (v, d) = cell(c);
                let s = if d.is_empty() {
                    v
                } else {
                    format!("{v} ({d})")
                };
                let _ = write!(out, " {:<w$}", truncate(&s, w));
            }
            out.push('\n');
        }
        if t.slo.iter().any(|s| s.0.is_some()) {
            let _ = write!(out, "{:<18}", "SLO");
            for (ok, bad) in &t.slo {
                let s = match ok {
                    None => "-".to_string(),
                    Some(true) => "PASS".into(),
                    Some(false) => format!("FAIL: {}", bad.join(", ")),
                };
                let _ = write!(out, " {:<w$}", truncate(&s, w));
            }
            out.push('\n');
        }
    }
    if series.iter().any(|s| s.points.len() > 1) {
        let _ = writeln!(out, "Capacity:");
        for s in series {
            let _ = writeln!(out, "  {}", s.answer().sentence);
        }
    }
    if let Some(s) = series.iter().find(|s| !s.slos.is_empty()) {
        let _ = writeln!(
            out,
            "SLO: PASS when p{} of every SLO ({}) is within its limit and at most {}% of requests failed.",
            percentile_label(s.slo_percentile),
            s.slos.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "),
            capacity::MAX_ERROR_FRACTION * 100.0
        );
    }
    let _ = writeln!(out, "{}", noise_rule());
    out
}

fn truncate(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(w - 1).collect();
        t.push('…');
        t
    }
}

/// Every regression (configuration, figure) across the tables.
pub fn regressions(tables: &[Table]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for t in tables {
        for r in &t.rows {
            for (i, c) in r.cells.iter().enumerate() {
                if c.2 == Some(Verdict::Worse) {
                    out.push((t.names[i].clone(), r.key.clone()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_rule_with_and_without_repeats() {
        let b = Stat::one(100.0);
        assert_eq!(judge(&b, &Stat::one(108.0), false), Verdict::WithinNoise);
        assert_eq!(judge(&b, &Stat::one(120.0), false), Verdict::Worse);
        assert_eq!(judge(&b, &Stat::one(120.0), true), Verdict::Better);
        let spread = |m: f64, s: f64| Stat {
            n: 3,
            mean: m,
            std: Some(s),
            min: m - s,
            max: m + s,
        };
        // Spread 10 on both sides: threshold 28.3, so +20 is noise and +40 is not.
        assert_eq!(
            judge(&spread(100.0, 10.0), &spread(120.0, 10.0), false),
            Verdict::WithinNoise
        );
        assert_eq!(
            judge(&spread(100.0, 10.0), &spread(140.0, 10.0), false),
            Verdict::Worse
        );
        // Tiny spread: +5% counts although it is under the no-repeat 10%.
        assert_eq!(
            judge(&spread(100.0, 0.5), &spread(105.0, 0.5), false),
            Verdict::Worse
        );
    }
}
