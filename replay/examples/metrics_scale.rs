//! What the metrics of a long run cost: `N` synthetic result rows (1,000 requests a second,
//! streamed, E2EL 20 ms to 2 s, three chunks, 1% failing with distinct error texts) added to
//! a `replay::metrics::MetricsBuilder` one at a time, as a run finishes them. Prints JSON:
//! wall and CPU ns per row, peak RSS (VmHWM) and what the builder holds, sampled through the run, so
//! rerunning with a 10× larger `N` shows whether memory stays flat.
//!
//! usage: metrics_scale N

use std::time::Instant;

use replay::metrics::MetricsBuilder;
use trace_format::{Outcome, TraceRecord};

fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// CPU time of this process so far (user + system), s: unlike wall time, not inflated by
/// other work on the machine.
fn cpu_s() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Peak resident set of this process, MiB (Linux; 0 elsewhere).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn main() {
    let n: u64 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("usage: metrics_scale N (rows, > 0)");
            std::process::exit(2);
        }
    };
    let mut b = MetricsBuilder::new(0, &[], &[50.0, 99.0, 99.9]);
    let mut r = TraceRecord::new("r", 0, "/v1/completions");
    r.stream = true;
    r.output_tokens = Some(3);
    r.prompt_tokens = Some(100);
    let mut samples = Vec::new();
    let (t0, c0) = (Instant::now(), cpu_s());
    for i in 0..n {
        let x = mix(i);
        let e = 20_000 + (x % 1_980_000) as i64;
        r.arrival_time_us = i as i64 * 1000;
        r.scheduled_offset_us = Some(r.arrival_time_us);
        r.chunk_times_us.clear();
        r.chunk_times_us.extend([e / 4, e / 2, e]);
        (r.ttft_us, r.e2el_us) = (Some(e / 4), Some(e));
        r.dispatch_lag_us = Some(((x >> 32) % 3000) as i64);
        r.queue_us = Some(0);
        if i % 100 == 0 {
            r.outcome = Outcome::HttpError;
            r.error = Some(format!("HTTP 500: request {i}"));
        } else {
            r.outcome = Outcome::Ok;
            r.error = None;
        }
        b.add(&r);
        if (i + 1) % (n / 10).max(1) == 0 {
            samples.push(format!(
                "{{\"rows\":{},\"retained\":{},\"peak_rss_mib\":{:.1}}}",
                i + 1,
                b.retained(),
                peak_rss_mib()
            ));
        }
    }
    let (added, cpu) = (t0.elapsed(), cpu_s() - c0);
    let t1 = Instant::now();
    let m = b.finish();
    let finish = t1.elapsed();
    println!(
        "{{\"rows\":{n},\"ns_per_row\":{:.1},\"cpu_ns_per_row\":{:.1},\"finish_ms\":{:.1},\"peak_rss_mib\":{:.1},\
         \"e2el_p99_ms\":{},\"e2el_estimate\":{},\"through_the_run\":[{}]}}",
        added.as_nanos() as f64 / n as f64,
        cpu * 1e9 / n as f64,
        finish.as_secs_f64() * 1e3,
        peak_rss_mib(),
        m.e2el.get(99.0).unwrap_or(f64::NAN),
        m.e2el.estimate.map_or("null".into(), |e| e.to_string()),
        samples.join(",")
    );
}
