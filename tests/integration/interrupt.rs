//! An interrupted replay keeps what it measured. The real binary replays a ~10 s schedule
//! against the ground-truth server on loopback (which logs every request it finished) and
//! is stopped ~3 s in:
//! - SIGTERM / SIGINT: it stops sending, drains, writes `--save-result` and `--results`
//!   marked partial, says PARTIAL on the console, exits 143 / 130; `report` reads the result
//!   and says it is partial;
//! - a second signal cancels the requests in flight at once;
//! - `kill -9`: the `--results` journal holds every request that finished (but the last
//!   flush interval's), and `merge` recovers each once into a result marked partial.

use crate::support;
use support::env::tmpdir;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sim::groundtruth::{GroundTruth, GroundTruthConfig};

const REQUESTS: usize = 200;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_llmreplay"))
}

fn run(args: &[&str]) -> Output {
    let o = bin().args(args).stdin(Stdio::null()).output().unwrap();
    assert!(
        o.status.success(),
        "llmreplay {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// 200 requests at 20 req/s (Poisson): a schedule of ~10 s.
fn trace(dir: &Path) -> String {
    let t = dir.join("t.parquet").display().to_string();
    run(&[
        "synth",
        "-o",
        &t,
        "--num-prompts",
        &REQUESTS.to_string(),
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--request-rate",
        "20",
        "--seed",
        "7",
    ]);
    t
}

fn ground_truth(itl: Duration) -> GroundTruth {
    GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(5),
            itl,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Starts the replay of `trace` against `gt` writing `r.json` and `r.parquet` in `dir`.
fn spawn_replay(trace: &str, gt: &GroundTruth, dir: &Path, extra: &[&str]) -> Child {
    bin()
        .args(["replay", trace, "-q", "--target"])
        .arg(format!("gt={}", gt.url()))
        .arg("--save-result")
        .arg(dir.join("r.json"))
        .arg("--results")
        .arg(dir.join("r.parquet"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the server has seen the first request, then `after` more.
fn wait_into_the_run(gt: &GroundTruth, after: Duration) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while gt.log().is_empty() {
        assert!(Instant::now() < deadline, "no request reached the server");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(after);
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// The child's output, waiting at most `limit` (then it is killed and the test fails).
fn finish(mut child: Child, limit: Duration) -> (Output, Duration) {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("the replay did not exit within {limit:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (child.wait_with_output().unwrap(), t0.elapsed())
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn parquet_rows(p: &Path) -> trace_format::Trace {
    trace_format::read_traces(&[p.to_str().unwrap()]).unwrap()
}

fn no_duplicates(t: &trace_format::Trace) -> BTreeSet<String> {
    let ids: BTreeSet<String> = t.records.iter().map(|r| r.request_id.clone()).collect();
    assert_eq!(ids.len(), t.records.len(), "a request id appears twice");
    ids
}

/// SIGTERM or SIGINT ~3 s into the ~10 s schedule: a partial result everywhere.
fn stopped_by(sig: i32, name: &str, code: i32) {
    let dir = tmpdir(name);
    let t = trace(&dir);
    let gt = ground_truth(Duration::from_millis(2));
    let child = spawn_replay(&t, &gt, &dir, &["--drain-timeout", "5s"]);
    wait_into_the_run(&gt, Duration::from_secs(3));
    signal(&child, sig);
    let (out, took) = finish(child, Duration::from_secs(20));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    // How long the exit took is printed, not bounded (beyond `finish`'s): with every test in
    // one process beside other builds, one took 6.4 s against a bound of 6 s. That it stopped
    // sending is the schedule reached and the requests sent below; that it drained is no
    // request cancelled.
    eprintln!("{name}: exited {took:?} after the signal");
    assert!(
        stdout.contains("Serving Benchmark Result: PARTIAL"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("PARTIAL ({name})")), "{stdout}");

    let v = json(&dir.join("r.json"));
    let i = &v["llmreplay"]["interrupted"];
    assert_eq!(i["reason"], name, "{v:#}");
    let reached = i["schedule_reached_s"].as_f64().unwrap();
    let span = i["schedule_span_s"].as_f64().unwrap();
    assert!((2.0..6.0).contains(&reached), "reached {reached} s");
    assert!(span > reached + 2.0, "span {span} s");
    let sent = i["sent"].as_u64().unwrap() as usize;
    assert!(sent > 10 && sent < REQUESTS, "sent {sent}");
    // The requests in flight (a few ms each) finished within the 5 s drain.
    assert_eq!(
        i["cancelled"], 0,
        "exited {took:?} after {name}: {i:#}\n{stderr}"
    );
    if let Some(not_sent) = i["not_sent"].as_u64() {
        assert_eq!(sent + not_sent as usize, REQUESTS);
    }
    let finished = i["finished"].as_u64().unwrap() as usize;
    assert_eq!(v["num_prompts"].as_u64().unwrap() as usize, finished);
    assert!(finished <= sent);

    let rows = parquet_rows(&dir.join("r.parquet"));
    assert_eq!(rows.records.len(), finished);
    no_duplicates(&rows);
    assert_eq!(rows.files[0].meta.extra["interrupted"], name);
    assert!(!dir.join("r.journal").exists());

    let md = dir.join("r.md");
    let rep = run(&[
        "report",
        dir.join("r.json").to_str().unwrap(),
        "-o",
        md.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&rep.stdout);
    assert!(said.contains(&format!("PARTIAL ({name})")), "{said}");
    assert!(std::fs::read_to_string(&md)
        .unwrap()
        .contains(&format!("PARTIAL ({name})")));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_mid_run_writes_a_partial_result_that_report_reads() {
    stopped_by(libc::SIGTERM, "SIGTERM", 143);
}

#[test]
fn sigint_mid_run_writes_a_partial_result_that_report_reads() {
    stopped_by(libc::SIGINT, "SIGINT", 130);
}

/// Requests of ~20 s and a drain of 60 s: the first signal would wait for them; the second
/// cancels them at once, and the result (the first signal's, with its exit status) still
/// gets written.
fn second_signal(first: i32, first_name: &str, status: i32) {
    let dir = tmpdir(&format!("second-{first_name}"));
    let t = trace(&dir);
    let gt = ground_truth(Duration::from_secs(5));
    let child = spawn_replay(&t, &gt, &dir, &["--drain-timeout", "60s"]);
    wait_into_the_run(&gt, Duration::from_secs(2));
    signal(&child, first);
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    signal(&child, libc::SIGINT);
    let (out, _) = finish(child, Duration::from_secs(15));
    let took = t0.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{stderr}");
    assert!(
        took < Duration::from_secs(4),
        "{took:?} after the second signal; stderr: {stderr}"
    );
    let v = json(&dir.join("r.json"));
    let i = &v["llmreplay"]["interrupted"];
    assert_eq!(i["reason"], first_name);
    assert!(i["cancelled"].as_u64().unwrap() > 0, "{i:#}");
    let rows = parquet_rows(&dir.join("r.parquet"));
    assert!(rows
        .records
        .iter()
        .any(|r| r.outcome == trace_format::Outcome::ClientCancelled));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_signal_cancels_the_requests_in_flight_at_once() {
    second_signal(libc::SIGTERM, "SIGTERM", 143);
}

#[test]
fn a_second_sigint_cancels_the_requests_in_flight_and_exits_130() {
    second_signal(libc::SIGINT, "SIGINT", 130);
}

/// kill -9 ~3 s in: the journal holds every request the server finished but those of the
/// last flush interval and those in flight; `merge` recovers each once, marked partial.
#[test]
fn kill_9_mid_run_then_merge_recovers_every_finished_request_once() {
    let dir = tmpdir("kill9");
    let t = trace(&dir);
    let gt = ground_truth(Duration::from_millis(2));
    let child = spawn_replay(&t, &gt, &dir, &[]);
    wait_into_the_run(&gt, Duration::from_secs(3));
    signal(&child, libc::SIGKILL);
    let (out, _) = finish(child, Duration::from_secs(5));
    assert_eq!(out.status.code(), None, "killed by the signal");
    // What the server finished by the kill (the client has no more time to end any).
    let done: BTreeSet<String> = gt
        .log()
        .into_iter()
        .filter(|l| l.complete)
        .filter_map(|l| l.request_id)
        .collect();
    assert!(done.len() > 20, "{} finished", done.len());
    let journal = dir.join("r.journal");
    assert!(journal.exists() && !dir.join("r.parquet").exists());

    let merged = dir.join("recovered");
    let o = run(&[
        "merge",
        journal.to_str().unwrap(),
        "-o",
        merged.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("recovered"));
    assert!(!journal.exists());
    let rows = parquet_rows(&dir.join("r.parquet"));
    let ids = no_duplicates(&rows);
    assert!(ids.is_subset(&done), "a row the server never finished");
    // At 20 req/s of ~15 ms requests: the last 50 ms flush interval and the request in
    // flight are all a kill can take.
    assert!(
        done.len() - ids.len() <= 5,
        "{} finished, {} recovered",
        done.len(),
        ids.len()
    );
    assert_eq!(
        rows.files[0].meta.extra["interrupted"],
        "killed: recovered from journal"
    );
    let m = json(&dir.join("recovered.json"));
    assert_eq!(
        m["llmreplay"]["interrupted"]["reason"],
        "killed: recovered from journal"
    );
    assert_eq!(
        m["llmreplay"]["interrupted"]["finished"].as_u64(),
        Some(ids.len() as u64)
    );
    // And merge on the results path finds nothing left to recover.
    let again = bin()
        .args(["merge", journal.to_str().unwrap(), "-o"])
        .arg(dir.join("again"))
        .output()
        .unwrap();
    assert!(!again.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// What passes before the engine's part: a replay that is not interrupted writes today's
/// results and no journal is left; a leftover journal of a killed run is refused (not
/// overwritten) by the next replay writing the same results, and `merge` on the results
/// path finishes it.
#[test]
fn a_leftover_journal_is_refused_then_recovered_by_merge() {
    let dir = tmpdir("leftover");
    let t = trace(&dir);
    let gt = ground_truth(Duration::from_millis(1));
    let r = dir.join("r.parquet");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "replay",
            t.as_str(),
            "-q",
            "--max-requests",
            "20",
            "--request-rate",
            "200",
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let url = format!("gt={}", gt.url());
    let ok = bin()
        .args(args(&["--target", &url, "--results", r.to_str().unwrap()]))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(parquet_rows(&r).records.len(), 20);
    assert!(!dir.join("r.journal").exists());

    // A journal as a killed run leaves it (header, then rows), and no results file.
    let rows = parquet_rows(&r);
    std::fs::remove_file(&r).unwrap();
    {
        let (mut w, _) = trace_format::TraceWriter::open(trace_format::WriterConfig::one_file(
            &r,
            rows.files[0].meta.clone(),
        ))
        .unwrap();
        for rec in rows.records.iter().take(12) {
            w.append(rec.clone()).unwrap();
        }
        // Dropped unfinished: buffered rows are handed to the OS, the journal stays.
    }
    let refused = bin()
        .args(args(&["--target", &url, "--results", r.to_str().unwrap()]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains("earlier run") && err.contains("llmreplay merge"),
        "{err}"
    );
    let o = run(&[
        "merge",
        r.to_str().unwrap(),
        "-o",
        dir.join("m").to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("recovered 12 rows"));
    let back = parquet_rows(&r);
    assert_eq!(back.records.len(), 12);
    no_duplicates(&back);
    let m = json(&dir.join("m.json"));
    assert_eq!(
        m["llmreplay"]["interrupted"]["reason"],
        "killed: recovered from journal"
    );
    let rep = run(&[
        "report",
        dir.join("m.json").to_str().unwrap(),
        "-o",
        dir.join("m.md").to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&rep.stdout).contains("PARTIAL (killed"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sweep stops on SIGINT like a replay: the level running stops, no further level starts,
/// and the levels run so far are summarized and written; it exits 130.
#[test]
fn sigint_mid_sweep_keeps_the_levels_run_and_exits_130() {
    let dir = tmpdir("sweep-sigint");
    let t = trace(&dir);
    let gt = ground_truth(Duration::from_millis(2));
    // Level 1 replays the ~10 s schedule at half speed (~20 s); the signal comes 3 s in.
    let child = bin()
        .args(["replay", &t, "-q", "--target"])
        .arg(format!("gt={}", gt.url()))
        .args(["--sweep", "speedup=0.5,1,2", "--drain-timeout", "2s"])
        .arg("--save-result")
        .arg(dir.join("sweep.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_into_the_run(&gt, Duration::from_secs(3));
    let sent_by_then = gt.log().len();
    signal(&child, libc::SIGINT);
    let (out, took) = finish(child, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(took < Duration::from_secs(8), "stopped in {took:?}");
    assert!(stderr.contains("sweep stopped (SIGINT)"), "{stderr}");
    let doc = json(&dir.join("sweep.json"));
    assert_eq!(
        doc["llmreplay_sweep"]["levels"],
        serde_json::json!([0.5]),
        "{doc}"
    );
    assert_eq!(doc["results"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        doc["results"][0]["llmreplay"]["interrupted"]["reason"],
        "SIGINT"
    );
    // No later level ran: the server saw about what the first level had sent.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        gt.log().len() <= sent_by_then + 10,
        "{} requests after the signal",
        gt.log().len() - sent_by_then
    );
}
