//! Per-request paired comparison and the engine's own noise floor.
//!
//! The captured row and its replay are the same request, so a difference between them is
//! measured per request ([`Paired`], shared with shadow: the geometric mean of replayed /
//! captured with a t-based 95% confidence interval on the log ratios), not only between two
//! distributions.
//!
//! An engine does not answer the same requests in the same time twice: llama-server, warm, is
//! ×1.10–1.15 apart between two runs of the same bodies at the same offsets. A second replay of
//! the same capture against the same server (`--noise`) measures that spread per class and
//! metric, replay against replay ([`NoiseFloor`]); a difference from the capture is a drift
//! only beyond it ([`judge`]), otherwise it is "within the engine's own noise".

use serde::Serialize;

use super::{quantile_beyond, shape_drifts, shape_drifts_beyond, LatencyFidelity, RATIO_TOL};
pub use crate::paired::Paired;

/// How far beyond the measured run-to-run spread a difference must be, in log ratio, to be a
/// drift. The noise run is one draw of the engine's run-to-run shift and the comparison is
/// another, so the comparison may land past the one measured; twice it keeps an A/A's false
/// alarm rare, while a server 1.5× slower is still a drift against a spread of ×1.10–1.15.
pub const NOISE_MARGIN: f64 = 2.0;

/// What a second replay of the same requests showed for one class and metric, against the
/// replay assessed: the engine's own run-to-run spread.
#[derive(Debug, Clone, Serialize)]
pub struct NoiseFloor {
    /// The noise run against the replay, per request.
    pub paired: Option<Paired>,
    /// The noise run's quantiles against the replay's: (quantile, noise / replayed).
    pub quantiles: Vec<(f64, f64)>,
    /// Its KS distance from the replay.
    pub ks: f64,
    /// The ratio a difference must pass to be a drift: the larger of [`RATIO_TOL`] and the
    /// spread measured (its largest quantile or paired ratio, either way) to the power
    /// [`NOISE_MARGIN`].
    pub bound: f64,
}

impl NoiseFloor {
    /// The floor measured by the noise run's assessment (against the replay) of the same
    /// class and metric.
    pub fn of(noise: &LatencyFidelity) -> NoiseFloor {
        let spread = noise
            .quantiles
            .iter()
            .map(|q| q.3)
            .chain(noise.paired.map(|p| p.ratio))
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(|r| r.ln().abs())
            .fold(0f64, f64::max);
        NoiseFloor {
            paired: noise.paired,
            quantiles: noise.quantiles.iter().map(|q| (q.0, q.3)).collect(),
            ks: noise.ks,
            bound: (NOISE_MARGIN * spread).max(RATIO_TOL.ln()).exp(),
        }
    }
}

/// Where a metric stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Quantiles and paired ratio within [`RATIO_TOL`], no drift of shape.
    Reproduced,
    /// Beyond the tolerance, but no further than the engine's own run-to-run spread.
    WithinNoise,
    /// Beyond the tolerance and (when measured) beyond the engine's own noise.
    Drifts,
    /// A quantile past the tolerance, but no further than sampling alone gives with so few
    /// requests ([`super::quantile_beyond`]), and nothing else says it moved.
    TooFew,
}

/// A ratio within [1/RATIO_TOL, RATIO_TOL] (NaN: no captured value to compare).
pub(super) fn within_tol(r: f64) -> bool {
    r.is_nan() || (1.0 / RATIO_TOL..=RATIO_TOL).contains(&r)
}

/// The status of one metric: its quantiles and distance, its paired ratio (a drift only when
/// the whole interval is past the tolerance), and the noise floor when one was measured.
pub fn judge(l: &LatencyFidelity) -> Status {
    let shape = shape_drifts(l.ks, &l.captured_ms, &l.replayed_ms);
    let tol = RATIO_TOL.ln();
    let paired_out = l.paired.is_some_and(|p| p.beyond(tol));
    // A quantile past the tolerance counts only when sampling alone cannot put it there.
    let beyond = |q: &(f64, f64, f64, f64), by: f64| {
        quantile_beyond(&l.captured_ms, &l.replayed_ms, q.0, by)
    };
    if !shape
        && !paired_out
        && l.quantiles
            .iter()
            .all(|q| within_tol(q.3) || !beyond(q, RATIO_TOL))
    {
        return if l.quantiles.iter().all(|q| within_tol(q.3)) {
            Status::Reproduced
        } else {
            Status::TooFew
        };
    }
    let Some(n) = &l.noise else {
        return Status::Drifts;
    };
    let bound = n.bound.ln();
    let q_out = l
        .quantiles
        .iter()
        .any(|q| q.3.is_finite() && q.3 > 0.0 && q.3.ln().abs() > bound && beyond(q, n.bound));
    let p_out = l.paired.is_some_and(|p| p.beyond(bound));
    // A shape drift beyond the noise: further from the capture than the noise run is from the
    // replay, and with some decile moved past the engine's own bound (≥ RATIO_TOL, so past
    // SHAPE_TOL too), not only past 5%.
    let shape_out = l.ks > NOISE_MARGIN * n.ks
        && shape_drifts_beyond(l.ks, &l.captured_ms, &l.replayed_ms, n.bound);
    if q_out || p_out || shape_out {
        Status::Drifts
    } else {
        Status::WithinNoise
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ratio_and_interval_of_known_pairs() {
        // Every request exactly twice as slow: ratio 2, no spread.
        let p = Paired::of([(1.0, 2.0), (5.0, 10.0), (40.0, 80.0)]).unwrap();
        assert_eq!(p.n, 3);
        assert!((p.ratio - 2.0).abs() < 1e-12 && (p.ci.0 - 2.0).abs() < 1e-12);
        // ln ratios ±ln 1.1: mean 0, sd = ln 1.1 · √2, n = 2, t = 12.706.
        let p = Paired::of([(10.0, 11.0), (11.0, 10.0)]).unwrap();
        assert!((p.ratio - 1.0).abs() < 1e-12);
        let half = 12.706 * 1.1f64.ln() * 2f64.sqrt() / 2f64.sqrt();
        assert!((p.ci.1.ln() - half).abs() < 1e-9, "{p:?}");
        // Zeros and single pairs have no ratio.
        assert!(Paired::of([(0.0, 1.0), (1.0, 2.0)]).is_none());
    }
}
