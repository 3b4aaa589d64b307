//! How a trace file's rows are ordered by arrival ([`FileOrder`]): measured as a file is
//! written ([`OrderMeter`]) and recorded in its footer's key-value metadata under
//! [`meta::ARRIVAL_ORDER`], so a reader learns a file's extent in time and its disorder from
//! the footer, without reading a row. For a file without the key (written by an older
//! llmreplay or another tool) the reader falls back to the row-group statistics of
//! `arrival_time` for the extent ([`extent_from_statistics`]) and to a pass over the arrival
//! column for the disorder. The same statistics say how many rows have a recorded body
//! ([`non_null_from_statistics`]).

use std::path::Path;

use parquet::basic::{ConvertedType, LogicalType, TimeUnit};
use parquet::file::metadata::{KeyValue, ParquetMetaData};
use parquet::file::statistics::Statistics;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::schema::{col, meta};

/// How one file's rows are ordered by arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FileOrder {
    /// Its earliest arrival, µs since the epoch (None: no rows).
    pub first_arrival_us: Option<i64>,
    /// Its latest arrival.
    pub last_arrival_us: Option<i64>,
    /// The most any row arrived before the latest arrival of the rows above it in the file,
    /// µs (0: sorted by arrival).
    pub disorder_us: i64,
}

impl FileOrder {
    /// The key-value pair a writer puts in the file's footer.
    pub(crate) fn to_kv(self) -> KeyValue {
        let json = serde_json::to_string(&self).unwrap_or_default();
        KeyValue::new(meta::ARRIVAL_ORDER.to_string(), json)
    }

    /// The order recorded in a file's key-value metadata (None: not recorded). A value that
    /// does not parse, or says something impossible (a negative disorder, a first arrival
    /// after the last, an extent for no rows or none for some), is an error naming `path`.
    pub(crate) fn from_kv(kv: &[KeyValue], rows: usize, path: &Path) -> Result<Option<FileOrder>> {
        let Some(value) = kv
            .iter()
            .find(|e| e.key == meta::ARRIVAL_ORDER)
            .map(|e| e.value.as_deref().unwrap_or_default())
        else {
            return Ok(None);
        };
        let bad =
            |why: String| Error::format(path, format!("{} {value:?}: {why}", meta::ARRIVAL_ORDER));
        let o: FileOrder = serde_json::from_str(value).map_err(|e| bad(e.to_string()))?;
        let consistent = match (o.first_arrival_us, o.last_arrival_us) {
            (Some(f), Some(l)) => rows > 0 && f <= l,
            (None, None) => rows == 0,
            _ => false,
        };
        if !consistent || o.disorder_us < 0 {
            return Err(bad(format!("does not describe the file's {rows} rows")));
        }
        Ok(Some(o))
    }
}

/// What a file's footer says of its order: recorded in full by an llmreplay writer, or its
/// extent from the statistics, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The recorded order.
    Recorded(FileOrder),
    /// First and last arrival from the row groups' statistics.
    Extent(Option<i64>, Option<i64>),
    /// Neither.
    Nothing,
}

impl Claim {
    /// What the footer of a file of `rows` rows claims (an error: a recorded order that
    /// cannot be right).
    pub(crate) fn of(footer: &ParquetMetaData, rows: usize, path: &Path) -> Result<Claim> {
        let kv = footer
            .file_metadata()
            .key_value_metadata()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if let Some(o) = FileOrder::from_kv(kv, rows, path)? {
            return Ok(Claim::Recorded(o));
        }
        Ok(match extent_from_statistics(footer) {
            Some((first, last)) if first.is_some() == (rows > 0) => Claim::Extent(first, last),
            _ => Claim::Nothing,
        })
    }

    /// Checks the claim against the order measured over the file's rows: a footer that
    /// misstates them (a damaged file) is an error naming `path`, whichever reader meets it.
    pub(crate) fn check(&self, measured: FileOrder, path: &Path) -> Result<()> {
        let agrees = match *self {
            Claim::Recorded(o) => o == measured,
            Claim::Extent(first, last) => {
                (first, last) == (measured.first_arrival_us, measured.last_arrival_us)
            }
            Claim::Nothing => true,
        };
        if agrees {
            return Ok(());
        }
        Err(Error::format(
            path,
            format!(
                "damaged file: its footer misstates its rows ({self:?}; the rows: {measured:?})"
            ),
        ))
    }
}

/// Measures a file's [`FileOrder`] from its arrivals, in file order.
#[derive(Debug, Clone)]
pub(crate) struct OrderMeter {
    order: FileOrder,
    latest: i64,
    rows: usize,
}

impl Default for OrderMeter {
    fn default() -> Self {
        OrderMeter {
            order: FileOrder::default(),
            latest: i64::MIN,
            rows: 0,
        }
    }
}

impl OrderMeter {
    /// The next row's arrival, µs since the epoch.
    pub(crate) fn add(&mut self, at: i64) {
        self.rows += 1;
        self.latest = self.latest.max(at);
        self.order.disorder_us = self.order.disorder_us.max(self.latest.saturating_sub(at));
        self.order.first_arrival_us = Some(self.order.first_arrival_us.map_or(at, |f| f.min(at)));
        self.order.last_arrival_us = Some(self.latest);
    }

    /// Rows seen.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// The order of the rows seen.
    pub(crate) fn order(&self) -> FileOrder {
        self.order
    }
}

/// A file's earliest and latest arrival from the min/max statistics of its row groups'
/// `arrival_time` column, when it is in microseconds and every row group with rows has exact
/// ones (None otherwise).
/// For a file without rows: `Some((None, None))`.
pub(crate) fn extent_from_statistics(md: &ParquetMetaData) -> Option<(Option<i64>, Option<i64>)> {
    let columns = md.file_metadata().schema_descr().columns();
    let leaf = columns
        .iter()
        .position(|c| c.path().parts() == [col::ARRIVAL_TIME])?;
    // The statistics are in the column's unit: only microseconds are the reader's as they
    // are (another unit is converted, and rounded, as the rows are read).
    let micros = match columns[leaf].logical_type_ref() {
        Some(LogicalType::Timestamp(t)) => matches!(t.unit, TimeUnit::MICROS),
        Some(_) => false,
        None => columns[leaf].converted_type() == ConvertedType::TIMESTAMP_MICROS,
    };
    if !micros {
        return None;
    }
    let (mut first, mut last) = (None::<i64>, None::<i64>);
    for rg in md.row_groups() {
        if rg.num_rows() == 0 {
            continue;
        }
        let Some(Statistics::Int64(s)) = rg.column(leaf).statistics() else {
            return None;
        };
        let (Some(&lo), Some(&hi)) = (s.min_opt(), s.max_opt()) else {
            return None;
        };
        if !s.min_is_exact() || !s.max_is_exact() || lo > hi {
            return None;
        }
        first = Some(first.map_or(lo, |f| f.min(lo)));
        last = Some(last.map_or(hi, |l| l.max(hi)));
    }
    Some((first, last))
}

/// Rows of a file with a value in top-level column `column`, from the null counts of its row
/// groups' statistics (None: a row group without one, or no such column).
pub(crate) fn non_null_from_statistics(md: &ParquetMetaData, column: &str) -> Option<usize> {
    let leaf = md
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.path().parts() == [column])?;
    let mut n = 0usize;
    for rg in md.row_groups() {
        let nulls = rg.column(leaf).statistics()?.null_count_opt()?;
        let rows = usize::try_from(rg.num_rows()).ok()?;
        n += rows.checked_sub(usize::try_from(nulls).ok()?)?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meter_measures_extent_and_disorder() {
        let mut m = OrderMeter::default();
        assert_eq!(m.order(), FileOrder::default());
        for at in [10, 30, 20, 40, 5] {
            m.add(at);
        }
        assert_eq!(m.rows(), 5);
        assert_eq!(
            m.order(),
            FileOrder {
                first_arrival_us: Some(5),
                last_arrival_us: Some(40),
                disorder_us: 35,
            }
        );
    }

    #[test]
    fn the_recorded_order_round_trips_and_nonsense_is_an_error() {
        let p = Path::new("t.parquet");
        let o = FileOrder {
            first_arrival_us: Some(1),
            last_arrival_us: Some(9),
            disorder_us: 3,
        };
        assert_eq!(FileOrder::from_kv(&[o.to_kv()], 4, p).unwrap(), Some(o));
        assert_eq!(FileOrder::from_kv(&[], 4, p).unwrap(), None);
        let empty = FileOrder::default();
        assert_eq!(
            FileOrder::from_kv(&[empty.to_kv()], 0, p).unwrap(),
            Some(empty)
        );
        let kv = |v: &str| {
            vec![KeyValue::new(
                meta::ARRIVAL_ORDER.to_string(),
                v.to_string(),
            )]
        };
        for (v, rows) in [
            ("garbage", 4),
            (
                r#"{"first_arrival_us":9,"last_arrival_us":1,"disorder_us":0}"#,
                4,
            ),
            (
                r#"{"first_arrival_us":1,"last_arrival_us":9,"disorder_us":-1}"#,
                4,
            ),
            (
                r#"{"first_arrival_us":1,"last_arrival_us":9,"disorder_us":0}"#,
                0,
            ),
            (
                r#"{"first_arrival_us":null,"last_arrival_us":null,"disorder_us":0}"#,
                4,
            ),
            (
                r#"{"first_arrival_us":1,"last_arrival_us":null,"disorder_us":0}"#,
                4,
            ),
        ] {
            let e = FileOrder::from_kv(&kv(v), rows, p).unwrap_err().to_string();
            assert!(
                e.contains("t.parquet") && e.contains(meta::ARRIVAL_ORDER),
                "{v}: {e}"
            );
        }
    }
}
