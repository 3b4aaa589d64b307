//! Flag definitions (the CLI contract, defined once here) and the wiring from validated
//! flags to the library crates.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use replay::config::{
    Arrivals, EndpointKind, OutputLen, PercentileMetric, ReplayConfig, RequestOptions, Selection,
    SessionMode, Shard, Slo, Target,
};
use trace_format::{FileMeta, Producer};

/// Capture production LLM traffic and replay it against candidate endpoints.
#[derive(Parser, Debug)]
#[command(name = "llmreplay", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; boxing the larger argument structs would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run a transparent streaming proxy in front of one upstream and record its traffic as a trace.
    ///
    /// Exit status after SIGTERM/SIGINT: 0 when every recorded row is in a finished file; 3
    /// when the trace is incomplete (rows dropped, or journals kept for the next start: a
    /// full disk, see the summary); 130 on a second signal during the drain; 1 when it could
    /// not start. Nothing left in --out keeps it from starting.
    Capture(crate::capture_cmd::CaptureArgs),
    /// Convert public traces (Azure, BurstGPT, Mooncake, Qwen Bailian, ShareGPT) into a trace.
    Import(crate::import_cmd::ImportArgs),
    /// Write a trace as Mooncake JSONL (NVIDIA AIPerf, SGLang bench_serving).
    Export(crate::import_cmd::ExportArgs),
    /// Run a simulated OpenAI-compatible engine (no GPU).
    Sim(SimArgs),
    /// Replay a trace's arrival shape against one or more targets (default: an in-process sim).
    Replay(ReplayArgs),
    /// Write a synthetic trace (vLLM's random dataset as a trace).
    Synth(SynthArgs),
    /// Summarise traces: rows, span, arrival rate, requests in flight, tokens, outcomes.
    Inspect(InspectArgs),
    /// Start a sim, drive synthetic load at rising rates, and show where latency leaves its flat region.
    Demo(DemoArgs),
    /// Configurations side by side: differences, SLO pass/fail, and whether each exceeds run-to-run noise.
    Compare(crate::report_cmd::CompareArgs),
    /// Write the capacity report of result files: one self-contained HTML file with plots, or Markdown.
    Report(crate::report_cmd::ReportArgs),
    /// Merge the --results of shard runs (replay --shard K/N) into one Parquet file and one JSON result.
    Merge(crate::merge_cmd::MergeArgs),
}

/// A duration: `250ms`, `30s`, `5m`, `1h`, or plain seconds (`1.5`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(Duration::from_secs_f64(v * mult)),
        _ => Err(format!("{s:?} is not a duration (e.g. 500ms, 30s, 5m, 1h)")),
    }
}

/// `--start-at`: RFC 3339 (`2026-01-02T03:04:05Z`) or `+DURATION` from now, as epoch µs.
fn parse_start_at(s: &str) -> Result<i64, String> {
    match s.trim().strip_prefix('+') {
        Some(rel) => Ok(now_us() + parse_duration(rel)?.as_micros() as i64),
        None => replay::config::parse_rfc3339_us(s),
    }
}

/// `--shard-from-env`: K from `JOB_COMPLETION_INDEX` (a Kubernetes Indexed Job), N from
/// `LLMREPLAY_SHARDS`.
fn shard_from_env() -> Result<Shard> {
    let var =
        |k: &str| std::env::var(k).with_context(|| format!("--shard-from-env: ${k} is not set"));
    let (k, n) = (var("JOB_COMPLETION_INDEX")?, var("LLMREPLAY_SHARDS")?);
    format!("{}/{}", k.trim(), n.trim())
        .parse::<Shard>()
        .map_err(|e| {
            anyhow::anyhow!("--shard-from-env (JOB_COMPLETION_INDEX/LLMREPLAY_SHARDS): {e}")
        })
}

/// A rate: a positive number or `inf`.
pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    match s {
        "inf" | "infinity" => Ok(f64::INFINITY),
        _ => match s.parse::<f64>() {
            Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
            _ => Err(format!("{s:?} is not a positive rate (or inf)")),
        },
    }
}

fn parse_kv(s: &str, sep: char) -> Result<(String, String), String> {
    match s.split_once(sep) {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("{s:?}: expected KEY{sep}VALUE")),
    }
}

fn parse_percentile(p: &str) -> Result<f64, String> {
    match p.trim().parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("{p:?} is not a percentile in 0..100")),
    }
}

#[derive(Args, Debug, Clone)]
struct SimOpts {
    /// Engine profile (see `llmreplay sim --list-profiles`) [default: llama-3.1-8b-h100; for
    /// `demo`: tiny].
    #[arg(long)]
    profile: Option<String>,
    /// Ground-truth timing instead of the engine model: `TTFT_MS,ITL_MS` for every request, independent of load.
    #[arg(long, value_name = "TTFT_MS,ITL_MS")]
    fixed_timing: Option<String>,
    /// Tokens per streamed chunk (as speculative decoding coalesces them).
    #[arg(long, default_value_t = 1)]
    tokens_per_chunk: u32,
    /// Seed for output lengths and fault draws.
    #[arg(long, default_value_t = 0)]
    sim_seed: u64,
    /// Model name the sim reports.
    #[arg(long, default_value = "llmreplay-sim")]
    served_model_name: String,
    /// Fraction of requests answered with 500.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Fraction of requests answered with 429 + Retry-After.
    #[arg(long, default_value_t = 0.0)]
    rate_limit_rate: f64,
    /// Fraction of streams whose connection is reset mid-stream.
    #[arg(long, default_value_t = 0.0)]
    reset_rate: f64,
    /// Fraction of requests that stall after their headers.
    #[arg(long, default_value_t = 0.0)]
    stall_rate: f64,
    /// How long a stall lasts.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    stall: Duration,
}

/// The engine profile of `sim` and `replay` without `--profile`.
const DEFAULT_PROFILE: &str = "llama-3.1-8b-h100";

impl SimOpts {
    /// The profile given, or `default`.
    fn profile_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.profile.as_deref().unwrap_or(default)
    }

    /// The sim flags given with values other than their defaults: they configure a sim, so
    /// with a `--target` (no sim) they would be silently ignored.
    fn given(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut flag = |on: bool, name: &'static str| {
            if on {
                v.push(name);
            }
        };
        flag(self.profile.is_some(), "--profile");
        flag(self.fixed_timing.is_some(), "--fixed-timing");
        flag(self.tokens_per_chunk != 1, "--tokens-per-chunk");
        flag(self.sim_seed != 0, "--sim-seed");
        flag(
            self.served_model_name != "llmreplay-sim",
            "--served-model-name",
        );
        flag(self.error_rate != 0.0, "--error-rate");
        flag(self.rate_limit_rate != 0.0, "--rate-limit-rate");
        flag(self.reset_rate != 0.0, "--reset-rate");
        flag(self.stall_rate != 0.0, "--stall-rate");
        flag(self.stall != Duration::from_secs(3600), "--stall");
        v
    }

    fn config(&self) -> Result<sim::SimConfig> {
        self.config_with(DEFAULT_PROFILE)
    }

    fn config_with(&self, default_profile: &str) -> Result<sim::SimConfig> {
        let profile = self.profile_or(default_profile);
        let timing = match &self.fixed_timing {
            Some(spec) => {
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
            None => sim::Timing::Engine(sim::Profile::named(profile).with_context(|| {
                format!(
                    "unknown profile {:?} (known: {})",
                    profile,
                    sim::Profile::names().join(", ")
                )
            })?),
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
            model_name: self.served_model_name.clone(),
        })
    }
}

#[derive(Args, Debug)]
struct SimArgs {
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
    #[command(flatten)]
    sim: SimOpts,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// Trace files, directories or globs.
    #[arg(required = true)]
    traces: Vec<String>,
    /// Target base URL, `URL` or `NAME=URL`; repeat to replay the same schedule against each in turn.
    /// Without one, an in-process sim is the target. `--base-url` is `vllm bench serve`'s name
    /// for it: the server's base URL without the endpoint path (a trailing /v1 is dropped).
    #[arg(long = "target", visible_alias = "base-url")]
    targets: Vec<Target>,
    /// Replay speed: 2.0 = twice as fast, 0.5 = half.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Skip this much of the trace (trace time).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    start_offset: Duration,
    /// Replay only this much of the trace (trace time); with --loop, of the looped trace:
    /// the soak's length.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Soak: replay the trace N times back to back (fresh prompt text per pass, shared
    /// prefixes kept), or `inf` to loop until --duration.
    #[arg(long = "loop", value_name = "N|inf")]
    loops: Option<replay::soak::Loops>,
    /// Metrics per time slice of this width (e.g. 30s) in the JSON and as a timeline in the
    /// report, so drift over a long run shows as a trend.
    #[arg(long, value_parser = parse_duration)]
    slice: Option<Duration>,
    /// Keep this fraction of sessions (whole sessions when session_id is present).
    #[arg(long)]
    sample_ratio: Option<f64>,
    /// Replay at most this many requests (the earliest of the selection). `--num-prompts` is
    /// `vllm bench serve`'s name for the number of requests sent; a trace is never
    /// oversampled, so a shorter selection sends all it has.
    #[arg(long, visible_alias = "num-prompts")]
    max_requests: Option<usize>,
    /// Replay shard K of N (K in 0..N): a deterministic, disjoint part of the selection with
    /// whole sessions (by session_id, else request_id); requests keep their offsets in the
    /// full schedule, so N shards started together (--start-at) reproduce its arrival shape.
    /// Merge their --results with `llmreplay merge`.
    #[arg(long, value_name = "K/N", conflicts_with = "shard_from_env")]
    shard: Option<Shard>,
    /// Take --shard from the environment: K from $JOB_COMPLETION_INDEX (a Kubernetes Indexed
    /// Job sets it), N from $LLMREPLAY_SHARDS.
    #[arg(long)]
    shard_from_env: bool,
    /// Start the schedule's clock at this wall-clock time: RFC 3339 (2026-01-02T03:04:05Z)
    /// or +DURATION from this process's launch (+30s), so separate processes start together
    /// (to the millisecond with one absolute time; with +DURATION, as close as their launches).
    /// An error when more than 1 s in the past.
    #[arg(long, value_name = "TIME", value_parser = parse_start_at)]
    start_at: Option<i64>,
    /// Replace recorded timing with gamma arrivals at this rate (req/s, or inf = all at once).
    #[arg(long, value_parser = parse_rate)]
    request_rate: Option<f64>,
    /// Gamma shape of inter-arrivals with --request-rate (1 = Poisson).
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Cap on requests in flight; waiting for a slot is client queue time, not latency.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Session pacing: open (recorded times) or closed (next turn after the candidate answers + think time).
    #[arg(long, default_value = "open")]
    session_mode: SessionMode,
    /// Endpoint for rows without a recorded body: completions or chat (default: the row's own;
    /// paths other than chat are sent as completions).
    #[arg(long)]
    endpoint: Option<EndpointKind>,
    /// Model name for every request (default: the row's, else the target's first model).
    #[arg(long)]
    model: Option<String>,
    /// Output length of built requests: recorded (with ignore_eos), request (the row's max_tokens), or N.
    #[arg(long, default_value = "recorded")]
    output_len: OutputLen,
    /// Send built requests without streaming (by default they stream as their row did).
    #[arg(long)]
    no_stream: bool,
    /// Tokenizer synthesized prompts are exact for: cl100k_base, o200k_base, words, or a
    /// tokenizer.json path (default: word filler, exact for the sim, approximate elsewhere).
    #[arg(long)]
    tokenizer: Option<String>,
    /// Salt for synthesized prompts (default: random per run, so runs do not hit each other's prefix cache).
    #[arg(long)]
    prompt_salt: Option<u64>,
    /// Seed for sampling and synthetic arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Extra request header `K:V` (repeatable).
    #[arg(long = "header", value_parser = |s: &str| parse_kv(s, ':'))]
    headers: Vec<(String, String)>,
    /// API key, sent as a bearer token (default: $OPENAI_API_KEY).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Per-request timeout.
    #[arg(long, value_parser = parse_duration, default_value = "600s")]
    timeout: Duration,
    /// PEM bundle of a private CA to trust for https targets (default: the web PKI).
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Longest TCP (and TLS) connect to a target, apart from --timeout.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    connect_timeout: Duration,
    /// Longest a keep-alive connection waits idle for its next request; keep it below the
    /// target's keep-alive timeout (uvicorn, under vLLM and SGLang: 5 s).
    #[arg(long, value_parser = parse_duration, default_value = "4s")]
    pool_idle_timeout: Duration,
    /// Exit with status 4 (after writing every result) when more than this fraction of a
    /// target's requests failed; 1 never does.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.1, value_parser = parse_fraction)]
    max_failed: f64,
    /// Do not open the connection pool before the clock starts.
    #[arg(long)]
    no_preconnect: bool,
    /// Requests sent before the clock starts, not counted.
    #[arg(long, default_value_t = 0)]
    num_warmups: usize,
    /// Latency SLOs for goodput, `KEY:MS` with keys ttft, tpot, e2el.
    #[arg(long, num_args = 1..)]
    goodput: Vec<Slo>,
    /// Metrics that get percentiles.
    #[arg(long, value_delimiter = ',', default_value = "ttft,tpot,itl,e2el")]
    percentile_metrics: Vec<PercentileMetric>,
    /// Percentiles to report.
    #[arg(long, value_delimiter = ',', value_parser = parse_percentile, default_value = "50,95,99")]
    metric_percentiles: Vec<f64>,
    /// Write the JSON result here (vLLM's key names); with several targets, one file each (NAME inserted).
    #[arg(long)]
    save_result: Option<PathBuf>,
    /// Add vLLM's per-request arrays to the JSON result.
    #[arg(long)]
    save_detailed: bool,
    /// Write one Parquet row per request (trace schema + schedule, lag, target, run id).
    #[arg(long)]
    results: Option<PathBuf>,
    /// Pause between targets.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    cooldown: Duration,
    /// A label for this run (kept in the results).
    #[arg(long)]
    label: Option<String>,
    /// Provenance `K=V` kept in the results (engine, version, GPU, settings...).
    #[arg(long, num_args = 1.., value_parser = |s: &str| parse_kv(s, '='))]
    metadata: Vec<(String, String)>,
    /// Sample each target's /metrics during the run (on by default for the in-process sim).
    #[arg(long)]
    server_metrics: bool,
    /// Client worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    client_threads: usize,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Sweeps, repeats and the capacity answer.
    #[command(flatten)]
    capacity: crate::report_cmd::SweepArgs,
    /// The in-process sim used when no --target is given.
    #[command(flatten)]
    sim: SimOpts,
}

#[derive(Args, Debug)]
struct SynthArgs {
    /// Output trace file.
    #[arg(short, long)]
    output: PathBuf,
    /// Number of requests.
    #[arg(long, default_value_t = 1000)]
    num_prompts: usize,
    /// Prompt length, tokens.
    #[arg(long, default_value_t = 1024)]
    input_len: u32,
    /// Output length, tokens.
    #[arg(long, default_value_t = 128)]
    output_len: u32,
    /// Lengths uniform in [len*(1-F), len*(1+F)].
    #[arg(long, default_value_t = 0.0)]
    range_ratio: f64,
    /// Arrival rate, req/s (inf = all at t=0).
    #[arg(long, value_parser = parse_rate, default_value = "inf")]
    request_rate: f64,
    /// Gamma shape of inter-arrivals (1 = Poisson).
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Endpoint recorded on every row.
    #[arg(long, default_value = "completions")]
    endpoint: EndpointKind,
    /// Fraction of requests that stream.
    #[arg(long, default_value_t = 1.0)]
    stream_ratio: f64,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// Trace files, directories or globs.
    #[arg(required = true)]
    traces: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Offered request rates to step through (req/s).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,6")]
    rates: Vec<f64>,
    /// Seconds of load per rate.
    #[arg(long, default_value_t = 8.0)]
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
    sim: SimOpts,
}

/// The command line as typed, quoted where needed, for provenance.
pub(crate) fn command_line() -> String {
    trace_format::redact::redact_args(std::env::args())
        .into_iter()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "\"'$`\\".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Capture(a) => crate::capture_cmd::run_capture(a),
        Command::Import(a) => crate::import_cmd::run_import(a, &command_line()),
        Command::Export(a) => crate::import_cmd::run_export(a),
        Command::Sim(a) => run_sim(a),
        Command::Replay(a) => run_replay(a),
        Command::Synth(a) => run_synth(a),
        Command::Inspect(a) => run_inspect(a),
        Command::Demo(a) => run_demo(a),
        Command::Compare(a) => {
            if crate::report_cmd::run_compare(a)? {
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
                eprintln!("regression beyond noise found");
                std::process::exit(i32::from(crate::report_cmd::EXIT_REGRESSION));
            }
            Ok(())
        }
        Command::Report(a) => crate::report_cmd::run_report(a),
        Command::Merge(a) => crate::merge_cmd::run_merge(a, &command_line()),
    }
}

fn run_sim(a: SimArgs) -> Result<()> {
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
    let cfg = a.sim.config()?;
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(async move {
        let handle = sim::start(a.listen, cfg)
            .await
            .context("starting the sim")?;
        eprintln!(
            "llmreplay sim listening on {} (Ctrl-C to stop)",
            handle.url()
        );
        tokio::signal::ctrl_c()
            .await
            .context("waiting for Ctrl-C")?;
        handle.shutdown().await;
        Ok(())
    })
}

/// Waits for SIGINT or SIGTERM.
async fn shutdown_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    Ok(())
}

fn run_ground_truth(a: &SimArgs) -> Result<()> {
    use std::io::Write;
    let (ttft, itl) = match a.sim.config()?.timing {
        sim::Timing::Fixed { ttft, itl } => (ttft, itl),
        sim::Timing::Engine(_) => (Duration::from_millis(50), Duration::from_millis(10)),
    };
    let cfg = sim::groundtruth::GroundTruthConfig {
        ttft,
        itl,
        tokens_per_chunk: a.sim.tokens_per_chunk,
        ..Default::default()
    };
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
    rt.block_on(shutdown_signal())?;
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
struct EmbeddedSim {
    rt: tokio::runtime::Runtime,
    handle: Option<sim::SimHandle>,
}

impl EmbeddedSim {
    fn start(cfg: sim::SimConfig) -> Result<EmbeddedSim> {
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
    fn url(&self) -> String {
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

fn replay_config(a: &ReplayArgs, targets: Vec<Target>) -> ReplayConfig {
    ReplayConfig {
        targets,
        selection: Selection {
            start_offset: a.start_offset,
            duration: a.duration,
            sample_ratio: a.sample_ratio,
            max_requests: a.max_requests,
            shard: a.shard,
        },
        arrivals: match a.request_rate {
            Some(rate) => Arrivals::Rate {
                rate,
                burstiness: a.burstiness,
            },
            None => Arrivals::Recorded { speedup: a.speedup },
        },
        max_concurrency: a.max_concurrency,
        session_mode: a.session_mode,
        request: RequestOptions {
            endpoint: a.endpoint,
            model: a.model.clone(),
            output_len: a.output_len,
            stream: !a.no_stream,
            prompt_salt: a
                .prompt_salt
                .unwrap_or_else(|| now_us() as u64 ^ u64::from(std::process::id())),
            headers: a.headers.clone(),
            api_key: a.api_key.clone(),
            timeout: a.timeout,
            ca_cert: a.ca_cert.clone(),
            connect_timeout: a.connect_timeout,
            pool_idle_timeout: a.pool_idle_timeout,
            tokenizer: None,
        },
        preconnect: !a.no_preconnect,
        num_warmups: a.num_warmups,
        seed: a.seed,
        goodput: a.goodput.clone(),
        percentile_metrics: a.percentile_metrics.clone(),
        metric_percentiles: a.metric_percentiles.clone(),
        cooldown: a.cooldown,
        progress: !a.quiet,
        client_threads: a.client_threads,
        label: a.label.clone(),
        metadata: a.metadata.clone(),
        server_metrics: a.server_metrics,
        soak: replay::soak::Soak {
            loops: a.loops,
            slice: a.slice,
        },
        start_at_us: a.start_at,
    }
}

fn progress_bar(enabled: bool) -> impl Fn(&Target, replay::Progress) {
    use std::io::IsTerminal;
    let on = enabled && std::io::stderr().is_terminal();
    move |t: &Target, p: replay::Progress| {
        if on {
            eprint!(
                "\r{}: {}/{} done, {} failed, {} in flight   ",
                t.name, p.done, p.total, p.failed, p.in_flight
            );
            if p.done == p.total {
                eprintln!();
            }
        }
    }
}

/// Inserts the target name before the extension: `out.json` → `out-NAME.json`.
fn per_target_path(path: &Path, name: &str, many: bool) -> PathBuf {
    if !many {
        return path.to_path_buf();
    }
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // On the string, so an object URL (`s3://b/run.json`) keeps its `//`.
    let full = path.to_string_lossy();
    let (dir, file) = match full.rsplit_once('/') {
        Some((d, f)) => (format!("{d}/"), f),
        None => (String::new(), full.as_ref()),
    };
    let (stem, ext) = match file.rsplit_once('.') {
        Some((st, e)) if !st.is_empty() => (st, format!(".{e}")),
        _ => (file, String::new()),
    };
    PathBuf::from(format!("{dir}{stem}-{safe}{ext}"))
}

fn run_replay(a: ReplayArgs) -> Result<()> {
    let trace = trace_format::read_traces(&a.traces).context("reading the trace")?;
    let block_size = trace
        .files
        .iter()
        .find_map(|f| f.meta.block_size)
        .map(|b| b as usize);
    let mut sim_guard = None;
    let mut cfg = replay_config(&a, a.targets.clone());
    if a.shard_from_env {
        cfg.selection.shard = Some(shard_from_env()?);
    }
    if let Some(spec) = &a.tokenizer {
        let pt = replay::prompt::PromptTokenizer::load(spec)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("--tokenizer {spec}"))?;
        cfg.request.tokenizer = Some(std::sync::Arc::new(pt));
    }
    // Against the in-process sim word filler is exact: the note is for real targets.
    if !a.targets.is_empty() {
        let tok = cfg.request.tokenizer.as_ref().map(|t| t.tokenizer().name());
        if let Some(n) = replay::prompt::prompt_source_note(&trace.records, tok) {
            eprintln!("{n}");
        }
    }
    if !cfg.targets.is_empty() {
        let given = a.sim.given();
        if !given.is_empty() {
            let (verb, them) = if given.len() == 1 {
                ("configures", "it")
            } else {
                ("configure", "them")
            };
            bail!(
                "{} {verb} the in-process sim, which does not run with --target: drop {them}, or the --target",
                given.join(", ")
            );
        }
    }
    if cfg.targets.is_empty() {
        let s = EmbeddedSim::start(a.sim.config()?)?;
        cfg.targets = vec![Target {
            name: "sim".into(),
            url: s.url(),
        }];
        cfg.server_metrics = true;
        eprintln!(
            "no --target: replaying against an in-process sim ({}) at {}",
            a.sim.profile_or(DEFAULT_PROFILE),
            s.url()
        );
        sim_guard = Some(s);
    }
    cfg.validate()?;
    // The result's own keys are the reporting crate's to name.
    if let Some((k, _)) = cfg
        .metadata
        .iter()
        .find(|(k, _)| reporting::is_result_key(k))
    {
        bail!("--metadata {k}=...: {k:?} is a key of the result itself; choose another name");
    }
    let command = command_line();
    if let Some(spec) = a.capacity.spec(&cfg) {
        if cfg.start_at_us.is_some() {
            bail!("--start-at starts one run; it cannot be combined with a sweep or repeats");
        }
        a.capacity.prepare(&mut cfg);
        let r = crate::report_cmd::run_sweep(
            &cfg,
            &spec,
            &a.capacity,
            &trace,
            block_size,
            crate::report_cmd::SweepOutputs {
                command: &command,
                save_result: a.save_result.as_deref(),
                detailed: a.save_detailed,
                results: a.results.as_deref(),
            },
            &progress_bar(cfg.progress),
        );
        drop(sim_guard);
        return r;
    }
    if !cfg.goodput.is_empty() {
        // The SLO percentile is what pass/fail is judged at: make sure it is reported.
        a.capacity.prepare(&mut cfg);
    }
    let runs = replay::replay(
        &cfg,
        &trace.records,
        block_size,
        &progress_bar(cfg.progress),
    )?;
    drop(sim_guard);
    let identity = reporting::report::trace_identity(&trace);
    println!("{}", reporting::console::DEFINITIONS);
    let many = runs.len() > 1;
    for (run, m) in &runs {
        let inputs = reporting::report::ResultInputs {
            cfg: &cfg,
            run,
            metrics: m,
            trace: &identity,
            command: &command,
            detailed: a.save_detailed,
        };
        println!("{}", reporting::console::console_report(&inputs));
        if let Some(p) = &a.save_result {
            let p = per_target_path(p, &run.target.name, many);
            let doc = reporting::report::result_doc(&inputs);
            let at = trace_format::store::write_bytes(&p, doc.to_bytes())
                .with_context(|| format!("writing {}", p.display()))?;
            eprintln!("result written to {at}");
        }
    }
    if many {
        let results: Vec<reporting::result_doc::ResultDoc> = runs
            .iter()
            .map(|(run, m)| {
                reporting::report::result_doc(&reporting::report::ResultInputs {
                    cfg: &cfg,
                    run,
                    metrics: m,
                    trace: &identity,
                    command: &command,
                    detailed: false,
                })
            })
            .collect();
        println!(
            "{}",
            crate::report_cmd::comparison(&results, a.capacity.slo_percentile)
        );
    }
    if let Some(p) = &a.results {
        let rows: Vec<_> = runs
            .iter()
            .flat_map(|(r, _)| r.records.iter().cloned())
            .collect();
        let mut meta = FileMeta::new(Producer::Replay, command.clone());
        meta.source = Some(identity.files.join(","));
        meta.extra
            .insert("trace_content_hash".into(), identity.content_hash.clone());
        if let Some(l) = &cfg.label {
            meta.extra.insert("label".into(), l.clone());
        }
        if let Some(sh) = cfg.selection.shard {
            meta.extra.insert("shard".into(), sh.to_string());
        }
        for (k, v) in &cfg.metadata {
            meta.extra.insert(k.clone(), v.clone());
        }
        // What `merge` reports the shards ran with.
        meta.extra.insert(
            reporting::result_doc::RunSettings::META_KEY.into(),
            reporting::report::run_settings(&cfg).to_meta(),
        );
        for (run, _) in &runs {
            meta.extra.insert(
                format!("target.{}.url", run.target.name),
                run.target.url.clone(),
            );
            meta.extra.insert(
                format!("target.{}.models", run.target.name),
                run.target_info.models.join(","),
            );
            if let Some(v) = &run.target_info.version {
                meta.extra
                    .insert(format!("target.{}.version", run.target.name), v.to_string());
            }
        }
        let at = trace_format::store::write_trace(p, &rows, &meta)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("{} result rows written to {at}", rows.len());
    }
    // A run most of whose requests failed measured a broken target, not a slow one: say so
    // in the exit status, after everything was written.
    let worst = runs
        .iter()
        .map(|(run, m)| {
            // A cancellation replayed as recorded is the load production saw, not a failure.
            let cancelled = m.outcomes.get("client_cancelled").copied().unwrap_or(0);
            let failed = m.failed.saturating_sub(cancelled);
            (run, m, failed as f64 / m.num_prompts.max(1) as f64)
        })
        .filter(|(_, _, f)| *f > a.max_failed)
        .max_by(|x, y| x.2.total_cmp(&y.2));
    if let Some((run, m, _)) = worst {
        let what = m
            .top_errors
            .first()
            .map(|(o, t, n)| format!("; most often ({n}×) {o}: {t}"))
            .unwrap_or_default();
        eprintln!(
            "error: {} of {} requests to {} failed, over --max-failed {}{what}",
            m.failed, m.num_prompts, run.target.name, a.max_failed
        );
        std::process::exit(EXIT_FAILED_REQUESTS);
    }
    Ok(())
}

/// Exit status of a replay in which more than `--max-failed` of a target's requests failed.
const EXIT_FAILED_REQUESTS: i32 = 4;

/// A fraction in [0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?} is not a fraction from 0 to 1")),
    }
}

fn run_synth(a: SynthArgs) -> Result<()> {
    let spec = replay::synth::SynthSpec {
        num_prompts: a.num_prompts,
        input_len: a.input_len,
        output_len: a.output_len,
        range_ratio: a.range_ratio,
        request_rate: a.request_rate,
        burstiness: a.burstiness,
        seed: a.seed,
        endpoint: a.endpoint,
        start_us: now_us(),
        stream_ratio: a.stream_ratio,
    };
    let rows = replay::synth::synth(&spec)?;
    let meta = FileMeta::new(Producer::Synth, command_line());
    let at = trace_format::store::write_trace(&a.output, &rows, &meta)
        .with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!("{} synthetic requests written to {at}", rows.len());
    Ok(())
}

fn run_inspect(a: InspectArgs) -> Result<()> {
    use std::io::Write;
    let trace = trace_format::read_traces(&a.traces).context("reading the trace")?;
    let summary = trace_format::inspect::summarize(&trace);
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        writeln!(out, "{summary}")?;
    }
    Ok(())
}

fn run_demo(a: DemoArgs) -> Result<()> {
    // The default for `sim` and `replay` is the H100 profile; the demo's is `tiny`, whose knee
    // a laptop reaches in seconds. An explicit --profile is what runs.
    let profile = a.sim.profile_or("tiny").to_string();
    if a.rates.is_empty() || a.rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        bail!("--rates: give positive request rates, e.g. 2,4,8");
    }
    if !(a.seconds.is_finite() && a.seconds > 0.0) {
        bail!("--seconds must be positive");
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
        start_us: now_us(),
        stream_ratio: 1.0,
    };
    let rows = replay::synth::synth(&spec)?;
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
    let trace = trace_format::read_traces(&[trace_path.display().to_string()])
        .context("reading the demo trace back")?;
    let mut cfg = ReplayConfig::new(vec![Target {
        name: "sim".into(),
        url: s.url(),
    }]);
    cfg.request.timeout = Duration::from_secs(120);
    cfg.request.prompt_salt = now_us() as u64;
    cfg.server_metrics = true;
    cfg.goodput = a.goodput.clone();
    cfg.label = Some(format!("demo-{profile}"));
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
        plan: crate::report_cmd::PlanArgs {
            target_qps: Some(a.target_qps),
            redundancy: 2,
            cost_per_hour: None,
        },
    };
    sweep_args.prepare(&mut cfg);
    cfg.validate()?;
    let sweep_path = a.out.join("sweep.json");
    let spec = sweep_args.sweep.clone().context("the demo's sweep")?;
    crate::report_cmd::run_sweep(
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
        },
        &|_, _| {},
    )?;
    drop(s);
    crate::report_cmd::write_reports(&sweep_path, &a.out)?;
    println!("Past the knee, requests queue in the engine: TTFT climbs first (prefill queueing), then TPOT as batches fill.");
    println!("trace, sweep JSON and reports in {}", a.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sim flags configure the in-process sim: with a --target they are an error, not
    /// silently ignored; the demo runs the profile it is given, `tiny` without one.
    #[test]
    fn sim_flags_are_known_as_given() {
        let replay = |extra: &[&str]| {
            let mut args = vec!["llmreplay", "replay", "t.parquet", "--target", "http://h:1"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                Command::Replay(a) => a.sim.given(),
                _ => unreachable!(),
            }
        };
        assert!(replay(&[]).is_empty());
        assert_eq!(replay(&["--error-rate", "0.5"]), vec!["--error-rate"]);
        assert_eq!(
            replay(&["--profile", "llama-3.1-8b-h100", "--served-model-name", "m"]),
            vec!["--profile", "--served-model-name"]
        );
        let demo = |extra: &[&str]| {
            let mut args = vec!["llmreplay", "demo"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                Command::Demo(a) => a.sim.profile_or("tiny").to_string(),
                _ => unreachable!(),
            }
        };
        assert_eq!(demo(&[]), "tiny");
        assert_eq!(
            demo(&["--profile", "llama-3.1-8b-h100"]),
            "llama-3.1-8b-h100"
        );
    }

    #[test]
    fn durations_and_rates_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_rate("inf").unwrap(), f64::INFINITY);
        assert!(parse_rate("0").is_err());
    }

    #[test]
    fn per_target_names() {
        assert_eq!(
            per_target_path(Path::new("r/out.json"), "a:b", true),
            PathBuf::from("r/out-a_b.json")
        );
        assert_eq!(
            per_target_path(Path::new("out.json"), "x", false),
            PathBuf::from("out.json")
        );
        assert_eq!(
            per_target_path(Path::new("s3://b/runs/out.json"), "vllm", true).to_str(),
            Some("s3://b/runs/out-vllm.json")
        );
        assert_eq!(
            per_target_path(Path::new("out"), "x", true).to_str(),
            Some("out-x")
        );
    }

    /// `vllm bench serve` users type `--base-url` and `--num-prompts`; clap suggested
    /// unrelated flags. Where the meaning is the same they are aliases: `--base-url` is the
    /// server's base URL without the endpoint path (our `--target`), `--num-prompts` the
    /// number of requests sent (our `--max-requests`; synth has it as its own name).
    #[test]
    fn vllm_flag_names_are_aliases_where_they_mean_the_same() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["llmreplay", "replay", "t.parquet"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args)
                .unwrap_or_else(|e| panic!("{extra:?}: {e}"))
                .command
            {
                Command::Replay(a) => a,
                _ => unreachable!(),
            }
        };
        let a = parse(&["--base-url", "http://h:8000", "--num-prompts", "50"]);
        assert_eq!(a.targets.len(), 1);
        assert_eq!(a.targets[0].url, "http://h:8000");
        assert_eq!(a.max_requests, Some(50));
        let b = parse(&["--target", "http://h:8000", "--max-requests", "50"]);
        assert_eq!(
            (b.targets[0].url.as_str(), b.max_requests),
            ("http://h:8000", Some(50))
        );
        // The help says whose names they are.
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("replay")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("--base-url") && help.contains("--num-prompts"),
            "{help}"
        );
        assert!(help.contains("vllm bench serve"), "{help}");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Regression: a list flag whose parser returned a Vec panicked at access time.
    #[test]
    fn every_subcommand_parses_its_defaults() {
        for args in [
            &["llmreplay", "replay", "t.parquet"][..],
            &[
                "llmreplay",
                "replay",
                "t.parquet",
                "--percentile-metrics",
                "ttft,e2el",
                "--metric-percentiles",
                "50,99.9",
            ],
            &["llmreplay", "synth", "-o", "x.parquet"],
            &["llmreplay", "inspect", "x"],
            &["llmreplay", "demo"],
            &["llmreplay", "sim"],
            &["llmreplay", "import", "x.csv", "-o", "t.parquet"],
            &["llmreplay", "export", "t.parquet", "-o", "x.jsonl"],
            &[
                "llmreplay",
                "merge",
                "a.parquet",
                "b.parquet",
                "-o",
                "merged",
            ],
            &[
                "llmreplay",
                "replay",
                "t.parquet",
                "--shard",
                "1/4",
                "--start-at",
                "+2s",
            ],
            &[
                "llmreplay",
                "replay",
                "t.parquet",
                "--sweep",
                "max-concurrency=1,8,16",
                "--num-runs",
                "3",
                "--slo-percentile",
                "99",
                "--cost-per-hour",
                "2.5",
            ],
            &["llmreplay", "compare", "a.json", "b.json"],
            &["llmreplay", "report", "a.json", "-o", "r.html"],
            &[
                "llmreplay",
                "report",
                "a.json",
                "-o",
                "r.md",
                "--format",
                "md",
                "--alerts",
                "rules.yaml",
            ],
        ] {
            Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        let Cli {
            command: Command::Replay(r),
        } = Cli::try_parse_from([
            "llmreplay",
            "replay",
            "t",
            "--metric-percentiles",
            "50,99.9",
        ])
        .unwrap()
        else {
            panic!("not replay")
        };
        assert_eq!(r.metric_percentiles, vec![50.0, 99.9]);
        for bad in [
            &["llmreplay", "replay", "t", "--sweep", "max-concurrency=1.5"][..],
            &["llmreplay", "replay", "t", "--sweep", "qps=1,2"],
            &["llmreplay", "replay", "t", "--num-runs", "0"],
            &["llmreplay", "replay", "t", "--slo-percentile", "0"],
            &["llmreplay", "replay", "t", "--redundancy", "0"],
            &["llmreplay", "compare", "only-one.json"],
        ] {
            assert!(
                Cli::try_parse_from(bad).is_err(),
                "{bad:?} must be rejected"
            );
        }
        assert!(
            Cli::try_parse_from(["llmreplay", "replay", "t", "--metric-percentiles", "101"])
                .is_err()
        );
    }
}
