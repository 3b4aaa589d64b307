//! A burst on loopback: requests due at one instant leave one after another, and the wait
//! for those sent first (or for a concurrency slot) is client queue time, not dispatch lag.
//! Its own test binary, so its 200-request burst does not share the CPU with the timing
//! checks in `accuracy.rs` (tests of one binary run in parallel).

use std::time::Duration;

use replay::config::Target;
use replay::ReplayConfig;
use sim::groundtruth::{GroundTruth, GroundTruthConfig};
use trace_format::TraceRecord;

/// `n` streamed requests, all at one instant.
fn burst(n: usize) -> Vec<TraceRecord> {
    crate::rows("req", n, 0, (10, 2), true)
}

#[test]
fn a_burst_waits_in_the_client_queue_and_every_row_adds_up() {
    let _turn = crate::turn(module_path!());
    // 200 requests due at one instant, at most 50 in flight; each lasts ≥ 25 ms.
    // Two chunks of one token: the trace's output length.
    let server = GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(20),
            itl: Duration::from_millis(5),
            ..Default::default()
        },
    )
    .expect("ground-truth server");
    let mut cfg = ReplayConfig::new(vec![Target {
        name: "burst".into(),
        url: server.url(),
    }]);
    cfg.max_concurrency = Some(50);
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &burst(200),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .expect("replay runs");
    let (run, m) = &runs[0];
    assert_eq!(m.completed, 200, "outcomes: {:?}", m.outcomes);
    // Send time = start + scheduled offset + queue + lag + connect, for every row alike.
    let starts: Vec<i64> = run
        .records
        .iter()
        .map(|r| {
            assert_eq!(r.scheduled_offset_us, Some(0));
            assert!(r.dispatch_lag_us.unwrap() >= 0 && r.queue_us.unwrap() >= 0);
            r.arrival_time_us
                - r.dispatch_lag_us.unwrap()
                - r.queue_us.unwrap()
                - r.connect_us.unwrap_or(0)
        })
        .collect();
    let spread = starts.iter().max().unwrap() - starts.iter().min().unwrap();
    assert!(spread <= 10, "row starts {spread} µs apart");
    // 150 requests had to wait for a request to finish (≥ 25 ms): client queue, not lag.
    let queued = run
        .records
        .iter()
        .filter(|r| r.queue_us.unwrap() >= 25_000)
        .count();
    assert!(queued >= 150, "{queued} requests queued ≥ 25 ms");
    // Queue and lag are apart: no row's delay counted twice, or dropped.
    let first_send = run.records.iter().map(|r| r.arrival_time_us).min().unwrap();
    let last_send = run.records.iter().map(|r| r.arrival_time_us).max().unwrap();
    let max_behind = run
        .records
        .iter()
        .map(|r| r.queue_us.unwrap() + r.dispatch_lag_us.unwrap() + r.connect_us.unwrap_or(0))
        .max()
        .unwrap();
    assert!(
        max_behind >= last_send - first_send,
        "{max_behind} < {}",
        last_send - first_send
    );
}
