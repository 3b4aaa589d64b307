//! A time window over a trace (`--since`/`--until`): the rows arriving in it, half-open
//! (`since` included, `until` not), so hourly windows tile a day without a row in two of
//! them. [`TraceStream::open_in`](crate::stream::TraceStream::open_in) applies it: a file
//! whose rows all arrive outside it is never decoded, a file across an edge has the rows
//! outside it decoded and dropped as they are read.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::utc::rfc3339;

/// Which arrivals a trace is read for (µs since the epoch; None: unbounded on that side).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Window {
    /// The earliest arrival kept.
    pub since_us: Option<i64>,
    /// The first arrival no longer kept.
    pub until_us: Option<i64>,
}

/// Where a file's rows lie against a [`Window`], from its first and last arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Every row is in the window.
    Inside,
    /// No row is.
    Outside,
    /// Some may be: the file crosses an edge.
    Across,
}

impl Window {
    /// Every row.
    pub const ALL: Window = Window {
        since_us: None,
        until_us: None,
    };

    /// The window from `since_us` to `until_us`; an error when it holds no instant.
    pub fn new(since_us: Option<i64>, until_us: Option<i64>) -> Result<Window> {
        let w = Window { since_us, until_us };
        match (since_us, until_us) {
            (Some(s), Some(u)) if s >= u => Err(Error::Invalid(format!(
                "the window {w} is empty: --since must come before --until"
            ))),
            _ => Ok(w),
        }
    }

    /// Whether it keeps every row.
    pub fn is_all(&self) -> bool {
        self.since_us.is_none() && self.until_us.is_none()
    }

    /// Whether a row arriving at `at_us` is in it.
    pub fn contains(&self, at_us: i64) -> bool {
        self.since_us.is_none_or(|s| at_us >= s) && self.until_us.is_none_or(|u| at_us < u)
    }

    /// Where rows arriving from `first_us` to `last_us` (inclusive) lie against it.
    pub fn overlap(&self, first_us: i64, last_us: i64) -> Overlap {
        if self.contains(first_us) && self.contains(last_us) {
            Overlap::Inside
        } else if self.since_us.is_some_and(|s| last_us < s)
            || self.until_us.is_some_and(|u| first_us >= u)
        {
            Overlap::Outside
        } else {
            Overlap::Across
        }
    }

    /// Whether no row arriving at `at_us` or later is in it.
    pub fn ended_by(&self, at_us: i64) -> bool {
        self.until_us.is_some_and(|u| at_us >= u)
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |t: Option<i64>, open: &str| t.map_or(open.to_string(), rfc3339);
        write!(
            f,
            "[{}, {})",
            side(self.since_us, "the first row"),
            side(self.until_us, "after the last row")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_open_windows_tile_and_files_are_placed_against_them() {
        let w = Window::new(Some(100), Some(200)).unwrap();
        assert!(w.contains(100) && w.contains(199) && !w.contains(200) && !w.contains(99));
        let next = Window::new(Some(200), None).unwrap();
        assert!(next.contains(200) && !next.contains(199));
        assert_eq!(w.overlap(100, 199), Overlap::Inside);
        assert_eq!(w.overlap(0, 99), Overlap::Outside);
        assert_eq!(w.overlap(200, 300), Overlap::Outside);
        assert_eq!(w.overlap(50, 150), Overlap::Across);
        assert_eq!(w.overlap(150, 250), Overlap::Across);
        assert_eq!(w.overlap(0, 300), Overlap::Across);
        assert!(w.ended_by(200) && !w.ended_by(199) && !Window::ALL.ended_by(i64::MAX));
        assert!(Window::ALL.is_all() && Window::ALL.contains(i64::MIN));
        assert_eq!(Window::ALL.overlap(1, 2), Overlap::Inside);
        let e = Window::new(Some(5), Some(5)).unwrap_err().to_string();
        assert!(e.contains("--since must come before --until"), "{e}");
        assert_eq!(
            Window::new(Some(0), None).unwrap().to_string(),
            "[1970-01-01T00:00:00.000000Z, after the last row)"
        );
    }
}
