//! What a run tells people on the console: the definitions table first, then the results
//! as the seed report asks, the dispatch-lag verdict, and the side-by-side table of a
//! multi-target run.

use std::fmt::Write as _;

use trace_format::stats::{percentile_label, Summary};

use replay::config::{Arrivals, ReplayConfig};
use replay::metrics::Metrics;
use replay::run::RunOutput;
use replay::server_metrics::HistogramSummary;
use results::build::{prompt_note, run_verdict, slo_pass, verdict, ResultInputs};

/// The definitions table printed above every result: the console block of `docs/metrics.md`
/// (one source for the console, the report and the repository's documentation).
pub fn definitions() -> &'static str {
    crate::definitions::section("console")
}

fn line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<40} {value}");
}

fn section(out: &mut String, title: &str) {
    let _ = writeln!(out, "{:-^50}", title);
}

/// The console report of one run.
pub fn console_report(i: &ResultInputs) -> String {
    let mut out = String::new();
    run_header(&mut out, i);
    totals(&mut out, i);
    latencies(&mut out, i.cfg, i.metrics);
    validity(&mut out, i);
    by_class(&mut out, i.metrics);
    per_token(&mut out, i.metrics);
    let v = client(&mut out, i);
    endings(&mut out, i, &v);
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

/// What ran: a stopped run says so first, then the command, target, trace and load.
fn run_header(out: &mut String, i: &ResultInputs) {
    let (cfg, run, m) = (i.cfg, i.run, i.metrics);
    match results::build::interrupted_doc(run, m) {
        // A stopped run says so before anything else: its figures cover what ran.
        Some(p) => {
            let _ = writeln!(out, "{:=^50}", " Serving Benchmark Result: PARTIAL ");
            line(out, "PARTIAL:", p.summary());
        }
        None => {
            let _ = writeln!(out, "{:=^50}", " Serving Benchmark Result ");
        }
    }
    line(out, "Command:", i.command);
    line(
        out,
        "Target:",
        format!("{} ({})", run.target.name, run.target.url),
    );
    line(out, "Model:", &run.model);
    if let Some(v) = run.target_info.version_text() {
        line(out, "Target version:", v);
    }
    line(
        out,
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
            out,
            "Skipped rows:",
            format!(
                "{} could not become a request or be sent (first: {id}: {why})",
                run.skipped.len()
            ),
        );
    }
    match cfg.arrivals {
        Arrivals::Recorded { speedup } => {
            line(out, "Arrivals:", format!("recorded, speedup {speedup}"))
        }
        Arrivals::Rate { rate, burstiness } => {
            line(
                out,
                "Traffic request rate:",
                if rate.is_infinite() {
                    "inf".into()
                } else {
                    format!("{rate}")
                },
            );
            line(out, "Burstiness factor:", burstiness);
        }
    }
    line(out, "Synthesized prompts:", prompt_note(cfg, run));
    line(
        out,
        "Maximum request concurrency:",
        cfg.max_concurrency.map_or("none".into(), |c| c.to_string()),
    );
}

/// Requests, tokens, throughput, offered and steady-state load.
fn totals(out: &mut String, i: &ResultInputs) {
    let m = i.metrics;
    line(out, "Successful requests:", m.completed);
    // One failure count (the verdict's, compare's, the report's, `outcome_causes` in the
    // JSON): failed by the server, the client's own apart.
    line(
        out,
        "Failed requests:",
        results::run_verdict::failures_text(&m.causes),
    );
    line(
        out,
        "Benchmark duration (s):",
        format!("{:.2}", m.duration_s),
    );
    line(out, "Total input tokens:", m.total_input_tokens);
    line(out, "Total generated tokens:", m.total_output_tokens);
    if m.output_token_sources.keys().any(|k| k != "usage") {
        line(
            out,
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
        out,
        "Request throughput (req/s):",
        format!("{:.2}", m.request_throughput),
    );
    if let Some(g) = m.request_goodput {
        line(out, "Request goodput (req/s):", format!("{g:.2}"));
        line(
            out,
            "SLO attainment:",
            // Of the requests the server was asked to serve (the `Outcomes by cause:` line).
            format!("{:.1}%", m.slo_attainment.unwrap_or(0.0) * 100.0),
        );
    }
    line(
        out,
        "Output token throughput (tok/s):",
        format!("{:.2}", m.output_throughput),
    );
    line(
        out,
        "Total Token throughput (tok/s):",
        format!("{:.2}", m.total_token_throughput),
    );
    line(out, "Max concurrent requests:", m.max_concurrent_requests);
    if let Some(off) = m.served.offered_rps {
        line(out, "Offered request rate (req/s):", format!("{off:.2}"));
    }
    match (&m.served.steady, &m.served.steady_missing) {
        (Some(st), _) => line(
            out,
            "Steady-state throughput (req/s):",
            format!(
                "{:.2} ({} requests that ended from {:.1} s to {:.1} s: ramp-up and drain left out)",
                st.request_throughput, st.completed, st.start_s, st.end_s
            ),
        ),
        (None, Some(why)) => line(out, "Steady-state throughput (req/s):", format!("- ({why})")),
        _ => {}
    }
}

/// Each percentile metric, with the requests it covers and why the rest are left out.
fn latencies(out: &mut String, cfg: &ReplayConfig, m: &Metrics) {
    for pm in &cfg.percentile_metrics {
        let (title, name, s) = match pm.key() {
            "ttft" => ("Time to First Token", "TTFT", &m.ttft),
            "tpot" => ("Time per Output Token (excl. 1st token)", "TPOT", &m.tpot),
            "itl" => ("Inter-token Latency", "ITL", &m.itl),
            _ => ("End-to-end Latency", "E2EL", &m.e2el),
        };
        section(out, title);
        let c = &m.coverage;
        let covered = match pm.key() {
            "ttft" => c.ttft,
            "tpot" => c.tpot,
            "itl" => c.itl,
            _ => c.e2el,
        };
        let mut txt = format!("{covered} of {}", m.completed);
        let why: Vec<String> = c
            .left_out(pm.key(), m.completed)
            .iter()
            .map(|(n, why)| format!("{n} {}", why.replace("{}", name)))
            .collect();
        if !why.is_empty() {
            txt.push_str(&format!(" ({})", why.join("; ")));
        }
        line(out, &format!("Requests in {name}:"), txt);
        if covered == 0 {
            continue;
        }
        line(out, &format!("Mean {name} (ms):"), format!("{:.2}", s.mean));
        line(
            out,
            &format!("Median {name} (ms):"),
            format!("{:.2}", s.median),
        );
        summary_lines(out, name, s);
        if let (true, Some(t)) = (pm.key() == "ttft", &m.ttfat) {
            reasoning(out, m, t);
        }
    }
}

/// The validity stamp, beside the latencies it judges: the client's own timing error, its
/// budget, and what it was measured from (`results::validity`).
fn validity(out: &mut String, i: &ResultInputs) {
    let Some(v) = results::validity::of_run(i.cfg, i.metrics, i.run) else {
        return;
    };
    section(out, "Client timing error (validity)");
    line(out, "Validity:", &v.message);
    line(
        out,
        "Reader lateness p50/p99/max (ms):",
        format!(
            "{:.3} / {:.3} / {:.3} ({} probes)",
            v.reader_lateness_p50_ms, v.reader_lateness_p99_ms, v.reader_lateness_max_ms, v.probes
        ),
    );
    line(
        out,
        "Thread wake / dispatch lag p99 (ms):",
        format!(
            "{:.3} / {:.3}",
            v.thread_lateness_p99_ms, v.dispatch_lag_p99_ms
        ),
    );
    line(out, "CPU steal / governor:", v.host_text("not measured"));
    for r in v.reasons.iter().chain(&v.warnings) {
        let _ = writeln!(out, "  {r}");
    }
}

/// Mean, median, std and the percentiles of one metric's summary.
fn summary_lines(out: &mut String, name: &str, s: &Summary) {
    line(out, &format!("Std {name} (ms):"), format!("{:.2}", s.std));
    for (p, v) in &s.percentiles {
        line(
            out,
            &format!("P{} {name} (ms):", percentile_label(*p)),
            format!("{v:.2}"),
        );
    }
}

/// Time to first answer token and the reasoning's share of the output, after TTFT, when
/// some request reasoned.
fn reasoning(out: &mut String, m: &Metrics, s: &Summary) {
    section(out, "Time to First Answer Token (after reasoning)");
    line(
        out,
        "Requests in TTFAT:",
        format!("{} of {}", s.count, m.completed),
    );
    if let Some(r) = m.total_reasoning_tokens {
        let share = match m.total_output_tokens {
            0 => 0.0,
            o => 100.0 * r as f64 / o as f64,
        };
        line(
            out,
            "Reasoning tokens:",
            format!("{r} ({share:.1}% of output tokens)"),
        );
    }
    if s.count == 0 {
        return;
    }
    line(out, "Mean TTFAT (ms):", format!("{:.2}", s.mean));
    line(out, "Median TTFAT (ms):", format!("{:.2}", s.median));
    summary_lines(out, "TTFAT", s);
}

/// Latency per class of request, when the run mixed classes.
fn by_class(out: &mut String, m: &Metrics) {
    if !m.by_class.is_empty() {
        section(out, "Latency by class (median / P99 ms)");
        let cell = |s: Option<&Summary>| match s {
            Some(s) if s.count > 0 => {
                format!("{:.1} / {:.1}", s.median, s.get(99.0).unwrap_or(s.max))
            }
            Some(_) => "none".into(),
            None => "n/a".into(),
        };
        // TTFAT's column only when some request reasoned.
        let ttfat = m.ttfat.is_some();
        let rows: Vec<Vec<String>> = m
            .by_class
            .iter()
            .map(|c| {
                let mut row = vec![
                    format!(
                        "{} {}",
                        c.endpoint,
                        if c.stream { "streamed" } else { "not streamed" }
                    ),
                    format!("{}/{}", c.completed, c.requests),
                    cell(c.ttft.as_ref()),
                ];
                if ttfat {
                    row.push(cell(c.ttfat.as_ref()));
                }
                row.extend([
                    cell(c.tpot.as_ref()),
                    cell(c.itl.as_ref()),
                    cell(Some(&c.e2el)),
                ]);
                row
            })
            .collect();
        let mut head = vec!["class", "ok/sent", "TTFT"];
        if ttfat {
            head.push("TTFAT");
        }
        head.extend(["TPOT", "ITL", "E2EL"]);
        let widths: Vec<usize> = (0..head.len())
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
}

/// Per-token ITL (chunk gap / tokens), when measured.
fn per_token(out: &mut String, m: &Metrics) {
    if let Some(pt) = &m.itl_per_token {
        section(out, "Per-token ITL (chunk gap / tokens)");
        line(out, "Mean per-token ITL (ms):", format!("{:.2}", pt.mean));
        for (p, v) in &pt.percentiles {
            line(
                out,
                &format!("P{} per-token ITL (ms):", percentile_label(*p)),
                format!("{v:.2}"),
            );
        }
    }
}

/// The client: dispatch lag, queue, connections, CPU; the server figures beside it. Returns
/// the dispatch-lag verdict.
fn client(out: &mut String, i: &ResultInputs) -> results::doc::Verdict {
    let (cfg, run, m) = (i.cfg, i.run, i.metrics);
    section(out, "Client");
    let v = verdict(m, run);
    line(
        out,
        "Dispatch lag p50/p99/max (ms):",
        format!(
            "{:.3} / {:.3} / {:.3}",
            v.lag_p50_ms, v.lag_p99_ms, v.lag_max_ms
        ),
    );
    // Shown with a concurrency cap, and whenever requests queued behind a burst.
    if cfg.max_concurrency.is_some() || m.queue.max > 0.0 {
        line(
            out,
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
    line(out, "Connections pre / new / reused:", conns);
    if let Some(c) = &run.client_load {
        line(
            out,
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
            out,
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
            out,
            "Server queue time mean / p95 (ms):",
            format!("{:.2} / {}", q.mean, p95_text(q)),
        );
    }
    for (name, g) in &run.server_gauges {
        line(
            out,
            &format!("Server {name} mean/max:"),
            format!("{:.2} / {:.2}", g.mean, g.max),
        );
    }
    v
}

/// Outcomes, frequent errors, the usage warning, the dispatch-lag and run verdicts.
fn endings(out: &mut String, i: &ResultInputs, v: &results::doc::Verdict) {
    let (cfg, run, m) = (i.cfg, i.run, i.metrics);
    line(
        out,
        "Outcomes:",
        m.outcomes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    for (title, server) in [
        ("Most frequent errors (failed by the server):", true),
        (
            "The client's own and the replay's (no failure of the server):",
            false,
        ),
    ] {
        let listed: Vec<_> = m
            .top_errors
            .iter()
            .filter(|e| (e.cause == trace_format::Cause::Server) == server)
            .collect();
        if !listed.is_empty() {
            let _ = writeln!(out, "{title}");
            for e in listed {
                let _ = writeln!(out, "  {:>6} × {}: {}", e.requests, e.outcome, e.text);
            }
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
    let _ = writeln!(
        out,
        "{}",
        results::run_verdict::line(&run.target.name, &run_verdict(cfg, m))
    );
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
        let slo = match slo_pass(cfg, m) {
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

/// The p95 as printed: an estimate from histogram buckets, so marked `≈`, with the bucket
/// it lies in — interpolated inside a wide bucket it can exceed what any client measured.
/// A bucket wider than twice the larger of its lower bound and the mean places nothing
/// (a p95 "≈285" in 0–300 ms beside a mean of 11.7 ms): then only its bound is shown.
pub(crate) fn p95_text(q: &HistogramSummary) -> String {
    let Some(v) = q.p95 else {
        return "-".into();
    };
    let n = results::pct::fmt_num;
    match q.p95_bucket {
        Some((lo, hi)) if hi.is_finite() && hi - lo > 2.0 * lo.max(q.mean) => format!(
            "≤{} (the server's histogram bucket {}-{} ms is too wide beside the mean to \
             estimate it)",
            n(hi),
            n(lo),
            n(hi)
        ),
        Some((lo, hi)) if hi.is_infinite() => format!(
            "≥{v:.2} (estimated from histogram buckets: above the highest bound, {} ms)",
            n(lo)
        ),
        Some((lo, hi)) => format!(
            "≈{v:.2} (estimated from histogram buckets: somewhere in the {}-{} ms bucket)",
            n(lo),
            n(hi)
        ),
        None => format!("≈{v:.2} (estimated from histogram buckets)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39, polish: "p95 ≈285 (somewhere in the 0-300 ms bucket)" beside a mean of
    /// 11.7 ms: the interpolated figure says nothing; only the bucket's bound does.
    #[test]
    fn a_bucket_far_wider_than_the_mean_shows_only_its_bound() {
        let q = |mean: f64, p95: f64, bucket: (f64, f64)| HistogramSummary {
            count: 38.0,
            mean,
            p50: None,
            p95: Some(p95),
            p99: None,
            p95_bucket: Some(bucket),
        };
        let coarse = p95_text(&q(11.7, 285.0, (0.0, 300.0)));
        assert!(coarse.starts_with("≤300 ("), "{coarse}");
        assert!(!coarse.contains("285"), "{coarse}");
        // A bucket narrow beside its values still places the estimate.
        let fine = p95_text(&q(180.0, 230.0, (200.0, 250.0)));
        assert!(
            fine.starts_with("≈230.00 (") && fine.contains("200-250 ms"),
            "{fine}"
        );
        // A heavy tail far above the mean, in a bucket narrow beside its lower bound.
        let tail = p95_text(&q(16.0, 280.0, (250.0, 300.0)));
        assert!(tail.starts_with("≈280.00"), "{tail}");
    }

    #[test]
    fn bucket_quantiles_are_printed_as_estimates_with_their_bucket() {
        let before = "vllm:request_queue_time_seconds_bucket{le=\"0.25\"} 0\n\
            vllm:request_queue_time_seconds_bucket{le=\"0.5\"} 0\n\
            vllm:request_queue_time_seconds_bucket{le=\"+Inf\"} 0\n\
            vllm:request_queue_time_seconds_sum 0\nvllm:request_queue_time_seconds_count 0\n";
        let after = "vllm:request_queue_time_seconds_bucket{le=\"0.25\"} 10\n\
            vllm:request_queue_time_seconds_bucket{le=\"0.5\"} 20\n\
            vllm:request_queue_time_seconds_bucket{le=\"+Inf\"} 20\n\
            vllm:request_queue_time_seconds_sum 5\nvllm:request_queue_time_seconds_count 20\n";
        let d = replay::server_metrics::delta(
            &replay::server_metrics::histograms(before),
            &replay::server_metrics::histograms(after),
        );
        let mut run = results::build::empty_run(replay::config::Target {
            name: "t".into(),
            url: "http://127.0.0.1:1".into(),
        });
        run.server_histograms = d;
        let cfg = replay::ReplayConfig::new(Vec::new());
        let m = replay::metrics::compute(&[], 0, &[], &[50.0, 99.0]);
        let trace = results::build::TraceIdentity {
            files: Vec::new(),
            rows: 0,
            content_hash: String::new(),
        };
        let text = crate::console::console_report(&results::build::ResultInputs {
            cfg: &cfg,
            run: &run,
            metrics: &m,
            trace: &trace,
            command: "test",
            detailed: false,
        });
        let line = text
            .lines()
            .find(|l| l.contains("Server queue time"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains("≈475.00"), "{line}");
        assert!(
            line.contains("estimated from histogram buckets") && line.contains("250-500 ms"),
            "{line}"
        );
    }
}
