//! The exporter against a receiver on 127.0.0.1 that decodes what it gets with the official
//! protobuf definitions.

use std::sync::Arc;
use std::time::Duration;

use telemetry::span::{attr, Server, SpanId};
use telemetry::testing::{attr_int, attr_str, Receiver};
use telemetry::{Exporter, OtlpConfig, Role};
use trace_format::tracectx::{to_hex, TraceContext};
use trace_format::TraceRecord;

fn row(i: usize) -> TraceRecord {
    let mut r = TraceRecord::new(
        format!("r{i}"),
        1_700_000_000_000_000 + i as i64,
        "/v1/chat/completions",
    );
    r.model = Some("m".into());
    r.stream = true;
    r.prompt_tokens = Some(10 + i as i64);
    r.output_tokens = Some(4);
    r.status = Some(200);
    r.ttft_us = Some(20_000);
    r.e2el_us = Some(80_000);
    r.chunk_times_us = vec![20_000, 40_000, 60_000, 80_000];
    TraceContext::derive("run-x", &r.request_id).fill(&mut r);
    r
}

/// Every row is one span, decoded by the receiver, carrying the row's ids; the metrics come
/// at the end; batches are split at the batch size; headers are sent.
#[test]
fn rows_arrive_as_spans_and_metrics() {
    let rx = Receiver::start();
    let mut cfg = OtlpConfig::new(&rx.url(), Role::Replay).unwrap();
    cfg.batch = 7;
    cfg.header("x-api-key=secret").unwrap();
    let ex = Exporter::start(cfg).unwrap();
    let server = Arc::new(Server::from_url("http://127.0.0.1:8000").unwrap());
    let rows: Vec<TraceRecord> = (0..20).map(row).collect();
    for r in &rows {
        ex.send(r, SpanId::Own, Some(&server));
    }
    let report = ex.close();
    assert_eq!(
        (report.exported, report.dropped, report.failed),
        (20, 0, 0),
        "{report}"
    );
    let got = rx.received();
    assert!(got.bad.is_empty(), "{:?}", got.bad);
    assert_eq!(got.spans.len(), 20);
    for ((service, sp), r) in got.spans.iter().zip(&rows) {
        assert_eq!(service, "llmreplay-replay");
        assert_eq!(to_hex(&sp.trace_id), r.trace_id.clone().unwrap());
        assert_eq!(to_hex(&sp.span_id), r.span_id.clone().unwrap());
        assert_eq!(attr_str(sp, attr::REQUEST_ID), Some(r.request_id.as_str()));
        assert_eq!(attr_int(sp, attr::INPUT_TOKENS), r.prompt_tokens);
        assert_eq!(attr_str(sp, attr::SERVER_ADDRESS), Some("127.0.0.1"));
    }
    assert!(got
        .headers
        .iter()
        .all(|h| h.iter().any(|(k, v)| k == "x-api-key" && v == "secret")));
    let names: Vec<&str> = got.metrics.iter().map(|m| m.name.as_str()).collect();
    for n in [
        telemetry::otlp_metrics::name::DURATION,
        telemetry::otlp_metrics::name::TTFC,
        telemetry::otlp_metrics::name::TOKENS,
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
}

/// A receiver that never answers: sending never waits (the queue fills and drops, counted),
/// and the close gives up after one timed-out POST instead of one per batch.
#[test]
fn a_stalled_receiver_costs_spans_not_the_sender() {
    let rx = Receiver::stalled();
    let mut cfg = OtlpConfig::new(&rx.url(), Role::Replay).unwrap();
    cfg.queue = 8;
    cfg.batch = 4;
    cfg.timeout = Duration::from_millis(300);
    let ex = Exporter::start(cfg).unwrap();
    for i in 0..500 {
        ex.send(&row(i), SpanId::Own, None);
    }
    let stats = ex.stats();
    let report = ex.close();
    assert_eq!(report.exported, 0, "{report}");
    assert!(report.dropped > 0, "{report}");
    assert_eq!(
        report.dropped + report.failed,
        500,
        "every row is either dropped or lost: {report}"
    );
    assert!(report.last_error.unwrap().contains("no answer"));
    assert_eq!(
        stats
            .spans_dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        report.dropped
    );
}

/// Nothing listens: the same, with the connection refused.
#[test]
fn an_unreachable_receiver_is_counted() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = OtlpConfig::new(&format!("http://127.0.0.1:{port}"), Role::Capture).unwrap();
    let ex = Exporter::start(cfg).unwrap();
    for i in 0..10 {
        ex.send(&row(i), SpanId::Parent, None);
    }
    let report = ex.close();
    assert_eq!((report.exported, report.dropped + report.failed), (0, 10));
    assert!(report.to_string().contains("lost in failed exports"));
}
