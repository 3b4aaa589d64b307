//! Where a recorded request's time goes inside capture, for `--phase-log FILE` (a
//! diagnostic, off by default): each generation request's stamps on the monotonic clock —
//! its connection accepted, its head read, an upstream connection in hand (pooled or
//! newly connected), the request written to it, the upstream's response head read, and the
//! first body frame handed to the client's connection — and the serving thread that read
//! its head, kept in memory (at most [`MAX_ROWS`]) and written as JSON lines at shutdown.
//! `bench/phases.py` summarises them.
//!
//! The stamps are taken whether or not the log is on (six `Instant::now()`, tens of ns);
//! only the log itself is optional.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// Rows kept at most; later requests are not logged (the log says how many were left out).
pub(crate) const MAX_ROWS: usize = 1 << 20;

/// One request's stamps. `accepted` is set for the first request of a connection only.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phases {
    pub(crate) accepted: Option<Instant>,
    pub(crate) head: Instant,
    /// When the upstream connection was in hand, right before the request's write.
    pub(crate) leased: Option<Instant>,
    /// The connection came from the pool.
    pub(crate) reused: bool,
    pub(crate) written: Option<Instant>,
    pub(crate) response_head: Option<Instant>,
    pub(crate) first_byte: Option<Instant>,
    /// The serving thread that read the head ([`crate::runtime::threads::index`]).
    pub(crate) thread: usize,
}

impl Phases {
    /// Stamps of a request whose head was read at `head`.
    pub(crate) fn new(head: Instant) -> Phases {
        Phases {
            accepted: None,
            head,
            leased: None,
            reused: false,
            written: None,
            response_head: None,
            first_byte: None,
            thread: crate::runtime::threads::index(),
        }
    }
}

/// The phase log of a proxy (see the module).
#[derive(Debug)]
pub(crate) struct PhaseLog {
    path: PathBuf,
    base: Instant,
    rows: Mutex<(Vec<Phases>, u64)>,
}

impl PhaseLog {
    /// A log to be written to `path`; stamps are given in µs from now.
    pub(crate) fn new(path: &Path) -> PhaseLog {
        PhaseLog {
            path: path.to_path_buf(),
            base: Instant::now(),
            rows: Mutex::new((Vec::new(), 0)),
        }
    }

    /// Keeps one request's stamps.
    pub(crate) fn push(&self, p: &Phases) {
        let mut g = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if g.0.len() < MAX_ROWS {
            g.0.push(*p);
        } else {
            g.1 += 1;
        }
    }

    /// Writes the rows (one JSON object per line, µs since the proxy started, `null` for a
    /// phase the request did not reach) and returns how many; a last line
    /// `{"left_out": N}` when rows were over [`MAX_ROWS`].
    pub(crate) fn write(&self) -> std::io::Result<usize> {
        let g = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = std::io::BufWriter::new(std::fs::File::create(&self.path)?);
        let us = |t: Option<Instant>| match t {
            Some(t) => t
                .saturating_duration_since(self.base)
                .as_micros()
                .to_string(),
            None => "null".into(),
        };
        for p in &g.0 {
            writeln!(
                f,
                "{{\"accepted_us\":{},\"head_us\":{},\"leased_us\":{},\"reused\":{},\"written_us\":{},\"response_head_us\":{},\"first_byte_us\":{},\"thread\":{}}}",
                us(p.accepted),
                us(Some(p.head)),
                us(p.leased),
                p.reused,
                us(p.written),
                us(p.response_head),
                us(p.first_byte),
                p.thread,
            )?;
        }
        if g.1 > 0 {
            writeln!(f, "{{\"left_out\":{}}}", g.1)?;
        }
        f.flush()?;
        Ok(g.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rows_are_written_in_microseconds_from_the_start_with_nulls_for_missing_phases() {
        let dir = std::env::temp_dir().join(format!("phases-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.jsonl");
        let log = PhaseLog::new(&path);
        let mut p = Phases::new(log.base + Duration::from_micros(1500));
        p.accepted = Some(log.base + Duration::from_micros(1000));
        p.leased = Some(log.base + Duration::from_micros(2000));
        p.reused = true;
        log.push(&p);
        assert_eq!(log.write().unwrap(), 1);
        let text = std::fs::read_to_string(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["accepted_us"], 1000);
        assert_eq!(v["head_us"], 1500);
        assert_eq!(v["leased_us"], 2000);
        assert_eq!(v["reused"], true);
        assert!(v["written_us"].is_null() && v["first_byte_us"].is_null());
        assert_eq!(v["thread"], 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
