//! Nothing before a replay's first request reads the whole trace (issue 21): the stream
//! opens from the files' footers and the trace's content hash is taken as the run reads the
//! rows, or read at the end when the run stopped early. The real binary against its
//! in-process sim: the result names the whole trace, whatever part of it ran.

use crate::support;
use support::env::tmpdir;

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn run(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_llmreplay"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "llmreplay {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A replay of `trace` with `extra` flags: the JSON result's trace hash and the results
/// file's.
fn replay_hashes(trace: &Path, dir: &Path, tag: &str, extra: &[&str]) -> (String, String) {
    let json = dir.join(format!("{tag}.json"));
    let results = dir.join(format!("{tag}.parquet"));
    let mut args = vec![
        "replay",
        s(trace),
        "-q",
        "--request-rate",
        "inf",
        "--save-result",
        s(&json),
        "--results",
        s(&results),
    ];
    args.extend_from_slice(extra);
    run(&args);
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let from_json = doc["llmreplay"]["trace"]["content_hash"]
        .as_str()
        .unwrap()
        .to_string();
    let r = trace_format::read_traces(&[s(&results)]).unwrap();
    let from_results = r.files[0].meta.extra["trace_content_hash"].clone();
    (from_json, from_results)
}

#[test]
fn the_result_names_the_whole_trace_whether_the_run_read_all_of_it_or_stopped_early() {
    let dir = tmpdir("hash");
    let trace = dir.join("t.parquet");
    run(&[
        "synth",
        "-o",
        s(&trace),
        "--num-prompts",
        "3000",
        "--input-len",
        "8",
        "--output-len",
        "1",
        "--request-rate",
        "1000",
    ]);
    let want = trace_format::read_traces(&[s(&trace)])
        .unwrap()
        .content_hash();
    // The whole trace: hashed as the feed read it.
    let (json, results) = replay_hashes(&trace, &dir, "all", &[]);
    assert_eq!(
        (json.as_str(), results.as_str()),
        (want.as_str(), want.as_str())
    );
    // Ten requests: the feed stopped reading after them, the rest of the ids were read at
    // the end.
    let (json, results) = replay_hashes(&trace, &dir, "ten", &["--max-requests", "10"]);
    assert_eq!(
        (json.as_str(), results.as_str()),
        (want.as_str(), want.as_str())
    );
    let _ = std::fs::remove_dir_all(&dir);
}
