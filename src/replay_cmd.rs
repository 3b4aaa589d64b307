//! `llmreplay replay`: its flags, the configuration they make, and the wiring to the replay
//! crate: a plain run (`replay::replay`, then `reporting::outputs`), or a sweep or repeats
//! (`report_cmd::run_sweep`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use replay::config::{
    Arrivals, EndpointKind, OutputLen, ReplayConfig, RequestOptions, Selection, SessionMode, Shard,
    Target,
};

use crate::exit::{refuse, refused, ExitStatus, Failure};
use crate::flags::{
    command_line, parse_count, parse_duration, parse_fraction, parse_kv, parse_positive,
    parse_positive_duration, parse_rate, parse_share,
};
use crate::signals::{self, Signal};
use crate::sim_cmd::{EmbeddedSim, SimOpts, DEFAULT_PROFILE};

/// `--start-at`: RFC 3339 (`2026-01-02T03:04:05Z`) or `+DURATION` from now, as epoch µs.
fn parse_start_at(s: &str) -> Result<i64, String> {
    match s.trim().strip_prefix('+') {
        Some(rel) => Ok(wire::clock::epoch_us() + parse_duration(rel)?.as_micros() as i64),
        None => crate::flags::parse_time(s),
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

#[derive(Args, Debug)]
pub(crate) struct ReplayArgs {
    /// Trace files, directories, globs or object-store prefixes: several captures are one trace.
    #[arg(required = true)]
    traces: Vec<String>,
    #[command(flatten)]
    window: crate::flags::WindowFlags,
    /// Target base URL, `URL` or `NAME=URL`; repeat to replay the same schedule against each in turn.
    /// Without one, an in-process sim is the target. `--base-url` is `vllm bench serve`'s name
    /// for it: the server's base URL without the endpoint path (a trailing /v1 is dropped; a
    /// URL naming an endpoint, such as .../v1/chat/completions, is refused with its base URL;
    /// any other path is a prefix, e.g. a gateway's).
    #[arg(long = "target", visible_alias = "base-url")]
    targets: Vec<Target>,
    /// Replay speed: 2.0 = twice as fast, 0.5 = half.
    #[arg(long, default_value_t = 1.0, value_parser = parse_positive)]
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
    loops: Option<replay::config::Loops>,
    /// Metrics per time slice of this width (e.g. 30s) in the JSON and as a timeline in the
    /// report, so drift over a long run shows as a trend.
    #[arg(long, value_parser = parse_duration)]
    slice: Option<Duration>,
    /// Keep this fraction of sessions (whole sessions when session_id is present).
    #[arg(long, value_parser = parse_share)]
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
    #[arg(long, default_value_t = 1.0, value_parser = parse_positive)]
    burstiness: f64,
    /// Cap on requests in flight; waiting for a slot is client queue time, not latency.
    #[arg(long, value_parser = parse_count)]
    max_concurrency: Option<usize>,
    /// Session pacing: open (every request at its recorded time) or closed (a request after the
    /// candidate answered its parent — `parent_request_id`, else its session's previous turn —
    /// plus the recorded think time; with neither, at its recorded time).
    #[arg(long, default_value = "open")]
    session_mode: SessionMode,
    /// API for generation rows without a recorded body: completions, chat, responses or
    /// messages (default: the row's own; a path of no known API is sent as completions).
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
    #[arg(long, value_parser = parse_positive_duration, default_value = "600s")]
    timeout: Duration,
    /// PEM bundle of a private CA to trust for https targets (default: the web PKI).
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Longest TCP (and TLS) connect to a target, apart from --timeout.
    #[arg(long, value_parser = parse_positive_duration, default_value = "10s")]
    connect_timeout: Duration,
    /// Longest a keep-alive connection waits idle for its next request; keep it below the
    /// target's keep-alive timeout (uvicorn, under vLLM and SGLang: 5 s).
    #[arg(long, value_parser = parse_duration, default_value = "4s")]
    pool_idle_timeout: Duration,
    /// Exit with status 4 (after writing every result) when the server failed more than this
    /// fraction of the requests it was asked to serve (recorded cancellations and captured
    /// 4xx replayed as captured are the client's, not counted); 1 never does.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.1, value_parser = parse_fraction)]
    max_failed: f64,
    /// Exit with status 6 (after writing every result) when a target's verdict is FAIL: the
    /// --slo-percentile of a --goodput SLO over its limit, or the server's failures over the
    /// 1% error budget (the `VERDICT` line of each target says which).
    #[arg(long)]
    fail_on_slo: bool,
    /// Exit with status 8 (after writing every result) when a run's validity stamp is
    /// INVALID: the client's own timing error over 10% of an SLO judged or of the measured
    /// TTFT p50 (a sweep: any level). The stamp is printed and written either way.
    #[arg(long)]
    fail_on_invalid: bool,
    /// Do not open the connection pool before the clock starts.
    #[arg(long)]
    no_preconnect: bool,
    /// Requests sent before the clock starts, not counted.
    #[arg(long, default_value_t = 0)]
    num_warmups: usize,
    #[command(flatten)]
    metrics: crate::flags::MetricFlags,
    /// Write the JSON result here (vLLM's key names); with several targets, one file each (NAME inserted).
    #[arg(long)]
    save_result: Option<PathBuf>,
    /// Add vLLM's per-request arrays to the JSON result (keeps every row in memory until the
    /// run ends, as --slice does).
    #[arg(long)]
    save_detailed: bool,
    /// Write one Parquet row per request (trace schema + schedule, lag, target, run id), as
    /// requests finish: into a journal beside it (run.parquet → run.journal) that becomes the
    /// file when the replay ends. After a kill -9, `llmreplay merge run.journal -o OUT`
    /// recovers every finished row once.
    #[arg(long)]
    results: Option<PathBuf>,
    /// On SIGINT/SIGTERM: stop sending, let requests in flight finish for up to this long
    /// (the rest are recorded cancelled), then write the results of what ran, marked partial;
    /// exit 130 (SIGINT) or 143 (SIGTERM). A second signal cancels the requests in flight at
    /// once.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    drain_timeout: Duration,
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
    /// The in-process sim used when no --target is given: its flags under their own
    /// heading, as they do nothing with a --target (given with one, they are refused).
    #[command(flatten, next_help_heading = "In-process sim (only without --target)")]
    pub(crate) sim: SimOpts,
    /// Trace context and OTLP export.
    #[command(flatten)]
    otel: crate::otel::OtelArgs,
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
                .unwrap_or_else(|| wire::clock::epoch_us() as u64 ^ u64::from(std::process::id())),
            headers: a.headers.clone(),
            api_key: a.api_key.clone(),
            timeout: a.timeout,
            ca_cert: a.ca_cert.clone(),
            connect_timeout: a.connect_timeout,
            pool_idle_timeout: a.pool_idle_timeout,
            tokenizer: None,
            traceparent: !a.otel.no_traceparent,
        },
        preconnect: !a.no_preconnect,
        num_warmups: a.num_warmups,
        seed: a.seed,
        goodput: a.metrics.goodput.clone(),
        slo_percentile: a.capacity.slo_percentile,
        percentile_metrics: a.metrics.percentile_metrics.clone(),
        metric_percentiles: a.metrics.metric_percentiles.clone(),
        cooldown: a.cooldown,
        progress: !a.quiet,
        client_threads: a.client_threads,
        label: a.label.clone(),
        metadata: a.metadata.clone(),
        server_metrics: a.server_metrics,
        soak: replay::config::Soak {
            loops: a.loops,
            slice: a.slice,
        },
        start_at_us: a.start_at,
        // Rows stay in memory only where an output needs them all at the end: the
        // per-request arrays of --save-detailed and the time slices of --slice.
        keep_rows: a.save_detailed || a.slice.is_some(),
        drain_timeout: a.drain_timeout,
        lookahead: Default::default(),
    }
}

/// `--metadata` keys go into the result next to its own keys: one of those would overwrite
/// a measured value.
fn metadata_keys_are_free(metadata: &[(String, String)]) -> Result<()> {
    if let Some((k, _)) = metadata.iter().find(|(k, _)| results::is_result_key(k)) {
        refuse!("--metadata {k}=...: {k:?} is a key of the result itself; choose another name");
    }
    Ok(())
}

/// `--start-at` more than 1 s before `now_us` (the wall clock, µs since the epoch) is an error:
/// the schedule's first requests would all be late.
fn start_at_not_past(start_at_us: Option<i64>, now_us: i64) -> Result<()> {
    if let Some(at) = start_at_us {
        let late_us = now_us - at;
        if late_us > 1_000_000 {
            refuse!("--start-at is {:.1} s in the past", late_us as f64 / 1e6);
        }
    }
    Ok(())
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

pub(crate) fn run_replay(a: ReplayArgs) -> Result<ExitStatus> {
    // The trace is streamed: its files' footers now, its rows as the run reaches them (a
    // sweep or repeats read it whole below).
    let stream =
        crate::traces::open_stream_in(&a.traces, &a.window).context("reading the trace")?;
    let block_size = stream
        .files()
        .iter()
        .find_map(|f| f.meta.block_size)
        .map(|b| b as usize);
    let (mut cfg, sim_guard) = configure(&a, &stream)?;
    metadata_keys_are_free(&cfg.metadata)?;
    let sweep = a.capacity.spec(&cfg);
    if sweep.is_some() || !cfg.goodput.is_empty() {
        // The SLO percentile is what pass/fail is judged at: make sure it is reported.
        a.capacity.prepare(&mut cfg);
    }
    let cfg = cfg.validate().map_err(refused)?;
    start_at_not_past(cfg.start_at_us, wire::clock::epoch_us())?;
    let command = command_line();
    if let Some(spec) = sweep {
        let r = sweep_levels(&a, &cfg, &spec, block_size, &command);
        drop(sim_guard);
        return r.map(|stopped| stopped.unwrap_or(ExitStatus::Success));
    }
    // The trace's content hash is known once the run has read it (the stream hashes its rows
    // as they go by; a run that stopped early reads the rest of the ids then): nothing reads
    // the whole trace before the first request.
    let mut identity = results::build::TraceIdentity {
        files: stream
            .files()
            .iter()
            .map(|f| f.path.display().to_string())
            .collect(),
        rows: stream.rows(),
        content_hash: String::new(),
    };
    // Rows go to --results as they finish; what a kill leaves is in its journal (without the
    // trace's hash, not known yet).
    let mut results = a
        .results
        .as_deref()
        .map(|p| {
            let mut meta = results::outputs::results_meta(&cfg, &identity, &command);
            // The results carry the trace's prefix hashes, so its privacy manifest (key id).
            meta.privacy = trace_format::file_meta::carried(stream.files().iter().map(|f| &f.meta));
            results::parquet_sink::ResultsSink::create(p, meta)
        })
        .transpose()?;
    let mut otlp = a
        .otel
        .config(telemetry::Role::Replay)?
        .map(crate::otel::OtlpRows::start)
        .transpose()?;
    let stop = replay::Stop::new();
    stop_on_signals(&stop, a.drain_timeout)?;
    let ran = {
        // Rows go to every output: --results, the OTLP exporter.
        let mut sinks = replay::sink::Fanout::new();
        if let Some(s) = results.as_mut() {
            sinks.push(s);
        }
        if let Some(o) = otlp.as_mut() {
            sinks.push(o);
        }
        replay::replay(
            &cfg,
            &stream,
            block_size,
            &progress_bar(cfg.progress),
            &mut sinks,
            &stop,
        )
    };
    drop(sim_guard);
    if let Some(o) = otlp {
        eprintln!("{}", o.close());
    }
    let ran = ran.map_err(anyhow::Error::from).and_then(|runs| {
        identity.content_hash = stream.content_hash().context("reading the trace")?;
        crate::traces::say_stream_captures(&stream)?;
        if let Some(s) = results.as_mut() {
            s.set_trace_hash(&identity.content_hash);
        }
        Ok(runs)
    });
    let runs = match ran {
        Ok(runs) => runs,
        Err(e) => {
            if let Some(s) = &results {
                eprintln!(
                    "the rows that finished are in {} (recover: llmreplay merge {} -o OUT)",
                    s.journal().display(),
                    s.journal().display()
                );
            }
            return Err(e);
        }
    };
    finish(&a, &cfg, &identity, &runs, results, &stop, &command)
}

/// The run's configuration from the flags: the shard, the tokenizer, the note on how prompts
/// are made, and the in-process sim (started here, returned to be kept alive) when no
/// `--target` is given.
fn configure(
    a: &ReplayArgs,
    stream: &trace_format::TraceStream,
) -> Result<(ReplayConfig, Option<EmbeddedSim>)> {
    let mut sim_guard = None;
    let mut cfg = replay_config(a, a.targets.clone());
    if a.shard_from_env {
        cfg.selection.shard = Some(shard_from_env()?);
    }
    if let Some(spec) = &a.tokenizer {
        let pt = replay::prompt::PromptTokenizer::load(spec)
            .with_context(|| format!("--tokenizer {spec}"))?;
        cfg.request.tokenizer = Some(std::sync::Arc::new(pt));
    } else if let Some(name) = capture_tokenizer(stream).filter(|_| !a.targets.is_empty()) {
        // The capture counted (and hashed) with this tokenizer: prompts built with it have
        // the recorded lengths, so no note says they are approximate. (The in-process sim
        // counts words: the word filler is exact for it.)
        if let Ok(pt) = replay::prompt::PromptTokenizer::load(&name) {
            eprintln!(
                "note: synthesized prompts use the capture's tokenizer {name} (the trace's \
                 metadata; --tokenizer to choose another)"
            );
            cfg.request.tokenizer = Some(std::sync::Arc::new(pt));
        }
    }
    // Against the in-process sim word filler is exact: the note is for real targets.
    if !a.targets.is_empty() {
        let tok = cfg.request.tokenizer.as_ref().map(|t| t.tokenizer().name());
        if let Some(n) = prompt_note(stream, tok)? {
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
            refuse!(
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
    Ok((cfg, sim_guard))
}

/// The tokenizer every file of the trace was captured with (`capture --tokenizer`, in the
/// files' metadata), None when they do not say or disagree.
fn capture_tokenizer(stream: &trace_format::TraceStream) -> Option<String> {
    let mut names = stream
        .files()
        .iter()
        .map(|f| f.meta.extra.get("tokenizer").cloned());
    let first = names.next()??;
    names.all(|n| n.as_deref() == Some(&first)).then_some(first)
}

/// `--sweep`/`--repeats`: every level against the same rows, read once into memory.
fn sweep_levels(
    a: &ReplayArgs,
    cfg: &replay::ValidatedConfig,
    spec: &reporting::sweep::SweepSpec,
    block_size: Option<usize>,
    command: &str,
) -> Result<Option<ExitStatus>> {
    if cfg.start_at_us.is_some() {
        refuse!("--start-at starts one run; it cannot be combined with a sweep or repeats");
    }
    if a.fail_on_slo {
        refuse!("--fail-on-slo judges one run per target; a sweep's answer is its capacity (use llmreplay compare --fail-on-regression, or one replay per level)");
    }
    if a.otel.otlp_endpoint.is_some() {
        refuse!("--otlp-endpoint exports one run's requests; it cannot be combined with a sweep or repeats (export one replay per level)");
    }
    // Every level replays the same rows: they are read once, into memory.
    let trace = crate::traces::read_traces_in(&a.traces, &a.window).context("reading the trace")?;
    crate::traces::say_trace_captures(&trace, a.window.window()?);
    let stop = replay::Stop::new();
    stop_on_signals(&stop, a.drain_timeout)?;
    crate::report_cmd::run_sweep(
        cfg,
        spec,
        &a.capacity,
        &trace,
        block_size,
        crate::report_cmd::SweepOutputs {
            command,
            save_result: a.save_result.as_deref(),
            detailed: a.save_detailed,
            results: a.results.as_deref(),
            quiet: a.quiet,
            allow_invalid: !a.fail_on_invalid,
        },
        &progress_bar(cfg.progress),
        &stop,
    )
}

/// After the run: the console report and `--save-result`, the `--results` file closed, and
/// the exit status (stopped, too many failed, an SLO failed with `--fail-on-slo`).
fn finish(
    a: &ReplayArgs,
    cfg: &replay::ValidatedConfig,
    identity: &results::build::TraceIdentity,
    runs: &[(replay::RunOutput, replay::Metrics)],
    results: Option<results::parquet_sink::ResultsSink>,
    stop: &replay::Stop,
    command: &str,
) -> Result<ExitStatus> {
    reporting::outputs::write(
        cfg,
        identity,
        runs,
        &reporting::outputs::Outputs {
            command,
            save_result: a.save_result.as_deref(),
            detailed: a.save_detailed,
            slo_percentile: a.capacity.slo_percentile,
            quiet: a.quiet,
        },
        &mut reporting::outputs::Stdio,
    )?;
    if let Some(s) = results {
        let w = s.close()?;
        eprintln!("{} result rows written to {}", w.rows, w.at);
    }
    // A stopped run wrote what it measured, marked partial: the exit status says it stopped.
    if let Some(status) = interrupted_exit(runs, stop) {
        return Ok(status);
    }
    // A run most of whose requests failed measured a broken target, not a slow one: say so
    // in the exit status, after everything was written.
    if let Some(why) = results::outputs::too_many_failed(runs, a.max_failed) {
        return Err(Failure::error(ExitStatus::FailedRequests, why));
    }
    if a.fail_on_slo {
        if let Some(why) = results::outputs::failed_verdicts(cfg, runs) {
            return Err(Failure::error(ExitStatus::SloFail, why));
        }
    }
    crate::exit::invalid(
        runs.iter().map(|(run, m)| (&**cfg, run, m)),
        !a.fail_on_invalid,
    )
}

/// Rows [`prompt_note`] looks at when the footers do not say: enough to say how prompts are
/// made, without reading a long trace before the run.
const NOTE_ROWS: usize = 10_000;

/// How the run's prompts are made (recorded bodies or synthesized), over production's rows
/// (shadow rows are never replayed): from the footers' count of rows with a body when they
/// say there is no shadow row, else judged from the first [`NOTE_ROWS`] rows.
fn prompt_note(stream: &trace_format::TraceStream, tok: Option<&str>) -> Result<Option<String>> {
    if let (Some(bodies), Some(0)) = (stream.rows_with_body(), stream.shadow_rows()) {
        return Ok(replay::request::prompt_source_note(
            stream.rows(),
            bodies,
            tok,
        ));
    }
    let (mut read, mut seen, mut bodies) = (0, 0, 0);
    for r in stream.records().take(NOTE_ROWS) {
        let r = r.context("reading the trace")?;
        read += 1;
        if r.pair_request_id.is_none() {
            seen += 1;
            bodies += usize::from(r.body.is_some());
        }
    }
    Ok(
        replay::request::prompt_source_note(seen, bodies, tok).map(|n| {
            if read < stream.rows() {
                format!(
                    "{n} (judged from the first {read} of {} rows)",
                    stream.rows()
                )
            } else {
                n
            }
        }),
    )
}

/// The exit status that says the replay was stopped by a signal: the first signal's (a run
/// marked interrupted, or a stop that came after the runs had ended); None when nothing
/// stopped it.
fn interrupted_exit(
    runs: &[(replay::RunOutput, replay::Metrics)],
    stop: &replay::Stop,
) -> Option<ExitStatus> {
    let state = stop.state();
    let reason = runs
        .iter()
        .find_map(|(r, _)| r.interrupted.as_ref().map(|i| i.reason.clone()))
        .or_else(|| state.reason().map(String::from))?;
    Signal::named(&reason).map(Signal::status)
}

/// SIGINT and SIGTERM stop the run through `stop` (from here on, for the rest of the
/// process): the first stops sending and lets requests in flight finish for up to `drain`,
/// the second cancels them at once (the run still returns and everything that ran is
/// written), a third exits at once with the first signal's status (rows that finished are
/// in the --results journal).
pub(crate) fn stop_on_signals(stop: &replay::Stop, drain: Duration) -> Result<()> {
    let (first, second) = (stop.clone(), stop.clone());
    signals::watch(
        "replay",
        vec![
            Box::new(move |sig: Signal| {
                eprintln!(
                    "llmreplay replay: {}: stopping; requests in flight may finish for up to \
                     {drain:?}, then the results of what ran are written (signal again to \
                     cancel them now)",
                    sig.name()
                );
                first.request(sig.name());
            }),
            Box::new(move |sig: Signal| {
                eprintln!(
                    "llmreplay replay: {}: cancelling the requests in flight",
                    sig.name()
                );
                second.request(sig.name());
            }),
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn metadata_cannot_overwrite_result_keys() {
        let kv = |k: &str| vec![(k.to_string(), "x".to_string())];
        assert!(metadata_keys_are_free(&kv("gpu")).is_ok());
        for k in ["completed", "p99_ttft_ms", "mean_itl_ms", "llmreplay"] {
            assert!(
                metadata_keys_are_free(&kv(k))
                    .unwrap_err()
                    .to_string()
                    .contains("key of the result"),
                "{k}"
            );
        }
    }

    #[test]
    fn a_start_time_in_the_past_is_refused() {
        let now = 1_767_323_045_500_000;
        assert!(start_at_not_past(Some(now - 5_000_000), now)
            .unwrap_err()
            .to_string()
            .contains("in the past"));
        assert!(start_at_not_past(Some(now + 5_000_000), now).is_ok());
        assert!(start_at_not_past(None, now).is_ok());
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

    /// The note counts the bodies of the whole trace from the footers: one body after the
    /// first NOTE_ROWS rows is seen.
    #[test]
    fn the_prompt_note_counts_every_rows_body_from_the_footer() {
        let dir = std::env::temp_dir().join(format!("llmreplay-note-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.parquet");
        let n = NOTE_ROWS + 1;
        let rows: Vec<_> = (0..n)
            .map(|i| {
                let mut r = trace_format::TraceRecord::new(
                    format!("r{i}"),
                    1_700_000_000_000_000 + i as i64,
                    "/v1/completions",
                );
                r.prompt_tokens = Some(3);
                r.body = (i == n - 1).then(|| r#"{"prompt":"hi"}"#.to_string());
                r
            })
            .collect();
        let meta = trace_format::FileMeta::new(trace_format::Producer::Synth, "test");
        trace_format::write_trace_file(&p, &rows, &meta).unwrap();
        let stream = trace_format::TraceStream::open(&[p.to_str().unwrap()]).unwrap();
        let note = prompt_note(&stream, None).unwrap().unwrap();
        assert!(
            note.contains(&format!("recorded bodies of 1 of {n} rows")),
            "{note}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn metric_percentiles_parse_as_a_list() {
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
        assert_eq!(r.metrics.metric_percentiles, vec![50.0, 99.9]);
    }
}
