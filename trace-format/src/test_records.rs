//! Records and metadata the unit tests of the writer and the reader share.

use crate::file_meta::FileMeta;
use crate::schema::{Outcome, ParentLink, Producer, TokenSource, TraceRecord};

/// A record with every optional field set.
pub(crate) fn full_record(i: i64) -> TraceRecord {
    TraceRecord {
        request_id: format!("req-{i}"),
        session_id: Some(format!("sess-{}", i % 3)),
        parent_request_id: (i > 0).then(|| format!("req-{}", i - 1)),
        think_time_us: (i > 0).then_some(2_500),
        arrival_time_us: 1_700_000_000_000_000 + i * 1_000,
        endpoint: "/v1/chat/completions".into(),
        model: Some("llama-3-8b".into()),
        stream: i % 2 == 0,
        prompt_tokens: Some(100 + i),
        output_tokens: Some(20 + i),
        max_tokens: Some(256),
        prompt_tokens_source: Some(TokenSource::Usage),
        output_tokens_source: Some(TokenSource::Estimate),
        status: Some(200),
        outcome: Outcome::HttpError,
        error: Some("boom \"quoted\" ☃".into()),
        ttft_us: Some(12_345),
        e2el_us: Some(456_789),
        chunk_times_us: vec![12_345, 20_000, 456_789],
        chunk_tokens: Some(vec![1, 2, 3]),
        body: Some(r#"{"messages":[]}"#.into()),
        prefix_hashes: Some(vec![u64::MAX, 0, 42]),
        request_bytes: 1234,
        response_bytes: 5678,
        scheduled_offset_us: Some(1_000),
        dispatch_lag_us: Some(-5),
        queue_us: Some(7),
        new_connection: Some(true),
        connect_us: Some(900),
        target: Some("candidate".into()),
        run_id: Some("run-1".into()),
        captured_status: Some(400),
        captured_outcome: Some(Outcome::ClientCancelled),
        synthesized_body: Some(false),
        trace_id: Some(format!("{:032x}", 0x4bf9_2f35_77b3_4da6_u128 + i as u128)),
        span_id: Some(format!("{:016x}", 0x00f0_67aa_0ba9_02b7_u64 + i as u64)),
        ttfat_us: Some(20_000),
        reasoning_tokens: Some(5 + i),
        reasoning_tokens_source: Some(TokenSource::Usage),
        tools_offered: Some(2),
        tool_names: Some(vec!["get_weather".into(), "h:00ff00ff00ff00ff".into()]),
        tool_calls: Some(1),
        tool_call_names: Some(vec!["get_weather".into()]),
        parent_link: (i > 0).then_some(ParentLink::ToolCall),
        pair_request_id: Some(format!("prod-{i}")),
        cached_tokens: Some(64 + i),
        images: Some(2),
        image_bytes: Some(123_456),
        image_dims: Some(vec!["640x480".into(), String::new()]),
        audio_inputs: Some(1),
        audio_bytes: Some(32_000),
        parent_wait_us: Some(i * 7),
        capture_id: Some("capture-0".into()),
        capture_started_us: Some(1_700_000_000_000_000),
        link_keys: crate::fleet::LinkKeys {
            chat: Some(vec![1, u64::MAX - i as u64]),
            answer: Some(3),
            calls: Some(vec![]),
            args: Some(vec![5, 6]),
            result: Some(7),
            opening: None,
            client: Some(u64::MAX),
            response: Some(9),
            previous_response: Some(10),
        },
    }
}

pub(crate) fn test_meta() -> FileMeta {
    let mut m = FileMeta::new(Producer::Capture, "llmreplay capture --test");
    m.source = Some("unit test".into());
    m.block_size = Some(16);
    m.extra.insert("site".into(), "eu-1".into());
    m
}

/// The names of the entries of `dir`, sorted.
pub(crate) fn file_names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
