//! End-to-end regression tests of how latency is measured for mixed traffic: streamed and
//! not, chat and completions, through `llmreplay replay` (against loopback servers and the
//! sim) and `llmreplay capture`.
//!
//! - TTFT is the arrival of the first chunk that carries generated output: a chat stream's
//!   role-only first chunk (`{"delta":{"role":"assistant","content":""}}`), which some servers
//!   send before queueing and prefill, is not a token (not TTFT, not in `chunk_times_us`, not
//!   an ITL gap).
//! - A request that is not streamed has no TTFT (null in the rows, before: its E2EL), stays
//!   out of TTFT/TPOT/ITL, counts in E2EL and goodput, and the TTFT/TPOT SLOs do not apply to
//!   it; the JSON result says how many requests each metric covers
//!   (`llmreplay.metric_requests`), the console too ("Requests in TTFT: ...").
//! - The sim sends the role-only chunk with the first token (after prefill), not at once.
//!
//! Loopback only; every run is a second or two, and the tests run in parallel. Assertions are
//! on counts, outcomes and orderings with wide margins (a 300 ms delay against a bound of
//! 300 ms from below, a 400 ms answer against a 400 ms bound from above, 2x and more
//! elsewhere), never on tight timing.
//!
//! `LLMREPLAY_BIN=/path/to/llmreplay` runs the same tests against another build (to show an
//! older one fails them); by default they use this workspace's binary.

use crate::support;
use support::env::{free_addr, serial, tmpdir};
use support::sim::{cancel_after_chunks, SimProc};

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::capture::CaptureProc;
use support::http1::Http1Client;
use support::misbehaving::{Behaviour, MisbehavingServer};
use trace_format::{FileMeta, Outcome, Producer, TraceRecord};

/// The `llmreplay` under test: `$LLMREPLAY_BIN`, else this workspace's.
fn bin() -> String {
    std::env::var("LLMREPLAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_llmreplay").into())
}

const MS: i64 = 1000;

// ---------------------------------------------------------------------------------------
// Traces and replay runs
// ---------------------------------------------------------------------------------------

/// One request of a trace.
#[derive(Debug, Clone)]
struct Req {
    id: String,
    at_ms: i64,
    chat: bool,
    stream: bool,
    prompt_tokens: i64,
    output_tokens: i64,
}

fn write_trace(path: &Path, reqs: &[Req]) {
    let t0: i64 = 1_750_000_000_000_000;
    let records: Vec<TraceRecord> = reqs
        .iter()
        .map(|q| {
            let endpoint = if q.chat {
                "/v1/chat/completions"
            } else {
                "/v1/completions"
            };
            let mut r = TraceRecord::new(q.id.clone(), t0 + q.at_ms * MS, endpoint);
            r.stream = q.stream;
            r.prompt_tokens = Some(q.prompt_tokens);
            r.output_tokens = Some(q.output_tokens);
            r.status = Some(200);
            r
        })
        .collect();
    trace_format::write_trace_file(
        path,
        &records,
        &FileMeta::new(Producer::Import, "tests/integration/mixed_traffic.rs"),
    )
    .expect("write the trace");
}

/// What one `llmreplay replay` run produced.
struct Replay {
    /// The command line, for messages.
    cmd: String,
    stdout: String,
    stderr: String,
    /// --save-result.
    json: Value,
    /// --results rows by request id.
    rows: BTreeMap<String, TraceRecord>,
}

impl Replay {
    /// A number of the JSON result (top level), NaN when absent.
    fn num(&self, key: &str) -> f64 {
        self.json[key].as_f64().unwrap_or(f64::NAN)
    }

    /// `llmreplay.<key>` of the JSON result.
    fn ours(&self, key: &str) -> &Value {
        &self.json["llmreplay"][key]
    }

    /// The console line starting with `label`, or "" when there is none.
    fn console_line(&self, label: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or("")
    }

    fn context(&self) -> String {
        format!(
            "command: {}\nstderr:\n{}\nstdout:\n{}",
            self.cmd, self.stderr, self.stdout
        )
    }
}

/// Longest a replay run may take (every trace here spans well under a second).
const REPLAY_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `llmreplay replay TRACE` (against `target`, or the in-process sim) with `extra`
/// flags; panics unless it exits 0 and writes its JSON result and rows.
fn replay(name: &str, reqs: &[Req], target: Option<&str>, extra: &[&str]) -> Replay {
    let dir = tmpdir(&format!("replay-{name}"));
    let trace = dir.join("trace.parquet");
    write_trace(&trace, reqs);
    let (results, json) = (dir.join("out.parquet"), dir.join("out.json"));
    let mut cmd = Command::new(bin());
    cmd.arg("replay").arg(&trace);
    if let Some(t) = target {
        cmd.args(["--target", &format!("{name}={t}")]);
    }
    cmd.arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&json)
        .args(["-q", "--timeout", "30s", "--prompt-salt", "1"])
        .args(extra);
    let line = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("spawn llmreplay replay");
    let exit = wait_bounded(&mut child, REPLAY_DEADLINE);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let (stdout, stderr) = (read("stdout"), read("stderr"));
    assert!(
        exit.is_some_and(|s| s.success()),
        "{name}: llmreplay replay exited {exit:?}\ncommand: {line}\nstderr:\n{stderr}\nstdout:\n{stdout}"
    );
    let json: Value = serde_json::from_slice(&std::fs::read(&json).expect("the JSON result"))
        .expect("the JSON result parses");
    let rows = trace_format::read_traces(&[results.to_str().unwrap()])
        .expect("read the --results rows")
        .records
        .into_iter()
        .map(|r| (r.request_id.clone(), r))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    Replay {
        cmd: line,
        stdout,
        stderr,
        json,
        rows,
    }
}

/// Waits for `child` at most `limit`; kills it past that (None).
fn wait_bounded(child: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `v >= min`; false for NaN (a number missing from the JSON).
fn at_least(v: f64, min: f64) -> bool {
    v >= min
}

/// `v < max`; false for NaN (a number missing from the JSON).
fn below(v: f64, max: f64) -> bool {
    v < max
}

fn ms(us: Option<i64>) -> String {
    us.map_or("null".into(), |u| format!("{:.1}", u as f64 / 1000.0))
}

/// One line per row: what a failure message shows.
fn row_table(rows: &BTreeMap<String, TraceRecord>) -> String {
    rows.values()
        .map(|r| {
            format!(
                "\n    {} stream={} {:?} ttft={} e2el={} chunks={} ({}) out={:?}",
                r.session_id.as_deref().unwrap_or(&r.request_id),
                r.stream,
                r.outcome,
                ms(r.ttft_us),
                ms(r.e2el_us),
                r.chunk_times_us.len(),
                r.chunk_times_us
                    .iter()
                    .map(|c| format!("{:.1}", *c as f64 / 1000.0))
                    .collect::<Vec<_>>()
                    .join(" "),
                r.output_tokens
            )
        })
        .collect()
}

/// The rows of the trace files at `path` (a file or a directory), by session id.
fn rows_by_session(path: &Path) -> BTreeMap<String, TraceRecord> {
    trace_format::read_traces(&[path.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .records
        .into_iter()
        .map(|r| (r.session_id.clone().unwrap_or_default(), r))
        .collect()
}

/// Panics with every problem found, and the context to read them by.
#[track_caller]
fn report(test: &str, problems: &[String], context: &str) {
    assert!(
        problems.is_empty(),
        "{test}: {} problem(s):\n  - {}\n{context}",
        problems.len(),
        problems.join("\n  - ")
    );
}

// ---------------------------------------------------------------------------------------
// a. A server that sends the chat role-only chunk at once, the first content 300 ms later
// ---------------------------------------------------------------------------------------

/// The role-only chunk comes at once, the first content chunk this much later.
const ROLE_FIRST_DELAY: Duration = Duration::from_millis(300);
/// Content chunks per streamed answer (the server sends max_tokens of them).
const CONTENT_CHUNKS: usize = 5;

fn role_first_server() -> MisbehavingServer {
    MisbehavingServer::start(Behaviour {
        chunk_gap: Duration::from_millis(5),
        ..Behaviour::role_chunk_first(ROLE_FIRST_DELAY)
    })
}

/// `llmreplay replay` of streamed chat requests against a server that sends the role-only
/// chunk at once and the first content 300 ms later: TTFT is the first content (>= 300 ms),
/// the role chunk is neither a chunk of `chunk_times_us` nor an ITL gap, and TPOT is the
/// content's pace, not the 300 ms spread over the tokens.
#[test]
fn replay_ttft_is_the_first_content_chunk_not_the_role_chunk() {
    let server = role_first_server();
    let reqs: Vec<Req> = (0..4)
        .map(|i| Req {
            id: format!("role-{i}"),
            at_ms: i * 50,
            chat: true,
            stream: true,
            prompt_tokens: 12,
            output_tokens: CONTENT_CHUNKS as i64,
        })
        .collect();
    let run = replay("role_first", &reqs, Some(&server.url()), &[]);
    let delay_us = ROLE_FIRST_DELAY.as_micros() as i64;
    let mut problems = Vec::new();
    if run.num("completed") != 4.0 || run.num("failed") != 0.0 {
        problems.push(format!(
            "completed {} failed {}, want 4 and 0",
            run.num("completed"),
            run.num("failed")
        ));
    }
    for q in &reqs {
        let Some(r) = run.rows.get(&q.id) else {
            problems.push(format!("{}: no row", q.id));
            continue;
        };
        if r.outcome != Outcome::Ok {
            problems.push(format!("{}: outcome {:?} {:?}", q.id, r.outcome, r.error));
            continue;
        }
        if r.ttft_us.is_none_or(|t| t < delay_us) {
            problems.push(format!(
                "{}: ttft {} ms, want >= {} ms (the first content chunk, not the role chunk)",
                q.id,
                ms(r.ttft_us),
                ROLE_FIRST_DELAY.as_millis()
            ));
        }
        if r.chunk_times_us.len() != CONTENT_CHUNKS {
            problems.push(format!(
                "{}: {} chunk times, want {CONTENT_CHUNKS} (the content chunks only)",
                q.id,
                r.chunk_times_us.len()
            ));
        }
        if r.chunk_times_us.first().copied() != r.ttft_us {
            problems.push(format!(
                "{}: ttft {} ms is not the first chunk time {} ms",
                q.id,
                ms(r.ttft_us),
                ms(r.chunk_times_us.first().copied())
            ));
        }
        if r.e2el_us.is_none() || r.e2el_us < r.ttft_us {
            problems.push(format!(
                "{}: e2el {} ms before ttft {} ms",
                q.id,
                ms(r.e2el_us),
                ms(r.ttft_us)
            ));
        }
        if r.output_tokens != Some(CONTENT_CHUNKS as i64) {
            problems.push(format!(
                "{}: output_tokens {:?}, want {CONTENT_CHUNKS}",
                q.id, r.output_tokens
            ));
        }
    }
    let median_ttft = run.num("median_ttft_ms");
    if !at_least(median_ttft, ROLE_FIRST_DELAY.as_millis() as f64) {
        problems.push(format!(
            "median_ttft_ms {median_ttft}, want >= {}",
            ROLE_FIRST_DELAY.as_millis()
        ));
    }
    // Content chunks come 5 ms apart: no ITL gap is the 300 ms after the role chunk.
    let p99_itl = run.num("p99_itl_ms");
    if !below(p99_itl, ROLE_FIRST_DELAY.as_millis() as f64 / 2.0) {
        problems.push(format!(
            "p99_itl_ms {p99_itl}, want < {} (the role chunk is no ITL gap)",
            ROLE_FIRST_DELAY.as_millis() / 2
        ));
    }
    // TPOT = (E2EL - TTFT) / 4 ~ 5 ms; with the role chunk as TTFT it is ~80 ms.
    let median_tpot = run.num("median_tpot_ms");
    if !below(median_tpot, 40.0) {
        problems.push(format!("median_tpot_ms {median_tpot}, want < 40 (~5)"));
    }
    let cov = run.ours("metric_requests");
    let want = serde_json::json!({"ttft": 4, "tpot": 4, "itl": 4, "e2el": 4, "not_streamed": 0, "single_token": 0});
    if *cov != want {
        problems.push(format!("llmreplay.metric_requests {cov}, want {want}"));
    }
    // The server read and answered each request once (the capture test checks that its
    // answers do start with the role-only chunk).
    let posts = server.posts();
    if posts.len() != 4 || posts.iter().any(|p| !p.answered) {
        problems.push(format!("the server answered {:?}", posts));
    }
    eprintln!(
        "role chunk first: median TTFT {median_ttft} ms, p99 ITL {p99_itl} ms, median TPOT {median_tpot} ms"
    );
    report(
        "replay, role chunk first",
        &problems,
        &format!("rows:{}\n{}", row_table(&run.rows), run.context()),
    );
}

fn chat_body(marker: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"marker {marker} one two three"}}],"max_tokens":{CONTENT_CHUNKS},"stream":{stream}}}"#
    )
}

fn completion_body(marker: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"m","prompt":"marker {marker} one two three","max_tokens":{CONTENT_CHUNKS},"stream":{stream}}}"#
    )
}

/// `llmreplay capture` in front of the same server: a captured streamed chat row's TTFT is
/// the first content chunk (>= 300 ms), its chunk times the content chunks; a request that is
/// not streamed has no TTFT (null), only E2EL.
#[test]
fn capture_ttft_is_the_first_content_chunk_and_not_streamed_has_none() {
    let server = role_first_server();
    let out = tmpdir("capture");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn_bin(
        &bin(),
        listen,
        &server.url(),
        &out,
        &["--session-header", "x-marker", "--flush-interval", "50ms"],
    );
    cap.wait_for("listening on");
    // (marker, chat, stream)
    let sent = [
        ("cap-chat-stream-0", true, true),
        ("cap-chat-stream-1", true, true),
        ("cap-chat-whole", true, false),
        ("cap-text-whole", false, false),
        ("cap-text-stream", false, true),
    ];
    let mut client = Http1Client::new(listen);
    let mut problems = Vec::new();
    for (marker, chat, stream) in sent {
        let (path, body) = if chat {
            ("/v1/chat/completions", chat_body(marker, stream))
        } else {
            ("/v1/completions", completion_body(marker, stream))
        };
        match client.post(path, &[("x-marker", marker)], &body) {
            Ok(r) if r.status == 200 => {
                let text = r.text();
                if stream && chat && !text.contains(r#""delta":{"role":"assistant","content":""}"#)
                {
                    problems.push(format!("{marker}: no role-only chunk in {text:?}"));
                }
            }
            Ok(r) => problems.push(format!("{marker}: HTTP {} {:?}", r.status, r.text())),
            Err(e) => problems.push(format!("{marker}: {e}")),
        }
    }
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let mut rows: BTreeMap<String, TraceRecord> = BTreeMap::new();
    for r in trace_format::read_traces(&[out.to_str().unwrap()])
        .expect("read capture's trace files")
        .records
    {
        let key = r.session_id.clone().unwrap_or_default();
        if rows.insert(key.clone(), r).is_some() {
            problems.push(format!("{key}: more than one row"));
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    let delay_us = ROLE_FIRST_DELAY.as_micros() as i64;
    for (marker, chat, stream) in sent {
        let Some(r) = rows.get(marker) else {
            problems.push(format!("{marker}: no row"));
            continue;
        };
        if r.outcome != Outcome::Ok || r.stream != stream {
            problems.push(format!(
                "{marker}: outcome {:?} stream {} (sent stream {stream})",
                r.outcome, r.stream
            ));
            continue;
        }
        if r.e2el_us.is_none_or(|e| e <= 0) {
            problems.push(format!("{marker}: e2el {}", ms(r.e2el_us)));
        }
        match (chat, stream) {
            (true, true) => {
                if r.ttft_us.is_none_or(|t| t < delay_us) {
                    problems.push(format!(
                        "{marker}: captured ttft {} ms, want >= {} ms (the first content chunk)",
                        ms(r.ttft_us),
                        ROLE_FIRST_DELAY.as_millis()
                    ));
                }
                if r.chunk_times_us.len() != CONTENT_CHUNKS {
                    problems.push(format!(
                        "{marker}: {} chunk times, want {CONTENT_CHUNKS}",
                        r.chunk_times_us.len()
                    ));
                }
                if r.e2el_us < r.ttft_us {
                    problems.push(format!(
                        "{marker}: e2el {} ms before ttft {} ms",
                        ms(r.e2el_us),
                        ms(r.ttft_us)
                    ));
                }
            }
            (false, true) => {
                // No role chunk on /v1/completions: the first chunk is the first text.
                if r.ttft_us.is_none() || r.chunk_times_us.len() != CONTENT_CHUNKS {
                    problems.push(format!(
                        "{marker}: ttft {} ms, {} chunk times, want a ttft and {CONTENT_CHUNKS}",
                        ms(r.ttft_us),
                        r.chunk_times_us.len()
                    ));
                }
            }
            (_, false) => {
                if r.ttft_us.is_some() {
                    problems.push(format!(
                        "{marker}: not streamed, yet captured ttft {} ms (want null; e2el {} ms)",
                        ms(r.ttft_us),
                        ms(r.e2el_us)
                    ));
                }
                if !r.chunk_times_us.is_empty() {
                    problems.push(format!(
                        "{marker}: not streamed, yet {} chunk times",
                        r.chunk_times_us.len()
                    ));
                }
            }
        }
    }
    eprintln!("capture rows:{}", row_table(&rows));
    report(
        "capture, role chunk first",
        &problems,
        &format!("rows:{}\ncapture stderr: {log:#?}", row_table(&rows)),
    );
}

// ---------------------------------------------------------------------------------------
// b. Mixed traffic: streamed answers start at ~50 ms, whole ones take 400 ms
// ---------------------------------------------------------------------------------------

/// A whole (not streamed) answer takes this long.
const WHOLE_ANSWER: Duration = Duration::from_millis(400);

fn mixed_server() -> MisbehavingServer {
    MisbehavingServer::start(Behaviour {
        think: Duration::from_millis(50),
        think_not_streamed: Some(WHOLE_ANSWER),
        chunk_gap: Duration::from_millis(5),
        ..Default::default()
    })
}

/// 12 requests, 30 ms apart, cycling through streamed completions, streamed chat,
/// completions and chat not streamed; 4 output tokens each.
fn mixed_trace() -> Vec<Req> {
    (0..12)
        .map(|i| Req {
            id: format!("mix-{i:02}"),
            at_ms: i * 30,
            chat: i % 2 == 1,
            stream: i % 4 < 2,
            prompt_tokens: 12,
            output_tokens: 4,
        })
        .collect()
}

/// A mixed trace: rows of requests that are not streamed have no TTFT; TTFT percentiles are
/// the streamed requests' (p99 < 400 ms, where the whole answers' E2EL would put it above);
/// E2EL still covers everything; `llmreplay.metric_requests` and the console say what each
/// metric covers; under `--goodput ttft:200` every request is good (the TTFT SLO does not
/// apply to whole answers, which still count), while under `--goodput e2el:300` exactly the
/// whole answers fail (the E2EL SLO does apply to them).
#[test]
fn replay_mixed_traffic_not_streamed_requests_have_no_ttft() {
    let reqs = mixed_trace();
    // Two runs at once, each against its own server.
    let (ttft_run, e2el_run) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            let server = mixed_server();
            replay(
                "mixed_ttft",
                &reqs,
                Some(&server.url()),
                &["--goodput", "ttft:200"],
            )
        });
        let b = s.spawn(|| {
            let server = mixed_server();
            replay(
                "mixed_e2el",
                &reqs,
                Some(&server.url()),
                &["--goodput", "e2el:300"],
            )
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let whole_us = WHOLE_ANSWER.as_micros() as i64;
    let (n_stream, n_whole) = (
        reqs.iter().filter(|q| q.stream).count(),
        reqs.iter().filter(|q| !q.stream).count(),
    );
    let mut problems = Vec::new();
    for (name, run) in [("ttft:200", &ttft_run), ("e2el:300", &e2el_run)] {
        if run.num("completed") != reqs.len() as f64 || run.num("failed") != 0.0 {
            problems.push(format!(
                "{name}: completed {} failed {}, want {} and 0",
                run.num("completed"),
                run.num("failed"),
                reqs.len()
            ));
        }
        for q in &reqs {
            let Some(r) = run.rows.get(&q.id) else {
                problems.push(format!("{name}: {}: no row", q.id));
                continue;
            };
            if r.outcome != Outcome::Ok || r.stream != q.stream {
                problems.push(format!(
                    "{name}: {}: outcome {:?} stream {}",
                    q.id, r.outcome, r.stream
                ));
                continue;
            }
            if q.stream {
                if r.ttft_us.is_none_or(|t| t >= whole_us) || r.chunk_times_us.len() != 4 {
                    problems.push(format!(
                        "{name}: {} streamed: ttft {} ms, {} chunk times; want < {} ms and 4",
                        q.id,
                        ms(r.ttft_us),
                        r.chunk_times_us.len(),
                        WHOLE_ANSWER.as_millis()
                    ));
                }
            } else {
                if r.ttft_us.is_some() {
                    problems.push(format!(
                        "{name}: {} not streamed: ttft {} ms, want null (e2el {} ms)",
                        q.id,
                        ms(r.ttft_us),
                        ms(r.e2el_us)
                    ));
                }
                if r.e2el_us.is_none_or(|e| e < whole_us) {
                    problems.push(format!(
                        "{name}: {} not streamed: e2el {} ms, want >= {} ms",
                        q.id,
                        ms(r.e2el_us),
                        WHOLE_ANSWER.as_millis()
                    ));
                }
            }
        }
        // The TTFT percentiles are the streamed requests' only; E2EL has the whole answers.
        let p99_ttft = run.num("p99_ttft_ms");
        if !below(p99_ttft, WHOLE_ANSWER.as_millis() as f64) {
            problems.push(format!(
                "{name}: p99_ttft_ms {p99_ttft}, want < {} (whole answers are not in TTFT)",
                WHOLE_ANSWER.as_millis()
            ));
        }
        let p99_e2el = run.num("p99_e2el_ms");
        if !at_least(p99_e2el, WHOLE_ANSWER.as_millis() as f64) {
            problems.push(format!(
                "{name}: p99_e2el_ms {p99_e2el}, want >= {} (whole answers are in E2EL)",
                WHOLE_ANSWER.as_millis()
            ));
        }
        let cov = run.ours("metric_requests");
        let want = serde_json::json!({
            "ttft": n_stream, "tpot": n_stream, "itl": n_stream,
            "e2el": reqs.len(), "not_streamed": n_whole, "single_token": 0
        });
        if *cov != want {
            problems.push(format!(
                "{name}: llmreplay.metric_requests {cov}, want {want}"
            ));
        }
        // The console says it, per metric.
        let total = reqs.len();
        for metric in ["TTFT", "TPOT", "ITL"] {
            let l = run.console_line(&format!("Requests in {metric}:"));
            let want =
                format!("{n_stream} of {total} ({n_whole} not streamed: {metric} does not apply)");
            if !l.ends_with(&want) {
                problems.push(format!("{name}: console {l:?}, want it to end {want:?}"));
            }
        }
        let l = run.console_line("Requests in E2EL:");
        if !l.ends_with(&format!("{total} of {total}")) {
            problems.push(format!(
                "{name}: console {l:?}, want it to end \"{total} of {total}\""
            ));
        }
        if !run.stdout.contains("not streamed") {
            problems.push(format!("{name}: the console never says \"not streamed\""));
        }
    }
    // ttft:200: every request meets it (streamed ones at ~50 ms, the rest exempt).
    let att = ttft_run.ours("slo_attainment").as_f64();
    if !att.is_some_and(|a| (a - 1.0).abs() < 1e-9) {
        problems.push(format!(
            "ttft:200: llmreplay.slo_attainment {att:?}, want 1.0 ({n_whole} whole answers exempt)"
        ));
    }
    let (good, thr) = (
        ttft_run.num("request_goodput"),
        ttft_run.num("request_throughput"),
    );
    if !(good > 0.0 && (good - thr).abs() <= 1e-6 * thr) {
        problems.push(format!(
            "ttft:200: request_goodput {good}, want request_throughput {thr}"
        ));
    }
    if ttft_run.ours("slo_pass") != &Value::Bool(true) {
        problems.push(format!(
            "ttft:200: llmreplay.slo_pass {}, want true",
            ttft_run.ours("slo_pass")
        ));
    }
    if !ttft_run.console_line("SLO attainment:").ends_with("100.0%") {
        problems.push(format!(
            "ttft:200: console {:?}, want 100.0%",
            ttft_run.console_line("SLO attainment:")
        ));
    }
    // e2el:300: the E2EL SLO applies to every request: exactly the whole answers fail.
    let want = n_stream as f64 / reqs.len() as f64;
    let att = e2el_run.ours("slo_attainment").as_f64();
    if !att.is_some_and(|a| (a - want).abs() < 1e-9) {
        problems.push(format!(
            "e2el:300: llmreplay.slo_attainment {att:?}, want {want} (the whole answers fail it)"
        ));
    }
    eprintln!(
        "mixed: p99 TTFT {} / {} ms, p99 E2EL {} / {} ms, attainment ttft:200 {} e2el:300 {}",
        ttft_run.num("p99_ttft_ms"),
        e2el_run.num("p99_ttft_ms"),
        ttft_run.num("p99_e2el_ms"),
        e2el_run.num("p99_e2el_ms"),
        ttft_run.ours("slo_attainment"),
        e2el_run.ours("slo_attainment")
    );
    report(
        "replay, mixed traffic",
        &problems,
        &format!(
            "ttft:200 rows:{}\n{}\n\ne2el:300 rows:{}\n{}",
            row_table(&ttft_run.rows),
            ttft_run.context(),
            row_table(&e2el_run.rows),
            e2el_run.context()
        ),
    );
}

// ---------------------------------------------------------------------------------------
// c. The sim: the chat role chunk comes with the first token, after prefill
// ---------------------------------------------------------------------------------------

/// Prompt length for the sim: the default profile (llama-3.1-8b-h100, 40.6 µs per prefill
/// token, 8192 tokens per step) prefills 3000 tokens in ~125 ms, four of them in two steps
/// (~340 ms and ~500 ms).
const SIM_PROMPT: i64 = 3000;
const SIM_OUTPUT: i64 = 4;

fn sim_trace(chat: bool) -> Vec<Req> {
    (0..4)
        .map(|i| Req {
            id: format!("{}-{i}", if chat { "chat" } else { "text" }),
            at_ms: 0,
            chat,
            stream: true,
            prompt_tokens: SIM_PROMPT,
            output_tokens: SIM_OUTPUT,
        })
        .collect()
}

/// `llmreplay replay` against the in-process sim, long prompts sent at once: streamed chat
/// TTFT includes queueing and prefill like completions TTFT does (before, the sim sent the
/// role chunk at once and chat TTFT was ~0.2 ms), and a chat row's chunks are its tokens.
#[test]
fn sim_chat_ttft_includes_prefill_like_completions() {
    let (chat, text) = std::thread::scope(|s| {
        let a = s.spawn(|| replay("sim_chat", &sim_trace(true), None, &[]));
        let b = s.spawn(|| replay("sim_text", &sim_trace(false), None, &[]));
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut problems = Vec::new();
    for (name, run) in [("chat", &chat), ("completions", &text)] {
        if run.num("completed") != 4.0 || run.num("failed") != 0.0 {
            problems.push(format!(
                "{name}: completed {} failed {}, want 4 and 0",
                run.num("completed"),
                run.num("failed")
            ));
        }
        for r in run.rows.values() {
            if r.outcome != Outcome::Ok {
                problems.push(format!("{name}: {}: {:?}", r.request_id, r.outcome));
            } else if r.chunk_times_us.len() != SIM_OUTPUT as usize
                || r.output_tokens != Some(SIM_OUTPUT)
            {
                problems.push(format!(
                    "{name}: {}: {} chunk times, output_tokens {:?}; want {SIM_OUTPUT} of each \
                     (one token per chunk; the role chunk is none)",
                    r.request_id,
                    r.chunk_times_us.len(),
                    r.output_tokens
                ));
            }
        }
    }
    let (c, t) = (chat.num("median_ttft_ms"), text.num("median_ttft_ms"));
    // The premise: prefill is long enough to see.
    if !at_least(t, 50.0) {
        problems.push(format!(
            "completions median_ttft_ms {t}, want >= 50 (prefill of {SIM_PROMPT} tokens)"
        ));
    }
    if !at_least(c, 0.5 * t) {
        problems.push(format!(
            "chat median_ttft_ms {c}, want >= half of completions' {t} (prefill)"
        ));
    }
    eprintln!("sim: median TTFT chat {c} ms, completions {t} ms");
    report(
        "sim, chat vs completions",
        &problems,
        &format!(
            "chat rows:{}\n{}\n\ncompletions rows:{}\n{}",
            row_table(&chat.rows),
            chat.context(),
            row_table(&text.rows),
            text.context()
        ),
    );
}

/// `llmreplay sim --listen`, read off the wire: the role-only chunk of a streamed chat answer
/// arrives with the first token, after the prefill of a 3000-token prompt, not at once (a
/// client that counts any chunk, as vLLM's does, then times TTFT right).
#[test]
fn sim_sends_the_role_chunk_with_the_first_token() {
    let addr = free_addr();
    let mut sim = Command::new(bin())
        .args(["sim", "--listen", &addr.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn llmreplay sim");
    // Connect once it listens (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let sock = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break Some(s),
            Err(_) if Instant::now() < deadline && sim.try_wait().unwrap().is_none() => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => break None,
        }
    };
    let result = sock.map(|s| stream_event_times(s, &addr.to_string()));
    let _ = sim.kill();
    let _ = sim.wait();
    let times = result
        .expect("llmreplay sim never listened")
        .expect("read the sim's stream");
    let (role, content) = (times.role, times.first_content);
    let mut problems = Vec::new();
    match (role, content) {
        (Some(role), Some(content)) => {
            if content < Duration::from_millis(50) {
                problems.push(format!(
                    "first content at {content:?}, want >= 50 ms (prefill of {SIM_PROMPT} tokens)"
                ));
            }
            if role.as_secs_f64() < 0.5 * content.as_secs_f64() {
                problems.push(format!(
                    "the role-only chunk came at {role:?}, the first content at {content:?}: \
                     want it with the first token (>= half of that)"
                ));
            }
        }
        _ => problems.push(format!(
            "role chunk at {role:?}, first content at {content:?}: want both"
        )),
    }
    eprintln!("sim wire: role chunk at {role:?}, first content at {content:?}");
    report(
        "sim, role chunk on the wire",
        &problems,
        &format!("stream: {:?}", times.text),
    );
}

/// When a stream's events arrived, from the request written.
struct EventTimes {
    role: Option<Duration>,
    first_content: Option<Duration>,
    text: String,
}

/// Sends one streamed chat request with a `SIM_PROMPT`-word prompt and reads the answer to
/// `[DONE]`, noting when the role-only chunk and the first content arrived.
fn stream_event_times(mut s: TcpStream, host: &str) -> std::io::Result<EventTimes> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let prompt: Vec<String> = (0..SIM_PROMPT).map(|i| format!("w{i}")).collect();
    let body = serde_json::json!({
        "model": "llmreplay-sim",
        "messages": [{"role": "user", "content": prompt.join(" ")}],
        "max_tokens": SIM_OUTPUT, "ignore_eos": true, "stream": true,
    })
    .to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let t0 = Instant::now();
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let (mut role, mut first_content) = (None, None);
    let deadline = t0 + Duration::from_secs(20);
    while Instant::now() < deadline {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        let at = t0.elapsed();
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if role.is_none() && text.contains(r#""delta":{"role":"assistant","content":""}"#) {
            role = Some(at);
        }
        if first_content.is_none() && has_content(&text) {
            first_content = Some(at);
        }
        if text.contains("data: [DONE]") {
            break;
        }
    }
    Ok(EventTimes {
        role,
        first_content,
        text: String::from_utf8_lossy(&buf).into_owned(),
    })
}

/// Whether some `"content":"` in `text` is followed by a character other than the closing
/// quote: a chunk with content (the role-only chunk's is `""`).
fn has_content(text: &str) -> bool {
    let key = r#""content":""#;
    text.match_indices(key).any(|(i, _)| {
        text[i + key.len()..]
            .chars()
            .next()
            .is_some_and(|c| c != '"')
    })
}

// ---------------------------------------------------------------------------------------
// Cancellations
// ---------------------------------------------------------------------------------------

/// A request its client cancelled is replayed as cancelled at the recorded point, so the
/// candidate sees the load production saw: after as many output chunks as the recorded client
/// received, or, when it received none, after the recorded time from send. Before, it was
/// replayed as a full generation (here 400 tokens) and counted ok.
#[test]
fn cancelled_requests_are_cancelled_again_at_their_recorded_point() {
    let dir = tmpdir("cancel");
    let trace = dir.join("trace.parquet");
    let t0 = 1_750_000_000_000_000i64;
    let row = |id: &str, at_ms: i64| {
        let mut r = TraceRecord::new(id, t0 + at_ms * MS, "/v1/completions");
        r.stream = true;
        r.prompt_tokens = Some(64);
        r.output_tokens = Some(400);
        r.max_tokens = Some(400);
        r.status = Some(200);
        r
    };
    // Cancelled after 5 chunks; cancelled 60 ms after send, before any chunk; completed.
    let mut by_chunks = row("cancel-after-5-chunks", 0);
    by_chunks.outcome = Outcome::ClientCancelled;
    by_chunks.output_tokens = None;
    by_chunks.chunk_times_us = (0..5).map(|i| (20 + i) * MS).collect();
    by_chunks.ttft_us = Some(20 * MS);
    let mut by_time = row("cancel-after-60ms", 10);
    by_time.outcome = Outcome::ClientCancelled;
    by_time.output_tokens = None;
    by_time.e2el_us = Some(60 * MS);
    let done = row("completed", 20);
    trace_format::write_trace_file(
        &trace,
        &[by_chunks, by_time, done],
        &trace_format::FileMeta::new(
            trace_format::Producer::Import,
            "tests/integration/mixed_traffic.rs",
        ),
    )
    .unwrap();
    let (results, json) = (dir.join("out.parquet"), dir.join("out.json"));
    // The in-process sim (no --target): 400 tokens take well over a second.
    let mut child = Command::new(bin())
        .arg("replay")
        .arg(&trace)
        .arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&json)
        .args(["-q", "--prompt-salt", "1", "--output-len", "recorded"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("spawn llmreplay replay");
    let exit = wait_bounded(&mut child, REPLAY_DEADLINE);
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    assert!(
        exit.is_some_and(|s| s.success()),
        "llmreplay replay exited {exit:?} (recorded cancellations are no failure): {stderr}"
    );
    let rows: BTreeMap<String, TraceRecord> =
        trace_format::read_traces(&[results.to_str().unwrap()])
            .expect("read the --results rows")
            .records
            .into_iter()
            .map(|r| (r.request_id.clone(), r))
            .collect();
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let table = row_table(&rows);
    let r = &rows["cancel-after-5-chunks"];
    assert_eq!(r.outcome, Outcome::ClientCancelled, "{table}");
    // One read may carry a few chunks past the fifth; never the whole generation.
    assert!(
        (5..40).contains(&r.chunk_times_us.len()),
        "cancelled after {} chunks: {table}",
        r.chunk_times_us.len()
    );
    assert!(
        r.error
            .as_deref()
            .is_some_and(|e| e.contains("cancelled as recorded")),
        "{table}"
    );
    let r = &rows["cancel-after-60ms"];
    assert_eq!(r.outcome, Outcome::ClientCancelled, "{table}");
    assert!(
        r.error
            .as_deref()
            .is_some_and(|e| e.contains("cancelled as recorded")),
        "{table}"
    );
    let r = &rows["completed"];
    assert_eq!(r.outcome, Outcome::Ok, "{table}");
    assert_eq!(r.output_tokens, Some(400), "{table}");
    // Only the completed request is in the latencies; all three were sent.
    assert_eq!(v["completed"], 1, "{v}");
    assert_eq!(v["llmreplay"]["outcomes"]["client_cancelled"], 2, "{v}");
    assert_eq!(v["llmreplay"]["metric_requests"]["ttft"], 1, "{v}");
}

/// A server that ignores `stream_options` and sends no usage, streaming 30 tokens in 20
/// chunks (2, 1, 2, 1, ...): with `--tokenizer cl100k_base` replay counts the generated text
/// (30 tokens, source `tokenizer`, for streamed and whole answers alike) and says so; with no
/// tokenizer it estimates by the one rule (trace_format::tokens): a stream's chunk count (20,
/// source `estimate`), a whole answer's text bytes / 4, and warns for all 6.
#[test]
fn replay_counts_output_tokens_with_the_tokenizer_when_the_server_sends_no_usage() {
    let server = MisbehavingServer::start(Behaviour {
        think: Duration::from_millis(5),
        chunk_gap: Duration::from_millis(2),
        no_usage: true,
        tokens_per_chunk: vec![2, 1],
        ..Default::default()
    });
    let reqs: Vec<Req> = (0..6)
        .map(|i| Req {
            id: format!("nousage-{i}"),
            at_ms: i * 20,
            chat: i % 2 == 1,
            stream: i < 4,
            prompt_tokens: 12,
            output_tokens: 30,
        })
        .collect();
    let counted = replay(
        "nousage_tok",
        &reqs,
        Some(&server.url()),
        &["--tokenizer", "cl100k_base"],
    );
    let chunks = replay("nousage_chunks", &reqs, Some(&server.url()), &[]);
    let mut problems = Vec::new();
    for (id, r) in &counted.rows {
        if r.output_tokens != Some(30)
            || r.output_tokens_source != Some(trace_format::TokenSource::Tokenizer)
        {
            problems.push(format!(
                "--tokenizer: {id}: output_tokens {:?} source {:?}, want 30 from the tokenizer",
                r.output_tokens, r.output_tokens_source
            ));
        }
    }
    if counted.num("total_output_tokens") != 180.0 {
        problems.push(format!(
            "--tokenizer: total_output_tokens {}, want 180",
            counted.num("total_output_tokens")
        ));
    }
    if counted.ours("output_token_sources")["tokenizer"] != 6 {
        problems.push(format!(
            "--tokenizer: output_token_sources {}",
            counted.ours("output_token_sources")
        ));
    }
    if !counted
        .console_line("Output tokens counted from:")
        .contains("6 requests the text, by --tokenizer")
    {
        problems.push("--tokenizer: the console does not say how tokens were counted".into());
    }
    if counted.stdout.contains("chunk counts") {
        problems.push("--tokenizer: warned about chunk counts".into());
    }
    for (id, r) in chunks.rows.iter().filter(|(_, r)| r.stream) {
        if r.output_tokens != Some(20)
            || r.output_tokens_source != Some(trace_format::TokenSource::Estimate)
        {
            problems.push(format!(
                "no tokenizer: {id}: output_tokens {:?} source {:?}, want 20 chunks (estimate)",
                r.output_tokens, r.output_tokens_source
            ));
        }
    }
    if !chunks
        .stdout
        .contains("WARNING: the target sent no usage for 6 requests and there is no --tokenizer")
    {
        problems.push("no tokenizer: no warning that tokens are chunk counts".into());
    }
    report(
        "replay_counts_output_tokens_with_the_tokenizer_when_the_server_sends_no_usage",
        &problems,
        &format!("{}\n---\n{}", counted.context(), chunks.context()),
    );
}

/// Capture in front of a server that sends no usage (it ignores `stream_options`), 30 tokens
/// in 20 chunks: with `--tokenizer cl100k_base` every row, streamed or not, chat or not, has
/// 30 output tokens counted from the generated text (source `tokenizer`); the client still
/// gets the stream untouched.
#[test]
fn capture_counts_output_tokens_with_its_tokenizer_when_the_upstream_sends_no_usage() {
    let server = MisbehavingServer::start(Behaviour {
        think: Duration::from_millis(5),
        chunk_gap: Duration::from_millis(1),
        no_usage: true,
        tokens_per_chunk: vec![2, 1],
        ..Default::default()
    });
    let out = tmpdir("capture-nousage");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn_bin(
        &bin(),
        listen,
        &server.url(),
        &out,
        &[
            "--session-header",
            "x-marker",
            "--flush-interval",
            "50ms",
            "--tokenizer",
            "cl100k_base",
        ],
    );
    cap.wait_for("listening on");
    let sent = [
        ("nu-chat-stream", true, true),
        ("nu-text-stream", false, true),
        ("nu-chat-whole", true, false),
        ("nu-text-whole", false, false),
    ];
    let mut client = Http1Client::new(listen);
    let mut problems = Vec::new();
    for (marker, chat, stream) in sent {
        let body = serde_json::json!({
            "model": "m", "max_tokens": 30, "stream": stream,
            "prompt": format!("{marker} a b c"),
            "messages": [{"role": "user", "content": format!("{marker} a b c")}],
        })
        .to_string();
        let path = if chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        match client.post(path, &[("x-marker", marker)], &body) {
            Ok(r) if r.status == 200 => {
                if stream && r.text().matches("data: {").count() != 20 {
                    problems.push(format!("{marker}: the client did not get 20 chunks"));
                }
            }
            Ok(r) => problems.push(format!("{marker}: HTTP {} {:?}", r.status, r.text())),
            Err(e) => problems.push(format!("{marker}: {e}")),
        }
    }
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let rows = rows_by_session(&out);
    let _ = std::fs::remove_dir_all(&out);
    for (marker, _, stream) in sent {
        match rows.get(marker) {
            None => problems.push(format!("{marker}: no row")),
            Some(r) => {
                if r.outcome != Outcome::Ok
                    || r.output_tokens != Some(30)
                    || r.output_tokens_source != Some(trace_format::TokenSource::Tokenizer)
                {
                    problems.push(format!(
                        "{marker}: outcome {:?} output_tokens {:?} source {:?}, want ok, 30 from the tokenizer",
                        r.outcome, r.output_tokens, r.output_tokens_source
                    ));
                }
                if stream && r.chunk_times_us.len() != 20 {
                    problems.push(format!(
                        "{marker}: {} chunk times, want 20",
                        r.chunk_times_us.len()
                    ));
                }
            }
        }
    }
    report(
        "capture_counts_output_tokens_with_its_tokenizer_when_the_upstream_sends_no_usage",
        &problems,
        &format!("{log:#?}"),
    );
}

// ---------------------------------------------------------------------------------------
// e. The whole loop: a mixed workload captured in front of the sim, replayed against it
// ---------------------------------------------------------------------------------------

/// The sim's fixed timing in this test: first token after `SIM_TTFT`, then one every
/// `SIM_ITL` (`llmreplay sim --fixed-timing 40,8`).
const SIM_TTFT_MS: f64 = 40.0;
const SIM_ITL_MS: f64 = 8.0;
/// What a latency measured on loopback may differ from the sim's own timing by: the sim
/// sleeps on tokio's timer (~1 ms granularity) and this 2-core machine is shared with the
/// builds of other tests; the figure is a bound on scheduling noise, not on llmreplay's
/// accuracy (bench/ measures that against a ground-truth server).
const TOLERANCE_MS: f64 = 25.0;

/// The loop a user runs: mixed traffic (chat and completions, streamed and not, a stream
/// without usage, a cancellation after 6 chunks, an upstream error) captured in front of
/// the sim (`--no-inject-usage`, so the stream that asked for no usage gets none and capture counts
/// its words), then replayed against the same sim. Per class, captured and replayed figures
/// agree with what the sim did: TTFT = 40 ms, ITL = TPOT = 8 ms, E2EL = 40 + 8 (n - 1) ms
/// (within `TOLERANCE_MS`), output tokens equal the sim's count, requests that are not
/// streamed have no TTFT in either, the cancellation is cancelled again after the same 6
/// chunks, and the sim generated exactly the tokens the rows say.
///
/// It takes `serial()`: its latencies are held to the sim's within 25 ms, and beside another
/// test in the same process on a loaded machine a replayed E2EL came out 173.6 ms against
/// the sim's 144.
#[test]
fn capture_then_replay_against_the_sim_agree_with_what_the_sim_did() {
    let _g = serial();
    let sim = SimProc::fixed(&bin(), SIM_TTFT_MS, SIM_ITL_MS);
    let out = tmpdir("loop-capture");
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
            "--no-inject-usage",
            "--tokenizer",
            "words",
        ],
    );
    cap.wait_for("listening on");
    // (id, chat, stream, asks for usage, output tokens)
    let plan: Vec<(String, bool, bool, bool, u32)> = (0..12)
        .map(|i| {
            let (chat, stream) = (i % 2 == 1, i % 4 < 2);
            (format!("loop-{i:02}"), chat, stream, i != 0, 10 + 2 * i)
        })
        .collect();
    let mut problems = Vec::new();
    let mut client = Http1Client::new(listen);
    let before = sim.generated_tokens();
    for (id, chat, stream, usage, n) in &plan {
        let so = if *stream && *usage {
            r#","stream_options":{"include_usage":true}"#
        } else {
            ""
        };
        let (path, body) = if *chat {
            (
                "/v1/chat/completions",
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"{id} a b c d"}}],"max_tokens":{n},"ignore_eos":true,"stream":{stream}{so}}}"#
                ),
            )
        } else {
            (
                "/v1/completions",
                format!(
                    r#"{{"model":"m","prompt":"{id} a b c d","max_tokens":{n},"ignore_eos":true,"stream":{stream}{so}}}"#
                ),
            )
        };
        match client.post(path, &[("x-id", id)], &body) {
            Ok(r) if r.status == 200 => {}
            Ok(r) => problems.push(format!("{id}: HTTP {}", r.status)),
            Err(e) => problems.push(format!("{id}: {e}")),
        }
    }
    let ok_tokens: f64 = plan.iter().map(|p| f64::from(p.4)).sum();
    if let Err(e) = cancel_after_chunks(listen, "loop-cancel", 6) {
        problems.push(format!("loop-cancel: {e}"));
    }
    match client.post(
        "/v1/completions",
        &[("x-id", "loop-error"), ("x-sim-fault", "error")],
        r#"{"model":"m","prompt":"loop-error a b","max_tokens":5,"stream":true}"#,
    ) {
        Ok(r) if r.status >= 500 => {}
        other => problems.push(format!("loop-error: want a 5xx, got {other:?}")),
    }
    std::thread::sleep(Duration::from_millis(300));
    let captured_tokens = sim.generated_tokens() - before;
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let captured = rows_by_session(&out);

    // Replay the capture against the same sim.
    let dir = tmpdir("loop-replay");
    let (results, json) = (dir.join("out.parquet"), dir.join("out.json"));
    let before = sim.generated_tokens();
    let mut child = Command::new(bin())
        .arg("replay")
        .arg(&out)
        .args(["--target", &format!("sim={}", sim.url())])
        .arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&json)
        .args([
            "-q",
            "--timeout",
            "30s",
            "--tokenizer",
            "words",
            "--max-failed",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("spawn llmreplay replay");
    let exit = wait_bounded(&mut child, REPLAY_DEADLINE);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let context = format!(
        "replay exit {exit:?}\nstderr:\n{}\nstdout:\n{}",
        read("stderr"),
        read("stdout")
    );
    assert!(exit.is_some_and(|s| s.success()), "{context}");
    std::thread::sleep(Duration::from_millis(300));
    let replayed_tokens = sim.generated_tokens() - before;
    let replayed = rows_by_session(&results);
    let result: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&dir);

    let near = |v: Option<i64>, want: f64| {
        v.is_some_and(|us| (us as f64 / 1000.0 - want).abs() <= TOLERANCE_MS)
    };
    for (side, rows) in [("captured", &captured), ("replayed", &replayed)] {
        for (id, chat, stream, usage, n) in &plan {
            let Some(r) = rows.get(id) else {
                problems.push(format!("{side} {id}: no row"));
                continue;
            };
            let e2el = SIM_TTFT_MS + SIM_ITL_MS * f64::from(n - 1);
            let class = format!(
                "{side} {id} ({}, {})",
                if *chat { "chat" } else { "completions" },
                if *stream { "streamed" } else { "not streamed" }
            );
            if r.outcome != Outcome::Ok || r.output_tokens != Some(i64::from(*n)) {
                problems.push(format!(
                    "{class}: {:?}, {:?} output tokens, want ok and {n}",
                    r.outcome, r.output_tokens
                ));
            }
            // Counted from the text where the stream carried no usage (capture's side; the
            // replay asks for usage).
            let want_source = if *stream && !usage && side == "captured" {
                trace_format::TokenSource::Tokenizer
            } else {
                trace_format::TokenSource::Usage
            };
            if r.output_tokens_source != Some(want_source) {
                problems.push(format!(
                    "{class}: token source {:?}, want {want_source:?}",
                    r.output_tokens_source
                ));
            }
            if *stream {
                if !near(r.ttft_us, SIM_TTFT_MS) {
                    problems.push(format!(
                        "{class}: TTFT {} ms, sim {SIM_TTFT_MS}",
                        ms(r.ttft_us)
                    ));
                }
                let gaps: Vec<f64> = r
                    .chunk_times_us
                    .windows(2)
                    .map(|w| (w[1] - w[0]) as f64 / 1000.0)
                    .collect();
                let mean_gap = gaps.iter().sum::<f64>() / gaps.len().max(1) as f64;
                if r.chunk_times_us.len() != *n as usize
                    || (mean_gap - SIM_ITL_MS).abs() > TOLERANCE_MS / 5.0
                {
                    problems.push(format!(
                        "{class}: {} chunks with mean gap {mean_gap:.2} ms, sim {n} at {SIM_ITL_MS}",
                        r.chunk_times_us.len()
                    ));
                }
            } else if r.ttft_us.is_some() {
                problems.push(format!("{class}: has a TTFT ({})", ms(r.ttft_us)));
            }
            if !near(r.e2el_us, e2el) {
                problems.push(format!("{class}: E2EL {} ms, sim {e2el}", ms(r.e2el_us)));
            }
        }
        match rows.get("loop-cancel") {
            Some(r)
                if r.outcome == Outcome::ClientCancelled
                    && (6..=8).contains(&r.chunk_times_us.len()) => {}
            other => problems.push(format!(
                "{side} loop-cancel: want client_cancelled after ~6 chunks, got {:?}",
                other.map(|r| (r.outcome, r.chunk_times_us.len()))
            )),
        }
    }
    // The replay cancels at the captured point exactly.
    if let (Some(c), Some(r)) = (captured.get("loop-cancel"), replayed.get("loop-cancel")) {
        if c.chunk_times_us.len() != r.chunk_times_us.len() {
            problems.push(format!(
                "loop-cancel: replay cancelled after {} chunks, capture after {}",
                r.chunk_times_us.len(),
                c.chunk_times_us.len()
            ));
        }
    }
    match captured.get("loop-error") {
        Some(r) if r.outcome == Outcome::HttpError => {}
        other => problems.push(format!(
            "captured loop-error: want http_error, got {:?}",
            other.map(|r| r.outcome)
        )),
    }
    // What the sim generated: the rows' tokens, plus the cancelled stream's (which the rows
    // do not count: it never finished).
    for (side, total, rows) in [
        ("capture", captured_tokens, &captured),
        ("replay", replayed_tokens, &replayed),
    ] {
        // The error was the sim's answer to capture's client asking for it (`x-sim-fault`);
        // the replay does not forward that header, so the sim serves that request.
        let rows_ok: f64 = rows
            .iter()
            .filter(|(id, r)| r.outcome == Outcome::Ok && id.as_str() != "loop-error")
            .map(|(_, r)| r)
            .filter_map(|r| r.output_tokens)
            .sum::<i64>() as f64;
        if rows_ok != ok_tokens || total < ok_tokens {
            problems.push(format!(
                "{side}: rows say {rows_ok} tokens, the plan {ok_tokens}, the sim generated {total}"
            ));
        }
    }
    // The per-class breakdown covers the four classes.
    let classes = result["llmreplay"]["by_class"]
        .as_array()
        .map_or(0, Vec::len);
    if classes != 4 {
        problems.push(format!("llmreplay.by_class has {classes} classes, want 4"));
    }
    report(
        "capture_then_replay_against_the_sim_agree_with_what_the_sim_did",
        &problems,
        &format!(
            "captured:{}\nreplayed:{}\n{context}",
            row_table(&captured),
            row_table(&replayed)
        ),
    );
}
