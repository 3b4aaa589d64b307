//! One request of a run, as a task on the client runtime: it owns its request (freed, and its
//! look-ahead bytes given back, when it ends), sends it, and reports its row; and the burst
//! attribution of rows due at one instant, on a buffer that holds a burst only until the
//! pacer has moved past its instant and every member has finished.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch, Semaphore};
use trace_format::tokens::{self, Reasoning, Seen};
use trace_format::tracectx::TraceContext;
use trace_format::{Outcome, TokenSource, TraceRecord};
use wire::api::Api;

use crate::client::{Client, Exchange};
use crate::feed::{Fed, FeedMsg};
use crate::pacer::PacerEnd;
use crate::plan::PlannedRequest;
use crate::stop::{Stop, StopState};

/// What a run's tasks and pacer tell its run loop.
#[derive(Debug)]
pub(crate) enum RunMsg {
    /// A request's row.
    Row {
        /// Its schedule position.
        seq: u64,
        /// Its burst (the run of releases at one instant it was released in).
        gid: u64,
        rec: Box<TraceRecord>,
        end: Instant,
        /// Whether it waited for a concurrency slot.
        waited: bool,
        /// Whether a later turn of its session may wait for it.
        chained: bool,
        /// Cancelled by a stop (in flight at the drain deadline, or at a second stop).
        cancelled: bool,
        /// The id the target gave a chained Responses request's response (what the turns
        /// that continue it name).
        response_id: Option<String>,
    },
    /// A released request that was not sent: the run was stopping when its turn came.
    Unsent { gid: u64 },
    /// The burst `gid` is closed: the pacer released a later instant; it has `members`.
    Closed { gid: u64, members: usize },
    /// From the feed, through the pacer.
    Feed(FeedMsg),
    /// The pacer ended.
    PacerEnd(PacerEnd),
}

/// What every task of a run shares.
pub(crate) struct Shared {
    pub client: Arc<Client>,
    pub sem: Option<Semaphore>,
    pub start: Instant,
    pub started_at_us: i64,
    pub results: mpsc::UnboundedSender<RunMsg>,
    pub in_flight: AtomicUsize,
    pub target: String,
    pub run_id: String,
    pub model: String,
    /// Counts the generated text of responses that carry no usage (`--tokenizer`).
    pub tokenizer: Option<Arc<crate::prompt::PromptTokenizer>>,
    pub stop: Stop,
    /// Set when requests in flight are to be cancelled (drain deadline, second stop).
    pub abort: watch::Sender<bool>,
}

/// Sends a result row even if the request task is torn down early (cancelled by a stop, or
/// the runtime shut down), so the run never waits for a row that will not come. It borrows
/// the task's request (no copy of its id and endpoint on the send path).
struct RowGuard<'a> {
    shared: &'a Arc<Shared>,
    item: &'a PlannedRequest,
    gid: u64,
    /// The trace context the request was sent with.
    trace: Option<TraceContext>,
    done: bool,
}

impl RowGuard<'_> {
    fn unsent(mut self) {
        self.done = true;
        let _ = self.shared.results.send(RunMsg::Unsent { gid: self.gid });
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut rec = TraceRecord::new(
                self.item.request_id.clone(),
                wire::clock::epoch_us(),
                self.item.req.endpoint.clone(),
            );
            rec.outcome = Outcome::ClientCancelled;
            if let Some(t) = &self.trace {
                t.fill(&mut rec);
            }
            let stopping = self.shared.stop.level() > 0;
            rec.error = Some(if stopping {
                "cancelled: the run was stopped and the request was still in flight".into()
            } else {
                "request task ended before its result was recorded".into()
            });
            rec.target = Some(self.shared.target.clone());
            rec.run_id = Some(self.shared.run_id.clone());
            let _ = self.shared.results.send(RunMsg::Row {
                seq: self.item.seq,
                gid: self.gid,
                rec: Box::new(rec),
                end: Instant::now(),
                waited: false,
                chained: self.item.chained,
                cancelled: stopping,
                response_id: None,
            });
        }
    }
}

/// `fut`'s output, or None once `abort` turns true (the run cancels the requests in flight).
///
/// The request's future is polled on every wake-up of its task, once per chunk read, and so
/// is this: after the first poll it only looks at the watch's version (one atomic load) and
/// polls the watch's `changed()` again only when that moved. A `select!` on
/// `abort.wait_for(..)` polled the watch's notification on every wake-up, which takes the
/// watch's waiter lock (shared by every request of the run): a lock per chunk. The waker the
/// first poll registered stays valid: the task's waker wakes the task whichever poll gave it.
///
/// `fut` comes pinned by the caller: an async fn that took the future by value and pinned it
/// would hold it twice (the argument's slot and the pinned local), doubling the task's size.
async fn unless_aborted<F: Future>(
    abort: &watch::Sender<bool>,
    mut fut: std::pin::Pin<&mut F>,
) -> Option<F::Output> {
    let mut rx = abort.subscribe();
    let probe = abort.subscribe();
    if *rx.borrow_and_update() {
        return None;
    }
    let mut changed = std::pin::pin!(rx.changed());
    let mut registered = false;
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(v));
        }
        // `changed()` resolves on a new value (only `true` is ever sent) or a dropped sender.
        if (!registered || probe.has_changed().unwrap_or(true))
            && changed.as_mut().poll(cx).is_ready()
        {
            return std::task::Poll::Ready(None);
        }
        registered = true;
        std::task::Poll::Pending
    })
    .await
}

/// Sends `fed`, released by the pacer at `scheduled` in burst `gid`, and reports its row.
pub(crate) async fn one_request(sh: Arc<Shared>, fed: Box<Fed>, gid: u64, scheduled: Instant) {
    let item = &fed.item;
    // The request's trace context: derived from the run id and the request id, so a row's
    // ids can be recomputed from the row and differ from run to run.
    let trace = sh
        .client
        .sends_traceparent()
        .then(|| TraceContext::derive(&sh.run_id, &item.request_id));
    let mut guard = RowGuard {
        shared: &sh,
        item,
        gid,
        trace,
        done: false,
    };
    // When the request is due: its scheduled time or, when it had to wait for a
    // `--max-concurrency` slot, the moment it got one. Only the time after that is the
    // client's own delay (dispatch lag); a request that waits for a slot anyway is not
    // charged for having been released late.
    let (_permit, slot_at) = match &sh.sem {
        Some(s) => match s.try_acquire() {
            Ok(p) => (Some(p), None),
            Err(_) => {
                let mut stop = sh.stop.subscribe();
                tokio::select! {
                    p = s.acquire() => (p.ok(), Some(Instant::now())),
                    _ = stop.wait_for(|s| *s != StopState::Running) => {
                        guard.unsent();
                        return;
                    }
                }
            }
        },
        None => (None, None),
    };
    // Stopping: nothing more is sent, not even what was released just before.
    if sh.stop.level() > 0 {
        guard.unsent();
        return;
    }
    // A request the feed let in while `--max-concurrency` requests due before it were
    // unfinished had no slot before (`slot_not_before`: the feed builds no more requests
    // waiting for a slot than it has to, so one may reach the semaphore after its slot came).
    let slot_at = match (slot_at, fed.slot_not_before.filter(|h| *h > scheduled)) {
        (Some(a), Some(h)) => Some(a.max(h)),
        (a, h) => a.or(h),
    };
    let due = slot_at.map_or(scheduled, |at| at.max(scheduled));
    let waited = slot_at.is_some();
    sh.in_flight.fetch_add(1, Ordering::Relaxed);
    let execute =
        std::pin::pin!(sh
            .client
            .execute(&item.req, Some(&item.request_id), trace.as_ref()));
    let Some(mut ex) = unless_aborted(&sh.abort, execute).await else {
        sh.in_flight.fetch_sub(1, Ordering::Relaxed);
        return; // the guard records it cancelled
    };
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
    fill_counts(&mut rec, &mut ex, item, sh.tokenizer.as_deref());
    rec.ttfat_us = ex.ttfat_us;
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
    rec.parent_wait_us = item.parent_wait.map(|d| d.as_micros() as i64);
    rec.new_connection = Some(ex.new_connection);
    rec.connect_us = ex.new_connection.then_some(ex.connect.as_micros() as i64);
    rec.target = Some(sh.target.clone());
    rec.run_id = Some(sh.run_id.clone());
    item.req.captured.fill(&mut rec);
    if let Some(t) = &trace {
        t.fill(&mut rec);
    }
    guard.done = true;
    let _ = sh.results.send(RunMsg::Row {
        seq: item.seq,
        gid,
        rec: Box::new(rec),
        end,
        waited,
        chained: item.chained,
        cancelled: false,
        response_id: ex
            .response_id
            .filter(|_| item.chained && item.req.api == Api::Responses),
    });
}

/// The row's token counts from the exchange: the prompt's from the usage (else the plan's
/// estimate), the output's and reasoning's by the rule capture records them with.
fn fill_counts(
    rec: &mut TraceRecord,
    ex: &mut Exchange,
    item: &PlannedRequest,
    tokenizer: Option<&crate::prompt::PromptTokenizer>,
) {
    rec.cached_tokens = ex.cached_tokens;
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
    // Output and reasoning tokens by the rule capture records them with
    // (trace_format::tokens): the server's usage; without it, the generated text counted by
    // the tokenizer (--tokenizer, or the capture's); with neither, an estimate.
    let count = |t: &str| {
        let tok = tokenizer?;
        tok.tokenizer().count(t).ok()
    };
    let seen = |chunks: usize, text: Option<String>| match item.req.stream {
        true => Seen::streamed(chunks, text),
        false => Seen::whole(text),
    };
    let output = seen(ex.chunk_times_us.len(), ex.output_text.take());
    tokens::fill_output(rec, ex.completion_tokens, &output, count);
    let reasoning = match (ex.reasoning_tokens, ex.reasoning_seen.take()) {
        (Some(n), _) => Some(Reasoning::Reported(n)),
        (None, Some((chunks, text))) => Some(Reasoning::of(None, &seen(chunks, text), count)),
        (None, None) => None,
    };
    if let Some(r) = reasoning {
        r.fill(rec);
    }
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
///
/// This is the attribution over a whole run; the run applies it as rows finish, in bounded
/// memory ([`Bursts`]), and the tests check the two agree.
#[cfg(test)]
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
    for burst in by_instant.into_values().filter(|b| b.len() > 1) {
        chain(rows, burst, None);
    }
}

/// Attributes `burst` (indexes of rows due at one instant) in send order: each row waited for
/// the one sent before it, the first for a send at `before` (a member attributed earlier) if
/// it was sent after that. Returns the latest send seen.
fn chain(rows: &mut [TraceRecord], mut burst: Vec<usize>, mut before: Option<i64>) -> Option<i64> {
    burst.sort_by_key(|&i| rows[i].arrival_time_us);
    for i in burst {
        let r = &mut rows[i];
        let sent = r.arrival_time_us;
        if let Some(before) = before.filter(|b| *b <= sent) {
            let (lag, queue) = (r.dispatch_lag_us.unwrap_or(0), r.queue_us.unwrap_or(0));
            let behind = lag + queue;
            // The instant the request was due (start + scheduled offset), from its own row.
            let due = sent - behind - r.connect_us.unwrap_or(0);
            let wait = (before - due).clamp(0, behind);
            r.queue_us = Some(wait);
            r.dispatch_lag_us = Some(behind - wait);
        }
        before = Some(before.map_or(sent, |b| b.max(sent)));
    }
    before
}

/// Rows of one burst held at most: past it, the earliest-sent half is attributed and leaves,
/// and the rest wait for their predecessors in the part still held or in flight, so a burst of
/// millions (`--request-rate inf`) is held in bounded memory. A member that finishes after
/// `BURST_WINDOW / 2` members sent after it finished, and was sent before the last of those
/// that left, is left as sent (its whole delay dispatch lag: the conservative side).
pub(crate) const BURST_WINDOW: usize = 4096;

/// Rows held for burst attribution: a burst (the requests released at one instant) is held
/// until it is closed (the pacer released a later instant) and every member finished, then
/// attributed as `attribute_bursts` would over the whole run; at most [`BURST_WINDOW`] rows
/// of a burst are held. Rows of requests that waited for a concurrency slot take no part and
/// leave at once; rows of bursts of one are held only until the pacer moves on.
#[derive(Debug, Default)]
pub(crate) struct Bursts {
    groups: HashMap<u64, Burst>,
}

#[derive(Debug, Default)]
struct Burst {
    /// (schedule position, row) of members that did not wait for a slot, in completion order.
    rows: Vec<(u64, TraceRecord)>,
    finished: usize,
    members: Option<usize>,
    /// The latest send of the members that already left (past [`BURST_WINDOW`]).
    sent_before: Option<i64>,
}

impl Bursts {
    /// A member of `gid` finished with `row` (None: it was not sent; `waited`: it waited for
    /// a slot). Returns the rows that can leave: its own if it waited, the burst's once it
    /// is complete, the earliest half once it holds more than [`BURST_WINDOW`].
    pub fn finished(
        &mut self,
        gid: u64,
        row: Option<(u64, TraceRecord, bool)>,
    ) -> Vec<(u64, TraceRecord)> {
        let g = self.groups.entry(gid).or_default();
        g.finished += 1;
        let mut out = Vec::new();
        match row {
            Some((seq, rec, true)) => out.push((seq, rec)),
            Some((seq, rec, false)) => g.rows.push((seq, rec)),
            None => {}
        }
        if g.rows.len() > BURST_WINDOW {
            out.extend(g.window());
        }
        out.extend(self.ready(gid));
        out
    }

    /// The pacer closed `gid` with `members`.
    pub fn closed(&mut self, gid: u64, members: usize) -> Vec<(u64, TraceRecord)> {
        self.groups.entry(gid).or_default().members = Some(members);
        self.ready(gid)
    }

    /// Rows held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.groups.values().map(|g| g.rows.len()).sum()
    }

    fn ready(&mut self, gid: u64) -> Vec<(u64, TraceRecord)> {
        match self.groups.get(&gid) {
            Some(g) if g.members == Some(g.finished) => {}
            _ => return Vec::new(),
        }
        let mut g = self.groups.remove(&gid).unwrap_or_default();
        g.attribute(g.rows.len());
        g.rows
    }

    /// Every row still held (the run ended: no member is still in flight), burst by burst.
    pub fn flush(&mut self) -> Vec<(u64, TraceRecord)> {
        let mut ids: Vec<u64> = self.groups.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter()
            .flat_map(|id| {
                let mut g = self.groups.remove(&id).unwrap_or_default();
                g.attribute(g.rows.len());
                g.rows
            })
            .collect()
    }
}

impl Burst {
    /// Sorts the rows held by send time and attributes the first `n` (the rest stay as sent).
    fn attribute(&mut self, n: usize) {
        // Stable: rows sent at one microsecond stay in completion order, as before.
        self.rows.sort_by_key(|(_, r)| r.arrival_time_us);
        let (seqs, mut rows): (Vec<u64>, Vec<TraceRecord>) = self.rows.drain(..).unzip();
        let idx: Vec<usize> = (0..n)
            .filter(|&i| rows[i].scheduled_offset_us.is_some())
            .collect();
        if idx.len() > 1 || self.sent_before.is_some() {
            let last = chain(&mut rows, idx, self.sent_before);
            self.sent_before = last.or(self.sent_before);
        }
        self.rows = seqs.into_iter().zip(rows).collect();
    }

    /// The earliest-sent half of the rows held, attributed.
    fn window(&mut self) -> Vec<(u64, TraceRecord)> {
        let n = self.rows.len() / 2;
        self.attribute(n);
        self.rows.drain(..n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's future is woken once per chunk read; an abort is seen whenever it comes,
    /// however many wake-ups came before it (`unless_aborted` registers for it on the first
    /// poll only), and a request that ends before any abort keeps its output.
    #[tokio::test(start_paused = true)]
    async fn an_abort_ends_a_request_after_any_number_of_wake_ups() {
        use std::time::Duration;
        let abort = Arc::new(watch::channel(false).0);
        let polls = Arc::new(AtomicUsize::new(0));
        // 1,000 "chunks" 1 ms apart, then a stream that never ends.
        let stream = |polls: Arc<AtomicUsize>| async move {
            let mut sleep = Box::pin(tokio::time::sleep(Duration::from_millis(1)));
            let mut chunks = 0;
            std::future::poll_fn(move |cx| {
                polls.fetch_add(1, Ordering::Relaxed);
                while chunks < 1000 && sleep.as_mut().poll(cx).is_ready() {
                    chunks += 1;
                    sleep
                        .as_mut()
                        .reset(tokio::time::Instant::now() + Duration::from_millis(1));
                }
                std::task::Poll::<u32>::Pending
            })
            .await
        };
        let (a, p) = (abort.clone(), polls.clone());
        let task = tokio::spawn(async move { unless_aborted(&a, std::pin::pin!(stream(p))).await });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(polls.load(Ordering::Relaxed) >= 1000, "woken per chunk");
        abort.send_replace(true);
        assert_eq!(task.await.unwrap(), None, "the abort ends it");

        // Aborted before it starts: not polled at all.
        let polls = Arc::new(AtomicUsize::new(0));
        let never = std::pin::pin!(stream(polls.clone()));
        assert_eq!(unless_aborted(&abort, never).await, None);
        assert_eq!(polls.load(Ordering::Relaxed), 0);

        // Never aborted: its output.
        let calm = watch::channel(false).0;
        let done = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            7
        };
        assert_eq!(unless_aborted(&calm, std::pin::pin!(done)).await, Some(7));
    }

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

    /// Four requests due at 0, sent 30, 50, 2_050 and 2_060 µs late (the third after a 2 ms
    /// stall), listed out of send order; one at 5_000 on its own; two due at 9_000 of which
    /// one waited for a concurrency slot (its lag is already from the slot).
    fn burst_rows() -> (Vec<TraceRecord>, [bool; 7]) {
        let rows = vec![
            row("c", 0, 2_050, 0, None),
            row("a", 0, 30, 0, None),
            row("d", 0, 2_060, 0, None),
            row("b", 0, 50, 0, None),
            row("e", 5_000, 40, 0, None),
            row("f", 9_000, 25, 0, None),
            row("g", 9_000, 10, 700, None),
        ];
        (rows, [false, false, false, false, false, false, true])
    }

    #[test]
    fn a_burst_is_queue_time_and_only_gaps_between_sends_are_lag() {
        let (mut rows, waited) = burst_rows();
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

    #[test]
    fn bursts_held_until_closed_and_finished_equal_attribution_over_the_whole_run() {
        // Three instants: a burst of four, one alone, a burst of two with a slot wait.
        let (rows, waited) = burst_rows();
        let mut whole = rows.clone();
        attribute_bursts(&mut whole, &waited);
        let gid = |r: &TraceRecord| r.scheduled_offset_us.unwrap() as u64;
        // Rows finish in another order than sent; the pacer closes each burst when it
        // releases the next instant, before or after its members finish.
        let mut b = Bursts::default();
        let mut out: Vec<(u64, TraceRecord)> = Vec::new();
        for &k in &[4usize, 1, 0] {
            out.extend(b.finished(gid(&rows[k]), Some((k as u64, rows[k].clone(), waited[k]))));
        }
        assert!(out.is_empty(), "nothing leaves before its burst is closed");
        out.extend(b.closed(0, 4));
        assert!(out.is_empty(), "nor before every member finished");
        out.extend(b.closed(5_000, 1));
        assert_eq!(out.len(), 1, "a burst of one leaves once closed");
        for &k in &[3usize, 2, 6] {
            out.extend(b.finished(gid(&rows[k]), Some((k as u64, rows[k].clone(), waited[k]))));
        }
        // The member that waited for a slot takes no part: it left at once.
        assert_eq!(out.len(), 6);
        assert_eq!(b.held(), 0);
        out.extend(b.finished(9_000, None)); // a member not sent (the run was stopping)
        out.extend(b.finished(9_000, Some((5, rows[5].clone(), waited[5]))));
        assert!(out.len() == 6 && b.held() == 1);
        out.extend(b.flush());
        assert_eq!(b.held(), 0);
        out.sort_by_key(|(k, _)| *k);
        let got: Vec<TraceRecord> = out.into_iter().map(|(_, r)| r).collect();
        assert_eq!(got.len(), 7);
        for (g, w) in got.iter().zip(&whole) {
            assert_eq!(
                (&g.request_id, g.dispatch_lag_us, g.queue_us),
                (&w.request_id, w.dispatch_lag_us, w.queue_us)
            );
        }
    }

    #[test]
    fn a_burst_of_many_is_held_in_bounded_memory_and_attributed_as_over_the_whole_run() {
        // All due at 0 (`--request-rate inf`), sent 10 µs apart, finishing in pairs out of
        // send order; every eighth waited for a slot.
        let n = 3 * BURST_WINDOW + 7;
        let rows: Vec<TraceRecord> = (0..n)
            .map(|i| row(&format!("r{i}"), 0, 10 * i as i64 + 3, 0, None))
            .collect();
        let waited: Vec<bool> = (0..n).map(|i| i % 8 == 5).collect();
        let mut whole = rows.clone();
        attribute_bursts(&mut whole, &waited);
        let mut b = Bursts::default();
        let mut out: Vec<(u64, TraceRecord)> = Vec::new();
        let mut most = 0;
        for k in 0..n {
            let i = if k % 2 == 0 {
                (k + 1).min(n - 1)
            } else {
                k - 1
            };
            let left = b.finished(1, Some((i as u64, rows[i].clone(), waited[i])));
            if waited[i] {
                assert!(
                    left.iter().any(|(s, _)| *s == i as u64),
                    "a slot wait leaves at once"
                );
            }
            out.extend(left);
            most = most.max(b.held());
        }
        assert!(most <= BURST_WINDOW, "held {most} rows of one burst");
        out.extend(b.closed(1, n));
        assert_eq!(b.held(), 0);
        out.sort_by_key(|(k, _)| *k);
        assert_eq!(out.len(), n);
        for ((_, g), w) in out.iter().zip(&whole) {
            assert_eq!(
                (&g.request_id, g.dispatch_lag_us, g.queue_us),
                (&w.request_id, w.dispatch_lag_us, w.queue_us)
            );
            assert_eq!(send_minus_parts(g), send_minus_parts(w));
        }
    }
}
