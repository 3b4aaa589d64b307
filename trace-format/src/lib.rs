//! The llmreplay trace format: the schema (defined once), the Parquet writer and reader,
//! trace summaries, and what capture and replay both need to read a response the same way:
//! the OpenAI/SSE stream parser and HTTP/1.1 response framing.
#![deny(missing_docs)]

pub mod arrivals;
pub mod error;
pub mod http1;
pub mod import;
pub mod inspect;
pub mod reader;
pub mod rxstamp;
pub mod schema;
pub mod sse;
pub mod stats;
pub mod store;
pub mod tokenize;
pub mod vllm_metrics;
pub mod writer;

pub use error::{Error, Result};
pub use reader::{read_traces, Trace, TraceFile};
pub use schema::{Outcome, Producer, TokenSource, TraceRecord, SCHEMA_VERSION};
pub use writer::{write_trace_file, FileMeta, TraceWriter, WriterConfig};
