//! One token-count rule (issue 55): capture and replay count the output tokens of the same
//! stream without usage the same way (`trace_format::tokens`), with and without
//! `--tokenizer`, so an A/A report that pairs output tokens per request is not off for that
//! reason alone.
//!
//! The upstream streams the same chat answer to every request, never with usage: 4 chunks
//! carrying 9 words ("Hello there, world. How are you doing on this day"), so words,
//! cl100k_base tokens and chunks are three different numbers. Captured without usage
//! injection and replayed against the same upstream, each row's output tokens and their
//! source are the same on both sides.

use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, tmpdir};
use support::http1::Http1Client;
use support::scripted::{Script, ScriptedUpstream};

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use trace_format::{TokenSource, TraceRecord};

fn bin() -> String {
    std::env::var("LLMREPLAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_llmreplay").into())
}

const PIECES: [&str; 4] = [
    "Hello there,",
    " world. How are",
    " you doing",
    " on this day",
];

/// The answer as a chat stream with no usage (a finish chunk without content, then
/// `[DONE]`).
fn stream_without_usage() -> Script {
    let mut events: Vec<(Duration, String)> = PIECES
        .iter()
        .map(|p| {
            let chunk = serde_json::json!({
                "id": "c1", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}],
            });
            (Duration::from_millis(5), chunk.to_string())
        })
        .collect();
    let finish = serde_json::json!({
        "id": "c1", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    });
    events.push((Duration::ZERO, finish.to_string()));
    events.push((Duration::ZERO, "[DONE]".into()));
    Script::Events(events)
}

fn rows(path: &Path) -> Vec<TraceRecord> {
    trace_format::read_traces(&[path.to_str().unwrap()])
        .unwrap()
        .records
}

/// Captures 3 streamed chat requests to `up` with `capture_tok` (None: capture's default),
/// replays the capture against `up` with `replay_tok` (None: no `--tokenizer`); the rows of
/// both.
fn capture_then_replay(
    up: &ScriptedUpstream,
    name: &str,
    capture_tok: Option<&str>,
    replay_tok: Option<&str>,
) -> (Vec<TraceRecord>, Vec<TraceRecord>) {
    let dir = tmpdir(name);
    let cap_dir = dir.join("capture");
    let listen = free_addr();
    let mut flags = vec!["--flush-interval", "50ms", "--no-inject-usage"];
    if let Some(t) = capture_tok {
        flags.extend(["--tokenizer", t]);
    }
    let mut cap = CaptureProc::spawn_bin(&bin(), listen, &up.url(), &cap_dir, &flags);
    cap.wait_for("listening on");
    let mut client = Http1Client::new(listen);
    for i in 0..3 {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"turn {i}: say hello"}}],"stream":true}}"#
        );
        let r = client
            .post("/v1/chat/completions", &[], &body)
            .expect("through capture");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(!r.text().contains("usage"), "the stream carries no usage");
    }
    std::thread::sleep(Duration::from_millis(300));
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let captured = rows(&cap_dir);
    assert_eq!(captured.len(), 3, "{log:#?}");

    let results = dir.join("replay.parquet");
    let mut args = vec![
        "replay".to_string(),
        cap_dir.to_str().unwrap().into(),
        "--target".into(),
        up.url(),
        "--speedup".into(),
        "10".into(),
        "--results".into(),
        results.to_str().unwrap().into(),
    ];
    if let Some(t) = replay_tok {
        args.extend(["--tokenizer".into(), t.into()]);
    }
    let out = Command::new(bin())
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay replay");
    assert!(
        out.status.success(),
        "replay: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (captured, rows(&results))
}

/// Output tokens and their source per row, in arrival order.
fn counts(rows: &[TraceRecord]) -> Vec<(Option<i64>, Option<TokenSource>)> {
    let mut rows: Vec<_> = rows.iter().collect();
    rows.sort_by_key(|r| r.arrival_time_us);
    rows.iter()
        .map(|r| (r.output_tokens, r.output_tokens_source))
        .collect()
}

#[test]
fn capture_and_replay_count_a_stream_without_usage_the_same_way() {
    let up = ScriptedUpstream::start(HashMap::from([("*".to_string(), stream_without_usage())]));
    let text: String = PIECES.concat();
    let words = text.split_whitespace().count() as i64;
    let cl100k = tokenize::Tokenizer::load("cl100k_base")
        .unwrap()
        .count(&text)
        .unwrap() as i64;
    assert!(
        words != cl100k && words != 4 && cl100k != 4,
        "the three counts differ: words {words}, cl100k {cl100k}, chunks 4"
    );

    // Without --tokenizer on either side: capture counts with its default (words), replay
    // with the capture's tokenizer, named in the trace's metadata.
    let (captured, replayed) = capture_then_replay(&up, "tokens-default", None, None);
    let want = vec![(Some(words), Some(TokenSource::Tokenizer)); 3];
    assert_eq!(counts(&captured), want, "capture, default tokenizer");
    assert_eq!(counts(&replayed), want, "replay, no --tokenizer");

    // With --tokenizer cl100k_base on both sides.
    let (captured, replayed) = capture_then_replay(
        &up,
        "tokens-cl100k",
        Some("cl100k_base"),
        Some("cl100k_base"),
    );
    let want = vec![(Some(cl100k), Some(TokenSource::Tokenizer)); 3];
    assert_eq!(counts(&captured), want, "capture --tokenizer cl100k_base");
    assert_eq!(counts(&replayed), want, "replay --tokenizer cl100k_base");

    // Every request reached the upstream without usage asked for by capture; replay's ask
    // (stream_options.include_usage) went unanswered, as a server without usage does.
    let chats = up
        .seen()
        .iter()
        .filter(|s| s.path == "/v1/chat/completions")
        .count();
    assert_eq!(chats, 12);
}
