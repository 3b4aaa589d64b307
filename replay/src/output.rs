//! What one run against one target produced ([`RunOutput`]): the result every consumer reads
//! (the sinks as a run ends, the summary, the reports), apart from the run loop
//! ([`crate::run`]) that produces it.

use std::time::Duration;

use trace_format::TraceRecord;

use crate::config::Target;

/// What a target says about itself.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TargetInfo {
    /// Model ids from `/v1/models`.
    pub models: Vec<String>,
    /// The body of `/version`, when offered.
    pub version: Option<serde_json::Value>,
}

impl TargetInfo {
    /// The version as a reader wants it: `0.11.0` for vLLM's `{"version":"0.11.0"}`, with
    /// any other plain fields after it (`0.11.0 (commit abc)`); a body of another shape as
    /// compact JSON.
    pub fn version_text(&self) -> Option<String> {
        use serde_json::Value;
        let v = self.version.as_ref()?;
        let plain = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(_) | Value::Bool(_) => Some(v.to_string()),
            _ => None,
        };
        if let Some(s) = plain(v) {
            return Some(s);
        }
        let Some(m) = v.as_object() else {
            return Some(v.to_string());
        };
        let Some(version) = m.get("version").and_then(plain) else {
            return Some(v.to_string());
        };
        let rest: Vec<String> = m
            .iter()
            .filter(|(k, _)| k.as_str() != "version")
            .map(|(k, x)| format!("{k} {}", plain(x).unwrap_or_else(|| x.to_string())))
            .collect();
        Some(if rest.is_empty() {
            version
        } else {
            format!("{version} ({})", rest.join(", "))
        })
    }
}

/// The client's own resource use during the run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ClientLoad {
    /// CPU seconds of the client's worker threads.
    pub cpu_seconds: f64,
    /// Worker threads.
    pub worker_threads: usize,
    /// cpu_seconds / (wall × worker threads).
    pub utilization: f64,
    /// CPU seconds of the pacer thread (spinning near deadlines).
    pub pacer_cpu_seconds: f64,
}

/// One run against one target.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The target.
    pub target: Target,
    /// What it said about itself.
    pub target_info: TargetInfo,
    /// The model name requests were built with.
    pub model: String,
    /// Unique id of this run.
    pub run_id: String,
    /// Wall-clock time of the schedule's start, µs since the epoch.
    pub started_at_us: i64,
    /// One row per request, in schedule order (kept only with [`ReplayConfig::keep_rows`](crate::ReplayConfig::keep_rows);
    /// else empty: the rows went to the run's sink).
    pub records: Vec<TraceRecord>,
    /// Requests in the schedule (of an interrupted run: those the feed had built).
    pub plan_len: usize,
    /// Of which sent their row's recorded body (the others' prompts were synthesized).
    pub bodies_replayed: usize,
    /// Selected rows that could not become a request (all counted, the first kept).
    pub skipped: crate::plan::Skipped,
    /// Trace time span of the selection (of an interrupted run whose feed had not read the
    /// whole selection: the span of the trace within the window, from its arrival extent).
    pub trace_span: Duration,
    /// Wall time of the run.
    pub wall: Duration,
    /// Connections opened before the clock started.
    pub preconnected: usize,
    /// What the connection pool did while the clock ran (`None` where unknown: merged
    /// shards).
    pub pool: Option<wire::PoolStats>,
    /// Warm-up requests sent.
    pub warmups: usize,
    /// The most requests built and not finished at once (in the look-ahead, waiting for a
    /// `--max-concurrency` slot, or in flight): bounded by the look-ahead and the
    /// concurrency cap, not by the requests waiting (0 for a run assembled elsewhere).
    pub peak_built: usize,
    /// Client CPU, when measurable.
    pub client_load: Option<ClientLoad>,
    /// The client's own timing error as the run went ([`crate::probe`]): None where not
    /// measured (a run assembled elsewhere, merged shards).
    pub client_timing: Option<crate::probe::ClientTiming>,
    /// The server's scheduler gauges sampled during the run (`--server-metrics`).
    pub server_gauges: std::collections::BTreeMap<String, crate::server_metrics::GaugeStats>,
    /// The server's histograms over the run (after − before scrape; `--server-metrics`).
    pub server_histograms:
        std::collections::BTreeMap<String, crate::server_metrics::HistogramSummary>,
    /// Set when the run was stopped before its schedule ended: what ran is partial.
    pub interrupted: Option<crate::stop::Interrupted>,
    /// Rows per request endpoint (what the result's `backend` is named after, with or
    /// without [`ReplayConfig::keep_rows`](crate::ReplayConfig::keep_rows)).
    pub endpoints: std::collections::BTreeMap<String, usize>,
    /// Soak passes the rows came from (1 + the largest `~k` request-id suffix; see
    /// [`crate::soak::passes_replayed`]); 0 for a run assembled elsewhere.
    pub passes: usize,
}

#[cfg(test)]
mod version_tests {
    use super::TargetInfo;

    fn text(body: &str) -> Option<String> {
        TargetInfo {
            models: vec![],
            version: serde_json::from_str(body).ok(),
        }
        .version_text()
    }

    /// Issue 39, polish: the console printed `Target version: {"version":"0.11.0"}`.
    #[test]
    fn the_version_prints_as_text_not_json() {
        assert_eq!(text(r#"{"version":"0.11.0"}"#).as_deref(), Some("0.11.0"));
        assert_eq!(
            text(r#"{"version":"0.5.1","commit":"abc"}"#).as_deref(),
            Some("0.5.1 (commit abc)")
        );
        assert_eq!(text(r#""1.2""#).as_deref(), Some("1.2"));
        assert_eq!(text(r#"{"v":[1]}"#).as_deref(), Some(r#"{"v":[1]}"#));
        assert_eq!(text("not json"), None);
    }
}
