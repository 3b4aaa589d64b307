//! The server's own view: samples a target's Prometheus `/metrics` during a run and keeps
//! the mean and peak of vLLM's scheduler gauges (running, waiting, KV-cache usage), so the
//! server's queue can be read beside the client's latencies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::client::Client;

/// Gauges sampled, by vLLM's names.
pub const GAUGES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
];

/// Mean and peak of one gauge over a run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GaugeStats {
    /// Samples taken.
    pub samples: usize,
    /// Mean over samples.
    pub mean: f64,
    /// Largest sample.
    pub max: f64,
}

/// Sums every series of `name` in a Prometheus text exposition (labels ignored).
pub fn gauge_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = match rest.as_bytes().first() {
            Some(b'{') => match rest.find('}') {
                Some(i) => &rest[i + 1..],
                None => continue,
            },
            Some(b' ') => rest,
            _ => continue, // a longer name with this prefix
        };
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
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
                    if let Some(v) = gauge_value(&text, g) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_gauges_with_and_without_labels() {
        let text = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_running_total 99\n\
            vllm:num_requests_waiting 2.5\n";
        assert_eq!(gauge_value(text, "vllm:num_requests_running"), Some(3.0));
        assert_eq!(gauge_value(text, "vllm:num_requests_waiting"), Some(2.5));
        assert_eq!(gauge_value(text, "vllm:kv_cache_usage_perc"), None);
    }
}
