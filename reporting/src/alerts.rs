//! From benchmark to monitoring: Prometheus alerting rules for the SLOs a run used, written
//! from vLLM's own histograms, so the production endpoint is watched against the same limits
//! the capacity answer was measured with.
//!
//! Per SLO metric: a percentile alert (`histogram_quantile` over 5 minutes above the limit for
//! 10 minutes) and multi-window burn-rate alerts on the objective "p% of requests within the
//! limit" (Google SRE workbook: page at 14.4x over 1 h and 5 m, ticket at 6x over 6 h and
//! 30 m). Also an error-rate alert and a capacity alert at 80% of the measured per-replica
//! capacity. Limits that fall between bucket bounds use the next bound up (said in the rule).

use std::fmt::Write as _;

use trace_format::stats::percentile_label;

use crate::capacity::{fmt_num, CapacityAnswer};
use crate::series::Series;
use replay::config::SloMetric;
use replay::error::ReplayError;

use wire::prometheus::le;
use wire::vllm_metrics::{
    self as vllm, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS as E2E_BUCKETS, TTFT_BUCKETS,
};

/// Burn-rate windows: (long, short, factor, severity).
pub const BURN_WINDOWS: &[(&str, &str, f64, &str)] =
    &[("1h", "5m", 14.4, "page"), ("6h", "30m", 6.0, "ticket")];

/// The server histogram an SLO is watched on; None for TTFAT, which no server exports
/// (vLLM's TTFT histogram counts the reasoning's first token).
fn histogram(m: SloMetric) -> Option<(&'static str, &'static [f64], &'static str)> {
    Some(match m {
        SloMetric::Ttft => (vllm::TTFT, TTFT_BUCKETS, "TTFT"),
        SloMetric::Ttfat => return None,
        // vLLM's per-token decode latency histogram (TPOT is its per-request mean).
        SloMetric::Tpot => (vllm::ITL, ITL_BUCKETS, "TPOT"),
        SloMetric::E2el => (vllm::E2E, E2E_BUCKETS, "E2EL"),
    })
}

fn ident(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, 'x');
    }
    out
}

fn yq(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Writes the rules for every series with SLOs (one group per configuration).
pub fn rules_yaml(series: &[Series], answers: &[CapacityAnswer]) -> Result<String, ReplayError> {
    let mut y = String::from("# Prometheus alerting rules written by `llmreplay report --alerts` from the SLOs of the benchmark.\n# Check with: promtool check rules FILE\ngroups:\n");
    let mut any = false;
    for (s, a) in series.iter().zip(answers) {
        if s.slos.is_empty() {
            continue;
        }
        any = true;
        let pct = s.slo_percentile;
        let q = pct / 100.0;
        let budget = 1.0 - q;
        let _ = writeln!(y, "  - name: {}", yq(&format!("llmreplay-slo-{}", s.name)));
        y.push_str("    rules:\n");
        for slo in &s.slos {
            let Some((hist, buckets, name)) = histogram(slo.metric) else {
                let _ = writeln!(
                    y,
                    "      # {}: no server histogram measures it, so no rule watches it",
                    slo.metric.key()
                );
                continue;
            };
            let limit_s = slo.limit_ms / 1000.0;
            let bound = buckets
                .iter()
                .copied()
                .find(|b| *b >= limit_s - 1e-12)
                .unwrap_or(f64::INFINITY);
            let bound_note = if (bound - limit_s).abs() < 1e-9 {
                String::new()
            } else {
                format!(" (no bucket at {limit_s} s: counted against the next bound, {bound} s)")
            };
            let id = ident(&s.name);
            let _ = write!(
                y,
                "      - alert: {name}P{p}AboveSLO_{id}\n        expr: histogram_quantile({q}, sum by (le, model_name) (rate({hist}_bucket[5m]))) > {limit_s}\n        for: 10m\n        labels:\n          severity: warning\n          slo: {m}\n        annotations:\n          summary: {sum}\n",
                p = percentile_label(pct),
                m = slo.metric.key(),
                sum = yq(&format!(
                    "{name} p{} above the {} ms SLO the capacity benchmark used ({})",
                    percentile_label(pct),
                    fmt_num(slo.limit_ms),
                    s.name
                )),
            );
            let le_s = if bound.is_finite() {
                le(bound)
            } else {
                "+Inf".into()
            };
            for (long, short, factor, sev) in BURN_WINDOWS {
                let ratio = |w: &str| {
                    format!(
                        "(1 - sum(rate({hist}_bucket{{le=\"{le_s}\"}}[{w}])) / sum(rate({hist}_count[{w}])))"
                    )
                };
                let _ = write!(
                    y,
                    "      - alert: {name}ErrorBudgetBurn_{sev}_{id}\n        expr: {ratio_long} > ({factor} * {budget:.6}) and {ratio_short} > ({factor} * {budget:.6})\n        labels:\n          severity: {sev}\n          slo: {m}\n        annotations:\n          summary: {sum}\n",
                    ratio_long = ratio(long),
                    ratio_short = ratio(short),
                    m = slo.metric.key(),
                    sum = yq(&format!(
                        "{name} error budget burning {factor}x over {long} and {short}: objective {}% of requests within {} ms{bound_note}",
                        fmt_num(pct),
                        fmt_num(slo.limit_ms)
                    )),
                );
            }
        }
        let id = ident(&s.name);
        let _ = write!(
            y,
            "      - alert: ErrorRateHigh_{id}\n        expr: sum(rate(http_requests_total{{status=~\"5..|5xx\"}}[5m])) / sum(rate(http_requests_total[5m])) > 0.01\n        for: 5m\n        labels:\n          severity: critical\n        annotations:\n          summary: {}\n",
            yq("More than 1% of requests fail (the benchmark's error rule)")
        );
        if let Some(cap) = a.max_ok_request_throughput {
            let _ = write!(
                y,
                "      - alert: ApproachingMeasuredCapacity_{id}\n        expr: sum by (instance) (rate(vllm:request_success_total[5m])) > {:.4}\n        for: 15m\n        labels:\n          severity: warning\n        annotations:\n          summary: {}\n",
                0.8 * cap,
                yq(&format!(
                    "A replica serves more than 80% of the {cap:.2} req/s it held within the SLO in the benchmark ({})",
                    s.name
                ))
            );
        }
        let _ = write!(
            y,
            "      - alert: RequestsQueueing_{id}\n        expr: sum by (instance) (vllm:num_requests_waiting) > 0\n        for: 10m\n        labels:\n          severity: warning\n        annotations:\n          summary: {}\n",
            yq("Requests wait for admission for 10 minutes: prefill queueing, TTFT will climb")
        );
    }
    if !any {
        return Err(ReplayError::Config(
            "no --goodput SLO in the results: nothing to alert on".into(),
        ));
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_use_bucket_bounds_and_burn_windows() {
        let r = json!({"request_throughput": 2.0, "num_prompts": 10, "failed": 0, "p95_ttft_ms": 100.0, "p95_tpot_ms": 20.0,
            "max_concurrency": 4,
            "llmreplay": {"target": {"name": "sim a"}, "goodput_slos": {"ttft": 500.0, "tpot": 40.0}}});
        let r = results::doc::ResultDoc::from_value(&r).unwrap();
        let s = crate::series::series_of(&[r], None, 95.0);
        let a: Vec<_> = s.iter().map(|x| x.answer()).collect();
        let y = rules_yaml(&s, &a).unwrap();
        assert!(y.contains("le=\"0.5\""), "{y}");
        assert!(
            y.contains("next bound, 0.05 s"),
            "tpot 40 ms is not a bucket: {y}"
        );
        assert!(y.contains("histogram_quantile(0.95"));
        assert!(y.contains("14.4") && y.contains("[6h]"));
        assert!(y.contains("ApproachingMeasuredCapacity_sim_a"));
        assert!(rules_yaml(&s[..0], &[]).is_err());
    }
}
