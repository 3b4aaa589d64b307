//! What `replay --results` costs written as rows finish ([`results::parquet_sink::ResultsSink`])
//! against holding every row and writing the file at the end (`store::write_trace`, what a
//! replay did before): the time a row costs the thread that hands it over, the wall time to a
//! finished file, and the process's peak RSS. Run each mode in its own process:
//!
//! ```sh
//! cargo run --release -p results --example results_sink -- sink 1000000
//! cargo run --release -p results --example results_sink -- memory 1000000
//! ```

use std::time::Instant;

use replay::RowSink;
use trace_format::{FileMeta, Producer, TraceRecord};

/// A streamed request's row as a replay writes it: 128 output chunks.
fn row(i: usize) -> TraceRecord {
    let mut r = TraceRecord::new(
        format!("req-{i:09}"),
        1_767_323_045_000_000 + i as i64 * 1_000,
        "/v1/completions",
    );
    r.stream = true;
    r.model = Some("llama-3.1-8b".into());
    r.prompt_tokens = Some(1024);
    r.output_tokens = Some(128);
    r.max_tokens = Some(128);
    r.status = Some(200);
    r.ttft_us = Some(50_000);
    r.chunk_times_us = (0..128).map(|k| 50_000 + k * 10_000).collect();
    r.e2el_us = r.chunk_times_us.last().copied();
    r.scheduled_offset_us = Some(i as i64 * 1_000);
    r.dispatch_lag_us = Some(12);
    r.queue_us = Some(0);
    r.connect_us = Some(0);
    r.target = Some("cand".into());
    r.run_id = Some("bench-0".into());
    r
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("sink", String::as_str).to_string();
    let n: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let dir = std::env::temp_dir().join(format!("llmreplay-bench-sink-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let path = dir.join("run.parquet");
    let meta = FileMeta::new(Producer::Replay, "bench results_sink");
    let t0 = Instant::now();
    let mut handing = std::time::Duration::ZERO;
    match mode.as_str() {
        "sink" => {
            let mut sink = results::parquet_sink::ResultsSink::create(&path, meta).expect("sink");
            for i in 0..n {
                let r = row(i);
                let t = Instant::now();
                sink.row(&r).expect("row");
                handing += t.elapsed();
            }
            let fed = t0.elapsed();
            sink.close().expect("close");
            println!(
                "sink: every row handed over after {:.2} s, the file finished {:.2} s later",
                fed.as_secs_f64(),
                (t0.elapsed() - fed).as_secs_f64()
            );
        }
        "memory" => {
            let mut rows = Vec::new();
            for i in 0..n {
                let r = row(i);
                let t = Instant::now();
                rows.push(r);
                handing += t.elapsed();
            }
            store::write_trace(&path, &rows, &meta).expect("write");
        }
        m => panic!("mode {m}: sink or memory"),
    }
    let wall = t0.elapsed();
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "{mode}: {n} rows, {:.2} µs per row on the caller, {:.2} s to a finished file \
         ({:.0} rows/s), file {:.0} MB, peak RSS {:.0} MB",
        handing.as_secs_f64() * 1e6 / n as f64,
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64(),
        bytes as f64 / 1e6,
        peak_rss_mb()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
