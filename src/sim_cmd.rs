//! `llmreplay sim` (the simulated engine, or the ground-truth server with `--ground-truth`),
//! and the sim flags and in-process sim that `replay` (without `--target`) and `demo` use.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::flags::{parse_duration, parse_fraction};
use crate::signals;

#[derive(Args, Debug, Clone)]
pub(crate) struct SimOpts {
    /// Engine profile (see `llmreplay sim --list-profiles`) [default: llama-3.1-8b-h100; for
    /// `demo`: tiny].
    #[arg(long)]
    profile: Option<String>,
    /// Ground-truth timing instead of the engine model: `TTFT_MS,ITL_MS` for every request, independent of load.
    #[arg(long, value_name = "TTFT_MS,ITL_MS")]
    fixed_timing: Option<String>,
    /// A server of known capacity instead of the engine model: SLOTS requests at a time, each
    /// holding its slot SERVICE_MS, the rest waiting in turn (capacity = SLOTS / SERVICE_MS).
    #[arg(long, value_name = "SLOTS,SERVICE_MS", conflicts_with = "fixed_timing")]
    slot_timing: Option<String>,
    /// Tokens per streamed chunk (as speculative decoding coalesces them).
    #[arg(long, default_value_t = 1)]
    tokens_per_chunk: u32,
    /// Seed for output lengths and fault draws.
    #[arg(long, default_value_t = 0)]
    sim_seed: u64,
    /// Model names the sim serves (repeat the flag or give a comma list): `/v1/models`
    /// lists them and a request naming another model is answered 404, as vLLM answers it.
    /// Without it the sim reports `llmreplay-sim` and accepts any model name.
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    served_model_name: Vec<String>,
    /// Fraction of requests answered with 500.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    error_rate: f64,
    /// Fraction of requests answered with 429 + Retry-After.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    rate_limit_rate: f64,
    /// Fraction of streams whose connection is reset mid-stream.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    reset_rate: f64,
    /// Fraction of requests that stall after their headers.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    stall_rate: f64,
    /// How long a stall lasts.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    stall: Duration,
    /// A reasoning model: this share of chat requests reason before they answer
    /// (`delta.reasoning_content`, then `content`, as vLLM's reasoning parsers stream it).
    #[arg(long, default_value_t = 0.0, value_name = "SHARE", value_parser = parse_fraction)]
    reasoning_share: f64,
    /// Share of a reasoning request's output tokens that are reasoning.
    #[arg(long, default_value_t = 0.5, value_name = "SHARE", value_parser = parse_fraction)]
    reasoning_fraction: f64,
    /// `usage` counts the reasoning tokens apart
    /// (`completion_tokens_details.reasoning_tokens`, as OpenAI's API does; vLLM's does not).
    #[arg(long)]
    reasoning_details: bool,
    /// Share of Responses and Messages requests that offer tools (and do not end with a
    /// tool's result) whose answer is a call of the first tool (`function_call` /
    /// `tool_use`, its arguments streamed), drawn per request.
    #[arg(long, default_value_t = 0.0, value_name = "SHARE")]
    tool_call_share: f64,
}

/// The engine profile of `sim` and `replay` without `--profile`.
pub(crate) const DEFAULT_PROFILE: &str = "llama-3.1-8b-h100";

impl SimOpts {
    /// The profile given, or `default`.
    pub(crate) fn profile_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.profile.as_deref().unwrap_or(default)
    }

    /// The sim flags given with values other than their defaults: they configure a sim, so
    /// with a `--target` (no sim) they would be silently ignored.
    pub(crate) fn given(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut flag = |on: bool, name: &'static str| {
            if on {
                v.push(name);
            }
        };
        flag(self.profile.is_some(), "--profile");
        flag(self.fixed_timing.is_some(), "--fixed-timing");
        flag(self.slot_timing.is_some(), "--slot-timing");
        flag(self.tokens_per_chunk != 1, "--tokens-per-chunk");
        flag(self.sim_seed != 0, "--sim-seed");
        flag(!self.served_model_name.is_empty(), "--served-model-name");
        flag(self.tool_call_share != 0.0, "--tool-call-share");
        flag(self.error_rate != 0.0, "--error-rate");
        flag(self.reasoning_share != 0.0, "--reasoning-share");
        flag(self.reasoning_fraction != 0.5, "--reasoning-fraction");
        flag(self.reasoning_details, "--reasoning-details");
        flag(self.rate_limit_rate != 0.0, "--rate-limit-rate");
        flag(self.reset_rate != 0.0, "--reset-rate");
        flag(self.stall_rate != 0.0, "--stall-rate");
        flag(self.stall != Duration::from_secs(3600), "--stall");
        v
    }

    pub(crate) fn config(&self) -> Result<sim::SimConfig> {
        self.config_with(DEFAULT_PROFILE)
    }

    /// The sim's configuration, `default_profile` without `--profile`; a value it cannot
    /// take is refused (status 2).
    pub(crate) fn config_with(&self, default_profile: &str) -> Result<sim::SimConfig> {
        self.config_of(default_profile)
            .map_err(crate::exit::refused)
    }

    fn config_of(&self, default_profile: &str) -> Result<sim::SimConfig> {
        let profile = self.profile_or(default_profile);
        let timing = match (&self.fixed_timing, &self.slot_timing) {
            (_, Some(spec)) => slot_timing(spec)?,
            (Some(spec), None) => {
                let (t, i) = spec
                    .split_once(',')
                    .context("--fixed-timing: expected TTFT_MS,ITL_MS, e.g. 50,10")?;
                let ms = |v: &str| -> Result<Duration> {
                    let x: f64 = v
                        .trim()
                        .parse()
                        .with_context(|| format!("--fixed-timing: {v:?} is not a number"))?;
                    if !(x.is_finite() && x >= 0.0) {
                        bail!(
                            "--fixed-timing: {v:?} must be a non-negative number of milliseconds"
                        );
                    }
                    Ok(Duration::from_secs_f64(x / 1000.0))
                };
                sim::Timing::Fixed {
                    ttft: ms(t)?,
                    itl: ms(i)?,
                }
            }
            (None, None) => {
                sim::Timing::Engine(sim::Profile::named(profile).with_context(|| {
                    format!(
                        "unknown profile {:?} (known: {})",
                        profile,
                        sim::Profile::names().join(", ")
                    )
                })?)
            }
        };
        Ok(sim::SimConfig {
            timing,
            tokens_per_chunk: self.tokens_per_chunk,
            seed: self.sim_seed,
            faults: sim::Faults {
                error_rate: self.error_rate,
                rate_limit_rate: self.rate_limit_rate,
                retry_after_secs: 1,
                reset_rate: self.reset_rate,
                stall_rate: self.stall_rate,
                stall: self.stall,
            },
            model_name: self
                .served_model_name
                .first()
                .cloned()
                .unwrap_or_else(|| "llmreplay-sim".into()),
            reasoning: sim::Reasoning {
                share: self.reasoning_share,
                fraction: self.reasoning_fraction,
                details: self.reasoning_details,
            },
            served_models: self.served_model_name.clone(),
            tool_calls: self.tool_call_share,
        })
    }
}

#[derive(Args, Debug)]
pub(crate) struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Print the built-in profiles and exit.
    #[arg(long)]
    list_profiles: bool,
    /// Serve as a ground-truth server: the --fixed-timing script (default 50,10) from a
    /// dedicated writer thread with microsecond precision, logging when every chunk was written.
    #[arg(long)]
    ground_truth: bool,
    /// With --ground-truth: write the per-request chunk log here (JSON lines) on exit.
    #[arg(long, requires = "ground_truth")]
    chunk_log: Option<PathBuf>,
    /// Answer each request with a recorded row's cadence instead: the TTFT, chunk gaps,
    /// tokens per chunk, output length and outcome (a non-2xx status at its E2EL, a reset,
    /// a cancelled or timed-out stream left silent) of the row it matches in this capture or
    /// replay's --results (files, directories or globs). A request that matches no row gets
    /// a 404 (`no_recorded_request`), counted in /metrics. Not reproduced: reasoning timing,
    /// Retry-After, the sim's vLLM metrics.
    #[arg(
        long,
        num_args = 1..,
        value_name = "TRACE",
        conflicts_with_all = ["ground_truth", "fixed_timing", "slot_timing", "profile"]
    )]
    from_trace: Vec<String>,
    /// With --from-trace: how a request finds its row, tried in this order: `id` (its
    /// `x-request-id`, which replay sends: the row's request_id), `prompt` (its messages or
    /// prompt, against rows captured with --record-bodies full), `order` (the earliest row not
    /// answered yet).
    #[arg(
        long = "match",
        value_name = "LIST",
        default_value = "id,prompt,order",
        requires = "from_trace"
    )]
    match_by: String,
    #[command(flatten)]
    sim: SimOpts,
}

pub(crate) fn run_sim(a: SimArgs) -> Result<()> {
    if a.list_profiles {
        for name in sim::Profile::names() {
            let p = sim::Profile::named(name).context("built-in profile")?;
            println!("{}\n", p.describe());
        }
        return Ok(());
    }
    if a.ground_truth {
        return run_ground_truth(&a);
    }
    let mut cfg = a.sim.config()?;
    let mock = if a.from_trace.is_empty() {
        None
    } else {
        let methods = sim::from_trace::MatchBy::parse_list(&a.match_by).context("--match")?;
        let trace = crate::traces::read_traces(&a.from_trace)
            .with_context(|| format!("--from-trace: reading {}", a.from_trace.join(" ")))?;
        let mock = std::sync::Arc::new(
            sim::from_trace::TraceMock::new(&trace.records, &methods)
                .with_context(|| format!("--from-trace {}", a.from_trace.join(" ")))?,
        );
        eprintln!(
            "llmreplay sim: answering with the {} rows of {}",
            mock.rows().len(),
            a.from_trace.join(" ")
        );
        cfg.timing = sim::Timing::Trace(mock.clone());
        Some(mock)
    };
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    // The first signal stops it, the second exits at once.
    let mut stopped = signals::watch("sim", vec![signals::graceful()])?;
    rt.block_on(async move {
        let handle = sim::start(a.listen, cfg)
            .await
            .context("starting the sim")?;
        eprintln!(
            "llmreplay sim listening on {} (Ctrl-C to stop)",
            handle.url()
        );
        stopped.wait().await;
        handle.shutdown().await;
        if let Some(m) = &mock {
            eprintln!("llmreplay sim: {}", m.counts());
        }
        Ok(())
    })
}

fn run_ground_truth(a: &SimArgs) -> Result<()> {
    use std::io::Write;
    let (ttft, itl) = match a.sim.config()?.timing {
        sim::Timing::Fixed { ttft, itl } => (ttft, itl),
        sim::Timing::Engine(_) | sim::Timing::Slots { .. } | sim::Timing::Trace(_) => {
            (Duration::from_millis(50), Duration::from_millis(10))
        }
    };
    let cfg = sim::groundtruth::GroundTruthConfig {
        ttft,
        itl,
        tokens_per_chunk: a.sim.tokens_per_chunk,
        ..Default::default()
    };
    let mut stopped = signals::watch("sim", vec![signals::graceful()])?;
    let gt = sim::groundtruth::GroundTruth::start(a.listen, cfg)
        .with_context(|| format!("binding {}", a.listen))?;
    eprintln!(
        "llmreplay ground-truth server on {} (TTFT {:?}, ITL {:?}, {} tokens/chunk); SIGINT/SIGTERM to stop",
        gt.url(),
        ttft,
        itl,
        cfg.tokens_per_chunk
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(stopped.wait());
    if let Some(p) = &a.chunk_log {
        let log = gt.log();
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        );
        for entry in &log {
            serde_json::to_writer(&mut f, entry)?;
            f.write_all(b"\n")?;
        }
        f.flush()?;
        eprintln!("{} request logs written to {}", log.len(), p.display());
    }
    Ok(())
}

/// A sim on its own runtime (threads named `llmreplay-sim`), so the client's CPU is measured apart.
pub(crate) struct EmbeddedSim {
    rt: tokio::runtime::Runtime,
    handle: Option<sim::SimHandle>,
}

impl EmbeddedSim {
    pub(crate) fn start(cfg: sim::SimConfig) -> Result<EmbeddedSim> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("llmreplay-sim")
            .enable_all()
            .build()
            .context("sim runtime")?;
        let handle = rt
            .block_on(sim::start(
                "127.0.0.1:0".parse().expect("literal address"),
                cfg,
            ))
            .context("starting the in-process sim")?;
        Ok(EmbeddedSim {
            rt,
            handle: Some(handle),
        })
    }
    pub(crate) fn url(&self) -> String {
        self.handle.as_ref().map(|h| h.url()).unwrap_or_default()
    }
}

impl Drop for EmbeddedSim {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.rt.block_on(h.shutdown());
        }
    }
}

/// `--slot-timing SLOTS,SERVICE_MS`.
fn slot_timing(spec: &str) -> Result<sim::Timing> {
    let (n, ms) = spec
        .split_once(',')
        .context("--slot-timing: expected SLOTS,SERVICE_MS, e.g. 4,20")?;
    let slots: u32 =
        n.trim().parse().ok().filter(|n| *n > 0).with_context(|| {
            format!("--slot-timing: {n:?} is not a positive whole number of slots")
        })?;
    let ms: f64 = ms
        .trim()
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite() && *x > 0.0)
        .with_context(|| {
            format!("--slot-timing: {ms:?} is not a positive number of milliseconds")
        })?;
    Ok(sim::Timing::Slots {
        slots,
        service: Duration::from_secs_f64(ms / 1000.0),
    })
}
