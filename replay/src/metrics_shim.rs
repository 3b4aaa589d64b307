//! A stand-in for `metrics::MetricsBuilder` (lane metrics writes the real one, with memory
//! bounded apart from the number of rows): the same API, over [`metrics::compute`], so the
//! swap is one `use` line in `run.rs`. It holds every row until `finish`.

use trace_format::TraceRecord;

use crate::config::Slo;
use crate::metrics::{self, Metrics};

/// Metrics of a run, built row by row (any order).
pub struct MetricsBuilder {
    run_start_us: i64,
    slos: Vec<Slo>,
    percentiles: Vec<f64>,
    rows: Vec<TraceRecord>,
}

impl MetricsBuilder {
    /// Metrics of a run that started at `run_start_us` (epoch µs).
    pub fn new(run_start_us: i64, slos: &[Slo], percentiles: &[f64]) -> Self {
        MetricsBuilder {
            run_start_us,
            slos: slos.to_vec(),
            percentiles: percentiles.to_vec(),
            rows: Vec::new(),
        }
    }

    /// One finished row.
    pub fn add(&mut self, rec: &TraceRecord) {
        self.rows.push(rec.clone());
    }

    /// The metrics.
    pub fn finish(self) -> Metrics {
        metrics::compute(&self.rows, self.run_start_us, &self.slos, &self.percentiles)
    }
}
