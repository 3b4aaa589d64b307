//! What `llmreplay report` says, gathered once ([`ReportData`]) and written as Markdown for
//! the infrastructure team ([`markdown`]) or as one self-contained HTML file with plots
//! (`crate::html`): the capacity answer and plan first, the definitions table, the exact
//! commands, the levels and why, p50/p95/p99 and goodput per level, the comparison, and the
//! JSON files it all came from.

use std::fmt::Write as _;

use trace_format::stats::percentile_label;

use crate::capacity::{self, fmt_num, CapacityAnswer};
use crate::plan::{self, CapacityPlan, PlanInputs};
use crate::series::{self, ArrivalProfile, ResultFile, RunSamples, Samples, Series};
use results::doc::{ClassDoc, Extension, ServerHistogramsDoc, SlicesDoc, SummaryDoc, TrendDoc};
use results::sweep_doc::PlanInputsDoc;

/// The metric definitions table, Markdown: the report block of `docs/metrics.md`.
pub fn definitions_md() -> &'static str {
    crate::definitions::section("report")
}

/// Everything a report shows.
#[derive(Debug, Clone)]
pub struct ReportData {
    /// Title.
    pub title: String,
    /// The result files read.
    pub files: Vec<String>,
    /// Configurations across levels.
    pub series: Vec<Series>,
    /// Capacity answer per series.
    pub answers: Vec<CapacityAnswer>,
    /// Capacity plan per series with a capacity.
    pub plans: Vec<CapacityPlan>,
    /// Why no plan, when none.
    pub plan_note: Option<String>,
    /// Per-request samples: (series, level, samples).
    pub samples: Vec<(String, f64, Samples)>,
    /// The trace's arrival rate.
    pub arrivals: Option<ArrivalProfile>,
    /// Console comparison of the series, when more than one.
    pub comparison: Option<String>,
    /// `--note` texts (why these levels, context).
    pub notes: Vec<String>,
    /// The command that made the report.
    pub command: String,
    /// Server-side figures beside the client's: (series, level,
    /// `llmreplay.server_histograms`).
    pub server: Vec<(String, f64, ServerHistogramsDoc)>,
    /// Per-time-slice metrics of the runs that have them (`replay --slice`):
    /// (series, level, `llmreplay.slices`).
    pub slices: Vec<(String, f64, SlicesDoc)>,
    /// Latency per class of request of the runs that mix classes: (series, level,
    /// `llmreplay.by_class`).
    pub classes: Vec<(String, f64, Vec<ClassDoc>)>,
    /// What each run served and whether it can be trusted: (series, level, the run's
    /// `llmreplay`).
    pub verdicts: Vec<(String, f64, Extension)>,
}

/// Inputs of [`build`] beyond the files.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// `--slo-percentile` override.
    pub slo_percentile: Option<f64>,
    /// Plan inputs.
    pub plan: PlanInputs,
    /// Per-run samples of `--results` Parquet rows (per-request data when the JSON lacks it).
    pub samples: RunSamples,
    /// The trace's arrival rate from `--trace` (else the sweep file's).
    pub arrivals: Option<ArrivalProfile>,
    /// `--note`.
    pub notes: Vec<String>,
    /// The report command.
    pub command: String,
    /// Title.
    pub title: Option<String>,
}

/// One line per run that was stopped before its schedule ended (`llmreplay.interrupted`):
/// `NAME at LEVEL: PARTIAL (SIGTERM): ...`. A report says so before anything else.
pub fn partial_lines(d: &ReportData) -> Vec<String> {
    d.verdicts
        .iter()
        .filter_map(|(name, level, ours)| {
            let i = ours.interrupted.as_ref()?;
            let at = if level.is_finite() {
                format!(" at {level}")
            } else {
                String::new()
            };
            Some(format!("{name}{at}: {}", i.summary()))
        })
        .collect()
}

/// Gathers a report from result files.
pub fn build(files: &[ResultFile], o: &BuildOptions) -> ReportData {
    let series = series::series_of_files(files, o.slo_percentile);
    let answers: Vec<CapacityAnswer> = series.iter().map(Series::answer).collect();
    let arrivals = o.arrivals.clone().or_else(|| {
        files.iter().find_map(|f| {
            f.sweep()
                .and_then(|s| s.trace.arrivals.clone())
                .filter(|a| !a.counts.is_empty())
        })
    });
    // Target load and cost: the report's flags, else what the sweep was run with.
    let recorded = |k: fn(&PlanInputsDoc) -> Option<f64>| {
        files.iter().find_map(|f| k(&f.sweep()?.plan_inputs))
    };
    let plan_inputs = PlanInputs {
        target_qps: o.plan.target_qps.or_else(|| recorded(|p| p.target_qps)),
        cost_per_hour: o
            .plan
            .cost_per_hour
            .or_else(|| recorded(|p| p.cost_per_hour)),
        ..o.plan
    };
    let mut plans = Vec::new();
    let mut plan_note = None;
    if plan_inputs.target_qps.is_none() && arrivals.is_none() {
        plan_note = Some(
            "no capacity plan: give --target-qps, or --trace for the capture's peak arrival rate"
                .into(),
        );
    } else {
        let empty = ArrivalProfile::default();
        for a in &answers {
            if let Some(p) = series::plan_for(a, arrivals.as_ref().unwrap_or(&empty), plan_inputs) {
                plans.push(p);
            }
        }
        if plans.is_empty() {
            plan_note = Some("no capacity plan: no configuration met the SLO at any level (or no --goodput SLO was given)".into());
        }
    }
    let by_run = &o.samples;
    let mut samples = Vec::new();
    let mut server = Vec::new();
    let mut slices = Vec::new();
    let mut classes = Vec::new();
    let mut verdicts = Vec::new();
    for s in &series {
        for p in &s.points {
            let mut merged = Samples::default();
            let mut any = false;
            for (l, r) in s
                .runs
                .iter()
                .filter(|(l, _)| l.to_bits() == p.level.to_bits())
            {
                let _ = l;
                let ours = r.llmreplay.as_ref();
                let detailed = series::samples_of_result(r);
                let got = detailed
                    .as_ref()
                    .or_else(|| by_run.get(&series::run_key(r)?));
                if let Some(g) = got {
                    any = true;
                    merged.merge(g);
                }
                let Some(ours) = ours else { continue };
                if let Some(c) = ours.by_class.as_ref().filter(|c| !c.is_empty()) {
                    classes.push((s.name.clone(), p.level, c.clone()));
                }
                verdicts.push((s.name.clone(), p.level, ours.clone()));
                if let Some(sv) = &ours.server_histograms {
                    server.push((s.name.clone(), p.level, sv.clone()));
                }
                if let Some(sl) = &ours.slices {
                    slices.push((s.name.clone(), p.level, sl.clone()));
                }
            }
            if any {
                samples.push((s.name.clone(), p.level, merged));
            }
        }
    }
    let comparison = (series.len() > 1).then(|| {
        let t = crate::compare::compare(&series);
        crate::compare::render(&series, &t)
    });
    ReportData {
        title: o
            .title
            .clone()
            .unwrap_or_else(|| "LLM serving capacity report".into()),
        files: files.iter().map(|f| f.path.clone()).collect(),
        series,
        answers,
        plans,
        plan_note,
        samples,
        arrivals,
        comparison,
        notes: o.notes.clone(),
        command: o.command.clone(),
        server,
        slices,
        classes,
        verdicts,
    }
}

/// The latency-by-class table (runs that mix endpoints, or streamed and not): head and rows.
/// TTFT, TPOT and ITL read "n/a" for requests that are not streamed.
pub fn class_rows(d: &ReportData) -> (Vec<String>, Vec<Vec<String>>) {
    let head: Vec<String> = [
        "configuration",
        "level",
        "class",
        "ok / sent",
        "TTFT p50 / p99 ms",
        "TPOT p50 / p99 ms",
        "ITL p50 / p99 ms",
        "E2EL p50 / p99 ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cell = |v: Option<&SummaryDoc>| -> String {
        let Some(v) = v else {
            return "n/a".into();
        };
        if v.count == 0 {
            return "none".into();
        }
        format!("{:.1} / {:.1}", v.median, v.get(99.0).unwrap_or(v.max))
    };
    // TTFAT's column only when some run reasoned.
    let ttfat = d
        .classes
        .iter()
        .any(|(_, _, c)| c.iter().any(|k| k.ttfat_ms.is_some()));
    let mut head = head;
    if ttfat {
        head.insert(5, "TTFAT p50 / p99 ms".into());
    }
    let mut rows = Vec::new();
    for (name, level, c) in &d.classes {
        for k in c {
            let mut row = vec![
                name.clone(),
                fmt_num(*level),
                format!(
                    "{} {}",
                    k.endpoint,
                    if k.stream { "streamed" } else { "not streamed" }
                ),
                format!("{} / {}", k.completed, k.requests),
                cell(k.ttft_ms.as_ref()),
                cell(k.tpot_ms.as_ref()),
                cell(k.itl_ms.as_ref()),
                cell(Some(&k.e2el_ms)),
            ];
            if ttfat {
                row.insert(5, cell(k.ttfat_ms.as_ref()));
            }
            rows.push(row);
        }
    }
    (head, rows)
}

/// The reasoning table: per run where some request reasoned, the time to first answer token
/// (after the reasoning) and the reasoning's tokens.
pub fn reasoning_rows(d: &ReportData) -> (Vec<String>, Vec<Vec<String>>) {
    let head: Vec<String> = [
        "configuration",
        "level",
        "requests in TTFAT",
        "TTFAT p50 / p99 ms",
        "reasoning tokens",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows = Vec::new();
    for (name, level, v) in &d.verdicts {
        let Some(t) = &v.ttfat_ms else { continue };
        rows.push(vec![
            name.clone(),
            fmt_num(*level),
            t.count.to_string(),
            format!("{:.1} / {:.1}", t.median, t.get(99.0).unwrap_or(t.max)),
            v.total_reasoning_tokens
                .map_or("–".into(), |n| n.to_string()),
        ]);
    }
    (head, rows)
}

/// The verdict table: per run, the load offered and served, how many requests TTFT covered,
/// and the verdicts (target overloaded, client saturated) — only the runs with something to
/// say, or every run when some are not streamed.
pub fn verdict_rows(d: &ReportData) -> (Vec<String>, Vec<Vec<String>>) {
    let head: Vec<String> = [
        "configuration",
        "level",
        "offered req/s",
        "steady req/s",
        "requests in TTFT",
        "verdict",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows = Vec::new();
    for (name, level, v) in &d.verdicts {
        let f = |x: Option<f64>, dp: usize| x.map_or("–".into(), |x| format!("{x:.dp$}"));
        let overload = v.served.overload.as_ref();
        let saturated = v
            .client
            .verdict
            .as_ref()
            .is_some_and(|x| x.client_saturated);
        let not_streamed = v.metric_requests.not_streamed;
        if overload.is_none() && !saturated && not_streamed == 0 {
            continue;
        }
        let mut verdict = Vec::new();
        if let Some(o) = overload {
            verdict.push(format!(
                "OVERLOADED from t≈{} s: {} req/s served over the schedule's second half, under 90% of the requests due then",
                f(Some(o.from_s), 1),
                f(Some(o.served_rps), 2),
            ));
        }
        if saturated {
            verdict.push("client saturated: not clean server figures".into());
        }
        if verdict.is_empty() {
            verdict.push("OK".into());
        }
        rows.push(vec![
            name.clone(),
            fmt_num(*level),
            f(v.served.offered_rps, 2),
            f(v.served.steady.as_ref().map(|s| s.request_throughput), 2),
            format!(
                "{} of {} ({not_streamed} not streamed)",
                v.metric_requests.ttft, v.metric_requests.e2el
            ),
            verdict.join("; "),
        ]);
    }
    (head, rows)
}

/// The drift table of the sliced runs: head and one row per (series, level) — first and last
/// slice and least-squares slope per hour of p95 TTFT, p95 TPOT and the completion rate.
pub fn drift_rows(d: &ReportData) -> (Vec<String>, Vec<Vec<String>>) {
    let head = [
        "configuration",
        "level",
        "slices",
        "p95 TTFT first → last (ms)",
        "p95 TTFT slope (ms/h)",
        "p95 TPOT first → last (ms)",
        "p95 TPOT slope (ms/h)",
        "completed/s first → last",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows = d
        .slices
        .iter()
        .map(|(name, level, v)| {
            let d = &v.drift;
            let fl = |t: Option<TrendDoc>| {
                t.map_or("–".into(), |t| format!("{:.1} → {:.1}", t.first, t.last))
            };
            let slope = |t: Option<TrendDoc>| {
                t.map_or("–".into(), |t| format!("{:+.1}", t.slope_per_hour))
            };
            vec![
                name.clone(),
                fmt_num(*level),
                format!("{} × {} s", v.slices.len(), fmt_num(v.slice_s)),
                fl(d.p95_ttft_ms),
                slope(d.p95_ttft_ms),
                fl(d.p95_tpot_ms),
                slope(d.p95_tpot_ms),
                fl(d.completed_per_s),
            ]
        })
        .collect();
    (head, rows)
}

/// The server-side view of one run: client TTFT mean, server TTFT mean, their gap, server
/// queue time mean (ms, one decimal; `–` when not measured).
pub fn server_cells(v: &ServerHistogramsDoc) -> [String; 4] {
    let mean = |k: &str| v.histograms.get(k).map(|h| h.mean);
    [
        v.client_ttft_mean_ms,
        mean("ttft_ms"),
        v.ttft_gap_ms,
        mean("queue_time_ms"),
    ]
    .map(|x| x.map_or("–".into(), |x| format!("{x:.1}")))
}

/// The answer first: three lines per configuration (capacity at the SLO, knee, replicas;
/// [`plan::answer_lines`]).
pub fn answer_lines(d: &ReportData) -> Vec<String> {
    d.series
        .iter()
        .zip(&d.answers)
        .flat_map(|(s, a)| {
            let p = d.plans.iter().find(|p| p.name == a.name);
            plan::answer_lines(a, &s.slos, p)
        })
        .collect()
}

/// The trace's arrivals in one sentence, named for what wrote it (a synthetic trace is never
/// called captured): span, mean and peak, and what they are to the plan.
pub fn trace_line(d: &ReportData, a: &ArrivalProfile) -> String {
    let name = a.trace_name();
    let mut name = name.to_string();
    if let Some(c) = name.get_mut(0..1) {
        c.make_ascii_uppercase();
    }
    let mut t = format!(
        "{name}: {} s, mean {:.2} req/s, peak {:.0} req/s (1 s buckets, production rows only); {}",
        a.counts.len(),
        a.mean_per_s,
        a.peak_per_s,
        trace_rate_role(d)
    );
    if replaced_arrivals(d) {
        t.push_str(
            "; its recorded arrivals were not replayed (the request-rate levels replaced them)",
        );
    }
    t.push('.');
    t
}

/// Whether every series set its own request rate, so no level replayed the trace's
/// recorded arrivals (its arrival plot would show a load no level offered).
pub fn replaced_arrivals(d: &ReportData) -> bool {
    !d.series.is_empty()
        && d.series
            .iter()
            .all(|s| s.axis == capacity::Axis::RequestRate)
}

/// What the captured trace's arrival rate is to the plan: the load it is sized for (no
/// `--target-qps`: the trace's peak), or not (the plan carries `--target-qps`; a sweep's
/// levels set their own rates).
pub fn trace_rate_role(d: &ReportData) -> String {
    let peak = d
        .plans
        .iter()
        .any(|p| p.target_source == plan::LoadSource::TracePeak);
    let qps = d
        .plans
        .iter()
        .find(|p| p.target_source == plan::LoadSource::TargetQps)
        .map(|p| p.target_qps);
    match (peak, qps) {
        (true, _) => "its peak is the load the capacity plan is sized for".into(),
        (false, Some(q)) => format!(
            "not the load the plan is sized for: the plan carries --target-qps {q:.2} req/s"
        ),
        (false, None) => "no capacity plan is sized on it".into(),
    }
}

/// Why these levels, read off the answer.
pub fn levels_why(s: &Series, a: &CapacityAnswer) -> String {
    let levels = s
        .points
        .iter()
        .map(|p| fmt_num(p.level))
        .collect::<Vec<_>>()
        .join(", ");
    let mut t = format!("{} levels: {levels}", s.axis.key());
    if let Some(r) = s.points.first().map(|p| p.runs) {
        let _ = write!(t, " ({r} run{} each)", if r == 1 { "" } else { "s" });
    }
    t.push_str(". ");
    match (a.max_ok_level, &a.first_break) {
        (Some(ok), Some(b)) => {
            let _ = write!(
                t,
                "They bracket the limit: {} meets the SLO and {} does not, so the capacity lies between them{}.",
                capacity::load_text(s.axis, ok, a.max_ok_offered_rps),
                capacity::load_text(s.axis, b.level, b.offered_rps),
                if b.level / ok.max(1e-9) > 1.5 {
                    "; a finer sweep between the two (`--refine N`) narrows it"
                } else {
                    ""
                }
            );
        }
        (Some(_), None) if !s.slos.is_empty() => t.push_str(
            "Every level meets the SLO: the limit lies above the highest level; extend the sweep upward.",
        ),
        (None, Some(_)) => t.push_str(
            "The lowest level already misses the SLO: extend the sweep downward (or relax the SLO).",
        ),
        _ => t.push_str("No SLO was given, so the levels only trace the latency and throughput curves."),
    }
    t
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// One row per level: figures with their spread when repeated.
pub fn level_rows(s: &Series) -> (Vec<String>, Vec<Vec<String>>) {
    let pl = percentile_label(s.slo_percentile);
    let mut head = vec![
        s.axis.short().to_string(),
        "runs".into(),
        "offered req/s".into(),
        "req/s".into(),
        "steady req/s".into(),
        "goodput req/s".into(),
        "output tok/s".into(),
    ];
    let mut pcts = vec![50.0, s.slo_percentile, 99.0];
    pcts.dedup();
    let mut keys = Vec::new();
    for (m, name) in [
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("itl", "ITL"),
        ("e2el", "E2EL"),
    ] {
        for p in &pcts {
            keys.push(capacity::pct_key(*p, m));
            head.push(format!("{name} p{} ms", percentile_label(*p)));
        }
    }
    head.push("failed by the server".into());
    head.push("the client's own".into());
    head.push("SLO".into());
    let _ = pl;
    let rows = s
        .points
        .iter()
        .map(|p| {
            let f = |k: &str, d: usize| match p.stat(k) {
                Some(st) => match st.std {
                    Some(sd) => format!("{:.d$} ± {:.d$}", st.mean, sd),
                    None => format!("{:.d$}", st.mean),
                },
                None => "–".into(),
            };
            let mut r = vec![
                fmt_num(p.level),
                p.runs.to_string(),
                f(capacity::OFFERED_KEY, 2),
                f("request_throughput", 2),
                f(capacity::STEADY_KEY, 2),
                f("request_goodput", 2),
                f("output_throughput", 1),
            ];
            for k in &keys {
                // p50 is stored as median_*_ms by vLLM and as p50_*_ms when asked for.
                let alt = k.replacen("p50_", "median_", 1);
                r.push(if p.stat(k).is_some() {
                    f(k, 1)
                } else {
                    f(&alt, 1)
                });
            }
            // The one failure count (console, verdict, compare, JSON `outcome_causes`).
            r.push(if p.causes.total() > 0 {
                format!(
                    "{} ({:.1}%)",
                    results::run_verdict::server_failed_text(&p.causes),
                    p.failed_fraction * 100.0
                )
            } else {
                p.stat(capacity::SERVER_FAILED_KEY)
                    .map_or("–".into(), crate::compare::count_text)
            });
            r.push(p.causes.excluded().to_string());
            r.push(if s.slos.is_empty() {
                "–".into()
            } else if capacity::check_level(p, &s.slos, s.slo_percentile).1 {
                "PASS".into()
            } else {
                "FAIL".into()
            });
            r
        })
        .collect();
    (head, rows)
}

/// The Markdown report.
pub fn markdown(d: &ReportData) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# {}\n", d.title);
    for p in partial_lines(d) {
        let _ = writeln!(o, "> **{p}**\n");
    }
    let _ = writeln!(o, "## The answer\n");
    for l in answer_lines(d) {
        let _ = writeln!(o, "- **{}**", md_escape(&l));
    }
    let _ = writeln!(o, "\n## The capacity answer\n");
    for a in &d.answers {
        let _ = writeln!(o, "- **{}**", a.sentence);
    }
    if let Some(a) = d.answers.first() {
        let _ = writeln!(o, "\n_{}_\n", capacity::rules_text(a.slo_percentile));
    }
    plan_md(&mut o, d);
    let _ = writeln!(o, "## Definitions\n\n{}", definitions_md());
    let _ = writeln!(o, "## How it was measured\n");
    let _ = writeln!(o, "Exact commands:\n\n```sh");
    for s in &d.series {
        for c in &s.commands {
            let _ = writeln!(o, "{c}");
        }
    }
    let _ = writeln!(o, "```\n");
    for (s, a) in d.series.iter().zip(&d.answers) {
        let _ = writeln!(o, "- **{}** — {}", md_escape(&s.name), levels_why(s, a));
        if !s.slos.is_empty() {
            let _ = writeln!(
                o,
                "  SLOs (`--goodput`): {}, judged at p{}.",
                s.slos
                    .iter()
                    .map(|x| format!("`{x}`"))
                    .collect::<Vec<_>>()
                    .join(" "),
                percentile_label(s.slo_percentile)
            );
        }
    }
    for n in &d.notes {
        let _ = writeln!(o, "- {n}");
    }
    if let Some(a) = &d.arrivals {
        let _ = writeln!(o, "- {}", trace_line(d, a));
    }
    o.push('\n');
    let _ = writeln!(o, "## Results per level\n");
    for s in &d.series {
        let _ = writeln!(o, "### {}\n", md_escape(&s.name));
        let (head, rows) = level_rows(s);
        let _ = writeln!(o, "| {} |", head.join(" | "));
        let _ = writeln!(o, "|{}|", vec!["---"; head.len()].join("|"));
        for r in rows {
            let _ = writeln!(o, "| {} |", r.join(" | "));
        }
        o.push('\n');
    }
    if !d.server.is_empty() {
        let _ = writeln!(
            o,
            "## Server-side view (the server's own histograms, before/after each run)\n"
        );
        let _ = writeln!(o, "A client TTFT far above the server's, growing with load, means the client (not the server) is saturated.\n");
        let _ = writeln!(o, "| configuration | level | client TTFT mean ms | server TTFT mean ms | gap ms | server queue time mean ms |\n|---|---|---|---|---|---|");
        for (n, l, v) in &d.server {
            let _ = writeln!(
                o,
                "| {} | {} | {} |",
                md_escape(n),
                fmt_num(*l),
                server_cells(v).join(" | ")
            );
        }
        o.push('\n');
    }
    for (title, (head, rows)) in [
        (
            "Validity (the client's own timing error against its budget)",
            crate::validity::validity_rows(&d.verdicts),
        ),
        (
            "Verdicts (load served, client, metric coverage)",
            verdict_rows(d),
        ),
        ("Latency by class of request", class_rows(d)),
        ("Reasoning (time to first answer token)", reasoning_rows(d)),
    ] {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(o, "## {title}\n");
        let _ = writeln!(o, "| {} |", head.join(" | "));
        let _ = writeln!(o, "|{}", "---|".repeat(head.len()));
        for r in rows {
            let cells: Vec<String> = r.iter().map(|c| md_escape(c)).collect();
            let _ = writeln!(o, "| {} |", cells.join(" | "));
        }
        o.push('\n');
    }
    if !d.slices.is_empty() {
        let _ = writeln!(o, "## Drift over the run (per time slice, `--slice`)\n");
        let (head, rows) = drift_rows(d);
        let _ = writeln!(o, "| {} |", head.join(" | "));
        let _ = writeln!(o, "|{}", "---|".repeat(head.len()));
        for r in rows {
            let _ = writeln!(o, "| {} |", r.join(" | "));
        }
        o.push('\n');
    }
    if let Some(c) = &d.comparison {
        let _ = writeln!(o, "## Comparison\n\n```text\n{c}```\n");
    }
    let _ = writeln!(o, "## Source files\n");
    for f in &d.files {
        let _ = writeln!(o, "- `{f}`");
    }
    if !d.command.is_empty() {
        let _ = writeln!(o, "\nReport written by: `{}`", d.command);
    }
    o
}

/// The capacity plan: replicas and cost per configuration, and its note.
fn plan_md(o: &mut String, d: &ReportData) {
    let _ = writeln!(o, "## Capacity plan\n");
    if !d.plans.is_empty() {
        let _ = writeln!(o, "| configuration | per replica within SLO (req/s) | target load (req/s) | source | replicas for the load | redundancy | replicas | utilisation at target | monthly cost |\n|---|---|---|---|---|---|---|---|---|");
        for p in &d.plans {
            let _ = writeln!(
                o,
                "| {} | {} | {:.2} | {} | {} | x{} | **{}** | {:.0}% | {} |",
                md_escape(&p.name),
                p.per_replica_cell(),
                p.target_qps,
                match p.target_source {
                    plan::LoadSource::TargetQps => "--target-qps",
                    plan::LoadSource::TracePeak => "capture's peak (1 s buckets)",
                },
                p.replicas_cell(p.replicas_for_load),
                p.redundancy,
                p.replicas_cell(p.replicas),
                p.utilization * 100.0,
                p.monthly_cost.map_or("–".into(), |m| format!(
                    "{m:.0} ({} h/month)",
                    plan::HOURS_PER_MONTH
                ))
            );
        }
        let _ = writeln!(o, "\nRedundancy R: R independent failure domains, each able to carry the whole target load alone (2 = survives losing one zone).\n");
        for p in &d.plans {
            let _ = writeln!(o, "- {}", p.sentence);
        }
        o.push('\n');
        let (head, rows) = plan::DemandPlan::table(&d.plans);
        if !rows.is_empty() {
            let _ = writeln!(
                o,
                "### Over the trace's own demand
"
            );
            let _ = writeln!(
                o,
                "| {} |\n|{}",
                head.join(" | "),
                "---|".repeat(head.len())
            );
            for r in rows {
                let cells: Vec<String> = r.iter().map(|c| md_escape(c)).collect();
                let _ = writeln!(o, "| {} |", cells.join(" | "));
            }
            let _ = writeln!(o, "\n{}\n", plan::DEMAND_RULE);
            for dp in d.plans.iter().filter_map(|p| p.demand.as_ref()) {
                let _ = writeln!(o, "- {}", dp.sentence);
            }
            o.push('\n');
        }
    }
    if let Some(n) = &d.plan_note {
        let _ = writeln!(o, "{n}\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_format::TraceRecord;

    /// `--results` rows feed the run's plots; past the exact cap the plot says it is an
    /// estimate, below it it does not.
    #[test]
    fn a_plot_past_the_exact_cap_says_it_is_estimated() {
        // Without its `--save-detailed` arrays: the plots come from the rows.
        let text = std::fs::read("../samples/sim-replay-300.json").unwrap();
        let mut doc: serde_json::Value = serde_json::from_slice(&text).unwrap();
        for k in ["ttfts", "itls", "input_lens", "output_lens", "errors"] {
            doc.as_object_mut().unwrap().remove(k);
        }
        let text = serde_json::to_vec(&doc).unwrap();
        let file = ResultFile::parse("sim-replay-300.json", &text).unwrap();
        let key = series::run_key(file.results()[0]).unwrap();
        let report = |rows: usize| {
            let mut samples = RunSamples::only([key.clone()]);
            let mut r = TraceRecord::new("x", 0, "/v1/completions");
            r.stream = true;
            r.target = Some(key.0.clone());
            r.run_id = Some(key.1.clone());
            r.output_tokens = Some(1);
            for i in 0..rows {
                r.ttft_us = Some(1_000 + (i % 50_000) as i64);
                samples.add(&r);
            }
            let d = build(
                std::slice::from_ref(&file),
                &BuildOptions {
                    samples,
                    ..Default::default()
                },
            );
            crate::html::render(&d)
        };
        let few = report(1_000);
        assert!(few.contains("TTFT distribution — sim"), "no TTFT plot");
        assert!(!few.contains("estimated"));
        let many = report(trace_format::quantiles::EXACT_CAP + 1);
        assert!(
            many.contains("TTFT distribution — sim (estimated: over 1048576 values, within 0.1%)"),
            "the plot of 2^20 + 1 values does not say it is estimated"
        );
    }
}
