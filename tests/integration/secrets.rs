//! End-to-end: no credential reaches what llmreplay writes, and a damaged trace file is a
//! clear error, never a panic. The real `llmreplay` binary runs against an upstream on
//! loopback that answers 401 and echoes the key it was sent (as some gateways do), with
//! `--record-bodies full` and a request body carrying an `api_key` field.

use crate::support;
use support::env::{free_addr, tmpdir};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::capture::CaptureProc;
use trace_format::Outcome;

const KEY_BEARER: &str = "sk-proj-ECHOKEYA1b2c3d4e5";
const KEY_HEADER: &str = "ECHOKEYB5e6f7g8h9";
const KEY_BODY: &str = "ECHOKEYC9h0i1j2";
const KEY_REPLAY: &str = "sk-live-ECHOKEYD3k4l5m6";
const NEEDLES: [&str; 4] = ["ECHOKEYA", "ECHOKEYB", "ECHOKEYC", "ECHOKEYD"];

/// An upstream that answers `GET /v1/models` and every POST with a 401 echoing the
/// credentials it received, in the shape named by the request's `x-echo` header: `json` (an
/// OpenAI-style error whose message quotes the bearer token), `key` (`Invalid API key: …`
/// with the `X-Api-Key` value), `raw` (plain text quoting both headers).
fn echo_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { break };
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

fn serve(s: TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    loop {
        let mut start = String::new();
        if r.read_line(&mut start).unwrap_or(0) == 0 {
            return;
        }
        let mut len = 0;
        let (mut auth, mut xkey, mut mode) = (String::new(), String::new(), String::new());
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            let v = v.trim().to_string();
            match k.to_ascii_lowercase().as_str() {
                "content-length" => len = v.parse().unwrap_or(0),
                "authorization" => auth = v,
                "x-api-key" => xkey = v,
                "x-echo" => mode = v,
                _ => {}
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let (status, ctype, text) = if start.starts_with("GET /v1/models") {
            (
                "200 OK",
                "application/json",
                r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#.to_string(),
            )
        } else {
            let token = auth.strip_prefix("Bearer ").unwrap_or(&auth);
            match mode.as_str() {
                "key" => (
                    "401 Unauthorized",
                    "application/json",
                    format!(r#"{{"error":{{"message":"Invalid API key: {xkey}","code":401}}}}"#),
                ),
                "raw" => (
                    "401 Unauthorized",
                    "text/plain",
                    format!("Unauthorized.\nAuthorization: {auth}\nX-Api-Key: {xkey}\n"),
                ),
                _ => (
                    "401 Unauthorized",
                    "application/json",
                    format!(
                        r#"{{"error":{{"message":"Incorrect API key provided: {token}.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
                    ),
                ),
            }
        };
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        );
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// A raw HTTP/1.1 POST; returns the status code.
fn post(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Every file below `dir` (journals, Parquet, JSON) holds none of the keys.
fn assert_no_key_in(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let bytes = std::fs::read(&p).unwrap();
        for needle in NEEDLES {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} found in {}",
                p.display()
            );
        }
        n += 1;
    }
    n
}

#[test]
fn keys_echoed_by_the_upstream_or_in_bodies_are_written_nowhere() {
    let up = echo_upstream();
    let out = tmpdir("capture");
    let listen = free_addr();
    let upstream = format!("http://{up}");
    let flags = ["--record-bodies", "full", "--flush-interval", "20ms"];
    let mut cap = CaptureProc::spawn(listen, &upstream, &out, &flags);
    cap.wait_for("listening on");
    let auth = format!("Bearer {KEY_BEARER}");
    let body = format!(
        r#"{{"model":"m","prompt":"hello","max_tokens":2,"api_key":"{KEY_BODY}","user":"u1"}}"#
    );
    for mode in ["json", "key", "raw"] {
        let headers = [
            ("authorization", auth.as_str()),
            ("x-api-key", KEY_HEADER),
            ("x-echo", mode),
        ];
        assert_eq!(
            post(listen, "/v1/completions", &body, &headers),
            401,
            "{mode}"
        );
    }
    // The journal on disk (before any Parquet is written) already holds the rows. Checked
    // before the capture stops, asserted after (a failure must not leave the child running).
    std::thread::sleep(Duration::from_millis(300));
    let journal = std::panic::catch_unwind(|| assert_no_key_in(&out));
    let (status, log) = cap.terminate();
    match journal {
        Ok(n) => assert!(n > 0, "no journal written"),
        Err(e) => std::panic::resume_unwind(e),
    }
    assert!(status.success(), "{status:?}: {log:#?}");
    assert!(assert_no_key_in(&out) > 0);

    let t = trace_format::read_traces(&[out.to_str().unwrap()]).expect("read capture");
    assert_eq!(t.records.len(), 3);
    for r in &t.records {
        assert_eq!(r.outcome, Outcome::HttpError);
        let e = r.error.as_deref().unwrap_or_default();
        assert!(e.starts_with("HTTP 401") && e.contains("***"), "{e}");
        // The stored body is still the request's JSON, with the key's value masked.
        let b: serde_json::Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
        assert_eq!(b["api_key"], "***");
        assert_eq!(b["prompt"], "hello");
        assert_eq!(b["max_tokens"], 2);
        assert_eq!(b["user"], "u1");
    }

    // Replay the capture against the same upstream with a key of its own: the results
    // Parquet, the detailed JSON result and the console keep none of it.
    let res = tmpdir("replay");
    let results = res.join("run.parquet");
    let json = res.join("run.json");
    let o = Command::new(env!("CARGO_BIN_EXE_llmreplay"))
        .args(["replay", out.to_str().unwrap(), "--target"])
        .arg(format!("echo={upstream}"))
        .args([
            "--api-key",
            KEY_REPLAY,
            "--header",
            "x-echo:json",
            "--max-failed",
            "1",
        ])
        .arg("--results")
        .arg(&results)
        .arg("--save-result")
        .arg(&json)
        .arg("--save-detailed")
        .stdin(Stdio::null())
        .output()
        .expect("run replay");
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{console}");
    for needle in NEEDLES {
        assert!(
            !console.contains(needle),
            "{needle} on the console: {console}"
        );
    }
    assert_eq!(assert_no_key_in(&res), 2);
    let t = trace_format::read_traces(&[results.to_str().unwrap()]).expect("read results");
    assert_eq!(t.records.len(), 3);
    for r in &t.records {
        let e = r.error.as_deref().unwrap_or_default();
        assert!(e.contains("sk-***"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&res);
}

/// A trace file with one damaged data page (kept in `trace-format/tests/fuzz-regressions/`)
/// made `inspect`, `replay` and `export` panic inside arrow (exit 101). Each now exits 1 with
/// an error naming the file.
#[test]
fn a_damaged_trace_file_is_an_error_naming_it_in_every_command() {
    let dir = tmpdir("damaged");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("trace-format/tests/fuzz-regressions/parquet/bit-chunk-offset-out-of-bounds.parquet");
    let file = dir.join("damaged.parquet");
    std::fs::copy(&src, &file).unwrap();
    let f = file.to_str().unwrap();
    let out = dir.join("out.jsonl");
    let runs: [Vec<&str>; 3] = [
        vec!["inspect", f],
        vec!["replay", f, "-q"],
        vec!["export", f, "-o", out.to_str().unwrap()],
    ];
    for args in runs {
        let o = Command::new(env!("CARGO_BIN_EXE_llmreplay"))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run llmreplay");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("damaged.parquet"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
