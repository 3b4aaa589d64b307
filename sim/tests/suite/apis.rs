//! The APIs beyond completions and chat on 127.0.0.1: Responses and Messages streamed and
//! whole, read back through wire's one reader and verdict (what capture and replay use), with
//! their event sequences, ids, `previous_response_id`, tool calls, served model names, the
//! pooling APIs and faults.

use std::time::Duration;

use serde_json::{json, Value};
use sim::{start, Reasoning, SimConfig, SimHandle, Timing};
use wire::api::Api;
use wire::response_verdict::{
    judge_stream, judge_whole, End, Outcome, Rules, StreamTally, Verdict,
};
use wire::sse::{read_event_of, ChunkText, SseParser};

use crate::util::{post, request, Reply};

fn cfg() -> SimConfig {
    SimConfig {
        timing: Timing::Fixed {
            ttft: Duration::from_millis(1),
            itl: Duration::from_millis(1),
        },
        ..SimConfig::default()
    }
}

async fn server(cfg: SimConfig) -> SimHandle {
    start("127.0.0.1:0".parse().unwrap(), cfg)
        .await
        .expect("start")
}

/// The event types of a typed stream, in order.
fn types(r: &Reply) -> Vec<String> {
    r.chunks()
        .iter()
        .map(|c| c["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// A stream read as capture and replay read it: its verdict, tally and answer text.
fn read_stream(api: Api, r: &Reply) -> (Verdict, StreamTally, String, String) {
    let mut p = SseParser::new();
    let mut t = StreamTally::default();
    let mut text = ChunkText::default();
    let (mut answer, mut args) = (String::new(), String::new());
    let mut i = 0;
    p.feed(&r.body, |d| {
        i += 1;
        if t.note(i, read_event_of(api, d, Some(&mut text))) {
            answer.push_str(&text.answer);
            for c in text.tool_calls() {
                args.push_str(c.arguments);
            }
        }
    });
    let end = if r.complete {
        End::Complete
    } else {
        End::Broken("cut".into())
    };
    (judge_stream(r.status, &t, end), t, answer, args)
}

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

fn responses(input: Value, max: u32, stream: bool) -> Value {
    json!({"model": "m", "input": input, "max_output_tokens": max, "ignore_eos": true, "stream": stream})
}

#[tokio::test]
async fn a_responses_stream_is_the_event_sequence_openai_sends_and_reads_as_chat_does() {
    let h = server(cfg()).await;
    let r = post(
        h.addr(),
        "/v1/responses",
        responses(json!("one two three"), 5, true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert!(
        String::from_utf8_lossy(&r.body).starts_with("event: response.created\ndata: {"),
        "each event names its type"
    );
    let t = types(&r);
    let mut want: Vec<&str> = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(["response.output_text.delta"; 5]);
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        // max_output_tokens reached: incomplete, as OpenAI ends it.
        "response.incomplete",
    ]);
    assert_eq!(t, want);
    let seqs: Vec<u64> = r
        .chunks()
        .iter()
        .map(|c| c["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    let (v, tally, answer, _) = read_stream(Api::Responses, &r);
    assert_eq!(v.outcome, Outcome::Ok, "{v:?}");
    assert!(v.response_id.as_deref().unwrap().starts_with("resp_"));
    assert_eq!(
        (
            v.prompt_tokens,
            v.completion_tokens,
            v.reasoning_tokens,
            v.cached_tokens
        ),
        (Some(3), Some(5), Some(0), Some(0))
    );
    assert_eq!(tally.chunk_times_us.len(), 5);
    assert_eq!(words(&answer), 5);
    let last = r.chunks().pop().unwrap();
    assert_eq!(
        last["response"]["output"][0]["content"][0]["text"],
        answer.as_str()
    );

    // Whole: the same response object.
    let r = post(
        h.addr(),
        "/v1/responses",
        responses(json!("one two three"), 4, false),
    )
    .await;
    let v = judge_whole(
        Api::Responses,
        r.status,
        &r.body,
        false,
        End::Complete,
        Rules::REPLAY,
    );
    assert_eq!((v.outcome, v.completion_tokens), (Outcome::Ok, Some(4)));
    let w = wire::sse::read_whole(Api::Responses, &r.body).unwrap();
    assert_eq!(words(&w.answer), 4);
    assert_eq!(r.json()["object"], "response");
    h.shutdown().await;
}

#[tokio::test]
async fn previous_response_id_continues_the_conversation_and_an_unknown_one_is_404() {
    let h = server(cfg()).await;
    let a = post(
        h.addr(),
        "/v1/responses",
        responses(json!("a b c d"), 3, false),
    )
    .await;
    let id = a.json()["id"].as_str().unwrap().to_string();
    assert_eq!(a.json()["usage"]["input_tokens"], 4);
    // The second turn is prefilled on the first's prompt and answer, and its own input.
    let mut b = responses(json!([{"role": "user", "content": "e f"}]), 2, true);
    b["previous_response_id"] = json!(id);
    let r = post(h.addr(), "/v1/responses", b.clone()).await;
    let (v, ..) = read_stream(Api::Responses, &r);
    assert_eq!((v.outcome, v.prompt_tokens), (Outcome::Ok, Some(4 + 3 + 2)));
    let created = &r.chunks()[0]["response"];
    assert_eq!(created["previous_response_id"], id.as_str());
    // A third turn on the second.
    let mut c = responses(json!("g"), 1, false);
    c["previous_response_id"] = json!(v.response_id.clone().unwrap());
    let r = post(h.addr(), "/v1/responses", c).await;
    assert_eq!(r.json()["usage"]["input_tokens"], 9 + 2 + 1);

    // An id the sim never issued: 404, as OpenAI and vLLM answer it; nothing is generated.
    b["previous_response_id"] = json!("resp_captured_elsewhere");
    let r = post(h.addr(), "/v1/responses", b.clone()).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
    let v = judge_whole(
        Api::Responses,
        r.status,
        &r.body,
        true,
        End::Complete,
        Rules::REPLAY,
    );
    assert_eq!(v.outcome, Outcome::HttpError);
    // A response not stored cannot be continued.
    let mut d = responses(json!("x"), 1, false);
    d["store"] = json!(false);
    let r = post(h.addr(), "/v1/responses", d).await;
    assert_eq!(r.json()["store"], false);
    b["previous_response_id"] = r.json()["id"].clone();
    assert_eq!(post(h.addr(), "/v1/responses", b).await.status, 404);
    h.shutdown().await;

    // Ids differ from one sim to the next, so a trace's ids mean nothing to another sim.
    let (h1, h2) = (server(cfg()).await, server(cfg()).await);
    let one = post(h1.addr(), "/v1/responses", responses(json!("a"), 1, false)).await;
    let two = post(h2.addr(), "/v1/responses", responses(json!("a"), 1, false)).await;
    assert_ne!(one.json()["id"], two.json()["id"]);
    h1.shutdown().await;
    h2.shutdown().await;
}

fn messages(content: Value, max: u32, stream: bool) -> Value {
    json!({"model": "claude", "max_tokens": max, "ignore_eos": true, "stream": stream,
        "messages": [{"role": "user", "content": content}]})
}

#[tokio::test]
async fn a_messages_stream_with_thinking_is_the_sequence_anthropic_sends() {
    let mut c = cfg();
    c.reasoning = Reasoning {
        share: 1.0,
        fraction: 0.5,
        details: false,
    };
    let h = server(c).await;
    let r = post(
        h.addr(),
        "/v1/messages",
        messages(json!("hello there"), 6, true),
    )
    .await;
    assert_eq!(r.status, 200);
    let t = types(&r);
    let mut want = vec!["message_start", "ping", "content_block_start"];
    want.extend(["content_block_delta"; 3 + 1]); // thinking, then its signature
    want.extend(["content_block_stop", "content_block_start"]);
    want.extend(["content_block_delta"; 3]);
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(t, want);
    let ch = r.chunks();
    assert_eq!(ch[2]["content_block"]["type"], "thinking");
    assert_eq!(ch[6]["delta"]["type"], "signature_delta");
    assert_eq!(ch[9]["delta"]["type"], "text_delta");
    assert_eq!(ch[13]["delta"]["stop_reason"], "max_tokens");
    let (v, tally, answer, _) = read_stream(Api::Messages, &r);
    assert_eq!(v.outcome, Outcome::Ok, "{v:?}");
    assert!(v.response_id.as_deref().unwrap().starts_with("msg_"));
    assert_eq!((v.prompt_tokens, v.completion_tokens), (Some(2), Some(6)));
    assert_eq!((tally.chunk_times_us.len(), tally.reasoning_chunks), (6, 3));
    assert_eq!(words(&answer), 3);

    let r = post(
        h.addr(),
        "/v1/messages",
        messages(json!([{"type": "text", "text": "a b c"}]), 4, false),
    )
    .await;
    let body = r.json();
    assert_eq!(
        (body["type"].as_str(), body["stop_reason"].as_str()),
        (Some("message"), Some("max_tokens"))
    );
    assert_eq!(body["content"][0]["type"], "thinking");
    let v = judge_whole(
        Api::Messages,
        r.status,
        &r.body,
        false,
        End::Complete,
        Rules::REPLAY,
    );
    assert_eq!(
        (v.outcome, v.prompt_tokens, v.completion_tokens),
        (Outcome::Ok, Some(3), Some(4))
    );
    // Anthropic's API requires max_tokens, and answers errors in its own shape.
    let r = post(
        h.addr(),
        "/v1/messages",
        json!({"messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        (
            r.json()["type"].as_str(),
            r.json()["error"]["type"].as_str()
        ),
        (Some("error"), Some("invalid_request_error"))
    );
    h.shutdown().await;
}

#[tokio::test]
async fn tools_are_called_with_their_arguments_streamed_and_a_tool_result_is_answered() {
    let mut c = cfg();
    c.tool_calls = 1.0;
    let h = server(c).await;
    // Responses: a function_call item, its arguments over many deltas.
    let mut req = responses(json!("weather in Paris"), 6, true);
    req["tools"] = json!([{"type": "function", "name": "get_weather", "parameters": {}}]);
    let r = post(h.addr(), "/v1/responses", req.clone()).await;
    let t = types(&r);
    assert_eq!(
        t.iter()
            .filter(|t| *t == "response.function_call_arguments.delta")
            .count(),
        6
    );
    assert!(t.contains(&"response.function_call_arguments.done".to_string()));
    assert_eq!(t.last().unwrap(), "response.completed");
    let (v, tally, _, args) = read_stream(Api::Responses, &r);
    assert_eq!(v.outcome, Outcome::Ok);
    assert_eq!(
        tally.chunk_times_us.len(),
        1 + 6,
        "the call opened, six pieces"
    );
    let parsed: Value = serde_json::from_str(&args).expect("the arguments are JSON");
    assert_eq!(words(parsed["input"].as_str().unwrap()), 6);
    let item = r.chunks().last().unwrap()["response"]["output"][0].clone();
    assert_eq!(
        (item["type"].as_str(), item["name"].as_str()),
        (Some("function_call"), Some("get_weather"))
    );
    assert_eq!(item["arguments"].as_str(), Some(args.as_str()));
    // The call's output sent back: answered with text.
    let call_id = item["call_id"].clone();
    req["input"] = json!([{"role": "user", "content": "weather in Paris"}, item,
        {"type": "function_call_output", "call_id": call_id, "output": "sunny"}]);
    req["stream"] = json!(false);
    let r = post(h.addr(), "/v1/responses", req).await;
    assert_eq!(r.json()["output"][0]["type"], "message");

    // Messages: a tool_use block, input_json_delta pieces, stop_reason tool_use.
    let mut req = messages(json!("weather?"), 5, true);
    req["tools"] = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let r = post(h.addr(), "/v1/messages", req.clone()).await;
    let ch = r.chunks();
    assert_eq!(ch[2]["content_block"]["type"], "tool_use");
    let (v, _, _, args) = read_stream(Api::Messages, &r);
    assert_eq!(v.outcome, Outcome::Ok);
    assert!(serde_json::from_str::<Value>(&args).is_ok(), "{args}");
    let stop = ch.iter().find(|c| c["type"] == "message_delta").unwrap();
    assert_eq!(stop["delta"]["stop_reason"], "tool_use");
    req["stream"] = json!(false);
    let whole = post(h.addr(), "/v1/messages", req.clone()).await.json();
    let tool_use = &whole["content"][0];
    assert_eq!(tool_use["type"], "tool_use");
    assert!(tool_use["input"]["input"].is_string());
    req["messages"] = json!([{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [tool_use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "sunny"}]}]);
    let r = post(h.addr(), "/v1/messages", req).await;
    assert_eq!(r.json()["content"][0]["type"], "text");
    h.shutdown().await;
}

#[tokio::test]
async fn only_the_served_model_names_are_answered() {
    let mut c = cfg();
    c.model_name = "a".into();
    c.served_models = vec!["a".into(), "b".into()];
    let h = server(c).await;
    let models = request(h.addr(), "GET", "/v1/models", &[], "").await.json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "c", "messages": [{"role": "user", "content": "x"}]}),
        ),
        ("/v1/responses", json!({"model": "c", "input": "x"})),
        ("/v1/embeddings", json!({"model": "c", "input": "x"})),
    ] {
        let r = post(h.addr(), path, body.clone()).await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(
            r.json()["error"]["message"],
            "The model `c` does not exist."
        );
        let mut ok = body;
        ok["model"] = json!("b");
        assert_eq!(post(h.addr(), path, ok).await.status, 200, "{path}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn embeddings_rerank_and_score_are_answered_whole() {
    let h = server(cfg()).await;
    let r = post(
        h.addr(),
        "/v1/embeddings",
        json!({"model": "m", "input": ["a b", "c"]}),
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert!(v["data"][1]["embedding"].as_array().unwrap().len() >= 8);
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    let verdict = judge_whole(
        Api::Embeddings,
        r.status,
        &r.body,
        false,
        End::Complete,
        Rules::REPLAY,
    );
    assert_eq!(
        (verdict.outcome, verdict.prompt_tokens),
        (Outcome::Ok, Some(3))
    );
    for path in ["/v1/rerank", "/rerank", "/v2/rerank"] {
        let r = post(
            h.addr(),
            path,
            json!({"query": "q", "documents": ["a", "b c", "d"]}),
        )
        .await;
        let results = r.json()["results"].as_array().unwrap().clone();
        assert_eq!(results.len(), 3, "{path}");
        assert!(results[0]["relevance_score"].as_f64() >= results[2]["relevance_score"].as_f64());
    }
    let r = post(
        h.addr(),
        "/v1/score",
        json!({"text_1": "a", "text_2": ["b", "c"]}),
    )
    .await;
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        request(h.addr(), "GET", "/v1/embeddings", &[], "")
            .await
            .status,
        405
    );
    h.shutdown().await;
}

#[tokio::test]
async fn faults_act_on_the_new_apis_as_on_chat() {
    let h = server(cfg()).await;
    let send = |path: &'static str, body: Value, fault: &'static str| {
        let addr = h.addr();
        async move {
            request(
                addr,
                "POST",
                path,
                &[("x-sim-fault", fault)],
                &body.to_string(),
            )
            .await
        }
    };
    // A reset stream ends without its final event: the server's failure.
    let r = send("/v1/responses", responses(json!("a b"), 8, true), "reset").await;
    let (v, tally, ..) = read_stream(Api::Responses, &r);
    assert_eq!(v.outcome, Outcome::UpstreamError, "{v:?}");
    assert_eq!(tally.chunk_times_us.len(), 2);
    let r = send("/v1/messages", messages(json!("a"), 8, true), "reset").await;
    assert_eq!(
        read_stream(Api::Messages, &r).0.outcome,
        Outcome::UpstreamError
    );
    // An error status in the API's own shape.
    let r = send("/v1/messages", messages(json!("a"), 8, true), "error").await;
    assert_eq!((r.status, r.json()["type"].as_str()), (500, Some("error")));
    let r = send(
        "/v1/responses",
        responses(json!("a"), 8, false),
        "rate-limit",
    )
    .await;
    assert_eq!(r.status, 429);
    assert!(r.json()["error"]["message"].is_string());
    h.shutdown().await;
}
