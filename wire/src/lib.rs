//! The wire under capture, replay and the sim: one HTTP/1.1 client connection layer, the
//! kernel receive stamps of socket reads, the clocks, the OpenAI/SSE stream parser and vLLM's
//! metric names and histogram bounds.
//!
//! - [`framing`]: how a response body is delimited (RFC 9112 §6.3) and whether its
//!   connection may be reused; an in-place chunked decoder.
//! - [`Conn`]: one connection (plain TCP or rustls) with its read buffer: writes a request
//!   in one call, reads the response head, then the body straight from the read buffer —
//!   through a callback with the kernel receive time of each read (replay's measuring path),
//!   or one frame per read (capture's forwarding path).
//! - [`Pool`]: connect (with its own connect timeout), a LIFO keep-alive pool with a liveness
//!   check before reuse and an idle-age bound, preconnect and refresh, honest counts, and
//!   **the retry rule** ([`Pool::send`]): a request is sent again only when not one byte of
//!   it was accepted by a connection, so no server ever sees a request twice.
//! - [`habit`]: what an origin does with a connection after each kind of response, learned
//!   per origin: a server that closes after every streamed response while advertising
//!   keep-alive gets no reuse after one (and spares opened ahead), a well-behaved one full
//!   reuse.
//! - [`direct`]: a connect, and a new connection's first writes, that do not wait for a
//!   reactor turn when the kernel has already done the work (a loopback connect).
//! - [`rxstamp`]: `SO_TIMESTAMPNS` receive stamps and the clock pair that converts them.
//! - [`clock`]: the wall-clock stamp of now and a thread's fine timer slack, for every crate.
//! - [`listen`]: listening sockets with a listen queue that survives connection bursts, and
//!   the descriptor limit raised for them.
//! - [`api`]: which API a request speaks (completions, chat, Responses, Messages,
//!   embeddings, rerank, score), from its method and path.
//! - [`sse`]: the one SSE stream parser and response classifiers capture, replay and the
//!   tests read responses with, for every API's events.
//! - [`verdict`]: the one response verdict (outcome, error text, usage, tokens per chunk)
//!   capture and replay judge a finished response with.
//! - [`origin`]: an origin URL (`http[s]://host[:port][/base]`), read one way by every reader.
//! - [`vllm_metrics`]: vLLM's Prometheus latency histogram names and bounds, shared by the
//!   sim (which exports them), capture and replay's alert rules.
#![deny(missing_docs)]

pub mod api;
pub mod clock;
mod conn;
pub mod direct;
pub mod framing;
pub mod habit;
pub mod listen;
pub mod origin;
mod pool;
pub mod prometheus;
pub mod response_verdict;
pub mod rxstamp;
pub mod sse;
pub mod vllm_metrics;

#[doc(hidden)]
pub mod testing;

pub use conn::{BodyReader, Conn, Head, Io, ReadError, Stamped, WriteError};
pub use framing::{Framing, ResponseFraming};
pub use habit::{After, Habit};
pub use pool::{
    ConnectError, Lease, Pool, PoolConfig, PoolStats, Resolver, SendError, Sent, Target,
    RESOLVED_FOR,
};
