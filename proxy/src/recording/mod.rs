//! The recording side: a request's row from its arrival to the trace file.
//!
//! - [`request`]: what the trace needs from a request body, and the usage injected into it;
//! - [`apis`]: every API's request in the one shape the prompt code reads (chat's);
//! - [`row`]: one request's [`Recording`](row::Recording), finished exactly once, and the
//!   [`ObservedBody`](row::ObservedBody) that streams the upstream's frames to the client;
//! - [`observe`]: an SSE response observed as it streams, what capture injected cut out
//!   ([`jsonscan`]: the byte scanner that finds it);
//! - [`prompts`]: prompts tokenized off the request path, on the prompt runners, with the
//!   images and audio they carry ([`media`]);
//! - [`writer`]: the bounded queue to the trace writer's thread, where rows are joined with
//!   their prompts, linked ([`crate::linking`]) and written, and its taps ([`otlp`]).
//!
//! It may call: `linking`, `upstream` (the body it observes), `prefix`, `config`, `metrics`,
//! `phases`, `runtime`, `error`. It never calls the serving side.

pub(crate) mod apis;
pub use apis::prefix_hashes_of_body;
pub mod jsonscan;
pub(crate) mod media;
pub mod observe;
pub(crate) mod otlp;
pub(crate) mod prompts;
pub mod request;
pub(crate) mod row;
pub(crate) mod writer;
