//! The proxy's typed errors: configuration, sockets, TLS material, and the trace writer.

use std::net::SocketAddr;
use std::path::PathBuf;

/// An error starting, running or stopping the capture proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The configuration is invalid (bad upstream URL, sample rate, header name...).
    #[error("invalid capture configuration: {0}")]
    Config(String),
    /// A listening socket could not be bound.
    #[error("cannot bind {addr}: {cause}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// The underlying error (in the message, so not also a `source`: a chain printer
        /// such as anyhow's would print it twice).
        cause: std::io::Error,
    },
    /// A certificate, key or CA file could not be used.
    #[error("TLS material {path}: {reason}")]
    Tls {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The trace writer failed (opening the directory, recovering journals, closing files).
    #[error("trace writer: {0}")]
    Trace(#[from] trace_format::Error),
    /// The writer thread died.
    #[error("trace writer thread: {0}")]
    WriterThread(String),
    /// Other I/O error.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Result with [`ProxyError`].
pub type Result<T, E = ProxyError> = std::result::Result<T, E>;
