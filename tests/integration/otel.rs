//! OpenTelemetry end to end: replay against the sim exporting to an OTLP receiver on
//! 127.0.0.1 (built on the official protobuf definitions: spans decoded and checked, one per
//! request, each carrying its row's trace id); capture forwarding a client's `traceparent`
//! unchanged (or starting one) on the lean HTTP/1.1 path and on hyper's, and recording its
//! ids; a stalled receiver costing spans, never measurements.

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::capture::CaptureProc;
use support::env::{free_addr, tmpdir};
use support::fault_upstream::{Act, FaultUpstream};
use support::http1::raw_exchange;
use support::sim::SimProc;
use telemetry::span::attr;
use telemetry::testing::{attr_f64, attr_int, attr_str, Receiver};
use trace_format::tracectx::{to_hex, TraceContext};
use trace_format::TraceRecord;

const BIN: &str = env!("CARGO_BIN_EXE_llmreplay");

fn rows(path: &Path) -> Vec<TraceRecord> {
    trace_format::read_traces(&[path.to_str().unwrap()])
        .expect("reading the rows")
        .records
}

/// `llmreplay synth` of `n` requests into `dir`.
fn synth(dir: &Path, n: usize) -> PathBuf {
    let trace = dir.join("trace.parquet");
    let out = Command::new(BIN)
        .args([
            "synth",
            "--num-prompts",
            &n.to_string(),
            "--request-rate",
            "50",
        ])
        .args(["--input-len", "16", "--output-len", "4"])
        .args(["--seed", "7", "-o", trace.to_str().unwrap()])
        .output()
        .expect("running synth");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    trace
}

/// `llmreplay replay` of `trace` against `target`, with `extra` flags; its stderr.
fn replay(trace: &Path, target: &str, results: &Path, extra: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["replay", trace.to_str().unwrap(), "--target", target, "-q"])
        .args(["--results", results.to_str().unwrap()])
        .args(extra)
        .output()
        .expect("running replay");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

/// The done-when of the issue: a replay with --otlp-endpoint against the sim leaves one span
/// per request in the receiver, with the GenAI attributes, each span's trace id that of its
/// row in --results, and the row's span id the span's own.
#[test]
fn replay_exports_one_span_per_request_joined_to_its_row() {
    let dir = tmpdir("otel-replay");
    let trace = synth(&dir, 30);
    let sim = SimProc::fixed(BIN, 20, 5);
    let rx = Receiver::start();
    let results = dir.join("results.parquet");
    let err = replay(
        &trace,
        &sim.url(),
        &results,
        &["--otlp-endpoint", &rx.url()],
    );
    assert!(err.contains("OTLP: 30 spans exported, 0 dropped"), "{err}");
    let rows = rows(&results);
    assert_eq!(rows.len(), 30);
    let got = rx.received();
    assert!(got.bad.is_empty(), "{:?}", got.bad);
    assert_eq!(got.spans.len(), 30, "one span per request");
    let by_trace: HashMap<String, &telemetry::proto::tonic::trace::v1::Span> = got
        .spans
        .iter()
        .map(|(_, s)| (to_hex(&s.trace_id), s))
        .collect();
    assert_eq!(by_trace.len(), 30, "30 distinct trace ids");
    let port = sim
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse::<i64>()
        .unwrap();
    for r in &rows {
        let tid = r.trace_id.as_deref().expect("every row has a trace id");
        assert_eq!(tid.len(), 32);
        let sp = by_trace
            .get(tid)
            .unwrap_or_else(|| panic!("no span for {tid}"));
        assert_eq!(to_hex(&sp.span_id), r.span_id.clone().unwrap());
        assert!(sp.parent_span_id.is_empty());
        // The ids are the ones derived from the run and the request.
        let want = TraceContext::derive(r.run_id.as_deref().unwrap(), &r.request_id);
        assert_eq!(want.trace_hex(), tid);
        let model = r.model.as_deref().unwrap();
        let op = attr_str(sp, attr::OPERATION).unwrap();
        assert!(op == "chat" || op == "text_completion", "{op}");
        assert_eq!(sp.name, format!("{op} {model}"));
        assert_eq!(sp.kind, 3, "CLIENT");
        assert_eq!(attr_str(sp, attr::REQUEST_MODEL), Some(model));
        assert_eq!(attr_int(sp, attr::INPUT_TOKENS), r.prompt_tokens);
        assert_eq!(attr_int(sp, attr::OUTPUT_TOKENS), r.output_tokens);
        assert_eq!(attr_int(sp, attr::HTTP_STATUS), Some(200));
        assert_eq!(attr_str(sp, attr::SERVER_ADDRESS), Some("127.0.0.1"));
        assert_eq!(attr_int(sp, attr::SERVER_PORT), Some(port));
        assert_eq!(attr_str(sp, attr::REQUEST_ID), Some(r.request_id.as_str()));
        if r.stream {
            assert_eq!(
                attr_f64(sp, attr::TTFC),
                Some(r.ttft_us.unwrap() as f64 / 1e6)
            );
        }
        assert_eq!(
            sp.start_time_unix_nano,
            r.arrival_time_us as u64 * 1000,
            "the span starts when the request was sent"
        );
        assert_eq!(
            sp.end_time_unix_nano - sp.start_time_unix_nano,
            r.e2el_us.unwrap() as u64 * 1000
        );
        assert_eq!(sp.status.as_ref().unwrap().code, 1, "OK");
    }
    let names: Vec<&str> = got.metrics.iter().map(|m| m.name.as_str()).collect();
    assert!(
        names.contains(&"gen_ai.client.operation.duration"),
        "{names:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A receiver that never answers: the replay finishes, the drops and losses are counted and
/// said, and every request is measured as without the exporter (every row, all ok).
#[test]
fn a_stalled_receiver_costs_spans_not_measurements() {
    let dir = tmpdir("otel-stalled");
    let trace = synth(&dir, 20);
    let sim = SimProc::fixed(BIN, 10, 2);
    let rx = Receiver::stalled();
    let results = dir.join("results.parquet");
    let err = replay(
        &trace,
        &sim.url(),
        &results,
        &["--otlp-endpoint", &rx.url()],
    );
    assert!(err.contains("OTLP: 0 spans exported"), "{err}");
    assert!(err.contains("no answer"), "{err}");
    let rows = rows(&results);
    assert_eq!(rows.len(), 20);
    assert!(rows.iter().all(|r| r.outcome == trace_format::Outcome::Ok));
    assert!(rows.iter().all(|r| r.trace_id.is_some()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--no-traceparent`: no header is sent, the rows have no trace ids.
#[test]
fn no_traceparent_sends_none_and_records_none() {
    let dir = tmpdir("otel-none");
    let trace = synth(&dir, 3);
    let up = FaultUpstream::always(Act::Stream {
        events: 2,
        gap: Duration::from_millis(1),
    });
    let results = dir.join("results.parquet");
    replay(&trace, &up.url(), &results, &["--no-traceparent"]);
    // Generation requests (replay also GETs /v1/models and the like, without one).
    let posts = || -> Vec<_> {
        up.received()
            .into_iter()
            .filter(|r| r.method == "POST")
            .collect()
    };
    let got = posts();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|r| r.header("traceparent").is_none()));
    assert!(rows(&results).iter().all(|r| r.trace_id.is_none()));
    // By default every request carries the row's context.
    let results = dir.join("results2.parquet");
    replay(&trace, &up.url(), &results, &[]);
    let sent: Vec<String> = posts()
        .iter()
        .skip(3)
        .map(|r| r.header("traceparent").unwrap().to_string())
        .collect();
    for r in rows(&results) {
        let want = format!("00-{}-{}-01", r.trace_id.unwrap(), r.span_id.unwrap());
        assert!(sent.contains(&want), "{want} not in {sent:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

struct Capture {
    proc: CaptureProc,
    addr: SocketAddr,
    out: PathBuf,
}

impl Capture {
    fn start(name: &str, upstream: &str, extra: &[&str]) -> Capture {
        let out = tmpdir(name);
        let addr = free_addr();
        let mut flags = vec!["--session-header", "x-marker", "--flush-interval", "50ms"];
        flags.extend_from_slice(extra);
        let mut proc = CaptureProc::spawn(addr, upstream, &out, &flags);
        proc.wait_for("listening on");
        Capture { proc, addr, out }
    }

    fn send(&self, marker: &str, extra: &[&str]) -> u16 {
        let body = format!(r#"{{"model":"m","prompt":"marker {marker}","max_tokens":4}}"#);
        let mut h = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: capture\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-marker: {marker}\r\nconnection: close\r\n",
            body.len()
        );
        for l in extra {
            h.push_str(l);
            h.push_str("\r\n");
        }
        h.push_str("\r\n");
        h.push_str(&body);
        raw_exchange(self.addr, h.as_bytes(), Duration::from_secs(10)).statuses()[0]
    }

    /// SIGTERM; the rows and the log.
    fn stop(self) -> (Vec<TraceRecord>, Vec<String>) {
        let (status, log) = self.proc.terminate();
        assert!(status.success(), "capture exited {status:?}: {log:#?}");
        let rows = rows(&self.out);
        let _ = std::fs::remove_dir_all(&self.out);
        (rows, log)
    }
}

const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Capture, on the lean HTTP/1.1 path and on hyper's (`--upstream-h2` is not needed: an
/// h2c upstream is hyper's; here the lean path is turned off by a chunked request body,
/// which the lean path leaves to hyper): a client's valid `traceparent` reaches the upstream
/// unchanged and its ids are recorded; without one (or with an invalid one) capture starts
/// one, the upstream gets it and the row records it; the OTLP span of a forwarded context is
/// the client span's child, that of a started one is the upstream span's parent.
#[test]
fn capture_forwards_a_clients_traceparent_unchanged_or_starts_one() {
    let up = FaultUpstream::always(Act::Json);
    let rx = Receiver::start();
    let cap = Capture::start("otel-capture", &up.url(), &["--otlp-endpoint", &rx.url()]);
    assert_eq!(cap.send("given", &[&format!("traceparent: {CLIENT}")]), 200);
    assert_eq!(cap.send("none", &[]), 200);
    assert_eq!(cap.send("invalid", &["traceparent: 00-xyz-01"]), 200);
    let (rows, log) = cap.stop();
    let sent = |marker: &str| -> String {
        let r = up
            .received()
            .into_iter()
            .find(|r| r.body_text().contains(&format!("marker {marker}")))
            .unwrap();
        let v: Vec<&(String, String)> = r
            .headers
            .iter()
            .filter(|(k, _)| k == "traceparent")
            .collect();
        assert_eq!(v.len(), 1, "{marker}: {:?}", r.headers);
        v[0].1.clone()
    };
    let row = |marker: &str| -> &TraceRecord {
        rows.iter()
            .find(|r| r.session_id.as_deref() == Some(marker))
            .unwrap()
    };
    assert_eq!(sent("given"), CLIENT, "forwarded unchanged");
    let g = row("given");
    assert_eq!(
        g.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(g.span_id.as_deref(), Some("00f067aa0ba902b7"));
    for m in ["none", "invalid"] {
        let ctx = TraceContext::parse(&sent(m)).expect("a valid generated traceparent");
        let r = row(m);
        assert_eq!(r.trace_id, Some(ctx.trace_hex()), "{m}");
        assert_eq!(r.span_id, Some(ctx.span_hex()), "{m}");
        assert_ne!(r.trace_id, g.trace_id);
    }
    assert!(
        log.iter().any(|l| l.contains("OTLP: 3 spans exported")),
        "{log:#?}"
    );
    let got = rx.received();
    let span_of = |r: &TraceRecord| {
        got.spans
            .iter()
            .map(|(_, s)| s)
            .find(|s| attr_str(s, attr::REQUEST_ID) == Some(r.request_id.as_str()))
            .unwrap()
    };
    let gs = span_of(g);
    assert_eq!(to_hex(&gs.parent_span_id), "00f067aa0ba902b7");
    assert_ne!(to_hex(&gs.span_id), "00f067aa0ba902b7");
    let ns = span_of(row("none"));
    assert_eq!(to_hex(&ns.span_id), row("none").span_id.clone().unwrap());
    assert!(ns.parent_span_id.is_empty());
    assert!(got.spans.iter().all(|(svc, _)| svc == "llmreplay-capture"));
}

/// The same on hyper's path (a chunked request body is not the lean path's), and with
/// `--no-traceparent` nothing is added (a client's is still forwarded and recorded).
#[test]
fn capture_on_hypers_path_and_with_no_traceparent() {
    let up = FaultUpstream::always(Act::Json);
    let cap = Capture::start("otel-capture-h", &up.url(), &["--no-traceparent"]);
    assert_eq!(cap.send("given", &[&format!("traceparent: {CLIENT}")]), 200);
    assert_eq!(cap.send("none", &[]), 200);
    let (rows, _) = cap.stop();
    let by = |m: &str| {
        up.received()
            .into_iter()
            .find(|r| r.body_text().contains(&format!("marker {m}")))
            .unwrap()
    };
    assert_eq!(by("given").header("traceparent"), Some(CLIENT));
    assert_eq!(by("none").header("traceparent"), None);
    let none = rows
        .iter()
        .find(|r| r.session_id.as_deref() == Some("none"))
        .unwrap();
    assert_eq!(none.trace_id, None);
    let given = rows
        .iter()
        .find(|r| r.session_id.as_deref() == Some("given"))
        .unwrap();
    assert_eq!(
        given.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );

    // hyper's path: a chunked body.
    let cap = Capture::start("otel-capture-c", &up.url(), &[]);
    let body = r#"{"model":"m","prompt":"marker chunked","max_tokens":4}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: capture\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nx-marker: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let got = raw_exchange(cap.addr, req.as_bytes(), Duration::from_secs(10));
    assert_eq!(got.statuses(), vec![200], "{}", got.text());
    let (rows, _) = cap.stop();
    let ctx = TraceContext::parse(by("chunked").header("traceparent").unwrap()).unwrap();
    let r = rows
        .iter()
        .find(|r| r.session_id.as_deref() == Some("chunked"))
        .unwrap();
    assert_eq!(r.trace_id, Some(ctx.trace_hex()));
}
