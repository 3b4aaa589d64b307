//! The run's metrics as OTLP histograms (cumulative, explicit buckets: the GenAI
//! conventions' advised boundaries), one series per operation, model and outcome, in bounded
//! memory (a series per distinct key, at most [`MAX_SERIES`]).

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, AggregationTemporality, Histogram, HistogramDataPoint, Metric,
};
use trace_format::TraceRecord;

use crate::span::{attr, error_type, operation, Server};

/// Metric names.
pub mod name {
    /// End-to-end duration of each request, s.
    pub const DURATION: &str = "gen_ai.client.operation.duration";
    /// Time to the first chunk of streamed responses, s.
    pub const TTFC: &str = "gen_ai.client.operation.time_to_first_chunk";
    /// Time between consecutive chunks (each after the first), s.
    pub const TPOC: &str = "gen_ai.client.operation.time_per_output_chunk";
    /// Input and output tokens per request (`gen_ai.token.type`).
    pub const TOKENS: &str = "gen_ai.client.token.usage";
}

/// Most series kept; rows of further keys are counted in [`Aggregate::unkept`].
pub const MAX_SERIES: usize = 1024;

const DURATION_BOUNDS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
const TTFC_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
const TPOC_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
const TOKEN_BOUNDS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// One explicit-bucket histogram.
#[derive(Debug, Clone)]
struct Hist {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Hist {
    fn new(bounds: &'static [f64]) -> Hist {
        Hist {
            bounds,
            counts: vec![0; bounds.len() + 1],
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    fn add(&mut self, v: f64) {
        let b = self.bounds.partition_point(|&u| u < v);
        self.counts[b] += 1;
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    fn point(&self, attributes: Vec<KeyValue>, start: u64, now: u64) -> HistogramDataPoint {
        HistogramDataPoint {
            attributes,
            start_time_unix_nano: start,
            time_unix_nano: now,
            count: self.count,
            sum: Some(self.sum),
            bucket_counts: self.counts.clone(),
            explicit_bounds: self.bounds.to_vec(),
            min: Some(self.min),
            max: Some(self.max),
            ..Default::default()
        }
    }
}

/// The series key: operation, model, error type.
type Key = (&'static str, String, Option<String>);

#[derive(Debug, Clone)]
struct Series {
    duration: Hist,
    ttfc: Hist,
    tpoc: Hist,
    input: Hist,
    output: Hist,
}

impl Series {
    fn duration(&self) -> &Hist {
        &self.duration
    }
    fn ttfc(&self) -> &Hist {
        &self.ttfc
    }
    fn tpoc(&self) -> &Hist {
        &self.tpoc
    }
    fn input(&self) -> &Hist {
        &self.input
    }
    fn output(&self) -> &Hist {
        &self.output
    }
}

/// The run's histograms so far.
#[derive(Debug, Default)]
pub struct Aggregate {
    series: BTreeMap<Key, Series>,
    /// Rows whose series was not kept (over [`MAX_SERIES`]).
    pub unkept: u64,
    /// When the first row was added, ns since the epoch.
    start_ns: u64,
}

impl Aggregate {
    /// Adds a finished row.
    pub fn add(&mut self, rec: &TraceRecord) {
        if self.start_ns == 0 {
            self.start_ns = (rec.arrival_time_us.max(0) as u64).saturating_mul(1000);
        }
        let key = (
            operation(&rec.endpoint),
            rec.model.clone().unwrap_or_default(),
            error_type(rec),
        );
        if !self.series.contains_key(&key) && self.series.len() >= MAX_SERIES {
            self.unkept += 1;
            return;
        }
        let s = self.series.entry(key).or_insert_with(|| Series {
            duration: Hist::new(DURATION_BOUNDS),
            ttfc: Hist::new(TTFC_BOUNDS),
            tpoc: Hist::new(TPOC_BOUNDS),
            input: Hist::new(TOKEN_BOUNDS),
            output: Hist::new(TOKEN_BOUNDS),
        });
        let sec = |us: i64| us.max(0) as f64 / 1e6;
        if let Some(e) = rec.e2el_us {
            s.duration.add(sec(e));
        }
        if rec.stream && rec.outcome == trace_format::Outcome::Ok {
            if let Some(t) = rec.ttft_us {
                s.ttfc.add(sec(t));
            }
            for w in rec.chunk_times_us.windows(2) {
                s.tpoc.add(sec(w[1] - w[0]));
            }
        }
        if let Some(n) = rec.prompt_tokens {
            s.input.add(n as f64);
        }
        if let Some(n) = rec.output_tokens {
            s.output.add(n as f64);
        }
    }

    /// Whether any row was added.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// The histograms as OTLP metrics at `now_ns` (cumulative since the first row).
    pub fn metrics(&self, server: Option<&Server>, now_ns: u64) -> Vec<Metric> {
        let base = |(op, model, err): &Key| {
            let mut a = vec![kv(attr::OPERATION, Value::StringValue((*op).into()))];
            if !model.is_empty() {
                a.push(kv(attr::REQUEST_MODEL, Value::StringValue(model.clone())));
            }
            if let Some(sv) = server {
                a.push(kv(
                    attr::SERVER_ADDRESS,
                    Value::StringValue(sv.address.clone()),
                ));
                a.push(kv(attr::SERVER_PORT, Value::IntValue(i64::from(sv.port))));
            }
            if let Some(e) = err {
                a.push(kv(attr::ERROR_TYPE, Value::StringValue(e.clone())));
            }
            a
        };
        let start = self.start_ns;
        let points = |pick: fn(&Series) -> &Hist, extra: Option<KeyValue>| {
            self.series
                .iter()
                .filter(|(_, s)| pick(s).count > 0)
                .map(|(k, s)| {
                    let mut a = base(k);
                    a.extend(extra.clone());
                    pick(s).point(a, start, now_ns)
                })
                .collect::<Vec<_>>()
        };
        let token_type = |t: &str| Some(kv("gen_ai.token.type", Value::StringValue(t.into())));
        let mut tokens = points(Series::input, token_type("input"));
        tokens.extend(points(Series::output, token_type("output")));
        [
            (
                name::DURATION,
                "GenAI operation duration.",
                "s",
                points(Series::duration, None),
            ),
            (
                name::TTFC,
                "Time to receive the first chunk of a streamed response.",
                "s",
                points(Series::ttfc, None),
            ),
            (
                name::TPOC,
                "Time between consecutive chunks of a streamed response.",
                "s",
                points(Series::tpoc, None),
            ),
            (
                name::TOKENS,
                "Input and output tokens used.",
                "{token}",
                tokens,
            ),
        ]
        .into_iter()
        .filter(|(_, _, _, p)| !p.is_empty())
        .map(|(n, d, u, data_points)| Metric {
            name: n.into(),
            description: d.into(),
            unit: u.into(),
            data: Some(metric::Data::Histogram(Histogram {
                data_points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            })),
            ..Default::default()
        })
        .collect()
    }
}

fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fill_one_series_per_model_and_outcome() {
        let mut agg = Aggregate::default();
        for (i, model) in ["a", "a", "b"].iter().enumerate() {
            let mut r = TraceRecord::new(format!("r{i}"), 1_000, "/v1/completions");
            r.model = Some(model.to_string());
            r.stream = true;
            r.e2el_us = Some(300_000);
            r.ttft_us = Some(30_000);
            r.chunk_times_us = vec![30_000, 80_000, 300_000];
            r.prompt_tokens = Some(100);
            r.output_tokens = Some(3);
            agg.add(&r);
        }
        let mut failed = TraceRecord::new("x", 2_000, "/v1/chat/completions");
        failed.model = Some("a".into());
        failed.outcome = trace_format::Outcome::Timeout;
        failed.e2el_us = Some(5_000_000);
        agg.add(&failed);
        let m = agg.metrics(None, 9);
        let by = |n: &str| {
            let Some(metric::Data::Histogram(h)) = &m.iter().find(|x| x.name == n).unwrap().data
            else {
                panic!()
            };
            h.data_points.clone()
        };
        let d = by(name::DURATION);
        assert_eq!(d.len(), 3, "a, b, and a's timeout");
        assert_eq!(d.iter().map(|p| p.count).sum::<u64>(), 4);
        let ttfc = by(name::TTFC);
        assert_eq!(ttfc.iter().map(|p| p.count).sum::<u64>(), 3);
        // 30 ms falls in the (0.02, 0.04] bucket.
        assert_eq!(ttfc[0].bucket_counts[4], 2);
        assert_eq!(by(name::TPOC).iter().map(|p| p.count).sum::<u64>(), 6);
        assert_eq!(by(name::TOKENS).len(), 4, "input and output for a and b");
    }
}
