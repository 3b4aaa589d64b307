//! Responses and Messages streams and bodies, shaped as OpenAI's and Anthropic's API
//! references print them, read through the one parser, tally and verdict.

use super::*;
use crate::api::Api;
use crate::response_verdict::{
    judge_stream, judge_whole, End, Outcome, Rules, StreamTally, Verdict,
};

/// Feeds `events` (data payloads, each sent as `event: …` + `data: …` as the servers frame
/// them) one per 10 µs through the parser into a tally; also returns each output chunk's
/// text and the tool call pieces.
fn run(api: Api, events: &[&str]) -> (StreamTally, Vec<ChunkText>) {
    let mut p = SseParser::new();
    let mut t = StreamTally::default();
    let mut texts = Vec::new();
    let mut buf = ChunkText::default();
    for (i, e) in events.iter().enumerate() {
        let ty = serde_json::from_str::<serde_json::Value>(e)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
            .unwrap_or_default();
        let framed = format!("event: {ty}\ndata: {e}\n\n");
        p.feed(framed.as_bytes(), |d| {
            if t.note(10 * (i as i64 + 1), read_event_of(api, d, Some(&mut buf))) {
                texts.push(buf.clone());
            }
        });
    }
    (t, texts)
}

fn verdict(api: Api, events: &[&str]) -> (Verdict, StreamTally, Vec<ChunkText>) {
    let (t, texts) = run(api, events);
    (judge_stream(200, &t, End::Complete), t, texts)
}

const R_CREATED: &str = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"model":"m","output":[],"previous_response_id":null,"usage":null,"metadata":{}}}"#;
const R_IN_PROGRESS: &str = r#"{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67c9","object":"response","status":"in_progress","output":[],"usage":null}}"#;
const R_MSG_ADDED: &str = r#"{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#;
const R_PART_ADDED: &str = r#"{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#;
const R_TEXT_DONE: &str = r#"{"type":"response.output_text.done","item_id":"msg_1","output_index":0,"content_index":0,"text":"Hi there"}"#;
const R_COMPLETED: &str = r#"{"type":"response.completed","sequence_number":9,"response":{"id":"resp_67c9","object":"response","status":"completed","error":null,"output":[{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there","annotations":[]}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":32},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":48}}}"#;

fn r_delta(kind: &str, d: &str) -> String {
    format!(
        r#"{{"type":"response.{kind}.delta","item_id":"x","output_index":0,"content_index":0,"delta":{d}}}"#
    )
}

#[test]
fn a_responses_stream_reads_as_a_chat_stream_does() {
    let reasoning = r_delta("reasoning_summary_text", r#""Think""#);
    let reasoning2 = r_delta("reasoning_text", r#""ing""#);
    let empty = r_delta("output_text", r#""""#);
    let hi = r_delta("output_text", r#""Hi""#);
    let there = r_delta("output_text", r#"" there""#);
    let (v, t, texts) = verdict(
        Api::Responses,
        &[
            R_CREATED,
            R_IN_PROGRESS,
            &reasoning,
            &reasoning2,
            R_MSG_ADDED,
            R_PART_ADDED,
            &empty,
            &hi,
            &there,
            R_TEXT_DONE,
            R_COMPLETED,
        ],
    );
    assert_eq!(v.outcome, Outcome::Ok, "{v:?}");
    assert_eq!(v.response_id.as_deref(), Some("resp_67c9"));
    assert_eq!(
        (
            v.prompt_tokens,
            v.completion_tokens,
            v.reasoning_tokens,
            v.cached_tokens
        ),
        (Some(37), Some(11), Some(4), Some(32))
    );
    // Output at the two reasoning deltas and the two non-empty text deltas; the empty
    // delta, the lifecycle events and the .done events carry none.
    assert_eq!(t.chunk_times_us, [30, 40, 80, 90]);
    assert_eq!(t.first_answer_us, Some(80));
    assert_eq!(t.reasoning_chunks, 2);
    // The response ends at its final event.
    assert_eq!(t.last_chunk_us, Some(110));
    let answer: String = texts.iter().map(|c| c.answer.as_str()).collect();
    let output: String = texts.iter().map(|c| c.output.as_str()).collect();
    let reasoning: String = texts.iter().map(|c| c.reasoning.as_str()).collect();
    assert_eq!(
        (answer.as_str(), output.as_str(), reasoning.as_str()),
        ("Hi there", "ThinkingHi there", "Thinking")
    );
}

#[test]
fn a_responses_function_call_split_over_many_events_is_one_call() {
    let added = r#"{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_abc","name":"get_weather","arguments":""}}"#;
    let pieces = ["{\\\"loc", "ation\\\":", "\\\"Paris\\\"}"];
    let deltas: Vec<String> = pieces
        .iter()
        .map(|p| {
            format!(
                r#"{{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":1,"delta":"{p}"}}"#
            )
        })
        .collect();
    let done = r#"{"type":"response.function_call_arguments.done","item_id":"fc_1","output_index":1,"arguments":"{\"location\":\"Paris\"}"}"#;
    let mut events = vec![R_CREATED, added];
    events.extend(deltas.iter().map(String::as_str));
    events.extend([done, R_COMPLETED]);
    let (v, t, texts) = verdict(Api::Responses, &events);
    assert_eq!(v.outcome, Outcome::Ok);
    assert_eq!(
        t.chunk_times_us.len(),
        4,
        "the call opened, three argument pieces"
    );
    assert_eq!(t.first_answer_us, Some(20), "a call is answer output");
    let calls: Vec<(Option<u64>, String, String, String)> = texts
        .iter()
        .flat_map(|c| {
            c.tool_calls()
                .map(|p| (p.index, p.id.into(), p.name.into(), p.arguments.into()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        calls[0],
        (
            Some(1),
            "call_abc".into(),
            "get_weather".into(),
            String::new()
        )
    );
    let args: String = calls[1..].iter().map(|c| c.3.as_str()).collect();
    assert_eq!(args, r#"{"location":"Paris"}"#);
    assert!(calls[1..].iter().all(|c| c.0 == Some(1) && c.1.is_empty()));
}

#[test]
fn a_failed_or_erroring_responses_stream_is_the_servers_failure() {
    let failed = r#"{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"The model crashed"},"usage":null}}"#;
    let hi = r_delta("output_text", r#""Hi""#);
    let (v, t, _) = verdict(Api::Responses, &[R_CREATED, &hi, failed]);
    assert_eq!(v.outcome, Outcome::UpstreamError);
    assert_eq!(
        v.error.as_deref(),
        Some("error event in stream: The model crashed")
    );
    assert_eq!(t.chunk_times_us, [20]);
    let err = r#"{"type":"error","code":"rate_limit_exceeded","message":"Slow down","param":null,"sequence_number":3}"#;
    let (v, _, _) = verdict(Api::Responses, &[R_CREATED, err]);
    assert_eq!(v.error.as_deref(), Some("error event in stream: Slow down"));
    // Cut before its final event: the same rule as a chat stream without [DONE].
    let (v, _, _) = verdict(Api::Responses, &[R_CREATED, &hi]);
    assert_eq!(v.outcome, Outcome::UpstreamError);
    assert_eq!(
        v.error.as_deref(),
        Some("stream ended without its final event after 1 chunks")
    );
}

#[test]
fn an_incomplete_response_ended_as_the_server_meant_with_its_usage() {
    let hi = r_delta("output_text", r#""Hi""#);
    let incomplete = r#"{"type":"response.incomplete","response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":5,"output_tokens":16}}}"#;
    let (v, t, _) = verdict(Api::Responses, &[R_CREATED, &hi, incomplete]);
    assert_eq!(v.outcome, Outcome::Ok);
    assert_eq!((v.prompt_tokens, v.completion_tokens), (Some(5), Some(16)));
    assert_eq!(t.last_chunk_us, Some(30));
}

#[test]
fn a_refusal_is_answer_output() {
    let r = r_delta("refusal", r#""I can't""#);
    let (v, t, texts) = verdict(Api::Responses, &[R_CREATED, &r, R_COMPLETED]);
    assert_eq!(v.outcome, Outcome::Ok);
    assert_eq!(t.first_answer_us, Some(20));
    assert_eq!(texts[0].answer, "I can't");
}

const M_START: &str = r#"{"type": "message_start", "message": {"id": "msg_1nZd", "type": "message", "role": "assistant", "content": [], "model": "claude", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 2000, "output_tokens": 1}}}"#;
const M_PING: &str = r#"{"type": "ping"}"#;
const M_TEXT_START: &str =
    r#"{"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}"#;
const M_STOP_BLOCK: &str = r#"{"type": "content_block_stop", "index": 1}"#;
const M_DELTA: &str = r#"{"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence":null}, "usage": {"output_tokens": 15}}"#;
const M_STOP: &str = r#"{"type": "message_stop"}"#;

fn m_delta(index: u32, kind: &str, field: &str, v: &str) -> String {
    format!(
        r#"{{"type": "content_block_delta", "index": {index}, "delta": {{"type": "{kind}", "{field}": {v}}}}}"#
    )
}

#[test]
fn a_messages_stream_with_thinking_and_a_ping_before_output() {
    let think_start = r#"{"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}"#;
    let think = m_delta(0, "thinking_delta", "thinking", r#""Let me""#);
    let sig = m_delta(0, "signature_delta", "signature", r#""EqQBCgIYAhIM""#);
    let hello = m_delta(1, "text_delta", "text", r#""Hello""#);
    let bang = m_delta(1, "text_delta", "text", r#""!""#);
    let (v, t, texts) = verdict(
        Api::Messages,
        &[
            M_START,
            M_PING,
            think_start,
            &think,
            &sig,
            M_TEXT_START,
            &hello,
            &bang,
            M_STOP_BLOCK,
            M_DELTA,
            M_STOP,
        ],
    );
    assert_eq!(v.outcome, Outcome::Ok, "{v:?}");
    assert_eq!(v.response_id.as_deref(), Some("msg_1nZd"));
    // The prompt is the input plus both cache parts; the cache read is the cached part; the
    // output count is message_delta's, over message_start's 1.
    assert_eq!(
        (v.prompt_tokens, v.completion_tokens, v.cached_tokens),
        (Some(2125), Some(15), Some(2000))
    );
    assert_eq!(
        t.chunk_times_us,
        [40, 70, 80],
        "the ping and the signature are not output"
    );
    assert_eq!(t.first_answer_us, Some(70));
    assert_eq!(t.reasoning_chunks, 1);
    assert_eq!(t.last_chunk_us, Some(110));
    let answer: String = texts.iter().map(|c| c.answer.as_str()).collect();
    let reasoning: String = texts.iter().map(|c| c.reasoning.as_str()).collect();
    assert_eq!((answer.as_str(), reasoning.as_str()), ("Hello!", "Let me"));
}

#[test]
fn a_messages_tool_use_block_split_over_many_events_is_one_call() {
    let start = r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1","name":"get_weather","input":{}}}"#;
    let empty = m_delta(1, "input_json_delta", "partial_json", r#""""#);
    let a = m_delta(
        1,
        "input_json_delta",
        "partial_json",
        r#""{\"location\": \"San Fra""#,
    );
    let b = m_delta(1, "input_json_delta", "partial_json", r#""ncisco\"}""#);
    let (v, t, texts) = verdict(
        Api::Messages,
        &[
            M_START,
            start,
            &empty,
            &a,
            &b,
            M_STOP_BLOCK,
            M_DELTA,
            M_STOP,
        ],
    );
    assert_eq!(v.outcome, Outcome::Ok);
    assert_eq!(
        t.chunk_times_us,
        [20, 40, 50],
        "an empty piece is not output"
    );
    let pieces: Vec<(Option<u64>, String, String, String)> = texts
        .iter()
        .flat_map(|c| {
            c.tool_calls()
                .map(|p| (p.index, p.id.into(), p.name.into(), p.arguments.into()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        pieces[0],
        (
            Some(1),
            "toolu_01T1".into(),
            "get_weather".into(),
            String::new()
        )
    );
    let args: String = pieces[1..].iter().map(|c| c.3.as_str()).collect();
    assert_eq!(args, r#"{"location": "San Francisco"}"#);
}

#[test]
fn an_error_event_mid_messages_stream_is_the_servers_failure_with_its_message() {
    let hello = m_delta(1, "text_delta", "text", r#""Hello""#);
    let err =
        r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#;
    let (v, t, _) = verdict(Api::Messages, &[M_START, M_TEXT_START, &hello, err]);
    assert_eq!(v.outcome, Outcome::UpstreamError);
    assert_eq!(
        v.error.as_deref(),
        Some("error event in stream: Overloaded")
    );
    assert_eq!(t.chunk_times_us, [30]);
    assert_eq!(
        v.prompt_tokens,
        Some(2125),
        "what came before the error is kept"
    );
}

#[test]
fn unknown_typed_events_and_members_of_other_shapes_are_read_not_rejected() {
    // A future event whose `delta` is an object, one whose `item` is a string-less object.
    let odd = r#"{"type":"response.audio.delta","delta":{"bytes":"AAA"},"item":{"type":7}}"#;
    assert_eq!(
        read_event_of(Api::Responses, odd.as_bytes(), None),
        StreamEvent::Chunk {
            usage: None,
            output: false,
            answer: false
        }
    );
    assert_eq!(
        read_event_of(Api::Messages, b"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"citations_delta\",\"citation\":{}}}", None),
        StreamEvent::Chunk { usage: None, output: false, answer: false }
    );
    for api in [Api::Responses, Api::Messages] {
        assert_eq!(read_event_of(api, b"not json", None), StreamEvent::Invalid);
        assert_eq!(
            read_event_of(api, b"{\"no\":\"type\"}", None),
            StreamEvent::Invalid
        );
        assert_eq!(read_event_of(api, b"[DONE]", None), StreamEvent::Done);
    }
    // Escaped text is unescaped into the chunk's text.
    let mut buf = ChunkText::default();
    let esc = r_delta("output_text", r#""a\"b\u00e9""#);
    read_event_of(Api::Responses, esc.as_bytes(), Some(&mut buf));
    assert_eq!(buf.answer, "a\"bé");
}

#[test]
fn whole_responses_and_messages_bodies() {
    let resp = r#"{"id":"resp_9","object":"response","status":"completed","error":null,"output":[
        {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Plan. "}],"content":[{"type":"reasoning_text","text":"Deep."}]},
        {"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Paris.","annotations":[]}]},
        {"type":"function_call","id":"fc_1","call_id":"call_1","name":"lookup","arguments":"{\"q\":1}"}],
        "usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":30,"output_tokens_details":{"reasoning_tokens":20}}}"#;
    let w = read_whole(Api::Responses, resp.as_bytes()).unwrap();
    assert_eq!(w.id.as_deref(), Some("resp_9"));
    assert_eq!(w.answer, "Paris.");
    assert_eq!(w.reasoning, "Plan. Deep.");
    assert_eq!(w.output, "Plan. Deep.Paris.lookup{\"q\":1}");
    assert_eq!(
        w.calls,
        [WholeCall {
            id: "call_1".into(),
            name: "lookup".into(),
            arguments: "{\"q\":1}".into()
        }]
    );
    let v = judge_whole(
        Api::Responses,
        200,
        resp.as_bytes(),
        false,
        End::Complete,
        Rules::CAPTURE,
    );
    assert_eq!(v.outcome, Outcome::Ok);
    assert_eq!(
        (
            v.prompt_tokens,
            v.completion_tokens,
            v.reasoning_tokens,
            v.cached_tokens
        ),
        (Some(12), Some(30), Some(20), Some(0))
    );
    assert_eq!(v.response_id.as_deref(), Some("resp_9"));
    let failed = br#"{"id":"resp_8","status":"failed","error":{"code":"server_error","message":"boom"},"output":[]}"#;
    let v = judge_whole(
        Api::Responses,
        200,
        failed,
        false,
        End::Complete,
        Rules::REPLAY,
    );
    assert_eq!(v.outcome, Outcome::UpstreamError);
    assert_eq!(v.error.as_deref(), Some("response failed: boom"));

    let msg = r#"{"id":"msg_01","type":"message","role":"assistant","content":[
        {"type":"thinking","thinking":"Hmm.","signature":"x"},
        {"type":"text","text":"Sure."},
        {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"location":"SF"}}],
        "stop_reason":"tool_use","usage":{"input_tokens":10,"cache_read_input_tokens":90,"output_tokens":7}}"#;
    let w = read_whole(Api::Messages, msg.as_bytes()).unwrap();
    assert_eq!((w.answer.as_str(), w.reasoning.as_str()), ("Sure.", "Hmm."));
    assert_eq!(w.output, "Hmm.Sure.get_weather{\"location\":\"SF\"}");
    assert_eq!(
        w.calls,
        [WholeCall {
            id: "toolu_1".into(),
            name: "get_weather".into(),
            arguments: "{\"location\":\"SF\"}".into()
        }]
    );
    let v = judge_whole(
        Api::Messages,
        200,
        msg.as_bytes(),
        false,
        End::Complete,
        Rules::CAPTURE,
    );
    assert_eq!(
        (v.prompt_tokens, v.completion_tokens, v.cached_tokens),
        (Some(100), Some(7), Some(90))
    );
    assert_eq!(v.response_id.as_deref(), Some("msg_01"));
    let v = judge_whole(
        Api::Messages,
        200,
        b"<html>",
        false,
        End::Complete,
        Rules::CAPTURE,
    );
    assert_eq!(v.error.as_deref(), Some("response is not JSON"));
    let v = judge_whole(
        Api::Messages,
        200,
        b"[1]",
        false,
        End::Complete,
        Rules::CAPTURE,
    );
    assert_eq!(v.error.as_deref(), Some("response is not JSON"));
}

#[test]
fn chat_reads_its_cached_tokens_too() {
    let body = br#"{"id":"c1","choices":[{"message":{"content":"hi","tool_calls":[{"id":"call_9","type":"function","function":{"name":"f","arguments":"{}"}}]}}],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#;
    let w = read_whole(Api::Chat, body).unwrap();
    assert_eq!(
        (w.answer.as_str(), w.calls.len(), w.calls[0].id.as_str()),
        ("hi", 1, "call_9")
    );
    let v = judge_whole(Api::Chat, 200, body, false, End::Complete, Rules::CAPTURE);
    assert_eq!(v.cached_tokens, Some(8));
    assert_eq!(v.response_id.as_deref(), Some("c1"));
}
