//! Issue 39, finding 5 and its polish list, end to end: input that must be refused at once,
//! an upstream that is down, and what a new user trips on (errors, help, README). Real
//! processes, real sockets on loopback.

use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, serial, tmpdir};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sim::groundtruth::{GroundTruth, GroundTruthConfig};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llmreplay"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `text` with every run of whitespace one space (help text wraps where it likes).
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn synth(dir: &Path, n: &str) -> PathBuf {
    let p = dir.join("t.parquet");
    let o = run(&[
        "synth",
        "-o",
        p.to_str().unwrap(),
        "--num-prompts",
        n,
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--request-rate",
        "20",
    ]);
    assert!(o.status.success(), "synth: {}", stderr(&o));
    p
}

/// A GET on loopback: (status, body), bounded.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    Ok((status, body))
}

/// Polls `f` every 50 ms until it holds, for at most `within`.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Finding 5: `--target http://HOST/v1/chat/completions` passed the start-up probe, then
/// sent every request to `/v1/chat/completions/v1/chat/completions` (404) and exited 4. It is
/// refused before anything is sent, with the base URL to use.
#[test]
fn a_target_naming_an_endpoint_is_refused_before_anything_is_sent() {
    let _g = serial();
    let dir = tmpdir("polish-target");
    let trace = synth(&dir, "5");
    let server = GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(1),
            itl: Duration::from_millis(1),
            ..Default::default()
        },
    )
    .expect("ground-truth server");
    let target = format!("{}/v1/chat/completions", server.url());
    let o = run(&[
        "replay",
        trace.to_str().unwrap(),
        "--target",
        &target,
        "--quiet",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("base URL") && err.contains(&format!("--target {} ", server.url())),
        "{err}"
    );
    assert!(server.log().is_empty(), "requests were sent");
    let help = squash(&stdout(&run(&["replay", "--help"])));
    assert!(help.contains("is refused with its base URL"), "{help}");
}

/// Finding 5: capture started with its upstream down said nothing, `/healthz` said ok and
/// every request got 502. Now: a warning at start, `/readyz` 503 while the upstream is
/// unreachable (`/healthz`, liveness, stays 200), the gauge at 0; and when the upstream comes
/// up, a line in the log, `/readyz` 200 and the gauge at 1.
#[test]
fn capture_with_its_upstream_down_warns_and_is_not_ready_until_it_is_up() {
    let _g = serial();
    let dir = tmpdir("polish-upstream-down");
    let up_addr = free_addr();
    let (listen, admin) = (free_addr(), free_addr());
    let mut cap = CaptureProc::spawn_admin(
        env!("CARGO_BIN_EXE_llmreplay"),
        listen,
        admin,
        &format!("http://{up_addr}"),
        &dir.join("out"),
        &[],
    );
    let warning = cap.wait_for("warning: the upstream");
    assert!(
        warning.contains(&up_addr.to_string()) && warning.contains("is unreachable"),
        "{warning}"
    );
    // The admin listener is bound before the check starts.
    assert_eq!(http_get(admin, "/healthz").unwrap().0, 200);
    let (status, body) = http_get(admin, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("unreachable"), "{body}");
    let (_, metrics) = http_get(admin, "/metrics").unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "llmreplay_capture_upstream_up 0"),
        "{metrics}"
    );

    // The upstream comes up (a listener is all the check needs).
    let upstream = std::net::TcpListener::bind(up_addr).expect("bind the upstream's port");
    cap.wait_for("is reachable again");
    assert!(eventually(Duration::from_secs(5), || http_get(
        admin, "/readyz"
    )
    .is_ok_and(|(s, _)| s == 200)));
    let (_, metrics) = http_get(admin, "/metrics").unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "llmreplay_capture_upstream_up 1"),
        "{metrics}"
    );
    drop(upstream);
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
}

/// Polish: `capture --out afile` printed "afile: File exists (os error 17)" twice.
#[test]
fn capture_says_an_out_that_is_a_file_once() {
    let dir = tmpdir("polish-out-file");
    let afile = dir.join("afile");
    std::fs::write(&afile, b"x").unwrap();
    let o = run(&[
        "capture",
        "--upstream",
        "http://127.0.0.1:9",
        "--out",
        afile.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--no-admin",
    ]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert_eq!(err.matches("File exists").count(), 1, "{err}");
}

/// Polish: `inspect result.json` said "Invalid Parquet file. Corrupt footer".
#[test]
fn inspect_names_a_result_json_for_what_it_is() {
    let dir = tmpdir("polish-inspect-json");
    let p = dir.join("result.json");
    std::fs::write(&p, "{\n  \"backend\": \"openai\",\n  \"completed\": 3\n}\n").unwrap();
    let o = run(&["inspect", p.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("result JSON") && err.contains("llmreplay report"),
        "{err}"
    );
    assert!(!err.contains("Corrupt footer"), "{err}");
}

/// Polish: `replay --help` (132 lines) did not say which flags only configure the in-process
/// sim; they are under their own heading, after every other flag.
#[test]
fn replay_help_puts_the_sim_only_flags_under_their_own_heading() {
    let help = stdout(&run(&["replay", "--help"]));
    let heading = "In-process sim (only without --target):";
    let at = help
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} in\n{help}"));
    for flag in [
        "--profile",
        "--fixed-timing",
        "--tokens-per-chunk",
        "--sim-seed",
        "--served-model-name",
        "--error-rate",
        "--rate-limit-rate",
        "--reset-rate",
        "--stall-rate",
        "--stall <",
    ] {
        let f = help.find(&format!("      {flag}")).unwrap_or(0);
        assert!(f > at, "{flag} is not under {heading:?}");
    }
    for flag in ["--target", "--speedup", "--sweep"] {
        let f = help.find(&format!("      {flag}")).expect(flag);
        assert!(f < at, "{flag} is under {heading:?}");
    }
}

/// Polish: `capture --help` said `--threads` gives each thread its own listener with
/// SO_REUSEPORT; the threads share one listening socket.
#[test]
fn capture_help_says_the_threads_share_one_socket() {
    let help = stdout(&run(&["capture", "--help"]));
    let threads = &help[help.find("--threads").expect("--threads")..];
    let threads = squash(&threads[..threads.find("\n      --").unwrap_or(threads.len())]);
    assert!(threads.contains("one shared listening socket"), "{threads}");
    assert!(!threads.contains("own listener"), "{threads}");
    assert!(help.contains("/readyz"), "{help}");
    assert!(help.contains("--upstream-check-interval"), "{help}");
}

/// Polish: the README did not say how to get `llmreplay` onto PATH; its commands assume it.
#[test]
fn the_readme_says_how_to_put_llmreplay_on_path() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let install = readme
        .find("## Install")
        .expect("an Install section in the README");
    let using = readme.find("## Using it").expect("Using it");
    assert!(
        install < using,
        "Install comes before the commands that need it"
    );
    let section = &readme[install..using];
    assert!(
        section.contains("cargo install --path . --locked"),
        "{section}"
    );
    assert!(section.contains("PATH"), "{section}");
}
