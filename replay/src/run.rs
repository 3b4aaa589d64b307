//! Running a plan against one target: discovery, warm-up, preconnect, the paced run, and
//! the per-request result rows.
//!
//! The client runs on its own tokio runtime (threads named `llmreplay-client`) so its CPU
//! can be measured apart from anything else in the process, such as an in-process sim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Semaphore};
use trace_format::{Outcome, TokenSource, TraceRecord};

use crate::client::Client;
use crate::config::{ReplayConfig, Target, ValidatedConfig};
use crate::cpu;
use crate::error::ReplayError;
use crate::pacer::{spawn_pacer, Release};
use crate::plan::{build_plan, Plan};

/// Name prefix of the client runtime's threads.
pub const CLIENT_THREAD: &str = "llmreplay-clien";

/// What a target says about itself.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TargetInfo {
    /// Model ids from `/v1/models`.
    pub models: Vec<String>,
    /// The body of `/version`, when offered.
    pub version: Option<serde_json::Value>,
}

/// The client's own resource use during the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClientLoad {
    /// CPU seconds of the client's worker threads.
    pub cpu_seconds: f64,
    /// Worker threads.
    pub worker_threads: usize,
    /// cpu_seconds / (wall × worker threads).
    pub utilization: f64,
    /// CPU seconds of the pacer thread (spinning near deadlines).
    pub pacer_cpu_seconds: f64,
}

/// One run against one target.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The target.
    pub target: Target,
    /// What it said about itself.
    pub target_info: TargetInfo,
    /// The model name requests were built with.
    pub model: String,
    /// Unique id of this run.
    pub run_id: String,
    /// Wall-clock time of the schedule's start, µs since the epoch.
    pub started_at_us: i64,
    /// One row per request, in plan order.
    pub records: Vec<TraceRecord>,
    /// The plan that was replayed.
    pub plan_len: usize,
    /// Of which sent their row's recorded body (the others' prompts were synthesized).
    pub bodies_replayed: usize,
    /// Selected rows that could not become a request: (request id, why).
    pub skipped: Vec<(String, String)>,
    /// Trace time span of the selection.
    pub trace_span: Duration,
    /// Wall time of the run.
    pub wall: Duration,
    /// Connections opened before the clock started.
    pub preconnected: usize,
    /// What the connection pool did while the clock ran (`None` where unknown: merged
    /// shards).
    pub pool: Option<wire::PoolStats>,
    /// Warm-up requests sent.
    pub warmups: usize,
    /// Client CPU, when measurable.
    pub client_load: Option<ClientLoad>,
    /// The server's scheduler gauges sampled during the run (`--server-metrics`).
    pub server_gauges: std::collections::BTreeMap<String, crate::server_metrics::GaugeStats>,
    /// The server's histograms over the run (after − before scrape; `--server-metrics`).
    pub server_histograms:
        std::collections::BTreeMap<String, crate::server_metrics::HistogramSummary>,
    /// Set when the run was stopped before its schedule ended: what ran is partial.
    pub interrupted: Option<crate::stop::Interrupted>,
}

/// Builds the client runtime.
pub fn client_runtime(threads: usize) -> Result<tokio::runtime::Runtime, ReplayError> {
    let n = if threads == 0 {
        cpu::available_cpus()
    } else {
        threads
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(n)
        .thread_name(CLIENT_THREAD)
        .enable_all()
        .build()
        .map_err(|e| ReplayError::Runtime(e.to_string()))
}

/// Asks the target for its models and version. Unreachable is an error: nothing can run.
pub async fn discover(client: &Client, target: &Target) -> Result<TargetInfo, ReplayError> {
    let (status, body) = client
        .get("/v1/models")
        .await
        .map_err(|e| ReplayError::Target {
            target: target.name.clone(),
            message: format!("unreachable: {e}"),
        })?;
    let mut info = TargetInfo::default();
    if status == 200 {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
            if let Some(data) = v.get("data").and_then(|d| d.as_array()) {
                info.models = data
                    .iter()
                    .filter_map(|m| m.get("id")?.as_str().map(String::from))
                    .collect();
            }
        }
    }
    if let Ok((200, body)) = client.get("/version").await {
        info.version = serde_json::from_slice(&body).ok();
    }
    Ok(info)
}

/// How many connections to open before the clock starts: the concurrency the run will reach.
fn preconnect_count(plan: &Plan, records: &[TraceRecord], cfg: &ReplayConfig) -> usize {
    let n = plan.items.len();
    let estimate = match cfg.max_concurrency {
        Some(c) => c.min(n),
        None => {
            // Peak overlap of [offset, offset + recorded e2el], when the trace has latencies;
            // otherwise the most sends in any 5 s of the schedule (most requests end sooner).
            let by_id: std::collections::HashMap<&str, i64> = records
                .iter()
                .filter_map(|r| Some((r.request_id.as_str(), r.e2el_us?)))
                .collect();
            if by_id.is_empty() {
                let mut iv: Vec<(i64, i64)> = plan
                    .items
                    .iter()
                    .map(|p| {
                        let s = p.offset.as_micros() as i64;
                        (s, s + 5_000_000)
                    })
                    .collect();
                crate::metrics::max_overlap(&mut iv)
            } else {
                let mut iv: Vec<(i64, i64)> = plan
                    .items
                    .iter()
                    .map(|p| {
                        let s = p.offset.as_micros() as i64;
                        (
                            s,
                            s + by_id
                                .get(p.request_id.as_str())
                                .copied()
                                .unwrap_or(1_000_000),
                        )
                    })
                    .collect();
                crate::metrics::max_overlap(&mut iv) + 4
            }
        }
    };
    estimate.clamp(1, 4096).min(n)
}

struct Shared {
    plan: Plan,
    client: Arc<Client>,
    sem: Option<Semaphore>,
    start: Instant,
    started_at_us: i64,
    /// (plan index, row, end of the request, whether it waited for a concurrency slot).
    results: mpsc::UnboundedSender<(usize, TraceRecord, Instant, bool)>,
    in_flight: AtomicUsize,
    target: String,
    run_id: String,
    model: String,
    /// Counts the generated text of responses that carry no usage (`--tokenizer`).
    tokenizer: Option<Arc<crate::prompt::PromptTokenizer>>,
}

/// Runs the plan built from `records` against `target` on runtime `rt`.
pub fn run_target(
    rt: &tokio::runtime::Runtime,
    cfg: &ValidatedConfig,
    records: &[TraceRecord],
    block_size: Option<usize>,
    target: &Target,
    run_id: &str,
    progress: &dyn Fn(Progress),
) -> Result<RunOutput, ReplayError> {
    let client = Client::new(&target.url, &cfg.request, cfg.request.timeout)?;
    let info = rt.block_on(discover(&client, target))?;
    let model = cfg
        .request
        .model
        .clone()
        .or_else(|| info.models.first().cloned())
        .unwrap_or_else(|| "default".into());
    let plan = build_plan(
        records,
        &cfg.selection,
        cfg.arrivals,
        cfg.session_mode,
        &cfg.request,
        &model,
        block_size,
        cfg.seed,
    )?;

    // Warm-ups: same shape as the first request, different salt, not counted.
    if cfg.num_warmups > 0 {
        let mut wopts = cfg.request.clone();
        wopts.prompt_salt ^= 0x5741_524d; // "WARM"
        let first = records
            .iter()
            .find(|r| r.request_id == plan.items[0].request_id);
        if let Some(first) = first {
            let req = crate::request::build_request(first, &wopts, &model, block_size)
                .map_err(ReplayError::Config)?;
            rt.block_on(async {
                for _ in 0..cfg.num_warmups {
                    client.execute(&req, None).await;
                }
            });
        }
    }
    // The pool is opened before any wait, so a target that cannot be reached fails at once,
    // and opened again (refreshed) right before the clock starts: a connection the target
    // closed during a `--start-at` wait, or that idled past the idle timeout, never meets
    // the first request.
    let want = if cfg.preconnect {
        preconnect_count(&plan, records, cfg)
    } else {
        0
    };
    let refresh = |what: &str| -> Result<Duration, ReplayError> {
        let t = Instant::now();
        if want > 0 {
            rt.block_on(client.refresh(want))
                .map_err(|e| ReplayError::Target {
                    target: target.name.clone(),
                    message: format!("{what}: {e}"),
                })?;
        }
        Ok(t.elapsed())
    };
    let preconnect_took = refresh("preconnect")?;
    let total = plan.items.len();
    let initial: Vec<Release> = plan
        .items
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.waits_for_previous)
        .map(|(i, p)| (p.offset, i))
        .collect();
    let trace_span = plan.trace_span;
    let skipped = plan.skipped.clone();
    let bodies_replayed = plan.bodies;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let lead = Duration::from_millis(20);
    let (start, started_at_us) = match cfg.start_at_us {
        None => (
            Instant::now() + lead,
            wire::clock::epoch_us() + lead.as_micros() as i64,
        ),
        // `--start-at`: the schedule starts at that wall-clock instant, shared by separate
        // processes; sleep until just before it, then start the pacer.
        Some(at) => {
            let (now_us, now) = (wire::clock::epoch_us(), Instant::now());
            let ahead_us = at - now_us;
            if ahead_us < -1_000_000 {
                return Err(ReplayError::Config(format!(
                    "--start-at passed {:.1} s ago while the run was being prepared; give a later time",
                    -ahead_us as f64 / 1e6
                )));
            }
            let start = if ahead_us >= 0 {
                now + Duration::from_micros(ahead_us as u64)
            } else {
                now.checked_sub(Duration::from_micros(ahead_us.unsigned_abs()))
                    .unwrap_or(now)
            };
            // Wake early enough to refresh the pool before the clock starts.
            let margin = lead + (preconnect_took * 2).max(Duration::from_millis(50));
            std::thread::sleep(
                start
                    .checked_sub(margin)
                    .unwrap_or(start)
                    .saturating_duration_since(Instant::now()),
            );
            (start, at)
        }
    };
    if cfg.start_at_us.is_some() {
        refresh("preconnect after the --start-at wait")?;
        std::thread::sleep(
            start
                .checked_sub(lead)
                .unwrap_or(start)
                .saturating_duration_since(Instant::now()),
        );
    }
    let pool_at_start = client.pool_stats();
    let shared = Arc::new(Shared {
        sem: cfg.max_concurrency.map(Semaphore::new),
        plan,
        client,
        start,
        started_at_us,
        results: tx,
        in_flight: AtomicUsize::new(0),
        target: target.name.clone(),
        run_id: run_id.to_string(),
        model: model.clone(),
        tokenizer: cfg.request.tokenizer.clone(),
    });
    let sampler = cfg.server_metrics.then(|| {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        // Its own client, so scrapes never take a pooled request connection.
        let scrape = Client::new(&target.url, &cfg.request, Duration::from_secs(5));
        let task = scrape.ok().map(|c| {
            rt.spawn(crate::server_metrics::sample(
                c,
                Duration::from_millis(100),
                stop_rx,
            ))
        });
        (stop_tx, task)
    });
    let cpu0 = cpu::threads_cpu(CLIENT_THREAD);
    let pacer_cpu0 = cpu::threads_cpu("llmreplay-pacer").unwrap_or_default();
    let handle = rt.handle().clone();
    let sh = shared.clone();
    let (successor_tx, pacer) = spawn_pacer(shared.start, initial, total, move |idx, scheduled| {
        handle.spawn(one_request(sh.clone(), idx, scheduled));
    })
    .map_err(|e| ReplayError::Runtime(format!("pacer thread: {e}")))?;

    let mut rows: Vec<Option<TraceRecord>> = vec![None; total];
    let mut waited = vec![false; total];
    let mut done = 0usize;
    let mut failed = 0usize;
    let wall0 = Instant::now();
    rt.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while done < total {
            tokio::select! {
                got = rx.recv() => {
                    let Some((idx, rec, end, slot_wait)) = got else { break };
                    waited[idx] = slot_wait;
                    // Closed sessions: a finished turn schedules its successor after its think time.
                    if let Some(next) = shared.plan.items[idx].next_turn {
                        let at = end.saturating_duration_since(shared.start) + shared.plan.items[next].think;
                        let _ = successor_tx.send((at, next));
                    }
                    if rec.outcome != Outcome::Ok { failed += 1; }
                    rows[idx] = Some(rec);
                    done += 1;
                }
                _ = tick.tick() => {
                    progress(Progress { done, failed, in_flight: shared.in_flight.load(Ordering::Relaxed), total });
                }
            }
        }
    });
    progress(Progress {
        done,
        failed,
        in_flight: 0,
        total,
    });
    let _ = pacer.join();
    let wall = wall0.elapsed().saturating_sub(lead);
    let pool = shared.client.pool_stats().since(&pool_at_start);
    let client_load = match (cpu0, cpu::threads_cpu(CLIENT_THREAD)) {
        (Some(a), Some(b)) => {
            let workers = rt.metrics().num_workers();
            let secs = b.saturating_sub(a).as_secs_f64();
            Some(ClientLoad {
                cpu_seconds: secs,
                worker_threads: workers,
                utilization: secs / (wall.as_secs_f64().max(1e-9) * workers as f64),
                pacer_cpu_seconds: cpu::threads_cpu("llmreplay-pacer")
                    .unwrap_or_default()
                    .saturating_sub(pacer_cpu0)
                    .as_secs_f64(),
            })
        }
        _ => None,
    };
    let server_gauges = match sampler {
        Some((stop, Some(task))) => {
            let _ = stop.send(());
            rt.block_on(task).unwrap_or_default()
        }
        _ => Default::default(),
    };
    if let Some(missing) = rows.iter().position(Option::is_none) {
        return Err(ReplayError::Runtime(format!(
            "{} of {total} requests reported no result (the first: plan item {missing})",
            rows.iter().filter(|r| r.is_none()).count()
        )));
    }
    let mut records_out: Vec<TraceRecord> = rows.into_iter().flatten().collect();
    attribute_bursts(&mut records_out, &waited);
    Ok(RunOutput {
        target: target.clone(),
        target_info: info,
        model,
        run_id: run_id.to_string(),
        started_at_us: shared.started_at_us,
        records: records_out,
        plan_len: total,
        bodies_replayed,
        skipped,
        trace_span,
        wall,
        preconnected: pool_at_start.preconnected as usize,
        pool: Some(pool),
        warmups: cfg.num_warmups,
        client_load,
        server_gauges,
        server_histograms: Default::default(),
        interrupted: None,
    })
}

/// Requests due at one instant (identical timestamps in a trace, `--request-rate inf`) leave
/// one after another: no client writes a thousand requests at once. Each such request waits
/// for the ones of its instant sent before it, and that wait is client queue time, like the
/// wait for a `--max-concurrency` slot; its dispatch lag is only the time after its turn came
/// (the previous one was sent). So a burst shows as queue time and a client that sends it
/// promptly keeps a lag of microseconds, while a stall between two sends, or a burst that
/// starts late, is still lag. Requests that waited for a slot (`waited`) are due when they got
/// it and are left out. The row invariant holds: send = start + scheduled offset + queue +
/// lag + connect.
pub(crate) fn attribute_bursts(rows: &mut [TraceRecord], waited: &[bool]) {
    let mut by_instant: std::collections::HashMap<i64, Vec<usize>> = Default::default();
    for (i, r) in rows.iter().enumerate() {
        if let (Some(off), false) = (
            r.scheduled_offset_us,
            waited.get(i).copied().unwrap_or(true),
        ) {
            by_instant.entry(off).or_default().push(i);
        }
    }
    for mut burst in by_instant.into_values().filter(|b| b.len() > 1) {
        burst.sort_by_key(|&i| rows[i].arrival_time_us);
        for w in burst.windows(2) {
            let before = rows[w[0]].arrival_time_us;
            let r = &mut rows[w[1]];
            let (lag, queue) = (r.dispatch_lag_us.unwrap_or(0), r.queue_us.unwrap_or(0));
            let behind = lag + queue;
            // The instant the request was due (start + scheduled offset), from its own row.
            let due = r.arrival_time_us - behind - r.connect_us.unwrap_or(0);
            let wait = (before - due).clamp(0, behind);
            r.queue_us = Some(wait);
            r.dispatch_lag_us = Some(behind - wait);
        }
    }
}

/// Progress of a run, for a live display.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Requests finished.
    pub done: usize,
    /// Of which failed.
    pub failed: usize,
    /// In flight now.
    pub in_flight: usize,
    /// Requests in the plan.
    pub total: usize,
}

/// Sends a result row even if the request task is torn down early, so the run never waits
/// for a row that will not come.
struct RowGuard {
    shared: Arc<Shared>,
    idx: usize,
    sent: bool,
}

impl Drop for RowGuard {
    fn drop(&mut self) {
        if !self.sent {
            let item = &self.shared.plan.items[self.idx];
            let mut rec = TraceRecord::new(
                item.request_id.clone(),
                wire::clock::epoch_us(),
                item.req.endpoint.clone(),
            );
            rec.outcome = Outcome::ClientCancelled;
            rec.error = Some("request task ended before its result was recorded".into());
            rec.target = Some(self.shared.target.clone());
            rec.run_id = Some(self.shared.run_id.clone());
            let _ = self
                .shared
                .results
                .send((self.idx, rec, Instant::now(), false));
        }
    }
}

async fn one_request(sh: Arc<Shared>, idx: usize, scheduled: Instant) {
    let mut guard = RowGuard {
        shared: sh.clone(),
        idx,
        sent: false,
    };
    // When the request is due: its scheduled time or, when it had to wait for a
    // `--max-concurrency` slot, the moment it got one. Only the time after that is the
    // client's own delay (dispatch lag); a request that waits for a slot anyway is not
    // charged for having been released late.
    let (_permit, slot_at) = match &sh.sem {
        Some(s) => match s.try_acquire() {
            Ok(p) => (Some(p), None),
            Err(_) => {
                let p = s.acquire().await.ok();
                (p, Some(Instant::now()))
            }
        },
        None => (None, None),
    };
    let due = slot_at.map_or(scheduled, |at| at.max(scheduled));
    let waited = slot_at.is_some();
    sh.in_flight.fetch_add(1, Ordering::Relaxed);
    let item = &sh.plan.items[idx];
    let ex = sh.client.execute(&item.req, Some(&item.request_id)).await;
    let end = ex.end;
    sh.in_flight.fetch_sub(1, Ordering::Relaxed);

    let t0_off = ex.t0.saturating_duration_since(sh.start);
    let mut rec = TraceRecord::new(
        item.request_id.clone(),
        sh.started_at_us + t0_off.as_micros() as i64,
        item.req.endpoint.clone(),
    );
    rec.session_id = item.session_id.clone();
    rec.model = Some(sh.model.clone());
    rec.stream = item.req.stream;
    match ex.prompt_tokens {
        Some(p) => {
            rec.prompt_tokens = Some(p);
            rec.prompt_tokens_source = Some(TokenSource::Usage);
        }
        None => {
            rec.prompt_tokens = item.prompt_tokens;
            rec.prompt_tokens_source = item.prompt_tokens.map(|_| TokenSource::Estimate);
        }
    }
    // Output tokens: the server's usage; without it, the generated text counted by the
    // tokenizer (--tokenizer); with neither, the output chunks (labelled an estimate: a
    // chunk may carry several tokens).
    let counted = ex.output_text.as_deref().and_then(|t| {
        let tok = sh.tokenizer.as_ref()?;
        tok.tokenizer().count(t).ok()
    });
    match (ex.completion_tokens, counted) {
        (Some(c), _) => {
            rec.output_tokens = Some(c);
            rec.output_tokens_source = Some(TokenSource::Usage);
        }
        (None, Some(n)) => {
            rec.output_tokens = Some(n as i64);
            rec.output_tokens_source = Some(TokenSource::Tokenizer);
        }
        (None, None) if !ex.chunk_times_us.is_empty() => {
            rec.output_tokens = Some(ex.chunk_times_us.len() as i64);
            rec.output_tokens_source = Some(TokenSource::Estimate);
        }
        (None, None) => {}
    }
    rec.max_tokens = item.req.max_tokens;
    rec.status = ex.status;
    rec.outcome = ex.outcome;
    // Redacted here, not only by the writer: the error also goes to the JSON result
    // (--save-detailed) and the console. An upstream may echo the key in a 401.
    rec.error = ex
        .error
        .map(|e| trace_format::redact::redact_text(&e).into_owned());
    rec.ttft_us = ex.ttft_us;
    rec.e2el_us = ex.e2el_us;
    rec.chunk_times_us = ex.chunk_times_us;
    rec.chunk_tokens = ex.chunk_tokens;
    rec.request_bytes = item.req.body.len() as i64;
    rec.response_bytes = ex.response_bytes;
    let sched_off = scheduled.saturating_duration_since(sh.start);
    rec.scheduled_offset_us = Some(sched_off.as_micros() as i64);
    let queue = due.saturating_duration_since(scheduled);
    let lag = ex
        .t0
        .saturating_duration_since(due)
        .saturating_sub(ex.connect);
    rec.dispatch_lag_us = Some(lag.as_micros() as i64);
    rec.queue_us = Some(queue.as_micros() as i64);
    rec.new_connection = Some(ex.new_connection);
    rec.connect_us = ex.new_connection.then_some(ex.connect.as_micros() as i64);
    rec.target = Some(sh.target.clone());
    rec.run_id = Some(sh.run_id.clone());
    guard.sent = true;
    let _ = sh.results.send((idx, rec, end, waited));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row as `one_request` leaves it: due at `start + offset`, sent `lag + queue + connect`
    /// later.
    fn row(id: &str, offset: i64, lag: i64, queue: i64, connect: Option<i64>) -> TraceRecord {
        const START: i64 = 1_700_000_000_000_000;
        let mut r = TraceRecord::new(
            id,
            START + offset + lag + queue + connect.unwrap_or(0),
            "/v1/completions",
        );
        r.scheduled_offset_us = Some(offset);
        r.dispatch_lag_us = Some(lag);
        r.queue_us = Some(queue);
        r.connect_us = connect;
        r
    }

    fn send_minus_parts(r: &TraceRecord) -> i64 {
        r.arrival_time_us
            - r.scheduled_offset_us.unwrap()
            - r.dispatch_lag_us.unwrap()
            - r.queue_us.unwrap()
            - r.connect_us.unwrap_or(0)
    }

    #[test]
    fn a_burst_is_queue_time_and_only_gaps_between_sends_are_lag() {
        // Four requests due at 0, sent 30, 50, 2_050 and 2_060 µs late (the third after a
        // 2 ms stall), listed out of send order; one at 5_000 on its own; two due at 9_000
        // of which one waited for a concurrency slot (its lag is already from the slot).
        let mut rows = vec![
            row("c", 0, 2_050, 0, None),
            row("a", 0, 30, 0, None),
            row("d", 0, 2_060, 0, None),
            row("b", 0, 50, 0, None),
            row("e", 5_000, 40, 0, None),
            row("f", 9_000, 25, 0, None),
            row("g", 9_000, 10, 700, None),
        ];
        let waited = [false, false, false, false, false, false, true];
        let before: Vec<i64> = rows.iter().map(send_minus_parts).collect();
        attribute_bursts(&mut rows, &waited);
        let got: Vec<(&str, i64, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.request_id.as_str(),
                    r.dispatch_lag_us.unwrap(),
                    r.queue_us.unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("c", 2_000, 50),
                ("a", 30, 0),
                ("d", 10, 2_050),
                ("b", 20, 30),
                ("e", 40, 0),
                ("f", 25, 0),
                ("g", 10, 700),
            ]
        );
        // Every row still adds up to its send time.
        let after: Vec<i64> = rows.iter().map(send_minus_parts).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn connect_time_in_a_burst_is_neither_queue_nor_lag() {
        // Both due at 0; "y" opened a connection for 400 µs, in parallel with "x"'s send.
        let mut rows = vec![row("x", 0, 20, 0, None), row("y", 0, 30, 0, Some(400))];
        attribute_bursts(&mut rows, &[false, false]);
        // "y" was sent at 430, after "x" (20): of its 30 µs behind schedule (connect apart),
        // the 20 before "x" left are queue, the 10 after are lag.
        assert_eq!(rows[1].queue_us, Some(20));
        assert_eq!(rows[1].dispatch_lag_us, Some(10));
        assert_eq!(rows[1].connect_us, Some(400));
        // "y" connected while "x" was sent (at 300) and left at 405: it cannot have queued
        // longer than the 5 µs it was behind, and its lag does not go below zero.
        let mut rows = vec![row("x", 0, 300, 0, None), row("y", 0, 5, 0, Some(400))];
        attribute_bursts(&mut rows, &[false, false]);
        assert_eq!(rows[1].queue_us, Some(5));
        assert_eq!(rows[1].dispatch_lag_us, Some(0));
        assert_eq!(send_minus_parts(&rows[1]), 1_700_000_000_000_000);
    }
}
