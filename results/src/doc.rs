//! The JSON result document (`replay --save-result`, every level of a sweep, `merge`): one
//! serde type whose fields are the key contract. vLLM's `vllm bench serve` key names at the
//! top level ([`ResultDoc`]), ours under `llmreplay` ([`Extension`]). The per-metric latency
//! keys (`mean_ttft_ms`, `p99_ttft_ms`, … chosen by `--percentile-metrics` and
//! `--metric-percentiles`) and `--metadata` entries are dynamic: they live in a flattened map
//! ([`Extras`]). Everything else is a field.
//!
//! Written through [`ResultDoc::to_value`]: serde_json's map keeps keys sorted, so the file's
//! key order does not depend on field order here. Read with [`ResultDoc::from_value`]: every
//! field has a default, so vLLM's own result files and older llmreplay results read too.
//! `results/result.schema.json` describes the same document; `results/tests/result_schema.rs`
//! checks freshly written ones against it. The sweep document is in [`crate::sweep_doc`]; the
//! engine's typed figures in it are [`crate::figures`]'.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trace_format::stats::{percentile_label, Summary};

use replay::output::ClientLoad;
use replay::served::Served;
use replay::server_metrics::GaugeStats;

pub use crate::figures::{DriftDoc, MetricRequests, ServerHistogramsDoc, SlicesDoc, TrendDoc};

/// A `Summary` as the result writes it: count, mean, median, std, min, max, and `pNN` for each
/// asked percentile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SummaryDoc {
    /// Number of values.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Set when the percentiles are estimates (a sample past
    /// `trace_format::quantiles::EXACT_CAP` values): their relative error bound. Absent
    /// while exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<f64>,
    /// `p50`, `p99`, `p99.9`, … (the asked percentiles).
    #[serde(flatten)]
    pub percentiles: BTreeMap<String, f64>,
}

impl SummaryDoc {
    /// The written form of `s`.
    pub fn of(s: &Summary) -> SummaryDoc {
        SummaryDoc {
            count: s.count as u64,
            mean: s.mean,
            median: s.median,
            std: s.std,
            min: s.min,
            max: s.max,
            estimate: s.estimate,
            percentiles: s
                .percentiles
                .iter()
                .map(|(p, v)| (format!("p{}", percentile_label(*p)), *v))
                .collect(),
        }
    }

    /// The value of percentile `p` (`get(99.0)` reads `p99`).
    pub fn get(&self, p: f64) -> Option<f64> {
        self.percentiles
            .get(&format!("p{}", percentile_label(p)))
            .copied()
    }
}

/// `request_rate`: a number, `"inf"` (all at once), or `"trace"` (recorded arrivals).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RequestRate {
    /// Requests per second.
    PerSecond(f64),
    /// `--request-rate inf`.
    Infinite,
    /// The trace's recorded arrivals.
    #[default]
    Trace,
}

impl RequestRate {
    /// The rate as a number (`inf` for [`RequestRate::Infinite`], None for the trace).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            RequestRate::PerSecond(r) => Some(*r),
            RequestRate::Infinite => Some(f64::INFINITY),
            RequestRate::Trace => None,
        }
    }
}

impl Serialize for RequestRate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RequestRate::PerSecond(r) if r.is_infinite() => s.serialize_str("inf"),
            RequestRate::PerSecond(r) => s.serialize_f64(*r),
            RequestRate::Infinite => s.serialize_str("inf"),
            RequestRate::Trace => s.serialize_str("trace"),
        }
    }
}

impl<'de> Deserialize<'de> for RequestRate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Number(n) => RequestRate::PerSecond(n.as_f64().unwrap_or(0.0)),
            Value::String(s) if s == "inf" => RequestRate::Infinite,
            _ => RequestRate::Trace,
        })
    }
}

/// The top-level keys that vary by run: the latency summaries (`mean_X_ms`, `median_X_ms`,
/// `std_X_ms`, `pNN_X_ms`) and the `--metadata` entries (plus any key this version does not
/// know, from a newer or foreign file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extras {
    /// Latency summary keys, ms.
    pub latency: BTreeMap<String, f64>,
    /// Everything else: `--metadata` pairs (strings) and unknown keys.
    pub metadata: BTreeMap<String, Value>,
}

/// Whether `key` has the shape of a per-metric latency key (`mean_`/`median_`/`std_`/`p…`
/// then `_ms`).
pub fn is_latency_key(key: &str) -> bool {
    ["mean_", "median_", "std_", "p"]
        .iter()
        .any(|p| key.starts_with(p))
        && key.ends_with("_ms")
}

impl Serialize for Extras {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.latency.len() + self.metadata.len()))?;
        for (k, v) in &self.latency {
            m.serialize_entry(k, v)?;
        }
        for (k, v) in &self.metadata {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Extras {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let all = BTreeMap::<String, Value>::deserialize(d)?;
        let mut e = Extras::default();
        for (k, v) in all {
            match v.as_f64() {
                Some(x) if is_latency_key(&k) => {
                    e.latency.insert(k, x);
                }
                _ => {
                    e.metadata.insert(k, v);
                }
            }
        }
        Ok(e)
    }
}

/// A count as other tools write it: an integer, or a whole float (`1.0`).
fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(count_opt(d)?.unwrap_or(0))
}

fn count_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|x| *x >= 0.0 && x.fract() == 0.0)
                    .map(|x| x as u64)
            })
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("{v} is not a count"))),
    }
}

/// vLLM's fixed top-level keys (the dynamic ones are in [`Extras`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VllmFields {
    /// `YYYYmmdd-HHMMSS`, UTC, when the result was written.
    pub date: String,
    /// `openai` or `openai-chat`.
    pub backend: String,
    /// The model served.
    pub model_id: String,
    /// `--tokenizer`, or null.
    pub tokenizer_id: Option<String>,
    /// Requests in the run.
    #[serde(deserialize_with = "count")]
    pub num_prompts: u64,
    /// The arrival rate.
    pub request_rate: RequestRate,
    /// Gamma shape of the arrivals (null with recorded arrivals).
    pub burstiness: Option<f64>,
    /// `--max-concurrency`, or null.
    #[serde(deserialize_with = "count_opt")]
    pub max_concurrency: Option<u64>,
    /// `--label`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Benchmark duration, s.
    pub duration: f64,
    /// Successful requests.
    #[serde(deserialize_with = "count")]
    pub completed: u64,
    /// Failed requests.
    #[serde(deserialize_with = "count")]
    pub failed: u64,
    /// Prompt tokens of all requests.
    pub total_input_tokens: i64,
    /// Output tokens of successful requests.
    pub total_output_tokens: i64,
    /// Completed requests / s.
    pub request_throughput: f64,
    /// Requests / s meeting every SLO (null without `--goodput`).
    pub request_goodput: Option<f64>,
    /// Output tokens / s.
    pub output_throughput: f64,
    /// (Input + output) tokens / s.
    pub total_token_throughput: f64,
    /// Most requests in flight at once.
    #[serde(deserialize_with = "count")]
    pub max_concurrent_requests: u64,
    /// `--save-detailed`: prompt tokens per request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_lens: Option<Vec<i64>>,
    /// `--save-detailed`: output tokens per request (0 when failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_lens: Option<Vec<i64>>,
    /// `--save-detailed`: TTFT per request, s (0 when failed or not streamed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttfts: Option<Vec<f64>>,
    /// `--save-detailed`: chunk gaps per request, s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub itls: Option<Vec<Vec<f64>>>,
    /// `--save-detailed`: error text per request ("" when it succeeded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<String>>,
    /// vLLM's generated texts (never written by llmreplay; read from vLLM files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated_texts: Option<Vec<String>>,
}

/// The JSON result of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResultDoc {
    /// vLLM's fixed keys.
    #[serde(flatten)]
    pub vllm: VllmFields,
    /// Ours (absent from vLLM's own files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llmreplay: Option<Extension>,
    /// Latency summaries and `--metadata`.
    #[serde(flatten)]
    pub extras: Extras,
}

/// `llmreplay.target`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TargetDoc {
    /// `--target` name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// Model ids from `/v1/models`.
    pub models: Vec<String>,
    /// The body of `/version`, when offered: the server's own JSON, whatever its shape
    /// (vLLM's `{"version": "0.11.0"}`, a string, another server's object), kept as sent.
    pub version: Option<Value>,
}

/// `llmreplay.trace`: what was replayed, and how.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceDoc {
    /// Input files.
    pub files: Vec<String>,
    /// Rows in the input.
    pub rows: u64,
    /// Stable hash of (request_id, arrival_time) of every row, hex.
    pub content_hash: String,
    /// Rows selected for the run.
    pub selected_rows: u64,
    /// Span of the selected schedule, s.
    pub span_s: f64,
    /// Rows that could not become a request.
    pub skipped_rows: u64,
    /// The first few of them, `id: why`.
    pub skipped_examples: Vec<String>,
    /// `recorded` or `rate`.
    pub arrivals: String,
    /// `--speedup` of recorded arrivals (null with a rate).
    pub speedup: Option<f64>,
    /// `--start-offset`, s.
    pub start_offset_s: f64,
    /// `--duration`, s.
    pub window_s: Option<f64>,
    /// `--sample-ratio`.
    pub sample_ratio: Option<f64>,
    /// `--max-requests`.
    pub max_requests: Option<u64>,
    /// `--session-mode`.
    pub session_mode: String,
    /// `--seed`.
    pub seed: u64,
    /// `--prompt-salt`.
    pub prompt_salt: u64,
    /// How prompts without a recorded body were made.
    pub synthesized_prompts: String,
    /// Requests that sent their recorded body.
    pub recorded_bodies_replayed: u64,
}

/// `llmreplay.connections`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectionsDoc {
    /// Opened before the run.
    pub preconnected: u64,
    /// Opened during it.
    pub new_during_run: u64,
    /// Pooled connections reused.
    pub reused: Option<u64>,
    /// Pooled connections found closed by the target before any byte was sent.
    pub found_closed: Option<u64>,
    /// Pooled connections dropped for `--pool-idle-timeout`.
    pub expired_idle: Option<u64>,
    /// Connect time.
    pub connect_ms: SummaryDoc,
}

/// `llmreplay.client`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientDoc {
    /// The client's CPU use, or null.
    pub load: Option<ClientLoad>,
    /// Whether the client kept up.
    pub verdict: Option<Verdict>,
    /// The validity stamp: the client's own timing error against its budget (absent where
    /// not measured: merged shards, results that predate it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validity: Option<crate::validity::Validity>,
}

/// One entry of `llmreplay.by_class`: the metrics of one (endpoint, stream) class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClassDoc {
    /// Endpoint path.
    pub endpoint: String,
    /// Streamed or not.
    pub stream: bool,
    /// Requests.
    pub requests: u64,
    /// Successful ones.
    pub completed: u64,
    /// Their output tokens.
    pub output_tokens: i64,
    /// TTFT (streamed classes).
    pub ttft_ms: Option<SummaryDoc>,
    /// Time to first answer token (streamed classes of a run where some request reasoned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttfat_ms: Option<SummaryDoc>,
    /// TPOT (streamed classes).
    pub tpot_ms: Option<SummaryDoc>,
    /// ITL (streamed classes).
    pub itl_ms: Option<SummaryDoc>,
    /// E2EL.
    pub e2el_ms: SummaryDoc,
}

/// One entry of `llmreplay.top_errors`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopError {
    /// The outcome.
    pub outcome: String,
    /// The error text.
    pub error: String,
    /// Requests with it.
    pub requests: u64,
    /// Whose the outcome is (`trace_format::cause`): `server`, `client` (a cancellation
    /// replayed at its recorded point, a 4xx as captured: the client's own, no failure of the
    /// server) or `replay`; absent from results that predate it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<trace_format::Cause>,
}

/// `llmreplay.soak`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SoakDoc {
    /// `--loop`.
    #[serde(rename = "loop")]
    pub loops: String,
    /// Passes of the trace replayed.
    pub passes: u64,
}

/// `llmreplay.sweep`: a level run's place in its sweep.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SweepMark {
    /// The axis key.
    pub axis: String,
    /// The level.
    pub level: f64,
    /// Index of the level.
    pub level_index: u64,
    /// Repeat number, from 0.
    pub run: u64,
}

/// One shard run of a merge.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShardRun {
    /// Its run id.
    pub run_id: String,
    /// Its rows.
    pub rows: u64,
    /// Its start, µs since the epoch.
    pub started_at_us: Option<i64>,
    /// Its dispatch lag p99, ms.
    pub dispatch_lag_p99_ms: Option<f64>,
    /// Whether its client fell behind.
    pub lag_too_high: bool,
}

/// `llmreplay.merge`: what a merged result was made of.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MergeDoc {
    /// Input files.
    pub inputs: Vec<String>,
    /// Each input's `--shard` (null when not recorded).
    pub shards: Vec<Option<String>>,
    /// Every shard run.
    pub runs: Vec<ShardRun>,
    /// Whether any shard's client fell behind.
    pub worst_shard_lag_too_high: bool,
}

/// `llmreplay.verdict`: a run's PASS or FAIL and why ([`crate::run_verdict::judge`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunVerdict {
    /// PASS.
    pub pass: bool,
    /// Why, as one line: each SLO's percentile observed against its limit, and the error
    /// budget with its counts.
    pub reason: String,
    /// The percentile SLOs were judged at.
    pub percentile: f64,
    /// Server-caused failures / requests the server was asked to serve.
    pub server_failed_fraction: f64,
    /// The error budget.
    pub max_failed_fraction: f64,
}

/// `llmreplay`: everything vLLM's keys do not say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Extension {
    /// llmreplay's version.
    pub tool_version: String,
    /// The exact command line.
    pub command: String,
    /// The run's id (also in every `--results` row).
    pub run_id: String,
    /// RFC 3339 start of the run.
    pub started_at: Option<String>,
    /// The target.
    pub target: TargetDoc,
    /// The trace and its selection.
    pub trace: TraceDoc,
    /// `--goodput` SLOs, metric key → ms.
    pub goodput_slos: BTreeMap<String, f64>,
    /// Share of requests meeting every SLO.
    pub slo_attainment: Option<f64>,
    /// `verdict.pass`, or null without SLOs.
    pub slo_pass: Option<bool>,
    /// PASS or FAIL and why ([`crate::run_verdict`]): absent from results that predate it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<RunVerdict>,
    /// Requests per cause of their outcome (`trace_format::cause`): absent from results
    /// that predate it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome_causes: Option<trace_format::CauseCounts>,
    /// Dispatch lag.
    pub dispatch_lag_ms: SummaryDoc,
    /// Client queue time.
    pub client_queue_ms: SummaryDoc,
    /// Connections.
    pub connections: ConnectionsDoc,
    /// The client's load and verdict.
    pub client: ClientDoc,
    /// E2EL of every completed request.
    pub e2el_ms: SummaryDoc,
    /// Requests behind each metric.
    pub metric_requests: MetricRequests,
    /// What the run served against what it offered.
    pub served: Served,
    /// Per (endpoint, stream) class, when the run mixed classes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_class: Option<Vec<ClassDoc>>,
    /// ITL per token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub itl_per_token_ms: Option<SummaryDoc>,
    /// Time to first answer token of completed streamed requests, when some reasoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttfat_ms: Option<SummaryDoc>,
    /// Σ reasoning tokens of completed requests (part of `total_output_tokens`), when some
    /// reasoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_reasoning_tokens: Option<i64>,
    /// The workload the run replayed (`trace_format::inspect_card`): absent from results
    /// that predate it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<trace_format::inspect_card::WorkloadCard>,
    /// Requests per outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// The most frequent errors.
    pub top_errors: Vec<TopError>,
    /// Where output token counts came from.
    pub output_token_sources: BTreeMap<String, u64>,
    /// Warm-up requests sent.
    pub warmups: u64,
    /// The server's scheduler gauges (`--server-metrics`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_gauges: Option<BTreeMap<String, GaugeStats>>,
    /// The server's histograms over the run, with the client's TTFT beside them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_histograms: Option<ServerHistogramsDoc>,
    /// `--loop`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakDoc>,
    /// `--slice`: per-slice metrics and drift.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slices: Option<SlicesDoc>,
    /// The level run's place in a sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepMark>,
    /// What a merged result was made of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeDoc>,
    /// The run was stopped before its schedule ended: a partial result (absent when the run
    /// completed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<InterruptedDoc>,
}

/// `llmreplay.interrupted`: a run stopped before its schedule ended (a signal, a results
/// file that could not be written, a kill). Its figures cover the requests that finished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct InterruptedDoc {
    /// Why: `SIGINT`, `SIGTERM`, `killed: recovered from journal`, ...
    pub reason: String,
    /// Schedule offset the run had reached when it stopped sending, s.
    pub schedule_reached_s: f64,
    /// The schedule's span, s (null when unknown: the rows recovered after a kill).
    pub schedule_span_s: Option<f64>,
    /// Requests sent (null when unknown).
    #[serde(deserialize_with = "count_opt")]
    pub sent: Option<u64>,
    /// Requests of the selection never sent (null when unknown).
    #[serde(deserialize_with = "count_opt")]
    pub not_sent: Option<u64>,
    /// Requests still in flight at the drain deadline or a second stop, recorded as cancelled
    /// (null when unknown).
    #[serde(deserialize_with = "count_opt")]
    pub cancelled: Option<u64>,
    /// Requests that finished: the rows the figures are computed over.
    #[serde(deserialize_with = "count")]
    pub finished: u64,
}

impl InterruptedDoc {
    /// One line for people: `PARTIAL (SIGTERM): 3.0 s of the schedule's 10.0 s (30%) ran;
    /// 40 sent, 60 not sent, 2 cancelled`.
    pub fn summary(&self) -> String {
        let ran = match self.schedule_span_s {
            Some(span) if span > 0.0 => format!(
                "{:.1} s of the schedule's {span:.1} s ({:.0}%) ran",
                self.schedule_reached_s,
                100.0 * (self.schedule_reached_s / span).min(1.0)
            ),
            _ => format!(
                "the schedule ran to {:.1} s (its span is not known)",
                self.schedule_reached_s
            ),
        };
        let n = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
        format!(
            "PARTIAL ({}): {ran}; {} sent, {} not sent, {} cancelled, {} finished",
            self.reason,
            n(self.sent),
            n(self.not_sent),
            n(self.cancelled),
            self.finished
        )
    }
}

/// Whether the client itself limited the run, and whether the target kept up.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Verdict {
    /// Dispatch lag p50, ms.
    pub lag_p50_ms: f64,
    /// Dispatch lag p99, ms.
    pub lag_p99_ms: f64,
    /// Dispatch lag max, ms.
    pub lag_max_ms: f64,
    /// Lateness that could not move the reported numbers, ms (see `crate::build::lag_too_high`).
    pub lag_allowance_ms: f64,
    /// Client worker CPU utilisation (0–1), when measured.
    pub client_cpu_utilization: Option<f64>,
    /// True when the result may reflect the client rather than the server.
    pub client_saturated: bool,
    /// True when the target did not serve the offered load (see [`replay::served`]).
    pub target_overloaded: bool,
    /// One sentence for people.
    pub message: String,
}

/// The names serde gives a struct's fields, read from its derived `Deserialize`.
fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Names<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Names<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("field names only"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("field names only"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut names));
    names
}

/// The result's fixed top-level keys, from the type: [`VllmFields`]'s and `llmreplay`.
pub static RESULT_KEYS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut k = field_names::<VllmFields>().to_vec();
    k.push("llmreplay");
    k
});

/// Whether `key` is one the JSON result itself writes (so `--metadata` must not use it): a
/// fixed key, or one with the shape of a latency key.
pub fn is_result_key(key: &str) -> bool {
    RESULT_KEYS.contains(&key) || is_latency_key(key)
}

impl ResultDoc {
    /// The document as JSON (keys sorted: the written form).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a result document always serializes")
    }

    /// The file's bytes (pretty JSON, as `--save-result` writes it).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.to_value()).expect("a JSON value always serializes")
    }

    /// Reads a result document (vLLM's, or any version of llmreplay's).
    pub fn from_value(v: &Value) -> Result<ResultDoc, serde_json::Error> {
        ResultDoc::deserialize(v)
    }

    /// The `llmreplay` part (defaults for a vLLM file).
    pub fn ours(&self) -> std::borrow::Cow<'_, Extension> {
        match &self.llmreplay {
            Some(e) => std::borrow::Cow::Borrowed(e),
            None => std::borrow::Cow::Owned(Extension::default()),
        }
    }

    /// A latency key (`p99_ttft_ms`, `median_tpot_ms`, …).
    pub fn latency(&self, key: &str) -> Option<f64> {
        self.extras.latency.get(key).copied()
    }

    /// Every numeric top-level value by its key (what a sweep level aggregates over runs):
    /// the fixed numeric fields that are set, the latency keys, numeric `--metadata`.
    pub fn numbers(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = RESULT_KEYS
            .iter()
            .filter_map(|k| Some((k.to_string(), self.number(k)?)))
            .collect();
        out.extend(self.extras.latency.iter().map(|(k, v)| (k.clone(), *v)));
        out.extend(
            self.extras
                .metadata
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?))),
        );
        out
    }

    /// A numeric top-level value by its key: a fixed field or a latency key (what capacity
    /// and compare tabulate by key).
    pub fn number(&self, key: &str) -> Option<f64> {
        let v = &self.vllm;
        match key {
            "num_prompts" => Some(v.num_prompts as f64),
            "completed" => Some(v.completed as f64),
            "failed" => Some(v.failed as f64),
            "duration" => Some(v.duration),
            "total_input_tokens" => Some(v.total_input_tokens as f64),
            "total_output_tokens" => Some(v.total_output_tokens as f64),
            "request_throughput" => Some(v.request_throughput),
            "request_goodput" => v.request_goodput,
            "output_throughput" => Some(v.output_throughput),
            "total_token_throughput" => Some(v.total_token_throughput),
            "max_concurrent_requests" => Some(v.max_concurrent_requests as f64),
            "max_concurrency" => v.max_concurrency.map(|c| c as f64),
            "burstiness" => v.burstiness,
            // A number only when it is one ("inf" and "trace" are not).
            "request_rate" => match v.request_rate {
                RequestRate::PerSecond(r) if r.is_finite() => Some(r),
                _ => None,
            },
            k => self.latency(k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_list_comes_from_the_type() {
        for k in [
            "date",
            "request_throughput",
            "generated_texts",
            "label",
            "llmreplay",
        ] {
            assert!(is_result_key(k), "{k}");
        }
        // What `--metadata` may not name (the binary checks it before a run).
        for k in [
            "completed",
            "p99_ttft_ms",
            "mean_itl_ms",
            "mean_e2el_ms",
            "llmreplay",
        ] {
            assert!(is_result_key(k), "{k}");
        }
        assert!(!is_result_key("team") && !is_result_key("gpu") && !is_result_key("extras"));
        assert_eq!(RESULT_KEYS.len(), 26);
    }

    #[test]
    fn the_committed_sample_reads_and_writes_back_the_same() {
        let text = std::fs::read("../samples/sim-replay-300.json").unwrap();
        let v: Value = serde_json::from_slice(&text).unwrap();
        let doc = ResultDoc::from_value(&v).unwrap();
        assert_eq!(doc.to_value(), v);
        assert!(doc.latency("p99_ttft_ms").is_some());
        assert_eq!(doc.ours().trace.rows, 300);
    }

    #[test]
    fn a_vllm_result_reads() {
        let v = serde_json::json!({"date": "20250101-000000", "backend": "vllm", "model_id": "m",
            "num_prompts": 10, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": null,
            "completed": 10, "request_throughput": 2.5, "p99_ttft_ms": 12.0, "team": "x"});
        let d = ResultDoc::from_value(&v).unwrap();
        assert_eq!(d.vllm.request_rate, RequestRate::Infinite);
        assert_eq!(d.latency("p99_ttft_ms"), Some(12.0));
        assert_eq!(d.extras.metadata["team"], "x");
        assert!(d.llmreplay.is_none());
    }
}
