//! End-to-end accuracy on loopback: replay against the ground-truth server (known timing:
//! TTFT 50 ms, then chunks 10 ms apart carrying 4 tokens each) at 100 concurrent streams.
//! Mean TTFT, ITL and TPOT must be within 1 ms of the script, and output tokens must come
//! from usage, not from the chunk count.

use std::time::Duration;

use replay::config::{Arrivals, Target};
use replay::ReplayConfig;
use sim::groundtruth::{GroundTruth, GroundTruthConfig};
use trace_format::{Outcome, TokenSource, TraceRecord};

/// `n` requests arriving 1 ms apart: each lasts 290 ms, so 100 of them are all in flight at
/// once, without every stream's chunks falling due at the same instant (a burst at t=0 is a
/// connection-storm scenario of its own, measured in bench/).
fn trace(n: usize, stream: bool) -> Vec<TraceRecord> {
    crate::rows("req", n, 1000, (10, 100), stream)
}

/// 25 chunks for the trace's 100 output tokens (replay sends them as `max_tokens`).
const SCRIPT: GroundTruthConfig = GroundTruthConfig {
    ttft: Duration::from_millis(50),
    itl: Duration::from_millis(10),
    tokens_per_chunk: 4,
    default_max_tokens: 100,
};

fn server() -> GroundTruth {
    GroundTruth::start("127.0.0.1:0".parse().unwrap(), SCRIPT).expect("ground-truth server")
}

#[test]
fn metrics_match_the_script_at_100_concurrent_streams() {
    let _turn = crate::turn(module_path!());
    let server = server();
    let cfg = ReplayConfig::new(vec![Target {
        name: "scripted".into(),
        url: server.url(),
    }]);
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &trace(100, true),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .expect("replay runs");
    let (run, m) = &runs[0];
    assert_eq!(m.completed, 100, "outcomes: {:?}", m.outcomes);
    assert_eq!(
        m.max_concurrent_requests, 100,
        "all 100 streams in flight at once"
    );
    // The discovery request's connection is pooled too, so 99 more make 100.
    assert!(
        run.preconnected >= 99,
        "the pool is opened before the clock starts: {}",
        run.preconnected
    );
    assert!(
        run.records.iter().all(|r| r.new_connection == Some(false)),
        "no request paid for connecting"
    );

    // Output tokens from usage (100), not the chunk count (25).
    for r in &run.records {
        assert_eq!(r.output_tokens, Some(100));
        assert_eq!(r.output_tokens_source, Some(TokenSource::Usage));
        assert_eq!(r.chunk_times_us.len(), 25);
    }
    assert_eq!(m.total_output_tokens, 100 * 100);

    let log = server.log();
    assert_eq!(log.len(), 100);
    let server_ttft: f64 = log
        .iter()
        .map(|l| l.chunk_written_us[0] as f64 / 1e3)
        .sum::<f64>()
        / log.len() as f64;
    let first_rx = log.iter().map(|l| l.received).min().unwrap();
    let spread = log
        .iter()
        .map(|l| (l.received - first_rx).as_secs_f64() * 1e3)
        .fold(0.0, f64::max);
    eprintln!(
        "server's own TTFT mean {server_ttft:.3} ms; requests received over {spread:.3} ms; client dispatch lag p50 {:.3} max {:.3} ms",
        m.dispatch_lag.median, m.dispatch_lag.max
    );
    let tpot_script = (SCRIPT.itl.as_secs_f64() * 1e3 * 24.0) / 99.0;
    eprintln!(
        "TTFT mean {:.3} ms (script 50), ITL mean {:.3} ms (script 10), TPOT mean {:.3} ms (script {tpot_script:.3})",
        m.ttft.mean, m.itl.mean, m.tpot.mean
    );
    // CI asserts formulas, not the machine's speed (issue 6: no timing assertions; the
    // accuracy figures are bench/run.sh's). The tolerances are far below what a wrong
    // formula gives: TPOT over chunks instead of tokens reads 10 ms, not 2.42; ITL per
    // token instead of per chunk 2.5 ms, not 10; a TTFT taken at the second chunk or before
    // the request was sent is off by a 10 ms chunk gap or more.
    assert!((m.itl.mean - 10.0).abs() <= 2.0, "ITL mean {}", m.itl.mean);
    assert!(
        (m.tpot.mean - tpot_script).abs() <= 1.0,
        "TPOT mean {}",
        m.tpot.mean
    );

    // Against what the server logged it actually did (first write − request read), which
    // absorbs the server's own lateness on a busy machine: the client's TTFT is that plus
    // transport, never less, and less than half a chunk gap more.
    assert!(
        m.ttft.mean >= server_ttft - 0.5,
        "client TTFT {} below the server's own {}",
        m.ttft.mean,
        server_ttft
    );
    assert!(
        m.ttft.mean - server_ttft <= 5.0,
        "client adds {} ms to the server's TTFT {server_ttft}",
        m.ttft.mean - server_ttft
    );
}

#[test]
fn non_streamed_requests_use_the_whole_response() {
    let _turn = crate::turn(module_path!());
    let server = server();
    let mut cfg = ReplayConfig::new(vec![Target {
        name: "s".into(),
        url: server.url(),
    }]);
    cfg.arrivals = Arrivals::Rate {
        rate: f64::INFINITY,
        burstiness: 1.0,
    };
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &trace(5, false),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .expect("replay runs");
    let (run, m) = &runs[0];
    assert_eq!(m.completed, 5);
    let log = server.log();
    assert_eq!(log.len(), 5);
    assert!(log.iter().all(|l| !l.stream), "{log:?}");
    // When the server wrote each whole answer, ms after reading its request: the script's
    // 290 ms, never earlier, and later by what the server's own thread was late (CI,
    // 2026-12-07: one answer written 295.8 ms in). The client's E2EL is held to what the
    // server did, not to the script.
    let written: Vec<f64> = log
        .iter()
        .map(|l| *l.chunk_written_us.last().expect("one write") as f64 / 1e3)
        .collect();
    let (lo, hi) = (
        written.iter().copied().fold(f64::INFINITY, f64::min),
        written.iter().copied().fold(0.0, f64::max),
    );
    assert!(
        lo >= 289.5,
        "the server answered before its script: {written:?}"
    );
    for r in &run.records {
        assert!(!r.stream);
        assert!(r.chunk_times_us.is_empty());
        assert_eq!(r.output_tokens, Some(100));
        let e2el = r.e2el_us.unwrap() as f64 / 1e3;
        assert!(
            e2el >= lo - 0.5 && e2el <= hi + 5.0,
            "E2EL {e2el} against the server's writes {written:?}"
        );
    }
}

#[test]
fn unreachable_target_is_an_error_not_a_hang() {
    let _turn = crate::turn(module_path!());
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = ReplayConfig::new(vec![Target {
        name: "gone".into(),
        url: format!("http://127.0.0.1:{port}"),
    }]);
    let err = replay::replay(
        &cfg.validate().unwrap(),
        &trace(3, true),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
}

#[test]
fn failed_requests_are_recorded_outcomes() {
    let _turn = crate::turn(module_path!());
    // The sim with forced faults: 500, 429 and a reset mid-stream, each recorded per request.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(sim::start(
            "127.0.0.1:0".parse().unwrap(),
            sim::SimConfig {
                timing: sim::Timing::Fixed {
                    ttft: Duration::from_millis(5),
                    itl: Duration::from_millis(1),
                },
                ..Default::default()
            },
        ))
        .unwrap();
    let mut out = Vec::new();
    for fault in ["error", "rate-limit", "reset"] {
        let mut cfg = ReplayConfig::new(vec![Target {
            name: fault.into(),
            url: sim.url(),
        }]);
        cfg.request.headers = vec![("x-sim-fault".into(), fault.into())];
        let runs = replay::replay(
            &cfg.validate().unwrap(),
            &trace(2, true),
            None,
            &|_, _| {},
            &mut replay::sink::NoSink,
            &replay::Stop::new(),
        )
        .expect("a failing server still gives a run");
        out.push((fault, runs.into_iter().next().unwrap()));
    }
    for (fault, (run, m)) in &out {
        assert_eq!(m.failed, 2, "{fault}: {:?}", m.outcomes);
        for r in &run.records {
            match *fault {
                "error" => assert_eq!((r.outcome, r.status), (Outcome::HttpError, Some(500))),
                "rate-limit" => assert_eq!((r.outcome, r.status), (Outcome::HttpError, Some(429))),
                _ => {
                    assert_eq!(r.outcome, Outcome::UpstreamError, "{r:?}");
                    assert!(
                        r.error.as_deref().unwrap_or("").contains("chunks"),
                        "{:?}",
                        r.error
                    );
                }
            }
        }
    }
    rt.block_on(sim.shutdown());
}
