//! The OTLP/HTTP exchange: one blocking POST of a protobuf body over a fresh plain-HTTP/1.1
//! connection, bounded by a deadline. Batches are seconds apart, so a connection per batch
//! costs nothing that matters, and a receiver that stalls costs the exporter's thread at
//! most the timeout per batch.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::TelemetryError;

/// Where the OTLP receiver listens: `http://host[:port][/base]` (an origin, port 4318 when
/// not given); signals go to `/base/v1/traces` and `/base/v1/metrics` (the OTLP/HTTP default
/// paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The receiver's origin; its base path without a signal's path or a trailing `/`.
    pub origin: wire::origin::Origin,
}

impl Endpoint {
    /// Parses `url`. Only `http://` is supported (send to a local collector for TLS).
    pub fn parse(url: &str) -> Result<Endpoint, TelemetryError> {
        let bad = |why: &str| TelemetryError::Config(format!("--otlp-endpoint {url:?}: {why}"));
        let mut o =
            wire::origin::Origin::parse_or_port(url, Some(4318)).map_err(|e| bad(e.why()))?;
        if o.https {
            return Err(bad(
                "https is not supported by the exporter; send to a local OpenTelemetry Collector over http",
            ));
        }
        // `.../v1/traces` given as the endpoint: the base is what comes before it.
        for sig in ["/v1/traces", "/v1/metrics"] {
            if let Some(b) = o.base_path.strip_suffix(sig) {
                o.base_path = b.to_string();
            }
        }
        Ok(Endpoint { origin: o })
    }

    fn authority(&self) -> String {
        self.origin.host_port()
    }
}

/// POSTs `body` (`application/x-protobuf`) to `path` under the endpoint, with `headers`;
/// `Ok` for a 2xx answer within `timeout`, else what went wrong.
pub(crate) fn post(
    ep: &Endpoint,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let addrs: Vec<_> = (ep.origin.host.as_str(), ep.origin.port)
        .to_socket_addrs()
        .map_err(|e| format!("resolving {}: {e}", ep.origin.host))?
        .collect();
    let mut last = format!("{} resolves to no address", ep.origin.host);
    let mut conn = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, left()) {
            Ok(s) => {
                conn = Some(s);
                break;
            }
            Err(e) => last = format!("connecting to {a}: {e}"),
        }
    }
    let mut s = conn.ok_or(last)?;
    let _ = s.set_nodelay(true);
    let mut req = format!(
        "POST {}{path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\nconnection: close\r\n",
        ep.origin.base_path,
        ep.authority(),
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.set_write_timeout(Some(left()))
        .and_then(|_| s.write_all(&bytes))
        .map_err(|e| format!("sending to {}: {e}", ep.authority()))?;
    // The status line is all we need; the rest is read (bounded) so the receiver is not
    // reset mid-answer.
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") {
        s.set_read_timeout(Some(left()))
            .map_err(|e| e.to_string())?;
        if Instant::now() >= deadline {
            return Err(format!(
                "no answer from {} within {timeout:?}",
                ep.authority()
            ));
        }
        match s.read(&mut buf) {
            Ok(0) => return Err(format!("{} closed without an answer", ep.authority())),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "no answer from {} within {timeout:?}",
                    ep.authority()
                ))
            }
            Err(e) => return Err(format!("reading from {}: {e}", ep.authority())),
        }
        if head.len() > 8192 {
            return Err(format!("{} sent no status line", ep.authority()));
        }
    }
    let line = String::from_utf8_lossy(&head);
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("{} sent no HTTP status", ep.authority()))?;
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(format!("{}{path} answered {status}", ep.authority()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_with_defaults_and_signal_paths() {
        let e = Endpoint::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(
            (
                e.origin.host.as_str(),
                e.origin.port,
                e.origin.base_path.as_str()
            ),
            ("127.0.0.1", 4318, "")
        );
        let e = Endpoint::parse("http://collector/otlp/").unwrap();
        assert_eq!(
            (
                e.origin.host.as_str(),
                e.origin.port,
                e.origin.base_path.as_str()
            ),
            ("collector", 4318, "/otlp")
        );
        let e = Endpoint::parse("http://[::1]:9/v1/traces").unwrap();
        assert_eq!(
            (
                e.origin.host.as_str(),
                e.origin.port,
                e.origin.base_path.as_str()
            ),
            ("::1", 9, "")
        );
        assert_eq!(e.authority(), "[::1]:9");
        for bad in [
            "https://x:4318",
            "127.0.0.1:4318",
            "http://:4318",
            "http://x:port",
            "http://u@x",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
