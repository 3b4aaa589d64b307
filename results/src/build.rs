//! What a run's JSON result is made of: the dispatch-lag verdict, the trace's identity, the
//! prompt note, and the [`ResultDoc`] of one run (vLLM's key names, ours under `llmreplay`).
//! The console report and the side-by-side table are `reporting::console`'s.

use serde_json::Value;
use trace_format::stats::percentile_label;

use crate::doc::{
    ClassDoc, ClientDoc, ConnectionsDoc, DriftDoc, Extension, Extras, InterruptedDoc, RequestRate,
    ResultDoc, ServerHistogramsDoc, SlicesDoc, SoakDoc, SummaryDoc, TargetDoc, TopError, TraceDoc,
    TrendDoc, VllmFields,
};
use crate::settings::RunSettings;
use replay::config::{Arrivals, ReplayConfig, SloMetric};
use replay::metrics::Metrics;
use replay::run::RunOutput;

pub use crate::doc::{is_result_key, Verdict};

/// Client CPU utilisation above which it is said to be saturated.
pub const CPU_LIMIT: f64 = 0.9;

/// Whether the client's lateness could have changed the reported numbers: more than 1% of the
/// requests, and more than one, were sent later than the run's lag allowance (10% of the
/// mean gap between requests, or of the median E2EL when all were due at once; at least
/// 1 ms; see [`Metrics::lag_allowance_ms`]). Each latency is timed from its request's
/// actual send, so lateness matters through the load it changes: 1.2 ms at 8 req/s does
/// not, 1.2 ms on a 2 ms schedule does. Counted that way, a run of a few dozen requests is
/// not condemned by one scheduling hiccup either.
pub fn lag_too_high(m: &Metrics) -> bool {
    m.late_dispatches > (m.num_prompts / 100).max(1)
}

/// Judges whether the client kept up, and whether the target served the offered load.
pub fn verdict(m: &Metrics, run: &RunOutput) -> Verdict {
    let p99 = m.dispatch_lag.get(99.0).unwrap_or(0.0);
    let allow = m.lag_allowance_ms;
    let cpu = run.client_load.as_ref().map(|c| c.utilization);
    let lag_bad = lag_too_high(m);
    let cpu_bad = cpu.is_some_and(|c| c > CPU_LIMIT);
    let late = format!(
        "{} of {} requests sent over {allow:.1} ms late, the lateness that could change the load \
         (10% of the mean gap between requests, or of the median E2EL when all were due at \
         once; at least 1 ms)",
        m.late_dispatches, m.num_prompts
    );
    let mut message = match (lag_bad, cpu_bad) {
        (false, false) => format!(
            "OK: the client kept up (dispatch lag p99 {p99:.3} ms; {late}{}).",
            cpu.map(|c| format!("; client CPU {:.0}%", c * 100.0))
                .unwrap_or_default()
        ),
        _ => format!(
            "WARNING: the client could not keep up ({}{}): {} Use fewer requests per process, \
             --client-threads, or shard across processes.",
            if lag_bad {
                format!("dispatch lag p99 {p99:.3} ms; {late}")
            } else {
                String::new()
            },
            match (lag_bad, cpu_bad) {
                (true, true) => format!("; client CPU {:.0}%", cpu.unwrap_or(0.0) * 100.0),
                (false, true) => format!("client CPU {:.0}%", cpu.unwrap_or(0.0) * 100.0),
                _ => String::new(),
            },
            if cpu_bad {
                "the server did not get the load asked for, and a busy client reads late: chunks \
                 that arrive between two of its reads share the later time. These are NOT clean \
                 server figures."
            } else {
                "requests left later than scheduled, so the server did not get the load asked \
                 for (each latency is still timed from its request's actual send)."
            }
        ),
    };
    if let Some(o) = &m.served.overload {
        message = format!("{}\n{message}", o.message());
    }
    Verdict {
        lag_p50_ms: m.dispatch_lag.get(50.0).unwrap_or(0.0),
        lag_p99_ms: p99,
        lag_max_ms: m.dispatch_lag.max,
        lag_allowance_ms: allow,
        client_cpu_utilization: cpu,
        client_saturated: lag_bad || cpu_bad,
        target_overloaded: m.served.overload.is_some(),
        message,
    }
}

/// Identity of the replayed trace, for provenance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TraceIdentity {
    /// Input files.
    pub files: Vec<String>,
    /// Rows in the input.
    pub rows: usize,
    /// Stable hash of (request_id, arrival_time) of every row, hex.
    pub content_hash: String,
}

/// Computes the identity of a trace.
pub fn trace_identity(trace: &trace_format::Trace) -> TraceIdentity {
    let mut h = RowsHash::default();
    trace.records.iter().for_each(|r| h.add(r));
    TraceIdentity {
        files: trace
            .files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect(),
        rows: trace.records.len(),
        content_hash: h.hex(),
    }
}

/// [`TraceIdentity::content_hash`] of rows added one at a time, in the trace's order: the
/// trace's own [`trace_format::ContentHash`], for rows that are streamed rather than held.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowsHash(trace_format::ContentHash);

impl RowsHash {
    /// Adds the next row.
    pub fn add(&mut self, r: &trace_format::TraceRecord) {
        self.0.add(&r.request_id, r.arrival_time_us);
    }

    /// The hash, hex.
    pub fn hex(&self) -> String {
        self.0.finish()
    }
}

/// Everything the JSON result is made of.
pub struct ResultInputs<'a> {
    /// The configuration.
    pub cfg: &'a ReplayConfig,
    /// The run.
    pub run: &'a RunOutput,
    /// Its metrics.
    pub metrics: &'a Metrics,
    /// The trace's identity.
    pub trace: &'a TraceIdentity,
    /// The exact command line.
    pub command: &'a str,
    /// Add vLLM's per-request arrays.
    pub detailed: bool,
}

/// How exact the lengths of synthesized prompts (rows without a body) are.
pub fn prompt_lengths(cfg: &ReplayConfig) -> String {
    match &cfg.request.tokenizer {
        Some(t) => format!(
            "exact for tokenizer {} ({})",
            t.tokenizer().name(),
            match cfg.request.endpoint {
                Some(replay::config::EndpointKind::Completions) => "completions prompt",
                Some(
                    replay::config::EndpointKind::Chat
                    | replay::config::EndpointKind::Responses
                    | replay::config::EndpointKind::Messages,
                ) => "message content; the template adds its own",
                None => "completions prompt; for other APIs' rows the message content, the template adds its own",
            }
        ),
        None => "word filler: exact for the llmreplay sim, approximate for other targets (use --tokenizer)".into(),
    }
}

/// What the run's prompts were: how they were synthesized, or that the rows' recorded bodies
/// were sent (all, or how many).
pub fn prompt_note(cfg: &ReplayConfig, run: &RunOutput) -> String {
    let (b, n) = (run.bodies_replayed, run.plan_len);
    match b {
        0 => prompt_lengths(cfg),
        _ if b >= n => format!("none: all {n} requests sent their recorded bodies"),
        _ => format!(
            "{} for {} requests; {b} sent their recorded bodies",
            prompt_lengths(cfg),
            n - b
        ),
    }
}

/// The settings of `cfg` that its results report (and `--results` files record for merge).
pub fn run_settings(cfg: &ReplayConfig) -> RunSettings {
    let (request_rate, burstiness) = match cfg.arrivals {
        Arrivals::Rate { rate, burstiness } => (
            if rate.is_infinite() {
                RequestRate::Infinite
            } else {
                RequestRate::PerSecond(rate)
            },
            Some(burstiness),
        ),
        Arrivals::Recorded { .. } => (RequestRate::Trace, None),
    };
    let (speedup, mode) = match cfg.arrivals {
        Arrivals::Recorded { speedup } => (Some(speedup), "recorded"),
        Arrivals::Rate { .. } => (None, "rate"),
    };
    RunSettings {
        tokenizer_id: cfg
            .request
            .tokenizer
            .as_ref()
            .map(|t| t.tokenizer().name().to_string()),
        request_rate,
        burstiness,
        max_concurrency: cfg.max_concurrency.map(|c| c as u64),
        arrivals: mode.into(),
        speedup,
        start_offset_s: cfg.selection.start_offset.as_secs_f64(),
        window_s: cfg.selection.duration.map(|d| d.as_secs_f64()),
        sample_ratio: cfg.selection.sample_ratio,
        max_requests: cfg.selection.max_requests.map(|n| n as u64),
        session_mode: format!("{:?}", cfg.session_mode).to_lowercase(),
        seed: cfg.seed,
        prompt_salt: cfg.request.prompt_salt,
    }
}

/// The JSON result: vLLM's key names for what vLLM reports, ours under `llmreplay`.
pub fn result_doc(i: &ResultInputs) -> ResultDoc {
    let settings = run_settings(i.cfg);
    ResultDoc {
        vllm: vllm_fields(i, &settings),
        llmreplay: Some(extension(i, &settings)),
        extras: extras(i.cfg, i.metrics),
    }
}

/// The latency keys of every `--percentile-metrics` metric (`mean_ttft_ms`, `p99_ttft_ms`,
/// …) and `--metadata`.
fn extras(cfg: &ReplayConfig, m: &Metrics) -> Extras {
    let mut extras = Extras::default();
    for (k, v) in &cfg.metadata {
        extras.metadata.insert(k.clone(), Value::String(v.clone()));
    }
    // TTFAT's keys go with TTFT's, when some request reasoned (else they would equal them).
    // An SLO on TTFAT needs its keys in every run (a sweep judges levels by them): without
    // reasoning they are TTFT's.
    let slo = cfg.goodput.iter().any(|s| s.metric == SloMetric::Ttfat);
    let with_ttft = cfg.percentile_metrics.iter().any(|pm| pm.key() == "ttft");
    let ttfat = match &m.ttfat {
        Some(s) if with_ttft || slo => Some(s),
        _ => slo.then_some(&m.ttft),
    }
    .map(|s| ("ttfat", s));
    let asked = cfg.percentile_metrics.iter().map(|pm| {
        let s = match pm.key() {
            "ttft" => &m.ttft,
            "tpot" => &m.tpot,
            "itl" => &m.itl,
            _ => &m.e2el,
        };
        (pm.key(), s)
    });
    for (key, s) in asked.chain(ttfat) {
        let l = &mut extras.latency;
        l.insert(format!("mean_{key}_ms"), s.mean);
        l.insert(format!("median_{key}_ms"), s.median);
        l.insert(format!("std_{key}_ms"), s.std);
        for (p, v) in &s.percentiles {
            l.insert(format!("p{}_{key}_ms", percentile_label(*p)), *v);
        }
    }
    extras
}

/// vLLM's keys: the run's totals and rates, and with `--save-detailed` its per-request arrays.
fn vllm_fields(i: &ResultInputs, settings: &RunSettings) -> VllmFields {
    let (cfg, run, m) = (i.cfg, i.run, i.metrics);
    let recs = &run.records;
    let mut v = VllmFields {
        date: chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string(),
        backend: if run.endpoints.keys().any(|e| e.contains("chat"))
            || recs.iter().any(|r| r.endpoint.contains("chat"))
        {
            "openai-chat"
        } else {
            "openai"
        }
        .into(),
        model_id: run.model.clone(),
        tokenizer_id: settings.tokenizer_id.clone(),
        num_prompts: m.num_prompts as u64,
        request_rate: settings.request_rate,
        burstiness: settings.burstiness,
        max_concurrency: settings.max_concurrency,
        label: cfg.label.clone(),
        duration: m.duration_s,
        completed: m.completed as u64,
        failed: m.failed as u64,
        total_input_tokens: m.total_input_tokens,
        total_output_tokens: m.total_output_tokens,
        request_throughput: m.request_throughput,
        request_goodput: m.request_goodput,
        output_throughput: m.output_throughput,
        total_token_throughput: m.total_token_throughput,
        max_concurrent_requests: m.max_concurrent_requests as u64,
        ..Default::default()
    };
    if i.detailed {
        add_detailed(&mut v, recs);
    }
    v
}

/// `--save-detailed`: vLLM's per-request arrays (zeros and empty gaps for failed requests).
fn add_detailed(v: &mut VllmFields, recs: &[trace_format::TraceRecord]) {
    let ok = |r: &trace_format::TraceRecord| r.outcome == trace_format::Outcome::Ok;
    v.input_lens = Some(recs.iter().map(|r| r.prompt_tokens.unwrap_or(0)).collect());
    v.output_lens = Some(
        recs.iter()
            .map(|r| {
                if ok(r) {
                    r.output_tokens.unwrap_or(0)
                } else {
                    0
                }
            })
            .collect(),
    );
    v.ttfts = Some(
        recs.iter()
            .map(|r| {
                if ok(r) {
                    replay::metrics::ttft_ms(r).unwrap_or(0.0) / 1e3
                } else {
                    0.0
                }
            })
            .collect(),
    );
    v.itls = Some(
        recs.iter()
            .map(|r| {
                if ok(r) {
                    r.chunk_times_us
                        .windows(2)
                        .map(|w| (w[1] - w[0]) as f64 / 1e6)
                        .collect()
                } else {
                    Vec::new()
                }
            })
            .collect(),
    );
    v.errors = Some(
        recs.iter()
            .map(|r| r.error.clone().unwrap_or_default())
            .collect(),
    );
}

/// `llmreplay.server_histograms`: the server's histograms with the client's TTFT beside them
/// (None without `--server-metrics`).
fn server_histograms_doc(run: &RunOutput, m: &Metrics) -> Option<ServerHistogramsDoc> {
    if run.server_histograms.is_empty() {
        return None;
    }
    Some(ServerHistogramsDoc {
        client_ttft_mean_ms: Some(m.ttft.mean),
        ttft_gap_ms: run
            .server_histograms
            .get("ttft_ms")
            .filter(|t| t.count > 0.0)
            .map(|t| m.ttft.mean - t.mean),
        histograms: run.server_histograms.clone(),
    })
}

/// `llmreplay.slices` of a run cut into `width` slices: every slice, and the drift of p95
/// TTFT, p95 TPOT and the completion rate over the run ([`replay::soak::trend`]). A last
/// slice shorter than half the width is left out of the trends.
pub fn slices_doc(s: &[replay::soak::Slice], width: std::time::Duration) -> SlicesDoc {
    use replay::soak::{trend, Slice};
    let w = width.as_secs_f64();
    let mid = |x: &Slice| (x.start_s + x.end_s) / 2.0;
    let drift = |f: &dyn Fn(&Slice) -> Option<f64>| {
        let points: Vec<(f64, f64)> = s
            .iter()
            .filter(|x| x.end_s - x.start_s >= w / 2.0)
            .filter_map(|x| Some((mid(x), f(x)?)))
            .collect();
        trend(&points).map(TrendDoc::from)
    };
    SlicesDoc {
        slice_s: w,
        slices: s.to_vec(),
        drift: DriftDoc {
            p95_ttft_ms: drift(&|x| x.ttft_ms.map(|p| p.p95)),
            p95_tpot_ms: drift(&|x| x.tpot_ms.map(|p| p.p95)),
            completed_per_s: drift(&|x| (x.requests > 0).then_some(x.completed_per_s)),
        },
    }
}

/// `llmreplay.trace`: what was replayed, and how.
fn trace_doc(i: &ResultInputs, settings: &RunSettings) -> TraceDoc {
    let run = i.run;
    TraceDoc {
        files: i.trace.files.clone(),
        rows: i.trace.rows as u64,
        content_hash: i.trace.content_hash.clone(),
        selected_rows: run.plan_len as u64,
        span_s: run.trace_span.as_secs_f64(),
        skipped_rows: run.skipped.len() as u64,
        skipped_examples: run
            .skipped
            .iter()
            .take(5)
            .map(|(id, why)| format!("{id}: {why}"))
            .collect(),
        arrivals: settings.arrivals.clone(),
        speedup: settings.speedup,
        start_offset_s: settings.start_offset_s,
        window_s: settings.window_s,
        sample_ratio: settings.sample_ratio,
        max_requests: settings.max_requests,
        session_mode: settings.session_mode.clone(),
        seed: settings.seed,
        prompt_salt: settings.prompt_salt,
        synthesized_prompts: prompt_note(i.cfg, run),
        recorded_bodies_replayed: run.bodies_replayed as u64,
    }
}

/// `llmreplay`: everything vLLM's keys do not say.
fn extension(i: &ResultInputs, settings: &RunSettings) -> Extension {
    let (cfg, run, m) = (i.cfg, i.run, i.metrics);
    Extension {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        command: i.command.into(),
        run_id: run.run_id.clone(),
        started_at: chrono::DateTime::from_timestamp_micros(run.started_at_us)
            .map(|t| t.to_rfc3339()),
        target: TargetDoc {
            name: run.target.name.clone(),
            url: run.target.url.clone(),
            models: run.target_info.models.clone(),
            version: run.target_info.version.clone(),
        },
        trace: trace_doc(i, settings),
        goodput_slos: cfg
            .goodput
            .iter()
            .map(|s| (s.metric.key().to_string(), s.limit_ms))
            .collect(),
        slo_attainment: m.slo_attainment,
        slo_pass: slo_pass(cfg, m),
        verdict: Some(run_verdict(cfg, m)),
        outcome_causes: Some(m.causes),
        dispatch_lag_ms: SummaryDoc::of(&m.dispatch_lag),
        client_queue_ms: SummaryDoc::of(&m.queue),
        connections: ConnectionsDoc {
            preconnected: run.preconnected as u64,
            new_during_run: m.new_connections as u64,
            reused: run.pool.map(|p| p.reused),
            found_closed: run.pool.map(|p| p.found_closed),
            expired_idle: run.pool.map(|p| p.expired),
            connect_ms: SummaryDoc::of(&m.connect),
        },
        client: ClientDoc {
            load: run.client_load.clone(),
            verdict: Some(verdict(m, run)),
            validity: crate::validity::of_run(cfg, m, run),
        },
        e2el_ms: SummaryDoc::of(&m.e2el),
        metric_requests: m.coverage.into(),
        served: m.served.clone(),
        by_class: (!m.by_class.is_empty()).then(|| {
            m.by_class
                .iter()
                .map(|c| ClassDoc {
                    endpoint: c.endpoint.clone(),
                    stream: c.stream,
                    requests: c.requests as u64,
                    completed: c.completed as u64,
                    output_tokens: c.output_tokens,
                    ttft_ms: c.ttft.as_ref().map(SummaryDoc::of),
                    ttfat_ms: c.ttfat.as_ref().map(SummaryDoc::of),
                    tpot_ms: c.tpot.as_ref().map(SummaryDoc::of),
                    itl_ms: c.itl.as_ref().map(SummaryDoc::of),
                    e2el_ms: SummaryDoc::of(&c.e2el),
                })
                .collect()
        }),
        itl_per_token_ms: m.itl_per_token.as_ref().map(SummaryDoc::of),
        ttfat_ms: m.ttfat.as_ref().map(SummaryDoc::of),
        total_reasoning_tokens: m.total_reasoning_tokens,
        outcomes: m
            .outcomes
            .iter()
            .map(|(k, v)| (k.clone(), *v as u64))
            .collect(),
        workload: Some(m.workload.clone()),
        top_errors: m
            .top_errors
            .iter()
            .map(|e| TopError {
                outcome: e.outcome.clone(),
                error: e.text.clone(),
                requests: e.requests as u64,
                cause: Some(e.cause),
            })
            .collect(),
        output_token_sources: m
            .output_token_sources
            .iter()
            .map(|(k, v)| (k.clone(), *v as u64))
            .collect(),
        warmups: run.warmups as u64,
        server_gauges: (!run.server_gauges.is_empty()).then(|| run.server_gauges.clone()),
        server_histograms: server_histograms_doc(run, m),
        soak: cfg.soak.loops.map(|l| SoakDoc {
            loops: l.to_string(),
            passes: run.passes.max(replay::soak::passes_replayed(&run.records)) as u64,
        }),
        slices: cfg.soak.slice.map(|w| {
            let s = replay::soak::slices(&run.records, run.started_at_us, w, &cfg.goodput);
            slices_doc(&s, w)
        }),
        sweep: None,
        merge: None,
        interrupted: interrupted_doc(run, m),
    }
}

/// `llmreplay.interrupted` of a run that was stopped (None when it completed).
pub fn interrupted_doc(run: &RunOutput, m: &Metrics) -> Option<InterruptedDoc> {
    let i = run.interrupted.as_ref()?;
    Some(InterruptedDoc {
        reason: i.reason.clone(),
        schedule_reached_s: i.after.as_secs_f64(),
        schedule_span_s: Some(run.trace_span.as_secs_f64()),
        sent: Some(i.sent as u64),
        not_sent: i.not_sent.map(|n| n as u64),
        cancelled: Some(i.cancelled as u64),
        finished: m.num_prompts as u64,
    })
}

/// [`result_doc`] as JSON.
pub fn result_json(i: &ResultInputs) -> Value {
    result_doc(i).to_value()
}

/// A run without rows against `target`: the start of a run assembled from elsewhere (the
/// merge of shards) and of test fixtures.
pub fn empty_run(target: replay::config::Target) -> RunOutput {
    RunOutput {
        target,
        target_info: Default::default(),
        model: String::new(),
        run_id: String::new(),
        started_at_us: 0,
        records: Vec::new(),
        plan_len: 0,
        bodies_replayed: 0,
        skipped: Default::default(),
        trace_span: std::time::Duration::ZERO,
        wall: std::time::Duration::ZERO,
        preconnected: 0,
        pool: None,
        warmups: 0,
        peak_built: 0,
        client_load: None,
        client_timing: None,
        server_gauges: Default::default(),
        server_histograms: Default::default(),
        interrupted: None,
        endpoints: Default::default(),
        passes: 0,
    }
}

/// The run's verdict ([`crate::run_verdict::judge`]) against the configuration's SLOs at its
/// SLO percentile.
pub fn run_verdict(cfg: &ReplayConfig, m: &Metrics) -> crate::run_verdict::RunVerdict {
    crate::run_verdict::judge_metrics(m, &cfg.goodput, cfg.slo_percentile)
}

/// The run's verdict as `slo_pass`: None without SLOs.
pub fn slo_pass(cfg: &ReplayConfig, m: &Metrics) -> Option<bool> {
    (!cfg.goodput.is_empty()).then(|| run_verdict(cfg, m).pass)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_format::TraceRecord;

    /// `llmreplay.slices`: every slice kept, the trends over the full-width ones only, a
    /// trend from 0 without a ratio (written null), a series with fewer than two values
    /// without a trend.
    #[test]
    fn slices_doc_keeps_every_slice_and_trends_the_full_ones() {
        use replay::soak::{Slice, SlicePercentiles};
        let p95 = |v: f64| {
            Some(SlicePercentiles {
                p50: v / 2.0,
                p95: v,
                p99: v,
            })
        };
        let slice = |i: usize, len: f64, ttft: f64, done: f64| Slice {
            start_s: i as f64 * 10.0,
            end_s: i as f64 * 10.0 + len,
            requests: 2,
            completed_per_s: done,
            ttft_ms: p95(ttft),
            ..Default::default()
        };
        let s = vec![
            slice(0, 10.0, 290.0, 0.0),
            slice(1, 10.0, 500.0, 0.2),
            slice(2, 4.0, 9000.0, 0.3), // under half the width: no trend point
        ];
        let d = slices_doc(&s, std::time::Duration::from_secs(10));
        assert_eq!((d.slice_s, d.slices.len()), (10.0, 3));
        let t = d.drift.p95_ttft_ms.unwrap();
        assert_eq!((t.slices, t.first, t.last), (2, 290.0, 500.0));
        assert!(t.slope_per_hour > 0.0 && t.ratio.is_some());
        let c = d.drift.completed_per_s.unwrap();
        assert_eq!((c.first, c.ratio), (0.0, None));
        assert_eq!(d.drift.p95_tpot_ms, None);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["drift"]["completed_per_s"]["ratio"], Value::Null);
        assert_eq!(v["drift"]["p95_tpot_ms"], Value::Null);
        assert_eq!(v["slices"][2]["tpot_ms"], Value::Null);
    }

    fn run_with_lags(lags_us: &[i64]) -> Metrics {
        let recs: Vec<TraceRecord> = lags_us
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let mut r = TraceRecord::new(format!("r{i}"), i as i64 * 1000, "/v1/completions");
                r.dispatch_lag_us = Some(*l);
                r
            })
            .collect();
        replay::metrics::compute(&recs, 0, &[], &[50.0, 99.0])
    }

    #[test]
    fn one_hiccup_in_a_small_run_is_not_a_saturated_client() {
        let mut lags = vec![50; 24];
        lags[7] = 2_500;
        assert!(!lag_too_high(&run_with_lags(&lags)));
        lags[9] = 1_800;
        assert!(
            lag_too_high(&run_with_lags(&lags)),
            "two late sends in 24 is more than 1%"
        );
        // Large runs: more than 1% over 1 ms is p99 above 1 ms.
        let mut big = vec![50; 1000];
        for l in big.iter_mut().take(10) {
            *l = 3_000;
        }
        assert!(!lag_too_high(&run_with_lags(&big)), "exactly 1% late");
        big[10] = 3_000;
        big[11] = 3_000;
        assert!(lag_too_high(&run_with_lags(&big)));
    }

    /// `n` streamed requests `gap_ms` apart, each sent `lag_us` late, TTFT `ttft_ms`.
    fn paced(n: usize, gap_ms: f64, lag_us: i64, ttft_ms: f64) -> Metrics {
        let recs: Vec<TraceRecord> = (0..n)
            .map(|i| {
                let due = (i as f64 * gap_ms * 1e3) as i64;
                let mut r = TraceRecord::new(format!("r{i}"), due + lag_us, "/v1/completions");
                r.scheduled_offset_us = Some(due);
                r.dispatch_lag_us = Some(lag_us);
                r.stream = true;
                r.ttft_us = Some((ttft_ms * 1e3) as i64);
                r.chunk_times_us = vec![r.ttft_us.unwrap(), r.ttft_us.unwrap() + 5_000];
                r.e2el_us = Some(r.chunk_times_us[1]);
                r.output_tokens = Some(2);
                r
            })
            .collect();
        replay::metrics::compute(&recs, 0, &[], &[50.0, 99.0])
    }

    #[test]
    fn the_prompt_line_says_when_recorded_bodies_were_sent() {
        let cfg = ReplayConfig::new(vec![]);
        let mut run = run_output(0.1);
        run.plan_len = 10;
        assert!(prompt_note(&cfg, &run).starts_with("word filler"));
        run.bodies_replayed = 10;
        assert_eq!(
            prompt_note(&cfg, &run),
            "none: all 10 requests sent their recorded bodies"
        );
        run.bodies_replayed = 4;
        let mixed = prompt_note(&cfg, &run);
        assert!(
            mixed.starts_with("word filler")
                && mixed.ends_with("for 6 requests; 4 sent their recorded bodies"),
            "{mixed}"
        );
    }

    #[test]
    fn lateness_is_judged_against_what_it_could_change() {
        // docs/replay.md's first example: 8 req/s, every send 1.24 ms late. The allowance is 10%
        // of the 125 ms gap: the load it changed is not worth a warning.
        let m = paced(200, 125.0, 1_240, 812.0);
        assert!(
            (m.lag_allowance_ms - 12.5).abs() < 1e-9,
            "{}",
            m.lag_allowance_ms
        );
        let v = verdict(&m, &run_output(0.01));
        assert!(!v.client_saturated, "{}", v.message);
        assert!(v.message.starts_with("OK"), "{}", v.message);
        // The same lag against a 10 ms TTFT on a 2 ms schedule: over the 1 ms floor on
        // every request, a load that was not the one asked for.
        let m = paced(200, 2.0, 1_240, 10.0);
        assert_eq!(m.lag_allowance_ms, 1.0);
        let v = verdict(&m, &run_output(0.01));
        assert!(v.client_saturated, "{}", v.message);
        // 3 ms late at 50 req/s (allowance 2 ms): flagged; 1.5 ms is not.
        let v = verdict(&paced(200, 20.0, 3_000, 40.0), &run_output(0.01));
        assert!(v.client_saturated, "{}", v.message);
        let v = verdict(&paced(200, 20.0, 1_500, 40.0), &run_output(0.01));
        assert!(!v.client_saturated, "{}", v.message);
        // All due at once (a closed loop): judged against the slot's E2EL (here 45 ms).
        let mut m = paced(200, 0.0, 3_000, 40.0);
        assert!(
            (m.lag_allowance_ms - 4.5).abs() < 1e-9,
            "{}",
            m.lag_allowance_ms
        );
        m.late_dispatches = 0;
        assert!(!verdict(&m, &run_output(0.01)).client_saturated);
    }

    fn run_output(cpu_utilization: f64) -> RunOutput {
        let mut run = empty_run(replay::config::Target {
            name: "t".into(),
            url: "http://127.0.0.1:1".into(),
        });
        run.model = "m".into();
        run.run_id = "r".into();
        run.wall = std::time::Duration::from_secs(1);
        run.client_load = Some(replay::run::ClientLoad {
            cpu_seconds: cpu_utilization,
            worker_threads: 1,
            utilization: cpu_utilization,
            pacer_cpu_seconds: 0.0,
        });
        run
    }

    #[test]
    fn the_verdict_says_what_a_late_schedule_and_a_busy_client_each_spoil() {
        let late = run_with_lags(&[3_000; 100]);
        let on_time = run_with_lags(&[50; 100]);
        let ok = verdict(&on_time, &run_output(0.3));
        assert!(!ok.client_saturated);
        assert!(ok.message.starts_with("OK"), "{}", ok.message);
        assert!(
            ok.message
                .contains("dispatch lag p99 0.050 ms; 0 of 100 requests sent over 1.0 ms late"),
            "{}",
            ok.message
        );
        // One late send in 24: p99 over 1 ms (a short run's p99 is near its maximum), but
        // within the rule; the message must not claim the p99 was within 1 ms.
        let mut one = vec![50; 24];
        one[3] = 4_000;
        let hiccup = verdict(&run_with_lags(&one), &run_output(0.3));
        assert!(!hiccup.client_saturated);
        assert!(
            hiccup
                .message
                .contains("1 of 24 requests sent over 1.0 ms late"),
            "{}",
            hiccup.message
        );
        // Late sends, CPU to spare: the load was not the one asked for, but each latency is
        // timed from its own send.
        let lag = verdict(&late, &run_output(0.3));
        assert!(lag.client_saturated);
        assert!(lag
            .message
            .starts_with("WARNING: the client could not keep up (dispatch lag"));
        assert!(
            lag.message.contains("timed from its request's actual send"),
            "{}",
            lag.message
        );
        assert!(!lag.message.contains("NOT clean"), "{}", lag.message);
        // A busy client also reads late: the figures themselves are suspect.
        let busy = verdict(&on_time, &run_output(0.95));
        assert!(busy.client_saturated);
        assert!(busy.message.contains("client CPU 95%"), "{}", busy.message);
        assert!(
            busy.message.contains("NOT clean server figures"),
            "{}",
            busy.message
        );
    }
}
