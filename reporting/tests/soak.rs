//! Soak against the in-process sim, in seconds: `--loop` replays a short trace three times
//! back to back (and `--loop inf` until `--duration`), `--slice` cuts the run into windows
//! whose counts add up to the run's, and the report draws the timeline.

use std::time::Duration;

use replay::config::{EndpointKind, Target};
use replay::config::{Loops, Soak};
use replay::ReplayConfig;
use reporting::series::ResultFile;

fn trace(n: usize, rate: f64) -> Vec<trace_format::TraceRecord> {
    replay::synth::synth(&replay::synth::SynthSpec {
        num_prompts: n,
        input_len: 64,
        output_len: 16,
        range_ratio: 0.0,
        request_rate: rate,
        burstiness: 1.0,
        seed: 11,
        endpoint: EndpointKind::Completions,
        start_us: 1_700_000_000_000_000,
        stream_ratio: 1.0,
    })
    .unwrap()
}

#[test]
fn a_looped_sliced_run_against_the_sim_reports_every_slice_and_draws_the_timeline() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cfg_sim = sim::SimConfig {
        timing: sim::Timing::Engine(sim::Profile::named("tiny").unwrap()),
        ..Default::default()
    };
    let h = rt
        .block_on(sim::start("127.0.0.1:0".parse().unwrap(), cfg_sim))
        .unwrap();
    let mut cfg = ReplayConfig::new(vec![Target {
        name: "sim".into(),
        url: h.url(),
    }]);
    cfg.client_threads = 1;
    cfg.goodput = vec!["ttft:500".parse().unwrap(), "tpot:50".parse().unwrap()];
    cfg.soak = Soak {
        loops: Some(Loops::Count(3)),
        slice: Some(Duration::from_millis(500)),
    };
    let records = trace(8, 8.0); // ~1 s of trace per pass
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &records,
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .unwrap();
    let (run, m) = &runs[0];
    assert_eq!(m.num_prompts, 24, "three passes of 8");
    assert_eq!(
        run.records
            .iter()
            .filter(|r| r.request_id.ends_with("~2"))
            .count(),
        8
    );
    // Every pass after the first starts after the previous pass's last send.
    let sent = |suffix: &str| -> Vec<i64> {
        run.records
            .iter()
            .filter(|r| match r.request_id.rsplit_once('~') {
                Some((_, k)) => k == suffix,
                None => suffix.is_empty(),
            })
            .map(|r| r.arrival_time_us)
            .collect()
    };
    assert!(sent("").iter().max() < sent("1").iter().min());
    assert!(sent("1").iter().max() < sent("2").iter().min());
    let identity = results::build::trace_identity(&trace_format::Trace {
        records: records.clone(),
        files: vec![],
    });
    let j = results::build::result_json(&results::build::ResultInputs {
        cfg: &cfg,
        run,
        metrics: m,
        trace: &identity,
        command: "llmreplay replay t --loop 3 --slice 500ms",
        detailed: true,
    });
    assert_eq!(j["llmreplay"]["soak"]["passes"], 3);
    let sl = &j["llmreplay"]["slices"];
    let slices = sl["slices"].as_array().unwrap();
    // ~3 s of sends plus the last completions, in 0.5 s slices.
    assert!((5..=12).contains(&slices.len()), "{} slices", slices.len());
    let total: u64 = slices.iter().map(|s| s["requests"].as_u64().unwrap()).sum();
    assert_eq!(total, 24, "every request in exactly one slice");
    let done: f64 = slices
        .iter()
        .map(|s| s["completed_per_s"].as_f64().unwrap() * sl["slice_s"].as_f64().unwrap())
        .sum();
    assert!(
        (done - m.completed as f64).abs() < 1e-6,
        "{done} vs {}",
        m.completed
    );
    for s in slices.iter().filter(|s| s["completed"].as_u64() > Some(0)) {
        assert!(s["ttft_ms"]["p95"].as_f64().unwrap() > 0.0, "{s}");
    }
    assert!(
        sl["drift"]["p95_ttft_ms"]["slope_per_hour"].is_number(),
        "{sl}"
    );

    // The report: two timeline plots and the drift table.
    let dir = std::env::temp_dir().join(format!("llmreplay-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("soak.json");
    std::fs::write(&p, serde_json::to_vec(&j).unwrap()).unwrap();
    let data = reporting::document::build(&[ResultFile::read(&p).unwrap()], &Default::default());
    assert_eq!(data.slices.len(), 1);
    let plots = reporting::html::plots(&data);
    let timeline: Vec<_> = plots
        .iter()
        .filter(|(c, _)| c.starts_with("Timeline"))
        .collect();
    assert_eq!(
        timeline.len(),
        2,
        "{:?}",
        plots.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    for (_, svg) in &timeline {
        assert!(svg.matches("<polyline").count() >= 2, "{svg}");
        assert!(!svg.contains("no data"));
    }
    let html = reporting::html::render(&data);
    assert!(html.contains("Drift over the run"));
    assert!(reporting::document::markdown(&data).contains("## Drift over the run"));
    let _ = std::fs::remove_dir_all(&dir);

    // --loop inf: as many passes as 2.5 s of trace time needs (period ~1 s: three), cut there.
    cfg.soak = Soak {
        loops: Some(Loops::UntilDuration),
        slice: None,
    };
    assert!(cfg.validate().is_err(), "--loop inf needs --duration");
    cfg.selection.duration = Some(Duration::from_millis(2500));
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &records,
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .unwrap();
    let (run, m) = &runs[0];
    let last = run
        .records
        .iter()
        .map(|r| r.scheduled_offset_us.unwrap())
        .max()
        .unwrap();
    assert!(
        last < 2_500_000 + 100_000,
        "nothing scheduled past --duration: {last}"
    );
    assert!(
        m.num_prompts > 16 && m.num_prompts < 24,
        "{}",
        m.num_prompts
    );
    rt.block_on(h.shutdown());
}
