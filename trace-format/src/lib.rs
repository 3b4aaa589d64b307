//! The llmreplay trace format: the schema (defined once), the Parquet writer (with its
//! crash-safe journal) and reader, trace summaries (`inspect`, `stats`), redaction and
//! arrival processes.
//!
//! One way down: [`schema`], [`file_meta`] and [`order`] (what a file holds) ← [`encode`] (records into
//! durable Parquet files) ← [`journal`] (a writer's journal and its recovery) ← [`writer`]
//! (the rotating [`TraceWriter`]); [`reader`] reads what [`encode`] wrote, whole, and
//! [`stream`] in arrival order with bounded memory, through the same checks. Local files only: object stores are the `store` crate's, importers of
//! public formats the `import` crate's, tokenizers the `tokenize` crate's.
#![deny(missing_docs)]

pub mod arrivals;
pub mod blobs;
pub mod captures;
pub mod cause;
pub mod encode;
pub mod error;
pub mod file_meta;
pub mod fleet;
pub mod fnv;
pub mod inspect;
pub mod inspect_card;
pub mod journal;
pub mod keyed;
pub mod order;
pub mod prefix_cache;
pub mod privacy;
pub mod quantiles;
pub mod reader;
pub mod redact;
pub mod rekey;
pub mod schema;
pub mod sessions;
pub mod stats;
pub mod stream;
#[cfg(test)]
mod test_records;
pub mod tokens;
pub mod tracectx;
pub mod utc;
pub mod window;
pub mod writer;

pub use cause::{Cause, CauseCounts};
pub use encode::{write_trace_file, TraceFileWriter};
pub use error::{Error, Result};
pub use file_meta::FileMeta;
pub use reader::{read_traces, ContentHash, Trace, TraceFile};
pub use schema::{Outcome, ParentLink, Producer, TokenSource, TraceRecord, SCHEMA_VERSION};
pub use stream::TraceStream;
pub use window::Window;
pub use writer::{TraceWriter, WriterConfig};
