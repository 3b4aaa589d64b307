//! The sweep's JSON document (`replay --sweep`/`--num-runs --save-result`): the summary
//! under `llmreplay_sweep` and every level run's [`ResultDoc`] under `results`. Like the
//! result, written through a serde_json Value (keys sorted) and read with defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::ResultDoc;

/// The arrival rate of a trace's production rows (shadow rows left out) over 1-second
/// buckets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ArrivalProfile {
    /// Bucket width, s.
    pub bucket_s: f64,
    /// Arrivals per bucket from the first arrival.
    pub counts: Vec<u32>,
    /// Rows / span.
    pub mean_per_s: f64,
    /// Largest bucket / bucket width.
    pub peak_per_s: f64,
    /// What wrote the trace (`capture`, `import`, `synth`, `replay`: its files' producer), so
    /// a synthetic trace is never called captured; absent when not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// Output tokens of the production rows (for the cost per million output tokens).
    pub output_tokens: u64,
}

impl ArrivalProfile {
    /// The trace as a report names it: `the captured trace`, `the synthetic trace`, …
    pub fn trace_name(&self) -> &'static str {
        match self.producer.as_deref() {
            Some("capture") => "the captured trace",
            Some("synth") => "the synthetic trace",
            Some("import") => "the imported trace",
            Some("replay") => "the replay's result rows",
            _ => "the trace",
        }
    }
}

/// A sweep's JSON document: the summary (`llmreplay_sweep`) and every level run's result
/// (`results`, each marked with `llmreplay.sweep`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepFile {
    /// The summary.
    #[serde(rename = "llmreplay_sweep")]
    pub summary: SweepSummary,
    /// Every level run.
    #[serde(default)]
    pub results: Vec<ResultDoc>,
}

impl SweepFile {
    /// The document as JSON (keys sorted: the written form).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a sweep document always serializes")
    }

    /// The file's bytes (pretty JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.to_value()).expect("a JSON value always serializes")
    }

    /// Reads a sweep document.
    pub fn from_value(v: &Value) -> Result<SweepFile, serde_json::Error> {
        SweepFile::deserialize(v)
    }
}

/// `llmreplay_sweep`: what the sweep ran and what it found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SweepSummary {
    /// llmreplay's version.
    pub tool_version: String,
    /// The exact command.
    pub command: String,
    /// The axis key (`max-concurrency`, `request-rate`, `speedup`).
    pub axis: String,
    /// Levels, ascending.
    pub levels: Vec<f64>,
    /// Repeats of every level.
    pub num_runs: u64,
    /// `--level-duration`, s.
    pub level_duration_s: Option<f64>,
    /// `--cooldown`, s.
    pub cooldown_s: f64,
    /// The percentile SLOs are judged at.
    pub slo_percentile: Option<f64>,
    /// `--goodput` SLOs, metric key → ms.
    pub goodput_slos: BTreeMap<String, f64>,
    /// The capacity rules, in words.
    pub rules: String,
    /// The trace.
    pub trace: SweepTrace,
    /// The capacity plan's inputs.
    pub plan_inputs: PlanInputsDoc,
    /// Per configuration: its levels (`capacity::LevelPoint`s) and capacity answer (with its
    /// plan), as `capacity` writes them.
    pub targets: BTreeMap<String, SweepTarget>,
}

/// `llmreplay_sweep.trace`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SweepTrace {
    /// Input files.
    pub files: Vec<String>,
    /// Rows.
    pub rows: u64,
    /// Content hash.
    pub content_hash: String,
    /// Arrival rate.
    pub arrivals: Option<ArrivalProfile>,
}

/// `llmreplay_sweep.plan_inputs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanInputsDoc {
    /// `--target-qps`.
    pub target_qps: Option<f64>,
    /// `--redundancy`.
    pub redundancy: u32,
    /// `--cost-per-hour`.
    pub cost_per_hour: Option<f64>,
    /// `--plan-window`, s: the window of the plan over the trace's demand curve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
}

/// One configuration of a sweep.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SweepTarget {
    /// Its levels (`capacity::LevelPoint`).
    pub levels: Value,
    /// Its capacity answer (`plan::answer_json`).
    pub capacity: Value,
}
