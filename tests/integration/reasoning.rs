//! Reasoning measured apart (issue 42, item 1): a reasoning model's stream through capture
//! and replay, against the sim's truth.
//!
//! The sim (`--fixed-timing 40,10 --reasoning-share 0.5 --reasoning-fraction 0.6`) answers
//! half the chat requests with reasoning first: token `i` of every response leaves at
//! 40 ms + i × 10 ms, and the first `R` tokens are `delta.reasoning_content`, so the first
//! answer token leaves `R × 10 ms` after the first token. Each response the test client gets
//! is its truth: `R` is the words of its reasoning text, the output its words in all.
//!
//! Captured (streamed with usage, streamed without usage, not streamed; chat and
//! completions), every row has TTFT at the first token of any kind, TTFAT at the first answer
//! token, and the reasoning tokens (from the usage's details, or the reasoning text counted
//! by the tokenizer when the stream carried no usage). Replayed against the same sim, the
//! replay's rows say the same, its result carries TTFAT, and an SLO on `ttfat` fails where
//! the same limit on `ttft` passes.

use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, serial, tmpdir};
use support::http1::Http1Client;
use support::sim::SimProc;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;
use trace_format::{TokenSource, TraceRecord};

fn bin() -> String {
    std::env::var("LLMREPLAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_llmreplay").into())
}

const TTFT_MS: i64 = 40;
const ITL_MS: i64 = 10;

/// What the client saw of one response: reasoning and answer words, and whether it was
/// streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Truth {
    reasoning: i64,
    output: i64,
    stream: bool,
}

fn words(s: &str) -> i64 {
    s.split_whitespace().count() as i64
}

/// The reasoning and answer words of a response body, streamed or whole.
fn truth_of(body: &str, stream: bool) -> Truth {
    let (mut reasoning, mut answer) = (0, 0);
    let mut count = |v: &Value, at: &str| {
        reasoning += v
            .pointer(&format!("{at}/reasoning_content"))
            .and_then(Value::as_str)
            .map_or(0, words);
        answer += [format!("{at}/content"), "/text".into()]
            .iter()
            .filter_map(|p| v.pointer(p).and_then(Value::as_str))
            .map(words)
            .sum::<i64>();
    };
    if stream {
        for line in body.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(c) = v.pointer("/choices/0") {
                count(c, "/delta");
            }
        }
    } else {
        let v: Value = serde_json::from_str(body).expect("a JSON answer");
        count(&v["choices"][0], "/message");
    }
    Truth {
        reasoning,
        output: reasoning + answer,
        stream,
    }
}

/// One row against its truth: reasoning tokens and their source, TTFT and TTFAT.
fn check_row(r: &TraceRecord, t: Truth, usage_reported: bool, problems: &mut Vec<String>) {
    let id = r.session_id.as_deref().unwrap_or(&r.request_id);
    if r.output_tokens != Some(t.output) {
        problems.push(format!(
            "{id}: output {:?}, truth {}",
            r.output_tokens, t.output
        ));
    }
    if r.reasoning_tokens != Some(t.reasoning) {
        problems.push(format!(
            "{id}: reasoning {:?} ({:?}), truth {}",
            r.reasoning_tokens, r.reasoning_tokens_source, t.reasoning
        ));
    }
    // Reported by the usage's details; else counted from the reasoning text (the words
    // tokenizer counts the sim's words exactly); a response without reasoning takes its
    // output's source.
    let want = if usage_reported || t.reasoning == 0 {
        r.output_tokens_source
    } else {
        Some(TokenSource::Tokenizer)
    };
    if r.reasoning_tokens_source != want {
        problems.push(format!(
            "{id}: reasoning source {:?}, want {want:?}",
            r.reasoning_tokens_source
        ));
    }
    if !t.stream {
        if r.ttfat_us.is_some() {
            problems.push(format!("{id}: not streamed but TTFAT {:?}", r.ttfat_us));
        }
        return;
    }
    let (Some(ttft), Some(ttfat)) = (r.ttft_us, r.ttfat_us) else {
        problems.push(format!("{id}: TTFT {:?} TTFAT {:?}", r.ttft_us, r.ttfat_us));
        return;
    };
    // The sim sends on absolute deadlines: the answer's first token leaves R × ITL after the
    // first token, whatever the scheduling noise of the first one.
    let gap_ms = (ttfat - ttft) as f64 / 1e3;
    let want_ms = (t.reasoning * ITL_MS) as f64;
    if (gap_ms - want_ms).abs() > 15.0 {
        problems.push(format!(
            "{id}: TTFAT − TTFT {gap_ms:.1} ms, truth {want_ms} ms (R = {})",
            t.reasoning
        ));
    }
    if ttft < TTFT_MS * 1000 - 2_000 {
        problems.push(format!("{id}: TTFT {ttft} µs before the sim's first token"));
    }
}

/// Runs `llmreplay ARGS`; its exit code and stdout.
fn llmreplay(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The rows of a trace by their session (the test's id, sent as `x-id`).
fn rows(path: &Path) -> HashMap<String, TraceRecord> {
    trace_format::read_traces(&[path.to_str().unwrap()])
        .unwrap()
        .records
        .into_iter()
        .filter_map(|r| Some((r.session_id.clone()?, r)))
        .collect()
}

#[test]
fn reasoning_and_answer_measured_apart_through_capture_and_replay() {
    let _serial = serial();
    let timing = format!("{TTFT_MS},{ITL_MS}");
    let reasoning = [
        "--fixed-timing",
        &timing,
        "--reasoning-share",
        "0.5",
        "--reasoning-fraction",
        "0.6",
    ];
    // Captured from a server that counts the reasoning in its usage (OpenAI's API)...
    let sim = SimProc::start(&bin(), &[&reasoning[..], &["--reasoning-details"]].concat());
    // ... replayed against one that does not (vLLM's): the same answers, counted apart by
    // the tokenizer.
    let vllm_like = SimProc::start(&bin(), &reasoning);
    let dir = tmpdir("reasoning");
    let cap_dir = dir.join("capture");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn_bin(
        &bin(),
        listen,
        &sim.url(),
        &cap_dir,
        &[
            "--flush-interval",
            "50ms",
            "--record-bodies",
            "full",
            "--session-header",
            "x-id",
            // Streams carry usage only when the client asked: the others' reasoning is
            // counted from its text.
            "--no-inject-usage",
        ],
    );
    cap.wait_for("listening on");

    // id → (truth, whether the usage reported the reasoning).
    let mut truths: HashMap<String, (Truth, bool)> = HashMap::new();
    let mut client = Http1Client::new(listen);
    for i in 0..30 {
        let id = format!("r{i:02}");
        let n = 12 + i;
        // Chat: streamed with usage, streamed without, not streamed; every fifth completions.
        let (path, stream, usage, body) = if i % 5 == 4 {
            (
                "/v1/completions",
                true,
                false,
                format!(
                    r#"{{"model":"m","prompt":"{id} a b c","max_tokens":{n},"ignore_eos":true,"stream":true}}"#
                ),
            )
        } else {
            let (stream, usage) = [(true, true), (true, false), (false, true)][i % 3];
            let so = if usage && stream {
                r#","stream_options":{"include_usage":true}"#
            } else {
                ""
            };
            (
                "/v1/chat/completions",
                stream,
                usage,
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"{id} tell me a b c"}}],"max_tokens":{n},"ignore_eos":true,"stream":{stream}{so}}}"#
                ),
            )
        };
        let r = client
            .post(path, &[("x-id", &id)], &body)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(r.status, 200, "{id}: {}", r.text());
        let t = truth_of(&r.text(), stream);
        assert_eq!(
            t.output, n as i64,
            "{id}: the sim answers max_tokens with ignore_eos"
        );
        truths.insert(id, (t, usage));
    }
    let reasoned = truths.values().filter(|(t, _)| t.reasoning > 0).count();
    assert!(
        (5..=25).contains(&reasoned),
        "the sim reasons on half the chat requests: {reasoned} of 30"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");

    let captured = rows(&cap_dir);
    assert_eq!(captured.len(), truths.len(), "every request recorded");
    let mut problems = Vec::new();
    for (id, (t, usage)) in &truths {
        match captured.get(id) {
            Some(r) => check_row(r, *t, *usage, &mut problems),
            None => problems.push(format!("{id}: no captured row")),
        }
    }
    assert!(
        problems.is_empty(),
        "capture against the sim's truth: {problems:#?}"
    );

    // Replayed against the same sim: the same prompts get the same answers.
    let results = dir.join("replay.parquet");
    let json = dir.join("replay.json");
    let (code, stdout, stderr) = llmreplay(&[
        "replay",
        cap_dir.to_str().unwrap(),
        "--target",
        &format!("sim={}", vllm_like.url()),
        "--speedup",
        "4",
        "--tokenizer",
        "words",
        "--goodput",
        "ttft:90",
        "--fail-on-slo",
        "--results",
        results.to_str().unwrap(),
        "--save-result",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "TTFT meets 90 ms\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("Time to First Answer Token") && stdout.contains("Mean TTFAT (ms):"),
        "the console shows TTFAT:\n{stdout}"
    );
    let replayed = rows(&results);
    let mut problems = Vec::new();
    for (id, (t, _)) in &truths {
        match replayed.get(id) {
            // Replay asks every stream for usage, which counts no reasoning on this server.
            Some(r) => check_row(r, *t, false, &mut problems),
            None => problems.push(format!("{id}: not replayed")),
        }
    }
    assert!(
        problems.is_empty(),
        "replay against the sim's truth: {problems:#?}"
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let total: i64 = truths.values().map(|(t, _)| t.reasoning).sum();
    assert_eq!(doc["llmreplay"]["total_reasoning_tokens"], total);
    let ttfat = &doc["llmreplay"]["ttfat_ms"];
    assert!(
        ttfat["p99"].as_f64().unwrap() > doc["p99_ttft_ms"].as_f64().unwrap() + 50.0,
        "TTFAT's tail is the reasoning's: {ttfat} against p99 TTFT {}",
        doc["p99_ttft_ms"]
    );
    assert!(
        doc["mean_ttfat_ms"].as_f64().is_some(),
        "vLLM-style TTFAT keys"
    );

    // The same limit on the answer's first token: the reasoning requests miss it.
    let (code, stdout, stderr) = llmreplay(&[
        "replay",
        cap_dir.to_str().unwrap(),
        "--target",
        &format!("sim={}", vllm_like.url()),
        "--speedup",
        "4",
        "--goodput",
        "ttfat:90",
        "--fail-on-slo",
    ]);
    assert_eq!(code, Some(6), "TTFAT misses 90 ms\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("VERDICT") && stdout.contains("FAIL") && stdout.contains("TTFAT"),
        "the verdict names TTFAT:\n{stdout}"
    );
}
