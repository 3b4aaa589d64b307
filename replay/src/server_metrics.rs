//! The server's own view: samples a target's Prometheus `/metrics` during a run and keeps
//! the mean and peak of the scheduler gauges (vLLM's running, waiting and KV-cache usage;
//! llama.cpp's `llama-server --metrics` processing and deferred requests), so the server's
//! queue can be read beside the client's latencies. The text is read by
//! [`wire::prometheus`], the one reader and writer of the format.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::client::Client;
use wire::prometheus;
pub use wire::prometheus::Histogram;

/// Gauges sampled, by the engine's own names (a gauge the server does not export is left out).
/// llama.cpp has no KV-usage gauge and none of vLLM's histograms; its `requests_processing`
/// is vLLM's running, `requests_deferred` its waiting (requests queued for a free slot).
pub const GAUGES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
];

/// Mean and peak of one gauge over a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct GaugeStats {
    /// Samples taken.
    pub samples: usize,
    /// Mean over samples.
    pub mean: f64,
    /// Largest sample.
    pub max: f64,
}

/// Polls `client`'s `/metrics` every `every` until `stop` fires; returns stats per gauge.
pub async fn sample(
    client: Arc<Client>,
    every: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> BTreeMap<String, GaugeStats> {
    let mut sums: BTreeMap<String, GaugeStats> = BTreeMap::new();
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                let Ok((200, body)) = client.get("/metrics").await else { continue };
                let text = String::from_utf8_lossy(&body);
                for g in GAUGES {
                    if let Some(v) = prometheus::sum(&text, g) {
                        let s = sums.entry((*g).to_string()).or_default();
                        s.mean += v; // a running sum until the end
                        s.max = if s.samples == 0 { v } else { s.max.max(v) };
                        s.samples += 1;
                    }
                }
            }
        }
    }
    for s in sums.values_mut() {
        if s.samples > 0 {
            s.mean /= s.samples as f64;
        }
    }
    sums
}

/// vLLM histograms scraped before and after a run, so the server's own view of the run
/// (its TTFT, queue time and E2E latency) can be read beside the client's.
pub const HISTOGRAMS: &[(&str, &str)] = &[
    ("ttft_ms", wire::vllm_metrics::TTFT),
    ("queue_time_ms", wire::vllm_metrics::QUEUE_TIME),
    ("e2el_ms", wire::vllm_metrics::E2E),
];

/// What the server's histogram saw during a run, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistogramSummary {
    /// Observations during the run.
    pub count: f64,
    /// sum / count.
    pub mean: f64,
    /// Bucket-interpolated quantiles (as `histogram_quantile`; only as exact as the buckets).
    pub p50: Option<f64>,
    /// 95th.
    pub p95: Option<f64>,
    /// 99th.
    pub p99: Option<f64>,
    /// The bucket the p95 lies in, ms (upper infinite for `+Inf`): how rough the estimate is.
    #[serde(skip)]
    pub p95_bucket: Option<(f64, f64)>,
}

impl HistogramSummary {
    /// Summarises a histogram in seconds as milliseconds.
    pub fn of(h: &Histogram) -> HistogramSummary {
        let ms = |v: Option<f64>| v.map(|x| x * 1e3);
        HistogramSummary {
            count: h.count,
            mean: if h.count > 0.0 {
                h.sum / h.count * 1e3
            } else {
                0.0
            },
            p50: ms(h.quantile(0.5)),
            p95: ms(h.quantile(0.95)),
            p99: ms(h.quantile(0.99)),
            p95_bucket: h.bucket_of(0.95).map(|(a, b)| (a * 1e3, b * 1e3)),
        }
    }
}

/// Every histogram of [`HISTOGRAMS`] in a scrape.
pub fn histograms(text: &str) -> BTreeMap<String, Histogram> {
    HISTOGRAMS
        .iter()
        .filter_map(|(k, n)| Some((k.to_string(), Histogram::read(text, n)?)))
        .collect()
}

/// The run's share of each histogram: after − before, summarised.
pub fn delta(
    before: &BTreeMap<String, Histogram>,
    after: &BTreeMap<String, Histogram>,
) -> BTreeMap<String, HistogramSummary> {
    after
        .iter()
        .map(|(k, a)| {
            let d = match before.get(k) {
                Some(b) => a.since(b),
                None => a.clone(),
            };
            (k.clone(), HistogramSummary::of(&d))
        })
        .collect()
}

/// Scrapes `/metrics` once (None when the target has none).
pub async fn scrape(client: &Client) -> Option<BTreeMap<String, Histogram>> {
    match client.get("/metrics").await {
        Ok((200, body)) => Some(histograms(&String::from_utf8_lossy(&body))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_delta_and_quantile_as_prometheus() {
        let before = "vllm:time_to_first_token_seconds_bucket{le=\"0.1\",model_name=\"m\"} 10\n\
            vllm:time_to_first_token_seconds_bucket{le=\"0.5\",model_name=\"m\"} 10\n\
            vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 10\n\
            vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.5\n\
            vllm:time_to_first_token_seconds_count{model_name=\"m\"} 10\n";
        let after = "vllm:time_to_first_token_seconds_bucket{le=\"0.1\",model_name=\"m\"} 20\n\
            vllm:time_to_first_token_seconds_bucket{le=\"0.5\",model_name=\"m\"} 30\n\
            vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 30\n\
            vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 4.5\n\
            vllm:time_to_first_token_seconds_count{model_name=\"m\"} 30\n";
        let d = delta(&histograms(before), &histograms(after));
        let t = &d["ttft_ms"];
        assert_eq!(t.count, 20.0);
        assert!((t.mean - 200.0).abs() < 1e-9);
        // rank 10 of 20 is the top of the first bucket (10 observations <= 0.1 s).
        assert!((t.p50.unwrap() - 100.0).abs() < 1e-9);
        // rank 19 is 9/10 of the way through (0.1, 0.5].
        assert!((t.p95.unwrap() - 460.0).abs() < 1e-9);
        assert!(!d.contains_key("queue_time_ms"));
    }

    /// The server's queue-time p95, interpolated inside a 0.25-0.5 s bucket, read 460 ms
    /// above a client E2EL p99 of 300 ms, printed like a measurement. Bucket-derived figures
    /// are labelled as estimates, with the bucket they come from.
    #[test]
    fn reads_gauges_with_and_without_labels() {
        let text = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_running_total 99\n\
            vllm:num_requests_waiting 2.5\n";
        assert_eq!(
            prometheus::sum(text, "vllm:num_requests_running"),
            Some(3.0)
        );
        assert_eq!(
            prometheus::sum(text, "vllm:num_requests_waiting"),
            Some(2.5)
        );
        assert_eq!(prometheus::sum(text, "vllm:kv_cache_usage_perc"), None);
    }

    #[test]
    fn reads_llama_cpp_gauges() {
        // As llama-server --metrics writes them (b11434).
        let text = "# HELP llamacpp:requests_processing Number of requests processing\n\
            # TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 8\n\
            # HELP llamacpp:requests_deferred Number of requests deferred\n\
            # TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 3\n\
            llamacpp:n_busy_slots_per_decode 5.5\n";
        let got: Vec<_> = GAUGES
            .iter()
            .filter_map(|g| prometheus::sum(text, g))
            .collect();
        assert_eq!(got, [8.0, 3.0]);
    }
}
