//! Synthetic traces: vLLM's random dataset as a trace, so every `vllm bench serve`-style run
//! is a replay too. Lengths are uniform in `[len·(1−r), len·(1+r)]` (vLLM's
//! `--random-range-ratio`), arrivals follow the same gamma process as `--request-rate`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trace_format::{TokenSource, TraceRecord};

use crate::config::EndpointKind;
use crate::error::ReplayError;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    /// Number of requests.
    pub num_prompts: usize,
    /// Mean prompt length, tokens.
    pub input_len: u32,
    /// Mean output length, tokens.
    pub output_len: u32,
    /// Relative half-width of the uniform length range, in [0, 1).
    pub range_ratio: f64,
    /// Requests per second (infinite = all at t=0).
    pub request_rate: f64,
    /// Gamma shape of inter-arrivals (1 = Poisson).
    pub burstiness: f64,
    /// Seed for lengths and arrivals.
    pub seed: u64,
    /// Endpoint recorded on every row.
    pub endpoint: EndpointKind,
    /// Arrival time of the first request, µs since the epoch.
    pub start_us: i64,
    /// Fraction of requests that stream (the rest are not streamed), in [0, 1].
    pub stream_ratio: f64,
}

fn sample_len(rng: &mut ChaCha8Rng, mean: u32, r: f64) -> i64 {
    let lo = ((f64::from(mean) * (1.0 - r)).floor() as i64).max(1);
    let hi = ((f64::from(mean) * (1.0 + r)).ceil() as i64).max(lo);
    if r == 0.0 {
        i64::from(mean).max(1)
    } else {
        rng.gen_range(lo..=hi)
    }
}

/// Generates the rows of a synthetic trace.
pub fn synth(spec: &SynthSpec) -> Result<Vec<TraceRecord>, ReplayError> {
    let mut rows = Vec::with_capacity(spec.num_prompts);
    synth_each(spec, |r| {
        rows.push(r);
        Ok(())
    })?;
    Ok(rows)
}

/// The spec's values checked, before any row is made (a refused value is a usage error).
pub fn validate(spec: &SynthSpec) -> Result<(), ReplayError> {
    if spec.num_prompts == 0 {
        return Err(ReplayError::Config(
            "--num-prompts must be at least 1".into(),
        ));
    }
    if !(0.0..1.0).contains(&spec.range_ratio) {
        return Err(ReplayError::Config(format!(
            "--range-ratio {}: must be in [0, 1)",
            spec.range_ratio
        )));
    }
    if spec.input_len == 0 || spec.output_len == 0 {
        return Err(ReplayError::Config(
            "--input-len and --output-len must be at least 1".into(),
        ));
    }
    if !(0.0..=1.0).contains(&spec.stream_ratio) {
        return Err(ReplayError::Config(format!(
            "--stream-ratio {}: must be in [0, 1]",
            spec.stream_ratio
        )));
    }
    if spec.request_rate.is_nan()
        || spec.request_rate <= 0.0
        || !spec.burstiness.is_finite()
        || spec.burstiness <= 0.0
    {
        return Err(ReplayError::Config(
            "--request-rate and --burstiness must be positive".into(),
        ));
    }
    Ok(())
}

/// Generates the rows of a synthetic trace one at a time, each passed to `row` as it is made
/// (the same rows as [`synth`], in bounded memory for any `num_prompts`); stops at `row`'s
/// first error.
pub fn synth_each(
    spec: &SynthSpec,
    mut row: impl FnMut(TraceRecord) -> Result<(), ReplayError>,
) -> Result<(), ReplayError> {
    validate(spec)?;
    let offs =
        trace_format::arrivals::GammaArrivals::new(spec.request_rate, spec.burstiness, spec.seed)?;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ 0x5157_4e54_4845_5349);
    for (i, off) in offs.take(spec.num_prompts).enumerate() {
        let r = {
            let mut r = TraceRecord::new(
                format!("synth-{:06}", i),
                spec.start_us + off.as_micros() as i64,
                spec.endpoint.path(),
            );
            r.stream = rng.gen_bool(spec.stream_ratio);
            r.prompt_tokens = Some(sample_len(&mut rng, spec.input_len, spec.range_ratio));
            r.output_tokens = Some(sample_len(&mut rng, spec.output_len, spec.range_ratio));
            r.max_tokens = r.output_tokens;
            r.prompt_tokens_source = Some(TokenSource::Recorded);
            r.output_tokens_source = Some(TokenSource::Recorded);
            r
        };
        row(r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SynthSpec {
        SynthSpec {
            num_prompts: 1000,
            input_len: 100,
            output_len: 20,
            range_ratio: 0.5,
            request_rate: 50.0,
            burstiness: 1.0,
            seed: 1,
            endpoint: EndpointKind::Completions,
            start_us: 0,
            stream_ratio: 0.75,
        }
    }

    #[test]
    fn lengths_in_range_and_seeded() {
        let a = synth(&spec()).unwrap();
        assert_eq!(a, synth(&spec()).unwrap());
        assert!(a
            .iter()
            .all(|r| (50..=150).contains(&r.prompt_tokens.unwrap())));
        assert!(a
            .iter()
            .all(|r| (10..=30).contains(&r.output_tokens.unwrap())));
        let span = (a.last().unwrap().arrival_time_us - a[0].arrival_time_us) as f64 / 1e6;
        assert!((999.0 / span - 50.0).abs() < 5.0, "rate {}", 999.0 / span);
        let mut s = spec();
        s.range_ratio = 0.0;
        assert!(synth(&s)
            .unwrap()
            .iter()
            .all(|r| r.prompt_tokens == Some(100)));
        s.range_ratio = 1.0;
        assert!(synth(&s).is_err());
    }
}
