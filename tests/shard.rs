//! Sharded replay end to end: four `llmreplay replay --shard K/4 --start-at +2s` processes
//! (each against its in-process sim), then `llmreplay merge`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use trace_format::stats::percentile;
use trace_format::Outcome;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_llmreplay"))
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmreplay-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn four_shards_merge_into_the_whole_trace() {
    let dir = tempdir("shard");
    let trace = dir.join("t.parquet");
    let o = bin()
        .args([
            "synth",
            "-o",
            s(&trace),
            "--num-prompts",
            "120",
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--request-rate",
            "60",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let full = trace_format::read_traces(&[s(&trace)]).unwrap().records;
    let first = full[0].arrival_time_us;

    // All four start their clocks at the same instant, two seconds from now.
    let start_at = "+2s";
    let children: Vec<(PathBuf, std::process::Child)> = (0..4)
        .map(|k| {
            let results = dir.join(format!("r{k}.parquet"));
            let child = bin()
                .args([
                    "replay",
                    s(&trace),
                    "--shard",
                    &format!("{k}/4"),
                    "--start-at",
                    start_at,
                    "--fixed-timing",
                    "5,1",
                    "--client-threads",
                    "1",
                    "--results",
                    s(&results),
                    "-q",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (results, child)
        })
        .collect();
    let mut shard_files = Vec::new();
    for (results, child) in children {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        shard_files.push(results);
    }

    // Each shard's rows keep their offsets in the full trace, and shards are disjoint.
    let mut shard_starts = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for f in &shard_files {
        let mut starts = Vec::new();
        let rows = trace_format::read_traces(&[s(f)]).unwrap().records;
        assert!(!rows.is_empty(), "{} is empty", f.display());
        for r in &rows {
            assert!(seen.insert(r.request_id.clone()), "{} twice", r.request_id);
            let want = full
                .iter()
                .find(|t| t.request_id == r.request_id)
                .map(|t| t.arrival_time_us - first)
                .unwrap();
            let got = r.scheduled_offset_us.unwrap();
            assert!(
                (got - want).abs() <= 1,
                "{}: scheduled at {got} µs, trace offset {want} µs",
                r.request_id
            );
            starts.push(
                r.arrival_time_us
                    - got
                    - r.dispatch_lag_us.unwrap_or(0)
                    - r.queue_us.unwrap_or(0)
                    - r.connect_us.unwrap_or(0),
            );
        }
        // Every row of one run points back to the same start, to µs rounding.
        let spread = starts.iter().max().unwrap() - starts.iter().min().unwrap();
        assert!(
            spread <= 10,
            "{}: row starts {spread} µs apart",
            f.display()
        );
        shard_starts.push(*starts.iter().min().unwrap());
    }
    assert_eq!(seen.len(), full.len(), "the shards cover the trace");
    // `+2s` is relative to each process's own launch: the shards start as far apart as
    // their launches were (milliseconds), not two seconds after their plans were ready.
    let spread = shard_starts.iter().max().unwrap() - shard_starts.iter().min().unwrap();
    assert!(spread <= 300_000, "shards started {spread} µs apart");

    let merged = dir.join("merged");
    let mut args = vec!["merge".to_string()];
    args.extend(shard_files.iter().map(|p| s(p).to_string()));
    args.extend(["-o".into(), s(&merged).into()]);
    let o = bin().args(&args).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));

    let rows = trace_format::read_traces(&[s(&dir.join("merged.parquet"))])
        .unwrap()
        .records;
    assert_eq!(rows.len(), full.len());
    let mut ttft: Vec<f64> = rows
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .filter_map(|r| r.ttft_us)
        .map(|t| t as f64 / 1000.0)
        .collect();
    assert_eq!(ttft.len(), full.len(), "every request completed");
    ttft.sort_by(f64::total_cmp);
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("merged.json")).unwrap()).unwrap();
    assert_eq!(v["completed"], full.len());
    let p99 = v["p99_ttft_ms"].as_f64().unwrap();
    let want = percentile(&ttft, 99.0);
    assert!(
        (p99 - want).abs() < 1e-9,
        "merged p99 TTFT {p99} vs {want} over all rows"
    );
    assert_eq!(v["llmreplay"]["merge"]["runs"].as_array().unwrap().len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}
