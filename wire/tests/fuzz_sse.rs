//! Property tests ("fuzzing") of the SSE parser and response classifiers: what an upstream
//! sends. Runs a bounded number of cases in CI; `LLMREPLAY_FUZZ_CASES=N` runs `N` per
//! property (`bench/fuzz.sh`). Failing cases proptest finds are kept in
//! `fuzz_sse.proptest-regressions` and replayed first on every run.

use proptest::prelude::*;
use wire::sse::{classify, response_usage, SseParser};

fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("LLMREPLAY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Bytes that look like SSE: fields, comments, every line ending, JSON-ish payloads.
fn sse_like() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"event: x".to_vec()),
        Just(b": comment".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"[DONE]".to_vec()),
        Just(br#"{"choices":[{"index":0,"delta":{"content":"x"}}]}"#.to_vec()),
        Just(br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#.to_vec()),
        Just(br#"{"error":{"message":"boom"}}"#.to_vec()),
        prop::collection::vec(any::<u8>(), 0..12),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

/// Every event of `input` fed in pieces cut at `cuts`.
fn events(input: &[u8], cuts: &[usize]) -> (Vec<Vec<u8>>, bool) {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.sort_unstable();
    let mut prev = 0;
    for cut in points.into_iter().chain([input.len()]) {
        p.feed(&input[prev..cut], |e| out.push(e.to_vec()));
        prev = cut;
    }
    assert_eq!(p.bytes_fed(), input.len() as u64);
    (out, p.has_partial())
}

proptest! {
    #![proptest_config(config(256))]

    /// However a stream is cut into reads, the parser yields the same events, and every
    /// event classifies without a panic.
    #[test]
    fn sse_events_do_not_depend_on_how_reads_are_cut(
        input in prop_oneof![sse_like(), prop::collection::vec(any::<u8>(), 0..512)],
        cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        let (whole, partial) = events(&input, &[]);
        let (cut, cut_partial) = events(&input, &cuts);
        prop_assert_eq!(&whole, &cut);
        prop_assert_eq!(partial, cut_partial);
        let (bytewise, _) = events(&input, &(0..input.len()).collect::<Vec<_>>());
        prop_assert_eq!(&whole, &bytewise);
        for e in &whole {
            let _ = classify(e);
        }
        let _ = response_usage(&input);
    }
}
