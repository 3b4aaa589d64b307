//! Property tests ("fuzzing") of everything in trace-format that reads untrusted bytes: the
//! SSE parser and response classifiers (what an upstream sends), the importers (public trace
//! files), the journal reader (what a crashed capture left), and the redactor (every text it
//! is given). Each runs a bounded number of cases in CI; `LLMREPLAY_FUZZ_CASES=N` runs `N`
//! per property (`bench/fuzz.sh`). Failing cases proptest finds are kept in
//! `proptest-regressions/fuzz_inputs.txt` and replayed first on every run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use trace_format::import::{import_file, Format, ImportOptions};
use trace_format::redact::{redact_json, redact_text};
use trace_format::sse::{classify, response_usage, SseParser};
use trace_format::writer::recover_dir;
use trace_format::{FileMeta, Producer};

fn tmp() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "llmreplay-fuzz-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
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
    #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(256)))]

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

    /// Redaction never panics, is idempotent, keeps valid JSON valid, and leaves no
    /// planted key behind.
    #[test]
    fn redaction_is_total_idempotent_and_keeps_json_valid(
        text in prop_oneof![
            any::<String>(),
            prop::collection::vec(prop_oneof![
                Just("sk-".to_string()),
                Just("Bearer ".to_string()),
                Just("Authorization: ".to_string()),
                Just("api_key".to_string()),
                Just("\"".to_string()),
                Just("\\".to_string()),
                Just(":".to_string()),
                Just("=".to_string()),
                Just("://".to_string()),
                Just("@".to_string()),
                Just("\n".to_string()),
                Just("☃".to_string()),
                "[a-zA-Z0-9_-]{0,12}",
            ], 0..30).prop_map(|v| v.concat()),
        ],
        value in json_value(),
        key in "[A-Za-z0-9]{8,20}",
    ) {
        let once = redact_text(&text);
        prop_assert_eq!(redact_text(&once), once.clone());
        let once = redact_json(&text);
        prop_assert_eq!(redact_json(&once), once.clone());

        let mut doc = serde_json::json!({"messages": [{"content": value}]});
        doc["api_key"] = serde_json::Value::String(format!("KEY{key}"));
        doc["note"] = serde_json::Value::String(format!("auth Bearer K3Y{key}, sk-KEY{key}"));
        let body = serde_json::to_string(&doc).unwrap();
        let red = redact_json(&body);
        let back: serde_json::Value = serde_json::from_str(&red).expect("still JSON");
        prop_assert_eq!(back["api_key"].as_str(), Some("***"));
        prop_assert!(!red.contains(&format!("KEY{key}")), "{}", red);
        prop_assert_eq!(redact_json(&red), red.clone());
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "(sk-|Bearer |token=|https://u:p@h/)[a-z0-9]{0,10}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    "[a-z_]{0,10}",
                    Just("password".to_string()),
                    Just("token".to_string())
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Small valid inputs of each import format, the seeds the mutations start from.
const SEEDS: [(Format, &str, &str); 5] = [
    (
        Format::Azure,
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,2\n2024-05-10 00:00:00.2+00:00,20,0\n\n2024-05-10 00:00:01+00:00,30,3\n",
    ),
    (
        Format::BurstGpt,
        "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n118.5,GPT-4,417,276,693,API log\n",
    ),
    (
        Format::Mooncake,
        "m.jsonl",
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, 1]}\n{\"timestamp\": 1500.5, \"input_length\": 10, \"output_length\": 0, \"hash_ids\": [0]}\n",
    ),
    (
        Format::Qwen,
        "q.jsonl",
        "{\"chat_id\": 10, \"parent_chat_id\": -1, \"timestamp\": 0.5, \"input_length\": 40, \"output_length\": 5, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [1, 2, 3]}\n{\"chat_id\": 12, \"parent_chat_id\": 10, \"timestamp\": 3.000001, \"input_length\": 60, \"output_length\": 7, \"type\": \"text\", \"turn\": 2, \"hash_ids\": [1, 2, 3, 4]}\n",
    ),
    (
        Format::ShareGpt,
        "s.json",
        r#"[{"id": "a", "conversations": [{"from": "human", "value": "hello world"}, {"from": "gpt", "value": "hi there"}]}, {"id": "c", "conversations": [{"from": "human", "value": "one two"}, {"from": "gpt", "value": "five"}]}]"#,
    ),
];

/// A mutation of `seed`: bytes replaced, inserted or removed, lines duplicated or dropped.
fn mutated(seed: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let op = (
        0usize..6,
        any::<usize>(),
        prop::collection::vec(any::<u8>(), 1..8),
    );
    prop::collection::vec(op, 0..8).prop_map(move |ops| {
        let mut b = seed.as_bytes().to_vec();
        for (kind, at, bytes) in ops {
            let at = at % (b.len() + 1);
            match kind {
                0 => b.splice(at..at, bytes),
                1 => {
                    let end = (at + bytes.len()).min(b.len());
                    b.splice(at..end, bytes)
                }
                2 => {
                    let end = (at + bytes.len()).min(b.len());
                    b.splice(at..end, Vec::new())
                }
                3 => {
                    // A digit run (huge numbers, negative ones).
                    let digits: Vec<u8> = bytes
                        .iter()
                        .map(|x| b"0123456789-.e9"[*x as usize % 14])
                        .collect();
                    b.splice(at..at, digits)
                }
                4 => {
                    // A separator in the wrong place.
                    let sep = [b',', b'\n', b'"', b'{', b'[', b':'][bytes[0] as usize % 6];
                    b.splice(at..at, vec![sep])
                }
                _ => b.splice(at..at, seed.as_bytes()[..at.min(seed.len())].to_vec()),
            };
        }
        b
    })
}

fn import_case(format: Format, name: &str, data: &[u8], auto: bool) {
    let dir = tmp();
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    let opts = ImportOptions {
        format: if auto { Format::Auto } else { format },
        tokenizer: Some(words()),
        ..ImportOptions::default()
    };
    let got = import_file(&p, &opts, "fuzz");
    if let Err(e) = &got {
        let msg = e.to_string();
        assert!(
            msg.contains(name),
            "{format}: error without the file: {msg}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn words() -> std::sync::Arc<trace_format::tokenize::Tokenizer> {
    static T: std::sync::OnceLock<std::sync::Arc<trace_format::tokenize::Tokenizer>> =
        std::sync::OnceLock::new();
    T.get_or_init(|| std::sync::Arc::new(trace_format::tokenize::Tokenizer::load("words").unwrap()))
        .clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(64)))]

    /// A damaged import file of any format (given or detected) is records or an error
    /// naming the file, never a panic.
    #[test]
    fn damaged_import_files_are_records_or_errors(
        (which, data) in (0usize..SEEDS.len()).prop_flat_map(|w| (Just(w), mutated(SEEDS[w].2))),
        auto in any::<bool>(),
    ) {
        let (format, name, _) = SEEDS[which];
        import_case(format, name, &data, auto);
    }

    /// A journal left by a crashed capture, damaged anywhere, is recovered or refused with
    /// an error naming the journal, never a panic.
    #[test]
    fn damaged_journals_are_recovered_or_errors(data in journal_bytes()) {
        let dir = tmp();
        std::fs::write(dir.join("cap-x.journal"), &data).unwrap();
        let meta = FileMeta::new(Producer::Capture, "fuzz");
        if let Err(e) = recover_dir(&dir, &meta) {
            prop_assert!(e.to_string().contains("cap-x.journal"), "{}", e);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Journal lines: real records serialized, then damaged.
fn journal_bytes() -> impl Strategy<Value = Vec<u8>> {
    let rec =
        (0i64..1000, any::<bool>(), prop::option::of(any::<String>())).prop_map(|(i, s, e)| {
            let mut r =
                trace_format::TraceRecord::new(format!("r{i}"), i * 1000, "/v1/completions");
            r.stream = s;
            r.error = e;
            r.chunk_times_us = vec![i, i + 1];
            serde_json::to_string(&r).unwrap()
        });
    (
        prop::collection::vec(rec, 0..6),
        prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        any::<bool>(),
    )
        .prop_map(|(lines, flips, torn)| {
            let mut b = lines.join("\n").into_bytes();
            if !torn {
                b.push(b'\n');
            }
            for (at, v) in flips {
                if !b.is_empty() {
                    let n = b.len();
                    b[at % n] = v;
                }
            }
            b
        })
}

#[test]
fn import_seeds_are_valid() {
    for (format, name, seed) in SEEDS {
        let dir = tmp();
        let p = dir.join(name);
        std::fs::write(&p, seed).unwrap();
        let opts = ImportOptions {
            tokenizer: Some(words()),
            ..ImportOptions::default()
        };
        let (recs, stats) =
            import_file(&p, &opts, "seed").unwrap_or_else(|e| panic!("{format}: {e}"));
        assert_eq!(stats.format, format);
        assert!(!recs.is_empty());
        let _ = std::fs::remove_dir_all(Path::new(&dir));
    }
}
