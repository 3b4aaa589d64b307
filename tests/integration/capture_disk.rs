//! `llmreplay capture` and the disk it records to (issue 17): a full disk and a damaged
//! journal must never stop the traffic. The real binary runs with `--out` on a tiny tmpfs
//! (root only; a loud SKIP otherwise, CI runs as root) or on a prepared directory.
//!
//! `LLMREPLAY_CAPTURE_BIN` runs these tests against another build (e.g. an older one, to
//! see them fail).

use crate::support;
use support::env::free_addr;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use support::capture::CaptureProc;
use support::disk::{http, metric, Tmpfs};
use trace_format::TraceRecord;

fn bin() -> String {
    std::env::var("LLMREPLAY_CAPTURE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_llmreplay").to_string())
}

fn sim(rt: &tokio::runtime::Runtime) -> sim::SimHandle {
    rt.block_on(sim::start(
        "127.0.0.1:0".parse().unwrap(),
        sim::SimConfig {
            timing: sim::Timing::Fixed {
                ttft: Duration::from_millis(1),
                itl: Duration::from_millis(1),
            },
            ..Default::default()
        },
    ))
    .expect("sim")
}

fn body(i: usize) -> (bool, String) {
    let stream = i % 2 == 0;
    (
        stream,
        format!(
            r#"{{"model":"m","prompt":"disk test {i} one two three","max_tokens":3,"ignore_eos":true,"stream":{stream}}}"#
        ),
    )
}

/// Sends request `i` through the proxy and checks the client got the upstream's answer.
fn send(listen: SocketAddr, i: usize) {
    let (stream, b) = body(i);
    let (status, got) = http(listen, "POST", "/v1/completions", &b);
    assert_eq!(status, 200, "request {i}: {got}");
    if stream {
        assert!(got.contains("data: [DONE]"), "request {i}: {got}");
    } else {
        assert!(got.contains("\"choices\""), "request {i}: {got}");
    }
}

fn metrics(admin: SocketAddr) -> String {
    let (status, m) = http(admin, "GET", "/metrics", "");
    assert_eq!(status, 200);
    m
}

fn m(text: &str, name: &str) -> u64 {
    metric(text, &format!("llmreplay_capture_{name}"))
        .unwrap_or_else(|| panic!("no llmreplay_capture_{name} in\n{text}")) as u64
}

/// Polls /metrics until `cond` holds (bounded), returns the exposition.
fn metrics_until(admin: SocketAddr, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(admin);
        if cond(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// The request ids in the finished Parquet files of `dir`.
fn parquet_ids(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = trace_format::read_traces(&[dir.to_str().unwrap()])
        .expect("read traces")
        .records
        .into_iter()
        .map(|r| r.request_id)
        .collect();
    ids.sort();
    ids
}

/// Exit code of a capture that drained and stopped but could not finish its whole trace.
const EXIT_INCOMPLETE: i32 = 7;

/// The disk fills while capture serves: every client still gets the upstream's answer,
/// `records_dropped_total` counts exactly the rows that never reach a file, the writer's
/// errors are logged rate-limited, SIGTERM drains, prints the summary and exits 7; restarted
/// on the still-full disk with the journal left, capture serves (the journal is kept); once
/// there is space again the next start finishes the journal and nothing else is missing.
#[test]
fn full_disk_keeps_serving_counts_drops_exactly_and_restarts_on_the_full_disk() {
    let Some(disk) = Tmpfs::mount("full", "1m") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = sim(&rt);
    let out = disk.path().join("cap");
    let flags = ["--flush-interval", "40ms"];
    let (listen, admin) = (free_addr(), free_addr());
    let mut cap = CaptureProc::spawn_admin(&bin(), listen, admin, &s.url(), &out, &flags);
    cap.wait_for("listening on");

    const BEFORE: usize = 5;
    const DURING: usize = 30;
    for i in 0..BEFORE {
        send(listen, i);
    }
    metrics_until(admin, "5 rows written", |t| {
        metric(t, "llmreplay_capture_records_written_total") == Some(BEFORE as f64)
    });
    disk.fill();
    let t_full = Instant::now();
    for i in BEFORE..BEFORE + DURING {
        send(listen, i);
    }
    // Every row is accounted for: written (in the journal) or dropped.
    let text = metrics_until(admin, "every row written or dropped", |t| {
        m(t, "records_written_total") + m(t, "records_dropped_total") == (BEFORE + DURING) as u64
    });
    let dropped = m(&text, "records_dropped_total");
    assert!(dropped > 0, "{text}");
    assert!(m(&text, "record_errors_total") > 0, "{text}");
    assert_eq!(m(&text, "trace_write_failing"), 1, "{text}");
    // Another second of a failing disk: the errors are not logged every tick.
    std::thread::sleep(Duration::from_millis(1000));
    let elapsed = t_full.elapsed();
    let error_lines = cap
        .log()
        .iter()
        .filter(|l| l.contains("trace") && (l.contains("fail") || l.contains("error")))
        .count();
    assert!(
        error_lines <= 2,
        "{error_lines} writer error lines in {elapsed:?}: {:#?}",
        cap.log()
    );

    let (status, log) = cap.terminate();
    assert_eq!(status.code(), Some(EXIT_INCOMPLETE), "{status:?}: {log:#?}");
    let summary = log
        .iter()
        .find(|l| l.contains("records written"))
        .unwrap_or_else(|| panic!("no summary: {log:#?}"));
    assert!(
        summary.contains(&format!("{dropped} dropped")),
        "{summary} (dropped {dropped})"
    );
    let left = names(&out);
    assert!(
        left.iter().any(|n| n.ends_with(".journal")),
        "the journal is kept: {left:?}"
    );

    // Restart on the still-full disk with the journal left: capture serves.
    let (listen, admin) = (free_addr(), free_addr());
    let mut cap = CaptureProc::spawn_admin(&bin(), listen, admin, &s.url(), &out, &flags);
    cap.wait_for("listening on");
    send(listen, 1000);
    let text = metrics_until(admin, "the row of the restart dropped", |t| {
        m(t, "records_dropped_total") == 1
    });
    assert_eq!(m(&text, "journals_pending"), 1, "{text}");
    let (status, log) = cap.terminate();
    assert_eq!(status.code(), Some(EXIT_INCOMPLETE), "{status:?}: {log:#?}");
    assert!(
        names(&out).iter().any(|n| n.ends_with(".journal")),
        "the journal is still kept: {:?}",
        names(&out)
    );

    // Space again: the next start finishes the journal; the rows there are exactly those
    // that were not counted as dropped.
    disk.free();
    let (listen, admin) = (free_addr(), free_addr());
    let mut cap = CaptureProc::spawn_admin(&bin(), listen, admin, &s.url(), &out, &flags);
    cap.wait_for("listening on");
    send(listen, 2000);
    let (status, log) = cap.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}: {log:#?}");
    rt.block_on(s.shutdown());
    let files = names(&out);
    assert!(
        files.iter().all(|n| n.ends_with(".parquet")),
        "left behind: {files:?}"
    );
    let ids = parquet_ids(&out);
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "a row twice: {ids:?}");
    // 35 rows of the first run minus those dropped, none of the second, one of the third.
    assert_eq!(
        ids.len() as u64,
        (BEFORE + DURING) as u64 - dropped + 1,
        "{ids:?}"
    );
}

fn line(r: &TraceRecord) -> Vec<u8> {
    let mut v = serde_json::to_vec(r).unwrap();
    v.push(b'\n');
    v
}

fn record(i: usize) -> TraceRecord {
    let mut r = TraceRecord::new(
        format!("old-{i}"),
        1_700_000_000_000_000 + i as i64 * 1000,
        "/v1/completions",
    );
    r.status = Some(200);
    r
}

/// The journal of issue 17 finding 3 (a record over 64 KiB cut by ENOSPC, the next record
/// glued to it, and a damaged line): the next start recovers every intact record, sets the
/// journal aside byte for byte under a new name, says so in the log and in /metrics, and
/// serves.
#[test]
fn damaged_journal_at_start_is_recovered_set_aside_and_capture_serves() {
    let out = std::env::temp_dir().join(format!("llmreplay-disk-{}-damaged", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let mut big = record(99);
    big.body = Some("z".repeat(100 * 1024));
    let mut torn = serde_json::to_vec(&big).unwrap();
    torn.truncate(75_785);
    let mut data = Vec::new();
    for i in 0..12 {
        data.extend(line(&record(i)));
    }
    data.extend(&torn); // line 13: cut short by ENOSPC ...
    data.extend(line(&record(12))); // ... and the next record written after it
    data.extend_from_slice(b"\x00\x00garbage\n");
    data.extend(line(&record(13)));
    let journal = out.join("capture-20260101T000000Z-000000.journal");
    std::fs::write(&journal, &data).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = sim(&rt);
    let (listen, admin) = (free_addr(), free_addr());
    let mut cap = CaptureProc::spawn_admin(&bin(), listen, admin, &s.url(), &out, &[]);
    cap.wait_for("listening on");
    send(listen, 0);
    let text = metrics(admin);
    assert_eq!(m(&text, "journal_lines_damaged_total"), 2, "{text}");
    assert_eq!(m(&text, "journal_files_set_aside_total"), 1, "{text}");
    assert_eq!(m(&text, "records_recovered_total"), 14, "{text}");
    let (status, log) = cap.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}: {log:#?}");
    assert!(
        log.iter()
            .any(|l| l.contains("set aside") && l.contains("capture-20260101T000000Z-000000")),
        "{log:#?}"
    );
    rt.block_on(s.shutdown());

    let files = names(&out);
    let aside: Vec<&String> = files
        .iter()
        .filter(|n| n.starts_with("capture-20260101T000000Z-000000.journal.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "{files:?}");
    assert_eq!(
        std::fs::read(out.join(aside[0])).unwrap(),
        data,
        "kept byte for byte"
    );
    assert!(!journal.exists());
    let ids = parquet_ids(&out);
    let mut want: Vec<String> = (0..14).map(|i| format!("old-{i}")).collect();
    want.sort();
    let old: Vec<String> = ids
        .iter()
        .filter(|i| i.starts_with("old-"))
        .cloned()
        .collect();
    assert_eq!(old, want);
    assert_eq!(ids.len(), 15, "the recovered rows and the new one: {ids:?}");
    let _ = std::fs::remove_dir_all(&out);
}
