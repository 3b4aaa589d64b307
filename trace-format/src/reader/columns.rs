//! Arrow batches of a trace file into records: columns found by name, tolerant of physical
//! types (any integer width, any timestamp unit, large and view strings), strict about
//! values (an unknown outcome or token source is an error naming the file and row).

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{
    Array, BooleanArray, GenericListArray, LargeStringArray, PrimitiveArray, RecordBatch,
    StringArray, StringViewArray,
};
use arrow_schema::{DataType, Schema, TimeUnit};

use super::foreign;
use crate::error::{Error, Result};
use crate::fleet::LinkKeys;
use crate::schema::{col, Outcome, ParentLink, TokenSource, TraceRecord};

/// Columns a file must have to be a trace.
const REQUIRED: [&str; 5] = [
    col::REQUEST_ID,
    col::ARRIVAL_TIME,
    col::ENDPOINT,
    col::STREAM,
    col::OUTCOME,
];

pub(super) fn check_required(schema: &Schema, path: &Path) -> Result<()> {
    for name in REQUIRED {
        if schema.field_with_name(name).is_err() {
            return Err(Error::NotATrace {
                path: path.to_path_buf(),
                reason: format!("required column {name} is missing"),
            });
        }
    }
    Ok(())
}

/// Converts one Arrow batch of a trace file to records. Columns are found by name; missing
/// optional columns read as null (lists as empty, byte counts as 0).
pub fn batch_to_records(batch: &RecordBatch, path: &Path) -> Result<Vec<TraceRecord>> {
    convert(batch, path, 0)
}

/// [`batch_to_records`] from `first_row` of the file, the bodies' stored strings put back
/// ([`crate::blobs`]).
pub(crate) fn convert(
    batch: &RecordBatch,
    path: &Path,
    first_row: usize,
) -> Result<Vec<TraceRecord>> {
    let mut rows = convert_rows(batch, path, first_row)?;
    crate::blobs::restore_rows(&mut rows, path)?;
    Ok(rows)
}

fn convert_rows(batch: &RecordBatch, path: &Path, first_row: usize) -> Result<Vec<TraceRecord>> {
    let normalized = foreign::normalize(batch, path, first_row)?;
    let batch: &RecordBatch = &normalized;
    let cx = Cx {
        batch,
        path,
        first_row,
    };
    check_required(batch.schema_ref(), path)?;
    let request_id = cx.strs(col::REQUEST_ID)?;
    let session_id = cx.strs(col::SESSION_ID)?;
    let parent_request_id = cx.strs(col::PARENT_REQUEST_ID)?;
    let think_time = cx.ints(col::THINK_TIME_US)?;
    let arrival = cx.times(col::ARRIVAL_TIME)?;
    let endpoint = cx.strs(col::ENDPOINT)?;
    let model = cx.strs(col::MODEL)?;
    let stream = cx.bools(col::STREAM)?;
    let prompt_tokens = cx.ints(col::PROMPT_TOKENS)?;
    let output_tokens = cx.ints(col::OUTPUT_TOKENS)?;
    let max_tokens = cx.ints(col::MAX_TOKENS)?;
    let prompt_src = cx.strs(col::PROMPT_TOKENS_SOURCE)?;
    let output_src = cx.strs(col::OUTPUT_TOKENS_SOURCE)?;
    let status = cx.ints(col::STATUS)?;
    let outcome = cx.strs(col::OUTCOME)?;
    let error = cx.strs(col::ERROR)?;
    let ttft = cx.ints(col::TTFT_US)?;
    let e2el = cx.ints(col::E2EL_US)?;
    let chunk_times = cx.lists(col::CHUNK_TIMES_US)?;
    let chunk_tokens = cx.lists(col::CHUNK_TOKENS)?;
    let body = cx.strs(col::BODY)?;
    let prefix_hashes = cx.lists(col::PREFIX_HASHES)?;
    let request_bytes = cx.ints(col::REQUEST_BYTES)?;
    let response_bytes = cx.ints(col::RESPONSE_BYTES)?;
    let scheduled = cx.ints(col::SCHEDULED_OFFSET_US)?;
    let dispatch_lag = cx.ints(col::DISPATCH_LAG_US)?;
    let queue = cx.ints(col::QUEUE_US)?;
    let new_connection = cx.bools(col::NEW_CONNECTION)?;
    let connect = cx.ints(col::CONNECT_US)?;
    let target = cx.strs(col::TARGET)?;
    let run_id = cx.strs(col::RUN_ID)?;
    let captured_status = cx.ints(col::CAPTURED_STATUS)?;
    let captured_outcome = cx.strs(col::CAPTURED_OUTCOME)?;
    let synthesized_body = cx.bools(col::SYNTHESIZED_BODY)?;
    let trace_id = cx.strs(col::TRACE_ID)?;
    let span_id = cx.strs(col::SPAN_ID)?;
    let ttfat = cx.ints(col::TTFAT_US)?;
    let reasoning_tokens = cx.ints(col::REASONING_TOKENS)?;
    let reasoning_src = cx.strs(col::REASONING_TOKENS_SOURCE)?;
    let tools_offered = cx.ints(col::TOOLS_OFFERED)?;
    let tool_names = cx.str_lists(col::TOOL_NAMES)?;
    let tool_calls = cx.ints(col::TOOL_CALLS)?;
    let tool_call_names = cx.str_lists(col::TOOL_CALL_NAMES)?;
    let parent_link = cx.strs(col::PARENT_LINK)?;
    let pair_request_id = cx.strs(col::PAIR_REQUEST_ID)?;
    let cached_tokens = cx.ints(col::CACHED_TOKENS)?;
    let images = cx.ints(col::IMAGES)?;
    let image_bytes = cx.ints(col::IMAGE_BYTES)?;
    let image_dims = cx.str_lists(col::IMAGE_DIMS)?;
    let audio_inputs = cx.ints(col::AUDIO_INPUTS)?;
    let audio_bytes = cx.ints(col::AUDIO_BYTES)?;
    let parent_wait = cx.ints(col::PARENT_WAIT_US)?;
    let capture_id = cx.strs(col::CAPTURE_ID)?;
    let capture_started = cx.times(col::CAPTURE_STARTED)?;
    let chat_keys = cx.lists(col::LINK_CHAT_KEYS)?;
    let call_keys = cx.lists(col::LINK_CALL_KEYS)?;
    let arg_keys = cx.lists(col::LINK_ARG_KEYS)?;
    let one_keys = [
        col::LINK_ANSWER_KEY,
        col::LINK_RESULT_KEY,
        col::LINK_OPENING_KEY,
        col::LINK_CLIENT_KEY,
        col::LINK_RESPONSE_KEY,
        col::LINK_PREVIOUS_RESPONSE_KEY,
    ]
    .map(|c| cx.ints(c).map(|v| (c, v)));
    let [answer_key, result_key, opening_key, client_key, response_key, previous_key] = one_keys;
    let (answer_key, result_key, opening_key) = (answer_key?, result_key?, opening_key?);
    let (client_key, response_key, previous_key) = (client_key?, response_key?, previous_key?);

    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let s = |c: &Strs<'_>| c.get(i).map(str::to_string);
        let required_str = |c: &Strs<'_>, name: &str| {
            c.get(i)
                .map(str::to_string)
                .ok_or_else(|| cx.bad(i, name, "null in a required column"))
        };
        let i64_of = |c: &Ints<'_>, name: &str| -> Result<Option<i64>> {
            c.get(i)
                .map(|v| i64::try_from(v).map_err(|_| cx.bad(i, name, "value out of range")))
                .transpose()
        };
        let source = |c: &Strs<'_>, name: &str| -> Result<Option<TokenSource>> {
            c.get(i)
                .map(|v| v.parse::<TokenSource>().map_err(|e| cx.bad(i, name, &e)))
                .transpose()
        };
        let i32_of = |c: &Ints<'_>, name: &str| -> Result<Option<i32>> {
            c.get(i)
                .map(|v| i32::try_from(v).map_err(|_| cx.bad(i, name, "value out of range")))
                .transpose()
        };
        let key_of = |(name, c): &(&str, Ints<'_>)| -> Result<Option<u64>> {
            c.get(i)
                .map(|v| u64::try_from(v).map_err(|_| cx.bad(i, name, "not a uint64 key")))
                .transpose()
        };
        let outcome_str = outcome
            .get(i)
            .ok_or_else(|| cx.bad(i, col::OUTCOME, "null in a required column"))?;
        let rec = TraceRecord {
            request_id: required_str(&request_id, col::REQUEST_ID)?,
            session_id: s(&session_id),
            parent_request_id: s(&parent_request_id),
            think_time_us: i64_of(&think_time, col::THINK_TIME_US)?,
            arrival_time_us: arrival
                .get(i)
                .ok_or_else(|| cx.bad(i, col::ARRIVAL_TIME, "null in a required column"))?,
            endpoint: required_str(&endpoint, col::ENDPOINT)?,
            model: s(&model),
            stream: bool_at(stream, i)
                .ok_or_else(|| cx.bad(i, col::STREAM, "null in a required column"))?,
            prompt_tokens: i64_of(&prompt_tokens, col::PROMPT_TOKENS)?,
            output_tokens: i64_of(&output_tokens, col::OUTPUT_TOKENS)?,
            max_tokens: i64_of(&max_tokens, col::MAX_TOKENS)?,
            prompt_tokens_source: source(&prompt_src, col::PROMPT_TOKENS_SOURCE)?,
            output_tokens_source: source(&output_src, col::OUTPUT_TOKENS_SOURCE)?,
            status: status
                .get(i)
                .map(|v| u16::try_from(v).map_err(|_| cx.bad(i, col::STATUS, "not an HTTP status")))
                .transpose()?,
            outcome: outcome_str
                .parse::<Outcome>()
                .map_err(|e| cx.bad(i, col::OUTCOME, &e))?,
            error: s(&error),
            ttft_us: i64_of(&ttft, col::TTFT_US)?,
            e2el_us: i64_of(&e2el, col::E2EL_US)?,
            chunk_times_us: chunk_times
                .get::<i64>(i, &cx, col::CHUNK_TIMES_US)?
                .unwrap_or_default(),
            chunk_tokens: chunk_tokens.get::<i32>(i, &cx, col::CHUNK_TOKENS)?,
            body: s(&body),
            prefix_hashes: prefix_hashes.get::<u64>(i, &cx, col::PREFIX_HASHES)?,
            request_bytes: i64_of(&request_bytes, col::REQUEST_BYTES)?.unwrap_or(0),
            response_bytes: i64_of(&response_bytes, col::RESPONSE_BYTES)?.unwrap_or(0),
            scheduled_offset_us: i64_of(&scheduled, col::SCHEDULED_OFFSET_US)?,
            dispatch_lag_us: i64_of(&dispatch_lag, col::DISPATCH_LAG_US)?,
            queue_us: i64_of(&queue, col::QUEUE_US)?,
            new_connection: bool_at(new_connection, i),
            connect_us: i64_of(&connect, col::CONNECT_US)?,
            target: s(&target),
            run_id: s(&run_id),
            captured_status: captured_status
                .get(i)
                .map(|v| {
                    u16::try_from(v)
                        .map_err(|_| cx.bad(i, col::CAPTURED_STATUS, "not an HTTP status"))
                })
                .transpose()?,
            captured_outcome: captured_outcome
                .get(i)
                .map(|v| {
                    v.parse::<Outcome>()
                        .map_err(|e| cx.bad(i, col::CAPTURED_OUTCOME, &e))
                })
                .transpose()?,
            synthesized_body: bool_at(synthesized_body, i),
            trace_id: s(&trace_id),
            span_id: s(&span_id),
            ttfat_us: i64_of(&ttfat, col::TTFAT_US)?,
            reasoning_tokens: i64_of(&reasoning_tokens, col::REASONING_TOKENS)?,
            reasoning_tokens_source: source(&reasoning_src, col::REASONING_TOKENS_SOURCE)?,
            tools_offered: i32_of(&tools_offered, col::TOOLS_OFFERED)?,
            tool_names: tool_names.get(i, &cx, col::TOOL_NAMES)?,
            tool_calls: i32_of(&tool_calls, col::TOOL_CALLS)?,
            tool_call_names: tool_call_names.get(i, &cx, col::TOOL_CALL_NAMES)?,
            parent_link: parent_link
                .get(i)
                .map(|v| {
                    v.parse::<ParentLink>()
                        .map_err(|e| cx.bad(i, col::PARENT_LINK, &e))
                })
                .transpose()?,
            pair_request_id: s(&pair_request_id),
            cached_tokens: i64_of(&cached_tokens, col::CACHED_TOKENS)?,
            images: i32_of(&images, col::IMAGES)?,
            image_bytes: i64_of(&image_bytes, col::IMAGE_BYTES)?,
            image_dims: image_dims.get(i, &cx, col::IMAGE_DIMS)?,
            audio_inputs: i32_of(&audio_inputs, col::AUDIO_INPUTS)?,
            audio_bytes: i64_of(&audio_bytes, col::AUDIO_BYTES)?,
            parent_wait_us: i64_of(&parent_wait, col::PARENT_WAIT_US)?,
            capture_id: s(&capture_id),
            capture_started_us: capture_started.get(i),
            link_keys: LinkKeys {
                chat: chat_keys.get::<u64>(i, &cx, col::LINK_CHAT_KEYS)?,
                answer: key_of(&answer_key)?,
                calls: call_keys.get::<u64>(i, &cx, col::LINK_CALL_KEYS)?,
                args: arg_keys.get::<u64>(i, &cx, col::LINK_ARG_KEYS)?,
                result: key_of(&result_key)?,
                opening: key_of(&opening_key)?,
                client: key_of(&client_key)?,
                response: key_of(&response_key)?,
                previous_response: key_of(&previous_key)?,
            },
        };
        out.push(rec);
    }
    Ok(out)
}

/// The arrival times of a batch (which may hold only that column), µs since the epoch; a
/// null is an error naming the file and row, as in [`convert`].
pub(crate) fn arrivals(batch: &RecordBatch, path: &Path, first_row: usize) -> Result<Vec<i64>> {
    let normalized = foreign::normalize(batch, path, first_row)?;
    let batch: &RecordBatch = &normalized;
    let cx = Cx {
        batch,
        path,
        first_row,
    };
    let arrival = cx.times(col::ARRIVAL_TIME)?;
    (0..batch.num_rows())
        .map(|i| {
            arrival
                .get(i)
                .ok_or_else(|| cx.bad(i, col::ARRIVAL_TIME, "null in a required column"))
        })
        .collect()
}

/// A row's request id, arrival and capture: what a stream's content hash and its captures
/// read ([`row_keys`]).
pub(crate) struct RowKey {
    pub(crate) request_id: String,
    pub(crate) arrival_us: i64,
    pub(crate) capture_id: Option<String>,
    pub(crate) capture_started_us: Option<i64>,
}

/// The [`RowKey`] of each row of a batch (decoding only those columns).
pub(crate) fn row_keys(batch: &RecordBatch, path: &Path, first_row: usize) -> Result<Vec<RowKey>> {
    let normalized = foreign::normalize(batch, path, first_row)?;
    let batch: &RecordBatch = &normalized;
    let cx = Cx {
        batch,
        path,
        first_row,
    };
    let ids = cx.strs(col::REQUEST_ID)?;
    let capture_id = cx.strs(col::CAPTURE_ID)?;
    let capture_started = cx.times(col::CAPTURE_STARTED)?;
    let at = arrivals(batch, path, first_row)?;
    at.into_iter()
        .enumerate()
        .map(|(i, a)| {
            let id = ids
                .get(i)
                .ok_or_else(|| cx.bad(i, col::REQUEST_ID, "null in a required column"))?;
            Ok(RowKey {
                request_id: id.to_string(),
                arrival_us: a,
                capture_id: capture_id.get(i).map(str::to_string),
                capture_started_us: capture_started.get(i),
            })
        })
        .collect()
}

/// Conversion context: the batch, its file, and the file row of its first row.
struct Cx<'a> {
    batch: &'a RecordBatch,
    path: &'a Path,
    first_row: usize,
}

impl<'a> Cx<'a> {
    fn column(&self, name: &str) -> Option<&'a dyn Array> {
        let idx = self.batch.schema_ref().index_of(name).ok()?;
        Some(self.batch.column(idx).as_ref())
    }

    fn wrong_type(&self, name: &str, found: &DataType, expected: &str) -> Error {
        Error::NotATrace {
            path: self.path.to_path_buf(),
            reason: format!("column {name} has type {found}, expected {expected}"),
        }
    }

    fn bad(&self, row: usize, name: &str, message: &str) -> Error {
        Error::Format {
            path: self.path.to_path_buf(),
            message: format!("row {}, column {name}: {message}", self.first_row + row),
        }
    }

    fn strs(&self, name: &str) -> Result<Strs<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Strs::Missing);
        };
        match a.data_type() {
            DataType::Utf8 => Ok(Strs::Utf8(a.as_string::<i32>())),
            DataType::LargeUtf8 => Ok(Strs::Large(a.as_string::<i64>())),
            DataType::Utf8View => Ok(Strs::View(a.as_string_view())),
            dt => Err(self.wrong_type(name, dt, "a string")),
        }
    }

    fn bools(&self, name: &str) -> Result<Option<&'a BooleanArray>> {
        let Some(a) = self.column(name) else {
            return Ok(None);
        };
        a.as_boolean_opt()
            .map(Some)
            .ok_or_else(|| self.wrong_type(name, a.data_type(), "a boolean"))
    }

    fn ints(&self, name: &str) -> Result<Ints<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Ints::Missing);
        };
        Ints::of(a).ok_or_else(|| self.wrong_type(name, a.data_type(), "an integer"))
    }

    fn times(&self, name: &str) -> Result<Times<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Times::Missing);
        };
        Ok(match a.data_type() {
            DataType::Timestamp(TimeUnit::Second, _) => {
                Times::Second(a.as_primitive::<TimestampSecondType>())
            }
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                Times::Milli(a.as_primitive::<TimestampMillisecondType>())
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Times::Micro(a.as_primitive::<TimestampMicrosecondType>())
            }
            DataType::Timestamp(TimeUnit::Nanosecond, _) => {
                Times::Nano(a.as_primitive::<TimestampNanosecondType>())
            }
            dt => return Err(self.wrong_type(name, dt, "a timestamp")),
        })
    }

    fn lists(&self, name: &str) -> Result<Lists<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Lists::Missing);
        };
        let expected = "a list of integers";
        match a.data_type() {
            DataType::List(_) => {
                let list = a.as_list::<i32>();
                let values = Ints::of(list.values().as_ref())
                    .ok_or_else(|| self.wrong_type(name, a.data_type(), expected))?;
                Ok(Lists::List(list, values))
            }
            DataType::LargeList(_) => {
                let list = a.as_list::<i64>();
                let values = Ints::of(list.values().as_ref())
                    .ok_or_else(|| self.wrong_type(name, a.data_type(), expected))?;
                Ok(Lists::Large(list, values))
            }
            dt => Err(self.wrong_type(name, dt, expected)),
        }
    }
}

impl<'a> Cx<'a> {
    fn str_lists(&self, name: &str) -> Result<StrLists<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(StrLists::Missing);
        };
        let expected = "a list of strings";
        let (offsets, values): (Vec<usize>, &'a dyn Array) = match a.data_type() {
            DataType::List(_) => {
                let l = a.as_list::<i32>();
                let o = l.value_offsets().iter().map(|&o| o as usize).collect();
                (o, l.values().as_ref())
            }
            DataType::LargeList(_) => {
                let l = a.as_list::<i64>();
                let o = l.value_offsets().iter().map(|&o| o as usize).collect();
                (o, l.values().as_ref())
            }
            dt => return Err(self.wrong_type(name, dt, expected)),
        };
        let strs = match values.data_type() {
            DataType::Utf8 => Strs::Utf8(values.as_string::<i32>()),
            DataType::LargeUtf8 => Strs::Large(values.as_string::<i64>()),
            DataType::Utf8View => Strs::View(values.as_string_view()),
            _ => return Err(self.wrong_type(name, a.data_type(), expected)),
        };
        Ok(StrLists::List {
            list: a,
            offsets,
            values: strs,
        })
    }
}

/// A list-of-strings column, or a missing one (all null).
enum StrLists<'a> {
    Missing,
    List {
        list: &'a dyn Array,
        offsets: Vec<usize>,
        values: Strs<'a>,
    },
}

impl StrLists<'_> {
    /// The list at row `i` (null → None); a null item is an error.
    fn get(&self, i: usize, cx: &Cx<'_>, name: &str) -> Result<Option<Vec<String>>> {
        let StrLists::List {
            list,
            offsets,
            values,
        } = self
        else {
            return Ok(None);
        };
        if list.is_null(i) {
            return Ok(None);
        }
        (offsets[i]..offsets[i + 1])
            .map(|j| {
                values
                    .get(j)
                    .map(str::to_string)
                    .ok_or_else(|| cx.bad(i, name, "null item in a list"))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

fn bool_at(a: Option<&BooleanArray>, i: usize) -> Option<bool> {
    a.filter(|a| a.is_valid(i)).map(|a| a.value(i))
}

/// A string column of any Arrow string type, or a missing one (all null).
enum Strs<'a> {
    Missing,
    Utf8(&'a StringArray),
    Large(&'a LargeStringArray),
    View(&'a StringViewArray),
}

impl<'a> Strs<'a> {
    fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            Strs::Missing => None,
            Strs::Utf8(a) => a.is_valid(i).then(|| a.value(i)),
            Strs::Large(a) => a.is_valid(i).then(|| a.value(i)),
            Strs::View(a) => a.is_valid(i).then(|| a.value(i)),
        }
    }
}

/// A timestamp column of any unit, read as µs since the epoch.
enum Times<'a> {
    Missing,
    Second(&'a PrimitiveArray<TimestampSecondType>),
    Milli(&'a PrimitiveArray<TimestampMillisecondType>),
    Micro(&'a PrimitiveArray<TimestampMicrosecondType>),
    Nano(&'a PrimitiveArray<TimestampNanosecondType>),
}

impl Times<'_> {
    fn get(&self, i: usize) -> Option<i64> {
        match self {
            Times::Missing => None,
            Times::Second(a) => a.is_valid(i).then(|| a.value(i).saturating_mul(1_000_000)),
            Times::Milli(a) => a.is_valid(i).then(|| a.value(i).saturating_mul(1_000)),
            Times::Micro(a) => a.is_valid(i).then(|| a.value(i)),
            Times::Nano(a) => a.is_valid(i).then(|| a.value(i).div_euclid(1_000)),
        }
    }
}

macro_rules! ints_enum {
    ($($v:ident($t:ty)),* $(,)?) => {
        /// An integer column of any width and signedness, or a missing one (all null).
        enum Ints<'a> {
            Missing,
            $($v(&'a PrimitiveArray<$t>),)*
        }

        impl<'a> Ints<'a> {
            fn of(a: &'a dyn Array) -> Option<Self> {
                $(if let Some(p) = a.as_primitive_opt::<$t>() {
                    return Some(Ints::$v(p));
                })*
                None
            }

            /// The value at `i` (null → None), widened so every integer type fits.
            fn get(&self, i: usize) -> Option<i128> {
                match self {
                    Ints::Missing => None,
                    $(Ints::$v(a) => a.is_valid(i).then(|| i128::from(a.value(i))),)*
                }
            }
        }
    };
}

ints_enum!(
    I8(Int8Type),
    I16(Int16Type),
    I32(Int32Type),
    I64(Int64Type),
    U8(UInt8Type),
    U16(UInt16Type),
    U32(UInt32Type),
    U64(UInt64Type),
);

/// A list-of-integers column, or a missing one (all null).
enum Lists<'a> {
    Missing,
    List(&'a GenericListArray<i32>, Ints<'a>),
    Large(&'a GenericListArray<i64>, Ints<'a>),
}

impl Lists<'_> {
    /// The list at row `i` converted to `T` (null → None); a null or out-of-range item is
    /// an error.
    fn get<T: TryFrom<i128>>(&self, i: usize, cx: &Cx<'_>, name: &str) -> Result<Option<Vec<T>>> {
        let (range, values) = match self {
            Lists::Missing => return Ok(None),
            Lists::List(l, v) => {
                if l.is_null(i) {
                    return Ok(None);
                }
                let o = l.value_offsets();
                (o[i] as usize..o[i + 1] as usize, v)
            }
            Lists::Large(l, v) => {
                if l.is_null(i) {
                    return Ok(None);
                }
                let o = l.value_offsets();
                (o[i] as usize..o[i + 1] as usize, v)
            }
        };
        range
            .map(|j| {
                let v = values
                    .get(j)
                    .ok_or_else(|| cx.bad(i, name, "null list item"))?;
                T::try_from(v).map_err(|_| cx.bad(i, name, &format!("list item {v} out of range")))
            })
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }
}
