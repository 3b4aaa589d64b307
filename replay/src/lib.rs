//! Replay: re-issue a trace's arrival shape against candidate endpoints and measure
//! vLLM-compatible metrics (TTFT, ITL, TPOT, E2EL, throughput, goodput), with the
//! client's own dispatch lag recorded so a saturated client never reads like a slow server.
#![deny(missing_docs)]

pub mod client;
pub mod config;
pub mod cpu;
pub mod error;
pub mod metrics;
pub mod pacer;
pub mod plan;
pub mod prompt;
pub mod report;
pub mod run;
pub mod server_metrics;
pub mod synth;

pub use config::ReplayConfig;
pub use error::ReplayError;
pub use metrics::Metrics;
pub use run::{Progress, RunOutput};

/// Replays `records` against every target in turn (same schedule, `cooldown` between), and
/// returns each run with its metrics.
pub fn replay(
    cfg: &ReplayConfig,
    records: &[trace_format::TraceRecord],
    block_size: Option<usize>,
    progress: &dyn Fn(&config::Target, Progress),
) -> Result<Vec<(RunOutput, Metrics)>, ReplayError> {
    cfg.validate()?;
    let rt = run::client_runtime(cfg.client_threads)?;
    let mut out = Vec::with_capacity(cfg.targets.len());
    let run_base = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    );
    for (i, target) in cfg.targets.iter().enumerate() {
        if i > 0 && !cfg.cooldown.is_zero() {
            std::thread::sleep(cfg.cooldown);
        }
        let run_id = format!("{run_base}-{i}");
        let run = run::run_target(&rt, cfg, records, block_size, target, &run_id, &|p| {
            progress(target, p)
        })?;
        let m = metrics::compute(
            &run.records,
            run.started_at_us,
            &cfg.goodput,
            &cfg.metric_percentiles,
        );
        out.push((run, m));
    }
    Ok(out)
}
