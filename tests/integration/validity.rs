//! End-to-end tests of the validity stamp (issue 53) against the ground-truth server
//! (`sim --ground-truth --fixed-timing 50,10`: every TTFT is 50 ms, every chunk gap 10 ms).
//!
//! The client is starved for real: the replay process is pinned to one CPU
//! (`sched_setaffinity` in its `pre_exec`, what `taskset -c` does) and four threads of this
//! process spin pinned to the same CPU. The same replay alone on that CPU reads VALID and
//! exits 0; starved, its own measured timing error is over 10% of the measured TTFT p50, it
//! reads INVALID in the console, the JSON result and the report, and with `--fail-on-invalid`
//! exits 8 after writing the result; without it the stamp is kept and the exit is 0.

use crate::support;
use support::env::{serial, tmpdir};
use support::sim::SimProc;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value;

fn bin() -> String {
    std::env::var("LLMREPLAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_llmreplay").into())
}

/// The first CPU this process may run on.
fn first_cpu() -> usize {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .expect("a CPU")
    }
}

/// Pins the calling thread (pid 0: the caller) to `cpu`.
fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: as in first_cpu; sched_setaffinity reads the set.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Threads spinning on `cpu` until dropped: a CPU hog beside the client.
struct Hogs(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Hogs {
    fn start(cpu: usize, n: usize) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    pin_to(cpu).expect("pin a hog");
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                })
            })
            .collect();
        Hogs(stop, threads)
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

/// `replay TRACE --target gt=URL --save-result JSON ARGS…`, pinned to `cpu`.
fn replay_on(cpu: usize, trace: &Path, url: &str, json: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(["replay", trace.to_str().unwrap(), "--target"])
        .arg(format!("gt={url}"))
        .args(["-q", "--save-result", json.to_str().unwrap()])
        .args(args);
    // SAFETY: only sched_setaffinity (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || pin_to(cpu));
    }
    cmd.output().expect("run llmreplay replay")
}

fn stamp(json: &Path) -> Value {
    let v: Value = serde_json::from_slice(&std::fs::read(json).expect("the result")).unwrap();
    v["llmreplay"]["client"]["validity"].clone()
}

#[test]
fn a_starved_client_reads_invalid_and_a_quiet_one_valid() {
    let _alone = serial();
    let dir = tmpdir("validity");
    let trace = dir.join("t.parquet");
    let synth = Command::new(bin())
        .args(["synth", "-o", trace.to_str().unwrap()])
        .args(["--num-prompts", "150", "--input-len", "16", "--output-len"])
        .args(["30", "--request-rate", "30", "--seed", "1"])
        .output()
        .unwrap();
    assert!(synth.status.success(), "{synth:?}");
    let sim = SimProc::start(&bin(), &["--ground-truth", "--fixed-timing", "50,10"]);
    let cpu = first_cpu();

    // Alone on its CPU: VALID, exit 0, the measured TTFT the server's 50 ms.
    let quiet = dir.join("quiet.json");
    let out = replay_on(cpu, &trace, &sim.url(), &quiet, &["--fail-on-invalid"]);
    let console = String::from_utf8_lossy(&out.stdout);
    let s = stamp(&quiet);
    assert!(out.status.success(), "{out:?}\n{s:#}");
    assert_eq!(s["valid"], true, "{s:#}");
    assert!(s["error_ms"].as_f64().unwrap() <= 5.0, "{s:#}");
    assert!(
        console.contains("Validity:                                VALID: client timing error"),
        "{console}"
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&quiet).unwrap()).unwrap();
    let ttft = v["median_ttft_ms"].as_f64().unwrap();
    assert!((50.0..55.0).contains(&ttft), "TTFT p50 {ttft}");
    assert_eq!(s["references"][0]["what"], "the measured TTFT p50", "{s:#}");

    // Four hogs on its CPU: INVALID, exit 8, the result written first, the reason named.
    let starved = dir.join("starved.json");
    let out = {
        let _hogs = Hogs::start(cpu, 4);
        replay_on(cpu, &trace, &sim.url(), &starved, &["--fail-on-invalid"])
    };
    let console = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let s = stamp(&starved);
    assert_eq!(out.status.code(), Some(8), "{out:?}\n{s:#}");
    assert_eq!(s["valid"], false, "{s:#}");
    assert!(s["error_ms"].as_f64().unwrap() > s["budget_ms"].as_f64().unwrap());
    assert!(
        s["reasons"][0]
            .as_str()
            .unwrap()
            .contains("is over 10% of the measured TTFT p50"),
        "{s:#}"
    );
    assert!(
        console.contains("INVALID: client timing error"),
        "{console}"
    );
    assert!(
        stderr.contains("INVALID (gt: the client's timing error"),
        "{stderr}"
    );
    // The report says it too.
    let md = dir.join("report.md");
    let rep = Command::new(bin())
        .args([
            "report",
            starved.to_str().unwrap(),
            "-o",
            md.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(rep.status.success(), "{rep:?}");
    let md = std::fs::read_to_string(&md).unwrap();
    assert!(md.contains("## Validity (the client's own timing error against its budget)"));
    assert!(md.contains("| INVALID |"), "{md}");

    // Without --fail-on-invalid: the stamp still INVALID, the exit 0.
    let allowed = dir.join("allowed.json");
    let out = {
        let _hogs = Hogs::start(cpu, 4);
        replay_on(cpu, &trace, &sim.url(), &allowed, &[])
    };
    let s = stamp(&allowed);
    assert!(out.status.success(), "{out:?}\n{s:#}");
    assert_eq!(s["valid"], false, "{s:#}");
}
