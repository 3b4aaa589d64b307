//! Tokenizing prompts off the request path, in batches on the prompt runners' threads.
//!
//! A request's prompt is tokenized while the request is forwarded (its row is written
//! seconds later, when the writer thread joins the result). The request only queues its body
//! (a reference-counted [`Bytes`], no copy): the body is parsed into a tree here, not on the
//! serving thread. A waking thread per request (futex calls and context switches) would cost
//! more than tokenizing a short prompt, so a runner woken for a job waits [`LINGER`] for a
//! batch to gather and works through the queue until it is empty, then parks. When jobs pile
//! up faster than the runners drain them (a real tokenizer on long prompts), more runners
//! wake or start, up to one per core, so expensive tokenizing still runs in parallel.
//!
//! The runners are the proxy's own threads (`capture-prompts`), at a lower CPU priority than
//! the serving threads ([`crate::runtime::threads::background`]): in a burst the request paths get the
//! CPU first and the tokenizing follows. A runner idle for [`IDLE_EXIT`] exits.
//!
//! When the tokenizing cannot keep up, it is shed, never the row: a job that waited longer
//! than the shed budget (`ProxyConfig::recorder_shed_after`) before a runner took it is not
//! tokenized; the writer thread gets the chat chain and an estimate of the prompt's tokens
//! instead ([`PromptInfo::shed`]), so the queue drains at parsing speed and the recorder's lag
//! stays bounded. Jobs that need no tokens at all (no prefix hashes kept) are only parsed.
//! A chat prompt starts from the longest prefix of its messages already tokenized
//! ([`PrefixCache`]): the next turn of a conversation tokenizes only its new messages.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use tokenize::Tokenizer;
use wire::api::Api;

use crate::linking::agents::{request_tools, RequestTools};
use crate::linking::sessions::{chat_keys, ChatKeys};
use crate::prefix::{
    estimate_tokens, prompt_blocks_cached, PrefixCache, PromptBlocks, PREFIX_CACHE_HASHES,
};
use crate::recording::apis::chat_view;
use crate::recording::media::{media, Media};

/// What the writer thread gets of a request's prompt, computed off the request path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PromptInfo {
    /// Prefix hashes and token count (None when the body has no prompt this can read).
    pub(crate) blocks: Option<PromptBlocks>,
    /// The chat keys for session linking ([`chat_keys`] of the request in chat's shape,
    /// [`chat_view`]; None for completions and the APIs that do not generate).
    pub(crate) chain: Option<ChatKeys>,
    /// A completion's prompt (a string), for [`crate::linking::completions`]' linking on the writer
    /// thread, which drops it once hashed (None for chat and anything else).
    pub(crate) completion: Option<String>,
    /// The tools it offers and what agent linking needs of its messages (None when the
    /// body is not a JSON object, or its API does not generate).
    pub(crate) tools: Option<RequestTools>,
    /// Its images and audio (None when the body is not a JSON object, or its API does not
    /// generate).
    pub(crate) media: Option<Media>,
    /// Set when the prompt was not tokenized: the job waited past the shed budget
    /// (`estimate` is the prompt's tokens by [`estimate_tokens`]), or it was queued with
    /// no tokenizing wanted.
    pub(crate) shed: Option<Shed>,
}

/// A prompt left untokenized, and its estimated token count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shed {
    /// The prompt's tokens by [`estimate_tokens`] (None when the body has no prompt).
    pub(crate) estimate: Option<usize>,
    /// The body, for the writer to tokenize when it needs the count after all (queued
    /// without tokenizing and the upstream reported no usage); None when the job was shed.
    pub(crate) body: Option<Bytes>,
}

/// The result of tokenizing a row's prompt, computed off the request path.
pub(crate) type PendingPrompt = std::sync::mpsc::Receiver<PromptInfo>;

/// How long a woken runner waits for more jobs before it starts.
pub(crate) const LINGER: Duration = Duration::from_millis(5);
/// Queued jobs per running runner above which another one wakes or starts.
const BACKLOG_PER_RUNNER: usize = 4;
/// How long a parked runner waits for work before its thread exits.
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// One body to read: its API, when it was queued and whether to tokenize it.
struct Job {
    api: Api,
    body: Bytes,
    tx: SyncSender<PromptInfo>,
    queued_at: Instant,
    tokenize: bool,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Runners awake (waiting out [`LINGER`] or working), counted by whoever woke them.
    running: usize,
    /// Runner threads alive.
    threads: usize,
    /// Wake-ups handed to parked runners and not yet taken.
    wakeups: usize,
}

/// The queue of prompts to tokenize; shared by every connection.
pub(crate) struct PromptQueue {
    tokenizer: Arc<Tokenizer>,
    block_size: u32,
    state: Mutex<State>,
    wake: Condvar,
    max_runners: usize,
    /// A job waiting longer than this is not tokenized.
    shed_after: Duration,
    /// Chat prefixes already tokenized.
    cache: PrefixCache,
}

impl std::fmt::Debug for PromptQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptQueue")
            .field("block_size", &self.block_size)
            .field("max_runners", &self.max_runners)
            .finish_non_exhaustive()
    }
}

/// What one body's prompt gives: parsed here, put in chat's shape ([`chat_view`]),
/// tokenized (unless `shed`), and its chat chain.
fn info(
    job: &Job,
    tokenize: bool,
    block_size: u32,
    tok: &Tokenizer,
    cache: &PrefixCache,
) -> PromptInfo {
    match serde_json::from_slice::<Value>(&job.body) {
        Ok(Value::Object(obj)) => {
            let api = job.api;
            let media = api.generates().then(|| media(&obj));
            let mut obj = chat_view(api, obj);
            let mut info = PromptInfo {
                media,
                blocks: tokenize
                    .then(|| prompt_blocks_cached(&obj, block_size, tok, cache))
                    .flatten(),
                chain: chat_keys(&obj).filter(|_| api.generates()),
                completion: None,
                tools: api.generates().then(|| request_tools(&obj)),
                shed: (!tokenize).then(|| Shed {
                    estimate: estimate_tokens(&obj),
                    body: (!job.tokenize).then(|| job.body.clone()),
                }),
            };
            if api == Api::Completions && info.chain.is_none() {
                info.completion = crate::linking::completions::take_prompt(&mut obj);
            }
            info
        }
        _ => PromptInfo::default(),
    }
}

impl PromptQueue {
    pub(crate) fn new(
        tokenizer: Arc<Tokenizer>,
        block_size: u32,
        shed_after: Duration,
    ) -> Arc<PromptQueue> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Arc::new(PromptQueue {
            tokenizer,
            block_size,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            max_runners: cores.max(1),
            shed_after,
            cache: PrefixCache::new(PREFIX_CACHE_HASHES),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the reading of one request body of `api` (its chat chain, and its tokenizing
    /// when `tokenize`); the writer thread receives the result.
    pub(crate) fn submit(self: &Arc<Self>, api: Api, body: Bytes, tokenize: bool) -> PendingPrompt {
        self.submit_at(api, body, tokenize, Instant::now())
    }

    /// [`PromptQueue::submit`] for a job queued at `queued_at`.
    fn submit_at(
        self: &Arc<Self>,
        api: Api,
        body: Bytes,
        tokenize: bool,
        queued_at: Instant,
    ) -> PendingPrompt {
        let (tx, rx) = sync_channel(1);
        let mut st = self.lock();
        st.jobs.push_back(Job {
            api,
            body,
            tx,
            queued_at,
            tokenize,
        });
        let wanted = st.running == 0
            || (st.running < self.max_runners && st.jobs.len() > st.running * BACKLOG_PER_RUNNER);
        if !wanted {
            return rx;
        }
        // Woken runners that have not yet taken their wake-up are already in `running`.
        let parked = st.threads - st.running;
        st.running += 1;
        if parked > 0 {
            st.wakeups += 1;
            drop(st);
            self.wake.notify_one();
            return rx;
        }
        st.threads += 1;
        drop(st);
        let q = self.clone();
        let spawned = std::thread::Builder::new()
            .name("capture-prompts".into())
            .spawn(move || {
                crate::runtime::threads::background();
                q.run()
            });
        if spawned.is_err() {
            // No thread to be had (out of memory or of threads): this job, and whatever else
            // is queued, is done here rather than left to wait.
            let mut st = self.lock();
            st.threads -= 1;
            st.running -= 1;
            let jobs: Vec<Job> = if st.running == 0 {
                st.jobs.drain(..).collect()
            } else {
                Vec::new()
            };
            drop(st);
            for job in jobs {
                self.work(job);
            }
        }
        rx
    }

    /// Does one job: tokenized when wanted and it did not wait past the shed budget.
    fn work(&self, job: Job) {
        let tokenize = job.tokenize && job.queued_at.elapsed() <= self.shed_after;
        let info = info(
            &job,
            tokenize,
            self.block_size,
            &self.tokenizer,
            &self.cache,
        );
        let _ = job.tx.send(info);
    }

    /// A runner thread: woken (counted in `running` by its waker), lets a batch gather, works
    /// until the queue is empty, then parks until woken again or idle for [`IDLE_EXIT`].
    fn run(&self) {
        let mut linger = true;
        loop {
            if linger {
                std::thread::sleep(LINGER);
            }
            loop {
                let job = self.lock().jobs.pop_front();
                let Some(job) = job else { break };
                self.work(job);
            }
            let mut st = self.lock();
            // A job queued after the last pop may have seen this runner still running and
            // woken none: take it on.
            if !st.jobs.is_empty() {
                linger = false;
                continue;
            }
            linger = true;
            st.running -= 1;
            loop {
                let (next, timeout) = self
                    .wake
                    .wait_timeout(st, IDLE_EXIT)
                    .unwrap_or_else(|e| e.into_inner());
                st = next;
                if st.wakeups > 0 {
                    st.wakeups -= 1;
                    break;
                }
                if timeout.timed_out() {
                    st.threads -= 1;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHED: Duration = Duration::from_secs(3600);

    fn body(prompt: &str) -> Bytes {
        Bytes::from(serde_json::json!({"model": "m", "prompt": prompt}).to_string())
    }

    fn idle(q: &PromptQueue) -> bool {
        let st = q.lock();
        st.running == 0 && st.jobs.is_empty() && st.wakeups == 0
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_job_gets_its_own_result() {
        let q = PromptQueue::new(Arc::new(Tokenizer::words()), 2, SHED);
        let mut pending = Vec::new();
        for round in 0..20 {
            for n in 1..=50usize {
                let prompt = vec!["w"; n].join(" ");
                pending.push((n, q.submit(Api::Completions, body(&prompt), true)));
            }
            if round % 5 == 0 {
                // Let the runners finish and park, so later jobs must wake them.
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
        while !idle(&q) {
            assert!(std::time::Instant::now() < deadline, "runners never parked");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let threads = q.lock().threads;
        assert!(
            (1..=q.max_runners).contains(&threads),
            "{threads} runner threads for {} cores",
            q.max_runners
        );
    }

    /// A parked runner is woken for the next job (no new thread), and the runners run at the
    /// background priority.
    #[test]
    fn parked_runners_are_woken_not_respawned() {
        let q = PromptQueue::new(Arc::new(Tokenizer::words()), 2, SHED);
        for round in 0..5 {
            let rx = q.submit(Api::Completions, body("a b c"), true);
            let got = rx.recv_timeout(Duration::from_secs(10)).expect("tokenized");
            assert_eq!(got.blocks.expect("a prompt").tokens, 3, "round {round}");
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !idle(&q) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the runner never parked"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(q.lock().threads, 1, "round {round}");
        }
        #[cfg(target_os = "linux")]
        {
            let nice = |comm: &str| -> Option<i64> {
                for t in std::fs::read_dir("/proc/self/task").ok()? {
                    let dir = t.ok()?.path();
                    let name = std::fs::read_to_string(dir.join("comm")).ok()?;
                    if name.trim() == comm {
                        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
                        // Field 19 (nice), counted after the parenthesised name.
                        let rest = &stat[stat.rfind(')')? + 2..];
                        return rest.split(' ').nth(16)?.parse().ok();
                    }
                }
                None
            };
            assert_eq!(
                nice("capture-prompts"),
                Some(crate::runtime::threads::BACKGROUND_NICE)
            );
        }
    }

    /// A job that waited past the shed budget is not tokenized: the writer gets the chat
    /// chain and an estimate instead; a fresh one is tokenized; one queued without tokenizing
    /// comes back with its body for the writer.
    #[test]
    fn a_job_past_the_shed_budget_is_parsed_not_tokenized() {
        let q = PromptQueue::new(Arc::new(Tokenizer::words()), 2, Duration::from_secs(1));
        let chat = Bytes::from(
            serde_json::json!({"model": "m", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "one two three four five six seven"},
            ]})
            .to_string(),
        );
        let wait = |rx: PendingPrompt| rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let fresh = wait(q.submit(Api::Chat, chat.clone(), true));
        let blocks = fresh.blocks.clone().expect("tokenized");
        assert_eq!((blocks.tokens, fresh.shed.clone()), (9, None));

        let old = Instant::now()
            .checked_sub(Duration::from_secs(2))
            .expect("an instant 2 s ago");
        let shed = wait(q.submit_at(Api::Chat, chat.clone(), true, old));
        assert_eq!(shed.blocks, None, "not tokenized");
        assert_eq!(shed.chain, fresh.chain, "the session chain is still read");
        assert_eq!(
            shed.shed,
            Some(Shed {
                estimate: Some("be brief".len().div_ceil(4) + 33usize.div_ceil(4)),
                body: None,
            })
        );

        let untokenized = wait(q.submit(Api::Chat, chat.clone(), false));
        assert_eq!(untokenized.blocks, None);
        assert_eq!(untokenized.chain, fresh.chain);
        assert_eq!(untokenized.shed.and_then(|s| s.body), Some(chat));
    }

    #[test]
    fn a_body_without_a_prompt_gives_none() {
        let q = PromptQueue::new(Arc::new(Tokenizer::words()), 16, SHED);
        for b in [&br#"{"model":"m"}"#[..], b"not json", b"[1]"] {
            let rx = q.submit(Api::Chat, Bytes::from_static(b), true);
            let want = PromptInfo {
                // A JSON object offers tools and carries media (none here) all the same.
                tools: b.starts_with(b"{").then(Default::default),
                media: b.starts_with(b"{").then(Default::default),
                ..Default::default()
            };
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), want);
        }
    }

    /// A Responses and a Messages prompt are tokenized and chained as the same
    /// conversation sent to chat is; an embeddings input is tokenized, never chained.
    #[test]
    fn every_api_is_read_in_chats_shape() {
        let q = PromptQueue::new(Arc::new(Tokenizer::words()), 2, SHED);
        let get = |api: Api, v: serde_json::Value| {
            q.submit(api, Bytes::from(v.to_string()), true)
                .recv_timeout(Duration::from_secs(10))
                .unwrap()
        };
        let chat = get(
            Api::Chat,
            serde_json::json!({"messages": [
                {"role": "system", "content": "be brief please"},
                {"role": "user", "content": "what is two plus two"}
            ]}),
        );
        let responses = get(
            Api::Responses,
            serde_json::json!({"instructions": "be brief please", "input": "what is two plus two"}),
        );
        let messages = get(
            Api::Messages,
            serde_json::json!({"system": "be brief please", "max_tokens": 9,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "what is two plus two"}]}]}),
        );
        assert_eq!(chat.blocks.as_ref().map(|b| b.tokens), Some(8));
        for other in [&responses, &messages] {
            assert_eq!(other.blocks, chat.blocks);
            assert_eq!(other.chain, chat.chain);
            assert_eq!(other.completion, None);
        }
        let e = get(
            Api::Embeddings,
            serde_json::json!({"input": "one two three four five"}),
        );
        assert_eq!(e.blocks.map(|b| (b.tokens, b.hashes.len())), Some((5, 2)));
        assert_eq!(
            (e.chain, e.completion, e.tools, e.media),
            (None, None, None, None)
        );
    }
}
