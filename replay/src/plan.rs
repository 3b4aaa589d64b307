//! The schedule of a run, computed row by row as the trace is read: which rows are replayed
//! ([`Selector`]: window, sample, max, shard), when each is sent (recorded arrivals ÷ the
//! speedup, or the gamma process drawn lazily), and, in closed session mode, which turns wait
//! for which ([`Assembler`], by [`crate::graph`]: the parent, else the session's previous turn). Nothing here needs the whole trace: the feed
//! ([`crate::feed`]) runs these steps on its threads ahead of the clock.
//!
//! Offsets are absolute from the run's start (`start + offset`), never gaps to the previous
//! send, so timing errors do not accumulate. Request bodies are built before their send time,
//! so nothing but sending happens at send time.

use std::time::Duration;

use trace_format::arrivals::GammaArrivals;
use trace_format::TraceRecord;

use crate::config::{Arrivals, Selection, SessionMode};
use crate::error::ReplayError;
use crate::graph::Graph;
use crate::prompt::stable_hash;
use crate::request::BuiltRequest;

/// One request of the schedule.
#[derive(Debug, Clone)]
pub struct PlannedRequest {
    /// Position in the schedule (0, 1, ...: the order rows were selected in).
    pub seq: u64,
    /// The trace row's request id.
    pub request_id: String,
    /// The trace row's session.
    pub session_id: Option<String>,
    /// Scheduled send offset from the run start (open mode, and first turns in closed mode;
    /// for a later turn, the offset its row would have had open, which bounds the look-ahead).
    pub offset: Duration,
    /// Closed mode: think time between the end of the turn this one waits for and this one.
    pub think: Duration,
    /// Closed mode: the turn (its `seq`) this one waits for: its parent (`parent_request_id`)
    /// when assembled earlier in this run, else its session's previous turn ([`crate::graph`]).
    pub waits_for: Option<u64>,
    /// Whether a later turn may wait for this one (closed mode: it has a session or a
    /// parent; any mode: it is a Responses request, whose id a later turn may name).
    pub chained: bool,
    /// Open mode: a Responses turn waiting for its parent (`waits_for`) is sent at its own
    /// `offset` or once its parent answered, whichever is later (no think time).
    pub open_wait: bool,
    /// How long it was held past its `offset` for its parent's answer (set when its parent
    /// answered: the row's `parent_wait_us`).
    pub parent_wait: Option<Duration>,
    /// The request to send.
    pub req: BuiltRequest,
    /// The recorded prompt length.
    pub prompt_tokens: Option<i64>,
    /// The recorded end-to-end latency, for the preconnect estimate.
    pub recorded_e2el_us: Option<i64>,
}

/// A selected row and its send offset, before its request is built.
#[derive(Debug, Clone)]
pub struct Selected {
    /// The row.
    pub rec: TraceRecord,
    /// Its send offset in the whole selection's schedule.
    pub offset: Duration,
}

/// What [`Selector::offer`] made of a row.
#[derive(Debug)]
// Returned once per row and taken apart at once: boxing the row would allocate per row.
#[allow(clippy::large_enum_variant)]
pub enum Step {
    /// Replayed (in this shard).
    Take(Selected),
    /// Not replayed; read on.
    Pass,
    /// No later row can be selected (past the window, or `max_requests` reached).
    Done,
}

/// The selection (`sel`) and send offsets, row by row, over rows in arrival order: the first
/// row's arrival starts the window; the sample is a hash of the session (else request) id;
/// `max_requests` keeps the earliest; the shard applies last and keeps the offsets of the
/// whole selection, so shards started at the same instant reproduce the full arrival shape.
#[derive(Debug)]
pub struct Selector {
    sel: Selection,
    arrivals: Arrivals,
    seed: u64,
    gamma: Option<GammaArrivals>,
    /// `[lo, hi)` of the window, µs since the epoch, from the first row.
    window: Option<(i64, Option<i64>)>,
    rows: usize,
    selected: usize,
    first_selected_us: Option<i64>,
    last_selected_us: i64,
}

impl Selector {
    /// A selector for `sel` with send times from `arrivals` (checked by `validate`).
    pub fn new(sel: &Selection, arrivals: Arrivals, seed: u64) -> Result<Self, ReplayError> {
        let gamma = match arrivals {
            Arrivals::Recorded { .. } => None,
            Arrivals::Rate { rate, burstiness } => {
                Some(GammaArrivals::new(rate, burstiness, seed)?)
            }
        };
        Ok(Selector {
            sel: sel.clone(),
            arrivals,
            seed,
            gamma,
            window: None,
            rows: 0,
            selected: 0,
            first_selected_us: None,
            last_selected_us: 0,
        })
    }

    fn sampled(&self, r: &TraceRecord) -> bool {
        match self.sel.sample_ratio {
            None => true,
            Some(ratio) => {
                let key = r.session_id.as_deref().unwrap_or(&r.request_id);
                let h = stable_hash(key) ^ self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
                ((h >> 11) as f64 / (1u64 << 53) as f64) < ratio
            }
        }
    }

    /// Offers the next row (rows come in arrival order).
    pub fn offer(&mut self, rec: TraceRecord) -> Step {
        if self.sel.max_requests.is_some_and(|m| self.selected >= m) {
            return Step::Done;
        }
        self.rows += 1;
        // A shadow row (capture's `--shadow`) measured a candidate on a production request,
        // whose own row is in the trace: it is no demand of its own, and is never replayed.
        if rec.pair_request_id.is_some() {
            return Step::Pass;
        }
        let t = rec.arrival_time_us;
        let (lo, hi) = *self.window.get_or_insert_with(|| {
            let lo = t.saturating_add(self.sel.start_offset.as_micros() as i64);
            let hi = self
                .sel
                .duration
                .map(|d| lo.saturating_add(d.as_micros() as i64));
            (lo, hi)
        });
        if hi.is_some_and(|h| t >= h) {
            return Step::Done;
        }
        if t < lo || !self.sampled(&rec) {
            return Step::Pass;
        }
        self.selected += 1;
        let first = *self.first_selected_us.get_or_insert(t);
        self.last_selected_us = self.last_selected_us.max(t);
        let offset = match (self.arrivals, &mut self.gamma) {
            (_, Some(g)) => g.next().unwrap_or_default(),
            (Arrivals::Recorded { speedup }, None) => {
                Duration::from_secs_f64(((t - first).max(0) as f64 / 1e6) / speedup)
            }
            (Arrivals::Rate { .. }, None) => Duration::ZERO,
        };
        if self.sel.shard.is_some_and(|s| !s.contains(&rec)) {
            return Step::Pass;
        }
        Step::Take(Selected { rec, offset })
    }

    /// Rows offered so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows selected so far (before the shard).
    pub fn selected(&self) -> usize {
        self.selected
    }

    /// Span of the selected rows in trace time (last arrival − first).
    pub fn trace_span(&self) -> Duration {
        let first = self.first_selected_us.unwrap_or(self.last_selected_us);
        Duration::from_micros((self.last_selected_us - first).max(0) as u64)
    }

    /// Why nothing can be replayed, once every row was offered and none became a request;
    /// `skipped` are the rows whose request could not be built.
    pub fn empty_error(&self, skipped: &Skipped) -> ReplayError {
        ReplayError::Empty(if self.rows == 0 {
            "the trace has no rows".into()
        } else if self.selected == 0 {
            "the window/sample selected no rows".into()
        } else if skipped.is_empty() {
            let shard = self.sel.shard.map_or(String::new(), |s| s.to_string());
            format!(
                "shard {shard} has none of the {} selected rows (fewer sessions than shards?)",
                self.selected
            )
        } else {
            format!(
                "none of the {} selected rows can be replayed; first: {}",
                skipped.len(),
                skipped.first().map_or("", |(_, r)| r.as_str())
            )
        })
    }
}

/// Selected rows whose request could not be built, all counted and the first
/// [`SKIPPED_KEPT`] kept (request id, why): a trace of any size holds a bounded number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    rows: usize,
    kept: Vec<(String, String)>,
}

/// Skipped rows kept as examples, at most (the result shows five).
pub const SKIPPED_KEPT: usize = 100;

impl Skipped {
    /// One more skipped row.
    pub fn push(&mut self, request_id: String, why: String) {
        self.rows += 1;
        if self.kept.len() < SKIPPED_KEPT {
            self.kept.push((request_id, why));
        }
    }

    /// Rows skipped, every one.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether no row was skipped.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Adds `other`'s rows after these.
    pub fn extend(&mut self, other: Skipped) {
        self.rows += other.rows;
        let room = SKIPPED_KEPT.saturating_sub(self.kept.len());
        self.kept.extend(other.kept.into_iter().take(room));
    }

    /// The first row skipped: (request id, why).
    pub fn first(&self) -> Option<&(String, String)> {
        self.kept.first()
    }

    /// The rows kept (the first [`SKIPPED_KEPT`]), in the order they were skipped.
    pub fn iter(&self) -> std::slice::Iter<'_, (String, String)> {
        self.kept.iter()
    }
}

/// Turns selected rows and their built requests into the schedule's items, in order:
/// numbers them, keeps the rows that could not be built (reported, never silently dropped:
/// the others keep their offsets), and in closed mode links each turn to the one it waits for.
#[derive(Debug)]
pub struct Assembler {
    speedup: f64,
    next_seq: u64,
    /// The turns that can be waited for (open mode: only chained Responses turns wait).
    graph: Graph,
    closed: bool,
    /// Selected rows that could not become a request.
    pub skipped: Skipped,
    /// Requests that send their row's recorded body (the others' prompts are synthesized).
    pub bodies: usize,
}

impl Assembler {
    /// An assembler for `session_mode`, with offsets from `arrivals`.
    pub fn new(session_mode: SessionMode, arrivals: Arrivals) -> Self {
        Assembler {
            speedup: match arrivals {
                Arrivals::Recorded { speedup } => speedup,
                Arrivals::Rate { .. } => 1.0,
            },
            next_seq: 0,
            graph: Graph::default(),
            closed: session_mode == SessionMode::Closed,
            skipped: Skipped::default(),
            bodies: 0,
        }
    }

    /// Items assembled so far.
    pub fn len(&self) -> u64 {
        self.next_seq
    }

    /// Whether no item was assembled.
    pub fn is_empty(&self) -> bool {
        self.next_seq == 0
    }

    /// The next item, from a selected row and its built request (None: skipped).
    pub fn add(
        &mut self,
        s: Selected,
        built: Result<BuiltRequest, String>,
    ) -> Option<PlannedRequest> {
        let Selected { rec, offset } = s;
        let req = match built {
            Ok(req) => req,
            Err(reason) => {
                self.skipped.push(rec.request_id, reason);
                return None;
            }
        };
        let wait = self.graph.waits(&rec, self.closed);
        if wait.is_none() && req.parent_id_at.is_some() {
            // It continues a response the candidate never gave: it cannot be sent.
            self.skipped.push(
                rec.request_id,
                format!(
                    "its parent {} (previous_response_id) is not replayed: outside the selection, or more than {} chained rows earlier",
                    rec.parent_request_id.as_deref().unwrap_or("?"),
                    crate::graph::WINDOW
                ),
            );
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let chained = self.graph.remember(seq, &rec, self.closed);
        self.bodies += usize::from(rec.body.is_some());
        let (mut think, mut waits_for) = (Duration::ZERO, None);
        if let Some(w) = wait {
            let think_us = rec.arrival_time_us.saturating_sub(w.end_us).max(0);
            think = Duration::from_secs_f64(think_us as f64 / 1e6 / self.speedup);
            waits_for = Some(w.seq);
        }
        Some(PlannedRequest {
            seq,
            request_id: rec.request_id,
            session_id: rec.session_id,
            offset,
            think,
            waits_for,
            chained,
            open_wait: !self.closed && waits_for.is_some(),
            parent_wait: None,
            req,
            prompt_tokens: rec.prompt_tokens,
            recorded_e2el_us: rec.e2el_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OutputLen, RequestOptions, Shard};
    use crate::request::build_request;
    use std::collections::HashMap;

    fn rec(id: &str, t_ms: i64, session: Option<&str>) -> TraceRecord {
        let mut r = TraceRecord::new(id, 1_700_000_000_000_000 + t_ms * 1000, "/v1/completions");
        r.prompt_tokens = Some(5);
        r.output_tokens = Some(3);
        r.session_id = session.map(str::to_string);
        r
    }

    /// The whole schedule, by the feed's steps run inline: select, build, assemble.
    struct Schedule {
        items: Vec<PlannedRequest>,
        skipped: Skipped,
        trace_span: Duration,
    }

    fn schedule(
        rs: &[TraceRecord],
        sel: &Selection,
        arrivals: Arrivals,
        mode: SessionMode,
        seed: u64,
    ) -> Result<Schedule, ReplayError> {
        let mut s = Selector::new(sel, arrivals, seed)?;
        let mut asm = Assembler::new(mode, arrivals);
        let mut items = Vec::new();
        for r in rs {
            match s.offer(r.clone()) {
                Step::Take(sel) => {
                    let b = build_request(&sel.rec, &opts(), "m", None);
                    items.extend(asm.add(sel, b));
                }
                Step::Pass => {}
                Step::Done => break,
            }
        }
        if items.is_empty() {
            return Err(s.empty_error(&asm.skipped));
        }
        Ok(Schedule {
            items,
            skipped: asm.skipped,
            trace_span: s.trace_span(),
        })
    }

    /// The schedule of `rs` with recorded arrivals at speed 1, open sessions.
    fn open_plan(rs: &[TraceRecord]) -> Result<Schedule, ReplayError> {
        schedule(
            rs,
            &Selection::default(),
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            0,
        )
    }

    fn ids(s: &Schedule) -> Vec<&str> {
        s.items.iter().map(|i| i.request_id.as_str()).collect()
    }

    fn opts() -> RequestOptions {
        RequestOptions {
            endpoint: None,
            model: None,
            output_len: OutputLen::Recorded,
            stream: true,
            prompt_salt: 1,
            tokenizer: None,
            headers: vec![],
            api_key: None,
            timeout: Duration::from_secs(1),
            ca_cert: None,
            connect_timeout: Duration::from_secs(10),
            pool_idle_timeout: Duration::from_secs(4),
            traceparent: true,
        }
    }

    fn offsets(rs: &[TraceRecord], arrivals: Arrivals, seed: u64) -> Vec<Duration> {
        let s = schedule(rs, &Selection::default(), arrivals, SessionMode::Open, seed);
        s.unwrap().items.iter().map(|i| i.offset).collect()
    }

    #[test]
    fn shadow_rows_are_never_replayed() {
        let mut shadow = rec("a-cand", 10_000, None);
        shadow.pair_request_id = Some("a".into());
        shadow.target = Some("cand".into());
        let rs = [rec("a", 10_000, None), shadow, rec("b", 10_500, None)];
        let s = open_plan(&rs).unwrap();
        assert_eq!(ids(&s), vec!["a", "b"]);
    }

    #[test]
    fn recorded_offsets_scale_with_speedup() {
        let rs = [
            rec("a", 10_000, None),
            rec("b", 10_500, None),
            rec("c", 12_000, None),
        ];
        let o = offsets(&rs, Arrivals::Recorded { speedup: 2.0 }, 0);
        assert_eq!(
            o,
            vec![
                Duration::ZERO,
                Duration::from_millis(250),
                Duration::from_millis(1000)
            ]
        );
        // The window starts at the first row; offsets at the first selected one.
        let sel = Selection {
            start_offset: Duration::from_millis(400),
            ..Default::default()
        };
        let s = schedule(
            &rs,
            &sel,
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            0,
        )
        .unwrap();
        assert_eq!(ids(&s), vec!["b", "c"]);
        assert_eq!(s.items[1].offset, Duration::from_millis(1500));
        assert_eq!(s.trace_span, Duration::from_millis(1500));
    }

    #[test]
    fn gamma_offsets_are_the_processes_drawn_row_by_row() {
        let rs: Vec<TraceRecord> = (0..2_000).map(|i| rec(&format!("r{i}"), 0, None)).collect();
        let rate = Arrivals::Rate {
            rate: 100.0,
            burstiness: 1.0,
        };
        let a = offsets(&rs, rate, 3);
        assert_eq!(
            a,
            trace_format::arrivals::gamma_offsets(2_000, 100.0, 1.0, 3).unwrap()
        );
        assert_ne!(a, offsets(&rs, rate, 4));
        let inf = offsets(
            &rs[..3],
            Arrivals::Rate {
                rate: f64::INFINITY,
                burstiness: 1.0,
            },
            3,
        );
        assert!(inf.iter().all(|d| d.is_zero()));
    }

    #[test]
    fn window_sample_and_max_select_rows_and_stop_reading() {
        let rs: Vec<TraceRecord> = (0..100)
            .map(|i| rec(&format!("r{i}"), i * 100, None))
            .collect();
        let sel = Selection {
            start_offset: Duration::from_secs(1),
            duration: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let mut s = Selector::new(&sel, Arrivals::Recorded { speedup: 1.0 }, 0).unwrap();
        let mut taken = Vec::new();
        for (i, r) in rs.iter().enumerate() {
            match s.offer(r.clone()) {
                Step::Take(_) => taken.push(i),
                Step::Pass => {}
                Step::Done => break,
            }
        }
        assert_eq!(taken, (10..30).collect::<Vec<_>>());
        assert_eq!(
            s.rows(),
            31,
            "reading stops at the first row past the window"
        );
        let sel = Selection {
            max_requests: Some(5),
            ..Default::default()
        };
        let p = schedule(
            &rs,
            &sel,
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            0,
        );
        assert_eq!(p.unwrap().items.len(), 5);
        let sel = Selection {
            sample_ratio: Some(0.5),
            ..Default::default()
        };
        let p = schedule(
            &rs,
            &sel,
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            0,
        );
        let n = p.unwrap().items.len();
        assert!((30..70).contains(&n), "{n}");
        let sel = Selection {
            start_offset: Duration::from_secs(100),
            ..Default::default()
        };
        let err = schedule(
            &rs,
            &sel,
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            0,
        );
        assert!(err.err().unwrap().to_string().contains("selected no rows"));
        assert!(open_plan(&[])
            .err()
            .unwrap()
            .to_string()
            .contains("no rows"));
    }

    #[test]
    fn sampling_keeps_sessions_whole() {
        let rs: Vec<TraceRecord> = (0..200)
            .map(|i| rec(&format!("r{i}"), i, Some(&format!("s{}", i % 20))))
            .collect();
        let sel = Selection {
            sample_ratio: Some(0.5),
            ..Default::default()
        };
        let p = schedule(
            &rs,
            &sel,
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            42,
        )
        .unwrap();
        for s in 0..20 {
            let n = p
                .items
                .iter()
                .filter(|i| i.session_id.as_deref() == Some(&format!("s{s}")))
                .count();
            assert!(n == 0 || n == 10, "session s{s} split: {n}");
        }
    }

    #[test]
    fn shards_are_disjoint_cover_the_trace_and_keep_sessions_whole() {
        // Sessions of several turns, interleaved, plus rows without a session.
        let rs: Vec<TraceRecord> = (0..400)
            .map(|i| {
                let s = (i % 3 != 0).then(|| format!("s{}", i % 37));
                rec(&format!("r{i}"), i * 10, s.as_deref())
            })
            .collect();
        let n = 4;
        let gamma = Arrivals::Rate {
            rate: 50.0,
            burstiness: 1.0,
        };
        for arrivals in [Arrivals::Recorded { speedup: 1.0 }, gamma] {
            let full =
                schedule(&rs, &Selection::default(), arrivals, SessionMode::Open, 0).unwrap();
            let full_off: HashMap<&str, Duration> = full
                .items
                .iter()
                .map(|p| (p.request_id.as_str(), p.offset))
                .collect();
            let mut seen: HashMap<String, u32> = HashMap::new();
            let mut session_shard: HashMap<String, u32> = HashMap::new();
            for k in 0..n {
                let sel = Selection {
                    shard: Some(Shard::new(k, n).unwrap()),
                    ..Default::default()
                };
                let p = schedule(&rs, &sel, arrivals, SessionMode::Open, 0).unwrap();
                assert!(!p.items.is_empty(), "shard {k} is empty");
                for it in &p.items {
                    assert!(
                        seen.insert(it.request_id.clone(), k).is_none(),
                        "{} in two shards",
                        it.request_id
                    );
                    assert_eq!(
                        it.offset,
                        full_off[it.request_id.as_str()],
                        "a shard keeps the full schedule's offsets"
                    );
                    if let Some(s) = &it.session_id {
                        let prev = session_shard.insert(s.clone(), k);
                        assert!(prev.is_none_or(|p| p == k), "session {s} split");
                    }
                }
            }
            assert_eq!(seen.len(), rs.len(), "the shards cover every row");
        }
        // A shard that gets nothing says so.
        let one = [rec("only", 0, Some("s1"))];
        let k = Shard::of_key("s1", 2);
        let sel = Selection {
            shard: Some(Shard::new(1 - k, 2).unwrap()),
            ..Default::default()
        };
        let err = schedule(
            &one,
            &sel,
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            0,
        );
        assert!(err
            .err()
            .unwrap()
            .to_string()
            .contains("has none of the 1 selected rows"));
    }

    #[test]
    fn shard_specs_parse_and_reject_garbage() {
        assert_eq!(
            "1/4".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 4 }
        );
        assert!("4/4".parse::<Shard>().is_err());
        assert!("0/0".parse::<Shard>().is_err());
        assert!("1".parse::<Shard>().is_err());
        assert!("a/4".parse::<Shard>().is_err());
    }

    #[test]
    fn rows_that_cannot_be_built_are_skipped_and_reported() {
        let mut rs = vec![rec("a", 0, None), rec("b", 10, None), rec("c", 20, None)];
        rs[1].prompt_tokens = None; // e.g. a cancelled capture with no readable prompt
        let p = open_plan(&rs).unwrap();
        assert_eq!(ids(&p), vec!["a", "c"]);
        assert_eq!(
            p.items[1].offset,
            Duration::from_millis(20),
            "others keep their offsets"
        );
        assert_eq!(
            p.items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(p.skipped.len(), 1);
        assert!(
            p.skipped.first().unwrap().1.contains("no prompt_tokens"),
            "{:?}",
            p.skipped
        );
        rs[0].prompt_tokens = None;
        rs[2].prompt_tokens = None;
        let err = open_plan(&rs).err().unwrap();
        assert!(
            err.to_string().contains("none of the 3 selected rows"),
            "{err}"
        );
    }

    /// A trace of any size holds a bounded number of skipped rows: all counted, the first
    /// [`SKIPPED_KEPT`] kept, and the error of a trace none of whose rows can be built
    /// counts them all.
    #[test]
    fn skipped_rows_are_all_counted_and_the_first_kept() {
        let n = SKIPPED_KEPT * 3 + 7;
        let mut rs: Vec<_> = (0..n)
            .map(|i| {
                let mut r = rec(&format!("s{i}"), i as i64, None);
                r.prompt_tokens = None;
                r
            })
            .collect();
        rs.push(rec("ok", n as i64, None));
        let p = open_plan(&rs).unwrap();
        assert_eq!(ids(&p), vec!["ok"]);
        assert_eq!(p.skipped.len(), n);
        assert_eq!(p.skipped.iter().count(), SKIPPED_KEPT);
        assert_eq!(p.skipped.first().unwrap().0, "s0");
        assert_eq!(
            p.skipped.iter().last().unwrap().0,
            format!("s{}", SKIPPED_KEPT - 1)
        );
        rs.pop();
        let err = open_plan(&rs).err().unwrap();
        assert!(
            err.to_string()
                .contains(&format!("none of the {n} selected rows")),
            "{err}"
        );
    }

    #[test]
    fn closed_sessions_chain_turns_with_think_time() {
        let mut rs = vec![
            rec("a1", 0, Some("a")),
            rec("b1", 100, Some("b")),
            rec("a2", 1000, Some("a")),
            rec("x", 1100, None),
        ];
        rs[0].e2el_us = Some(400_000);
        let p = schedule(
            &rs,
            &Selection::default(),
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Closed,
            0,
        )
        .unwrap();
        assert_eq!(p.items[2].waits_for, Some(0));
        assert_eq!(p.items[2].think, Duration::from_millis(600));
        assert_eq!(p.items[1].waits_for, None);
        assert!(p.items[0].chained && p.items[2].chained && !p.items[3].chained);
        let open = open_plan(&rs).unwrap();
        assert!(open
            .items
            .iter()
            .all(|i| i.waits_for.is_none() && !i.chained));
    }

    fn closed(rs: &[TraceRecord], sel: &Selection, speedup: f64) -> Schedule {
        schedule(
            rs,
            sel,
            Arrivals::Recorded { speedup },
            SessionMode::Closed,
            0,
        )
        .unwrap()
    }

    fn child(id: &str, t_ms: i64, session: &str, parent: &str) -> TraceRecord {
        let mut r = rec(id, t_ms, Some(session));
        r.parent_request_id = Some(parent.into());
        r
    }

    #[test]
    fn a_sub_agent_in_another_session_waits_for_its_parent() {
        // The main agent's call a1 (ends at 400 ms) spawns a sub-agent (session s) at 700 ms
        // and continues at 1000 ms; the sub-agent's second call follows its first.
        let mut rs = vec![
            rec("a1", 0, Some("a")),
            rec("x", 100, None),
            child("s1", 700, "s", "a1"),
            child("a2", 1000, "a", "a1"),
            child("s2", 1300, "s", "s1"),
        ];
        rs[0].e2el_us = Some(400_000);
        rs[2].e2el_us = Some(200_000);
        let p = closed(&rs, &Selection::default(), 2.0);
        let w: Vec<_> = p.items.iter().map(|i| (i.waits_for, i.think)).collect();
        let ms = Duration::from_millis;
        assert_eq!(
            w,
            vec![
                (None, ms(0)),
                (None, ms(0)),
                (Some(0), ms(150)), // (700 - 400) / 2
                (Some(0), ms(300)), // one parent, two children
                (Some(2), ms(200)), // (1300 - 900) / 2
            ]
        );
        assert_eq!(
            p.items.iter().map(|i| i.chained).collect::<Vec<_>>(),
            vec![true, false, true, true, true]
        );
        // Open mode keeps every recorded offset.
        let open = open_plan(&rs).unwrap();
        assert!(open.items.iter().all(|i| i.waits_for.is_none()));
        assert_eq!(open.items[2].offset, ms(700));
    }

    #[test]
    fn a_parent_outside_the_selection_falls_back_to_the_session_then_the_offset() {
        let rs = vec![
            rec("a1", 0, Some("a")),
            rec("b1", 600, Some("b")),
            child("s1", 700, "s", "a1"),
            child("b2", 900, "b", "a1"),
            child("s2", 1300, "s", "s1"),
        ];
        // The window starts after a1: s1 has neither parent nor previous turn (its open
        // offset), b2 follows b1, s2 still waits for s1.
        let sel = Selection {
            start_offset: Duration::from_millis(500),
            ..Default::default()
        };
        let p = closed(&rs, &sel, 1.0);
        assert_eq!(ids(&p), vec!["b1", "s1", "b2", "s2"]);
        let w: Vec<_> = p.items.iter().map(|i| i.waits_for).collect();
        assert_eq!(w, vec![None, None, Some(0), Some(1)]);
        assert_eq!(p.items[1].offset, Duration::from_millis(100));
        assert_eq!(p.items[2].think, Duration::from_millis(300));
        // A parent whose request could not be built is not waited for either.
        let mut rs = rs;
        rs[0].prompt_tokens = None;
        let p = closed(&rs, &Selection::default(), 1.0);
        assert_eq!(ids(&p)[0], "b1");
        assert_eq!(p.items[1].waits_for, None, "s1's parent was skipped");
    }
}
