//! `llmreplay sim --from-trace`: a mock that answers each request with a recorded row's
//! cadence and outcome, so a replay of the capture against it reproduces the capture (the
//! fidelity report says so), with no GPU.

use crate::support;
use support::env::tmpdir;
use support::sim::SimProc;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use trace_format::{FileMeta, Outcome, Producer, TraceRecord};

const BIN: &str = env!("CARGO_BIN_EXE_llmreplay");
const T0: i64 = 1_750_000_000_000_000;

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// 24 streamed requests whose TTFTs (20–250 ms) and chunk gaps (10–28 ms: the mock's timer is
/// tokio's, 1 ms granular, so gaps of a few ms read up to ~15% long) all differ, a 503, a 400
/// (its body recorded, so the replay sends what was refused) and a request that was not
/// streamed, 60 ms apart.
fn write_capture(path: &Path) -> Vec<TraceRecord> {
    let mut rows = Vec::new();
    for i in 0..24i64 {
        let mut r = TraceRecord::new(format!("c{i}"), T0 + i * 60_000, "/v1/completions");
        r.stream = true;
        r.model = Some("m".into());
        r.prompt_tokens = Some(20 + i);
        let ttft = 20_000 + (i * 37 % 24) * 10_000;
        let gap = 10_000 + (i * 5 % 10) * 2_000;
        let out = 5 + i % 7;
        r.chunk_times_us = (0..out).map(|k| ttft + k * gap).collect();
        r.chunk_tokens = Some(vec![1; out as usize]);
        r.ttft_us = Some(ttft);
        r.e2el_us = r.chunk_times_us.last().copied();
        r.output_tokens = Some(out);
        r.status = Some(200);
        r.outcome = Outcome::Ok;
        rows.push(r);
    }
    let mut e = TraceRecord::new("busy", T0 + 24 * 60_000, "/v1/completions");
    (e.stream, e.model, e.prompt_tokens) = (true, Some("m".into()), Some(30));
    (e.status, e.outcome, e.e2el_us) = (Some(503), Outcome::HttpError, Some(15_000));
    e.max_tokens = Some(16);
    let mut bad = TraceRecord::new("bad", T0 + 25 * 60_000, "/v1/completions");
    (bad.model, bad.prompt_tokens) = (Some("m".into()), Some(30));
    (bad.status, bad.outcome, bad.e2el_us) = (Some(400), Outcome::HttpError, Some(2_000));
    bad.max_tokens = Some(16);
    bad.body = Some(r#"{"model":"m","prompt":"#.into());
    let mut whole = TraceRecord::new("whole", T0 + 26 * 60_000, "/v1/completions");
    (whole.model, whole.prompt_tokens, whole.output_tokens) =
        (Some("m".into()), Some(30), Some(12));
    (whole.status, whole.outcome, whole.e2el_us) = (Some(200), Outcome::Ok, Some(90_000));
    rows.extend([e, bad, whole]);
    trace_format::write_trace_file(path, &rows, &FileMeta::new(Producer::Capture, "test")).unwrap();
    rows
}

#[test]
fn a_replay_against_the_mock_reproduces_the_capture() {
    let dir = tmpdir("from-trace");
    let cap = dir.join("capture.parquet");
    let rows = write_capture(&cap);
    let mock = SimProc::start(BIN, &["--from-trace", cap.to_str().unwrap()]);
    let (results, doc) = (dir.join("results.parquet"), dir.join("result.json"));
    let o = Command::new(BIN)
        .stdin(Stdio::null())
        .arg("replay")
        .arg(&cap)
        .args(["--target", &format!("mock={}", mock.url()), "-q"])
        .arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&doc)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let replayed = trace_format::read_traces(&[results.to_str().unwrap()])
        .unwrap()
        .records;
    assert_eq!(replayed.len(), rows.len(), "{replayed:#?}");
    for c in &rows {
        let r = replayed
            .iter()
            .find(|r| r.request_id == c.request_id)
            .unwrap_or_else(|| panic!("{} not replayed", c.request_id));
        assert_eq!(
            (r.status, r.outcome),
            (c.status, c.outcome),
            "{}",
            c.request_id
        );
        if c.outcome == Outcome::Ok {
            assert_eq!(r.output_tokens, c.output_tokens, "{}", c.request_id);
        }
        if let (Some(ct), Some(rt)) = (c.ttft_us, r.ttft_us) {
            // The recorded TTFT, plus a loopback round trip and the replay client's own
            // overhead (a few ms on a loaded 2-core machine), never less.
            assert!(
                rt >= ct - 1_000 && rt <= ct + 15_000,
                "{}: recorded TTFT {ct} µs, replayed {rt} µs",
                c.request_id
            );
        }
    }
    let json = dir.join("fidelity.json");
    let o = Command::new(BIN)
        .stdin(Stdio::null())
        .args(["fidelity", "--fail-on-drift", "--captured"])
        .arg(&cap)
        .arg("--replayed")
        .arg(&results)
        .arg("--replay-result")
        .arg(&doc)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let t = text(&o);
    // Same requests, tokens, outcomes and schedule (what --fail-on-drift enforces) ...
    assert!(o.status.success(), "{t}");
    assert!(t.contains("The replay reproduces the "), "{t}");
    // ... and per request the recorded TTFT, TPOT and E2EL. ITL is left out: the mock's
    // timer is tokio's (1 ms granular) and on a loaded machine a chunk woken late makes one
    // gap long and the next short, which moves the gaps' quantiles, not the per-request means.
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let streamed = f["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["stream"] == true)
        .unwrap_or_else(|| panic!("{f}"));
    for metric in ["ttft", "tpot", "e2el"] {
        let l = streamed["latencies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["metric"] == metric)
            .unwrap_or_else(|| panic!("{metric}: {streamed}"));
        let r = l["paired"]["ratio"]
            .as_f64()
            .unwrap_or_else(|| panic!("{l}"));
        assert!((0.97..1.05).contains(&r), "{metric} paired ×{r}: {t}");
    }
}

#[test]
fn a_request_that_matches_no_row_gets_a_clear_404_and_a_bad_trace_a_clear_error() {
    let dir = tmpdir("from-trace-miss");
    let cap = dir.join("capture.parquet");
    write_capture(&cap);
    let mock = SimProc::start(
        BIN,
        &["--from-trace", cap.to_str().unwrap(), "--match", "id"],
    );
    let body = r#"{"model":"m","prompt":"hi","max_tokens":3}"#;
    let mut s = std::net::TcpStream::connect(mock.url().trim_start_matches("http://")).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-request-id: nowhere\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    assert!(resp.contains("no_recorded_request"), "{resp}");

    let missing = dir.join("nope.parquet");
    let o = Command::new(BIN)
        .stdin(Stdio::null())
        .args(["sim", "--listen", "127.0.0.1:1", "--from-trace"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nope.parquet"), "{}", text(&o));
    let junk = dir.join("junk.parquet");
    std::fs::write(&junk, b"not parquet").unwrap();
    let o = Command::new(BIN)
        .stdin(Stdio::null())
        .args(["sim", "--listen", "127.0.0.1:1", "--from-trace"])
        .arg(&junk)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("junk.parquet"),
        "{}",
        text(&o)
    );
}
