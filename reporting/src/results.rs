//! Reading results back: a `--save-result` file is either one vLLM-style result or a sweep
//! document (`llmreplay_sweep` + `results`). Both become [`Series`] — one configuration
//! (target, label) across load levels — which `compare`, `report` and the sweep summary share.
//! Also the per-request samples behind the distribution plots (from `--save-detailed` arrays
//! or a `--results` Parquet file) and the trace's arrival rate.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use trace_format::{Outcome, TraceRecord};

use crate::capacity::{
    self, Axis, CapacityAnswer, CapacityPlan, LevelPoint, LoadSource, PlanInputs,
};
use crate::result_doc::ResultDoc;
pub use crate::sweep_doc::ArrivalProfile;
use crate::sweep_doc::{SweepFile, SweepSummary};
use replay::config::Slo;
use replay::error::ReplayError;

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

/// Arrivals per second of `records` (any order).
pub fn arrival_profile(records: &[TraceRecord]) -> ArrivalProfile {
    let Some(first) = records.iter().map(|r| r.arrival_time_us).min() else {
        return ArrivalProfile {
            bucket_s: 1.0,
            ..Default::default()
        };
    };
    let last = records
        .iter()
        .map(|r| r.arrival_time_us)
        .max()
        .unwrap_or(first);
    let n = ((last - first) / 1_000_000 + 1) as usize;
    let n = n.min(1_000_000);
    let mut counts = vec![0u32; n];
    for r in records {
        let i = (((r.arrival_time_us - first) / 1_000_000) as usize).min(n - 1);
        counts[i] += 1;
    }
    let peak = counts.iter().copied().max().unwrap_or(0);
    ArrivalProfile {
        bucket_s: 1.0,
        mean_per_s: records.len() as f64 / n as f64,
        peak_per_s: f64::from(peak),
        counts,
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
    capacity::plan(a, qps, src, p.redundancy, p.cost_per_hour)
}

/// Per-request latencies of one run, ms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    /// TTFT of completed requests.
    pub ttft: Vec<f64>,
    /// TPOT of completed requests with more than one output token.
    pub tpot: Vec<f64>,
    /// Pooled ITL.
    pub itl: Vec<f64>,
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
            s.ttft.push(t * 1e3);
        }
        let gaps: Vec<f64> = itls
            .get(i)
            .map(|a| a.iter().map(|g| g * 1e3).collect())
            .unwrap_or_default();
        if out > 1 && !gaps.is_empty() {
            s.tpot.push(gaps.iter().sum::<f64>() / (out - 1) as f64);
        }
        s.itl.extend(gaps);
    }
    Some(s)
}

/// Samples per (target, run id) from `--results` rows.
pub fn samples_of_records(records: &[TraceRecord]) -> BTreeMap<(String, String), Samples> {
    let mut out: BTreeMap<(String, String), Samples> = BTreeMap::new();
    for r in records.iter().filter(|r| r.outcome == Outcome::Ok) {
        let key = (
            r.target.clone().unwrap_or_default(),
            r.run_id.clone().unwrap_or_default(),
        );
        let s = out.entry(key).or_default();
        if let Some(t) = replay::metrics::ttft_ms(r) {
            s.ttft.push(t);
        }
        if let Some(t) = replay::metrics::tpot_ms(r) {
            s.tpot.push(t);
        }
        s.itl.extend(replay::metrics::itl_gaps_ms(r));
    }
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
        assert_eq!(s.ttft, vec![100.0]);
        assert_eq!(s.tpot, vec![20.0]);
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
}
