//! Paired comparisons, one module under A/A fidelity and shadow: the same request measured
//! twice (captured and replayed, production and candidate) compared per request, with
//! Student's t intervals.

use serde::Serialize;

/// Two-sided 95% quantiles of Student's t for 1..=30 degrees of freedom; 1.96 beyond.
const T975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// The two-sided 95% quantile of Student's t with `df` degrees of freedom.
pub fn t975(df: usize) -> f64 {
    df.checked_sub(1)
        .and_then(|i| T975.get(i))
        .copied()
        .unwrap_or(1.96)
}

/// The mean and the sample variance (n − 1) of `v`.
pub fn mean_var(v: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = v.clone().count() as f64;
    let mean = v.clone().sum::<f64>() / n;
    let var = v.map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var)
}

/// Replayed / captured per request, over the requests with a value on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Paired {
    /// Requests paired.
    pub n: usize,
    /// Geometric mean of replayed / captured.
    pub ratio: f64,
    /// Its 95% confidence interval (t-based, on the log ratios; needs two requests).
    pub ci: (f64, f64),
}

impl Paired {
    /// The paired ratio of (captured, replayed) values; None without two positive pairs.
    pub fn of(pairs: impl IntoIterator<Item = (f64, f64)>) -> Option<Paired> {
        let logs: Vec<f64> = pairs
            .into_iter()
            .filter(|(c, r)| *c > 0.0 && *r > 0.0 && c.is_finite() && r.is_finite())
            .map(|(c, r)| (r / c).ln())
            .collect();
        let n = logs.len();
        if n < 2 {
            return None;
        }
        let mean = logs.iter().sum::<f64>() / n as f64;
        let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let t = t975(n - 1);
        let half = t * (var / n as f64).sqrt();
        Some(Paired {
            n,
            ratio: mean.exp(),
            ci: ((mean - half).exp(), (mean + half).exp()),
        })
    }

    /// Whether the whole interval is beyond `bound_log` (a log ratio) on one side.
    pub(crate) fn beyond(&self, bound_log: f64) -> bool {
        self.ci.0.ln() > bound_log || self.ci.1.ln() < -bound_log
    }
}
