//! Times for humans: µs since the epoch as RFC 3339, UTC.

use chrono::{DateTime, SecondsFormat};

/// `us` (µs since the epoch) as RFC 3339 with microseconds, UTC.
pub fn rfc3339(us: i64) -> String {
    DateTime::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, true))
        .unwrap_or_else(|| format!("{us} µs since the epoch (out of range)"))
}
