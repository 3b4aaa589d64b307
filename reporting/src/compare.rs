//! `llmreplay compare A.json B.json ...` and the end of a multi-target run: configurations
//! side by side, the difference of each from the first (the baseline), SLO pass/fail per
//! configuration, and whether each difference exceeds run-to-run noise.
//!
//! It reads the JSON result files ([`ResultFile::read`](crate::series::ResultFile::read)),
//! whole: their summaries do not grow with the rows of the runs, but a result saved with
//! `--save-detailed` holds vLLM's per-request arrays (about 150 bytes a request), which are
//! read with it and not used here.
//!
//! The noise rule, stated with every table: with repeats (`--num-runs` ≥ 2 on both sides) a
//! difference counts when it exceeds twice the combined spread, √(s_a² + s_b²), and 1% of the
//! baseline; without repeats no spread is measured, so a difference counts only when it
//! exceeds [`NOISE_FRACTION_WITHOUT_REPEATS`] of the baseline.

use std::fmt::Write as _;

use serde::Serialize;
use trace_format::stats::percentile_label;

use crate::capacity::{self, fmt_num, Axis, LevelPoint, Stat};
use crate::series::Series;

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
    /// A count of requests (printed as an integer: no decimals on a count).
    pub count: bool,
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
    /// SLO verdict per configuration ([`results::run_verdict::judge`]): Some(true) pass,
    /// Some(false) fail, None without SLOs; with why it failed.
    pub slo: Vec<(Option<bool>, Vec<String>)>,
    /// Requests per cause of their outcome per configuration (None when its results do not
    /// count causes), shown beside the verdict.
    pub causes: Vec<Option<trace_format::CauseCounts>>,
    /// The workload card per configuration (None for results that predate it).
    pub workloads: Vec<Option<trace_format::inspect_card::WorkloadCard>>,
}

fn figures(pct: f64) -> Vec<(String, String, bool)> {
    let p = percentile_label(pct);
    let mut v = vec![
        ("request_throughput".into(), "req/s".into(), true),
        ("request_goodput".into(), "goodput req/s".into(), true),
        ("output_throughput".into(), "output tok/s".into(), true),
        // From zero, any failure is beyond noise. The one failure count: failed by the
        // server (the client's own are on the row `the client's own`, never a regression).
        (
            results::level::SERVER_FAILED_KEY.into(),
            "failed by the server".into(),
            false,
        ),
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
                count: key == results::level::SERVER_FAILED_KEY,
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
                let v = results::run_verdict::judge(p, &s.slos, s.slo_percentile);
                let bad = if v.pass { Vec::new() } else { vec![v.reason] };
                (Some(v.pass), bad)
            }
            _ => (None, Vec::new()),
        })
        .collect();
    Table {
        level,
        names: series.iter().map(|s| s.name.clone()).collect(),
        rows,
        slo,
        causes: points
            .iter()
            .map(|p| p.map(|p| p.causes).filter(|c| c.total() > 0))
            .collect(),
        workloads: points
            .iter()
            .map(|p| p.and_then(|p| p.workload.clone()))
            .collect(),
    }
}

/// Which series compare with the baseline, at which of its levels, and what was left out.
struct Alignment {
    /// The axis the tables are on (None: every configuration has a single result).
    axis: Option<Axis>,
    /// Indices into the series of the compared configurations, the baseline first.
    included: Vec<usize>,
    /// Per included series, its level on `axis` for each of its points.
    levels: Vec<Vec<f64>>,
    /// The baseline's levels: one table each.
    table_levels: Vec<f64>,
    /// What was not compared and why.
    notes: Vec<String>,
}

/// Levels' settings as people read them: `concurrency 8, 16`, `request-rate 2, 4`.
fn levels_text(axis: Axis, levels: &[f64]) -> String {
    let nums = levels
        .iter()
        .map(|l| fmt_num(*l))
        .collect::<Vec<_>>()
        .join(", ");
    match axis {
        Axis::MaxConcurrency => format!("concurrency {nums}"),
        Axis::RequestRate => format!("request-rate {nums}"),
        Axis::Speedup => format!("{nums}x the captured load"),
    }
}

fn same_level(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits()
}

/// The load settings of a single result, as read.
fn load_text(r: &results::doc::ResultDoc) -> String {
    let mut parts = Vec::new();
    for a in [Axis::RequestRate, Axis::MaxConcurrency, Axis::Speedup] {
        if let Some(v) = crate::series::axis_value(r, a) {
            parts.push(format!("{}={}", a.key(), fmt_num(v)));
        }
    }
    if parts.is_empty() {
        "no recorded load settings".into()
    } else {
        parts.join(" ")
    }
}

fn align(series: &[Series]) -> Alignment {
    let mut al = Alignment {
        axis: None,
        included: Vec::new(),
        levels: Vec::new(),
        table_levels: Vec::new(),
        notes: Vec::new(),
    };
    let Some(base) = series.first() else {
        return al;
    };
    if series.iter().all(|s| s.points.len() == 1) {
        al.included = (0..series.len()).collect();
        al.levels = series.iter().map(|s| vec![s.points[0].level]).collect();
        // Single results: the same figures, but say so when they ran at different loads.
        let loads: Vec<String> = series
            .iter()
            .map(|s| s.runs.first().map_or_else(String::new, |r| load_text(&r.1)))
            .collect();
        if loads.iter().any(|l| l != &loads[0]) {
            let each: Vec<String> = series
                .iter()
                .zip(&loads)
                .map(|(s, l)| format!("{}: {l}", s.name))
                .collect();
            al.notes.push(format!(
                "the results ran at different load settings ({}): differences include the load, not only the configuration",
                each.join("; ")
            ));
        }
        return al;
    }
    // The axis: the baseline's when it is a sweep, else the first sweep's.
    let axis = if base.points.len() > 1 {
        base.axis
    } else {
        series
            .iter()
            .find(|s| s.points.len() > 1)
            .map_or(base.axis, |s| s.axis)
    };
    al.axis = Some(axis);
    let describe = |s: &Series| -> String {
        if s.points.len() > 1 {
            let ls: Vec<f64> = s.points.iter().map(|p| p.level).collect();
            format!("a {} sweep ({})", s.axis.key(), levels_text(s.axis, &ls))
        } else {
            format!(
                "a single result ({})",
                s.runs.first().map_or_else(String::new, |r| load_text(&r.1))
            )
        }
    };
    for (i, s) in series.iter().enumerate() {
        let levels: Option<Vec<f64>> = if s.points.len() > 1 {
            (s.axis == axis).then(|| s.points.iter().map(|p| p.level).collect())
        } else {
            s.runs
                .first()
                .and_then(|r| crate::series::axis_value(&r.1, axis))
                .map(|l| vec![l])
        };
        match levels {
            Some(l) => {
                al.included.push(i);
                al.levels.push(l);
            }
            None if i == 0 => {
                al.notes.push(format!(
                    "the baseline {} is {}, with no {} setting to place it among the other sweeps' levels: nothing compared",
                    s.name,
                    describe(s),
                    axis.key()
                ));
                al.included.clear();
                al.levels.clear();
                return al;
            }
            None => al.notes.push(format!(
                "{} is {}, {}: levels on different axes are different loads, not compared level by level (see the capacity answers)",
                s.name,
                describe(s),
                if base.points.len() > 1 {
                    format!("the baseline {} a {} sweep", base.name, axis.key())
                } else {
                    format!("the comparison is on {}", axis.key())
                }
            )),
        }
    }
    al.table_levels = al.levels[0].clone();
    for (k, &i) in al.included.iter().enumerate().skip(1) {
        let s = &series[i];
        let extra: Vec<f64> = al.levels[k]
            .iter()
            .copied()
            .filter(|l| !al.table_levels.iter().any(|b| same_level(*b, *l)))
            .collect();
        if !extra.is_empty() {
            al.notes.push(format!(
                "{}: {} {} no baseline run at that level: not compared",
                s.name,
                levels_text(axis, &extra),
                if extra.len() == 1 { "has" } else { "have" }
            ));
        }
        // A single result sits at one level: only the levels of sweeps are "missing".
        if s.points.len() > 1 {
            let missing: Vec<f64> = al
                .table_levels
                .iter()
                .copied()
                .filter(|b| !al.levels[k].iter().any(|l| same_level(*b, *l)))
                .collect();
            if !missing.is_empty() {
                al.notes.push(format!(
                    "{} has no run at {}: shown as -",
                    s.name,
                    levels_text(axis, &missing)
                ));
            }
        }
    }
    al
}

/// Builds the comparison of `series` (the first is the baseline): one table per level of the
/// baseline, matching levels by value on the baseline's axis; a configuration with a single
/// result compares at its own setting of that axis. Sweeps on another axis are left out
/// ([`notes`] says which, [`refusal`] when nothing is left to compare).
pub fn compare(series: &[Series]) -> Vec<Table> {
    let al = align(series);
    if al.included.is_empty() {
        return Vec::new();
    }
    let refs: Vec<&Series> = al.included.iter().map(|&i| &series[i]).collect();
    if al.axis.is_none() {
        let pts: Vec<Option<&LevelPoint>> = refs.iter().map(|s| s.points.first()).collect();
        return vec![table_at(None, &refs, &pts)];
    }
    al.table_levels
        .iter()
        .map(|&bl| {
            let pts: Vec<Option<&LevelPoint>> = refs
                .iter()
                .zip(&al.levels)
                .map(|(s, ls)| {
                    ls.iter()
                        .position(|l| same_level(*l, bl))
                        .map(|j| &s.points[j])
                })
                .collect();
            table_at(Some(bl), &refs, &pts)
        })
        .collect()
}

/// What the comparison leaves out and why: sweeps on another axis, levels on one side only,
/// single results run at different load settings.
pub fn notes(series: &[Series]) -> Vec<String> {
    align(series).notes
}

/// Why `series` cannot be compared at all (nothing shares the baseline's axis), or None.
pub fn refusal(series: &[Series]) -> Option<String> {
    let al = align(series);
    if series.len() >= 2 && al.included.len() < 2 {
        Some(format!(
            "nothing to compare with the baseline {}: {}",
            series[0].name,
            al.notes.join("; ")
        ))
    } else {
        None
    }
}

/// A count as people read it: an integer, or the mean over repeats with one decimal when
/// they differ.
pub fn count_text(s: &Stat) -> String {
    if s.mean.fract() == 0.0 {
        format!("{}", s.mean as u64)
    } else {
        format!("{:.1} (mean of {})", s.mean, s.n)
    }
}

fn cell(v: &(Option<Stat>, Option<f64>, Option<Verdict>), count: bool) -> (String, String) {
    let val = match v.0 {
        Some(s) if count => count_text(&s),
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
    let al = align(series);
    for n in &al.notes {
        let _ = writeln!(out, "Note: {n}.");
    }
    for t in tables {
        let title = match (t.level, al.axis) {
            (Some(l), Some(a)) => format!(" Compare at {} ", a.level_label(l)),
            _ => " Compare ".to_string(),
        };
        // The grid first (label, then one cell per configuration), so that every column is
        // as wide as its widest cell: nothing is cut.
        let mut grid: Vec<Vec<String>> = Vec::new();
        let mut head = vec![String::new()];
        head.extend(t.names.iter().enumerate().map(|(i, n)| {
            if i == 0 {
                format!("{n} (baseline)")
            } else {
                n.clone()
            }
        }));
        grid.push(head);
        for r in &t.rows {
            let mut line = vec![r.label.clone()];
            line.extend(r.cells.iter().map(|c| {
                let (v, d) = cell(c, r.count);
                if d.is_empty() {
                    v
                } else {
                    format!("{v} ({d})")
                }
            }));
            grid.push(line);
        }
        type Part = fn(&trace_format::CauseCounts) -> u64;
        let apart: [(&str, Part); 2] = [
            ("the client's own (apart)", |c| c.client),
            ("changed by the replay (apart)", |c| c.replay),
        ];
        for (label, of) in apart {
            if t.causes.iter().any(|c| c.is_some_and(|c| of(&c) > 0)) {
                let mut line = vec![label.to_string()];
                line.extend(t.causes.iter().map(|c| match c {
                    Some(c) => of(c).to_string(),
                    None => "-".into(),
                }));
                grid.push(line);
            }
        }
        if t.slo.iter().any(|s| s.0.is_some()) {
            let mut line = vec!["SLO".to_string()];
            line.extend(t.slo.iter().map(|(ok, bad)| match ok {
                None => "-".to_string(),
                Some(true) => "PASS".into(),
                Some(false) => format!("FAIL: {}", bad.join(", ")),
            }));
            grid.push(line);
        }
        let cols = t.names.len() + 1;
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                grid.iter()
                    .filter_map(|l| l.get(c))
                    .map(|x| x.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let total = (widths.iter().sum::<usize>() + 2 * (cols - 1)).max(title.chars().count() + 6);
        let _ = writeln!(out, "{:=^total$}", title);
        for line in &grid {
            let mut text = String::new();
            for (c, x) in line.iter().enumerate() {
                if c > 0 {
                    text.push_str("  ");
                }
                let _ = write!(text, "{:<w$}", x, w = widths[c]);
            }
            let _ = writeln!(out, "{}", text.trim_end());
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
            "SLO: PASS when p{} of every SLO ({}) is within its limit and at most {}% of the requests the server was asked to serve failed by the server (the client's own — recorded cancellations, 4xx as captured — apart).",
            percentile_label(s.slo_percentile),
            s.slos.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "),
            capacity::MAX_ERROR_FRACTION * 100.0
        );
    }
    let _ = writeln!(out, "{}", noise_rule());
    out
}

/// Where a configuration's workload differs from the baseline's at the same level beyond
/// [`trace_format::inspect_card::TOLERANCE`], one line each, naming the configuration, the
/// level and the dimension: such a comparison measures the traces, not the servers.
pub fn workload_differences(tables: &[Table]) -> Vec<String> {
    use trace_format::inspect_card::{differences, TOLERANCE};
    let mut out = Vec::new();
    for t in tables {
        let Some(Some(base)) = t.workloads.first() else {
            continue;
        };
        for (name, w) in t.names.iter().zip(&t.workloads).skip(1) {
            let Some(w) = w else { continue };
            let d = differences(base, w, TOLERANCE);
            if !d.is_empty() {
                let at = t
                    .level
                    .map_or(String::new(), |l| format!(" at level {}", fmt_num(l)));
                out.push(format!(
                    "{name}{at} against {}: {}",
                    t.names[0],
                    d.join("; ")
                ));
            }
        }
    }
    out
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

    /// A series on `axis` at `levels`, TTFT p50 rising with the level (a result's load
    /// settings as vLLM writes them: `max_concurrency` null unless set, `request_rate`).
    fn sweep(name: &str, axis: Axis, levels: &[f64]) -> Series {
        let run = |l: f64| {
            let v = match axis {
                Axis::MaxConcurrency => {
                    serde_json::json!({"max_concurrency": l as u64, "request_rate": "inf"})
                }
                Axis::RequestRate => {
                    serde_json::json!({"max_concurrency": null, "request_rate": l})
                }
                Axis::Speedup => serde_json::json!({"llmreplay": {"trace": {"speedup": l}}}),
            };
            results::doc::ResultDoc::from_value(&v).unwrap()
        };
        Series {
            name: name.into(),
            axis,
            slos: Vec::new(),
            slo_percentile: 95.0,
            points: levels
                .iter()
                .map(|&l| LevelPoint {
                    level: l,
                    runs: 1,
                    values: [
                        ("request_throughput".to_string(), Stat::one(l)),
                        ("median_ttft_ms".to_string(), Stat::one(100.0 + l)),
                    ]
                    .into_iter()
                    .collect(),
                    failed_fraction: 0.0,
                    causes: Default::default(),
                    workload: None,
                })
                .collect(),
            runs: levels.iter().map(|&l| (l, run(l))).collect(),
            commands: Vec::new(),
        }
    }

    /// A request-rate sweep against a max-concurrency sweep printed "Compare at 1 req/s
    /// offered" against concurrency 1, called it a regression and dropped levels 8-64 without
    /// a word. Levels on different axes are different loads: not compared, and said so.
    #[test]
    fn sweeps_on_different_axes_are_not_paired_level_by_level() {
        let series = vec![
            sweep("rate", Axis::RequestRate, &[1.0, 2.0, 4.0]),
            sweep("conc", Axis::MaxConcurrency, &[1.0, 8.0, 16.0, 32.0, 64.0]),
        ];
        let tables = compare(&series);
        assert!(
            tables.iter().all(|t| t.names == ["rate"]),
            "{:?}",
            tables.iter().map(|t| &t.names).collect::<Vec<_>>()
        );
        assert!(regressions(&tables).is_empty());
        let why = refusal(&series).expect("nothing comparable: refused");
        assert!(
            why.contains("request-rate") && why.contains("max-concurrency"),
            "{why}"
        );
        let text = render(&series, &tables);
        println!("{text}");
        assert!(!text.contains("REGRESSION"), "{text}");
        assert!(text.contains("not compared"), "{text}");
        assert!(text.contains("1, 8, 16, 32, 64"), "{text}");
    }

    /// Levels present on one side only are named, never silently dropped.
    #[test]
    fn unmatched_levels_are_named() {
        let series = vec![
            sweep("a", Axis::MaxConcurrency, &[1.0, 8.0, 16.0]),
            sweep("b", Axis::MaxConcurrency, &[1.0, 8.0, 32.0, 64.0]),
        ];
        assert!(refusal(&series).is_none());
        let tables = compare(&series);
        assert_eq!(tables.len(), 3);
        let text = render(&series, &tables);
        println!("{text}");
        assert!(
            text.contains("b: concurrency 32, 64 have no baseline run"),
            "{text}"
        );
        assert!(text.contains("b has no run at concurrency 16"), "{text}");
    }

    /// Cells were cut to 30 characters ("REGRESSI…"): columns are as wide as their content,
    /// and every row's cells start where the header's do.
    #[test]
    fn columns_fit_their_content() {
        let mut a = sweep(
            "baseline-configuration-with-a-long-name",
            Axis::RequestRate,
            &[1.0],
        );
        let mut b = sweep("b", Axis::RequestRate, &[1.0]);
        let spread = |m: f64| Stat {
            n: 3,
            mean: m,
            std: Some(12.34),
            min: m - 12.34,
            max: m + 12.34,
        };
        a.points[0]
            .values
            .insert("median_ttft_ms".into(), spread(1234.56));
        b.points[0]
            .values
            .insert("median_ttft_ms".into(), spread(1475.0));
        let series = vec![a, b];
        let text = render(&series, &compare(&series));
        println!("{text}");
        assert!(!text.contains('…'), "{text}");
        assert!(text.contains("1475.00±12.34 (+19.5% REGRESSION)"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let head = lines.iter().find(|l| l.contains("(baseline)")).unwrap();
        let col = head.find(" b").unwrap() + 1;
        let row = lines.iter().find(|l| l.starts_with("TTFT p50 ms")).unwrap();
        let chars: Vec<char> = row.chars().collect();
        let head_chars = head[..col].chars().count();
        assert_eq!(chars[head_chars - 1], ' ', "{text}");
        assert_eq!(chars[head_chars], '1', "{text}");
    }

    /// A single result compares at its own level of the baseline's sweep, not at every level.
    #[test]
    fn a_single_result_compares_at_its_own_level_only() {
        let series = vec![
            sweep("a", Axis::RequestRate, &[1.0, 2.0, 4.0]),
            sweep("one", Axis::RequestRate, &[2.0]),
        ];
        let tables = compare(&series);
        let with_one: Vec<f64> = tables
            .iter()
            .filter(|t| {
                let i = t.names.iter().position(|n| n == "one");
                i.is_some_and(|i| t.rows.iter().any(|r| r.cells[i].0.is_some()))
            })
            .filter_map(|t| t.level)
            .collect();
        assert_eq!(with_one, [2.0]);
    }

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
