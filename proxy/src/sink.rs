//! The record sink: a bounded queue to the trace-format [`TraceWriter`] running on its own
//! thread, so writing never slows the proxy. The thread drains the queue every
//! [`DRAIN_EVERY`] (or half flush interval, if shorter), so queueing a record never wakes it.
//! A full queue drops the record (counted in `records_dropped_total` and logged) instead of
//! waiting.
//!
//! A row arrives with the tokenization of its prompt still running on the blocking pool
//! ([`PendingPrompt`]); the writer thread waits for it (bounded) and fills in
//! `prefix_hashes`, and `prompt_tokens` (source `tokenizer`) when the upstream reported none.
//! When the upstream sent no usage, it also counts the generated text with the tokenizer
//! (`output_tokens`, source `tokenizer`), off the request path.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use trace_format::tokenize::Tokenizer;
use trace_format::writer::RecoveryReport;
use trace_format::{TokenSource, TraceRecord, TraceWriter, WriterConfig};

use crate::error::{ProxyError, Result};
use crate::metrics::Metrics;
use crate::prefix::PromptBlocks;

/// The result of tokenizing a row's prompt, computed off the request path.
pub(crate) type PendingPrompt = Receiver<Option<PromptBlocks>>;

/// Longest time a queued record waits for the writer thread: the queue's default 16 Ki
/// records then absorb over 300k records/s.
const DRAIN_EVERY: Duration = Duration::from_millis(50);

/// Longest wait of the writer thread for one prompt's tokenization.
const PROMPT_WAIT: Duration = Duration::from_secs(10);

/// The generated text of a response that carried no usage, for the tokenizer to count.
#[derive(Debug)]
pub(crate) enum OutputText {
    /// The text of a stream's output chunks.
    Text(String),
    /// A whole (non-streamed) JSON response body.
    Body(Vec<u8>),
}

impl OutputText {
    fn text(self) -> Option<String> {
        match self {
            OutputText::Text(t) => Some(t),
            OutputText::Body(b) => trace_format::sse::response_text(&b),
        }
    }
}

struct Queued {
    rec: TraceRecord,
    prompt: Option<PendingPrompt>,
    output: Option<OutputText>,
}

enum Msg {
    Record(Box<Queued>),
    Close,
}

/// The row with what its prompt's tokenization gave.
fn resolve(q: Queued, keep_hashes: bool, tokenizer: &Tokenizer) -> TraceRecord {
    let Queued {
        mut rec,
        prompt,
        output,
    } = q;
    if rec.output_tokens.is_none() {
        if let Some(n) = output
            .and_then(OutputText::text)
            .filter(|t| !t.is_empty())
            .and_then(|t| tokenizer.count(&t).ok())
        {
            rec.output_tokens = Some(n as i64);
            rec.output_tokens_source = Some(TokenSource::Tokenizer);
        }
    }
    if let Some(p) = prompt.and_then(|rx| rx.recv_timeout(PROMPT_WAIT).ok().flatten()) {
        if keep_hashes {
            rec.prefix_hashes = Some(p.hashes);
        }
        if rec.prompt_tokens.is_none() {
            rec.prompt_tokens = Some(p.tokens as i64);
            rec.prompt_tokens_source = Some(TokenSource::Tokenizer);
        }
    }
    rec
}

/// The sending side; cheap to share.
#[derive(Debug)]
pub(crate) struct Sink {
    tx: SyncSender<Msg>,
    metrics: Arc<Metrics>,
}

/// The writer thread; [`WriterThread::close`] finishes the files.
#[derive(Debug)]
pub(crate) struct WriterThread {
    tx: SyncSender<Msg>,
    handle: JoinHandle<Result<Vec<PathBuf>>>,
}

/// Opens the writer (recovering journals a crash left in the directory) and starts its
/// thread.
pub(crate) fn start(
    cfg: WriterConfig,
    capacity: usize,
    keep_hashes: bool,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
) -> Result<(Sink, WriterThread, RecoveryReport)> {
    let tick = cfg.flush_interval / 2;
    let (writer, report) = TraceWriter::open(cfg)?;
    let (tx, rx) = mpsc::sync_channel(capacity.max(1));
    let m = metrics.clone();
    let handle = std::thread::Builder::new()
        .name("llmreplay-writer".into())
        .spawn(move || run(writer, rx, tick, keep_hashes, &tokenizer, &m))?;
    Ok((
        Sink {
            tx: tx.clone(),
            metrics,
        },
        WriterThread { tx, handle },
        report,
    ))
}

fn run(
    mut writer: TraceWriter,
    rx: Receiver<Msg>,
    tick: Duration,
    keep_hashes: bool,
    tokenizer: &Tokenizer,
    metrics: &Metrics,
) -> Result<Vec<PathBuf>> {
    let tick = tick.max(Duration::from_millis(1));
    let mut last_tick = std::time::Instant::now();
    let append = |writer: &mut TraceWriter, q: Box<Queued>| match writer.append(resolve(
        *q,
        keep_hashes,
        tokenizer,
    )) {
        Ok(()) => {
            metrics.records_written.fetch_add(1, Relaxed);
        }
        Err(e) => {
            let n = metrics.record_errors.fetch_add(1, Relaxed);
            if n.is_power_of_two() || n == 0 {
                eprintln!(
                    "llmreplay capture: trace write failed ({} so far): {e}",
                    n + 1
                );
            }
        }
    };
    loop {
        // The thread wakes on its own clock (or at close), not once per record: a send never
        // wakes it, and every record queued is handed to the OS by the tick that follows,
        // within the loss window.
        let until_tick = tick.saturating_sub(last_tick.elapsed());
        std::thread::park_timeout(until_tick.min(DRAIN_EVERY));
        loop {
            match rx.try_recv() {
                Ok(Msg::Record(q)) => append(&mut writer, q),
                Ok(Msg::Close) | Err(TryRecvError::Disconnected) => {
                    // Anything still queued was sent before Close: keep it.
                    while let Ok(Msg::Record(q)) = rx.try_recv() {
                        append(&mut writer, q);
                    }
                    return Ok(writer.close()?);
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        if last_tick.elapsed() >= tick {
            last_tick = std::time::Instant::now();
            if let Err(e) = writer.tick() {
                eprintln!("llmreplay capture: trace flush failed: {e}");
            }
        }
    }
}

impl Sink {
    /// Queues a record (with its prompt's pending tokenization), or drops and counts it when
    /// the queue is full.
    pub(crate) fn send(
        &self,
        rec: TraceRecord,
        prompt: Option<PendingPrompt>,
        output: Option<OutputText>,
    ) {
        match self.tx.try_send(Msg::Record(Box::new(Queued {
            rec,
            prompt,
            output,
        }))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                let n = self.metrics.records_dropped.fetch_add(1, Relaxed) + 1;
                if n.is_power_of_two() || n % 1000 == 0 {
                    eprintln!(
                        "llmreplay capture: trace writer queue full, {n} records dropped so far"
                    );
                }
            }
        }
    }
}

impl WriterThread {
    /// Finishes the files (after everything queued before this call) and returns them.
    pub(crate) fn close(self) -> Result<Vec<PathBuf>> {
        let _ = self.tx.send(Msg::Close);
        drop(self.tx);
        self.handle.thread().unpark();
        self.handle
            .join()
            .map_err(|_| ProxyError::WriterThread("panicked".into()))?
    }
}
