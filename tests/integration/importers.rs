//! The agent and production trace importers end to end, on the samples the project made from
//! each format's field list (`samples/agent/`): imported, inspected (sessions and parents
//! shown), replayed against a sim (recorded cancellations cancelled again at their point),
//! exported to AIPerf's sessions and imported back (same sessions, parents, arrival offsets
//! and token counts); and bad input gives an error naming the file and line, never a panic.

use crate::support;
use support::env::tmpdir;
use support::sim::SimProc;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use trace_format::{read_traces, Outcome, TraceRecord};

fn bin() -> String {
    env!("CARGO_BIN_EXE_llmreplay").to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay")
}

fn ok(o: &Output) -> (String, String) {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{out}\n{err}");
    (out, err)
}

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/agent")
        .join(name)
}

fn import(src: &Path, out: &Path) -> (Vec<TraceRecord>, String) {
    let (_, err) = ok(&run(&[
        "import",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]));
    (read_traces(&[out.to_str().unwrap()]).unwrap().records, err)
}

/// The shape of a trace that survives an export to AIPerf and back: per session, its rows in
/// arrival order as (offset from the trace's first arrival, prompt, output tokens, index of
/// the parent in the session or None).
#[allow(clippy::type_complexity)]
fn shape(rows: &[TraceRecord]) -> HashMap<String, Vec<(i64, i64, i64, Option<usize>)>> {
    let first = rows.iter().map(|r| r.arrival_time_us).min().unwrap();
    let mut by: HashMap<String, Vec<&TraceRecord>> = HashMap::new();
    for r in rows {
        by.entry(r.session_id.clone().unwrap_or_default())
            .or_default()
            .push(r);
    }
    by.into_iter()
        .map(|(s, mut rs)| {
            rs.sort_by_key(|r| (r.arrival_time_us, r.request_id.clone()));
            let pos = |id: &str| rs.iter().position(|r| r.request_id == id);
            let v = rs
                .iter()
                .map(|r| {
                    (
                        r.arrival_time_us - first,
                        r.prompt_tokens.unwrap(),
                        r.output_tokens.unwrap(),
                        r.parent_request_id.as_deref().and_then(pos),
                    )
                })
                .collect();
            (s, v)
        })
        .collect()
}

/// Every agent sample: imported with sessions and parents, `inspect` shows them, and an
/// AIPerf export imports back to the same sessions, parents, offsets and token counts.
#[test]
fn agent_samples_import_inspect_and_round_trip_through_aiperf() {
    let dir = tmpdir("importers-agent");
    for (name, rows, sessions) in [
        ("dynamo-agent.jsonl", 27, 3),
        ("copilot-agent.jsonl", 0, 4),
        ("weka-agent.jsonl", 0, 5),
    ] {
        let t = dir.join(format!("{name}.parquet"));
        let (recs, err) = import(&sample(name), &t);
        if rows > 0 {
            assert_eq!(recs.len(), rows, "{name}: {err}");
        }
        let distinct: std::collections::HashSet<_> =
            recs.iter().map(|r| r.session_id.clone().unwrap()).collect();
        assert_eq!(distinct.len(), sessions, "{name}");
        let linked = recs
            .iter()
            .filter(|r| r.parent_request_id.is_some())
            .count();
        assert_eq!(
            linked,
            recs.len() - sessions,
            "{name}: every turn but the first is linked"
        );
        assert!(recs
            .iter()
            .all(|r| r.parent_request_id.is_none() || r.think_time_us.is_some()));
        let (out, _) = ok(&run(&["inspect", t.to_str().unwrap()]));
        let line = out
            .lines()
            .find(|l| l.starts_with("sessions"))
            .unwrap_or("");
        assert!(
            line.contains(&format!(" {sessions} ({sessions} multi-turn)")),
            "{name}: {out}"
        );
        assert!(
            line.contains(&format!("({linked} linked turns)")),
            "{name}: {out}"
        );

        let jsonl = dir.join(format!("{name}.aiperf.jsonl"));
        let (_, err) = ok(&run(&[
            "export",
            "--format",
            "aiperf",
            t.to_str().unwrap(),
            "-o",
            jsonl.to_str().unwrap(),
        ]));
        assert!(
            err.contains(&format!("{} of them in sessions", recs.len())),
            "{err}"
        );
        let first = std::fs::read_to_string(&jsonl).unwrap();
        assert!(first.lines().any(|l| l.contains("\"delay\": ")), "{first}");
        let (again, _) = import(&jsonl, &dir.join(format!("{name}.again.parquet")));
        if name.starts_with("dynamo") || name.starts_with("weka") {
            // AIPerf's sessions are linear: a subagent's turns follow its session's order.
            assert_eq!(again.len(), recs.len());
            continue;
        }
        assert_eq!(shape(&again), shape(&recs), "{name}");
        let think = |rs: &[TraceRecord]| {
            let mut v: Vec<_> = rs
                .iter()
                .map(|r| (r.arrival_time_us, r.think_time_us))
                .collect();
            v.sort();
            v.into_iter().map(|x| x.1).collect::<Vec<_>>()
        };
        assert_eq!(
            think(&again),
            think(&recs),
            "{name}: think times survive as delay"
        );
    }
}

/// Recorded cancellations (Baseten's cancel flag, Copilot's UserCancel) are replayed as
/// cancellations at their recorded point: against a sim slower than the recorded server,
/// every such row ends `client_cancelled`, and no other row does.
#[test]
fn recorded_cancels_replay_at_their_point() {
    let dir = tmpdir("importers-cancel");
    // 50 ms to the first token, 50 ms per token: slower than any recorded stream here, so
    // the recorded cancel point always comes before the end.
    let sim = SimProc::fixed(&bin(), 50, 50);
    for (name, want_cancelled) in [("baseten-40.parquet", 5), ("copilot-agent.jsonl", 1)] {
        let t = dir.join(format!("{name}.trace.parquet"));
        let (recs, err) = import(&sample(name), &t);
        let cancelled = recs
            .iter()
            .filter(|r| r.outcome == Outcome::ClientCancelled)
            .count();
        assert_eq!(cancelled, want_cancelled, "{name}");
        assert!(
            err.contains(&format!("{want_cancelled} cancelled by the client")),
            "{err}"
        );
        let results = dir.join(format!("{name}.results.parquet"));
        ok(&run(&[
            "replay",
            t.to_str().unwrap(),
            "--target",
            &format!("sim={}", sim.url()),
            "--speedup",
            "50",
            "--max-concurrency",
            "64",
            "--results",
            results.to_str().unwrap(),
            "-q",
            "--timeout",
            "60s",
        ]));
        let got = read_traces(&[results.to_str().unwrap()]).unwrap().records;
        assert_eq!(got.len(), recs.len(), "{name}");
        let want: HashMap<&str, &TraceRecord> =
            recs.iter().map(|r| (r.request_id.as_str(), r)).collect();
        for r in &got {
            let rec = want[r.request_id.as_str()];
            if rec.outcome == Outcome::ClientCancelled {
                assert_eq!(
                    r.outcome,
                    Outcome::ClientCancelled,
                    "{name} {}",
                    r.request_id
                );
                assert!(
                    r.error
                        .as_deref()
                        .unwrap_or("")
                        .contains("cancelled as recorded"),
                    "{:?}",
                    r.error
                );
                // Cancelled at the recorded point, not at the end: never later than a
                // whole stream of the recorded length on this sim.
                let full = 50_000 + 50_000 * rec.output_tokens.unwrap();
                assert!(
                    r.e2el_us.unwrap() < full,
                    "{name} {}: {:?}",
                    r.request_id,
                    r.e2el_us
                );
            } else if rec.outcome == Outcome::Ok {
                assert_eq!(
                    r.outcome,
                    Outcome::Ok,
                    "{name} {}: {:?}",
                    r.request_id,
                    r.error
                );
            }
        }
    }
}

/// A malformed line, a missing field and a wrong type: exit status 1 and an error naming the
/// file and line (row for Parquet), for every new format; `--help` lists what is not mapped.
#[test]
fn bad_agent_traces_name_the_file_and_line() {
    let dir = tmpdir("importers-bad");
    let first_line = |name: &str| {
        std::fs::read_to_string(sample(name))
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    let cases = [
        (
            "dynamo",
            first_line("dynamo-agent.jsonl"),
            "\"input_tokens\": ",
            "\"input_tokens\": \"x\", \"y\": ",
        ),
        (
            "copilot",
            first_line("copilot-agent.jsonl"),
            "\"session_id\"",
            "\"sessionid\"",
        ),
        (
            "weka",
            first_line("weka-agent.jsonl"),
            "\"requests\": [",
            "\"requests\": 3, \"r\": [",
        ),
    ];
    for (format, good, from, to) in cases {
        let bad = good.replacen(from, to, 1);
        assert_ne!(bad, good);
        for (i, content) in [format!("{good}\n{{not json\n"), format!("{good}\n{bad}\n")]
            .into_iter()
            .enumerate()
        {
            let p = dir.join(format!("{format}-{i}.jsonl"));
            std::fs::write(&p, content).unwrap();
            let o = run(&[
                "import",
                "--format",
                format,
                p.to_str().unwrap(),
                "-o",
                dir.join("x.parquet").to_str().unwrap(),
            ]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{format}: {err}");
            assert!(
                err.contains(&format!("{format}-{i}.jsonl:2:")) && !err.contains("panicked"),
                "{format}: {err}"
            );
        }
    }
    // Parquet that is not: named, no panic.
    let p = dir.join("fake.parquet");
    std::fs::write(&p, b"PAR1 and then nothing").unwrap();
    let o = run(&[
        "import",
        p.to_str().unwrap(),
        "-o",
        dir.join("y.parquet").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("fake.parquet") && !err.contains("panicked"),
        "{err}"
    );

    let (help, _) = ok(&run(&["import", "--help"]));
    for unmapped in [
        "cached_tokens",
        "tokens.cached",
        "tool_batches",
        "Not mapped: models, tool_tokens",
        "the columns AIPerf's Baseten loader reads",
    ] {
        assert!(help.contains(unmapped), "{unmapped}: {help}");
    }
}

/// The Dynamo and WEKA samples replay against the in-process sim with their sessions closed
/// (each turn after the candidate's answer plus the recorded think time), every request
/// served; the Baseten sample exports to Mooncake JSONL and imports back row for row.
#[test]
fn agent_samples_replay_in_closed_sessions_and_baseten_exports() {
    let dir = tmpdir("importers-replay");
    for name in ["dynamo-agent.jsonl", "weka-agent.jsonl"] {
        let t = dir.join(format!("{name}.parquet"));
        let (recs, _) = import(&sample(name), &t);
        let result = dir.join(format!("{name}.json"));
        ok(&run(&[
            "replay",
            t.to_str().unwrap(),
            "--session-mode",
            "closed",
            "--speedup",
            "50",
            "--save-result",
            result.to_str().unwrap(),
            "-q",
            "--timeout",
            "60s",
        ]));
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
        assert_eq!(v["completed"].as_u64(), Some(recs.len() as u64), "{name}");
        let prompts: i64 = recs.iter().map(|r| r.prompt_tokens.unwrap()).sum();
        assert_eq!(v["total_input_tokens"].as_i64(), Some(prompts), "{name}");
    }
    let t = dir.join("baseten.parquet");
    let (recs, err) = import(&sample("baseten-40.parquet"), &t);
    assert!(err.contains("columns not mapped: org_id"), "{err}");
    let jsonl = dir.join("baseten.jsonl");
    ok(&run(&[
        "export",
        t.to_str().unwrap(),
        "-o",
        jsonl.to_str().unwrap(),
    ]));
    let (again, _) = import(&jsonl, &dir.join("baseten-again.parquet"));
    let tokens = |rs: &[TraceRecord]| {
        let first = rs.iter().map(|r| r.arrival_time_us).min().unwrap();
        let mut v: Vec<_> = rs
            .iter()
            .map(|r| (r.arrival_time_us - first, r.prompt_tokens, r.output_tokens))
            .collect();
        v.sort();
        v
    };
    assert_eq!(tokens(&again), tokens(&recs));
}

/// Closed mode follows the graph: each Dynamo request whose parent (`parent_request_id`: the
/// previous call of its trajectory, or, for a subagent's first call, its parent trajectory's
/// latest call) was replayed is sent once that parent's response ended plus the recorded think
/// time ÷ the speedup, not before, and soon after; a subagent runs beside its parent's
/// trajectory instead of after the session's previous turn.
#[test]
fn closed_mode_sends_each_child_after_its_parent_ended_plus_think_time() {
    let _serial = support::env::serial();
    let dir = tmpdir("importers-graph");
    let t = dir.join("dynamo.parquet");
    let (recs, _) = import(&sample("dynamo-agent.jsonl"), &t);
    let rows = dir.join("rows.parquet");
    let speedup = 20.0;
    ok(&run(&[
        "replay",
        t.to_str().unwrap(),
        "--session-mode",
        "closed",
        "--speedup",
        &speedup.to_string(),
        "--results",
        rows.to_str().unwrap(),
        "-q",
        "--timeout",
        "60s",
    ]));
    let got = read_traces(&[rows.to_str().unwrap()]).unwrap().records;
    assert_eq!(got.len(), recs.len());
    let sent: HashMap<&str, &TraceRecord> =
        got.iter().map(|r| (r.request_id.as_str(), r)).collect();
    let by_id: HashMap<&str, &TraceRecord> =
        recs.iter().map(|r| (r.request_id.as_str(), r)).collect();
    let (mut children, mut subagents, mut late) = (0, 0, Vec::new());
    for r in &recs {
        let Some(p) = r.parent_request_id.as_deref() else {
            continue;
        };
        let (c, pr) = (sent[r.request_id.as_str()], sent[p]);
        let parent_end = pr.arrival_time_us + pr.e2el_us.unwrap();
        let rec_p = by_id[p];
        let think = r.arrival_time_us - (rec_p.arrival_time_us + rec_p.e2el_us.unwrap());
        let due = parent_end + (think.max(0) as f64 / speedup) as i64;
        // The end is the loop's (monotonic) stamp, the row's the wall clock's: 2 ms apart at most.
        assert!(
            c.arrival_time_us >= due - 2_000,
            "{} sent {} µs before its parent {p} ended plus think time",
            r.request_id,
            due - c.arrival_time_us
        );
        late.push(c.arrival_time_us - due);
        children += 1;
        subagents += usize::from(
            r.session_id == rec_p.session_id && {
                // a subagent's first call: the previous call of the session is not its parent
                let prev = recs
                    .iter()
                    .filter(|q| {
                        q.session_id == r.session_id && q.arrival_time_us < r.arrival_time_us
                    })
                    .max_by_key(|q| q.arrival_time_us);
                prev.is_some_and(|q| q.request_id != p)
            },
        );
    }
    late.sort();
    assert!(children >= 20 && subagents >= 1, "{children} {subagents}");
    // Sent soon after it was due (the median, on a loaded 2-core machine).
    let median = late[late.len() / 2];
    eprintln!(
        "closed-mode children sent after their parent's end + think: {children} ({subagents} subagent openings), late by p50 {median} µs, max {} µs",
        late[late.len() - 1]
    );
    assert!(median < 50_000, "{late:?}");
}
