//! `results/result.schema.json` against the committed sample and against documents written by
//! this tree (a replay with `--save-detailed`-style arrays, a mixed-class run, a sweep's level
//! results), in `cargo test` (tests/python/test_result_schema.py checks the same with
//! Python's `jsonschema`).
//!
//! The checker covers the subset of JSON Schema 2020-12 the schema uses (type, enum,
//! properties, required, additionalProperties, patternProperties, propertyNames, items,
//! maxItems, minimum, maximum, exclusiveMinimum, minLength, pattern, oneOf, $ref to $defs,
//! dependentRequired); a keyword it does not know fails the test, so the schema cannot grow
//! past what is checked here.

use std::time::Duration;

use replay::config::{EndpointKind, Target};
use replay::ReplayConfig;
use results::doc::ResultDoc;
use serde_json::Value;

const ANNOTATIONS: &[&str] = &["$schema", "$id", "$defs", "title", "description", "format"];

struct Checker<'a> {
    root: &'a Value,
}

impl Checker<'_> {
    fn check(&self, s: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
        let Some(s) = s.as_object() else {
            if s == &Value::Bool(false) {
                errs.push(format!("{at}: not allowed"));
            }
            return;
        };
        for (k, kv) in s {
            match k.as_str() {
                "$ref" => {
                    let r = kv.as_str().unwrap();
                    let path = r.strip_prefix('#').expect("local $ref");
                    let target = self.root.pointer(path).unwrap_or_else(|| panic!("{r}"));
                    self.check(target, v, at, errs);
                }
                "type" => {
                    let types: Vec<&str> = match kv {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                        _ => panic!("type {kv}"),
                    };
                    if !types.iter().any(|t| type_matches(t, v)) {
                        errs.push(format!("{at}: {v} is not of type {types:?}"));
                    }
                }
                "enum" => {
                    if !kv.as_array().unwrap().contains(v) {
                        errs.push(format!("{at}: {v} is not one of {kv}"));
                    }
                }
                "properties" => {
                    if let Some(o) = v.as_object() {
                        for (p, ps) in kv.as_object().unwrap() {
                            if let Some(x) = o.get(p) {
                                self.check(ps, x, &format!("{at}/{p}"), errs);
                            }
                        }
                    }
                }
                "patternProperties" => {
                    if let Some(o) = v.as_object() {
                        for (pat, ps) in kv.as_object().unwrap() {
                            let re = regex::Regex::new(pat).unwrap();
                            for (p, x) in o.iter().filter(|(p, _)| re.is_match(p)) {
                                self.check(ps, x, &format!("{at}/{p}"), errs);
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    if let Some(o) = v.as_object() {
                        let named = s.get("properties").and_then(Value::as_object);
                        let pats: Vec<regex::Regex> = s
                            .get("patternProperties")
                            .and_then(Value::as_object)
                            .map(|m| m.keys().map(|p| regex::Regex::new(p).unwrap()).collect())
                            .unwrap_or_default();
                        for (p, x) in o {
                            let known = named.is_some_and(|n| n.contains_key(p))
                                || pats.iter().any(|re| re.is_match(p));
                            if !known {
                                self.check(kv, x, &format!("{at}/{p}"), errs);
                            }
                        }
                    }
                }
                "propertyNames" => {
                    if let Some(o) = v.as_object() {
                        for p in o.keys() {
                            self.check(kv, &Value::String(p.clone()), &format!("{at}/{p}"), errs);
                        }
                    }
                }
                "required" => {
                    if let Some(o) = v.as_object() {
                        for r in kv.as_array().unwrap().iter().filter_map(Value::as_str) {
                            if !o.contains_key(r) {
                                errs.push(format!("{at}: {r:?} is required"));
                            }
                        }
                    }
                }
                "dependentRequired" => {
                    if let Some(o) = v.as_object() {
                        for (p, needs) in kv.as_object().unwrap() {
                            if !o.contains_key(p) {
                                continue;
                            }
                            for n in needs.as_array().unwrap().iter().filter_map(Value::as_str) {
                                if !o.contains_key(n) {
                                    errs.push(format!("{at}: {p:?} needs {n:?}"));
                                }
                            }
                        }
                    }
                }
                "items" => {
                    if let Some(a) = v.as_array() {
                        for (i, x) in a.iter().enumerate() {
                            self.check(kv, x, &format!("{at}/{i}"), errs);
                        }
                    }
                }
                "maxItems" => {
                    if let Some(a) = v.as_array() {
                        if a.len() as u64 > kv.as_u64().unwrap() {
                            errs.push(format!("{at}: more than {kv} items"));
                        }
                    }
                }
                "minimum" | "maximum" | "exclusiveMinimum" => {
                    if let (Some(x), Some(b)) = (v.as_f64(), kv.as_f64()) {
                        let ok = match k.as_str() {
                            "minimum" => x >= b,
                            "maximum" => x <= b,
                            _ => x > b,
                        };
                        if !ok {
                            errs.push(format!("{at}: {x} fails {k} {b}"));
                        }
                    }
                }
                "minLength" => {
                    if let Some(t) = v.as_str() {
                        if (t.chars().count() as u64) < kv.as_u64().unwrap() {
                            errs.push(format!("{at}: {t:?} shorter than {kv}"));
                        }
                    }
                }
                "pattern" => {
                    if let Some(t) = v.as_str() {
                        if !regex::Regex::new(kv.as_str().unwrap()).unwrap().is_match(t) {
                            errs.push(format!("{at}: {t:?} does not match {kv}"));
                        }
                    }
                }
                "oneOf" => {
                    let n = kv
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|alt| {
                            let mut e = Vec::new();
                            self.check(alt, v, at, &mut e);
                            e.is_empty()
                        })
                        .count();
                    if n != 1 {
                        errs.push(format!("{at}: {v} matches {n} of oneOf, not exactly one"));
                    }
                }
                k if ANNOTATIONS.contains(&k) => {}
                other => panic!("schema keyword {other:?} at {at} is not checked by this test"),
            }
        }
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_u64() || v.is_i64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        other => panic!("type {other}"),
    }
}

fn schema() -> Value {
    serde_json::from_slice(&std::fs::read("result.schema.json").unwrap()).unwrap()
}

fn errors(doc: &Value) -> Vec<String> {
    let s = schema();
    let mut errs = Vec::new();
    Checker { root: &s }.check(&s, doc, "", &mut errs);
    errs
}

#[test]
fn the_committed_sample_validates_and_reads_back_unchanged() {
    let v: Value =
        serde_json::from_slice(&std::fs::read("../samples/sim-replay-300.json").unwrap()).unwrap();
    assert_eq!(errors(&v), Vec::<String>::new());
    let doc = ResultDoc::from_value(&v).unwrap();
    assert_eq!(doc.to_value(), v, "the typed document loses nothing");
}

/// A partial result (a stopped run, or a killed one's rows recovered: unknowns null)
/// validates with its `llmreplay.interrupted`; one without a reason does not.
#[test]
fn a_partial_result_validates() {
    let mut v: Value =
        serde_json::from_slice(&std::fs::read("../samples/sim-replay-300.json").unwrap()).unwrap();
    for i in [
        results::doc::InterruptedDoc {
            reason: "SIGTERM".into(),
            schedule_reached_s: 3.0,
            schedule_span_s: Some(10.0),
            sent: Some(90),
            not_sent: Some(210),
            cancelled: Some(2),
            finished: 88,
        },
        results::doc::InterruptedDoc {
            reason: results::parquet_sink::KILLED.into(),
            schedule_reached_s: 3.0,
            finished: 88,
            ..Default::default()
        },
    ] {
        v["llmreplay"]["interrupted"] = serde_json::to_value(&i).unwrap();
        assert_eq!(errors(&v), Vec::<String>::new(), "{i:?}");
        let doc = ResultDoc::from_value(&v).unwrap();
        assert_eq!(doc.ours().interrupted.as_ref(), Some(&i));
        assert_eq!(doc.to_value(), v);
    }
    v["llmreplay"]["interrupted"]["reason"] = "".into();
    assert!(!errors(&v).is_empty());
}

#[test]
fn the_checker_catches_what_the_schema_forbids() {
    let v: Value =
        serde_json::from_slice(&std::fs::read("../samples/sim-replay-300.json").unwrap()).unwrap();
    let broken = |f: &dyn Fn(&mut Value)| {
        let mut d = v.clone();
        f(&mut d);
        errors(&d)
    };
    assert!(!broken(&|d| d["num_prompts"] = "many".into()).is_empty());
    assert!(!broken(&|d| {
        d.as_object_mut().unwrap().remove("request_throughput");
    })
    .is_empty());
    assert!(!broken(&|d| d["date"] = "yesterday".into()).is_empty());
    assert!(!broken(&|d| d["llmreplay"]["trace"]["content_hash"] = "xyz".into()).is_empty());
}

fn sim(timing: sim::Timing) -> (tokio::runtime::Runtime, sim::SimHandle) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cfg = sim::SimConfig {
        timing,
        ..Default::default()
    };
    let h = rt
        .block_on(sim::start("127.0.0.1:0".parse().unwrap(), cfg))
        .unwrap();
    (rt, h)
}

fn records(n: usize, stream_ratio: f64, endpoint: EndpointKind) -> Vec<trace_format::TraceRecord> {
    replay::synth::synth(&replay::synth::SynthSpec {
        num_prompts: n,
        input_len: 32,
        output_len: 8,
        range_ratio: 0.5,
        request_rate: 200.0,
        burstiness: 1.0,
        seed: 3,
        endpoint,
        start_us: 1_700_000_000_000_000,
        stream_ratio,
    })
    .unwrap()
}

fn fresh(cfg: &ReplayConfig, recs: &[trace_format::TraceRecord], detailed: bool) -> Vec<Value> {
    let identity = results::build::trace_identity(&trace_format::Trace {
        records: recs.to_vec(),
        files: vec![],
    });
    replay::replay(
        &cfg.validate().unwrap(),
        &recs,
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .unwrap()
    .iter()
    .map(|(run, m)| {
        let doc = results::build::result_doc(&results::build::ResultInputs {
            cfg,
            run,
            metrics: m,
            trace: &identity,
            command: "llmreplay replay t",
            detailed,
        });
        // Read back, the typed document keeps every key and value (compared as parsed:
        // serde_json's float parsing may move a last digit, in any reader).
        let v: Value = serde_json::from_slice(&doc.to_bytes()).unwrap();
        assert_eq!(
            ResultDoc::from_value(&v).unwrap().to_value(),
            v,
            "round trip"
        );
        v
    })
    .collect()
}

#[test]
fn fresh_replay_and_sweep_results_validate() {
    let (rt, h) = sim(sim::Timing::Fixed {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
    });
    let target = Target {
        name: "sim".into(),
        url: h.url(),
    };
    let mut cfg = ReplayConfig::new(vec![target]);
    cfg.client_threads = 1;
    cfg.goodput = vec!["ttft:200".parse().unwrap()];
    cfg.label = Some("schema".into());
    cfg.metadata = vec![("team".into(), "golden".into())];
    // Streamed and not, chat: by_class, the detailed arrays, metadata, a label.
    for v in fresh(&cfg, &records(20, 0.5, EndpointKind::Chat), true) {
        assert_eq!(errors(&v), Vec::<String>::new(), "{v:#}");
        assert!(v["llmreplay"]["by_class"].is_array());
        assert_eq!(v["team"], "golden");
        // Every run is stamped (issue 53), and the stamp is what the schema says.
        let stamp = &v["llmreplay"]["client"]["validity"];
        assert!(stamp["valid"].is_boolean(), "{stamp:#}");
        assert!(stamp["probes"].as_u64().unwrap() > 0, "{stamp:#}");
    }
    // A sweep's level results: each level a fresh run, marked with its place in the sweep
    // (what `reporting::sweep::level_result` adds to the run's document).
    let recs = records(12, 1.0, EndpointKind::Completions);
    for (i, level) in [1u64, 4].into_iter().enumerate() {
        cfg.max_concurrency = Some(level as usize);
        for mut v in fresh(&cfg, &recs, false) {
            v["llmreplay"]["sweep"] = serde_json::to_value(results::doc::SweepMark {
                axis: "max-concurrency".into(),
                level: level as f64,
                level_index: i as u64,
                run: 0,
            })
            .unwrap();
            assert_eq!(errors(&v), Vec::<String>::new(), "{v:#}");
            assert!(ResultDoc::from_value(&v).unwrap().ours().sweep.is_some());
        }
    }
    rt.block_on(h.shutdown());
}

/// A result with every field the engine's typed values fill (`--slice`'s slices and drift,
/// the server's gauges and histograms beside the client's TTFT, the client's load, the
/// requests behind each metric), as main wrote it before these fields were typed
/// (`replay --slice 1s --goodput ttft:50` against the in-process sim): it validates, and the
/// typed document writes the same bytes, nulls included.
#[test]
fn a_sliced_result_reads_back_byte_identical() {
    let mut v: Value =
        serde_json::from_slice(&std::fs::read("tests/data/sliced-result.json").unwrap()).unwrap();
    let same = |v: &Value| {
        assert_eq!(errors(v), Vec::<String>::new());
        let doc = ResultDoc::from_value(v).unwrap();
        assert_eq!(doc.to_value(), *v);
        assert_eq!(doc.to_bytes(), serde_json::to_vec_pretty(v).unwrap());
        doc
    };
    let doc = same(&v);
    let ours = doc.ours();
    let sl = ours.slices.as_ref().unwrap();
    assert_eq!(
        (sl.slice_s, sl.slices.len()),
        (
            1.0,
            v["llmreplay"]["slices"]["slices"].as_array().unwrap().len()
        )
    );
    assert_eq!(sl.drift.p95_ttft_ms.unwrap().slices, 3);
    let h = ours.server_histograms.as_ref().unwrap();
    assert!(h.histograms.contains_key("ttft_ms") && h.ttft_gap_ms.is_some());
    assert_eq!(ours.client.load.as_ref().unwrap().worker_threads, 2);
    assert_eq!(ours.metric_requests.single_token, Some(0));
    // What a run writes as null: an empty slice's percentiles, a trend of fewer than two
    // slices, a trend from 0 (no ratio); and an older result without `single_token`.
    v["llmreplay"]["slices"]["slices"][0]["ttft_ms"] = Value::Null;
    v["llmreplay"]["slices"]["slices"][0]["slo_attainment"] = Value::Null;
    v["llmreplay"]["slices"]["drift"]["p95_tpot_ms"] = Value::Null;
    v["llmreplay"]["slices"]["drift"]["completed_per_s"]["ratio"] = Value::Null;
    v["llmreplay"]["metric_requests"]
        .as_object_mut()
        .unwrap()
        .remove("single_token");
    let doc = same(&v);
    assert_eq!(doc.ours().metric_requests.single_token, None);
}
