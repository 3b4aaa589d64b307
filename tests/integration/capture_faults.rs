//! The fault and attack suite of `llmreplay capture` (issue 17): the real binary on loopback
//! in front of [`support::fault_upstream`], a raw-TCP upstream that counts every request it
//! receives (a request smuggled inside another's body is a request of its own there) and
//! misbehaves on demand.
//!
//! Every case asserts three things:
//! 1. what the client got (status, headers, body, and whether the body was complete),
//! 2. what the upstream received, counted (never a duplicate, never a request the proxy did
//!    not answer as its own, never a host other than the configured upstream),
//! 3. the row recorded (outcome, status, chunks, error), or that there is none.
//!
//! Cases: upstream refused, accepted-then-reset and closed before the head; reset mid-stream;
//! stalled before the head and mid-body; 429 and 503 with Retry-After; malformed, unterminated
//! and non-UTF-8 SSE; client disconnect mid-stream and mid-request-body; request smuggling
//! (CL+TE, TE+CL, duplicate CL, obs-fold, other malformed framing); absolute-form targets and
//! CONNECT, over HTTP/1.1 and h2; hop-by-hop headers both ways; oversize headers, bodies and
//! response heads; kill -9 with requests in flight; SIGTERM drain within and past the drain
//! timeout. Slow clients (slowloris) and huge SSE events belong to the listener-timeout tests.
//!
//! Each test runs its own capture and upstream, so they run in parallel; the whole file takes
//! a few seconds.

use crate::support;
use support::env::{free_addr, tmpdir};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::capture::CaptureProc;
use support::fault_upstream::{chunk, Act, FaultUpstream, Received};
use support::http1::{raw_exchange, RawReply};
use trace_format::{Outcome, TraceRecord};

/// `llmreplay capture` in front of `upstream`, recording `x-marker` as the session id.
/// Killed when dropped unstopped (a failed test leaves no process behind).
struct Capture {
    proc: CaptureProc,
    addr: SocketAddr,
    out: PathBuf,
}

impl Drop for Capture {
    fn drop(&mut self) {
        if matches!(self.proc.child.try_wait(), Ok(None)) {
            let _ = self.proc.child.kill();
            let _ = self.proc.child.wait();
        }
    }
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

    /// SIGTERM; asserts exit 0; the rows written.
    fn stop(mut self) -> Vec<TraceRecord> {
        // SAFETY: a signal to our own child.
        unsafe {
            libc::kill(self.proc.child.id() as i32, libc::SIGTERM);
        }
        let status = self.wait_exit(Duration::from_secs(20));
        assert!(status.success(), "capture exited {status:?}");
        let rows = read_rows(&self.out);
        let _ = std::fs::remove_dir_all(&self.out);
        rows
    }

    /// Waits (bounded) for the exit, without another signal (a second one ends the drain).
    fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.proc.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "capture did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn send(&self, request: &[u8]) -> RawReply {
        raw_exchange(self.addr, request, Duration::from_secs(10))
    }
}

fn read_rows(out: &std::path::Path) -> Vec<TraceRecord> {
    if !out.exists() {
        return Vec::new();
    }
    trace_format::read_traces(&[out.to_str().unwrap()])
        .map(|t| t.records)
        .unwrap_or_default()
}

/// A generation request body whose prompt carries `marker`.
fn gen_body(path: &str, marker: &str, stream: bool) -> String {
    if path.contains("chat") {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"marker {marker} one two"}}],"max_tokens":8,"stream":{stream}}}"#
        )
    } else {
        format!(
            r#"{{"model":"m","prompt":"marker {marker} one two","max_tokens":8,"stream":{stream}}}"#
        )
    }
}

/// A whole generation request (content-length, `connection: close`) with `extra` header lines.
fn gen(path: &str, marker: &str, stream: bool, extra: &[&str]) -> Vec<u8> {
    let body = gen_body(path, marker, stream);
    let mut h = format!(
        "POST {path} HTTP/1.1\r\nhost: capture\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-marker: {marker}\r\nconnection: close\r\n",
        body.len()
    );
    for l in extra {
        h.push_str(l);
        h.push_str("\r\n");
    }
    h.push_str("\r\n");
    h.push_str(&body);
    h.into_bytes()
}

/// The one row of `marker` (panics unless there is exactly one).
fn row<'a>(rows: &'a [TraceRecord], marker: &str) -> &'a TraceRecord {
    let mine: Vec<&TraceRecord> = rows
        .iter()
        .filter(|r| r.session_id.as_deref() == Some(marker))
        .collect();
    assert_eq!(mine.len(), 1, "rows of {marker}: {rows:#?}");
    mine[0]
}

fn no_row(rows: &[TraceRecord], marker: &str) {
    assert!(
        !rows.iter().any(|r| r.session_id.as_deref() == Some(marker)),
        "{marker} has a row: {rows:#?}"
    );
}

/// Content events (SSE `data:` lines that are not `[DONE]`) in a client's body.
fn data_events(body: &[u8]) -> usize {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter(|e| e.starts_with("data: {\"choices\":[{"))
        .count()
}

fn marker_act(r: &Received, table: &[(&str, Act)]) -> Act {
    let text = format!("{}{}", String::from_utf8_lossy(&r.head), r.body_text());
    table
        .iter()
        .find(|(m, _)| text.contains(&format!("marker {m} ")) || text.contains(&format!(": {m}\r")))
        .map(|(_, a)| a.clone())
        .unwrap_or(Act::Json)
}

// ---------------------------------------------------------------------------------------
// The upstream refuses, resets or closes before answering
// ---------------------------------------------------------------------------------------

/// Nothing listens at the upstream's port; an upstream that accepts and resets at once; one
/// that reads the request and closes without a byte; one that reads it and resets. The client
/// gets a 502 each time, the upstream got each request at most once (the request was written,
/// so it is never sent again), and each has one `upstream_error` row without a status.
#[test]
fn upstream_refused_reset_or_closed_before_the_head_is_a_502_once() {
    // Refused: nothing listening.
    let cap = Capture::start("refused", &format!("http://{}", free_addr()), &[]);
    let got = cap.send(&gen("/v1/completions", "refused-a", true, &[]));
    let rows = cap.stop();
    assert_eq!(got.statuses(), vec![502], "{}", got.text());
    assert!(
        got.first().text().contains("upstream_error"),
        "{}",
        got.text()
    );
    let r = row(&rows, "refused-a");
    assert_eq!(
        (r.outcome, r.status),
        (Outcome::UpstreamError, None),
        "{r:?}"
    );
    assert!(r.error.as_deref().unwrap_or("").contains("onnect"), "{r:?}");

    // Accepted, then closed or reset before a byte of response.
    let up = FaultUpstream::start(|r| {
        marker_act(
            r,
            &[
                ("closed-b", Act::CloseBeforeHead),
                ("reset-c", Act::ResetBeforeHead),
            ],
        )
    });
    let cap = Capture::start("closed", &up.url(), &[]);
    let b = cap.send(&gen("/v1/completions", "closed-b", true, &[]));
    let c = cap.send(&gen("/v1/chat/completions", "reset-c", false, &[]));
    let rows = cap.stop();
    for (m, got) in [("closed-b", &b), ("reset-c", &c)] {
        assert_eq!(got.statuses(), vec![502], "{m}: {}", got.text());
        assert_eq!(
            up.count(m),
            1,
            "{m} reached the upstream {} times",
            up.count(m)
        );
        let r = row(&rows, m);
        assert_eq!(
            (r.outcome, r.status),
            (Outcome::UpstreamError, None),
            "{r:?}"
        );
    }
    assert_eq!(up.received().len(), 2, "{:#?}", up.received());
}

// ---------------------------------------------------------------------------------------
// Broken and stalled streams
// ---------------------------------------------------------------------------------------

/// The upstream resets the connection after the head and three events: the client gets the
/// 200 and the three events, then the connection ends without the chunked body's end (the
/// cut is visible, never a clean end); the upstream got the request once; the row is
/// `upstream_error` with status 200 and the three chunks.
#[test]
fn reset_mid_stream_cuts_the_client_and_records_the_chunks_seen() {
    let up = FaultUpstream::always(Act::ResetAfter { events: 3 });
    let cap = Capture::start("reset-mid", &up.url(), &[]);
    let got = cap.send(&gen("/v1/completions", "midreset", true, &[]));
    let rows = cap.stop();
    let resp = got.first();
    assert_eq!(resp.status, 200);
    assert!(
        !resp.complete,
        "a cut stream must not end cleanly: {}",
        got.text()
    );
    assert_eq!(data_events(&resp.body), 3, "{}", resp.text());
    assert_ne!(got.end, "timeout");
    assert_eq!(up.count("midreset"), 1);
    let r = row(&rows, "midreset");
    assert_eq!(
        (r.outcome, r.status),
        (Outcome::UpstreamError, Some(200)),
        "{r:?}"
    );
    assert_eq!(r.chunk_times_us.len(), 3, "{r:?}");
    assert!(
        r.error.as_deref().unwrap_or("").contains("upstream body"),
        "{r:?}"
    );
}

/// The upstream reads the request and says nothing: after `--upstream-timeout` the client
/// gets 504, the upstream got the request once and sees its connection closed (capture does
/// not keep a dead request's socket), and the row is `timeout`.
#[test]
fn stall_before_headers_is_a_504_after_the_upstream_timeout() {
    let up = FaultUpstream::always(Act::StallBeforeHead);
    let cap = Capture::start("stall-head", &up.url(), &["--upstream-timeout", "400ms"]);
    let t = Instant::now();
    let got = cap.send(&gen("/v1/completions", "stallhead", true, &[]));
    let took = t.elapsed();
    let closed = up.wait_answer("stallhead", Duration::from_secs(3), |a| a.peer_closed);
    let rows = cap.stop();
    assert_eq!(got.statuses(), vec![504], "{}", got.text());
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(up.count("stallhead"), 1);
    assert!(
        closed.is_some(),
        "capture kept the stalled upstream connection open"
    );
    let r = row(&rows, "stallhead");
    assert_eq!(r.outcome, Outcome::Timeout, "{r:?}");
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("no response headers"),
        "{r:?}"
    );
}

/// The upstream sends the head and two events, then nothing: after `--idle-timeout` the
/// client's stream is cut (no clean end), the upstream got the request once and sees the
/// connection closed, and the row is `timeout` with status 200 and the two chunks.
#[test]
fn stall_mid_body_is_cut_after_the_idle_timeout() {
    let up = FaultUpstream::always(Act::StallAfter { events: 2 });
    let cap = Capture::start("stall-body", &up.url(), &["--idle-timeout", "400ms"]);
    let got = cap.send(&gen("/v1/chat/completions", "stallbody", true, &[]));
    let closed = up.wait_answer("stallbody", Duration::from_secs(3), |a| a.peer_closed);
    let rows = cap.stop();
    let resp = got.first();
    assert_eq!(resp.status, 200);
    assert!(!resp.complete, "{}", got.text());
    assert_eq!(data_events(&resp.body), 2, "{}", resp.text());
    assert_ne!(
        got.end, "timeout",
        "the client's connection was left hanging"
    );
    assert_eq!(up.count("stallbody"), 1);
    assert!(
        closed.is_some(),
        "capture kept the stalled upstream connection open"
    );
    let r = row(&rows, "stallbody");
    assert_eq!(
        (r.outcome, r.status),
        (Outcome::Timeout, Some(200)),
        "{r:?}"
    );
    assert_eq!(r.chunk_times_us.len(), 2, "{r:?}");
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("no data from the upstream"),
        "{r:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Error statuses
// ---------------------------------------------------------------------------------------

/// 429 and 503 with Retry-After reach the client as sent (status, Retry-After, body), the
/// upstream gets each request exactly once (capture never retries), and each row is
/// `http_error` with the status and the upstream's message.
#[test]
fn status_429_and_503_with_retry_after_pass_through_once() {
    let up = FaultUpstream::start(|r| {
        marker_act(
            r,
            &[
                (
                    "limited",
                    Act::Status {
                        code: 429,
                        headers: vec!["retry-after: 7".into()],
                    },
                ),
                (
                    "unavail",
                    Act::Status {
                        code: 503,
                        headers: vec!["retry-after: 2".into()],
                    },
                ),
            ],
        )
    });
    let cap = Capture::start("status", &up.url(), &[]);
    let a = cap.send(&gen("/v1/completions", "limited", true, &[]));
    let b = cap.send(&gen("/v1/chat/completions", "unavail", false, &[]));
    let rows = cap.stop();
    for (m, got, code, after) in [("limited", &a, 429, "7"), ("unavail", &b, 503, "2")] {
        let resp = got.first();
        assert_eq!(got.statuses(), vec![code], "{m}: {}", got.text());
        assert_eq!(
            resp.header("retry-after"),
            Some(after),
            "{m}: {:?}",
            resp.headers
        );
        assert!(resp.complete);
        assert!(
            resp.text().contains(&format!("upstream says {code}")),
            "{}",
            resp.text()
        );
        assert_eq!(up.count(m), 1, "{m}: capture retried");
        let r = row(&rows, m);
        assert_eq!(
            (r.outcome, r.status),
            (Outcome::HttpError, Some(code)),
            "{r:?}"
        );
        assert!(
            r.error
                .as_deref()
                .unwrap_or("")
                .contains(&format!("upstream says {code}")),
            "{r:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Malformed and non-UTF-8 SSE
// ---------------------------------------------------------------------------------------

/// A streamed response head, chunked.
fn sse_head() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        .to_vec()
}

/// The malformed SSE body, as the events the upstream writes (each one HTTP chunk).
fn malformed_events() -> Vec<Vec<u8>> {
    vec![
        b"data: {\"choices\":[{\"index\":0,\"text\":\" a\"}]}\n\n".to_vec(),
        b"data: {not json at all\n\n".to_vec(),
        b": a comment\n\n".to_vec(),
        b"event: weird\nid: 7\nretry: x\ndata: plain text\n\n".to_vec(),
        b"garbage line without a colon\n\n".to_vec(),
        b"data: {\"choices\":[{\"index\":0,\"text\":\" b\"}]}\r\n\r\n".to_vec(),
        // One event split over two HTTP chunks, in the middle of its JSON.
        b"data: {\"choices\":[{\"ind".to_vec(),
        b"ex\":0,\"text\":\" c\"}]}\n\n".to_vec(),
        b"data: {\"choices\":[{\"index\":0,\"text\":\" d\"}]}\r\r".to_vec(),
        b"data:\n\n".to_vec(),
        b"data: {\"error\":\"not really\"\n\n".to_vec(),
        b"data: [DONE]\n\n".to_vec(),
    ]
}

fn non_utf8_events() -> Vec<Vec<u8>> {
    vec![
        b"data: {\"choices\":[{\"index\":0,\"text\":\" a\"}]}\n\n".to_vec(),
        b"data: {\"choices\":[{\"index\":0,\"text\":\"\xff\xfe\xc3\x28\"}]}\n\n".to_vec(),
        b": \xc0\xaf comment\n\n".to_vec(),
        b"\xef\xbb\xbfdata: {\"choices\":[{\"index\":0,\"text\":\" bom\"}]}\n\n".to_vec(),
        b"da\xffta: x\n\n".to_vec(),
        b"data: {\"choices\":[{\"index\":0,\"text\":\" b\"}]}\n\n".to_vec(),
        b"data: [DONE]\n\n".to_vec(),
    ]
}

fn raw_sse(events: &[Vec<u8>], terminal: bool) -> Vec<u8> {
    let mut v = sse_head();
    for e in events {
        v.extend(chunk(e));
    }
    if terminal {
        v.extend_from_slice(b"0\r\n\r\n");
    }
    v
}

/// Malformed SSE (invalid JSON, comments, unknown fields, a line without a colon, CRLF and
/// CR line ends, an event split mid-JSON across reads, an empty data line) and non-UTF-8 SSE
/// (invalid bytes in a chunk's text, a comment and a field name, a BOM) reach the client byte
/// for byte; each request reaches the upstream once; the rows are `ok` with exactly the
/// well-formed output chunks. A stream whose framing ends cleanly without `[DONE]` is whole
/// for the client, and its row says `upstream_error`. Capture keeps serving afterwards.
#[test]
fn malformed_and_non_utf8_sse_pass_through_byte_for_byte() {
    let up = FaultUpstream::start(|r| {
        marker_act(
            r,
            &[
                ("badsse", Act::Raw(raw_sse(&malformed_events(), true))),
                ("nonutf8", Act::Raw(raw_sse(&non_utf8_events(), true))),
                ("nodone", Act::Raw(raw_sse(&malformed_events()[..1], true))),
            ],
        )
    });
    // Usage injection is on (the default): the events pass the stripping observer, and none
    // is a usage event, so the client must get exactly the upstream's bytes.
    let cap = Capture::start("sse", &up.url(), &[]);
    let bad = cap.send(&gen("/v1/completions", "badsse", true, &[]));
    let non = cap.send(&gen("/v1/completions", "nonutf8", true, &[]));
    let nodone = cap.send(&gen("/v1/completions", "nodone", true, &[]));
    let after = cap.send(&gen("/v1/completions", "afterwards", false, &[]));
    let rows = cap.stop();

    for (m, got, events, chunks) in [
        ("badsse", &bad, malformed_events(), 4),
        ("nonutf8", &non, non_utf8_events(), 2),
    ] {
        let resp = got.first();
        assert_eq!(resp.status, 200, "{m}");
        assert!(resp.complete, "{m}: {}", got.text());
        assert_eq!(resp.body, events.concat(), "{m}: the client's bytes differ");
        assert_eq!(up.count(m), 1, "{m}");
        let r = row(&rows, m);
        assert_eq!(
            (r.outcome, r.status),
            (Outcome::Ok, Some(200)),
            "{m}: {r:?}"
        );
        assert_eq!(r.chunk_times_us.len(), chunks, "{m}: {r:?}");
        assert_eq!(r.response_bytes as usize, resp.body.len(), "{m}: {r:?}");
    }
    let resp = nodone.first();
    assert_eq!((resp.status, resp.complete), (200, true));
    assert_eq!(resp.body, malformed_events()[0]);
    assert_eq!(up.count("nodone"), 1);
    let r = row(&rows, "nodone");
    assert_eq!(
        (r.outcome, r.status),
        (Outcome::UpstreamError, Some(200)),
        "{r:?}"
    );
    assert!(
        r.error.as_deref().unwrap_or("").contains("without [DONE]"),
        "{r:?}"
    );
    assert_eq!(after.statuses(), vec![200]);
    assert_eq!(row(&rows, "afterwards").outcome, Outcome::Ok);
}

/// A 2xx that is not what was asked for (an HTML page from a gateway; JSON for a streamed
/// request) reaches the client byte for byte, and its row is the server's failure with the
/// error replay gives the same response (`wire::response_verdict`): capture recorded `ok`, so the
/// request read `ok` in the capture and `upstream_error` in its replay, which `fidelity`
/// called drift. An HTTP error's row has the E2EL of its end, as replay's has.
#[test]
fn a_2xx_that_is_not_what_was_asked_for_is_recorded_as_replay_judges_it() {
    let json = br#"{"choices":[{"text":"x"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
    let whole = |ctype: &str, body: &[u8]| {
        let mut v = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        v.extend_from_slice(body);
        v
    };
    let html = whole("text/html", b"<html>bad gateway</html>");
    let as_json = whole("application/json", json);
    let (h, j) = (html.clone(), as_json.clone());
    let up = FaultUpstream::start(move |r| {
        marker_act(
            r,
            &[
                ("html200", Act::Raw(h.clone())),
                ("jsonforstream", Act::Raw(j.clone())),
                (
                    "busy",
                    Act::Status {
                        code: 503,
                        headers: vec![],
                    },
                ),
            ],
        )
    });
    let cap = Capture::start("bodies", &up.url(), &[]);
    let got_html = cap.send(&gen("/v1/completions", "html200", false, &[]));
    let got_json = cap.send(&gen("/v1/completions", "jsonforstream", true, &[]));
    let got_busy = cap.send(&gen("/v1/completions", "busy", false, &[]));
    let rows = cap.stop();

    for (m, got, sent, error) in [
        ("html200", &got_html, &html, "response is not JSON"),
        (
            "jsonforstream",
            &got_json,
            &as_json,
            "streamed request answered without text/event-stream",
        ),
    ] {
        let resp = got.first();
        assert_eq!((resp.status, resp.complete), (200, true), "{m}");
        let body_at = sent.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(resp.body, sent[body_at..], "{m}: the client's bytes differ");
        assert_eq!(up.count(m), 1, "{m}");
        let r = row(&rows, m);
        assert_eq!(
            (r.outcome, r.status, r.error.as_deref(), r.e2el_us),
            (Outcome::UpstreamError, Some(200), Some(error), None),
            "{m}: {r:?}"
        );
    }
    assert_eq!(got_busy.statuses(), vec![503]);
    let r = row(&rows, "busy");
    assert_eq!(r.outcome, Outcome::HttpError, "{r:?}");
    assert!(r.e2el_us.is_some_and(|e| e >= 0), "{r:?}");
}

// ---------------------------------------------------------------------------------------
// Client disconnect
// ---------------------------------------------------------------------------------------

/// The client reads the head and three events of a long stream and closes: capture closes
/// the upstream connection (the upstream's next write fails, so the generation stops there),
/// the upstream got the request once, and the row is `client_cancelled` with status 200 and
/// the chunks passed on before the close.
#[test]
fn client_disconnect_mid_stream_reaches_the_upstream_and_is_recorded() {
    use std::io::{Read, Write};
    let up = FaultUpstream::always(Act::Stream {
        events: 400,
        gap: Duration::from_millis(10),
    });
    let cap = Capture::start("disconnect", &up.url(), &[]);
    let mut s = std::net::TcpStream::connect(cap.addr).unwrap();
    s.write_all(&gen("/v1/completions", "leaver", true, &[]))
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let events = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .matches("data: {\"choices\":[{")
            .count()
    };
    while events(&seen) < 3 {
        let n = s.read(&mut buf).expect("stream");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    drop(s);
    let gone = up.wait_answer("leaver", Duration::from_secs(5), |a| a.write_failed);
    let rows = cap.stop();
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    assert_eq!(up.count("leaver"), 1);
    let gone = gone.expect("the upstream never saw the client's disconnect");
    assert!(gone.events_written < 400, "{gone:?}");
    let r = row(&rows, "leaver");
    assert_eq!(
        (r.outcome, r.status),
        (Outcome::ClientCancelled, Some(200)),
        "{r:?}"
    );
    assert!(
        r.chunk_times_us.len() >= 3 && r.chunk_times_us.len() <= gone.events_written,
        "{r:?} vs {gone:?}"
    );
    assert_eq!(r.error.as_deref(), Some("client disconnected"), "{r:?}");
}

// ---------------------------------------------------------------------------------------
// Request smuggling
// ---------------------------------------------------------------------------------------

/// A request smuggled behind another. Capture may refuse the message or parse the bytes
/// after its body as a request of its own, but the upstream must never see more requests
/// than the client got answers for, nor bytes that are not a request, nor any framing but
/// capture's own (one content-length that is the body's length, or chunked alone).
fn assert_no_desync(name: &str, got: &RawReply, received: &[Received]) {
    let forwarded = received.len();
    let answered = got.responses.len();
    assert!(
        received.iter().all(|r| r.method != "<unparsable>"),
        "{name}: the upstream got bytes that are not a request: {received:#?}"
    );
    assert!(
        forwarded <= answered,
        "{name}: the upstream got {forwarded} requests, the client {answered} answers ({:?}): {received:#?}",
        got.statuses()
    );
    for r in received {
        let cls: Vec<_> = r
            .headers
            .iter()
            .filter(|(k, _)| k == "content-length")
            .collect();
        // Capture's own framing: one content-length, or chunked (hyper's client on the
        // pass-through path) without one; never the client's two.
        let te = r
            .headers
            .iter()
            .filter(|(k, _)| k == "transfer-encoding")
            .count();
        assert!(
            cls.len() + te <= 1,
            "{name}: framing passed through: {:?}",
            r.headers
        );
        if let Some((_, v)) = cls.first() {
            assert_eq!(v.parse::<usize>().ok(), Some(r.body.len()), "{name}: {r:?}");
        }
    }
}

/// CL+TE in both orders (the classic CL.TE and TE.CL desyncs), on a generation path and on
/// a pass-through path, each with a second request hidden where one reading of the framing
/// puts it in the body and the other after it. The listener reads transfer-encoding and
/// ignores content-length (RFC 9112 §6.3), and closes the connection after the answer:
/// - CL.TE (the body is chunked, the smuggled request after its last chunk): the first
///   request is served once, with capture's own content-length; the smuggled bytes are
///   never read as a request (one answer, and the upstream never sees them);
/// - TE.CL (the body is not chunked at all): a bad body, refused (400 on the generation
///   path, whose row says so; 502 on the pass-through path, whose upstream request fails
///   before a whole request is sent), and nothing reaches the upstream. The generation
///   request's row is `http_error` 400, as its client saw.
#[test]
fn smuggling_cl_te_never_desyncs_the_upstream() {
    let up = FaultUpstream::always(Act::Json);
    let cap = Capture::start("smuggle-clte", &up.url(), &[]);
    let smuggled =
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40\r\nx-marker: smuggled\r\n\r\n{\"prompt\":\"marker smuggled \",\"x\":123456}";
    assert_eq!(smuggled.split("\r\n\r\n").nth(1).unwrap().len(), 40);
    // (name, marker, request, the body the upstream must get if any, the client's status)
    let mut cases = Vec::new();
    for (path, gen_path) in [("/v1/completions", true), ("/v1/moderations", false)] {
        let m = format!("clte{}", cases.len());
        let json = gen_body(path, &m, false);
        let te_body = format!("{:x}\r\n{json}\r\n0\r\n\r\n{smuggled}", json.len());
        cases.push((
            format!("CL.TE {path}"),
            m.clone(),
            format!(
                "POST {path} HTTP/1.1\r\nhost: capture\r\ncontent-length: {}\r\ntransfer-encoding: chunked\r\nx-marker: {m}\r\n\r\n{te_body}",
                te_body.len()
            ),
            Some(json.clone()),
            200,
        ));
        let m = format!("tecl{}", cases.len());
        let json = gen_body(path, &m, false);
        cases.push((
            format!("TE.CL {path}"),
            m.clone(),
            format!(
                "POST {path} HTTP/1.1\r\nhost: capture\r\ntransfer-encoding: chunked\r\ncontent-length: {}\r\nx-marker: {m}\r\n\r\n{json}{smuggled}",
                json.len()
            ),
            None,
            if gen_path { 400 } else { 502 },
        ));
    }
    let mut results = Vec::new();
    for (name, m, req, body, status) in &cases {
        let before = up.received().len();
        let got = cap.send(req.as_bytes());
        // Only this case's requests.
        let received: Vec<_> = up.received().split_off(before);
        results.push((
            name.clone(),
            m.clone(),
            got,
            received,
            body.clone(),
            *status,
        ));
    }
    let rows = cap.stop();
    let table: String = results
        .iter()
        .map(|(name, _, got, received, _, _)| {
            format!(
                "\n  {name}: client {:?}, upstream {:?}",
                got.statuses(),
                received
                    .iter()
                    .map(|r| (&r.method, &r.target, r.body.len()))
                    .collect::<Vec<_>>()
            )
        })
        .collect();
    eprintln!("smuggling CL+TE:{table}");
    for (name, m, got, received, body, status) in &results {
        assert_no_desync(name, got, received);
        assert_eq!(got.statuses(), vec![*status], "{name}: {table}");
        match body {
            Some(b) => {
                assert_eq!(received.len(), 1, "{name}: {table}");
                assert_eq!(received[0].body_text(), *b, "{name}");
            }
            None => assert!(received.is_empty(), "{name}: {table}"),
        }
        let mine: Vec<_> = rows
            .iter()
            .filter(|r| r.session_id.as_deref() == Some(m.as_str()))
            .collect();
        match (name.contains("completions"), body.is_some()) {
            (true, true) => assert!(
                matches!(mine[..], [r] if r.outcome == Outcome::Ok),
                "{name}: {mine:?}"
            ),
            // The client got a 400 for a body that breaks its framing: the row says so
            // (before, it said `client_cancelled`, as if the client had gone away).
            (true, false) => assert!(
                matches!(mine[..], [r] if r.outcome == Outcome::HttpError && r.status == Some(400)
                    && r.error.as_deref().unwrap_or("").contains("malformed request body")),
                "{name}: {mine:?}"
            ),
            (false, _) => assert!(mine.is_empty(), "{name}: pass-through has no row: {mine:?}"),
        }
    }
    assert_eq!(up.count("smuggled"), 0, "{:#?}", up.received());
    no_row(&rows, "smuggled");
}

/// A client that sends half its request body and goes away: nothing reaches the upstream
/// (a generation request is read whole first), and the row is `client_cancelled`, unlike a
/// body that breaks its framing (above).
#[test]
fn client_gone_mid_request_body_is_client_cancelled() {
    use std::io::Write;
    let up = FaultUpstream::always(Act::Json);
    let cap = Capture::start("half-body", &up.url(), &[]);
    let body = gen_body("/v1/completions", "halfbody", false);
    let mut s = std::net::TcpStream::connect(cap.addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: capture\r\nx-marker: halfbody\r\ncontent-length: {}\r\n\r\n{}",
        body.len() + 100,
        body
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(s);
    std::thread::sleep(Duration::from_millis(100));
    let rows = cap.stop();
    assert_eq!(up.received().len(), 0, "{:#?}", up.received());
    let r = row(&rows, "halfbody");
    assert_eq!(
        (r.outcome, r.status),
        (Outcome::ClientCancelled, None),
        "{r:?}"
    );
    assert!(
        r.error.as_deref().unwrap_or("").contains("request body"),
        "{r:?}"
    );
}

/// Malformed framing the listener must refuse with 400 before anything reaches the
/// upstream: two different content-lengths, a list of them, obs-fold (in an ordinary field
/// and in content-length), a transfer-encoding whose last coding is not chunked, a space
/// before the colon, a bare LF inside a field, a negative or signed length.
#[test]
fn smuggling_malformed_framing_is_refused_before_the_upstream() {
    let up = FaultUpstream::always(Act::Json);
    let cap = Capture::start("smuggle-bad", &up.url(), &[]);
    let body = gen_body("/v1/completions", "framing", false);
    let n = body.len();
    let heads = [
        (
            "duplicate CL",
            format!("content-length: {n}\r\ncontent-length: {}", n + 30),
        ),
        ("CL list", format!("content-length: {n}, {}", n + 30)),
        (
            "obs-fold",
            format!("content-length: {n}\r\nx-folded: a\r\n  b"),
        ),
        ("obs-fold CL", format!("content-length:\r\n {n}")),
        (
            "TE not chunked last",
            format!("content-length: {n}\r\ntransfer-encoding: chunked, identity"),
        ),
        (
            "TE unknown",
            format!("content-length: {n}\r\ntransfer-encoding: xchunked"),
        ),
        ("space before colon", format!("content-length : {n}")),
        ("signed CL", format!("content-length: +{n}")),
        ("negative CL", "content-length: -1".to_string()),
    ];
    let mut results = Vec::new();
    for (name, h) in &heads {
        let before = up.received().len();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: capture\r\nx-marker: framing\r\n{h}\r\n\r\n{body}"
        );
        let got = cap.send(req.as_bytes());
        let received = up.received().split_off(before);
        results.push((*name, got, received));
    }
    let rows = cap.stop();
    let table: String = results
        .iter()
        .map(|(name, got, rec)| {
            format!(
                "\n  {name}: client {:?}, upstream {}",
                got.statuses(),
                rec.len()
            )
        })
        .collect();
    eprintln!("malformed framing:{table}");
    for (name, got, received) in &results {
        assert_eq!(got.statuses(), vec![400], "{name}: {table}");
        assert!(
            received.is_empty(),
            "{name} reached the upstream: {received:#?}"
        );
    }
    no_row(&rows, "framing");
    // Two equal content-lengths are one length (RFC 9110 §8.6): served once, one field on.
    let cap = Capture::start("smuggle-samecl", &up.url(), &[]);
    let n = gen_body("/v1/completions", "samecl", false).len();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: capture\r\nx-marker: samecl\r\nconnection: close\r\ncontent-length: {n}\r\ncontent-length: {n}\r\n\r\n{}",
        gen_body("/v1/completions", "samecl", false)
    );
    let got = cap.send(req.as_bytes());
    let rows = cap.stop();
    assert_eq!(got.statuses(), vec![200], "{} ({})", got.text(), got.end);
    assert_eq!(up.count("samecl"), 1);
    let r = up
        .received()
        .into_iter()
        .find(|r| r.body_text().contains("samecl"))
        .unwrap();
    assert_eq!(
        r.headers
            .iter()
            .filter(|(k, _)| k == "content-length")
            .count(),
        1,
        "{:?}",
        r.headers
    );
    assert_eq!(row(&rows, "samecl").outcome, Outcome::Ok);
}

// ---------------------------------------------------------------------------------------
// Absolute-form targets and CONNECT
// ---------------------------------------------------------------------------------------

/// Only the configured upstream is ever reached: absolute-form requests for another host
/// (pass-through and generation) get 400, CONNECT gets 405 (and the bytes after it are not
/// tunnelled), a Host header naming another host is ignored for routing (the upstream gets
/// its own host); the decoy host never sees a connection. Absolute-form for capture's own
/// address is served. Only the forwarded generation requests have rows.
#[test]
fn absolute_form_and_connect_never_reach_another_host() {
    let up = FaultUpstream::always(Act::Json);
    let decoy = FaultUpstream::always(Act::Json);
    let cap = Capture::start("absolute", &up.url(), &[]);
    let d = decoy.addr;
    let own = cap.addr;
    let body = gen_body("/v1/completions", "abs-gen", false);
    let foreign_gen = format!(
        "POST http://{d}/v1/completions HTTP/1.1\r\nhost: {d}\r\nx-marker: abs-gen\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let foreign_get =
        format!("GET http://{d}/v1/models HTTP/1.1\r\nhost: {d}\r\nx-marker: abs-get\r\nconnection: close\r\n\r\n");
    let foreign_https =
        format!("GET https://{d}/v1/models HTTP/1.1\r\nhost: {d}\r\nconnection: close\r\n\r\n");
    let connect = format!(
        "CONNECT {d} HTTP/1.1\r\nhost: {d}\r\n\r\nGET /tunnelled HTTP/1.1\r\nhost: {d}\r\nconnection: close\r\n\r\n"
    );
    let host_only = gen("/v1/completions", "host-only", false, &[]);
    let host_only = String::from_utf8(host_only)
        .unwrap()
        .replace("host: capture", &format!("host: {d}"));
    let body2 = gen_body("/v1/completions", "abs-own", false);
    let own_gen = format!(
        "POST http://{own}/v1/completions HTTP/1.1\r\nhost: {own}\r\nx-marker: abs-own\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body2}",
        body2.len()
    );
    let g1 = cap.send(foreign_gen.as_bytes());
    let g2 = cap.send(foreign_get.as_bytes());
    let g3 = cap.send(foreign_https.as_bytes());
    let g4 = cap.send(connect.as_bytes());
    let g5 = cap.send(host_only.as_bytes());
    let g6 = cap.send(own_gen.as_bytes());
    let rows = cap.stop();
    eprintln!(
        "absolute-form/CONNECT: client {:?} {:?} {:?} {:?} {:?} {:?} ({} {} {} {}); upstream {:?}",
        g1.statuses(),
        g2.statuses(),
        g3.statuses(),
        g4.statuses(),
        g5.statuses(),
        g6.statuses(),
        g1.end,
        g2.end,
        g3.end,
        g4.end,
        up.received()
            .iter()
            .map(|r| (&r.method, &r.target))
            .collect::<Vec<_>>()
    );
    assert_eq!(g1.statuses().first(), Some(&400), "{}", g1.text());
    assert_eq!(g2.statuses().first(), Some(&400), "{}", g2.text());
    assert_eq!(g3.statuses().first(), Some(&400), "{}", g3.text());
    // CONNECT is refused and nothing is tunnelled: the bytes after it are the next request
    // on the connection, served like any other by the configured upstream.
    assert_eq!(g4.statuses(), vec![405, 200], "{}", g4.text());
    assert_eq!(
        up.received()
            .iter()
            .filter(|r| r.target == "/tunnelled")
            .count(),
        1
    );
    assert_eq!(g5.statuses(), vec![200], "{}", g5.text());
    assert_eq!(g6.statuses(), vec![200], "{}", g6.text());
    assert_eq!(
        decoy.connections(),
        0,
        "the decoy was reached: {:#?}",
        decoy.received()
    );
    assert_eq!(
        up.count("abs-gen") + up.count("abs-get"),
        0,
        "{:#?}",
        up.received()
    );
    assert_eq!(up.count("host-only"), 1);
    assert_eq!(up.count("abs-own"), 1);
    // Whatever followed the CONNECT went to the configured upstream or nowhere.
    for r in up.received() {
        assert_eq!(
            r.header("host"),
            Some(up.addr.to_string().as_str()),
            "{r:?}"
        );
        assert!(r.target.starts_with('/'), "{r:?}");
    }
    no_row(&rows, "abs-gen");
    assert_eq!(row(&rows, "host-only").outcome, Outcome::Ok);
    assert_eq!(row(&rows, "abs-own").outcome, Outcome::Ok);
    assert_eq!(rows.len(), 2, "{rows:#?}");
}

/// The same over HTTP/2 (prior knowledge): an h2 request always carries an authority, and
/// capture never routes by it, so a request for another host goes to the configured
/// upstream (with the upstream's own Host) and the decoy sees no connection; CONNECT is 405.
#[test]
fn h2_authority_and_connect_never_reach_another_host() {
    use http_body_util::{BodyExt, Full};
    let up = FaultUpstream::always(Act::Json);
    let decoy = FaultUpstream::always(Act::Json);
    let cap = Capture::start("h2-authority", &up.url(), &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (get, generation, connect) = rt.block_on(async {
        // Dial capture; every request names the decoy as its :authority.
        let d = decoy.addr;
        let io = tokio::net::TcpStream::connect(cap.addr).await.unwrap();
        let (mut tx, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(io),
        )
        .await
        .expect("h2 handshake");
        tokio::spawn(conn);
        let get = hyper::Request::get(format!("http://{d}/v1/models"))
            .header("x-marker", "h2get")
            .body(Full::default())
            .unwrap();
        let r = tx.send_request(get).await.expect("h2 get");
        let get = (
            r.status().as_u16(),
            r.into_body().collect().await.unwrap().to_bytes(),
        );
        let post = hyper::Request::post(format!("http://{d}/v1/completions"))
            .header("x-marker", "h2gen")
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(gen_body(
                "/v1/completions",
                "h2gen",
                false,
            ))))
            .unwrap();
        let r = tx.send_request(post).await.expect("h2 post");
        let generation = (
            r.status().as_u16(),
            r.into_body().collect().await.unwrap().to_bytes(),
        );
        let connect = hyper::Request::connect(d.to_string())
            .body(Full::default())
            .unwrap();
        let connect = match tx.send_request(connect).await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        (get, generation, connect)
    });
    drop(rt); // closes the h2 connection (its task lives on this runtime)
    let rows = cap.stop();
    assert_eq!(get.0, 200, "{:?}", get.1);
    assert_eq!(generation.0, 200, "{:?}", generation.1);
    assert_eq!(connect, 405);
    assert_eq!(
        decoy.connections(),
        0,
        "the decoy was reached: {:#?}",
        decoy.received()
    );
    assert_eq!(up.count("h2get"), 1);
    assert_eq!(up.count("h2gen"), 1);
    for r in up.received() {
        assert_eq!(
            r.header("host"),
            Some(up.addr.to_string().as_str()),
            "{r:?}"
        );
    }
    assert_eq!(row(&rows, "h2gen").outcome, Outcome::Ok);
    assert_eq!(rows.len(), 1, "{rows:#?}");
}

// ---------------------------------------------------------------------------------------
// Hop-by-hop headers
// ---------------------------------------------------------------------------------------

/// Hop-by-hop fields (RFC 9110 §7.6.1), and the fields `Connection` names, are not
/// forwarded in either direction, on the generation path and on the pass-through path;
/// end-to-end fields are. Each request reaches the upstream once and the generation one is
/// recorded `ok`.
#[test]
fn hop_by_hop_headers_are_dropped_both_ways() {
    let resp_head = "x-up-hop: 1\r\nconnection: x-up-hop\r\nkeep-alive: timeout=5\r\nproxy-authenticate: Basic\r\nupgrade: foo\r\nx-end-to-end: kept";
    let stream = {
        let mut v = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n{resp_head}\r\n\r\n"
        )
        .into_bytes();
        v.extend(chunk(
            b"data: {\"choices\":[{\"index\":0,\"text\":\" a\"}]}\n\n",
        ));
        v.extend(chunk(b"data: [DONE]\n\n"));
        v.extend_from_slice(b"0\r\n\r\n");
        v
    };
    let json = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n{resp_head}\r\n\r\n{{}}"
    )
    .into_bytes();
    let up = FaultUpstream::start(move |r| {
        if r.method == "POST" && r.target.ends_with("completions") {
            Act::Raw(stream.clone())
        } else {
            Act::Raw(json.clone())
        }
    });
    let cap = Capture::start("hop", &up.url(), &[]);
    let hop = [
        "connection: keep-alive, x-drop-me, close",
        "x-drop-me: 1",
        "keep-alive: timeout=5",
        "proxy-connection: keep-alive",
        "te: trailers",
        "trailer: x-t",
        "upgrade: websocket",
        "proxy-authorization: Basic c2VjcmV0",
        "x-end-to-end: kept",
    ];
    let mut g = String::from_utf8(gen("/v1/completions", "hopgen", true, &[])).unwrap();
    g = g.replace(
        "connection: close\r\n",
        &format!("{}\r\n", hop.join("\r\n")),
    );
    let p = format!(
        "GET /v1/models HTTP/1.1\r\nhost: capture\r\nx-marker: hoppass\r\n{}\r\n\r\n",
        hop.join("\r\n")
    );
    let a = cap.send(g.as_bytes());
    let b = cap.send(p.as_bytes());
    let rows = cap.stop();
    let dropped_req = [
        "connection",
        "x-drop-me",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "transfer-encoding",
    ];
    let dropped_resp = ["x-up-hop", "keep-alive", "proxy-authenticate", "upgrade"];
    for (m, got) in [("hopgen", &a), ("hoppass", &b)] {
        let resp = got.first();
        assert_eq!(resp.status, 200, "{m}: {}", got.text());
        assert!(resp.complete, "{m}");
        for h in dropped_resp {
            assert!(
                resp.header(h).is_none(),
                "{m}: {h} reached the client: {:?}",
                resp.headers
            );
        }
        assert_eq!(
            resp.header("x-end-to-end"),
            Some("kept"),
            "{m}: {:?}",
            resp.headers
        );
        assert_eq!(up.count(m), 1, "{m}");
        let r = up
            .received()
            .into_iter()
            .find(|r| support::fault_upstream::contains(&r.head, m) || r.body_text().contains(m))
            .unwrap();
        for h in dropped_req {
            assert!(
                r.header(h).is_none(),
                "{m}: {h} reached the upstream: {:?}",
                r.headers
            );
        }
        assert_eq!(
            r.header("x-end-to-end"),
            Some("kept"),
            "{m}: {:?}",
            r.headers
        );
    }
    assert_eq!(data_events(&a.first().body), 1);
    let r = row(&rows, "hopgen");
    assert_eq!(
        (r.outcome, r.chunk_times_us.len()),
        (Outcome::Ok, 1),
        "{r:?}"
    );
    no_row(&rows, "hoppass");
}

// ---------------------------------------------------------------------------------------
// Oversize headers and bodies
// ---------------------------------------------------------------------------------------

/// A 1 MiB header field and 200 header fields are refused by the listener (431) before the
/// upstream; a generation body over `--max-request-body-mb` (content-length or chunked) is a
/// 413 with an `http_error` row and never reaches the upstream; a 1 MiB upstream response
/// head (the limit is 400 KiB) is a 502 with an `upstream_error` row, the request having reached the
/// upstream once.
#[test]
fn oversize_headers_and_bodies_are_refused_and_recorded() {
    let big_head = {
        let mut v =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nx-big: "
                .to_vec();
        v.extend(std::iter::repeat_n(b'a', 1 << 20));
        v.extend_from_slice(b"\r\n\r\n{}");
        v
    };
    let up = FaultUpstream::start(move |r| {
        marker_act(r, &[("bighead", Act::RawThenClose(big_head.clone()))])
    });
    let cap = Capture::start("oversize", &up.url(), &["--max-request-body-mb", "1"]);
    let huge_field = format!("x-huge: {}", "h".repeat(1 << 20));
    let a = cap.send(&gen("/v1/completions", "hugefield", false, &[&huge_field]));
    let many: Vec<String> = (0..200).map(|i| format!("x-many-{i}: {i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let b = cap.send(&gen("/v1/completions", "manyfields", false, &many));
    // 1.5 MB bodies, sized and chunked.
    let filler = "w ".repeat(750_000);
    let big = format!(r#"{{"model":"m","prompt":"marker bigbody {filler}","max_tokens":1}}"#);
    let c = cap.send(
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: capture\r\nx-marker: bigbody\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{big}",
            big.len()
        )
        .as_bytes(),
    );
    let big2 = big.replace("bigbody", "bigchunk");
    let mut chunked = String::new();
    for piece in big2.as_bytes().chunks(64 * 1024) {
        chunked.push_str(&format!(
            "{:x}\r\n{}\r\n",
            piece.len(),
            std::str::from_utf8(piece).unwrap()
        ));
    }
    chunked.push_str("0\r\n\r\n");
    let d = cap.send(
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: capture\r\nx-marker: bigchunk\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n{chunked}"
        )
        .as_bytes(),
    );
    let e = cap.send(&gen("/v1/completions", "bighead", false, &[]));
    let rows = cap.stop();
    assert_eq!(
        a.statuses(),
        vec![431],
        "{}",
        &a.text()[..a.text().len().min(200)]
    );
    assert_eq!(
        b.statuses(),
        vec![431],
        "{}",
        &b.text()[..b.text().len().min(200)]
    );
    assert_eq!(up.count("hugefield") + up.count("manyfields"), 0);
    no_row(&rows, "hugefield");
    no_row(&rows, "manyfields");
    for (m, got) in [("bigbody", &c), ("bigchunk", &d)] {
        assert_eq!(got.statuses(), vec![413], "{m}: {}", got.text());
        assert_eq!(up.count(m), 0, "{m}");
        let r = row(&rows, m);
        assert_eq!(
            (r.outcome, r.status),
            (Outcome::HttpError, Some(413)),
            "{m}: {r:?}"
        );
    }
    assert_eq!(
        e.statuses(),
        vec![502],
        "{}",
        &e.text()[..e.text().len().min(300)]
    );
    assert_eq!(up.count("bighead"), 1);
    let r = row(&rows, "bighead");
    assert_eq!(r.outcome, Outcome::UpstreamError, "{r:?}");
}

// ---------------------------------------------------------------------------------------
// kill -9 and SIGTERM
// ---------------------------------------------------------------------------------------

/// Starts `n` streamed requests on their own threads; each returns what its client got.
fn start_streams(
    addr: SocketAddr,
    prefix: &str,
    n: usize,
) -> Vec<(String, std::thread::JoinHandle<RawReply>)> {
    (0..n)
        .map(|i| {
            let m = format!("{prefix}{i}x");
            let req = gen("/v1/completions", &m, true, &[]);
            (
                m,
                std::thread::spawn(move || raw_exchange(addr, &req, Duration::from_secs(20))),
            )
        })
        .collect()
}

fn wait_until(within: Duration, what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// kill -9 with three streams in flight, after six completed requests and more than the
/// flush interval: the in-flight clients see their streams cut; the upstream got every
/// request once; the next capture on the same directory recovers exactly the six completed
/// rows (the in-flight ones are the documented loss) and nothing twice.
#[test]
fn kill_9_loses_only_the_requests_in_flight() {
    let up = FaultUpstream::start(|r| {
        if r.body_text().contains("\"stream\":true") {
            Act::Stream {
                events: 500,
                gap: Duration::from_millis(10),
            }
        } else {
            Act::Json
        }
    });
    let mut cap = Capture::start("kill9", &up.url(), &[]);
    let done: Vec<String> = (0..6).map(|i| format!("k9done{i}x")).collect();
    for m in &done {
        let got = cap.send(&gen("/v1/chat/completions", m, false, &[]));
        assert_eq!(got.statuses(), vec![200], "{m}");
    }
    let flying = start_streams(cap.addr, "k9fly", 3);
    wait_until(Duration::from_secs(5), "three streams in flight", || {
        flying.iter().all(|(m, _)| {
            up.wait_answer(m, Duration::ZERO, |a| a.events_written >= 2)
                .is_some()
        })
    });
    std::thread::sleep(Duration::from_millis(300)); // > 5 flush intervals after the last row
    cap.proc.child.kill().expect("SIGKILL");
    let status = cap.proc.child.wait().unwrap();
    assert!(!status.success());
    let replies: Vec<(String, RawReply)> = flying
        .into_iter()
        .map(|(m, h)| (m, h.join().unwrap()))
        .collect();
    // The next capture on the same directory recovers the journal before it listens.
    let out = cap.out.clone();
    let addr = free_addr();
    let mut next = CaptureProc::spawn(addr, &up.url(), &out, &["--session-header", "x-marker"]);
    next.wait_for("listening on");
    let (status, log) = next.terminate();
    assert!(status.success(), "{log:#?}");
    assert!(
        log.iter().any(|l| l.contains("recovered 6 records")),
        "{log:#?}"
    );
    let rows = read_rows(&out);
    let _ = std::fs::remove_dir_all(&out);
    for (m, got) in &replies {
        let resp = got.first();
        assert_eq!(resp.status, 200, "{m}");
        assert!(!resp.complete, "{m}: a stream cut by kill -9 ended cleanly");
        assert_eq!(up.count(m), 1, "{m}");
        no_row(&rows, m);
    }
    for m in &done {
        assert_eq!(up.count(m), 1, "{m}");
        assert_eq!(row(&rows, m).outcome, Outcome::Ok);
    }
    assert_eq!(rows.len(), 6, "{rows:#?}");
}

/// SIGTERM with four streams in flight: capture stops accepting at once (a new connection
/// is refused), lets the four finish (each client gets its whole stream to `[DONE]`), writes
/// their rows and exits 0; the upstream got each once.
#[test]
fn sigterm_drains_the_streams_in_flight() {
    let up = FaultUpstream::always(Act::Stream {
        events: 30,
        gap: Duration::from_millis(20),
    });
    let mut cap = Capture::start("drain", &up.url(), &["--drain-timeout", "10s"]);
    let flying = start_streams(cap.addr, "drain", 4);
    wait_until(Duration::from_secs(5), "four streams in flight", || {
        flying.iter().all(|(m, _)| {
            up.wait_answer(m, Duration::ZERO, |a| a.events_written >= 1)
                .is_some()
        })
    });
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(cap.proc.child.id() as i32, libc::SIGTERM);
    }
    cap.proc.wait_for("stopping; draining");
    // The listener closes right after that line.
    let t = Instant::now();
    let refused = loop {
        if std::net::TcpStream::connect(cap.addr).is_err() {
            break true;
        }
        if t.elapsed() > Duration::from_millis(500) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let replies: Vec<(String, RawReply)> = flying
        .into_iter()
        .map(|(m, h)| (m, h.join().unwrap()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = cap.proc.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "capture did not exit after the drain"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
    let rows = read_rows(&cap.out);
    let _ = std::fs::remove_dir_all(&cap.out);
    assert!(refused, "capture still accepted connections while draining");
    for (m, got) in &replies {
        let resp = got.first();
        assert_eq!(resp.status, 200, "{m}");
        assert!(
            resp.complete && resp.text().ends_with("data: [DONE]\n\n"),
            "{m}: {}",
            got.text()
        );
        assert_eq!(data_events(&resp.body), 30, "{m}");
        assert_eq!(up.count(m), 1, "{m}");
        let r = row(&rows, m);
        assert_eq!(
            (r.outcome, r.output_tokens),
            (Outcome::Ok, Some(30)),
            "{r:?}"
        );
    }
    assert_eq!(rows.len(), 4);
}

/// SIGTERM with a stream longer than `--drain-timeout`: at the timeout capture cuts it (the
/// client's stream ends without its end), the upstream got it once and sees the close, the
/// row is `client_cancelled` "cut by the proxy's shutdown", and capture still exits 0 with
/// finished files.
#[test]
fn sigterm_cuts_what_outlives_the_drain_timeout() {
    let up = FaultUpstream::always(Act::Stream {
        events: 300,
        gap: Duration::from_millis(20),
    });
    let cap = Capture::start("drain-cut", &up.url(), &["--drain-timeout", "300ms"]);
    let flying = start_streams(cap.addr, "longcut", 1);
    wait_until(Duration::from_secs(5), "the stream in flight", || {
        up.wait_answer("longcut0x", Duration::ZERO, |a| a.events_written >= 2)
            .is_some()
    });
    let t = Instant::now();
    let rows = cap.stop();
    let took = t.elapsed();
    let (m, h) = flying.into_iter().next().unwrap();
    let got = h.join().unwrap();
    let closed = up.wait_answer(&m, Duration::from_secs(3), |a| {
        a.write_failed || a.peer_closed
    });
    assert!(took < Duration::from_secs(5), "{took:?}");
    let resp = got.first();
    assert_eq!(resp.status, 200);
    assert!(!resp.complete, "{}", got.text());
    assert_eq!(up.count(&m), 1);
    assert!(closed.is_some(), "the upstream never saw the cut");
    let r = row(&rows, &m);
    assert_eq!(
        (r.outcome, r.status),
        (Outcome::ClientCancelled, Some(200)),
        "{r:?}"
    );
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("cut by the proxy's shutdown"),
        "{r:?}"
    );
}
