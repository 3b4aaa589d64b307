//! Flags and wiring of the capacity work: `replay --sweep` (and `--num-runs`), `compare`, and
//! `report`. The logic lives in the reporting crate (`sweep`, `capacity`, `compare`, `document`,
//! `html`, `alerts`); this file parses, validates, runs a sweep's levels (`replay::replay`,
//! one per step of `reporting::sweep::SweepPlan`) and prints.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::flags::{parse_percentile, parse_positive};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use replay::config::{Arrivals, PercentileMetric, ReplayConfig, SloMetric, Target};
use reporting::capacity::Axis;
use reporting::series::{self, ResultFile};
use reporting::sweep::{self, PlanInputs, SweepOptions, SweepSpec};
use trace_format::Trace;

/// Capacity-planning flags shared by `replay` and `report`.
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// Load to plan for, req/s (default: the captured trace's peak 1-second arrival rate).
    #[arg(long, value_parser = parse_positive)]
    pub target_qps: Option<f64>,
    /// Independent failure domains, each able to carry the whole load alone (2 = survive losing one).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub redundancy: u32,
    /// Cost of one replica per hour (any currency), for the monthly cost (x 730 h), the cost
    /// per day over the trace's demand and the cost per million output tokens.
    #[arg(long, value_parser = parse_positive)]
    pub cost_per_hour: Option<f64>,
    /// Window of the plan over the trace's own demand curve: replicas per window at the SLO,
    /// sized for the window's peak 1-second arrival rate.
    #[arg(long, value_parser = crate::flags::parse_positive_duration, default_value = "5m")]
    pub plan_window: Duration,
}

impl PlanArgs {
    fn inputs(&self) -> PlanInputs {
        PlanInputs {
            target_qps: self.target_qps,
            redundancy: self.redundancy,
            cost_per_hour: self.cost_per_hour,
            window_s: self.plan_window.as_secs_f64(),
        }
    }
}

/// `replay` flags for sweeps and repeats.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Replay at each level in turn: max-concurrency=1,8,16,32 | request-rate=1,2,4 | speedup=0.5,1,2.
    /// Each level is a fresh run (own prompt salt, --cooldown between), the JSON holds every level.
    #[arg(long, value_name = "AXIS=L1,L2,...")]
    pub sweep: Option<SweepSpec>,
    /// Repeat every level (or the single run) N times: mean and spread per level.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub num_runs: u64,
    /// Offer load this long at each level (request-rate: rate x this many requests; speedup:
    /// this much wall time of trace). Default: the whole selection at every level.
    #[arg(long, value_parser = crate::flags::parse_positive_duration)]
    pub level_duration: Option<Duration>,
    /// The percentile at which every --goodput SLO must hold for a level to count.
    #[arg(long, default_value_t = 95.0, value_parser = parse_percentile)]
    pub slo_percentile: f64,
    /// After the --sweep levels, run up to N more, each halfway between the highest level
    /// meeting the SLO and the lowest breaking it, until the two are within 2% (concurrency:
    /// adjacent): the capacity answer then lands near the limit, not at the nearest level given.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub refine: usize,
    #[command(flatten)]
    pub plan: PlanArgs,
}

impl SweepArgs {
    /// The sweep to run: `--sweep`, or a one-level sweep of the current setting with
    /// `--num-runs` > 1; None for a plain replay.
    pub fn spec(&self, cfg: &ReplayConfig) -> Option<SweepSpec> {
        if let Some(s) = &self.sweep {
            return Some(s.clone());
        }
        if self.num_runs <= 1 {
            return None;
        }
        let (axis, level) = match (cfg.max_concurrency, cfg.arrivals) {
            (Some(c), _) => (Axis::MaxConcurrency, c as f64),
            (None, Arrivals::Rate { rate, .. }) if rate.is_finite() => (Axis::RequestRate, rate),
            (None, Arrivals::Recorded { speedup }) => (Axis::Speedup, speedup),
            (None, Arrivals::Rate { .. }) => (Axis::MaxConcurrency, f64::NAN),
        };
        if level.is_nan() {
            // --request-rate inf without a concurrency cap: repeat as an uncapped run.
            return Some(SweepSpec {
                axis: Axis::MaxConcurrency,
                levels: vec![1e9],
            });
        }
        Some(SweepSpec {
            axis,
            levels: vec![level],
        })
    }

    /// Makes sure the results carry what the capacity answer reads: the SLO percentile (and 50,
    /// 99) of TTFT and TPOT and of every SLO metric.
    pub fn prepare(&self, cfg: &mut ReplayConfig) {
        for p in [50.0, self.slo_percentile, 99.0] {
            if !cfg.metric_percentiles.contains(&p) {
                cfg.metric_percentiles.push(p);
            }
        }
        cfg.metric_percentiles.sort_by(f64::total_cmp);
        let mut want = vec![PercentileMetric::Ttft, PercentileMetric::Tpot];
        for s in &cfg.goodput {
            want.push(match s.metric {
                // TTFAT's keys come with TTFT's (results::build).
                SloMetric::Ttft | SloMetric::Ttfat => PercentileMetric::Ttft,
                SloMetric::Tpot => PercentileMetric::Tpot,
                SloMetric::E2el => PercentileMetric::E2el,
            });
        }
        for m in want {
            if !cfg.percentile_metrics.contains(&m) {
                cfg.percentile_metrics.push(m);
            }
        }
    }
}

/// Where a sweep writes, and the provenance it writes with.
pub struct SweepOutputs<'a> {
    /// The exact command line.
    pub command: &'a str,
    /// `--save-result`.
    pub save_result: Option<&'a Path>,
    /// `--save-detailed`.
    pub detailed: bool,
    /// `--results` Parquet.
    pub results: Option<&'a Path>,
    /// `-q`: no definitions block above the results.
    pub quiet: bool,
    /// Not `--fail-on-invalid`: an INVALID level does not make the exit status 8.
    pub allow_invalid: bool,
}

/// Runs a sweep and prints the level table, the capacity answer and the plan. A signal
/// (`stop`, see [`crate::replay_cmd::stop_on_signals`]) stops the level running as it stops
/// a replay, no further level starts, and the levels run so far are summarized and written
/// as usual; the signal's exit status is returned then. A level stamped INVALID makes the
/// sweep's status 8 ([`crate::exit::invalid`]), after everything is written.
#[allow(clippy::too_many_arguments)]
pub fn run_sweep(
    cfg: &replay::ValidatedConfig,
    spec: &SweepSpec,
    a: &SweepArgs,
    trace: &Trace,
    block_size: Option<usize>,
    out: SweepOutputs,
    progress: &dyn Fn(&Target, replay::Progress),
    stop: &replay::Stop,
) -> Result<Option<crate::exit::ExitStatus>> {
    let opts = SweepOptions {
        num_runs: a.num_runs as usize,
        level_duration: a.level_duration,
        slo_percentile: a.slo_percentile,
        refine: a.refine,
    };
    if spec.axis == Axis::MaxConcurrency && a.level_duration.is_some() {
        eprintln!("note: --level-duration has no effect on a max-concurrency sweep (every level replays the selection)");
    }
    if !out.quiet {
        println!("{}", reporting::console::definitions());
    }
    println!(
        "Sweep {} over {} level(s) x {} run(s) x {} target(s){}",
        spec.axis.key(),
        spec.levels.len(),
        opts.num_runs,
        cfg.targets.len(),
        if cfg.cooldown.is_zero() {
            String::new()
        } else {
            format!(", {:?} cooldown between levels", cfg.cooldown)
        }
    );
    // The levels are run here, one `replay::replay` each; the plan (reporting) only says
    // which comes next, so no library calls back up into the binary or across to the engine.
    let mut plan = sweep::SweepPlan::new(cfg, spec, &opts).map_err(crate::exit::refused)?;
    while let Some(step) = plan.next_step()? {
        if !step.cooldown.is_zero() {
            std::thread::sleep(step.cooldown);
        }
        let runs = replay::replay(
            &step.cfg,
            &trace.records,
            block_size,
            progress,
            &mut replay::sink::NoSink,
            stop,
        )?;
        for lr in plan.record(step, runs) {
            println!("{}", sweep::run_line(lr, spec, &opts));
        }
        if let Some(reason) = stop.state().reason() {
            eprintln!(
                "sweep stopped ({reason}): no further level runs; the levels run so far are \
                 summarized and written (the last one partly run)"
            );
            break;
        }
    }
    let runs = plan.finish();
    // The levels run, refined ones included; a stopped sweep's only.
    let mut ran = sweep::levels_run(spec, &runs);
    if stop.state().reason().is_some() {
        ran.levels
            .retain(|l| runs.iter().any(|r| r.level.to_bits() == l.to_bits()));
    }
    let spec = &ran;
    let o = sweep::outcome(
        runs,
        cfg,
        spec,
        &opts,
        trace,
        sweep::SweepWriteUp {
            command: out.command,
            detailed: out.detailed,
            plan: a.plan.inputs(),
        },
    );
    print!("{}", sweep::summary_text(&o, spec, &opts, a.plan.inputs()));
    if let Some(p) = out.save_result {
        store::write_bytes(p, o.doc.to_bytes())
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!(
            "sweep result written to {} (report: llmreplay report {} -o report.html)",
            p.display(),
            p.display()
        );
    }
    if let Some(p) = out.results {
        let rows: Vec<_> = o
            .runs
            .iter()
            .flat_map(|lr| lr.output.records.iter().cloned())
            .collect();
        let mut meta = sweep::results_meta(&o, spec, out.command);
        // The rows carry the trace's prefix hashes, so its privacy manifest (key id).
        meta.privacy = trace_format::file_meta::carried(trace.files.iter().map(|f| &f.meta));
        // Through the object-store layer like every other output (`s3://…` works here too).
        store::write_trace(p, &rows, &meta).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("{} result rows written to {}", rows.len(), p.display());
    }
    if let Some(s) = stop
        .state()
        .reason()
        .and_then(crate::signals::Signal::named)
    {
        return Ok(Some(s.status()));
    }
    // Every output is written: any level INVALID is the sweep's status.
    crate::exit::invalid(
        o.runs.iter().map(|lr| (&*lr.cfg, &lr.output, &lr.metrics)),
        out.allow_invalid,
    )
    .map(|_| None)
}

/// Writes `report.html` and `report.md` of one result file into `dir`.
pub fn write_reports(result: &Path, dir: &Path) -> Result<()> {
    // The error names the file.
    let files = vec![ResultFile::read(result)?];
    let data = reporting::document::build(
        &files,
        &reporting::document::BuildOptions {
            command: crate::flags::command_line(),
            ..Default::default()
        },
    );
    for (name, text) in [
        ("report.html", reporting::html::render(&data)),
        ("report.md", reporting::document::markdown(&data)),
    ] {
        let p = dir.join(name);
        store::write_bytes(&p, text.into()).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("report written to {}", p.display());
    }
    Ok(())
}

/// `llmreplay compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Result JSON files (`--save-result` of replay, single runs or sweeps); the first is the baseline.
    #[arg(required = true, num_args = 2..)]
    files: Vec<PathBuf>,
    /// The percentile SLOs are judged at (default: the sweep's, else 95).
    #[arg(long, value_parser = parse_percentile)]
    slo_percentile: Option<f64>,
    /// Also write the comparison as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Exit with status 3 when any difference is a regression beyond noise.
    #[arg(long)]
    fail_on_regression: bool,
    /// Compare runs whose workload cards differ beyond the tolerance (different traces or
    /// selections); by default compare refuses, naming what differs.
    #[arg(long)]
    allow_different_workloads: bool,
}

fn read_files(paths: &[PathBuf]) -> Result<Vec<ResultFile>> {
    paths
        .iter()
        .map(|p| ResultFile::read(p).map_err(Into::into))
        .collect()
}

/// Runs `compare`; returns whether a regression was found.
pub fn run_compare(a: CompareArgs) -> Result<bool> {
    let files = read_files(&a.files)?;
    let series = series::series_of_files(&files, a.slo_percentile);
    if series.len() < 2 {
        bail!("nothing to compare: the files hold one configuration only");
    }
    if let Some(why) = reporting::compare::refusal(&series) {
        bail!("{why}");
    }
    let tables = reporting::compare::compare(&series);
    // Two runs of different workloads measure the workloads: no verdict on the servers.
    let differ = reporting::compare::workload_differences(&tables);
    if !differ.is_empty() {
        let tol = trace_format::inspect_card::TOLERANCE.text();
        if !a.allow_different_workloads {
            bail!(
                "the runs replayed different workloads, so a difference between them would \
                 measure the traces, not the servers; no comparison: {} (tolerance: {tol}). \
                 --allow-different-workloads compares them anyway",
                differ.join(" | ")
            );
        }
        println!(
            "Note: the workloads differ ({}; tolerance: {tol}); compared anyway \
             (--allow-different-workloads): differences below measure the traces as much as the servers.",
            differ.join(" | ")
        );
    }
    print!("{}", reporting::compare::render(&series, &tables));
    let regs = reporting::compare::regressions(&tables);
    if let Some(p) = &a.json {
        let answers: Vec<_> = series.iter().map(|s| s.answer()).collect();
        let v = serde_json::json!({"files": a.files, "tables": tables, "capacity": answers, "regressions": regs, "notes": reporting::compare::notes(&series), "noise_rule": reporting::compare::noise_rule()});
        store::write_bytes(p, serde_json::to_vec_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("comparison written to {}", p.display());
    }
    Ok(a.fail_on_regression && !regs.is_empty())
}

/// The format an output's extension names: `.md`/`.markdown`, `.html`/`.htm`, none (HTML);
/// any other (`report.pdf`) is an error, not an HTML file under that name.
fn report_format_of(output: &std::path::Path) -> Result<ReportFormat> {
    match output.extension().and_then(|e| e.to_str()) {
        Some("md") | Some("markdown") => Ok(ReportFormat::Md),
        Some("html") | Some("htm") | None => Ok(ReportFormat::Html),
        Some(other) => crate::exit::refuse!(
            "-o {}: no report format for .{other}: write .html or .md (or give --format)",
            output.display()
        ),
    }
}

/// Report formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// One self-contained HTML file with SVG plots.
    Html,
    /// Markdown for the infrastructure team.
    Md,
}

/// `llmreplay report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Result JSON files (single runs or sweeps).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output file (`-`: standard output, the summary lines then on standard error).
    #[arg(short, long)]
    output: PathBuf,
    /// html or md (default: from the output's extension, else html).
    #[arg(long)]
    format: Option<ReportFormat>,
    /// `--results` Parquet files of the runs: per-request data for the distribution plots when
    /// the JSON was saved without --save-detailed.
    #[arg(long = "results", num_args = 1..)]
    results: Vec<String>,
    /// The captured trace (files, directories, globs, object-store prefixes: several
    /// captures are one trace): its arrival rate plot and peak load.
    #[arg(long, num_args = 1..)]
    trace: Vec<String>,
    /// --since/--until: the window of the --trace read.
    #[command(flatten)]
    window: crate::flags::WindowFlags,
    /// The percentile SLOs are judged at (default: the sweep's, else 95).
    #[arg(long, value_parser = parse_percentile)]
    slo_percentile: Option<f64>,
    /// A line of context for the report (why these levels, the customer's figures); repeatable.
    #[arg(long)]
    note: Vec<String>,
    /// Report title.
    #[arg(long)]
    title: Option<String>,
    /// Also write Prometheus alerting rules for the SLOs (from vLLM's histograms) here.
    #[arg(long)]
    alerts: Option<PathBuf>,
    #[command(flatten)]
    plan: PlanArgs,
}

/// Runs `report`.
pub fn run_report(a: ReportArgs) -> Result<()> {
    // `-o -`: the report on stdout (as `curl -o -` and `tar -f -`), its summary on stderr.
    // The format is checked before any file is read: a refused -o is a usage error.
    let to_stdout = a.output.as_os_str() == "-";
    let format = match a.format {
        Some(f) => f,
        None if to_stdout => ReportFormat::Html,
        None => report_format_of(&a.output)?,
    };
    let files = read_files(&a.files)?;
    // Both streamed: memory bounded by the runs and the trace's seconds, not its rows.
    let mut samples = series::RunSamples::only(
        files
            .iter()
            .flat_map(|f| f.results())
            .filter_map(series::run_key),
    );
    if !a.results.is_empty() {
        let stream = crate::traces::open_stream(&a.results).context("reading --results")?;
        samples.read(&stream).context("reading --results")?;
    }
    let arrivals = if a.trace.is_empty() {
        None
    } else {
        let stream =
            crate::traces::open_stream_in(&a.trace, &a.window).context("reading --trace")?;
        let mut a = series::arrival_profile_of(&stream).context("reading --trace")?;
        a.producer = series::producer_of(stream.files());
        crate::traces::say_stream_captures(&stream)?;
        Some(a)
    };
    let data = reporting::document::build(
        &files,
        &reporting::document::BuildOptions {
            slo_percentile: a.slo_percentile,
            plan: a.plan.inputs(),
            samples,
            arrivals,
            notes: a.note.clone(),
            command: crate::flags::command_line(),
            title: a.title.clone(),
        },
    );
    let text = match format {
        ReportFormat::Html => reporting::html::render(&data),
        ReportFormat::Md => reporting::document::markdown(&data),
    };
    if to_stdout {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing the report to stdout")?;
    } else {
        store::write_bytes(&a.output, text.into())
            .with_context(|| format!("writing {}", a.output.display()))?;
    }
    let say = |line: &str| {
        if to_stdout {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    // A partial result says so first (`llmreplay.interrupted`: a stopped or killed run).
    for p in reporting::document::partial_lines(&data) {
        say(&p);
    }
    // The answer first (capacity at the SLO, knee, replicas), then how it was found.
    for l in reporting::document::answer_lines(&data) {
        say(&l);
    }
    for ans in &data.answers {
        say(&ans.sentence);
    }
    for p in &data.plans {
        say(&format!("Plan: {}", p.sentence));
        if let Some(d) = &p.demand {
            say(&format!("Demand: {}", d.sentence));
        }
    }
    if !to_stdout {
        eprintln!("report written to {}", a.output.display());
    }
    if let Some(p) = &a.alerts {
        let series = &data.series;
        let yaml = reporting::alerts::rules_yaml(series, &data.answers)?;
        store::write_bytes(p, yaml.into()).with_context(|| format!("writing {}", p.display()))?;
        eprintln!(
            "alerting rules written to {} (check: promtool check rules {})",
            p.display(),
            p.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `report -o report.pdf` wrote HTML under that name; now only names it can write pass.
    #[test]
    fn the_output_extension_names_a_format_or_is_refused() {
        let f = |p: &str| report_format_of(std::path::Path::new(p));
        assert_eq!(f("r.md").unwrap(), ReportFormat::Md);
        assert_eq!(f("r.html").unwrap(), ReportFormat::Html);
        assert_eq!(f("report").unwrap(), ReportFormat::Html);
        let e = f("r.pdf").unwrap_err().to_string();
        assert!(e.contains(".pdf") && e.contains("--format"), "{e}");
    }
}
