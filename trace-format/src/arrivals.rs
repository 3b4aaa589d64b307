//! Synthetic arrival processes: vLLM's gamma process (`--request-rate`, `--burstiness`), used
//! by `replay --request-rate`, `synth`, and importers of traces without timestamps (ShareGPT).
//!
//! The first request arrives at 0; each later one after a gamma-distributed gap with shape
//! `burstiness` and scale `1 / (rate · burstiness)`, so the mean rate is `rate` for any
//! burstiness (1 = Poisson, < 1 burstier, > 1 more regular). An infinite rate sends everything
//! at 0. The draws come from ChaCha8 seeded with `seed`: the same offsets on every machine.

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma};

use crate::error::{Error, Result};

/// Checks a rate (positive, or infinite) and a burstiness (positive, finite).
pub fn validate(rate: f64, burstiness: f64) -> Result<()> {
    if rate.is_nan() || rate <= 0.0 {
        return Err(Error::Invalid(format!(
            "--request-rate {rate}: must be positive (or inf)"
        )));
    }
    if !(burstiness.is_finite() && burstiness > 0.0) {
        return Err(Error::Invalid(format!(
            "--burstiness {burstiness}: must be a positive number"
        )));
    }
    Ok(())
}

/// Offsets from the start of `n` arrivals of the gamma process (see the module doc).
pub fn gamma_offsets(n: usize, rate: f64, burstiness: f64, seed: u64) -> Result<Vec<Duration>> {
    Ok(GammaArrivals::new(rate, burstiness, seed)?
        .take(n)
        .collect())
}

/// The gamma process's offsets one at a time, without end: the same values as
/// [`gamma_offsets`] for the same parameters, for a schedule built as its rows are read.
#[derive(Debug, Clone)]
pub struct GammaArrivals {
    /// None: an infinite rate (every offset 0).
    gamma: Option<Gamma<f64>>,
    rng: ChaCha8Rng,
    t: f64,
    first: bool,
}

impl GammaArrivals {
    /// The process of `rate` requests per second and shape `burstiness`, drawn from `seed`.
    pub fn new(rate: f64, burstiness: f64, seed: u64) -> Result<Self> {
        validate(rate, burstiness)?;
        let gamma = if rate.is_infinite() {
            None
        } else {
            Some(
                Gamma::new(burstiness, 1.0 / (rate * burstiness)).map_err(|e| {
                    Error::Invalid(format!("gamma({burstiness}, 1/({rate}·{burstiness})): {e}"))
                })?,
            )
        };
        Ok(GammaArrivals {
            gamma,
            rng: ChaCha8Rng::seed_from_u64(seed),
            t: 0.0,
            first: true,
        })
    }
}

impl Iterator for GammaArrivals {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if let Some(g) = &self.gamma {
            if !std::mem::take(&mut self.first) {
                self.t += g.sample(&mut self.rng);
            }
        }
        Some(Duration::from_secs_f64(self.t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_offsets_have_the_asked_rate_and_are_seeded() {
        let a = gamma_offsets(20_000, 100.0, 1.0, 3).unwrap();
        assert_eq!(a, gamma_offsets(20_000, 100.0, 1.0, 3).unwrap());
        assert_ne!(a, gamma_offsets(20_000, 100.0, 1.0, 4).unwrap());
        assert_eq!(a[0], Duration::ZERO);
        let rate = 19_999.0 / a.last().unwrap().as_secs_f64();
        assert!((rate - 100.0).abs() < 3.0, "rate {rate}");
        // Burstier: same mean rate, larger spread of gaps.
        let b = gamma_offsets(20_000, 100.0, 0.25, 3).unwrap();
        let rate_b = 19_999.0 / b.last().unwrap().as_secs_f64();
        assert!((rate_b - 100.0).abs() < 6.0, "rate {rate_b}");
        let cv = |v: &[Duration]| {
            let g: Vec<f64> = v.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
            let m = g.iter().sum::<f64>() / g.len() as f64;
            (g.iter().map(|x| (x - m).powi(2)).sum::<f64>() / g.len() as f64).sqrt() / m
        };
        assert!(cv(&b) > 1.5 * cv(&a), "{} vs {}", cv(&b), cv(&a));
        assert!(gamma_offsets(3, f64::INFINITY, 1.0, 0)
            .unwrap()
            .iter()
            .all(|d| d.is_zero()));
        assert!(gamma_offsets(3, 0.0, 1.0, 0).is_err());
        // Read lazily, the process is the same sequence however far it is read: a schedule
        // built row by row has the offsets of one built at once.
        let mut lazy = GammaArrivals::new(100.0, 0.25, 3).unwrap();
        assert!(lazy.by_ref().take(5_000).eq(b[..5_000].iter().copied()));
        assert!(lazy.take(15_000).eq(b[5_000..].iter().copied()));
        assert!(gamma_offsets(3, 1.0, f64::NAN, 0).is_err());
    }
}
