//! Files other tools wrote from llmreplay's columns: a capture filtered in pandas, Polars,
//! DuckDB or Spark and written back. They carry our columns but not our metadata, and Arrow's
//! usual variations of our types:
//! - a column of only nulls typed `null` (pandas writes an all-None column so);
//! - dictionary-encoded strings (a pandas `category`, Spark's and DuckDB's dictionaries);
//! - an integer column with nulls written as floating point (pandas turns `int64` with a
//!   missing value into `float64`): read back as integers when every value is integral,
//!   NaN as null, anything else an error naming the row and column;
//! - decimals of scale 0 for integers (Spark has no unsigned 64-bit type: `prefix_hashes`
//!   come back as `decimal(20,0)`);
//! - strings as plain binary (older Spark and Hive, `binaryAsString`): read when UTF-8;
//! - the same inside lists.
//!
//! Timestamps of any unit and zone, large and view strings, large lists, any integer width
//! and nullable columns where ours are not are read as they are by the column reader
//! ([`super::columns`]); this module turns the rest into types it reads, and leaves a batch
//! that needs nothing untouched (no copy).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Float32Type, Float64Type};
use arrow_array::{
    new_null_array, Array, ArrayRef, GenericListArray, Int64Array, OffsetSizeTrait, RecordBatch,
    StringArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};

use crate::error::{Error, Result};
use crate::schema;

/// Our type of each column, by name.
fn canonical(name: &str) -> Option<&'static DataType> {
    static TYPES: OnceLock<HashMap<String, DataType>> = OnceLock::new();
    TYPES
        .get_or_init(|| {
            schema::schema()
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect()
        })
        .get(name)
}

/// `batch` with every column of ours in a type the column reader reads; the batch itself
/// (borrowed) when none needed a change. A value that has no reading as our type (a fraction
/// where an integer belongs, bytes that are not UTF-8) is an error naming the file's row and
/// the column, as the column reader's are.
pub(crate) fn normalize<'a>(
    batch: &'a RecordBatch,
    path: &Path,
    first_row: usize,
) -> Result<Cow<'a, RecordBatch>> {
    let schema = batch.schema();
    let mut changed: Vec<(usize, ArrayRef)> = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        let Some(target) = canonical(f.name()) else {
            continue;
        };
        let conformed = conform(batch.column(i), target).map_err(|(row, why)| Error::Format {
            path: path.to_path_buf(),
            message: format!("row {}, column {}: {why}", first_row + row, f.name()),
        })?;
        if let Some(a) = conformed {
            changed.push((i, a));
        }
    }
    if changed.is_empty() {
        return Ok(Cow::Borrowed(batch));
    }
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for (i, a) in changed {
        fields[i] = Field::new(fields[i].name(), a.data_type().clone(), true);
        columns[i] = a;
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map(Cow::Owned)
        .map_err(|e| Error::format(path, e))
}

/// A value that cannot be read as our type: its index in the array and why.
type Bad = (usize, String);

/// `a` in a type the column reader reads as `target`, or None when it reads `a` as it is.
fn conform(a: &ArrayRef, target: &DataType) -> std::result::Result<Option<ArrayRef>, Bad> {
    let integer = target.is_integer();
    Ok(match a.data_type() {
        DataType::Null => Some(new_null_array(target, a.len())),
        DataType::Dictionary(_, _) => {
            let d = a.as_any_dictionary();
            let flat = arrow_select::take::take(d.values().as_ref(), d.keys(), None)
                .map_err(|e| (0, format!("dictionary: {e}")))?;
            Some(conform(&flat, target)?.unwrap_or(flat))
        }
        DataType::Float32 if integer => Some(integers(
            a.as_primitive::<Float32Type>()
                .iter()
                .map(|v| v.map(f64::from)),
            target,
        )?),
        DataType::Float64 if integer => {
            Some(integers(a.as_primitive::<Float64Type>().iter(), target)?)
        }
        DataType::Decimal128(_, scale) if integer => Some(decimals(a, *scale, target)?),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
            if *target == DataType::Utf8 =>
        {
            Some(utf8(a)?)
        }
        DataType::List(_) => match target {
            DataType::List(item) => list(a.as_list::<i32>(), item.data_type())?,
            _ => None,
        },
        DataType::LargeList(_) => match target {
            DataType::List(item) => list(a.as_list::<i64>(), item.data_type())?,
            _ => None,
        },
        _ => None,
    })
}

/// Floating-point values as integers: each integral, NaN (pandas' missing value) null.
fn integers(
    values: impl Iterator<Item = Option<f64>>,
    target: &DataType,
) -> std::result::Result<ArrayRef, Bad> {
    let mut out: Vec<Option<i128>> = Vec::new();
    for (i, v) in values.enumerate() {
        out.push(match v {
            None => None,
            Some(x) if x.is_nan() => None,
            Some(x) if x.fract() == 0.0 && x.abs() < 1.9e19 => Some(x as i128),
            Some(x) => return Err((i, format!("{x} is not an integer"))),
        });
    }
    wide_integers(out, target)
}

/// Decimals as integers: exact only (a decimal with a fraction is an error).
fn decimals(a: &ArrayRef, scale: i8, target: &DataType) -> std::result::Result<ArrayRef, Bad> {
    let unit = 10i128
        .checked_pow(u32::from(scale.max(0).unsigned_abs()))
        .ok_or((0, format!("decimal scale {scale} is out of range")))?;
    let mut out: Vec<Option<i128>> = Vec::new();
    for (i, v) in a.as_primitive::<Decimal128Type>().iter().enumerate() {
        out.push(match v {
            None => None,
            Some(x) if scale < 0 => Some(
                x.checked_mul(10i128.pow(u32::from(scale.unsigned_abs())))
                    .ok_or((i, "decimal out of range".to_string()))?,
            ),
            Some(x) if x % unit == 0 => Some(x / unit),
            Some(x) => return Err((i, format!("{x}e-{scale} is not an integer"))),
        });
    }
    wide_integers(out, target)
}

/// Integers as `UInt64` when our type is unsigned 64-bit (block hashes), else as `Int64`.
fn wide_integers(
    values: Vec<Option<i128>>,
    target: &DataType,
) -> std::result::Result<ArrayRef, Bad> {
    let out_of_range = |i: usize, v: i128| (i, format!("{v} is out of range"));
    if *target == DataType::UInt64 {
        let mut out = Vec::with_capacity(values.len());
        for (i, v) in values.into_iter().enumerate() {
            out.push(
                v.map(|v| u64::try_from(v).map_err(|_| out_of_range(i, v)))
                    .transpose()?,
            );
        }
        return Ok(Arc::new(UInt64Array::from(out)));
    }
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        out.push(
            v.map(|v| i64::try_from(v).map_err(|_| out_of_range(i, v)))
                .transpose()?,
        );
    }
    Ok(Arc::new(Int64Array::from(out)))
}

/// Binary values as UTF-8 strings.
fn utf8(a: &ArrayRef) -> std::result::Result<ArrayRef, Bad> {
    let text = |i: usize, b: Option<&[u8]>| -> std::result::Result<Option<String>, Bad> {
        b.map(|b| {
            std::str::from_utf8(b)
                .map(str::to_string)
                .map_err(|e| (i, format!("bytes that are not UTF-8 text ({e})")))
        })
        .transpose()
    };
    type Texts = std::result::Result<Vec<Option<String>>, Bad>;
    let values = match a.data_type() {
        DataType::Binary => a
            .as_binary::<i32>()
            .iter()
            .enumerate()
            .map(|(i, b)| text(i, b))
            .collect::<Texts>(),
        DataType::LargeBinary => a
            .as_binary::<i64>()
            .iter()
            .enumerate()
            .map(|(i, b)| text(i, b))
            .collect::<Texts>(),
        _ => a
            .as_binary_view()
            .iter()
            .enumerate()
            .map(|(i, b)| text(i, b))
            .collect::<Texts>(),
    }?;
    Ok(Arc::new(StringArray::from(values)))
}

/// A list whose items need a change, rebuilt with the items in a type the reader reads
/// (None when they need none). An item's error names its list's row.
fn list<O: OffsetSizeTrait>(
    l: &GenericListArray<O>,
    item: &DataType,
) -> std::result::Result<Option<ArrayRef>, Bad> {
    let row_of = |j: usize| {
        l.value_offsets()
            .partition_point(|o| o.as_usize() <= j)
            .saturating_sub(1)
    };
    let Some(values) = conform(l.values(), item).map_err(|(j, why)| (row_of(j), why))? else {
        return Ok(None);
    };
    let field = Arc::new(Field::new("item", values.data_type().clone(), true));
    GenericListArray::<O>::try_new(field, l.offsets().clone(), values, l.nulls().cloned())
        .map(|a| Some(Arc::new(a) as ArrayRef))
        .map_err(|e| (0, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::{Int32Type, Int8Type as I8};
    use arrow_array::{DictionaryArray, Float64Array, Int8Array, ListArray, NullArray};

    fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(cols).unwrap()
    }

    #[test]
    fn readable_batches_are_not_copied() {
        let b = batch(vec![(
            "request_id",
            Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
        )]);
        assert!(matches!(
            normalize(&b, Path::new("f"), 0).unwrap(),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn pandas_floats_nulls_and_categories_become_ours() {
        let keys = Int8Array::from(vec![Some(0), None, Some(1), Some(0)]);
        let dict: DictionaryArray<I8> =
            DictionaryArray::try_new(keys, Arc::new(StringArray::from(vec!["ok", "timeout"])))
                .unwrap();
        let b = batch(vec![
            ("outcome", Arc::new(dict) as ArrayRef),
            (
                "ttft_us",
                Arc::new(Float64Array::from(vec![
                    Some(1.0),
                    Some(f64::NAN),
                    None,
                    Some(3e9),
                ])),
            ),
            ("prefix_hashes", Arc::new(NullArray::new(4))),
            ("not_ours", Arc::new(Float64Array::from(vec![0.5; 4]))),
        ]);
        let n = normalize(&b, Path::new("f"), 0).unwrap();
        let outcome: Vec<_> = n.column(0).as_string::<i32>().iter().collect();
        assert_eq!(outcome, vec![Some("ok"), None, Some("timeout"), Some("ok")]);
        let ttft: Vec<_> = n
            .column(1)
            .as_primitive::<arrow_array::types::Int64Type>()
            .iter()
            .collect();
        assert_eq!(ttft, vec![Some(1), None, None, Some(3_000_000_000)]);
        assert_eq!(n.column(2).null_count(), 4);
        assert_eq!(n.column(2).data_type(), canonical("prefix_hashes").unwrap());
        // A column that is not ours is left as it is.
        assert_eq!(n.column(3).data_type(), &DataType::Float64);
    }

    #[test]
    fn a_fraction_where_an_integer_belongs_names_its_row() {
        let b = batch(vec![(
            "e2el_us",
            Arc::new(Float64Array::from(vec![1.0, 2.5])) as ArrayRef,
        )]);
        let e = normalize(&b, Path::new("sub.parquet"), 100)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sub.parquet") && e.contains("row 101, column e2el_us: 2.5"),
            "{e}"
        );
        // Inside a list, the row of the list.
        let l = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1)]),
            Some(vec![Some(2), Some(3)]),
        ]);
        let floats = Float64Array::from(vec![1.0, 2.0, 3.5]);
        let l = ListArray::new(
            Arc::new(Field::new("item", DataType::Float64, true)),
            l.offsets().clone(),
            Arc::new(floats),
            None,
        );
        let b = batch(vec![("chunk_times_us", Arc::new(l) as ArrayRef)]);
        let e = normalize(&b, Path::new("f"), 0).unwrap_err().to_string();
        assert!(e.contains("row 1, column chunk_times_us: 3.5"), "{e}");
    }
}
