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
