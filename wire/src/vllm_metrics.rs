//! vLLM's Prometheus latency histograms, the one contract three crates share: the sim
//! exports them under vLLM's names, capture exports the same bounds under its own prefix,
//! and replay's alert rules name their `le` labels. A bound that differs in one place makes
//! a `histogram_quantile` or an alert silently read the wrong bucket.

/// `vllm:time_to_first_token_seconds`.
pub const TTFT: &str = "vllm:time_to_first_token_seconds";
/// `vllm:inter_token_latency_seconds`.
pub const ITL: &str = "vllm:inter_token_latency_seconds";
/// `vllm:e2e_request_latency_seconds`.
pub const E2E: &str = "vllm:e2e_request_latency_seconds";
/// `vllm:request_queue_time_seconds`.
pub const QUEUE_TIME: &str = "vllm:request_queue_time_seconds";

/// vLLM's bounds for `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's bounds for `vllm:inter_token_latency_seconds`.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-latency bounds: `vllm:e2e_request_latency_seconds` and
/// `vllm:request_queue_time_seconds`.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_increase_strictly_and_match_vllms_ends() {
        for b in [TTFT_BUCKETS, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS] {
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        }
        // vLLM's first and last bounds (vllm/v1/metrics/loggers.py).
        assert_eq!(
            (TTFT_BUCKETS[0], *TTFT_BUCKETS.last().unwrap()),
            (0.001, 2560.0)
        );
        assert_eq!((ITL_BUCKETS[0], *ITL_BUCKETS.last().unwrap()), (0.01, 80.0));
        assert_eq!(
            (
                REQUEST_LATENCY_BUCKETS[0],
                *REQUEST_LATENCY_BUCKETS.last().unwrap()
            ),
            (0.3, 7680.0)
        );
        assert_eq!(
            (
                TTFT_BUCKETS.len(),
                ITL_BUCKETS.len(),
                REQUEST_LATENCY_BUCKETS.len()
            ),
            (22, 19, 21)
        );
    }
}
