//! Every output goes through the one writer of the object-store layer: the results of a
//! plain replay, of `--num-runs`/`--sweep` (the JSON and the `--results` Parquet), of `merge`
//! and of `report` land at an object URL as they land at a path. The store here is a plain
//! `http://` one (object_store's HTTP store: PUT of the object) on loopback, which keeps
//! what it was given.

use crate::support;
use support::env::tmpdir;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

type Objects = Arc<Mutex<BTreeMap<String, Vec<u8>>>>;

/// An HTTP object store that takes PUTs (and answers MKCOL) and remembers the bodies.
fn put_store() -> (String, Objects) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let objects: Objects = Default::default();
    let o = objects.clone();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let o = o.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut parts = line.split_whitespace();
                    let (method, path) = (
                        parts.next().unwrap_or("").to_string(),
                        parts.next().unwrap_or("").to_string(),
                    );
                    let mut len = 0usize;
                    loop {
                        let mut h = String::new();
                        r.read_line(&mut h).unwrap();
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                len = v.trim().parse().unwrap();
                            }
                        }
                    }
                    let mut body = vec![0; len];
                    r.read_exact(&mut body).unwrap();
                    let status = match method.as_str() {
                        "PUT" => {
                            o.lock().unwrap().insert(path, body);
                            "201 Created"
                        }
                        "MKCOL" => "201 Created",
                        _ => "404 Not Found",
                    };
                    let _ = write!(w, "HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                }
            });
        }
    });
    (url, objects)
}

fn llmreplay(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_llmreplay"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run llmreplay");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "llmreplay {args:?}: {err}");
    err
}

#[test]
fn every_command_writes_to_an_object_url_as_to_a_path() {
    let (url, objects) = put_store();
    let dir = tmpdir("outputs");
    let trace = dir.join("t.parquet");
    let t = trace.to_str().unwrap();
    llmreplay(&[
        "synth",
        "-o",
        t,
        "--num-prompts",
        "12",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--request-rate",
        "100",
        "--seed",
        "1",
    ]);
    let fixed = ["--fixed-timing", "5,1"];
    // --num-runs: the sweep document and its rows.
    let mut a = vec!["replay", t];
    a.extend(fixed);
    let (runs, rows) = (
        format!("{url}/b/runs.json"),
        format!("{url}/b/rows.parquet"),
    );
    a.extend([
        "--num-runs",
        "2",
        "--save-result",
        &runs,
        "--results",
        &rows,
    ]);
    llmreplay(&a);
    // Shards at local paths, merged to the store.
    let mut shards = Vec::new();
    for k in ["0/2", "1/2"] {
        let p = dir.join(format!("shard{}.parquet", &k[..1]));
        let mut a = vec!["replay", t];
        a.extend(fixed);
        a.extend(["--request-rate", "50", "--max-concurrency", "3"]);
        a.extend(["--shard", k, "--results", p.to_str().unwrap()]);
        llmreplay(&a);
        shards.push(p);
    }
    let merged = format!("{url}/b/merged");
    llmreplay(&[
        "merge",
        shards[0].to_str().unwrap(),
        shards[1].to_str().unwrap(),
        "-o",
        &merged,
    ]);
    // A plain replay's result, then its report.
    let single = dir.join("single.json");
    let mut a = vec!["replay", t];
    a.extend(fixed);
    a.extend(["--save-result", single.to_str().unwrap()]);
    llmreplay(&a);
    let report = format!("{url}/b/report.md");
    llmreplay(&["report", single.to_str().unwrap(), "-o", &report]);

    let got = objects.lock().unwrap();
    for k in [
        "/b/runs.json",
        "/b/rows.parquet",
        "/b/merged.json",
        "/b/merged.parquet",
        "/b/report.md",
    ] {
        assert!(
            got.get(k).is_some_and(|b| !b.is_empty()),
            "{k} not written; got {:?}",
            got.keys()
        );
    }
    assert!(got["/b/rows.parquet"].starts_with(b"PAR1"));
    let sweep: serde_json::Value = serde_json::from_slice(&got["/b/runs.json"]).unwrap();
    assert_eq!(sweep["results"].as_array().unwrap().len(), 2);
    let m: serde_json::Value = serde_json::from_slice(&got["/b/merged.json"]).unwrap();
    // The settings the shards ran with, not a merge's invented ones ("trace", null).
    assert_eq!(m["request_rate"], 50.0);
    assert_eq!(m["burstiness"], 1.0);
    assert_eq!(m["max_concurrency"], 3);
    assert_eq!(m["llmreplay"]["trace"]["arrivals"], "rate");
    assert_eq!(m["llmreplay"]["merge"]["runs"].as_array().unwrap().len(), 2);
    drop(got);
    let _ = std::fs::remove_dir_all(&dir);
}
