//! The HTTP server on 127.0.0.1, port 0, real sockets.

use std::time::Duration;

use serde_json::json;
use sim::{start, Faults, Profile, SimConfig, SimHandle, Timing};

use crate::util::{post, request, request_inner};

fn fixed(ttft_ms: u64, itl_ms: u64) -> SimConfig {
    SimConfig {
        timing: Timing::Fixed {
            ttft: Duration::from_millis(ttft_ms),
            itl: Duration::from_millis(itl_ms),
        },
        ..SimConfig::default()
    }
}

async fn server(cfg: SimConfig) -> SimHandle {
    start("127.0.0.1:0".parse().unwrap(), cfg)
        .await
        .expect("start")
}

fn chat(words: &str, max_tokens: u32, stream: bool) -> serde_json::Value {
    json!({
        "model": "whatever",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

#[tokio::test]
async fn streamed_chat_is_vllm_shaped() {
    let h = server(fixed(1, 1)).await;
    assert!(h.url().starts_with("http://127.0.0.1:"));
    let r = post(
        h.addr(),
        "/v1/chat/completions",
        chat("one two three four five", 7, true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert!(r.complete, "body not terminated");
    // every event is `data: ...\n\n`, ending with [DONE]
    assert!(r.body.starts_with(b"data: "));
    assert!(r.body.ends_with(b"data: [DONE]\n\n"));
    assert_eq!(r.events.last().unwrap().1, "[DONE]");
    let chunks = r.chunks();
    // role chunk, 7 content chunks, usage chunk
    assert_eq!(chunks.len(), 9);
    let role = &chunks[0];
    assert_eq!(role["object"], "chat.completion.chunk");
    assert_eq!(
        role["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let id = role["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    let content = &chunks[1..8];
    for (i, c) in content.iter().enumerate() {
        assert_eq!(c["id"], id);
        assert_eq!(c["model"], "llmreplay-sim");
        let choice = &c["choices"][0];
        assert!(choice["delta"]["content"]
            .as_str()
            .unwrap()
            .starts_with(' '));
        let want = if i == 6 { json!("length") } else { json!(null) };
        assert_eq!(choice["finish_reason"], want);
        assert!(c.get("usage").is_none());
    }
    let usage = &chunks[8];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12})
    );
    h.shutdown().await;
}

#[tokio::test]
async fn tokens_per_chunk_and_continuous_usage() {
    let mut cfg = fixed(1, 1);
    cfg.tokens_per_chunk = 4;
    let h = server(cfg).await;
    let body = json!({
        "prompt": "a b c",
        "max_tokens": 10,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    });
    let r = post(h.addr(), "/v1/completions", body).await;
    assert_eq!(r.status, 200);
    let chunks = r.chunks();
    let content: Vec<_> = chunks
        .iter()
        .filter(|c| !c["choices"].as_array().unwrap().is_empty())
        .collect();
    assert_eq!(content.len(), 3); // ceil(10 / 4)
    let cumulative: Vec<_> = content
        .iter()
        .map(|c| c["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(cumulative, [4, 8, 10]);
    let words: usize = content
        .iter()
        .map(|c| {
            c["choices"][0]["text"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count()
        })
        .sum();
    assert_eq!(words, 10);
    assert_eq!(content[0]["object"], "text_completion");
    assert!(content[0]["id"].as_str().unwrap().starts_with("cmpl-"));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 10);
    assert_eq!(last["usage"]["prompt_tokens"], 3);
    h.shutdown().await;
}

#[tokio::test]
async fn non_streamed_responses_carry_usage() {
    let h = server(fixed(1, 1)).await;
    let r = post(h.addr(), "/v1/chat/completions", chat("x y", 5, false)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        5
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7})
    );

    // without ignore_eos: a deterministic length in [1, max_tokens]
    let body = json!({"prompt": "the same prompt", "max_tokens": 50});
    let a = post(h.addr(), "/v1/completions", body.clone()).await.json();
    let b = post(h.addr(), "/v1/completions", body).await.json();
    let n = a["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=50).contains(&n));
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let want = if n == 50 { "length" } else { "stop" };
    assert_eq!(a["choices"][0]["finish_reason"], want);
    // default max_tokens for completions is 16
    let d = post(
        h.addr(),
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "ignore_eos": true}),
    )
    .await
    .json();
    assert_eq!(
        d["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19})
    );
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_openai_errors() {
    let h = server(fixed(1, 1)).await;
    let a = h.addr();
    for (path, body) in [
        ("/v1/chat/completions", "not json"),
        ("/v1/chat/completions", "{}"),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": 3}]}"#,
        ),
        ("/v1/completions", r#"{"model": "m"}"#),
        ("/v1/completions", r#"{"prompt": "x", "max_tokens": 0}"#),
        ("/v1/completions", r#"{"prompt": "x", "max_tokens": "ten"}"#),
        ("/v1/completions", ""),
    ] {
        let r = request(a, "POST", path, &[], body).await;
        assert_eq!(r.status, 400, "{path} {body}");
        let v = r.json();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].is_string());
        assert!(v["error"]["param"].is_null() && v["error"]["code"].is_null());
    }
    let r = request(a, "GET", "/v1/nope", &[], "").await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].is_string());
    let r = request(a, "GET", "/v1/completions", &[], "").await;
    assert_eq!(r.status, 405);
    let r = request(
        a,
        "POST",
        "/v1/completions",
        &[("x-sim-fault", "bogus")],
        r#"{"prompt":"x"}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    h.shutdown().await;
}

#[tokio::test]
async fn context_length_is_enforced_by_engine_profiles() {
    let cfg = SimConfig {
        timing: Timing::Engine(Profile::named("tiny").unwrap()),
        ..SimConfig::default()
    };
    let h = server(cfg).await;
    let r = post(
        h.addr(),
        "/v1/completions",
        json!({"prompt": "a b", "max_tokens": 5000}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("maximum context length"));
    h.shutdown().await;
}

#[tokio::test]
async fn reset_fault_drops_connection_mid_body() {
    let h = server(fixed(1, 1)).await;
    let r = request(
        h.addr(),
        "POST",
        "/v1/chat/completions",
        &[("x-sim-fault", "reset")],
        &chat("a b", 20, true).to_string(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.complete, "body should end abruptly");
    assert!(r.events.iter().all(|(_, e)| e != "[DONE]"));
    // role chunk + a couple of content chunks arrived before the drop
    assert!(r.chunks().len() >= 2, "{}", r.chunks().len());
    // non-streamed: headers, then the connection goes
    let r = request(
        h.addr(),
        "POST",
        "/v1/completions",
        &[("x-sim-fault", "reset")],
        r#"{"prompt":"a","max_tokens":3}"#,
    )
    .await;
    assert!(!r.complete);
    h.shutdown().await;
}

#[tokio::test]
async fn rate_limit_and_error_faults() {
    let mut cfg = fixed(1, 1);
    cfg.faults.retry_after_secs = 7;
    let h = server(cfg).await;
    let body = r#"{"prompt":"a","max_tokens":3}"#;
    let r = request(
        h.addr(),
        "POST",
        "/v1/completions",
        &[("x-sim-fault", "rate-limit")],
        body,
    )
    .await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    let r = request(
        h.addr(),
        "POST",
        "/v1/completions",
        &[("x-sim-fault", "error")],
        body,
    )
    .await;
    assert_eq!(r.status, 500);
    assert!(r.json()["error"]["message"].is_string());
    h.shutdown().await;

    // by rate: all requests rate-limited
    let mut cfg = fixed(1, 1);
    cfg.faults = Faults {
        rate_limit_rate: 1.0,
        ..Faults::default()
    };
    let h = server(cfg).await;
    let r = request(h.addr(), "POST", "/v1/completions", &[], body).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    h.shutdown().await;

    let mut cfg = fixed(1, 1);
    cfg.faults.error_rate = 1.5;
    assert!(start("127.0.0.1:0".parse().unwrap(), cfg).await.is_err());
}

#[tokio::test]
async fn stall_fault_sends_headers_then_nothing() {
    let h = server(fixed(1, 1)).await;
    let r = request_inner(
        h.addr(),
        "POST",
        "/v1/chat/completions",
        &[("x-sim-fault", "stall")],
        &chat("a b", 3, true).to_string(),
        Some(Duration::from_millis(300)),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert!(!r.complete);
    // the server keeps serving; short stalls end and the response proceeds
    let mut cfg = fixed(1, 1);
    cfg.faults.stall = Duration::from_millis(150);
    let h2 = server(cfg).await;
    let r = request(
        h2.addr(),
        "POST",
        "/v1/chat/completions",
        &[("x-sim-fault", "stall")],
        &chat("a b", 3, true).to_string(),
    )
    .await;
    assert!(r.complete);
    assert!(r.events[0].0 - r.t0 >= Duration::from_millis(150));
    h2.shutdown().await;
    h.shutdown().await;
}

#[tokio::test]
async fn metrics_and_info_endpoints() {
    let h = server(fixed(1, 1)).await;
    let a = h.addr();
    let r = post(a, "/v1/chat/completions", chat("a b c", 4, true)).await;
    assert!(r.complete);
    let m = request(a, "GET", "/metrics", &[], "").await;
    assert_eq!(m.status, 200);
    let text = String::from_utf8(m.body).unwrap();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:request_queue_time_seconds_bucket",
    ] {
        assert!(text.contains(name), "missing {name}");
    }
    assert!(
        text.contains("vllm:generation_tokens_total{model_name=\"llmreplay-sim\"} 4"),
        "{text}"
    );
    assert!(text.contains("vllm:prompt_tokens_total{model_name=\"llmreplay-sim\"} 3"));
    assert!(
        text.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"llmreplay-sim\",le=\"0.001\"}"
        ),
        "{text}"
    );
    // What the sim writes, replay's reader reads: one request's TTFT.
    let ttft = wire::prometheus::Histogram::read(&text, wire::vllm_metrics::TTFT).unwrap();
    assert_eq!(ttft.count, 1.0, "{text}");

    let v = request(a, "GET", "/v1/models", &[], "").await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "llmreplay-sim");
    let v = request(a, "GET", "/version", &[], "").await.json();
    assert!(v["version"].as_str().unwrap().starts_with("llmreplay-sim "));
    let r = request(a, "GET", "/health", &[], "").await;
    assert_eq!(r.status, 200);
    h.shutdown().await;
}

#[tokio::test]
async fn fixed_timing_first_chunk_at_ttft() {
    let h = server(fixed(120, 20)).await;
    let r = post(
        h.addr(),
        "/v1/completions",
        json!({
            "prompt": "x", "max_tokens": 4, "ignore_eos": true, "stream": true
        }),
    )
    .await;
    let times: Vec<_> = r.events.iter().map(|(t, _)| *t - r.t0).collect();
    assert_eq!(r.chunks().len(), 4);
    // first chunk no earlier than ttft; generous upper bound for a loaded machine
    assert!(times[0] >= Duration::from_millis(120), "{times:?}");
    assert!(times[0] < Duration::from_millis(600), "{times:?}");
    // last chunk no earlier than ttft + 3 * itl
    assert!(times[3] >= Duration::from_millis(180), "{times:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn engine_backed_stream_and_disconnect_cleanup() {
    let cfg = SimConfig {
        timing: Timing::Engine(Profile::named("tiny").unwrap()),
        ..SimConfig::default()
    };
    let h = server(cfg).await;
    let r = post(
        h.addr(),
        "/v1/chat/completions",
        chat("one two three", 3, true),
    )
    .await;
    assert!(r.complete);
    let chunks = r.chunks();
    assert_eq!(chunks.len(), 5);
    assert_eq!(chunks[4]["usage"]["completion_tokens"], 3);
    // first token after one 20 ms step at least
    assert!(r.events[1].0 - r.t0 >= Duration::from_millis(20));

    // a client that goes away mid-stream: the engine drops the request
    let partial = request_inner(
        h.addr(),
        "POST",
        "/v1/chat/completions",
        &[],
        &chat("a b c", 900, true).to_string(),
        Some(Duration::from_millis(100)),
    )
    .await;
    assert_eq!(partial.status, 200);
    drop(partial);
    let mut running = None;
    for _ in 0..100 {
        let m = request(h.addr(), "GET", "/metrics", &[], "").await;
        let text = String::from_utf8(m.body).unwrap();
        let gauge =
            |name| wire::prometheus::labelled(&text, name, &[("model_name", "llmreplay-sim")]);
        if gauge("vllm:num_requests_running") == Some(0.0)
            && gauge("vllm:kv_cache_usage_perc") == Some(0.0)
        {
            running = Some(0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(running, Some(0), "aborted request still running");
    h.shutdown().await;
}

#[tokio::test]
async fn h2c_prior_knowledge_and_keep_alive() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let h = server(fixed(1, 1)).await;
    let tcp = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    // two requests on one connection
    for _ in 0..2 {
        let req = http::Request::post(format!("{}/v1/chat/completions", h.url()))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(
                chat("a b c", 3, true).to_string(),
            )))
            .unwrap();
        let resp = send.send_request(req).await.expect("h2 request");
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"));
        assert_eq!(text.matches("data: ").count(), 6); // role, 3 content, usage, DONE
    }
    h.shutdown().await;
}

#[tokio::test]
async fn odd_inputs_never_break_the_server() {
    let cfg = SimConfig {
        timing: Timing::Engine(Profile::named("tiny").unwrap()),
        ..SimConfig::default()
    };
    let h = server(cfg).await;
    let bodies = [
        "null",
        "1e999",
        "\"str\"",
        r#"{"prompt": null}"#,
        r#"{"prompt": [[1, 2], "a b", 3]}"#,
        r#"{"prompt": [{"x": 1}]}"#,
        r#"{"prompt": "", "max_tokens": 1}"#,
        r#"{"prompt": "a", "max_tokens": 18446744073709551615}"#,
        r#"{"prompt": "a", "max_tokens": null, "stream": null, "stream_options": 3}"#,
        r#"{"messages": []}"#,
        r#"{"messages": [null]}"#,
        r#"{"messages": [{"role": "user", "content": null}], "max_tokens": 2}"#,
        r#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#,
        "{\"prompt\": \"\u{feff}\u{0} \\ud800\"}",
        "\u{0}\u{1}\u{2}",
    ];
    for path in ["/v1/completions", "/v1/chat/completions"] {
        for b in bodies {
            let r = request(h.addr(), "POST", path, &[], b).await;
            assert!(
                r.status == 200 || r.status == 400,
                "{path} {b}: {}",
                r.status
            );
            assert!(r.complete, "{path} {b}");
        }
    }
    let r = request(h.addr(), "GET", "/health", &[], "").await;
    assert_eq!(r.status, 200);
    h.shutdown().await;
}
