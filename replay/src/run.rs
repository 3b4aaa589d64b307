//! Running the schedule against one target: discovery, warm-up, preconnect, the paced run,
//! and the per-request result rows, handed to the run's [`RowSink`] as requests finish.
//!
//! Three parts run at once: the feed ([`crate::feed`]) builds requests ahead of the clock,
//! the pacer ([`crate::pacer`]) releases each at its deadline onto the client runtime, and
//! the run loop here takes the rows as they finish (schedules closed-session successors,
//! attributes bursts, feeds the metrics and the sink) and watches the [`Stop`].
//!
//! The client runs on its own tokio runtime (threads named `llmreplay-client`) so its CPU
//! can be measured apart from anything else in the process, such as an in-process sim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Semaphore};
use trace_format::{Outcome, TraceRecord};

use crate::client::Client;
use crate::config::{ReplayConfig, Target, ValidatedConfig};
use crate::cpu;
use crate::dispatch::Dispatch;
use crate::error::ReplayError;
use crate::feed::{Fed, FeedMsg, ToPacer};
use crate::graph::{Ended, Ends};
use crate::metrics::Metrics;
use crate::metrics::MetricsBuilder;
pub use crate::output::{ClientLoad, RunOutput, TargetInfo};
use crate::pacer::{spawn_pacer, Input, PacerEnd};
use crate::plan::PlannedRequest;
use crate::preflight::{check_prefix, discover};
use crate::sink::RowSink;
use crate::source::RecordSource;
use crate::stop::{Interrupted, Stop};
use crate::task::{Bursts, RunMsg, Shared};

/// Name prefix of the client runtime's threads.
pub const CLIENT_THREAD: &str = "llmreplay-clien";

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

/// Longest the run waits, once the first request is built, for more of the schedule to
/// estimate the connections to open: the first request leaves within a second of the start.
const PREFIX_WAIT: Duration = Duration::from_millis(300);

/// How many connections to open before the clock starts: the concurrency the run will reach,
/// estimated from the first part of the schedule (`prefix`; `total` when the whole schedule is
/// known).
fn preconnect_count(prefix: &[&PlannedRequest], total: Option<u64>, cfg: &ReplayConfig) -> usize {
    let n = total.map_or(prefix.len(), |t| t as usize);
    let estimate = match cfg.max_concurrency {
        Some(c) => c.min(n),
        None => {
            // Peak overlap of [offset, offset + recorded e2el], when the trace has latencies;
            // otherwise the most sends in any 5 s of the schedule (most requests end sooner).
            let known = prefix.iter().any(|p| p.recorded_e2el_us.is_some());
            let mut iv: Vec<(i64, i64)> = prefix
                .iter()
                .map(|p| {
                    let s = p.offset.as_micros() as i64;
                    let len = match known {
                        true => p.recorded_e2el_us.unwrap_or(1_000_000),
                        false => 5_000_000,
                    };
                    (s, s + len)
                })
                .collect();
            crate::metrics::max_overlap(&mut iv) + if known { 4 } else { 0 }
        }
    };
    estimate.clamp(1, 4096).min(n.max(1))
}

/// The first part of the schedule, read before the clock starts.
struct Prefix {
    inputs: Vec<ToPacer>,
    first_row: Option<TraceRecord>,
    total: Option<u64>,
}

/// Waits for the first request, then for more until the feed is as far ahead as it may go,
/// has fed everything, or [`PREFIX_WAIT`] passed. An error of the feed before the clock
/// starts (nothing to replay, an unreadable trace) is the run's error.
fn read_prefix(
    rx: &Receiver<Vec<ToPacer>>,
    feed: &crate::feed::FeedCtl,
) -> Result<Prefix, ReplayError> {
    let mut p = Prefix {
        inputs: Vec::new(),
        first_row: None,
        total: None,
    };
    let mut first_at: Option<Instant> = None;
    loop {
        if p.total.is_some() || first_at.is_some_and(|t| t.elapsed() >= PREFIX_WAIT) {
            return Ok(p);
        }
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(batch) => {
                for i in batch {
                    match i {
                        Input::Pass(FeedMsg::First(r)) => p.first_row = Some(*r),
                        Input::Pass(FeedMsg::Failed(e)) => return Err(e),
                        Input::Pass(FeedMsg::Done(n)) => {
                            p.total = Some(n);
                            p.inputs.push(Input::Pass(FeedMsg::Done(n)));
                        }
                        i => {
                            first_at.get_or_insert_with(Instant::now);
                            p.inputs.push(i);
                        }
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) if first_at.is_some() && feed.stalled() => return Ok(p),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(ReplayError::Runtime("the feed ended without a word".into()))
            }
        }
    }
}

/// Runs the schedule of `source` against `target` on runtime `rt`: rows go to `sink` as they
/// finish, and to the returned metrics; `stop` ends it early.
#[allow(clippy::too_many_arguments)]
pub fn run_target(
    rt: &tokio::runtime::Runtime,
    cfg: &ValidatedConfig,
    source: &dyn RecordSource,
    block_size: Option<usize>,
    target: &Target,
    run_id: &str,
    progress: &dyn Fn(Progress),
    sink: &mut dyn RowSink,
    stop: &Stop,
) -> Result<(RunOutput, Metrics), ReplayError> {
    let endpoint = cfg.endpoint(target)?;
    let client = Client::new(endpoint, &cfg.request, cfg.request.timeout)?;
    let info = rt.block_on(discover(&client, target))?;
    if info.models.is_empty() && !endpoint.base_path.is_empty() {
        rt.block_on(check_prefix(endpoint, &cfg.request, target))?;
    }
    let model = cfg
        .request
        .model
        .clone()
        .or_else(|| info.models.first().cloned())
        .unwrap_or_else(|| "default".into());
    std::thread::scope(|scope| {
        let (feed_tx, feed_rx) = std::sync::mpsc::channel::<Vec<ToPacer>>();
        let feed = crate::feed::start(
            scope,
            cfg,
            source,
            model.clone(),
            block_size,
            feed_tx.clone(),
        )?;
        let ctl = feed.ctl.clone();
        let out = run_fed(
            rt, cfg, block_size, target, run_id, progress, sink, stop, client, info, model, &ctl,
            feed_tx, feed_rx,
        );
        let summary = feed.finish();
        let (mut run, m, err) = out?;
        run.plan_len = if summary.complete {
            summary.total as usize
        } else {
            run.plan_len.max(summary.total as usize)
        };
        // The rows the feed could not build, then the turns not sent for their parent.
        let mut skipped = summary.skipped;
        skipped.extend(std::mem::take(&mut run.skipped));
        run.skipped = skipped;
        run.bodies_replayed = summary.bodies;
        run.trace_span = summary.trace_span;
        if !summary.complete && run.interrupted.is_some() {
            // The feed stopped before the end of the selection: its span from the source's
            // arrival extent, the window applied (the rows were never read to the end).
            if let Ok(Some(span)) = source.arrival_span() {
                let whole = Duration::from_micros((span.last_us - span.first_us).max(0) as u64);
                let after = whole.saturating_sub(cfg.selection.start_offset);
                run.trace_span = cfg.selection.duration.map_or(after, |d| d.min(after));
            }
        }
        if let Some(i) = run.interrupted.as_mut() {
            i.not_sent = summary
                .complete
                .then(|| (summary.total as usize).saturating_sub(i.sent));
        }
        match err {
            Some(e) => Err(e),
            None => Ok((run, m)),
        }
    })
}

/// How long before the clock starts the pacer is started (and the pool last refreshed).
const LEAD: Duration = Duration::from_millis(20);

/// The run proper, once the feed runs: warm-up, preconnect, the clock, the run loop.
/// Returns the run and an error that stopped it (a sink that could not write, a trace that
/// could not be read further), if any.
#[allow(clippy::too_many_arguments)]
fn run_fed(
    rt: &tokio::runtime::Runtime,
    cfg: &ValidatedConfig,
    block_size: Option<usize>,
    target: &Target,
    run_id: &str,
    progress: &dyn Fn(Progress),
    sink: &mut dyn RowSink,
    stop: &Stop,
    client: Arc<Client>,
    info: TargetInfo,
    model: String,
    feed: &crate::feed::FeedCtl,
    successor_tx: Sender<Vec<ToPacer>>,
    feed_rx: Receiver<Vec<ToPacer>>,
) -> Result<(RunOutput, Metrics, Option<ReplayError>), ReplayError> {
    let prefix = read_prefix(&feed_rx, feed)?;
    warm_up(rt, cfg, &client, &prefix, &model, block_size)?;
    let (start, started_at_us) = start_clock(rt, cfg, &client, target, &prefix)?;
    sink.start(target, run_id)?;
    let pool_at_start = client.pool_stats();
    let (tx, rx) = mpsc::unbounded_channel::<RunMsg>();
    let shared = Arc::new(Shared {
        sem: cfg.max_concurrency.map(Semaphore::new),
        client,
        start,
        started_at_us,
        results: tx,
        in_flight: AtomicUsize::new(0),
        target: target.name.clone(),
        run_id: run_id.to_string(),
        model: model.clone(),
        tokenizer: cfg.request.tokenizer.clone(),
        stop: stop.clone(),
        abort: watch::channel(false).0,
    });
    let sampler = cfg.server_metrics.then(|| {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        // Its own client, so scrapes never take a pooled request connection.
        let scrape = cfg
            .endpoint(target)
            .and_then(|ep| Client::new(ep, &cfg.request, Duration::from_secs(5)));
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
    feed.started(start);
    let pacer = spawn_pacer(
        start,
        prefix.inputs,
        feed_rx,
        stop.clone(),
        Dispatch::new(rt.handle().clone(), shared.clone()),
    )
    .map_err(|e| ReplayError::Runtime(format!("pacer thread: {e}")))?;

    let probe = crate::probe::Probe::start(rt.handle());
    let mut lp = Loop::new(cfg, &shared, sink, successor_tx, prefix.total);
    let wall0 = Instant::now();
    let mut rx = lp.drive(rt, rx, progress, feed);
    let mut pr = lp.progress(feed);
    pr.in_flight = 0;
    progress(pr);
    // The schedule is over: the pacer ends once nothing can be sent to it any more.
    lp.successors = None;
    lp.ends.clear_waiting();
    feed.cancel();
    let _ = pacer.join();
    while let Ok(msg) = rx.try_recv() {
        lp.on(msg);
    }
    for (seq, rec) in lp.bursts.flush() {
        lp.emit(seq, rec);
    }
    let wall = wall0.elapsed().saturating_sub(LEAD);
    let pool = shared.client.pool_stats().since(&pool_at_start);
    let client_load = client_load(rt, cpu0, pacer_cpu0, wall);
    let client_timing = probe.map(|p| p.finish(rt));
    let server_gauges = match sampler {
        Some((stop, Some(task))) => {
            let _ = stop.send(());
            rt.block_on(task).unwrap_or_default()
        }
        _ => Default::default(),
    };
    let interrupted = lp.stopped_at.map(|at| Interrupted {
        reason: stop.state().reason().unwrap_or("stopped").to_string(),
        after: at.saturating_duration_since(start),
        sent: lp.done,
        not_sent: None,
        cancelled: lp.cancelled,
    });
    let mut kept = std::mem::take(&mut lp.kept);
    kept.sort_unstable_by_key(|(seq, _)| *seq);
    let run = RunOutput {
        target: target.clone(),
        target_info: info,
        model,
        run_id: run_id.to_string(),
        started_at_us,
        records: kept.into_iter().map(|(_, r)| r).collect(),
        endpoints: std::mem::take(&mut lp.endpoints),
        passes: lp.passes,
        plan_len: feed.emitted() as usize,
        bodies_replayed: 0,
        skipped: std::mem::take(&mut lp.not_sent),
        trace_span: Duration::ZERO,
        wall,
        preconnected: pool_at_start.preconnected as usize,
        pool: Some(pool),
        warmups: cfg.num_warmups,
        peak_built: feed.peak_held(),
        client_load,
        client_timing,
        server_gauges,
        server_histograms: Default::default(),
        interrupted,
    };
    let error = lp.error.take();
    Ok((run, lp.metrics.finish(), error))
}

/// Warm-ups: same shape as the first request, different salt, not counted.
fn warm_up(
    rt: &tokio::runtime::Runtime,
    cfg: &ValidatedConfig,
    client: &Client,
    prefix: &Prefix,
    model: &str,
    block_size: Option<usize>,
) -> Result<(), ReplayError> {
    if let (true, Some(first)) = (cfg.num_warmups > 0, &prefix.first_row) {
        let mut wopts = cfg.request.clone();
        wopts.prompt_salt ^= 0x5741_524d; // "WARM"
        let req = crate::request::build_request(first, &wopts, model, block_size)
            .map_err(ReplayError::Config)?;
        rt.block_on(async {
            for _ in 0..cfg.num_warmups {
                client.execute(&req, None, None).await;
            }
        });
    }
    Ok(())
}

/// Opens the pool and waits for the clock's start (now + [`LEAD`], or `--start-at`):
/// returns the start and its wall-clock stamp (µs since the epoch).
///
/// The pool is opened before any wait, so a target that cannot be reached fails at once,
/// and opened again (refreshed) right before the clock starts: a connection the target
/// closed during a `--start-at` wait, or that idled past the idle timeout, never meets
/// the first request.
fn start_clock(
    rt: &tokio::runtime::Runtime,
    cfg: &ValidatedConfig,
    client: &Client,
    target: &Target,
    prefix: &Prefix,
) -> Result<(Instant, i64), ReplayError> {
    let want = if cfg.preconnect {
        let items: Vec<&PlannedRequest> = prefix
            .inputs
            .iter()
            .filter_map(|i| match i {
                Input::At(_, _, f) | Input::Pass(FeedMsg::Waiting(f)) => Some(&f.item),
                _ => None,
            })
            .collect();
        preconnect_count(&items, prefix.total, cfg)
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
    let Some(at) = cfg.start_at_us else {
        return Ok((
            Instant::now() + LEAD,
            wire::clock::epoch_us() + LEAD.as_micros() as i64,
        ));
    };
    // `--start-at`: the schedule starts at that wall-clock instant, shared by separate
    // processes; sleep until just before it, then start the pacer.
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
    let margin = LEAD + (preconnect_took * 2).max(Duration::from_millis(50));
    std::thread::sleep(
        start
            .checked_sub(margin)
            .unwrap_or(start)
            .saturating_duration_since(Instant::now()),
    );
    refresh("preconnect after the --start-at wait")?;
    std::thread::sleep(
        start
            .checked_sub(LEAD)
            .unwrap_or(start)
            .saturating_duration_since(Instant::now()),
    );
    Ok((start, at))
}

/// The client runtime's CPU over the run (`cpu0`, `pacer_cpu0`: at its start), when the
/// threads' CPU can be read.
fn client_load(
    rt: &tokio::runtime::Runtime,
    cpu0: Option<Duration>,
    pacer_cpu0: Duration,
    wall: Duration,
) -> Option<ClientLoad> {
    let (a, b) = (cpu0?, cpu::threads_cpu(CLIENT_THREAD)?);
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

/// The run loop's state: rows as they finish, closed-session successors, the stop.
struct Loop<'a> {
    cfg: &'a ValidatedConfig,
    sh: &'a Arc<Shared>,
    sink: &'a mut dyn RowSink,
    metrics: MetricsBuilder,
    bursts: Bursts,
    /// Rows kept for [`RunOutput::records`] (`keep_rows`), with their schedule position.
    kept: Vec<(u64, TraceRecord)>,
    /// Rows per endpoint, and the soak passes seen ([`RunOutput::endpoints`], `passes`).
    endpoints: std::collections::BTreeMap<String, usize>,
    passes: usize,
    /// To the pacer: successors of finished turns.
    successors: Option<Sender<Vec<ToPacer>>>,
    /// Turns waiting for the turn they follow (closed mode; chained Responses turns in any
    /// mode), and how the last [`crate::graph::WINDOW`] chained turns that finished ended.
    ends: Ends<Box<Fed>>,
    /// Chained Responses turns not sent because their parent failed or was not sent, with
    /// why (reported with the rows the feed skipped).
    not_sent: crate::plan::Skipped,
    /// Requests in the schedule, once the feed has fed them all.
    total: Option<u64>,
    pacer_end: Option<PacerEnd>,
    /// Requests released that finished (with a row) or were not sent.
    finished: usize,
    /// Rows.
    done: usize,
    failed: usize,
    unsent: usize,
    /// Rows of requests a stop cancelled.
    cancelled: usize,
    stopped_at: Option<Instant>,
    error: Option<ReplayError>,
}

impl<'a> Loop<'a> {
    /// The loop of a run whose clock starts at `sh.start`; `total`: the requests of the
    /// schedule, when the feed has fed them all already.
    fn new(
        cfg: &'a ValidatedConfig,
        sh: &'a Arc<Shared>,
        sink: &'a mut dyn RowSink,
        successors: Sender<Vec<ToPacer>>,
        total: Option<u64>,
    ) -> Self {
        Loop {
            cfg,
            sh,
            sink,
            metrics: MetricsBuilder::new(sh.started_at_us, &cfg.goodput, &cfg.metric_percentiles),
            bursts: Bursts::default(),
            kept: Vec::new(),
            endpoints: Default::default(),
            passes: 0,
            successors: Some(successors),
            ends: Ends::default(),
            not_sent: Default::default(),
            total,
            pacer_end: None,
            finished: 0,
            done: 0,
            failed: 0,
            unsent: 0,
            cancelled: 0,
            // A stop requested before the clock started: nothing is sent.
            stopped_at: (sh.stop.level() > 0).then(Instant::now),
            error: None,
        }
    }

    /// Takes the rows as they finish until the run is over, watching the stop: a first stop
    /// drains for the drain timeout, then (or at once for a second stop) in-flight requests
    /// are aborted. Hands back the channel, for what is still on its way.
    fn drive(
        &mut self,
        rt: &tokio::runtime::Runtime,
        mut rx: mpsc::UnboundedReceiver<RunMsg>,
        progress: &dyn Fn(Progress),
        feed: &crate::feed::FeedCtl,
    ) -> mpsc::UnboundedReceiver<RunMsg> {
        let stop = self.sh.stop.clone();
        rt.block_on(async {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            let mut stop_rx = stop.subscribe();
            let mut drain_deadline: Option<tokio::time::Instant> = None;
            while !self.over() {
                let drain = async {
                    match drain_deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    got = rx.recv() => {
                        let Some(msg) = got else { break };
                        self.on(msg);
                    }
                    _ = tick.tick() => progress(self.progress(feed)),
                    _ = stop_rx.changed() => {
                        if drain_deadline.is_none() {
                            self.stopped_at.get_or_insert_with(Instant::now);
                            drain_deadline =
                                Some(tokio::time::Instant::now() + self.cfg.drain_timeout);
                        }
                        if stop.level() >= 2 {
                            self.sh.abort.send_replace(true);
                        }
                    }
                    _ = drain => {
                        self.sh.abort.send_replace(true);
                        drain_deadline = None;
                    }
                }
            }
        });
        rx
    }

    /// Whether every request of the schedule finished, or the stopped pacer's releases did.
    fn over(&self) -> bool {
        match (self.total, self.pacer_end) {
            (_, Some(e)) if e.stopped => self.finished >= e.released,
            (Some(t), _) => self.finished as u64 >= t,
            _ => false,
        }
    }

    fn progress(&self, feed: &crate::feed::FeedCtl) -> Progress {
        Progress {
            done: self.done,
            failed: self.failed,
            in_flight: self.sh.in_flight.load(Ordering::Relaxed),
            total: self.total.unwrap_or_else(|| feed.emitted()) as usize,
        }
    }

    /// Stops the run for an error of its own (the first one is returned).
    fn fail(&mut self, e: ReplayError) {
        if self.error.is_none() {
            self.sh.stop.request(&format!("error: {e}"));
            self.error = Some(e);
        }
    }

    /// Sends `fed`, a turn whose predecessor ended as `ended`: in closed mode after its think
    /// time, in open mode at its own offset if that is later. A Responses turn that names
    /// its parent's response gets the id the target gave it, or is not sent (nor are the
    /// turns that wait for it) when its parent failed or was not sent.
    fn release(&mut self, ended: &Ended, fed: Box<Fed>) {
        let mut todo = vec![(ended.clone(), fed)];
        while let Some((ended, mut fed)) = todo.pop() {
            if fed.item.req.parent_id_at.is_some() {
                let why = match (&ended.failed, &ended.response_id) {
                    (Some(f), _) => Some(format!("not sent: its parent {f}")),
                    (None, None) => Some(
                        "not sent: its parent's answer carried no response id to continue".into(),
                    ),
                    (None, Some(id)) => {
                        fed.item.req.set_parent_id(id);
                        None
                    }
                };
                if let Some(why) = why {
                    // Counted as finished: it was in the schedule and will not be sent.
                    self.finished += 1;
                    let item = &fed.item;
                    if item.chained {
                        let failed = format!("{} was not sent", item.request_id);
                        let end = Ended {
                            at: Instant::now(),
                            response_id: None,
                            failed: Some(failed.into()),
                        };
                        for next in self.ends.finished(item.seq, end.clone()) {
                            todo.push((end.clone(), next));
                        }
                    }
                    self.not_sent.push(fed.item.request_id.clone(), why);
                    continue;
                }
            }
            let after = ended.at.saturating_duration_since(self.sh.start);
            fed.item.parent_wait = Some(after.saturating_sub(fed.item.offset));
            let at = match fed.item.open_wait {
                true => fed.item.offset.max(after),
                false => after + fed.item.think,
            };
            let seq = fed.item.seq;
            let sent = self
                .successors
                .as_ref()
                .is_some_and(|tx| tx.send(vec![Input::At(at, seq, fed)]).is_ok());
            if !sent {
                self.unsent += 1;
            }
        }
    }

    fn on(&mut self, msg: RunMsg) {
        match msg {
            RunMsg::Row {
                seq,
                gid,
                rec,
                end,
                waited,
                chained,
                cancelled,
                response_id,
            } => {
                self.finished += 1;
                self.done += 1;
                self.cancelled += usize::from(cancelled);
                if rec.outcome != Outcome::Ok {
                    self.failed += 1;
                }
                // Closed mode: a finished turn schedules the turns that follow it (its session's
                // next, its children) after their think time.
                if chained && self.stopped_at.is_none() {
                    let ended = Ended {
                        at: end,
                        response_id: response_id.map(Into::into),
                        failed: (rec.outcome != Outcome::Ok).then(|| {
                            let why = rec.error.as_deref().unwrap_or("");
                            format!(
                                "{} failed on the target ({}: {why})",
                                rec.request_id, rec.outcome
                            )
                            .into()
                        }),
                    };
                    for next in self.ends.finished(seq, ended.clone()) {
                        self.release(&ended, next);
                    }
                }
                for (s, r) in self.bursts.finished(gid, Some((seq, *rec, waited))) {
                    self.emit(s, r);
                }
            }
            RunMsg::Unsent { gid } => {
                self.finished += 1;
                self.unsent += 1;
                for (s, r) in self.bursts.finished(gid, None) {
                    self.emit(s, r);
                }
            }
            RunMsg::Closed { gid, members } => {
                for (s, r) in self.bursts.closed(gid, members) {
                    self.emit(s, r);
                }
            }
            RunMsg::Feed(FeedMsg::Waiting(fed)) => {
                let prev = fed.item.waits_for.unwrap_or(u64::MAX);
                if let Some((ended, fed)) = self.ends.wait(prev, fed) {
                    self.release(&ended, fed);
                }
            }
            RunMsg::Feed(FeedMsg::Done(n)) => self.total = Some(n),
            RunMsg::Feed(FeedMsg::Failed(e)) => self.fail(e),
            RunMsg::Feed(FeedMsg::First(_)) => {}
            RunMsg::PacerEnd(e) => {
                // A pacer a stop ended means a stopped run, even when its end reaches the
                // loop before the stop does (nothing in flight: `over()` then ends the loop
                // before the stop's branch could mark it, and the run read as complete).
                if e.stopped {
                    self.stopped_at.get_or_insert_with(Instant::now);
                }
                self.pacer_end = Some(e);
            }
        }
    }

    /// A finished row, attributed: to the metrics, the sink, and the kept rows.
    fn emit(&mut self, seq: u64, rec: TraceRecord) {
        self.metrics.add(&rec);
        match self.endpoints.get_mut(&rec.endpoint) {
            Some(n) => *n += 1,
            None => {
                self.endpoints.insert(rec.endpoint.clone(), 1);
            }
        }
        self.passes = self
            .passes
            .max(crate::soak::passes_replayed(std::slice::from_ref(&rec)));
        if let Err(e) = self.sink.row(&rec) {
            self.fail(e);
        }
        if self.cfg.keep_rows {
            self.kept.push((seq, rec));
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
