//! Typed errors of the replay crate. Per-request failures are not errors: they are
//! recorded outcomes; these are the reasons a run could not run at all.

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// A configuration value or combination that cannot work.
    #[error("{0}")]
    Config(String),
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] trace_format::Error),
    /// The trace selection left nothing to replay.
    #[error("nothing to replay: {0}")]
    Empty(String),
    /// A target could not be reached at all.
    #[error("target {target}: {message}")]
    Target {
        /// The target's name.
        target: String,
        /// What happened.
        message: String,
    },
    /// An I/O error writing results.
    #[error("{path}: {cause}")]
    Io {
        /// The path.
        path: String,
        /// The underlying error (in the message, so not also a `source`: a chain printer
        /// such as anyhow's would print it twice).
        cause: std::io::Error,
    },
    /// A result could not be written.
    #[error("writing {path}")]
    Write {
        /// The path or object URL.
        path: String,
        /// Why.
        #[source]
        source: trace_format::Error,
    },
    /// The client runtime could not start.
    #[error("client runtime: {0}")]
    Runtime(String),
}
