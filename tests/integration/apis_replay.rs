//! Replay speaks each row's own API (issue 51), through the real binary against the sim:
//! rows of completions, chat, Responses, Messages and embeddings, with and without recorded
//! bodies, each sent to its own endpoint in its API's shape; and a Responses chain
//! (`previous_response_id`) replayed against the candidate's own state: each turn names the
//! id the candidate gave its parent (the sim answers an id it did not issue 404, as real
//! servers do, so forwarding the captured ids fails), is sent only once its parent answered,
//! and reports the time it waited for it apart (`parent_wait_us`), in open and closed mode; a
//! chain whose parent fails on the candidate is not sent, and says why.

use crate::support;
use support::env::tmpdir;
use support::sim::SimProc;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use trace_format::{
    FileMeta, Outcome, ParentLink, Producer, TraceRecord, TraceWriter, WriterConfig,
};

fn bin() -> String {
    std::env::var("LLMREPLAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_llmreplay").into())
}

/// 2024-01-01, in µs: the trace's first arrival.
const T0: i64 = 1_704_067_200_000_000;

fn row(id: &str, at_ms: i64, endpoint: &str) -> TraceRecord {
    let mut r = TraceRecord::new(id, T0 + at_ms * 1000, endpoint);
    r.model = Some("m".into());
    r.status = Some(200);
    r.e2el_us = Some(30_000);
    r
}

/// A Responses turn with its recorded body; `parent`: the row it continues and the id the
/// captured server gave that row's response.
fn turn(id: &str, at_ms: i64, input: &str, parent: Option<(&str, &str)>) -> TraceRecord {
    let mut r = row(id, at_ms, "/v1/responses");
    let mut body = json!({"model": "m", "input": [{"role": "user", "content": input}],
        "max_output_tokens": 4, "ignore_eos": true, "stream": true});
    if let Some((p, captured_id)) = parent {
        body["previous_response_id"] = json!(captured_id);
        r.parent_request_id = Some(p.into());
        r.parent_link = Some(ParentLink::PreviousResponse);
        r.session_id = Some("chain".into());
    }
    r.stream = true;
    r.body = Some(body.to_string());
    r
}

fn write(path: &Path, rows: &[TraceRecord]) {
    let meta = FileMeta::new(Producer::Capture, "apis_replay test");
    let (mut w, _) = TraceWriter::open(WriterConfig::one_file(path, meta)).unwrap();
    for r in rows {
        w.append(r.clone()).unwrap();
    }
    w.close().unwrap();
}

/// Runs `llmreplay replay TRACE --target sim=URL ARGS`; its rows by request id and result.
fn replay(
    dir: &Path,
    trace: &Path,
    url: &str,
    args: &[&str],
) -> (HashMap<String, TraceRecord>, Value) {
    let results = dir.join(format!("r{}.parquet", args.len()));
    let json_out = dir.join(format!("r{}.json", args.len()));
    let _ = std::fs::remove_file(&results);
    let out = Command::new(bin())
        .arg("replay")
        .arg(trace)
        .args([
            "--target",
            &format!("sim={url}"),
            "--speedup",
            "2",
            "--results",
        ])
        .arg(&results)
        .arg("--save-result")
        .arg(&json_out)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay");
    assert!(
        out.status.success(),
        "replay failed\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = trace_format::read_traces(&[results.to_str().unwrap()])
        .unwrap()
        .records
        .into_iter()
        .map(|r| (r.request_id.clone(), r))
        .collect();
    let doc = serde_json::from_slice(&std::fs::read(&json_out).unwrap()).unwrap();
    (rows, doc)
}

/// The first value under `key` anywhere in `v`.
fn find<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(o) => o.get(key).or_else(|| o.values().find_map(|x| find(x, key))),
        Value::Array(a) => a.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

fn chain_trace(dir: &Path) -> PathBuf {
    let t = dir.join("chain.parquet");
    // Turn 2 arrives 50 ms after turn 1, turn 3 50 ms after turn 2 (at speedup 2: 25 ms),
    // while the sim (40 ms to the first token, 10 ms a token, 4 tokens) answers each in
    // ~70 ms: each waits for its parent.
    write(
        &t,
        &[
            turn("t1", 0, "one two three", None),
            turn("t2", 50, "four five", Some(("t1", "resp_captured_1"))),
            turn("t3", 100, "six", Some(("t2", "resp_captured_2"))),
        ],
    );
    t
}

/// The chain replayed: every turn served, on the conversation the candidate holds (its
/// prompt = the earlier turns' prompts and answers and its own input), after its parent.
fn check_chain(rows: &HashMap<String, TraceRecord>) {
    for id in ["t1", "t2", "t3"] {
        let r = &rows[id];
        assert_eq!(r.outcome, Outcome::Ok, "{id}: {:?} {:?}", r.status, r.error);
        assert_eq!(r.endpoint, "/v1/responses");
    }
    // 3 words; then 3 + 4 answered + 2; then 9 + 4 + 1.
    let prompts: Vec<_> = ["t1", "t2", "t3"]
        .iter()
        .map(|i| rows[*i].prompt_tokens)
        .collect();
    assert_eq!(prompts, [Some(3), Some(9), Some(14)]);
    assert_eq!(rows["t1"].parent_wait_us, None, "t1 waits for no parent");
    for (child, parent) in [("t2", "t1"), ("t3", "t2")] {
        let (c, p) = (&rows[child], &rows[parent]);
        let parent_end = p.arrival_time_us + p.e2el_us.unwrap();
        assert!(
            c.arrival_time_us >= parent_end,
            "{child} sent at {} before its parent answered at {parent_end}",
            c.arrival_time_us
        );
        let wait = c.parent_wait_us.expect("parent_wait_us");
        assert!(wait > 0, "{child} waited {wait} µs");
        // Waiting is neither latency nor the client's lag.
        assert!(
            c.dispatch_lag_us.unwrap() < 50_000,
            "{:?}",
            c.dispatch_lag_us
        );
        assert!(c.ttft_us.unwrap() < 200_000, "{:?}", c.ttft_us);
    }
}

#[test]
fn a_previous_response_chain_is_replayed_on_the_candidates_own_ids_open_and_closed() {
    let sim = SimProc::fixed(&bin(), 40, 10);
    let dir = tmpdir("apis-chain");
    let t = chain_trace(&dir);
    let (rows, _) = replay(&dir, &t, &sim.url(), &[]);
    check_chain(&rows);
    // Open mode keeps the first turn's offset and sends the others once their parent
    // answered: the same chain, closed.
    let (rows, _) = replay(&dir, &t, &sim.url(), &["--session-mode", "closed"]);
    check_chain(&rows);
}

#[test]
fn a_turn_whose_parent_failed_is_not_sent_and_says_why() {
    let sim = SimProc::fixed(&bin(), 5, 1);
    let dir = tmpdir("apis-chain-fail");
    let t = dir.join("fail.parquet");
    // The first turn's body is one the server refuses (400): the rest of the chain cannot
    // continue a response that does not exist.
    let mut bad = turn("f1", 0, "x", None);
    bad.body = Some(json!({"model": "m", "input": 5, "stream": true}).to_string());
    write(
        &t,
        &[
            bad,
            turn("f2", 50, "y", Some(("f1", "resp_a"))),
            turn("f3", 100, "z", Some(("f2", "resp_b"))),
            turn("ok", 120, "alone", None),
        ],
    );
    for mode in ["open", "closed"] {
        // The parent's failure is the server's: allowed here, counted once.
        let args = ["--session-mode", mode, "--max-failed", "1"];
        let (rows, doc) = replay(&dir, &t, &sim.url(), &args);
        assert_eq!(rows["f1"].outcome, Outcome::HttpError, "{mode}");
        assert_eq!(rows["ok"].outcome, Outcome::Ok, "{mode}");
        assert!(
            !rows.contains_key("f2") && !rows.contains_key("f3"),
            "{mode}: {:?}",
            rows.keys()
        );
        assert_eq!(find(&doc, "skipped_rows"), Some(&json!(2)), "{mode}");
        let why = find(&doc, "skipped_examples").unwrap().to_string();
        assert!(
            why.contains("f2: not sent: its parent f1 failed on the target (http_error")
                && why.contains("f3: not sent: its parent f2 was not sent"),
            "{mode}: {why}"
        );
    }
}

#[test]
fn every_row_goes_to_its_own_endpoint_in_its_apis_shape() {
    let sim = SimProc::start(
        &bin(),
        &["--fixed-timing", "5,1", "--served-model-name", "m"],
    );
    let dir = tmpdir("apis-mixed");
    let t = dir.join("mixed.parquet");
    let mut rows = Vec::new();
    for (i, ep) in [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
    ]
    .iter()
    .enumerate()
    {
        for stream in [true, false] {
            // Synthesized from their lengths (no body).
            let mut r = row(&format!("s{i}{stream}"), (i * 20) as i64, ep);
            r.prompt_tokens = Some(7);
            r.output_tokens = Some(5);
            r.stream = stream && !ep.ends_with("embeddings");
            rows.push(r);
        }
    }
    // Recorded bodies, as the clients sent them.
    let mut m = row("bm", 150, "/v1/messages");
    m.body = Some(
        json!({"model": "m", "max_tokens": 3, "ignore_eos": true, "stream": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]})
        .to_string(),
    );
    m.stream = true;
    let mut e = row("be", 160, "/v1/embeddings");
    e.body = Some(json!({"model": "m", "input": ["a b", "c"]}).to_string());
    rows.extend([m, e]);
    write(&t, &rows);
    let (got, _) = replay(&dir, &t, &sim.url(), &[]);
    assert_eq!(got.len(), rows.len());
    for r in &rows {
        let g = &got[&r.request_id];
        assert_eq!(g.outcome, Outcome::Ok, "{}: {:?}", r.request_id, g.error);
        assert_eq!(g.endpoint, r.endpoint, "{}", r.request_id);
        assert_eq!(g.stream, r.stream, "{}", r.request_id);
        if r.body.is_none() {
            assert_eq!(g.prompt_tokens, Some(7), "{}", r.request_id);
        }
        if r.endpoint.ends_with("embeddings") {
            assert!(
                g.ttft_us.is_none() && g.e2el_us.is_some(),
                "{}",
                r.request_id
            );
        } else if r.body.is_none() {
            // ignore_eos: exactly the recorded length, on every generation API.
            assert_eq!(g.output_tokens, Some(5), "{}", r.request_id);
            if r.stream {
                assert_eq!(g.chunk_times_us.len(), 5, "{}", r.request_id);
            }
        }
    }
    assert_eq!(got["bm"].output_tokens, Some(3));
    assert_eq!(got["be"].prompt_tokens, Some(3));
}

/// Runs a capture of `flags` in front of `upstream` into `out` while `send` sends to its
/// listener; its rows, sorted by endpoint.
fn capture_while(
    upstream: &str,
    out: &Path,
    flags: &[&str],
    send: &dyn Fn(SocketAddr),
) -> Vec<TraceRecord> {
    let listen = support::env::free_addr();
    let mut args = vec!["--flush-interval", "20ms"];
    args.extend_from_slice(flags);
    let mut cap = support::capture::CaptureProc::spawn(listen, upstream, out, &args);
    cap.wait_for("listening on");
    send(listen);
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
    let mut rows = trace_format::read_traces(&[out.to_str().unwrap()])
        .unwrap()
        .records;
    rows.sort_by(|x, y| x.endpoint.cmp(&y.endpoint));
    rows
}

/// Replays `trace` into the capture listening on `listen`.
fn replay_into(trace: &Path, listen: SocketAddr) {
    let out = Command::new(bin())
        .arg("replay")
        .arg(trace)
        .args(["--target", &format!("c=http://{listen}"), "--speedup", "10"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A prompt's images survive a `hashes` trace (issue 51): capture records how many, their
/// bytes and sizes but no pixel; replaying that trace sends, per image, a synthetic PNG of the
/// recorded size and bytes in the row's API — checked by a second capture in front of the
/// sim, which records the same images, sizes and bytes for every row of chat, Responses and
/// Messages.
#[test]
fn a_hashes_traces_images_are_replayed_at_their_recorded_sizes_and_bytes() {
    use support::http1::Http1Client;
    let sim = SimProc::start(&bin(), &["--fixed-timing", "2,1"]);
    let dir = tmpdir("apis-images");
    let png = |d, bytes, seed| replay::prompt::image::png(d, bytes, seed);
    let (a, b) = (png((800, 600), 40_000, 1), png((64, 48), 0, 2));
    let bodies = [
        (
            "/v1/chat/completions",
            json!({"model": "m", "max_tokens": 3, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": a.data_url}},
                {"type": "image_url", "image_url": {"url": b.data_url}}]}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "max_output_tokens": 3, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "and this"},
                {"type": "input_image", "image_url": a.data_url}]}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 3, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "and that"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                    "data": b.base64()}}]}]}),
        ),
    ];
    let first = dir.join("first");
    let captured = capture_while(&sim.url(), &first, &[], &|listen| {
        let mut c = Http1Client::new(listen);
        for (ep, body) in &bodies {
            let r = c.post(ep, &[], &body.to_string()).unwrap();
            assert_eq!(r.status, 200, "{ep}: {}", r.text());
        }
    });
    assert_eq!(captured.len(), 3);
    for r in &captured {
        assert!(r.body.is_none() && r.images.unwrap_or(0) > 0, "{r:?}");
    }
    let replayed = capture_while(&sim.url(), &dir.join("second"), &[], &|listen| {
        replay_into(&first, listen)
    });
    assert_eq!(replayed.len(), 3);
    for (c, r) in captured.iter().zip(&replayed) {
        assert_eq!(c.endpoint, r.endpoint);
        assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error);
        assert_eq!(r.images, c.images, "{}", c.endpoint);
        assert_eq!(r.image_dims, c.image_dims, "{}", c.endpoint);
        assert_eq!(r.image_bytes, c.image_bytes, "{}", c.endpoint);
    }
    assert_eq!(
        captured[0].image_dims.as_deref(),
        Some(&["800x600".to_string(), "64x48".to_string()][..])
    );
}

/// Under `--privacy full` an agent's screenshot re-sent with every turn is stored once
/// (issue 51): `blobs/` beside the trace holds each distinct image once, the Parquet bodies
/// refer to it, every reader gets the bodies back exactly as sent, and a replay sends the
/// recorded bytes — a second capture in front of the sim stores the same images.
#[test]
fn a_full_captures_images_are_stored_once_and_replayed_as_sent() {
    use support::http1::Http1Client;
    let sim = SimProc::start(&bin(), &["--fixed-timing", "2,1"]);
    let dir = tmpdir("apis-blobs");
    let shot = replay::prompt::image::png((1024, 768), 80_000, 5);
    let other = replay::prompt::image::png((320, 200), 20_000, 6);
    // Four turns of one agent: each re-sends the first screenshot, the third adds another.
    let mut history = vec![
        json!({"type": "text", "text": "look"}),
        json!({"type": "image_url", "image_url": {"url": shot.data_url}}),
    ];
    let mut sent = Vec::new();
    for turn in 0..4 {
        if turn == 2 {
            history.push(json!({"type": "image_url", "image_url": {"url": other.data_url}}));
        }
        history.push(json!({"type": "text", "text": format!("turn {turn}")}));
        let body = json!({"model": "m", "max_tokens": 2,
            "messages": [{"role": "user", "content": history}]});
        sent.push(body.to_string());
    }
    // The images a capture stored, sorted.
    let blobs_of = |out: &Path| -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = std::fs::read_dir(out.join("blobs"))
            .map(|d| {
                d.map(|e| std::fs::read(e.unwrap().path()).unwrap())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let full = ["--privacy", "full"];
    let first = dir.join("first");
    let rows = capture_while(&sim.url(), &first, &full, &|listen| {
        let mut c = Http1Client::new(listen);
        for b in &sent {
            let r = c.post("/v1/chat/completions", &[], b).unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
    });
    let blobs = blobs_of(&first);
    assert_eq!(blobs.len(), 2, "two distinct images, each stored once");
    let mut want = vec![
        shot.data_url.clone().into_bytes(),
        other.data_url.clone().into_bytes(),
    ];
    want.sort();
    assert_eq!(blobs, want);
    let mut bodies: Vec<String> = rows.iter().map(|r| r.body.clone().unwrap()).collect();
    bodies.sort();
    let mut expected = sent.clone();
    expected.sort();
    assert_eq!(
        bodies, expected,
        "every reader gets the bodies back as sent"
    );
    let parquet: u64 = std::fs::read_dir(&first)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let inline: usize = sent.iter().map(String::len).sum();
    assert!(
        parquet < inline as u64 / 4,
        "{parquet} bytes of Parquet for {inline} sent"
    );
    // Replayed: the recorded bytes, as a second capture stores them.
    let second = dir.join("second");
    capture_while(&sim.url(), &second, &full, &|listen| {
        replay_into(&first, listen)
    });
    let again = blobs_of(&second);
    assert_eq!(again, blobs);
}
