//! The one per-row skeleton of the line-based importers (Azure and BurstGPT CSV, Mooncake
//! and Qwen JSON lines): read the file line by line ([`for_each_line`]: 1-based numbers, a
//! UTF-8 BOM and `\r` removed, blank lines passed over), decode each line (a CSV record under
//! the file's header in [`csv_records`], a JSON object in [`jsonl_records`]), let the format
//! map its fields, and build the record ([`At::record`]: id `<prefix>:<line>`, recorded token
//! counts, `stream = true`). A row that cannot be read is [`Error::BadRow`] naming the file
//! and its line ([`At::bad`]); nothing is skipped silently.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use trace_format::{Error, Result, TokenSource, TraceRecord};

use crate::out::Sink;

/// Where a row is: the file and its 1-based line, for errors and request ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    /// The source file.
    pub(crate) path: &'a Path,
    /// The 1-based line number.
    pub(crate) line: usize,
}

impl At<'_> {
    /// [`Error::BadRow`] for this row.
    pub(crate) fn bad(&self, message: impl Into<String>) -> Error {
        bad(self.path, self.line, message)
    }

    /// The imported row of this line: id `<prefix>:<line>`, recorded token counts,
    /// `stream = true`.
    pub(crate) fn record(
        &self,
        prefix: &str,
        arrival_us: i64,
        endpoint: &str,
        prompt: i64,
        output: i64,
    ) -> TraceRecord {
        let mut r = TraceRecord::new(format!("{prefix}:{}", self.line), arrival_us, endpoint);
        r.stream = true;
        r.prompt_tokens = Some(prompt);
        r.output_tokens = Some(output);
        r.prompt_tokens_source = Some(TokenSource::Recorded);
        r.output_tokens_source = Some(TokenSource::Recorded);
        r
    }
}

/// [`Error::BadRow`] for `path:line`.
pub(crate) fn bad(path: &Path, line: usize, message: impl Into<String>) -> Error {
    Error::BadRow {
        path: path.to_path_buf(),
        line,
        message: message.into(),
    }
}

/// `path` for reading as text: a gzip file (named `*.gz`, as the Copilot coding-agent shards
/// are published) is decompressed as it is read.
pub(crate) fn open_text(path: &Path) -> Result<Box<dyn BufRead>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let gz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::read::MultiGzDecoder::new(BufReader::new(file)),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file))
    })
}

/// Calls `f(line_no, line)` for every non-blank line of `path` (1-based numbers; a UTF-8
/// BOM and a trailing `\r` are removed), until it returns `false` (no more rows wanted).
pub(crate) fn for_each_line(
    path: &Path,
    mut f: impl FnMut(usize, &str) -> Result<bool>,
) -> Result<()> {
    let mut reader = open_text(path)?;
    let mut buf = String::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = reader.read_line(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                bad(path, line_no + 1, "not UTF-8 text")
            } else {
                Error::io(path, e)
            }
        })?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        let mut line = buf.trim_end_matches(['\n', '\r']);
        if line_no == 1 {
            line = line.trim_start_matches('\u{feff}');
        }
        if line.trim().is_empty() {
            continue;
        }
        if !f(line_no, line)? {
            return Ok(());
        }
    }
}

// ---- CSV ----

/// One data row of a CSV file: its fields, one per header column.
pub(crate) struct CsvRow<'a> {
    /// Where it is.
    pub(crate) at: At<'a>,
    /// Its fields (as many as the header has).
    pub(crate) fields: Vec<String>,
}

impl CsvRow<'_> {
    /// The non-negative integer in column `i`, called `name` in errors.
    pub(crate) fn count(&self, name: &str, i: usize) -> Result<i64> {
        parse_count(self.at.path, self.at.line, name, &self.fields[i])
    }
}

/// Reads a CSV file with a header line: `columns` finds the columns the format reads in the
/// header, then `record` maps every data row (with exactly as many fields as the header) to
/// its record, which goes to `sink` as it is read. A file without a header is an error.
pub(crate) fn csv_records<C>(
    path: &Path,
    sink: &mut dyn Sink,
    columns: impl Fn(&CsvHeader) -> Result<C>,
    mut record: impl FnMut(&CsvRow<'_>, &C) -> Result<TraceRecord>,
) -> Result<()> {
    let mut header: Option<(CsvHeader, C)> = None;
    for_each_line(path, |line_no, line| {
        let Some((h, cols)) = &header else {
            let h = CsvHeader::parse(path, line)?;
            let cols = columns(&h)?;
            header = Some((h, cols));
            return Ok(true);
        };
        let at = At {
            path,
            line: line_no,
        };
        let fields = split_csv_line(line).ok_or_else(|| at.bad("unterminated quote"))?;
        if fields.len() != h.len() {
            return Err(at.bad(format!(
                "{} fields, the header has {}",
                fields.len(),
                h.len()
            )));
        }
        sink.push(record(&CsvRow { at, fields }, cols)?)
    })?;
    if header.is_none() {
        return Err(bad(path, 1, "empty file: no header"));
    }
    Ok(())
}

/// Splits one CSV line (RFC 4180 quoting: `"a,b"`, `""` for a quote; no line breaks inside
/// fields). `None` for an unterminated quote.
pub(crate) fn split_csv_line(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    field.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
        } else if c == '"' && at_start {
            quoted = true;
            at_start = false;
        } else if c == ',' {
            out.push(std::mem::take(&mut field));
            at_start = true;
        } else {
            field.push(c);
            at_start = false;
        }
    }
    if quoted {
        return None;
    }
    out.push(field);
    Some(out)
}

/// A CSV file's header: column index by (trimmed, case-insensitive) name.
pub(crate) struct CsvHeader {
    path: PathBuf,
    names: Vec<String>,
}

impl CsvHeader {
    /// Reads the header line of the file `path`.
    pub(crate) fn parse(path: &Path, line: &str) -> Result<CsvHeader> {
        let names = split_csv_line(line)
            .ok_or_else(|| bad(path, 1, "unterminated quote in the header"))?
            .into_iter()
            .map(|n| n.trim().to_ascii_lowercase())
            .collect();
        Ok(CsvHeader {
            path: path.to_path_buf(),
            names,
        })
    }

    /// The index of column `name`, if there is one.
    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        self.names
            .iter()
            .position(|n| n == &name.to_ascii_lowercase())
    }

    /// The index of column `name`; its absence is an error.
    pub(crate) fn require(&self, name: &str) -> Result<usize> {
        self.find(name).ok_or_else(|| {
            bad(
                &self.path,
                1,
                format!(
                    "no column {name:?} in the header ({})",
                    self.names.join(",")
                ),
            )
        })
    }

    /// The number of columns.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

/// Parses a non-negative integer field.
pub(crate) fn parse_count(path: &Path, line: usize, name: &str, v: &str) -> Result<i64> {
    let t = v.trim();
    // Some exports write integral counts as floats ("12.0").
    let t = t.strip_suffix(".0").unwrap_or(t);
    t.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
        bad(
            path,
            line,
            format!("{name} {v:?} is not a non-negative integer"),
        )
    })
}

// ---- JSON lines ----

/// One row of a JSON-lines file: a JSON object.
pub(crate) struct JsonRow<'a> {
    /// Where it is.
    pub(crate) at: At<'a>,
    /// Its fields.
    pub(crate) obj: &'a Map<String, Value>,
}

impl JsonRow<'_> {
    /// Its `timestamp` (required; each format reads its unit).
    pub(crate) fn timestamp(&self) -> Result<&Value> {
        self.obj
            .get("timestamp")
            .ok_or_else(|| self.at.bad("no timestamp"))
    }

    /// The record of this row (see [`At::record`]) with its `input_length`,
    /// `output_length` and `hash_ids` (as `prefix_hashes`; absent or null is none).
    pub(crate) fn record(
        &self,
        prefix: &str,
        arrival_us: i64,
        endpoint: &str,
    ) -> Result<TraceRecord> {
        let mut r = self.at.record(
            prefix,
            arrival_us,
            endpoint,
            self.count("input_length")?,
            self.count("output_length")?,
        );
        r.prefix_hashes = self.hash_ids()?;
        Ok(r)
    }

    /// A non-negative integer field (`input_length`, `output_length`).
    fn count(&self, name: &str) -> Result<i64> {
        self.obj
            .get(name)
            .and_then(Value::as_i64)
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                self.at
                    .bad(format!("{name} missing or not a non-negative integer"))
            })
    }

    /// The `hash_ids` (Mooncake, Qwen Bailian): absent or null is None.
    fn hash_ids(&self) -> Result<Option<Vec<u64>>> {
        match self.obj.get("hash_ids") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|h| {
                    h.as_u64().ok_or_else(|| {
                        self.at
                            .bad(format!("hash id {h} is not a non-negative integer"))
                    })
                })
                .collect::<Result<Vec<u64>>>()
                .map(Some),
            Some(other) => Err(self.at.bad(format!("hash_ids {other} is not an array"))),
        }
    }
}

/// Reads a JSON-lines file: every line a JSON object that `record` maps to its record, which
/// goes to `sink` as it is read.
pub(crate) fn jsonl_records(
    path: &Path,
    sink: &mut dyn Sink,
    mut record: impl FnMut(&JsonRow<'_>) -> Result<TraceRecord>,
) -> Result<()> {
    jsonl_rows(path, sink, |row, out| {
        out.push(record(row)?);
        Ok(())
    })
}

/// Reads a JSON-lines file whose lines may hold any number of requests (a session of an
/// agent trace per line, or events that are not requests): `rows` puts the records of each
/// line's JSON object in the vector it is given (in the order they go on, linked as the line
/// links them), and they go to `sink` line by line.
pub(crate) fn jsonl_rows(
    path: &Path,
    sink: &mut dyn Sink,
    mut rows: impl FnMut(&JsonRow<'_>, &mut Vec<TraceRecord>) -> Result<()>,
) -> Result<()> {
    let mut line_rows = Vec::new();
    for_each_line(path, |line_no, line| {
        let at = At {
            path,
            line: line_no,
        };
        let v: Value = serde_json::from_str(line).map_err(|e| at.bad(format!("not JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| at.bad("not a JSON object"))?;
        rows(&JsonRow { at, obj }, &mut line_rows)?;
        sink.push_all(std::mem::take(&mut line_rows))
    })
}

/// Typed reads of the fields of one JSON object of a row, each error naming the row and the
/// field (`what` is the object's path in the row, e.g. `request` or `requests[3]`).
pub(crate) struct Fields<'a> {
    /// Where the row is.
    pub(crate) at: At<'a>,
    /// The object's path in the row, for errors (empty for the line's own object).
    pub(crate) what: String,
    /// The object.
    pub(crate) obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// The fields of the line's own object.
    pub(crate) fn of(row: &JsonRow<'a>) -> Fields<'a> {
        Fields {
            at: row.at,
            what: String::new(),
            obj: row.obj,
        }
    }

    fn name(&self, field: &str) -> String {
        if self.what.is_empty() {
            field.to_string()
        } else {
            format!("{}.{field}", self.what)
        }
    }

    /// The error for `field`: `<what>.<field> <why>`.
    pub(crate) fn bad(&self, field: &str, why: impl fmt::Display) -> Error {
        self.at.bad(format!("{} {why}", self.name(field)))
    }

    /// The value of `field`; null counts as absent.
    pub(crate) fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    /// The object in `field` (required).
    pub(crate) fn object(&self, field: &str) -> Result<Fields<'a>> {
        match self.get(field) {
            Some(Value::Object(obj)) => Ok(Fields {
                at: self.at,
                what: self.name(field),
                obj,
            }),
            None => Err(self.bad(field, "missing")),
            Some(v) => Err(self.bad(field, format!("{v} is not an object"))),
        }
    }

    /// The array in `field` (required).
    pub(crate) fn array(&self, field: &str) -> Result<&'a Vec<Value>> {
        match self.get(field) {
            Some(Value::Array(a)) => Ok(a),
            None => Err(self.bad(field, "missing")),
            Some(v) => Err(self.bad(field, format!("{v} is not an array"))),
        }
    }

    /// Element `i` of an array read from `field`, as an object.
    pub(crate) fn element(&self, field: &str, i: usize, v: &'a Value) -> Result<Fields<'a>> {
        let what = format!("{}[{i}]", self.name(field));
        match v {
            Value::Object(obj) => Ok(Fields {
                at: self.at,
                what,
                obj,
            }),
            v => Err(self.at.bad(format!("{what} {v} is not an object"))),
        }
    }

    /// A string field (a number is taken as its decimal text); absent is None.
    pub(crate) fn opt_str(&self, field: &str) -> Result<Option<String>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(v) => Err(self.bad(field, format!("{v} is not a string"))),
        }
    }

    /// A required string field.
    pub(crate) fn str(&self, field: &str) -> Result<String> {
        self.opt_str(field)?
            .ok_or_else(|| self.bad(field, "missing"))
    }

    /// A non-negative integer field (`12.0` is accepted); absent is None.
    pub(crate) fn opt_count(&self, field: &str) -> Result<Option<i64>> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        let n = v.as_i64().or_else(|| {
            v.as_f64()
                .filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x < 9.0e15)
                .map(|x| x as i64)
        });
        n.filter(|n| *n >= 0)
            .map(Some)
            .ok_or_else(|| self.bad(field, format!("{v} is not a non-negative integer")))
    }

    /// A required non-negative integer field.
    pub(crate) fn count(&self, field: &str) -> Result<i64> {
        self.opt_count(field)?
            .ok_or_else(|| self.bad(field, "missing"))
    }

    /// A non-negative number of `unit_us` µs (1000 for ms, 1e6 for s) as µs, to the nearest
    /// µs; absent is None.
    pub(crate) fn opt_duration_us(&self, field: &str, unit_us: f64) -> Result<Option<i64>> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        v.as_f64()
            .filter(|x| x.is_finite() && *x >= 0.0 && x * unit_us < 9.0e18)
            .map(|x| Some((x * unit_us).round() as i64))
            .ok_or_else(|| self.bad(field, format!("{v} is not a non-negative number")))
    }

    /// The positive block size in `field`, which must equal the one an earlier row of the
    /// file gave (`seen`: the size and its line; one block size per file).
    pub(crate) fn block_size(&self, field: &str, seen: &mut Option<(u32, usize)>) -> Result<u32> {
        let size = self.count(field)?;
        let size = u32::try_from(size)
            .ok()
            .filter(|b| *b > 0)
            .ok_or_else(|| self.bad(field, format!("{size} is out of range")))?;
        match *seen {
            Some((b, line)) if b != size => Err(self.bad(
                field,
                format!("{size} differs from {b} on line {line} (one block size per file)"),
            )),
            _ => {
                *seen = Some((size, self.at.line));
                Ok(size)
            }
        }
    }

    /// An array of non-negative integers (block hash ids); absent is None.
    pub(crate) fn opt_hashes(&self, field: &str) -> Result<Option<Vec<u64>>> {
        if self.get(field).is_none() {
            return Ok(None);
        }
        self.array(field)?
            .iter()
            .map(|h| {
                h.as_u64().ok_or_else(|| {
                    self.bad(field, format!("hash id {h} is not a non-negative integer"))
                })
            })
            .collect::<Result<Vec<u64>>>()
            .map(Some)
    }
}

// ---- values ----

/// Parses a decimal number of seconds (`12`, `12.5`, `1.25e2`) into µs, exactly for up to
/// six fractional digits (more are rounded to the nearest µs).
pub(crate) fn seconds_to_us(v: &str) -> Option<i64> {
    let t = v.trim();
    if t.is_empty() || t.contains(['e', 'E']) || t.starts_with('-') {
        let x: f64 = t.parse().ok()?;
        return (x.is_finite() && x >= 0.0).then(|| (x * 1e6).round() as i64);
    }
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut us: i64 = 0;
    let digits = frac.as_bytes();
    for i in 0..6 {
        us = us * 10 + digits.get(i).map_or(0, |d| i64::from(d - b'0'));
    }
    if digits.len() > 6 && digits[6] >= b'5' {
        us += 1;
    }
    secs.checked_mul(1_000_000)?.checked_add(us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_lines_split_with_quotes() {
        assert_eq!(split_csv_line("a,b,,c").unwrap(), vec!["a", "b", "", "c"]);
        assert_eq!(
            split_csv_line(r#""x,y",2,"say ""hi""""#).unwrap(),
            vec!["x,y", "2", r#"say "hi""#]
        );
        assert!(split_csv_line(r#""open,1"#).is_none());
    }

    #[test]
    fn seconds_parse_exactly() {
        assert_eq!(seconds_to_us("12"), Some(12_000_000));
        assert_eq!(seconds_to_us("0.000001"), Some(1));
        assert_eq!(seconds_to_us("5.25"), Some(5_250_000));
        assert_eq!(seconds_to_us("1.0000005"), Some(1_000_001));
        assert_eq!(seconds_to_us("1.5e1"), Some(15_000_000));
        assert_eq!(seconds_to_us("x"), None);
        assert_eq!(seconds_to_us("-1"), None);
        assert_eq!(seconds_to_us(""), None);
    }
}
