//! `llmreplay demo`: a sim, a synthetic trace and a request-rate sweep of it, with the
//! capacity report written at the end.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use replay::config::{Arrivals, EndpointKind, ReplayConfig, Slo, Target};
use trace_format::{FileMeta, Producer};

use crate::exit::{refuse, refused};
use crate::flags::command_line;
use crate::sim_cmd::{EmbeddedSim, SimOpts};

/// The gamma shape of the demo's arrivals: near-regular (each gap within ~1% of 1/rate, the
/// mean of a level's gaps within ~0.4% at 8 requests), so every level offers its set rate
/// within 2% and the answer does not move with the draw (Poisson levels of 8 s offered 0.92
/// req/s at a set rate of 1).
const DEMO_BURSTINESS: f64 = 10_000.0;

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Offered request rates to step through (req/s).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,6", value_parser = crate::flags::parse_positive)]
    rates: Vec<f64>,
    /// Seconds of load per rate.
    #[arg(long, default_value_t = 8.0, value_parser = crate::flags::parse_positive)]
    seconds: f64,
    /// Prompt length, tokens.
    #[arg(long, default_value_t = 128)]
    input_len: u32,
    /// Output length, tokens.
    #[arg(long, default_value_t = 64)]
    output_len: u32,
    /// Directory for the demo's trace and results.
    #[arg(long, default_value = "llmreplay-demo")]
    out: PathBuf,
    /// Latency SLOs for goodput and the capacity answer, `KEY:MS`.
    #[arg(long, num_args = 1.., default_values = ["ttft:500", "tpot:50"])]
    goodput: Vec<Slo>,
    /// The load the capacity plan must carry, req/s.
    #[arg(long, default_value_t = 10.0)]
    target_qps: f64,
    /// Sim options (the demo defaults to the tiny profile, whose knee sits at a few requests/s).
    #[command(flatten)]
    pub(crate) sim: SimOpts,
}

pub(crate) fn run_demo(a: DemoArgs) -> Result<crate::exit::ExitStatus> {
    // The default for `sim` and `replay` is the H100 profile; the demo's is `tiny`, whose knee
    // a laptop reaches in seconds. An explicit --profile is what runs.
    let profile = a.sim.profile_or("tiny").to_string();
    if a.rates.is_empty() || a.rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        refuse!("--rates: give positive request rates, e.g. 2,4,8");
    }
    if !(a.seconds.is_finite() && a.seconds > 0.0) {
        refuse!("--seconds must be positive");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let s = EmbeddedSim::start(a.sim.config_with(&profile)?)?;
    println!(
        "llmreplay demo: in-process sim (profile {profile}) at {}",
        s.url()
    );
    let max_rate = a.rates.iter().cloned().fold(0.0, f64::max);
    let spec = replay::synth::SynthSpec {
        num_prompts: ((max_rate * a.seconds).ceil() as usize).max(1),
        input_len: a.input_len,
        output_len: a.output_len,
        range_ratio: 0.25,
        request_rate: f64::INFINITY,
        burstiness: 1.0,
        seed: 0,
        endpoint: EndpointKind::Completions,
        start_us: wire::clock::epoch_us(),
        stream_ratio: 1.0,
    };
    let rows = replay::synth::synth(&spec).map_err(refused)?;
    let trace_path = a.out.join("trace.parquet");
    trace_format::write_trace_file(
        &trace_path,
        &rows,
        &FileMeta::new(Producer::Synth, command_line()),
    )?;
    println!(
        "synthetic trace: {} ({} requests, prompt {}±25%, output {}±25% tokens)",
        trace_path.display(),
        rows.len(),
        a.input_len,
        a.output_len
    );
    // The levels are a request-rate sweep: the same mechanism as `replay --sweep`.
    let trace = crate::traces::read_traces(&[trace_path.display().to_string()])
        .context("reading the demo trace back")?;
    let mut cfg = ReplayConfig::new(vec![Target {
        name: "sim".into(),
        url: s.url(),
    }]);
    cfg.request.timeout = Duration::from_secs(120);
    cfg.request.prompt_salt = wire::clock::epoch_us() as u64;
    cfg.server_metrics = true;
    cfg.goodput = a.goodput.clone();
    cfg.label = Some(format!("demo-{profile}"));
    // Every level keeps this shape; the sweep sets the rate.
    cfg.arrivals = Arrivals::Rate {
        rate: a.rates[0],
        burstiness: DEMO_BURSTINESS,
    };
    let levels = a
        .rates
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let sweep_args = crate::report_cmd::SweepArgs {
        sweep: Some(
            format!("request-rate={levels}")
                .parse()
                .map_err(|e: String| anyhow::anyhow!(e))?,
        ),
        num_runs: 1,
        level_duration: Some(Duration::from_secs_f64(a.seconds)),
        slo_percentile: 95.0,
        refine: 0,
        plan: crate::report_cmd::PlanArgs {
            target_qps: Some(a.target_qps),
            redundancy: 2,
            cost_per_hour: None,
            plan_window: Duration::from_secs(300),
        },
    };
    sweep_args.prepare(&mut cfg);
    let cfg = cfg.validate().map_err(refused)?;
    let sweep_path = a.out.join("sweep.json");
    let spec = sweep_args.sweep.clone().context("the demo's sweep")?;
    // Ctrl-C stops the sweep as it stops a replay: the levels run so far are kept and
    // reported.
    let stop = replay::Stop::new();
    crate::replay_cmd::stop_on_signals(&stop, Duration::from_secs(5))?;
    let stopped = crate::report_cmd::run_sweep(
        &cfg,
        &spec,
        &sweep_args,
        &trace,
        None,
        crate::report_cmd::SweepOutputs {
            command: &command_line(),
            save_result: Some(&sweep_path),
            detailed: true,
            results: None,
            quiet: false,
            // The demo's sim shares the machine with its client: the stamps are shown, not
            // turned into the exit status.
            allow_invalid: true,
        },
        &|_, _| {},
        &stop,
    )?;
    drop(s);
    crate::report_cmd::write_reports(&sweep_path, &a.out)?;
    println!("Past the knee, requests queue in the engine: TTFT climbs first (prefill queueing), then TPOT as batches fill.");
    println!("trace, sweep JSON and reports in {}", a.out.display());
    Ok(stopped.unwrap_or(crate::exit::ExitStatus::Success))
}
