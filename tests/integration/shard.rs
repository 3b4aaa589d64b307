//! Sharded replay end to end: four `llmreplay replay --shard K/4 --start-at +2s` processes
//! (each against its in-process sim), then `llmreplay merge`; and four shards sharing one
//! absolute start against one ground-truth server, which sees the arrival shape of a single
//! process replaying the whole trace.

use crate::support;
use support::env::{serial, tmpdir};

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

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Starts `c` in the background, its output captured for [`finished`].
fn spawned(c: &mut Command) -> std::process::Child {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a child from [`spawned`]; asserts it succeeded.
fn finished(child: std::process::Child) {
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn four_shards_merge_into_the_whole_trace() {
    let _serial = serial();
    let dir = tmpdir("shard");
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
            let child = spawned(bin().args([
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
            ]));
            (results, child)
        })
        .collect();
    let mut shard_files = Vec::new();
    for (results, child) in children {
        finished(child);
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

/// `unix_us` as RFC 3339 with microseconds, for `--start-at`.
fn rfc3339(unix_us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(unix_us)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Replays `trace` against `url` as `shards` processes (`--shard K/N`) that share one
/// absolute start two seconds from now (as a launcher computes `+2s` once for all of them,
/// e.g. the Kubernetes guide's START_AT). Returns that start (µs since the epoch) and the
/// request ids each process sent.
fn replay_sharded(trace: &Path, url: &str, shards: usize, dir: &Path) -> (i64, Vec<Vec<String>>) {
    let start = wire::clock::epoch_us() + 2_000_000;
    let at = rfc3339(start);
    let children: Vec<(PathBuf, std::process::Child)> = (0..shards)
        .map(|k| {
            let results = dir.join(format!("shape-{shards}-{k}.parquet"));
            let mut c = bin();
            c.args(["replay", s(trace), "--target", url, "--start-at", &at, "-q"])
                .args(["--client-threads", "1", "--results", s(&results)]);
            if shards > 1 {
                c.args(["--shard", &format!("{k}/{shards}")]);
            }
            (results, spawned(&mut c))
        })
        .collect();
    let mut ids = Vec::new();
    for (results, child) in children {
        finished(child);
        let rows = trace_format::read_traces(&[s(&results)]).unwrap().records;
        ids.push(rows.into_iter().map(|r| r.request_id).collect());
    }
    (start, ids)
}

#[test]
fn four_shards_with_one_start_reproduce_the_arrival_shape_of_one_process() {
    use sim::groundtruth::{GroundTruth, GroundTruthConfig};
    let _serial = serial();
    let dir = tmpdir("shape");
    let trace = dir.join("t.parquet");
    let o = bin()
        .args(["synth", "-o", s(&trace), "--num-prompts", "240"])
        .args([
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--request-rate",
            "80",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let full = trace_format::read_traces(&[s(&trace)]).unwrap().records;
    let first = full[0].arrival_time_us;
    let offset: std::collections::HashMap<&str, i64> = full
        .iter()
        .map(|r| (r.request_id.as_str(), r.arrival_time_us - first))
        .collect();

    // One server for both runs; it logs when it had read each request.
    let server = GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: std::time::Duration::from_millis(5),
            itl: std::time::Duration::from_millis(1),
            ..Default::default()
        },
    )
    .unwrap();
    let url = server.url();
    // Server-side arrival offsets (µs after the run's start), by request id.
    let arrivals = |from: usize, start: i64| -> std::collections::HashMap<String, i64> {
        server.log()[from..]
            .iter()
            .filter_map(|l| Some((l.request_id.clone()?, l.received_unix_us - start)))
            .collect()
    };

    let (start, _) = replay_sharded(&trace, &url, 1, &dir);
    let single = arrivals(0, start);
    let seen = server.log().len();
    let (start, shard_ids) = replay_sharded(&trace, &url, 4, &dir);
    let sharded = arrivals(seen, start);
    assert_eq!(
        single.len(),
        full.len(),
        "one process: every request arrived"
    );
    assert_eq!(
        sharded.len(),
        full.len(),
        "four shards: every request arrived"
    );

    let mut diff = Vec::new();
    let mut late_single = Vec::new();
    let mut late_sharded = Vec::new();
    for (id, want) in &offset {
        let (a, b) = (single[*id], sharded[*id]);
        diff.push((b - a).abs() as f64 / 1000.0);
        late_single.push((a - want) as f64 / 1000.0);
        late_sharded.push((b - want) as f64 / 1000.0);
    }
    for v in [&mut diff, &mut late_single, &mut late_sharded] {
        v.sort_by(f64::total_cmp);
    }
    let p99 = percentile(&diff, 99.0);
    eprintln!(
        "server-side arrival: |4 shards - 1 process| p50 {:.3} ms p99 {p99:.3} ms max {:.3} ms; \
         after the trace offset: 1 process p50 {:.3} p99 {:.3} ms, 4 shards p50 {:.3} p99 {:.3} ms",
        percentile(&diff, 50.0),
        diff.last().unwrap(),
        percentile(&late_single, 50.0),
        percentile(&late_single, 99.0),
        percentile(&late_sharded, 50.0),
        percentile(&late_sharded, 99.0),
    );
    // Every shard started on the shared instant: the median of each shard's differences is
    // immune to the scheduling noise of a busy machine, and a shard started even 1 ms apart
    // shifts all of its requests.
    for (k, ids) in shard_ids.iter().enumerate() {
        let mut d: Vec<f64> = ids
            .iter()
            .map(|id| (sharded[id] - single[id]) as f64 / 1000.0)
            .collect();
        d.sort_by(f64::total_cmp);
        let median = percentile(&d, 50.0);
        assert!(
            median.abs() <= 0.5,
            "shard {k}/4 arrives {median:.3} ms (median) apart from one process"
        );
    }
    // The p99 target (2 ms) is a timing figure: bench/run.sh shards asserts it (with
    // LLMREPLAY_STRICT_TIMING=1) and records it in bench/README.md; a busy CI machine
    // adds tails of its own, so here the bound is loose.
    let bound = if std::env::var_os("LLMREPLAY_STRICT_TIMING").is_some() {
        2.0
    } else {
        20.0
    };
    assert!(
        p99 <= bound,
        "the four shards' arrival shape differs from one process's by p99 {p99:.3} ms (> {bound} ms)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
