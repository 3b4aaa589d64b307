//! The llmreplay trace format: the schema (defined once), the Parquet writer (with its
//! crash-safe journal) and reader, trace summaries (`inspect`, `stats`), redaction and
//! arrival processes. Local files only: object stores are the `store` crate's, importers of
//! public formats the `import` crate's, tokenizers the `tokenize` crate's.
#![deny(missing_docs)]

pub mod arrivals;
pub mod error;
pub mod inspect;
pub mod reader;
pub mod redact;
pub mod schema;
pub mod stats;
pub mod writer;

pub use error::{Error, Result};
pub use reader::{read_traces, Trace, TraceFile};
pub use schema::{Outcome, Producer, TokenSource, TraceRecord, SCHEMA_VERSION};
pub use writer::{write_trace_file, FileMeta, TraceWriter, WriterConfig};
