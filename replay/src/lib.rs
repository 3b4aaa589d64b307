//! Replay: re-issue a trace's arrival shape against candidate endpoints and measure
//! vLLM-compatible metrics (TTFT, ITL, TPOT, E2EL, throughput, goodput), with the
//! client's own dispatch lag recorded so a saturated client never reads like a slow server.
#![deny(missing_docs)]

pub mod client;
pub mod config;
pub mod coverage;
pub mod cpu;
mod dispatch;
pub mod error;
pub mod feed;
pub mod graph;
pub mod metrics;
pub mod output;
pub mod pacer;
pub mod plan;
pub mod preflight;
pub mod probe;
pub mod prompt;
pub mod request;
pub mod run;
pub mod served;
pub mod server_metrics;
pub mod sink;
pub mod soak;
pub mod source;
pub mod stop;
pub mod synth;
mod task;

pub use config::{ReplayConfig, ValidatedConfig};
pub use error::ReplayError;
pub use metrics::Metrics;
pub use run::{Progress, RunOutput};
pub use sink::RowSink;
pub use source::RecordSource;
pub use stop::{Interrupted, Stop};

/// Replays `source` against every target in turn (same schedule, `cooldown` between), and
/// returns each run with its metrics. Rows go to `sink` as requests finish; `stop` ends the
/// run early (the runs so far are returned, the one stopped marked
/// [`RunOutput::interrupted`]; later targets are not run). An error of the sink stops the run
/// as a stop would, and is returned.
pub fn replay(
    cfg: &ValidatedConfig,
    source: &dyn RecordSource,
    block_size: Option<usize>,
    progress: &dyn Fn(&config::Target, Progress),
    sink: &mut dyn RowSink,
    stop: &Stop,
) -> Result<Vec<(RunOutput, Metrics)>, ReplayError> {
    // Soak: the trace's passes back to back, read again per pass; the selection then applies
    // to the looped rows.
    let looped;
    let source = match cfg.soak.loops {
        Some(l) => {
            let span = source.arrival_span()?;
            let n = soak::passes(
                span,
                l,
                cfg.selection.start_offset,
                cfg.selection.duration,
                cfg.keep_rows,
            )?;
            looped = soak::Looped::new(source, n, span);
            &looped as &dyn RecordSource
        }
        None => source,
    };
    let rt = run::client_runtime(cfg.client_threads)?;
    let mut out = Vec::with_capacity(cfg.targets.len());
    let run_base = format!("{:x}", wire::clock::epoch_us());
    for (i, target) in cfg.targets.iter().enumerate() {
        if i > 0 && !cfg.cooldown.is_zero() {
            let until = std::time::Instant::now() + cfg.cooldown;
            while stop.level() == 0 && std::time::Instant::now() < until {
                std::thread::sleep(
                    until
                        .saturating_duration_since(std::time::Instant::now())
                        .min(std::time::Duration::from_millis(50)),
                );
            }
        }
        if stop.level() > 0 {
            break;
        }
        let run_id = format!("{run_base}-{i}");
        // The server's histograms before and after: its own view of exactly this run.
        let scraper = if cfg.server_metrics {
            cfg.endpoint(target)
                .and_then(|ep| {
                    client::Client::new(ep, &cfg.request, std::time::Duration::from_secs(5))
                })
                .ok()
        } else {
            None
        };
        let before = scraper
            .as_ref()
            .and_then(|c| rt.block_on(server_metrics::scrape(c)));
        let (mut run, m) = run::run_target(
            &rt,
            cfg,
            source,
            block_size,
            target,
            &run_id,
            &|p| progress(target, p),
            sink,
            stop,
        )?;
        if let (Some(c), Some(b)) = (&scraper, &before) {
            if let Some(a) = rt.block_on(server_metrics::scrape(c)) {
                run.server_histograms = server_metrics::delta(b, &a);
            }
        }
        sink.finish(&run)?;
        out.push((run, m));
    }
    Ok(out)
}
