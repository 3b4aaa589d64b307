//! Shadow traffic at capture (`--shadow NAME=URL`): production requests mirrored to
//! candidates, each recorded as a row paired with its production row, and a candidate that is
//! slow, stalled or unreachable costing production nothing.

use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use support::capture::CaptureProc;
use support::disk::http;
use support::env::{free_addr, serial, tmpdir};
use support::fault_upstream::{Act, FaultUpstream};
use support::sim::{cancel_after_chunks, SimProc};
use trace_format::{Outcome, TraceRecord};

const BIN: &str = env!("CARGO_BIN_EXE_llmreplay");

fn rows(dir: &Path) -> Vec<TraceRecord> {
    trace_format::read_traces(&[dir.to_str().unwrap()])
        .expect("reading the rows")
        .records
}

/// One POST of `body` to `/v1/completions` with extra header lines, on a fresh connection:
/// its status and how long it took.
fn post(addr: SocketAddr, body: &str, headers: &str) -> (u16, Duration) {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    (status, t.elapsed())
}

/// The value of the series `name{labels}` in a Prometheus exposition.
fn series(text: &str, name_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name_labels)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// /metrics, polled (bounded) until `done` holds of it.
fn metrics_until(admin: SocketAddr, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, text) = http(admin, "GET", "/metrics", "");
        if done(&text) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const STREAM: &str = r#"{"model":"m","prompt":"w w w w","max_tokens":8,"stream":true}"#;

/// The sim as production, a sim 130 ms slower to its first token as the candidate: every
/// production row has exactly one shadow row (its `pair_request_id`, `target` = the
/// candidate's name, its own request id), complete, with the larger TTFT.
#[test]
fn every_mirrored_request_has_its_pair_row_and_the_slower_candidate_shows() {
    let _alone = serial();
    let prod = SimProc::fixed(BIN, 20, 5);
    let cand = SimProc::fixed(BIN, 150, 5);
    let (listen, admin, out) = (free_addr(), free_addr(), tmpdir("shadow-pairs"));
    let shadow = format!("cand={}", cand.url());
    let mut cap = CaptureProc::spawn_admin(
        BIN,
        listen,
        admin,
        &prod.url(),
        &out,
        &["--shadow", &shadow, "--threads", "1"],
    );
    cap.wait_for("listening on");
    let n = 6;
    for _ in 0..n {
        let (status, took) = post(listen, STREAM, "");
        assert_eq!(status, 200);
        // The client waits for production only (20 ms to the first token, 8 tokens 5 ms
        // apart), never for the candidate's 150 ms.
        assert!(took < Duration::from_millis(140), "{took:?}");
    }
    let m = metrics_until(admin, |t| {
        series(t, "llmreplay_shadow_completed_total{target=\"cand\"}") == Some(n as f64)
    });
    assert_eq!(
        series(&m, "llmreplay_shadow_sent_total{target=\"cand\"}"),
        Some(n as f64),
        "{m}"
    );
    assert_eq!(
        series(&m, "llmreplay_shadow_completed_total{target=\"cand\"}"),
        Some(n as f64)
    );
    // Production's own counters count production requests only.
    assert_eq!(
        series(&m, "llmreplay_capture_requests_total{outcome=\"ok\"}"),
        Some(n as f64)
    );
    let (status, _) = cap.terminate();
    assert!(status.success());
    let all = rows(&out);
    let (shadows, prods): (Vec<_>, Vec<_>) = all.iter().partition(|r| r.target.is_some());
    assert_eq!((prods.len(), shadows.len()), (n, n));
    let by_id: HashMap<&str, &TraceRecord> =
        prods.iter().map(|r| (r.request_id.as_str(), *r)).collect();
    let mut paired = std::collections::HashSet::new();
    for s in &shadows {
        assert_eq!(s.target.as_deref(), Some("cand"));
        let pair = s.pair_request_id.as_deref().expect("pair_request_id");
        let p = by_id.get(pair).expect("the pair is a production row");
        assert!(paired.insert(pair), "two shadows of {pair}");
        assert_ne!(s.request_id, p.request_id);
        assert_eq!(p.pair_request_id, None);
        assert_eq!((p.outcome, s.outcome), (Outcome::Ok, Outcome::Ok));
        assert_eq!(s.arrival_time_us, p.arrival_time_us);
        assert_eq!((s.model.as_deref(), s.stream), (Some("m"), true));
        assert_eq!(s.output_tokens, Some(8));
        let (pt, st) = (p.ttft_us.unwrap(), s.ttft_us.unwrap());
        assert!(
            st > pt + 80_000,
            "candidate TTFT {st} µs against production {pt} µs"
        );
    }
    // `llmreplay shadow` pairs them: the candidate's TTFT is higher, request by request, and
    // fails the SLO production meets.
    let json = out.join("shadow.json");
    let o = std::process::Command::new(BIN)
        .args(["shadow", out.to_str().unwrap(), "--goodput", "ttft:100"])
        .args(["--json", json.to_str().unwrap(), "--fail-on-slo"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(6),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains(&format!(
            "Candidate cand: {n} requests mirrored, 0 production"
        )),
        "{text}"
    );
    let ttft = text
        .lines()
        .find(|l| l.trim_start().starts_with("TTFT"))
        .expect(&text);
    assert!(ttft.contains("HIGHER on the candidate"), "{text}");
    assert!(text.contains("production, same requests: PASS"), "{text}");
    assert!(text.contains("VERDICT cand: FAIL — p95 TTFT"), "{text}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let d = &doc["candidates"][0]["classes"][0]["metrics"][0];
    assert_eq!(d["metric"], "ttft");
    assert!(d["ci"][0].as_f64().unwrap() > 80.0, "{d}");
}

/// A candidate that never answers and one that cannot be reached: every production request
/// answers at production's pace; the stalled one holds at most `--shadow-max-in-flight`
/// requests (the rest dropped and counted, never queued), the unreachable one's are counted
/// as connect failures; the candidate gets its own credentials, never the client's, and the
/// model it serves; `POST /shadow/off` stops mirroring live and `/shadow/on` resumes it.
#[test]
fn a_stalled_or_unreachable_candidate_costs_production_nothing() {
    let prod = SimProc::fixed(BIN, 5, 2);
    let stall = FaultUpstream::always(Act::StallBeforeHead);
    let gone = free_addr();
    let (listen, admin, out) = (free_addr(), free_addr(), tmpdir("shadow-faults"));
    let flags = [
        "--shadow".to_string(),
        format!("stall={}", stall.url()),
        "--shadow".into(),
        format!("gone=http://{gone}"),
        "--shadow-header".into(),
        "stall:x-api-key=cand-secret".into(),
        "--shadow-model".into(),
        "stall:cand-model".into(),
        "--shadow-max-in-flight".into(),
        "2".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut cap = CaptureProc::spawn_admin(BIN, listen, admin, &prod.url(), &out, &flags);
    cap.wait_for("listening on");
    let n = 10;
    for _ in 0..n {
        let (status, took) = post(listen, STREAM, "authorization: Bearer client-secret\r\n");
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
    let want = |t: &str| {
        series(
            t,
            "llmreplay_shadow_dropped_total{target=\"gone\",reason=\"connect\"}",
        ) == Some(n as f64)
            && series(
                t,
                "llmreplay_shadow_dropped_total{target=\"stall\",reason=\"max_in_flight\"}",
            ) == Some((n - 2) as f64)
    };
    let m = metrics_until(admin, want);
    assert!(want(&m), "{m}");
    assert_eq!(
        series(&m, "llmreplay_shadow_sent_total{target=\"stall\"}"),
        Some(2.0)
    );
    assert_eq!(
        series(&m, "llmreplay_shadow_in_flight{target=\"stall\"}"),
        Some(2.0)
    );
    assert_eq!(
        series(&m, "llmreplay_shadow_sent_total{target=\"gone\"}"),
        Some(n as f64)
    );
    assert_eq!(
        series(&m, "llmreplay_shadow_completed_total{target=\"gone\"}"),
        Some(0.0)
    );
    assert_eq!(series(&m, "llmreplay_shadow_on"), Some(1.0));
    assert_eq!(
        series(&m, "llmreplay_capture_requests_total{outcome=\"ok\"}"),
        Some(n as f64)
    );
    // What the stalled candidate received: its own key and model, not the client's secret.
    let got = stall.received();
    assert_eq!(got.len(), 2);
    for r in &got {
        assert_eq!(r.header("x-api-key"), Some("cand-secret"));
        assert_eq!(r.header("authorization"), None);
        let body: serde_json::Value = serde_json::from_str(&r.body_text()).unwrap();
        assert_eq!(body["model"], "cand-model");
        assert_eq!(body["prompt"], "w w w w");
    }

    // Off: nothing more is mirrored; on again: mirroring resumes.
    assert_eq!(http(admin, "GET", "/shadow/off", "").0, 405);
    assert_eq!(http(admin, "POST", "/shadow/off", "").0, 200);
    assert_eq!(post(listen, STREAM, "").0, 200);
    let m = metrics_until(admin, |_| true);
    assert_eq!(series(&m, "llmreplay_shadow_on"), Some(0.0));
    assert_eq!(
        series(&m, "llmreplay_shadow_sent_total{target=\"gone\"}"),
        Some(n as f64)
    );
    assert_eq!(http(admin, "POST", "/shadow/on", "").0, 200);
    assert_eq!(post(listen, STREAM, "").0, 200);
    let m = metrics_until(admin, |t| {
        series(t, "llmreplay_shadow_sent_total{target=\"gone\"}") == Some(n as f64 + 1.0)
    });
    assert_eq!(
        series(&m, "llmreplay_shadow_sent_total{target=\"gone\"}"),
        Some(n as f64 + 1.0)
    );

    // The stalled ones are cut at shutdown, their rows written.
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
    let all = rows(&out);
    let of = |t: &str| -> Vec<&TraceRecord> {
        all.iter()
            .filter(|r| r.target.as_deref() == Some(t))
            .collect()
    };
    assert_eq!(all.iter().filter(|r| r.target.is_none()).count(), n + 2);
    let gone_rows = of("gone");
    assert_eq!(gone_rows.len(), n + 1);
    assert!(gone_rows
        .iter()
        .all(|r| r.outcome == Outcome::UpstreamError && r.status.is_none()));
    let stall_rows = of("stall");
    assert_eq!(stall_rows.len(), 2);
    for r in stall_rows {
        assert_eq!(r.outcome, Outcome::ClientCancelled);
        assert_eq!(r.model.as_deref(), Some("cand-model"));
        assert!(
            r.error.as_deref().unwrap_or("").contains("shutdown"),
            "{r:?}"
        );
    }
}

/// A request production refuses (bad JSON: the sim's 400) is mirrored as it is and its pair
/// row records the candidate's own answer (`http_error`, 400); a request whose client goes
/// away mid-stream cancels its shadow at that moment (`client_cancelled`, its error naming
/// the production request's cancellation).
#[test]
fn a_refused_request_and_a_cancelled_one_pair_as_documented() {
    let prod = SimProc::fixed(BIN, 5, 20);
    let cand = SimProc::fixed(BIN, 5, 20);
    let (listen, admin, out) = (free_addr(), free_addr(), tmpdir("shadow-cancel"));
    let shadow = format!("cand={}", cand.url());
    let mut cap = CaptureProc::spawn_admin(
        BIN,
        listen,
        admin,
        &prod.url(),
        &out,
        &["--shadow", &shadow],
    );
    cap.wait_for("listening on");
    assert_eq!(post(listen, r#"{"model":"m","prompt":"#, "").0, 400);
    cancel_after_chunks(listen, "c1", 3).unwrap();
    let m = metrics_until(admin, |t| {
        series(
            t,
            "llmreplay_shadow_dropped_total{target=\"cand\",reason=\"cancelled\"}",
        ) == Some(1.0)
            && series(t, "llmreplay_shadow_completed_total{target=\"cand\"}") == Some(1.0)
    });
    assert_eq!(
        series(
            &m,
            "llmreplay_shadow_dropped_total{target=\"cand\",reason=\"cancelled\"}"
        ),
        Some(1.0),
        "{m}"
    );
    let (status, _) = cap.terminate();
    assert!(status.success());
    let all = rows(&out);
    let pair = |p: &TraceRecord| {
        all.iter()
            .find(|r| r.pair_request_id.as_deref() == Some(&p.request_id))
            .unwrap_or_else(|| panic!("no pair row for {p:?}"))
    };
    let refused = all
        .iter()
        .find(|r| r.target.is_none() && r.status == Some(400))
        .expect("the refused production row");
    let s = pair(refused);
    assert_eq!((s.outcome, s.status), (Outcome::HttpError, Some(400)));
    let cancelled = all
        .iter()
        .find(|r| r.target.is_none() && r.outcome == Outcome::ClientCancelled)
        .expect("the cancelled production row");
    let s = pair(cancelled);
    assert_eq!(s.outcome, Outcome::ClientCancelled);
    assert!(
        s.error
            .as_deref()
            .unwrap_or("")
            .contains("production request was cancelled"),
        "{s:?}"
    );
    // Cancelled at the same point: the shadow's stream ended within a few chunks of
    // production's (200 tokens 20 ms apart would take 4 s).
    let (pe, se) = (cancelled.e2el_us.unwrap(), s.e2el_us.unwrap());
    assert!(
        (pe - se).abs() < 500_000,
        "production {pe} µs, shadow {se} µs"
    );
    assert!(s.chunk_times_us.len() < 50, "{}", s.chunk_times_us.len());
    // `llmreplay shadow` pairs the outcomes: the same on both sides, neither the candidate's
    // failure (the 4xx and the cancellation are the client's).
    let o = std::process::Command::new(BIN)
        .args(["shadow", out.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("http_error → http_error: 1"), "{text}");
    assert!(
        text.contains("client_cancelled → client_cancelled: 1"),
        "{text}"
    );
    assert!(!text.contains("outcome differed"), "{text}");
    // Both left out as the client's: nothing the candidate was asked to serve is left to judge.
    assert!(text.contains("2 the client's own"), "{text}");
    assert!(text.contains("0 of 0 failed by the server"), "{text}");
}

/// `--shadow-sample-by session` keeps conversations whole: sessions named by the session
/// header, and chat conversations without one (drawn by their messages up to the first user
/// message), are each mirrored in every turn or in none, and the sample takes some but not all.
#[test]
fn a_session_sample_mirrors_whole_conversations() {
    let prod = SimProc::fixed(BIN, 2, 1);
    let cand = SimProc::fixed(BIN, 2, 1);
    let (listen, admin, out) = (free_addr(), free_addr(), tmpdir("shadow-sessions"));
    let shadow = format!("cand={}", cand.url());
    let flags = [
        "--shadow",
        &shadow,
        "--shadow-sample",
        "0.5",
        "--shadow-sample-by",
        "session",
        "--session-header",
        "x-session",
    ];
    let mut cap = CaptureProc::spawn_admin(BIN, listen, admin, &prod.url(), &out, &flags);
    cap.wait_for("listening on");
    let (sessions, turns) = (12, 3);
    for s in 0..sessions {
        for _ in 0..turns {
            let (status, _) = post(listen, STREAM, &format!("x-session: s{s}\r\n"));
            assert_eq!(status, 200);
        }
    }
    // Chat conversations without a header: turn k carries the turns before it.
    for c in 0..sessions {
        let mut messages = vec![
            serde_json::json!({"role": "system", "content": "be brief"}),
            serde_json::json!({"role": "user", "content": format!("question {c}")}),
        ];
        for t in 0..turns {
            let body = serde_json::json!({"model": "m", "messages": messages, "max_tokens": 4});
            let (status, _) = http(listen, "POST", "/v1/chat/completions", &body.to_string());
            assert_eq!(status, 200);
            messages.push(serde_json::json!({"role": "assistant", "content": format!("a{t}")}));
            messages.push(serde_json::json!({"role": "user", "content": format!("more {t}")}));
        }
    }
    let total = 2 * sessions * turns;
    metrics_until(admin, |t| {
        let sent = series(t, "llmreplay_shadow_sent_total{target=\"cand\"}").unwrap_or(0.0);
        let done = series(t, "llmreplay_shadow_completed_total{target=\"cand\"}").unwrap_or(-1.0);
        sent == done
            && series(t, "llmreplay_capture_requests_total{outcome=\"ok\"}") == Some(total as f64)
    });
    let (status, _) = cap.terminate();
    assert!(status.success());
    let all = rows(&out);
    let mirrored: std::collections::HashSet<&str> = all
        .iter()
        .filter_map(|r| r.pair_request_id.as_deref())
        .collect();
    let prods: Vec<&TraceRecord> = all.iter().filter(|r| r.target.is_none()).collect();
    assert_eq!(prods.len(), total);
    // Conversations: the header's sessions by session_id; the chat ones (their fake answers
    // link no turns) by the order they were sent in, one after another.
    let mut by_session: HashMap<String, Vec<bool>> = HashMap::new();
    let mut chats: Vec<&&TraceRecord> = prods
        .iter()
        .filter(|p| p.endpoint.ends_with("/chat/completions"))
        .collect();
    chats.sort_by_key(|p| p.arrival_time_us);
    for (i, p) in chats.iter().enumerate() {
        by_session
            .entry(format!("chat{}", i / turns))
            .or_default()
            .push(mirrored.contains(p.request_id.as_str()));
    }
    for p in prods
        .iter()
        .filter(|p| !p.endpoint.ends_with("/chat/completions"))
    {
        let key = p.session_id.clone().expect("the header's session");
        by_session
            .entry(key)
            .or_default()
            .push(mirrored.contains(p.request_id.as_str()));
    }
    assert_eq!(by_session.len(), 2 * sessions, "{by_session:?}");
    let mut taken = [0, 0];
    for (s, turns_mirrored) in &by_session {
        assert_eq!(turns_mirrored.len(), turns, "{s}");
        let all_in = turns_mirrored.iter().all(|m| *m);
        assert!(
            all_in || turns_mirrored.iter().all(|m| !*m),
            "{s}: {turns_mirrored:?}"
        );
        taken[usize::from(s.starts_with("chat"))] += usize::from(all_in);
    }
    for t in taken {
        assert!(
            0 < t && t < sessions,
            "{taken:?} of {sessions} sessions each"
        );
    }
}

/// Shadow flags that cannot work are refused at start, naming the flag and why.
#[test]
fn bad_shadow_flags_are_refused_by_name() {
    let out = tmpdir("shadow-flags");
    for (args, says) in [
        (
            &["--shadow", "noeq"][..],
            "--shadow \"noeq\": expected NAME=URL",
        ),
        (
            &["--shadow", "a=ftp://x"],
            "only http and https are supported",
        ),
        (
            &["--shadow", "a=http://x:1", "--shadow", "a=http://y:1"],
            "NAME given twice",
        ),
        (
            &["--shadow", "a=http://x:1", "--shadow-header", "b:x=y"],
            "no --shadow named \"b\"",
        ),
        (
            &["--shadow", "a=http://x:1", "--shadow-header", "a:host=y"],
            "capture sets this header itself",
        ),
        (
            &["--shadow", "a=http://x:1", "--shadow-sample", "2"],
            "'2' for '--shadow-sample <SHADOW_SAMPLE>': \"2\" is not a share above 0 and at most 1",
        ),
        (
            &["--shadow", "a=http://x:1", "--shadow-timeout", "0s"],
            "--shadow-timeout \"0\": must be > 0",
        ),
        (&["--shadow-timeout", "5s"], "--shadow"),
        (&["--shadow-sample", "0.5"], "--shadow"),
    ] {
        let o = std::process::Command::new(BIN)
            .args(["capture", "--no-admin", "--listen", "127.0.0.1:0"])
            .args(["--upstream", "http://127.0.0.1:9", "--out"])
            .arg(&out)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run llmreplay capture");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Capture stopped right after production's last answer: the candidate, slower, was still
/// answering those requests, and they were cut ("cut by the proxy's shutdown", 9 of 200 in a
/// user's run) and counted against it. Shadows in flight now finish within the drain (at most
/// 5 s) before the files close.
#[test]
fn a_stop_right_after_production_answered_lets_the_slower_candidate_finish() {
    let prod = SimProc::fixed(BIN, 10, 2);
    let cand = SimProc::fixed(BIN, 400, 5);
    let (listen, out) = (free_addr(), tmpdir("shadow-stop"));
    let shadow = format!("cand={}", cand.url());
    let mut cap = CaptureProc::spawn(listen, &prod.url(), &out, &["--shadow", &shadow]);
    cap.wait_for("listening on");
    for _ in 0..3 {
        assert_eq!(post(listen, STREAM, "").0, 200);
    }
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
    let all = rows(&out);
    let shadows: Vec<&TraceRecord> = all.iter().filter(|r| r.target.is_some()).collect();
    assert_eq!(shadows.len(), 3, "{all:#?}");
    for s in shadows {
        assert_eq!(
            (s.outcome, s.output_tokens),
            (Outcome::Ok, Some(8)),
            "{s:?}"
        );
    }
}

/// `--shadow-timeout`: a candidate that stalls, before its response head or after two events,
/// holds its in-flight places only until the deadline (not capture's 10-minute timeouts): then
/// its shadows are cut as the candidate's timeouts (counted with that reason, rows `timeout`),
/// the places are freed, and later production requests are mirrored again. `llmreplay shadow`
/// counts the timeouts against the candidate.
#[test]
fn a_stalled_candidate_is_cut_at_the_shadow_timeout_and_its_places_freed() {
    let _alone = serial();
    let prod = SimProc::fixed(BIN, 5, 2);
    let head = FaultUpstream::always(Act::StallBeforeHead);
    let body = FaultUpstream::always(Act::StallAfter { events: 2 });
    let (listen, admin, out) = (free_addr(), free_addr(), tmpdir("shadow-timeout"));
    let flags = [
        "--shadow".to_string(),
        format!("head={}", head.url()),
        "--shadow".into(),
        format!("body={}", body.url()),
        "--shadow-max-in-flight".into(),
        "2".into(),
        "--shadow-timeout".into(),
        "1s".into(),
        "--threads".into(),
        "1".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut cap = CaptureProc::spawn_admin(BIN, listen, admin, &prod.url(), &out, &flags);
    cap.wait_for("listening on");
    let count = |t: &str, target: &str, reason: &str| {
        series(
            t,
            &format!("llmreplay_shadow_dropped_total{{target=\"{target}\",reason=\"{reason}\"}}"),
        )
    };
    let each = |t: &str, what: &dyn Fn(&str, &str) -> Option<f64>, want: f64| {
        ["head", "body"].iter().all(|c| what(t, c) == Some(want))
    };
    let in_flight =
        |t: &str, c: &str| series(t, &format!("llmreplay_shadow_in_flight{{target=\"{c}\"}}"));
    let sent =
        |t: &str, c: &str| series(t, &format!("llmreplay_shadow_sent_total{{target=\"{c}\"}}"));

    // Two requests take both places of each candidate; a third, well within the deadline,
    // finds them busy.
    let start = Instant::now();
    for _ in 0..3 {
        let (status, took) = post(listen, STREAM, "");
        assert_eq!(status, 200);
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
    assert!(
        start.elapsed() < Duration::from_millis(900),
        "too slow to test the deadline"
    );
    let m = metrics_until(admin, |t| each(t, &in_flight, 2.0));
    assert!(each(&m, &in_flight, 2.0), "{m}");
    assert!(each(&m, &|t, c| count(t, c, "max_in_flight"), 1.0), "{m}");
    // At the deadline both are cut: the candidate's timeouts, the places free.
    let timed_out = |want: f64| {
        move |t: &str| each(t, &|t, c| count(t, c, "timeout"), want) && each(t, &in_flight, 0.0)
    };
    let m = metrics_until(admin, timed_out(2.0));
    assert!(timed_out(2.0)(&m), "{m}");
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "cut before the deadline"
    );
    // Later requests are mirrored again (and cut again).
    for _ in 0..2 {
        assert_eq!(post(listen, STREAM, "").0, 200);
    }
    let m = metrics_until(admin, timed_out(4.0));
    assert!(timed_out(4.0)(&m), "{m}");
    assert!(each(&m, &sent, 4.0), "{m}");
    assert!(each(&m, &|t, c| count(t, c, "max_in_flight"), 1.0), "{m}");
    assert_eq!(
        series(&m, "llmreplay_capture_requests_total{outcome=\"ok\"}"),
        Some(5.0)
    );

    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
    let all = rows(&out);
    assert_eq!(all.iter().filter(|r| r.target.is_none()).count(), 5);
    for (target, status, chunks) in [("head", None, 0), ("body", Some(200), 2)] {
        let of: Vec<&TraceRecord> = all
            .iter()
            .filter(|r| r.target.as_deref() == Some(target))
            .collect();
        assert_eq!(of.len(), 4, "{target}");
        for r in of {
            assert_eq!(r.outcome, Outcome::Timeout, "{r:?}");
            assert_eq!(r.status, status, "{r:?}");
            assert_eq!(r.chunk_times_us.len(), chunks, "{r:?}");
            let e = r.error.as_deref().unwrap_or("");
            assert!(e.contains("within --shadow-timeout 1s"), "{r:?}");
        }
    }

    // `llmreplay shadow` judges them as the candidate's timeouts: production ok, candidate
    // timeout, and the candidate fails.
    let o = std::process::Command::new(BIN)
        .args(["shadow", out.to_str().unwrap(), "--fail-on-slo"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(6),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("ok → timeout: 4"), "{text}");
    assert!(text.contains("VERDICT head: FAIL"), "{text}");
    assert!(text.contains("VERDICT body: FAIL"), "{text}");
}
