//! A simulated OpenAI-compatible LLM server with no GPU, for testing `llmreplay` and for
//! demos: it speaks vLLM's OpenAI API (`/v1/completions`, `/v1/chat/completions`, streamed
//! and not, `/v1/models`, `/version`, `/health`, `/metrics` with vLLM's metric names), OpenAI
//! Responses (`/v1/responses`, with `previous_response_id`) and Anthropic Messages
//! (`/v1/messages`) as their references stream them, and embeddings, rerank and score answered
//! whole, and times its output with a model of a GPU serving engine.
//!
//! # Timing
//! - [`Timing::Engine`] runs a vLLM V1-like continuous-batching engine in real time (see
//!   [`engine`]): a waiting queue, `max_num_seqs` running sequences, a per-step token budget
//!   with chunked prefill, a paged KV cache with preemption, and a prefix cache. Latency is
//!   flat at low load and climbs past a knee, as on a GPU. [`Profile`] holds the engine's
//!   parameters; [`Profile::named`] gives built-in ones (`llama-3.1-8b-h100`, `tiny`).
//! - [`Timing::Fixed`] emits chunk `i` of every request at `t0 + ttft + i × itl`
//!   independently of load: a ground-truth server to check a client's measurements against.
//! - [`Timing::Slots`] serves `slots` requests at a time for a fixed service time each, the
//!   rest waiting first come first served: a server whose capacity is known exactly
//!   (`slots / service` requests per second), to test capacity answers against.
//! - [`Timing::Trace`] answers each request with a recorded trace row's timing, tokens and
//!   outcome, matched by request id, prompt or order ([`from_trace`]).
//!
//! # Tokenization
//! There is no real tokenizer: **one token per whitespace-separated word** of the prompt
//! (a completion `prompt` string or array of strings; a token-id array counts its length;
//! chat counts the words of every message's `content` string or text parts, with no chat
//! template overhead). The replay tool generates filler prompts of exactly N words, so
//! `usage.prompt_tokens` equals the intended length. Output tokens are words such as
//! `" lorem"` from a small fixed vocabulary, deterministic per request content and seed.
//!
//! # Output length
//! With `ignore_eos: true` a request generates exactly `max_tokens` tokens
//! (`finish_reason: "length"`); otherwise a pseudo-random length in `[1, max_tokens]` fixed by
//! the request content and [`SimConfig::seed`] (`"stop"` when shorter than `max_tokens`).
//! `max_tokens` defaults to 16 for completions and 256 for chat (`max_completion_tokens`
//! takes precedence for chat). Each content chunk carries
//! [`SimConfig::tokens_per_chunk`] tokens (the last may carry fewer), as with speculative
//! decoding; `usage` still counts tokens.
//!
//! # Responses, Messages, tool calls
//! Responses and Messages answers carry the same tokens as chat's, as their typed events
//! (`typed.rs`): reasoning first (when [`SimConfig::reasoning`] draws it), then the answer.
//! A Responses answer is kept (unless the request says `store: false`; bounded, oldest
//! forgotten first) so a later request naming it in `previous_response_id` is prefilled on
//! the whole conversation; an id the sim did not issue, or forgot, is answered 404. With
//! [`SimConfig::tool_calls`], a Responses or Messages request that offers tools and does not
//! end with a tool's result calls the first tool (drawn per request content and seed): its
//! answer tokens are the call's arguments (`{"input":"…"}`), streamed as
//! `function_call_arguments.delta` / `input_json_delta`.
//!
//! # Models
//! With [`SimConfig::served_models`], a request naming another model is answered 404, as
//! vLLM answers it; otherwise any model name is accepted.
//!
//! # Faults
//! By rate ([`Faults`], seeded) or forced per request with the header
//! `x-sim-fault: error|rate-limit|reset|stall`: `error` answers 500, `rate-limit` 429 with
//! `Retry-After`, `reset` streams a few chunks and then drops the connection (no `[DONE]`),
//! `stall` sends the headers and then nothing for [`Faults::stall`].
#![deny(missing_docs)]

mod apis;
pub mod engine;
pub mod engine_metrics;
pub mod from_trace;
pub mod groundtruth;
mod openai;
mod output;
pub mod profile;
mod server;
mod slots;
pub mod store;
pub mod tokens;
mod typed;
mod writer;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub use engine::{Emit, Engine};
pub use engine_metrics::{FinishReason, Metrics, MetricsSnapshot};
pub use profile::Profile;

/// Configuration of a simulated server.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// How output is timed.
    pub timing: Timing,
    /// Tokens per SSE content chunk (>= 1; default 1).
    pub tokens_per_chunk: u32,
    /// Seed for output lengths, output text and fault draws.
    pub seed: u64,
    /// Injected faults.
    pub faults: Faults,
    /// Model name reported by `/v1/models`, in responses and as the metrics label
    /// (default `"llmreplay-sim"`). Requests may name any model.
    pub model_name: String,
    /// Chat, Responses and Messages requests that reason before they answer
    /// ([`Reasoning`]; none by default).
    pub reasoning: Reasoning,
    /// The only model names requests may name, listed by `/v1/models` (another is answered
    /// 404, as vLLM answers it); empty (the default): any name, `model_name` listed.
    pub served_models: Vec<String>,
    /// Share of Responses and Messages requests offering tools (and not ending with a tool's
    /// result) whose answer is a call of the first tool, in `[0, 1]` (default 0).
    pub tool_calls: f64,
}

/// A reasoning model's output, simulated: for a share of chat requests (drawn per request
/// content and seed), the first part of the output tokens is reasoning, streamed as
/// `delta.reasoning_content` (vLLM's reasoning parser's field) and answered whole as
/// `message.reasoning_content`, before the answer's `content`. Like vLLM's, its `usage`
/// does not count the reasoning apart unless [`Reasoning::details`] asks for OpenAI's
/// `completion_tokens_details.reasoning_tokens`. The reasoning of a request
/// of `n` output tokens is `round(n × fraction)` tokens, leaving at least one answer token
/// (none when `n` is 1). Timing is unchanged: the answer's first token is the reasoning's
/// count of tokens after the first token.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reasoning {
    /// Share of chat requests that reason, in `[0, 1]`.
    pub share: f64,
    /// Share of a reasoning request's output tokens that are reasoning, in `[0, 1]`.
    pub fraction: f64,
    /// `usage` reports the reasoning tokens (`completion_tokens_details.reasoning_tokens`),
    /// as OpenAI's API does; vLLM's does not.
    pub details: bool,
}

impl Reasoning {
    /// Reasoning tokens of a chat request whose content hash is `content` and whose output
    /// is `target` tokens, under `seed`.
    pub fn tokens(&self, seed: u64, content: u64, target: u32) -> u32 {
        if self.share <= 0.0 || target < 2 {
            return 0;
        }
        let draw = tokens::mix(seed ^ content ^ 0x7265_6173_6f6e) as f64 / u64::MAX as f64;
        if draw >= self.share {
            return 0;
        }
        ((f64::from(target) * self.fraction).round() as u32).min(target - 1)
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            timing: Timing::Engine(Profile::default()),
            tokens_per_chunk: 1,
            seed: 0,
            faults: Faults::default(),
            model_name: "llmreplay-sim".into(),
            reasoning: Reasoning::default(),
            served_models: Vec::new(),
            tool_calls: 0.0,
        }
    }
}

/// How the simulated server times its output.
#[derive(Debug, Clone)]
pub enum Timing {
    /// A continuous-batching engine model with these parameters.
    Engine(Profile),
    /// Every request independently: first chunk at `t0 + ttft`, chunk `i` at
    /// `t0 + ttft + i × itl` (absolute deadlines; `t0` = request handled).
    Fixed {
        /// Time to the first chunk.
        ttft: Duration,
        /// Time between chunks.
        itl: Duration,
    },
    /// A server of known capacity: `slots` requests at a time, each holding its slot for
    /// `service` (its chunks spread evenly over it, the last at the end); requests beyond
    /// `slots` wait, first come first served. Capacity: exactly `slots / service` req/s.
    Slots {
        /// Requests served at a time (≥ 1).
        slots: u32,
        /// Time each request holds its slot (> 0).
        service: Duration,
    },
    /// Each request answered with a recorded row's timing, tokens and outcome
    /// ([`from_trace`]: `llmreplay sim --from-trace`).
    Trace(Arc<from_trace::TraceMock>),
}

/// Fault injection rates (each in `[0, 1]`, summing to at most 1), drawn per request from a
/// RNG seeded with [`SimConfig::seed`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Fraction of requests answered with 500.
    pub error_rate: f64,
    /// Fraction of requests answered with 429 and `Retry-After`.
    pub rate_limit_rate: f64,
    /// `Retry-After` seconds of a 429 (0 is sent as 1).
    pub retry_after_secs: u32,
    /// Fraction of requests whose connection is dropped after a few chunks.
    pub reset_rate: f64,
    /// Fraction of requests that send headers and then stall.
    pub stall_rate: f64,
    /// How long a stall lasts before the response proceeds (zero means one hour).
    pub stall: Duration,
}

/// Errors of the simulated server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The configuration is invalid.
    #[error("invalid simulator configuration: {0}")]
    Config(String),
    /// The listening socket could not be bound.
    #[error("cannot bind {addr}: {cause}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// The underlying error (in the message, so not also a `source`: a chain printer
        /// such as anyhow's would print it twice).
        cause: std::io::Error,
    },
    /// Other I/O error on the listener.
    #[error("listener I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// A running simulated server (from [`start`]).
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), SimError>>,
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:8000`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, drains in-flight responses for up to a second, and waits for the
    /// server to end.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(());
        let _ = self.task.await;
    }
}

/// Binds `addr` (port 0 picks a free port) and serves on the current tokio runtime until
/// [`SimHandle::shutdown`].
pub async fn start(addr: SocketAddr, cfg: SimConfig) -> Result<SimHandle, SimError> {
    server::validate(&cfg)?;
    let listener = wire::listen::bind(addr).map_err(|cause| SimError::Bind { addr, cause })?;
    let addr = listener.local_addr()?;
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, cfg, async move {
        let _ = rx.await;
    }));
    Ok(SimHandle {
        addr,
        shutdown: tx,
        task,
    })
}

/// Serves HTTP/1.1 and h2c (prior knowledge) on `listener` until `shutdown` completes, then
/// drains in-flight responses for up to a second.
pub async fn serve(
    listener: TcpListener,
    cfg: SimConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    server::serve(listener, cfg, shutdown).await
}
