//! A fleet of captures is one trace (issue 56): the same workload — conversations (shared
//! system prompts, 3–7 turns each, think times between turns) and agents at work (tool
//! calls, sub-agents opened with a `task` call's prompt, final answers; the play of
//! `agents.rs`) — is sent once through one `llmreplay capture` and once round-robin through
//! three (each request to the next capture, as a load balancer spreads a fleet's traffic),
//! all in front of the scripted model of `agents.rs` (it answers what each request asks it
//! to, tool calls with their ids included, so both runs get the same answers). The three
//! captures share one `--hash-key-file`. `llmreplay link` over their three directories must
//! give every row the parent, link kind and session (by marker) the single capture gave it,
//! and the think time the single-capture linker computes from the linked rows (this arrival
//! minus the parent's end); every row must name its capture. Then the linked trace is
//! replayed, closed, against the sim: every child is sent after its parent answered.
//!
//! Two agents of two API keys draw the same tool call ids (their seeds collide): a capture
//! that saw only the other key's call links a tool result to it (tool calls of another
//! client are linked when no call of its own is remembered); the pass, which saw both,
//! links it to its own, as the single capture did, and says the conflict.
//!
//! No turn is ambiguous by design (no two conversations open with the same question and
//! answer): which of two identical candidates a turn continues depends on the timing of the
//! run, which two runs do not share. Loopback only; the figures are printed
//! (`fleet linking: …`).

use crate::agents::{marker, scripted, Clients, Play, Rng, Route, Truth};
use crate::support;
use support::capture::CaptureProc;
use support::env::{free_addr, serial, tmpdir};
use support::fault_upstream::FaultUpstream;
use support::sim::SimProc;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;
use trace_format::{ParentLink, TraceRecord};

fn bin() -> String {
    env!("CARGO_BIN_EXE_llmreplay").to_string()
}

/// One conversation: `turns` user questions, each continuing the last answer.
fn conversation(play: &Play<'_>, name: &str, system: Option<&str>, turns: u64, seed: u64) {
    let mut rng = Rng(seed);
    let mut clients = Clients::new(&play.route);
    let mut messages: Vec<serde_json::Value> = system
        .map(|s| vec![json!({"role": "system", "content": s})])
        .unwrap_or_default();
    let (mut parent, mut gap) = (None, None);
    for t in 0..turns {
        let marker = format!("{name}-t{t}");
        messages.push(json!({"role": "user", "content": format!("question {t} of {name}")}));
        let text = format!("answer {t} of {name}: {}", rng.next());
        let stream = rng.range(0, 2) != 0;
        let done = play.send(
            &mut clients,
            &marker,
            &messages,
            json!({"content": text}),
            stream,
            (parent.take(), gap),
        );
        messages.push(json!({"role": "assistant", "content": text}));
        parent = Some((marker, ParentLink::ChatPrefix));
        std::thread::sleep(Duration::from_millis(rng.range(2, 25)));
        gap = Some(done.elapsed());
    }
}

/// The workload through `addrs` in turn: 12 agents and 36 conversations of 4 API keys,
/// started over ~300 ms, each on its own threads. Returns the truth of every request.
fn workload(addrs: &[SocketAddr]) -> Vec<Truth> {
    let next = AtomicUsize::new(0);
    let plays: Vec<Play> = (0..4)
        .map(|k| Play {
            route: Route { addrs, next: &next },
            key: format!("key-{k}"),
            seed: 7 + k,
            truths: Mutex::new(Vec::new()),
        })
        .collect();
    let systems = [
        Some("You are a helpful assistant."),
        Some("Answer briefly."),
        None,
    ];
    std::thread::scope(|s| {
        for a in 0..12usize {
            let p = &plays[a % 4];
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(a as u64 * 25));
                let task = format!("Fix the failing build for team {}.", a % 4);
                p.agent(&format!("a{a}"), &task, 0, None);
            });
        }
        for c in 0..36u64 {
            let p = &plays[c as usize % 4];
            let system = systems[c as usize % 3];
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(c * 8));
                conversation(p, &format!("c{c}"), system, 3 + c % 5, 1000 + c);
            });
        }
    });
    plays
        .into_iter()
        .flat_map(|p| p.truths.into_inner().unwrap())
        .collect()
}

/// Runs the workload through `n` captures (sharing `key`) in front of `upstream`; their
/// output directories.
fn captured(n: usize, upstream: &str, key: &Path, name: &str) -> (Vec<Truth>, Vec<PathBuf>) {
    let dirs: Vec<PathBuf> = (0..n).map(|i| tmpdir(&format!("{name}-{i}"))).collect();
    let addrs: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
    let key = key.to_str().unwrap();
    let mut caps: Vec<CaptureProc> = dirs
        .iter()
        .zip(&addrs)
        .map(|(d, &a)| {
            let extra = [
                "--flush-interval",
                "50ms",
                "--record-bodies",
                "full",
                "--hash-key-file",
                key,
            ];
            CaptureProc::spawn(a, upstream, d, &extra)
        })
        .collect();
    for c in &mut caps {
        c.wait_for("listening on");
    }
    let truths = workload(&addrs);
    for c in caps {
        let (status, log) = c.terminate();
        assert!(status.success(), "capture exited {status:?}: {log:#?}");
    }
    (truths, dirs)
}

/// Each row by its marker: (parent's marker, link, session's first marker, row).
fn by_marker(
    rows: &[TraceRecord],
) -> HashMap<String, (Option<String>, Option<ParentLink>, String)> {
    let markers: HashMap<&str, String> = rows
        .iter()
        .map(|r| (r.request_id.as_str(), marker(r)))
        .collect();
    rows.iter()
        .map(|r| {
            let parent = r.parent_request_id.as_deref().map(|p| markers[p].clone());
            let session = r.session_id.as_deref().expect("a session");
            (marker(r), (parent, r.parent_link, markers[session].clone()))
        })
        .collect()
}

#[test]
fn three_captures_linked_are_one_capture_and_replay_closed_in_order() {
    let _serial = serial();
    let upstream = FaultUpstream::start(scripted);
    let work = tmpdir("fleet");
    let key = work.join("hash.key");
    std::fs::write(&key, format!("{:064x}\n", 0x5eed_u128 << 64 | 0xfee7)).unwrap();
    let (truth_one, one) = captured(1, &upstream.url(), &key, "fleet-one");
    let (truth_three, three) = captured(3, &upstream.url(), &key, "fleet-three");
    assert_eq!(truth_one.len(), truth_three.len(), "the same workload");

    // Each of the three captures alone leaves most cross-capture turns unlinked.
    let single = trace_format::read_traces(&[one[0].to_str().unwrap()])
        .unwrap()
        .records;
    let mut apart = Vec::new();
    for d in &three {
        apart.extend(
            trace_format::read_traces(&[d.to_str().unwrap()])
                .unwrap()
                .records,
        );
    }
    let ids: std::collections::BTreeSet<_> =
        apart.iter().filter_map(|r| r.capture_id.clone()).collect();
    assert_eq!(ids.len(), 3, "every row names its capture: {ids:?}");
    assert!(apart.iter().all(|r| r.capture_started_us.is_some()));
    let want = by_marker(&single);
    let before = by_marker(&apart);
    let same_before = want.iter().filter(|(m, w)| before[*m] == **w).count();

    let linked_path = work.join("linked.parquet");
    let out = Command::new(bin())
        .arg("link")
        .args(&three)
        .arg("--out")
        .arg(&linked_path)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay link");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "link failed\n{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let linked = trace_format::read_traces(&[linked_path.to_str().unwrap()])
        .unwrap()
        .records;
    assert_eq!(linked.len(), single.len(), "every row once");
    let got = by_marker(&linked);
    let mut wrong = Vec::new();
    for (m, w) in &want {
        if got[m] != *w {
            wrong.push(format!("{m}: single {w:?}, linked {:?}", got[m]));
        }
    }
    // The truth, too: every parent the workload made.
    for t in &truth_one {
        let parent = got[&t.marker].0.clone().zip(got[&t.marker].1);
        if parent != t.parent {
            wrong.push(format!(
                "{}: truth {:?}, linked {parent:?}",
                t.marker, t.parent
            ));
        }
    }
    // Think times as the single-capture linker computes them: arrival − the parent's end.
    let rows: HashMap<&str, &TraceRecord> =
        linked.iter().map(|r| (r.request_id.as_str(), r)).collect();
    for r in &linked {
        let want = r.parent_request_id.as_deref().map(|p| {
            let p = rows[p];
            (r.arrival_time_us - (p.arrival_time_us + p.e2el_us.unwrap_or(0))).max(0)
        });
        if r.think_time_us != want {
            wrong.push(format!(
                "{}: think {:?}, want {want:?}",
                marker(r),
                r.think_time_us
            ));
        }
    }
    let links = want.values().filter(|w| w.0.is_some()).count();
    let kinds = |k| want.values().filter(|w| w.1 == Some(k)).count();
    eprintln!(
        "fleet linking: {} rows, {links} links ({} chat prefix, {} tool call, {} sub-agent); \
         three captures apart: {same_before} of {} rows as one capture; linked: {} of {}\n{said}",
        linked.len(),
        kinds(ParentLink::ChatPrefix),
        kinds(ParentLink::ToolCall),
        kinds(ParentLink::Subagent),
        want.len(),
        want.len() - wrong.len().min(want.len()),
        want.len(),
    );
    assert!(
        links >= 150 && kinds(ParentLink::Subagent) >= 4 && kinds(ParentLink::ToolCall) >= 15,
        "too few links to say: {links}"
    );
    assert!(
        same_before < want.len(),
        "the captures apart must miss links"
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The pass says what it changed: the three captures had linked some turns to the
    // latest turn of the conversation each saw.
    assert!(!said.contains(" 0 chat-prefix links relinked"), "{said}");

    // Closed-mode replay of the linked trace: each child is sent after its parent answered.
    let sim = SimProc::fixed(&bin(), 2, 1);
    let results = work.join("replayed.parquet");
    let out = Command::new(bin())
        .arg("replay")
        .arg(&linked_path)
        .args(["--target", &format!("sim={}", sim.url())])
        .args(["--session-mode", "closed", "--speedup", "4", "--results"])
        .arg(&results)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay replay");
    assert!(
        out.status.success(),
        "replay failed\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let replayed = trace_format::read_traces(&[results.to_str().unwrap()])
        .unwrap()
        .records;
    let sent: HashMap<&str, &TraceRecord> = replayed
        .iter()
        .map(|r| (r.request_id.as_str(), r))
        .collect();
    let mut children = 0;
    for r in &linked {
        let Some(p) = &r.parent_request_id else {
            continue;
        };
        let (c, p) = (sent[r.request_id.as_str()], sent[p.as_str()]);
        let parent_end = p.arrival_time_us + p.e2el_us.expect("the parent answered");
        assert!(
            c.arrival_time_us >= parent_end,
            "{} sent {} µs before its parent answered",
            marker(r),
            parent_end - c.arrival_time_us
        );
        children += 1;
    }
    assert_eq!(children, links);
    for d in one.iter().chain(&three) {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// µs since the epoch of an RFC 3339 time.
fn us(t: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(t)
        .unwrap()
        .timestamp_micros()
}

/// An RFC 3339 time as the tools print it (µs, UTC).
fn utc(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// Three captures' directories (`pod-K`, 4 files of 5 s each, as capture rotates them, a
/// request every 50 ms from 18:53:05 for 20 s; capture K's 7·K ms later), hashed under `key`,
/// beside the repository's sample of an older schema (synth, 1.1: 300 rows from 18:53:09.8 to
/// 18:53:19.7, no capture columns). Returns the inputs and every row written or sampled.
fn fleet_inputs(work: &Path, key: &str) -> (Vec<String>, Vec<TraceRecord>) {
    use trace_format::privacy::{Grade, Manifest};
    let t0 = us("2026-12-01T18:53:05Z");
    let mut meta = trace_format::FileMeta::new(trace_format::Producer::Capture, "test");
    meta.privacy = Some(Manifest::new(
        Grade::Hashes,
        Some(&trace_format::keyed::KeyId(key.into())),
        16,
        "words",
    ));
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/synth-300.parquet");
    let mut all = trace_format::read_traces(&[sample.to_str().unwrap()])
        .unwrap()
        .records;
    let mut inputs = Vec::new();
    for k in 0..3i64 {
        let dir = work.join(format!("pod-{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..4i64 {
            let rows: Vec<TraceRecord> = (0..100i64)
                .map(|i| {
                    let at = t0 + f * 5_000_000 + i * 50_000 + k * 7_000;
                    let mut r = TraceRecord::new(format!("pod{k}-{f}-{i}"), at, "/v1/completions");
                    r.stream = true;
                    (r.prompt_tokens, r.output_tokens, r.max_tokens) = (Some(12), Some(3), Some(3));
                    (r.status, r.ttft_us, r.e2el_us) = (Some(200), Some(2_000), Some(6_000));
                    r.capture_id = Some(format!("pod-{k}"));
                    r.capture_started_us = Some(t0 - 60_000_000 + k);
                    r
                })
                .collect();
            let name = format!("capture-20261201T1853{:02}Z-{f:06}.parquet", 5 + 5 * f);
            trace_format::write_trace_file(&dir.join(name), &rows, &meta).unwrap();
            all.extend(rows);
        }
        inputs.push(dir.display().to_string());
    }
    inputs.push(sample.display().to_string());
    (inputs, all)
}

/// llmreplay with `args`: (success, stdout, stderr).
fn llmreplay(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay");
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Three captures' directories and a trace of an older schema, given together with a window
/// across their files, are one trace of exactly the rows arriving in the window to `replay`,
/// `fidelity --captured`, `report --trace`, `export` and `inspect`: each reads (or replays,
/// exports, compares) that many rows and says each capture's rows and span in it, the same
/// lines from every command. A directory hashed under another key is refused beside them.
#[test]
fn several_captures_in_a_window_are_one_trace_to_replay_fidelity_report_and_export() {
    let _serial = serial();
    let work = tmpdir("fleet-window");
    let (mut inputs, all) = fleet_inputs(&work, "fleet-key");
    let (since, until) = ("2026-12-01T18:53:12Z", "2026-12-01T18:53:16Z");
    let kept: Vec<&TraceRecord> = all
        .iter()
        .filter(|r| (us(since)..us(until)).contains(&r.arrival_time_us))
        .collect();
    let total = kept.len();
    let unnamed = kept.iter().filter(|r| r.capture_id.is_none()).count();
    let mut want = vec![format!(
        "trace: {total} rows in the window [{}, {}) from 3 capture(s):",
        utc(us(since)),
        utc(us(until))
    )];
    for k in 0..3 {
        let at: Vec<i64> = kept
            .iter()
            .filter(|r| r.capture_id.as_deref() == Some(&format!("pod-{k}")))
            .map(|r| r.arrival_time_us)
            .collect();
        let (first, last) = (at[0], *at.last().unwrap());
        want.push(format!(
            "  pod-{k} (started {}): {} rows, {} → {} ({:.3} s), clock unknown (no file says)",
            utc(us("2026-12-01T18:52:05Z") + k),
            at.len(),
            utc(first),
            utc(last),
            (last - first) as f64 / 1e6
        ));
    }
    want.push(format!("  {unnamed} rows name no capture"));
    assert!(
        unnamed > 50 && total > unnamed + 200,
        "{total} rows, {unnamed} synth"
    );
    let says_captures = |what: &str, err: &str| {
        for line in &want {
            assert!(err.contains(line.as_str()), "{what}: no {line:?} in\n{err}");
        }
    };
    let with = |inputs: &[String], extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        v.extend(inputs.iter().cloned());
        v.extend(["--since", since, "--until", until].map(String::from));
        v
    };
    let run = |args: Vec<String>| llmreplay(&args.iter().map(String::as_str).collect::<Vec<_>>());

    // replay: every row of the window sent, none other.
    let sim = SimProc::fixed(&bin(), 1, 1);
    let results = work.join("replayed.parquet");
    let doc = work.join("replayed.json");
    let mut args = with(&inputs, &["replay"]);
    args.extend(["--target".into(), format!("sim={}", sim.url())]);
    args.extend(["--speedup", "4", "--quiet", "--results"].map(String::from));
    args.extend([results.display().to_string(), "--save-result".into()]);
    args.push(doc.display().to_string());
    let (ok, out, err) = run(args);
    assert!(ok, "replay failed\n{out}\n{err}");
    says_captures("replay", &err);
    let replayed = trace_format::read_traces(&[results.to_str().unwrap()])
        .unwrap()
        .records;
    assert_eq!(replayed.len(), total);

    // fidelity: the window's rows are the capture the replay is compared with, all matched.
    let mut args = with(&inputs, &["fidelity", "--captured"]);
    args.extend(["--replayed".into(), results.display().to_string()]);
    args.extend(["--speedup".into(), "4".into()]);
    let (ok, out, err) = run(args);
    assert!(ok, "fidelity failed\n{out}\n{err}");
    says_captures("fidelity", &err);
    assert!(
        out.contains(&format!(
            "Requests: {total} captured, {total} replayed, {total} in both (0 only captured"
        )),
        "{out}"
    );

    // report: the window's 4 s of arrivals are the trace's.
    let md = work.join("report.md");
    let mut args = with(&inputs, &["report", "--trace"]);
    args.extend([
        doc.display().to_string(),
        "-o".into(),
        md.display().to_string(),
    ]);
    let (ok, out, err) = run(args);
    assert!(ok, "report failed\n{out}\n{err}");
    says_captures("report", &err);
    let text = std::fs::read_to_string(&md).unwrap();
    let mean = format!(": 4 s, mean {:.2} req/s", total as f64 / 4.0);
    assert!(text.contains(&mean), "no {mean:?} in\n{text}");

    // export: a line per row of the window.
    let jsonl = work.join("window.jsonl");
    let mut args = with(&inputs, &["export"]);
    args.extend(["-o".into(), jsonl.display().to_string()]);
    let (ok, out, err) = run(args);
    assert!(ok, "export failed\n{out}\n{err}");
    says_captures("export", &err);
    assert_eq!(
        std::fs::read_to_string(&jsonl).unwrap().lines().count(),
        total
    );

    // inspect: the same rows, and each capture's share of them in its summary.
    let (ok, out, err) = run(with(&inputs, &["inspect", "--json"]));
    assert!(ok, "inspect failed\n{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"], total, "{out}");
    let shares: Vec<(String, u64)> = v["captures"]["captures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["rows"].as_u64().unwrap(),
            )
        })
        .collect();
    let count = |k: usize| {
        kept.iter()
            .filter(|r| r.capture_id.as_deref() == Some(&format!("pod-{k}")))
            .count() as u64
    };
    assert_eq!(
        shares,
        (0..3)
            .map(|k| (format!("pod-{k}"), count(k)))
            .collect::<Vec<_>>()
    );

    // A capture hashed under another key is not combined, window or not.
    let other = tmpdir("fleet-window-other");
    let (odd, _) = fleet_inputs(&other, "another-key");
    inputs.push(odd[0].clone());
    let (ok, _, err) = run(with(&inputs, &["inspect"]));
    assert!(
        !ok && err.contains("hashes under different keys never compare"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&other);
}
