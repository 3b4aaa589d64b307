//! End-to-end tests of the recorder keeping up (issue 40): when tokenizing cannot keep up,
//! capture sheds the work, never the row, and the row says what it lacks; the recorder's lag
//! and the work it shed are on /metrics. Client → capture (in-process) → sim, on loopback.

#![allow(clippy::await_holding_lock)] // SERIAL serialises whole tests on purpose

use crate::support;
use support::env::{fresh_path, serial};
use support::http1::Http1Client;

use std::sync::Arc;
use std::time::Duration;

use proxy::{Privacy, ProxyConfig, UsageMode};
use trace_format::{TokenSource, TraceRecord};

async fn sim() -> sim::SimHandle {
    sim::start(
        "127.0.0.1:0".parse().unwrap(),
        sim::SimConfig {
            timing: sim::Timing::Fixed {
                ttft: Duration::from_millis(1),
                itl: Duration::from_millis(1),
            },
            ..Default::default()
        },
    )
    .await
    .expect("sim")
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Sends `prompts` (streamed completions: the sim reports usage only when asked) through a
/// capture with the given shed budget, usage mode and bodies kept; returns the rows (in
/// request order) and the /metrics text once every row was written.
async fn capture(
    prompts: &[String],
    shed_after: Duration,
    usage: UsageMode,
    bodies: Privacy,
) -> (Vec<TraceRecord>, String) {
    let s = sim().await;
    let out = fresh_path("recorder");
    let mut c = ProxyConfig::new("127.0.0.1:0".parse().unwrap(), s.url(), &out);
    c.flush_interval = Duration::from_millis(20);
    c.tokenizer = Arc::new(proxy::Tokenizer::load("cl100k_base").unwrap());
    c.block_size = 4;
    c.usage = usage;
    c.privacy = bodies;
    c.recorder_shed_after = shed_after;
    let p = proxy::start(c.validate().expect("config"))
        .await
        .expect("proxy");
    let addr = p.addr();
    let bodies: Vec<String> = prompts
        .iter()
        .map(|prompt| {
            serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 3, "stream": true})
                .to_string()
        })
        .collect();
    tokio::task::spawn_blocking(move || {
        let mut client = Http1Client::new(addr);
        for b in &bodies {
            let r = client.post("/v1/completions", &[], b).expect("response");
            assert_eq!(r.status, 200, "{}", r.text());
        }
    })
    .await
    .unwrap();
    // Every response is in: the rows are queued; wait (bounded) for the writer to take them.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !p.metrics().recorder_queue.is_empty() {
        assert!(std::time::Instant::now() < deadline, "rows still queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let text = p.metrics().render();
    p.shutdown(Duration::from_secs(5)).await.expect("shutdown");
    s.shutdown().await;
    let mut rows = trace_format::read_traces(&[out.to_str().unwrap()])
        .unwrap()
        .records;
    rows.sort_by_key(|r| r.arrival_time_us);
    let _ = std::fs::remove_dir_all(&out);
    (rows, text)
}

fn prompts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("Request {i}: summarize the quarterly report for the sales team in three short bullet points."))
        .collect()
}

/// Tokenizing shed (a budget nothing meets): every row is still written, without
/// `prefix_hashes`; with no usage from the upstream its token counts are estimates (source
/// `estimate`, 4 bytes a token) or, for a prompt not even parsed in time, null; the shed
/// work is counted by kind, and the lag is back to 0
/// once everything is written. Before the fix capture had no shed path: the runners
/// tokenized every prompt however late, and this test did not compile (no
/// `recorder_shed_after`, no `recorder_shed_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_rows_are_written_without_the_work_and_say_so() {
    let _g = serial();
    let ps = prompts(8);
    let (rows, m) = capture(
        &ps,
        Duration::from_nanos(1),
        UsageMode::Off,
        Privacy::Hashes,
    )
    .await;
    assert_eq!(rows.len(), ps.len(), "no row dropped");
    for (r, p) in rows.iter().zip(&ps) {
        assert_eq!(r.prefix_hashes, None, "{r:?}");
        // Shed by the runner (an estimate), or not ready when the writer's wait was spent
        // (nothing): either way the row says so.
        let estimated = (
            Some(p.len().div_ceil(4) as i64),
            Some(TokenSource::Estimate),
        );
        let got = (r.prompt_tokens, r.prompt_tokens_source);
        assert!(got == estimated || got == (None, None), "{r:?}");
        assert_eq!(r.output_tokens_source, Some(TokenSource::Estimate), "{r:?}");
        assert!(r.output_tokens.unwrap() > 0);
    }
    let n = ps.len() as f64;
    for work in ["prefix_hashes", "prompt_tokens", "output_tokens"] {
        let name = format!("llmreplay_capture_recorder_shed_total{{work=\"{work}\"}}");
        assert_eq!(metric(&m, &name), n, "{work}");
    }
    assert_eq!(metric(&m, "llmreplay_capture_recorder_lag_seconds"), 0.0);
    assert_eq!(metric(&m, "llmreplay_capture_recorder_queued_records"), 0.0);
    assert_eq!(metric(&m, "llmreplay_capture_records_dropped_total"), 0.0);

    // With usage from the upstream only the hashes are shed: the counts are the server's.
    let (rows, m) = capture(
        &ps,
        Duration::from_nanos(1),
        UsageMode::Standard,
        Privacy::Hashes,
    )
    .await;
    assert_eq!(rows.len(), ps.len());
    for r in &rows {
        assert_eq!(r.prefix_hashes, None);
        assert_eq!(r.prompt_tokens_source, Some(TokenSource::Usage), "{r:?}");
        assert_eq!(r.output_tokens_source, Some(TokenSource::Usage));
    }
    let shed = |work: &str| {
        metric(
            &m,
            &format!("llmreplay_capture_recorder_shed_total{{work=\"{work}\"}}"),
        )
    };
    assert_eq!(
        (
            shed("prefix_hashes"),
            shed("prompt_tokens"),
            shed("output_tokens")
        ),
        (n, 0.0, 0.0)
    );
}

/// Within the budget nothing is shed: hashes of real tokens, counts by the tokenizer. And
/// with no hashes to keep (`--privacy perf`), a prompt is tokenized only when the
/// upstream reports no usage: with usage, the rows carry the server's counts and nothing is
/// shed or estimated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_the_budget_nothing_is_shed() {
    let _g = serial();
    let tok = proxy::Tokenizer::load("cl100k_base").unwrap();
    let ps = prompts(4);
    let budget = Duration::from_secs(30);
    let (rows, m) = capture(&ps, budget, UsageMode::Off, Privacy::Hashes).await;
    for (r, p) in rows.iter().zip(&ps) {
        let n = tok.count(p).unwrap();
        assert_eq!(r.prefix_hashes.as_ref().map(Vec::len), Some(n / 4), "{r:?}");
        assert_eq!(r.prompt_tokens, Some(n as i64));
        assert_eq!(r.prompt_tokens_source, Some(TokenSource::Tokenizer));
        assert_eq!(r.output_tokens_source, Some(TokenSource::Tokenizer));
    }
    assert!(m.contains("llmreplay_capture_recorder_shed_total{work=\"prefix_hashes\"} 0\n"));

    let (rows, _) = capture(&ps, budget, UsageMode::Off, Privacy::Perf).await;
    for (r, p) in rows.iter().zip(&ps) {
        assert_eq!(r.prefix_hashes, None);
        assert_eq!(r.prompt_tokens, Some(tok.count(p).unwrap() as i64), "{r:?}");
        assert_eq!(r.prompt_tokens_source, Some(TokenSource::Tokenizer));
    }
    let (rows, m) = capture(&ps, budget, UsageMode::Standard, Privacy::Perf).await;
    for r in &rows {
        assert_eq!(r.prompt_tokens_source, Some(TokenSource::Usage), "{r:?}");
    }
    assert!(m.contains("llmreplay_capture_recorder_shed_total{work=\"prompt_tokens\"} 0\n"));
}
