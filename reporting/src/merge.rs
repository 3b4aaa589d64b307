//! Merging shard runs (`replay --shard K/N`, each with `--results`) into one result: every
//! row in one Parquet file and one [`ResultDoc`] with every metric computed over all rows at
//! once (exact percentiles, never an average of per-shard percentiles). The shards' run
//! settings (request rate, burstiness, concurrency, arrivals, selection, seeds) come from
//! their files ([`RunSettings`], under [`RunSettings::META_KEY`]); the checks say when the
//! inputs are not the shards of one run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use trace_format::{FileMeta, Producer, Trace, TraceRecord};

use crate::result_doc::{InterruptedDoc, MergeDoc, ResultDoc, RunSettings, ShardRun};
use replay::config::{PercentileMetric, ReplayConfig, Slo, Target};
use replay::error::ReplayError;

fn fail(message: String) -> ReplayError {
    ReplayError::Config(message)
}

/// The wall-clock start of the run a result row belongs to, µs since the epoch: its send
/// time minus its scheduled offset, dispatch lag, client queue and connect time (exactly
/// what the run added to the start to get the send time, up to µs rounding).
pub fn row_run_start_us(r: &TraceRecord) -> Option<i64> {
    Some(
        r.arrival_time_us
            - r.scheduled_offset_us?
            - r.dispatch_lag_us.unwrap_or(0)
            - r.queue_us.unwrap_or(0)
            - r.connect_us.unwrap_or(0),
    )
}

/// The merged run's start: the earliest row start (shards started with one `--start-at`
/// agree to the µs); the earliest arrival for rows without a schedule.
pub fn merged_start_us(records: &[TraceRecord]) -> Option<i64> {
    records
        .iter()
        .map(|r| row_run_start_us(r).unwrap_or(r.arrival_time_us))
        .min()
}

/// Checks that the inputs are shards of one sharded run of one trace, as a directory holding
/// an older run's results beside this one's would not be: their request ids would repeat,
/// and the merged duration and rates would span both runs. Errors name the runs and files to
/// choose from; the notes returned say what is merely incomplete (shards missing).
pub fn check_shards(
    files: &[trace_format::TraceFile],
    records: &[TraceRecord],
) -> Result<Vec<String>, ReplayError> {
    if let Some(f) = files.iter().find(|f| f.meta.producer != Producer::Replay) {
        return Err(fail(format!(
            "{} is not a replay result (written by `llmreplay {}`): merge takes the \
             `--results` files of replay runs",
            f.path.display(),
            f.meta.producer.as_str()
        )));
    }
    let hashes: BTreeSet<&String> = files
        .iter()
        .filter_map(|f| f.meta.extra.get("trace_content_hash"))
        .collect();
    if hashes.len() > 1 {
        let per_file: String = files
            .iter()
            .map(|f| {
                format!(
                    "\n  {}: trace {}",
                    f.path.display(),
                    f.meta
                        .extra
                        .get("trace_content_hash")
                        .map_or("?", |h| h.as_str())
                )
            })
            .collect();
        return Err(fail(format!(
            "the inputs replayed different traces; merge the shards of one trace{per_file}"
        )));
    }
    let mut shards: BTreeMap<(u32, u32), Vec<String>> = BTreeMap::new();
    for f in files {
        if let Some(label) = f.meta.extra.get("shard") {
            let sh: replay::config::Shard = label
                .parse()
                .map_err(|e| fail(format!("{}: shard {label:?}: {e}", f.path.display())))?;
            shards
                .entry((sh.count, sh.index))
                .or_default()
                .push(f.path.display().to_string());
        }
    }
    let counts: BTreeSet<u32> = shards.keys().map(|(n, _)| *n).collect();
    if counts.len() > 1 {
        return Err(fail(format!(
            "the inputs come from different splits of the trace ({}): give the shards of one \
             `--shard K/N` run",
            shards
                .iter()
                .map(|((n, k), f)| format!("{k}/{n} in {}", f.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    if let Some(((n, k), f)) = shards.iter().find(|(_, f)| f.len() > 1) {
        return Err(fail(format!(
            "shard {k}/{n} is in more than one input ({}): give one result file per shard",
            f.join(", ")
        )));
    }
    // Per run: rows, earliest send, and which request ids it holds.
    let mut runs: BTreeMap<&str, (usize, i64)> = BTreeMap::new();
    let mut first_run: std::collections::HashMap<&str, &str> = Default::default();
    let mut repeated = 0usize;
    for r in records {
        let run = r.run_id.as_deref().unwrap_or("(no run id)");
        let e = runs.entry(run).or_insert((0, i64::MAX));
        e.0 += 1;
        e.1 = e.1.min(r.arrival_time_us);
        match first_run.insert(r.request_id.as_str(), run) {
            Some(other) if other != run => repeated += 1,
            _ => {}
        }
    }
    let describe = || {
        runs.iter()
            .map(|(id, (n, t0))| {
                let at = trace_format::inspect::rfc3339(*t0);
                format!("\n  run {id}: {n} rows, first send {at}")
            })
            .collect::<String>()
    };
    if repeated > 0 {
        return Err(fail(format!(
            "{repeated} request ids appear in more than one run, but the shards of one trace are \
             disjoint: these inputs hold more than one replay of the same requests (an older \
             run's results in the same directory?). Give the files of one sharded run.{}",
            describe()
        )));
    }
    let mut notes = Vec::new();
    if let Some(&n) = counts.iter().next() {
        let missing: Vec<String> = (0..n)
            .filter(|k| !shards.contains_key(&(n, *k)))
            .map(|k| format!("{k}/{n}"))
            .collect();
        if !missing.is_empty() {
            notes.push(format!(
                "merging {} of {n} shards; missing: {} (the figures cover only the shards given)",
                n as usize - missing.len(),
                missing.join(", ")
            ));
        }
    }
    Ok(notes)
}

/// What a merge computes beyond the rows: the flags of `llmreplay merge`.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// Latency SLOs for goodput.
    pub goodput: Vec<Slo>,
    /// Metrics that get percentiles.
    pub percentile_metrics: Vec<PercentileMetric>,
    /// Percentiles to report.
    pub metric_percentiles: Vec<f64>,
}

/// A merged run: every row, its result, the Parquet metadata to write the rows with.
#[derive(Debug, Clone)]
pub struct Merged {
    /// Every row of every shard.
    pub records: Vec<TraceRecord>,
    /// The merged result.
    pub doc: ResultDoc,
    /// Metadata of the merged Parquet file.
    pub meta: FileMeta,
    /// What is merely incomplete or approximate (shards missing, settings that differ).
    pub notes: Vec<String>,
    /// Shard runs merged.
    pub runs: usize,
    /// p99 TTFT over all rows, ms.
    pub p99_ttft_ms: Option<f64>,
    /// Whether any shard's client fell behind.
    pub worst_lag_too_high: bool,
}

/// Merges the `--results` of the shards of one run (`trace`: as read from the inputs).
pub fn merge(mut trace: Trace, o: &MergeOptions, command: &str) -> Result<Merged, ReplayError> {
    // The identity of the replayed trace when the shards agree on it, else of these rows.
    let rows_identity = crate::report::trace_identity(&trace);
    let records = std::mem::take(&mut trace.records);
    if records.is_empty() {
        return Err(fail("the inputs have no rows".into()));
    }
    let targets: BTreeSet<&str> = records.iter().filter_map(|r| r.target.as_deref()).collect();
    if targets.len() > 1 {
        return Err(fail(format!(
            "the inputs replayed several targets ({}); merge the shards of one target at a time",
            targets.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    let target_name = targets.into_iter().next().unwrap_or("unknown").to_string();
    let mut ids = BTreeSet::new();
    let dups = records
        .iter()
        .filter(|r| !ids.insert((r.run_id.as_deref(), r.request_id.as_str())))
        .count();
    if dups > 0 {
        return Err(fail(format!(
            "{dups} rows appear twice in the inputs (the same result file given twice?)"
        )));
    }
    let mut notes = check_shards(&trace.files, &records)?;
    let start_us = merged_start_us(&records).unwrap_or(0);

    let metrics = replay::metrics::compute(&records, start_us, &o.goodput, &o.metric_percentiles);

    // Provenance common to every input (target URL and models, trace hash, label).
    let metas: Vec<&FileMeta> = trace.files.iter().map(|f| &f.meta).collect();
    let common = |k: &str| -> Option<String> {
        let vals: BTreeSet<Option<&String>> = metas.iter().map(|m| m.extra.get(k)).collect();
        match vals.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(v)] => Some((*v).clone()),
            _ => None,
        }
    };
    // One URL when the shards agree (one service); otherwise each shard's, comma-separated.
    let url = {
        let urls: BTreeSet<&String> = metas
            .iter()
            .filter_map(|m| m.extra.get(&format!("target.{target_name}.url")))
            .collect();
        let joined = urls.into_iter().cloned().collect::<Vec<_>>().join(",");
        if joined.is_empty() {
            "unknown".to_string()
        } else {
            joined
        }
    };
    let models: Vec<String> = common(&format!("target.{target_name}.models"))
        .map(|m| {
            m.split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let mut cfg = ReplayConfig::new(vec![Target {
        name: target_name.clone(),
        url: url.clone(),
    }]);
    cfg.goodput = o.goodput.clone();
    cfg.percentile_metrics = o.percentile_metrics.clone();
    cfg.metric_percentiles = o.metric_percentiles.clone();
    cfg.label = common("label");

    // Per shard run: its own dispatch-lag judgement (the client of each process).
    let mut by_run: BTreeMap<String, Vec<TraceRecord>> = BTreeMap::new();
    for r in &records {
        by_run
            .entry(r.run_id.clone().unwrap_or_default())
            .or_default()
            .push(r.clone());
    }
    let shards: Vec<ShardRun> = by_run
        .iter()
        .map(|(run_id, rows)| {
            let m = replay::metrics::compute(
                rows,
                merged_start_us(rows).unwrap_or(start_us),
                &[],
                &[50.0, 99.0],
            );
            ShardRun {
                run_id: run_id.clone(),
                rows: rows.len() as u64,
                started_at_us: merged_start_us(rows),
                dispatch_lag_p99_ms: m.dispatch_lag.get(99.0),
                lag_too_high: crate::report::lag_too_high(&m),
            }
        })
        .collect();
    let worst_lag_too_high = shards.iter().any(|s| s.lag_too_high);

    let last_offset = records
        .iter()
        .filter_map(|r| r.scheduled_offset_us)
        .max()
        .unwrap_or(0);
    let run = replay::RunOutput {
        target_info: replay::run::TargetInfo {
            models,
            version: common(&format!("target.{target_name}.version"))
                .and_then(|v| serde_json::from_str(&v).ok()),
        },
        model: records
            .iter()
            .find_map(|r| r.model.clone())
            .unwrap_or_default(),
        run_id: format!("merged-{}", by_run.len()),
        started_at_us: start_us,
        plan_len: records.len(),
        bodies_replayed: records.iter().filter(|r| r.body.is_some()).count(),
        trace_span: Duration::from_micros(last_offset.max(0) as u64),
        wall: Duration::from_secs_f64(metrics.duration_s),
        records,
        ..crate::report::empty_run(cfg.targets[0].clone())
    };
    let identity = crate::report::TraceIdentity {
        files: trace
            .files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect(),
        rows: run.records.len(),
        content_hash: common("trace_content_hash").unwrap_or(rows_identity.content_hash),
    };
    let mut doc = crate::report::result_doc(&crate::report::ResultInputs {
        cfg: &cfg,
        run: &run,
        metrics: &metrics,
        trace: &identity,
        command,
        detailed: false,
    });
    // The settings the shards ran with, when every input says and they agree (the prompt
    // salt aside: each process draws its own unless given one; the merged result keeps one
    // only when they share it).
    let settings: Vec<Option<RunSettings>> = metas
        .iter()
        .map(|m| {
            m.extra
                .get(RunSettings::META_KEY)
                .and_then(|s| serde_json::from_str::<RunSettings>(s).ok())
        })
        .collect();
    if let Some(Some(first)) = settings.first() {
        let unsalted = |s: &RunSettings| RunSettings {
            prompt_salt: 0,
            ..s.clone()
        };
        if settings
            .iter()
            .all(|s| s.as_ref().is_some_and(|s| unsalted(s) == unsalted(first)))
        {
            let mut agreed = first.clone();
            if settings
                .iter()
                .flatten()
                .any(|s| s.prompt_salt != first.prompt_salt)
            {
                agreed.prompt_salt = doc.ours().trace.prompt_salt;
            }
            agreed.apply(&mut doc);
        } else {
            notes.push(
                "the shards ran with different settings (or some do not record them): \
                 request_rate, max_concurrency and the trace selection are not in the merged \
                 result"
                    .into(),
            );
        }
    }
    if let Some(ours) = doc.llmreplay.as_mut() {
        ours.merge = Some(MergeDoc {
            inputs: identity.files.clone(),
            shards: metas
                .iter()
                .map(|m| m.extra.get("shard").cloned())
                .collect(),
            runs: shards,
            worst_shard_lag_too_high: worst_lag_too_high,
        });
        ours.interrupted = interrupted_inputs(&trace.files, &run.records);
        if let Some(i) = &ours.interrupted {
            notes.push(format!(
                "{}: the merged figures cover the rows that finished",
                i.summary()
            ));
        }
    }

    let mut meta = FileMeta::new(Producer::Replay, command.to_string());
    meta.source = Some(identity.files.join(","));
    meta.extra
        .insert(format!("target.{target_name}.url"), url.clone());
    for k in [
        "trace_content_hash".to_string(),
        "label".to_string(),
        format!("target.{target_name}.models"),
        format!("target.{target_name}.version"),
        RunSettings::META_KEY.to_string(),
    ] {
        if let Some(v) = common(&k) {
            meta.extra.insert(k, v);
        }
    }
    meta.extra
        .insert("merged_runs".into(), by_run.len().to_string());
    if let Some(i) = doc.llmreplay.as_ref().and_then(|o| o.interrupted.as_ref()) {
        meta.extra
            .insert(crate::outputs::INTERRUPTED_KEY.into(), i.reason.clone());
    }
    Ok(Merged {
        p99_ttft_ms: metrics.ttft.get(99.0),
        runs: by_run.len(),
        records: run.records,
        doc,
        meta,
        notes,
        worst_lag_too_high,
    })
}

/// A merge of inputs some of which are partial (an interrupted run, a killed one recovered
/// from its journal): why, each reason once, and how far the schedule got by the rows. What
/// was sent and not sent is not in a results file, so it is unknown here.
fn interrupted_inputs(
    files: &[trace_format::TraceFile],
    records: &[TraceRecord],
) -> Option<InterruptedDoc> {
    let reasons: BTreeSet<&str> = files
        .iter()
        .filter_map(|f| f.meta.extra.get(crate::outputs::INTERRUPTED_KEY))
        .map(String::as_str)
        .collect();
    if reasons.is_empty() {
        return None;
    }
    let reached_us = records
        .iter()
        .filter_map(|r| r.scheduled_offset_us)
        .max()
        .unwrap_or(0);
    Some(InterruptedDoc {
        reason: reasons.into_iter().collect::<Vec<_>>().join("; "),
        schedule_reached_s: reached_us.max(0) as f64 / 1e6,
        schedule_span_s: None,
        sent: None,
        not_sent: None,
        cancelled: None,
        finished: records.len() as u64,
    })
}

/// `PATH` → (`PATH.parquet`, `PATH.json`); a given `.parquet`/`.json` extension is dropped.
pub fn output_paths(p: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let base = match p.extension().and_then(|e| e.to_str()) {
        Some("parquet" | "json") => p.with_extension(""),
        _ => p.to_path_buf(),
    };
    let with = |ext: &str| {
        let mut s = base.clone().into_os_string();
        s.push(ext);
        std::path::PathBuf::from(s)
    };
    (with(".parquet"), with(".json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    #[test]
    fn outputs_and_run_start() {
        assert_eq!(
            output_paths(Path::new("d/merged")),
            (
                PathBuf::from("d/merged.parquet"),
                PathBuf::from("d/merged.json")
            )
        );
        // As strings: Path equality would call `s3:/bucket` and `s3://bucket` equal.
        let (pq, js) = output_paths(Path::new("s3://bucket/runs/m.json"));
        assert_eq!(pq.to_str(), Some("s3://bucket/runs/m.parquet"));
        assert_eq!(js.to_str(), Some("s3://bucket/runs/m.json"));
        assert_eq!(
            output_paths(Path::new("m.json")).0,
            PathBuf::from("m.parquet")
        );
        let mut r = TraceRecord::new("a", 10_000, "/v1/completions");
        r.scheduled_offset_us = Some(5_000);
        r.dispatch_lag_us = Some(100);
        r.queue_us = Some(200);
        r.connect_us = Some(300);
        assert_eq!(row_run_start_us(&r), Some(4_400));
        let b = TraceRecord::new("b", 3_000, "/v1/completions");
        assert_eq!(merged_start_us(&[r, b]), Some(3_000));
    }

    fn file(path: &str, shard: Option<&str>, hash: &str) -> trace_format::TraceFile {
        let mut meta = FileMeta::new(Producer::Replay, "llmreplay replay");
        if let Some(s) = shard {
            meta.extra.insert("shard".into(), s.into());
        }
        meta.extra.insert("trace_content_hash".into(), hash.into());
        trace_format::TraceFile {
            path: PathBuf::from(path),
            meta,
            rows: 1,
            schema_version: "1.0".into(),
            tool_version: None,
        }
    }

    fn row(id: &str, run: &str, at: i64) -> TraceRecord {
        let mut r = TraceRecord::new(id, at, "/v1/completions");
        r.run_id = Some(run.into());
        r
    }

    #[test]
    fn only_the_shards_of_one_run_merge() {
        let rows = [row("a", "r1", 1), row("b", "r2", 2)];
        let two = [
            file("s0.parquet", Some("0/2"), "h"),
            file("s1.parquet", Some("1/2"), "h"),
        ];
        assert!(check_shards(&two, &rows).unwrap().is_empty());
        // One of two shards: merged, with a note.
        let notes = check_shards(&two[..1], &rows[..1]).unwrap();
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("missing: 1/2"), "{notes:?}");
        // An older run of shard 0 beside the new one, without shard labels: the same
        // requests twice.
        let stale = [row("a", "r1", 1), row("b", "r2", 2), row("a", "r0", 0)];
        let unlabeled = [file("x.parquet", None, "h"), file("y.parquet", None, "h")];
        let e = check_shards(&unlabeled, &stale).unwrap_err().to_string();
        assert!(
            e.contains("1 request ids appear in more than one run"),
            "{e}"
        );
        assert!(
            e.contains("run r0: 1 rows, first send 1970-01-01T00:00:00.000000Z"),
            "{e}"
        );
        // The same shard twice, different splits, different traces.
        let twice = [
            file("a.parquet", Some("0/2"), "h"),
            file("b.parquet", Some("0/2"), "h"),
        ];
        let e = check_shards(&twice, &rows).unwrap_err().to_string();
        assert!(
            e.contains("shard 0/2 is in more than one input (a.parquet, b.parquet)"),
            "{e}"
        );
        let mixed = [
            file("a.parquet", Some("0/2"), "h"),
            file("b.parquet", Some("1/4"), "h"),
        ];
        let e = check_shards(&mixed, &rows).unwrap_err().to_string();
        assert!(e.contains("different splits"), "{e}");
        let mut synth = file("t.parquet", None, "h");
        synth.meta.producer = Producer::Synth;
        let e = check_shards(&[two[0].clone(), synth], &rows)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.parquet is not a replay result (written by `llmreplay synth`)"),
            "{e}"
        );
        let traces = [
            file("a.parquet", Some("0/2"), "h"),
            file("b.parquet", Some("1/2"), "g"),
        ];
        let e = check_shards(&traces, &rows).unwrap_err().to_string();
        assert!(e.contains("different traces"), "{e}");
    }
}
