//! A backlog in bounded memory: requests all due at once behind a `--max-concurrency` cap
//! are built when a slot is near, not when they are due, so the requests built and not
//! finished at once stay within the cap plus the look-ahead's `waiting`, however many are
//! waiting; and their queue time still runs from their scheduled time.

use std::time::Duration;

use replay::config::Target;
use replay::ReplayConfig;
use sim::groundtruth::{GroundTruth, GroundTruthConfig};
use trace_format::TraceRecord;

/// `n` streamed requests of one output token, `gap_us` apart.
fn trace(n: usize, gap_us: i64) -> Vec<TraceRecord> {
    crate::rows("req", n, gap_us, (8, 1), true)
}

#[test]
fn requests_waiting_for_a_slot_are_not_built_until_one_is_near() {
    let _turn = crate::turn(module_path!());
    const N: usize = 2_000;
    const CAP: usize = 8;
    const WAITING: usize = 64;
    let server = GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(1),
            itl: Duration::from_millis(1),
            ..Default::default()
        },
    )
    .expect("ground-truth server");
    let mut cfg = ReplayConfig::new(vec![Target {
        name: "backlog".into(),
        url: server.url(),
    }]);
    cfg.max_concurrency = Some(CAP);
    cfg.lookahead.waiting = WAITING;
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &trace(N, 0),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .expect("replay runs");
    let (run, m) = &runs[0];
    assert_eq!(m.completed, N, "outcomes: {:?}", m.outcomes);
    assert_eq!(run.records.len(), N);
    // The bound does not depend on timing: the feed lets a due request in only while fewer
    // than CAP + WAITING are due and unfinished.
    let bound = CAP + WAITING;
    assert!(bound < N / 4);
    assert!(
        run.peak_built >= CAP && run.peak_built <= bound,
        "{} requests built at once (bound {bound}) of {N}",
        run.peak_built
    );
    // Every request held back by the feed waited for a slot: its queue time runs from its
    // scheduled instant, as when every waiting request was built.
    let unqueued = run
        .records
        .iter()
        .filter(|r| r.queue_us.unwrap() == 0)
        .count();
    assert!(unqueued <= bound, "{unqueued} requests did not queue");
    for r in &run.records {
        assert_eq!(r.scheduled_offset_us, Some(0));
        assert!(r.dispatch_lag_us.unwrap() >= 0 && r.queue_us.unwrap() >= 0);
    }
}

#[test]
fn a_paced_trace_faster_than_the_target_is_held_in_bounded_memory_too() {
    let _turn = crate::turn(module_path!());
    // 1,000 requests 1 ms apart; two slots of requests that last ≥ 8 ms serve at most
    // 250 req/s, so a backlog grows through the whole schedule (to ~750).
    const N: usize = 1_000;
    const CAP: usize = 2;
    const WAITING: usize = 64;
    let server = GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(8),
            itl: Duration::from_millis(1),
            ..Default::default()
        },
    )
    .expect("ground-truth server");
    let mut cfg = ReplayConfig::new(vec![Target {
        name: "paced".into(),
        url: server.url(),
    }]);
    cfg.max_concurrency = Some(CAP);
    cfg.lookahead.waiting = WAITING;
    cfg.lookahead.time = Duration::from_millis(50);
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &trace(N, 1_000),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .expect("replay runs");
    let (run, m) = &runs[0];
    assert_eq!(m.completed, N, "outcomes: {:?}", m.outcomes);
    // Beside the backlog's bound, the look-ahead: 50 ms of schedule, 51 requests at most,
    // released into the backlog at most once more while it is full.
    let bound = CAP + WAITING + 2 * 51;
    assert!(
        run.peak_built <= bound,
        "{} requests built at once (bound {bound}) of {N}",
        run.peak_built
    );
    let queued = run
        .records
        .iter()
        .filter(|r| r.queue_us.unwrap() > 0)
        .count();
    assert!(queued >= N / 2, "{queued} requests queued");
}
