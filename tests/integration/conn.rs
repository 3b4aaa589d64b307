//! End-to-end tests of issue 40 (items 1 and 5): the connection layer against a server that
//! closes after every streamed response while advertising keep-alive (llama.cpp's server),
//! through capture and through replay; and the `X-Forwarded-For` / `X-Forwarded-Proto`
//! capture adds for the upstream.
//!
//! The server here closes 1 ms after the last chunk of each stream (llama.cpp's close follows
//! by microseconds; a millisecond makes the race the pool used to lose happen nearly every
//! time a connection is reused, instead of now and then). What the tests check is counts and
//! outcomes: every request answered, and every request reaching the server once.

use crate::support;
use support::env::{free_addr, tmpdir};

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::capture::CaptureProc;
use support::http1::Http1Client;
use support::misbehaving::{Behaviour, ConnEnd, MisbehavingServer};
use trace_format::{FileMeta, Outcome, Producer, TraceRecord};

/// llama.cpp's server, quick: a streamed answer of 3 tokens, then the close 1 ms later.
fn closes_after_every_stream() -> MisbehavingServer {
    MisbehavingServer::start(Behaviour {
        think: Duration::from_millis(2),
        chunk_gap: Duration::from_millis(1),
        ..Behaviour::close_after_every_stream(Duration::from_millis(1))
    })
}

fn body(marker: &str) -> String {
    format!(r#"{{"model":"m","prompt":"marker {marker} one two","max_tokens":3,"stream":true}}"#)
}

/// How many times the server read each marker (from `x-request-id`).
fn reads_by_id(server: &MisbehavingServer) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for s in server.posts() {
        *seen.entry(s.request_id.unwrap_or_default()).or_insert(0) += 1;
    }
    seen
}

/// 4 clients × 50 streamed completions through capture, each client on one keep-alive
/// connection to capture, sending its next request as soon as the previous answer ended.
/// Before the pool learned the server's habit, a request written to an upstream connection
/// the server was closing got a 502 (1 of 40 in the issue's run; most reuses with the 1 ms
/// close here). Now: 200 answers, each request read once by the server.
#[test]
fn capture_against_a_server_that_closes_after_every_stream_fails_nothing() {
    let server = closes_after_every_stream();
    let out = tmpdir("conn-capture");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(listen, &server.url(), &out, &["--flush-interval", "50ms"]);
    cap.wait_for("listening on");
    let clients: Vec<_> = (0..4)
        .map(|c| {
            std::thread::spawn(move || {
                let mut client = Http1Client::new(listen);
                (0..50)
                    .map(|i| {
                        let marker = format!("c{c}-{i:02}");
                        let got = client.post(
                            "/v1/completions",
                            &[("x-request-id", &marker)],
                            &body(&marker),
                        );
                        let ok = matches!(&got, Ok(r) if r.status == 200
                            && r.text().contains("data: [DONE]"));
                        (marker, ok, got.map(|r| r.status).map_err(|e| e.to_string()))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let sent: Vec<_> = clients
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let failed: Vec<_> = sent.iter().filter(|(_, ok, _)| !ok).collect();
    assert!(
        failed.is_empty(),
        "{} of 200 failed: {failed:?}",
        failed.len()
    );
    let seen = reads_by_id(&server);
    assert_eq!(seen.len(), 200, "the server did not see every request");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "read more than once: {twice:?}");
    assert!(
        server.count(ConnEnd::ClosedAfterStream) >= 190,
        "the server did not close after its streams: {:?}",
        server.count(ConnEnd::ClosedAfterStream)
    );
    let rows = trace_format::read_traces(&[out.to_str().unwrap()])
        .expect("read capture's trace")
        .records;
    assert_eq!(rows.len(), 200);
    assert!(rows.iter().all(|r| r.outcome == Outcome::Ok));
    let _ = std::fs::remove_dir_all(&out);
}

/// 200 streamed requests arriving at once, replayed with `--max-concurrency 4`: every slot
/// that frees up sends the next request within microseconds of the previous answer's end,
/// right when the server closes that connection. Before: "connection closed before a
/// response" for some of them (1–3 of 24 in the issue's run against llama-server). Now none,
/// each request read once, and the connections the pool retired were replaced by spares.
#[test]
fn replay_against_a_server_that_closes_after_every_stream_fails_nothing() {
    let mut server = closes_after_every_stream();
    let dir = tmpdir("conn-replay");
    let trace = dir.join("trace.parquet");
    let t0: i64 = 1_750_000_000_000_000;
    let records: Vec<TraceRecord> = (0..200)
        .map(|i| {
            let mut r = TraceRecord::new(format!("rr-{i:03}"), t0, "/v1/completions");
            r.stream = true;
            r.prompt_tokens = Some(8);
            r.output_tokens = Some(3);
            r.status = Some(200);
            r
        })
        .collect();
    trace_format::write_trace_file(
        &trace,
        &records,
        &FileMeta::new(Producer::Import, "tests/integration/conn.rs"),
    )
    .unwrap();
    let (results, json) = (dir.join("out.parquet"), dir.join("out.json"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmreplay"))
        .arg("replay")
        .arg(&trace)
        .args(["--target", &format!("ls={}", server.url())])
        .args(["--max-concurrency", "4", "-q", "--timeout", "30s"])
        .arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn llmreplay replay");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("replay did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    server.stop();
    let rows = trace_format::read_traces(&[results.to_str().unwrap()])
        .expect("read the results")
        .records;
    let failed: Vec<_> = rows
        .iter()
        .filter(|r| r.outcome != Outcome::Ok)
        .map(|r| (&r.request_id, &r.error))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 200 failed: {failed:?}\n{}",
        failed.len(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(rows.len(), 200);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seen = reads_by_id(&server);
    assert_eq!(seen.len(), 200, "the server did not see every request");
    assert!(seen.values().all(|&n| n == 1), "a request was read twice");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    eprintln!("connections: {}", doc["llmreplay"]["connections"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The upstream sees the client: `X-Forwarded-For` with the client's address and
/// `X-Forwarded-Proto: http`, in place of what the client claimed; with
/// `--trust-forwarded-headers` the client's values are kept and its address appended; with
/// `--no-forwarded-headers` the client's headers pass unchanged. For a recorded request and a
/// pass-through one alike.
#[test]
fn the_upstream_sees_the_client_address_in_x_forwarded_for() {
    let server = MisbehavingServer::start(Behaviour::default());
    let cases: [(&[&str], &str, &str); 3] = [
        (&[], "127.0.0.1", "http"),
        (
            &["--trust-forwarded-headers"],
            "203.0.113.7, 127.0.0.1",
            "https",
        ),
        (&["--no-forwarded-headers"], "203.0.113.7", "https"),
    ];
    for (i, (flags, want_for, want_proto)) in cases.into_iter().enumerate() {
        let out = tmpdir("conn-forwarded");
        let listen = free_addr();
        let mut cap = CaptureProc::spawn(listen, &server.url(), &out, flags);
        cap.wait_for("listening on");
        let mut client = Http1Client::new(listen);
        for (j, path) in ["/v1/completions", "/v1/moderations"].iter().enumerate() {
            let marker = format!("fwd-{i}-{j}");
            let r = client
                .post(
                    path,
                    &[
                        ("x-request-id", &marker),
                        ("x-forwarded-for", "203.0.113.7"),
                        ("x-forwarded-proto", "https"),
                    ],
                    &format!(r#"{{"model":"m","prompt":"p {marker}","max_tokens":2}}"#),
                )
                .expect("an answer");
            assert!(r.status == 200 || r.status == 404, "{}", r.status);
            let seen: Vec<_> = server
                .requests()
                .into_iter()
                .filter(|s| s.request_id.as_deref() == Some(marker.as_str()))
                .collect();
            assert_eq!(seen.len(), 1, "{flags:?} {path}");
            assert_eq!(
                (
                    seen[0].forwarded_for.as_deref(),
                    seen[0].forwarded_proto.as_deref()
                ),
                (Some(want_for), Some(want_proto)),
                "{flags:?} {path}"
            );
        }
        let (status, log) = cap.terminate();
        assert!(status.success(), "capture exited {status:?}: {log:#?}");
        let _ = std::fs::remove_dir_all(&out);
    }
}
