use std::fs::{self, File};
use std::sync::Arc;

use arrow_array::{RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;

use super::*;
use crate::encode::{records_to_batch, write_trace_file};
use crate::reader::{read_traces, RemoteFile};
use crate::test_records::{full_record, test_meta};

const T0: i64 = 1_700_000_000_000_000;

/// A record arriving at `T0 + at_us`, lasting `e2el_us`.
fn rec(id: &str, at_us: i64, e2el_us: i64) -> TraceRecord {
    let mut r = full_record(0);
    r.request_id = id.to_string();
    r.arrival_time_us = T0 + at_us;
    r.e2el_us = Some(e2el_us);
    r
}

/// Writes `records` in the order given, in row groups of `group_rows` rows.
fn write_grouped(path: &Path, records: &[TraceRecord], group_rows: usize) {
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(test_meta().to_kv()))
        .set_max_row_group_row_count(Some(group_rows))
        .build();
    let batch = records_to_batch(records).unwrap();
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    for start in (0..batch.num_rows()).step_by(group_rows.max(1)) {
        let len = group_rows.min(batch.num_rows() - start);
        w.write(&batch.slice(start, len)).unwrap();
    }
    w.close().unwrap();
}

/// Rows as capture writes them: appended when each request ends.
fn capture_order(mut records: Vec<TraceRecord>) -> Vec<TraceRecord> {
    records.sort_by_key(|r| r.arrival_time_us + r.e2el_us.unwrap_or(0));
    records
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The stream's records, files and hash equal the whole-file reader's.
fn assert_same_as_read_traces(inputs: &[&str]) -> TraceStream {
    let trace = read_traces(inputs).unwrap();
    let stream = TraceStream::open(inputs).unwrap();
    let streamed: Vec<TraceRecord> = stream.records().collect::<Result<_>>().unwrap();
    assert_eq!(streamed.len(), trace.records.len());
    assert!(streamed == trace.records, "the stream's order differs");
    assert_eq!(stream.files(), &trace.files[..]);
    assert_eq!(stream.rows(), trace.records.len());
    assert_eq!(stream.content_hash().unwrap(), trace.content_hash());
    assert_eq!(
        stream.first_arrival_us(),
        trace.records.first().map(|r| r.arrival_time_us)
    );
    assert_eq!(
        stream.last_arrival_us(),
        trace.records.last().map(|r| r.arrival_time_us)
    );
    stream
}

#[test]
fn overlapping_files_ties_disorder_empty_files_and_many_row_groups_read_as_read_traces() {
    let dir = tempfile::tempdir().unwrap();
    // a: sorted, in row groups of 7 rows, with ties inside it and with b.
    let a: Vec<_> = (0..100)
        .map(|i| rec(&format!("a{i}"), (i / 3) * 1000, 10))
        .collect();
    // b: capture-like (appended at the end), overlapping a, ties with a on the ms grid.
    let b: Vec<_> = (0..150)
        .map(|i| rec(&format!("b{i}"), i * 500, (i * 7919) % 20_000))
        .collect();
    let b = capture_order(b);
    // c: empty. d: after everything, one row group. e: one row tying a's first.
    let pa = dir.path().join("a.parquet");
    let pb = dir.path().join("b.parquet");
    let pc = dir.path().join("c.parquet");
    let pd = dir.path().join("d.parquet");
    let pe = dir.path().join("e.parquet");
    write_grouped(&pa, &a, 7);
    write_grouped(&pb, &b, 16);
    write_trace_file(&pc, &[], &test_meta()).unwrap();
    let d: Vec<_> = (0..30)
        .map(|i| rec(&format!("d{i}"), 200_000 + i, 1))
        .collect();
    write_trace_file(&pd, &d, &test_meta()).unwrap();
    write_trace_file(&pe, &[rec("e0", 0, 5)], &test_meta()).unwrap();

    let stream = assert_same_as_read_traces(&[
        path_str(&pa),
        path_str(&pb),
        path_str(&pc),
        path_str(&pd),
        path_str(&pe),
    ]);
    let order = stream.order().unwrap();
    assert_eq!(order[0].disorder_us, 0);
    assert!(order[1].disorder_us > 0, "{order:?}");
    assert_eq!(order[2].first_arrival_us, None);
    assert_eq!(stream.files()[2].rows, 0);
    // In another file order, ties break the other way, exactly as read_traces does.
    assert_same_as_read_traces(&[path_str(&pe), path_str(&pb), path_str(&pa)]);
    // A directory, as read_traces expands it.
    assert_same_as_read_traces(&[path_str(dir.path())]);
}

#[test]
fn records_can_be_read_again_and_stop_after_an_error_naming_the_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.parquet");
    let rows: Vec<_> = (0..3000).map(|i| rec(&format!("r{i}"), i, 1)).collect();
    write_grouped(&p, &rows, 1000);
    let stream = TraceStream::open(&[path_str(&p)]).unwrap();
    let first: Vec<_> = stream.records().collect::<Result<_>>().unwrap();
    let again: Vec<_> = stream.records().collect::<Result<_>>().unwrap();
    assert_eq!(first, again);
    assert_eq!(first, rows);

    // An unknown outcome at file row 2500: the first pass (arrivals only) does not see it,
    // the records stop at it with an error naming the file and the row.
    let bad = dir.path().join("bad.parquet");
    let batch = records_to_batch(&rows).unwrap();
    let idx = batch.schema().index_of(col::OUTCOME).unwrap();
    let mut cols = batch.columns().to_vec();
    let outcomes: Vec<&str> = (0..3000)
        .map(|i| if i == 2500 { "exploded" } else { "ok" })
        .collect();
    cols[idx] = Arc::new(StringArray::from(outcomes));
    let batch = RecordBatch::try_new(batch.schema(), cols).unwrap();
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(test_meta().to_kv()))
        .set_max_row_group_row_count(Some(1000))
        .build();
    let mut w =
        ArrowWriter::try_new(File::create(&bad).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let stream = TraceStream::open(&[path_str(&bad)]).unwrap();
    let mut it = stream.records();
    let ok = it.by_ref().take_while(Result::is_ok).count();
    assert!(ok <= 2500, "{ok}");
    assert!(it.next().is_none(), "nothing after the error");
    let err = stream.records().find_map(Result::err).unwrap().to_string();
    assert!(
        err.contains("bad.parquet") && err.contains("row 2500") && err.contains("exploded"),
        "{err}"
    );
}

#[test]
fn open_errors_are_read_traces_errors() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("nope.parquet");
    assert!(matches!(
        TraceStream::open(&[path_str(&none)]),
        Err(Error::NoFiles(_))
    ));
    let junk = dir.path().join("junk.parquet");
    fs::write(&junk, b"not parquet").unwrap();
    let err = TraceStream::open(&[path_str(&junk)]).unwrap_err();
    assert!(
        matches!(&err, Error::Format { path, .. } if path == &junk),
        "{err}"
    );
    let good = dir.path().join("good.parquet");
    write_trace_file(&good, &[full_record(0), full_record(1)], &test_meta()).unwrap();
    let bytes = fs::read(&good).unwrap();
    let cut = dir.path().join("cut.parquet");
    fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = TraceStream::open(&[path_str(&cut)]).unwrap_err();
    assert!(
        matches!(&err, Error::Format { path, .. } if path == &cut),
        "{err}"
    );
}

#[test]
fn a_file_rewritten_between_the_first_pass_and_the_read_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.parquet");
    let sorted: Vec<_> = (0..50).map(|i| rec(&format!("r{i}"), i * 10, 1)).collect();
    write_trace_file(&p, &sorted, &test_meta()).unwrap();
    let stream = TraceStream::open(&[path_str(&p)]).unwrap();
    let mut reversed = sorted.clone();
    reversed.reverse();
    write_grouped(&p, &reversed, 50);
    let err = stream.records().find_map(Result::err).unwrap().to_string();
    assert!(err.contains("changed while it was read"), "{err}");
    write_trace_file(&p, &sorted[..40], &test_meta()).unwrap();
    let err = stream.records().find_map(Result::err).unwrap().to_string();
    assert!(err.contains("40 rows, 50 when it was opened"), "{err}");
}

/// Memory: a sorted file holds one batch; a capture-like file adds the rows within its
/// disorder; files apart in time are open one at a time.
#[test]
fn rows_held_are_bounded_by_a_batch_and_the_disorder_not_by_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let sorted = dir.path().join("sorted.parquet");
    let n = 20_000;
    let rows: Vec<_> = (0..n)
        .map(|i| rec(&format!("r{i}"), i * 1000, 10))
        .collect();
    write_grouped(&sorted, &rows, 4096);
    let stream = TraceStream::open(&[path_str(&sorted)]).unwrap();
    let mut it = stream.records();
    assert_eq!(it.by_ref().count(), n as usize);
    assert!(
        it.peak_held_rows() <= STREAM_BATCH_ROWS + 1,
        "{}",
        it.peak_held_rows()
    );
    assert_eq!(it.held_rows(), 0);

    // One request per ms, each lasting up to 50 ms: at most ~50 rows of disorder.
    let capture = dir.path().join("capture.parquet");
    let rows: Vec<_> = (0..n)
        .map(|i| rec(&format!("c{i}"), i * 1000, (i * 7919) % 50_000))
        .collect();
    write_grouped(&capture, &capture_order(rows), 4096);
    let stream = TraceStream::open(&[path_str(&capture)]).unwrap();
    let disorder = stream.order().unwrap()[0].disorder_us;
    assert!(disorder > 20_000 && disorder < 50_000, "{disorder}");
    let mut it = stream.records();
    assert_eq!(it.by_ref().count(), n as usize);
    let window_rows = (disorder / 1000 + 1) as usize;
    assert!(
        it.peak_held_rows() <= STREAM_BATCH_ROWS + window_rows + 1,
        "{} held, window {window_rows}",
        it.peak_held_rows()
    );

    // Ten files one after another in time: never more than one open.
    let hourly = dir.path().join("hourly");
    fs::create_dir(&hourly).unwrap();
    for f in 0..10 {
        let rows: Vec<_> = (0..500)
            .map(|i| rec(&format!("h{f}-{i}"), f * 1_000_000 + i * 100, 5))
            .collect();
        write_trace_file(&hourly.join(format!("{f:02}.parquet")), &rows, &test_meta()).unwrap();
    }
    let stream = TraceStream::open(&[path_str(&hourly)]).unwrap();
    let mut it = stream.records();
    assert_eq!(it.by_ref().count(), 5000);
    assert_eq!(it.peak_open_files(), 1);
    assert!(it.peak_held_rows() <= 501, "{}", it.peak_held_rows());
}

/// Files of a remote source: fetched when read, read like local ones.
#[test]
fn remote_files_stream_like_local_ones() {
    struct Mem(
        Vec<(String, bytes::Bytes)>,
        Arc<std::sync::atomic::AtomicUsize>,
    );
    impl RemoteFiles for Mem {
        fn claims(&self, input: &str) -> bool {
            input.starts_with("mem://")
        }
        fn list(&self, _input: &str) -> Result<Vec<RemoteFile>> {
            Ok(self
                .0
                .iter()
                .map(|(name, data)| {
                    let (data, fetches) = (data.clone(), self.1.clone());
                    RemoteFile {
                        name: name.clone(),
                        fetch: Box::new(move || {
                            fetches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Ok(data.clone())
                        }),
                    }
                })
                .collect())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for f in 0..3i64 {
        let p = dir.path().join(format!("{f}.parquet"));
        let rows: Vec<_> = (0..40)
            .map(|i| rec(&format!("m{f}-{i}"), i * 3 + f, 2))
            .collect();
        write_trace_file(&p, &rows, &test_meta()).unwrap();
        files.push((
            format!("mem://b/{f}.parquet"),
            bytes::Bytes::from(fs::read(&p).unwrap()),
        ));
    }
    let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mem = Mem(files, fetches.clone());
    let whole = crate::reader::read_traces_with(&["mem://b"], &mem).unwrap();
    let stream = TraceStream::open_with(&["mem://b"], &mem).unwrap();
    let before = fetches.load(std::sync::atomic::Ordering::Relaxed);
    let streamed: Vec<_> = stream.records().collect::<Result<_>>().unwrap();
    assert_eq!(streamed, whole.records);
    assert_eq!(stream.files(), &whole.files[..]);
    assert_eq!(
        fetches.load(std::sync::atomic::Ordering::Relaxed) - before,
        3
    );
}

/// The content hash is the one results have named traces by (FNV-1a over the request id's
/// bytes and the arrival's little-endian bytes), pinned.
#[test]
fn content_hash_is_pinned() {
    assert_eq!(content_hash_of(&[]), "cbf29ce484222325");
    assert_eq!(
        content_hash_of(&[("a", 1), ("b", 2)]),
        crate::reader::content_hash([("a", 1), ("b", 2)])
    );
    assert_eq!(content_hash_of(&[("a", 1)]), "dedf9f982e43402d");
}

fn content_hash_of(rows: &[(&str, i64)]) -> String {
    crate::reader::content_hash(rows.iter().copied())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Any files, any disorder, any ties, any row groups: the stream is read_traces.
    #[test]
    fn any_files_stream_as_read_traces(
        files in prop::collection::vec(
            (prop::collection::vec((0i64..40, 0i64..25), 0..60), 1usize..9, any::<bool>()),
            1..5,
        )
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut names = Vec::new();
        for (f, (rows, group, capture)) in files.iter().enumerate() {
            let recs: Vec<_> = rows
                .iter()
                .enumerate()
                .map(|(i, &(at, len))| rec(&format!("f{f}-{i}"), at * 1000, len * 1000))
                .collect();
            let recs = if *capture { capture_order(recs) } else { recs };
            let p = dir.path().join(format!("{f}.parquet"));
            if recs.is_empty() {
                write_trace_file(&p, &recs, &test_meta()).unwrap();
            } else {
                write_grouped(&p, &recs, *group);
            }
            names.push(p.to_str().unwrap().to_string());
        }
        let inputs: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_same_as_read_traces(&inputs);
    }
}

/// A stream is shared with the engine's builder thread(s) (`Sync`) and its records are moved
/// to one (`Send`).
#[test]
fn a_stream_is_sync_and_its_records_are_send() {
    fn sync<T: Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.parquet");
    write_trace_file(&p, &[full_record(0)], &test_meta()).unwrap();
    let stream = TraceStream::open(&[path_str(&p)]).unwrap();
    sync(&stream);
    let records = stream.records();
    send(&records);
    let rows = std::thread::scope(|s| s.spawn(move || records.count()).join().unwrap());
    assert_eq!(rows, 1);
}

/// What capture leaves: its writer appends each row when the request ends and rotates
/// files by size, so a long request lands in a later file than shorter ones that arrived
/// after it (the files overlap in time). The stream reads them in exactly read_traces'
/// order, a few files open at once.
#[test]
fn capture_writer_files_rotated_mid_request_stream_as_read_traces() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::WriterConfig::new(dir.path(), "capture", test_meta());
    cfg.max_file_bytes = 256 * 1024;
    let (mut w, _) = crate::TraceWriter::open(cfg).unwrap();
    // One request per ms; most last 5–40 ms, every 500th lasts 2 s.
    let n = 6000i64;
    let rows: Vec<_> = (0..n)
        .map(|i| {
            let len = if i % 500 == 0 {
                2_000_000
            } else {
                5_000 + (i * 7919) % 35_000
            };
            rec(&format!("c{i}"), i * 1000, len)
        })
        .collect();
    for r in capture_order(rows) {
        w.append(r).unwrap();
    }
    let files = w.close().unwrap();
    assert!(files.len() >= 4, "{} files", files.len());
    let stream = assert_same_as_read_traces(&[path_str(dir.path())]);
    let mut it = stream.records();
    assert_eq!(it.by_ref().count(), n as usize);
    assert!(
        it.peak_open_files() < files.len(),
        "{} of {} files open at once",
        it.peak_open_files(),
        files.len()
    );
    // Each open file: a batch and the rows within its disorder (2 s of requests at most).
    assert!(
        it.peak_held_rows() <= it.peak_open_files() * (STREAM_BATCH_ROWS + 2001),
        "{} rows held",
        it.peak_held_rows()
    );
}

/// Zeroes every byte between the magic and the footer: the rows are gone, the footer
/// (row counts, statistics, key-value metadata) intact.
fn wipe_rows(path: &Path) {
    let mut bytes = fs::read(path).unwrap();
    let n = bytes.len();
    let footer = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    bytes[4..n - 8 - footer].fill(0);
    fs::write(path, bytes).unwrap();
}

/// What every llmreplay writer leaves: the order in the footer, so opening reads no row (a
/// file whose rows are wiped opens, with its rows and extent; reading it fails, naming it).
#[test]
fn files_llmreplay_wrote_open_from_the_footer_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("capture.parquet");
    let rows: Vec<_> = (0..3000)
        .map(|i| {
            let mut r = rec(&format!("c{i}"), i * 1000, (i * 7919) % 50_000);
            if i % 3 == 0 {
                r.body = None;
            }
            r
        })
        .collect();
    write_trace_file(&p, &capture_order(rows), &test_meta()).unwrap();
    let Measured {
        rows: measured_rows,
        order: measured,
        ..
    } = measure(
        &OpenFile::open(&Source::Local(p.clone())).unwrap(),
        Window::ALL,
    )
    .unwrap();
    assert_eq!(measured_rows, 3000);
    assert!(measured.disorder_us > 20_000, "{measured:?}");
    wipe_rows(&p);
    let stream = TraceStream::open(&[path_str(&p)]).unwrap();
    assert_eq!(stream.rows(), 3000);
    assert_eq!(stream.order().unwrap(), vec![measured]);
    assert_eq!(stream.first_arrival_us(), Some(T0));
    assert_eq!(stream.last_arrival_us(), Some(T0 + 2_999_000));
    assert_eq!(stream.rows_with_body(), Some(2000));
    let err = stream.records().find_map(Result::err).unwrap();
    assert!(
        matches!(&err, Error::Format { path, .. } if path == &p),
        "{err}"
    );
    assert!(stream.content_hash().is_err());
}

/// A file without the recorded order (an older llmreplay, another tool) opens from its
/// statistics and is measured when the merge reaches it: an earlier file's rows come first,
/// then its error. Without statistics it is measured when opened.
#[test]
fn files_without_the_recorded_order_are_measured_when_reached() {
    let dir = tempfile::tempdir().unwrap();
    let early = dir.path().join("early.parquet");
    let late = dir.path().join("late.parquet");
    let a: Vec<_> = (0..100).map(|i| rec(&format!("a{i}"), i * 10, 1)).collect();
    let b: Vec<_> = (0..100)
        .map(|i| rec(&format!("b{i}"), 5_000 + i * 10, 1))
        .collect();
    write_grouped(&early, &a, 30);
    write_grouped(&late, &capture_order(b.clone()), 30);
    // Intact, the order measured late equals the writer's.
    let stream = assert_same_as_read_traces(&[path_str(&early), path_str(&late)]);
    assert_eq!(stream.order().unwrap()[1].last_arrival_us, Some(T0 + 5_990));
    wipe_rows(&late);
    let stream = TraceStream::open(&[path_str(&late), path_str(&early)]).unwrap();
    assert_eq!(stream.rows(), 200);
    assert_eq!(stream.first_arrival_us(), Some(T0));
    assert_eq!(stream.last_arrival_us(), Some(T0 + 5_990));
    let read: Vec<_> = stream.records().collect();
    assert_eq!(read.len(), 101, "a's rows, then late's error");
    assert!(read[..100].iter().all(Result::is_ok));
    let err = read[100].as_ref().unwrap_err().to_string();
    assert!(err.contains("late.parquet"), "{err}");

    // No statistics: measured when opened, so the wiped file fails to open.
    let bare = dir.path().join("bare.parquet");
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(test_meta().to_kv()))
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None)
        .build();
    let batch = records_to_batch(&b).unwrap();
    let mut w =
        ArrowWriter::try_new(File::create(&bare).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    assert_same_as_read_traces(&[path_str(&bare), path_str(&early)]);
    let stream = TraceStream::open(&[path_str(&bare), path_str(&early)]).unwrap();
    assert_eq!(stream.rows_with_body(), None, "no statistics: not known");
    wipe_rows(&bare);
    let err = TraceStream::open(&[path_str(&bare)]).unwrap_err();
    assert!(
        matches!(&err, Error::Format { path, .. } if path == &bare),
        "{err}"
    );
}

/// A footer whose recorded order is false (an edited file, a buggy writer) cannot make the
/// stream yield rows out of order: the rows that contradict it are an error naming the file.
#[test]
fn a_footer_that_misstates_the_order_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<_> = (0..50).map(|i| rec(&format!("r{i}"), i * 10, 1)).collect();
    let write = |name: &str, rows: &[TraceRecord], order: FileOrder| {
        let p = dir.path().join(name);
        let mut kv = test_meta().to_kv();
        kv.push(order.to_kv());
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(kv))
            .build();
        let batch = records_to_batch(rows).unwrap();
        let mut w =
            ArrowWriter::try_new(File::create(&p).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        p
    };
    let truth = FileOrder {
        first_arrival_us: Some(T0),
        last_arrival_us: Some(T0 + 490),
        disorder_us: 0,
    };
    let mut reversed = rows.clone();
    reversed.reverse();
    let claims_sorted = write("reversed.parquet", &reversed, truth);
    let late_first = write(
        "late-first.parquet",
        &rows,
        FileOrder {
            first_arrival_us: Some(T0 + 100),
            ..truth
        },
    );
    let early_last = write(
        "early-last.parquet",
        &rows,
        FileOrder {
            last_arrival_us: Some(T0 + 100),
            ..truth
        },
    );
    for p in [&claims_sorted, &late_first, &early_last] {
        let stream = TraceStream::open(&[path_str(p)]).unwrap();
        let err = stream.records().find_map(Result::err).unwrap().to_string();
        assert!(
            err.contains(path_str(p)) && err.contains("misstates"),
            "{err}"
        );
        // The whole-file reader refuses it too.
        let err = read_traces(&[path_str(p)]).unwrap_err().to_string();
        assert!(err.contains("misstates"), "{err}");
    }
    // The truth reads as read_traces does.
    assert_same_as_read_traces(&[path_str(&write("true.parquet", &rows, truth))]);
}

/// A pass of the records to their end leaves the content hash: asked for afterwards, it
/// reads nothing (the file can be gone). A pass stopped early leaves nothing.
#[test]
fn a_full_pass_of_the_records_leaves_the_content_hash() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.parquet");
    let rows: Vec<_> = (0..500).map(|i| rec(&format!("r{i}"), i * 3, 1)).collect();
    write_trace_file(&p, &rows, &test_meta()).unwrap();
    let want = read_traces(&[path_str(&p)]).unwrap().content_hash();

    let partial = TraceStream::open(&[path_str(&p)]).unwrap();
    assert_eq!(partial.records().take(499).count(), 499);
    let full = TraceStream::open(&[path_str(&p)]).unwrap();
    assert_eq!(full.records().count(), 500);
    fs::remove_file(&p).unwrap();
    assert_eq!(full.content_hash().unwrap(), want);
    assert!(
        partial.content_hash().is_err(),
        "a partial pass hashed nothing"
    );
}

/// A capture's rows: `n` requests of capture `id`, one every `step_us` from `T0 + from_us`,
/// appended as capture appends them (when each ends).
fn capture_rows(id: &str, from_us: i64, n: i64, step_us: i64) -> Vec<TraceRecord> {
    capture_order(
        (0..n)
            .map(|i| {
                let mut r = rec(
                    &format!("{id}-{i}"),
                    from_us + i * step_us,
                    (i * 7919) % 30_000,
                );
                r.capture_id = Some(id.to_string());
                r.capture_started_us = Some(T0 + from_us);
                r
            })
            .collect(),
    )
}

/// Several captures' files read in a window are the rows of the whole trace that arrive in
/// it, in the same order, with their hash and each capture's rows and span: a file across an
/// edge is narrowed (its counts are the window's), a file outside it is never decoded (its
/// rows are wiped: reading it would fail), the window's end stops a file's reading (its rows
/// after it are wiped too), and files of an older schema (no capture columns) mix in.
#[test]
fn a_window_over_several_captures_reads_only_its_rows_and_counts_each_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    // a: 0–2 s, b: 1–3 s (overlapping a), c: 5–6 s (after the window), old: 1.5–2.5 s.
    let a = capture_rows("pod-a", 0, 200, 10_000);
    let b = capture_rows("pod-b", 1_000_000, 400, 5_000);
    let c = capture_rows("pod-c", 5_000_000, 100, 10_000);
    let old: Vec<_> = (0..50)
        .map(|i| {
            let mut r = rec(&format!("old-{i}"), 1_500_000 + i * 20_000, 10);
            (r.capture_id, r.capture_started_us) = (None, None);
            r
        })
        .collect();
    for (n, rows) in [("a", &a), ("b", &b), ("c", &c), ("old", &old)] {
        write_trace_file(&path(&format!("{n}.parquet")), rows, &test_meta()).unwrap();
    }
    // b written in row groups of 64, so that its rows after the window are in later groups.
    write_grouped(&path("b.parquet"), &b, 64);
    let inputs: Vec<String> = ["a", "b", "c", "old"]
        .iter()
        .map(|n| path(&format!("{n}.parquet")).display().to_string())
        .collect();
    let whole = read_traces(&inputs).unwrap();
    let (since, until) = (T0 + 1_200_000, T0 + 1_800_000);
    let want: Vec<TraceRecord> = whole
        .records
        .iter()
        .filter(|r| (since..until).contains(&r.arrival_time_us))
        .cloned()
        .collect();
    wipe_rows(&path("c.parquet"));
    let window = Window::new(Some(since), Some(until)).unwrap();
    let stream = TraceStream::open_in(&inputs, &LocalOnly, window).unwrap();
    let files: Vec<_> = stream
        .files()
        .iter()
        .map(|f| (f.path.clone(), f.rows))
        .collect();
    let count = |id: &str| {
        want.iter()
            .filter(|r| r.capture_id.as_deref() == Some(id))
            .count()
    };
    assert_eq!(
        files,
        vec![
            (path("a.parquet"), count("pod-a")),
            (path("b.parquet"), count("pod-b")),
            (path("old.parquet"), 15),
        ]
    );
    assert_eq!(stream.rows(), want.len());
    assert_eq!(stream.window(), window);
    assert_eq!(stream.first_arrival_us(), Some(want[0].arrival_time_us));
    assert_eq!(
        stream.last_arrival_us(),
        want.last().map(|r| r.arrival_time_us)
    );
    // The key pass (no records read yet) and a full pass of the records agree.
    let hash = crate::reader::content_hash(
        want.iter()
            .map(|r| (r.request_id.as_str(), r.arrival_time_us)),
    );
    assert_eq!(stream.content_hash().unwrap(), hash);
    let by_keys = stream.captures().unwrap().unwrap();
    let streamed: Vec<TraceRecord> = stream.records().collect::<Result<_>>().unwrap();
    assert!(streamed == want, "the window's rows differ");
    let again = TraceStream::open_in(&inputs, &LocalOnly, window).unwrap();
    assert_eq!(again.records().count(), want.len());
    let by_records = again.captures().unwrap().unwrap();
    assert_eq!(by_keys, by_records);
    let got: Vec<_> = by_keys
        .captures
        .iter()
        .map(|c| (c.id.as_str(), c.rows, (c.span_s * 1e6).round() as i64))
        .collect();
    let span = |id: &str| {
        let at: Vec<i64> = want
            .iter()
            .filter(|r| r.capture_id.as_deref() == Some(id))
            .map(|r| r.arrival_time_us)
            .collect();
        at.iter().max().unwrap() - at.iter().min().unwrap()
    };
    assert_eq!(
        got,
        vec![
            ("pod-a", count("pod-a"), span("pod-a")),
            ("pod-b", count("pod-b"), span("pod-b")),
        ]
    );
    assert_eq!(by_keys.rows_without_capture, 15);
    // Without the window, the wiped file is read, and fails naming it.
    let all = TraceStream::open(&inputs).unwrap();
    let err = all.records().find_map(Result::err).unwrap();
    assert!(
        matches!(&err, Error::Format { path: p, .. } if p == &path("c.parquet")),
        "{err}"
    );
}

/// The window's end stops a file's reading: rows after it (every column but the arrival
/// time wiped here, in the last row groups) are never decoded; the arrival column of a file
/// across an edge is read when it is opened, to count its rows in the window. A window
/// holding no row is an error saying where the rows are.
#[test]
fn a_file_is_read_no_further_than_the_window_and_an_empty_window_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.parquet");
    let rows: Vec<_> = (0..4096)
        .map(|i| rec(&format!("r{i}"), i * 1000, 1))
        .collect();
    write_grouped(&p, &rows, 256);
    // Zero the column chunks of rows 3072 on (row groups 12–15), arrival_time's kept.
    let mut bytes = fs::read(&p).unwrap();
    {
        let f = OpenFile::open(&Source::Local(p.clone())).unwrap();
        for g in 12..16 {
            let group = f.footer().row_group(g);
            for c in group.columns() {
                if c.column_path().string() != col::ARRIVAL_TIME {
                    let (at, len) = c.byte_range();
                    bytes[at as usize..(at + len) as usize].fill(0);
                }
            }
        }
    }
    fs::write(&p, bytes).unwrap();
    let inputs = [path_str(&p)];
    let w = Window::new(Some(T0 + 1_000_000), Some(T0 + 2_000_000)).unwrap();
    let stream = TraceStream::open_in(&inputs, &LocalOnly, w).unwrap();
    let got: Vec<i64> = stream
        .records()
        .map(|r| r.unwrap().arrival_time_us - T0)
        .collect();
    assert_eq!(got, (1000..2000).map(|i| i * 1000).collect::<Vec<_>>());
    // The whole file fails where it was wiped.
    assert!(TraceStream::open(&inputs)
        .unwrap()
        .records()
        .any(|r| r.is_err()));
    let late = Window::new(Some(T0 + 10_000_000), None).unwrap();
    let e = TraceStream::open_in(&inputs, &LocalOnly, late)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no row arrives in the window"), "{e}");
    assert!(
        e.contains("1 file(s) hold rows from 2023-11-14T22:13:20.000000Z"),
        "{e}"
    );
}
