//! The llmreplay trace format: the schema (defined once), the Parquet writer and reader,
//! trace summaries, and the OpenAI/SSE stream parser capture and replay both read responses
//! with.
#![deny(missing_docs)]

pub mod arrivals;
pub mod error;
pub mod import;
pub mod inspect;
pub mod prefix_cache;
pub mod reader;
pub mod redact;
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
