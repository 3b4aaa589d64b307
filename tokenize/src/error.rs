//! Typed errors of the tokenize crate.

use std::path::PathBuf;

/// Everything that can go wrong loading a tokenizer or running one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The tokenizer file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message, so not also a `source`: a chain printer
        /// such as anyhow's would print it twice).
        cause: std::io::Error,
    },
    /// An unknown name, a file that is not a tokenizer, or a failure of the tokenizer itself.
    #[error("{0}")]
    Invalid(String),
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
}
