//! Fuzzing the Parquet trace reader: trace files written with several writer settings
//! (Snappy as our writer writes them, uncompressed so mutations reach the decoders, with and
//! without dictionaries, data pages v1 and v2, small pages so a file has many) are damaged
//! with multi-byte mutations aimed mostly inside column chunks (page headers, definition
//! levels, validity bitmaps, values), and every damaged file is read in-process. Any input
//! must be a value or an error naming the file: never a panic; and a [`TraceStream`] of the
//! same bytes must read the same records or fail too.
//!
//! `LLMREPLAY_FUZZ_CASES` sets the number of mutated files per writer setting (default a
//! few hundred, a few seconds in CI); `bench/fuzz.sh` runs many more. Inputs that ever
//! crashed are kept in `tests/fuzz-regressions/parquet/` and read by
//! `regression_files_are_errors_naming_the_file`.

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::file::reader::{FileReader, SerializedFileReader};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trace_format::encode::records_to_batch;
use trace_format::reader::{read_trace_bytes, RemoteFile, RemoteFiles};
use trace_format::schema::{Outcome, TokenSource};
use trace_format::{FileMeta, Producer, TraceRecord, TraceStream};

/// Rows with every kind of column: nulls in every optional column (definition levels and
/// validity bitmaps), empty and null lists, repeated strings (dictionaries).
fn records(n: i64) -> Vec<TraceRecord> {
    (0..n)
        .map(|i| {
            let mut r = TraceRecord::new(format!("req-{i}"), 1_700_000_000_000_000 + i * 997, {
                if i % 3 == 0 {
                    "/v1/completions"
                } else {
                    "/v1/chat/completions"
                }
            });
            let some = |k: i64| i % k != 0;
            r.session_id = some(2).then(|| format!("s-{}", i % 5));
            r.model = some(3).then(|| "llama".to_string());
            r.stream = i % 2 == 0;
            r.prompt_tokens = some(4).then_some(100 + i);
            r.output_tokens = some(5).then_some(i * 3);
            r.max_tokens = some(7).then_some(256);
            r.prompt_tokens_source = some(4).then_some(TokenSource::Usage);
            r.output_tokens_source = some(6).then_some(TokenSource::Estimate);
            r.status = some(3).then_some(200);
            r.outcome = if i % 11 == 0 {
                Outcome::HttpError
            } else {
                Outcome::Ok
            };
            r.error = (i % 11 == 0).then(|| format!("upstream said {i}"));
            r.ttft_us = some(2).then_some(10_000 + i);
            r.e2el_us = some(3).then_some(90_000 + i);
            r.chunk_times_us = (0..(i % 4)).map(|k| k * 1000).collect();
            r.chunk_tokens = some(2).then(|| (0..(i % 3) as i32).collect());
            r.body = (i % 9 == 0).then(|| format!("{{\"prompt\":\"p{i}\"}}"));
            r.prefix_hashes = some(3).then(|| vec![i as u64, u64::MAX - i as u64]);
            r.request_bytes = i;
            r.response_bytes = 2 * i;
            r.scheduled_offset_us = some(2).then_some(i);
            r.dispatch_lag_us = some(5).then_some(-i);
            r.queue_us = some(3).then_some(i);
            r.new_connection = some(2).then_some(i % 4 == 0);
            r.connect_us = some(4).then_some(i);
            r.target = some(2).then(|| "cand".to_string());
            r.run_id = some(2).then(|| "run".to_string());
            r
        })
        .collect()
}

/// The writer settings a damaged file may come from.
fn settings() -> Vec<(&'static str, WriterProperties)> {
    let kv = FileMeta::new(Producer::Import, "fuzz").to_kv();
    let base = || WriterProperties::builder().set_key_value_metadata(Some(kv.clone()));
    vec![
        (
            "snappy",
            base().set_compression(Compression::SNAPPY).build(),
        ),
        (
            "plain",
            base().set_compression(Compression::UNCOMPRESSED).build(),
        ),
        (
            "plain-nodict-small-pages",
            base()
                .set_compression(Compression::UNCOMPRESSED)
                .set_dictionary_enabled(false)
                .set_data_page_row_count_limit(16)
                .set_write_batch_size(16)
                .build(),
        ),
        (
            "plain-v2",
            base()
                .set_compression(Compression::UNCOMPRESSED)
                .set_writer_version(WriterVersion::PARQUET_2_0)
                .set_data_page_row_count_limit(32)
                .set_write_batch_size(32)
                .build(),
        ),
        (
            "snappy-v2-nodict",
            base()
                .set_compression(Compression::SNAPPY)
                .set_writer_version(WriterVersion::PARQUET_2_0)
                .set_dictionary_enabled(false)
                .build(),
        ),
    ]
}

fn write(props: WriterProperties, rows: i64) -> Vec<u8> {
    let batch = records_to_batch(&records(rows)).unwrap();
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    out
}

/// The byte ranges of every column chunk (dictionary page, data pages) of a file.
fn chunk_ranges(file: &[u8]) -> Vec<(usize, usize)> {
    let r = SerializedFileReader::new(Bytes::copy_from_slice(file)).unwrap();
    let mut out = Vec::new();
    for rg in r.metadata().row_groups() {
        for c in rg.columns() {
            let (start, len) = c.byte_range();
            out.push((start as usize, (start + len) as usize));
        }
    }
    out
}

/// Damages `file`: 1 to 8 mutations, nine in ten inside one column chunk.
fn mutate(rng: &mut ChaCha8Rng, file: &[u8], ranges: &[(usize, usize)]) -> Vec<u8> {
    let mut m = file.to_vec();
    let ops = rng.gen_range(1..=8);
    for _ in 0..ops {
        let (lo, hi) = if rng.gen_bool(0.9) && !ranges.is_empty() {
            ranges[rng.gen_range(0..ranges.len())]
        } else {
            (0, m.len())
        };
        let hi = hi.min(m.len());
        if hi <= lo {
            continue;
        }
        let at = rng.gen_range(lo..hi);
        match rng.gen_range(0..7) {
            0 => m[at] ^= 1 << rng.gen_range(0..8),
            1 => m[at] = rng.gen(),
            2 => m[at] = [0x00, 0xff, 0x7f, 0x80, 0x01][rng.gen_range(0..5)],
            3 => {
                // A run of random bytes (a damaged sector, a bitmap, a length field).
                let n = rng.gen_range(1..=16).min(hi - at);
                rng.fill(&mut m[at..at + n]);
            }
            4 => m[at] = m[at].wrapping_add(rng.gen_range(1..=4)),
            5 => m[at] = m[at].wrapping_sub(rng.gen_range(1..=4)),
            _ => {
                // A run of 0xff or 0x00 (all valid / all null bitmaps, huge varints).
                let n = rng.gen_range(1..=8).min(hi - at);
                let b = if rng.gen_bool(0.5) { 0xff } else { 0x00 };
                m[at..at + n].fill(b);
            }
        }
    }
    m
}

/// What reading one input did.
enum Outcome2 {
    Read,
    Error(String),
    Panic(String),
}

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// One file held in memory, as a remote source, for the stream.
struct OneFile(String, Bytes);

impl RemoteFiles for OneFile {
    fn claims(&self, _input: &str) -> bool {
        true
    }
    fn list(&self, _input: &str) -> trace_format::Result<Vec<RemoteFile>> {
        let data = self.1.clone();
        Ok(vec![RemoteFile {
            name: self.0.clone(),
            fetch: Box::new(move || Ok(data.clone())),
        }])
    }
}

/// `data` read by a [`TraceStream`]: its records in arrival order, or its first error.
fn stream(data: &[u8], name: &Path) -> trace_format::Result<Vec<TraceRecord>> {
    let one = OneFile(name.display().to_string(), Bytes::copy_from_slice(data));
    let s = TraceStream::open_with(&["mem"], &one)?;
    s.records().collect()
}

/// Reads `data` in-process, whole and as a stream, catching a panic (its message is kept by
/// a quiet hook). The stream must agree with the whole read: the same records (in arrival
/// order), or an error too.
fn read(data: &[u8], name: &Path) -> Outcome2 {
    let got = panic::catch_unwind(AssertUnwindSafe(|| {
        let whole = read_trace_bytes(Bytes::copy_from_slice(data), name);
        (whole, stream(data, name))
    }));
    match got {
        Ok((Ok((_, mut records)), streamed)) => {
            records.sort_by_key(|r| r.arrival_time_us);
            match streamed {
                Ok(s) if s == records => Outcome2::Read,
                Ok(_) => Outcome2::Panic("the stream read other records".into()),
                Err(e) => Outcome2::Panic(format!("the stream failed where a read did not: {e}")),
            }
        }
        Ok((Err(e), Ok(_))) => Outcome2::Panic(format!("the stream read what a read refused: {e}")),
        Ok((Err(e), Err(s))) => {
            if s.to_string().contains(&name.display().to_string()) {
                Outcome2::Error(e.to_string())
            } else {
                Outcome2::Panic(format!("a stream error without the file: {s}"))
            }
        }
        Err(_) => Outcome2::Panic(
            LAST_PANIC
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| "?".into()),
        ),
    }
}

fn quiet_panics() {
    panic::set_hook(Box::new(|info| {
        *LAST_PANIC.lock().unwrap() = Some(info.to_string());
    }));
}

fn regression_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions/parquet")
}

#[test]
fn mutated_trace_files_are_values_or_errors_never_panics() {
    let per_setting = u64::from(wire::testing::fuzz_cases(300));
    let seed: u64 = std::env::var("LLMREPLAY_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(17);
    quiet_panics();
    let name = Path::new("damaged.parquet");
    let mut panics = Vec::new();
    let mut runs = 0u64;
    let mut errors = 0u64;
    let mut guarded = 0u64;
    for (si, (label, props)) in settings().into_iter().enumerate() {
        let file = write(props, 200);
        let ranges = chunk_ranges(&file);
        assert!(matches!(read(&file, name), Outcome2::Read), "{label}");
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((si as u64) << 32));
        for case in 0..per_setting {
            let m = mutate(&mut rng, &file, &ranges);
            runs += 1;
            if let Ok(dir) = std::env::var("LLMREPLAY_FUZZ_SAVE") {
                // Kept before the read: an input that aborts the process (an allocation
                // failure is no panic) is left here.
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::fs::write(Path::new(&dir).join("last-input.parquet"), &m);
            }
            match read(&m, name) {
                Outcome2::Read => {}
                Outcome2::Error(e) => {
                    errors += 1;
                    guarded += u64::from(e.contains("the decoder failed"));
                    assert!(
                        e.contains("damaged.parquet"),
                        "{label}: error without the file: {e}"
                    );
                }
                Outcome2::Panic(msg) => {
                    if let Ok(dir) = std::env::var("LLMREPLAY_FUZZ_SAVE") {
                        let _ = std::fs::create_dir_all(&dir);
                        let p = Path::new(&dir).join(format!("{label}-{seed}-{case}.parquet"));
                        let _ = std::fs::write(&p, &m);
                    }
                    panics.push(format!("{label} case {case}: {msg}"));
                }
            }
        }
    }
    let _ = panic::take_hook();
    eprintln!(
        "parquet fuzz: {runs} mutated files, {errors} errors ({guarded} of them panics inside \
         the parquet crate, caught by the reader's guard), {} panics escaped",
        panics.len()
    );
    assert!(
        panics.is_empty(),
        "{} panics:\n{}",
        panics.len(),
        panics.join("\n")
    );
}

/// Every input that once crashed the reader (found by the sweep above; the file name says
/// where it panicked) is an error naming the file, through the path API `replay` uses, the
/// in-memory one and the stream `inspect` and `export` read. No panic is caught here: one fails the
/// test.
#[test]
fn regression_files_are_errors_naming_the_file() {
    let mut n = 0;
    for e in std::fs::read_dir(regression_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "parquet") {
            continue;
        }
        n += 1;
        let err = trace_format::read_traces(&[p.to_str().unwrap()])
            .err()
            .unwrap_or_else(|| panic!("{} read without error", p.display()));
        let msg = err.to_string();
        assert!(msg.contains(&*p.to_string_lossy()), "{msg}");
        let data = std::fs::read(&p).unwrap();
        assert!(read_trace_bytes(Bytes::from(data), &p).is_err());
        let streamed = TraceStream::open(&[p.to_str().unwrap()])
            .and_then(|s| s.records().collect::<trace_format::Result<Vec<_>>>());
        let msg = match streamed {
            Ok(_) => panic!("{} streamed without error", p.display()),
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(&*p.to_string_lossy()), "{msg}");
    }
    assert!(n >= 9, "regression files missing");
}
