//! The proxy's configuration: what the CLI or a test sets ([`ProxyConfig`]), checked once
//! into the [`ValidatedProxyConfig`](validated::ValidatedProxyConfig) that [`crate::start`]
//! takes ([`validated`]), with its TLS material ([`tls`]); shared read-only by every
//! connection.
//!
//! It may call: `runtime` (a default), `error`.

pub(crate) mod tls;
pub(crate) mod validated;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokenize::Tokenizer;
use trace_format::keyed::HashKey;

/// How much of the content the trace keeps (`--privacy`): `perf` none, `hashes` keyed
/// hashes only (the default), `full` the request JSON too.
pub use trace_format::privacy::Grade as Privacy;

/// This process's random hash key (kept nowhere), the default of [`ProxyConfig::hash_key`].
fn process_key() -> Arc<HashKey> {
    static KEY: std::sync::OnceLock<Arc<HashKey>> = std::sync::OnceLock::new();
    KEY.get_or_init(|| Arc::new(HashKey::random())).clone()
}

/// Whether and how the proxy asks a streaming upstream for token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UsageMode {
    /// Never touch requests (`--no-inject-usage`).
    Off,
    /// Add `stream_options.include_usage` (OpenAI's API; the default).
    #[default]
    Standard,
    /// Also add vLLM's `continuous_usage_stats` for per-chunk token counts.
    Vllm,
}

/// What capture tells the upstream about the client (`X-Forwarded-For`,
/// `X-Forwarded-Proto`), as nginx and Envoy deployments do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeaders {
    /// Pass the client's headers on unchanged, add nothing (`--no-forwarded-headers`).
    Off,
    /// `X-Forwarded-For: <client address>` and `X-Forwarded-Proto: <http|https of the
    /// listener>`, replacing whatever the client sent (a client cannot choose the address
    /// the upstream sees). The default.
    #[default]
    Set,
    /// Trust the inbound values, from a load balancer in front: the client address is
    /// appended to its `X-Forwarded-For`, and its `X-Forwarded-Proto` is kept
    /// (`--trust-forwarded-headers`).
    Trust,
}

/// Certificate chain and private key (PEM files) for a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Timeouts on what a client sends, on the proxy and the admin listener. None of them touches
/// the response direction: a generation may stream for as long as the upstream keeps sending
/// (that side has `upstream_timeout` and `idle_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// A new connection that sends no byte for this long is closed (nothing recorded).
    pub first_byte: Duration,
    /// A request head must be complete this long after its first byte, else the
    /// connection is closed (nothing was forwarded, nothing recorded).
    pub header: Duration,
    /// A keep-alive connection idle this long between requests is closed.
    pub keepalive: Duration,
    /// Longest gap between two reads of a request body, and the allowance for a whole body
    /// on top of `body_min_rate`; then 408.
    pub body: Duration,
    /// Bytes/s a request body must keep up: each this many bytes received extend its
    /// deadline (`body` after the head) by one second; 0: only the gap counts.
    pub body_min_rate: u64,
}

impl Default for ClientLimits {
    /// 30 s to the first byte, 30 s for a head, 75 s idle between requests (nginx's
    /// keep-alive default: longer than the idle time of common client pools, so a client
    /// rarely writes into a connection the proxy is closing), 30 s body gaps with at least
    /// 1 KiB/s on average.
    fn default() -> Self {
        ClientLimits {
            first_byte: Duration::from_secs(30),
            header: Duration::from_secs(30),
            keepalive: Duration::from_secs(75),
            body: Duration::from_secs(30),
            body_min_rate: 1024,
        }
    }
}

/// How `--shadow` chooses the production requests it mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShadowSampleBy {
    /// Each request drawn on its own.
    #[default]
    Request,
    /// A conversation drawn as a whole: by the session header's value (`session_header`),
    /// else by a chat request's messages up to its first user message (the root every turn
    /// of a conversation carries, as [`crate::linking::sessions`] links them); a request with neither
    /// is drawn on its own.
    Session,
}

/// One shadow candidate (`--shadow NAME=URL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowTarget {
    /// Its name: the `target` of its rows.
    pub name: String,
    /// Its base URL, as `upstream`.
    pub url: String,
    /// Headers it gets in place of the client's credentials (`--shadow-header`).
    pub headers: Vec<(String, String)>,
    /// The model name it is asked for instead of the client's (`--shadow-model`).
    pub model: Option<String>,
}

/// Shadow traffic: production generation requests mirrored to candidates, their answers
/// measured, recorded as paired rows and discarded (see `proxy/src/shadow.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowConfig {
    /// The candidates (at least one).
    pub targets: Vec<ShadowTarget>,
    /// Fraction of recorded generation requests mirrored, in (0, 1].
    pub sample: f64,
    /// What the sample draws.
    pub sample_by: ShadowSampleBy,
    /// Mirrored requests in flight per candidate; more are dropped (and counted).
    pub max_in_flight: usize,
    /// Longest a mirrored request may take, from when it is sent to the end of its answer;
    /// then it is cut and recorded as the candidate's `timeout` (its slot freed).
    pub timeout: Duration,
}

impl ShadowConfig {
    /// Mirrors every request to `targets`, at most 64 in flight each, each cut after 60 s.
    pub fn new(targets: Vec<ShadowTarget>) -> Self {
        ShadowConfig {
            targets,
            sample: 1.0,
            sample_by: ShadowSampleBy::Request,
            max_in_flight: 64,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Everything the capture proxy needs; see [`ProxyConfig::new`] for the defaults.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Address to listen on (port 0 picks one).
    pub listen: SocketAddr,
    /// Admin listener for `/metrics`, `/healthz` and `/readyz` (`None`: no admin listener).
    pub admin: Option<SocketAddr>,
    /// Upstream base URL, `http://` or `https://`, optionally with a path prefix.
    pub upstream: String,
    /// PEM CA bundle trusted for an https upstream instead of the web PKI roots.
    pub upstream_ca: Option<PathBuf>,
    /// Speak HTTP/2 with prior knowledge to a plain-http upstream (h2c). An https upstream
    /// negotiates h2 or HTTP/1.1 by ALPN.
    pub upstream_h2: bool,
    /// Serve TLS on the listener.
    pub tls: Option<TlsFiles>,
    /// `X-Forwarded-For` / `X-Forwarded-Proto` on requests to the upstream.
    pub forwarded: ForwardedHeaders,
    /// Directory of the trace files.
    pub out: PathBuf,
    /// Trace file name prefix.
    pub file_prefix: String,
    /// What the trace keeps of the content.
    pub privacy: Privacy,
    /// The key every content hash written is made under ([`trace_format::keyed`]); unless
    /// set (the CLI reads it from `--hash-key-file`), one random key per process, so
    /// proxies restarted in one process into one directory still agree.
    pub hash_key: Arc<HashKey>,
    /// Tokens per prefix-hash block.
    pub block_size: u32,
    /// How tokens are counted for prefix hashes (and for `prompt_tokens` when the upstream
    /// reported no usage); its name goes into the file metadata.
    pub tokenizer: Arc<Tokenizer>,
    /// Usage injection.
    pub usage: UsageMode,
    /// Fraction of generation requests recorded, in (0, 1].
    pub sample_rate: f64,
    /// Records queued for the writer before new ones are dropped.
    pub queue_capacity: usize,
    /// The recorder's shed budget: a prompt waiting longer than this to be tokenized is not
    /// tokenized (its row has no `prefix_hashes`, and estimated `prompt_tokens` when the
    /// upstream reported none), and a row queued longer than this for the writer gets
    /// estimated token counts instead of counted ones. Bounds the recorder's lag.
    pub recorder_shed_after: Duration,
    /// Longest wait for the upstream's response headers (then 504, outcome `timeout`).
    pub upstream_timeout: Duration,
    /// Longest TCP (and TLS) connect to the upstream (then 502).
    pub upstream_connect_timeout: Duration,
    /// How often the upstream's reachability is checked while it answers (a TCP connection
    /// to its host and port; every second while it does not, and at once after a request
    /// could not connect): the gauge `llmreplay_capture_upstream_up`, `/readyz`, and a line
    /// in the log at each change. `None`: not checked (no gauge; `/readyz` as `/healthz`).
    pub upstream_check_interval: Option<Duration>,
    /// Longest an upstream keep-alive connection waits idle for reuse: below the upstream's
    /// own keep-alive timeout (uvicorn's is 5 s), so no request is written to a connection
    /// in the instant the upstream closes it.
    pub upstream_pool_idle_timeout: Duration,
    /// Longest gap between two frames of a response body (then the stream is cut, outcome
    /// `timeout`).
    pub idle_timeout: Duration,
    /// Largest generation request body read (larger ones get 413).
    pub max_request_body: usize,
    /// Client side of every listener (proxy and admin): how long each phase of a request
    /// may take before the connection is closed (or, mid-body, answered 408).
    pub client: ClientLimits,
    /// Most bytes of one SSE event held to observe it; a larger event is forwarded as it
    /// arrives, unobserved and unstripped, and counted.
    pub max_sse_event: usize,
    /// Rotate trace files at this estimated size.
    pub max_file_bytes: u64,
    /// Rotate trace files at this age.
    pub max_file_age: Duration,
    /// Also rotate when the UTC hour changes (files for Hive partitions by hour).
    pub rotate_on_hour: bool,
    /// The writer's loss window on a crash (journal hand-over interval).
    pub flush_interval: Duration,
    /// Arrival times are rounded down to a multiple of this (None: kept to the µs).
    pub time_bucket: Option<Duration>,
    /// Under `full`, each large base64 string of a body (an image) is written once to
    /// `blobs/` beside the trace files, the body referring to it ([`trace_format::blobs`]);
    /// false keeps them inline (an object-store `--out`, whose uploader moves trace files
    /// only).
    pub blobs: bool,
    /// Request header whose value becomes `session_id` (never a credential header).
    pub session_header: Option<String>,
    /// The producing command line, for the file metadata.
    pub command: String,
    /// Where to write each generation request's phase stamps at shutdown (a diagnostic for
    /// `bench/`; see `bench/phases.py`). None: not kept.
    pub phase_log: Option<PathBuf>,
    /// Threads serving client connections. 1: on the caller's runtime. More: each on its
    /// own single-threaded runtime, accepting from the one listening socket, with its own
    /// upstream pool (see `proxy/src/runtime/threads.rs`).
    pub threads: usize,
    /// Heap each serving thread faults in when it starts, for the next connection burst
    /// (see `proxy/src/runtime/heap.rs`); 0: none.
    pub warm_heap: usize,
    /// Start a W3C trace for a generation request whose client sent no valid `traceparent`
    /// (one is added upstream, its ids recorded); false with `--no-traceparent`. A client's
    /// valid `traceparent` is always forwarded unchanged and its ids recorded.
    pub traceparent: bool,
    /// Export each recorded row as an OTLP span, and the capture's metrics
    /// (`--otlp-endpoint`); `None`: nothing is exported.
    pub otlp: Option<telemetry::OtlpConfig>,
    /// Shadow traffic to candidates (`--shadow`); `None`: nothing is mirrored.
    pub shadow: Option<ShadowConfig>,
    /// The `capture_id` of every row (`--capture-id`); `None`: the pod's name, else
    /// `host:port` of the listener ([`trace_format::fleet::capture_id`]).
    pub capture_id: Option<String>,
}

impl ProxyConfig {
    /// A configuration with defaults: no admin listener, record hashes with 16-token blocks
    /// of the `words` tokenizer, standard usage injection, everything sampled, 16 Ki queued records, a 1 s recorder shed budget, 10 min upstream
    /// and idle timeouts, 64 MiB request bodies, 256 MiB / 1 h files, 200 ms flush.
    pub fn new(listen: SocketAddr, upstream: impl Into<String>, out: impl Into<PathBuf>) -> Self {
        ProxyConfig {
            listen,
            admin: None,
            upstream: upstream.into(),
            upstream_ca: None,
            upstream_h2: false,
            tls: None,
            forwarded: ForwardedHeaders::Set,
            out: out.into(),
            file_prefix: "capture".into(),
            privacy: Privacy::Hashes,
            hash_key: process_key(),
            block_size: 16,
            tokenizer: Arc::new(Tokenizer::words()),
            usage: UsageMode::Standard,
            sample_rate: 1.0,
            queue_capacity: 16 * 1024,
            recorder_shed_after: Duration::from_secs(1),
            upstream_timeout: Duration::from_secs(600),
            upstream_connect_timeout: Duration::from_secs(10),
            upstream_pool_idle_timeout: Duration::from_secs(4),
            upstream_check_interval: None,
            idle_timeout: Duration::from_secs(600),
            max_request_body: 64 * 1024 * 1024,
            client: ClientLimits::default(),
            max_sse_event: wire::sse::DEFAULT_MAX_EVENT,
            max_file_bytes: 256 * 1024 * 1024,
            max_file_age: Duration::from_secs(3600),
            rotate_on_hour: false,
            flush_interval: Duration::from_millis(200),
            time_bucket: None,
            blobs: true,
            session_header: None,
            command: String::new(),
            phase_log: None,
            threads: 1,
            warm_heap: crate::runtime::heap::WARM_BYTES,
            traceparent: true,
            otlp: None,
            shadow: None,
            capture_id: None,
        }
    }
}
