//! The rule a level is judged by, shared by a run's verdict ([`crate::run_verdict`]), a sweep's
//! levels and the capacity answer (`reporting::capacity`): every numeric figure of a level's
//! results over its runs ([`LevelPoint`], [`Stat`]), each SLO's percentile within its limit
//! and server-caused failures within [`MAX_ERROR_FRACTION`] ([`check_level`]).

use std::collections::BTreeMap;

use serde::Serialize;
use trace_format::stats::percentile_label;

use crate::doc::ResultDoc;
use replay::config::Slo;

/// A level with more server-caused failures than this fraction of the requests the server was
/// asked to serve breaks the SLO, whatever its latencies (vLLM's percentiles are over
/// completed requests only). The client's and the replay's outcomes (`trace_format::cause`)
/// are not in it.
pub const MAX_ERROR_FRACTION: f64 = 0.01;

/// Mean and spread of one figure over the repeated runs of a level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stat {
    /// Runs with a value.
    pub n: usize,
    /// Mean over runs.
    pub mean: f64,
    /// Sample standard deviation over runs (None with one run: no spread measured).
    pub std: Option<f64>,
    /// Smallest run value.
    pub min: f64,
    /// Largest run value.
    pub max: f64,
}

impl Stat {
    /// Mean and spread of `values` (None when empty).
    pub fn of(values: &[f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n as f64;
        let std = (n > 1).then(|| {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        });
        Some(Stat {
            n,
            mean,
            std,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }

    /// A single value (one run).
    pub fn one(v: f64) -> Stat {
        Stat {
            n: 1,
            mean: v,
            std: None,
            min: v,
            max: v,
        }
    }
}

/// One load level of one configuration: every numeric figure of its results, over runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelPoint {
    /// The axis value.
    pub level: f64,
    /// Runs at this level.
    pub runs: usize,
    /// Numeric top-level keys of the vLLM result (`request_throughput`, `p95_ttft_ms`, ...).
    pub values: BTreeMap<String, Stat>,
    /// Server-caused failures / requests the server was asked to serve, mean over runs
    /// (failed / sent for results that do not count causes: vLLM's, older ones).
    pub failed_fraction: f64,
    /// Requests per cause of their outcome, summed over runs (zero for results that do not
    /// count causes).
    pub causes: trace_format::CauseCounts,
    /// The workload its first run replayed (`llmreplay.workload`; None for results that
    /// predate it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<trace_format::inspect_card::WorkloadCard>,
}

impl LevelPoint {
    /// Aggregates the vLLM-style results of the runs of one level.
    pub fn from_results(level: f64, results: &[&ResultDoc]) -> LevelPoint {
        let mut acc: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut fails = Vec::new();
        let mut causes = trace_format::CauseCounts::default();
        for r in results {
            for (k, x) in r.numbers() {
                acc.entry(k).or_default().push(x);
            }
            if let Some(s) = r.llmreplay.as_ref().and_then(|o| o.served.steady.as_ref()) {
                acc.entry(STEADY_KEY.into())
                    .or_default()
                    .push(s.request_throughput);
            }
            if let Some(o) = r.llmreplay.as_ref().and_then(|o| o.served.offered_rps) {
                acc.entry(OFFERED_KEY.into()).or_default().push(o);
            }
            // One failure count everywhere: failed by the server, the client's own apart.
            let (server, client) = match r.llmreplay.as_ref().and_then(|o| o.outcome_causes) {
                Some(c) => {
                    causes.merge(&c);
                    fails.push(c.server_failed_fraction());
                    (c.server, c.client + c.replay)
                }
                None => {
                    let sent = r.vllm.num_prompts as f64;
                    let failed = r.vllm.failed as f64;
                    fails.push(if sent > 0.0 { failed / sent } else { 0.0 });
                    (r.vllm.failed, 0)
                }
            };
            acc.entry(SERVER_FAILED_KEY.into())
                .or_default()
                .push(server as f64);
            acc.entry(CLIENT_OWN_KEY.into())
                .or_default()
                .push(client as f64);
        }
        LevelPoint {
            level,
            runs: results.len(),
            values: acc
                .into_iter()
                .filter_map(|(k, v)| Stat::of(&v).map(|s| (k, s)))
                .collect(),
            failed_fraction: Stat::of(&fails).map_or(0.0, |s| s.mean),
            causes,
            workload: results
                .iter()
                .find_map(|r| r.llmreplay.as_ref()?.workload.clone()),
        }
    }

    /// Requests per second this level sustained: its steady-state throughput (ramp-up and
    /// drain left out, see `replay::served`), else, for results that lack one (too short,
    /// or older), the whole run's `request_throughput`.
    pub fn served_rps(&self) -> Option<f64> {
        self.mean(STEADY_KEY)
            .or_else(|| self.mean("request_throughput"))
    }

    /// The load this level offered: requests due per second over its schedule, from the
    /// first due to the last (mean over runs); None for results without it (a closed loop,
    /// `--request-rate inf`, or older results). The one offered load of a level, everywhere.
    pub fn offered_rps(&self) -> Option<f64> {
        self.mean(OFFERED_KEY)
    }

    /// The mean of a figure, when present.
    pub fn mean(&self, key: &str) -> Option<f64> {
        self.values.get(key).map(|s| s.mean)
    }

    /// A figure with its spread.
    pub fn stat(&self, key: &str) -> Option<&Stat> {
        self.values.get(key)
    }
}

/// Where a level keeps its steady-state throughput among its figures.
pub const STEADY_KEY: &str = "steady_request_throughput";
/// Where a level keeps its offered load among its figures ([`LevelPoint::offered_rps`]).
pub const OFFERED_KEY: &str = "offered_request_rate";
/// Where a level keeps the requests failed by the server among its figures (per run:
/// `llmreplay.outcome_causes.server`, else vLLM's `failed` for results without causes).
pub const SERVER_FAILED_KEY: &str = "failed_by_server";
/// Where a level keeps the client's own outcomes (cancellations replayed at their point, 4xx
/// as captured) and the replay's, per run: no failures of the server.
pub const CLIENT_OWN_KEY: &str = "client_own";

/// The vLLM key of percentile `p` of an SLO metric: `p95_ttft_ms`.
pub fn pct_key(p: f64, metric: &str) -> String {
    format!("p{}_{metric}_ms", percentile_label(p))
}

/// One SLO checked at one level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloCheck {
    /// `ttft`, `tpot` or `e2el`.
    pub metric: String,
    /// The percentile value, ms (None when the result lacks that percentile).
    pub value_ms: Option<f64>,
    /// The SLO, ms.
    pub limit_ms: f64,
    /// value ≤ limit.
    pub ok: bool,
}

/// Checks every SLO at `p`'s chosen percentile, plus the error rule.
pub fn check_level(p: &LevelPoint, slos: &[Slo], pct: f64) -> (Vec<SloCheck>, bool) {
    let checks: Vec<SloCheck> = slos
        .iter()
        .map(|s| {
            let v = p.mean(&pct_key(pct, s.metric.key()));
            SloCheck {
                metric: s.metric.key().into(),
                value_ms: v,
                limit_ms: s.limit_ms,
                ok: v.is_some_and(|v| v <= s.limit_ms),
            }
        })
        .collect();
    let errors_ok = p.failed_fraction <= MAX_ERROR_FRACTION;
    let ok = errors_ok && checks.iter().all(|c| c.ok);
    (checks, ok)
}
