//! Tokenizing prompts off the request path, in batches on the blocking pool.
//!
//! A request's prompt is tokenized while the request is forwarded (its row is written
//! seconds later, when the writer thread joins the result). One `spawn_blocking` per request
//! woke a parked pool thread per request, and those wake-ups (futex calls and context
//! switches) cost more than tokenizing a short prompt. Here a request only queues its job; a
//! runner on the blocking pool waits [`LINGER`] for a batch to gather and works through the
//! queue until it is empty. When jobs pile up faster than the runners drain them (a real
//! tokenizer on long prompts), more runners start, up to one per core, so expensive
//! tokenizing still runs in parallel.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokenize::Tokenizer;

use crate::prefix::{prompt_blocks, PromptBlocks};
use crate::sessions::chat_chain;

/// What the writer thread gets of a request's prompt, computed off the request path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PromptInfo {
    /// Prefix hashes and token count (None when the body has no prompt this can read).
    pub(crate) blocks: Option<PromptBlocks>,
    /// The chat chain for session linking ([`chat_chain`]; None for non-chat requests).
    pub(crate) chain: Option<Vec<u64>>,
}

/// The result of tokenizing a row's prompt, computed off the request path.
pub(crate) type PendingPrompt = std::sync::mpsc::Receiver<PromptInfo>;

/// How long a new runner waits for more jobs before it starts.
pub(crate) const LINGER: Duration = Duration::from_millis(5);
/// Queued jobs per running runner above which another one starts.
const BACKLOG_PER_RUNNER: usize = 4;

type Job = (Map<String, Value>, SyncSender<PromptInfo>);

/// The queue of prompts to tokenize; shared by every connection.
pub(crate) struct PromptQueue {
    tokenizer: Arc<Tokenizer>,
    block_size: u32,
    jobs: Mutex<VecDeque<Job>>,
    runners: AtomicUsize,
    max_runners: usize,
}

impl std::fmt::Debug for PromptQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptQueue")
            .field("block_size", &self.block_size)
            .field("runners", &self.runners.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PromptQueue {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, block_size: u32) -> Arc<PromptQueue> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Arc::new(PromptQueue {
            tokenizer,
            block_size,
            jobs: Mutex::new(VecDeque::new()),
            runners: AtomicUsize::new(0),
            max_runners: cores.max(1),
        })
    }

    /// Queues the tokenizing (and the chat chain) of one request body (must be called within a tokio runtime);
    /// the writer thread receives the result.
    pub(crate) fn submit(self: &Arc<Self>, body: Map<String, Value>) -> PendingPrompt {
        let (tx, rx) = sync_channel(1);
        let queued = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.push_back((body, tx));
            jobs.len()
        };
        let running = self.runners.load(Ordering::Acquire);
        let wanted =
            running == 0 || (running < self.max_runners && queued > running * BACKLOG_PER_RUNNER);
        if wanted
            && self
                .runners
                .compare_exchange(running, running + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let q = self.clone();
            tokio::task::spawn_blocking(move || q.run());
        }
        rx
    }

    fn pop(&self) -> Option<Job> {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// A runner: lets a batch gather, then tokenizes until the queue is empty.
    fn run(&self) {
        std::thread::sleep(LINGER);
        loop {
            while let Some((body, tx)) = self.pop() {
                let _ = tx.send(PromptInfo {
                    blocks: prompt_blocks(&body, self.block_size, &self.tokenizer),
                    chain: chat_chain(&body),
                });
            }
            self.runners.fetch_sub(1, Ordering::AcqRel);
            // A job queued after the last pop may have seen this runner still counted and
            // started none: take it on again rather than leave it waiting.
            let empty = self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty();
            if empty {
                return;
            }
            self.runners.fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(prompt: &str) -> Map<String, Value> {
        match serde_json::json!({"model": "m", "prompt": prompt}) {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_job_gets_its_own_result() {
        let q = PromptQueue::new(Arc::new(Tokenizer::words()), 2);
        let mut pending = Vec::new();
        for round in 0..20 {
            for n in 1..=50usize {
                let prompt = vec!["w"; n].join(" ");
                pending.push((n, q.submit(body(&prompt))));
            }
            if round % 5 == 0 {
                // Let runners finish and exit, so later jobs must start new ones.
                tokio::time::sleep(LINGER * 3).await;
            }
        }
        for (n, rx) in pending {
            let got = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("tokenized")
                .blocks
                .expect("a prompt");
            assert_eq!(got.tokens, n);
            assert_eq!(got.hashes.len(), n / 2);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while q.runners.load(Ordering::Acquire) != 0 {
            assert!(std::time::Instant::now() < deadline, "runners never exited");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(q.jobs.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_body_without_a_prompt_gives_none() {
        let q = PromptQueue::new(Arc::new(Tokenizer::words()), 16);
        let mut m = Map::new();
        m.insert("model".into(), Value::from("m"));
        let rx = q.submit(m);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            PromptInfo::default()
        );
    }
}
