//! Every exit status, provoked through the real binary (`llmreplay --help` and README's
//! "Exit status" list them; `src/exit.rs` defines them once), and the one signal helper:
//! the first SIGINT/SIGTERM stops capture and sim gracefully, the next one ends capture at
//! once with the first signal's status. Replay's signals are in `tests/interrupt.rs`.

use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, tmpdir};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sim::groundtruth::{GroundTruth, GroundTruthConfig};
use trace_format::{FileMeta, Producer, TraceRecord};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llmreplay"));
    c.stdin(Stdio::null());
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// 20 requests at 200 req/s.
fn synth(dir: &Path) -> String {
    let t = dir.join("t.parquet").display().to_string();
    let o = run(&[
        "synth",
        "-o",
        &t,
        "--num-prompts",
        "20",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--request-rate",
        "200",
        "--seed",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    t
}

#[test]
fn status_1_when_a_command_fails_and_2_when_its_flags_are_refused() {
    let o = run(&["inspect", "/nonexistent/exits-no-trace"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = run(&["replay", "t.parquet", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = run(&["--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let help = String::from_utf8_lossy(&o.stdout);
    for code in ["0", "1", "2", "3", "4", "5", "6", "7", "130", "143"] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{code}  "))),
            "--help lists status {code}: {help}"
        );
    }
}

/// Issue 53: every refused flag or value exits 2 (README's "Exit status": flags or arguments
/// refused), whether clap refuses it or the command's own check does, a negative number is a
/// value refused by its range (not an unknown flag), and the error names the flag. Before,
/// `--speedup 0`, `--max-concurrency 0`, `capture --sample-rate 2`, `sim --error-rate 1.5`
/// and the rest exited 1, like a run that failed, and `--speedup -2` was "unexpected argument".
#[test]
fn every_refused_flag_or_value_exits_2_per_command() {
    let dir = tmpdir("exits-refused");
    let t = synth(&dir);
    let out = dir.join("out").display().to_string();
    let md = dir.join("r.md").display().to_string();
    let json = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/sim-replay-300.json");
    let up = "http://127.0.0.1:9";
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        // (command, arguments, what the error names)
        ("replay", vec!["replay", &t, "--speedup", "0"], "--speedup"),
        ("replay", vec!["replay", &t, "--speedup", "-2"], "--speedup"),
        (
            "replay",
            vec!["replay", &t, "--max-concurrency", "0"],
            "--max-concurrency",
        ),
        (
            "replay",
            vec!["replay", &t, "--sample-ratio", "1.5"],
            "--sample-ratio",
        ),
        ("replay", vec!["replay", &t, "--timeout", "0s"], "--timeout"),
        (
            "replay",
            vec!["replay", &t, "--burstiness", "0"],
            "--burstiness",
        ),
        (
            "replay",
            vec!["replay", &t, "--request-rate", "0"],
            "--request-rate",
        ),
        (
            "replay",
            vec!["replay", &t, "--goodput", "ttft:-5"],
            "--goodput",
        ),
        (
            "replay",
            vec!["replay", &t, "--slo-percentile", "150"],
            "--slo-percentile",
        ),
        (
            "replay",
            vec!["replay", &t, "--max-failed", "2"],
            "--max-failed",
        ),
        (
            "replay",
            vec!["replay", &t, "--level-duration", "0s"],
            "--level-duration",
        ),
        (
            "replay",
            vec!["replay", &t, "--target", "http://h:1/v1/chat/completions"],
            "base URL",
        ),
        (
            "replay",
            vec!["replay", &t, "--target", up, "--error-rate", "0.5"],
            "--error-rate",
        ),
        (
            "replay",
            vec!["replay", &t, "--metadata", "completed=1"],
            "--metadata",
        ),
        (
            "replay",
            vec!["replay", &t, "--sweep", "speedup=1,2", "--fail-on-slo"],
            "--fail-on-slo",
        ),
        (
            "synth",
            vec!["synth", "-o", &out, "--num-prompts", "0"],
            "--num-prompts",
        ),
        (
            "synth",
            vec!["synth", "-o", &out, "--burstiness", "-1"],
            "--burstiness",
        ),
        (
            "synth",
            vec!["synth", "-o", &out, "--range-ratio", "1"],
            "--range-ratio",
        ),
        (
            "synth",
            vec!["synth", "-o", &out, "--stream-ratio", "2"],
            "--stream-ratio",
        ),
        (
            "capture",
            vec![
                "capture",
                "--upstream",
                up,
                "--out",
                &out,
                "--sample-rate",
                "2",
            ],
            "--sample-rate",
        ),
        (
            "capture",
            vec![
                "capture",
                "--upstream",
                up,
                "--out",
                &out,
                "--sample-rate",
                "-1",
            ],
            "--sample-rate",
        ),
        (
            "capture",
            vec![
                "capture",
                "--upstream",
                up,
                "--out",
                &out,
                "--block-size",
                "0",
            ],
            "--block-size",
        ),
        (
            "capture",
            vec!["capture", "--upstream", "ftp://x", "--out", &out],
            "--upstream",
        ),
        ("sim", vec!["sim", "--error-rate", "1.5"], "--error-rate"),
        ("sim", vec!["sim", "--error-rate", "-1"], "--error-rate"),
        (
            "sim",
            vec!["sim", "--fixed-timing", "x,1"],
            "--fixed-timing",
        ),
        ("sim", vec!["sim", "--slot-timing", "0,20"], "--slot-timing"),
        (
            "sim",
            vec!["sim", "--profile", "no-such-profile"],
            "profile",
        ),
        ("demo", vec!["demo", "--rates", "0"], "--rates"),
        ("demo", vec!["demo", "--rates", "1,-2"], "--rates"),
        ("demo", vec!["demo", "--seconds", "0"], "--seconds"),
        (
            "import",
            vec!["import", &t, "-o", &out, "--head", "0"],
            "--head",
        ),
        (
            "import",
            vec!["import", &t, "-o", &out, "--burstiness", "0"],
            "--burstiness",
        ),
        (
            "inspect",
            vec!["inspect", &t, "--cache-blocks", "-1"],
            "--cache-blocks",
        ),
        ("compare", vec!["compare", json], "<FILES>"),
        (
            "compare",
            vec!["compare", json, json, "--slo-percentile", "0"],
            "--slo-percentile",
        ),
        (
            "report",
            vec!["report", json, "-o", &md, "--redundancy", "0"],
            "--redundancy",
        ),
        (
            "report",
            vec!["report", json, "-o", &md, "--target-qps", "-3"],
            "--target-qps",
        ),
        ("report", vec!["report", json, "-o", "r.pdf"], "-o"),
        (
            "merge",
            vec!["merge", &t, "-o", &out, "--metric-percentiles", "0"],
            "--metric-percentiles",
        ),
        (
            "fidelity",
            vec![
                "fidelity",
                "--captured",
                &t,
                "--replayed",
                &t,
                "--speedup",
                "0",
            ],
            "--speedup",
        ),
        (
            "shadow",
            vec!["shadow", &t, "--slo-percentile", "101"],
            "--slo-percentile",
        ),
        ("rekey", vec!["rekey", &t, "-o", &out], "--key-file"),
    ];
    let mut wrong = Vec::new();
    for (command, args, names) in &cases {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.code() != Some(2) || !err.contains(names) || err.contains("unexpected argument")
        {
            wrong.push(format!("{command}: {args:?} → {}", text(&o)));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} refused flags not exiting 2:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `compare --fail-on-regression`: 3 for a candidate 30% slower, 0 for the same figures.
#[test]
fn status_3_is_a_regression_found_by_compare() {
    let dir = tmpdir("exits-compare");
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/sim-replay-300.json");
    let mut d: serde_json::Value = serde_json::from_slice(&std::fs::read(base).unwrap()).unwrap();
    d["label"] = "again".into();
    let again = dir.join("again.json");
    std::fs::write(&again, serde_json::to_vec(&d).unwrap()).unwrap();
    for (k, v) in d.as_object_mut().unwrap().iter_mut() {
        if k.ends_with("_ttft_ms") || k.ends_with("_e2el_ms") {
            if let Some(x) = v.as_f64() {
                *v = serde_json::json!(x * 1.3);
            }
        }
    }
    d["label"] = "candidate".into();
    let cand = dir.join("candidate.json");
    std::fs::write(&cand, serde_json::to_vec(&d).unwrap()).unwrap();
    let cand = cand.to_str().unwrap();
    let o = run(&["compare", base, cand, "--fail-on-regression"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("regression beyond noise found"));
    let o = run(&[
        "compare",
        base,
        again.to_str().unwrap(),
        "--fail-on-regression",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every request fails (the in-process sim's fault rate 1): 4, after the outputs.
#[test]
fn status_4_is_a_replay_whose_requests_failed() {
    let dir = tmpdir("exits-failed");
    let t = synth(&dir);
    let r = dir.join("r.json");
    let o = run(&[
        "replay",
        &t,
        "-q",
        "--fixed-timing",
        "1,1",
        "--error-rate",
        "1",
        "--save-result",
        r.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(r.exists(), "the result is written first");
    assert!(String::from_utf8_lossy(&o.stderr).contains("error: 20 of 20 requests"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn write_trace(path: &Path, output_tokens: i64) {
    let rows: Vec<TraceRecord> = (0..6)
        .map(|i| {
            let mut r = TraceRecord::new(
                format!("r{i}"),
                1_750_000_000_000_000 + i as i64 * 100_000,
                "/v1/completions",
            );
            r.prompt_tokens = Some(10);
            r.output_tokens = Some(output_tokens);
            r.e2el_us = Some(50_000);
            r.status = Some(200);
            r
        })
        .collect();
    trace_format::write_trace_file(path, &rows, &FileMeta::new(Producer::Import, "test")).unwrap();
}

/// The same requests with ten times the output tokens: the load drifts, 5.
#[test]
fn status_5_is_a_replay_that_drifts_from_its_capture() {
    let dir = tmpdir("exits-drift");
    let (a, b) = (dir.join("a.parquet"), dir.join("b.parquet"));
    write_trace(&a, 4);
    write_trace(&b, 40);
    let fidelity = |replayed: &Path| {
        bin()
            .args(["fidelity", "--fail-on-drift", "--captured"])
            .arg(&a)
            .arg("--replayed")
            .arg(replayed)
            .output()
            .unwrap()
    };
    let o = fidelity(&b);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    let o = fidelity(&a);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TTFT SLO of 1 ms no server meets: `--fail-on-slo` gives 6.
#[test]
fn status_6_is_a_failed_verdict_with_fail_on_slo() {
    let dir = tmpdir("exits-slo");
    let t = synth(&dir);
    let o = run(&[
        "replay",
        &t,
        "-q",
        "--fixed-timing",
        "20,1",
        "--goodput",
        "ttft:1",
        "--fail-on-slo",
    ]);
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("error: verdict FAIL"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn ground_truth(itl: Duration) -> GroundTruth {
    GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(5),
            itl,
            ..Default::default()
        },
    )
    .unwrap()
}

/// A streaming request through `proxy`; returns once its first event arrived, with the
/// thread that reads the rest (until the connection closes, or 60 s pass).
fn stream_in_flight(proxy: SocketAddr) -> std::thread::JoinHandle<()> {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = r#"{"model":"m","prompt":"one two","max_tokens":20,"stream":true}"#;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: {proxy}\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "closed before an event"
        );
        if line.starts_with("data:") {
            break;
        }
    }
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
    })
}

/// The status of `cap` once it exits (bounded wait).
fn exit_of(cap: &mut CaptureProc, within: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = cap.child.try_wait().unwrap() {
            return s;
        }
        assert!(
            t0.elapsed() < within,
            "capture did not exit: {:#?}",
            cap.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A stream of ~100 s in flight and a drain of 60 s: the first signal drains (waiting for
/// it), the second ends capture at once with the first signal's status.
fn capture_second_signal(first: i32, second: i32, status: i32) {
    let gt = ground_truth(Duration::from_secs(5));
    let out = tmpdir("exits-capture-second");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(listen, &gt.url(), &out, &["--drain-timeout", "60s"]);
    cap.wait_for("listening on");
    let client = stream_in_flight(listen);
    signal(cap.child.id(), first);
    cap.wait_for("stopping; draining");
    signal(cap.child.id(), second);
    let st = exit_of(&mut cap, Duration::from_secs(20));
    assert_eq!(st.code(), Some(status), "{st:?}: {:#?}", cap.log());
    cap.wait_for("exiting at once");
    client.join().unwrap();
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn capture_exits_at_once_on_a_second_sigint_with_130() {
    capture_second_signal(libc::SIGINT, libc::SIGINT, 130);
}

#[test]
fn capture_exits_at_once_on_a_second_signal_after_sigterm_with_143() {
    capture_second_signal(libc::SIGTERM, libc::SIGINT, 143);
}

/// The trace directory removed under a running capture: its journal cannot be finished,
/// and capture stops with 7 (3 before, which is compare's regression).
#[test]
fn status_7_is_a_capture_whose_trace_is_incomplete() {
    let gt = ground_truth(Duration::from_millis(1));
    let out = tmpdir("exits-incomplete");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(listen, &gt.url(), &out, &["--flush-interval", "20ms"]);
    cap.wait_for("listening on");
    stream_in_flight(listen).join().unwrap();
    let t0 = Instant::now();
    while !std::fs::read_dir(&out).unwrap().any(|e| {
        e.unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "journal")
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no journal in {out:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::remove_dir_all(&out).unwrap();
    let (st, log) = cap.terminate();
    assert_eq!(st.code(), Some(7), "{st:?}: {log:#?}");
    assert!(
        log.iter()
            .any(|l| l.starts_with("error: the trace is incomplete")),
        "{log:#?}"
    );
}

/// `sim` stops on SIGTERM as on SIGINT, with 0 (SIGTERM killed it before).
#[test]
fn sim_stops_gracefully_on_sigterm() {
    let listen = free_addr();
    let mut child = bin()
        .args([
            "sim",
            "--listen",
            &listen.to_string(),
            "--fixed-timing",
            "1,1",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("listening on"), "{line}");
    signal(child.id(), libc::SIGTERM);
    let t0 = Instant::now();
    let st = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("sim did not exit on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(st.code(), Some(0), "{st:?}");
}

/// Capture's configuration is checked once (`ProxyConfig::validate`, or clap for a value out
/// of its range), before it binds anything; each refusal names its flag and exits 2.
#[test]
fn capture_configuration_errors_name_their_flag() {
    let out = tmpdir("exits-config");
    let listen = free_addr().to_string();
    for (extra, said) in [
        (
            &["--queue-capacity", "0"][..],
            "error: --queue-capacity must be > 0",
        ),
        (&["--threads", "0"], "error: --threads must be > 0"),
        (
            &["--sample-rate", "2"],
            "'2' for '--sample-rate <SAMPLE_RATE>': \"2\" is not a share above 0 and at most 1",
        ),
        (
            &["--session-header", "Authorization"],
            "error: --session-header \"Authorization\" holds credentials",
        ),
        (
            &["--upstream", "ftp://h:1"],
            "--upstream \"ftp://h:1\": only http and https",
        ),
    ] {
        let mut args = vec!["capture", "--no-admin", "--listen", &listen];
        args.extend_from_slice(&["--out", out.to_str().unwrap()]);
        if extra[0] != "--upstream" {
            args.extend_from_slice(&["--upstream", "http://127.0.0.1:9"]);
        }
        args.extend_from_slice(extra);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(said), "{extra:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
