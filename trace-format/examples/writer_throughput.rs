//! Capture's trace writer alone, for `bench/run.sh cost`: how many records per second it
//! takes (journal line + in-memory batch + Parquet file at rotation and close) and how many
//! bytes a request costs on disk.
//!
//! Records look like a capture of a streamed chat completion: 100 chunk times with jitter,
//! token counts, 64 prefix-block hashes (a 1,024-token prompt at block size 16), status and
//! model. Prints one JSON object.
//!
//! usage: writer_throughput DIR [RECORDS]

use std::time::Instant;

use trace_format::schema::{Outcome, Producer, TokenSource, TraceRecord};
use trace_format::{FileMeta, TraceWriter, WriterConfig};

/// A small deterministic generator (xorshift), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn record(i: u64, rng: &mut Rng) -> TraceRecord {
    let arrival = 1_795_000_000_000_000 + (i as i64) * 1_000;
    let mut r = TraceRecord::new(format!("req-{i:08}"), arrival, "/v1/chat/completions");
    r.session_id = Some(format!("s-{}", i % 97));
    r.model = Some("Qwen/Qwen3-8B".into());
    r.stream = true;
    r.prompt_tokens = Some(800 + (rng.next() % 400) as i64);
    r.prompt_tokens_source = Some(TokenSource::Usage);
    r.output_tokens = Some(100);
    r.output_tokens_source = Some(TokenSource::Usage);
    r.max_tokens = Some(256);
    r.status = Some(200);
    r.outcome = Outcome::Ok;
    let ttft = 40_000 + (rng.next() % 30_000) as i64;
    let mut t = ttft;
    r.chunk_times_us = (0..100)
        .map(|_| {
            let now = t;
            t += 9_000 + (rng.next() % 2_500) as i64;
            now
        })
        .collect();
    r.ttft_us = Some(ttft);
    r.e2el_us = r.chunk_times_us.last().copied();
    r.prefix_hashes = Some((0..64).map(|_| rng.next()).collect());
    r.request_bytes = 4_200 + (rng.next() % 1_000) as i64;
    r.response_bytes = 19_000 + (rng.next() % 2_000) as i64;
    r
}

fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: writer_throughput DIR [RECORDS]");
        std::process::exit(2);
    };
    let n: u64 = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let meta = FileMeta::new(Producer::Capture, "writer_throughput");
    let cfg = WriterConfig::new(dir, "bench", meta);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let records: Vec<TraceRecord> = (0..n).map(|i| record(i, &mut rng)).collect();
    let (mut w, _) = match TraceWriter::open(cfg) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("writer_throughput: {e}");
            std::process::exit(1);
        }
    };
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    for r in records {
        if let Err(e) = w.append(r) {
            eprintln!("writer_throughput: {e}");
            std::process::exit(1);
        }
    }
    let files = match w.close() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("writer_throughput: {e}");
            std::process::exit(1);
        }
    };
    let wall = t0.elapsed().as_secs_f64();
    let cpu = match (cpu0, cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "{{\"records\":{n},\"files\":{},\"wall_seconds\":{wall:.3},\"cpu_seconds\":{cpu:.3},\"records_per_second\":{:.0},\"parquet_bytes\":{bytes},\"bytes_per_record\":{:.1}}}",
        files.len(),
        n as f64 / wall,
        bytes as f64 / n as f64
    );
}
