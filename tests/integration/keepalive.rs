//! End-to-end regression tests of keep-alive connection handling: `llmreplay replay` and
//! `llmreplay capture` against loopback servers that close connections the way real servers
//! do (idle timeouts, a request limit per connection, `Connection: close`, HTTP/1.0
//! close-delimited bodies, and a worker that reads a request and dies without answering).
//!
//! What every test checks is counts and outcomes, never timing figures: every request gets
//! its answer (or, where the server dropped it, exactly that request fails), and no request
//! reaches the server twice.
//!
//! The replay scenarios each run a ~15 s trace; they all run at once, in parallel threads,
//! the first time any test asks for their results (the capture tests start them in the
//! background before their own work), so the whole binary takes about as long as the longest
//! scenario.

use crate::support;
use support::env::{free_addr, tmpdir};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use support::capture::CaptureProc;
use support::http1::Http1Client;
use support::misbehaving::{Behaviour, ConnEnd, ConnEvent, MisbehavingServer, Served};
use trace_format::{FileMeta, Outcome, Producer, TraceRecord};

// ---------------------------------------------------------------------------------------
// The trace
// ---------------------------------------------------------------------------------------

/// Gaps (ms) between consecutive arrivals: bursts (0), reuse well within a 100 ms idle
/// timeout (30 ms), and pauses past 100 ms (250), 1 s (1500) and 5 s (6500), with a 600 ms
/// and a 2.5 s pause in between (past 100 ms, within 1 s / past 1 s, within 5 s).
///
/// The gaps are chosen so that no connection's idle time, whichever earlier request last used
/// it (every sum of consecutive gaps, less a response's 10-30 ms) and including connections
/// opened before the clock started, falls within 30 ms of 100 ms, 1 s or 5 s: a request sent
/// at the very instant the server closes the connection is a race no client can win, and
/// these tests must not depend on it.
const GAPS_MS: &[u64] = &[
    0, 0, 250, 30, 30, 0, 250, 30, 600, 0, 30, 1500, 0, 30, 600, 2500, 0, 30, 250, 6500, 0, 30,
    600, 1500, 30,
];

/// Writes the trace (mixed completions/chat, streamed or not, 3 output tokens each) and
/// returns the request ids in arrival order.
fn write_trace(path: &Path) -> Vec<String> {
    let t0: i64 = 1_750_000_000_000_000;
    let mut at = t0;
    let mut records = Vec::new();
    for (i, gap) in GAPS_MS.iter().enumerate() {
        at += *gap as i64 * 1000;
        let chat = i % 3 == 1;
        let endpoint = if chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let mut r = TraceRecord::new(format!("ka-{i:02}"), at, endpoint);
        r.stream = i % 2 == 0;
        r.prompt_tokens = Some(12);
        r.output_tokens = Some(3);
        r.status = Some(200);
        records.push(r);
    }
    trace_format::write_trace_file(
        path,
        &records,
        &FileMeta::new(Producer::Import, "tests/integration/keepalive.rs"),
    )
    .expect("write the trace");
    records.into_iter().map(|r| r.request_id).collect()
}

// ---------------------------------------------------------------------------------------
// Replay scenarios
// ---------------------------------------------------------------------------------------

/// What one `llmreplay replay` run against one misbehaving server produced.
struct ReplayRun {
    name: &'static str,
    /// The trace's request ids.
    ids: Vec<String>,
    exit: Option<ExitStatus>,
    stderr: String,
    /// `completed` and `failed` of --save-result.
    completed: Option<u64>,
    failed: Option<u64>,
    /// --results rows.
    rows: Vec<TraceRecord>,
    /// What the server read.
    served: Vec<Served>,
    events: Vec<ConnEvent>,
    /// Why the run could not be examined at all (a panic in the harness).
    harness_error: Option<String>,
}

struct Scenario {
    name: &'static str,
    behaviour: Behaviour,
    extra: &'static [&'static str],
}

fn scenarios() -> Vec<Scenario> {
    let ms = Duration::from_millis;
    vec![
        Scenario {
            name: "idle_100ms",
            behaviour: Behaviour::idle_timeout(ms(100)),
            extra: &[],
        },
        Scenario {
            name: "idle_1s",
            behaviour: Behaviour::idle_timeout(ms(1000)),
            extra: &[],
        },
        Scenario {
            name: "idle_5s",
            behaviour: Behaviour::idle_timeout(ms(5000)),
            extra: &[],
        },
        Scenario {
            // The pool used to be opened before the wait for --start-at: every pooled
            // connection was past the server's idle timeout when the clock started.
            name: "idle_1s_start_at_3s",
            behaviour: Behaviour::idle_timeout(ms(1000)),
            extra: &["--start-at", "+3s"],
        },
        Scenario {
            name: "max_3_per_conn_with_close_header",
            behaviour: Behaviour::max_requests(3, true),
            extra: &[],
        },
        Scenario {
            name: "max_3_per_conn_silent_close",
            behaviour: Behaviour::max_requests(3, false),
            extra: &[],
        },
        Scenario {
            // The extreme of the above: every response is the last on its connection, and
            // none says so. Every pooled connection is dead by the time it is reused.
            name: "max_1_per_conn_silent_close",
            behaviour: Behaviour::max_requests(1, false),
            extra: &[],
        },
        Scenario {
            name: "connection_close_always",
            behaviour: Behaviour::connection_close_always(),
            extra: &[],
        },
        Scenario {
            name: "http10_no_length",
            behaviour: Behaviour::http10_no_length(),
            extra: &[],
        },
        Scenario {
            name: "read_then_close_without_answer",
            behaviour: Behaviour::read_then_close_without_answer(),
            // Half its requests fail by design: the exit status would say so.
            extra: &["--max-failed", "1"],
        },
    ]
}

/// Longest a replay run may take (the trace spans 15 s, plus --start-at's 3 s).
const REPLAY_DEADLINE: Duration = Duration::from_secs(90);

fn replay_against(
    name: &'static str,
    trace: &Path,
    ids: &[String],
    behaviour: Behaviour,
    extra: &[&str],
) -> ReplayRun {
    let dir = tmpdir(&format!("replay-{name}"));
    let mut server = MisbehavingServer::start(behaviour);
    let (results, json) = (dir.join("out.parquet"), dir.join("out.json"));
    let stdout = std::fs::File::create(dir.join("stdout")).unwrap();
    let stderr = std::fs::File::create(dir.join("stderr")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmreplay"))
        .arg("replay")
        .arg(trace)
        .args(["--target", &format!("{name}={}", server.url())])
        .arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&json)
        .args(["-q", "--timeout", "30s", "--prompt-salt", "1"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("spawn llmreplay replay");
    let deadline = Instant::now() + REPLAY_DEADLINE;
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    server.stop();
    let v: Option<serde_json::Value> = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let rows = trace_format::read_traces(&[results.to_str().unwrap()])
        .map(|t| t.records)
        .unwrap_or_default();
    let run = ReplayRun {
        name,
        ids: ids.to_vec(),
        exit,
        stderr: std::fs::read_to_string(dir.join("stderr")).unwrap_or_default(),
        completed: v.as_ref().and_then(|v| v["completed"].as_u64()),
        failed: v.as_ref().and_then(|v| v["failed"].as_u64()),
        rows,
        served: server.requests(),
        events: server.events(),
        harness_error: None,
    };
    let _ = std::fs::remove_dir_all(&dir);
    run
}

/// Every replay scenario, run once, all at the same time.
fn replay_runs() -> &'static [ReplayRun] {
    static RUNS: OnceLock<Vec<ReplayRun>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let dir = tmpdir("trace");
        let trace = dir.join("trace.parquet");
        let ids = write_trace(&trace);
        let threads: Vec<_> = scenarios()
            .into_iter()
            .map(|s| {
                let (trace, ids) = (trace.clone(), ids.clone());
                let h = std::thread::spawn(move || {
                    replay_against(s.name, &trace, &ids, s.behaviour, s.extra)
                });
                (s.name, h)
            })
            .collect();
        let runs = threads
            .into_iter()
            .map(|(name, h)| {
                h.join().unwrap_or_else(|e| ReplayRun {
                    name,
                    ids: Vec::new(),
                    exit: None,
                    stderr: String::new(),
                    completed: None,
                    failed: None,
                    rows: Vec::new(),
                    served: Vec::new(),
                    events: Vec::new(),
                    harness_error: Some(format!("{e:?}")),
                })
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        runs
    })
}

/// Starts the replay scenarios in the background (no wait), so they overlap other tests.
fn start_replay_runs() {
    std::thread::spawn(|| {
        replay_runs();
    });
}

fn replay_run(name: &str) -> &'static ReplayRun {
    let run = replay_runs()
        .iter()
        .find(|r| r.name == name)
        .expect("a scenario of that name");
    if let Some(e) = &run.harness_error {
        panic!("{name}: the scenario itself panicked: {e}");
    }
    run
}

/// How the server saw one request: `conn#index` and what it did, e.g. `c3#1 dropped`.
fn seen(s: &Served) -> String {
    let what = if s.dropped {
        "read, dropped"
    } else if s.answered {
        "answered"
    } else {
        "read, not answered"
    };
    format!("c{}#{} {what}", s.conn, s.index)
}

/// The server's view per request id (POSTs only), and the POSTs with an unknown id.
fn server_view(run: &ReplayRun) -> (BTreeMap<&str, Vec<&Served>>, Vec<&Served>) {
    let mut by_id: BTreeMap<&str, Vec<&Served>> =
        run.ids.iter().map(|i| (i.as_str(), Vec::new())).collect();
    let mut unknown = Vec::new();
    for s in run.served.iter().filter(|s| s.method == "POST") {
        match s.request_id.as_deref().and_then(|id| by_id.get_mut(id)) {
            Some(v) => v.push(s),
            None => unknown.push(s),
        }
    }
    (by_id, unknown)
}

fn conn_summary(run: &ReplayRun) -> String {
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for e in &run.events {
        *ends.entry(format!("{:?}", e.what)).or_default() += 1;
    }
    let reused = run
        .served
        .iter()
        .filter(|s| s.method == "POST" && s.index > 0)
        .count();
    format!("server connections: {ends:?}; POSTs on a reused connection: {reused}")
}

fn process_problems(run: &ReplayRun, problems: &mut Vec<String>) {
    match run.exit {
        None => problems.push(format!(
            "llmreplay replay did not finish within {REPLAY_DEADLINE:?}"
        )),
        Some(s) if !s.success() => problems.push(format!(
            "llmreplay replay exited {s}; stderr:\n{}",
            run.stderr
        )),
        Some(_) => {}
    }
    if run.rows.len() != run.ids.len() {
        problems.push(format!(
            "--results has {} rows for {} requests",
            run.rows.len(),
            run.ids.len()
        ));
    }
}

/// The checks for a server that answers everything it reads: no failure, and every request
/// read by the server exactly once.
fn assert_every_request_once_and_ok(name: &str) {
    let run = replay_run(name);
    let n = run.ids.len();
    let (by_id, unknown) = server_view(run);
    let mut problems = Vec::new();
    process_problems(run, &mut problems);

    let failed_rows: Vec<&TraceRecord> = run
        .rows
        .iter()
        .filter(|r| r.outcome != Outcome::Ok)
        .collect();
    let twice: Vec<(&str, &Vec<&Served>)> = by_id
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(k, v)| (*k, v))
        .collect();
    let never: Vec<&str> = by_id
        .iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(k, _)| *k)
        .collect();
    if run.completed != Some(n as u64) || run.failed != Some(0) {
        problems.push(format!(
            "--save-result: completed {:?}, failed {:?} (want {n} and 0)",
            run.completed, run.failed
        ));
    }
    if !failed_rows.is_empty() {
        let mut s = format!("{} of {n} requests failed:", failed_rows.len());
        for r in &failed_rows {
            let server: Vec<String> = by_id
                .get(r.request_id.as_str())
                .map(|v| v.iter().map(|s| seen(s)).collect())
                .unwrap_or_default();
            let _ = write!(
                s,
                "\n    {} {:?} {:?} (new connection {:?}; server: {})",
                r.request_id,
                r.outcome,
                r.error.as_deref().unwrap_or(""),
                r.new_connection,
                if server.is_empty() {
                    "never saw it".to_string()
                } else {
                    server.join(", ")
                }
            );
        }
        problems.push(s);
    }
    if !twice.is_empty() {
        let mut s = format!(
            "{} of {n} requests reached the server more than once:",
            twice.len()
        );
        for (id, v) in &twice {
            let list: Vec<String> = v.iter().map(|s| seen(s)).collect();
            let _ = write!(s, "\n    {id}: {}", list.join(", "));
        }
        problems.push(s);
    }
    if !never.is_empty() {
        problems.push(format!(
            "{} of {n} requests never reached the server: {never:?}",
            never.len()
        ));
    }
    if !unknown.is_empty() {
        let list: Vec<String> = unknown
            .iter()
            .map(|s| format!("{:?} ({})", s.request_id, seen(s)))
            .collect();
        problems.push(format!("POSTs with an unknown x-request-id: {list:?}"));
    }
    let summary = format!(
        "{name}: {} of {n} failed, {} sent more than once, {} never sent; {}",
        failed_rows.len(),
        twice.len(),
        never.len(),
        conn_summary(run)
    );
    eprintln!("{summary}");
    assert!(
        problems.is_empty(),
        "{summary}\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn replay_idle_timeout_100ms() {
    assert_every_request_once_and_ok("idle_100ms");
}

#[test]
fn replay_idle_timeout_1s() {
    assert_every_request_once_and_ok("idle_1s");
}

#[test]
fn replay_idle_timeout_5s() {
    assert_every_request_once_and_ok("idle_5s");
}

#[test]
fn replay_idle_timeout_1s_with_start_at_3s() {
    assert_every_request_once_and_ok("idle_1s_start_at_3s");
}

#[test]
fn replay_max_requests_per_connection_with_connection_close() {
    assert_every_request_once_and_ok("max_3_per_conn_with_close_header");
}

#[test]
fn replay_max_requests_per_connection_silent_close() {
    assert_every_request_once_and_ok("max_3_per_conn_silent_close");
}

#[test]
fn replay_server_closes_after_every_response_without_saying_so() {
    assert_every_request_once_and_ok("max_1_per_conn_silent_close");
}

#[test]
fn replay_connection_close_on_every_response() {
    assert_every_request_once_and_ok("connection_close_always");
}

#[test]
fn replay_http10_close_delimited_bodies() {
    assert_every_request_once_and_ok("http10_no_length");
}

/// A server that reads a request on a reused connection and closes without answering: the
/// failures are exactly the requests it read and dropped (upstream_error), and every request
/// reached it exactly once; a POST the server may have acted on is never sent again.
#[test]
fn replay_read_then_close_fails_exactly_the_dropped_requests_once() {
    let name = "read_then_close_without_answer";
    let run = replay_run(name);
    let n = run.ids.len();
    let (by_id, unknown) = server_view(run);
    let mut problems = Vec::new();
    process_problems(run, &mut problems);

    let twice: Vec<(&str, &Vec<&Served>)> = by_id
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(k, v)| (*k, v))
        .collect();
    let never: Vec<&str> = by_id
        .iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(k, _)| *k)
        .collect();
    let dropped: BTreeSet<&str> = by_id
        .iter()
        .filter(|(_, v)| v.iter().any(|s| s.dropped))
        .map(|(k, _)| *k)
        .collect();
    let failed: BTreeSet<&str> = run
        .rows
        .iter()
        .filter(|r| r.outcome != Outcome::Ok)
        .map(|r| r.request_id.as_str())
        .collect();
    if !twice.is_empty() {
        let mut s = format!(
            "{} of {n} requests reached the server more than once:",
            twice.len()
        );
        for (id, v) in &twice {
            let list: Vec<String> = v.iter().map(|s| seen(s)).collect();
            let row = run.rows.iter().find(|r| r.request_id == *id);
            let _ = write!(
                s,
                "\n    {id}: {} -> recorded {:?}",
                list.join(", "),
                row.map(|r| r.outcome)
            );
        }
        problems.push(s);
    }
    if !never.is_empty() {
        problems.push(format!(
            "{} of {n} requests never reached the server: {never:?}",
            never.len()
        ));
    }
    if !unknown.is_empty() {
        problems.push(format!(
            "{} POSTs with an unknown x-request-id",
            unknown.len()
        ));
    }
    if failed != dropped {
        problems.push(format!(
            "failed requests {failed:?} are not the ones the server dropped {dropped:?}"
        ));
    }
    for r in run.rows.iter().filter(|r| r.outcome != Outcome::Ok) {
        if r.outcome != Outcome::UpstreamError {
            problems.push(format!(
                "{}: recorded {:?} ({:?}), want upstream_error",
                r.request_id, r.outcome, r.error
            ));
        }
    }
    if run.failed != Some(dropped.len() as u64) || run.completed != Some((n - dropped.len()) as u64)
    {
        problems.push(format!(
            "--save-result: completed {:?}, failed {:?} (the server dropped {})",
            run.completed,
            run.failed,
            dropped.len()
        ));
    }
    let summary = format!(
        "{name}: server dropped {} requests, {} recorded failed, {} of {n} sent more than once, {} never sent; {}",
        dropped.len(),
        failed.len(),
        twice.len(),
        never.len(),
        conn_summary(run)
    );
    eprintln!("{summary}");
    assert!(
        problems.is_empty(),
        "{summary}\n  {}",
        problems.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// Capture
// ---------------------------------------------------------------------------------------

/// A generation request body carrying `marker` in its prompt.
fn capture_body(marker: &str, chat: bool, stream: bool) -> String {
    if chat {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"marker {marker} one two three"}}],"max_tokens":3,"stream":{stream}}}"#
        )
    } else {
        format!(
            r#"{{"model":"m","prompt":"marker {marker} one two three","max_tokens":3,"stream":{stream}}}"#
        )
    }
}

/// What the client got for one request through the proxy.
struct Sent {
    marker: String,
    stream: bool,
    got: Result<support::http1::Response, String>,
}

impl Sent {
    fn status(&self) -> Option<u16> {
        self.got.as_ref().ok().map(|r| r.status)
    }
}

/// The upstream's log of `marker`: every POST whose x-request-id is the marker, or whose body
/// carries it (whichever the proxy passed on).
fn upstream_saw<'a>(served: &'a [Served], marker: &str) -> Vec<&'a Served> {
    let needle = format!("marker {marker} ");
    served
        .iter()
        .filter(|s| s.method == "POST")
        .filter(|s| s.request_id.as_deref() == Some(marker) || s.body.contains(&needle))
        .collect()
}

/// Runs capture in front of `server`, sends one request per entry of `pauses` (after
/// sleeping that long since the previous response), stops capture and returns what the
/// client got and the rows capture wrote (by marker).
fn through_capture(
    name: &str,
    server: &MisbehavingServer,
    pauses: &[Duration],
    shape: impl Fn(usize) -> (bool, bool),
) -> (Vec<Sent>, BTreeMap<String, Vec<TraceRecord>>, Vec<String>) {
    let out = tmpdir(&format!("capture-{name}"));
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(
        listen,
        &server.url(),
        &out,
        &["--session-header", "x-marker", "--flush-interval", "50ms"],
    );
    cap.wait_for("listening on");
    let mut client = Http1Client::new(listen);
    let mut sent = Vec::new();
    for (i, pause) in pauses.iter().enumerate() {
        std::thread::sleep(*pause);
        let marker = format!("{name}-{i:02}");
        let (chat, stream) = shape(i);
        let path = if chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let got = client
            .post(
                path,
                &[("x-marker", &marker), ("x-request-id", &marker)],
                &capture_body(&marker, chat, stream),
            )
            .map_err(|e| e.to_string());
        sent.push(Sent {
            marker,
            stream,
            got,
        });
    }
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let mut rows: BTreeMap<String, Vec<TraceRecord>> = BTreeMap::new();
    for r in trace_format::read_traces(&[out.to_str().unwrap()])
        .expect("read capture's trace files")
        .records
    {
        rows.entry(r.session_id.clone().unwrap_or_default())
            .or_default()
            .push(r);
    }
    let _ = std::fs::remove_dir_all(&out);
    (sent, rows, log)
}

/// Whether a 200 the client got is a whole answer: the SSE stream to `[DONE]`, or JSON.
fn complete_answer(s: &Sent) -> bool {
    match &s.got {
        Ok(r) if s.stream => r.text().contains("data: [DONE]"),
        Ok(r) => serde_json::from_slice::<serde_json::Value>(&r.body)
            .is_ok_and(|v| v.get("usage").is_some()),
        Err(_) => false,
    }
}

/// Capture in front of an upstream that reads a request on a reused connection and dies
/// without answering: the proxy never sends a request twice, the client gets 502 exactly
/// where the upstream closed without answering and 200 where it answered, and each row says
/// the same as what the client got.
#[test]
fn capture_never_resends_a_post_the_upstream_read_and_dropped() {
    start_replay_runs();
    let server = MisbehavingServer::start(Behaviour::read_then_close_without_answer());
    let pauses = vec![Duration::from_millis(20); 10];
    let (sent, rows, log) = through_capture("dropped", &server, &pauses, |_| (false, true));
    let served = server.posts();
    let n = sent.len();
    let mut problems = Vec::new();
    let mut table = String::new();
    let mut twice = 0;
    for s in &sent {
        let up = upstream_saw(&served, &s.marker);
        let answered = up.iter().any(|u| u.answered);
        let want = if answered { 200 } else { 502 };
        let row = rows.get(&s.marker).map(Vec::as_slice).unwrap_or_default();
        let _ = write!(
            table,
            "\n    {}: client {:?}, upstream [{}], rows {:?}",
            s.marker,
            s.got.as_ref().map(|r| r.status),
            up.iter().map(|u| seen(u)).collect::<Vec<_>>().join(", "),
            row.iter()
                .map(|r| (r.status, r.outcome))
                .collect::<Vec<_>>()
        );
        if up.len() > 1 {
            twice += 1;
            problems.push(format!(
                "{} reached the upstream {} times",
                s.marker,
                up.len()
            ));
        }
        if up.is_empty() {
            problems.push(format!("{} never reached the upstream", s.marker));
        }
        if s.status() != Some(want) {
            problems.push(format!(
                "{}: client got {:?}, want {want} (upstream {})",
                s.marker,
                s.got.as_ref().map(|r| r.status),
                if answered {
                    "answered it"
                } else {
                    "closed without answering"
                }
            ));
        } else if want == 200 && !complete_answer(s) {
            problems.push(format!("{}: a 200 without a whole SSE stream", s.marker));
        }
        match (row, s.status()) {
            ([r], Some(200)) if r.status == Some(200) && r.outcome == Outcome::Ok => {}
            ([r], Some(502))
                if r.outcome == Outcome::UpstreamError && matches!(r.status, None | Some(502)) => {}
            _ => problems.push(format!(
                "{}: rows {:?} do not match the client's {:?}",
                s.marker,
                row.iter()
                    .map(|r| (r.status, r.outcome, r.error.clone()))
                    .collect::<Vec<_>>(),
                s.got.as_ref().map(|r| r.status)
            )),
        }
    }
    let extra: Vec<&String> = rows
        .keys()
        .filter(|k| !sent.iter().any(|s| &s.marker == *k))
        .collect();
    if !extra.is_empty() {
        problems.push(format!("rows for requests never sent: {extra:?}"));
    }
    let ok = sent.iter().filter(|s| s.status() == Some(200)).count();
    let bad_gateway = sent.iter().filter(|s| s.status() == Some(502)).count();
    let summary = format!(
        "capture/read_then_close: {twice} of {n} reached the upstream twice; client got {ok}×200, {bad_gateway}×502; upstream connections {}, dropped {}",
        server.count(ConnEnd::Accepted),
        server.count(ConnEnd::ClosedWithoutAnswer)
    );
    eprintln!("{summary}{table}");
    assert!(
        problems.is_empty(),
        "{summary}{table}\n  {}\ncapture stderr: {log:#?}",
        problems.join("\n  ")
    );
}

/// Capture in front of an upstream that closes connections idle for 100 ms, with pauses
/// shorter and longer than that between requests: every request gets its 200 and reaches the
/// upstream exactly once, and every row is ok.
#[test]
fn capture_idle_timeout_100ms_every_request_once_and_ok() {
    start_replay_runs();
    let server = MisbehavingServer::start(Behaviour::idle_timeout(Duration::from_millis(100)));
    let pauses: Vec<Duration> = [0u64, 50, 200, 1200, 50, 200, 1200, 50, 200, 1200, 50]
        .iter()
        .map(|ms| Duration::from_millis(*ms))
        .collect();
    let (sent, rows, log) = through_capture("idle", &server, &pauses, |i| (i % 3 == 1, i % 2 == 0));
    let served = server.posts();
    let n = sent.len();
    let mut problems = Vec::new();
    let mut table = String::new();
    for s in &sent {
        let up = upstream_saw(&served, &s.marker);
        let row = rows.get(&s.marker).map(Vec::as_slice).unwrap_or_default();
        let _ = write!(
            table,
            "\n    {}: client {:?}, upstream [{}], rows {:?}",
            s.marker,
            s.got.as_ref().map(|r| r.status).map_err(|e| e.as_str()),
            up.iter().map(|u| seen(u)).collect::<Vec<_>>().join(", "),
            row.iter()
                .map(|r| (r.status, r.outcome, r.error.clone()))
                .collect::<Vec<_>>()
        );
        if up.len() != 1 {
            problems.push(format!(
                "{} reached the upstream {} times",
                s.marker,
                up.len()
            ));
        }
        if s.status() != Some(200) || !complete_answer(s) {
            problems.push(format!("{}: not a whole 200", s.marker));
        }
        if !matches!(row, [r] if r.outcome == Outcome::Ok && r.status == Some(200)) {
            problems.push(format!("{}: rows are not one ok row", s.marker));
        }
    }
    let ok = sent.iter().filter(|s| complete_answer(s)).count();
    let summary = format!(
        "capture/idle_100ms: {ok} of {n} got a whole 200; upstream saw {} POSTs for {n} requests; upstream connections {}, idle-closed {}",
        served.len(),
        server.count(ConnEnd::Accepted),
        server.count(ConnEnd::IdleClosed)
    );
    eprintln!("{summary}{table}");
    assert!(
        problems.is_empty(),
        "{summary}{table}\n  {}\ncapture stderr: {log:#?}",
        problems.join("\n  ")
    );
}
