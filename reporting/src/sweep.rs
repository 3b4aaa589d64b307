//! Sweeps: the same trace replayed at a series of load levels (`--sweep
//! max-concurrency=1,8,16,32`, `request-rate=...`, `speedup=...`), each level a fresh,
//! comparable run — same rows and schedule seed, a prompt salt of its own so the server's
//! prefix cache does not carry over from one level (or repeat) to the next, a cooldown
//! between levels — repeated `--num-runs` times for a mean and a spread. With `--refine N`,
//! up to N more levels bisect the bracket between the highest level that met the SLO and the
//! lowest that broke it ([`refine_level`]), so the capacity answer lands within
//! [`REFINE_GAP`] of the limit instead of at the nearest level someone typed.
//!
//! The sweep's JSON is one file: every level's vLLM-style result (under `results`, each
//! marked with `llmreplay.sweep`) and a summary with the capacity answer per target (under
//! `llmreplay_sweep`).

use std::str::FromStr;
use std::time::Duration;

use std::collections::BTreeMap;

use crate::capacity::{self, Axis};
pub use crate::plan::PlanInputs;
use crate::series;
use replay::config::{Arrivals, ReplayConfig, ValidatedConfig};
use replay::error::ReplayError;
use replay::metrics::Metrics;
use replay::run::RunOutput;
use results::build::{result_doc, ResultInputs, TraceIdentity};
use results::doc::{ResultDoc, SweepMark};
use results::sweep_doc::{
    ArrivalProfile, PlanInputsDoc, SweepFile, SweepSummary, SweepTarget, SweepTrace,
};

/// What to sweep and over which levels.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    /// The axis.
    pub axis: Axis,
    /// Levels, ascending.
    pub levels: Vec<f64>,
}

impl FromStr for SweepSpec {
    type Err = String;
    /// `max-concurrency=1,8,16`, `request-rate=1,2,4`, `speedup=0.5,1,2`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (k, v) = s.split_once('=').ok_or_else(|| {
            format!(
                "--sweep {s:?}: expected AXIS=L1,L2,... (max-concurrency, request-rate or speedup)"
            )
        })?;
        let axis = Axis::from_key(k.trim()).ok_or_else(|| {
            format!("--sweep {s:?}: unknown axis {k:?} (expected max-concurrency, request-rate or speedup)")
        })?;
        let mut levels = Vec::new();
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let x: f64 = part
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("--sweep {s:?}: {part:?} is not a positive number"))?;
            if axis == Axis::MaxConcurrency && x.fract() != 0.0 {
                return Err(format!(
                    "--sweep {s:?}: concurrency {part} is not a whole number"
                ));
            }
            levels.push(x);
        }
        if levels.is_empty() {
            return Err(format!("--sweep {s:?}: no levels"));
        }
        levels.sort_by(f64::total_cmp);
        levels.dedup();
        Ok(SweepSpec { axis, levels })
    }
}

/// How a sweep runs, beyond the replay configuration.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Repeats of every level (≥ 1).
    pub num_runs: usize,
    /// Offer load this long at each level (request-rate: rate × d requests; speedup: d × speedup
    /// of trace time). None replays the configured selection at every level.
    pub level_duration: Option<Duration>,
    /// The percentile SLOs are judged at.
    pub slo_percentile: f64,
    /// Levels added after the given ones, at most, bisecting the capacity bracket (0: none).
    pub refine: usize,
}

/// Refinement stops once the bracket (highest level meeting the SLO, lowest breaking it) is
/// this narrow, as a fraction of its top (rate and speedup axes; concurrency: adjacent whole
/// numbers). The capacity answer is then within this fraction of the lowest breaking level.
pub const REFINE_GAP: f64 = 0.02;

/// One run of one level against one target.
#[derive(Debug, Clone)]
pub struct LevelRun {
    /// Index of the level in the spec.
    pub level_index: usize,
    /// The level.
    pub level: f64,
    /// Repeat number, from 0.
    pub run: usize,
    /// The configuration this level ran with.
    pub cfg: ValidatedConfig,
    /// The run.
    pub output: RunOutput,
    /// Its metrics.
    pub metrics: Metrics,
}

use trace_format::fnv::splitmix64 as mix;

/// The configuration of one level and repeat: the axis value set, a salt of its own; a new
/// configuration, validated.
pub fn level_config(
    base: &ReplayConfig,
    spec: &SweepSpec,
    opts: &SweepOptions,
    level_index: usize,
    run: usize,
) -> Result<ValidatedConfig, ReplayError> {
    let level = spec.levels[level_index];
    config_at(base, spec.axis, level, opts, level_index, run)
}

/// The configuration of `level` on `axis`, the `level_index`-th level run (its salt).
fn config_at(
    base: &ReplayConfig,
    axis: Axis,
    level: f64,
    opts: &SweepOptions,
    level_index: usize,
    run: usize,
) -> Result<ValidatedConfig, ReplayError> {
    let mut cfg = base.clone();
    match axis {
        Axis::MaxConcurrency => cfg.max_concurrency = Some(level as usize),
        Axis::RequestRate => {
            let burstiness = match base.arrivals {
                Arrivals::Rate { burstiness, .. } => burstiness,
                Arrivals::Recorded { .. } => 1.0,
            };
            cfg.arrivals = Arrivals::Rate {
                rate: level,
                burstiness,
            };
            if let Some(d) = opts.level_duration {
                let n = (level * d.as_secs_f64()).ceil().max(1.0) as usize;
                cfg.selection.max_requests =
                    Some(cfg.selection.max_requests.map_or(n, |m| m.min(n)));
            }
        }
        Axis::Speedup => {
            cfg.arrivals = Arrivals::Recorded { speedup: level };
            if let Some(d) = opts.level_duration {
                let w = d.mul_f64(level);
                cfg.selection.duration = Some(cfg.selection.duration.map_or(w, |x| x.min(w)));
            }
        }
    }
    cfg.request.prompt_salt =
        mix(base.request.prompt_salt ^ mix(((level_index as u64) << 32) | run as u64));
    cfg.cooldown = base.cooldown;
    cfg.validate()
}

/// Which run a sweep makes next: every level (`num_runs` times each), then up to
/// `opts.refine` levels more from [`refine_level`]. The caller runs each [`LevelStep`]
/// (`replay::replay` with its configuration, against every target) and hands the runs back
/// ([`SweepPlan::record`]); the plan never calls the engine. The levels run are
/// [`levels_run`] of [`SweepPlan::finish`].
pub struct SweepPlan<'a> {
    base: &'a ValidatedConfig,
    axis: Axis,
    opts: &'a SweepOptions,
    /// The levels to run: the given ones, then each refining one as it is chosen.
    levels: Vec<f64>,
    /// Levels at most: the given ones and `opts.refine` more.
    max_levels: usize,
    /// The next level index and repeat.
    next: (usize, usize),
    runs: Vec<LevelRun>,
}

/// One run of one level: its place in the sweep and the configuration it runs with.
#[derive(Debug, Clone)]
pub struct LevelStep {
    /// Index of the level (the given levels first, refining ones after).
    pub level_index: usize,
    /// The level.
    pub level: f64,
    /// Repeat number, from 0.
    pub run: usize,
    /// The configuration (the level set, a prompt salt of its own).
    pub cfg: ValidatedConfig,
    /// Wait this long before the run (`--cooldown`; zero before the first).
    pub cooldown: Duration,
}

impl<'a> SweepPlan<'a> {
    /// The plan of `spec` over `base`; an error when `opts` cannot run.
    pub fn new(
        base: &'a ValidatedConfig,
        spec: &SweepSpec,
        opts: &'a SweepOptions,
    ) -> Result<SweepPlan<'a>, ReplayError> {
        if opts.num_runs == 0 {
            return Err(ReplayError::Config("--num-runs must be at least 1".into()));
        }
        if !(opts.slo_percentile > 0.0 && opts.slo_percentile <= 100.0) {
            return Err(ReplayError::Config(format!(
                "--slo-percentile {}: must be in (0, 100]",
                opts.slo_percentile
            )));
        }
        Ok(SweepPlan {
            base,
            axis: spec.axis,
            opts,
            levels: spec.levels.clone(),
            max_levels: spec.levels.len() + opts.refine,
            next: (0, 0),
            runs: Vec::new(),
        })
    }

    /// The next run, or None when the sweep is done: the given levels in order, each
    /// `num_runs` times, then a refining level while the capacity bracket is wider than
    /// [`REFINE_GAP`] and `opts.refine` allows.
    pub fn next_step(&mut self) -> Result<Option<LevelStep>, ReplayError> {
        let (li, run) = self.next;
        if li >= self.levels.len() {
            if self.levels.len() >= self.max_levels {
                return Ok(None);
            }
            match refine_level(&self.runs, self.axis, self.opts.slo_percentile) {
                Some(l) if !self.levels.iter().any(|x| x.to_bits() == l.to_bits()) => {
                    self.levels.push(l)
                }
                _ => return Ok(None),
            }
        }
        self.next = if run + 1 < self.opts.num_runs {
            (li, run + 1)
        } else {
            (li + 1, 0)
        };
        let level = self.levels[li];
        Ok(Some(LevelStep {
            level_index: li,
            level,
            run,
            cfg: config_at(self.base, self.axis, level, self.opts, li, run)?,
            cooldown: if li > 0 || run > 0 {
                self.base.cooldown
            } else {
                Duration::ZERO
            },
        }))
    }

    /// Records the runs of `step` (one per target, as `replay::replay` returns them); the
    /// level runs they made, for a live table.
    pub fn record(&mut self, step: LevelStep, runs: Vec<(RunOutput, Metrics)>) -> &[LevelRun] {
        let from = self.runs.len();
        for (output, metrics) in runs {
            self.runs.push(LevelRun {
                level_index: step.level_index,
                level: step.level,
                run: step.run,
                cfg: step.cfg.clone(),
                output,
                metrics,
            });
        }
        &self.runs[from..]
    }

    /// Every level run, in the order they ran.
    pub fn finish(self) -> Vec<LevelRun> {
        self.runs
    }
}

/// The next level a refining sweep runs, judged on the same capacity answer as the report:
/// halfway between the highest level meeting the SLO and the lowest breaking it, for the
/// target whose two are furthest apart (relative to the breaking level); None once every
/// bracket is within [`REFINE_GAP`] (concurrency: adjacent), or without one (no SLO, no
/// level met it, or none broke it).
pub fn refine_level(runs: &[LevelRun], axis: Axis, slo_percentile: f64) -> Option<f64> {
    let spec = SweepSpec {
        axis,
        levels: Vec::new(),
    };
    let identity = TraceIdentity {
        files: Vec::new(),
        rows: 0,
        content_hash: String::new(),
    };
    let docs: Vec<ResultDoc> = runs
        .iter()
        .map(|lr| level_result(lr, &spec, &identity, "", false))
        .collect();
    series::series_of(&docs, Some(axis), slo_percentile)
        .iter()
        .filter_map(|s| {
            let a = s.answer();
            let (lo, hi) = (a.max_ok_level?, a.first_break.as_ref()?.level);
            Some(((hi - lo) / hi, bisect(axis, lo, hi)?))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, mid)| mid)
}

/// Halfway between `lo` (met the SLO) and `hi` (broke it); None once they are within
/// [`REFINE_GAP`] of `hi` (concurrency: adjacent whole numbers).
pub fn bisect(axis: Axis, lo: f64, hi: f64) -> Option<f64> {
    let (mid, narrow) = match axis {
        Axis::MaxConcurrency => (((lo + hi) / 2.0).floor(), hi - lo <= 1.0),
        Axis::RequestRate | Axis::Speedup => ((lo + hi) / 2.0, hi - lo <= REFINE_GAP * hi),
    };
    (!narrow && mid > lo && mid < hi).then_some(mid)
}

/// The sweep that `runs` ran: `spec`'s axis and every level run (refined ones included),
/// ascending.
pub fn levels_run(spec: &SweepSpec, runs: &[LevelRun]) -> SweepSpec {
    let mut levels: Vec<f64> = spec
        .levels
        .iter()
        .copied()
        .chain(runs.iter().map(|r| r.level))
        .collect();
    levels.sort_by(f64::total_cmp);
    levels.dedup_by(|a, b| a.to_bits() == b.to_bits());
    SweepSpec {
        axis: spec.axis,
        levels,
    }
}

/// The vLLM-style result of one level run, marked with its place in the sweep.
pub fn level_result(
    lr: &LevelRun,
    spec: &SweepSpec,
    trace: &TraceIdentity,
    command: &str,
    detailed: bool,
) -> ResultDoc {
    let mut d = result_doc(&ResultInputs {
        cfg: &lr.cfg,
        run: &lr.output,
        metrics: &lr.metrics,
        trace,
        command,
        detailed,
    });
    if let Some(o) = d.llmreplay.as_mut() {
        o.sweep = Some(SweepMark {
            axis: spec.axis.key().into(),
            level: lr.level,
            level_index: lr.level_index as u64,
            run: lr.run as u64,
        });
    }
    d
}

/// Everything the sweep's JSON document is made of.
pub struct SweepDoc<'a> {
    /// The spec.
    pub spec: &'a SweepSpec,
    /// Options.
    pub opts: &'a SweepOptions,
    /// The base configuration (SLOs, cooldown).
    pub cfg: &'a ReplayConfig,
    /// Every level result (from [`level_result`]).
    pub results: Vec<ResultDoc>,
    /// The trace.
    pub trace: &'a TraceIdentity,
    /// The trace's arrival rate.
    pub arrivals: &'a ArrivalProfile,
    /// The exact command.
    pub command: &'a str,
    /// A capacity plan's inputs: target load (None = the trace's peak), redundancy, cost.
    pub plan: PlanInputs,
}

/// The sweep's document: `llmreplay_sweep` (summary, capacity answers, plans) and `results`.
pub fn sweep_doc(d: &SweepDoc) -> SweepFile {
    let series = series::series_of(&d.results, Some(d.spec.axis), d.opts.slo_percentile);
    let mut targets = BTreeMap::new();
    for s in &series {
        let a = capacity::answer(&s.name, s.axis, &s.points, &s.slos, s.slo_percentile);
        let p = series::plan_for(&a, d.arrivals, d.plan);
        targets.insert(
            s.name.clone(),
            SweepTarget {
                levels: serde_json::json!(s.points),
                capacity: crate::plan::answer_json(&a, p.as_ref()),
            },
        );
    }
    SweepFile {
        summary: SweepSummary {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            command: d.command.into(),
            axis: d.spec.axis.key().into(),
            levels: d.spec.levels.clone(),
            num_runs: d.opts.num_runs as u64,
            level_duration_s: d.opts.level_duration.map(|x| x.as_secs_f64()),
            cooldown_s: d.cfg.cooldown.as_secs_f64(),
            slo_percentile: Some(d.opts.slo_percentile),
            goodput_slos: d
                .cfg
                .goodput
                .iter()
                .map(|s| (s.metric.key().to_string(), s.limit_ms))
                .collect(),
            rules: capacity::rules_text(d.opts.slo_percentile),
            trace: SweepTrace {
                files: d.trace.files.clone(),
                rows: d.trace.rows as u64,
                content_hash: d.trace.content_hash.clone(),
                arrivals: Some(d.arrivals.clone()),
            },
            plan_inputs: PlanInputsDoc {
                target_qps: d.plan.target_qps,
                redundancy: d.plan.redundancy,
                cost_per_hour: d.plan.cost_per_hour,
                window_s: Some(d.plan.window_s),
            },
            targets,
        },
        results: d.results.clone(),
    }
}

/// The console line of one finished level run (printed as the sweep goes).
pub fn run_line(lr: &LevelRun, spec: &SweepSpec, opts: &SweepOptions) -> String {
    let m = &lr.metrics;
    let pl = trace_format::stats::percentile_label(opts.slo_percentile);
    let v = results::build::verdict(m, &lr.output);
    format!(
        "  {} run {}/{} {}: {}{:.2} req/s served{}, goodput {}, TTFT p50/p{pl} {:.1}/{:.1} ms, TPOT p50/p{pl} {:.1}/{:.1} ms, {} failed{}{}{}",
        spec.axis.level_label(lr.level),
        lr.run + 1,
        opts.num_runs,
        lr.output.target.name,
        // The load the schedule really offered (a short Poisson level is not its setting).
        m.served.offered_rps.map_or(String::new(), |o| format!("{o:.2} req/s offered, ")),
        m.request_throughput,
        m.served.steady.as_ref().map_or(String::new(), |s| format!(" ({:.2} steady)", s.request_throughput)),
        m.request_goodput.map_or("-".into(), |g| format!("{g:.2}")),
        m.ttft.median,
        m.ttft.get(opts.slo_percentile).unwrap_or(f64::NAN),
        m.tpot.median,
        m.tpot.get(opts.slo_percentile).unwrap_or(f64::NAN),
        m.failed,
        if v.client_saturated { "  [client saturated: see the JSON verdict]" } else { "" },
        if v.target_overloaded { "  [OVERLOADED: the target fell behind the schedule]" } else { "" },
        // The level's validity stamp (results::validity), beside its TTFT.
        match results::validity::of_run(&lr.cfg, m, &lr.output) {
            Some(s) if !s.valid => format!(
                "  [INVALID: client timing error {:.2} ms over its {:.2} ms budget]",
                s.error_ms,
                s.budget_ms.unwrap_or(0.0)
            ),
            Some(_) => ", VALID".into(),
            None => String::new(),
        }
    )
}

/// A finished sweep: its runs, its document and series, what its outputs are written with.
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    /// Every level run.
    pub runs: Vec<LevelRun>,
    /// The sweep's JSON document.
    pub doc: SweepFile,
    /// One series per configuration.
    pub series: Vec<series::Series>,
    /// The trace's arrival rate.
    pub arrivals: ArrivalProfile,
    /// The trace's identity.
    pub identity: TraceIdentity,
}

/// How a finished sweep is written up.
#[derive(Debug, Clone, Copy)]
pub struct SweepWriteUp<'a> {
    /// The exact command line.
    pub command: &'a str,
    /// `--save-detailed`: the per-request arrays in every level result.
    pub detailed: bool,
    /// The capacity plan's inputs.
    pub plan: PlanInputs,
}

/// Turns the runs of a sweep over `trace` into its document and series.
pub fn outcome(
    runs: Vec<LevelRun>,
    base: &ReplayConfig,
    spec: &SweepSpec,
    opts: &SweepOptions,
    trace: &trace_format::Trace,
    w: SweepWriteUp,
) -> SweepOutcome {
    let identity = results::build::trace_identity(trace);
    let results: Vec<ResultDoc> = runs
        .iter()
        .map(|lr| level_result(lr, spec, &identity, w.command, w.detailed))
        .collect();
    let mut arrivals = series::arrival_profile(&trace.records);
    arrivals.producer = series::producer_of(&trace.files);
    let doc = sweep_doc(&SweepDoc {
        spec,
        opts,
        cfg: base,
        results,
        trace: &identity,
        arrivals: &arrivals,
        command: w.command,
        plan: w.plan,
    });
    let series = series::series_of(&doc.results, Some(spec.axis), opts.slo_percentile);
    SweepOutcome {
        runs,
        doc,
        series,
        arrivals,
        identity,
    }
}

/// What the console shows when a sweep ends: the level table, the comparison of several
/// configurations, the capacity answer and plan of each.
pub fn summary_text(
    o: &SweepOutcome,
    spec: &SweepSpec,
    opts: &SweepOptions,
    plan: PlanInputs,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("\n");
    // The answer first, three lines per configuration.
    let _ = writeln!(out, "Answer:");
    for s in &o.series {
        let ans = s.answer();
        let p = series::plan_for(&ans, &o.arrivals, plan);
        for l in crate::plan::answer_lines(&ans, &s.slos, p.as_ref()) {
            let _ = writeln!(out, "  {l}");
        }
    }
    out.push('\n');
    out.push_str(&console_table(spec, &o.series));
    if o.series.len() > 1 {
        let t = crate::compare::compare(&o.series);
        let _ = writeln!(out, "\n{}", crate::compare::render(&o.series, &t));
    }
    let _ = writeln!(out, "\nCapacity answer:");
    for s in &o.series {
        let ans = s.answer();
        let _ = writeln!(out, "  {}", ans.sentence);
        if let Some(p) = series::plan_for(&ans, &o.arrivals, plan) {
            let _ = writeln!(out, "  Plan: {}", p.sentence);
            if let Some(d) = &p.demand {
                let _ = writeln!(out, "  Demand: {}", d.sentence);
            }
        }
    }
    let _ = writeln!(out, "  ({})", capacity::rules_text(opts.slo_percentile));
    out
}

/// The metadata of a sweep's `--results` Parquet file.
pub fn results_meta(o: &SweepOutcome, spec: &SweepSpec, command: &str) -> trace_format::FileMeta {
    let mut meta = trace_format::FileMeta::new(trace_format::Producer::Replay, command.to_string());
    meta.source = Some(o.identity.files.join(","));
    meta.extra
        .insert("trace_content_hash".into(), o.identity.content_hash.clone());
    meta.extra.insert(
        "sweep".into(),
        format!("{}={:?}", spec.axis.key(), spec.levels),
    );
    meta
}

/// The console table of a sweep: one row per level and target (means; ± spread with repeats).
pub fn console_table(spec: &SweepSpec, series: &[series::Series]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for s in series {
        let pct = trace_format::stats::percentile_label(s.slo_percentile);
        let _ = writeln!(
            out,
            "{:=^118}",
            format!(" Sweep {} — {} ", spec.axis.key(), s.name)
        );
        let _ = writeln!(
            out,
            "{:>10} {:>4} {:>9} {:>13} {:>13} {:>9} {:>10} {:>10} {:>10} {:>10} {:>7}",
            "level",
            "runs",
            "offered",
            "req/s",
            "goodput",
            "good%",
            "TTFT p50",
            &format!("TTFT p{pct}"),
            "TPOT p50",
            &format!("TPOT p{pct}"),
            "failed"
        );
        for p in &s.points {
            let f = |k: &str| match p.stat(k) {
                Some(st) => match st.std {
                    Some(sd) => format!("{:.2}±{:.2}", st.mean, sd),
                    None => format!("{:.2}", st.mean),
                },
                None => "-".into(),
            };
            let ms = |k: &str| p.mean(k).map_or("-".into(), |v| format!("{v:.1}"));
            let thr = p.mean("request_throughput").unwrap_or(0.0);
            let good = p
                .mean("request_goodput")
                .and_then(|g| results::pct::share(g, thr))
                .map_or("-".into(), results::pct::fmt_share);
            let _ = writeln!(
                out,
                "{:>10} {:>4} {:>9} {:>13} {:>13} {:>9} {:>10} {:>10} {:>10} {:>10} {:>6.1}%",
                capacity::fmt_num(p.level),
                p.runs,
                p.offered_rps().map_or("-".into(), |o| format!("{o:.2}")),
                f("request_throughput"),
                f("request_goodput"),
                good,
                ms("median_ttft_ms"),
                ms(&capacity::pct_key(s.slo_percentile, "ttft")),
                ms("median_tpot_ms"),
                ms(&capacity::pct_key(s.slo_percentile, "tpot")),
                p.failed_fraction * 100.0
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use replay::config::Target;

    /// The plan steps through every level `num_runs` times in order, each with a salt of its
    /// own and the cooldown before all but the first, and stops (no refinement asked) after
    /// the last; it never runs anything itself.
    #[test]
    fn a_plan_steps_through_levels_and_repeats_in_order() {
        let mut base = ReplayConfig::new(vec![Target {
            name: "t".into(),
            url: "http://127.0.0.1:1".into(),
        }]);
        base.cooldown = Duration::from_millis(5);
        let base = base.validate().unwrap();
        let spec: SweepSpec = "max-concurrency=2,8".parse().unwrap();
        let opts = SweepOptions {
            num_runs: 2,
            level_duration: None,
            slo_percentile: 95.0,
            refine: 3,
        };
        let mut plan = SweepPlan::new(&base, &spec, &opts).unwrap();
        let mut seen = Vec::new();
        while let Some(step) = plan.next_step().unwrap() {
            assert_eq!(step.cfg.max_concurrency, Some(step.level as usize));
            seen.push((
                step.level_index,
                step.level,
                step.run,
                step.cooldown,
                step.cfg.request.prompt_salt,
            ));
            plan.record(step, Vec::new());
        }
        let cool = Duration::from_millis(5);
        let places: Vec<_> = seen.iter().map(|s| (s.0, s.1, s.2, s.3)).collect();
        assert_eq!(
            places,
            vec![
                (0, 2.0, 0, Duration::ZERO),
                (0, 2.0, 1, cool),
                (1, 8.0, 0, cool),
                (1, 8.0, 1, cool)
            ]
        );
        let mut salts: Vec<u64> = seen.iter().map(|s| s.4).collect();
        salts.dedup();
        assert_eq!(salts.len(), 4, "a prompt salt per level run");
        assert!(plan.finish().is_empty());
        let bad = SweepOptions {
            num_runs: 0,
            ..opts
        };
        assert!(SweepPlan::new(&base, &spec, &bad).is_err());
    }

    /// The same good% read 12% on the console and 13% elsewhere: Rust's `{:.0}` rounds a
    /// half to even (12.5 → 12), people and every other tool round it up. One rule, one
    /// function ([`results::pct::fmt_share`]): the sweep table and the knee sentence agree.
    #[test]
    fn good_percent_has_one_rounding_rule_on_the_console_and_in_the_knee() {
        use crate::capacity::{LevelPoint, Stat};
        let point = |level: f64, thr: f64, good: f64| LevelPoint {
            level,
            runs: 1,
            values: [
                ("request_throughput".to_string(), Stat::one(thr)),
                ("request_goodput".to_string(), Stat::one(good)),
                ("median_ttft_ms".to_string(), Stat::one(10.0)),
                ("median_tpot_ms".to_string(), Stat::one(10.0)),
            ]
            .into_iter()
            .collect(),
            failed_fraction: 0.0,
            causes: Default::default(),
            workload: None,
        };
        let points = vec![point(1.0, 1.0, 1.0), point(2.0, 2.0, 0.25)];
        let knee = capacity::knee(&points, Axis::RequestRate, true).unwrap();
        let reason = knee.reasons.join("; ");
        assert!(reason.contains("goodput fell to 13% of"), "{reason}");
        let series = series::Series {
            name: "t".into(),
            axis: Axis::RequestRate,
            slos: vec!["ttft:500".parse().unwrap()],
            slo_percentile: 95.0,
            points,
            runs: Vec::new(),
            commands: Vec::new(),
        };
        let spec: SweepSpec = "request-rate=1,2".parse().unwrap();
        let table = console_table(&spec, std::slice::from_ref(&series));
        assert!(table.contains(" 13% "), "{table}");
        assert!(!table.contains(" 12% "), "{table}");
    }

    #[test]
    fn refinement_bisects_the_bracket_until_it_is_narrow() {
        assert_eq!(bisect(Axis::RequestRate, 150.0, 270.0), Some(210.0));
        assert_eq!(bisect(Axis::RequestRate, 195.0, 202.5), Some(198.75));
        // 198.75..202.5 is within 2% of 202.5: the answer is close enough.
        assert_eq!(bisect(Axis::RequestRate, 198.75, 202.5), None);
        assert_eq!(bisect(Axis::Speedup, 1.0, 3.0), Some(2.0));
        assert_eq!(bisect(Axis::MaxConcurrency, 8.0, 16.0), Some(12.0));
        assert_eq!(bisect(Axis::MaxConcurrency, 8.0, 11.0), Some(9.0));
        assert_eq!(bisect(Axis::MaxConcurrency, 8.0, 9.0), None);
    }

    #[test]
    fn specs_parse_and_reject_garbage() {
        let s: SweepSpec = "max-concurrency=16,1,8".parse().unwrap();
        assert_eq!(
            (s.axis, s.levels),
            (Axis::MaxConcurrency, vec![1.0, 8.0, 16.0])
        );
        let s: SweepSpec = "speedup=0.5,2".parse().unwrap();
        assert_eq!(s.axis, Axis::Speedup);
        assert!("max-concurrency=1.5".parse::<SweepSpec>().is_err());
        assert!("rate".parse::<SweepSpec>().is_err());
        assert!("foo=1".parse::<SweepSpec>().is_err());
        assert!("request-rate=0".parse::<SweepSpec>().is_err());
        assert!("request-rate=".parse::<SweepSpec>().is_err());
    }

    #[test]
    fn every_level_and_repeat_gets_its_own_salt_and_setting() {
        let base = ReplayConfig::new(vec!["http://127.0.0.1:1".parse().unwrap()]);
        let spec: SweepSpec = "request-rate=1,4".parse().unwrap();
        let opts = SweepOptions {
            num_runs: 2,
            level_duration: Some(Duration::from_secs(10)),
            slo_percentile: 95.0,
            refine: 0,
        };
        let mut salts = std::collections::HashSet::new();
        for li in 0..2 {
            for run in 0..2 {
                let c = level_config(&base, &spec, &opts, li, run).unwrap();
                salts.insert(c.request.prompt_salt);
                assert_eq!(c.seed, base.seed, "same schedule seed at every level");
            }
        }
        assert_eq!(salts.len(), 4);
        let c = level_config(&base, &spec, &opts, 1, 0).unwrap();
        assert_eq!(
            c.arrivals,
            Arrivals::Rate {
                rate: 4.0,
                burstiness: 1.0
            }
        );
        assert_eq!(c.selection.max_requests, Some(40));
        let spec: SweepSpec = "max-concurrency=8".parse().unwrap();
        assert_eq!(
            level_config(&base, &spec, &opts, 0, 0)
                .unwrap()
                .max_concurrency,
            Some(8)
        );
    }
}
