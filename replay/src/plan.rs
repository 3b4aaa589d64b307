//! The schedule of a run: which rows are replayed, when each is sent, and (in closed
//! session mode) which turns wait for which.
//!
//! Offsets are absolute from the run's start (`start + offset`), never gaps to the previous
//! send, so timing errors do not accumulate. Everything here is computed before the clock
//! starts, including every request body, so nothing but sending happens at send time.

use std::collections::HashMap;
use std::time::Duration;

use trace_format::TraceRecord;

use crate::config::{Arrivals, RequestOptions, Selection, SessionMode, Shard};
use crate::error::ReplayError;
use crate::prompt::stable_hash;
use crate::request::{build_request, BuiltRequest};

/// One request of the schedule.
#[derive(Debug, Clone)]
pub struct PlannedRequest {
    /// The trace row's request id.
    pub request_id: String,
    /// The trace row's session.
    pub session_id: Option<String>,
    /// Scheduled send offset from the run start (open mode, and first turns in closed mode).
    pub offset: Duration,
    /// Closed mode: think time between the previous turn's end and this one.
    pub think: Duration,
    /// Closed mode: the next turn of this request's session (index into the plan).
    pub next_turn: Option<usize>,
    /// Closed mode: whether this turn waits for a previous one.
    pub waits_for_previous: bool,
    /// The request to send.
    pub req: BuiltRequest,
    /// The recorded prompt length.
    pub prompt_tokens: Option<i64>,
}

/// The whole schedule.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Requests, ordered by offset.
    pub items: Vec<PlannedRequest>,
    /// Span of the selected rows in trace time (last arrival − first).
    pub trace_span: Duration,
    /// Rows in the input trace.
    pub trace_rows: usize,
    /// Selected rows that could not become a request: (request id, why).
    pub skipped: Vec<(String, String)>,
    /// Requests that send their row's recorded body (the others' prompts are synthesized).
    pub bodies: usize,
}

impl Plan {
    /// Offset of the last scheduled first-send.
    pub fn last_offset(&self) -> Duration {
        self.items
            .iter()
            .map(|p| p.offset)
            .max()
            .unwrap_or_default()
    }
}

/// Positions (into `chosen`) of the rows of `chosen` that belong to `shard`.
pub fn shard_positions(records: &[TraceRecord], chosen: &[usize], shard: Shard) -> Vec<usize> {
    chosen
        .iter()
        .enumerate()
        .filter(|(_, &i)| shard.contains(&records[i]))
        .map(|(k, _)| k)
        .collect()
}

/// Indices of the rows `sel` keeps, in arrival order, before sharding (`sel.shard` is
/// applied by [`build_plan`] after offsets are computed over this whole selection, so a
/// shard keeps the offsets of the full schedule). `records` must be sorted by arrival.
pub fn select(records: &[TraceRecord], sel: &Selection, seed: u64) -> Vec<usize> {
    let Some(first) = records.first().map(|r| r.arrival_time_us) else {
        return Vec::new();
    };
    let lo = first.saturating_add(sel.start_offset.as_micros() as i64);
    let hi = sel
        .duration
        .map(|d| lo.saturating_add(d.as_micros() as i64));
    let mut out: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.arrival_time_us >= lo && hi.is_none_or(|h| r.arrival_time_us < h))
        .filter(|(_, r)| match sel.sample_ratio {
            None => true,
            Some(ratio) => {
                let key = r.session_id.as_deref().unwrap_or(&r.request_id);
                let h = stable_hash(key) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
                ((h >> 11) as f64 / (1u64 << 53) as f64) < ratio
            }
        })
        .map(|(i, _)| i)
        .collect();
    if let Some(m) = sel.max_requests {
        out.truncate(m);
    }
    out
}

/// Send offsets for `n` requests: recorded arrivals (µs since epoch, ascending) scaled by
/// the speedup, or vLLM's gamma process.
pub fn offsets(arrivals_us: &[i64], mode: Arrivals, seed: u64) -> Vec<Duration> {
    match mode {
        Arrivals::Recorded { speedup } => {
            let first = arrivals_us.first().copied().unwrap_or(0);
            arrivals_us
                .iter()
                .map(|a| Duration::from_secs_f64(((a - first).max(0) as f64 / 1e6) / speedup))
                .collect()
        }
        Arrivals::Rate { rate, burstiness } => {
            // vLLM's gamma process; `ReplayConfig::validate` has checked the parameters.
            trace_format::arrivals::gamma_offsets(arrivals_us.len(), rate, burstiness, seed)
                .expect("validated rate and burstiness")
        }
    }
}

/// Builds the request of every chosen row, in order. Prompt synthesis with a tokenizer
/// re-tokenizes every prompt (tens of ms for a 100k-token one), so the rows are split across
/// the machine's cores; the result does not depend on the split.
fn build_requests(
    records: &[TraceRecord],
    chosen: &[usize],
    opts: &RequestOptions,
    default_model: &str,
    block_size: Option<usize>,
) -> Vec<Result<BuiltRequest, String>> {
    let build = |i: &usize| build_request(&records[*i], opts, default_model, block_size);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if opts.tokenizer.is_none() || threads < 2 || chosen.len() < 64 {
        return chosen.iter().map(build).collect();
    }
    let per = chosen.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = chosen
            .chunks(per)
            .map(|part| s.spawn(move || part.iter().map(build).collect::<Vec<_>>()))
            .collect();
        let mut out = Vec::with_capacity(chosen.len());
        for h in handles {
            out.extend(h.join().expect("prompt synthesis does not panic"));
        }
        out
    })
}

/// Builds the schedule for `records` (sorted by arrival).
#[allow(clippy::too_many_arguments)]
pub fn build_plan(
    records: &[TraceRecord],
    sel: &Selection,
    arrivals: Arrivals,
    session_mode: SessionMode,
    opts: &RequestOptions,
    default_model: &str,
    block_size: Option<usize>,
    seed: u64,
) -> Result<Plan, ReplayError> {
    let chosen = select(records, sel, seed);
    if chosen.is_empty() {
        return Err(ReplayError::Empty(if records.is_empty() {
            "the trace has no rows".into()
        } else {
            "the window/sample selected no rows".into()
        }));
    }
    let arrivals_us: Vec<i64> = chosen.iter().map(|&i| records[i].arrival_time_us).collect();
    let offs = offsets(&arrivals_us, arrivals, seed);
    // A shard keeps its rows' offsets in the whole selection's schedule, so shards started
    // at the same instant reproduce the full arrival shape together.
    let (chosen, offs) = match sel.shard {
        None => (chosen, offs),
        Some(shard) => {
            let keep = shard_positions(records, &chosen, shard);
            if keep.is_empty() {
                return Err(ReplayError::Empty(format!(
                    "shard {shard} has none of the {} selected rows (fewer sessions than shards?)",
                    chosen.len()
                )));
            }
            (
                keep.iter().map(|&k| chosen[k]).collect::<Vec<_>>(),
                keep.iter().map(|&k| offs[k]).collect::<Vec<_>>(),
            )
        }
    };
    let speedup = match arrivals {
        Arrivals::Recorded { speedup } => speedup,
        Arrivals::Rate { .. } => 1.0,
    };
    // Rows that cannot become a request (no body and no recorded length, ...) are skipped
    // and reported, never silently: the others keep their offsets.
    let mut skipped = Vec::new();
    let mut kept = Vec::with_capacity(chosen.len());
    let mut kept_offs = Vec::with_capacity(chosen.len());
    let mut reqs = Vec::with_capacity(chosen.len());
    for ((k, &i), built) in chosen.iter().enumerate().zip(build_requests(
        records,
        &chosen,
        opts,
        default_model,
        block_size,
    )) {
        match built {
            Ok(req) => {
                kept.push(i);
                kept_offs.push(offs[k]);
                reqs.push(req);
            }
            Err(reason) => skipped.push((records[i].request_id.clone(), reason)),
        }
    }
    if kept.is_empty() {
        return Err(ReplayError::Empty(format!(
            "none of the {} selected rows can be replayed; first: {}",
            skipped.len(),
            skipped.first().map_or("", |(_, r)| r.as_str())
        )));
    }
    let (chosen, offs) = (kept, kept_offs);
    let mut items = Vec::with_capacity(chosen.len());
    for ((k, &i), req) in chosen.iter().enumerate().zip(reqs) {
        let rec = &records[i];
        items.push(PlannedRequest {
            request_id: rec.request_id.clone(),
            session_id: rec.session_id.clone(),
            offset: offs[k],
            think: Duration::ZERO,
            next_turn: None,
            waits_for_previous: false,
            req,
            prompt_tokens: rec.prompt_tokens,
        });
    }
    if session_mode == SessionMode::Closed {
        let mut last_of: HashMap<&str, usize> = HashMap::new();
        for k in 0..items.len() {
            let Some(sid) = records[chosen[k]].session_id.as_deref() else {
                continue;
            };
            if let Some(&prev) = last_of.get(sid) {
                let p = &records[chosen[prev]];
                let c = &records[chosen[k]];
                let prev_end = p.arrival_time_us + p.e2el_us.unwrap_or(0).max(0);
                let think_us = (c.arrival_time_us - prev_end).max(0);
                items[k].think = Duration::from_secs_f64(think_us as f64 / 1e6 / speedup);
                items[k].waits_for_previous = true;
                items[prev].next_turn = Some(k);
            }
            last_of.insert(sid, k);
        }
    }
    let bodies = chosen
        .iter()
        .filter(|&&i| records[i].body.is_some())
        .count();
    Ok(Plan {
        bodies,
        trace_span: Duration::from_micros(
            (arrivals_us[arrivals_us.len() - 1] - arrivals_us[0]).max(0) as u64,
        ),
        trace_rows: records.len(),
        items,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutputLen;

    fn rec(id: &str, t_ms: i64, session: Option<&str>) -> TraceRecord {
        let mut r = TraceRecord::new(id, 1_700_000_000_000_000 + t_ms * 1000, "/v1/completions");
        r.prompt_tokens = Some(5);
        r.output_tokens = Some(3);
        r.session_id = session.map(str::to_string);
        r
    }

    /// The plan of `rs` with recorded arrivals at speed 1, open sessions and default options.
    fn open_plan(rs: &[TraceRecord]) -> Result<Plan, ReplayError> {
        build_plan(
            rs,
            &Selection::default(),
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Open,
            &opts(),
            "m",
            None,
            0,
        )
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
        }
    }

    #[test]
    fn recorded_offsets_scale_with_speedup() {
        let o = offsets(
            &[10_000_000, 10_500_000, 12_000_000],
            Arrivals::Recorded { speedup: 2.0 },
            0,
        );
        assert_eq!(
            o,
            vec![
                Duration::ZERO,
                Duration::from_millis(250),
                Duration::from_millis(1000)
            ]
        );
    }

    #[test]
    fn gamma_offsets_have_the_asked_rate_and_are_seeded() {
        let a = offsets(
            &vec![0; 20_000],
            Arrivals::Rate {
                rate: 100.0,
                burstiness: 1.0,
            },
            3,
        );
        let b = offsets(
            &vec![0; 20_000],
            Arrivals::Rate {
                rate: 100.0,
                burstiness: 1.0,
            },
            3,
        );
        assert_eq!(a, b);
        let rate = 19_999.0 / a.last().unwrap().as_secs_f64();
        assert!((rate - 100.0).abs() < 3.0, "rate {rate}");
        let inf = offsets(
            &[0, 0, 0],
            Arrivals::Rate {
                rate: f64::INFINITY,
                burstiness: 1.0,
            },
            3,
        );
        assert!(inf.iter().all(|d| d.is_zero()));
    }

    #[test]
    fn window_sample_and_max_select_rows() {
        let rs: Vec<TraceRecord> = (0..100)
            .map(|i| rec(&format!("r{i}"), i * 100, None))
            .collect();
        let sel = Selection {
            start_offset: Duration::from_secs(1),
            duration: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let s = select(&rs, &sel, 0);
        assert_eq!(s, (10..30).collect::<Vec<_>>());
        let sel = Selection {
            max_requests: Some(5),
            ..Default::default()
        };
        assert_eq!(select(&rs, &sel, 0).len(), 5);
        let sel = Selection {
            sample_ratio: Some(0.5),
            ..Default::default()
        };
        let n = select(&rs, &sel, 0).len();
        assert!((30..70).contains(&n), "{n}");
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
        let kept = select(&rs, &sel, 42);
        for s in 0..20 {
            let n = kept
                .iter()
                .filter(|&&i| rs[i].session_id.as_deref() == Some(&format!("s{s}")))
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
        let full = open_plan(&rs).unwrap();
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
            let p = build_plan(
                &rs,
                &sel,
                Arrivals::Recorded { speedup: 1.0 },
                SessionMode::Open,
                &opts(),
                "m",
                None,
                0,
            )
            .unwrap();
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
        // Deterministic: the same shard twice is the same rows.
        let sel = Selection {
            shard: Some("2/4".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(
            shard_positions(&rs, &select(&rs, &sel, 0), sel.shard.unwrap()),
            shard_positions(&rs, &select(&rs, &sel, 9), sel.shard.unwrap())
        );
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
        assert_eq!(
            p.items
                .iter()
                .map(|i| i.request_id.as_str())
                .collect::<Vec<_>>(),
            vec!["a", "c"]
        );
        assert_eq!(
            p.items[1].offset,
            Duration::from_millis(20),
            "others keep their offsets"
        );
        assert_eq!(p.skipped.len(), 1);
        assert!(
            p.skipped[0].1.contains("no prompt_tokens"),
            "{:?}",
            p.skipped
        );
        rs[0].prompt_tokens = None;
        rs[2].prompt_tokens = None;
        let err = open_plan(&rs).unwrap_err();
        assert!(
            err.to_string().contains("none of the 3 selected rows"),
            "{err}"
        );
    }

    #[test]
    fn closed_sessions_chain_turns_with_think_time() {
        let mut rs = vec![
            rec("a1", 0, Some("a")),
            rec("b1", 100, Some("b")),
            rec("a2", 1000, Some("a")),
        ];
        rs[0].e2el_us = Some(400_000);
        let p = build_plan(
            &rs,
            &Selection::default(),
            Arrivals::Recorded { speedup: 1.0 },
            SessionMode::Closed,
            &opts(),
            "m",
            None,
            0,
        )
        .unwrap();
        assert_eq!(p.items[0].next_turn, Some(2));
        assert!(p.items[2].waits_for_previous);
        assert_eq!(p.items[2].think, Duration::from_millis(600));
        assert!(!p.items[1].waits_for_previous);
    }
}
