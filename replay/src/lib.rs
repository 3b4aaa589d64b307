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
pub mod pct;
pub mod plan;
pub mod prompt;
pub mod request;
pub mod run;
pub mod served;
pub mod server_metrics;
pub mod sink;
pub mod soak;
pub mod stop;
pub mod synth;

pub use config::{ReplayConfig, ValidatedConfig};
pub use error::ReplayError;
pub use metrics::Metrics;
pub use run::{Progress, RunOutput};
pub use sink::RowSink;
pub use stop::{Interrupted, Stop};

/// Replays `records` against every target in turn (same schedule, `cooldown` between), and
/// returns each run with its metrics.
pub fn replay(
    cfg: &ValidatedConfig,
    records: &[trace_format::TraceRecord],
    block_size: Option<usize>,
    progress: &dyn Fn(&config::Target, Progress),
) -> Result<Vec<(RunOutput, Metrics)>, ReplayError> {
    // Soak: the trace's passes back to back; the selection then applies to the looped rows.
    let looped;
    let records = match cfg.soak.loops {
        Some(l) => {
            let n = soak::passes(
                records,
                l,
                cfg.selection.start_offset,
                cfg.selection.duration,
            )?;
            looped = soak::loop_records(records, n);
            looped.as_slice()
        }
        None => records,
    };
    let rt = run::client_runtime(cfg.client_threads)?;
    let mut out = Vec::with_capacity(cfg.targets.len());
    let run_base = format!("{:x}", wire::clock::epoch_us());
    for (i, target) in cfg.targets.iter().enumerate() {
        if i > 0 && !cfg.cooldown.is_zero() {
            std::thread::sleep(cfg.cooldown);
        }
        let run_id = format!("{run_base}-{i}");
        // The server's histograms before and after: its own view of exactly this run.
        let scraper = if cfg.server_metrics {
            client::Client::new(&target.url, &cfg.request, std::time::Duration::from_secs(5)).ok()
        } else {
            None
        };
        let before = scraper
            .as_ref()
            .and_then(|c| rt.block_on(server_metrics::scrape(c)));
        let mut run = run::run_target(&rt, cfg, records, block_size, target, &run_id, &|p| {
            progress(target, p)
        })?;
        if let (Some(c), Some(b)) = (&scraper, &before) {
            if let Some(a) = rt.block_on(server_metrics::scrape(c)) {
                run.server_histograms = server_metrics::delta(b, &a);
            }
        }
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
