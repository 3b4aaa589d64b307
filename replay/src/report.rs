//! What a run tells people: the console report (definitions table first, then results as
//! the seed report asks), the JSON result with vLLM's key names, the dispatch-lag verdict,
//! and the side-by-side table of a multi-target run.

use std::fmt::Write as _;

use serde_json::{json, Map, Value};
use trace_format::stats::{percentile_label, Summary};

use crate::config::{Arrivals, ReplayConfig};
use crate::metrics::Metrics;
use crate::run::RunOutput;

/// The definitions table printed above every result (../shared/docs/metrics.md).
pub const DEFINITIONS: &str = "\
Metric definitions (vLLM's `vllm bench serve`; measured at the client from t0 = request written):
  TTFT      time of the first chunk with output - t0 (a chunk = an SSE event with non-empty `choices`;
            output = text, content, reasoning or a tool call: a chat role-only or empty chunk is not
            a token; vLLM's client takes any chunk, which on vLLM's server is the same instant);
            TTFT, ITL and TPOT cover streamed requests only
  ITL       gap between consecutive chunks with output, pooled over successful requests (k tokens in a chunk = one gap)
  TPOT      per request, (E2EL - TTFT) / (output_tokens - 1), output_tokens from usage
  E2EL      time of the last chunk - t0 (non-streamed: whole response read)
  goodput   requests/s meeting every --goodput SLO (inclusive)
  throughput  completed requests (or tokens) / duration; duration = scheduled start of the first request
              to the end of the last one
  dispatch lag  actual send - when the request was due (client overhead; queue and connect time apart)
  client queue  waiting for a --max-concurrency slot, or for the requests due at the same instant
              that were sent before it (a burst leaves one request after another)
";

/// Top-level keys of the JSON result that `--metadata` may not overwrite.
const RESULT_KEYS: &[&str] = &[
    "date",
    "backend",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "label",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrent_requests",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "errors",
    "generated_texts",
    "llmreplay",
];

/// Whether `key` is one the JSON result itself writes (so `--metadata` must not use it).
pub fn is_result_key(key: &str) -> bool {
    RESULT_KEYS.contains(&key)
        || ["mean_", "median_", "std_", "p"]
            .iter()
            .any(|p| key.starts_with(p))
            && key.ends_with("_ms")
}

/// Whether the client itself limited the run, and whether the target kept up.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verdict {
    /// Dispatch lag p50, ms.
    pub lag_p50_ms: f64,
    /// Dispatch lag p99, ms.
    pub lag_p99_ms: f64,
    /// Dispatch lag max, ms.
    pub lag_max_ms: f64,
    /// Lateness that could not move the reported numbers, ms (see [`lag_too_high`]).
    pub lag_allowance_ms: f64,
    /// Client worker CPU utilisation (0–1), when measured.
    pub client_cpu_utilization: Option<f64>,
    /// True when the result may reflect the client rather than the server.
    pub client_saturated: bool,
    /// True when the target did not serve the offered load (see [`crate::served`]).
    pub target_overloaded: bool,
    /// One sentence for people.
    pub message: String,
}

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
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in &trace.records {
        for b in r
            .request_id
            .as_bytes()
            .iter()
            .chain(r.arrival_time_us.to_le_bytes().iter())
        {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    TraceIdentity {
        files: trace
            .files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect(),
        rows: trace.records.len(),
        content_hash: format!("{h:016x}"),
    }
}

fn put_summary(obj: &mut Map<String, Value>, key: &str, s: &Summary) {
    obj.insert(format!("mean_{key}_ms"), json!(s.mean));
    obj.insert(format!("median_{key}_ms"), json!(s.median));
    obj.insert(format!("std_{key}_ms"), json!(s.std));
    for (p, v) in &s.percentiles {
        obj.insert(format!("p{}_{key}_ms", percentile_label(*p)), json!(v));
    }
}

fn summary_json(s: &Summary) -> Value {
    let mut o = Map::new();
    o.insert("count".into(), json!(s.count));
    o.insert("mean".into(), json!(s.mean));
    o.insert("median".into(), json!(s.median));
    o.insert("std".into(), json!(s.std));
    o.insert("min".into(), json!(s.min));
    o.insert("max".into(), json!(s.max));
    for (p, v) in &s.percentiles {
        o.insert(format!("p{}", percentile_label(*p)), json!(v));
    }
    Value::Object(o)
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
                Some(crate::config::EndpointKind::Completions) => "completions prompt",
                Some(crate::config::EndpointKind::Chat) => "chat content; the template adds its own",
                None => "completions prompt; for chat rows the content, the template adds its own",
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

/// The JSON result: vLLM's key names for what vLLM reports, ours under `llmreplay`.
pub fn result_json(i: &ResultInputs) -> Value {
    let (cfg, run, m) = (i.cfg, i.run, i.metrics);
    let mut o = Map::new();
    o.insert(
        "date".into(),
        json!(chrono::Utc::now().format("%Y%m%d-%H%M%S").to_string()),
    );
    o.insert(
        "backend".into(),
        json!(if run.records.iter().any(|r| r.endpoint.contains("chat")) {
            "openai-chat"
        } else {
            "openai"
        }),
    );
    o.insert("model_id".into(), json!(run.model));
    o.insert(
        "tokenizer_id".into(),
        cfg.request
            .tokenizer
            .as_ref()
            .map_or(Value::Null, |t| json!(t.tokenizer().name())),
    );
    o.insert("num_prompts".into(), json!(m.num_prompts));
    let (rate, burstiness) = match cfg.arrivals {
        Arrivals::Rate { rate, burstiness } => (
            if rate.is_infinite() {
                json!("inf")
            } else {
                json!(rate)
            },
            json!(burstiness),
        ),
        Arrivals::Recorded { .. } => (json!("trace"), Value::Null),
    };
    o.insert("request_rate".into(), rate);
    o.insert("burstiness".into(), burstiness);
    o.insert("max_concurrency".into(), json!(cfg.max_concurrency));
    if let Some(l) = &cfg.label {
        o.insert("label".into(), json!(l));
    }
    for (k, v) in &cfg.metadata {
        o.insert(k.clone(), json!(v));
    }
    o.insert("duration".into(), json!(m.duration_s));
    o.insert("completed".into(), json!(m.completed));
    o.insert("failed".into(), json!(m.failed));
    o.insert("total_input_tokens".into(), json!(m.total_input_tokens));
    o.insert("total_output_tokens".into(), json!(m.total_output_tokens));
    o.insert("request_throughput".into(), json!(m.request_throughput));
    o.insert("request_goodput".into(), json!(m.request_goodput));
    o.insert("output_throughput".into(), json!(m.output_throughput));
    o.insert(
        "total_token_throughput".into(),
        json!(m.total_token_throughput),
    );
    o.insert(
        "max_concurrent_requests".into(),
        json!(m.max_concurrent_requests),
    );
    for pm in &cfg.percentile_metrics {
        let s = match pm.key() {
            "ttft" => &m.ttft,
            "tpot" => &m.tpot,
            "itl" => &m.itl,
            _ => &m.e2el,
        };
        put_summary(&mut o, pm.key(), s);
    }
    if i.detailed {
        let recs = &run.records;
        let okv = |r: &&trace_format::TraceRecord| r.outcome == trace_format::Outcome::Ok;
        o.insert(
            "input_lens".into(),
            json!(recs
                .iter()
                .map(|r| r.prompt_tokens.unwrap_or(0))
                .collect::<Vec<_>>()),
        );
        o.insert(
            "output_lens".into(),
            json!(recs
                .iter()
                .map(|r| if okv(&r) {
                    r.output_tokens.unwrap_or(0)
                } else {
                    0
                })
                .collect::<Vec<_>>()),
        );
        o.insert(
            "ttfts".into(),
            json!(recs
                .iter()
                .map(|r| if okv(&r) {
                    crate::metrics::ttft_ms(r).unwrap_or(0.0) / 1e3
                } else {
                    0.0
                })
                .collect::<Vec<_>>()),
        );
        o.insert(
            "itls".into(),
            json!(recs
                .iter()
                .map(|r| if okv(&r) {
                    r.chunk_times_us
                        .windows(2)
                        .map(|w| (w[1] - w[0]) as f64 / 1e6)
                        .collect()
                } else {
                    Vec::new()
                })
                .collect::<Vec<Vec<f64>>>()),
        );
        o.insert(
            "errors".into(),
            json!(recs
                .iter()
                .map(|r| r.error.clone().unwrap_or_default())
                .collect::<Vec<_>>()),
        );
    }
    let v = verdict(m, run);
    let mut ours = Map::new();
    ours.insert("tool_version".into(), json!(env!("CARGO_PKG_VERSION")));
    ours.insert("command".into(), json!(i.command));
    ours.insert("run_id".into(), json!(run.run_id));
    ours.insert(
        "started_at".into(),
        json!(chrono::DateTime::from_timestamp_micros(run.started_at_us).map(|t| t.to_rfc3339())),
    );
    ours.insert(
        "target".into(),
        json!({"name": run.target.name, "url": run.target.url, "models": run.target_info.models, "version": run.target_info.version}),
    );
    let (speedup, mode) = match cfg.arrivals {
        Arrivals::Recorded { speedup } => (json!(speedup), "recorded"),
        Arrivals::Rate { .. } => (Value::Null, "rate"),
    };
    ours.insert(
        "trace".into(),
        json!({
            "files": i.trace.files, "rows": i.trace.rows, "content_hash": i.trace.content_hash,
            "selected_rows": run.plan_len, "span_s": run.trace_span.as_secs_f64(),
            "skipped_rows": run.skipped.len(),
            "skipped_examples": run.skipped.iter().take(5).map(|(id, why)| format!("{id}: {why}")).collect::<Vec<_>>(),
            "arrivals": mode, "speedup": speedup,
            "start_offset_s": cfg.selection.start_offset.as_secs_f64(),
            "window_s": cfg.selection.duration.map(|d| d.as_secs_f64()),
            "sample_ratio": cfg.selection.sample_ratio, "max_requests": cfg.selection.max_requests,
            "session_mode": format!("{:?}", cfg.session_mode).to_lowercase(),
            "seed": cfg.seed, "prompt_salt": cfg.request.prompt_salt,
            "synthesized_prompts": prompt_note(cfg, run),
            "recorded_bodies_replayed": run.bodies_replayed,
        }),
    );
    ours.insert(
        "goodput_slos".into(),
        Value::Object(
            cfg.goodput
                .iter()
                .map(|s| (s.metric.key().to_string(), json!(s.limit_ms)))
                .collect::<Map<_, _>>(),
        ),
    );
    ours.insert("slo_attainment".into(), json!(m.slo_attainment));
    ours.insert("slo_pass".into(), json!(slo_pass(m)));
    ours.insert("dispatch_lag_ms".into(), summary_json(&m.dispatch_lag));
    ours.insert("client_queue_ms".into(), summary_json(&m.queue));
    ours.insert(
        "connections".into(),
        json!({
            "preconnected": run.preconnected,
            "new_during_run": m.new_connections,
            "reused": run.pool.map(|p| p.reused),
            "found_closed": run.pool.map(|p| p.found_closed),
            "expired_idle": run.pool.map(|p| p.expired),
            "connect_ms": summary_json(&m.connect),
        }),
    );
    ours.insert(
        "client".into(),
        json!({"load": run.client_load, "verdict": v}),
    );
    ours.insert("e2el_ms".into(), summary_json(&m.e2el));
    ours.insert("metric_requests".into(), json!(m.coverage));
    ours.insert("served".into(), json!(m.served));
    if !m.by_class.is_empty() {
        ours.insert(
            "by_class".into(),
            json!(m
                .by_class
                .iter()
                .map(|c| json!({
                    "endpoint": c.endpoint, "stream": c.stream, "requests": c.requests,
                    "completed": c.completed, "output_tokens": c.output_tokens,
                    "ttft_ms": c.ttft.as_ref().map(summary_json),
                    "tpot_ms": c.tpot.as_ref().map(summary_json),
                    "itl_ms": c.itl.as_ref().map(summary_json),
                    "e2el_ms": summary_json(&c.e2el),
                }))
                .collect::<Vec<_>>()),
        );
    }
    if let Some(pt) = &m.itl_per_token {
        ours.insert("itl_per_token_ms".into(), summary_json(pt));
    }
    ours.insert("outcomes".into(), json!(m.outcomes));
    ours.insert(
        "top_errors".into(),
        json!(m
            .top_errors
            .iter()
            .map(|(o, t, n)| json!({"outcome": o, "error": t, "requests": n}))
            .collect::<Vec<_>>()),
    );
    ours.insert("output_token_sources".into(), json!(m.output_token_sources));
    ours.insert("warmups".into(), json!(run.warmups));
    if !run.server_gauges.is_empty() {
        ours.insert("server_gauges".into(), json!(run.server_gauges));
    }
    if !run.server_histograms.is_empty() {
        let mut h = Map::new();
        for (k, v) in &run.server_histograms {
            h.insert(k.clone(), json!(v));
        }
        h.insert("client_ttft_mean_ms".into(), json!(m.ttft.mean));
        if let Some(t) = run
            .server_histograms
            .get("ttft_ms")
            .filter(|t| t.count > 0.0)
        {
            h.insert("ttft_gap_ms".into(), json!(m.ttft.mean - t.mean));
        }
        ours.insert("server_histograms".into(), Value::Object(h));
    }
    if let Some(l) = cfg.soak.loops {
        ours.insert(
            "soak".into(),
            json!({"loop": l.to_string(), "passes": crate::soak::passes_replayed(&run.records)}),
        );
    }
    if let Some(w) = cfg.soak.slice {
        let s = crate::soak::slices(&run.records, run.started_at_us, w, &cfg.goodput);
        ours.insert("slices".into(), crate::soak::slices_json(&s, w));
    }
    o.insert("llmreplay".into(), Value::Object(ours));
    Value::Object(o)
}

/// PASS when at least 95% of requests meet every SLO; None without SLOs.
pub fn slo_pass(m: &Metrics) -> Option<bool> {
    m.slo_attainment.map(|a| a >= 0.95)
}

fn line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<40} {value}");
}

fn section(out: &mut String, title: &str) {
    let _ = writeln!(out, "{:-^50}", title);
}

/// The console report of one run.
pub fn console_report(i: &ResultInputs) -> String {
    let (cfg, run, m) = (i.cfg, i.run, i.metrics);
    let mut out = String::new();
    let _ = writeln!(out, "{:=^50}", " Serving Benchmark Result ");
    line(&mut out, "Command:", i.command);
    line(
        &mut out,
        "Target:",
        format!("{} ({})", run.target.name, run.target.url),
    );
    line(&mut out, "Model:", &run.model);
    if let Some(v) = &run.target_info.version {
        line(&mut out, "Target version:", v);
    }
    line(
        &mut out,
        "Trace:",
        format!(
            "{} ({} rows, hash {}), {} selected",
            i.trace.files.join(", "),
            i.trace.rows,
            i.trace.content_hash,
            run.plan_len
        ),
    );
    if let Some((id, why)) = run.skipped.first() {
        line(
            &mut out,
            "Skipped rows:",
            format!(
                "{} could not become a request (first: {id}: {why})",
                run.skipped.len()
            ),
        );
    }
    match cfg.arrivals {
        Arrivals::Recorded { speedup } => line(
            &mut out,
            "Arrivals:",
            format!("recorded, speedup {speedup}"),
        ),
        Arrivals::Rate { rate, burstiness } => {
            line(
                &mut out,
                "Traffic request rate:",
                if rate.is_infinite() {
                    "inf".into()
                } else {
                    format!("{rate}")
                },
            );
            line(&mut out, "Burstiness factor:", burstiness);
        }
    }
    line(&mut out, "Synthesized prompts:", prompt_note(cfg, run));
    line(
        &mut out,
        "Maximum request concurrency:",
        cfg.max_concurrency.map_or("none".into(), |c| c.to_string()),
    );
    line(&mut out, "Successful requests:", m.completed);
    line(&mut out, "Failed requests:", m.failed);
    line(
        &mut out,
        "Benchmark duration (s):",
        format!("{:.2}", m.duration_s),
    );
    line(&mut out, "Total input tokens:", m.total_input_tokens);
    line(&mut out, "Total generated tokens:", m.total_output_tokens);
    if m.output_token_sources.keys().any(|k| k != "usage") {
        line(
            &mut out,
            "Output tokens counted from:",
            m.output_token_sources
                .iter()
                .map(|(k, n)| {
                    let how = match k.as_str() {
                        "usage" => "the server's usage",
                        "tokenizer" => "the text, by --tokenizer (no usage)",
                        "estimate" => "output chunks (no usage, no --tokenizer)",
                        other => other,
                    };
                    format!("{n} requests {how}")
                })
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    line(
        &mut out,
        "Request throughput (req/s):",
        format!("{:.2}", m.request_throughput),
    );
    if let Some(g) = m.request_goodput {
        line(&mut out, "Request goodput (req/s):", format!("{g:.2}"));
        line(
            &mut out,
            "SLO attainment:",
            format!("{:.1}%", m.slo_attainment.unwrap_or(0.0) * 100.0),
        );
    }
    line(
        &mut out,
        "Output token throughput (tok/s):",
        format!("{:.2}", m.output_throughput),
    );
    line(
        &mut out,
        "Total Token throughput (tok/s):",
        format!("{:.2}", m.total_token_throughput),
    );
    line(
        &mut out,
        "Max concurrent requests:",
        m.max_concurrent_requests,
    );
    if let Some(off) = m.served.offered_rps {
        line(
            &mut out,
            "Offered request rate (req/s):",
            format!("{off:.2}"),
        );
    }
    match (&m.served.steady, &m.served.steady_missing) {
        (Some(st), _) => line(
            &mut out,
            "Steady-state throughput (req/s):",
            format!(
                "{:.2} ({} requests that ended from {:.1} s to {:.1} s: ramp-up and drain left out)",
                st.request_throughput, st.completed, st.start_s, st.end_s
            ),
        ),
        (None, Some(why)) => line(&mut out, "Steady-state throughput (req/s):", format!("- ({why})")),
        _ => {}
    }
    for pm in &cfg.percentile_metrics {
        let (title, name, s) = match pm.key() {
            "ttft" => ("Time to First Token", "TTFT", &m.ttft),
            "tpot" => ("Time per Output Token (excl. 1st token)", "TPOT", &m.tpot),
            "itl" => ("Inter-token Latency", "ITL", &m.itl),
            _ => ("End-to-end Latency", "E2EL", &m.e2el),
        };
        section(&mut out, title);
        let c = &m.coverage;
        let (covered, streamed_only) = match pm.key() {
            "ttft" => (c.ttft, true),
            "tpot" => (c.tpot, true),
            "itl" => (c.itl, true),
            _ => (c.e2el, false),
        };
        let mut txt = format!("{covered} of {}", m.completed);
        if streamed_only && c.not_streamed > 0 {
            txt.push_str(&format!(
                " ({} not streamed: {name} does not apply)",
                c.not_streamed
            ));
        }
        line(&mut out, &format!("Requests in {name}:"), txt);
        if covered == 0 {
            continue;
        }
        line(
            &mut out,
            &format!("Mean {name} (ms):"),
            format!("{:.2}", s.mean),
        );
        line(
            &mut out,
            &format!("Median {name} (ms):"),
            format!("{:.2}", s.median),
        );
        line(
            &mut out,
            &format!("Std {name} (ms):"),
            format!("{:.2}", s.std),
        );
        for (p, v) in &s.percentiles {
            line(
                &mut out,
                &format!("P{} {name} (ms):", percentile_label(*p)),
                format!("{v:.2}"),
            );
        }
    }
    if !m.by_class.is_empty() {
        section(&mut out, "Latency by class (median / P99 ms)");
        let cell = |s: Option<&Summary>| match s {
            Some(s) if s.count > 0 => {
                format!("{:.1} / {:.1}", s.median, s.get(99.0).unwrap_or(s.max))
            }
            Some(_) => "none".into(),
            None => "n/a".into(),
        };
        let rows: Vec<[String; 6]> = m
            .by_class
            .iter()
            .map(|c| {
                [
                    format!(
                        "{} {}",
                        c.endpoint,
                        if c.stream { "streamed" } else { "not streamed" }
                    ),
                    format!("{}/{}", c.completed, c.requests),
                    cell(c.ttft.as_ref()),
                    cell(c.tpot.as_ref()),
                    cell(c.itl.as_ref()),
                    cell(Some(&c.e2el)),
                ]
            })
            .collect();
        let head = ["class", "ok/sent", "TTFT", "TPOT", "ITL", "E2EL"];
        let widths: Vec<usize> = (0..6)
            .map(|i| {
                rows.iter()
                    .map(|r| r[i].chars().count())
                    .chain([head[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let fmt_row = |cells: &[&str]| {
            cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        let _ = writeln!(out, "{}", fmt_row(&head));
        for r in &rows {
            let cells: Vec<&str> = r.iter().map(String::as_str).collect();
            let _ = writeln!(out, "{}", fmt_row(&cells));
        }
        let _ = writeln!(
            out,
            "(n/a: TTFT, TPOT and ITL do not apply to requests that are not streamed)"
        );
    }
    if let Some(pt) = &m.itl_per_token {
        section(&mut out, "Per-token ITL (chunk gap / tokens)");
        line(
            &mut out,
            "Mean per-token ITL (ms):",
            format!("{:.2}", pt.mean),
        );
        for (p, v) in &pt.percentiles {
            line(
                &mut out,
                &format!("P{} per-token ITL (ms):", percentile_label(*p)),
                format!("{v:.2}"),
            );
        }
    }
    section(&mut out, "Client");
    let v = verdict(m, run);
    line(
        &mut out,
        "Dispatch lag p50/p99/max (ms):",
        format!(
            "{:.3} / {:.3} / {:.3}",
            v.lag_p50_ms, v.lag_p99_ms, v.lag_max_ms
        ),
    );
    // Shown with a concurrency cap, and whenever requests queued behind a burst.
    if cfg.max_concurrency.is_some() || m.queue.max > 0.0 {
        line(
            &mut out,
            "Client queue time p50/p99 (ms):",
            format!(
                "{:.2} / {:.2}",
                m.queue.get(50.0).unwrap_or(0.0),
                m.queue.get(99.0).unwrap_or(0.0)
            ),
        );
    }
    let reused = run
        .pool
        .map_or_else(|| "-".to_string(), |p| p.reused.to_string());
    let mut conns = format!(
        "{} / {} / {reused} (connect time excluded from TTFT)",
        run.preconnected, m.new_connections
    );
    if let Some(p) = run.pool.filter(|p| p.found_closed + p.expired > 0) {
        conns.push_str(&format!(
            "; pooled ones dropped before any byte was sent: {} found closed by the target, {} idle over --pool-idle-timeout",
            p.found_closed, p.expired
        ));
    }
    line(&mut out, "Connections pre / new / reused:", conns);
    if let Some(c) = &run.client_load {
        line(
            &mut out,
            "Client CPU:",
            format!(
                "{:.2} s on {} threads ({:.0}%)",
                c.cpu_seconds,
                c.worker_threads,
                c.utilization * 100.0
            ),
        );
    }
    if let Some(t) = run
        .server_histograms
        .get("ttft_ms")
        .filter(|t| t.count > 0.0)
    {
        line(
            &mut out,
            "TTFT mean client / server (ms):",
            format!(
                "{:.2} / {:.2} (gap {:.2}; the server's vllm:time_to_first_token_seconds over the run)",
                m.ttft.mean,
                t.mean,
                m.ttft.mean - t.mean
            ),
        );
    }
    if let Some(q) = run
        .server_histograms
        .get("queue_time_ms")
        .filter(|q| q.count > 0.0)
    {
        line(
            &mut out,
            "Server queue time mean / p95 (ms):",
            format!("{:.2} / {}", q.mean, q.p95_text()),
        );
    }
    for (name, g) in &run.server_gauges {
        line(
            &mut out,
            &format!("Server {name} mean/max:"),
            format!("{:.2} / {:.2}", g.mean, g.max),
        );
    }
    line(
        &mut out,
        "Outcomes:",
        m.outcomes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    if !m.top_errors.is_empty() {
        let _ = writeln!(out, "Most frequent errors:");
        for (outcome, text, n) in &m.top_errors {
            let _ = writeln!(out, "  {n:>6} × {outcome}: {text}");
        }
    }
    if let Some(n) = m.output_token_sources.get("estimate").filter(|n| **n > 0) {
        let _ = writeln!(
            out,
            "WARNING: the target sent no usage for {n} requests and there is no --tokenizer: their \
             output tokens are chunk counts, and a chunk may carry several tokens (TPOT reads high, token \
             throughput low). Give --tokenizer for the target's tokenizer."
        );
    }
    let _ = writeln!(out, "{}", v.message);
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

/// The side-by-side table that ends a multi-target run.
pub fn comparison_table(cfg: &ReplayConfig, runs: &[(RunOutput, Metrics)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:=^50}", " Targets side by side ");
    let _ = writeln!(
        out,
        "{:<20} {:>6} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}  SLO",
        "target",
        "ok",
        "failed",
        "req/s",
        "goodput",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
    );
    let base = runs.first().map(|(_, m)| m);
    for (run, m) in runs {
        let p = |s: &Summary, q: f64| s.get(q).map_or("-".to_string(), |v| format!("{v:.1}"));
        let slo = match slo_pass(m) {
            None => "-".to_string(),
            Some(true) => "PASS".into(),
            Some(false) => "FAIL".into(),
        };
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>6} {:>9.2} {:>9} {:>10} {:>10} {:>10} {:>10}  {}",
            run.target.name,
            m.completed,
            m.failed,
            m.request_throughput,
            m.request_goodput.map_or("-".into(), |g| format!("{g:.2}")),
            p(&m.ttft, 50.0),
            p(&m.ttft, 99.0),
            p(&m.tpot, 50.0),
            p(&m.tpot, 99.0),
            slo
        );
        if let Some(b) = base {
            if !std::ptr::eq(b, m) {
                let d = |a: f64, b: f64| {
                    if b == 0.0 {
                        "-".to_string()
                    } else {
                        format!("{:+.1}%", (a / b - 1.0) * 100.0)
                    }
                };
                let _ = writeln!(
                    out,
                    "{:<20} {:>6} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}",
                    "  vs first",
                    "",
                    "",
                    d(m.request_throughput, b.request_throughput),
                    "",
                    d(m.ttft.median, b.ttft.median),
                    d(
                        m.ttft.get(99.0).unwrap_or(0.0),
                        b.ttft.get(99.0).unwrap_or(0.0)
                    ),
                    d(m.tpot.median, b.tpot.median),
                    d(
                        m.tpot.get(99.0).unwrap_or(0.0),
                        b.tpot.get(99.0).unwrap_or(0.0)
                    ),
                );
            }
        }
    }
    if !cfg.goodput.is_empty() {
        let _ = writeln!(
            out,
            "SLO: PASS when at least 95% of requests meet every SLO ({}).",
            cfg.goodput
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_format::TraceRecord;

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
        crate::metrics::compute(&recs, 0, &[], &[50.0, 99.0])
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
        crate::metrics::compute(&recs, 0, &[], &[50.0, 99.0])
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
        // The README's first example: 8 req/s, every send 1.24 ms late. The allowance is 10%
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
        RunOutput {
            target: crate::config::Target {
                name: "t".into(),
                url: "http://127.0.0.1:1".into(),
            },
            target_info: Default::default(),
            model: "m".into(),
            run_id: "r".into(),
            started_at_us: 0,
            records: Vec::new(),
            plan_len: 0,
            bodies_replayed: 0,
            skipped: Vec::new(),
            trace_span: std::time::Duration::ZERO,
            wall: std::time::Duration::from_secs(1),
            preconnected: 0,
            pool: None,
            warmups: 0,
            client_load: Some(crate::run::ClientLoad {
                cpu_seconds: cpu_utilization,
                worker_threads: 1,
                utilization: cpu_utilization,
                pacer_cpu_seconds: 0.0,
            }),
            server_gauges: Default::default(),
            server_histograms: Default::default(),
        }
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
