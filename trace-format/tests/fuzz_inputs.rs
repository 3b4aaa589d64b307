//! Property tests ("fuzzing") of everything in trace-format that reads untrusted bytes: the
//! journal reader (what a crashed capture left) and the redactor (every text it is given).
//! (The SSE parser's are in `wire/tests/fuzz_sse.rs`, the importers' in
//! `import/tests/fuzz_import.rs`.) Each runs a bounded number of cases in CI;
//! `LLMREPLAY_FUZZ_CASES=N` runs `N` per property (`bench/fuzz.sh`). Failing cases proptest
//! finds are kept in `fuzz_inputs.proptest-regressions` and replayed first on every run.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use trace_format::journal::recover_dir;
use trace_format::redact::{redact_json, redact_text};
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(256)))]

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(64)))]

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
