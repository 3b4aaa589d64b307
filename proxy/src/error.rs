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
    /// The cause is in the message, so not also a `source` (a chain printer such as
    /// anyhow's would print it twice).
    #[error("trace writer: {0}")]
    Trace(trace_format::Error),
    /// The writer thread died.
    #[error("trace writer thread: {0}")]
    WriterThread(String),
    /// Other I/O error (in the message, not also a `source`).
    #[error("I/O error: {0}")]
    Io(std::io::Error),
}

impl From<trace_format::Error> for ProxyError {
    fn from(e: trace_format::Error) -> Self {
        ProxyError::Trace(e)
    }
}

impl From<std::io::Error> for ProxyError {
    fn from(e: std::io::Error) -> Self {
        ProxyError::Io(e)
    }
}

/// Result with [`ProxyError`].
pub type Result<T, E = ProxyError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39, polish: `capture --out afile` printed "afile: File exists" twice, once from
    /// the message and once from the `source` that anyhow's `{:#}` adds.
    #[test]
    fn no_error_repeats_its_cause_as_a_source() {
        let exists = || std::io::Error::from(std::io::ErrorKind::AlreadyExists);
        for e in [
            ProxyError::from(trace_format::Error::io("afile", exists())),
            ProxyError::from(exists()),
        ] {
            assert!(std::error::Error::source(&e).is_none(), "{e}");
        }
    }
}
