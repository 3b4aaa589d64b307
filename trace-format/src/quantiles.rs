//! A sample's quantiles in bounded memory: exact (the values themselves) up to
//! [`EXACT_CAP`] values, then a log-bucketed histogram whose quantiles are within
//! [`RELATIVE_ERROR`] of the true ones. Count, mean, std, min and max stay exact (running
//! sums) whatever the count.
//!
//! While exact, [`Quantiles::quantile`] is numpy's linear interpolation between closest
//! ranks and [`Summary::from_quantiles`](crate::stats::Summary::from_quantiles) is
//! bit-identical to [`Summary::from_values`](crate::stats::Summary::from_values) over the
//! same values. Past the cap each value is counted in the bucket `(γ^(i-1), γ^i]` of its
//! magnitude (negatives mirrored, zero apart), with `γ = (1+α)/(1−α)`, α = [`RELATIVE_ERROR`];
//! a bucket stands for `2γ^i/(γ+1)`, within α of every value in it (DDSketch's rule), so the
//! value at any rank is within α of the true one and so is numpy's interpolation between two
//! ranks of the same sign.

/// Most values kept exactly (8 MiB of `f64`). Every percentile of a run of up to a million
/// requests (TTFT, E2EL: one value per request) stays exact, as vLLM's benchmark computes
/// it; past that a result is a day of traffic or more, where 0.1% is far below the run's own
/// variation, and a fixed 8 MiB per sample keeps a replay of any length in bounded memory.
pub const EXACT_CAP: usize = 1 << 20;

/// Bound on the relative error of a quantile once the sample passed [`EXACT_CAP`] (0.1%).
pub const RELATIVE_ERROR: f64 = 0.001;

/// Magnitudes below this are counted as zero once estimated (1e-9: a nanosecond in ms; the
/// metrics are integer µs, or µs divided by a token count).
pub const MIN_MAGNITUDE: f64 = 1e-9;

/// Exact values, then a histogram; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct Quantiles {
    /// The values while exact (at most [`EXACT_CAP`]); emptied once estimated.
    values: Vec<f64>,
    /// Set once the sample passed the cap.
    hist: Option<Histogram>,
    moments: Moments,
}

/// Count, sum (Neumaier's compensated sum) and Welford's running variance, merged by Chan's
/// rule: exact mean and std without the values.
#[derive(Debug, Clone, Copy)]
struct Moments {
    n: u64,
    sum: f64,
    comp: f64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

impl Default for Moments {
    fn default() -> Self {
        Moments {
            n: 0,
            sum: 0.0,
            comp: 0.0,
            mean: 0.0,
            m2: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

impl Moments {
    fn add(&mut self, v: f64) {
        self.n += 1;
        let t = self.sum + v;
        self.comp += if self.sum.abs() >= v.abs() {
            (self.sum - t) + v
        } else {
            (v - t) + self.sum
        };
        self.sum = t;
        let d = v - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (v - self.mean);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    fn merge(&mut self, o: &Moments) {
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *o;
            return;
        }
        let n = self.n + o.n;
        let d = o.mean - self.mean;
        self.m2 += o.m2 + d * d * (self.n as f64 * o.n as f64 / n as f64);
        self.mean += d * (o.n as f64 / n as f64);
        let t = self.sum + o.sum;
        self.comp += o.comp
            + if self.sum.abs() >= o.sum.abs() {
                (self.sum - t) + o.sum
            } else {
                (o.sum - t) + self.sum
            };
        self.sum = t;
        self.n = n;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

/// Counts per log bucket of magnitude, one side per sign, dense between the lowest and the
/// highest index seen: at most ~355,000 buckets a side whatever the values (every finite
/// `f64` from [`MIN_MAGNITUDE`] up), about 10,000 (80 KiB) for values spanning nine decades.
#[derive(Debug, Clone, Default)]
struct Histogram {
    pos: Side,
    neg: Side,
    zeros: u64,
}

#[derive(Debug, Clone, Default)]
struct Side {
    /// Index of `counts[0]`.
    base: i32,
    counts: Vec<u64>,
}

fn gamma() -> f64 {
    (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
}

/// The bucket of magnitude `m` (> 0): `ceil(log_γ m)`.
fn index(m: f64) -> i32 {
    (m.ln() / gamma().ln()).ceil() as i32
}

/// The value a bucket stands for: within α of every magnitude in `(γ^(i-1), γ^i]`.
fn representative(i: i32) -> f64 {
    let g = gamma();
    2.0 * g.powi(i) / (g + 1.0)
}

impl Side {
    fn add(&mut self, i: i32, n: u64) {
        if self.counts.is_empty() {
            self.base = i;
        }
        if i < self.base {
            let grow = (self.base - i) as usize;
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.base = i;
        }
        let at = (i - self.base) as usize;
        if at >= self.counts.len() {
            self.counts.resize(at + 1, 0);
        }
        self.counts[at] += n;
    }
}

impl Histogram {
    fn add(&mut self, v: f64, n: u64) {
        let m = v.abs();
        if m < MIN_MAGNITUDE {
            self.zeros += n;
        } else if v > 0.0 {
            self.pos.add(index(m), n);
        } else {
            self.neg.add(index(m), n);
        }
    }

    fn merge(&mut self, o: &Histogram) {
        self.zeros += o.zeros;
        for (side, other) in [(&mut self.pos, &o.pos), (&mut self.neg, &o.neg)] {
            for (k, &c) in other.counts.iter().enumerate() {
                if c > 0 {
                    side.add(other.base + k as i32, c);
                }
            }
        }
    }

    /// The estimate of the value of 0-based rank `k` in ascending order.
    fn at_rank(&self, mut k: u64) -> f64 {
        for (j, &c) in self.neg.counts.iter().enumerate().rev() {
            if k < c {
                return -representative(self.neg.base + j as i32);
            }
            k -= c;
        }
        if k < self.zeros {
            return 0.0;
        }
        k -= self.zeros;
        for (j, &c) in self.pos.counts.iter().enumerate() {
            if k < c {
                return representative(self.pos.base + j as i32);
            }
            k -= c;
        }
        // Past the last rank (cannot happen for k < count): the largest bucket.
        self.pos
            .counts
            .len()
            .checked_sub(1)
            .map_or(0.0, |j| representative(self.pos.base + j as i32))
    }

    /// Values counted above `x` (buckets straddling `x` count when their representative is).
    fn count_above(&self, x: f64) -> u64 {
        let side = |s: &Side, sign: f64| -> u64 {
            s.counts
                .iter()
                .enumerate()
                .filter(|(j, _)| sign * representative(s.base + *j as i32) > x)
                .map(|(_, &c)| c)
                .sum()
        };
        side(&self.pos, 1.0) + side(&self.neg, -1.0) + if 0.0 > x { self.zeros } else { 0 }
    }

    fn buckets(&self) -> usize {
        self.pos.counts.len() + self.neg.counts.len()
    }
}

impl Quantiles {
    /// An empty sample.
    pub fn new() -> Quantiles {
        Quantiles::default()
    }

    /// Adds one value. NaN and infinities are not values of any metric and are not stored
    /// (nor counted).
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.moments.add(v);
        match &mut self.hist {
            Some(h) => h.add(v, 1),
            None if self.values.len() < EXACT_CAP => self.values.push(v),
            None => {
                self.spill();
                if let Some(h) = &mut self.hist {
                    h.add(v, 1);
                }
            }
        }
    }

    /// Moves the exact values into a histogram (and frees them).
    fn spill(&mut self) {
        let mut h = Histogram::default();
        for &v in &self.values {
            h.add(v, 1);
        }
        self.values = Vec::new();
        self.hist = Some(h);
    }

    /// Adds every value of `other` (exact while the two together fit under the cap).
    pub fn merge(&mut self, other: &Quantiles) {
        self.moments.merge(&other.moments);
        if self.hist.is_none()
            && other.hist.is_none()
            && self.values.len() + other.values.len() <= EXACT_CAP
        {
            self.values.extend_from_slice(&other.values);
            return;
        }
        if self.hist.is_none() {
            self.spill();
        }
        let Some(h) = &mut self.hist else { return };
        match &other.hist {
            Some(o) => h.merge(o),
            None => {
                for &v in &other.values {
                    h.add(v, 1);
                }
            }
        }
    }

    /// Number of values added.
    pub fn len(&self) -> usize {
        self.moments.n as usize
    }

    /// Whether no value was added.
    pub fn is_empty(&self) -> bool {
        self.moments.n == 0
    }

    /// Whether quantiles are exact (the sample never passed [`EXACT_CAP`]).
    pub fn is_exact(&self) -> bool {
        self.hist.is_none()
    }

    /// Bound on the relative error of [`quantile`](Self::quantile): 0 while exact, then
    /// [`RELATIVE_ERROR`] (relative to the larger magnitude of the two ranks interpolated
    /// between, which is the value itself unless they straddle zero).
    pub fn relative_error(&self) -> f64 {
        if self.is_exact() {
            0.0
        } else {
            RELATIVE_ERROR
        }
    }

    /// How many numbers the sample holds: its values while exact, its buckets after (the
    /// memory it retains, in 8-byte units, beyond a fixed few).
    pub fn retained(&self) -> usize {
        self.values.len() + self.hist.as_ref().map_or(0, Histogram::buckets)
    }

    /// The values while exact (in the order added), None once estimated.
    pub fn exact_values(&self) -> Option<&[f64]> {
        self.is_exact().then_some(self.values.as_slice())
    }

    /// The `p`th percentile (0–100, clamped) by numpy's linear interpolation between closest
    /// ranks; NaN when empty. Exact while [`is_exact`](Self::is_exact), else within
    /// [`relative_error`](Self::relative_error). Costs a copy of the values while exact.
    pub fn quantile(&self, p: f64) -> f64 {
        let n = self.len();
        if n == 0 {
            return f64::NAN;
        }
        let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
        let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
        let frac = rank - lo as f64;
        let (a, b) = match &self.hist {
            None => {
                let mut v = self.values.clone();
                let (_, &mut a, rest) = v.select_nth_unstable_by(lo, f64::total_cmp);
                let b = if hi == lo {
                    a
                } else {
                    rest.iter().copied().min_by(f64::total_cmp).unwrap_or(a)
                };
                (a, b)
            }
            Some(h) => {
                let clamp = |v: f64| v.clamp(self.moments.min, self.moments.max);
                (clamp(h.at_rank(lo as u64)), clamp(h.at_rank(hi as u64)))
            }
        };
        if n == 1 {
            return a;
        }
        a + (b - a) * frac
    }

    /// Values greater than `x`: exact while exact, else within the buckets around `x`
    /// (values within [`RELATIVE_ERROR`] of `x` may be miscounted).
    pub fn count_above(&self, x: f64) -> usize {
        match &self.hist {
            None => self.values.iter().filter(|&&v| v > x).count(),
            Some(h) => h.count_above(x) as usize,
        }
    }

    /// Arithmetic mean (0 when empty), from a compensated running sum.
    pub fn mean(&self) -> f64 {
        if self.moments.n == 0 {
            0.0
        } else {
            (self.moments.sum + self.moments.comp) / self.moments.n as f64
        }
    }

    /// Population standard deviation (0 when empty), from Welford's running variance.
    pub fn std(&self) -> f64 {
        if self.moments.n == 0 {
            0.0
        } else {
            (self.moments.m2.max(0.0) / self.moments.n as f64).sqrt()
        }
    }

    /// Smallest value (0 when empty).
    pub fn min(&self) -> f64 {
        if self.moments.n == 0 {
            0.0
        } else {
            self.moments.min
        }
    }

    /// Largest value (0 when empty).
    pub fn max(&self) -> f64 {
        if self.moments.n == 0 {
            0.0
        } else {
            self.moments.max
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{percentile, Summary};
    use proptest::prelude::*;

    /// splitmix64: a fixed pseudo-random sequence.
    fn mix(i: usize) -> u64 {
        let mut z = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn sorted(v: &[f64]) -> Vec<f64> {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s
    }

    /// A sample past the cap: `extra` values beyond EXACT_CAP drawn from `f`.
    fn past_cap(f: impl Fn(usize) -> f64) -> (Quantiles, Vec<f64>) {
        let mut q = Quantiles::new();
        let mut all = Vec::with_capacity(EXACT_CAP + 1000);
        for i in 0..EXACT_CAP + 1000 {
            let v = f(i);
            q.add(v);
            all.push(v);
        }
        (q, sorted(&all))
    }

    fn within(est: f64, truth: f64, bound: f64) -> bool {
        (est - truth).abs() <= bound * truth.abs() * (1.0 + 1e-9) + 1e-12
    }

    proptest! {
        /// Below the cap a summary is bit-identical to today's, whatever the values.
        #[test]
        fn exact_below_the_cap(v in proptest::collection::vec(-1e6f64..1e6, 0..300),
                               p in 0.0f64..=100.0) {
            let mut q = Quantiles::new();
            v.iter().for_each(|&x| q.add(x));
            prop_assert!(q.is_exact());
            prop_assert_eq!(q.relative_error(), 0.0);
            let s = sorted(&v);
            let want = percentile(&s, p);
            let got = q.quantile(p);
            prop_assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "p{}: {} vs {}", p, got, want);
            let ps = [p, 50.0, 99.0];
            prop_assert_eq!(Summary::from_quantiles(&q, &ps),
                            Summary::from_values(&mut v.clone(), &ps));
        }

        /// Merging two samples is the same as adding both.
        #[test]
        fn merge_is_adding(a in proptest::collection::vec(0.0f64..1e4, 0..100),
                           b in proptest::collection::vec(0.0f64..1e4, 0..100)) {
            let (mut qa, mut qb) = (Quantiles::new(), Quantiles::new());
            a.iter().for_each(|&x| qa.add(x));
            b.iter().for_each(|&x| qb.add(x));
            qa.merge(&qb);
            let mut all: Vec<f64> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(Summary::from_quantiles(&qa, &[90.0]),
                            Summary::from_values(&mut all, &[90.0]));
        }
    }

    #[test]
    fn past_the_cap_quantiles_are_within_the_stated_error_and_the_moments_exact() {
        // Log-normal-ish latencies over five decades, and ms from integer µs (with zeros and
        // negatives, as a clock step can give a chunk gap).
        type Shape = Box<dyn Fn(usize) -> f64>;
        let shapes: [(&str, Shape); 2] = [
            (
                "spread",
                Box::new(|i| {
                    let u = (mix(i) >> 11) as f64 / (1u64 << 53) as f64;
                    0.01 * (u * 5.0 * std::f64::consts::LN_10).exp()
                }),
            ),
            (
                "µs with zeros and negatives",
                Box::new(|i| ((mix(i) % 20_001) as i64 - 2_000) as f64 / 1000.0),
            ),
        ];
        for (name, f) in shapes {
            let (q, s) = past_cap(f);
            assert!(!q.is_exact(), "{name}");
            assert_eq!(q.len(), s.len());
            assert_eq!(q.relative_error(), RELATIVE_ERROR);
            assert!(q.retained() < 40_000, "{name}: {} buckets", q.retained());
            for p in [
                0.0, 0.1, 1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9, 99.99, 100.0,
            ] {
                let (est, truth) = (q.quantile(p), percentile(&s, p));
                // Near a sign change the bound is relative to the ranks' magnitude.
                let rank = p / 100.0 * (s.len() - 1) as f64;
                let scale = s[rank.floor() as usize]
                    .abs()
                    .max(s[rank.ceil() as usize].abs());
                assert!(
                    (est - truth).abs() <= RELATIVE_ERROR * scale * (1.0 + 1e-9),
                    "{name} p{p}: {est} vs {truth}"
                );
            }
            let mean = s.iter().sum::<f64>() / s.len() as f64;
            let var = s.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / s.len() as f64;
            assert!(
                within(q.mean(), mean, 1e-9),
                "{name}: {} vs {mean}",
                q.mean()
            );
            assert!(within(q.std(), var.sqrt(), 1e-9), "{name}");
            assert_eq!((q.min(), q.max()), (s[0], s[s.len() - 1]));
            let sum = Summary::from_quantiles(&q, &[99.0]);
            assert_eq!(sum.estimate, Some(RELATIVE_ERROR));
            assert_eq!(sum.count, s.len());
        }
    }

    #[test]
    fn memory_is_bounded_whatever_the_count() {
        let mut q = Quantiles::new();
        for i in 0..3 * EXACT_CAP {
            q.add((i % 5000) as f64 * 0.37 + 0.001);
        }
        assert!(q.exact_values().is_none());
        assert!(q.retained() < 20_000, "{}", q.retained());
        // Extremes of f64 widen the buckets' span, never beyond a fixed bound.
        q.add(f64::MAX);
        q.add(-f64::MAX);
        q.add(f64::MIN_POSITIVE);
        assert!(q.retained() < 2 * 360_000, "{}", q.retained());
        assert_eq!(q.max(), f64::MAX);
        assert_eq!(q.quantile(100.0), f64::MAX);
        assert_eq!(q.quantile(0.0), -f64::MAX);
    }

    #[test]
    fn merging_past_the_cap_keeps_every_value() {
        let (mut a, mut b) = (Quantiles::new(), Quantiles::new());
        let mut all = Vec::new();
        for i in 0..EXACT_CAP {
            let (x, y) = (1.0 + (mix(i) % 100) as f64, 1000.0 + (mix(i) % 100) as f64);
            a.add(x);
            b.add(y);
            all.extend([x, y]);
        }
        let exact_b = b.clone();
        a.merge(&b);
        assert!(!a.is_exact());
        assert_eq!(a.len(), 2 * EXACT_CAP);
        let s = sorted(&all);
        for p in [10.0, 25.0, 50.0, 75.0, 99.0] {
            assert!(
                within(a.quantile(p), percentile(&s, p), RELATIVE_ERROR),
                "p{p}"
            );
        }
        // An estimated sample merges into an exact one too.
        let mut c = exact_b;
        c.merge(&a);
        assert_eq!(c.len(), 3 * EXACT_CAP);
        all.extend((0..EXACT_CAP).map(|i| 1000.0 + (mix(i) % 100) as f64));
        let s = sorted(&all);
        for p in [10.0, 50.0, 90.0] {
            assert!(
                within(c.quantile(p), percentile(&s, p), RELATIVE_ERROR),
                "p{p}"
            );
        }
    }

    #[test]
    fn nan_and_infinities_are_not_stored() {
        let mut q = Quantiles::new();
        q.add(f64::NAN);
        q.add(f64::INFINITY);
        q.add(2.0);
        assert_eq!(q.len(), 1);
        assert_eq!(q.quantile(50.0), 2.0);
        assert!(Quantiles::new().quantile(50.0).is_nan());
        assert_eq!(q.count_above(1.0), 1);
    }

    #[test]
    fn counts_above_a_threshold() {
        let (q, s) = past_cap(|i| (i % 1000) as f64);
        let truth = s.iter().filter(|&&v| v > 500.5).count();
        assert_eq!(q.count_above(500.5), truth);
    }
}
