//! Server-side metrics in vLLM's Prometheus names (V1 engine), so a replay can be checked
//! against what the server itself saw. Updated once per engine step, rendered on `/metrics`.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use wire::prometheus::{self, escape_label};
use wire::vllm_metrics as names;
pub use wire::vllm_metrics::{ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS};

/// Why a request finished, as in OpenAI's `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model stopped on its own (end of sequence).
    Stop,
    /// `max_tokens` was reached.
    Length,
}

impl FinishReason {
    /// The OpenAI / vLLM string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// A fixed-bucket histogram.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, d: Duration) {
        let v = d.as_secs_f64();
        self.sum += v;
        self.count += 1;
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the observations, in seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// A copy of every metric at one moment.
#[derive(Debug, Clone)]
pub struct MetricsSnapshot {
    /// `vllm:num_requests_running`.
    pub num_requests_running: u64,
    /// `vllm:num_requests_waiting`.
    pub num_requests_waiting: u64,
    /// `vllm:kv_cache_usage_perc` (a fraction in 0..=1, as vLLM).
    pub kv_cache_usage_perc: f64,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens_total: u64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens_total: u64,
    /// `vllm:request_success_total` with `finished_reason="stop"`.
    pub request_success_stop: u64,
    /// `vllm:request_success_total` with `finished_reason="length"`.
    pub request_success_length: u64,
    /// `vllm:num_preemptions_total`.
    pub num_preemptions_total: u64,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub prefix_cache_queries_total: u64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub prefix_cache_hits_total: u64,
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e: Histogram,
    /// `vllm:inter_token_latency_seconds`.
    pub itl: Histogram,
    /// `vllm:request_queue_time_seconds`.
    pub queue_time: Histogram,
}

/// The metric registry of one simulated server.
#[derive(Debug)]
pub struct Metrics {
    model_name: String,
    inner: Mutex<MetricsSnapshot>,
}

impl Metrics {
    /// A registry with every metric at zero, labelled with `model_name`.
    pub fn new(model_name: &str) -> Self {
        Metrics {
            model_name: model_name.to_owned(),
            inner: Mutex::new(MetricsSnapshot {
                num_requests_running: 0,
                num_requests_waiting: 0,
                kv_cache_usage_perc: 0.0,
                prompt_tokens_total: 0,
                generation_tokens_total: 0,
                request_success_stop: 0,
                request_success_length: 0,
                num_preemptions_total: 0,
                prefix_cache_queries_total: 0,
                prefix_cache_hits_total: 0,
                ttft: Histogram::new(TTFT_BUCKETS),
                e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            }),
        }
    }

    /// A copy of all metrics now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        self.lock().clone()
    }

    pub(crate) fn update(&self) -> Update<'_> {
        Update { g: self.lock() }
    }

    fn lock(&self) -> MutexGuard<'_, MetricsSnapshot> {
        // A panic while holding the lock cannot leave the counters invalid; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renders all metrics in the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let s = self.snapshot();
        let label = format!("model_name=\"{}\"", escape_label(&self.model_name));
        let mut out = String::with_capacity(8192);
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            prometheus::single(out, name, help, "gauge", &label, prometheus::float(v));
        };
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            prometheus::single(out, name, help, "counter", &label, v);
        };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            s.num_requests_running as f64,
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            s.num_requests_waiting as f64,
        );
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            s.kv_cache_usage_perc,
        );
        counter(
            &mut out,
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            s.prompt_tokens_total,
        );
        counter(
            &mut out,
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            s.generation_tokens_total,
        );
        let success = "vllm:request_success_total";
        prometheus::head(
            &mut out,
            success,
            "Count of successfully processed requests.",
            "counter",
        );
        for (reason, n) in [
            ("stop", s.request_success_stop),
            ("length", s.request_success_length),
        ] {
            let labels = format!("finished_reason=\"{reason}\",{label}");
            prometheus::sample(&mut out, success, &labels, n);
        }
        counter(
            &mut out,
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            s.num_preemptions_total,
        );
        counter(
            &mut out,
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries_total,
        );
        counter(
            &mut out,
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits_total,
        );
        let hists: [(&str, &str, &Histogram); 4] = [
            (
                names::TTFT,
                "Histogram of time to first token in seconds.",
                &s.ttft,
            ),
            (
                names::E2E,
                "Histogram of e2e request latency in seconds.",
                &s.e2e,
            ),
            (
                names::ITL,
                "Histogram of inter-token latency in seconds.",
                &s.itl,
            ),
            (
                names::QUEUE_TIME,
                "Histogram of time spent in WAITING phase for request.",
                &s.queue_time,
            ),
        ];
        for (name, help, h) in hists {
            prometheus::head(&mut out, name, help, "histogram");
            let counts = h.counts.iter().copied();
            prometheus::histogram(&mut out, name, &label, h.bounds, counts, h.sum, h.count);
        }
        out
    }
}

/// A locked view for a batch of updates (one lock per engine step).
pub(crate) struct Update<'a> {
    g: MutexGuard<'a, MetricsSnapshot>,
}

impl Update<'_> {
    pub(crate) fn gauges(&mut self, running: usize, waiting: usize, kv_usage: f64) {
        self.g.num_requests_running = running as u64;
        self.g.num_requests_waiting = waiting as u64;
        self.g.kv_cache_usage_perc = kv_usage;
    }
    pub(crate) fn add_running(&mut self, delta: i64) {
        self.g.num_requests_running = self.g.num_requests_running.saturating_add_signed(delta);
    }
    pub(crate) fn prompt_tokens(&mut self, n: u32) {
        self.g.prompt_tokens_total += u64::from(n);
    }
    pub(crate) fn generation_tokens(&mut self, n: u32) {
        self.g.generation_tokens_total += u64::from(n);
    }
    pub(crate) fn success(&mut self, reason: FinishReason) {
        match reason {
            FinishReason::Stop => self.g.request_success_stop += 1,
            FinishReason::Length => self.g.request_success_length += 1,
        }
    }
    pub(crate) fn preemption(&mut self) {
        self.g.num_preemptions_total += 1;
    }
    pub(crate) fn prefix_cache(&mut self, queried: u32, hit: u32) {
        self.g.prefix_cache_queries_total += u64::from(queried);
        self.g.prefix_cache_hits_total += u64::from(hit);
    }
    pub(crate) fn ttft(&mut self, d: Duration) {
        self.g.ttft.observe(d);
    }
    pub(crate) fn e2e(&mut self, d: Duration) {
        self.g.e2e.observe(d);
    }
    pub(crate) fn itl(&mut self, d: Duration) {
        self.g.itl.observe(d);
    }
    pub(crate) fn queue_time(&mut self, d: Duration) {
        self.g.queue_time.observe(d);
    }
}
