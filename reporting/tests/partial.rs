//! Results that survive an interruption: the `--results` sink writes rows as they finish
//! (into a journal that becomes today's file), a killed run's journal is recovered once into
//! a file marked partial that `merge` reads, and a stopped run's JSON, console and report say
//! PARTIAL while a complete run's JSON has no `interrupted` key.

use std::path::PathBuf;
use std::time::Duration;

use replay::config::Target;
use replay::{Interrupted, ReplayConfig, RowSink};
use results::build::{ResultInputs, TraceIdentity};
use results::parquet_sink::{recover, ResultsSink, KILLED};
use trace_format::TraceRecord;

const T0: i64 = 1_767_323_045_000_000;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmreplay-partial-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn target() -> Target {
    Target {
        name: "cand".into(),
        url: "http://127.0.0.1:9".into(),
    }
}

/// A finished request's row as a replay writes it: 10 ms apart on the schedule.
fn row(i: usize) -> TraceRecord {
    let mut r = TraceRecord::new(
        format!("req-{i}"),
        T0 + i as i64 * 10_000,
        "/v1/completions",
    );
    r.stream = true;
    r.prompt_tokens = Some(16);
    r.output_tokens = Some(4);
    r.ttft_us = Some(5_000);
    r.e2el_us = Some(8_000);
    r.chunk_times_us = vec![5_000, 6_000, 7_000, 8_000];
    r.scheduled_offset_us = Some(i as i64 * 10_000);
    r.dispatch_lag_us = Some(0);
    r.queue_us = Some(0);
    r.connect_us = Some(0);
    r.target = Some("cand".into());
    r.run_id = Some("run-0".into());
    r
}

fn identity() -> TraceIdentity {
    TraceIdentity {
        files: vec!["t.parquet".into()],
        rows: 100,
        content_hash: "00000000deadbeef".into(),
    }
}

fn cfg() -> replay::ValidatedConfig {
    let mut c = ReplayConfig::new(vec![target()]);
    c.label = Some("partial".into());
    c.validate().unwrap()
}

fn open(path: &std::path::Path) -> ResultsSink {
    let meta = results::outputs::results_meta(&cfg(), &identity(), "llmreplay replay t.parquet");
    ResultsSink::create(path, meta).unwrap()
}

fn run_of(rows: &[TraceRecord], interrupted: Option<Interrupted>) -> replay::RunOutput {
    replay::RunOutput {
        run_id: "run-0".into(),
        model: "m".into(),
        started_at_us: T0,
        plan_len: 100,
        trace_span: Duration::from_millis(990),
        records: rows.to_vec(),
        interrupted,
        ..results::build::empty_run(target())
    }
}

fn sigterm() -> Option<Interrupted> {
    Some(Interrupted {
        reason: "SIGTERM".into(),
        after: Duration::from_millis(300),
        sent: 31,
        not_sent: Some(69),
        cancelled: 1,
    })
}

/// Rows reach the journal while the run goes (not at its end), and closing turns it into
/// the results file under its name, with the metadata only known at the end.
#[test]
fn rows_are_journalled_as_they_finish_and_the_file_is_finished_at_the_end() {
    let d = dir("close");
    let path = d.join("run.parquet");
    let mut sink = open(&path);
    assert_eq!(sink.journal(), d.join("run.journal"));
    sink.start(&target(), "run-0").unwrap();
    let rows: Vec<_> = (0..30).map(row).collect();
    for r in &rows {
        sink.row(r).unwrap();
    }
    // Within the flush interval every row is in the journal, the run still going.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = trace_format::journal::read_journal(sink.journal())
            .unwrap()
            .records
            .len();
        if n == rows.len() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{n} rows journalled");
        std::thread::sleep(results::parquet_sink::FLUSH_EVERY);
    }
    assert!(!path.exists(), "the file appears only complete");
    let mut run = run_of(&rows, sigterm());
    run.target_info.models = vec!["m".into()];
    sink.finish(&run).unwrap();
    let w = sink.close().unwrap();
    assert_eq!((w.at.as_str(), w.rows), (path.to_str().unwrap(), 30));
    assert!(!d.join("run.journal").exists());
    let t = trace_format::read_traces(&[path.to_str().unwrap()]).unwrap();
    assert_eq!(t.records, rows);
    let extra = &t.files[0].meta.extra;
    assert_eq!(extra["label"], "partial");
    assert_eq!(extra["target.cand.models"], "m");
    assert_eq!(extra["target.cand.url"], "http://127.0.0.1:9");
    assert_eq!(extra["interrupted"], "SIGTERM");
    assert!(extra.contains_key("result_settings"));
    let _ = std::fs::remove_dir_all(&d);
}

/// No row at all still writes the (empty) file, as a replay always did.
#[test]
fn a_run_without_rows_writes_an_empty_file() {
    let d = dir("empty");
    let path = d.join("run.parquet");
    let w = open(&path).close().unwrap();
    assert_eq!(w.rows, 0);
    let t = trace_format::read_traces(&[path.to_str().unwrap()]).unwrap();
    assert!(t.records.is_empty());
    let _ = std::fs::remove_dir_all(&d);
}

/// What a kill leaves (the sink never closed, the process gone): the journal. A new run on
/// the same path refuses to overwrite it; recovery writes every finished row once into the
/// results file, marked partial, and `merge` reads it as a partial result.
#[test]
fn a_killed_runs_journal_is_recovered_once_and_merges_as_partial() {
    let d = dir("killed");
    let path = d.join("run.parquet");
    let mut sink = open(&path);
    let rows: Vec<_> = (0..25).map(row).collect();
    for r in &rows {
        sink.row(r).unwrap();
    }
    drop(sink); // an error path: the journal is kept, as after a kill
    let journal = d.join("run.journal");
    assert!(journal.exists() && !path.exists());
    let meta = results::outputs::results_meta(&cfg(), &identity(), "again");
    let err = ResultsSink::create(&path, meta).err().unwrap();
    let text = format!("{err} {}", std::error::Error::source(&err).unwrap());
    assert!(text.contains("llmreplay merge"), "{text}");
    assert!(results::parquet_sink::needs_recovery(
        path.to_str().unwrap()
    ));
    assert!(results::parquet_sink::needs_recovery(
        journal.to_str().unwrap()
    ));

    let (file, n) = recover(&path).unwrap();
    assert_eq!((file.clone(), n), (path.clone(), 25));
    assert!(!journal.exists());
    assert!(!results::parquet_sink::needs_recovery(
        path.to_str().unwrap()
    ));
    assert!(recover(&path).is_err(), "recovered once");
    let t = trace_format::read_traces(&[path.to_str().unwrap()]).unwrap();
    assert_eq!(t.records, rows);
    let meta = &t.files[0].meta;
    assert_eq!(meta.extra["interrupted"], KILLED);
    assert_eq!(meta.extra["recovered"], "journal");
    assert_eq!(meta.extra["label"], "partial");

    let stream = trace_format::TraceStream::open(&[path.to_str().unwrap()]).unwrap();
    let checked = results::merge::check(&stream, "llmreplay merge run.journal -o out").unwrap();
    let mut merged_rows = Vec::new();
    let m = results::merge::merge(
        &stream,
        checked,
        &results::merge::MergeOptions {
            goodput: vec![],
            percentile_metrics: vec![],
            metric_percentiles: vec![50.0, 99.0],
        },
        &mut merged_rows,
    )
    .unwrap();
    assert_eq!(m.rows, 25);
    assert_eq!(merged_rows, rows);
    let i = m
        .doc
        .ours()
        .interrupted
        .clone()
        .expect("merged result is partial");
    assert_eq!(i.reason, KILLED);
    assert_eq!(i.finished, 25);
    assert_eq!(i.schedule_reached_s, 0.24);
    assert_eq!((i.sent, i.schedule_span_s), (None, None));
    assert!(
        m.notes.iter().any(|n| n.contains("PARTIAL")),
        "{:?}",
        m.notes
    );
    assert_eq!(m.meta.extra["interrupted"], KILLED);
    let _ = std::fs::remove_dir_all(&d);
}

fn inputs<'a>(
    cfg: &'a ReplayConfig,
    run: &'a replay::RunOutput,
    m: &'a replay::Metrics,
    id: &'a TraceIdentity,
) -> ResultInputs<'a> {
    ResultInputs {
        cfg,
        run,
        metrics: m,
        trace: id,
        command: "llmreplay replay t.parquet",
        detailed: false,
    }
}

/// A stopped run's JSON has `llmreplay.interrupted` (reason, how much of the schedule ran,
/// sent / not sent / cancelled), its console header says PARTIAL, and so does a report of
/// it; a complete run's JSON has no such key.
#[test]
fn a_stopped_run_says_partial_in_json_console_and_report() {
    let cfg = cfg();
    let rows: Vec<_> = (0..30).map(row).collect();
    let m = replay::metrics::compute(&rows, T0, &[], &[50.0, 99.0]);
    let id = identity();
    let run = run_of(&rows, sigterm());
    let doc = results::build::result_doc(&inputs(&cfg, &run, &m, &id));
    let v = doc.to_value();
    let i = &v["llmreplay"]["interrupted"];
    assert_eq!(i["reason"], "SIGTERM");
    assert_eq!(i["schedule_reached_s"], 0.3);
    assert_eq!(i["schedule_span_s"], 0.99);
    assert_eq!(
        (i["sent"].as_u64(), i["not_sent"].as_u64()),
        (Some(31), Some(69))
    );
    assert_eq!(
        (i["cancelled"].as_u64(), i["finished"].as_u64()),
        (Some(1), Some(30))
    );
    let back = results::ResultDoc::from_value(&v).unwrap();
    assert_eq!(back.to_value(), v);

    let console = reporting::console::console_report(&inputs(&cfg, &run, &m, &id));
    let head: Vec<&str> = console.lines().take(2).collect();
    assert!(head[0].contains("PARTIAL"), "{console}");
    assert!(
        head[1].contains("PARTIAL (SIGTERM): 0.3 s of the schedule's 1.0 s (30%) ran; 31 sent, 69 not sent, 1 cancelled, 30 finished"),
        "{console}"
    );

    let file = reporting::series::ResultFile::parse("partial.json", &doc.to_bytes()).unwrap();
    let data = reporting::document::build(&[file], &Default::default());
    let lines = reporting::document::partial_lines(&data);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("PARTIAL (SIGTERM)"), "{lines:?}");
    let md = reporting::document::markdown(&data);
    assert!(
        md.lines().take(4).any(|l| l.contains("PARTIAL (SIGTERM)")),
        "{md}"
    );
    assert!(reporting::html::render(&data).contains("PARTIAL (SIGTERM)"));

    // Complete: no key, no marker.
    let done = run_of(&rows, None);
    let v = results::build::result_doc(&inputs(&cfg, &done, &m, &id)).to_value();
    assert!(v["llmreplay"].get("interrupted").is_none(), "{v:#}");
    let console = reporting::console::console_report(&inputs(&cfg, &done, &m, &id));
    assert!(!console.contains("PARTIAL"));
}
