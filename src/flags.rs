//! Value parsers shared by the commands' flags (durations, rates, percentiles, `K=V`
//! pairs), and the provenance every command writes (its command line, the wall clock).
//! Defined once here; every `*_cmd` module imports them.

use std::time::Duration;

/// A duration: `250ms`, `30s`, `5m`, `1h`, or plain seconds (`1.5`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(Duration::from_secs_f64(v * mult)),
        _ => Err(format!("{s:?} is not a duration (e.g. 500ms, 30s, 5m, 1h)")),
    }
}

/// A rate: a positive number or `inf`.
pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    match s {
        "inf" | "infinity" => Ok(f64::INFINITY),
        _ => match s.parse::<f64>() {
            Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
            _ => Err(format!("{s:?} is not a positive rate (or inf)")),
        },
    }
}

/// `KEY<sep>VALUE`, both trimmed, the key not empty.
pub(crate) fn parse_kv(s: &str, sep: char) -> Result<(String, String), String> {
    match s.split_once(sep) {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("{s:?}: expected KEY{sep}VALUE")),
    }
}

/// A percentile in (0, 100]: `--metric-percentiles` (what is reported) and
/// `--slo-percentile` (what SLOs are judged at). p0 is no percentile anyone reports or
/// judges an SLO at; p100 is the maximum.
pub(crate) fn parse_percentile(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!("{s:?} is not a percentile in (0, 100]")),
    }
}

/// A duration above zero (a timeout).
pub(crate) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?} must be longer than 0")),
        d => Ok(d),
    }
}

/// The metric flags of every command that computes a run's metrics (`replay`, `merge`):
/// declared once, flattened into each.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct MetricFlags {
    /// Latency SLOs for goodput, `KEY:MS` with keys ttft, tpot, e2el.
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<replay::config::Slo>,
    /// Metrics that get percentiles.
    #[arg(long, value_delimiter = ',', default_value = "ttft,tpot,itl,e2el")]
    pub percentile_metrics: Vec<replay::config::PercentileMetric>,
    /// Percentiles to report.
    #[arg(long, value_delimiter = ',', value_parser = parse_percentile, default_value = "50,95,99")]
    pub metric_percentiles: Vec<f64>,
}

/// A wall-clock time, RFC 3339 (`2026-01-02T03:04:05Z`), as µs since the epoch.
pub(crate) fn parse_time(s: &str) -> Result<i64, String> {
    replay::config::parse_rfc3339_us(s).map_err(|e| e.to_string())
}

/// The time window of every command that reads a captured trace (`inspect`, `replay`,
/// `fidelity --captured`, `report --trace`, `export`): declared once, flattened into each,
/// applied where traces are opened (`traces::open_stream`, `traces::read_traces`).
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct WindowFlags {
    /// Read only the trace's rows arriving at or after this time, RFC 3339
    /// (2026-11-29T06:00:00Z): files whose rows all arrive outside --since/--until are not
    /// decoded.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<i64>,
    /// Read only the trace's rows arriving before this time, RFC 3339 (the window is
    /// [--since, --until): hourly windows tile a day).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until: Option<i64>,
}

impl WindowFlags {
    /// The window; refused (a usage error) when it holds no instant.
    pub(crate) fn window(&self) -> anyhow::Result<trace_format::Window> {
        trace_format::Window::new(self.since, self.until).map_err(crate::exit::refused)
    }
}

/// A whole number from 1 (a count of requests, a cap on them).
pub(crate) fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number from 1")),
    }
}

/// A share in (0, 1]: of sessions kept, of requests recorded or mirrored.
pub(crate) fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("{s:?} is not a share above 0 and at most 1")),
    }
}

/// A fraction in [0, 1].
pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?} is not a fraction from 0 to 1")),
    }
}

/// The command line as typed, quoted where needed, for provenance.
pub(crate) fn command_line() -> String {
    trace_format::redact::redact_args(std::env::args())
        .into_iter()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "\"'$`\\".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A finite number above zero (a speed-up, a rate of requests, a cost).
pub(crate) fn parse_positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_rates_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_rate("inf").unwrap(), f64::INFINITY);
        assert!(parse_rate("0").is_err());
    }

    #[test]
    fn ranges_refuse_what_cannot_run() {
        assert!(parse_positive_duration("0s").is_err());
        assert_eq!(
            parse_positive_duration("2s").unwrap(),
            Duration::from_secs(2)
        );
        assert!(parse_count("0").is_err() && parse_count("-1").is_err());
        assert_eq!(parse_count("3").unwrap(), 3);
        for bad in ["0", "1.5", "-0.5", "nan"] {
            assert!(parse_share(bad).is_err(), "{bad}");
            assert!(parse_positive(bad).is_err() || bad == "1.5", "{bad}");
        }
        assert_eq!(parse_share("1").unwrap(), 1.0);
        assert!(parse_fraction("1.5").is_err() && parse_fraction("0").is_ok());
        assert!(parse_positive("-2").is_err() && parse_positive("inf").is_err());
    }

    #[test]
    fn times_are_rfc3339_and_a_window_must_hold_an_instant() {
        assert_eq!(parse_time("1970-01-01T00:00:01Z").unwrap(), 1_000_000);
        assert_eq!(parse_time("1970-01-01T01:00:00+01:00").unwrap(), 0);
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
        let w = |since, until| WindowFlags { since, until }.window();
        assert!(w(Some(1), Some(2)).is_ok() && w(None, None).is_ok());
        let e = format!("{:#}", w(Some(2), Some(2)).unwrap_err());
        assert!(e.contains("--since must come before --until"), "{e}");
    }

    #[test]
    fn percentiles_are_in_0_exclusive_to_100() {
        assert_eq!(parse_percentile(" 99.9").unwrap(), 99.9);
        assert_eq!(parse_percentile("100").unwrap(), 100.0);
        for bad in ["0", "-1", "101", "p99", "nan"] {
            assert!(parse_percentile(bad).is_err(), "{bad}");
        }
    }
}
