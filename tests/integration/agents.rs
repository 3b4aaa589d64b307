//! Agents linked at capture, end to end (issue 42, item 2): agents whose model answers with
//! tool calls play their loops through the real `llmreplay capture` binary in front of a
//! scripted upstream, and the trace must say which request each tool-result request answers
//! (`parent_link = tool_call`, exact by `tool_call_id`), which request spawned each sub-agent
//! (`subagent`: opened with a pending `task` call's prompt, from the same API key), which
//! follow-up continues which answer (`chat_prefix`), and what tools each request offered and
//! each response called.
//!
//! The upstream answers what the request's `x_answer` field says (the test scripts the model:
//! content, or tool calls with their ids, names and arguments), streamed as servers stream
//! tool calls (the id and name in each call's first delta, the arguments in three pieces
//! after it) or whole. Each client is an API key (`Authorization`); every agent, sub-agents
//! included, runs on a thread of its own. The agents' histories are alike on purpose: every
//! agent of a client opens with the same task and every tool-call answer has no content, so
//! only the call ids tell their loops apart.
//!
//! Loopback only; the figures are printed (`agent linking through capture: …`).

use crate::support;
use support::env::{free_addr, serial, tmpdir};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::capture::CaptureProc;
use support::fault_upstream::{chunk, Act, FaultUpstream, Received};
use support::http1::Http1Client;
use trace_format::{ParentLink, TraceRecord};

/// splitmix64: the workload's draws, fixed by the seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn range(&mut self, lo: u64, hi_inclusive: u64) -> u64 {
        lo + self.next() % (hi_inclusive - lo + 1)
    }
}

/// The scripted model: answers with the request's `x_answer` (`content`, `tool_calls`:
/// `[{id, name, arguments}]`), streamed when the request asks.
pub(crate) fn scripted(r: &Received) -> Act {
    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let answer = &body["x_answer"];
    let content = answer["content"].as_str();
    let calls = answer["tool_calls"].as_array().cloned().unwrap_or_default();
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    if body["stream"] != json!(true) {
        let tool_calls: Vec<Value> = calls
            .iter()
            .map(|c| json!({"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}))
            .collect();
        let mut message = json!({"role": "assistant", "content": content});
        if !tool_calls.is_empty() {
            message["tool_calls"] = json!(tool_calls);
        }
        let resp = json!({
            "id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        })
        .to_string();
        return Act::Raw(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{resp}",
                resp.len()
            )
            .into_bytes(),
        );
    }
    let mut events =
        vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})];
    if let Some(c) = content {
        events.push(json!({"choices": [{"index": 0, "delta": {"content": c}}]}));
    }
    for (i, c) in calls.iter().enumerate() {
        events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": ""}}
        ]}}]}));
        let args = c["arguments"].as_str().unwrap_or("");
        let cuts = [0, args.len() / 3, 2 * args.len() / 3, args.len()];
        for w in cuts.windows(2) {
            let piece = args.get(w[0]..w[1]).unwrap_or(args);
            events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": piece}}
            ]}}]}));
        }
    }
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}));
    events.push(json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}));
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for e in events {
        out.extend(chunk(format!("data: {e}\n\n").as_bytes()));
    }
    out.extend(chunk(b"data: [DONE]\n\n"));
    out.extend_from_slice(b"0\r\n\r\n");
    Act::Raw(out)
}

/// The tools every agent offers.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "task", "parameters": {"type": "object"}}}
    ])
}

/// What the test knows of one request: its marker, its true parent's marker and how it is
/// linked, the tool calls its answer made, and the client-side tool time before it.
#[derive(Debug, Clone)]
pub(crate) struct Truth {
    pub(crate) marker: String,
    pub(crate) parent: Option<(String, ParentLink)>,
    calls: Vec<String>,
    /// The client's time between the parent's response and this request (tool or think).
    gap: Option<Duration>,
}

/// Where a play's requests go: one capture, or several in turn (a load balancer's round
/// robin over a fleet: each request to the next).
pub(crate) struct Route<'a> {
    pub(crate) addrs: &'a [SocketAddr],
    pub(crate) next: &'a AtomicUsize,
}

/// A client's connections, one per address of its route.
pub(crate) struct Clients(Vec<Http1Client>);

impl Clients {
    pub(crate) fn new(route: &Route<'_>) -> Clients {
        Clients(route.addrs.iter().map(|&a| Http1Client::new(a)).collect())
    }
}

pub(crate) struct Play<'a> {
    pub(crate) route: Route<'a>,
    pub(crate) key: String,
    pub(crate) seed: u64,
    pub(crate) truths: Mutex<Vec<Truth>>,
}

impl Play<'_> {
    /// Sends one request with `messages`, scripted to answer `answer`, to the next address
    /// of the route; records its truth.
    pub(crate) fn send(
        &self,
        clients: &mut Clients,
        marker: &str,
        messages: &[Value],
        answer: Value,
        stream: bool,
        (parent, gap): (Option<(String, ParentLink)>, Option<Duration>),
    ) -> Instant {
        let body = json!({
            "model": "m", "messages": messages, "tools": tools(), "stream": stream,
            "user": marker, "x_answer": answer,
        })
        .to_string();
        let auth = format!("Bearer {}", self.key);
        let at = self.route.next.fetch_add(1, Ordering::Relaxed) % clients.0.len();
        let resp = clients.0[at]
            .post("/v1/chat/completions", &[("authorization", &auth)], &body)
            .unwrap_or_else(|e| panic!("{marker}: {e}"));
        assert_eq!(resp.status, 200, "{marker}: {}", resp.text());
        let calls = answer["tool_calls"]
            .as_array()
            .map(|c| {
                c.iter()
                    .map(|c| c["name"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
        self.truths.lock().unwrap().push(Truth {
            marker: marker.to_string(),
            parent,
            calls,
            gap,
        });
        Instant::now()
    }

    /// Plays one agent (`depth` 0) or sub-agent (`depth` 1, opened with `task`) to its
    /// final answer; returns that answer.
    pub(crate) fn agent(
        &self,
        name: &str,
        task: &str,
        depth: u8,
        spawned_by: Option<String>,
    ) -> String {
        let mut rng = Rng(self.seed
            ^ name
                .bytes()
                .fold(7u64, |h, b| h.wrapping_mul(31) ^ u64::from(b)));
        let mut client = Clients::new(&self.route);
        let mut messages = vec![
            json!({"role": "system", "content": if depth == 0 { "You are a coding agent." } else { "You are a sub-agent." }}),
            json!({"role": "user", "content": task}),
        ];
        let loops = rng.range(if depth == 0 { 1 } else { 0 }, 3);
        let mut parent = spawned_by.map(|p| (p, ParentLink::Subagent));
        let mut gap = None;
        for turn in 0..=loops {
            let marker = format!("{name}-r{turn}");
            let stream = rng.range(0, 3) != 0;
            if turn == loops {
                let text = format!("{name} is done ({})", rng.next());
                let answer = json!({"content": text});
                self.send(
                    &mut client,
                    &marker,
                    &messages,
                    answer,
                    stream,
                    (parent.take(), gap),
                );
                return text;
            }
            let n = rng.range(1, 2) as usize;
            let calls: Vec<Value> = (0..n)
                .map(|j| {
                    let id = format!("call_{:016x}", rng.next());
                    if depth == 0 && rng.range(0, 2) == 0 {
                        let prompt = format!("Investigate part {j} of {name}'s task ({})", rng.next());
                        let args = json!({"description": "look", "prompt": prompt, "subagent_type": "general-purpose"});
                        json!({"id": id, "name": "task", "arguments": args.to_string()})
                    } else {
                        let args = json!({"path": format!("src/m{}.rs", rng.next() % 1000)});
                        json!({"id": id, "name": if j == 0 { "read_file" } else { "grep" }, "arguments": args.to_string()})
                    }
                })
                .collect();
            let answer = json!({"tool_calls": calls});
            let done = self.send(
                &mut client,
                &marker,
                &messages,
                answer,
                stream,
                (parent.take(), gap),
            );
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls.iter().map(|c| json!({
                "id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}
            })).collect::<Vec<_>>()}));
            // Run the tools: sub-agents in parallel, the rest a short sleep.
            let results: Vec<String> = std::thread::scope(|s| {
                let handles: Vec<_> = calls
                    .iter()
                    .enumerate()
                    .map(|(j, c)| {
                        let args: Value =
                            serde_json::from_str(c["arguments"].as_str().unwrap()).unwrap();
                        let sub = format!("{name}.{turn}.{j}");
                        let by = marker.clone();
                        let is_task = c["name"] == "task";
                        let wait = Duration::from_millis(5 + (rng.next() % 25));
                        s.spawn(move || {
                            if is_task {
                                std::thread::sleep(Duration::from_millis(2));
                                self.agent(&sub, args["prompt"].as_str().unwrap(), 1, Some(by))
                            } else {
                                std::thread::sleep(wait);
                                format!("contents of {}", args["path"])
                            }
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("tool thread"))
                    .collect()
            });
            for (c, r) in calls.iter().zip(results) {
                messages.push(json!({"role": "tool", "tool_call_id": c["id"], "content": r}));
            }
            parent = Some((marker, ParentLink::ToolCall));
            gap = Some(done.elapsed());
        }
        unreachable!()
    }
}

pub(crate) fn marker(r: &TraceRecord) -> String {
    let v: Value = serde_json::from_str(r.body.as_deref().expect("a body")).unwrap();
    v["user"].as_str().unwrap().to_string()
}

#[test]
fn capture_links_tool_results_and_subagents_of_agents_at_work() {
    let _serial = serial();
    let upstream = FaultUpstream::start(scripted);
    let out = tmpdir("agents");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(
        listen,
        &upstream.url(),
        &out,
        &["--flush-interval", "50ms", "--record-bodies", "full"],
    );
    cap.wait_for("listening on");
    // 24 agents of 4 API keys, started over 300 ms; the agents of one key open alike.
    let (next, addrs) = (AtomicUsize::new(0), [listen]);
    let plays: Vec<Play> = (0..4)
        .map(|k| Play {
            route: Route {
                addrs: &addrs,
                next: &next,
            },
            key: format!("key-{k}"),
            seed: 42 + k,
            truths: Mutex::new(Vec::new()),
        })
        .collect();
    std::thread::scope(|s| {
        for a in 0..24usize {
            let p = &plays[a % 4];
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(a as u64 * 12));
                let task = format!("Fix the failing build for team {}.", a % 4);
                p.agent(&format!("a{a}"), &task, 0, None);
                // A user follow-up after the final answer is a chat-prefix turn; not played here.
            });
        }
    });
    let (status, log) = cap.terminate();
    assert!(status.success(), "capture exited {status:?}: {log:#?}");
    let rows = trace_format::read_traces(&[out.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("read {}: {e}", out.display()))
        .records;
    let _ = std::fs::remove_dir_all(&out);
    let truths: Vec<Truth> = plays
        .iter()
        .flat_map(|p| p.truths.lock().unwrap().clone())
        .collect();
    assert_eq!(rows.len(), truths.len(), "one row per request");
    let by_marker: HashMap<String, &TraceRecord> = rows.iter().map(|r| (marker(r), r)).collect();
    assert_eq!(by_marker.len(), rows.len(), "markers are unique");
    let mut tally: HashMap<ParentLink, (usize, usize)> = HashMap::new();
    let mut wrong = Vec::new();
    let mut tool_time_err = Vec::new();
    for t in &truths {
        let r = by_marker[&t.marker];
        // The tool columns: three tools offered, named (bodies are kept); the calls made.
        assert_eq!(r.tools_offered, Some(3), "{}", t.marker);
        assert_eq!(
            r.tool_names.as_deref(),
            Some(&["read_file".to_string(), "grep".into(), "task".into()][..])
        );
        assert_eq!(r.tool_calls, Some(t.calls.len() as i32), "{}", t.marker);
        assert_eq!(r.tool_call_names.as_ref(), Some(&t.calls), "{}", t.marker);
        let Some((p, how)) = &t.parent else {
            if r.parent_request_id.is_some() {
                wrong.push(format!(
                    "{}: opening given {:?}",
                    t.marker, r.parent_request_id
                ));
            }
            assert_eq!(r.session_id.as_deref(), Some(r.request_id.as_str()));
            continue;
        };
        let e = tally.entry(*how).or_default();
        e.0 += 1;
        let want = &by_marker[p].request_id;
        if r.parent_request_id.as_ref() == Some(want) && r.parent_link == Some(*how) {
            e.1 += 1;
            assert_eq!(
                r.session_id, by_marker[p].session_id,
                "{}: the parent's session",
                t.marker
            );
            if *how == ParentLink::ToolCall {
                let got = r.think_time_us.expect("a tool time");
                let client = t.gap.unwrap().as_micros() as i64;
                tool_time_err.push(got - client);
            }
        } else {
            wrong.push(format!(
                "{} ({how:?}): got {:?} {:?}, want {want} ({p})",
                t.marker, r.parent_request_id, r.parent_link
            ));
        }
    }
    let share = |how| {
        let (n, right) = tally.get(&how).copied().unwrap_or_default();
        (right, n)
    };
    let (tr, tn) = share(ParentLink::ToolCall);
    let (sr, sn) = share(ParentLink::Subagent);
    tool_time_err.sort_unstable();
    eprintln!(
        "agent linking through capture: {} requests; tool results {tr} of {tn} parents right; \
         sub-agents {sr} of {sn}; tool time captured − client: min {} µs, max {} µs",
        rows.len(),
        tool_time_err.first().unwrap_or(&0),
        tool_time_err.last().unwrap_or(&0),
    );
    assert!(
        tn >= 30 && sn >= 10,
        "{tn} tool results, {sn} sub-agents: too few to say"
    );
    assert_eq!((tr, sr), (tn, sn), "every link exact: {wrong:#?}");
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Capture stamps the parent's end a little before the client reads it and the child's
    // arrival a little after it is sent: the tool time is the client's plus loopback.
    assert!(
        *tool_time_err.first().unwrap() >= -2_000,
        "{tool_time_err:?}"
    );
    assert!(
        tool_time_err[tool_time_err.len() * 95 / 100] <= 20_000,
        "{tool_time_err:?}"
    );
}
