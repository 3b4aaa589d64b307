//! Checks of a file's bytes before and after decoding: a `DELTA_*` page that claims more
//! values than it holds is refused before the decoder allocates for it, and every decoded
//! array is validated in full before a value is read from it.

use std::path::Path;

use arrow_array::{Array, RecordBatch};

use parquet::file::reader::{ChunkReader, FileReader, SerializedFileReader};

use crate::error::{Error, Result};

/// Refuses a data page of row group `group` whose `DELTA_*` header claims more values than
/// the page holds; `leaves` limits the check to those leaf columns (the ones a projected
/// read decodes), `None` checks them all.
///
/// The parquet crate allocates what that header claims before decoding (found by
/// `tests/fuzz_parquet.rs`: one damaged byte asked for 137 GB), and a failed allocation
/// aborts the process: no panic, so the guard of [`read_parquet`](super::read_parquet) cannot catch it. Every page
/// of the row group is read (and decompressed) once more for this, right before the row
/// group is decoded; only `DELTA_*` pages are looked into. The
/// first header of a page is checked (the lengths of `DELTA_LENGTH_BYTE_ARRAY`, the prefix
/// lengths of `DELTA_BYTE_ARRAY`); the suffix header of `DELTA_BYTE_ARRAY` comes after a
/// whole encoded block and is not.
pub(super) fn check_row_group_pages<R: ChunkReader + 'static>(
    reader: &SerializedFileReader<R>,
    group: usize,
    leaves: Option<&[usize]>,
    path: &Path,
) -> Result<()> {
    use parquet::basic::Encoding;
    use parquet::column::page::Page;
    let damaged = |why: String| Error::format(path, format!("damaged Parquet file: {why}"));
    {
        let rg = reader
            .get_row_group(group)
            .map_err(|e| Error::format(path, e))?;
        for c in 0..rg.num_columns() {
            if leaves.is_some_and(|l| !l.contains(&c)) {
                continue;
            }
            let descr = rg.metadata().column(c).column_descr_ptr();
            let mut pages = rg
                .get_column_page_reader(c)
                .map_err(|e| Error::format(path, e))?;
            while let Some(page) = pages.get_next_page().map_err(|e| Error::format(path, e))? {
                let (buf, num_values, encoding, values_at) = match &page {
                    Page::DataPage {
                        buf,
                        num_values,
                        encoding,
                        def_level_encoding,
                        rep_level_encoding,
                        ..
                    } => {
                        // Levels of a v1 page: each RLE run set prefixed by its 4-byte length.
                        let mut at = 0usize;
                        for (max, enc) in [
                            (descr.max_rep_level(), rep_level_encoding),
                            (descr.max_def_level(), def_level_encoding),
                        ] {
                            if max > 0 {
                                if *enc != Encoding::RLE {
                                    at = usize::MAX;
                                    break;
                                }
                                let len = buf
                                    .get(at..at + 4)
                                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                                    .ok_or_else(|| damaged("truncated levels".into()))?;
                                at = at.saturating_add(4).saturating_add(len as usize);
                            }
                        }
                        (buf, *num_values, *encoding, at)
                    }
                    Page::DataPageV2 {
                        buf,
                        num_values,
                        encoding,
                        def_levels_byte_len,
                        rep_levels_byte_len,
                        ..
                    } => (
                        buf,
                        *num_values,
                        *encoding,
                        (*def_levels_byte_len as usize)
                            .saturating_add(*rep_levels_byte_len as usize),
                    ),
                    _ => continue,
                };
                if !matches!(
                    encoding,
                    Encoding::DELTA_BINARY_PACKED
                        | Encoding::DELTA_LENGTH_BYTE_ARRAY
                        | Encoding::DELTA_BYTE_ARRAY
                ) || values_at == usize::MAX
                {
                    continue;
                }
                let values = buf
                    .get(values_at..)
                    .ok_or_else(|| damaged("levels longer than the page".into()))?;
                // Header: block size, miniblocks per block, total value count, first value.
                let mut at = 0;
                let mut varint = || -> Option<u64> {
                    let mut v = 0u64;
                    for shift in (0..64).step_by(7) {
                        let b = *values.get(at)?;
                        at += 1;
                        v |= u64::from(b & 0x7f) << shift;
                        if b & 0x80 == 0 {
                            return Some(v);
                        }
                    }
                    None
                };
                let count = varint()
                    .and(varint())
                    .and(varint())
                    .ok_or_else(|| damaged("truncated delta header".into()))?;
                if count > u64::from(num_values) {
                    return Err(damaged(format!(
                        "a {encoding} page of {num_values} values claims {count}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Checks every array of a decoded batch in full (buffer lengths, offsets, validity bitmaps,
/// UTF-8) so that reading a value from a damaged one is an error here, not a panic or an
/// out-of-bounds read later.
pub(super) fn validate(batch: &RecordBatch, path: &Path) -> Result<()> {
    for (field, column) in batch.schema_ref().fields().iter().zip(batch.columns()) {
        if column.len() != batch.num_rows() {
            return Err(Error::format(
                path,
                format!(
                    "damaged Parquet file: column {} has {} values for {} rows",
                    field.name(),
                    column.len(),
                    batch.num_rows()
                ),
            ));
        }
        column.to_data().validate_full().map_err(|e| {
            Error::format(
                path,
                format!("damaged Parquet file: column {}: {e}", field.name()),
            )
        })?;
    }
    Ok(())
}
