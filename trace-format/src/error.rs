//! Typed errors of the trace-format crate.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing traces.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error on a named path.
    #[error("{path}: {cause}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error (in the message, so not also a `source`: a chain printer
        /// such as anyhow's would print it twice).
        cause: std::io::Error,
    },
    /// A Parquet or Arrow error on a named path.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the Parquet/Arrow layer said.
        message: String,
    },
    /// The file was written with a schema major version this build does not read.
    #[error(
        "{path}: trace schema version {found} is not supported (this build reads {supported}.x)"
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: String,
        /// The major version this build reads.
        supported: u32,
    },
    /// A Parquet file that is not an llmreplay trace (no version metadata, missing columns).
    #[error("{path}: not an llmreplay trace: {reason}")]
    NotATrace {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A path, directory or glob that matched no trace file.
    #[error("{}", no_files_text(.0))]
    NoFiles(String),
    /// A bad row in an input (journal line, import row), with its line number.
    #[error("{path}:{line}: {message}")]
    BadRow {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// An object store (`s3://`, `gs://`, ...) refused or failed an operation.
    #[error("{url}: {message}")]
    Store {
        /// The object or prefix, as a URL.
        url: String,
        /// What the store (or the connection to it) said.
        message: String,
    },
    /// An invalid argument.
    #[error("{0}")]
    Invalid(String),
    /// Traces whose content hashes were made under different keys, combined.
    #[error(
        "{a} was hashed under key id {a_key} and {b} under key id {b_key}: hashes under \
         different keys never compare (no shared prefix, no link would be found), so they are \
         not combined; capture every trace to be compared with the same --hash-key-file"
    )]
    KeysDiffer {
        /// The first file.
        a: PathBuf,
        /// Its key id (`unkeyed` for a capture before keyed hashes).
        a_key: String,
        /// The file whose key differs.
        b: PathBuf,
        /// Its key id.
        b_key: String,
    },
    /// A trace writer closed without every record in a finished file (records dropped
    /// because the directory could not take them, or journals left for the next start).
    #[error("trace incomplete: {0}")]
    Incomplete(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            cause,
        }
    }
    /// Wraps a Parquet/Arrow error with its path.
    pub fn format(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> Self {
        Error::Format {
            path: path.into(),
            message: e.to_string(),
        }
    }
}

/// What [`Error::NoFiles`] says, by what the input is: a path that does not exist, a
/// directory without trace files, or a pattern that matched none.
fn no_files_text(input: &str) -> String {
    let p = std::path::Path::new(input);
    if input.is_empty() {
        "no trace files found".into()
    } else if p.is_dir() {
        format!("{input}: no trace files found in this directory (*.parquet)")
    } else if input.contains(['*', '?', '[']) {
        format!("{input}: no trace files match this pattern")
    } else if !p.exists() && !input.contains("://") {
        format!("{input}: no such file or directory")
    } else {
        format!("{input}: no trace files found")
    }
}
