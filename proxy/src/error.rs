//! The proxy's typed errors: configuration, sockets, TLS material, and the trace writer.

use std::net::SocketAddr;
use std::path::PathBuf;

/// An error starting, running or stopping the capture proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The configuration is invalid (bad upstream URL, sample rate, header name...): from
    /// [`crate::ProxyConfig::validate`]. The cause is in the message, not also a `source`.
    #[error("invalid capture configuration: {0}")]
    Config(ConfigError),
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

/// What is wrong with a [`crate::ProxyConfig`] ([`crate::ProxyConfig::validate`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The upstream URL is not one the proxy can forward to.
    #[error("--upstream {url:?}: {why}")]
    Upstream {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The sample rate is outside (0, 1].
    #[error("sample rate {0} must be in (0, 1]")]
    SampleRate(f64),
    /// A setting that must be positive is zero.
    #[error("{} must be > 0", .0.field())]
    Zero(Setting),
    /// The session header is not a header name.
    #[error("{0:?} is not a header name")]
    SessionHeader(String),
    /// The session header carries credentials.
    #[error("{0:?} holds credentials and cannot be recorded as the session id")]
    SecretSessionHeader(String),
    /// A shadow setting (`--shadow`, `--shadow-header`, `--shadow-model`, `--shadow-sample`,
    /// `--shadow-max-in-flight`, `--shadow-timeout`) is not one the proxy can use.
    #[error("{flag} {value:?}: {why}")]
    Shadow {
        /// The flag that set it.
        flag: &'static str,
        /// What it was given.
        value: String,
        /// Why it was refused.
        why: String,
    },
    /// The upstream's TLS client could not be configured.
    #[error("TLS client: {0}")]
    TlsClient(String),
    /// The OTLP exporter (`--otlp-endpoint`) could not be started.
    #[error("OTLP exporter: {0}")]
    Otlp(String),
}

/// A setting of [`crate::ProxyConfig`] that must be positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Setting {
    /// `block_size`.
    BlockSize,
    /// `max_file_bytes`.
    MaxFileBytes,
    /// `max_request_body`.
    MaxRequestBody,
    /// `queue_capacity`.
    QueueCapacity,
    /// `max_sse_event`.
    MaxSseEvent,
    /// `client.first_byte`.
    ClientFirstByte,
    /// `client.header`.
    ClientHeader,
    /// `client.keepalive`.
    ClientKeepalive,
    /// `client.body`.
    ClientBody,
    /// `threads`.
    Threads,
}

impl Setting {
    /// The field of [`crate::ProxyConfig`] it is.
    pub fn field(self) -> &'static str {
        match self {
            Setting::BlockSize => "block_size",
            Setting::MaxFileBytes => "max_file_bytes",
            Setting::MaxRequestBody => "max_request_body",
            Setting::QueueCapacity => "queue_capacity",
            Setting::MaxSseEvent => "max_sse_event",
            Setting::ClientFirstByte => "client.first_byte",
            Setting::ClientHeader => "client.header",
            Setting::ClientKeepalive => "client.keepalive",
            Setting::ClientBody => "client.body",
            Setting::Threads => "threads",
        }
    }
}

impl From<ConfigError> for ProxyError {
    fn from(e: ConfigError) -> Self {
        ProxyError::Config(e)
    }
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
