//! A streamed run on loopback against the ground-truth server: rows reach the sink as
//! requests finish, the feed stays within its look-ahead, closed sessions do not deadlock
//! when the look-ahead is full, and a stop (first: drain, then cancel; second: cancel at
//! once) leaves exactly one row per request sent, none lost or duplicated.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use replay::config::{Lookahead, SessionMode, Target};
use replay::source::{RecordSource, Records};
use replay::{ReplayConfig, ReplayError, RowSink, Stop};
use sim::groundtruth::{GroundTruth, GroundTruthConfig};
use trace_format::{Outcome, TraceRecord};

/// `n` streamed requests `gap_us` apart, each asking for `out` tokens.
fn trace(n: usize, gap_us: i64, out: i64) -> Vec<TraceRecord> {
    crate::rows("req", n, gap_us, (8, out), true)
}

fn server(itl_ms: u64) -> GroundTruth {
    GroundTruth::start(
        "127.0.0.1:0".parse().unwrap(),
        GroundTruthConfig {
            ttft: Duration::from_millis(5),
            itl: Duration::from_millis(itl_ms),
            ..Default::default()
        },
    )
    .expect("ground-truth server")
}

fn config(server: &GroundTruth) -> ReplayConfig {
    ReplayConfig::new(vec![Target {
        name: "gt".into(),
        url: server.url(),
    }])
}

/// A sink that keeps the rows it was given, and can be told to fail.
#[derive(Default)]
struct Collect {
    rows: Vec<TraceRecord>,
    fail_after: Option<usize>,
    started: usize,
    finished: usize,
}

impl RowSink for Collect {
    fn start(&mut self, _t: &Target, _id: &str) -> Result<(), ReplayError> {
        self.started += 1;
        Ok(())
    }
    fn row(&mut self, rec: &TraceRecord) -> Result<(), ReplayError> {
        if self.fail_after.is_some_and(|n| self.rows.len() >= n) {
            return Err(ReplayError::Config("disk full".into()));
        }
        self.rows.push(rec.clone());
        Ok(())
    }
    fn finish(&mut self, _run: &replay::RunOutput) -> Result<(), ReplayError> {
        self.finished += 1;
        Ok(())
    }
}

/// A source that counts the rows it has handed out (how far ahead the feed reads).
struct Counted {
    rows: Vec<TraceRecord>,
    read: Arc<AtomicUsize>,
    fail_at: Option<usize>,
}

impl RecordSource for Counted {
    fn records(&self) -> Result<Records<'_>, ReplayError> {
        let read = self.read.clone();
        let fail_at = self.fail_at;
        Ok(Box::new(self.rows.iter().enumerate().map(move |(i, r)| {
            read.fetch_add(1, Ordering::SeqCst);
            if fail_at == Some(i) {
                return Err(trace_format::Error::Invalid(
                    "row group 3 is corrupt".into(),
                ));
            }
            Ok(r.clone())
        })))
    }
}

fn ids_once(rows: &[TraceRecord]) -> HashMap<&str, &TraceRecord> {
    let mut by_id = HashMap::new();
    for r in rows {
        assert!(
            by_id.insert(r.request_id.as_str(), r).is_none(),
            "{} has two rows",
            r.request_id
        );
    }
    by_id
}

#[test]
fn rows_stream_to_the_sink_and_are_not_kept_unless_asked() {
    let _turn = crate::turn(module_path!());
    let gt = server(1);
    let mut cfg = config(&gt);
    cfg.keep_rows = false;
    let mut sink = Collect::default();
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &trace(300, 2_000, 3),
        None,
        &|_, _| {},
        &mut sink,
        &Stop::new(),
    )
    .unwrap();
    let (run, m) = &runs[0];
    assert!(run.records.is_empty(), "keep_rows = false keeps nothing");
    assert_eq!((sink.started, sink.finished), (1, 1));
    assert_eq!(m.completed, 300);
    assert_eq!(run.plan_len, 300);
    assert_eq!(run.interrupted, None);
    assert_eq!(ids_once(&sink.rows).len(), 300);
    assert!(sink.rows.iter().all(|r| r.outcome == Outcome::Ok));
}

#[test]
fn the_feed_reads_no_further_ahead_than_its_look_ahead() {
    let _turn = crate::turn(module_path!());
    // 3,000 requests over 3 s; the feed may build 200 ms of schedule ahead of the clock.
    let gt = server(1);
    let mut cfg = config(&gt);
    cfg.lookahead = Lookahead {
        time: Duration::from_millis(200),
        bytes: 64 << 20,
        ..Default::default()
    };
    let read = Arc::new(AtomicUsize::new(0));
    let src = Counted {
        rows: trace(3_000, 1_000, 1),
        read: read.clone(),
        fail_at: None,
    };
    let t0 = Mutex::new(None::<Instant>);
    let worst = Mutex::new(0i64);
    let progress = |_: &Target, p: replay::Progress| {
        let start = *t0.lock().unwrap().get_or_insert_with(Instant::now);
        // Rows the schedule reached by now, at 1 per ms, plus what may be read ahead of it:
        // the look-ahead (200 ms) and the chunks between reader and collector (at most 8
        // of 64 rows), with 50 ms for the clock's lead and the tick's lateness.
        let transit = (replay::feed::IN_TRANSIT * replay::feed::CHUNK_ROWS) as i64;
        let due = start.elapsed().as_millis() as i64 + 200 + transit + 50;
        let ahead = read.load(Ordering::SeqCst) as i64 - due.max(p.done as i64);
        let mut w = worst.lock().unwrap();
        *w = (*w).max(ahead);
    };
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &src,
        None,
        &progress,
        &mut replay::sink::NoSink,
        &Stop::new(),
    )
    .unwrap();
    assert_eq!(runs[0].1.completed, 3_000);
    assert!(
        *worst.lock().unwrap() <= 0,
        "the feed read {} rows beyond its look-ahead",
        worst.lock().unwrap()
    );
}

#[test]
fn closed_sessions_finish_when_the_look_ahead_holds_one_request() {
    let _turn = crate::turn(module_path!());
    // 40 sessions of 5 turns, interleaved; the look-ahead holds one built request at a
    // time, so most turns wait in it for their predecessor while the feed cannot move.
    let gt = server(1);
    let mut cfg = config(&gt);
    cfg.session_mode = SessionMode::Closed;
    cfg.lookahead = Lookahead {
        time: Duration::from_millis(1),
        bytes: 1,
        ..Default::default()
    };
    let mut rows = trace(200, 1_000, 2);
    for (i, r) in rows.iter_mut().enumerate() {
        r.session_id = Some(format!("s{}", i % 40));
        r.e2el_us = Some(40_000); // the next turn follows at once: no think time
    }
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &rows,
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &Stop::new(),
    )
    .unwrap();
    let (run, m) = &runs[0];
    assert_eq!(m.completed, 200, "{:?}", m.outcomes);
    // Every turn was sent after its predecessor ended.
    let by_id = ids_once(&run.records);
    for i in 40..200 {
        let (prev, cur) = (
            by_id[format!("req-{:05}", i - 40).as_str()],
            by_id[format!("req-{i:05}").as_str()],
        );
        let prev_end = prev.arrival_time_us + prev.e2el_us.unwrap();
        assert!(
            cur.arrival_time_us >= prev_end,
            "turn {i} before its predecessor ended"
        );
    }
}

#[test]
fn closed_graphs_finish_when_the_look_ahead_holds_one_request() {
    let _turn = crate::turn(module_path!());
    // 40 sessions of turns, and every 5th row a sub-agent's opening in a session of its own
    // whose parent is a turn 13 rows back in another session (which then has two children):
    // with one built request in the look-ahead, children wait for parents far behind them.
    let gt = server(1);
    let mut cfg = config(&gt);
    cfg.session_mode = SessionMode::Closed;
    cfg.lookahead = Lookahead {
        time: Duration::from_millis(1),
        bytes: 1,
        ..Default::default()
    };
    let mut rows = trace(200, 1_000, 2);
    for (i, r) in rows.iter_mut().enumerate() {
        r.e2el_us = Some(40_000);
        if i >= 40 && i % 5 == 0 {
            r.session_id = Some(format!("sub{i}"));
            r.parent_request_id = Some(format!("req-{:05}", i - 13));
        } else {
            r.session_id = Some(format!("s{}", i % 40));
        }
    }
    let parents: Vec<(String, String)> = rows
        .iter()
        .filter_map(|r| Some((r.request_id.clone(), r.parent_request_id.clone()?)))
        .collect();
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &rows,
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &Stop::new(),
    )
    .unwrap();
    let (run, m) = &runs[0];
    assert_eq!(m.completed, 200, "{:?}", m.outcomes);
    let by_id = ids_once(&run.records);
    assert_eq!(parents.len(), 32);
    for (child, parent) in &parents {
        let (p, c) = (by_id[parent.as_str()], by_id[child.as_str()]);
        assert!(
            c.arrival_time_us >= p.arrival_time_us + p.e2el_us.unwrap(),
            "{child} sent before its parent {parent} ended"
        );
    }
}

/// Runs `rows` and requests a stop (`twice`: two) `after` the first progress report.
/// Replays `rows` and stops the run `after` its launch, or, with `from_first`, `after` the
/// server has answered its first request (the schedule's clock starts only once the pool is
/// open, which a loaded machine delays by hundreds of ms: a stop timed from the launch then
/// reached less of the schedule than the test says).
fn stopped_run(
    cfg: &ReplayConfig,
    rows: &[TraceRecord],
    after: Duration,
    twice: bool,
    from_first: Option<&GroundTruth>,
) -> (replay::RunOutput, Collect, Duration, Stop) {
    let stop = Stop::new();
    let mut sink = Collect::default();
    let t = Instant::now();
    let (mut runs, took) = std::thread::scope(|scope| {
        let s = stop.clone();
        scope.spawn(move || {
            if let Some(gt) = from_first {
                let give_up = Instant::now() + Duration::from_secs(30);
                while gt.log().is_empty() && Instant::now() < give_up {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            std::thread::sleep(after);
            s.request("SIGTERM");
            if twice {
                std::thread::sleep(Duration::from_millis(50));
                s.request("SIGINT");
            }
        });
        let runs = replay::replay(
            &cfg.validate().unwrap(),
            &rows,
            None,
            &|_, _| {},
            &mut sink,
            &stop,
        )
        .unwrap();
        (runs, t.elapsed())
    });
    (runs.remove(0).0, sink, took, stop)
}

#[test]
fn a_stop_drains_then_cancels_and_every_sent_request_has_one_row() {
    let _turn = crate::turn(module_path!());
    // 2,000 requests over 4 s, each streaming for ~1 s; stopped after 1 s with a 300 ms
    // drain: the short-lived ones finish, the rest are cancelled at the deadline.
    let gt = server(10);
    let mut cfg = config(&gt);
    cfg.drain_timeout = Duration::from_millis(300);
    cfg.targets.push(Target {
        name: "second".into(),
        url: gt.url(),
    });
    let mut rows = trace(2_000, 2_000, 100);
    // Every tenth asks for one token: done within the drain.
    for r in rows.iter_mut().step_by(10) {
        r.output_tokens = Some(1);
    }
    // Stopped 1 s after the first (one-token) request was answered, ~1 s into the schedule.
    let (run, sink, took, _) =
        stopped_run(&cfg, &rows, Duration::from_millis(1_000), false, Some(&gt));
    assert!(
        took < Duration::from_secs(4),
        "the stopped run took {took:?}"
    );
    let i = run.interrupted.clone().expect("marked interrupted");
    assert_eq!(i.reason, "SIGTERM");
    assert!(
        i.after >= Duration::from_millis(800) && i.after < Duration::from_millis(2_000),
        "{:?}",
        i.after
    );
    // Exactly one row per request sent, kept and sunk alike; nothing sent after the stop.
    let by_id = ids_once(&sink.rows);
    assert_eq!(by_id.len(), i.sent);
    assert_eq!(run.records.len(), i.sent);
    assert!(i.sent > 200 && i.sent < 1_500, "sent {}", i.sent);
    assert_eq!(i.not_sent, Some(2_000 - i.sent));
    let latest_send = sink
        .rows
        .iter()
        .filter(|r| r.outcome != Outcome::ClientCancelled);
    let stop_at_us = run.started_at_us + i.after.as_micros() as i64;
    for r in latest_send {
        assert!(
            r.arrival_time_us <= stop_at_us + 2_000,
            "{} sent after the stop",
            r.request_id
        );
    }
    // The server saw exactly the requests that have rows: none lost, none invented.
    let seen: Vec<String> = gt.log().into_iter().filter_map(|l| l.request_id).collect();
    assert_eq!(seen.len(), i.sent, "server saw {} requests", seen.len());
    assert!(seen.iter().all(|id| by_id.contains_key(id.as_str())));
    // Short ones finished in the drain; long ones in flight were cancelled at its end.
    let cancelled: Vec<&TraceRecord> = sink
        .rows
        .iter()
        .filter(|r| r.outcome == Outcome::ClientCancelled)
        .collect();
    assert_eq!(cancelled.len(), i.cancelled);
    assert!(i.cancelled > 50, "cancelled {}", i.cancelled);
    assert!(cancelled
        .iter()
        .all(|r| r.error.as_deref().unwrap_or("").contains("stopped")));
    assert_eq!(sink.started, 1, "the second target is not run");
}

#[test]
fn a_second_stop_cancels_at_once() {
    let _turn = crate::turn(module_path!());
    let gt = server(20);
    let mut cfg = config(&gt);
    cfg.drain_timeout = Duration::from_secs(60);
    // 100 requests at once, each streaming for 4 s.
    let rows = trace(100, 0, 200);
    let (run, sink, took, stop) = stopped_run(&cfg, &rows, Duration::from_millis(500), true, None);
    assert!(
        took < Duration::from_secs(3),
        "took {took:?}: the drain was not cut short"
    );
    assert_eq!(stop.level(), 2);
    let i = run.interrupted.expect("interrupted");
    assert_eq!((i.sent, i.cancelled, i.not_sent), (100, 100, Some(0)));
    assert_eq!(ids_once(&sink.rows).len(), 100);
}

#[test]
fn a_sink_that_cannot_write_stops_the_run_and_its_error_is_returned() {
    let _turn = crate::turn(module_path!());
    let gt = server(1);
    let cfg = config(&gt);
    let mut sink = Collect {
        fail_after: Some(20),
        ..Default::default()
    };
    let t = Instant::now();
    // 5,000 requests over 10 s: the run stops at the first row the sink refuses.
    let err = replay::replay(
        &cfg.validate().unwrap(),
        &trace(5_000, 2_000, 1),
        None,
        &|_, _| {},
        &mut sink,
        &Stop::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(sink.rows.len(), 20);
}

#[test]
fn a_trace_that_breaks_mid_run_stops_it_with_the_trace_error() {
    let _turn = crate::turn(module_path!());
    let gt = server(1);
    let cfg = config(&gt);
    let src = Counted {
        rows: trace(5_000, 2_000, 1),
        read: Arc::new(AtomicUsize::new(0)),
        fail_at: Some(1_000),
    };
    let t = Instant::now();
    let err = replay::replay(
        &cfg.validate().unwrap(),
        &src,
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &Stop::new(),
    )
    .unwrap_err();
    assert!(matches!(err, ReplayError::Trace(_)), "{err}");
    assert!(err.to_string().contains("row group 3"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    // A trace broken before anything could be sent fails before the clock starts.
    let src = Counted {
        rows: trace(10, 1_000, 1),
        read: Arc::new(AtomicUsize::new(0)),
        fail_at: Some(0),
    };
    let err = replay::replay(
        &cfg.validate().unwrap(),
        &src,
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &Stop::new(),
    )
    .unwrap_err();
    assert!(matches!(err, ReplayError::Trace(_)), "{err}");
}
