//! Property tests ("fuzzing") of the SSE observer and the JSON member scanner, plus the
//! checked-in corpus under `tests/corpus/sse/` (`NAME.in.sse` as the upstream sent it with
//! injected usage, `NAME.want.sse` as the client must see it). Failing cases proptest finds
//! are kept in `proptest-regressions/`.

use std::collections::VecDeque;
use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;
use proxy::recording::jsonscan::member_removal_range;
use proxy::{StreamObserver, Strip};

const BOTH: Strip = Strip {
    usage_events: true,
    chunk_usage: true,
};

/// Feeds `input` cut at `cuts` and returns what the client would receive.
fn run(strip: Strip, input: &[u8], cuts: &[usize]) -> (Vec<u8>, StreamObserver) {
    let mut o = StreamObserver::new(strip, 4);
    let mut q = VecDeque::new();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.sort_unstable();
    let mut prev = 0;
    for (i, p) in points.into_iter().chain([input.len()]).enumerate() {
        if p > prev {
            o.observe(i as i64, Bytes::copy_from_slice(&input[prev..p]), &mut q);
            prev = p;
        }
    }
    o.finish(&mut q);
    let out: Vec<u8> = q.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(out.len() as u64, o.bytes_out);
    (out, o)
}

fn corpus() -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/sse");
    let mut cases = Vec::new();
    for e in std::fs::read_dir(&dir).expect("corpus dir") {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".in.sse") {
            let want = std::fs::read(dir.join(format!("{stem}.want.sse"))).expect("want file");
            cases.push((stem.to_string(), std::fs::read(&p).unwrap(), want));
        }
    }
    assert!(cases.len() >= 4, "corpus missing");
    cases
}

#[test]
fn corpus_strips_to_the_wanted_bytes_at_every_split() {
    for (name, input, want) in corpus() {
        for cut in 0..=input.len() {
            let (out, o) = run(BOTH, &input, &[cut]);
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "{name} cut at {cut}"
            );
            let (plain, _) = run(Strip::default(), &input, &[cut]);
            assert_eq!(plain, input, "{name}: pass-through must be exact");
            assert!(o.chunk_times_us.len() <= 3);
        }
    }
}

/// One generated chunk's text: JSON-escaped, with characters that trip naive scanners.
fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("a".to_string()),
            Just(" usage".to_string()),
            Just("\"usage\":".to_string()),
            Just("}".to_string()),
            Just("{".to_string()),
            Just("\\".to_string()),
            Just("é".to_string()),
            Just("\n".to_string()),
        ],
        0..6,
    )
    .prop_map(|v| serde_json::Value::from(v.concat()).to_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(256)))]

    /// Arbitrary bytes never panic; without stripping the output is the input.
    #[test]
    fn arbitrary_bytes_pass_through(input in proptest::collection::vec(any::<u8>(), 0..512),
                                    cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let (out, _) = run(Strip::default(), &input, &cuts);
        prop_assert_eq!(out, input.clone());
        let (out, _) = run(BOTH, &input, &cuts);
        prop_assert!(out.len() <= input.len());
    }

    /// SSE-looking noise (lines of data/comment fields, CR/LF mixes) never panics, and
    /// stripping only ever removes bytes.
    #[test]
    fn sse_noise_never_panics(lines in proptest::collection::vec(
        prop_oneof![
            Just("data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}".to_string()),
            Just("data: {\"choices\":[{}],\"usage\":null}".to_string()),
            Just("data: {\"usage\":1,\"choices\":[1]}".to_string()),
            Just("data: [DONE]".to_string()),
            Just(": c".to_string()),
            Just("data:".to_string()),
            Just(String::new()),
            "[ -~]{0,20}".prop_map(|s| s),
        ], 0..12),
        ends in proptest::collection::vec(prop_oneof![Just("\n"), Just("\r\n"), Just("\r")], 12),
        cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let mut input = Vec::new();
        for (l, e) in lines.iter().zip(ends.iter().cycle()) {
            input.extend_from_slice(l.as_bytes());
            input.extend_from_slice(e.as_bytes());
        }
        let (out, _) = run(BOTH, &input, &cuts);
        prop_assert!(out.len() <= input.len());
    }

    /// A generated vLLM stream with injected usage strips to the stream without it, byte for
    /// byte, however it is cut into frames.
    #[test]
    fn injected_usage_strips_exactly(texts in proptest::collection::vec(text(), 1..6),
                                     crlf in any::<bool>(),
                                     spaced in any::<bool>(),
                                     cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let nl = if crlf { "\r\n" } else { "\n" };
        let sep = if spaced { ", " } else { "," };
        let mut with = String::new();
        let mut without = String::new();
        for (i, t) in texts.iter().enumerate() {
            let base = format!("{{\"id\":\"c\"{sep}\"choices\":[{{\"index\":0{sep}\"text\":{t}}}]");
            with.push_str(&format!(
                "data: {base}{sep}\"usage\":{{\"prompt_tokens\":3{sep}\"completion_tokens\":{}}}}}{nl}{nl}",
                i + 1
            ));
            without.push_str(&format!("data: {base}}}{nl}{nl}"));
        }
        with.push_str(&format!(
            "data: {{\"id\":\"c\"{sep}\"choices\":[]{sep}\"usage\":{{\"completion_tokens\":{}}}}}{nl}{nl}",
            texts.len()
        ));
        with.push_str(&format!("data: [DONE]{nl}{nl}"));
        without.push_str(&format!("data: [DONE]{nl}{nl}"));
        let (out, o) = run(BOTH, with.as_bytes(), &cuts);
        prop_assert_eq!(String::from_utf8_lossy(&out), without);
        // A chunk whose text is empty carries no output: no chunk time, its tokens counted
        // with the next chunk that has some.
        let with_output = texts
            .iter()
            .filter(|t| !serde_json::from_str::<String>(t).unwrap_or_default().is_empty())
            .count();
        prop_assert_eq!(o.chunk_times_us.len(), with_output);
        prop_assert_eq!(o.cumulative_tokens.len(), with_output);
        prop_assert!(o.done);
    }

    /// The scanner never panics and a removal leaves valid JSON without the member.
    #[test]
    fn member_removal_keeps_valid_json(keys in proptest::collection::vec("[a-z]{1,3}|usage", 0..5),
                                       vals in proptest::collection::vec(text(), 5),
                                       junk in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut obj = String::from("{");
        for (i, k) in keys.iter().enumerate() {
            if i > 0 { obj.push(','); }
            obj.push_str(&format!("\"{k}\":{}", vals[i % vals.len()]));
        }
        obj.push('}');
        let _ = member_removal_range(&junk, 0, b"usage");
        let parsed: serde_json::Value = serde_json::from_str(&obj).unwrap();
        match member_removal_range(obj.as_bytes(), 0, b"usage") {
            Some((a, b)) => {
                let cut = format!("{}{}", &obj[..a], &obj[b..]);
                let v: serde_json::Value = serde_json::from_str(&cut).expect("valid after cut");
                let mut want = parsed.clone();
                // Only the first "usage" is cut; serde keeps the last duplicate, so compare
                // when the key is unique.
                if keys.iter().filter(|k| *k == "usage").count() == 1 {
                    want.as_object_mut().unwrap().remove("usage");
                    prop_assert_eq!(v, want);
                }
            }
            None => prop_assert!(!keys.iter().any(|k| k == "usage")),
        }
    }
}
