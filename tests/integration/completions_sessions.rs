//! Completions turns linked at capture, end to end (issue 42, item 2): conversations held over
//! `/v1/completions` (each prompt = the previous prompt + the answer the client got + the new
//! question) are sent through the real `llmreplay capture` binary, recording hashes only, in
//! front of the ground-truth server, streamed and not, interleaved (a client thread and
//! connection each). Each client names its conversation in a session header, which wins for
//! `session_id`, so the truth is in the trace itself: a turn's parent must be the previous row
//! of its session, found from the prompts' hashes alone (`parent_link` = `completion_prefix`).
//! Some conversations share a system prompt, some open with the same question, some clients
//! resend the answer trimmed on a new line. Loopback only; the figure is printed.

use crate::support;
use support::env::{free_addr, tmpdir};

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use sim::groundtruth::{GroundTruth, GroundTruthConfig};
use support::capture::CaptureProc;
use support::http1::Http1Client;
use trace_format::{Outcome, ParentLink, TraceRecord};

fn answer_of(text: &str, stream: bool) -> Option<String> {
    if !stream {
        let v: Value = serde_json::from_str(text).ok()?;
        return v
            .pointer("/choices/0/text")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    let mut out = String::new();
    for line in text.lines() {
        let Some(v) = line
            .strip_prefix("data: ")
            .and_then(|d| serde_json::from_str::<Value>(d).ok())
        else {
            continue;
        };
        if let Some(t) = v.pointer("/choices/0/text").and_then(Value::as_str) {
            out.push_str(t);
        }
    }
    Some(out)
}

/// Plays conversation `id` of `turns` turns; returns how many turns were answered.
fn play(addr: std::net::SocketAddr, id: usize, turns: usize) -> usize {
    std::thread::sleep(Duration::from_millis((id as u64 * 37) % 400));
    let mut client = Http1Client::new(addr);
    let mut prompt = match id % 3 {
        0 => String::new(),
        1 => "You are a helpful assistant.\n\n".to_string(),
        _ => "Answer briefly.\n".to_string(),
    };
    let header = format!("conv-{id}");
    for t in 0..turns {
        let q = if t == 0 && id % 5 == 0 {
            "What is the capital of France?".to_string()
        } else {
            format!("question {t} of conversation {id}")
        };
        prompt.push_str(&format!("User: {q}\nAssistant:"));
        let stream = (id + t) % 2 == 0;
        let body = json!({
            "model": "m", "prompt": prompt, "max_tokens": 3 + (id + t) % 7, "stream": stream,
        })
        .to_string();
        let resp = client.post("/v1/completions", &[("x-conversation", &header)], &body);
        let Some(answer) = resp
            .ok()
            .filter(|r| r.status == 200)
            .and_then(|r| answer_of(&r.text(), stream))
        else {
            return t;
        };
        if id % 4 == 3 {
            prompt.push('\n');
            prompt.push_str(answer.trim());
        } else {
            prompt.push_str(&answer);
        }
        prompt.push('\n');
        std::thread::sleep(Duration::from_millis(5 + (id as u64 * 7 + t as u64) % 30));
    }
    turns
}

#[test]
fn capture_links_completions_turns_from_their_prompts_hashes() {
    let server = GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(2),
            itl: Duration::from_millis(1),
            tokens_per_chunk: 1,
            default_max_tokens: 8,
        },
    )
    .expect("ground-truth server");
    let out = tmpdir("completions-links");
    let listen = free_addr();
    let args = [
        "--flush-interval",
        "50ms",
        "--record-bodies",
        "hashes",
        "--session-header",
        "x-conversation",
    ];
    let mut cap = CaptureProc::spawn(listen, &server.url(), &out, &args);
    cap.wait_for("listening on");
    let convs: Vec<(usize, usize)> = (0..60).map(|id| (id, 2 + id % 5)).collect();
    let answered: usize = std::thread::scope(|s| {
        let hs: Vec<_> = convs
            .iter()
            .map(|&(id, turns)| s.spawn(move || play(listen, id, turns)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("client")).sum()
    });
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let rows = trace_format::read_traces(&[out.to_str().unwrap()])
        .unwrap()
        .records;
    let _ = std::fs::remove_dir_all(&out);
    let turns: usize = convs.iter().map(|c| c.1).sum();
    assert_eq!(answered, turns, "every turn answered");
    assert_eq!(rows.len(), turns);
    assert!(rows
        .iter()
        .all(|r| r.body.is_none() && r.outcome == Outcome::Ok));
    let mut by: HashMap<&str, Vec<&TraceRecord>> = HashMap::new();
    for r in &rows {
        by.entry(r.session_id.as_deref().expect("a session"))
            .or_default()
            .push(r);
    }
    assert_eq!(by.len(), convs.len());
    let (mut links, mut right) = (0, 0);
    for rs in by.values_mut() {
        rs.sort_by_key(|r| r.arrival_time_us);
        assert_eq!(rs[0].parent_request_id, None, "{:?}", rs[0]);
        for w in rs.windows(2) {
            links += 1;
            let ok = w[1].parent_request_id.as_deref() == Some(&w[0].request_id);
            right += usize::from(ok);
            if ok {
                assert_eq!(w[1].parent_link, Some(ParentLink::CompletionPrefix));
                let think = w[1].think_time_us.expect("think time");
                assert!((0..1_000_000).contains(&think), "{think}");
            }
        }
    }
    let share = right as f64 / links as f64;
    eprintln!(
        "completions linking through capture: {right} of {links} parent links right ({share:.4})"
    );
    assert!(share >= 0.98, "{right} of {links}");
}
