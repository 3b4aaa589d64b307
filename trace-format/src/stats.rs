//! Summary statistics with the definitions vLLM's benchmark uses: mean, median, population
//! standard deviation, and percentiles by linear interpolation between closest ranks
//! (numpy's default), so our numbers can be laid beside theirs. Over samples too large to
//! hold, [`Summary::from_quantiles`] says when its percentiles are estimates.

use serde::Serialize;

use crate::quantiles::Quantiles;

/// The `p`th percentile (0–100) of ascending `sorted` values; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

/// Count, mean, median, population std and the asked percentiles of a sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Number of values.
    pub count: usize,
    /// Arithmetic mean (0 when empty, as vLLM reports).
    pub mean: f64,
    /// Median (0 when empty).
    pub median: f64,
    /// Population standard deviation (0 when empty).
    pub std: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// `(p, value)` for each asked percentile.
    pub percentiles: Vec<(f64, f64)>,
    /// None when the percentiles are exact; else the bound on their relative error (the
    /// sample passed [`EXACT_CAP`](crate::quantiles::EXACT_CAP) values). Count, mean, std,
    /// min and max are exact either way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<f64>,
}

impl Summary {
    /// Summarises `values` (sorted in place). An empty sample gives zeros, as vLLM does.
    pub fn from_values(values: &mut [f64], percentiles: &[f64]) -> Summary {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        if n == 0 {
            return Summary {
                count: 0,
                mean: 0.0,
                median: 0.0,
                std: 0.0,
                min: 0.0,
                max: 0.0,
                percentiles: percentiles.iter().map(|&p| (p, 0.0)).collect(),
                estimate: None,
            };
        }
        // Sum in f64 over sorted values (small first) to keep precision.
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        Summary {
            count: n,
            mean,
            median: percentile(values, 50.0),
            std: var.sqrt(),
            min: values[0],
            max: values[n - 1],
            percentiles: percentiles
                .iter()
                .map(|&p| (p, percentile(values, p)))
                .collect(),
            estimate: None,
        }
    }

    /// Summarises a bounded-memory sample: exactly [`from_values`](Self::from_values) over
    /// the same values while `q` is exact, else its estimates with
    /// [`estimate`](Self::estimate) set.
    pub fn from_quantiles(q: &Quantiles, percentiles: &[f64]) -> Summary {
        if let Some(v) = q.exact_values() {
            return Summary::from_values(&mut v.to_vec(), percentiles);
        }
        Summary {
            count: q.len(),
            mean: q.mean(),
            median: q.quantile(50.0),
            std: q.std(),
            min: q.min(),
            max: q.max(),
            percentiles: percentiles.iter().map(|&p| (p, q.quantile(p))).collect(),
            estimate: Some(q.relative_error()),
        }
    }

    /// The value of percentile `p` if it was asked for.
    pub fn get(&self, p: f64) -> Option<f64> {
        self.percentiles
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, v)| *v)
    }
}

/// Formats a percentile for key names the way vLLM does: `99` → "99", `99.9` → "99.9".
pub fn percentile_label(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy_linear() {
        // numpy.percentile([1,2,3,4], [0,25,50,90,99,100]) = [1, 1.75, 2.5, 3.7, 3.97, 4]
        let v = [1.0, 2.0, 3.0, 4.0];
        let expect = [
            (0.0, 1.0),
            (25.0, 1.75),
            (50.0, 2.5),
            (90.0, 3.7),
            (99.0, 3.97),
            (100.0, 4.0),
        ];
        for (p, e) in expect {
            assert!(
                (percentile(&v, p) - e).abs() < 1e-12,
                "p{p}: {}",
                percentile(&v, p)
            );
        }
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn summary_uses_population_std() {
        let mut v = vec![4.0, 2.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        let s = Summary::from_values(&mut v, &[50.0, 99.0]);
        assert_eq!(s.count, 8);
        assert_eq!(s.mean, 5.0);
        assert_eq!(s.std, 2.0); // numpy.std (ddof=0)
        assert_eq!(s.median, 4.5);
        assert_eq!(s.get(50.0), Some(4.5));
        assert_eq!(s.min, 2.0);
        assert_eq!(s.max, 9.0);
        let empty = Summary::from_values(&mut [], &[99.0]);
        assert_eq!((empty.mean, empty.get(99.0)), (0.0, Some(0.0)));
    }

    #[test]
    fn labels_like_vllm() {
        assert_eq!(percentile_label(99.0), "99");
        assert_eq!(percentile_label(99.9), "99.9");
    }
}
