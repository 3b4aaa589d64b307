//! End-to-end: what leaves with a trace (issue 54, docs/privacy.md). The real `llmreplay
//! capture` records chat traffic with a known system prompt and tools in front of the sim,
//! under `--privacy` grades and hash keys given by `--hash-key-file`:
//! - under one key, equal prompts give equal prefix hashes in two captures; under two keys no
//!   hash is equal, and `inspect`, `merge` and `fidelity` refuse to combine them, naming both
//!   key ids;
//! - the trace holds the keyed value of the system prompt's block, never its unkeyed FNV-1a
//!   value nor its text; no byte of the key (raw or hex) is in any file written (journals
//!   while capturing, Parquet after), on /metrics or on stderr;
//! - a `perf` trace has every content-derived column null ([`content_column`], the one list),
//!   and every file's manifest says its grade and key id.

use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, tmpdir};
use support::http1::Http1Client;
use support::sim::SimProc;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use trace_format::keyed::HashKey;
use trace_format::privacy::{content_column, Grade};
use trace_format::{TraceFile, TraceRecord};

const BIN: &str = env!("CARGO_BIN_EXE_llmreplay");
/// The system prompt a competitor could guess: 8 words, two blocks of 4.
const SYSTEM: &str = "You are AcmeBank's support agent AcmeBot always polite";
const BLOCK: u32 = 4;

/// A key file of fixed bytes (hex), mode 0600.
fn key_file(dir: &Path, name: &str, byte: u8) -> (PathBuf, [u8; 32]) {
    let bytes: [u8; 32] = std::array::from_fn(|i| byte.wrapping_add(i as u8 * 7));
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let p = dir.join(name);
    std::fs::write(&p, format!("{hex}\n")).unwrap();
    (p, bytes)
}

fn chat_body(user: &str) -> String {
    json!({
        "model": "m",
        "max_tokens": 4,
        "stream": true,
        "tools": [{"type": "function", "function": {"name": "lookup_account_balance"}}],
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user}
        ]
    })
    .to_string()
}

/// What one capture left: its rows, files, stderr, /metrics text, and the bytes of every
/// file in its directory while it ran (journals) and after (Parquet).
struct Captured {
    out: PathBuf,
    rows: Vec<TraceRecord>,
    files: Vec<TraceFile>,
    log: Vec<String>,
    metrics: String,
    written: Vec<(PathBuf, Vec<u8>)>,
}

fn all_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Captures three chat requests (two users, one repeated) under `flags`.
fn capture(sim: &SimProc, name: &str, flags: &[&str]) -> Captured {
    let out = tmpdir(name);
    let (listen, admin) = (free_addr(), free_addr());
    let bs = BLOCK.to_string();
    let mut args = vec!["--block-size", &bs, "--flush-interval", "20ms"];
    args.extend_from_slice(flags);
    let mut cap = CaptureProc::spawn_admin(BIN, listen, admin, &sim.url(), &out, &args);
    cap.wait_for("listening on");
    let mut c = Http1Client::new(listen);
    for user in [
        "what is my balance",
        "close my account",
        "what is my balance",
    ] {
        let r = c
            .post("/v1/chat/completions", &[], &chat_body(user))
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut written = all_bytes(&out);
    let metrics = Http1Client::new(admin)
        .send("GET", "/metrics", &[], None)
        .unwrap()
        .text();
    let (status, log) = cap.terminate();
    assert!(status.success(), "{status:?}: {log:#?}");
    written.extend(all_bytes(&out));
    let t = trace_format::read_traces(&[out.to_str().unwrap()]).expect("read the capture");
    assert_eq!(t.records.len(), 3, "{log:#?}");
    Captured {
        out,
        rows: t.records,
        files: t.files,
        log,
        metrics,
        written,
    }
}

/// The unkeyed FNV-1a chain of the system prompt's blocks, as capture computes it before
/// keying (a guesser holding the prompt computes the same).
fn unkeyed_system_blocks() -> Vec<u64> {
    let body = json!({"messages": [{"role": "system", "content": SYSTEM}]});
    let h =
        proxy::prefix::prefix_hashes(body.as_object().unwrap(), BLOCK, &proxy::Tokenizer::words())
            .unwrap();
    assert_eq!(h.len(), 2, "8 words in blocks of 4");
    h
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn llmreplay(args: &[&str]) -> (bool, String) {
    let o = Command::new(BIN)
        .args(args)
        .output()
        .expect("run llmreplay");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

#[test]
fn one_key_compares_two_keys_never_mix_and_no_key_or_prompt_is_written() {
    let sim = SimProc::fixed(BIN, 1, 1);
    let keys = tmpdir("keys");
    let (ka, ka_bytes) = key_file(&keys, "a.key", 1);
    let (kb, _) = key_file(&keys, "b.key", 99);
    let (ka, kb) = (ka.to_str().unwrap(), kb.to_str().unwrap());
    let a1 = capture(&sim, "a1", &["--hash-key-file", ka]);
    let a2 = capture(&sim, "a2", &["--hash-key-file", ka, "--privacy", "hashes"]);
    let b = capture(&sim, "b", &["--hash-key-file", kb]);
    let key_a = HashKey::load(Path::new(ka)).unwrap();
    let key_b = HashKey::load(Path::new(kb)).unwrap();

    // Under one key: the same prompts, the same hashes, in both captures.
    let hashes = |c: &Captured| -> Vec<Vec<u64>> {
        c.rows
            .iter()
            .map(|r| r.prefix_hashes.clone().expect("hashes"))
            .collect()
    };
    let mut h1 = hashes(&a1);
    let mut h2 = hashes(&a2);
    h1.sort();
    h2.sort();
    assert_eq!(h1, h2);
    // Rows in arrival order: the first and third asked the same.
    let same = |c: &Captured| {
        (
            c.rows[0].prefix_hashes.clone(),
            c.rows[1].prefix_hashes.clone(),
        )
    };
    assert_eq!(a1.rows[0].prefix_hashes, a1.rows[2].prefix_hashes);
    assert_ne!(same(&a1).0, same(&a1).1);
    assert_eq!(same(&a1), same(&a2));
    // The system prompt's blocks: the keyed values are there (the first two of every row),
    // the unkeyed ones nowhere; under the other key no hash is equal.
    let unkeyed = unkeyed_system_blocks();
    let keyed_a: Vec<u64> = unkeyed.iter().map(|&h| key_a.hash_u64(h)).collect();
    let keyed_b: Vec<u64> = unkeyed.iter().map(|&h| key_b.hash_u64(h)).collect();
    for r in a1.rows.iter().chain(&a2.rows) {
        assert_eq!(r.prefix_hashes.as_ref().unwrap()[..2], keyed_a[..], "{r:?}");
    }
    let all_b: Vec<u64> = b
        .rows
        .iter()
        .flat_map(|r| r.prefix_hashes.clone().unwrap())
        .collect();
    assert_eq!(b.rows[0].prefix_hashes.as_ref().unwrap()[..2], keyed_b[..]);
    let all_a: Vec<u64> = h1.concat();
    assert!(
        all_a.iter().all(|h| !all_b.contains(h)),
        "a hash equal under two keys"
    );
    for c in [&a1, &a2, &b] {
        for r in &c.rows {
            let ph = r.prefix_hashes.as_ref().unwrap();
            assert!(
                unkeyed.iter().all(|u| !ph.contains(u)),
                "an unkeyed hash: {r:?}"
            );
            let names = r.tool_names.as_ref().expect("tool names");
            assert_eq!(names.len(), 1);
            assert!(
                names[0].starts_with("h:") && names[0].len() == 18,
                "{names:?}"
            );
            let row = serde_json::to_string(r).unwrap();
            assert!(
                !row.contains("AcmeBank") && !row.contains("lookup_account"),
                "{row}"
            );
        }
    }
    // Tool names: keyed (equal under one key, not under the other, not FNV-1a's).
    let name = |c: &Captured| c.rows[0].tool_names.clone().unwrap()[0].clone();
    assert_eq!(name(&a1), name(&a2));
    assert_ne!(name(&a1), name(&b));
    let fnv = trace_format::fnv::fnv1a(trace_format::fnv::OFFSET, b"lookup_account_balance");
    assert_ne!(name(&a1), format!("h:{fnv:016x}"));

    // No byte of the key, raw or hex, and no text of the prompt, in anything written.
    let hex: String = ka_bytes.iter().map(|b| format!("{b:02x}")).collect();
    for c in [&a1, &a2] {
        let mut journals = 0;
        for (p, bytes) in &c.written {
            journals += p.to_string_lossy().contains("journal") as usize;
            for needle in [
                &ka_bytes[..],
                hex.as_bytes(),
                &hex.as_bytes()[..16],
                SYSTEM.as_bytes(),
            ] {
                assert!(!contains(bytes, needle), "{} holds a secret", p.display());
            }
            for u in &unkeyed {
                assert!(
                    !contains(bytes, &u.to_le_bytes()),
                    "{}: unkeyed hash",
                    p.display()
                );
            }
        }
        assert!(
            journals > 0,
            "no journal seen: {:?}",
            c.written.iter().map(|w| &w.0).collect::<Vec<_>>()
        );
        let text = format!("{}\n{}", c.metrics, c.log.join("\n"));
        assert!(c.metrics.contains("llmreplay_capture"), "{}", c.metrics);
        assert!(
            !text.contains(&hex[..16]) && !text.contains("AcmeBank"),
            "{text}"
        );
    }

    // The manifest: grade and key id (not the key), printed first by inspect.
    for f in a1.files.iter().chain(&a2.files) {
        let m = f.meta.privacy.as_ref().expect("a manifest");
        assert_eq!(m.grade, Grade::Hashes);
        assert_eq!(m.key_id.as_deref(), Some(key_a.id().0.as_str()));
        assert_eq!(m.block_size, Some(BLOCK));
    }
    let (ok, text) = llmreplay(&["inspect", a1.out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("privacy") && first.contains("grade: hashes"),
        "{text}"
    );
    assert!(text.contains(&key_a.id().0), "{text}");

    // Two keys never mix: inspect (its prefix-cache hit rate), merge and fidelity refuse,
    // naming both key ids; one key combines.
    let (ida, idb) = (key_a.id().0, key_b.id().0);
    let (a1s, a2s, bs) = (
        a1.out.to_str().unwrap(),
        a2.out.to_str().unwrap(),
        b.out.to_str().unwrap(),
    );
    let (ok, text) = llmreplay(&["inspect", a1s, a2s]);
    assert!(ok, "{text}");
    let refused = |args: &[&str]| {
        let (ok, text) = llmreplay(args);
        assert!(!ok, "{args:?} combined two keys: {text}");
        assert!(
            text.contains(&ida) && text.contains(&idb),
            "{args:?}: {text}"
        );
    };
    refused(&["inspect", a1s, bs]);
    // A replay's results carry their trace's key id (they carry its hashes).
    let res = tmpdir("results");
    let replay = |trace: &str, name: &str| {
        let p = res.join(name).to_str().unwrap().to_string();
        let target = format!("sim={}", sim.url());
        let (ok, text) = llmreplay(&["replay", trace, "--target", &target, "--results", &p]);
        assert!(ok, "{text}");
        p
    };
    let (ra, rb) = (replay(a1s, "a.parquet"), replay(bs, "b.parquet"));
    let t = trace_format::read_traces(&[ra.as_str()]).unwrap();
    let carried = t.files[0]
        .meta
        .privacy
        .as_ref()
        .expect("the trace's manifest");
    assert_eq!(carried.key_id.as_deref(), Some(ida.as_str()));
    let merged = res.join("m");
    refused(&["merge", &ra, &rb, "--output", merged.to_str().unwrap()]);
    refused(&["fidelity", "--captured", a1s, "--replayed", &rb]);
    let (_, text) = llmreplay(&["fidelity", "--captured", a1s, "--replayed", &ra]);
    assert!(!text.contains(&idb) && !text.contains("key id"), "{text}");
}

#[test]
fn a_perf_trace_has_no_content_derived_value() {
    let sim = SimProc::fixed(BIN, 1, 1);
    let keys = tmpdir("perf-keys");
    let (k, _) = key_file(&keys, "k", 7);
    let c = capture(
        &sim,
        "perf",
        &["--privacy", "perf", "--hash-key-file", k.to_str().unwrap()],
    );
    let m = c.files[0].meta.privacy.clone().expect("a manifest");
    assert_eq!((m.grade, m.key_id, m.block_size), (Grade::Perf, None, None));
    assert!(m.content_columns.is_empty());
    // Every column of the schema, by the one list: the content-derived ones are null in
    // every row; the others are not all null (the check reads real values).
    let schema = trace_format::schema::schema();
    let mut content = Vec::new();
    for f in schema.fields() {
        let derived = content_column(f.name()).expect("every column classified");
        if !derived {
            continue;
        }
        content.push(f.name().clone());
        for r in &c.rows {
            // The record's fields are named as the columns; the link keys (`link_*`) are
            // the fields of its `link_keys`.
            let v = serde_json::to_value(r).unwrap();
            let value = match f.name().strip_prefix("link_") {
                Some(_) => serde_json::to_value(&r.link_keys).unwrap(),
                None => v[f.name()].clone(),
            };
            let null = match &value {
                serde_json::Value::Object(o) => o.values().all(|x| x.is_null()),
                other => other.is_null(),
            };
            assert!(null, "{} is not null under perf: {v}", f.name());
        }
    }
    assert_eq!(content.len(), 13, "{content:?}");
    for r in &c.rows {
        assert_eq!(r.tools_offered, Some(1), "counts stay: {r:?}");
        assert!(r.prompt_tokens.is_some() && r.ttft_us.is_some());
    }
    // The same flags under the older name mean the same grade.
    let old = capture(
        &sim,
        "perf-old",
        &[
            "--record-bodies",
            "none",
            "--hash-key-file",
            k.to_str().unwrap(),
        ],
    );
    assert_eq!(
        old.files[0].meta.privacy.as_ref().unwrap().grade,
        Grade::Perf
    );
    assert!(old
        .rows
        .iter()
        .all(|r| r.tool_names.is_none() && r.prefix_hashes.is_none()));
}

/// Without --hash-key-file capture makes a key beside its output (0600), says so once on
/// stderr (its path and id, never the key), and a second capture to that output reuses it.
#[test]
fn without_a_key_file_one_is_made_beside_the_output_and_reused() {
    let sim = SimProc::fixed(BIN, 1, 1);
    let c1 = capture(&sim, "auto", &[]);
    let key_path = PathBuf::from(format!("{}.hash-key", c1.out.display()));
    let said: Vec<&String> = c1
        .log
        .iter()
        .filter(|l| l.contains("hash-key-file"))
        .collect();
    assert_eq!(said.len(), 1, "{:#?}", c1.log);
    assert!(said[0].contains("just created") && said[0].contains(&key_path.display().to_string()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let key = HashKey::load(&key_path).unwrap();
    let hex = std::fs::read_to_string(&key_path).unwrap();
    assert!(!c1.log.join("\n").contains(hex.trim()));
    let id = key.id().0;
    assert_eq!(
        c1.files[0].meta.privacy.as_ref().unwrap().key_id.as_deref(),
        Some(id.as_str())
    );
    // Again into the same directory: the same key, so the same hashes.
    let out = c1.out.to_str().unwrap().to_string();
    let (listen, admin) = (free_addr(), free_addr());
    let mut cap = CaptureProc::spawn_admin(BIN, listen, admin, &sim.url(), Path::new(&out), &[]);
    let line = cap.wait_for("hash-key-file");
    assert!(line.contains("kept in") && line.contains(&id), "{line}");
    cap.wait_for("listening on");
    let (status, log) = cap.terminate();
    assert!(status.success(), "{log:#?}");
}

/// The loss bound (issue 54): a capture that drops rows (a writer queue of one, a burst of
/// concurrent requests) and forwards requests it does not record says so on /metrics and in
/// its files' manifests, counted since it started as of each file's close: the first file
/// (rotated by age before the burst) holds the pass-through requests and no drop, the last
/// one the drops too, and `inspect` prints the capture's latest counts with the manifest.
/// Every request sent is a row or a drop.
#[test]
fn a_capture_says_what_it_lost_in_its_manifest_and_on_metrics() {
    let sim = SimProc::fixed(BIN, 1, 1);
    let out = tmpdir("loss");
    let (listen, admin) = (free_addr(), free_addr());
    let flags = [
        "--queue-capacity",
        "1",
        "--flush-interval",
        "1s",
        "--max-file-age",
        "100ms",
    ];
    let mut cap = CaptureProc::spawn_admin(BIN, listen, admin, &sim.url(), &out, &flags);
    cap.wait_for("listening on");
    let mut c = Http1Client::new(listen);
    for _ in 0..2 {
        let r = c.send("GET", "/v1/models", &[], None).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = c
        .post("/v1/chat/completions", &[], &chat_body("first"))
        .unwrap();
    assert_eq!(r.status, 200);
    // The writer's tick (every half second) rotates the first file by age.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while trace_format::read_traces(&[out.to_str().unwrap()]).is_err() {
        assert!(std::time::Instant::now() < deadline, "no first file");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The burst: 32 requests at once against a queue of one drained every 50 ms.
    const BURST: usize = 32;
    let go = std::sync::Arc::new(std::sync::Barrier::new(BURST));
    let burst: Vec<_> = (0..BURST)
        .map(|i| {
            let go = go.clone();
            std::thread::spawn(move || {
                let mut c = Http1Client::new(listen);
                go.wait();
                let r = c
                    .post(
                        "/v1/chat/completions",
                        &[],
                        &chat_body(&format!("user {i}")),
                    )
                    .unwrap();
                assert_eq!(r.status, 200);
            })
        })
        .collect();
    for t in burst {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let metrics = Http1Client::new(admin)
        .send("GET", "/metrics", &[], None)
        .unwrap()
        .text();
    let (status, log) = cap.terminate();
    let metric = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {name}: {metrics}"));
        line[name.len() + 1..].trim().parse().unwrap()
    };
    let dropped = metric("llmreplay_capture_records_dropped_queue_full_total");
    assert!(dropped > 0, "the burst dropped nothing: {metrics}");
    assert_eq!(status.code(), Some(7), "rows were dropped: {log:#?}");
    assert_eq!(metric("llmreplay_capture_records_dropped_total"), dropped);
    assert_eq!(metric("llmreplay_capture_passthrough_requests_total"), 2);
    assert!(
        metrics.contains("llmreplay_capture_crash_window_seconds 1.000\n"),
        "{metrics}"
    );

    let t = trace_format::read_traces(&[out.to_str().unwrap()]).unwrap();
    assert_eq!(t.records.len() as u64 + dropped, 1 + BURST as u64);
    assert!(t.files.len() >= 2, "{} files", t.files.len());
    let loss = |f: &TraceFile| f.meta.privacy.as_ref().unwrap().loss.clone().unwrap();
    let first = t
        .files
        .iter()
        .find(|f| f.rows == 1)
        .expect("the file before the burst");
    let first = loss(first);
    assert_eq!((first.queue_full, first.write_failed), (0, 0));
    assert_eq!(first.unrecorded, 2);
    assert_eq!(
        first.unrecorded_paths,
        [("GET".to_string(), "/v1/models".to_string(), 2)]
    );
    assert_eq!(first.crash_window_ms, 1000);
    let latest = t
        .files
        .iter()
        .map(loss)
        .max_by_key(|l| l.queue_full)
        .unwrap();
    assert_eq!(latest.queue_full, dropped);
    assert_eq!(latest.capture, first.capture, "one capture");

    let (ok, text) = llmreplay(&["inspect", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let privacy: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("trace "))
        .collect();
    let want = format!("lost: {dropped} rows dropped ({dropped} recorder queue full, 0 trace");
    assert!(privacy.iter().any(|l| l.contains(&want)), "{text}");
    assert!(
        privacy
            .iter()
            .any(|l| l.contains("not recorded: 2 requests (GET /v1/models 2)")),
        "{text}"
    );
    assert!(privacy.iter().any(|l| l.contains("last 1000 ms")), "{text}");
}

/// `export` carries the trace's manifest into `<output>.privacy.json` (Mooncake and AIPerf
/// JSONL have no field for it), its `hash_ids` are the keyed `prefix_hashes`, and a `full`
/// trace is refused (status 2) unless `--allow-full-export`.
#[test]
fn export_carries_the_manifest_and_refuses_a_full_trace_unless_told() {
    let sim = SimProc::fixed(BIN, 1, 1);
    let keys = tmpdir("export-keys");
    let (k, _) = key_file(&keys, "k", 3);
    let key = HashKey::load(&k).unwrap();
    let k = k.to_str().unwrap();
    let hashes = capture(&sim, "export-hashes", &["--hash-key-file", k]);
    let full = capture(
        &sim,
        "export-full",
        &["--privacy", "full", "--hash-key-file", k],
    );
    let dir = tmpdir("exported");
    let run = |trace: &Path, out: &Path, extra: &[&str]| {
        let mut args = vec![
            "export",
            trace.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = Command::new(BIN).args(&args).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let sidecar = |out: &Path| -> serde_json::Value {
        let p = format!("{}.privacy.json", out.display());
        serde_json::from_str(&std::fs::read_to_string(&p).expect("the sidecar")).unwrap()
    };
    for (fmt, name) in [("mooncake", "h.jsonl"), ("aiperf", "h-aiperf.jsonl")] {
        let out = dir.join(name);
        let (code, err) = run(&hashes.out, &out, &["--format", fmt]);
        assert_eq!(code, Some(0), "{err}");
        let m = &sidecar(&out)["manifest"];
        assert_eq!(m["grade"], "hashes");
        assert_eq!(m["key_id"], key.id().0.as_str());
        // hash_ids: the rows' keyed prefix hashes, as written.
        let mut exported: Vec<Vec<u64>> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                serde_json::from_value(v["hash_ids"].clone()).unwrap()
            })
            .collect();
        let mut rows: Vec<Vec<u64>> = hashes
            .rows
            .iter()
            .map(|r| r.prefix_hashes.clone().unwrap())
            .collect();
        exported.sort();
        rows.sort();
        assert_eq!(exported, rows);
    }
    let out = dir.join("f.jsonl");
    let (code, err) = run(&full.out, &out, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--privacy full") && err.contains("--allow-full-export"),
        "{err}"
    );
    assert!(!out.exists() && !Path::new(&format!("{}.privacy.json", out.display())).exists());
    let (code, err) = run(&full.out, &out, &["--allow-full-export"]);
    assert_eq!(code, Some(0), "{err}");
    let side = sidecar(&out);
    assert_eq!(side["manifest"]["grade"], "full");
    assert!(side["manifest"]["note"]
        .as_str()
        .unwrap()
        .starts_with("FULL"));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains("AcmeBank"), "no text in the lines: {text}");
}

/// `--time-bucket 100ms`: every arrival is a multiple of 100 ms, the manifest records the
/// bucket and `inspect` prints it as the trace's resolution.
#[test]
fn a_time_bucket_rounds_arrivals_and_is_in_the_manifest() {
    let sim = SimProc::fixed(BIN, 1, 1);
    let c = capture(&sim, "bucket", &["--time-bucket", "100ms"]);
    for r in &c.rows {
        assert_eq!(r.arrival_time_us % 100_000, 0, "{r:?}");
    }
    for f in &c.files {
        assert_eq!(f.meta.privacy.as_ref().unwrap().time_bucket_ms, Some(100));
    }
    let (ok, text) = llmreplay(&["inspect", c.out.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(text.contains("rounded down to 100 ms buckets"), "{text}");
}

/// `rekey` (issue 54): the holder of a trace's key re-keys it to exactly what a capture under
/// the new key recorded (prefix hashes and tool names, row by row), and then it compares with
/// that capture; without the key a `hashes` trace is refused (status 2, naming its key id),
/// as is a wrong key; a `full` trace is re-keyed from its bodies by anyone holding it.
#[test]
fn rekey_by_the_holder_of_the_key_or_from_full_bodies_equals_a_capture_under_the_new_key() {
    let sim = SimProc::fixed(BIN, 1, 1);
    let keys = tmpdir("rekey-keys");
    let (ka, ka_bytes) = key_file(&keys, "a.key", 3);
    let (kb, _) = key_file(&keys, "b.key", 77);
    let (ka, kb) = (ka.to_str().unwrap(), kb.to_str().unwrap());
    let a = capture(&sim, "rk-a", &["--hash-key-file", ka]);
    let b = capture(&sim, "rk-b", &["--hash-key-file", kb]);
    let full = capture(
        &sim,
        "rk-full",
        &["--hash-key-file", ka, "--privacy", "full"],
    );
    let (ida, idb) = (
        HashKey::load(Path::new(ka)).unwrap().id().0,
        HashKey::load(Path::new(kb)).unwrap().id().0,
    );
    let out = tmpdir("rekeyed");
    let status = |args: &[&str]| {
        let o = Command::new(BIN).args(args).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let a_dir = a.out.to_str().unwrap();
    let a2 = out.join("a2.parquet");
    let a2s = a2.to_str().unwrap();
    // Nobody but the key's holder.
    let (code, err) = status(&["rekey", a_dir, "--key-file", kb, "-o", a2s]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("only the holder") && err.contains(&ida),
        "{err}"
    );
    let (code, err) = status(&[
        "rekey",
        a_dir,
        "--key-file",
        kb,
        "--old-key-file",
        kb,
        "-o",
        a2s,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&idb) && err.contains(&ida), "{err}");
    assert!(!a2.exists(), "a refused rekey leaves no file");

    let same_as_b = |path: &str| {
        let t = trace_format::read_traces(&[path]).unwrap();
        assert_eq!(t.records.len(), b.rows.len());
        for (r, want) in t.records.iter().zip(&b.rows) {
            assert_eq!(r.prefix_hashes, want.prefix_hashes, "{}", r.request_id);
            assert!(r.prefix_hashes.as_ref().is_some_and(|h| !h.is_empty()));
        }
        let m = t.files[0].meta.privacy.clone().expect("a manifest");
        assert_eq!(m.key_id.as_deref(), Some(idb.as_str()));
        t
    };
    let (code, err) = status(&[
        "rekey",
        a_dir,
        "--key-file",
        kb,
        "--old-key-file",
        ka,
        "-o",
        a2s,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("with the trace's own key"), "{err}");
    let t = same_as_b(a2s);
    for (r, want) in t.records.iter().zip(&b.rows) {
        assert_eq!(r.tool_names, want.tool_names);
    }
    assert_eq!(
        t.files[0].meta.privacy.as_ref().unwrap().grade,
        Grade::Hashes
    );
    // Re-keyed, it combines with the new key's capture, and holds no byte of either key.
    let (ok, text) = llmreplay(&["inspect", a2s, b.out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let bytes = std::fs::read(&a2).unwrap();
    let hex: String = ka_bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert!(!contains(&bytes, &ka_bytes) && !contains(&bytes, hex.as_bytes()));

    // A full trace: from its bodies, no key needed; tool names stay as sent.
    let f2 = out.join("f2.parquet");
    let f2s = f2.to_str().unwrap();
    let (code, err) = status(&[
        "rekey",
        full.out.to_str().unwrap(),
        "--key-file",
        kb,
        "-o",
        f2s,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("derived again from the bodies"), "{err}");
    let t = same_as_b(f2s);
    assert_eq!(t.files[0].meta.privacy.as_ref().unwrap().grade, Grade::Full);
    assert!(t.records.iter().all(|r| r.body.is_some()));
}
