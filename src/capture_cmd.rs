//! `llmreplay capture`: flags of the capture proxy (part of the CLI contract) and the wiring
//! from validated flags to `proxy::start`, signals and the final summary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};

use crate::exit::{ExitStatus, Failure};
use crate::flags::{command_line, parse_duration};
use crate::signals;
use trace_format::keyed::HashKey;

/// What leaves with a trace (docs/privacy.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrivacyArg {
    /// Timings, counts, outcomes, sessions and links: no content-derived value at all.
    Perf,
    /// No text; keyed hashes of the prompt's blocks and of tool names.
    Hashes,
    /// The request JSON (for exact replay) and tool names as sent, and the keyed hashes.
    Full,
}

/// `--record-bodies`, the older name of `--privacy` (`none` is `perf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RecordBodiesArg {
    /// `--privacy perf`.
    None,
    /// `--privacy hashes`.
    Hashes,
    /// `--privacy full`.
    Full,
}

/// Usage injection flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageModeArg {
    /// `stream_options.include_usage` (OpenAI's API).
    Standard,
    /// Also vLLM's `continuous_usage_stats`, for per-chunk token counts.
    Vllm,
}

/// Flags of `llmreplay capture`.
#[derive(Args, Debug)]
pub struct CaptureArgs {
    /// Address the proxy listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The one upstream, `http://HOST:PORT` or `https://HOST[:PORT][/prefix]`.
    #[arg(long)]
    upstream: String,
    /// Where the trace files go: a directory (created 0700; files are 0600), or an object
    /// store prefix such as `s3://bucket/captures` (credentials and endpoint from the
    /// environment, e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT_URL, AWS_ALLOW_HTTP=true). Objects land in Hive partitions,
    /// `PREFIX/date=YYYY-MM-DD/hour=HH/*.parquet` (UTC), after each file is finished.
    #[arg(long)]
    out: String,
    /// With an object-store --out: the local directory where files are journaled and
    /// finished before upload, and kept while the store is unreachable (default: a
    /// directory per --out under the system temp directory). Files left there by a previous
    /// run are uploaded at the next start.
    #[arg(long)]
    spool_dir: Option<PathBuf>,
    /// Admin listener for /metrics, /healthz (liveness: 200 while capture serves) and
    /// /readyz (readiness: also 503 while the upstream is unreachable).
    #[arg(long, default_value = "127.0.0.1:9464")]
    admin: SocketAddr,
    /// No admin listener.
    #[arg(long, conflicts_with = "admin")]
    no_admin: bool,
    /// PEM CA bundle to trust for an https upstream (default: the web PKI roots).
    #[arg(long)]
    upstream_ca: Option<PathBuf>,
    /// Speak HTTP/2 with prior knowledge (h2c) to a plain-http upstream.
    #[arg(long)]
    upstream_h2: bool,
    /// Pass the client's X-Forwarded-For / X-Forwarded-Proto on unchanged and add none. By
    /// default the upstream gets `X-Forwarded-For: <client address>` and
    /// `X-Forwarded-Proto: http|https` (the listener's), in place of any the client sent.
    #[arg(long)]
    no_forwarded_headers: bool,
    /// Trust the X-Forwarded-For / X-Forwarded-Proto a load balancer in front sends: the
    /// client address is appended to its X-Forwarded-For, and its X-Forwarded-Proto kept.
    #[arg(long, conflicts_with = "no_forwarded_headers")]
    trust_forwarded_headers: bool,
    /// PEM certificate chain: serve TLS on --listen (needs --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// What leaves with the trace: perf (no content-derived value), hashes (keyed hashes
    /// only; the default), full (request bodies too). Recorded in each file's privacy
    /// manifest, which `inspect` prints first (docs/privacy.md).
    #[arg(long, value_enum)]
    privacy: Option<PrivacyArg>,
    /// The older name of --privacy: none = perf, hashes, full.
    #[arg(long, value_enum, conflicts_with = "privacy")]
    record_bodies: Option<RecordBodiesArg>,
    /// The file holding the key every content hash is made under (64 hex digits, e.g.
    /// `openssl rand -hex 32`); give every capture whose hashes must compare (a fleet, a
    /// series of days) the same file. Without it, a key is created in `<out>.hash-key`
    /// beside the output (0600; reused by later captures to the same output). The key is
    /// never written into traces, journals, metrics or logs; files record its id.
    #[arg(long, env = "LLMREPLAY_HASH_KEY_FILE", value_name = "PATH")]
    hash_key_file: Option<PathBuf>,
    /// Tokens per prefix-hash block.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// How prompt tokens are counted for prefix-hash blocks, and prompt and output tokens
    /// when the upstream reports no usage (source `tokenizer`; the generated text is counted
    /// on the writer thread): cl100k_base, o200k_base, words (one per whitespace word, as the
    /// sim counts), or the path of a Hugging Face tokenizer.json. Recorded in the file
    /// metadata with --block-size.
    #[arg(long, default_value = "words")]
    tokenizer: String,
    /// Never modify requests (streams then carry usage only if the client asked: without it,
    /// output tokens are counted from the text with --tokenizer).
    #[arg(long)]
    no_inject_usage: bool,
    /// Which usage to ask for when injecting.
    #[arg(long, value_enum, default_value_t = UsageModeArg::Standard, conflicts_with = "no_inject_usage")]
    usage_mode: UsageModeArg,
    /// Fraction of generation requests recorded, in (0, 1].
    #[arg(long, default_value_t = 1.0, value_parser = crate::flags::parse_share)]
    sample_rate: f64,
    /// On SIGTERM/SIGINT, how long in-flight requests may take to finish.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    drain_timeout: Duration,
    /// Longest wait for the upstream's response headers (then 504).
    #[arg(long, value_parser = parse_duration, default_value = "600s")]
    upstream_timeout: Duration,
    /// Longest TCP (and TLS) connect to the upstream (then 502).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    connect_timeout: Duration,
    /// How often the upstream's reachability is checked while it answers (a TCP connection
    /// to its host and port; every 1 s while it does not, and at once after a request could
    /// not connect); 0 turns the checks off. An unreachable upstream does not stop capture:
    /// it is logged, /readyz answers 503 and llmreplay_capture_upstream_up is 0 meanwhile.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    upstream_check_interval: Duration,
    /// Longest an upstream keep-alive connection waits idle for its next request; keep it
    /// below the upstream's keep-alive timeout (uvicorn, under vLLM and SGLang: 5 s).
    #[arg(long, value_parser = parse_duration, default_value = "4s")]
    pool_idle_timeout: Duration,
    /// Longest silence within a response body (then the stream is cut).
    #[arg(long, value_parser = parse_duration, default_value = "600s")]
    idle_timeout: Duration,
    /// A new client connection (proxy or admin port) that sends no byte of a request for
    /// this long is closed; nothing is recorded.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    client_first_byte_timeout: Duration,
    /// A request head must be complete this long after its first byte, else the connection
    /// is closed (nothing was forwarded; nothing is recorded).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    client_header_timeout: Duration,
    /// A keep-alive client connection idle this long between requests is closed (nginx's
    /// default; longer than common client pools keep idle connections).
    #[arg(long, value_parser = parse_duration, default_value = "75s")]
    client_keepalive_timeout: Duration,
    /// Longest gap between two reads of a request body, and the allowance for the whole
    /// body on top of --client-body-min-rate; then 408 (a generation request's row:
    /// status 408, outcome timeout). Responses are never cut by the client timeouts.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    client_body_timeout: Duration,
    /// Bytes/s a request body must average: each this many bytes received extend its
    /// deadline (--client-body-timeout after the head) by 1 s; 0: only gaps count.
    #[arg(long, default_value_t = 1024)]
    client_body_min_rate: u64,
    /// Most KiB of one SSE event held to observe it (and strip injected usage); a larger
    /// event is forwarded as it arrives, unobserved, and counted in
    /// llmreplay_capture_sse_oversized_events_total.
    #[arg(long, default_value_t = 1024)]
    max_event_kb: usize,
    /// Records queued for the writer before new ones are dropped (and counted).
    #[arg(long, default_value_t = 16384)]
    queue_capacity: usize,
    /// Largest generation request body, MiB (larger: 413).
    #[arg(long, default_value_t = 64)]
    max_request_body_mb: usize,
    /// Rotate trace files at this size, MiB.
    #[arg(long, default_value_t = 256)]
    max_file_mb: u64,
    /// Rotate trace files at this age.
    #[arg(long, value_parser = parse_duration, default_value = "1h")]
    max_file_age: Duration,
    /// Loss window on a crash: buffered records are handed to the OS this often.
    #[arg(long, value_parser = parse_duration, default_value = "200ms")]
    flush_interval: Duration,
    /// Round every arrival time down to a multiple of this (e.g. 100ms), for traces that
    /// leave: recorded in the manifest as the trace's time resolution. Whole milliseconds.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    time_bucket: Option<Duration>,
    /// Trace file name prefix.
    #[arg(long, default_value = "capture")]
    file_prefix: String,
    /// The capture_id written on every row (default: the pod's name, POD_NAME or, inside
    /// Kubernetes, HOSTNAME; else host:port of the listener).
    #[arg(long, value_name = "ID")]
    capture_id: Option<String>,
    /// Request header whose value is recorded as session_id (never a credential header).
    #[arg(long)]
    session_header: Option<String>,
    /// Threads serving connections (default: one per core; the trace writer and prompt
    /// tokenizing have their own). They accept from one shared listening socket (no
    /// SO_REUSEPORT: a new connection goes to whichever thread is free first, and no other
    /// process can bind the port), and each serves its connections to their end with its own
    /// upstream pool, so no work moves between threads.
    #[arg(long, env = "LLMREPLAY_CAPTURE_THREADS")]
    threads: Option<usize>,
    /// Diagnostic: write each generation request's phase stamps (accept, head read, upstream
    /// connection, request written, response head, first byte out) to FILE as JSON lines at
    /// shutdown; `bench/phases.py FILE` summarises them.
    #[arg(long, hide = true, value_name = "FILE")]
    phase_log: Option<PathBuf>,
    /// Trace context and OTLP export.
    #[command(flatten)]
    otel: crate::otel::OtelArgs,
    /// Shadow traffic.
    #[command(flatten)]
    shadow: ShadowArgs,
}

/// `--shadow` and its settings (docs/fidelity.md: "Shadow traffic").
#[derive(Args, Debug)]
pub struct ShadowArgs {
    /// Mirror recorded generation requests to candidate NAME at URL (repeatable): each is
    /// sent the production request's body, its answer measured, recorded as a row with
    /// target=NAME and pair_request_id = the production row's request_id, and discarded. The
    /// client only ever gets production's answer.
    #[arg(long, value_name = "NAME=URL")]
    shadow: Vec<String>,
    /// A header candidate NAME gets (repeatable), e.g. its own credentials; the client's
    /// credential headers (Authorization, api-key, ...) are never mirrored.
    #[arg(long, value_name = "NAME:HEADER=VALUE", requires = "shadow")]
    shadow_header: Vec<String>,
    /// The model name candidate NAME is asked for in place of the client's.
    #[arg(long, value_name = "NAME:MODEL", requires = "shadow")]
    shadow_model: Vec<String>,
    /// Fraction of recorded generation requests mirrored, in (0, 1].
    #[arg(long, default_value_t = 1.0, requires = "shadow", value_parser = crate::flags::parse_share)]
    shadow_sample: f64,
    /// What the sample draws: each request, or whole sessions (the --session-header value,
    /// else a chat conversation's messages up to its first user message).
    #[arg(long, value_enum, default_value_t = ShadowSampleByArg::Request, requires = "shadow")]
    shadow_sample_by: ShadowSampleByArg,
    /// Mirrored requests in flight per candidate; more are dropped and counted
    /// (llmreplay_shadow_dropped_total{reason="max_in_flight"}).
    #[arg(long, default_value_t = 64, requires = "shadow")]
    shadow_max_in_flight: usize,
    /// Longest a mirrored request may take, from when it is sent to the end of its answer:
    /// then it is cut, its row a timeout of the candidate, its in-flight place freed
    /// (llmreplay_shadow_dropped_total{reason="timeout"}). Raise it above your longest
    /// answers: a candidate still streaming at the deadline is cut all the same.
    #[arg(long, value_parser = parse_duration, default_value = "60s", requires = "shadow")]
    shadow_timeout: Duration,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ShadowSampleByArg {
    Request,
    Session,
}

impl ShadowArgs {
    /// The proxy's shadow settings (None without --shadow).
    fn config(self) -> Result<Option<proxy::ShadowConfig>> {
        if self.shadow.is_empty() {
            return Ok(None);
        }
        let mut targets = Vec::with_capacity(self.shadow.len());
        for s in &self.shadow {
            let (name, url) = s
                .split_once('=')
                .ok_or_else(|| anyhow!("--shadow {s:?}: expected NAME=URL"))?;
            targets.push(proxy::ShadowTarget {
                name: name.to_string(),
                url: url.to_string(),
                headers: Vec::new(),
                model: None,
            });
        }
        let named = |flag: &str, v: &str| -> Result<(usize, String)> {
            let (name, rest) = v
                .split_once(':')
                .ok_or_else(|| anyhow!("{flag} {v:?}: expected NAME:..."))?;
            let i = targets
                .iter()
                .position(|t| t.name == name)
                .ok_or_else(|| anyhow!("{flag} {v:?}: no --shadow named {name:?}"))?;
            Ok((i, rest.to_string()))
        };
        let mut headers = Vec::new();
        for h in &self.shadow_header {
            let (i, rest) = named("--shadow-header", h)?;
            let (k, v) = rest
                .split_once('=')
                .ok_or_else(|| anyhow!("--shadow-header {h:?}: expected NAME:HEADER=VALUE"))?;
            headers.push((i, k.trim().to_string(), v.trim().to_string()));
        }
        let mut models = Vec::new();
        for m in &self.shadow_model {
            models.push(named("--shadow-model", m)?);
        }
        for (i, k, v) in headers {
            targets[i].headers.push((k, v));
        }
        for (i, m) in models {
            if targets[i].model.replace(m).is_some() {
                crate::exit::refuse!("--shadow-model given twice for {:?}", targets[i].name);
            }
        }
        let mut c = proxy::ShadowConfig::new(targets);
        c.sample = self.shadow_sample;
        c.sample_by = match self.shadow_sample_by {
            ShadowSampleByArg::Request => proxy::ShadowSampleBy::Request,
            ShadowSampleByArg::Session => proxy::ShadowSampleBy::Session,
        };
        c.max_in_flight = self.shadow_max_in_flight;
        c.timeout = self.shadow_timeout;
        Ok(Some(c))
    }
}

impl CaptureArgs {
    /// Validates the flags into the proxy's configuration.
    /// The object store --out names, if it names one.
    fn store(&self) -> Result<Option<store::ObjectLocation>> {
        if !store::is_url(&self.out) {
            return Ok(None);
        }
        let loc = store::ObjectLocation::parse(&self.out)
            .with_context(|| format!("--out {}", self.out))?;
        Ok(Some(loc))
    }

    /// The local directory the proxy writes into: --out, or the spool directory of an
    /// object-store --out.
    fn local_dir(&self) -> PathBuf {
        if !store::is_url(&self.out) {
            return PathBuf::from(&self.out);
        }
        if let Some(d) = &self.spool_dir {
            return d.clone();
        }
        let name: String = self
            .out
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        std::env::temp_dir().join("llmreplay-spool").join(name)
    }

    /// Validates the flags into the proxy's configuration: the flags' own rules here, the
    /// configuration's in [`proxy::ProxyConfig::validate`] (its errors named by flag).
    fn config(self) -> Result<proxy::ValidatedProxyConfig> {
        if self.spool_dir.is_some() && !store::is_url(&self.out) {
            crate::exit::refuse!("--spool-dir goes with an object-store --out (s3://...)");
        }
        let to_store = store::is_url(&self.out);
        let dir = self.local_dir();
        let mut c = proxy::ProxyConfig::new(self.listen, self.upstream, dir);
        c.rotate_on_hour = to_store;
        c.admin = (!self.no_admin).then_some(self.admin);
        c.upstream_ca = self.upstream_ca;
        c.upstream_h2 = self.upstream_h2;
        c.forwarded = match (self.no_forwarded_headers, self.trust_forwarded_headers) {
            (true, _) => proxy::ForwardedHeaders::Off,
            (false, true) => proxy::ForwardedHeaders::Trust,
            (false, false) => proxy::ForwardedHeaders::Set,
        };
        c.tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(proxy::TlsFiles { cert, key }),
            (None, None) => None,
            _ => crate::exit::refuse!("--tls-cert and --tls-key go together"),
        };
        c.privacy = match (self.privacy, self.record_bodies) {
            (Some(PrivacyArg::Perf), _) | (None, Some(RecordBodiesArg::None)) => {
                proxy::Privacy::Perf
            }
            (Some(PrivacyArg::Full), _) | (None, Some(RecordBodiesArg::Full)) => {
                proxy::Privacy::Full
            }
            _ => proxy::Privacy::Hashes,
        };
        if c.privacy.hashes() {
            c.hash_key = std::sync::Arc::new(hash_key(self.hash_key_file.as_deref(), &c.out)?);
        }
        c.block_size = self.block_size;
        c.tokenizer = std::sync::Arc::new(
            proxy::Tokenizer::load(&self.tokenizer).context("loading the tokenizer")?,
        );
        c.usage = match (self.no_inject_usage, self.usage_mode) {
            (true, _) => proxy::UsageMode::Off,
            (false, UsageModeArg::Standard) => proxy::UsageMode::Standard,
            (false, UsageModeArg::Vllm) => proxy::UsageMode::Vllm,
        };
        c.sample_rate = self.sample_rate;
        c.queue_capacity = self.queue_capacity;
        c.upstream_timeout = self.upstream_timeout;
        c.upstream_connect_timeout = self.connect_timeout;
        c.upstream_pool_idle_timeout = self.pool_idle_timeout;
        c.upstream_check_interval =
            (!self.upstream_check_interval.is_zero()).then_some(self.upstream_check_interval);
        c.idle_timeout = self.idle_timeout;
        c.max_request_body = self.max_request_body_mb * 1024 * 1024;
        c.client = proxy::ClientLimits {
            first_byte: self.client_first_byte_timeout,
            header: self.client_header_timeout,
            keepalive: self.client_keepalive_timeout,
            body: self.client_body_timeout,
            body_min_rate: self.client_body_min_rate,
        };
        c.max_sse_event = self.max_event_kb * 1024;
        c.max_file_bytes = self.max_file_mb * 1024 * 1024;
        c.max_file_age = self.max_file_age;
        c.flush_interval = self.flush_interval;
        c.time_bucket = self.time_bucket.filter(|b| !b.is_zero());
        // An object store's uploader moves the trace files only: images stay inline.
        c.blobs = !store::is_url(&self.out);
        c.file_prefix = self.file_prefix;
        c.capture_id = self.capture_id;
        c.session_header = self.session_header;
        c.phase_log = self.phase_log;
        c.traceparent = !self.otel.no_traceparent;
        c.otlp = self.otel.config(telemetry::Role::Capture)?;
        c.shadow = self.shadow.config()?;
        c.threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        c.command = command_line();
        c.validate().map_err(flag_error)
    }
}

/// The key of `--hash-key-file`, else the one beside the output directory `dir`
/// (`<dir>.hash-key`, created when missing), said once on stderr.
fn hash_key(file: Option<&std::path::Path>, dir: &std::path::Path) -> Result<HashKey> {
    if let Some(f) = file {
        return HashKey::load(f).context("--hash-key-file");
    }
    let abs = std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?;
    let Some(name) = abs.file_name() else {
        crate::exit::refuse!(
            "--out {} has no name to put its hash key beside: give --hash-key-file",
            dir.display()
        );
    };
    let path = abs.with_file_name(format!("{}.hash-key", name.to_string_lossy()));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("{}", parent.display()))?;
    }
    let (key, created) = HashKey::load_or_create(&path)?;
    eprintln!(
        "llmreplay capture: no --hash-key-file: content hashes are keyed with the key {} {} \
         (id {}); give every capture whose hashes must compare the same key file",
        if created {
            "just created in"
        } else {
            "kept in"
        },
        path.display(),
        key.id()
    );
    Ok(key)
}

/// A configuration error, named by the flag that set the value: refused (status 2).
fn flag_error(e: proxy::ProxyError) -> anyhow::Error {
    use proxy::{ConfigError, Setting};
    let proxy::ProxyError::Config(c) = e else {
        return e.into();
    };
    let refused = crate::exit::refused;
    match c {
        ConfigError::SampleRate(r) => refused(format!("--sample-rate {r} must be in (0, 1]")),
        ConfigError::Zero(s) => {
            let flag = match s {
                Setting::BlockSize => "--block-size",
                Setting::MaxFileBytes => "--max-file-mb",
                Setting::MaxRequestBody => "--max-request-body-mb",
                Setting::QueueCapacity => "--queue-capacity",
                Setting::MaxSseEvent => "--max-event-kb",
                Setting::ClientFirstByte => "--client-first-byte-timeout",
                Setting::ClientHeader => "--client-header-timeout",
                Setting::ClientKeepalive => "--client-keepalive-timeout",
                Setting::ClientBody => "--client-body-timeout",
                Setting::Threads => "--threads",
                _ => s.field(),
            };
            refused(format!("{flag} must be > 0"))
        }
        ConfigError::SessionHeader(_) | ConfigError::SecretSessionHeader(_) => {
            refused(format!("--session-header {c}"))
        }
        // The upstream's message names its flag already.
        c => proxy::ProxyError::Config(c).into(),
    }
}

/// Runs the capture proxy until SIGTERM or SIGINT, then drains for up to `--drain-timeout`,
/// finishes the trace files, prints a summary and returns. Exit status: 0 when every
/// recorded row is in a finished file; [`ExitStatus::TraceIncomplete`] (7) when rows were
/// dropped or journals are left for the next start (a full disk: capture kept serving, see
/// the summary); 130 / 143 on a second signal during the drain, which exits at once (see
/// [`crate::signals`]; the journal it leaves is recovered by the next capture into that
/// directory); 1 when it could not start.
///
/// Nothing in `--out` keeps capture from starting: journals a previous run left are finished
/// (on a still-full disk they are kept and retried while serving), damaged ones are
/// recovered line by line and set aside as `<name>.damaged-<utc>`.
pub fn run_capture(args: CaptureArgs) -> Result<ExitStatus> {
    let drain = args.drain_timeout;
    let args_flush = args.flush_interval;
    let store = args.store()?;
    let dest = args.out.clone();
    let cfg = args.config()?;
    let tls = cfg.tls();
    let out = cfg.config().out.clone();
    // Uploads finished files (and any a previous run left in the spool) as they appear.
    let uploader =
        store.map(|loc| store::SpoolUploader::spawn(loc, out.clone(), Duration::from_secs(2)));
    let uploading = uploader.is_some();
    // This thread's runtime serves the first listener (and the admin one); the proxy starts
    // its other serving threads, each on its own runtime.
    let rt = proxy::serving_runtime().context("tokio runtime")?;
    let (dest2, out2) = (dest.clone(), out.clone());
    // The first signal drains, the second exits at once.
    let mut stopped = signals::watch_noting(
        "capture",
        vec![signals::graceful()],
        format!(
            ": requests still in flight are not recorded; every row recorded so far is kept in \
             a journal in {} (at most the last --flush-interval, {:?}, of rows may be lost), \
             which the next capture with this --out finishes into a trace file",
            out.display(),
            args_flush
        ),
    )?;
    let incomplete = rt.block_on(async move {
        let (dest, out) = (dest2, out2);
        let handle = proxy::start(cfg).await.context("starting the capture proxy")?;
        log_recovery(handle.recovered());
        eprintln!(
            "llmreplay capture listening on {}{}, writing to {}",
            handle.url(tls),
            handle
                .admin_addr()
                .map_or(String::new(), |a| format!(
                    " (admin http://{a}/metrics, /healthz, /readyz)"
                )),
            if uploading {
                format!("{dest} (spooled in {})", out.display())
            } else {
                out.display().to_string()
            }
        );
        stopped.wait().await;
        eprintln!(
            "llmreplay capture: stopping; draining in-flight requests for up to {drain:?} (signal again to stop now)"
        );
        let report = handle.shutdown(drain).await.context("shutting down")?;
        let dropped = report.records_dropped;
        let queue_full = report.records_dropped_queue_full;
        eprintln!(
            "llmreplay capture: {} records written, {dropped} dropped ({queue_full} writer queue \
             full, {} the trace directory could not take; {} write errors){}; files: {}",
            report.records_written,
            dropped - queue_full.min(dropped),
            report.record_errors,
            if report.drained {
                ""
            } else {
                "; some in-flight requests were cut at the drain timeout"
            },
            if report.files.is_empty() {
                "none".to_string()
            } else {
                report
                    .files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        let left_rows: usize = report.journals_left.iter().map(|d| d.records).sum();
        if !report.journals_left.is_empty() {
            eprintln!(
                "llmreplay capture: {} journal(s) holding {left_rows} records could not be \
                 finished and are kept in {} for the next start to finish: {}",
                report.journals_left.len(),
                out.display(),
                report
                    .journals_left
                    .iter()
                    .map(|d| d.journal.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let incomplete = (dropped > 0 || !report.journals_left.is_empty()).then(|| {
            format!(
                "{dropped} rows dropped, {} journal(s) with {left_rows} rows left for the next start",
                report.journals_left.len()
            )
        });
        Ok::<_, anyhow::Error>(incomplete)
    })?;
    let fail_incomplete = |incomplete: Option<String>| match incomplete {
        Some(why) => Err(Failure::error(
            ExitStatus::TraceIncomplete,
            format!("the trace is incomplete: {why}"),
        )),
        None => Ok(ExitStatus::Success),
    };
    let Some(uploader) = uploader else {
        return fail_incomplete(incomplete);
    };
    let up = uploader.finish(drain);
    eprintln!(
        "llmreplay capture: {} file(s) uploaded to {dest}{}",
        up.uploaded.len(),
        up.uploaded
            .iter()
            .map(|u| format!("\n  {u}"))
            .collect::<String>()
    );
    if !up.left.is_empty() {
        bail!(
            "{} finished file(s) could not be uploaded to {dest} and stay in {} (the next \
             capture with this --out/--spool-dir uploads them): {}",
            up.left.len(),
            out.display(),
            up.last_error.unwrap_or_default()
        );
    }
    fail_incomplete(incomplete)
}

/// Says what the start found in --out: journals finished, set aside or kept for later.
fn log_recovery(rec: &trace_format::writer::RecoveryReport) {
    if !rec.files.is_empty() {
        eprintln!(
            "llmreplay capture: recovered {} records from a previous run into {} file(s){}",
            rec.records,
            rec.files.len(),
            if rec.torn_lines > 0 {
                format!(
                    " ({} torn final line(s) dropped: the crash's loss window)",
                    rec.torn_lines
                )
            } else {
                String::new()
            }
        );
    }
    if !rec.damaged_lines.is_empty() {
        eprintln!(
            "llmreplay capture: {} damaged journal line(s) ({}); every intact record was \
             recovered and the journal(s) set aside, kept byte for byte: {}",
            rec.damaged_lines.len(),
            rec.damaged_lines
                .iter()
                .map(|(p, l)| format!("{}:{l}", p.display()))
                .collect::<Vec<_>>()
                .join(", "),
            rec.set_aside
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for d in &rec.deferred {
        eprintln!(
            "llmreplay capture: journal {} ({} records) from a previous run could not be \
             finished yet: {}; it is kept and retried while capture runs",
            d.journal.display(),
            d.records,
            d.reason
        );
    }
    for e in &rec.errors {
        eprintln!("llmreplay capture: cleaning up --out: {e}");
    }
}
