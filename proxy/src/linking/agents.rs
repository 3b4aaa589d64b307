//! Agents linked at capture: the tools a request offers, the tool calls its response makes,
//! and the agent's loop as a graph (issue 42).
//!
//! An agent's loop is a chat conversation in which the model answers with tool calls
//! (`tool_calls[].id`), the agent runs them and sends the results back as `tool` messages
//! naming those ids (`tool_call_id`). So a request carrying tool results has an exact parent:
//! the request whose response made the calls. Capture remembers, for each finished response
//! that made tool calls, the hash of each call's id ([`Agents`], bounded), and links a request
//! to it by the id of its newest tool message: `parent_link = tool_call`, the parent's
//! session, and the tool's time as the think time (this arrival minus the end of that
//! response). That link wins over the chat-prefix match ([`crate::linking::sessions`]), which cannot
//! tell apart two agents whose histories hash the same (empty answers with tool calls).
//!
//! Sub-agents: a conversation that opens (no assistant or tool message, no parent by either
//! rule) while another request's tool call is pending (its response made the call, and no
//! request has carried a result for that response's calls yet), from the same client, and
//! whose first user message is exactly a string value of that call's `arguments` (a `task`
//! tool's `prompt`), is that request's sub-agent: `parent_link = subagent`, in the parent's
//! session. "The same client" is the peer IP address with the request's `Authorization`,
//! `x-api-key` or `api-key` header ([`client_key`]; hashed, never kept). The arguments'
//! string values of at least [`MIN_DERIVED`] bytes (trimmed) are hashed when the stream ends
//! ([`CallsSeen::finish`]); no text is kept.
//!
//! What cannot be linked exactly: a sub-agent whose first message wraps or rewrites the
//! prompt it was given (only equality of the trimmed text is tested), a sub-agent of another
//! client (another API key, another machine), one spawned by a call whose arguments were over
//! [`ARGS_CAP`] bytes, and two pending calls from one client with the same prompt (the
//! sub-agent goes to the most recently finished call not yet used, as the chat-prefix rule
//! guesses). Legacy `function_call` answers carry no id: they are counted, never linked.
//!
//! Memory: the ids and argument hashes of the last [`DEFAULT_MAX_REQUESTS`] responses that
//! made tool calls (a few hundred bytes each).

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::{Map, Value};
use trace_format::fleet::LinkKeys;
use trace_format::keyed::{keyed_name, HashKey};
use trace_format::{ParentLink, TraceRecord};
use wire::sse::{ToolCallPiece, Whole};

use crate::linking::bounded::Recent;
use crate::linking::responses::ResponseIds;
use crate::linking::sessions::{content_hash, ChatKeys, Linker, Parent, TextHash};
use crate::prefix::{fnv, FNV_OFFSET};

/// Bytes of one call's arguments kept while it streams, to hash its string values at the
/// end; a call with more is counted and linked by id, never to a sub-agent.
pub const ARGS_CAP: usize = 64 * 1024;

/// Shortest string value of a call's arguments (trimmed, bytes) that a sub-agent's first
/// message is matched against: shorter ones (`"general-purpose"` is 15) are too common to
/// say anything.
pub const MIN_DERIVED: usize = 8;

/// String values hashed per call.
pub const MAX_STRINGS: usize = 16;

/// Calls kept per response (more are counted, not named or linked).
pub const MAX_CALLS: usize = 256;

/// Responses with tool calls remembered by default.
pub const DEFAULT_MAX_REQUESTS: usize = 100_000;

/// Requests remembered per call id or argument hash (an id reused by every response of a
/// server that numbers its calls `call_0`, `call_1`…: the most recent ones).
pub const MAX_PER_KEY: usize = 32;

/// The stable hash of an id or a name.
fn hash_str(s: &str) -> u64 {
    fnv(FNV_OFFSET, s.as_bytes())
}

/// How the trace names tools, by its privacy grade.
#[derive(Debug, Clone, Copy)]
pub enum ToolNaming<'a> {
    /// Not at all (`perf`): the tool columns hold counts only.
    Omit,
    /// `h:` and the 16 hex digits of the name's keyed hash (`hashes`).
    Keyed(&'a HashKey),
    /// As sent (`full`).
    Plain,
}

/// A tool's name as the trace records it under `naming` (None: not recorded).
pub fn tool_name(name: &str, naming: &ToolNaming<'_>) -> Option<String> {
    match naming {
        ToolNaming::Omit => None,
        ToolNaming::Keyed(k) => Some(keyed_name(k.hash_bytes(name.as_bytes()))),
        ToolNaming::Plain => Some(name.to_string()),
    }
}

/// Who sent a request, for sub-agent linking: the peer address and the request's API
/// credentials (`Authorization`, `x-api-key`, `api-key`), hashed together.
pub fn client_key(peer: Option<IpAddr>, headers: &http::HeaderMap) -> u64 {
    let mut h = FNV_OFFSET;
    match peer {
        Some(IpAddr::V4(a)) => h = fnv(h, &a.octets()),
        Some(IpAddr::V6(a)) => h = fnv(h, &a.octets()),
        None => {}
    }
    for name in ["authorization", "x-api-key", "api-key"] {
        for v in headers.get_all(name) {
            h = fnv(h, name.as_bytes());
            h = fnv(h, v.as_bytes());
        }
    }
    h
}

/// What agent linking and the tool columns need of a request's body, read on a prompt
/// runner.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestTools {
    /// Names of the tools offered (`tools[].function.name`, else the legacy
    /// `functions[].name`; `""` for one without), in order.
    pub offered: Vec<String>,
    /// The hash of the `tool_call_id` that decides the parent: the newest tool message's
    /// (else the ids of an assistant message's `tool_calls` at the end), when no assistant
    /// answer follows it.
    pub results_for: Option<u64>,
    /// The [`TextHash`] of the first user message, when the conversation opens here (no
    /// assistant or tool message).
    pub opening: Option<u64>,
    /// The hash ([`crate::linking::responses::id_hash`]) of its `previous_response_id`
    /// (Responses): the response whose conversation it continues.
    pub previous_response: Option<u64>,
}

/// Reads [`RequestTools`] from a request body (None when it is not a JSON object's).
pub fn request_tools(body: &Map<String, Value>) -> RequestTools {
    let tools = body
        .get("tools")
        .and_then(Value::as_array)
        .map(|a| (a, true))
        .or_else(|| {
            body.get("functions")
                .and_then(Value::as_array)
                .map(|a| (a, false))
        });
    let offered = tools.map_or_else(Vec::new, |(a, nested)| {
        a.iter()
            .map(|t| {
                let name = if nested {
                    t.pointer("/function/name").or_else(|| t.get("name"))
                } else {
                    t.get("name")
                };
                name.and_then(Value::as_str).unwrap_or("").to_string()
            })
            .collect()
    });
    let mut r = RequestTools {
        offered,
        previous_response: body
            .get("previous_response_id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(crate::linking::responses::id_hash),
        ..Default::default()
    };
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return r;
    };
    for m in messages.iter().rev() {
        match m.get("role").and_then(Value::as_str) {
            Some("tool") => {
                r.results_for = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(hash_str);
                break;
            }
            Some("assistant") => {
                r.results_for = m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .and_then(|c| c.last())
                    .and_then(|c| c.get("id"))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(hash_str);
                break;
            }
            _ => {}
        }
    }
    let answered = messages.iter().any(|m| {
        matches!(
            m.get("role").and_then(Value::as_str),
            Some("assistant" | "tool" | "function")
        )
    });
    if !answered {
        r.opening = messages
            .iter()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .map(|m| m.get("content").map_or(TextHash::of(""), content_hash));
    }
    r
}

/// One tool call of a response, as it streams.
#[derive(Debug, Default)]
struct CallAcc {
    index: Option<u64>,
    id: String,
    name: String,
    args: String,
    /// The arguments passed [`ARGS_CAP`]: not kept.
    args_over: bool,
}

/// The tool calls of one response, gathered as they stream ([`CallsSeen::piece`]) or read
/// from a whole response ([`CallsSeen::of_response`]).
#[derive(Debug, Default)]
pub struct CallsSeen {
    calls: Vec<CallAcc>,
    /// Calls past [`MAX_CALLS`]: counted only.
    more: usize,
}

/// A finished tool call: its name, the hash of its id, and the hashes of its arguments'
/// string values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Call {
    /// `function.name` (as sent).
    pub name: String,
    /// The hash of its `id` (None when it had none).
    pub id: Option<u64>,
    /// [`TextHash`]es of its arguments' string values of at least [`MIN_DERIVED`] bytes.
    pub strings: Vec<u64>,
}

/// The tool calls a response made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResponseCalls {
    /// Each call, in order.
    pub calls: Vec<Call>,
    /// Calls made in all (`calls` holds at most [`MAX_CALLS`]).
    pub count: usize,
}

impl CallsSeen {
    /// One streamed piece: the call it continues (by `index`; without one, the last call
    /// unless the piece names another id), or a new call.
    pub fn piece(&mut self, p: ToolCallPiece<'_>) {
        let at = match p.index {
            Some(i) => self.calls.iter().rposition(|c| c.index == Some(i)),
            None => self.calls.len().checked_sub(1).filter(|&l| {
                p.id.is_empty() || self.calls[l].id.is_empty() || self.calls[l].id == p.id
            }),
        };
        let c = match at {
            Some(i) => &mut self.calls[i],
            None if self.calls.len() >= MAX_CALLS => {
                self.more += 1;
                return;
            }
            None => {
                self.calls.push(CallAcc {
                    index: p.index,
                    ..Default::default()
                });
                let last = self.calls.len() - 1;
                &mut self.calls[last]
            }
        };
        if c.id.is_empty() {
            c.id.push_str(p.id);
        }
        // The name comes whole in the first piece; a server that repeats it in every piece
        // is not appended to itself.
        if !p.name.is_empty() && p.name != c.name {
            c.name.push_str(p.name);
        }
        if !c.args_over {
            if c.args.len() + p.arguments.len() > ARGS_CAP {
                c.args_over = true;
                c.args = String::new();
            } else {
                c.args.push_str(p.arguments);
            }
        }
    }

    /// The calls of a whole (non-streamed) response, as [`wire::sse::read_whole`] read them
    /// (chat's first choice's `message.tool_calls`, Responses' `function_call` items,
    /// Messages' `tool_use` blocks).
    pub fn of_whole(w: &Whole) -> CallsSeen {
        let mut seen = CallsSeen::default();
        for (i, call) in w.calls.iter().enumerate() {
            seen.piece(ToolCallPiece {
                index: Some(i as u64),
                id: &call.id,
                name: &call.name,
                arguments: &call.arguments,
            });
        }
        seen
    }

    /// The calls made, their arguments' string values hashed (the text is dropped).
    pub fn finish(self) -> ResponseCalls {
        let count = self.calls.len() + self.more;
        let calls = self
            .calls
            .into_iter()
            .map(|c| {
                let mut strings = Vec::new();
                if !c.args_over {
                    if let Ok(v) = serde_json::from_str::<Value>(&c.args) {
                        string_values(&v, &mut strings);
                    }
                }
                Call {
                    name: c.name,
                    id: (!c.id.is_empty()).then(|| hash_str(&c.id)),
                    strings,
                }
            })
            .collect();
        ResponseCalls { calls, count }
    }
}

/// The [`TextHash`]es of `v`'s string values (not keys) of at least [`MIN_DERIVED`] bytes
/// trimmed, depth first, at most [`MAX_STRINGS`].
fn string_values(v: &Value, out: &mut Vec<u64>) {
    if out.len() >= MAX_STRINGS {
        return;
    }
    match v {
        Value::String(s) if s.trim().len() >= MIN_DERIVED => out.push(TextHash::of(s)),
        Value::Array(a) => a.iter().for_each(|x| string_values(x, out)),
        Value::Object(o) => o.values().for_each(|x| string_values(x, out)),
        _ => {}
    }
}

/// What capture saw of a response, for linking: handed with the row to the writer thread.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The [`TextHash`] of the answer's content.
    pub(crate) answer: Option<u64>,
    /// The tool calls it made (None when the body was not observed for them).
    pub(crate) calls: Option<ResponseCalls>,
    /// [`client_key`] of its request.
    pub(crate) client: u64,
    /// The hash ([`crate::linking::responses::id_hash`]) of its response's id, when a
    /// later turn can name it (Responses' `previous_response_id`).
    pub(crate) response_id: Option<u64>,
}

/// A remembered response that made tool calls.
#[derive(Debug)]
struct Made {
    request_id: String,
    session_id: String,
    end_us: i64,
    client: u64,
    /// Call id hashes and argument string hashes it is indexed under.
    ids: Vec<u64>,
    strings: Vec<u64>,
    /// The arrival of the first request that carried results of its calls.
    resolved_at: Option<i64>,
    /// Argument hashes a sub-agent was already linked by.
    spawned: Vec<u64>,
}

/// The responses that made tool calls, by call id and by argument string: the writer
/// thread's memory for agent linking. Requests are given in the order they finish.
#[derive(Debug)]
pub struct Agents {
    /// The responses that made calls, by sequence number: the last `max`.
    made: Recent<u64, Made>,
    by_id: HashMap<u64, Vec<u64>>,
    by_string: HashMap<u64, Vec<u64>>,
    seq: u64,
}

fn index(map: &mut HashMap<u64, Vec<u64>>, key: u64, seq: u64) {
    let v = map.entry(key).or_default();
    if !v.contains(&seq) {
        v.push(seq);
        if v.len() > MAX_PER_KEY {
            v.remove(0);
        }
    }
}

fn unindex(map: &mut HashMap<u64, Vec<u64>>, key: u64, seq: u64) {
    if let Some(v) = map.get_mut(&key) {
        v.retain(|&s| s != seq);
        if v.is_empty() {
            map.remove(&key);
        }
    }
}

impl Agents {
    /// Remembers the last `max` responses that made tool calls.
    pub fn new(max: usize) -> Agents {
        Agents {
            made: Recent::new(max),
            by_id: HashMap::new(),
            by_string: HashMap::new(),
            seq: 0,
        }
    }

    /// Responses remembered now (at most `max`).
    pub fn remembered(&self) -> usize {
        self.made.len()
    }

    /// The request whose response made the call `id` (hashed), for a request arriving at
    /// `arrival_us` from `client` with its results: one that had ended by then, from the
    /// same client, most recently ended first. It no longer has a call pending.
    pub fn tool_parent(&mut self, id: u64, arrival_us: i64, client: u64) -> Option<Parent> {
        let seqs = self.by_id.get(&id)?;
        let best = seqs
            .iter()
            .copied()
            .filter_map(|s| Some((s, self.made.get(&s)?)))
            .max_by_key(|(_, m)| (m.end_us <= arrival_us, m.client == client, m.end_us))
            .map(|(s, _)| s)?;
        let m = self.made.get_mut(&best)?;
        m.resolved_at = Some(m.resolved_at.map_or(arrival_us, |r| r.min(arrival_us)));
        Some(Parent {
            request_id: m.request_id.clone(),
            session_id: m.session_id.clone(),
            end_us: m.end_us,
            how: ParentLink::ToolCall,
        })
    }

    /// The request whose pending tool call spawned a conversation opening with a user
    /// message of hash `first` at `arrival_us` from `client` (see the module).
    pub fn subagent_parent(&mut self, first: u64, arrival_us: i64, client: u64) -> Option<Parent> {
        let seqs = self.by_string.get(&first)?;
        let best = seqs
            .iter()
            .copied()
            .filter(|s| {
                self.made.get(s).is_some_and(|m| {
                    m.client == client
                        && m.end_us <= arrival_us
                        && m.resolved_at.is_none_or(|r| r > arrival_us)
                })
            })
            .filter_map(|s| Some((s, self.made.get(&s)?)))
            .max_by_key(|(_, m)| (!m.spawned.contains(&first), m.end_us))
            .map(|(s, _)| s)?;
        let m = self.made.get_mut(&best)?;
        m.spawned.push(first);
        Some(Parent {
            request_id: m.request_id.clone(),
            session_id: m.session_id.clone(),
            end_us: m.end_us,
            how: ParentLink::Subagent,
        })
    }

    /// Remembers a finished response's tool calls, by the hashes of their `ids` and of
    /// their arguments' `strings` ([`LinkKeys::calls`], [`LinkKeys::args`]; nothing when it
    /// made none with an id or a matchable argument).
    pub fn remember(
        &mut self,
        request_id: &str,
        session_id: &str,
        end_us: i64,
        client: u64,
        (ids, strings): (&[u64], &[u64]),
    ) {
        let ids = ids.to_vec();
        let mut strings = strings.to_vec();
        strings.sort_unstable();
        strings.dedup();
        if ids.is_empty() && strings.is_empty() {
            return;
        }
        self.seq += 1;
        let seq = self.seq;
        for &k in &ids {
            index(&mut self.by_id, k, seq);
        }
        for &k in &strings {
            index(&mut self.by_string, k, seq);
        }
        let forgotten = self.made.insert(
            seq,
            Made {
                request_id: request_id.to_string(),
                session_id: session_id.to_string(),
                end_us,
                client,
                ids,
                strings,
                resolved_at: None,
                spawned: Vec::new(),
            },
        );
        for (old, m) in forgotten {
            for k in m.ids {
                unindex(&mut self.by_id, k, old);
            }
            for k in m.strings {
                unindex(&mut self.by_string, k, old);
            }
        }
    }
}

/// The link keys of a request ([`LinkKeys`]: what [`Links::link`] looks up and leaves),
/// each hashed by `keyed` (the trace's key, so captures under one key agree): its chat keys,
/// what it carries ([`RequestTools`]) and what its response made ([`Seen`]). Empty for a row
/// that is neither chat-shaped nor names a `previous_response_id`.
pub(crate) fn link_keys(
    chat: Option<&ChatKeys>,
    req: Option<&RequestTools>,
    seen: &Seen,
    keyed: impl Fn(u64) -> u64,
) -> LinkKeys {
    let previous = req.and_then(|r| r.previous_response);
    if chat.is_none() && previous.is_none() {
        return LinkKeys::default();
    }
    let calls = seen.calls.as_ref();
    LinkKeys {
        chat: chat.map(|c| c.lookups.iter().map(|&h| keyed(h)).collect()),
        answer: chat.zip(seen.answer).map(|(c, a)| keyed(c.answer_key(a))),
        calls: calls.map(|c| c.calls.iter().filter_map(|c| c.id).map(&keyed).collect()),
        args: calls.map(|c| {
            let mut v: Vec<u64> = c
                .calls
                .iter()
                .flat_map(|c| c.strings.iter().map(|&h| keyed(h)))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        }),
        result: req.and_then(|r| r.results_for).map(&keyed),
        opening: req.and_then(|r| r.opening).map(&keyed),
        client: Some(keyed(seen.client)),
        response: seen.response_id.map(&keyed),
        previous_response: previous.map(&keyed),
    }
}

/// Session, agent and response-id linking together: on capture's writer thread, and in the
/// fleet pass over the rows of several captures ([`crate::linking::fleet`]), from the same
/// keys ([`LinkKeys`]).
#[derive(Debug)]
pub struct Links {
    pub(crate) sessions: Linker,
    pub(crate) agents: Agents,
    pub(crate) responses: ResponseIds,
}

impl Default for Links {
    /// Each linker remembering its default.
    fn default() -> Links {
        Links {
            sessions: Linker::new(crate::linking::sessions::DEFAULT_MAX_KEYS),
            agents: Agents::new(DEFAULT_MAX_REQUESTS),
            responses: ResponseIds::new(crate::linking::responses::DEFAULT_MAX_RESPONSES),
        }
    }
}

impl Links {
    /// Links a row by its keys (`keys.chat`: None for a row that is not chat-shaped; rows
    /// without chat keys and without a `previous_response_id` keep their header session, if
    /// any, and no parent) and remembers what its response leaves for later rows: its
    /// answer (only a complete one can be continued), its tool calls and its response id.
    /// The parent: by `previous_response_id`, else by tool call, else by chat prefix, else
    /// as a sub-agent. `rec.session_id` on the way in is the session its request header
    /// named (None: none), which wins.
    pub fn link(&mut self, rec: &mut TraceRecord, keys: &LinkKeys) {
        let previous = keys
            .previous_response
            .and_then(|id| self.responses.parent(id));
        if keys.chat.is_none() && previous.is_none() {
            return;
        }
        let client = keys.client.unwrap_or(0);
        let arrival = rec.arrival_time_us;
        let end_us = arrival.saturating_add(rec.e2el_us.unwrap_or(0).max(0));
        let parent = previous.or_else(|| {
            let lookups = keys.chat.as_deref()?;
            let tool = keys
                .result
                .and_then(|id| self.agents.tool_parent(id, arrival, client));
            let parent = match tool {
                Some(p) => {
                    self.sessions.mark_continued(lookups, &p.request_id);
                    Some(p)
                }
                None => self.sessions.find_parent(lookups, arrival),
            };
            parent.or_else(|| self.agents.subagent_parent(keys.opening?, arrival, client))
        });
        let session_id = match (&rec.session_id, &parent) {
            (Some(s), _) => s.clone(),
            (None, Some(p)) => p.session_id.clone(),
            (None, None) => rec.request_id.clone(),
        };
        if rec.outcome == trace_format::Outcome::Ok {
            if let (Some(a), Some(_)) = (keys.answer, &keys.chat) {
                self.sessions
                    .remember_answer(&rec.request_id, &session_id, end_us, a);
            }
            if let Some(id) = keys.response {
                self.responses
                    .remember(id, &rec.request_id, &session_id, end_us);
            }
            if let Some(ids) = &keys.calls {
                let args = keys.args.as_deref().unwrap_or(&[]);
                self.agents
                    .remember(&rec.request_id, &session_id, end_us, client, (ids, args));
            }
        }
        rec.think_time_us = parent
            .as_ref()
            .map(|p| arrival.saturating_sub(p.end_us).max(0));
        rec.parent_link = parent.as_ref().map(|p| p.how);
        rec.parent_request_id = parent.map(|p| p.request_id);
        rec.session_id = Some(session_id);
    }
}

/// Fills the tool columns: what the request offered (when its body was read) and the calls
/// its response made (when observed), named by [`tool_name`].
pub(crate) fn fill_tools(
    rec: &mut TraceRecord,
    req: Option<&RequestTools>,
    calls: Option<&ResponseCalls>,
    naming: &ToolNaming<'_>,
) {
    // Under `perf` not even an empty list: the column is null.
    let names = |names: &mut dyn Iterator<Item = &str>| match naming {
        ToolNaming::Omit => None,
        _ => names.map(|n| tool_name(n, naming)).collect(),
    };
    if let Some(r) = req {
        rec.tools_offered = Some(r.offered.len().min(i32::MAX as usize) as i32);
        rec.tool_names = names(&mut r.offered.iter().map(String::as_str));
    }
    if let Some(c) = calls {
        rec.tool_calls = Some(c.count.min(i32::MAX as usize) as i32);
        rec.tool_call_names = names(&mut c.calls.iter().map(|c| c.name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linking::sessions::{chat_chain, chat_keys};
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn calls(list: &[(&str, &str, &str)]) -> ResponseCalls {
        let tc: Vec<Value> = list
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": tc}}]});
        let w = wire::sse::read_whole(wire::api::Api::Chat, body.to_string().as_bytes()).unwrap();
        CallsSeen::of_whole(&w).finish()
    }

    #[test]
    fn a_request_says_what_it_offers_and_whose_calls_it_answers() {
        let r = request_tools(&obj(json!({
            "tools": [
                {"type": "function", "function": {"name": "read_file", "parameters": {}}},
                {"type": "function", "function": {"name": "task"}},
                {"type": "web_search"}
            ],
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
                {"role": "tool", "tool_call_id": "c2", "content": "r2"},
                {"role": "tool", "tool_call_id": "c1", "content": "r1"},
                {"role": "user", "content": "and also"}
            ]
        })));
        assert_eq!(r.offered, vec!["read_file", "task", ""]);
        assert_eq!(
            r.results_for,
            Some(hash_str("c1")),
            "the newest tool message decides"
        );
        assert_eq!(r.opening, None, "not an opening");
        // The results were answered already: the chat prefix decides.
        let r = request_tools(&obj(json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "more"}
        ]})));
        assert_eq!(r.results_for, None);
        // An assistant message with calls and no results yet.
        let r = request_tools(&obj(json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c9"}]}
        ]})));
        assert_eq!(r.results_for, Some(hash_str("c9")));
        // Legacy functions; an opening with its first user message hashed as linking does.
        let r = request_tools(&obj(json!({
            "functions": [{"name": "f"}, {"name": "g"}],
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": " Fix the parser bug \n"}]}
            ]
        })));
        assert_eq!(r.offered, vec!["f", "g"]);
        assert_eq!(r.opening, Some(TextHash::of("Fix the parser bug")));
        let none = request_tools(&obj(json!({"prompt": "x"})));
        assert_eq!(none, RequestTools::default());
        assert_eq!(
            tool_name("task", &ToolNaming::Plain).as_deref(),
            Some("task")
        );
        let key = HashKey::random();
        let h = tool_name("task", &ToolNaming::Keyed(&key)).unwrap();
        assert_eq!(h, format!("h:{:016x}", key.hash_bytes(b"task")));
        assert_eq!(h.len(), 18);
        assert_eq!(tool_name("task", &ToolNaming::Omit), None);
    }

    /// Streamed through the observer, split anywhere: each call's id and name from its
    /// first piece, its arguments from the pieces after, the strings of its arguments
    /// hashed at the end; the same calls as the whole response gives.
    #[test]
    fn streamed_calls_are_gathered_by_index_in_any_split() {
        use crate::recording::observe::{StreamObserver, Strip};
        use bytes::Bytes;
        use std::collections::VecDeque;
        let args = r#"{"description":"look","prompt":"Find where the \"parser\" fails","n":3}"#;
        let mut events = vec![
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"task","arguments":""}}]}}]}),
        ];
        for piece in [&args[..10], &args[10..31], &args[31..]] {
            events.push(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":piece}}]}}]}));
        }
        events.push(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"read","arguments":"{\"path\":\"src/lib.rs\"}"}}]}}]}));
        events.push(json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}));
        let mut sse = String::new();
        for e in &events {
            sse.push_str(&format!("data: {e}\n\n"));
        }
        sse.push_str("data: [DONE]\n\n");
        let want = calls(&[
            ("call_a", "task", args),
            ("call_b", "read", r#"{"path":"src/lib.rs"}"#),
        ]);
        assert_eq!(want.count, 2);
        assert_eq!(
            want.calls[0].strings,
            vec![TextHash::of("Find where the \"parser\" fails")]
        );
        assert_eq!(want.calls[1].strings, vec![TextHash::of("src/lib.rs")]);
        let b = sse.as_bytes();
        for cut in (0..b.len()).step_by(7) {
            let mut o = StreamObserver::new(Strip::default(), 8);
            o.keep_tool_calls();
            let mut q = VecDeque::new();
            o.observe(1, Bytes::copy_from_slice(&b[..cut]), &mut q);
            o.observe(2, Bytes::copy_from_slice(&b[cut..]), &mut q);
            assert_eq!(o.calls.take().unwrap().finish(), want, "cut at {cut}");
        }
        // Pieces without an index: a new id is a new call, none continues the last.
        let mut s = CallsSeen::default();
        for (id, name, a) in [
            ("x", "f", "{"),
            ("", "", "}"),
            ("y", "g", "[]"),
            ("y", "g", ""),
        ] {
            s.piece(ToolCallPiece {
                index: None,
                id,
                name,
                arguments: a,
            });
        }
        let f = s.finish();
        assert_eq!(f.count, 2);
        assert_eq!(
            f.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["f", "g"],
            "a name repeated in every piece is not doubled"
        );
        // Arguments over the cap: counted and linked by id, no strings.
        let mut s = CallsSeen::default();
        let big = format!("{{\"prompt\":\"{}\"}}", "x".repeat(ARGS_CAP));
        s.piece(ToolCallPiece {
            index: Some(0),
            id: "z",
            name: "task",
            arguments: &big,
        });
        let f = s.finish();
        assert_eq!(
            (f.count, f.calls[0].id.is_some(), f.calls[0].strings.len()),
            (1, true, 0)
        );
    }

    fn links() -> Links {
        Links {
            sessions: Linker::new(1_000),
            agents: Agents::new(1_000),
            responses: ResponseIds::new(1_000),
        }
    }

    fn chat_row(id: &str, at: i64, e2el: i64) -> TraceRecord {
        let mut r = TraceRecord::new(id, at, "/v1/chat/completions");
        r.e2el_us = Some(e2el);
        r
    }

    /// Feeds one finished request to `l`: `messages` its body, `made` the calls its
    /// response made, `client` who sent it.
    fn feed(
        l: &mut Links,
        rec: &mut TraceRecord,
        messages: &[Value],
        made: &[(&str, &str, &str)],
        client: u64,
    ) {
        let body = obj(json!({"messages": messages}));
        let req = request_tools(&body);
        let seen = Seen {
            answer: Some(TextHash::of("")),
            calls: Some(calls(made)),
            client,
            response_id: None,
        };
        l.link(
            rec,
            &link_keys(chat_keys(&body).as_ref(), Some(&req), &seen, |h| h),
        );
    }

    /// Two agents with identical histories (same system prompt, same task, answers that
    /// are only tool calls, so the same answer hash): the chat prefix cannot tell them
    /// apart, the call ids do, and the tool's time is the think time.
    #[test]
    fn tool_results_link_to_the_request_that_made_the_calls_not_a_twin() {
        let mut l = links();
        let opening = vec![
            json!({"role": "system", "content": "You are an agent."}),
            json!({"role": "user", "content": "Fix the build."}),
        ];
        let mut a1 = chat_row("a1", 0, 100);
        feed(&mut l, &mut a1, &opening, &[("ca", "read", "{}")], 1);
        let mut b1 = chat_row("b1", 10, 150);
        feed(&mut l, &mut b1, &opening, &[("cb", "read", "{}")], 1);
        assert_eq!(
            (a1.session_id.as_deref(), a1.parent_link),
            (Some("a1"), None)
        );
        let next = |id: &str| {
            let mut m = opening.clone();
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]}));
            m.push(json!({"role": "tool", "tool_call_id": id, "content": "same result"}));
            m
        };
        // b's results come first: the chat prefix alone would give it a1 (the most recently
        // finished candidate is b1, but take a's results arriving first to see the guess).
        let mut a2 = chat_row("a2", 400, 50);
        feed(&mut l, &mut a2, &next("ca"), &[], 1);
        let mut b2 = chat_row("b2", 500, 50);
        feed(&mut l, &mut b2, &next("cb"), &[], 1);
        assert_eq!(a2.parent_request_id.as_deref(), Some("a1"));
        assert_eq!(a2.parent_link, Some(ParentLink::ToolCall));
        assert_eq!(a2.session_id.as_deref(), Some("a1"));
        assert_eq!(
            a2.think_time_us,
            Some(300),
            "arrival 400 − end 100: the tool's time"
        );
        assert_eq!(b2.parent_request_id.as_deref(), Some("b1"));
        assert_eq!(
            (b2.session_id.as_deref(), b2.think_time_us),
            (Some("b1"), Some(340))
        );
        // Without the tool-call rule both would have gone by prefix: b1 then a1 (a swap).
        let mut plain = Linker::new(100);
        for (id, at, end) in [("a1", 0, 100), ("b1", 10, 160)] {
            plain.observe(
                id,
                at,
                end,
                chat_chain(&obj(json!({"messages": opening}))).as_deref(),
                Some(TextHash::of("")),
                None,
            );
        }
        let guess = plain.observe(
            "a2",
            400,
            450,
            chat_chain(&obj(json!({"messages": next("ca")}))).as_deref(),
            None,
            None,
        );
        assert_eq!(
            guess.parent_request_id.as_deref(),
            Some("b1"),
            "the prefix guess is wrong here"
        );
        // A header session stays; the parent is still the call's.
        let mut h = chat_row("h", 600, 10);
        h.session_id = Some("H".into());
        feed(&mut l, &mut h, &next("ca"), &[], 1);
        assert_eq!(
            (h.session_id.as_deref(), h.parent_request_id.as_deref()),
            (Some("H"), Some("a1"))
        );
        // A later turn after the final answer links by chat prefix.
        let mut fin = next("cb");
        let mut b3 = chat_row("b3", 700, 10);
        feed(&mut l, &mut b3, &fin, &[], 1);
        fin.push(json!({"role": "assistant", "content": ""}));
        fin.push(json!({"role": "user", "content": "thanks, now test it"}));
        let mut b4 = chat_row("b4", 800, 10);
        feed(&mut l, &mut b4, &fin, &[], 1);
        assert_eq!(
            (b4.parent_request_id.as_deref(), b4.parent_link),
            (Some("b3"), Some(ParentLink::ChatPrefix))
        );
    }

    /// A sub-agent opens while its parent's task call is pending, from the same client,
    /// with the call's prompt as its first message: linked. Another client, a call already
    /// answered, or another text: not.
    #[test]
    fn a_subagent_links_to_the_pending_call_whose_prompt_it_opens_with() {
        let mut l = links();
        let prompt = "Find every caller of parse_header and list them";
        let args =
            json!({"description": "callers", "prompt": prompt, "subagent_type": "general-purpose"})
                .to_string();
        let main = vec![json!({"role": "user", "content": "Refactor the header parser."})];
        let mut p = chat_row("p", 0, 100);
        feed(
            &mut l,
            &mut p,
            &main,
            &[("t1", "task", &args), ("r1", "read", "{\"path\":\"a.rs\"}")],
            7,
        );
        let sub = |text: &str| {
            vec![
                json!({"role": "system", "content": "You are a sub-agent."}),
                json!({"role": "user", "content": text}),
            ]
        };
        let mut other_client = chat_row("x", 150, 10);
        feed(&mut l, &mut other_client, &sub(prompt), &[], 8);
        assert_eq!(other_client.parent_request_id, None, "another client");
        let mut wrapped = chat_row("w", 160, 10);
        feed(
            &mut l,
            &mut wrapped,
            &sub(&format!("Task: {prompt}")),
            &[],
            7,
        );
        assert_eq!(
            wrapped.parent_request_id, None,
            "a rewrapped prompt is not matched"
        );
        let mut s1 = chat_row("s1", 200, 10);
        feed(
            &mut l,
            &mut s1,
            &sub(&format!("  {prompt}\n")),
            &[("s1c", "grep", "{}")],
            7,
        );
        assert_eq!(s1.parent_request_id.as_deref(), Some("p"));
        assert_eq!(s1.parent_link, Some(ParentLink::Subagent));
        assert_eq!(
            (s1.session_id.as_deref(), s1.think_time_us),
            (Some("p"), Some(100))
        );
        // The sub-agent's own loop links by its own calls, in the same session.
        let mut s2m = sub(prompt);
        s2m.push(json!({"role": "assistant", "tool_calls": [{"id": "s1c"}]}));
        s2m.push(json!({"role": "tool", "tool_call_id": "s1c", "content": "3 callers"}));
        let mut s2 = chat_row("s2", 300, 10);
        feed(&mut l, &mut s2, &s2m, &[], 7);
        assert_eq!(
            (s2.parent_request_id.as_deref(), s2.session_id.as_deref()),
            (Some("s1"), Some("p"))
        );
        // The main agent gets its results back: the call is no longer pending.
        let mut m2m = main.clone();
        m2m.push(json!({"role": "assistant", "tool_calls": [{"id": "t1"}, {"id": "r1"}]}));
        m2m.push(json!({"role": "tool", "tool_call_id": "t1", "content": "done"}));
        m2m.push(json!({"role": "tool", "tool_call_id": "r1", "content": "fn x"}));
        let mut m2 = chat_row("m2", 400, 10);
        feed(&mut l, &mut m2, &m2m, &[], 7);
        assert_eq!(m2.parent_request_id.as_deref(), Some("p"));
        let mut late = chat_row("late", 500, 10);
        feed(&mut l, &mut late, &sub(prompt), &[], 7);
        assert_eq!(late.parent_request_id, None, "the call was answered at 400");
        assert_eq!(late.session_id.as_deref(), Some("late"));
    }

    /// The tool columns: counts always, names kept under `--privacy full`, keyed hashes
    /// under `hashes` (equal under one key, not under another), none under `perf`; nothing
    /// for what was not read (a shed prompt, an unobserved body).
    #[test]
    fn tool_columns_name_or_hash() {
        let req = request_tools(&obj(json!({"tools": [
            {"type": "function", "function": {"name": "read_file"}},
            {"type": "function", "function": {"name": "task"}}
        ], "messages": [{"role": "user", "content": "x"}]})));
        let made = calls(&[
            ("a", "task", "{}"),
            ("b", "task", "{}"),
            ("c", "read_file", "{}"),
        ]);
        let mut full = chat_row("r", 0, 1);
        fill_tools(&mut full, Some(&req), Some(&made), &ToolNaming::Plain);
        assert_eq!((full.tools_offered, full.tool_calls), (Some(2), Some(3)));
        assert_eq!(
            full.tool_names,
            Some(vec!["read_file".to_string(), "task".into()])
        );
        assert_eq!(
            full.tool_call_names,
            Some(vec!["task".to_string(), "task".into(), "read_file".into()])
        );
        let mut hashed = chat_row("r", 0, 1);
        let (key, other) = (HashKey::random(), HashKey::random());
        let keyed = ToolNaming::Keyed(&key);
        fill_tools(&mut hashed, Some(&req), Some(&made), &keyed);
        let h = |n: &str| tool_name(n, &keyed).unwrap();
        assert_eq!(hashed.tool_names, Some(vec![h("read_file"), h("task")]));
        let unkeyed = format!("h:{:016x}", hash_str("read_file"));
        assert_ne!(h("read_file"), unkeyed);
        assert_ne!(
            tool_name("read_file", &ToolNaming::Keyed(&other)).unwrap(),
            h("read_file")
        );
        let mut perf = chat_row("r", 0, 1);
        fill_tools(&mut perf, Some(&req), Some(&made), &ToolNaming::Omit);
        assert_eq!(
            (
                perf.tools_offered,
                perf.tool_calls,
                perf.tool_names,
                perf.tool_call_names
            ),
            (Some(2), Some(3), None, None)
        );
        let mut perf = chat_row("r", 0, 1);
        let nothing = (RequestTools::default(), ResponseCalls::default());
        fill_tools(
            &mut perf,
            Some(&nothing.0),
            Some(&nothing.1),
            &ToolNaming::Omit,
        );
        assert_eq!(
            (perf.tool_names, perf.tool_call_names),
            (None, None),
            "not even []"
        );
        assert_eq!(
            hashed.tool_call_names,
            Some(vec![h("task"), h("task"), h("read_file")])
        );
        assert!(hashed
            .tool_names
            .iter()
            .flatten()
            .all(|n| n.starts_with("h:") && n.len() == 18));
        let mut none = chat_row("r", 0, 1);
        fill_tools(&mut none, None, None, &keyed);
        assert_eq!(
            (none.tools_offered, none.tool_names, none.tool_calls),
            (None, None, None)
        );
        let mut no_tools = chat_row("r", 0, 1);
        fill_tools(
            &mut no_tools,
            Some(&RequestTools::default()),
            Some(&ResponseCalls::default()),
            &keyed,
        );
        assert_eq!(
            (no_tools.tools_offered, no_tools.tool_calls),
            (Some(0), Some(0))
        );
    }

    /// Memory stays bounded: the oldest responses are forgotten, with their index entries.
    #[test]
    fn agents_forget_the_oldest_responses() {
        let mut a = Agents::new(10);
        for i in 0..1_000u64 {
            let c = calls(&[(
                &format!("id{i}"),
                "f",
                &format!("{{\"p\":\"prompt number {i}\"}}"),
            )]);
            let ids: Vec<u64> = c.calls.iter().filter_map(|c| c.id).collect();
            let strings: Vec<u64> = c.calls.iter().flat_map(|c| c.strings.clone()).collect();
            a.remember(&format!("r{i}"), "s", i as i64, 1, (&ids, &strings));
            assert!(a.remembered() <= 10 && a.by_id.len() <= 10 && a.by_string.len() <= 10);
        }
        assert!(a.tool_parent(hash_str("id5"), 2_000, 1).is_none());
        assert_eq!(
            a.tool_parent(hash_str("id999"), 2_000, 1)
                .unwrap()
                .request_id,
            "r999"
        );
    }

    /// One agent of the synthetic workload, as its client plays it.
    struct Agent {
        messages: Vec<Value>,
        client: u64,
        loops_left: u32,
        followup: bool,
        /// The agent and call slot whose result this sub-agent makes.
        parent_call: Option<(usize, usize)>,
        depth: u8,
        /// Results of the last answer's calls, by slot (None: a sub-agent still working).
        results: Vec<Option<Value>>,
        waiting: usize,
        ready_at: i64,
        last_request: String,
        next_parent: Option<(String, ParentLink)>,
    }

    /// The workload's events: (time, sequence, agent or request slot, is a finish).
    type Events = std::collections::BinaryHeap<std::cmp::Reverse<(i64, u64, usize, bool)>>;

    /// Agent `a` has every result of its last answer's calls: it sends them, each tool
    /// message naming its call, when the last is in.
    fn send_results(agents: &mut [Agent], a: usize, events: &mut Events, seq: &mut u64) {
        let ag = &mut agents[a];
        let ids: Vec<String> = ag.messages.last().unwrap()["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect();
        for (slot, r) in ag.results.drain(..).enumerate() {
            let mut r = r.expect("every result is in");
            r["tool_call_id"] = json!(ids[slot]);
            ag.messages.push(r);
        }
        ag.next_parent = Some((ag.last_request.clone(), ParentLink::ToolCall));
        *seq += 1;
        events.push(std::cmp::Reverse((ag.ready_at, *seq, a, false)));
    }

    /// The issue's figure on the linker alone (`tests/integration/agents.rs` sends a smaller
    /// one through capture): 100 agents of 25 clients, started over 10 s and interleaved,
    /// each looping 1–6 times through answers of 1–3 tool calls (random ids, as vLLM's and
    /// OpenAI's) and requests carrying their results, a quarter of the top-level calls a
    /// `task` whose prompt opens a sub-agent (with 0–3 loops of its own; its result goes
    /// back when it is done), 30% of the agents continuing with a user follow-up after their
    /// final answer. Every 10th agent opens like the others of its kind (same system prompt
    /// and task) and every answer with tool calls has the same (empty) content, so the chat
    /// prefix alone is ambiguous; one task prompt in ten is one shared text, which agents of
    /// one client may have pending at once (a sub-agent that cannot be told apart).
    #[test]
    fn synthetic_agent_workload_links_tool_results_exactly() {
        use rand::{Rng, SeedableRng};
        use std::cmp::Reverse;
        const MS: i64 = 1_000;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
        let new_agent = |messages: Vec<Value>, client: u64, loops: u32, depth: u8| Agent {
            messages,
            client,
            loops_left: loops,
            followup: false,
            parent_call: None,
            depth,
            results: Vec::new(),
            waiting: 0,
            ready_at: 0,
            last_request: String::new(),
            next_parent: None,
        };
        let mut agents: Vec<Agent> = Vec::new();
        let mut events = Events::new();
        let mut seq = 0u64;
        for a in 0..100usize {
            let task = if a % 10 == 0 {
                "Fix the failing build.".to_string()
            } else {
                format!("Task {a}: {}", rng.gen::<u64>())
            };
            let messages = vec![
                json!({"role": "system", "content": "You are a coding agent."}),
                json!({"role": "user", "content": task}),
            ];
            let mut ag = new_agent(messages, (a % 25) as u64, rng.gen_range(1..=6), 0);
            ag.followup = rng.gen_bool(0.3);
            agents.push(ag);
            seq += 1;
            events.push(Reverse((rng.gen_range(0..10_000 * MS), seq, a, false)));
        }
        struct InFlight {
            id: String,
            agent: usize,
            arrival: i64,
            end: i64,
            messages: Vec<Value>,
            truth: Option<(String, ParentLink)>,
        }
        let mut flights: Vec<InFlight> = Vec::new();
        let mut l = Links {
            sessions: Linker::new(crate::linking::sessions::DEFAULT_MAX_KEYS),
            agents: Agents::new(DEFAULT_MAX_REQUESTS),
            responses: ResponseIds::new(1),
        };
        let mut tally: HashMap<ParentLink, (usize, usize)> = HashMap::new();
        let mut false_parents = 0usize;
        let mut wrong = Vec::new();
        while let Some(Reverse((now, _, who, finish))) = events.pop() {
            if !finish {
                let a = &mut agents[who];
                flights.push(InFlight {
                    id: format!("req-{}", flights.len()),
                    agent: who,
                    arrival: now,
                    end: now + rng.gen_range(50 * MS..3_000 * MS),
                    messages: a.messages.clone(),
                    truth: a.next_parent.take(),
                });
                seq += 1;
                events.push(Reverse((
                    flights.last().unwrap().end,
                    seq,
                    flights.len() - 1,
                    true,
                )));
                continue;
            }
            let f = &flights[who];
            let (id, a, arrival, end) = (f.id.clone(), f.agent, f.arrival, f.end);
            // The model's answer: tool calls while the agent loops, else a final answer.
            let mut made: Vec<(String, String, String)> = Vec::new();
            let mut tasks: Vec<(usize, String)> = Vec::new();
            let final_text = if agents[a].loops_left > 0 {
                for j in 0..rng.gen_range(1..=3usize) {
                    let cid = format!("call_{:024x}", rng.gen::<u128>() >> 32);
                    if agents[a].depth == 0 && rng.gen_bool(0.25) {
                        let prompt = if rng.gen_bool(0.1) {
                            "Run the whole test suite and summarize the failures.".to_string()
                        } else {
                            format!("Investigate part {j} for agent {a}: {}", rng.gen::<u32>())
                        };
                        let args = json!({"description": "look", "prompt": prompt, "subagent_type": "general-purpose"});
                        made.push((cid, "task".into(), args.to_string()));
                        tasks.push((j, prompt));
                    } else {
                        let args = json!({"path": format!("src/module_{}.rs", rng.gen::<u16>())});
                        made.push((cid, "read_file".into(), args.to_string()));
                    }
                }
                None
            } else {
                Some(format!("final answer of agent {a}: {}", rng.gen::<u64>()))
            };
            let list: Vec<(&str, &str, &str)> = made
                .iter()
                .map(|(i, n, g)| (i.as_str(), n.as_str(), g.as_str()))
                .collect();
            let mut rec = chat_row(&id, arrival, end - arrival);
            let body = obj(json!({"messages": f.messages}));
            let seen = Seen {
                answer: Some(TextHash::of(final_text.as_deref().unwrap_or(""))),
                calls: Some(calls(&list)),
                client: agents[a].client,
                response_id: None,
            };
            let req = request_tools(&body);
            let keys = link_keys(chat_keys(&body).as_ref(), Some(&req), &seen, |h| h);
            l.link(&mut rec, &keys);
            match &f.truth {
                Some((p, how)) => {
                    let t = tally.entry(*how).or_default();
                    t.0 += 1;
                    let right = rec.parent_request_id.as_deref() == Some(p.as_str())
                        && rec.parent_link == Some(*how);
                    if right {
                        t.1 += 1;
                    } else {
                        wrong.push(format!(
                            "{id} ({how:?}): got {:?} {:?}, want {p}",
                            rec.parent_request_id, rec.parent_link
                        ));
                    }
                }
                None => false_parents += usize::from(rec.parent_request_id.is_some()),
            }
            agents[a].last_request = id.clone();
            if let Some(text) = final_text {
                let ag = &mut agents[a];
                ag.messages
                    .push(json!({"role": "assistant", "content": text}));
                if let Some((p, slot)) = ag.parent_call {
                    let result =
                        json!({"role": "tool", "content": format!("sub-agent {a}: {text}")});
                    let back = end + rng.gen_range(MS..20 * MS);
                    let pa = &mut agents[p];
                    pa.results[slot] = Some(result);
                    pa.ready_at = pa.ready_at.max(back);
                    pa.waiting -= 1;
                    if pa.waiting == 0 {
                        send_results(&mut agents, p, &mut events, &mut seq);
                    }
                } else if ag.followup {
                    ag.followup = false;
                    ag.loops_left = rng.gen_range(1..=3);
                    let q = format!("follow-up {}", rng.gen::<u64>());
                    ag.messages.push(json!({"role": "user", "content": q}));
                    ag.next_parent = Some((id, ParentLink::ChatPrefix));
                    seq += 1;
                    let at = end + rng.gen_range(500 * MS..5_000 * MS);
                    events.push(Reverse((at, seq, a, false)));
                }
                continue;
            }
            let ag = &mut agents[a];
            ag.loops_left -= 1;
            let tool_calls: Vec<Value> = made
                .iter()
                .map(|(i, n, g)| json!({"id": i, "type": "function", "function": {"name": n, "arguments": g}}))
                .collect();
            ag.messages
                .push(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
            ag.results = (0..made.len())
                .map(|_| Some(json!({"role": "tool", "content": "ok"})))
                .collect();
            ag.waiting = tasks.len();
            ag.ready_at = end + rng.gen_range(MS..300 * MS);
            let client = ag.client;
            for (slot, prompt) in tasks {
                agents[a].results[slot] = None;
                let messages = vec![
                    json!({"role": "system", "content": "You are a sub-agent."}),
                    json!({"role": "user", "content": prompt}),
                ];
                let mut sub = new_agent(messages, client, rng.gen_range(0..=3), 1);
                sub.parent_call = Some((a, slot));
                sub.next_parent = Some((id.clone(), ParentLink::Subagent));
                agents.push(sub);
                seq += 1;
                let at = end + rng.gen_range(MS..50 * MS);
                events.push(Reverse((at, seq, agents.len() - 1, false)));
            }
            if agents[a].waiting == 0 {
                send_results(&mut agents, a, &mut events, &mut seq);
            }
        }
        let share = |how: ParentLink| {
            let (n, right) = tally.get(&how).copied().unwrap_or_default();
            (right, n, right as f64 / n.max(1) as f64)
        };
        let (tr, tn, ts) = share(ParentLink::ToolCall);
        let (sr, sn, ss) = share(ParentLink::Subagent);
        let (cr, cn, cs) = share(ParentLink::ChatPrefix);
        eprintln!(
            "agent linking: {} requests of {} agents ({} sub-agents); tool results {tr} of {tn} \
             parents right ({ts:.4}); sub-agents {sr} of {sn} ({ss:.4}); follow-ups by chat \
             prefix {cr} of {cn} ({cs:.4}); {false_parents} openings given a parent",
            flights.len(),
            agents.len(),
            agents.len() - 100,
        );
        assert_eq!(
            flights.len(),
            tally.values().map(|t| t.0).sum::<usize>() + 100
        );
        assert!(tn > 500 && sn > 100 && cn > 10, "{tn} {sn} {cn}");
        assert!(ts >= 0.995, "tool results: {tr} of {tn}; wrong: {wrong:#?}");
        assert_eq!(tr, tn, "tool results are exact: {wrong:#?}");
        assert!(ss >= 0.95, "sub-agents: {sr} of {sn}; wrong: {wrong:#?}");
        assert_eq!(cr, cn, "follow-ups: {wrong:#?}");
        assert_eq!(false_parents, 0);
    }
}
