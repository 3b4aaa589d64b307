//! Property tests ("fuzzing") of the importers: public trace files of every format,
//! damaged, are records or an error naming the file, never a panic. Runs a bounded number of
//! cases in CI; `LLMREPLAY_FUZZ_CASES=N` runs `N` per property (`bench/fuzz.sh`). Failing
//! cases proptest finds are kept in `fuzz_import.proptest-regressions` and replayed first on
//! every run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use import::{import_file, Format, ImportOptions};
use proptest::prelude::*;

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

/// Small valid inputs of each import format, the seeds the mutations start from.
const SEEDS: [(Format, &str, &str); 9] = [
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
    (
        Format::Dynamo,
        "d.jsonl",
        "{\"schema\": \"dynamo.agent.trace.v1\", \"event_type\": \"request_end\", \"event_time_unix_ms\": 1000900, \"event_source\": \"dynamo\", \"agent_context\": {\"session_type_id\": \"c\", \"session_id\": \"s\", \"trajectory_id\": \"m\"}, \"request\": {\"request_id\": \"r\", \"model\": \"m\", \"input_tokens\": 100, \"output_tokens\": 10, \"request_received_ms\": 1000000, \"ttft_ms\": 12.5, \"total_time_ms\": 900.0, \"replay\": {\"trace_block_size\": 64, \"input_length\": 100, \"input_sequence_hashes\": [1, 2]}}}\n{\"schema\": \"dynamo.agent.trace.v1\", \"event_type\": \"tool_end\", \"event_time_unix_ms\": 1001000, \"event_source\": \"harness\", \"agent_context\": {\"session_type_id\": \"c\", \"session_id\": \"s\", \"trajectory_id\": \"m\"}, \"tool\": {\"tool_call_id\": \"t\", \"tool_class\": \"bash\", \"duration_ms\": 5.0}}\n{\"schema\": \"dynamo.agent.trace.v1\", \"event_type\": \"request_end\", \"event_time_unix_ms\": 1002100, \"event_source\": \"dynamo\", \"agent_context\": {\"session_type_id\": \"c\", \"session_id\": \"s\", \"trajectory_id\": \"sub\", \"parent_trajectory_id\": \"m\"}, \"request\": {\"request_id\": \"r2\", \"model\": \"m\", \"input_tokens\": 120, \"output_tokens\": 5, \"request_received_ms\": 1002000, \"total_time_ms\": 100.0}}\n",
    ),
    (
        Format::Copilot,
        "c.jsonl",
        r#"{"session_id": "s1", "date": "2026-06-01", "turns": [{"turn_id": "t1", "llm_calls": [{"message_id": "m1", "timestamp": "2026-06-01T10:00:00.000Z", "duration_ms": 1500.0, "model": "Model A", "result": "Success", "tokens": {"total": 1100, "prompt": 1000, "completion": 100, "cached": 0}}, {"message_id": "m2", "timestamp": "2026-06-01T10:00:04.000Z", "duration_ms": 800.5, "model": "Model A", "result": "UserCancel", "tokens": {"total": 1250, "prompt": 1200, "completion": 50, "cached": 1000}}], "tool_batches": [{"timestamp": "2026-06-01T10:00:01.600Z", "duration_ms": 2000.0, "function_calls": [{"name": "bash", "status": 1, "duration_ms": 1900.0}]}]}]}
"#,
    ),
    (
        Format::SwissAi,
        "t.jsonl",
        r#"{"id": "a:b:c", "status": "DEFAULT", "created_at": "2025-08-21T19:19:22.469Z", "finished_at": "2025-08-21T19:19:27.249Z", "model": "Qwen/Qwen3-32B", "model_parameters": {"temperature": 0.7, "max_tokens": null}, "reported_token_input": 111, "reported_token_output": 184, "token_count": 108, "bucket_ids": [44122773, 36225474, 7]}
{"id": "d:e:f", "status": "ERROR", "created_at": "2025-08-21T19:19:23.000Z", "finished_at": "2025-08-21T19:19:23.500Z", "model": "Qwen/Qwen3-32B", "reported_token_input": -1, "reported_token_output": -1}
"#,
    ),
    (
        Format::Weka,
        "w.jsonl",
        r#"{"id": "a1", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [{"t": 0.0, "model": "m", "in": 418, "out": 20, "hash_ids": [0, 1, 2, 3, 4, 5, 6], "api_time": 2.303}, {"t": 5.5, "model": "m", "in": 500, "out": 30, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7], "api_time": 1.0, "think_time": 3.0}]}
"#,
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

fn words() -> std::sync::Arc<tokenize::Tokenizer> {
    static T: std::sync::OnceLock<std::sync::Arc<tokenize::Tokenizer>> = std::sync::OnceLock::new();
    T.get_or_init(|| std::sync::Arc::new(tokenize::Tokenizer::load("words").unwrap()))
        .clone()
}

proptest! {
    #![proptest_config(config(64))]

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
