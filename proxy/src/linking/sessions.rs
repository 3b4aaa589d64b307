//! Conversations linked at capture, from hashes only.
//!
//! Production chat traffic rarely names its conversation, but every turn of one carries the
//! turns before it: a chat request whose messages are an earlier request's messages plus that
//! request's answer (plus the new user message) continues that request's conversation. So each
//! chat prompt is reduced to the chained hash after each of its messages ([`chat_chain`]:
//! role and text of message 1, then of message 2 on top of it, …), and each finished request
//! leaves one key behind: its chain continued by the answer it got as an `assistant` message
//! ([`answer_key`]). A later request whose chain passes through such a key is that request's
//! child; the longest match wins (a conversation that shares a system prompt or a first
//! question with others still links to its own last turn, because the answers differ).
//!
//! When identical prompts got identical answers in two conversations (the same first question
//! answered the same way), the key is ambiguous; the child goes to the most recently finished
//! candidate that no other turn has continued yet, then to the most recent one.
//!
//! No text is kept: each message's text is reduced to a 64-bit FNV-1a hash ([`TextHash`],
//! which the capture observer also feeds with the answer as it streams, so the answer's text
//! is never held for linking), and the chain mixes role and text hash; linking works under
//! `--record-bodies hashes`. Content given as parts counts its `text` parts in order; other
//! parts (images, audio) and tool calls do not enter the hash. Completions (`prompt`
//! strings) have no message boundaries to hash at: [`crate::linking::completions`] links them.
//!
//! Memory: the [`Linker`] remembers the answer keys of the last `max_keys` finished chat
//! requests ([`DEFAULT_MAX_KEYS`], ~150 bytes each) and at most [`MAX_CANDIDATES`] requests
//! per key; a conversation idle for longer than that many other finished turns starts a new
//! session.

use serde_json::{Map, Value};
use trace_format::ParentLink;

use crate::linking::bounded::Candidates;
use crate::prefix::{fnv, FNV_OFFSET};

/// The FNV-1a hash of a text with surrounding whitespace trimmed, fed piece by piece (a
/// streamed answer arrives in chunks): `TextHash` of `"  a b\n"` in any split equals that of
/// `"a b"`. Clients resend the answer they displayed, so surrounding whitespace is not
/// significant. Holds nothing of the text: whitespace after the last non-space character is
/// hashed into a tentative state that only becomes the hash when more text follows.
#[derive(Debug, Clone, Copy)]
pub struct TextHash {
    committed: u64,
    tentative: u64,
    started: bool,
}

impl Default for TextHash {
    fn default() -> Self {
        TextHash {
            committed: FNV_OFFSET,
            tentative: FNV_OFFSET,
            started: false,
        }
    }
}

impl TextHash {
    /// Appends a piece of the text.
    pub fn push(&mut self, piece: &str) {
        let mut rest = piece;
        while !rest.is_empty() {
            // A run of whitespace, then a run of other characters.
            let ws_end = rest
                .find(|c: char| !c.is_whitespace())
                .unwrap_or(rest.len());
            let (ws, tail) = rest.split_at(ws_end);
            if self.started && !ws.is_empty() {
                self.tentative = fnv(self.tentative, ws.as_bytes());
            }
            let word_end = tail.find(char::is_whitespace).unwrap_or(tail.len());
            let (word, tail) = tail.split_at(word_end);
            if !word.is_empty() {
                self.started = true;
                self.committed = fnv(self.tentative, word.as_bytes());
                self.tentative = self.committed;
            }
            rest = tail;
        }
    }

    /// The hash of the trimmed text so far.
    pub fn finish(&self) -> u64 {
        self.committed
    }

    /// The hash of one whole text.
    pub fn of(text: &str) -> u64 {
        let mut h = TextHash::default();
        h.push(text);
        h.finish()
    }
}

/// The chain hash of one more message (its role and [`TextHash`]) on top of `parent`.
fn step(parent: u64, role: &str, text: u64) -> u64 {
    let h = fnv(FNV_OFFSET, &parent.to_le_bytes());
    let h = fnv(h, role.as_bytes());
    let h = fnv(h, &[0x1f]);
    let h = fnv(h, &text.to_le_bytes());
    fnv(h, &[0x1e])
}

/// The [`TextHash`] of a message's `content`: a string, or its `text` parts in order.
pub fn content_hash(content: &Value) -> u64 {
    let mut h = TextHash::default();
    match content {
        Value::String(s) => h.push(s),
        Value::Array(parts) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    h.push(t);
                }
            }
        }
        _ => {}
    }
    h.finish()
}

/// The chained hash after each message of a chat request (`messages`); None when the body has
/// no messages (a completion, an embedding).
pub fn chat_chain(body: &Map<String, Value>) -> Option<Vec<u64>> {
    walk_chain(body, |_, _| {})
}

/// The chain of `body`'s messages, calling `each(role, hash)` after each message.
fn walk_chain(body: &Map<String, Value>, mut each: impl FnMut(&str, u64)) -> Option<Vec<u64>> {
    let messages = body.get("messages")?.as_array()?;
    if messages.is_empty() {
        return None;
    }
    let mut h = 0u64;
    let mut chain = Vec::with_capacity(messages.len());
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let text = m.get("content").map_or(TextHash::of(""), content_hash);
        h = step(h, role, text);
        each(role, h);
        chain.push(h);
    }
    Some(chain)
}

/// What chat linking needs of a prompt: the keys it looks up (the chain after each of its
/// `assistant` messages but the last message: only there can a remembered [`answer_key`],
/// an answer continued as an `assistant` message, be), oldest first, and the chain after its
/// last message, on which the key its own answer leaves is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatKeys {
    /// The chain after each `assistant` message before the last message, oldest first.
    pub lookups: Vec<u64>,
    /// The chain after the last message.
    pub last: u64,
}

impl ChatKeys {
    /// The keys of a chain (the lookups at every message but the last: for callers that do
    /// not know the roles; a non-`assistant` position never matches an answer key).
    pub fn of_chain(chain: &[u64]) -> Option<ChatKeys> {
        let (&last, before) = chain.split_last()?;
        Some(ChatKeys {
            lookups: before.to_vec(),
            last,
        })
    }

    /// The key a complete answer of [`TextHash`] `answer` to this prompt leaves.
    pub fn answer_key(&self, answer: u64) -> u64 {
        step(self.last, "assistant", answer)
    }
}

/// The [`ChatKeys`] of a chat request (None when it has no messages).
pub fn chat_keys(body: &Map<String, Value>) -> Option<ChatKeys> {
    let mut lookups = Vec::new();
    let chain = walk_chain(body, |role, h| {
        if role == "assistant" {
            lookups.push(h);
        }
    })?;
    let last = *chain.last()?;
    // The last message is the new one: never a lookup.
    if lookups.last() == Some(&last) {
        lookups.pop();
    }
    Some(ChatKeys { lookups, last })
}

/// The key a finished chat request leaves: its chain continued by its answer (the
/// [`TextHash`] of the answer's content).
pub fn answer_key(chain: &[u64], answer: u64) -> Option<u64> {
    chain.last().map(|&h| step(h, "assistant", answer))
}

/// The text of the answer a client shows and resends as the next turn's `assistant`
/// message: the first choice's `content` (chat, `delta` when streamed, `message` when not) or
/// `text` (completions). Reasoning and tool calls are not part of it.
pub fn push_answer_text(payload: &Value, h: &mut TextHash) {
    let Some(choices) = payload.get("choices").and_then(Value::as_array) else {
        return;
    };
    for c in choices {
        if c.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
            continue;
        }
        for inner in ["delta", "message"] {
            if let Some(t) = c
                .pointer(&format!("/{inner}/content"))
                .and_then(Value::as_str)
            {
                h.push(t);
            }
        }
        if let Some(t) = c.get("text").and_then(Value::as_str) {
            h.push(t);
        }
    }
}

/// A request's parent, as linking found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    /// The parent's request id.
    pub request_id: String,
    /// The parent's session.
    pub session_id: String,
    /// When the parent's response ended (µs since the epoch).
    pub end_us: i64,
    /// How it was found.
    pub how: ParentLink,
}

/// What linking says about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The conversation: the parent's, else a new one named after this request (its
    /// request id), or the request's own session header.
    pub session_id: String,
    /// The request this one continues.
    pub parent_request_id: Option<String>,
    /// This request's arrival minus the end of its parent's response, µs (≥ 0).
    pub think_time_us: Option<i64>,
}

#[derive(Debug, Clone)]
struct Candidate {
    request_id: String,
    session_id: String,
    end_us: i64,
    continued: bool,
}

/// Links requests into conversations. Requests are given in the order they finish: a turn's
/// parent finished before the turn was sent, so it is always seen first.
#[derive(Debug)]
pub struct Linker {
    /// Answers by their key, the last `max_keys` (at most [`MAX_CANDIDATES`] a key).
    index: Candidates<u64, Candidate>,
}

/// Answer keys kept by default: the oldest is forgotten beyond this, so a conversation idle
/// for longer than this many other turns starts a new session. About 150 bytes each (30 MB).
pub const DEFAULT_MAX_KEYS: usize = 200_000;

/// Requests remembered per answer key: identical prompts answered identically (a fixed
/// health-check conversation sent in a loop) are ambiguous beyond a few, and a longer list
/// would cost every lookup.
pub const MAX_CANDIDATES: usize = 32;

impl Linker {
    /// A linker that remembers the answers of the last `max_keys` finished chat requests.
    pub fn new(max_keys: usize) -> Linker {
        Linker {
            index: Candidates::new(max_keys, MAX_CANDIDATES),
        }
    }

    /// Answer keys remembered now (at most `max_keys`).
    pub fn remembered(&self) -> usize {
        self.index.len()
    }

    /// Links one finished request and remembers its answer for its children.
    /// `chain`: [`chat_chain`] of its body (None: not a chat request, never linked);
    /// `answer`: the [`TextHash`] of its answer (None: failed or unknown, so nothing can
    /// continue it); `header_session`: the session its request header named, which wins.
    pub fn observe(
        &mut self,
        request_id: &str,
        arrival_us: i64,
        end_us: i64,
        chain: Option<&[u64]>,
        answer: Option<u64>,
        header_session: Option<&str>,
    ) -> Link {
        let keys = chain.and_then(ChatKeys::of_chain);
        let parent = keys
            .as_ref()
            .and_then(|k| self.find_parent(&k.lookups, arrival_us));
        let session_id = match (header_session, &parent) {
            (Some(s), _) => s.to_string(),
            (None, Some(p)) => p.session_id.clone(),
            (None, None) => request_id.to_string(),
        };
        if let (Some(k), Some(a)) = (keys, answer) {
            self.remember_answer(request_id, &session_id, end_us, k.answer_key(a));
        }
        Link {
            session_id,
            think_time_us: parent
                .as_ref()
                .map(|p| arrival_us.saturating_sub(p.end_us).max(0)),
            parent_request_id: parent.map(|p| p.request_id),
        }
    }

    /// Remembers a finished request's answer (`key`: [`ChatKeys::answer_key`] of a complete
    /// answer) for the turns that will continue it.
    pub fn remember_answer(&mut self, request_id: &str, session_id: &str, end_us: i64, key: u64) {
        let c = Candidate {
            request_id: request_id.to_string(),
            session_id: session_id.to_string(),
            end_us,
            continued: false,
        };
        self.index.insert(key, c, |_| {});
    }

    /// The parent of a request looking up `lookups` ([`ChatKeys::lookups`]) arriving at
    /// `arrival_us`, by chat prefix (see the module); it counts as continued.
    pub fn find_parent(&mut self, lookups: &[u64], arrival_us: i64) -> Option<Parent> {
        self.parent_of(lookups, arrival_us).map(|c| Parent {
            request_id: c.request_id,
            session_id: c.session_id,
            end_us: c.end_us,
            how: ParentLink::ChatPrefix,
        })
    }

    /// A request looking up `lookups` has `request_id` as its parent, found otherwise (by
    /// tool call): that candidate, where a lookup finds one, counts as continued, so an
    /// ambiguous prefix does not give it to another turn.
    pub fn mark_continued(&mut self, lookups: &[u64], request_id: &str) {
        for h in lookups {
            if let Some(cands) = self.index.get_mut(h) {
                if let Some((_, c)) = cands.iter_mut().find(|c| c.1.request_id == request_id) {
                    c.continued = true;
                    return;
                }
            }
        }
    }

    /// The parent of a request looking up `lookups`: the longest prefix of its chain that
    /// ends at a remembered answer.
    fn parent_of(&mut self, lookups: &[u64], arrival_us: i64) -> Option<Candidate> {
        for &h in lookups.iter().rev() {
            let Some(cands) = self.index.get_mut(&h) else {
                continue;
            };
            let best = pick(
                0..cands.len(),
                arrival_us,
                |i| cands[i].1.end_us,
                |i| cands[i].1.continued,
            )?;
            cands[best].1.continued = true;
            return Some(cands[best].1.clone());
        }
        None
    }
}

/// Which of the requests remembered under one key a turn continues, when several are
/// (identical prompts answered identically): the most recently finished one that had
/// finished by `arrival_us` and that no other turn has continued yet, else the most recently
/// finished by then, else the most recently finished. `ids` are the candidates; `end_us`
/// and `continued` read each one. One rule for chat turns and completions turns.
pub(crate) fn pick(
    ids: impl Iterator<Item = usize> + Clone,
    arrival_us: i64,
    end_us: impl Fn(usize) -> i64,
    continued: impl Fn(usize) -> bool,
) -> Option<usize> {
    let ended = |i: &usize| end_us(*i) <= arrival_us;
    ids.clone()
        .filter(|i| ended(i) && !continued(*i))
        .max_by_key(|&i| end_us(i))
        .or_else(|| ids.clone().filter(ended).max_by_key(|&i| end_us(i)))
        .or_else(|| ids.max_by_key(|&i| end_us(i)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    fn body(messages: &[(&str, String)]) -> Map<String, Value> {
        let m: Vec<Value> = messages
            .iter()
            .map(|(r, t)| json!({"role": r, "content": t}))
            .collect();
        json!({"model": "m", "messages": m})
            .as_object()
            .unwrap()
            .clone()
    }

    #[test]
    fn a_turn_links_to_the_request_whose_answer_it_carries() {
        let mut l = Linker::new(100);
        let t1 = body(&[("system", "be brief".into()), ("user", "hi".into())]);
        let a = l.observe(
            "r1",
            0,
            1_000,
            chat_chain(&t1).as_deref(),
            Some(TextHash::of("hello!")),
            None,
        );
        assert_eq!(a.session_id, "r1");
        assert_eq!(a.parent_request_id, None);
        // The client resends the answer (with a trailing newline) and asks again.
        let t2 = body(&[
            ("system", "be brief".into()),
            ("user", "hi".into()),
            ("assistant", "hello!\n".into()),
            ("user", "how are you?".into()),
        ]);
        let b = l.observe(
            "r2",
            3_500,
            4_000,
            chat_chain(&t2).as_deref(),
            Some(TextHash::of("fine")),
            None,
        );
        assert_eq!(b.session_id, "r1");
        assert_eq!(b.parent_request_id.as_deref(), Some("r1"));
        assert_eq!(b.think_time_us, Some(2_500));
        // A different answer in the history is another conversation.
        let t3 = body(&[
            ("system", "be brief".into()),
            ("user", "hi".into()),
            ("assistant", "hey".into()),
            ("user", "how are you?".into()),
        ]);
        let c = l.observe("r3", 5_000, 6_000, chat_chain(&t3).as_deref(), None, None);
        assert_eq!((c.session_id.as_str(), c.parent_request_id), ("r3", None));
        // Content as parts hashes as the same text.
        let parts = json!({"messages": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "hello!"},
            {"role": "user", "content": [{"type": "text", "text": "how are you?"}, {"type": "image_url", "image_url": {"url": "x"}}]}
        ]});
        assert_eq!(chat_chain(parts.as_object().unwrap()), chat_chain(&t2));
        // Completions are not chat.
        assert_eq!(
            chat_chain(json!({"prompt": "x"}).as_object().unwrap()),
            None
        );
    }

    #[test]
    fn a_header_session_wins_and_old_answers_are_forgotten() {
        let mut l = Linker::new(1);
        let t1 = body(&[("user", "q1".into())]);
        let t2 = body(&[("user", "q2".into())]);
        let a = l.observe(
            "a",
            0,
            10,
            chat_chain(&t1).as_deref(),
            Some(TextHash::of("x")),
            Some("H"),
        );
        assert_eq!(a.session_id, "H");
        l.observe(
            "b",
            0,
            10,
            chat_chain(&t2).as_deref(),
            Some(TextHash::of("y")),
            None,
        );
        let t1b = body(&[
            ("user", "q1".into()),
            ("assistant", "x".into()),
            ("user", "more".into()),
        ]);
        let c = l.observe("c", 20, 30, chat_chain(&t1b).as_deref(), None, None);
        assert_eq!(c.parent_request_id, None, "a's answer was evicted by b's");
    }

    /// A streamed answer hashes as the whole answer trimmed, however it is split, so the
    /// observer never needs its text; inner whitespace still counts.
    #[test]
    fn text_hash_is_the_trimmed_text_in_any_split() {
        let text = "  \n Bonjour, ça va ?\n\n Très  bien.\t \n";
        let want = TextHash::of(text.trim());
        for a in 0..=text.len() {
            for b in a..=text.len() {
                if !(text.is_char_boundary(a) && text.is_char_boundary(b)) {
                    continue;
                }
                let mut h = TextHash::default();
                for piece in [&text[..a], &text[a..b], &text[b..]] {
                    h.push(piece);
                }
                assert_eq!(h.finish(), want, "split at {a}, {b}");
            }
        }
        assert_ne!(TextHash::of("Très bien."), TextHash::of("Très  bien."));
        assert_ne!(TextHash::of("ab"), TextHash::of("a b"));
        assert_eq!(TextHash::of(" \n "), TextHash::of(""));
    }

    #[test]
    fn the_answer_is_the_first_choices_content_only() {
        let mut h = TextHash::default();
        for chunk in [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Hel"}}, {"index": 1, "delta": {"content": "other"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "lo"}}]}),
            json!({"choices": [], "usage": {"completion_tokens": 2}}),
        ] {
            push_answer_text(&chunk, &mut h);
        }
        assert_eq!(h.finish(), TextHash::of("Hello"));
        let mut whole = TextHash::default();
        push_answer_text(
            &json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello\n"}}]}),
            &mut whole,
        );
        assert_eq!(whole.finish(), TextHash::of("Hello"));
        let mut completion = TextHash::default();
        push_answer_text(&json!({"choices": [{"text": " 42"}]}), &mut completion);
        assert_eq!(completion.finish(), TextHash::of("42"));
    }

    /// The same conversation replayed in a loop (one key, thousands of requests): each key
    /// keeps at most MAX_CANDIDATES, the linker its max_keys, and every repeat still links.
    #[test]
    fn identical_conversations_in_a_loop_stay_bounded() {
        let mut l = Linker::new(1_000);
        let t1 = body(&[("user", "ping".into())]);
        let t2 = body(&[
            ("user", "ping".into()),
            ("assistant", "pong".into()),
            ("user", "again".into()),
        ]);
        let (c1, c2) = (chat_chain(&t1).unwrap(), chat_chain(&t2).unwrap());
        let key = answer_key(&c1, TextHash::of("pong")).unwrap();
        for i in 0..5_000i64 {
            let t = i * 100;
            l.observe(
                &format!("a{i}"),
                t,
                t + 10,
                Some(&c1),
                Some(TextHash::of("pong")),
                None,
            );
            let b = l.observe(&format!("b{i}"), t + 20, t + 30, Some(&c2), None, None);
            assert_eq!(b.parent_request_id, Some(format!("a{i}")), "repeat {i}");
            assert_eq!(b.think_time_us, Some(10));
            assert!(l.index.get(&key).map_or(0, Vec::len) <= MAX_CANDIDATES);
            assert!(l.remembered() <= 1_000);
        }
    }

    /// The figure, on the linker alone: 200 interleaved conversations of 2–10 turns,
    /// some sharing a system prompt, some with identical first turns (answered identically, as
    /// a deterministic model would). `tests/integration/sessions.rs` sends the same shape
    /// through capture.
    #[test]
    fn synthetic_multi_turn_workload_links_at_least_98_percent() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let systems = ["You are a helpful assistant.", "Answer in French.", ""];
        struct Conv {
            msgs: Vec<(&'static str, String)>,
            turns: usize,
            done: usize,
            last: Option<String>,
            next_at: i64,
        }
        let mut convs: Vec<Conv> = (0..200)
            .map(|i| {
                let sys = systems[i % 3];
                let mut msgs = Vec::new();
                if !sys.is_empty() {
                    msgs.push(("system", sys.to_string()));
                }
                Conv {
                    msgs,
                    turns: rng.gen_range(2..=10),
                    done: 0,
                    last: None,
                    next_at: rng.gen_range(0..5_000_000),
                }
            })
            .collect();
        // Requests in flight: (end, conv, request id, chain, answer, arrival).
        let mut l = Linker::new(DEFAULT_MAX_KEYS);
        let mut now = 0i64;
        let (mut links, mut right) = (0usize, 0usize);
        let mut in_flight: Vec<(i64, usize, String, Vec<u64>, String, i64)> = Vec::new();
        let mut seq = 0;
        loop {
            // Send every turn that is due.
            let mut due: Vec<usize> = (0..convs.len())
                .filter(|&c| {
                    convs[c].done < convs[c].turns
                        && convs[c].next_at <= now
                        && convs[c].next_at >= 0
                })
                .collect();
            due.shuffle(&mut rng);
            for c in due {
                let conv = &mut convs[c];
                // Every 10th conversation opens with the same question as others.
                let q = if conv.done == 0 && c % 10 == 0 {
                    "What is the capital of France?".to_string()
                } else {
                    format!(
                        "question {} of conversation {c}: {}",
                        conv.done,
                        rng.gen::<u32>()
                    )
                };
                conv.msgs.push(("user", q.clone()));
                // A deterministic model: the answer depends on the prompt only.
                let chain = chat_chain(&body(&conv.msgs)).unwrap();
                let answer = format!("answer {:x}", chain.last().unwrap());
                let id = format!("req-{seq}");
                seq += 1;
                let end = now + rng.gen_range(50_000..2_000_000);
                in_flight.push((end, c, id, chain, answer, now));
                conv.next_at = -1; // waiting for the answer
            }
            // Finish what ends next.
            in_flight.sort_by_key(|x| -x.0);
            let Some((end, c, id, chain, answer, arrival)) = in_flight.pop() else {
                if convs.iter().all(|c| c.done >= c.turns) {
                    break;
                }
                now = convs
                    .iter()
                    .filter(|c| c.next_at >= 0)
                    .map(|c| c.next_at)
                    .min()
                    .unwrap();
                continue;
            };
            now = end;
            let link = l.observe(
                &id,
                arrival,
                end,
                Some(&chain),
                Some(TextHash::of(&answer)),
                None,
            );
            let conv = &mut convs[c];
            if conv.done > 0 {
                links += 1;
                right += usize::from(link.parent_request_id == conv.last);
            } else {
                assert_eq!(link.parent_request_id, None, "a first turn has no parent");
            }
            conv.done += 1;
            conv.last = Some(id);
            conv.msgs.push(("assistant", answer));
            conv.next_at = end + rng.gen_range(100_000..3_000_000);
        }
        assert!(links > 800, "{links} links");
        let share = right as f64 / links as f64;
        eprintln!("session linking: {right} of {links} parent links right ({share:.4})");
        assert!(
            share >= 0.98,
            "{right} of {links} parent links right ({share:.4})"
        );
    }
}
