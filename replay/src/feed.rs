//! The feed: reads a [`RecordSource`] row by row and builds the schedule's requests ahead of
//! the clock, within a bounded look-ahead, on threads of its own; the pacer receives them
//! through a channel. So a run holds the requests of the look-ahead and those in flight,
//! never the whole trace, and the first request leaves as soon as the first rows are built.
//!
//! Three stages, each on its own thread(s): a reader (the [`Selector`]: selection and send
//! offsets), builders (request bodies; prompt synthesis with a tokenizer takes tens of ms
//! for a 100k-token prompt, so with a tokenizer one builder per core), and a collector that
//! takes the builders' chunks back in order (so the schedule never depends on the split),
//! assembles the items ([`Assembler`]) and holds each until it fits the look-ahead: at most
//! [`Lookahead::time`] of schedule ahead of the clock and [`Lookahead::bytes`] of built
//! requests not yet finished (an item's bytes are given back when its request ends).
//! Between the reader and the collector at most [`IN_TRANSIT`] chunks are in transit (the one
//! being filled, one waiting to be handed over, two queued and one being built per builder,
//! two built, one being assembled), so the rows read but not yet in the look-ahead are at
//! most `IN_TRANSIT × CHUNK_ROWS` per builder.
//!
//! A backlog is not built either: with `--max-concurrency C`, at most `C + W`
//! ([`Lookahead::waiting`]) requests that are due (their offset reached) and not finished
//! exist at once, in flight or waiting for a slot. When that many are, the feed waits (the
//! rows behind stay unread in the trace, due or not: a paced trace against a slower target
//! is held the same way) until `W / 2` have finished,
//! then builds the next ones; so the requests waiting for a slot are W/2 to W, and the one
//! whose slot comes next is built well before. A request that becomes due while `C` requests
//! due before it are unfinished could not have had a slot yet, and one that becomes due
//! while fewer are (the feed fell behind) takes the slot free longest: it records from when
//! ([`Fed::slot_not_before`]). So its queue time runs from its scheduled time to its slot as
//! it did when every waiting request was built, and only the time after its slot came is
//! dispatch lag, even when it reaches the semaphore late. Memory is then O(concurrency +
//! look-ahead), not O(requests waiting).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use trace_format::TraceRecord;

use crate::config::{Lookahead, ValidatedConfig};
use crate::error::ReplayError;
use crate::pacer::Input;
use crate::plan::{Assembler, PlannedRequest, Selected, Selector, Step};
use crate::request::build_request;
use crate::source::RecordSource;

/// Rows per builder chunk, at most.
pub const CHUNK_ROWS: usize = 64;
/// Recorded prompt tokens per builder chunk, at most (a chunk of long prompts is small, so
/// the first request does not wait for many of them to be synthesized).
const CHUNK_TOKENS: i64 = 32_768;
/// Chunks in transit between reader and collector, at most, with one builder.
pub const IN_TRANSIT: usize = 8;
/// How often a waiting feed thread looks at the clock and at cancellation.
const POLL: Duration = Duration::from_millis(20);

/// A scheduled request in the look-ahead; its bytes are given back when it is dropped.
#[derive(Debug)]
pub struct Fed {
    /// The request.
    pub item: PlannedRequest,
    /// The earliest it can have had a `--max-concurrency` slot, when it became due (let in
    /// by the feed or released by the pacer): then, when `max_concurrency` requests due
    /// before it were unfinished, or when the slot free longest was freed (see the module
    /// doc). None: a slot was free from the start.
    pub slot_not_before: Option<Instant>,
    ticket: Ticket,
}

impl Fed {
    /// Released by the pacer: it now counts as due (it is to be sent or wait for a slot).
    pub fn released(&mut self) {
        if let Some(t) = self.ticket.count_due() {
            self.slot_not_before.get_or_insert(t);
        }
    }
}

/// What the feed tells the run besides the requests to pace.
#[derive(Debug)]
pub enum FeedMsg {
    /// The first request's row (only when warm-ups are asked for).
    First(Box<TraceRecord>),
    /// A closed-session turn that waits for its predecessor (`item.waits_for`).
    Waiting(Box<Fed>),
    /// Every request was fed: the schedule has this many.
    Done(u64),
    /// The trace could not be read, or nothing in it can be replayed.
    Failed(ReplayError),
}

/// What goes to the pacer.
pub type ToPacer = Input<Box<Fed>, FeedMsg>;

/// What the feed learned once it ended.
#[derive(Debug, Clone, Default)]
pub struct FeedSummary {
    /// Requests fed.
    pub total: u64,
    /// Whether the whole selection was fed (false: the run stopped it first).
    pub complete: bool,
    /// Selected rows that could not become a request.
    pub skipped: crate::plan::Skipped,
    /// Requests that send their row's recorded body.
    pub bodies: usize,
    /// Span of the selected rows in trace time.
    pub trace_span: Duration,
}

/// Bytes of built requests not yet finished and the requests due and not finished, and
/// their caps.
#[derive(Debug)]
struct Budget {
    used: Mutex<Used>,
    freed: Condvar,
    cap: usize,
    /// `--max-concurrency` (usize::MAX: none).
    concurrency: usize,
    /// Most requests due and not finished (`--max-concurrency` + [`Lookahead::waiting`]).
    max_due: usize,
    /// Once at `max_due`, the feed waits until no more than this many are due.
    low_due: usize,
}

#[derive(Debug, Default)]
struct Used {
    bytes: usize,
    /// Requests fed and not finished.
    items: usize,
    /// Of which due (their offset reached when fed, or released by the pacer).
    due: usize,
    /// The most `items` held at once.
    peak: usize,
    /// The feed waits for the requests due to fall to `low_due`.
    backlogged: bool,
    /// The feed is waiting on `freed` (a request that ends wakes it only then: a condvar's
    /// notify is a futex syscall, and every request ends through [`Ticket`]'s drop).
    waiting: bool,
    /// With `due` below `concurrency`: when the slots the requests due leave free were
    /// freed, oldest first; slots never taken (free since the start) are not listed, so
    /// there are at most `concurrency - due`.
    free_since: VecDeque<Instant>,
}

impl Used {
    /// One more request due, from `now`: it takes the slot free longest, and returns when
    /// that slot was freed (None: never taken) or, when none is free, `now` (it has no slot
    /// before then).
    fn take_due(&mut self, concurrency: usize, now: Instant) -> Option<Instant> {
        let free = concurrency.saturating_sub(self.due);
        self.due += 1;
        if concurrency == usize::MAX {
            return None;
        }
        if free == 0 {
            return Some(now);
        }
        if self.free_since.len() < free {
            return None;
        }
        self.free_since.pop_front()
    }

    /// A request due finished at `now`: its slot is free from then.
    fn end_due(&mut self, concurrency: usize, now: Instant) {
        self.due = self.due.saturating_sub(1);
        if self.due < concurrency && concurrency != usize::MAX {
            self.free_since.push_back(now);
        }
    }
}

impl Budget {
    fn used(&self) -> std::sync::MutexGuard<'_, Used> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug)]
struct Ticket {
    bytes: usize,
    /// Counted among the requests due.
    due: bool,
    budget: Arc<Budget>,
}

impl Ticket {
    /// Counts it among the requests due (once); see [`Used::take_due`].
    fn count_due(&mut self) -> Option<Instant> {
        if self.due {
            return None;
        }
        self.due = true;
        let c = self.budget.concurrency;
        self.budget.used().take_due(c, Instant::now())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut used = self.budget.used();
        used.bytes = used.bytes.saturating_sub(self.bytes);
        used.items = used.items.saturating_sub(1);
        if self.due {
            used.end_due(self.budget.concurrency, Instant::now());
        }
        // A feed waiting for the backlog to shrink is woken once it has (or by its poll).
        if used.waiting && (!used.backlogged || used.due <= self.budget.low_due) {
            self.budget.freed.notify_all();
        }
    }
}

/// The handle the run keeps on its feed.
#[derive(Debug)]
pub struct FeedCtl {
    start: OnceLock<Instant>,
    cancel: AtomicBool,
    stalled: AtomicBool,
    emitted: AtomicU64,
    budget: Arc<Budget>,
    lookahead: Duration,
}

impl FeedCtl {
    /// The clock started at `start`: the look-ahead now runs from it.
    pub fn started(&self, start: Instant) {
        let _ = self.start.set(start);
    }

    /// Stops the feed (the run ended or stopped).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.budget.freed.notify_all();
    }

    /// Whether the feed waits for the look-ahead to move (it is as far ahead as allowed).
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    /// Requests fed so far.
    pub fn emitted(&self) -> u64 {
        self.emitted.load(Ordering::Relaxed)
    }

    /// Bytes of built requests held now (in the look-ahead or in flight).
    pub fn bytes_held(&self) -> usize {
        self.budget.used().bytes
    }

    /// The most requests built and not finished at once so far (in the look-ahead, waiting
    /// for a slot, or in flight).
    pub fn peak_held(&self) -> usize {
        self.budget.used().peak
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// How long before an item due at `offset` fits the look-ahead's time bound (zero: it
    /// fits). `first` is the schedule's first offset: before the clock starts, the
    /// look-ahead runs from there.
    fn time_to_room(&self, offset: Duration, first: Duration) -> Duration {
        let now = self.start.get().map_or(Duration::ZERO, |s| {
            Instant::now().saturating_duration_since(*s)
        });
        offset.saturating_sub(now.max(first) + self.lookahead)
    }

    /// Whether `bytes` more fit beside `used`: one item always fits, however large, so the
    /// look-ahead never stops a run.
    fn bytes_fit(&self, used: &Used, bytes: usize) -> bool {
        used.bytes == 0 || used.bytes + bytes <= self.budget.cap
    }

    /// Whether one more request due fits the backlog.
    fn due_fits(&self, used: &Used) -> bool {
        let b = &self.budget;
        used.due < b.max_due && !(used.backlogged && used.due > b.low_due)
    }

    /// Whether an item due at `offset` is due now (before the clock starts: at the first).
    fn is_due(&self, offset: Duration, first: Duration) -> bool {
        let now = self.start.get().map_or(Duration::ZERO, |s| {
            Instant::now().saturating_duration_since(*s)
        });
        offset <= now.max(first)
    }

    /// Whether an item fits the look-ahead now.
    fn has_room(&self, offset: Duration, first: Duration, bytes: usize, chained: bool) -> bool {
        let used = self.budget.used();
        self.time_to_room(offset, first).is_zero()
            && self.bytes_fit(&used, bytes)
            && (chained || self.due_fits(&used))
    }

    /// Waits until an item due at `offset` of `bytes` fits the look-ahead, and takes its
    /// place: its ticket and, when it could not have had a slot before now, this instant
    /// ([`Fed::slot_not_before`]) (None: cancelled). A closed-session turn that waits for its predecessor (`chained`)
    /// is not due before the pacer releases it.
    fn wait_for_room(
        &self,
        offset: Duration,
        first: Duration,
        bytes: usize,
        chained: bool,
    ) -> Option<(Ticket, Option<Instant>)> {
        loop {
            if self.cancelled() {
                return None;
            }
            let wait = self.time_to_room(offset, first);
            if wait.is_zero() {
                break;
            }
            self.stalled.store(true, Ordering::SeqCst);
            std::thread::sleep(wait.min(POLL));
        }
        let mut used = self.budget.used();
        loop {
            // A full backlog stops the feed whether this item is due yet or not: once due,
            // it would join the backlog (a paced trace against a slower target).
            let due = !chained && self.is_due(offset, first);
            let backlog = !chained && !self.due_fits(&used);
            if self.bytes_fit(&used, bytes) && !backlog {
                let slot = match due {
                    true => used.take_due(self.budget.concurrency, Instant::now()),
                    false => None,
                };
                used.bytes += bytes;
                used.items += 1;
                used.peak = used.peak.max(used.items);
                used.backlogged = false;
                self.stalled.store(false, Ordering::SeqCst);
                let ticket = Ticket {
                    bytes,
                    due,
                    budget: self.budget.clone(),
                };
                return Some((ticket, slot));
            }
            if self.cancelled() {
                return None;
            }
            used.backlogged |= backlog;
            self.stalled.store(true, Ordering::SeqCst);
            used.waiting = true;
            used = self
                .budget
                .freed
                .wait_timeout(used, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            used.waiting = false;
        }
    }
}

/// A running feed: its control handle, and the collector thread (which returns the summary).
pub struct Feed<'scope> {
    /// Shared with the run.
    pub ctl: Arc<FeedCtl>,
    collector: ScopedJoinHandle<'scope, FeedSummary>,
}

impl Feed<'_> {
    /// Stops the feed and waits for its summary.
    pub fn finish(self) -> FeedSummary {
        self.ctl.cancel();
        self.collector.join().unwrap_or_default()
    }
}

enum Work {
    Rows(Vec<Selected>),
    End(Box<Result<Selector, ReplayError>>),
}

enum Built {
    Rows(Vec<(Selected, Result<crate::request::BuiltRequest, String>)>),
    End(Box<Result<Selector, ReplayError>>),
}

/// Builder threads for `cfg`: one per core with a tokenizer, else one.
fn builders(cfg: &ValidatedConfig) -> usize {
    match cfg.request.tokenizer {
        Some(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        None => 1,
    }
}

/// Starts the feed of `source` for a run of `cfg` with model `model`; requests go to `tx`.
pub fn start<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    cfg: &'env ValidatedConfig,
    source: &'env dyn RecordSource,
    model: String,
    block_size: Option<usize>,
    tx: Sender<Vec<ToPacer>>,
) -> Result<Feed<'scope>, ReplayError> {
    let Lookahead {
        time,
        bytes,
        waiting,
    } = cfg.lookahead;
    let concurrency = cfg.max_concurrency.unwrap_or(usize::MAX);
    let max_due = concurrency.saturating_add(waiting.max(1));
    let ctl = Arc::new(FeedCtl {
        start: OnceLock::new(),
        cancel: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
        emitted: AtomicU64::new(0),
        budget: Arc::new(Budget {
            used: Mutex::new(Used::default()),
            freed: Condvar::new(),
            cap: bytes.max(1),
            concurrency,
            max_due,
            low_due: max_due - waiting.max(1).div_ceil(2),
        }),
        lookahead: time,
    });
    let selector = Selector::new(&cfg.selection, cfg.arrivals, cfg.seed)?;
    let spawn_err = |e: std::io::Error| ReplayError::Runtime(format!("feed thread: {e}"));
    let n = builders(cfg);
    let mut to_builders = Vec::with_capacity(n);
    let mut from_builders = Vec::with_capacity(n);
    for w in 0..n {
        let (in_tx, in_rx) = sync_channel::<Work>(2);
        let (out_tx, out_rx) = sync_channel::<Built>(2);
        let model = model.clone();
        std::thread::Builder::new()
            .name(format!("llmreplay-build{w}"))
            .spawn_scoped(scope, move || {
                for work in in_rx {
                    let out = match work {
                        Work::Rows(rows) => Built::Rows(
                            rows.into_iter()
                                .map(|s| {
                                    let b = build_request(&s.rec, &cfg.request, &model, block_size);
                                    (s, b)
                                })
                                .collect(),
                        ),
                        Work::End(e) => Built::End(e),
                    };
                    if out_tx.send(out).is_err() {
                        break;
                    }
                }
            })
            .map_err(spawn_err)?;
        to_builders.push(in_tx);
        from_builders.push(out_rx);
    }
    let c = ctl.clone();
    std::thread::Builder::new()
        .name("llmreplay-read".into())
        .spawn_scoped(scope, move || read(source, selector, &to_builders, &c))
        .map_err(spawn_err)?;
    let c = ctl.clone();
    let warmups = cfg.num_warmups > 0;
    let asm = Assembler::new(cfg.session_mode, cfg.arrivals);
    let collector = std::thread::Builder::new()
        .name("llmreplay-feed".into())
        .spawn_scoped(scope, move || {
            collect(&from_builders, asm, &c, &tx, warmups)
        })
        .map_err(spawn_err)?;
    Ok(Feed { ctl, collector })
}

/// The reader: rows through the selector, in chunks to the builders in turn.
fn read(source: &dyn RecordSource, mut sel: Selector, to: &[SyncSender<Work>], ctl: &FeedCtl) {
    let mut next = 0usize;
    let mut send = |w: Work| -> bool {
        let ok = to[next % to.len()].send(w).is_ok();
        next += 1;
        ok
    };
    let mut chunk: Vec<Selected> = Vec::new();
    let mut tokens = 0i64;
    let rows = match source.records() {
        Ok(r) => r,
        Err(e) => {
            send(Work::End(Box::new(Err(e))));
            return;
        }
    };
    for row in rows {
        if ctl.cancelled() {
            return;
        }
        let rec = match row {
            Ok(r) => r,
            Err(e) => {
                if send(Work::Rows(std::mem::take(&mut chunk))) {
                    send(Work::End(Box::new(Err(e.into()))));
                }
                return;
            }
        };
        match sel.offer(rec) {
            Step::Take(s) => {
                tokens += s.rec.prompt_tokens.unwrap_or(0).max(0);
                chunk.push(s);
                if chunk.len() >= CHUNK_ROWS || tokens >= CHUNK_TOKENS {
                    tokens = 0;
                    if !send(Work::Rows(std::mem::take(&mut chunk))) {
                        return;
                    }
                }
            }
            Step::Pass => {}
            Step::Done => break,
        }
    }
    if send(Work::Rows(chunk)) {
        send(Work::End(Box::new(Ok(sel))));
    }
}

/// The collector: the builders' chunks in order, assembled, each sent once it fits the
/// look-ahead (a batch per chunk, so the pacer wakes per chunk, not per request).
fn collect(
    from: &[Receiver<Built>],
    mut asm: Assembler,
    ctl: &FeedCtl,
    tx: &Sender<Vec<ToPacer>>,
    warmups: bool,
) -> FeedSummary {
    let mut first_offset: Option<Duration> = None;
    let mut k = 0usize;
    loop {
        let Ok(built) = from[k % from.len()].recv() else {
            return summary(asm, None, false);
        };
        k += 1;
        let rows = match built {
            Built::Rows(rows) => rows,
            Built::End(end) => match *end {
                Ok(sel) => {
                    let msg = if asm.is_empty() {
                        FeedMsg::Failed(sel.empty_error(&asm.skipped))
                    } else {
                        FeedMsg::Done(asm.len())
                    };
                    let _ = tx.send(vec![Input::Pass(msg)]);
                    return summary(asm, Some(&sel), true);
                }
                Err(e) => {
                    let _ = tx.send(vec![Input::Pass(FeedMsg::Failed(e))]);
                    return summary(asm, None, false);
                }
            },
        };
        let mut batch: Vec<ToPacer> = Vec::with_capacity(rows.len());
        for (s, built) in rows {
            let first_row = (warmups && asm.is_empty() && built.is_ok()).then(|| s.rec.clone());
            let Some(item) = asm.add(s, built) else {
                continue;
            };
            if let Some(r) = first_row {
                batch.push(Input::Pass(FeedMsg::First(Box::new(r))));
            }
            let first = *first_offset.get_or_insert(item.offset);
            let bytes = item.req.body.len() + item.request_id.len() + 256;
            // Hand over what is ready before waiting for room, so the pacer never waits
            // for the feed while the feed waits for the clock.
            let chained = item.waits_for.is_some();
            if !batch.is_empty()
                && !ctl.has_room(item.offset, first, bytes, chained)
                && tx.send(std::mem::take(&mut batch)).is_err()
            {
                return summary(asm, None, false);
            }
            let Some((ticket, slot_not_before)) =
                ctl.wait_for_room(item.offset, first, bytes, chained)
            else {
                return summary(asm, None, false);
            };
            let fed = Box::new(Fed {
                ticket,
                slot_not_before,
                item,
            });
            batch.push(match fed.item.waits_for {
                Some(_) => Input::Pass(FeedMsg::Waiting(fed)),
                None => Input::At(fed.item.offset, fed.item.seq, fed),
            });
            ctl.emitted.fetch_add(1, Ordering::Relaxed);
        }
        if !batch.is_empty() && tx.send(batch).is_err() {
            return summary(asm, None, false);
        }
    }
}

fn summary(asm: Assembler, sel: Option<&Selector>, complete: bool) -> FeedSummary {
    FeedSummary {
        total: asm.len(),
        complete,
        trace_span: sel.map(Selector::trace_span).unwrap_or_default(),
        skipped: asm.skipped,
        bodies: asm.bodies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_due_takes_the_slot_free_longest_or_has_none_before_it_becomes_due() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut u = Used::default();
        // Two slots, never taken: free since the start.
        assert_eq!(u.take_due(2, at(0)), None);
        assert_eq!(u.take_due(2, at(1)), None);
        // Both taken: the next two have no slot before they become due.
        assert_eq!(u.take_due(2, at(2)), Some(at(2)));
        assert_eq!(u.take_due(2, at(3)), Some(at(3)));
        // Two end: their slots go to the two waiting, none is left free.
        u.end_due(2, at(10));
        u.end_due(2, at(11));
        assert!(u.free_since.is_empty());
        // Two more end with nothing due behind them (the feed fell behind): the next ones
        // take those slots, the one freed first first.
        u.end_due(2, at(20));
        u.end_due(2, at(25));
        assert_eq!(u.free_since.len(), 2);
        assert_eq!(u.take_due(2, at(30)), Some(at(20)));
        assert_eq!(u.take_due(2, at(31)), Some(at(25)));
        assert_eq!(u.take_due(2, at(32)), Some(at(32)));
        assert_eq!(u.due, 3);
        // Without a cap nothing is listed.
        let mut v = Used::default();
        v.end_due(usize::MAX, at(40));
        assert_eq!(v.take_due(usize::MAX, at(41)), None);
        assert!(v.free_since.is_empty());
    }
}
