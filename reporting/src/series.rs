//! Reading results back: a `--save-result` file is either one vLLM-style result or a sweep
//! document (`llmreplay_sweep` + `results`). Both become [`Series`] — one configuration
//! (target, label) across load levels — which `compare`, `report` and the sweep summary share.
//! Also the per-request samples behind the distribution plots (from `--save-detailed` arrays
//! or `--results` Parquet rows, read as they stream: [`RunSamples`], bounded per run) and the
//! trace's arrival rate ([`arrival_profile_of`], counted second by second).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use trace_format::quantiles::Quantiles;
use trace_format::{Outcome, TraceRecord, TraceStream};

use crate::capacity::{self, Axis, CapacityAnswer, LevelPoint};
use crate::plan::{CapacityPlan, LoadSource, PlanInputs};
use replay::config::Slo;
use replay::error::ReplayError;
use results::doc::ResultDoc;
pub use results::sweep_doc::ArrivalProfile;
use results::sweep_doc::{SweepFile, SweepSummary};

/// A result file as read: one result, or a sweep.
#[derive(Debug, Clone)]
pub struct ResultFile {
    /// Where it came from.
    pub path: String,
    /// What it holds.
    pub content: ResultContent,
}

/// What a result file holds.
#[derive(Debug, Clone)]
pub enum ResultContent {
    /// One vLLM-style result (`replay --save-result`, `merge`).
    Single(Box<ResultDoc>),
    /// A sweep (`replay --sweep`/`--num-runs --save-result`).
    Sweep(Box<SweepFile>),
}

impl ResultFile {
    /// Reads a JSON result (single or sweep).
    pub fn read(path: &Path) -> Result<ResultFile, ReplayError> {
        let io = |e: std::io::Error| ReplayError::Io {
            path: path.display().to_string(),
            cause: e,
        };
        let text = std::fs::read(path).map_err(io)?;
        ResultFile::parse(&path.display().to_string(), &text)
    }

    /// Parses the bytes of a JSON result read from `path`.
    pub fn parse(path: &str, text: &[u8]) -> Result<ResultFile, ReplayError> {
        if text.starts_with(b"PAR1") {
            return Err(ReplayError::Config(format!(
                "{path}: a Parquet trace or per-request results file, not a JSON result: give the \
                 file `replay --save-result` wrote (report takes Parquet results with --results, \
                 a trace with --trace)"
            )));
        }
        let bad =
            |e: serde_json::Error| ReplayError::Config(format!("{path}: not a JSON result: {e}"));
        let doc: Value = serde_json::from_slice(text).map_err(bad)?;
        let content = if !doc.is_object() {
            None
        } else if doc.get("llmreplay_sweep").is_some() {
            Some(ResultContent::Sweep(Box::new(
                SweepFile::from_value(&doc).map_err(bad)?,
            )))
        } else if doc.get("request_throughput").is_some() {
            Some(ResultContent::Single(Box::new(
                ResultDoc::from_value(&doc).map_err(bad)?,
            )))
        } else {
            None
        };
        let Some(content) = content else {
            return Err(ReplayError::Config(format!(
                "{path}: neither a --save-result of llmreplay/vLLM nor a sweep result"
            )));
        };
        Ok(ResultFile {
            path: path.to_string(),
            content,
        })
    }

    /// The vLLM-style results inside (one for a single result, every level run for a sweep).
    pub fn results(&self) -> Vec<&ResultDoc> {
        match &self.content {
            ResultContent::Single(d) => vec![d],
            ResultContent::Sweep(s) => s.results.iter().collect(),
        }
    }

    /// The sweep summary, when this is a sweep.
    pub fn sweep(&self) -> Option<&SweepSummary> {
        match &self.content {
            ResultContent::Sweep(s) => Some(&s.summary),
            ResultContent::Single(_) => None,
        }
    }
}

/// One configuration across load levels.
#[derive(Debug, Clone)]
pub struct Series {
    /// Target name (with `--label` when given).
    pub name: String,
    /// The axis.
    pub axis: Axis,
    /// SLOs of the runs.
    pub slos: Vec<Slo>,
    /// The percentile SLOs are judged at.
    pub slo_percentile: f64,
    /// Levels, ascending.
    pub points: Vec<LevelPoint>,
    /// (level, result) of every run.
    pub runs: Vec<(f64, ResultDoc)>,
    /// Exact commands of the runs (deduplicated).
    pub commands: Vec<String>,
}

impl Series {
    /// The capacity answer of this series.
    pub fn answer(&self) -> CapacityAnswer {
        capacity::answer(
            &self.name,
            self.axis,
            &self.points,
            &self.slos,
            self.slo_percentile,
        )
    }
}

/// The name a result is grouped under: its target, with its label.
pub fn config_name(r: &ResultDoc) -> String {
    let target = match r.llmreplay.as_ref().map(|o| o.target.name.as_str()) {
        Some(n) => n,
        None if !r.vllm.model_id.is_empty() => &r.vllm.model_id,
        None => "result",
    };
    match r.vllm.label.as_deref() {
        Some(l) if !l.is_empty() && l != target => format!("{target} [{l}]"),
        _ => target.to_string(),
    }
}

/// The setting of `axis` a result was run with (`max_concurrency`, `request_rate`, speedup).
pub fn axis_value(r: &ResultDoc, axis: Axis) -> Option<f64> {
    match axis {
        Axis::MaxConcurrency => r.vllm.max_concurrency.map(|c| c as f64),
        Axis::RequestRate => r.vllm.request_rate.as_f64(),
        Axis::Speedup => r.llmreplay.as_ref()?.trace.speedup,
    }
}

/// The level and axis of one result: its sweep mark, else what it was run with.
fn place(r: &ResultDoc, axis: Option<Axis>) -> (Axis, f64) {
    if let Some(sw) = r.llmreplay.as_ref().and_then(|o| o.sweep.as_ref()) {
        if let Some(a) = Axis::from_key(&sw.axis) {
            return (a, sw.level);
        }
    }
    let order = match axis {
        Some(a) => vec![a],
        None => vec![Axis::MaxConcurrency, Axis::RequestRate, Axis::Speedup],
    };
    for a in order {
        if let Some(v) = axis_value(r, a) {
            return (a, v);
        }
    }
    (axis.unwrap_or(Axis::RequestRate), 0.0)
}

/// Groups results into series (first-seen order), inferring each one's axis: a sweep mark, or
/// the setting that varies between its results (max_concurrency, request_rate, speedup).
pub fn series_of(results: &[ResultDoc], axis: Option<Axis>, pct: f64) -> Vec<Series> {
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, Vec<&ResultDoc>> = BTreeMap::new();
    for r in results {
        let n = config_name(r);
        if !groups.contains_key(&n) {
            order.push(n.clone());
        }
        groups.entry(n).or_default().push(r);
    }
    order
        .into_iter()
        .map(|name| {
            let rs = &groups[&name];
            // Which axis varies across these results?
            let axis = axis.or_else(|| {
                if rs
                    .iter()
                    .any(|r| r.llmreplay.as_ref().is_some_and(|o| o.sweep.is_some()))
                {
                    return None;
                }
                [Axis::MaxConcurrency, Axis::RequestRate, Axis::Speedup]
                    .into_iter()
                    .find(|a| {
                        let mut vs: Vec<u64> = rs
                            .iter()
                            .filter_map(|r| axis_value(r, *a).map(f64::to_bits))
                            .collect();
                        vs.sort_unstable();
                        vs.dedup();
                        vs.len() > 1
                    })
            });
            let mut by_level: Vec<(f64, Vec<&ResultDoc>)> = Vec::new();
            let mut found_axis = axis;
            let mut runs = Vec::new();
            for r in rs {
                let (a, l) = place(r, axis);
                found_axis.get_or_insert(a);
                runs.push((l, (*r).clone()));
                match by_level
                    .iter_mut()
                    .find(|(x, _)| x.to_bits() == l.to_bits())
                {
                    Some((_, v)) => v.push(r),
                    None => by_level.push((l, vec![r])),
                }
            }
            by_level.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut commands: Vec<String> = Vec::new();
            for r in rs {
                if let Some(c) = r.llmreplay.as_ref().map(|o| o.command.as_str()) {
                    if !commands.iter().any(|x| x == c) {
                        commands.push(c.to_string());
                    }
                }
            }
            Series {
                name,
                axis: found_axis.unwrap_or(Axis::RequestRate),
                slos: capacity::slos_of(rs[0]),
                slo_percentile: pct,
                points: by_level
                    .iter()
                    .map(|(l, v)| LevelPoint::from_results(*l, v))
                    .collect(),
                runs,
                commands,
            }
        })
        .collect()
}

/// Every series in `files` (sweep files use their recorded percentile unless `pct` is given).
pub fn series_of_files(files: &[ResultFile], pct: Option<f64>) -> Vec<Series> {
    let mut out = Vec::new();
    let mut singles: Vec<ResultDoc> = Vec::new();
    for f in files {
        match &f.content {
            ResultContent::Sweep(sw) => {
                let p = pct.or(sw.summary.slo_percentile).unwrap_or(95.0);
                let axis = Axis::from_key(&sw.summary.axis);
                out.extend(series_of(&sw.results, axis, p));
            }
            ResultContent::Single(d) => singles.push((**d).clone()),
        }
    }
    if !singles.is_empty() {
        out.extend(series_of(&singles, None, pct.unwrap_or(95.0)));
    }
    // Two files of the same configuration name stay apart: suffix repeats.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for s in &mut out {
        let n = seen.entry(s.name.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            s.name = format!("{} #{}", s.name, n);
        }
    }
    out
}

/// What wrote a trace's files (their producer when they agree), for [`ArrivalProfile::producer`].
pub fn producer_of(files: &[trace_format::TraceFile]) -> Option<String> {
    let first = files.first()?.meta.producer;
    files
        .iter()
        .all(|f| f.meta.producer == first)
        .then(|| first.as_str().to_string())
}

/// Production's arrivals per second of `records` (any order; shadow rows left out).
pub fn arrival_profile(records: &[TraceRecord]) -> ArrivalProfile {
    let first = records
        .iter()
        .filter(|r| r.pair_request_id.is_none())
        .map(|r| r.arrival_time_us)
        .min();
    let mut counts = ArrivalCounts::new(first);
    records.iter().for_each(|r| counts.add_record(r));
    counts.finish()
}

/// Production's arrivals per second of a streamed trace ([`TraceStream`]: one pass over its
/// rows, in arrival order): the profile [`arrival_profile`] gives of the same rows, holding
/// the per-second counts only (at most [`ARRIVAL_BUCKETS`], 4 MiB).
pub fn arrival_profile_of(stream: &TraceStream) -> Result<ArrivalProfile, trace_format::Error> {
    let mut counts = ArrivalCounts::new(None);
    for r in stream.records() {
        counts.add_record(&r?);
    }
    Ok(counts.finish())
}

/// Most one-second buckets of an [`ArrivalProfile`] (11.6 days); later arrivals count in the
/// last.
pub const ARRIVAL_BUCKETS: usize = 1_000_000;

/// An arrival profile counted one production arrival at a time: shadow rows (a `capture
/// --shadow` candidate's answers, with `pair_request_id`) are no load anyone sends, so they
/// are never counted ([`ArrivalCounts::add_record`]), and the span runs from the first to the
/// last production arrival.
#[derive(Debug, Clone, Default)]
pub struct ArrivalCounts {
    /// The first arrival, µs since the epoch (None until the first row when not known in
    /// advance: rows then come in arrival order).
    first_us: Option<i64>,
    counts: Vec<u32>,
    rows: usize,
    output_tokens: u64,
}

impl ArrivalCounts {
    /// Counts for arrivals from `first_us` on (None: the first arrival added, for rows added
    /// in arrival order).
    pub fn new(first_us: Option<i64>) -> ArrivalCounts {
        ArrivalCounts {
            first_us,
            ..Default::default()
        }
    }

    /// Counts one arrival (earlier than the first counts in the first second; later than
    /// [`ARRIVAL_BUCKETS`] seconds in the last).
    pub fn add(&mut self, at_us: i64) {
        let first = *self.first_us.get_or_insert(at_us);
        let i =
            ((at_us.saturating_sub(first).max(0) / 1_000_000) as usize).min(ARRIVAL_BUCKETS - 1);
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        self.rows += 1;
    }

    /// Counts a trace row's arrival when it is production's (a shadow row is left out).
    pub fn add_record(&mut self, r: &TraceRecord) {
        if r.pair_request_id.is_none() {
            self.add(r.arrival_time_us);
            self.output_tokens += r.output_tokens.map_or(0, |t| t.max(0) as u64);
        }
    }

    /// The profile.
    pub fn finish(self) -> ArrivalProfile {
        if self.counts.is_empty() {
            return ArrivalProfile {
                bucket_s: 1.0,
                ..Default::default()
            };
        }
        let peak = self.counts.iter().copied().max().unwrap_or(0);
        ArrivalProfile {
            bucket_s: 1.0,
            mean_per_s: self.rows as f64 / self.counts.len() as f64,
            peak_per_s: f64::from(peak),
            counts: self.counts,
            producer: None,
            output_tokens: self.output_tokens,
        }
    }
}

/// The capacity plan of an answer for the given inputs (target load: `--target-qps`, else the
/// trace's peak arrival rate).
pub fn plan_for(
    a: &CapacityAnswer,
    arrivals: &ArrivalProfile,
    p: PlanInputs,
) -> Option<CapacityPlan> {
    let (qps, src) = match p.target_qps {
        Some(q) => (q, LoadSource::TargetQps),
        None => (arrivals.peak_per_s, LoadSource::TracePeak),
    };
    let mut plan = crate::plan::plan(a, qps, src, p.redundancy, p.cost_per_hour)?;
    plan.demand = crate::plan::demand_plan(&plan, arrivals, p.window_s);
    Some(plan)
}

/// Per-request latencies of one run, ms, in bounded memory: each a [`Quantiles`] sample,
/// every value while there are at most [`EXACT_CAP`](trace_format::quantiles::EXACT_CAP),
/// then a histogram within [`RELATIVE_ERROR`](trace_format::quantiles::RELATIVE_ERROR) (the
/// mechanism of the run's own percentiles); [`Samples::is_estimate`] says which.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// TTFT of completed requests.
    pub ttft: Quantiles,
    /// TPOT of completed requests with more than one output token.
    pub tpot: Quantiles,
    /// Pooled ITL.
    pub itl: Quantiles,
}

impl Samples {
    /// Adds a `--results` row (completed requests only).
    pub fn add_record(&mut self, r: &TraceRecord) {
        if r.outcome != Outcome::Ok {
            return;
        }
        if let Some(t) = replay::metrics::ttft_ms(r) {
            self.ttft.add(t);
        }
        if let Some(t) = replay::metrics::tpot_ms(r) {
            self.tpot.add(t);
        }
        replay::metrics::itl_gaps_ms(r).for_each(|g| self.itl.add(g));
    }

    /// The sample of `metric`: `ttft`, `tpot`, else ITL.
    pub fn of(&self, metric: &str) -> &Quantiles {
        match metric {
            "ttft" => &self.ttft,
            "tpot" => &self.tpot,
            _ => &self.itl,
        }
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Samples) {
        self.ttft.merge(&other.ttft);
        self.tpot.merge(&other.tpot);
        self.itl.merge(&other.itl);
    }

    /// Whether any of the three passed the exact cap (its plot is then drawn from the
    /// histogram, within 0.1%, not from every value).
    pub fn is_estimate(&self) -> bool {
        !(self.ttft.is_exact() && self.tpot.is_exact() && self.itl.is_exact())
    }
}

/// Samples from a result's `--save-detailed` arrays (None without them). TPOT is
/// Σ ITL / (output_lens − 1): E2EL − TTFT is the sum of a stream's chunk gaps.
pub fn samples_of_result(r: &ResultDoc) -> Option<Samples> {
    let ttfts = r.vllm.ttfts.as_ref()?;
    let itls = r.vllm.itls.as_ref()?;
    let outs = r.vllm.output_lens.as_ref()?;
    let errors = r.vllm.errors.as_ref();
    let mut s = Samples::default();
    for (i, t) in ttfts.iter().enumerate() {
        let failed = errors.and_then(|e| e.get(i)).is_some_and(|e| !e.is_empty());
        let out = outs.get(i).copied().unwrap_or(0);
        if failed || out == 0 {
            continue;
        }
        // 0 is vLLM's "no TTFT": a request that was not streamed has no first token.
        if *t > 0.0 {
            s.ttft.add(t * 1e3);
        }
        let gaps: Vec<f64> = itls
            .get(i)
            .map(|a| a.iter().map(|g| g * 1e3).collect())
            .unwrap_or_default();
        if out > 1 && !gaps.is_empty() {
            s.tpot.add(gaps.iter().sum::<f64>() / (out - 1) as f64);
        }
        gaps.into_iter().for_each(|g| s.itl.add(g));
    }
    Some(s)
}

/// (target, run id): the run a `--results` row belongs to.
pub type RunKey = (String, String);

/// The run of a result document (its target and run id), None without `llmreplay`.
pub fn run_key(r: &ResultDoc) -> Option<RunKey> {
    let o = r.llmreplay.as_ref()?;
    Some((o.target.name.clone(), o.run_id.clone()))
}

/// Samples per run ([`RunKey`]) from `--results` rows added one at a time, in any order:
/// memory bounded by the runs (three [`Quantiles`], at most 24 MiB, each), not the rows. With
/// [`RunSamples::only`], rows of other runs are skipped.
#[derive(Debug, Clone, Default)]
pub struct RunSamples {
    by_run: BTreeMap<RunKey, Samples>,
    only: Option<std::collections::BTreeSet<RunKey>>,
}

impl RunSamples {
    /// Samples of the runs `keys` only (the runs a report's result files name).
    pub fn only(keys: impl IntoIterator<Item = RunKey>) -> RunSamples {
        RunSamples {
            by_run: BTreeMap::new(),
            only: Some(keys.into_iter().collect()),
        }
    }

    /// Adds one row.
    pub fn add(&mut self, r: &TraceRecord) {
        if r.outcome != Outcome::Ok {
            return;
        }
        let key = (
            r.target.clone().unwrap_or_default(),
            r.run_id.clone().unwrap_or_default(),
        );
        if self.only.as_ref().is_some_and(|k| !k.contains(&key)) {
            return;
        }
        self.by_run.entry(key).or_default().add_record(r);
    }

    /// Every row of a streamed `--results` input (arrival order).
    pub fn read(&mut self, stream: &TraceStream) -> Result<(), trace_format::Error> {
        for r in stream.records() {
            self.add(&r?);
        }
        Ok(())
    }

    /// The samples of one run.
    pub fn get(&self, key: &RunKey) -> Option<&Samples> {
        self.by_run.get(key)
    }
}

/// Samples per (target, run id) from `--results` rows.
pub fn samples_of_records(records: &[TraceRecord]) -> RunSamples {
    let mut out = RunSamples::default();
    records.iter().for_each(|r| out.add(r));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn res(target: &str, conc: u64, thr: f64) -> ResultDoc {
        let v = json!({"request_throughput": thr, "max_concurrency": conc, "num_prompts": 10, "failed": 0,
               "request_rate": "inf",
               "llmreplay": {"target": {"name": target}, "goodput_slos": {"ttft": 500.0}, "command": "llmreplay replay x"}});
        ResultDoc::from_value(&v).unwrap()
    }

    #[test]
    fn a_parquet_file_is_named_as_such_not_as_bad_json() {
        let dir = std::env::temp_dir().join(format!("llmreplay-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.parquet");
        std::fs::write(&p, b"PAR1\x15\x04rest of a parquet file").unwrap();
        let e = ResultFile::read(&p).unwrap_err().to_string();
        assert!(
            e.contains("a Parquet trace or per-request results file"),
            "{e}"
        );
        assert!(
            e.contains("--save-result") && e.contains("--results"),
            "{e}"
        );
        let j = dir.join("r.json");
        std::fs::write(&j, b"{bad").unwrap();
        let e = ResultFile::read(&j).unwrap_err().to_string();
        assert!(e.contains("not a JSON result"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn single_results_group_by_target_and_infer_the_axis() {
        let rs = vec![res("a", 1, 1.0), res("a", 8, 6.0), res("b", 1, 0.9)];
        let s = series_of(&rs, None, 95.0);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].name.as_str(), s[0].axis, s[0].points.len()),
            ("a", Axis::MaxConcurrency, 2)
        );
        assert_eq!(s[0].slos.len(), 1);
        assert_eq!(s[0].commands, vec!["llmreplay replay x".to_string()]);
    }

    #[test]
    fn detailed_arrays_give_tpot_from_the_gaps() {
        // The third request completed without streaming: TTFT 0, no gaps, no TTFT sample.
        let r = json!({"ttfts": [0.1, 0.0, 0.0], "itls": [[0.01, 0.03], [], []], "output_lens": [3, 0, 40], "errors": ["", "boom", ""]});
        let s = samples_of_result(&ResultDoc::from_value(&r).unwrap()).unwrap();
        assert_eq!(s.ttft.exact_values(), Some(&[100.0][..]));
        assert_eq!(s.tpot.exact_values(), Some(&[20.0][..]));
        assert_eq!(s.itl.len(), 2);
    }

    #[test]
    fn arrival_profile_buckets_per_second() {
        let recs: Vec<TraceRecord> = [0, 100_000, 1_500_000, 3_900_000]
            .iter()
            .map(|t| TraceRecord::new("r", *t, "/v1/completions"))
            .collect();
        let a = arrival_profile(&recs);
        assert_eq!(a.counts, vec![2, 1, 0, 1]);
        assert_eq!(a.peak_per_s, 2.0);
    }

    /// Issue 53: with `capture --shadow` on, the report and the sweep sized the plan for
    /// production plus every candidate's mirror (peak 8 req/s where production sent 4). A
    /// shadow capture's arrivals, and so its plan, are those of the same capture without
    /// its shadow rows, read whole or streamed.
    #[test]
    fn a_shadow_captures_plan_equals_the_same_captures_plan_without_shadow() {
        let production: Vec<TraceRecord> = (0..40i64)
            .map(|i| {
                // 4 in the first second of every 2, for 20 s.
                let at = (i / 4) * 2_000_000 + (i % 4) * 200_000;
                TraceRecord::new(format!("p{i}"), at, "/v1/completions")
            })
            .collect();
        let mut with_shadow = production.clone();
        for p in &production {
            // The mirror answers a few ms after production, one row per candidate.
            for (k, cand) in ["a", "b"].iter().enumerate() {
                let mut s = TraceRecord::new(
                    format!("{}-{cand}", p.request_id),
                    p.arrival_time_us + 3_000 + k as i64,
                    "/v1/completions",
                );
                s.pair_request_id = Some(p.request_id.clone());
                s.target = Some(cand.to_string());
                with_shadow.push(s);
            }
        }
        with_shadow.sort_by_key(|r| r.arrival_time_us);
        let (a, b) = (arrival_profile(&production), arrival_profile(&with_shadow));
        assert_eq!((b.peak_per_s, b.counts.len()), (4.0, 19));
        assert_eq!(a, b);
        let v = serde_json::json!({"num_prompts": 10, "failed": 0, "request_throughput": 1.5,
            "request_goodput": 1.5, "p95_ttft_ms": 50.0, "llmreplay": {"served": {"offered_rps": 1.5}}});
        let pt = LevelPoint::from_results(1.0, &[&ResultDoc::from_value(&v).unwrap()]);
        let slos = vec!["ttft:500".parse().unwrap()];
        let ans = capacity::answer("cand", Axis::Speedup, &[pt], &slos, 95.0);
        let inputs = PlanInputs::default();
        let plan = plan_for(&ans, &b, inputs).unwrap();
        assert_eq!(Some(&plan), plan_for(&ans, &a, inputs).as_ref());
        assert_eq!((plan.target_qps, plan.replicas_for_load), (4.0, 3));
        // Streamed from a file (report --trace), the same.
        let dir =
            std::env::temp_dir().join(format!("llmreplay-shadow-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("cap.parquet");
        let meta = trace_format::FileMeta::new(trace_format::Producer::Capture, "t");
        trace_format::write_trace_file(&p, &with_shadow, &meta).unwrap();
        let stream = TraceStream::open(&[p.to_str().unwrap()]).unwrap();
        assert_eq!(arrival_profile_of(&stream).unwrap(), a);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A streamed trace's profile is the whole trace's, over files that overlap in time.
    #[test]
    fn a_streamed_arrival_profile_is_the_whole_traces() {
        let dir = std::env::temp_dir().join(format!("llmreplay-arrivals-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let meta = trace_format::FileMeta::new(trace_format::Producer::Synth, "t");
        let paths: Vec<String> = (0..3i64)
            .map(|k| {
                let recs: Vec<TraceRecord> = (0..500i64)
                    .map(|i| {
                        TraceRecord::new(
                            format!("{k}-{i}"),
                            k * 700_000 + i * (i % 13) * 9_000,
                            "/v1/completions",
                        )
                    })
                    .collect();
                let p = dir.join(format!("t{k}.parquet"));
                trace_format::write_trace_file(&p, &recs, &meta).unwrap();
                p.display().to_string()
            })
            .collect();
        let whole = trace_format::read_traces(&paths).unwrap();
        let stream = TraceStream::open(&paths).unwrap();
        let a = arrival_profile_of(&stream).unwrap();
        let b = arrival_profile(&whole.records);
        assert_eq!(
            (a.counts.len(), a.peak_per_s, a.mean_per_s),
            (b.counts.len(), b.peak_per_s, b.mean_per_s)
        );
        assert_eq!(a.counts, b.counts);
        assert_eq!(a.counts.iter().map(|c| *c as usize).sum::<usize>(), 1_500);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `--results` rows of runs no result file names are not kept; the others are, per run.
    #[test]
    fn run_samples_keep_the_runs_asked_for() {
        let row = |run: &str, ttft: i64| {
            let mut r = TraceRecord::new("x", 0, "/v1/completions");
            r.stream = true;
            r.run_id = Some(run.into());
            r.target = Some("sim".into());
            r.ttft_us = Some(ttft);
            r.chunk_times_us = vec![ttft, ttft + 2_000];
            r.e2el_us = Some(ttft + 2_000);
            r.output_tokens = Some(2);
            r
        };
        let key = |run: &str| ("sim".to_string(), run.to_string());
        let mut s = RunSamples::only([key("a")]);
        for t in [1_000, 2_000, 3_000] {
            s.add(&row("a", t));
            s.add(&row("b", t));
        }
        let a = s.get(&key("a")).unwrap();
        assert_eq!(a.ttft.exact_values(), Some(&[1.0, 2.0, 3.0][..]));
        assert_eq!(a.itl.exact_values(), Some(&[2.0, 2.0, 2.0][..]));
        assert!(!a.is_estimate());
        assert!(s.get(&key("b")).is_none());
        let all = samples_of_records(&[row("b", 5_000)]);
        assert_eq!(all.get(&key("b")).map(|b| b.ttft.len()), Some(1));
    }
}
