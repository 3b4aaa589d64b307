//! The configuration of a replay run: [`ReplayConfig`] as given (flags, or a library user's
//! settings), and the [`ValidatedConfig`] that [`ReplayConfig::validate`] makes of it, which
//! every run takes and nothing can change afterwards. A variant (a sweep level) is a new
//! `ReplayConfig`, validated again.
//!
//! The binary parses flags; everything a run sees is already checked, so the run itself never
//! meets a bad value. Each mode is an enum parsed with a clear error, never a string with a
//! silent fallback.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use wire::api::Api;

use crate::error::ReplayError;

/// One candidate endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Short name used in tables and result files.
    pub name: String,
    /// Base URL, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted and dropped).
    pub url: String,
}

impl FromStr for Target {
    type Err = String;
    /// `URL` or `NAME=URL`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, url) = match s.split_once('=') {
            Some((n, u)) if !n.contains('/') && !n.contains(':') => (n.to_string(), u.to_string()),
            _ => (String::new(), s.to_string()),
        };
        let url = url
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "target {s:?}: expected http://HOST:PORT or https://..., optionally NAME=URL"
            ));
        }
        if let Some(base) = endpoint_base(&url) {
            let named = if name.is_empty() {
                String::new()
            } else {
                format!("{name}=")
            };
            return Err(format!(
                "target {s:?} names an API endpoint; give the server's base URL instead: \
                 --target {named}{base} (each request's own path, /v1/completions or \
                 /v1/chat/completions, is added to it)"
            ));
        }
        if url.contains(['?', '#']) {
            return Err(format!(
                "target {s:?}: a base URL takes no query string or fragment"
            ));
        }
        let name = if name.is_empty() {
            url.split("://").nth(1).unwrap_or(&url).to_string()
        } else {
            name
        };
        Ok(Target { name, url })
    }
}

/// Where a target lives, parsed from its URL once, by [`ReplayConfig::validate`]: an origin
/// as every URL reader takes it ([`wire::origin`]).
pub type Endpoint = wire::origin::Origin;

/// The paths that end an OpenAI API endpoint: a target URL ending in one (with or without
/// `/v1` before it) names an endpoint, not a server.
const ENDPOINT_PATHS: &[&str] = &[
    "/chat/completions",
    "/completions",
    "/models",
    "/embeddings",
    "/responses",
];

/// When `url` (no trailing `/`) ends in an API endpoint's path: the base URL before it (and
/// before a `/v1` ahead of it). A path that is not an endpoint is a prefix, kept.
fn endpoint_base(url: &str) -> Option<&str> {
    let path_start = url.find("://").map_or(0, |i| i + 3);
    let path = &url[path_start..];
    let path = &path[path.find('/')?..];
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let rest = ENDPOINT_PATHS.iter().find_map(|e| path.strip_suffix(e))?;
    let rest = rest.strip_suffix("/v1").unwrap_or(rest);
    Some(&url[..path_start + url[path_start..].find('/')? + rest.len()])
}

/// Which generation API a built request (a row without a body) speaks: `--endpoint`'s values
/// for replay (every generation row sent to it) and synth (the endpoint every row records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointKind {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/responses` (OpenAI Responses).
    Responses,
    /// `/v1/messages` (Anthropic Messages).
    Messages,
}

impl EndpointKind {
    /// The API it speaks.
    pub fn api(self) -> Api {
        match self {
            EndpointKind::Completions => Api::Completions,
            EndpointKind::Chat => Api::Chat,
            EndpointKind::Responses => Api::Responses,
            EndpointKind::Messages => Api::Messages,
        }
    }

    /// The request path.
    pub fn path(self) -> &'static str {
        self.api().default_path()
    }
}

impl FromStr for EndpointKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            EndpointKind::Completions,
            EndpointKind::Chat,
            EndpointKind::Responses,
            EndpointKind::Messages,
        ]
        .into_iter()
        .find(|k| s == k.api().name() || s == k.path())
        .ok_or_else(|| {
            format!("unknown endpoint {s:?} (expected completions, chat, responses or messages)")
        })
    }
}

/// How built requests choose `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputLen {
    /// The recorded output length, with `ignore_eos` so the server generates exactly it.
    Recorded,
    /// The recorded request's own `max_tokens`, without `ignore_eos`.
    Request,
    /// A fixed length, with `ignore_eos`.
    Fixed(u32),
}

impl FromStr for OutputLen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "recorded" => Ok(OutputLen::Recorded),
            "request" => Ok(OutputLen::Request),
            n => match n.parse::<u32>() {
                Ok(v) if v > 0 => Ok(OutputLen::Fixed(v)),
                _ => Err(format!(
                    "--output-len {s:?}: expected recorded, request or a positive number"
                )),
            },
        }
    }
}

/// How turns of one session are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionMode {
    /// Every request at its recorded time.
    Open,
    /// A request when the candidate finished its parent (`parent_request_id`, else its
    /// session's previous turn), plus think time ([`crate::graph`]).
    Closed,
}

impl FromStr for SessionMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "open" => Ok(SessionMode::Open),
            "closed" => Ok(SessionMode::Closed),
            _ => Err(format!(
                "unknown session mode {s:?} (expected open or closed)"
            )),
        }
    }
}

/// Where send times come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// The trace's recorded arrival offsets, divided by `speedup`.
    Recorded {
        /// 2.0 = twice as fast.
        speedup: f64,
    },
    /// Gamma inter-arrivals as in vLLM (`burstiness` 1 = Poisson); `rate` infinite = all at once.
    Rate {
        /// Requests per second.
        rate: f64,
        /// Gamma shape.
        burstiness: f64,
    },
}

/// A latency SLO for goodput (`ttft:500`), in milliseconds, inclusive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// Which metric.
    pub metric: SloMetric,
    /// Limit in milliseconds (a request passes when its value ≤ this).
    pub limit_ms: f64,
}

/// Metrics an SLO can bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloMetric {
    /// Time to first token.
    Ttft,
    /// Time to first answer token (after a reasoning model's reasoning; TTFT without it).
    Ttfat,
    /// Time per output token.
    Tpot,
    /// End-to-end latency.
    E2el,
}

impl SloMetric {
    /// The key as written on the command line and in JSON.
    pub fn key(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::Ttfat => "ttfat",
            SloMetric::Tpot => "tpot",
            SloMetric::E2el => "e2el",
        }
    }
}

impl FromStr for Slo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (k, v) = s
            .split_once(':')
            .ok_or_else(|| format!("--goodput {s:?}: expected KEY:MS, e.g. ttft:500"))?;
        let metric = match k {
            "ttft" => SloMetric::Ttft,
            "ttfat" => SloMetric::Ttfat,
            "tpot" => SloMetric::Tpot,
            "e2el" => SloMetric::E2el,
            _ => {
                return Err(format!(
                    "--goodput {s:?}: unknown key {k:?} (expected ttft, ttfat, tpot or e2el)"
                ))
            }
        };
        let limit_ms: f64 = v
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| {
                format!("--goodput {s:?}: {v:?} is not a non-negative number of milliseconds")
            })?;
        Ok(Slo { metric, limit_ms })
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.metric.key(), self.limit_ms)
    }
}

/// How many passes of the trace to replay (`--loop`; see [`crate::soak`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loops {
    /// Exactly this many passes (≥ 1).
    Count(usize),
    /// As many as the selection's `--duration` needs.
    UntilDuration,
}

impl FromStr for Loops {
    type Err = String;
    /// `N` (≥ 1) or `inf` (until `--duration`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "inf" | "until-duration" => Ok(Loops::UntilDuration),
            n => match n.parse::<usize>() {
                Ok(v) if v >= 1 => Ok(Loops::Count(v)),
                _ => Err(format!(
                    "--loop {s:?}: expected a number of passes (>= 1) or inf (until --duration)"
                )),
            },
        }
    }
}

impl fmt::Display for Loops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loops::Count(n) => write!(f, "{n}"),
            Loops::UntilDuration => f.write_str("inf"),
        }
    }
}

/// Soak settings of a run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Soak {
    /// Passes of the trace (None: once, as recorded).
    pub loops: Option<Loops>,
    /// Metrics per slice of this width (by send time), in the JSON and the report's timeline.
    pub slice: Option<Duration>,
}

/// Metrics that get percentiles (`--percentile-metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercentileMetric {
    /// Time to first token.
    Ttft,
    /// Time per output token.
    Tpot,
    /// Inter-token latency.
    Itl,
    /// End-to-end latency.
    E2el,
}

impl PercentileMetric {
    /// vLLM's key stem.
    pub fn key(self) -> &'static str {
        match self {
            PercentileMetric::Ttft => "ttft",
            PercentileMetric::Tpot => "tpot",
            PercentileMetric::Itl => "itl",
            PercentileMetric::E2el => "e2el",
        }
    }
}

impl FromStr for PercentileMetric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ttft" => Ok(PercentileMetric::Ttft),
            "tpot" => Ok(PercentileMetric::Tpot),
            "itl" => Ok(PercentileMetric::Itl),
            "e2el" => Ok(PercentileMetric::E2el),
            _ => Err(format!(
                "unknown metric {s:?} (expected ttft, tpot, itl or e2el)"
            )),
        }
    }
}

impl RequestOptions {
    /// The API a built request for a row of `row_endpoint` speaks: the row's own
    /// ([`Api::of_endpoint`]; a path of none as completions), or `--endpoint`'s for a
    /// generation (an embeddings, rerank or score row keeps its own).
    pub fn endpoint_for(&self, row_endpoint: &str) -> Api {
        let own = Api::of_endpoint(row_endpoint);
        match (own, self.endpoint) {
            (Some(a), _) if !a.generates() => a,
            (_, Some(k)) => k.api(),
            (own, None) => own.unwrap_or(Api::Completions),
        }
    }
}

/// Which part of the trace is replayed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// Skip this much of the trace (trace time, from its first arrival).
    pub start_offset: Duration,
    /// Replay only this much of the trace (trace time).
    pub duration: Option<Duration>,
    /// Keep this fraction of sessions (or requests without sessions), deterministically.
    pub sample_ratio: Option<f64>,
    /// Keep at most this many requests (the earliest).
    pub max_requests: Option<usize>,
    /// Keep only this shard of the selection (`--shard K/N`), applied last.
    pub shard: Option<Shard>,
}

/// Shard `index` of `count` (`--shard K/N`, K in 0..N): a deterministic, disjoint part of a
/// selection; whole sessions stay in one shard, and the shards together cover every row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// K, in `0..count`.
    pub index: u32,
    /// N, at least 1.
    pub count: u32,
}

impl Shard {
    /// Builds shard `index` of `count`, checking `index < count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, ReplayError> {
        if count == 0 {
            return Err(ReplayError::Config("shard count must be at least 1".into()));
        }
        if index >= count {
            return Err(ReplayError::Config(format!(
                "shard index {index} is not within 0..{count} (shards count from 0)"
            )));
        }
        Ok(Shard { index, count })
    }

    /// Which shard of `count` a row with this session (else request) id belongs to.
    pub fn of_key(key: &str, count: u32) -> u32 {
        // Mixed again so shard membership is independent of --sample-ratio's use of the hash.
        let h = crate::prompt::stable_hash(key).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((h >> 32) % u64::from(count.max(1))) as u32
    }

    /// Whether `r` belongs to this shard.
    pub fn contains(&self, r: &trace_format::TraceRecord) -> bool {
        Shard::of_key(r.session_id.as_deref().unwrap_or(&r.request_id), self.count) == self.index
    }
}

impl FromStr for Shard {
    type Err = String;
    /// `K/N`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (k, n) = s
            .split_once('/')
            .ok_or_else(|| format!("--shard {s:?}: expected K/N, e.g. 0/4"))?;
        let k: u32 = k
            .trim()
            .parse()
            .map_err(|_| format!("--shard {s:?}: {k:?} is not a shard index"))?;
        let n: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("--shard {s:?}: {n:?} is not a shard count"))?;
        Shard::new(k, n).map_err(|e| format!("--shard {s:?}: {e}"))
    }
}

/// An RFC 3339 time (`2026-01-02T03:04:05Z`, any offset) as µs since the epoch.
pub fn parse_rfc3339_us(s: &str) -> Result<i64, ReplayError> {
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.timestamp_micros())
        .map_err(|e| {
            ReplayError::Config(format!(
                "{s:?} is not an RFC 3339 time such as 2026-01-02T03:04:05Z: {e}"
            ))
        })
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// How requests are built and sent.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    /// Endpoint of the generation rows without a body; None = the row's own API (a path of
    /// no API as completions).
    pub endpoint: Option<EndpointKind>,
    /// Rewrites the model name of every request.
    pub model: Option<String>,
    /// Output length policy for rows without a body.
    pub output_len: OutputLen,
    /// Allows streaming: built requests stream when their row did; false sends every built
    /// request unstreamed. Rows with a body keep their own `stream`.
    pub stream: bool,
    /// Salt mixed into synthesized prompts (per-run random when not given).
    pub prompt_salt: u64,
    /// Tokenizer that synthesized prompts are exact for (`--tokenizer`); `None` keeps the
    /// word filler: exact for the sim, approximate for a real target.
    pub tokenizer: Option<std::sync::Arc<crate::prompt::PromptTokenizer>>,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Sent as `Authorization: Bearer ...`.
    pub api_key: Option<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// PEM bundle of the CA to trust for https targets instead of the web PKI.
    pub ca_cert: Option<std::path::PathBuf>,
    /// Longest TCP/TLS connect, apart from the request timeout (`--connect-timeout`).
    pub connect_timeout: Duration,
    /// Longest a keep-alive connection is kept idle for reuse (`--pool-idle-timeout`): below
    /// the target's own keep-alive timeout (uvicorn's is 5 s), so the pool never writes to a
    /// connection in the instant the server closes it.
    pub pool_idle_timeout: Duration,
    /// Send a W3C `traceparent` with every request (its ids go to the row's `trace_id` and
    /// `span_id`); false with `--no-traceparent`, or when a `--header traceparent` is given.
    pub traceparent: bool,
}

/// Everything a replay run needs, as given; [`ReplayConfig::validate`] checks it and gives
/// the [`ValidatedConfig`] a run takes.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Candidate endpoints, replayed in turn with the same schedule.
    pub targets: Vec<Target>,
    /// Which rows.
    pub selection: Selection,
    /// Send times.
    pub arrivals: Arrivals,
    /// Caps requests in flight.
    pub max_concurrency: Option<usize>,
    /// Session pacing.
    pub session_mode: SessionMode,
    /// Request building and sending.
    pub request: RequestOptions,
    /// Open the connection pool before the clock starts.
    pub preconnect: bool,
    /// Requests sent and not counted before the clock starts.
    pub num_warmups: usize,
    /// Seed for sampling and synthetic arrivals.
    pub seed: u64,
    /// Goodput SLOs.
    pub goodput: Vec<Slo>,
    /// The percentile at which every SLO must hold for a run to PASS (`--slo-percentile`).
    pub slo_percentile: f64,
    /// Metrics that get percentiles.
    pub percentile_metrics: Vec<PercentileMetric>,
    /// Which percentiles.
    pub metric_percentiles: Vec<f64>,
    /// Pause between targets.
    pub cooldown: Duration,
    /// Show a live progress bar (on a terminal).
    pub progress: bool,
    /// Client worker threads (0 = one per core).
    pub client_threads: usize,
    /// `--label`.
    pub label: Option<String>,
    /// `--metadata K=V`.
    pub metadata: Vec<(String, String)>,
    /// Sample each target's `/metrics` during the run (vLLM's scheduler gauges).
    pub server_metrics: bool,
    /// Soak: passes of the trace (`--loop`) and metrics per time slice (`--slice`).
    pub soak: Soak,
    /// Wall-clock start of the schedule, µs since the epoch (`--start-at`), so separate
    /// processes start their clocks at the same instant; None = as soon as ready.
    pub start_at_us: Option<i64>,
    /// Keep every result row in [`crate::RunOutput::records`] (sweeps, repeats, soak slices,
    /// `--save-detailed`); false: rows go to the run's [`crate::RowSink`] only, so a run of
    /// any length needs memory for its requests in flight only.
    pub keep_rows: bool,
    /// After a first stop request, how long requests in flight may finish before they are
    /// cancelled (recorded `client_cancelled`).
    pub drain_timeout: Duration,
    /// How far ahead of the clock requests are built.
    pub lookahead: Lookahead,
}

/// How far ahead of the clock the feed builds requests: at most `time` of schedule ahead,
/// at most `bytes` of built requests not yet finished (one request always fits), and with a
/// `max_concurrency`, at most `waiting` requests due beyond it (waiting for a slot). The
/// run's memory is bounded by these and by the requests in flight, not by the trace or by
/// the requests waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookahead {
    /// Schedule time built ahead of the clock.
    pub time: Duration,
    /// Bytes of built requests (in the look-ahead or in flight).
    pub bytes: usize,
    /// Requests due and built beyond `max_concurrency` (waiting for a slot); the rest of a
    /// backlog stays unread until some finish.
    pub waiting: usize,
}

impl Default for Lookahead {
    fn default() -> Self {
        Lookahead {
            time: Duration::from_secs(5),
            bytes: 128 << 20,
            waiting: 4096,
        }
    }
}

/// The default of [`ReplayConfig::drain_timeout`].
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

impl ReplayConfig {
    /// A configuration for `targets` with the defaults of `llmreplay replay` (recorded
    /// arrivals at speed 1, streaming, preconnect, percentiles 50/95/99 of TTFT, TPOT, ITL and
    /// E2EL, a 600 s timeout, salt 0), for library users and tests.
    pub fn new(targets: Vec<Target>) -> Self {
        ReplayConfig {
            targets,
            selection: Selection::default(),
            arrivals: Arrivals::Recorded { speedup: 1.0 },
            max_concurrency: None,
            session_mode: SessionMode::Open,
            request: RequestOptions {
                endpoint: None,
                model: None,
                output_len: OutputLen::Recorded,
                stream: true,
                prompt_salt: 0,
                tokenizer: None,
                headers: Vec::new(),
                api_key: None,
                timeout: Duration::from_secs(600),
                ca_cert: None,
                connect_timeout: Duration::from_secs(10),
                pool_idle_timeout: Duration::from_secs(4),
                traceparent: true,
            },
            preconnect: true,
            num_warmups: 0,
            seed: 0,
            goodput: Vec::new(),
            slo_percentile: 95.0,
            percentile_metrics: vec![
                PercentileMetric::Ttft,
                PercentileMetric::Tpot,
                PercentileMetric::Itl,
                PercentileMetric::E2el,
            ],
            metric_percentiles: vec![50.0, 95.0, 99.0],
            cooldown: Duration::ZERO,
            progress: false,
            client_threads: 0,
            label: None,
            metadata: Vec::new(),
            server_metrics: false,
            soak: Soak::default(),
            start_at_us: None,
            keep_rows: true,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            lookahead: Lookahead::default(),
        }
    }

    /// Checks values that flags alone cannot (ranges and combinations) and returns the
    /// checked configuration, which cannot be changed.
    ///
    /// Not checked here: whether a `--metadata` key collides with a key of the result (the
    /// result's business, `report::is_result_key`), and whether `--start-at` is already past
    /// (a question of the wall clock, not of the values); the binary checks both where it
    /// reads the flags, and a run refuses a start time that passed while it was prepared.
    pub fn validate(&self) -> Result<ValidatedConfig, ReplayError> {
        let bad = |m: String| Err(ReplayError::Config(m));
        if self.targets.is_empty() {
            return bad("no target".into());
        }
        let mut names: Vec<&str> = self.targets.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        if names.len() != self.targets.len() {
            return bad("two targets share a name; name them with NAME=URL".into());
        }
        match self.arrivals {
            Arrivals::Recorded { speedup } if !(speedup.is_finite() && speedup > 0.0) => {
                return bad(format!("--speedup {speedup}: must be a positive number"))
            }
            Arrivals::Rate { rate, burstiness } => {
                if rate.is_nan() || rate <= 0.0 {
                    return bad(format!("--request-rate {rate}: must be positive (or inf)"));
                }
                if !(burstiness.is_finite() && burstiness > 0.0) {
                    return bad(format!(
                        "--burstiness {burstiness}: must be a positive number"
                    ));
                }
            }
            _ => {}
        }
        if let Some(r) = self.selection.sample_ratio {
            if !(r > 0.0 && r <= 1.0) {
                return bad(format!("--sample-ratio {r}: must be in (0, 1]"));
            }
        }
        if self.max_concurrency == Some(0) {
            return bad("--max-concurrency must be at least 1".into());
        }
        for p in &self.metric_percentiles {
            if !(*p > 0.0 && *p <= 100.0) {
                return bad(format!(
                    "--metric-percentiles: {p} is not a percentile in (0, 100]"
                ));
            }
        }
        if self.request.timeout.is_zero() {
            return bad("--timeout must be positive".into());
        }
        if self.soak.loops == Some(Loops::UntilDuration) && self.selection.duration.is_none() {
            return bad("--loop inf replays until --duration: give --duration (e.g. 1h)".into());
        }
        if self.soak.slice.is_some_and(|d| d.is_zero()) {
            return bad("--slice must be positive".into());
        }
        if self.lookahead.time.is_zero() || self.lookahead.bytes == 0 || self.lookahead.waiting == 0
        {
            return bad("the look-ahead must be positive (time, bytes and waiting)".into());
        }
        if self.start_at_us.is_some() && self.targets.len() > 1 {
            return bad("--start-at starts one run: give a single --target".into());
        }
        let endpoints = self
            .targets
            .iter()
            .map(|t| {
                Endpoint::parse(&t.url).map_err(|e| ReplayError::Config(format!("{}: {e}", t.url)))
            })
            .collect::<Result<_, _>>()?;
        Ok(ValidatedConfig {
            cfg: self.clone(),
            endpoints,
        })
    }
}

/// A [`ReplayConfig`] that passed [`ReplayConfig::validate`]: read-only (its fields are read
/// through `Deref`), so what was checked is what runs. To derive a variant, clone the
/// `ReplayConfig` (`(*cfg).clone()`), change it and validate it again.
#[derive(Debug, Clone)]
pub struct ValidatedConfig {
    cfg: ReplayConfig,
    /// Each target's parsed URL, in the order of `targets`.
    endpoints: Vec<Endpoint>,
}

impl ValidatedConfig {
    /// Where `target` (one of this configuration's) lives, as its URL was parsed.
    pub fn endpoint(&self, target: &Target) -> Result<&Endpoint, ReplayError> {
        self.cfg
            .targets
            .iter()
            .position(|t| t == target)
            .map(|i| &self.endpoints[i])
            .ok_or_else(|| ReplayError::Config(format!("target {} is not configured", target.name)))
    }
}

impl std::ops::Deref for ValidatedConfig {
    type Target = ReplayConfig;
    fn deref(&self) -> &ReplayConfig {
        &self.cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validation parses each target's URL once and keeps it: the client takes it from
    /// there, and a URL it cannot parse is refused before any run.
    #[test]
    fn validation_keeps_each_targets_parsed_url() {
        let targets: Vec<Target> = ["a=http://127.0.0.1:8000", "b=https://gw.example.com/team"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let v = ReplayConfig::new(targets.clone()).validate().unwrap();
        let b = v.endpoint(&targets[1]).unwrap();
        assert_eq!(
            (b.https, b.authority.as_str(), b.port, b.base_path.as_str()),
            (true, "gw.example.com", 443, "/team")
        );
        assert_eq!(v.endpoint(&targets[0]).unwrap().port, 8000);
        let other: Target = "c=http://h:1".parse().unwrap();
        assert!(v.endpoint(&other).is_err());
        let bad = Target {
            name: "x".into(),
            url: "http://".into(),
        };
        assert!(matches!(
            ReplayConfig::new(vec![bad]).validate(),
            Err(ReplayError::Config(_))
        ));
    }

    #[test]
    fn targets_parse_with_and_without_names() {
        let t: Target = "http://127.0.0.1:8000/v1/".parse().unwrap();
        assert_eq!(t.url, "http://127.0.0.1:8000");
        assert_eq!(t.name, "127.0.0.1:8000");
        let t: Target = "awq=https://h:1".parse().unwrap();
        assert_eq!((t.name.as_str(), t.url.as_str()), ("awq", "https://h:1"));
        assert!("localhost:8000".parse::<Target>().is_err());
        // A path that is not an endpoint is a prefix (a gateway's), kept.
        let t: Target = "https://gw.example.com/team-a/v1".parse().unwrap();
        assert_eq!(t.url, "https://gw.example.com/team-a");
    }

    /// Issue 39, finding 5: an endpoint URL as --target passed the probe, then every request
    /// went to `/v1/chat/completions/v1/chat/completions` (404).
    #[test]
    fn a_target_naming_an_endpoint_is_refused_with_its_base_url() {
        for (given, base) in [
            (
                "http://127.0.0.1:18001/v1/chat/completions",
                "--target http://127.0.0.1:18001 ",
            ),
            (
                "vllm=http://h:8000/v1/completions/",
                "--target vllm=http://h:8000 ",
            ),
            (
                "https://gw.example.com/team-a/v1/models",
                "--target https://gw.example.com/team-a ",
            ),
            ("http://h:8000/chat/completions", "--target http://h:8000 "),
        ] {
            let e = given.parse::<Target>().unwrap_err();
            assert!(e.contains("base URL") && e.contains(base), "{given}: {e}");
        }
        let e = "http://h:8000/?model=x".parse::<Target>().unwrap_err();
        assert!(e.contains("query"), "{e}");
    }

    #[test]
    fn slos_parse_and_reject_garbage() {
        let s: Slo = "ttft:500".parse().unwrap();
        assert_eq!((s.metric, s.limit_ms), (SloMetric::Ttft, 500.0));
        assert!("ttft".parse::<Slo>().is_err());
        assert!("foo:1".parse::<Slo>().is_err());
        assert!("tpot:-1".parse::<Slo>().is_err());
        assert!("tpot:abc".parse::<Slo>().is_err());
    }

    /// Regression: captured chat rows without a body were replayed as completions.
    #[test]
    fn built_requests_follow_the_row_endpoint_unless_forced() {
        let mut o = ReplayConfig::new(vec![]).request;
        for a in Api::ALL {
            assert_eq!(o.endpoint_for(a.default_path()), a);
        }
        assert_eq!(o.endpoint_for("/openai/v1/responses"), Api::Responses);
        assert_eq!(o.endpoint_for("/generate"), Api::Completions);
        o.endpoint = Some(EndpointKind::Chat);
        assert_eq!(o.endpoint_for("/v1/completions"), Api::Chat);
        assert_eq!(o.endpoint_for("/v1/messages"), Api::Chat);
        // A row that generates nothing stays what it is.
        assert_eq!(o.endpoint_for("/v1/embeddings"), Api::Embeddings);
        // Every generation API can be forced (and synthesized), by name or path.
        for (s, a) in [
            ("responses", Api::Responses),
            ("/v1/messages", Api::Messages),
            ("completions", Api::Completions),
        ] {
            o.endpoint = Some(s.parse().unwrap());
            assert_eq!(o.endpoint_for("/v1/chat/completions"), a, "{s}");
        }
        assert!("embeddings".parse::<EndpointKind>().is_err());
    }

    #[test]
    fn start_times_parse_as_rfc3339() {
        assert_eq!(
            parse_rfc3339_us("2026-01-02T03:04:05.5Z").unwrap(),
            1_767_323_045_500_000
        );
        assert_eq!(
            parse_rfc3339_us("2026-01-02T04:04:05.5+01:00").unwrap(),
            1_767_323_045_500_000
        );
        assert!(parse_rfc3339_us("tomorrow").is_err());
        let mut c = ReplayConfig::new(vec![
            "a=http://127.0.0.1:1".parse().unwrap(),
            "b=http://127.0.0.1:2".parse().unwrap(),
        ]);
        c.start_at_us = Some(1_767_323_045_500_000);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("single --target"));
        c.targets.pop();
        assert_eq!(c.validate().unwrap().start_at_us, c.start_at_us);
    }

    #[test]
    fn output_len_modes() {
        assert_eq!(
            "recorded".parse::<OutputLen>().unwrap(),
            OutputLen::Recorded
        );
        assert_eq!("128".parse::<OutputLen>().unwrap(), OutputLen::Fixed(128));
        assert!("0".parse::<OutputLen>().is_err());
        assert!("lots".parse::<OutputLen>().is_err());
    }
}
