//! The trace schema v1: one row per request, defined once.
//!
//! Versions: `1.0`; `1.1` added `parent_request_id` and `think_time_us` (sessions linked at
//! capture); `1.2` added `captured_status`, `captured_outcome` and `synthesized_body` (what a
//! replayed row's captured row was, for the outcome taxonomy in [`crate::cause`]); `1.3` added
//! `trace_id` and `span_id` (the W3C trace context the upstream received, [`crate::tracectx`]);
//! `1.4` added reasoning measured apart (`ttfat_us`, `reasoning_tokens`,
//! `reasoning_tokens_source`), tools and agent structure (`tools_offered`, `tool_names`,
//! `tool_calls`, `tool_call_names`, `parent_link`) and shadow pairs (`pair_request_id`);
//! `1.5` added the prompt's cached part (`cached_tokens`), its images and audio (`images`,
//! `image_bytes`, `image_dims`, `audio_inputs`, `audio_bytes`) and the parent link
//! `previous_response` (Responses and Anthropic Messages recorded as chat is); `1.6` added
//! where a row was captured (`capture_id`, `capture_started`) and the link keys
//! (`link_*`: what capture's linkers look up and leave, keyed, so a pass over the rows of
//! several captures links them as one capture would: [`crate::fleet`]).
//! A minor version only adds nullable columns, so every `1.x` file reads: a column
//! the file lacks reads as null.
//!
//! Captures, imports, synthetic traces and replay results all use this schema, so the same
//! SQL answers questions about production and about a candidate, and the two join on
//! `request_id`. Column names are constants here; [`schema`] builds the Arrow schema from
//! them and nothing else spells a column name.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, TimeUnit};
use serde::{Deserialize, Serialize};

/// The schema version written into every file (`llmreplay.schema_version`).
///
/// Readers accept any `1.x`; a different major version is an error.
pub const SCHEMA_VERSION: &str = "1.6";
/// The major version this build reads.
pub const SCHEMA_MAJOR: u32 = 1;

/// Names of the columns, as users write them in SQL.
pub mod col {
    /// Unique per request (utf8).
    pub const REQUEST_ID: &str = "request_id";
    /// Conversation/session key when known (utf8, null).
    pub const SESSION_ID: &str = "session_id";
    /// The request this one continues in its session: its prompt carries that request's
    /// prompt and answer (utf8, null; since 1.1).
    pub const PARENT_REQUEST_ID: &str = "parent_request_id";
    /// This request's arrival minus the end of its parent's response, µs (int64, null;
    /// since 1.1).
    pub const THINK_TIME_US: &str = "think_time_us";
    /// When the request arrived (timestamp µs, UTC).
    pub const ARRIVAL_TIME: &str = "arrival_time";
    /// Request path, e.g. `/v1/chat/completions`.
    pub const ENDPOINT: &str = "endpoint";
    /// Model name (null when unknown).
    pub const MODEL: &str = "model";
    /// Whether the response was streamed.
    pub const STREAM: &str = "stream";
    /// Prompt tokens (null when unknown).
    pub const PROMPT_TOKENS: &str = "prompt_tokens";
    /// Output tokens (null when unknown).
    pub const OUTPUT_TOKENS: &str = "output_tokens";
    /// `max_tokens` asked for (null when absent).
    pub const MAX_TOKENS: &str = "max_tokens";
    /// Where `prompt_tokens` came from.
    pub const PROMPT_TOKENS_SOURCE: &str = "prompt_tokens_source";
    /// Where `output_tokens` came from.
    pub const OUTPUT_TOKENS_SOURCE: &str = "output_tokens_source";
    /// HTTP status (null when no response).
    pub const STATUS: &str = "status";
    /// `ok`, `http_error`, `upstream_error`, `client_cancelled`, `timeout`.
    pub const OUTCOME: &str = "outcome";
    /// Error text (null when none).
    pub const ERROR: &str = "error";
    /// Time to first token from t0, µs.
    pub const TTFT_US: &str = "ttft_us";
    /// End-to-end latency from t0, µs.
    pub const E2EL_US: &str = "e2el_us";
    /// Offset from t0 of every chunk, µs.
    pub const CHUNK_TIMES_US: &str = "chunk_times_us";
    /// Tokens in each chunk, when known.
    pub const CHUNK_TOKENS: &str = "chunk_tokens";
    /// The request JSON, only when recorded.
    pub const BODY: &str = "body";
    /// Hashes of consecutive prompt blocks, when computed.
    pub const PREFIX_HASHES: &str = "prefix_hashes";
    /// Bytes of the request body.
    pub const REQUEST_BYTES: &str = "request_bytes";
    /// Bytes of the response body.
    pub const RESPONSE_BYTES: &str = "response_bytes";
    /// Replay: the request's scheduled send offset from the run start, µs.
    pub const SCHEDULED_OFFSET_US: &str = "scheduled_offset_us";
    /// Replay: the client's own delay, µs: actual send − scheduled send − queue − connect.
    pub const DISPATCH_LAG_US: &str = "dispatch_lag_us";
    /// Replay: client queue time, µs: waiting for a `--max-concurrency` slot, or for the
    /// requests due at the same instant that were sent before it.
    pub const QUEUE_US: &str = "queue_us";
    /// Replay: whether the request opened a new connection.
    pub const NEW_CONNECTION: &str = "new_connection";
    /// Replay: time spent connecting when the connection was new, µs (not part of TTFT).
    pub const CONNECT_US: &str = "connect_us";
    /// Replay: the target's name; capture: a shadow row's candidate (`--shadow NAME=URL`),
    /// null on production rows.
    pub const TARGET: &str = "target";
    /// Replay: the run's id.
    pub const RUN_ID: &str = "run_id";
    /// Replay: the HTTP status of the captured row this request replays (int32, null when
    /// unknown; since 1.2).
    pub const CAPTURED_STATUS: &str = "captured_status";
    /// Replay: the outcome of the captured row this request replays (utf8, null when
    /// unknown; since 1.2).
    pub const CAPTURED_OUTCOME: &str = "captured_outcome";
    /// Replay: whether the request body was synthesized because the captured row had none
    /// (bool, null when unknown; since 1.2).
    pub const SYNTHESIZED_BODY: &str = "synthesized_body";
    /// The W3C trace id the upstream received with the request in its `traceparent` header,
    /// 32 lowercase hex digits (utf8, null when none was sent; since 1.3). A server's own
    /// spans for the request (vLLM's `--otlp-traces-endpoint`) carry the same trace id.
    pub const TRACE_ID: &str = "trace_id";
    /// The parent id of that `traceparent`, 16 lowercase hex digits: the span the server's
    /// span is a child of (replay: its own client span; capture: the client's span, or the
    /// one capture started) (utf8, null when none was sent; since 1.3).
    pub const SPAN_ID: &str = "span_id";
    /// Time to first answer token from t0, µs: the first output chunk carrying answer
    /// output (`content`, `text` or a tool call) rather than reasoning only
    /// (`reasoning_content` / `reasoning`); equal to `ttft_us` when the response had no
    /// reasoning before its answer (int64, null when no answer arrived or it was not
    /// measured; since 1.4).
    pub const TTFAT_US: &str = "ttfat_us";
    /// Reasoning tokens of the output, part of `output_tokens`: the answer's tokens are
    /// `output_tokens - reasoning_tokens` (int64, null when unknown; 0 when the response
    /// had no reasoning; since 1.4).
    pub const REASONING_TOKENS: &str = "reasoning_tokens";
    /// Where `reasoning_tokens` came from (`usage`:
    /// `usage.completion_tokens_details.reasoning_tokens`; `tokenizer`: the reasoning text
    /// counted; `recorded`, `estimate`) (utf8, null when unknown; since 1.4).
    pub const REASONING_TOKENS_SOURCE: &str = "reasoning_tokens_source";
    /// Tools the request offered (`tools`, or the legacy `functions`) (int32, null when
    /// unknown; 0 when none; since 1.4).
    pub const TOOLS_OFFERED: &str = "tools_offered";
    /// Names of the tools offered, in the request's order: the names when bodies are kept,
    /// else their hashes (`h:` and 16 hex digits) (list of utf8, null when unknown; since 1.4).
    pub const TOOL_NAMES: &str = "tool_names";
    /// Tool calls the response made (int32, null when unknown; since 1.4).
    pub const TOOL_CALLS: &str = "tool_calls";
    /// Names of the tool calls the response made, in order, named as in `tool_names` (list
    /// of utf8, null when unknown; since 1.4).
    pub const TOOL_CALL_NAMES: &str = "tool_call_names";
    /// How `parent_request_id` was found ([`ParentLink`]: `chat_prefix`, `tool_call`,
    /// `completion_prefix`, `subagent`, `recorded`; `previous_response` since 1.5) (utf8,
    /// null when there is no parent; since 1.4).
    pub const PARENT_LINK: &str = "parent_link";
    /// Shadow traffic: the `request_id` of the production request this row mirrors (its
    /// `target` names the candidate) (utf8, null for a row that is no shadow; since 1.4).
    pub const PAIR_REQUEST_ID: &str = "pair_request_id";
    /// The part of `prompt_tokens` the server read from its prefix cache, as its usage
    /// reports it (`prompt_tokens_details.cached_tokens`, Responses'
    /// `input_tokens_details.cached_tokens`, Messages' `cache_read_input_tokens`) (int64,
    /// null when not reported; since 1.5).
    pub const CACHED_TOKENS: &str = "cached_tokens";
    /// Images in the prompt (chat `image_url` parts, Responses `input_image`, Messages
    /// `image` blocks) (int32, null when the body was not read; 0 when none; since 1.5).
    pub const IMAGES: &str = "images";
    /// Bytes of the prompt's images as sent: the decoded bytes of inline (base64) images, 0
    /// for an image given by URL (int64, null when the body was not read; since 1.5).
    pub const IMAGE_BYTES: &str = "image_bytes";
    /// Each image's pixel size, `WxH`, where its PNG, JPEG, GIF or WebP header gives it;
    /// `""` otherwise (an image by URL) (list of utf8, null when the body was not read;
    /// since 1.5).
    pub const IMAGE_DIMS: &str = "image_dims";
    /// Audio inputs in the prompt (chat `input_audio` parts) (int32, null when the body was
    /// not read; since 1.5).
    pub const AUDIO_INPUTS: &str = "audio_inputs";
    /// Decoded bytes of the prompt's audio inputs (int64, null when the body was not read;
    /// since 1.5).
    pub const AUDIO_BYTES: &str = "audio_bytes";
    /// Replay: how long the request was held past the time it was otherwise due because its
    /// parent had not answered yet, µs (a Responses turn needs its parent's id on the
    /// candidate; closed mode waits for every turn's predecessor): not latency, not dispatch
    /// lag, not queue time (int64, null for a row that waits for no parent; since 1.5).
    pub const PARENT_WAIT_US: &str = "parent_wait_us";
    /// Capture: which capture process wrote the row: its `--capture-id`, else the pod name
    /// (`POD_NAME`, or `HOSTNAME` inside Kubernetes), else `host:port` of its listener (utf8,
    /// null for rows no capture wrote; since 1.6).
    pub const CAPTURE_ID: &str = "capture_id";
    /// Capture: when that capture process started (timestamp µs, UTC; with `capture_id` it
    /// names one run of one capture; since 1.6).
    pub const CAPTURE_STARTED: &str = "capture_started";
    /// Link key: the keys this chat row looks up for its parent, the chained hash of its
    /// messages up to each `assistant` message, oldest first (the last found wins) (list of
    /// uint64, keyed; empty for a chat row without an answer in its history; null for a row
    /// that is not chat-shaped, or under `perf`; since 1.6).
    pub const LINK_CHAT_KEYS: &str = "link_chat_keys";
    /// Link key: the key this row leaves for the turn that continues it: its chain continued
    /// by its answer, as that turn's `link_chat_keys` will hold it (uint64, keyed; null when
    /// not ok or no answer; since 1.6).
    pub const LINK_ANSWER_KEY: &str = "link_answer_key";
    /// Link key: the ids of the tool calls this row's response made (list of uint64, keyed;
    /// since 1.6).
    pub const LINK_CALL_KEYS: &str = "link_call_keys";
    /// Link key: the string values (≥ 8 bytes) of those calls' arguments, that a sub-agent
    /// opens with (list of uint64, keyed; since 1.6).
    pub const LINK_ARG_KEYS: &str = "link_arg_keys";
    /// Link key: the `tool_call_id` whose results this row carries (uint64, keyed; since 1.6).
    pub const LINK_RESULT_KEY: &str = "link_result_key";
    /// Link key: the first user message of a conversation opening here (uint64, keyed;
    /// since 1.6).
    pub const LINK_OPENING_KEY: &str = "link_opening_key";
    /// Link key: who sent the row (peer address and API credentials) (uint64, keyed; since
    /// 1.6).
    pub const LINK_CLIENT_KEY: &str = "link_client_key";
    /// Link key: the id of this row's Responses response (uint64, keyed; since 1.6).
    pub const LINK_RESPONSE_KEY: &str = "link_response_key";
    /// Link key: the `previous_response_id` this row names (uint64, keyed; since 1.6).
    pub const LINK_PREVIOUS_RESPONSE_KEY: &str = "link_previous_response_key";
}

/// Key-value metadata keys written into every file.
pub mod meta {
    /// Schema version, e.g. `1.0`.
    pub const SCHEMA_VERSION: &str = "llmreplay.schema_version";
    /// `capture`, `import`, `replay`, `synth`.
    pub const PRODUCER: &str = "llmreplay.producer";
    /// Version of the tool that wrote the file.
    pub const TOOL_VERSION: &str = "llmreplay.tool_version";
    /// The producing command line.
    pub const COMMAND: &str = "llmreplay.command";
    /// For imports: the source file(s) and format.
    pub const SOURCE: &str = "llmreplay.source";
    /// Block size of `prefix_hashes`, in tokens.
    pub const BLOCK_SIZE: &str = "llmreplay.block_size";
    /// Prefix of free-form provenance keys (`--metadata K=V`, target info).
    pub const EXTRA_PREFIX: &str = "llmreplay.meta.";
    /// The file's first and last arrival and its disorder, measured as it was written
    /// ([`crate::order::FileOrder`], JSON): what a reader knows from the footer alone.
    pub const ARRIVAL_ORDER: &str = "llmreplay.arrival_order";
    /// A capture's privacy manifest ([`crate::privacy::Manifest`], JSON).
    pub const PRIVACY: &str = "llmreplay.privacy";
    /// The captures whose rows the file holds: each one's id, start and clock offset (a
    /// JSON list of [`crate::fleet::CaptureInfo`]; one for a capture's own file).
    pub const CAPTURES: &str = "llmreplay.captures";
}

/// Which program wrote a trace file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Producer {
    /// `llmreplay capture`.
    Capture,
    /// `llmreplay import`.
    Import,
    /// `llmreplay replay` results.
    Replay,
    /// `llmreplay synth`.
    Synth,
    /// Another tool (pandas, Polars, DuckDB, Spark) wrote the file from llmreplay's columns
    /// without llmreplay's metadata: only ever read, never written by llmreplay.
    External,
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A complete 2xx response.
    Ok,
    /// The server answered with a non-2xx status.
    HttpError,
    /// Connection refused or reset, a truncated or malformed stream.
    UpstreamError,
    /// The client went away before the response ended.
    ClientCancelled,
    /// No complete answer within the timeout.
    Timeout,
}

impl Outcome {
    /// A request's E2EL, µs after its write, by the one rule capture and replay record it
    /// with: its last chunk of any kind (as vLLM's client times it); without a chunk,
    /// `ended_us` when the response ended as it should (`ok`, or an HTTP error read whole) or
    /// when the client cancelled (a replay cancels it at that point again); none when it was
    /// cut, timed out or failed, for it did not end.
    pub fn e2el_us(self, last_chunk_us: Option<i64>, ended_us: i64) -> Option<i64> {
        last_chunk_us.or_else(|| {
            matches!(
                self,
                Outcome::Ok | Outcome::HttpError | Outcome::ClientCancelled
            )
            .then_some(ended_us)
        })
    }
}

/// Where a token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage` field.
    Usage,
    /// Counted with the configured tokenizer.
    Tokenizer,
    /// Taken from an imported trace.
    Recorded,
    /// An estimate (e.g. chunk count or bytes); not exact.
    Estimate,
}

macro_rules! str_enum {
    ($t:ty { $($v:ident => $s:literal),* $(,)? }) => {
        impl $t {
            /// The name stored in trace files.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),* }
            }
            /// Every value, in declaration order.
            pub const ALL: &'static [$t] = &[$(Self::$v),*];
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($s => Ok(Self::$v),)*
                    other => Err(format!(
                        "unknown {} {other:?} (expected one of: {})",
                        stringify!($t),
                        [$($s),*].join(", ")
                    )),
                }
            }
        }
    };
}

str_enum!(Producer { Capture => "capture", Import => "import", Replay => "replay", Synth => "synth", External => "external" });
str_enum!(Outcome {
    Ok => "ok",
    HttpError => "http_error",
    UpstreamError => "upstream_error",
    ClientCancelled => "client_cancelled",
    Timeout => "timeout",
});
/// The outcome of the response verdict capture and replay share ([`wire::response_verdict`]): the
/// same variant, so the names written to traces are this file's.
impl From<wire::response_verdict::Outcome> for Outcome {
    fn from(o: wire::response_verdict::Outcome) -> Outcome {
        use wire::response_verdict::Outcome as V;
        match o {
            V::Ok => Outcome::Ok,
            V::HttpError => Outcome::HttpError,
            V::UpstreamError => Outcome::UpstreamError,
            V::ClientCancelled => Outcome::ClientCancelled,
            V::Timeout => Outcome::Timeout,
        }
    }
}

/// How a row's `parent_request_id` was found (schema 1.4's `parent_link`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParentLink {
    /// A chat prompt that carries the parent's messages and answer (capture's linker).
    ChatPrefix,
    /// The request carries `tool` results for calls the parent's response made, matched
    /// exactly by `tool_call_id`.
    ToolCall,
    /// A completions prompt that starts with the parent's prompt and answer.
    CompletionPrefix,
    /// The first request of a sub-agent's conversation, started while the parent's tool
    /// call was pending.
    Subagent,
    /// Taken from an imported trace, or named by the client (a session header).
    Recorded,
    /// A Responses turn whose `previous_response_id` names the parent's response: the
    /// server holds the conversation, so a replay must send it after its parent answered,
    /// naming the id the candidate gave the parent.
    PreviousResponse,
}

str_enum!(ParentLink {
    ChatPrefix => "chat_prefix",
    ToolCall => "tool_call",
    CompletionPrefix => "completion_prefix",
    Subagent => "subagent",
    Recorded => "recorded",
    PreviousResponse => "previous_response",
});

str_enum!(TokenSource { Usage => "usage", Tokenizer => "tokenizer", Recorded => "recorded", Estimate => "estimate" });

/// One request: one row of a trace file.
///
/// Times are integer microseconds so nothing is lost to rounding; `arrival_time_us` is
/// microseconds since the Unix epoch (UTC), every other `_us` field is an offset from t0
/// (see docs/metrics.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Unique per request.
    pub request_id: String,
    /// Conversation/session key when known.
    pub session_id: Option<String>,
    /// The request this one continues in its session (since schema 1.1).
    #[serde(default)]
    pub parent_request_id: Option<String>,
    /// This request's arrival minus the end of its parent's response, µs (since 1.1).
    #[serde(default)]
    pub think_time_us: Option<i64>,
    /// Arrival (capture) or send (replay) time, µs since the Unix epoch, UTC.
    pub arrival_time_us: i64,
    /// Request path.
    pub endpoint: String,
    /// Model name.
    pub model: Option<String>,
    /// Whether the response is streamed.
    pub stream: bool,
    /// Prompt tokens.
    pub prompt_tokens: Option<i64>,
    /// Output tokens.
    pub output_tokens: Option<i64>,
    /// `max_tokens` of the request.
    pub max_tokens: Option<i64>,
    /// Where `prompt_tokens` came from (null when unknown).
    pub prompt_tokens_source: Option<TokenSource>,
    /// Where `output_tokens` came from (null when unknown).
    pub output_tokens_source: Option<TokenSource>,
    /// HTTP status.
    pub status: Option<u16>,
    /// What became of the request.
    pub outcome: Outcome,
    /// Error text.
    pub error: Option<String>,
    /// Time to first chunk from t0, µs.
    pub ttft_us: Option<i64>,
    /// End-to-end latency from t0, µs.
    pub e2el_us: Option<i64>,
    /// Offset from t0 of every chunk, µs.
    pub chunk_times_us: Vec<i64>,
    /// Tokens in each chunk, when known.
    pub chunk_tokens: Option<Vec<i32>>,
    /// The request JSON, only when recorded.
    pub body: Option<String>,
    /// Hashes of consecutive prompt blocks.
    pub prefix_hashes: Option<Vec<u64>>,
    /// Request body bytes.
    pub request_bytes: i64,
    /// Response body bytes.
    pub response_bytes: i64,
    /// Replay: scheduled send offset from the run start, µs.
    pub scheduled_offset_us: Option<i64>,
    /// Replay: the client's own delay, µs: actual send − scheduled send − queue − connect.
    pub dispatch_lag_us: Option<i64>,
    /// Replay: client queue time, µs: waiting for a concurrency slot, or for the requests
    /// due at the same instant that were sent before it.
    pub queue_us: Option<i64>,
    /// Replay: whether the request's connection was new.
    pub new_connection: Option<bool>,
    /// Replay: time spent connecting, µs (not part of TTFT).
    pub connect_us: Option<i64>,
    /// Replay: the target's name; capture: a shadow row's candidate (`--shadow NAME=URL`),
    /// null on production rows.
    pub target: Option<String>,
    /// Replay: the run's id.
    pub run_id: Option<String>,
    /// Replay: the HTTP status of the captured row (since 1.2).
    #[serde(default)]
    pub captured_status: Option<u16>,
    /// Replay: the outcome of the captured row (since 1.2).
    #[serde(default)]
    pub captured_outcome: Option<Outcome>,
    /// Replay: whether the body sent was synthesized (the captured row had none; since 1.2).
    #[serde(default)]
    pub synthesized_body: Option<bool>,
    /// The W3C trace id sent upstream in `traceparent`, 32 hex digits (since 1.3).
    #[serde(default)]
    pub trace_id: Option<String>,
    /// The parent id of that `traceparent`, 16 hex digits (since 1.3).
    #[serde(default)]
    pub span_id: Option<String>,
    /// Time to first answer token from t0, µs (since 1.4).
    #[serde(default)]
    pub ttfat_us: Option<i64>,
    /// Reasoning tokens, part of `output_tokens` (since 1.4).
    #[serde(default)]
    pub reasoning_tokens: Option<i64>,
    /// Where `reasoning_tokens` came from (since 1.4).
    #[serde(default)]
    pub reasoning_tokens_source: Option<TokenSource>,
    /// Tools the request offered (since 1.4).
    #[serde(default)]
    pub tools_offered: Option<i32>,
    /// Names (or hashes) of the tools offered (since 1.4).
    #[serde(default)]
    pub tool_names: Option<Vec<String>>,
    /// Tool calls the response made (since 1.4).
    #[serde(default)]
    pub tool_calls: Option<i32>,
    /// Names (or hashes) of the tool calls made (since 1.4).
    #[serde(default)]
    pub tool_call_names: Option<Vec<String>>,
    /// How `parent_request_id` was found (since 1.4).
    #[serde(default)]
    pub parent_link: Option<ParentLink>,
    /// Shadow: the production request this row mirrors (since 1.4).
    #[serde(default)]
    pub pair_request_id: Option<String>,
    /// The part of the prompt read from the server's cache, from its usage (since 1.5).
    #[serde(default)]
    pub cached_tokens: Option<i64>,
    /// Images in the prompt (since 1.5).
    #[serde(default)]
    pub images: Option<i32>,
    /// Bytes of the prompt's inline images (since 1.5).
    #[serde(default)]
    pub image_bytes: Option<i64>,
    /// `WxH` of each image where its header gives it, else `""` (since 1.5).
    #[serde(default)]
    pub image_dims: Option<Vec<String>>,
    /// Audio inputs in the prompt (since 1.5).
    #[serde(default)]
    pub audio_inputs: Option<i32>,
    /// Bytes of the prompt's audio inputs (since 1.5).
    #[serde(default)]
    pub audio_bytes: Option<i64>,
    /// Replay: time held waiting for its parent's answer, µs (since 1.5).
    #[serde(default)]
    pub parent_wait_us: Option<i64>,
    /// The capture process that wrote the row (since 1.6).
    #[serde(default)]
    pub capture_id: Option<String>,
    /// When that capture process started, µs since the epoch (since 1.6).
    #[serde(default)]
    pub capture_started_us: Option<i64>,
    /// The link keys (`link_*` columns, since 1.6).
    #[serde(default)]
    pub link_keys: crate::fleet::LinkKeys,
}

impl TraceRecord {
    /// A record with the given identity and every optional field empty.
    pub fn new(
        request_id: impl Into<String>,
        arrival_time_us: i64,
        endpoint: impl Into<String>,
    ) -> Self {
        TraceRecord {
            request_id: request_id.into(),
            session_id: None,
            parent_request_id: None,
            think_time_us: None,
            arrival_time_us,
            endpoint: endpoint.into(),
            model: None,
            stream: false,
            prompt_tokens: None,
            output_tokens: None,
            max_tokens: None,
            prompt_tokens_source: None,
            output_tokens_source: None,
            status: None,
            outcome: Outcome::Ok,
            error: None,
            ttft_us: None,
            e2el_us: None,
            chunk_times_us: Vec::new(),
            chunk_tokens: None,
            body: None,
            prefix_hashes: None,
            request_bytes: 0,
            response_bytes: 0,
            scheduled_offset_us: None,
            dispatch_lag_us: None,
            queue_us: None,
            new_connection: None,
            connect_us: None,
            target: None,
            run_id: None,
            captured_status: None,
            captured_outcome: None,
            synthesized_body: None,
            trace_id: None,
            span_id: None,
            ttfat_us: None,
            reasoning_tokens: None,
            reasoning_tokens_source: None,
            tools_offered: None,
            tool_names: None,
            tool_calls: None,
            tool_call_names: None,
            parent_link: None,
            pair_request_id: None,
            cached_tokens: None,
            images: None,
            image_bytes: None,
            image_dims: None,
            audio_inputs: None,
            audio_bytes: None,
            parent_wait_us: None,
            capture_id: None,
            capture_started_us: None,
            link_keys: crate::fleet::LinkKeys::default(),
        }
    }

    /// A rough size in bytes, for rotation by size.
    pub fn approx_bytes(&self) -> usize {
        128 + self.request_id.len()
            + self.endpoint.len()
            + self.session_id.as_ref().map_or(0, String::len)
            + self.parent_request_id.as_ref().map_or(0, String::len)
            + self.model.as_ref().map_or(0, String::len)
            + self.error.as_ref().map_or(0, String::len)
            + self.body.as_ref().map_or(0, String::len)
            + self.chunk_times_us.len() * 8
            + self.chunk_tokens.as_ref().map_or(0, |v| v.len() * 4)
            + self.prefix_hashes.as_ref().map_or(0, |v| v.len() * 8)
            + self.trace_id.as_ref().map_or(0, String::len)
            + self.span_id.as_ref().map_or(0, String::len)
            + names_bytes(&self.tool_names)
            + names_bytes(&self.tool_call_names)
            + self.pair_request_id.as_ref().map_or(0, String::len)
            + names_bytes(&self.image_dims)
            + self.capture_id.as_ref().map_or(0, String::len)
            + self.link_keys.approx_bytes()
    }
}

fn names_bytes(names: &Option<Vec<String>>) -> usize {
    names
        .as_ref()
        .map_or(0, |v| v.iter().map(|s| s.len() + 16).sum())
}

/// The columns each minor version added (`1.0` has the rest): what a file's version is
/// inferred from when it carries our columns but not our metadata (written back by pandas,
/// Polars, DuckDB or Spark).
pub const COLUMNS_SINCE: &[(&str, &[&str])] = {
    use col::*;
    &[
        ("1.1", &[PARENT_REQUEST_ID, THINK_TIME_US]),
        (
            "1.2",
            &[CAPTURED_STATUS, CAPTURED_OUTCOME, SYNTHESIZED_BODY],
        ),
        ("1.3", &[TRACE_ID, SPAN_ID]),
        (
            "1.4",
            &[
                TTFAT_US,
                REASONING_TOKENS,
                REASONING_TOKENS_SOURCE,
                TOOLS_OFFERED,
                TOOL_NAMES,
                TOOL_CALLS,
                TOOL_CALL_NAMES,
                PARENT_LINK,
                PAIR_REQUEST_ID,
            ],
        ),
        (
            "1.5",
            &[
                CACHED_TOKENS,
                IMAGES,
                IMAGE_BYTES,
                IMAGE_DIMS,
                AUDIO_INPUTS,
                AUDIO_BYTES,
                PARENT_WAIT_US,
            ],
        ),
        (
            "1.6",
            &[
                CAPTURE_ID,
                CAPTURE_STARTED,
                LINK_CHAT_KEYS,
                LINK_ANSWER_KEY,
                LINK_CALL_KEYS,
                LINK_ARG_KEYS,
                LINK_RESULT_KEY,
                LINK_OPENING_KEY,
                LINK_CLIENT_KEY,
                LINK_RESPONSE_KEY,
                LINK_PREVIOUS_RESPONSE_KEY,
            ],
        ),
    ]
};

/// The schema version of a file with these columns and no version in its metadata: the
/// latest minor version that added one of them (`1.0` when none).
pub fn version_of_columns<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> &'static str {
    COLUMNS_SINCE
        .iter()
        .rev()
        .find(|(_, added)| names.clone().into_iter().any(|n| added.contains(&n)))
        .map_or("1.0", |(v, _)| *v)
}

/// The Arrow schema of trace files (without file metadata).
pub fn schema() -> Schema {
    use col::*;
    let list_of = |dt: DataType| DataType::List(Arc::new(Field::new("item", dt, true)));
    Schema::new(vec![
        Field::new(REQUEST_ID, DataType::Utf8, false),
        Field::new(SESSION_ID, DataType::Utf8, true),
        Field::new(PARENT_REQUEST_ID, DataType::Utf8, true),
        Field::new(THINK_TIME_US, DataType::Int64, true),
        Field::new(
            ARRIVAL_TIME,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new(ENDPOINT, DataType::Utf8, false),
        Field::new(MODEL, DataType::Utf8, true),
        Field::new(STREAM, DataType::Boolean, false),
        Field::new(PROMPT_TOKENS, DataType::Int64, true),
        Field::new(OUTPUT_TOKENS, DataType::Int64, true),
        Field::new(MAX_TOKENS, DataType::Int64, true),
        Field::new(PROMPT_TOKENS_SOURCE, DataType::Utf8, true),
        Field::new(OUTPUT_TOKENS_SOURCE, DataType::Utf8, true),
        Field::new(STATUS, DataType::Int32, true),
        Field::new(OUTCOME, DataType::Utf8, false),
        Field::new(ERROR, DataType::Utf8, true),
        Field::new(TTFT_US, DataType::Int64, true),
        Field::new(E2EL_US, DataType::Int64, true),
        Field::new(CHUNK_TIMES_US, list_of(DataType::Int64), false),
        Field::new(CHUNK_TOKENS, list_of(DataType::Int32), true),
        Field::new(BODY, DataType::Utf8, true),
        Field::new(PREFIX_HASHES, list_of(DataType::UInt64), true),
        Field::new(REQUEST_BYTES, DataType::Int64, false),
        Field::new(RESPONSE_BYTES, DataType::Int64, false),
        Field::new(SCHEDULED_OFFSET_US, DataType::Int64, true),
        Field::new(DISPATCH_LAG_US, DataType::Int64, true),
        Field::new(QUEUE_US, DataType::Int64, true),
        Field::new(NEW_CONNECTION, DataType::Boolean, true),
        Field::new(CONNECT_US, DataType::Int64, true),
        Field::new(TARGET, DataType::Utf8, true),
        Field::new(RUN_ID, DataType::Utf8, true),
        Field::new(CAPTURED_STATUS, DataType::Int32, true),
        Field::new(CAPTURED_OUTCOME, DataType::Utf8, true),
        Field::new(SYNTHESIZED_BODY, DataType::Boolean, true),
        Field::new(TRACE_ID, DataType::Utf8, true),
        Field::new(SPAN_ID, DataType::Utf8, true),
        Field::new(TTFAT_US, DataType::Int64, true),
        Field::new(REASONING_TOKENS, DataType::Int64, true),
        Field::new(REASONING_TOKENS_SOURCE, DataType::Utf8, true),
        Field::new(TOOLS_OFFERED, DataType::Int32, true),
        Field::new(TOOL_NAMES, list_of(DataType::Utf8), true),
        Field::new(TOOL_CALLS, DataType::Int32, true),
        Field::new(TOOL_CALL_NAMES, list_of(DataType::Utf8), true),
        Field::new(PARENT_LINK, DataType::Utf8, true),
        Field::new(PAIR_REQUEST_ID, DataType::Utf8, true),
        Field::new(CACHED_TOKENS, DataType::Int64, true),
        Field::new(IMAGES, DataType::Int32, true),
        Field::new(IMAGE_BYTES, DataType::Int64, true),
        Field::new(IMAGE_DIMS, list_of(DataType::Utf8), true),
        Field::new(AUDIO_INPUTS, DataType::Int32, true),
        Field::new(AUDIO_BYTES, DataType::Int64, true),
        Field::new(PARENT_WAIT_US, DataType::Int64, true),
        Field::new(CAPTURE_ID, DataType::Utf8, true),
        Field::new(
            CAPTURE_STARTED,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new(LINK_CHAT_KEYS, list_of(DataType::UInt64), true),
        Field::new(LINK_ANSWER_KEY, DataType::UInt64, true),
        Field::new(LINK_CALL_KEYS, list_of(DataType::UInt64), true),
        Field::new(LINK_ARG_KEYS, list_of(DataType::UInt64), true),
        Field::new(LINK_RESULT_KEY, DataType::UInt64, true),
        Field::new(LINK_OPENING_KEY, DataType::UInt64, true),
        Field::new(LINK_CLIENT_KEY, DataType::UInt64, true),
        Field::new(LINK_RESPONSE_KEY, DataType::UInt64, true),
        Field::new(LINK_PREVIOUS_RESPONSE_KEY, DataType::UInt64, true),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every verdict outcome is the trace outcome of the same name, and every trace outcome
    /// is one.
    #[test]
    fn verdict_outcomes_are_the_traces() {
        use wire::response_verdict::Outcome as V;
        let all = [
            V::Ok,
            V::HttpError,
            V::UpstreamError,
            V::ClientCancelled,
            V::Timeout,
        ];
        let mapped: Vec<Outcome> = all.iter().map(|&v| Outcome::from(v)).collect();
        assert_eq!(mapped, Outcome::ALL);
        for (v, o) in all.iter().zip(&mapped) {
            assert_eq!(format!("{v:?}"), format!("{o:?}"));
        }
    }

    #[test]
    fn enums_round_trip_through_their_names() {
        for o in Outcome::ALL {
            assert_eq!(o.as_str().parse::<Outcome>().unwrap(), *o);
        }
        for s in TokenSource::ALL {
            assert_eq!(s.as_str().parse::<TokenSource>().unwrap(), *s);
        }
        for p in Producer::ALL {
            assert_eq!(p.as_str().parse::<Producer>().unwrap(), *p);
        }
        for l in ParentLink::ALL {
            assert_eq!(l.as_str().parse::<ParentLink>().unwrap(), *l);
        }
        let err = "oops".parse::<Outcome>().unwrap_err();
        assert!(err.contains("http_error"), "{err}");
    }

    /// A 1.0 file (written before the session columns and the 1.2 captured columns
    /// existed) reads, those columns null; so does a journal line of a 1.0 writer (capture's
    /// crash recovery).
    #[test]
    fn files_and_journals_without_the_1_1_columns_still_read() {
        use crate::encode::records_to_batch;
        use crate::test_records::full_record;
        use parquet::arrow::ArrowWriter;
        use parquet::file::metadata::KeyValue;
        use parquet::file::properties::WriterProperties;

        let dir = tempfile::tempdir().unwrap();
        let mut batch = records_to_batch(&[full_record(1), full_record(2)]).unwrap();
        for name in [
            col::PARENT_REQUEST_ID,
            col::THINK_TIME_US,
            col::CAPTURED_STATUS,
            col::CAPTURED_OUTCOME,
            col::SYNTHESIZED_BODY,
            col::TRACE_ID,
            col::SPAN_ID,
            col::TTFAT_US,
            col::REASONING_TOKENS,
            col::REASONING_TOKENS_SOURCE,
            col::TOOLS_OFFERED,
            col::TOOL_NAMES,
            col::TOOL_CALLS,
            col::TOOL_CALL_NAMES,
            col::PARENT_LINK,
            col::PAIR_REQUEST_ID,
            col::CACHED_TOKENS,
            col::IMAGES,
            col::IMAGE_BYTES,
            col::IMAGE_DIMS,
            col::AUDIO_INPUTS,
            col::AUDIO_BYTES,
            col::PARENT_WAIT_US,
        ]
        .into_iter()
        .chain(
            COLUMNS_SINCE
                .iter()
                .find(|(v, _)| *v == "1.6")
                .unwrap()
                .1
                .iter()
                .copied(),
        ) {
            let idx = batch.schema().index_of(name).unwrap();
            batch.remove_column(idx);
        }
        let p = dir.path().join("v1_0.parquet");
        let kv = vec![
            KeyValue::new(meta::SCHEMA_VERSION.into(), "1.0".to_string()),
            KeyValue::new(meta::PRODUCER.into(), "capture".to_string()),
        ];
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(kv))
            .build();
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&p).unwrap(),
            batch.schema(),
            Some(props),
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let t = crate::read_traces(&[p.to_str().unwrap()]).unwrap();
        assert_eq!(t.files[0].schema_version, "1.0");
        let mut want = full_record(1);
        (want.parent_request_id, want.think_time_us) = (None, None);
        (
            want.captured_status,
            want.captured_outcome,
            want.synthesized_body,
        ) = (None, None, None);
        (want.trace_id, want.span_id) = (None, None);
        (
            want.ttfat_us,
            want.reasoning_tokens,
            want.reasoning_tokens_source,
        ) = (None, None, None);
        (want.tools_offered, want.tool_names) = (None, None);
        (want.tool_calls, want.tool_call_names) = (None, None);
        (want.parent_link, want.pair_request_id) = (None, None);
        (want.cached_tokens, want.images, want.image_bytes) = (None, None, None);
        (want.image_dims, want.audio_inputs, want.audio_bytes) = (None, None, None);
        want.parent_wait_us = None;
        (want.capture_id, want.capture_started_us) = (None, None);
        want.link_keys = crate::fleet::LinkKeys::default();
        assert_eq!(t.records[0], want);
        assert!(t.records.iter().all(|r| r.parent_request_id.is_none()));

        // The committed samples were written by 1.0 writers (until they are remade).
        let sample = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../samples/sim-replay-300.parquet"
        );
        let t = crate::read_traces(&[sample]).unwrap();
        assert_eq!(t.records.len(), 300);
        if t.files[0].schema_version == "1.0" {
            assert!(t.records.iter().all(|r| r.think_time_us.is_none()));
        }

        // A journal line has no key for a column its writer did not know.
        let mut line = serde_json::to_value(full_record(3)).unwrap();
        let o = line.as_object_mut().unwrap();
        o.remove("parent_request_id");
        o.remove("think_time_us");
        o.remove("captured_status");
        o.remove("captured_outcome");
        o.remove("synthesized_body");
        o.remove("trace_id");
        o.remove("span_id");
        for k in [
            "ttfat_us",
            "reasoning_tokens",
            "reasoning_tokens_source",
            "tools_offered",
            "tool_names",
            "tool_calls",
            "tool_call_names",
            "parent_link",
            "pair_request_id",
            "cached_tokens",
            "images",
            "image_bytes",
            "image_dims",
            "audio_inputs",
            "audio_bytes",
            "parent_wait_us",
            "capture_id",
            "capture_started_us",
            "link_keys",
        ] {
            o.remove(k);
        }
        let r: TraceRecord = serde_json::from_value(line).unwrap();
        assert_eq!((r.parent_request_id, r.think_time_us), (None, None));
        assert_eq!(
            (r.captured_status, r.captured_outcome, r.synthesized_body),
            (None, None, None)
        );
        assert_eq!(
            (r.ttfat_us, r.tool_names, r.parent_link),
            (None, None, None)
        );
        assert_eq!(
            (r.cached_tokens, r.images, r.image_dims),
            (None, None, None)
        );
        assert_eq!((r.pair_request_id, r.parent_wait_us), (None, None));
    }

    #[test]
    fn schema_has_the_documented_columns() {
        let s = schema();
        for name in [
            "request_id",
            "session_id",
            "parent_request_id",
            "think_time_us",
            "arrival_time",
            "endpoint",
            "model",
            "stream",
            "prompt_tokens",
            "output_tokens",
            "max_tokens",
            "prompt_tokens_source",
            "output_tokens_source",
            "status",
            "outcome",
            "error",
            "ttft_us",
            "e2el_us",
            "chunk_times_us",
            "chunk_tokens",
            "body",
            "prefix_hashes",
            "request_bytes",
            "response_bytes",
            "captured_status",
            "captured_outcome",
            "synthesized_body",
            "trace_id",
            "span_id",
            "ttfat_us",
            "reasoning_tokens",
            "reasoning_tokens_source",
            "tools_offered",
            "tool_names",
            "tool_calls",
            "tool_call_names",
            "parent_link",
            "pair_request_id",
            "cached_tokens",
            "images",
            "image_bytes",
            "image_dims",
            "audio_inputs",
            "audio_bytes",
            "parent_wait_us",
            "capture_id",
            "capture_started",
            "link_chat_keys",
            "link_answer_key",
            "link_call_keys",
            "link_arg_keys",
            "link_result_key",
            "link_opening_key",
            "link_client_key",
            "link_response_key",
            "link_previous_response_key",
        ] {
            assert!(s.field_with_name(name).is_ok(), "missing column {name}");
        }
        assert!(matches!(
            s.field_with_name("arrival_time").unwrap().data_type(),
            DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) if tz.as_ref() == "UTC"
        ));
    }
}
