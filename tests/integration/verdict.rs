//! End-to-end tests of the verdict (issue 39, findings 1 and 2): mixed traffic as users have
//! it — chat and completions, streamed and not, streams the client closed after a few chunks,
//! malformed requests the server refused with a 400 — captured in front of the sim, then
//! replayed A/A against the same sim and against one 3× slower.
//!
//! - The recorded cancellations (replayed at their point) and the captured 4xx (replayed as
//!   captured) are the client's: the A/A replay reads PASS in the console (`VERDICT` line), in
//!   the JSON (`llmreplay.verdict`, `slo_pass`), in `compare` and in `report`, with a
//!   capacity plan; before, they were counted as server failures (over the 1% error budget)
//!   and every verdict read FAIL.
//! - Against the slower sim the same capture reads FAIL naming the SLO (p95 TTFT against its
//!   limit), and `--fail-on-slo` makes the exit status 6.
//! - Captured without bodies (`--record-bodies hashes`), the 4xx rows are replayed with
//!   synthesized bodies (or skipped): the replay's, counted apart, never the server's.
//!
//! Loopback only; each replay is a few seconds. The SLO is TTFT ≤ 250 ms against a sim whose
//! TTFT is 100 ms (PASS: 150 ms of room for a loaded machine's scheduling noise) or 300 ms
//! (FAIL: the sim never answers sooner than its timing).

use crate::support;
use support::env::{free_addr, tmpdir};
use support::sim::{cancel_after_chunks, SimProc};

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::capture::CaptureProc;
use support::http1::Http1Client;

fn bin() -> String {
    std::env::var("LLMREPLAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_llmreplay").into())
}

/// The SLO every replay is judged against.
const SLO: &str = "ttft:250";
/// Requests served in the capture, then cancelled by their client, then refused (400).
const SERVED: usize = 26;
const CANCELLED: usize = 2;
const REFUSED: usize = 2;

/// Captures the mixed traffic in front of `sim` with `--record-bodies record`; returns the
/// capture's directory.
fn capture_mixed(sim: &SimProc, name: &str, record: &str) -> PathBuf {
    let out = tmpdir(name);
    let listen = free_addr();
    let mut cap = CaptureProc::spawn_bin(
        &bin(),
        listen,
        &sim.url(),
        &out,
        &[
            "--session-header",
            "x-id",
            "--flush-interval",
            "50ms",
            "--record-bodies",
            record,
        ],
    );
    cap.wait_for("listening on");
    let mut client = Http1Client::new(listen);
    let mut problems = Vec::new();
    for i in 0..SERVED {
        let id = format!("ok-{i:02}");
        let (chat, stream) = (i % 2 == 1, i % 4 < 2);
        let (path, body) = if chat {
            (
                "/v1/chat/completions",
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"{id} a b c"}}],"max_tokens":6,"ignore_eos":true,"stream":{stream}}}"#
                ),
            )
        } else {
            (
                "/v1/completions",
                format!(
                    r#"{{"model":"m","prompt":"{id} a b c","max_tokens":6,"ignore_eos":true,"stream":{stream}}}"#
                ),
            )
        };
        match client.post(path, &[("x-id", &id)], &body) {
            Ok(r) if r.status == 200 => {}
            other => problems.push(format!("{id}: {other:?}")),
        }
        if i % 13 == 5 {
            let id = format!("cancel-{i:02}");
            if let Err(e) = cancel_after_chunks(listen, &id, 3) {
                problems.push(format!("{id}: {e}"));
            }
        }
        if i % 13 == 9 {
            // A malformed request: the sim answers 400.
            let id = format!("bad-{i:02}");
            match client.post(
                "/v1/chat/completions",
                &[("x-id", &id)],
                r#"{"model":"m","messages":[],"max_tokens":4}"#,
            ) {
                Ok(r) if r.status == 400 => {}
                other => problems.push(format!("{id}: want a 400, got {other:?}")),
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    assert!(problems.is_empty(), "capture: {problems:#?}");
    let rows = trace_format::read_traces(&[out.to_str().unwrap()])
        .unwrap()
        .records;
    let count = |o: trace_format::Outcome| rows.iter().filter(|r| r.outcome == o).count();
    assert_eq!(
        (
            rows.len(),
            count(trace_format::Outcome::ClientCancelled),
            count(trace_format::Outcome::HttpError)
        ),
        (SERVED + CANCELLED + REFUSED, CANCELLED, REFUSED),
        "the capture"
    );
    out
}

/// What one command printed and how it ended.
struct Ran {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn context(&self) -> String {
        format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

/// Runs `llmreplay ARGS` for at most a minute.
fn run(dir: &Path, tag: &str, args: &[&str]) -> Ran {
    let (out, err) = (
        dir.join(format!("{tag}.out")),
        dir.join(format!("{tag}.err")),
    );
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawn llmreplay");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        status,
        stdout: std::fs::read_to_string(out).unwrap_or_default(),
        stderr: std::fs::read_to_string(err).unwrap_or_default(),
    }
}

/// Replays `trace` against `sim` as target `name`, judged against [`SLO`] with
/// `--fail-on-slo`; returns the run and its JSON result.
fn replay(dir: &Path, trace: &Path, name: &str, sim: &SimProc) -> (Ran, Value, PathBuf) {
    let json = dir.join(format!("{name}.json"));
    let ran = run(
        dir,
        name,
        &[
            "replay",
            trace.to_str().unwrap(),
            "--target",
            &format!("{name}={}", sim.url()),
            "--goodput",
            SLO,
            "--fail-on-slo",
            "--save-result",
            json.to_str().unwrap(),
            "-q",
            "--timeout",
            "30s",
        ],
    );
    let doc = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (ran, doc, json)
}

fn causes(doc: &Value) -> (u64, u64, u64, u64) {
    let c = &doc["llmreplay"]["outcome_causes"];
    let n = |k: &str| c[k].as_u64().unwrap_or(u64::MAX);
    (n("served"), n("server"), n("client"), n("replay"))
}

#[test]
fn an_a_a_replay_of_mixed_traffic_passes_and_a_3x_slower_sim_fails_naming_the_slo() {
    let fast = SimProc::fixed(&bin(), 100, 8);
    let slow = SimProc::fixed(&bin(), 300, 24);
    let trace = capture_mixed(&fast, "verdict-capture-full", "full");
    let dir = tmpdir("verdict-replay");

    // A/A: the same sim. The cancellations and 400s are the client's, as captured.
    let (a, doc, a_json) = replay(&dir, &trace, "same", &fast);
    assert_eq!(a.code(), Some(0), "{}", a.context());
    assert!(
        a.stdout.contains("VERDICT same: PASS — p95 TTFT"),
        "{}",
        a.context()
    );
    assert!(a.stdout.contains("4 the client's own"), "{}", a.context());
    let v = &doc["llmreplay"]["verdict"];
    assert_eq!(v["pass"], Value::Bool(true), "{v}");
    assert_eq!(doc["llmreplay"]["slo_pass"], Value::Bool(true));
    assert_eq!(
        causes(&doc),
        (SERVED as u64, 0, (CANCELLED + REFUSED) as u64, 0),
        "{}",
        a.context()
    );
    assert_eq!(doc["llmreplay"]["slo_attainment"].as_f64(), Some(1.0));

    // 3x slower: FAIL, naming the SLO, and the exit status follows it.
    let (b, doc_b, b_json) = replay(&dir, &trace, "slower", &slow);
    assert_eq!(b.code(), Some(6), "{}", b.context());
    let fail = b
        .stdout
        .lines()
        .find(|l| l.starts_with("VERDICT slower: FAIL — p95 TTFT"))
        .unwrap_or_else(|| panic!("no FAIL verdict line: {}", b.context()));
    assert!(fail.contains("> 250 ms"), "{fail}");
    assert_eq!(doc_b["llmreplay"]["verdict"]["pass"], Value::Bool(false));
    assert_eq!(doc_b["llmreplay"]["slo_pass"], Value::Bool(false));

    // compare: the same verdicts, the excluded counts beside.
    let c = run(
        &dir,
        "compare",
        &[
            "compare",
            a_json.to_str().unwrap(),
            b_json.to_str().unwrap(),
        ],
    );
    assert_eq!(c.code(), Some(0), "{}", c.context());
    let slo_row = c
        .stdout
        .lines()
        .find(|l| l.starts_with("SLO "))
        .unwrap_or_else(|| panic!("no SLO row: {}", c.context()));
    assert!(
        slo_row.contains("PASS") && slo_row.contains("FAIL: p95 TTFT"),
        "{}",
        c.context()
    );
    assert!(!slo_row.contains("% failed"), "{}", c.context());
    assert!(
        c.stdout.contains("the client's own (apart)"),
        "{}",
        c.context()
    );

    // report: PASS with a capacity plan for the A/A run; FAIL naming TTFT for the slower.
    let r = run(
        &dir,
        "report",
        &[
            "report",
            a_json.to_str().unwrap(),
            "-o",
            dir.join("same.md").to_str().unwrap(),
            "--target-qps",
            "20",
        ],
    );
    assert_eq!(r.code(), Some(0), "{}", r.context());
    assert!(!r.stdout.contains("misses the SLO"), "{}", r.context());
    assert!(!r.stdout.contains("failed"), "{}", r.context());
    assert!(r.stdout.contains("Plan: "), "{}", r.context());
    let r = run(
        &dir,
        "report-slower",
        &[
            "report",
            b_json.to_str().unwrap(),
            "-o",
            dir.join("slower.md").to_str().unwrap(),
        ],
    );
    assert_eq!(r.code(), Some(0), "{}", r.context());
    assert!(
        r.stdout.contains("misses the SLO") && r.stdout.contains("TTFT"),
        "{}",
        r.context()
    );
    let _ = std::fs::remove_dir_all(&trace);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without recorded bodies the 400s cannot be sent as captured: the replay synthesizes a
/// valid request (the sim serves it) or skips the row. Either is the replay's change, counted
/// apart, never a server failure; the cancellations stay the client's.
#[test]
fn without_bodies_the_captured_4xx_are_the_replays_change_not_the_servers() {
    let sim = SimProc::fixed(&bin(), 100, 8);
    let trace = capture_mixed(&sim, "verdict-capture-hashes", "hashes");
    let dir = tmpdir("verdict-replay-hashes");
    let (a, doc, _) = replay(&dir, &trace, "hashes", &sim);
    assert_eq!(a.code(), Some(0), "{}", a.context());
    assert!(a.stdout.contains("VERDICT hashes: PASS"), "{}", a.context());
    let (served, server, client, replayed) = causes(&doc);
    let skipped = doc["llmreplay"]["trace"]["skipped_rows"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        (served, server, client, replayed + skipped),
        (SERVED as u64, 0, CANCELLED as u64, REFUSED as u64),
        "{}",
        a.context()
    );
    let _ = std::fs::remove_dir_all(&trace);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 53: one failure count. A capture with cancellations and client 4xx, replayed against
/// a sim that fails a share of requests with 5xx: the console, the `VERDICT` line, the JSON
/// (`llmreplay.outcome_causes`), `compare` and `report` give the same counts — failed by the
/// server, the client's own apart — and counts as integers (compare printed `2.00`).
#[test]
fn console_verdict_compare_report_and_json_give_the_same_failure_counts() {
    let sim = SimProc::fixed(&bin(), 100, 8);
    let trace = capture_mixed(&sim, "verdict-capture-counts", "full");
    let erring = SimProc::start(
        &bin(),
        &[
            "--fixed-timing",
            "100,8",
            "--error-rate",
            "0.25",
            "--sim-seed",
            "7",
        ],
    );
    let dir = tmpdir("verdict-counts");
    let mut ran = Vec::new();
    for (name, target) in [("same", &sim), ("erring", &erring)] {
        let json = dir.join(format!("{name}.json"));
        let r = run(
            &dir,
            name,
            &[
                "replay",
                trace.to_str().unwrap(),
                "--target",
                &format!("{name}={}", target.url()),
                "--goodput",
                SLO,
                "--max-failed",
                "1",
                "--save-result",
                json.to_str().unwrap(),
                "-q",
            ],
        );
        assert_eq!(r.code(), Some(0), "{}", r.context());
        let doc: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        ran.push((r, doc, json));
    }
    let (r, doc, _) = &ran[1];
    let (served, server, client_own, _) = causes(doc);
    // The 400s stay the client's (the sim refuses them before any injected fault); a
    // cancellation the erring sim answered with a 5xx first is the server's.
    assert!(server > 0, "the erring sim failed none: {}", r.context());
    assert!(client_own >= REFUSED as u64, "{}", r.context());
    let same_client = causes(&ran[0].1).2;
    assert_eq!(same_client, (CANCELLED + REFUSED) as u64);
    let asked = served + server;
    let counts = format!("{server} of {asked} failed by the server");
    let apart = format!("{client_own} the client's own (cancelled or 4xx as captured), apart");
    // The console's one failure line and the verdict say the same counts.
    let failed = r
        .stdout
        .lines()
        .find(|l| l.starts_with("Failed requests:"))
        .unwrap_or_else(|| panic!("no failure line: {}", r.context()));
    assert!(
        failed.contains(&counts) && failed.contains(&apart),
        "{failed}"
    );
    let verdict = r
        .stdout
        .lines()
        .find(|l| l.starts_with("VERDICT erring:"))
        .unwrap_or_else(|| panic!("no verdict: {}", r.context()));
    assert!(
        verdict.contains(&counts) && verdict.contains(&apart),
        "{verdict}"
    );
    // The errors list keeps the client's own apart from the server's failures.
    let errors = r
        .stdout
        .split("Most frequent errors (failed by the server):")
        .nth(1);
    assert!(
        errors.is_some_and(|e| e
            .lines()
            .take_while(|l| l.starts_with("  "))
            .all(|l| !l.contains("client_cancelled"))),
        "{}",
        r.context()
    );
    // compare: integers, the same counts.
    let c = run(
        &dir,
        "compare",
        &[
            "compare",
            ran[0].2.to_str().unwrap(),
            ran[1].2.to_str().unwrap(),
        ],
    );
    let row = |label: &str| -> Vec<String> {
        c.stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} row: {}", c.context()))[label.len()..]
            .split("  ")
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect()
    };
    let failed_row = row("failed by the server");
    assert_eq!(failed_row[0], "0", "{}", c.context());
    assert!(
        failed_row[1].starts_with(&format!("{server} ")) || failed_row[1] == server.to_string(),
        "{}",
        c.context()
    );
    assert_eq!(
        row("the client's own (apart)"),
        vec![same_client.to_string(), client_own.to_string()],
        "{}",
        c.context()
    );
    // Counts are integers (a latency may well be 102.00 ms).
    for label in ["failed by the server", "the client's own (apart)"] {
        assert!(
            row(label)
                .iter()
                .all(|v| !v.split_whitespace().next().unwrap_or("").contains('.')),
            "{label}: {}",
            c.context()
        );
    }
    // report: the same counts in its table.
    let md = dir.join("erring.md");
    let rep = run(
        &dir,
        "report",
        &[
            "report",
            ran[1].2.to_str().unwrap(),
            "-o",
            md.to_str().unwrap(),
        ],
    );
    assert_eq!(rep.code(), Some(0), "{}", rep.context());
    let text = std::fs::read_to_string(&md).unwrap();
    let level = text
        .lines()
        .find(|l| l.contains(&counts))
        .unwrap_or_else(|| panic!("no level row with {counts:?}:\n{text}"));
    assert!(level.contains(&format!("| {client_own} |")), "{level}");
    let _ = std::fs::remove_dir_all(&trace);
    let _ = std::fs::remove_dir_all(&dir);
}
