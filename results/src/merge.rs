//! Merging shard runs (`replay --shard K/N`, each with `--results`) into one result: every
//! row in one Parquet file and one [`ResultDoc`] with every metric computed over all rows at
//! once (never an average of per-shard percentiles). The shards' run settings (request rate,
//! burstiness, concurrency, arrivals, selection, seeds) come from their files
//! ([`RunSettings`], under [`RunSettings::META_KEY`]); the checks say when the inputs are not
//! the shards of one run.
//!
//! The inputs are streamed ([`TraceStream`]), in two passes over their rows in arrival order,
//! so memory does not grow with the rows:
//! 1. [`check`] reads every row once for what the checks and the result's start need
//!    ([`RowChecks`]: per run its rows, first send and start; the targets; the repeat checks)
//!    and fails before anything is written;
//! 2. [`merge`] reads them again, hands each row to the output ([`RowSink`], arrival order)
//!    and to the metrics ([`MetricsBuilder`], the mechanism a replay uses: percentiles exact
//!    up to [`EXACT_CAP`](trace_format::quantiles::EXACT_CAP) values, then estimated and
//!    marked `estimate`), with one more builder per shard run for its dispatch-lag judgement,
//!    given only the columns that judgement reads.
//!
//! Held at once: the stream's decoded rows (one batch per open file), one [`MetricsBuilder`]
//! for the whole run and one (lag, E2EL, schedule, intervals, served sample: at most ~44 MiB)
//! per shard run, and at most [`REPEAT_KEYS`] request-id hashes (~32 MiB).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use trace_format::{FileMeta, Producer, TraceFile, TraceRecord, TraceStream};

use crate::build::RowsHash;
use crate::doc::{InterruptedDoc, MergeDoc, ResultDoc, ShardRun};
use crate::settings::RunSettings;
use replay::config::{PercentileMetric, ReplayConfig, Slo, Target};
use replay::error::ReplayError;
use replay::metrics::MetricsBuilder;
use replay::RowSink;

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
    records.iter().map(row_start_or_arrival).min()
}

fn row_start_or_arrival(r: &TraceRecord) -> i64 {
    row_run_start_us(r).unwrap_or(r.arrival_time_us)
}

/// Most request-id hashes the repeat checks hold (16 bytes each with the map's overhead).
/// Up to this many distinct request ids the checks are exact (64-bit hashes); past it they
/// keep the ids whose hash has its low `k` bits zero, `k` raised by one each time the set
/// fills (a fraction `r = 2^-k ≥ REPEAT_KEYS / (2 n)` of `n` ids), so every repetition of a
/// kept id is still seen and a repetition of `d` ids goes unnoticed with probability
/// `(1 − r)^d` (below 10⁻⁹ for `d ≥ 21 / r`: 400 ids of 10 million).
pub const REPEAT_KEYS: usize = 1 << 20;

/// Most target names listed in the error of inputs with several.
const TARGETS_LISTED: usize = 16;

/// Request ids seen again, in bounded memory (see [`REPEAT_KEYS`]).
#[derive(Debug)]
struct Repeats {
    cap: usize,
    /// Ids are kept when their hash has its low `shift` bits zero.
    shift: u32,
    /// Id hash → the run (index) it was last seen in.
    last_run: HashMap<u64, u32>,
    /// Rows whose id was seen before in the same run: the same row twice.
    twice: usize,
    /// Rows whose id was last seen in another run.
    across: usize,
}

impl Repeats {
    fn new(cap: usize) -> Repeats {
        Repeats {
            cap: cap.max(1),
            shift: 0,
            last_run: HashMap::new(),
            twice: 0,
            across: 0,
        }
    }

    fn add(&mut self, request_id: &str, run: u32) {
        let mut h = std::hash::DefaultHasher::new();
        request_id.hash(&mut h);
        let key = h.finish();
        if key.trailing_zeros() < self.shift {
            return;
        }
        match self.last_run.insert(key, run) {
            Some(r) if r == run => self.twice += 1,
            Some(_) => self.across += 1,
            None => {
                while self.last_run.len() > self.cap {
                    self.shift += 1;
                    let shift = self.shift;
                    self.last_run.retain(|k, _| k.trailing_zeros() >= shift);
                }
            }
        }
    }

    /// "", or how much of the ids were checked when the checks were sampled.
    fn scope(&self) -> String {
        match self.shift {
            0 => String::new(),
            k => format!(
                " (at least: past {} request ids, 1 in {} is checked)",
                self.cap,
                1u64 << k.min(63)
            ),
        }
    }
}

/// One shard run, as the first pass saw it.
#[derive(Debug, Clone)]
struct RunRows {
    index: u32,
    rows: usize,
    first_send_us: i64,
    start_us: i64,
}

/// What the checks and the merged result read of the rows, gathered one row at a time in
/// arrival order, in bounded memory: per run (run id) its rows, first send and start; the
/// targets; request ids repeated (see [`REPEAT_KEYS`]); and the run-wide figures the result
/// names (the rows' identity hash, model, recorded bodies, endpoints, last scheduled offset).
#[derive(Debug)]
pub struct RowChecks {
    rows: usize,
    targets: BTreeSet<String>,
    runs: BTreeMap<String, RunRows>,
    repeats: Repeats,
    start_us: Option<i64>,
    hash: RowsHash,
    model: Option<String>,
    bodies: usize,
    endpoints: BTreeMap<String, usize>,
    last_offset_us: Option<i64>,
}

impl Default for RowChecks {
    fn default() -> Self {
        RowChecks::with_repeat_keys(REPEAT_KEYS)
    }
}

/// Distinct endpoints counted (a result's backend is named after them).
const ENDPOINTS_COUNTED: usize = 64;

impl RowChecks {
    /// Checks whose repeat detection holds at most `cap` request-id hashes.
    pub fn with_repeat_keys(cap: usize) -> RowChecks {
        RowChecks {
            rows: 0,
            targets: BTreeSet::new(),
            runs: BTreeMap::new(),
            repeats: Repeats::new(cap),
            start_us: None,
            hash: RowsHash::default(),
            model: None,
            bodies: 0,
            endpoints: BTreeMap::new(),
            last_offset_us: None,
        }
    }

    /// The checks of `records` (in arrival order).
    pub fn of<'a>(records: impl IntoIterator<Item = &'a TraceRecord>) -> RowChecks {
        let mut c = RowChecks::default();
        records.into_iter().for_each(|r| c.add(r));
        c
    }

    /// Adds the next row (arrival order).
    pub fn add(&mut self, r: &TraceRecord) {
        self.rows += 1;
        if let Some(t) = r.target.as_deref() {
            if self.targets.len() <= TARGETS_LISTED && !self.targets.contains(t) {
                self.targets.insert(t.to_string());
            }
        }
        let run_key = r.run_id.as_deref().unwrap_or_default();
        let next = self.runs.len() as u32;
        let start = row_start_or_arrival(r);
        let run = match self.runs.get_mut(run_key) {
            Some(run) => run,
            None => self.runs.entry(run_key.to_string()).or_insert(RunRows {
                index: next,
                rows: 0,
                first_send_us: i64::MAX,
                start_us: i64::MAX,
            }),
        };
        run.rows += 1;
        run.first_send_us = run.first_send_us.min(r.arrival_time_us);
        run.start_us = run.start_us.min(start);
        let index = run.index;
        self.repeats.add(&r.request_id, index);
        self.start_us = Some(self.start_us.map_or(start, |s| s.min(start)));
        self.hash.add(r);
        if self.model.is_none() {
            self.model.clone_from(&r.model);
        }
        self.bodies += usize::from(r.body.is_some());
        let room = self.endpoints.len() < ENDPOINTS_COUNTED;
        match self.endpoints.get_mut(&r.endpoint) {
            Some(n) => *n += 1,
            None if room => {
                self.endpoints.insert(r.endpoint.clone(), 1);
            }
            None => {}
        }
        if let Some(o) = r.scheduled_offset_us {
            self.last_offset_us = Some(self.last_offset_us.map_or(o, |l| l.max(o)));
        }
    }

    /// Rows added.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Shard runs (distinct run ids) seen.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Request-id hashes held by the repeat checks (at most [`REPEAT_KEYS`], or the cap given).
    pub fn repeat_keys_held(&self) -> usize {
        self.repeats.last_run.len()
    }

    /// The errors of rows that are not one run's: several targets, rows given twice.
    fn row_errors(&self) -> Result<(), ReplayError> {
        if self.targets.len() > 1 {
            let mut names: Vec<&str> = self.targets.iter().map(String::as_str).collect();
            if names.len() > TARGETS_LISTED {
                names.truncate(TARGETS_LISTED);
                names.push("…");
            }
            return Err(fail(format!(
                "the inputs replayed several targets ({}); merge the shards of one target at a \
                 time",
                names.join(", ")
            )));
        }
        if self.repeats.twice > 0 {
            return Err(fail(format!(
                "{} rows appear twice in the inputs{} (the same result file given twice?)",
                self.repeats.twice,
                self.repeats.scope()
            )));
        }
        Ok(())
    }
}

/// Checks that the inputs are shards of one sharded run of one trace, as a directory holding
/// an older run's results beside this one's would not be: their request ids would repeat,
/// and the merged duration and rates would span both runs. Errors name the runs and files to
/// choose from; the notes returned say what is merely incomplete (shards missing).
pub fn check_shards(files: &[TraceFile], rows: &RowChecks) -> Result<Vec<String>, ReplayError> {
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
    if rows.repeats.across > 0 {
        let runs: String = rows
            .runs
            .iter()
            .map(|(id, run)| {
                let id = if id.is_empty() { "(no run id)" } else { id };
                let at = trace_format::inspect::rfc3339(run.first_send_us);
                format!("\n  run {id}: {} rows, first send {at}", run.rows)
            })
            .collect();
        return Err(fail(format!(
            "{} request ids appear in more than one run{}, but the shards of one trace are \
             disjoint: these inputs hold more than one replay of the same requests (an older \
             run's results in the same directory?). Give the files of one sharded run.{runs}",
            rows.repeats.across,
            rows.repeats.scope()
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

/// Inputs that passed the checks ([`check`]): what the first pass found, the provenance they
/// share, and the metadata of the merged Parquet file.
#[derive(Debug)]
pub struct Checked {
    rows: RowChecks,
    target: String,
    url: String,
    /// Provenance every input agrees on (`extra` keys → value).
    common: BTreeMap<String, String>,
    settings: Vec<Option<RunSettings>>,
    interrupted: Option<InterruptedDoc>,
    meta: FileMeta,
    notes: Vec<String>,
    command: String,
}

impl Checked {
    /// The metadata to write the merged rows with.
    pub fn meta(&self) -> &FileMeta {
        &self.meta
    }

    /// What the first pass found.
    pub fn rows(&self) -> &RowChecks {
        &self.rows
    }
}

/// A merged run: its result and what it was made of (the rows went to the [`RowSink`]).
#[derive(Debug, Clone)]
pub struct Merged {
    /// Rows merged (every row of every shard, each given to the sink once).
    pub rows: usize,
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
    /// The most rows the stream held decoded at once during the second pass (the rows are
    /// not otherwise kept).
    pub peak_held_rows: usize,
    /// Values, buckets and sampled rows the metrics held at the end, over every builder
    /// ([`MetricsBuilder::retained`]): bounded whatever the rows.
    pub retained: usize,
}

/// The first pass: reads every row once for the checks (one target; no row twice; the
/// shards of one run of one trace, [`check_shards`]) and what the result needs before its
/// metrics (the run's start), and gathers the provenance the inputs share.
pub fn check(stream: &TraceStream, command: &str) -> Result<Checked, ReplayError> {
    let mut rows = RowChecks::default();
    for r in stream.records() {
        rows.add(&r?);
    }
    if rows.rows == 0 {
        return Err(fail("the inputs have no rows".into()));
    }
    rows.row_errors()?;
    let files = stream.files();
    let notes = check_shards(files, &rows)?;
    let target = rows
        .targets
        .iter()
        .next()
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let metas: Vec<&FileMeta> = files.iter().map(|f| &f.meta).collect();
    // Provenance common to every input (target URL and models, trace hash, label, settings).
    let mut common = BTreeMap::new();
    for k in [
        "trace_content_hash".to_string(),
        "label".to_string(),
        format!("target.{target}.models"),
        format!("target.{target}.version"),
        RunSettings::META_KEY.to_string(),
    ] {
        let vals: BTreeSet<Option<&String>> = metas.iter().map(|m| m.extra.get(&k)).collect();
        if let [Some(v)] = vals.into_iter().collect::<Vec<_>>().as_slice() {
            common.insert(k, (*v).clone());
        }
    }
    // One URL when the shards agree (one service); otherwise each shard's, comma-separated.
    let url = {
        let urls: BTreeSet<&String> = metas
            .iter()
            .filter_map(|m| m.extra.get(&format!("target.{target}.url")))
            .collect();
        let joined = urls.into_iter().cloned().collect::<Vec<_>>().join(",");
        if joined.is_empty() {
            "unknown".to_string()
        } else {
            joined
        }
    };
    let interrupted = interrupted_inputs(files, rows.last_offset_us, rows.rows);
    let mut meta = FileMeta::new(Producer::Replay, command.to_string());
    meta.privacy = trace_format::file_meta::carried(metas.iter().copied());
    meta.source = Some(
        files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    meta.extra
        .insert(format!("target.{target}.url"), url.clone());
    meta.extra
        .extend(common.iter().map(|(k, v)| (k.clone(), v.clone())));
    meta.extra
        .insert("merged_runs".into(), rows.runs.len().to_string());
    if let Some(i) = &interrupted {
        meta.extra
            .insert(crate::outputs::INTERRUPTED_KEY.into(), i.reason.clone());
    }
    let settings = metas
        .iter()
        .map(|m| {
            m.extra
                .get(RunSettings::META_KEY)
                .and_then(|s| serde_json::from_str::<RunSettings>(s).ok())
        })
        .collect();
    Ok(Checked {
        rows,
        target,
        url,
        common,
        settings,
        interrupted,
        meta,
        notes,
        command: command.to_string(),
    })
}

/// The row a shard run's own builder is given: only what its dispatch-lag judgement reads
/// (send time, schedule, lag, E2EL and outcome), so that builder holds no latency sample of
/// its own beyond lag and E2EL.
fn lag_view(r: &TraceRecord) -> TraceRecord {
    let mut v = TraceRecord::new("", r.arrival_time_us, "");
    v.scheduled_offset_us = r.scheduled_offset_us;
    v.dispatch_lag_us = r.dispatch_lag_us;
    v.e2el_us = r.e2el_us;
    v.outcome = r.outcome;
    v
}

/// The second pass: every row, in arrival order, to `out` and to the metrics; then the
/// merged result. `stream` must be the one [`check`] read (a file that changed since is an
/// error of the stream).
pub fn merge(
    stream: &TraceStream,
    c: Checked,
    o: &MergeOptions,
    out: &mut dyn RowSink,
) -> Result<Merged, ReplayError> {
    let start_us = c.rows.start_us.unwrap_or(0);
    let mut all = MetricsBuilder::new(start_us, &o.goodput, &o.metric_percentiles);
    // Per shard run (by its first-pass index): its own dispatch-lag judgement.
    let mut order: Vec<(&String, &RunRows)> = c.rows.runs.iter().collect();
    order.sort_by_key(|(_, r)| r.index);
    let mut per_run: Vec<MetricsBuilder> = order
        .iter()
        .map(|(_, r)| MetricsBuilder::new(r.start_us, &[], &[50.0, 99.0]))
        .collect();
    let mut records = stream.records();
    let mut n = 0usize;
    for r in records.by_ref() {
        let r = r?;
        let run = c.rows.runs.get(r.run_id.as_deref().unwrap_or_default());
        let Some(b) = run.and_then(|run| per_run.get_mut(run.index as usize)) else {
            return Err(ReplayError::Trace(trace_format::Error::Invalid(format!(
                "run {:?} was not in the inputs when they were first read: an input changed",
                r.run_id
            ))));
        };
        b.add(&lag_view(&r));
        all.add(&r);
        out.row(&r)?;
        n += 1;
    }
    if n != c.rows.rows {
        return Err(ReplayError::Trace(trace_format::Error::Invalid(format!(
            "the inputs held {} rows when first read, {n} now: an input changed",
            c.rows.rows
        ))));
    }
    let peak_held_rows = records.peak_held_rows();
    let mut retained = all.retained() + per_run.iter().map(|b| b.retained()).sum::<usize>();
    retained += c.rows.repeat_keys_held();
    let metrics = all.finish();
    let shards = shard_runs(&order, per_run);
    let worst_lag_too_high = shards.iter().any(|s| s.lag_too_high);
    let (cfg, run) = merged_run(&c, o, n, &metrics);
    let files: Vec<String> = stream
        .files()
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    let identity = crate::build::TraceIdentity {
        files,
        rows: n,
        content_hash: c
            .common
            .get("trace_content_hash")
            .cloned()
            .unwrap_or_else(|| c.rows.hash.hex()),
    };
    let mut doc = crate::build::result_doc(&crate::build::ResultInputs {
        cfg: &cfg,
        run: &run,
        metrics: &metrics,
        trace: &identity,
        command: &c.command,
        detailed: false,
    });
    let mut notes = c.notes;
    if let Some(note) = apply_settings(&c.settings, &mut doc) {
        notes.push(note);
    }
    if let Some(ours) = doc.llmreplay.as_mut() {
        ours.merge = Some(MergeDoc {
            inputs: identity.files.clone(),
            shards: stream
                .files()
                .iter()
                .map(|f| f.meta.extra.get("shard").cloned())
                .collect(),
            runs: shards,
            worst_shard_lag_too_high: worst_lag_too_high,
        });
        if let Some(i) = &c.interrupted {
            notes.push(format!(
                "{}: the merged figures cover the rows that finished",
                i.summary()
            ));
        }
        ours.interrupted = c.interrupted;
    }
    Ok(Merged {
        rows: n,
        doc,
        meta: c.meta,
        notes,
        runs: c.rows.runs.len(),
        p99_ttft_ms: metrics.ttft.get(99.0),
        worst_lag_too_high,
        peak_held_rows,
        retained,
    })
}

/// Each shard run with its own dispatch-lag judgement, by run id (the result's order).
fn shard_runs(order: &[(&String, &RunRows)], per_run: Vec<MetricsBuilder>) -> Vec<ShardRun> {
    let mut shards: Vec<ShardRun> = order
        .iter()
        .zip(per_run)
        .map(|((run_id, run), b)| {
            let m = b.finish();
            ShardRun {
                run_id: (*run_id).clone(),
                rows: run.rows as u64,
                started_at_us: Some(run.start_us),
                dispatch_lag_p99_ms: m.dispatch_lag.get(99.0),
                lag_too_high: crate::build::lag_too_high(&m),
            }
        })
        .collect();
    shards.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    shards
}

/// The configuration and the run the merged result is built from: the inputs' target,
/// models, version and label, `o`'s metric options, the `n` rows' span and endpoints.
fn merged_run(
    c: &Checked,
    o: &MergeOptions,
    n: usize,
    metrics: &replay::Metrics,
) -> (ReplayConfig, replay::RunOutput) {
    let start_us = c.rows.start_us.unwrap_or(0);
    let models: Vec<String> = c
        .common
        .get(&format!("target.{}.models", c.target))
        .map(|m| {
            m.split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let mut cfg = ReplayConfig::new(vec![Target {
        name: c.target.clone(),
        url: c.url.clone(),
    }]);
    cfg.goodput = o.goodput.clone();
    cfg.percentile_metrics = o.percentile_metrics.clone();
    cfg.metric_percentiles = o.metric_percentiles.clone();
    cfg.label = c.common.get("label").cloned();
    let runs = c.rows.runs.len();
    let run = replay::RunOutput {
        target_info: replay::run::TargetInfo {
            models,
            version: c
                .common
                .get(&format!("target.{}.version", c.target))
                .and_then(|v| serde_json::from_str(v).ok()),
        },
        model: c.rows.model.clone().unwrap_or_default(),
        run_id: format!("merged-{runs}"),
        started_at_us: start_us,
        plan_len: n,
        bodies_replayed: c.rows.bodies,
        trace_span: Duration::from_micros(c.rows.last_offset_us.unwrap_or(0).max(0) as u64),
        wall: Duration::from_secs_f64(metrics.duration_s),
        endpoints: c.rows.endpoints.clone(),
        ..crate::build::empty_run(cfg.targets[0].clone())
    };
    (cfg, run)
}

/// Writes into `doc` the settings the shards ran with, when every input says and they agree
/// (the prompt salt aside: each process draws its own unless given one; the merged result
/// keeps one only when they share it); else the note that says they are not in it.
fn apply_settings(settings: &[Option<RunSettings>], doc: &mut ResultDoc) -> Option<String> {
    let Some(Some(first)) = settings.first() else {
        return None;
    };
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
        agreed.apply(doc);
        None
    } else {
        Some(
            "the shards ran with different settings (or some do not record them): \
             request_rate, max_concurrency and the trace selection are not in the merged \
             result"
                .into(),
        )
    }
}

/// A merge of inputs some of which are partial (an interrupted run, a killed one recovered
/// from its journal): why, each reason once, and how far the schedule got by the rows (the
/// largest scheduled offset of `rows` rows). What was sent and not sent is not in a results
/// file, so it is unknown here.
fn interrupted_inputs(
    files: &[TraceFile],
    last_offset_us: Option<i64>,
    rows: usize,
) -> Option<InterruptedDoc> {
    let reasons: BTreeSet<&str> = files
        .iter()
        .filter_map(|f| f.meta.extra.get(crate::outputs::INTERRUPTED_KEY))
        .map(String::as_str)
        .collect();
    if reasons.is_empty() {
        return None;
    }
    Some(InterruptedDoc {
        reason: reasons.into_iter().collect::<Vec<_>>().join("; "),
        schedule_reached_s: last_offset_us.unwrap_or(0).max(0) as f64 / 1e6,
        schedule_span_s: None,
        sent: None,
        not_sent: None,
        cancelled: None,
        finished: rows as u64,
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
            assumed: None,
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
        assert!(check_shards(&two, &RowChecks::of(&rows))
            .unwrap()
            .is_empty());
        // One of two shards: merged, with a note.
        let notes = check_shards(&two[..1], &RowChecks::of(&rows[..1])).unwrap();
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("missing: 1/2"), "{notes:?}");
        // An older run of shard 0 beside the new one, without shard labels: the same
        // requests twice.
        let stale = [row("a", "r1", 1), row("b", "r2", 2), row("a", "r0", 0)];
        let unlabeled = [file("x.parquet", None, "h"), file("y.parquet", None, "h")];
        let e = check_shards(&unlabeled, &RowChecks::of(&stale))
            .unwrap_err()
            .to_string();
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
        let e = check_shards(&twice, &RowChecks::of(&rows))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("shard 0/2 is in more than one input (a.parquet, b.parquet)"),
            "{e}"
        );
        let mixed = [
            file("a.parquet", Some("0/2"), "h"),
            file("b.parquet", Some("1/4"), "h"),
        ];
        let e = check_shards(&mixed, &RowChecks::of(&rows))
            .unwrap_err()
            .to_string();
        assert!(e.contains("different splits"), "{e}");
        let mut synth = file("t.parquet", None, "h");
        synth.meta.producer = Producer::Synth;
        let e = check_shards(&[two[0].clone(), synth], &RowChecks::of(&rows))
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
        let e = check_shards(&traces, &RowChecks::of(&rows))
            .unwrap_err()
            .to_string();
        assert!(e.contains("different traces"), "{e}");
    }

    /// Result rows of shard `k` of `n`: interleaved sends, chunked streams, a few failures;
    /// shard 2's client fell behind (50 ms of dispatch lag on a 10 ms schedule).
    fn shard_rows(k: i64, n: i64, per_shard: i64) -> Vec<TraceRecord> {
        let t0 = 1_700_000_000_000_000i64;
        (0..per_shard)
            .map(|i| {
                let slot = i * n + k;
                let lag = if k == 2 { 50_000 } else { 100 + (i % 7) * 30 };
                let offset = slot * 10_000;
                let mut r =
                    TraceRecord::new(format!("r{slot}"), t0 + offset + lag, "/v1/completions");
                r.run_id = Some(format!("run-{k}"));
                r.target = Some("sim".into());
                r.model = Some("m".into());
                r.stream = true;
                r.scheduled_offset_us = Some(offset);
                r.dispatch_lag_us = Some(lag);
                r.queue_us = Some(0);
                r.new_connection = Some(i == 0);
                r.connect_us = (i == 0).then_some(300);
                r.arrival_time_us += r.connect_us.unwrap_or(0);
                if slot % 17 == 5 {
                    r.outcome = trace_format::Outcome::HttpError;
                    r.status = Some(500);
                    r.error = Some("boom".into());
                    return r;
                }
                let ttft = 20_000 + (slot * 7_919) % 30_000;
                let gaps = 3 + slot % 5;
                r.chunk_times_us = (0..=gaps)
                    .map(|g| ttft + g * (4_000 + slot % 900))
                    .collect();
                r.ttft_us = Some(ttft);
                r.e2el_us = r.chunk_times_us.last().copied();
                r.output_tokens = Some(gaps + 1);
                r.prompt_tokens = Some(100 + slot % 50);
                r
            })
            .collect()
    }

    /// Shards written as `replay --shard K/N --results` writes them; returns the paths.
    fn write_shards(dir: &Path, n: i64, per_shard: i64) -> Vec<String> {
        std::fs::create_dir_all(dir).unwrap();
        (0..n)
            .map(|k| {
                let mut meta = FileMeta::new(Producer::Replay, "llmreplay replay t.parquet");
                meta.extra.insert("shard".into(), format!("{k}/{n}"));
                meta.extra.insert("trace_content_hash".into(), "h".into());
                meta.extra
                    .insert("target.sim.url".into(), "http://127.0.0.1:1".into());
                let p = dir.join(format!("s{k}.parquet"));
                trace_format::write_trace_file(&p, &shard_rows(k, n, per_shard), &meta).unwrap();
                p.display().to_string()
            })
            .collect()
    }

    /// `llmreplay merge`'s defaults (every metric; p50, p95, p99) and a TTFT SLO.
    fn options() -> MergeOptions {
        let d = ReplayConfig::new(Vec::new());
        MergeOptions {
            goodput: vec!["ttft:40".parse().unwrap()],
            percentile_metrics: d.percentile_metrics,
            metric_percentiles: d.metric_percentiles,
        }
    }

    fn stream_merge(paths: &[String]) -> (Merged, Vec<TraceRecord>) {
        let stream = TraceStream::open(paths).unwrap();
        let checked = check(&stream, "llmreplay merge -o m").unwrap();
        let mut rows = Vec::new();
        let m = merge(&stream, checked, &options(), &mut rows).unwrap();
        (m, rows)
    }

    /// The streamed merge gives what the whole-trace merge gave: every row once in arrival
    /// order, every metric computed over all rows at once, and each shard's own judgement.
    #[test]
    fn streaming_equals_the_whole_trace_merge() {
        let dir = std::env::temp_dir().join(format!("llmreplay-merge-eq-{}", std::process::id()));
        let paths = write_shards(&dir, 3, 400);
        let (m, rows) = stream_merge(&paths);
        let whole = trace_format::read_traces(&paths).unwrap();
        assert_eq!(rows, whole.records, "every row once, in arrival order");
        assert_eq!(m.rows, 1200);
        let start = merged_start_us(&whole.records).unwrap();
        let o = options();
        let all =
            replay::metrics::compute(&whole.records, start, &o.goodput, &o.metric_percentiles);
        let v = &m.doc.vllm;
        assert_eq!(v.num_prompts, all.num_prompts as u64);
        assert_eq!(v.completed, all.completed as u64);
        assert!(v.failed > 0);
        assert_eq!(v.duration, all.duration_s);
        assert_eq!(v.request_throughput, all.request_throughput);
        assert_eq!(v.request_goodput, all.request_goodput);
        assert_eq!(v.output_throughput, all.output_throughput);
        assert_eq!(
            v.max_concurrent_requests,
            all.max_concurrent_requests as u64
        );
        assert_eq!(m.p99_ttft_ms, all.ttft.get(99.0));
        for (key, s) in [
            ("ttft", &all.ttft),
            ("tpot", &all.tpot),
            ("itl", &all.itl),
            ("e2el", &all.e2el),
        ] {
            for p in [50.0, 95.0, 99.0] {
                let got = m.doc.extras.latency.get(&format!("p{p}_{key}_ms")).copied();
                assert_eq!(got, s.get(p), "p{p} {key}");
            }
            assert_eq!(
                m.doc.extras.latency.get(&format!("mean_{key}_ms")),
                Some(&s.mean)
            );
        }
        let ours = m.doc.ours();
        assert_eq!(
            ours.started_at,
            chrono::DateTime::from_timestamp_micros(start).map(|t| t.to_rfc3339())
        );
        let merged = ours.merge.as_ref().unwrap();
        assert_eq!(merged.runs.len(), 3);
        for (k, run) in merged.runs.iter().enumerate() {
            let own: Vec<TraceRecord> = whole
                .records
                .iter()
                .filter(|r| r.run_id.as_deref() == Some(run.run_id.as_str()))
                .cloned()
                .collect();
            assert_eq!(run.run_id, format!("run-{k}"));
            let s = merged_start_us(&own);
            let lag = replay::metrics::compute(&own, s.unwrap(), &[], &[50.0, 99.0]);
            assert_eq!(run.rows, own.len() as u64);
            assert_eq!(run.started_at_us, s);
            assert_eq!(run.dispatch_lag_p99_ms, lag.dispatch_lag.get(99.0));
            assert_eq!(run.lag_too_high, crate::build::lag_too_high(&lag));
            assert_eq!(run.lag_too_high, k == 2, "shard {k}");
        }
        assert!(m.worst_lag_too_high && merged.worst_shard_lag_too_high);
        assert_eq!(ours.trace.content_hash, "h");
        assert_eq!(m.meta.extra["merged_runs"], "3");
        assert_eq!(m.meta.extra["target.sim.url"], "http://127.0.0.1:1");
        // Without a recorded trace hash, the rows' own identity, as over the whole trace.
        let bare: Vec<String> = paths
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let t = trace_format::read_traces(&[p]).unwrap();
                let mut meta = t.files[0].meta.clone();
                meta.extra.remove("trace_content_hash");
                let q = dir.join(format!("bare{k}.parquet"));
                trace_format::write_trace_file(&q, &t.records, &meta).unwrap();
                q.display().to_string()
            })
            .collect();
        let (b, _) = stream_merge(&bare);
        let whole = trace_format::read_traces(&bare).unwrap();
        assert_eq!(
            b.doc.ours().trace.content_hash,
            crate::build::trace_identity(&whole).content_hash
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What the merge holds does not follow the rows: the stream's decoded batches (one per
    /// open file) and the metrics' samples, not the rows themselves.
    #[test]
    fn a_merge_holds_batches_not_rows() {
        let dir = std::env::temp_dir().join(format!("llmreplay-merge-held-{}", std::process::id()));
        let paths = write_shards(&dir, 4, 6_000);
        let (m, rows) = stream_merge(&paths);
        assert_eq!((m.rows, rows.len()), (24_000, 24_000));
        let bound = 4 * (trace_format::stream::STREAM_BATCH_ROWS + 1);
        assert!(m.peak_held_rows <= bound, "{} > {bound}", m.peak_held_rows);
        assert!(m.peak_held_rows > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Past its cap the repeat check keeps a sample of the ids by hash, and a repetition is
    /// still caught: every occurrence of a kept id is seen. Below it, exact.
    #[test]
    fn repeats_are_exact_below_the_cap_and_sampled_past_it() {
        let mut exact = RowChecks::with_repeat_keys(1_000);
        for i in 0..50 {
            exact.add(&row(&format!("a{i}"), "r0", i));
        }
        for i in 0..50 {
            exact.add(&row(&format!("a{i}"), "r0", 100 + i));
        }
        assert_eq!((exact.repeats.twice, exact.repeats.across), (50, 0));
        let e = exact.row_errors().unwrap_err().to_string();
        assert!(
            e.starts_with("50 rows appear twice in the inputs (the same"),
            "{e}"
        );

        let mut c = RowChecks::with_repeat_keys(64);
        for i in 0..5_000 {
            c.add(&row(&format!("b{i}"), "r0", i));
        }
        assert!(c.repeat_keys_held() <= 64, "{}", c.repeat_keys_held());
        assert!(c.repeats.shift > 0);
        assert_eq!(
            (c.repeats.twice, c.repeats.across),
            (0, 0),
            "no false repeat"
        );
        c.row_errors().unwrap();
        // An older run of the same requests beside it: caught through the sampled ids.
        for i in 0..5_000 {
            c.add(&row(&format!("b{i}"), "r1", 10_000 + i));
        }
        assert!(c.repeat_keys_held() <= 64);
        assert!(c.repeats.across > 0);
        let files = [file("x.parquet", None, "h"), file("y.parquet", None, "h")];
        let e = check_shards(&files, &c).unwrap_err().to_string();
        assert!(
            e.contains(
                "request ids appear in more than one run (at least: past 64 request ids, 1 in"
            ),
            "{e}"
        );
        assert!(e.contains("run r1: 5000 rows"), "{e}");
    }
}
