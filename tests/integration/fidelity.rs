//! `llmreplay fidelity` end to end: the binary over files it refuses, and an A/A loop (capture
//! in front of the sim, replay against the same sim) whose verdict `--fail-on-drift` enforces.

use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, tmpdir};
use support::http1::Http1Client;
use support::sim::SimProc;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use trace_format::{FileMeta, Producer, TraceRecord};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llmreplay"));
    c.stdin(Stdio::null());
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn write_trace(path: &Path, prefix: &str, n: usize) {
    let rows: Vec<TraceRecord> = (0..n)
        .map(|i| {
            let mut r = TraceRecord::new(
                format!("{prefix}{i}"),
                1_750_000_000_000_000 + i as i64 * 100_000,
                "/v1/completions",
            );
            r.prompt_tokens = Some(10);
            r.output_tokens = Some(4);
            r.e2el_us = Some(50_000);
            r.status = Some(200);
            r
        })
        .collect();
    trace_format::write_trace_file(path, &rows, &FileMeta::new(Producer::Import, "test")).unwrap();
}

/// Two unrelated files ("0 in both") gave a dozen "load differs" lines and exit 0: refused,
/// on the ordinary error path (status 1, not --fail-on-drift's 5), saying why.
#[test]
fn two_files_with_no_request_in_common_are_refused() {
    let dir = tmpdir("fidelity-unrelated");
    let (a, b) = (dir.join("a.parquet"), dir.join("b.parquet"));
    write_trace(&a, "a", 6);
    write_trace(&b, "b", 4);
    let o = bin()
        .args(["fidelity", "--fail-on-drift", "--captured"])
        .arg(&a)
        .arg("--replayed")
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the 6 captured and 4 replayed rows have no request id in common"),
        "{}",
        text(&o)
    );
    assert!(
        o.stdout.is_empty(),
        "no report for inputs refused: {}",
        text(&o)
    );
}

/// The A/A a user runs first: traffic captured in front of the sim with capture's defaults
/// (`--record-bodies hashes`), replayed against the same sim, then `fidelity
/// --fail-on-drift`. It exited 5. The replay sent the same load on the same schedule to the
/// same server: it must pass.
#[test]
fn fail_on_drift_passes_an_aa_against_the_same_sim() {
    let sim = SimProc::start(env!("CARGO_BIN_EXE_llmreplay"), &[]);
    let out = tmpdir("fidelity-aa-capture");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(listen, &sim.url(), &out, &["--flush-interval", "50ms"]);
    cap.wait_for("listening on");
    let mut client = Http1Client::new(listen);
    for i in 0..16u32 {
        let (chat, stream) = (i % 2 == 1, i % 4 < 2);
        let n = 8 + 2 * (i % 5);
        let words = "lorem ipsum dolor sit amet ".repeat(1 + (i as usize % 3) * 4);
        let (path, body) = if chat {
            (
                "/v1/chat/completions",
                format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"aa {i} {words}"}}],"max_tokens":{n},"stream":{stream}}}"#
                ),
            )
        } else {
            (
                "/v1/completions",
                format!(
                    r#"{{"model":"m","prompt":"aa {i} {words}","max_tokens":{n},"stream":{stream}}}"#
                ),
            )
        };
        let r = client
            .post(path, &[], &body)
            .expect("request through capture");
        assert_eq!(r.status, 200, "request {i}");
        std::thread::sleep(Duration::from_millis(60));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");

    let dir = tmpdir("fidelity-aa-replay");
    let (results, doc) = (dir.join("aa.parquet"), dir.join("aa.json"));
    let o = bin()
        .arg("replay")
        .arg(&out)
        .args(["--target", &format!("sim={}", sim.url()), "-q"])
        .arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&doc)
        .output()
        .unwrap();
    assert!(o.status.success(), "replay: {}", text(&o));
    let o = bin()
        .args(["fidelity", "--fail-on-drift", "--captured"])
        .arg(&out)
        .arg("--replayed")
        .arg(&results)
        .arg("--replay-result")
        .arg(&doc)
        .output()
        .unwrap();
    eprintln!("{}", text(&o));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
