//! The APIs agents speak, captured (issue 51): OpenAI Responses and Anthropic Messages
//! streams and bodies, embeddings, and what capture forwards without recording.
//!
//! A scripted upstream ([`ScriptedUpstream`]) answers each request with the events its
//! `x-script` header names, each after a known pause, so every row can be checked against
//! what was sent: tokens from the usage, TTFT at the first output event (not a `ping` or an
//! opening event), TTFAT at the first answer, one chunk per output event, E2EL at the final
//! event, the verdict on an error event, an incomplete response or a cut stream; the tool
//! columns and links (a Messages tool-use loop by `tool_use_id`, a Responses chain by
//! `previous_response_id`); and no API key in any byte written.

use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, serial, tmpdir};
use support::http1::Http1Client;
use support::misbehaving::{Behaviour, MisbehavingServer};
use support::scripted::{Script, ScriptedUpstream};

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use trace_format::{Outcome, ParentLink, TokenSource, TraceRecord};

const MS: i64 = 1_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `(pause, event)` pairs of a script.
fn events(list: &[(u64, Value)]) -> Script {
    Script::Events(list.iter().map(|(p, e)| (ms(*p), e.to_string())).collect())
}

fn rows(out: &Path) -> Vec<TraceRecord> {
    let mut r = trace_format::read_traces(&[out.to_str().unwrap()])
        .expect("read capture's trace")
        .records;
    r.sort_by_key(|r| r.arrival_time_us);
    r
}

/// The rows by their `x-marker` session header.
fn by_marker(rows: Vec<TraceRecord>) -> BTreeMap<String, TraceRecord> {
    rows.into_iter()
        .map(|r| (r.session_id.clone().unwrap_or_default(), r))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Responses events
// ---------------------------------------------------------------------------------------

fn r_created(id: &str) -> Value {
    json!({"type": "response.created", "sequence_number": 0, "response": {"id": id, "object": "response", "status": "in_progress", "output": [], "usage": null}})
}

fn r_delta(kind: &str, text: &str) -> Value {
    json!({"type": format!("response.{kind}.delta"), "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": text})
}

fn r_done(kind: &str, id: &str, usage: Value) -> Value {
    json!({"type": format!("response.{kind}"), "response": {"id": id, "object": "response", "status": kind, "output": [], "usage": usage}})
}

fn r_usage(input: i64, cached: i64, output: i64, reasoning: i64) -> Value {
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": input + output})
}

fn r_call_added(call_id: &str, name: &str) -> Value {
    json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "function_call", "id": "fc_1", "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"}})
}

fn r_args(piece: &str) -> Value {
    json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": piece})
}

// ---------------------------------------------------------------------------------------
// Messages events
// ---------------------------------------------------------------------------------------

fn m_start(id: &str, input: i64, cache_read: i64, cache_creation: i64) -> Value {
    json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant", "content": [], "model": "claude", "stop_reason": null, "usage": {"input_tokens": input, "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": cache_creation, "output_tokens": 1}}})
}

fn m_block(index: u32, block: Value) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": block})
}

fn m_delta(index: u32, delta: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": delta})
}

fn m_stop_block(index: u32) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

fn m_end(output: i64, reason: &str) -> [Value; 2] {
    [
        json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": {"output_tokens": output}}),
        json!({"type": "message_stop"}),
    ]
}

fn text(t: &str) -> Value {
    json!({"type": "text_delta", "text": t})
}

/// The scripts of [`each_event_kind_is_checked_against_its_row`].
fn event_scripts() -> HashMap<String, Script> {
    let mut s = HashMap::new();
    let mut put = |k: &str, v: Script| {
        s.insert(k.to_string(), v);
    };
    put(
        "r-ok",
        events(&[
            (0, r_created("resp_ok")),
            (
                0,
                json!({"type": "response.in_progress", "response": {"id": "resp_ok"}}),
            ),
            (40, r_delta("reasoning_summary_text", "Think")),
            (
                0,
                json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
            ),
            (40, r_delta("output_text", "Hi")),
            (20, r_delta("output_text", " there")),
            (
                0,
                json!({"type": "response.output_text.done", "output_index": 1, "text": "Hi there"}),
            ),
            (20, r_done("completed", "resp_ok", r_usage(37, 32, 11, 4))),
        ]),
    );
    put(
        "r-failed",
        events(&[
            (0, r_created("resp_f")),
            (10, r_delta("output_text", "Hal")),
            (
                10,
                json!({"type": "response.failed", "response": {"id": "resp_f", "status": "failed", "error": {"code": "server_error", "message": "the model crashed"}}}),
            ),
        ]),
    );
    put(
        "r-error",
        events(&[
            (0, r_created("resp_e")),
            (10, r_delta("output_text", "Hal")),
            (
                10,
                json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": null}),
            ),
        ]),
    );
    put(
        "r-incomplete",
        events(&[
            (0, r_created("resp_i")),
            (10, r_delta("output_text", "one")),
            (10, r_delta("output_text", " two")),
            (
                10,
                json!({"type": "response.incomplete", "response": {"id": "resp_i", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "usage": {"input_tokens": 5, "output_tokens": 2}}}),
            ),
        ]),
    );
    put(
        "r-refusal",
        events(&[
            (0, r_created("resp_r")),
            (30, r_delta("refusal", "I can't")),
            (10, r_delta("refusal", " help with that.")),
            (10, r_done("completed", "resp_r", r_usage(9, 0, 6, 0))),
        ]),
    );
    let args = ["{\"ci", "ty\":", "\"San ", "Francisco\"", "}"];
    let mut tool = vec![
        (0, r_created("resp_t")),
        (20, r_call_added("call_7", "get_weather")),
    ];
    tool.extend(args.iter().map(|a| (10, r_args(a))));
    tool.push((0, json!({"type": "response.function_call_arguments.done", "output_index": 0, "arguments": args.concat()})));
    tool.push((10, r_done("completed", "resp_t", r_usage(20, 0, 12, 0))));
    put("r-tool", events(&tool));
    put(
        "r-cut",
        events(&[
            (0, r_created("resp_c")),
            (10, r_delta("output_text", "half")),
        ]),
    );
    put(
        "r-json",
        Script::Json(
            json!({"id": "resp_j", "object": "response", "status": "completed", "error": null,
                "output": [{"type": "message", "id": "m", "role": "assistant", "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}],
                "usage": r_usage(12, 8, 2, 0)})
            .to_string(),
        ),
    );
    let mut think = vec![
        (0, m_start("msg_t", 10, 90, 5)),
        (0, json!({"type": "ping"})),
        (0, m_block(0, json!({"type": "thinking", "thinking": ""}))),
        (
            50,
            m_delta(0, json!({"type": "thinking_delta", "thinking": "Let me"})),
        ),
        (
            10,
            m_delta(0, json!({"type": "thinking_delta", "thinking": " think"})),
        ),
        (
            0,
            m_delta(0, json!({"type": "signature_delta", "signature": "EqQB"})),
        ),
        (0, m_stop_block(0)),
        (0, json!({"type": "ping"})),
        (0, m_block(1, json!({"type": "text", "text": ""}))),
        (30, m_delta(1, text("Sure"))),
        (10, m_delta(1, text(", here."))),
        (0, m_stop_block(1)),
    ];
    think.extend(m_end(7, "end_turn").into_iter().map(|e| (10, e)));
    put("m-think", events(&think));
    let pieces = ["{\"loc", "ation\": \"S", "F\", \"unit\"", ": \"c\"}"];
    let mut tool = vec![
        (0, m_start("msg_u", 30, 0, 0)),
        (
            20,
            m_block(
                0,
                json!({"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {}}),
            ),
        ),
    ];
    tool.extend(pieces.iter().map(|p| {
        (
            10,
            m_delta(0, json!({"type": "input_json_delta", "partial_json": p})),
        )
    }));
    tool.push((0, m_stop_block(0)));
    tool.extend(m_end(15, "tool_use").into_iter().map(|e| (0, e)));
    put("m-tool", events(&tool));
    put(
        "m-overloaded",
        events(&[
            (0, m_start("msg_o", 4, 0, 0)),
            (0, json!({"type": "ping"})),
            (10, m_block(0, json!({"type": "text", "text": ""}))),
            (10, m_delta(0, text("Part"))),
            (
                10,
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
        ]),
    );
    put(
        "m-json",
        Script::Json(
            json!({"id": "msg_j", "type": "message", "role": "assistant", "model": "claude",
                "content": [{"type": "thinking", "thinking": "Hmm hmm.", "signature": "x"}, {"type": "text", "text": "Done."}],
                "stop_reason": "end_turn", "usage": {"input_tokens": 3, "cache_read_input_tokens": 40, "cache_creation_input_tokens": 0, "output_tokens": 9}})
            .to_string(),
        ),
    );
    put(
        "m-529",
        Script::Status(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string(),
        ),
    );
    put(
        "e-json",
        Script::Json(
            json!({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}, {"object": "embedding", "index": 1, "embedding": [0.3, 0.4]}], "model": "e5", "usage": {"prompt_tokens": 6, "total_tokens": 6}})
            .to_string(),
        ),
    );
    s
}

/// One request per script, through capture, each row checked against its events.
#[test]
fn each_event_kind_is_checked_against_its_row() {
    let _alone = serial();
    let up = ScriptedUpstream::start(event_scripts());
    let out = tmpdir("apis-events");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(
        listen,
        &up.url(),
        &out,
        &["--session-header", "x-marker", "--flush-interval", "50ms"],
    );
    cap.wait_for("listening on");
    let mut client = Http1Client::new(listen);
    let mut statuses = BTreeMap::new();
    let responses = |stream: bool| {
        json!({"model": "gpt-x", "input": "Say hi", "max_output_tokens": 64, "stream": stream})
            .to_string()
    };
    let messages = |stream: bool| {
        json!({"model": "claude", "max_tokens": 256, "stream": stream, "messages": [{"role": "user", "content": "Say hi"}]}).to_string()
    };
    let sends: Vec<(&str, &str, String)> = vec![
        ("r-ok", "/v1/responses", responses(true)),
        ("r-failed", "/v1/responses", responses(true)),
        ("r-error", "/v1/responses", responses(true)),
        ("r-incomplete", "/v1/responses", responses(true)),
        ("r-refusal", "/v1/responses", responses(true)),
        ("r-tool", "/v1/responses", responses(true)),
        ("r-cut", "/v1/responses", responses(true)),
        ("r-json", "/v1/responses", responses(false)),
        ("m-think", "/v1/messages", messages(true)),
        ("m-tool", "/v1/messages", messages(true)),
        ("m-overloaded", "/v1/messages", messages(true)),
        ("m-json", "/v1/messages", messages(false)),
        ("m-529", "/v1/messages", messages(false)),
        (
            "e-json",
            "/v1/embeddings",
            json!({"model": "e5", "input": ["alpha beta", "gamma delta epsilon"]}).to_string(),
        ),
    ];
    for (script, path, body) in &sends {
        let headers = [
            ("x-script", *script),
            ("x-marker", *script),
            ("x-api-key", "sk-ant-api03-APIKEYNEVERWRITTEN0123456789"),
        ];
        let got = client.post(path, &headers, body);
        statuses.insert(
            script.to_string(),
            got.map(|r| r.status).map_err(|e| e.to_string()),
        );
    }
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
    // The upstream got each request as the client sent it: no usage injected into a typed
    // API's request.
    // and with its key, which is forwarded, never written.
    for s in up.seen() {
        assert!(!s.body.contains("stream_options"), "{}: {}", s.path, s.body);
        assert!(
            s.headers
                .iter()
                .any(|(k, v)| k == "x-api-key" && v.contains("APIKEYNEVERWRITTEN")),
            "{}: {:?}",
            s.path,
            s.headers
        );
    }
    for needle in ["APIKEYNEVERWRITTEN"] {
        for e in std::fs::read_dir(&out).unwrap() {
            let bytes = std::fs::read(e.unwrap().path()).unwrap();
            assert!(!bytes.windows(needle.len()).any(|w| w == needle.as_bytes()));
        }
    }
    let rows = by_marker(rows(&out));
    let _ = std::fs::remove_dir_all(&out);
    let mut problems = Vec::new();
    let mut check = |name: &str, ok: bool, what: String| {
        if !ok {
            problems.push(format!("{name}: {what}"));
        }
    };
    for (script, path, _) in &sends {
        let want = if *script == "m-529" { 529 } else { 200 };
        check(
            script,
            statuses[*script] == Ok(want),
            format!("client got {:?}", statuses[*script]),
        );
        let Some(r) = rows.get(*script) else {
            check(script, false, "no row".into());
            continue;
        };
        check(
            script,
            r.endpoint == *path,
            format!("endpoint {}", r.endpoint),
        );
    }
    let r = |k: &str| {
        rows.get(k)
            .cloned()
            .unwrap_or_else(|| TraceRecord::new("none", 0, ""))
    };

    // A Responses stream: reasoning then answer; an opening and a `….done` are no chunks.
    let ok = r("r-ok");
    check(
        "r-ok",
        ok.outcome == Outcome::Ok,
        format!("{:?} {:?}", ok.outcome, ok.error),
    );
    check(
        "r-ok",
        (
            ok.prompt_tokens,
            ok.cached_tokens,
            ok.output_tokens,
            ok.reasoning_tokens,
        ) == (Some(37), Some(32), Some(11), Some(4)),
        format!(
            "tokens {:?}",
            (
                ok.prompt_tokens,
                ok.cached_tokens,
                ok.output_tokens,
                ok.reasoning_tokens
            )
        ),
    );
    check(
        "r-ok",
        ok.prompt_tokens_source == Some(TokenSource::Usage)
            && ok.reasoning_tokens_source == Some(TokenSource::Usage)
            && ok.max_tokens == Some(64)
            && ok.stream,
        format!("{ok:?}"),
    );
    check(
        "r-ok",
        ok.chunk_times_us.len() == 3,
        format!("chunks {:?}", ok.chunk_times_us),
    );
    let (ttft, ttfat, e2el) = (
        ok.ttft_us.unwrap_or(0),
        ok.ttfat_us.unwrap_or(0),
        ok.e2el_us.unwrap_or(0),
    );
    check(
        "r-ok",
        ttft >= 40 * MS && ttfat >= ttft + 25 * MS && e2el >= ttfat + 25 * MS,
        format!("ttft {ttft} ttfat {ttfat} e2el {e2el}"),
    );
    check(
        "r-ok",
        ok.chunk_times_us.first() == Some(&ttft)
            && ok.chunk_times_us.last().is_some_and(|&l| l < e2el),
        format!("chunks {:?} e2el {e2el}", ok.chunk_times_us),
    );

    for (k, msg) in [("r-failed", "the model crashed"), ("r-error", "slow down")] {
        let f = r(k);
        check(
            k,
            f.outcome == Outcome::UpstreamError
                && f.error.as_deref().is_some_and(|e| e.contains(msg))
                && f.chunk_times_us.len() == 1,
            format!("{:?} {:?} {:?}", f.outcome, f.error, f.chunk_times_us),
        );
    }
    let inc = r("r-incomplete");
    check(
        "r-incomplete",
        inc.outcome == Outcome::Ok && inc.output_tokens == Some(2) && inc.chunk_times_us.len() == 2,
        format!(
            "{:?} {:?} {:?}",
            inc.outcome, inc.output_tokens, inc.chunk_times_us
        ),
    );
    let refusal = r("r-refusal");
    check(
        "r-refusal",
        refusal.outcome == Outcome::Ok
            && refusal.ttfat_us == refusal.ttft_us
            && refusal.ttft_us.is_some_and(|t| t >= 30 * MS)
            && refusal.chunk_times_us.len() == 2,
        format!("{refusal:?}"),
    );
    // The call's opening (its id and name), then one chunk per piece of its arguments.
    let args = ["{\"ci", "ty\":", "\"San ", "Francisco\"", "}"];
    let tool = r("r-tool");
    check(
        "r-tool",
        tool.outcome == Outcome::Ok
            && tool.tool_calls == Some(1)
            && tool
                .tool_call_names
                .as_ref()
                .is_some_and(|n| n.len() == 1 && n[0].starts_with("h:"))
            && tool.chunk_times_us.len() == 1 + args.len()
            && tool.output_tokens == Some(12),
        format!("{tool:?}"),
    );
    let cut = r("r-cut");
    check(
        "r-cut",
        cut.outcome == Outcome::UpstreamError
            && cut
                .error
                .as_deref()
                .is_some_and(|e| e.contains("without its final event")),
        format!("{:?} {:?}", cut.outcome, cut.error),
    );
    let json_r = r("r-json");
    check(
        "r-json",
        json_r.outcome == Outcome::Ok
            && !json_r.stream
            && (
                json_r.prompt_tokens,
                json_r.cached_tokens,
                json_r.output_tokens,
            ) == (Some(12), Some(8), Some(2))
            && json_r.ttft_us.is_none()
            && json_r.e2el_us.is_some(),
        format!("{json_r:?}"),
    );

    // A Messages stream: a ping before any output is no chunk and no TTFT; thinking is
    // reasoning (counted by the tokenizer: the usage has no reasoning part); the prompt is
    // the input and both cache parts, the cache read recorded apart.
    let think = r("m-think");
    check(
        "m-think",
        think.outcome == Outcome::Ok
            && (
                think.prompt_tokens,
                think.cached_tokens,
                think.output_tokens,
            ) == (Some(105), Some(90), Some(7)),
        format!("{:?} {:?} {think:?}", think.outcome, think.error),
    );
    check(
        "m-think",
        think.chunk_times_us.len() == 4
            && think.ttft_us.is_some_and(|t| t >= 50 * MS)
            && think
                .ttfat_us
                .is_some_and(|t| t >= think.ttft_us.unwrap() + 25 * MS)
            && think
                .e2el_us
                .is_some_and(|e| e > *think.chunk_times_us.last().unwrap()),
        format!(
            "chunks {:?} ttft {:?} ttfat {:?} e2el {:?}",
            think.chunk_times_us, think.ttft_us, think.ttfat_us, think.e2el_us
        ),
    );
    check(
        "m-think",
        think.reasoning_tokens == Some(3)
            && think.reasoning_tokens_source == Some(TokenSource::Tokenizer),
        format!(
            "reasoning {:?} {:?}",
            think.reasoning_tokens, think.reasoning_tokens_source
        ),
    );
    let mtool = r("m-tool");
    check(
        "m-tool",
        mtool.outcome == Outcome::Ok
            && mtool.tool_calls == Some(1)
            && mtool.chunk_times_us.len() == 5
            && mtool.ttfat_us == mtool.ttft_us
            && (mtool.prompt_tokens, mtool.output_tokens) == (Some(30), Some(15)),
        format!("{mtool:?}"),
    );
    let over = r("m-overloaded");
    check(
        "m-overloaded",
        over.outcome == Outcome::UpstreamError
            && over
                .error
                .as_deref()
                .is_some_and(|e| e.contains("Overloaded"))
            && over.chunk_times_us.len() == 1,
        format!("{:?} {:?}", over.outcome, over.error),
    );
    let mj = r("m-json");
    check(
        "m-json",
        mj.outcome == Outcome::Ok
            && (mj.prompt_tokens, mj.cached_tokens, mj.output_tokens)
                == (Some(43), Some(40), Some(9))
            && mj.reasoning_tokens == Some(2),
        format!("{mj:?}"),
    );
    let m529 = r("m-529");
    check(
        "m-529",
        m529.outcome == Outcome::HttpError
            && m529.status == Some(529)
            && m529
                .error
                .as_deref()
                .is_some_and(|e| e.contains("Overloaded")),
        format!("{:?} {:?}", m529.outcome, m529.error),
    );

    // Embeddings: a row without generated output.
    let e = r("e-json");
    check(
        "e-json",
        e.outcome == Outcome::Ok
            && !e.stream
            && e.prompt_tokens == Some(6)
            && e.prompt_tokens_source == Some(TokenSource::Usage)
            && e.output_tokens.is_none()
            && e.reasoning_tokens.is_none()
            && e.ttft_us.is_none()
            && e.e2el_us.is_some_and(|t| t > 0)
            && e.tools_offered.is_none()
            && e.parent_request_id.is_none(),
        format!("{e:?}"),
    );
    assert!(
        problems.is_empty(),
        "{}\nlog: {log:#?}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Links
// ---------------------------------------------------------------------------------------

/// Two twin Anthropic agents (the same task, the same answers, only their tool ids differ)
/// run a tool-use loop each, one answer streamed and one whole; and a Responses
/// conversation chained by `previous_response_id` over three turns. Every turn is linked to
/// the request whose response it continues, exactly, and no key reaches the trace.
#[test]
fn a_messages_tool_loop_and_a_responses_chain_are_linked_exactly() {
    let _alone = serial();
    let tool_turn = |msg: &str, id: &str, name: &str, args: &str, stream: bool| -> Script {
        if !stream {
            return Script::Json(
                json!({"id": msg, "type": "message", "role": "assistant", "content": [
                    {"type": "tool_use", "id": id, "name": name, "input": serde_json::from_str::<Value>(args).unwrap()}
                ], "stop_reason": "tool_use", "usage": {"input_tokens": 50, "output_tokens": 10}})
                .to_string(),
            );
        }
        let mut e = vec![
            (0, m_start(msg, 40, 0, 0)),
            (0, m_block(0, json!({"type": "text", "text": ""}))),
            (5, m_delta(0, text("Checking."))),
            (0, m_stop_block(0)),
            (
                5,
                m_block(
                    1,
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                ),
            ),
            (
                5,
                m_delta(1, json!({"type": "input_json_delta", "partial_json": args})),
            ),
            (0, m_stop_block(1)),
        ];
        e.extend(m_end(12, "tool_use").into_iter().map(|x| (0, x)));
        events(&e)
    };
    let final_turn = |msg: &str| {
        let mut e = vec![
            (0, m_start(msg, 60, 0, 0)),
            (0, m_block(0, json!({"type": "text", "text": ""}))),
            (5, m_delta(0, text("It is 15C at noon."))),
            (0, m_stop_block(0)),
        ];
        e.extend(m_end(8, "end_turn").into_iter().map(|x| (0, x)));
        events(&e)
    };
    let mut scripts = HashMap::new();
    for (agent, a, b) in [("A", "toolu_A1", "toolu_A2"), ("B", "toolu_B1", "toolu_B2")] {
        scripts.insert(
            format!("{agent}1"),
            tool_turn(
                &format!("msg_{agent}1"),
                a,
                "get_weather",
                r#"{"city":"SF"}"#,
                true,
            ),
        );
        scripts.insert(
            format!("{agent}2"),
            tool_turn(
                &format!("msg_{agent}2"),
                b,
                "get_time",
                r#"{"tz":"PT"}"#,
                false,
            ),
        );
        scripts.insert(format!("{agent}3"), final_turn(&format!("msg_{agent}3")));
    }
    let r_turn = |id: &str, t: &str| {
        events(&[
            (0, r_created(id)),
            (5, r_delta("output_text", t)),
            (5, r_done("completed", id, r_usage(10, 0, 3, 0))),
        ])
    };
    scripts.insert("R1".into(), r_turn("resp_1", "Why did the chicken"));
    scripts.insert(
        "R2".into(),
        Script::Json(
            json!({"id": "resp_2", "object": "response", "status": "completed", "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Another one."}]}],
                "usage": r_usage(20, 10, 3, 0)})
            .to_string(),
        ),
    );
    scripts.insert("R3".into(), r_turn("resp_3", "Last one."));
    let up = ScriptedUpstream::start(scripts);
    let out = tmpdir("apis-links");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(
        listen,
        &up.url(),
        &out,
        &["--record-bodies", "full", "--flush-interval", "50ms"],
    );
    cap.wait_for("listening on");
    let mut client = Http1Client::new(listen);
    let key = "sk-ant-api03-LOOPKEYNEVERWRITTEN0123456789";
    let send = |client: &mut Http1Client, script: &str, path: &str, body: Value| {
        let r = client
            .post(
                path,
                &[
                    ("x-script", script),
                    ("x-api-key", key),
                    ("authorization", "Bearer sk-LOOPKEYNEVERWRITTEN99"),
                ],
                &body.to_string(),
            )
            .expect("an answer");
        assert_eq!(r.status, 200, "{script}: {}", r.text());
    };
    let user = json!({"role": "user", "content": "Weather in SF, and the time?"});
    let tools = json!([{"name": "get_weather", "input_schema": {"type": "object"}}, {"name": "get_time", "input_schema": {"type": "object"}}]);
    let assistant = |id: &str, name: &str, input: Value, with_text: bool| {
        let mut c = vec![];
        if with_text {
            c.push(json!({"type": "text", "text": "Checking."}));
        }
        c.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        json!({"role": "assistant", "content": c})
    };
    let result = |id: &str, out: &str| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": out}]});
    // Turn 1 of both agents first, then turn 2 of B before A's: a prefix guess would mix
    // the twins up; their tool ids do not.
    let body = |msgs: Vec<Value>, stream: bool| json!({"model": "claude", "max_tokens": 200, "stream": stream, "tools": tools, "messages": msgs});
    for agent in ["A", "B"] {
        send(
            &mut client,
            &format!("{agent}1"),
            "/v1/messages",
            body(vec![user.clone()], true),
        );
    }
    let t2 = |agent: &str| {
        vec![
            user.clone(),
            assistant(
                &format!("toolu_{agent}1"),
                "get_weather",
                json!({"city": "SF"}),
                true,
            ),
            result(&format!("toolu_{agent}1"), "15C"),
        ]
    };
    for agent in ["B", "A"] {
        send(
            &mut client,
            &format!("{agent}2"),
            "/v1/messages",
            body(t2(agent), false),
        );
    }
    for agent in ["A", "B"] {
        let mut m = t2(agent);
        m.push(assistant(
            &format!("toolu_{agent}2"),
            "get_time",
            json!({"tz": "PT"}),
            false,
        ));
        m.push(result(&format!("toolu_{agent}2"), "noon"));
        send(
            &mut client,
            &format!("{agent}3"),
            "/v1/messages",
            body(m, true),
        );
    }
    // The Responses chain.
    send(
        &mut client,
        "R1",
        "/v1/responses",
        json!({"model": "gpt-x", "input": "Tell me a joke", "stream": true}),
    );
    send(
        &mut client,
        "R2",
        "/v1/responses",
        json!({"model": "gpt-x", "previous_response_id": "resp_1", "input": [{"role": "user", "content": "Another"}]}),
    );
    send(
        &mut client,
        "R3",
        "/v1/responses",
        json!({"model": "gpt-x", "previous_response_id": "resp_2", "input": "One more", "stream": true}),
    );
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
    for e in std::fs::read_dir(&out).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        assert!(
            !bytes.windows(19).any(|w| w == b"LOOPKEYNEVERWRITTEN"),
            "a key was written"
        );
    }
    let rows = rows(&out);
    let _ = std::fs::remove_dir_all(&out);
    // Rows in the order sent: A1 B1 B2 A2 A3 B3 R1 R2 R3.
    let names = ["A1", "B1", "B2", "A2", "A3", "B3", "R1", "R2", "R3"];
    assert_eq!(rows.len(), names.len(), "{rows:#?}");
    let id: HashMap<&str, &TraceRecord> = names.iter().copied().zip(rows.iter()).collect();
    let parent = |n: &str| {
        let r = id[n];
        (
            r.parent_request_id.clone(),
            r.parent_link,
            r.session_id.clone(),
        )
    };
    let rid = |n: &str| Some(id[n].request_id.clone());
    for (n, p, how, session) in [
        ("A1", None, None, "A1"),
        ("B1", None, None, "B1"),
        ("A2", Some("A1"), Some(ParentLink::ToolCall), "A1"),
        ("B2", Some("B1"), Some(ParentLink::ToolCall), "B1"),
        ("A3", Some("A2"), Some(ParentLink::ToolCall), "A1"),
        ("B3", Some("B2"), Some(ParentLink::ToolCall), "B1"),
        ("R1", None, None, "R1"),
        ("R2", Some("R1"), Some(ParentLink::PreviousResponse), "R1"),
        ("R3", Some("R2"), Some(ParentLink::PreviousResponse), "R1"),
    ] {
        assert_eq!(
            parent(n),
            (p.and_then(rid), how, rid(session)),
            "{n}: {:?}",
            id[n]
        );
    }
    // The tool columns: offered and made, named (bodies are kept).
    assert_eq!(id["A1"].tools_offered, Some(2));
    assert_eq!(
        id["A1"].tool_call_names,
        Some(vec!["get_weather".to_string()])
    );
    assert_eq!(id["A2"].tool_call_names, Some(vec!["get_time".to_string()]));
    assert_eq!(id["A3"].tool_calls, Some(0));
    assert!(id["A2"].think_time_us.is_some_and(|t| t >= 0));
}

// ---------------------------------------------------------------------------------------
// What capture does not record
// ---------------------------------------------------------------------------------------

/// 200 requests on paths capture does not record (GET /v1/models, a made-up path, a
/// streamed and a whole POST to another made-up path) through capture, on one keep-alive
/// client connection, to an upstream that closes its connection right after every streamed
/// response while advertising keep-alive (llama.cpp's server): every one is answered by the
/// upstream (no 502 of capture's own), each reaches the upstream exactly once, nothing is
/// recorded, and capture says once per path what it does not record.
#[test]
fn unrecorded_paths_are_forwarded_once_each_without_an_error_of_captures_own() {
    let _alone = serial();
    let server = MisbehavingServer::start(Behaviour::close_after_every_stream(ms(1)));
    let out = tmpdir("apis-unrecorded");
    let listen = free_addr();
    let mut cap = CaptureProc::spawn(listen, &server.url(), &out, &["--flush-interval", "50ms"]);
    cap.wait_for("listening on");
    let mut client = Http1Client::new(listen);
    let n = 200;
    let mut problems = Vec::new();
    for i in 0..n {
        let rid = format!("u-{i:03}");
        let h = [("x-request-id", rid.as_str())];
        let (got, want) = match i % 4 {
            0 => (client.send("GET", "/v1/models", &h, None), 200),
            1 => (client.send("GET", "/made/up", &h, None), 404),
            2 => (
                client.post(
                    "/custom/generate",
                    &h,
                    r#"{"prompt":"a b","max_tokens":3,"stream":true}"#,
                ),
                200,
            ),
            _ => (
                client.post("/custom/generate", &h, r#"{"prompt":"a b","max_tokens":3}"#),
                200,
            ),
        };
        match got {
            Ok(r) if r.status == want => {
                if i % 4 == 2 && !r.text().contains("data: [DONE]") {
                    problems.push(format!("{rid}: a stream without its end"));
                }
            }
            Ok(r) => problems.push(format!(
                "{rid}: status {} (want {want}): {}",
                r.status,
                r.text()
            )),
            Err(e) => problems.push(format!("{rid}: {e}")),
        }
    }
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
    let served = server.requests();
    for i in 0..n {
        let rid = format!("u-{i:03}");
        let times = served
            .iter()
            .filter(|s| s.request_id.as_deref() == Some(&rid))
            .count();
        if times != 1 {
            problems.push(format!("{rid} reached the upstream {times} times"));
        }
    }
    let notices: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("without recording it"))
        .collect();
    if notices.len() != 3 {
        problems.push(format!(
            "{} notices, want 3 (one per method and path): {notices:#?}",
            notices.len()
        ));
    }
    let written =
        trace_format::read_traces(&[out.to_str().unwrap()]).map_or(0, |t| t.records.len());
    if written != 0 {
        problems.push(format!(
            "{written} rows written for requests capture does not record"
        ));
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        problems.is_empty(),
        "{} problems of {n} requests:\n{}\nupstream connections: {}",
        problems.len(),
        problems.join("\n"),
        server.count(support::misbehaving::ConnEnd::Accepted)
    );
}
