use super::*;

const T0: i64 = 1_700_000_000_000_000;
const CHAT: &str = "/v1/chat/completions";

/// A streamed row: `ttft` ms to the first of `out` chunks, then `itl` ms apart.
fn row(id: &str, at_ms: i64, ttft: f64, itl: f64, out: i64) -> TraceRecord {
    let mut r = TraceRecord::new(id, T0 + at_ms * 1000, CHAT);
    r.stream = true;
    r.status = Some(200);
    r.outcome = Outcome::Ok;
    let ttft_us = (ttft * 1000.0) as i64;
    r.ttft_us = Some(ttft_us);
    r.chunk_times_us = (0..out)
        .map(|i| ttft_us + (i as f64 * itl * 1000.0) as i64)
        .collect();
    r.e2el_us = r.chunk_times_us.last().copied();
    r.output_tokens = Some(out);
    r
}

fn shadow_of(p: &TraceRecord, target: &str, ttft: f64, itl: f64, out: i64) -> TraceRecord {
    let mut r = row(
        &format!("{}-{target}", p.request_id),
        (p.arrival_time_us - T0) / 1000,
        ttft,
        itl,
        out,
    );
    r.pair_request_id = Some(p.request_id.clone());
    r.target = Some(target.into());
    r
}

/// A deterministic spread in [0, 1): the requests' own variety (prompt lengths, batching).
fn u(i: u64) -> f64 {
    let x = (i.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
    x as f64 / (1u64 << 53) as f64
}

#[test]
fn a_constant_delay_is_measured_exactly_and_the_paired_interval_is_far_narrower() {
    let mut rows = Vec::new();
    for i in 0..40 {
        // Production TTFT anywhere from 50 to 500 ms; the candidate exactly 10 ms later.
        let ttft = 50.0 + 450.0 * u(i);
        let p = row(&format!("r{i}"), i as i64 * 100, ttft, 10.0, 20);
        rows.push(shadow_of(&p, "cand", ttft + 10.0, 10.0, 20));
        rows.push(p);
    }
    let rep = assess(&rows, &[], 95.0).unwrap();
    assert_eq!((rep.production, rep.orphans), (40, 0));
    let c = &rep.candidates[0];
    assert_eq!((c.target.as_str(), c.paired, c.unpaired), ("cand", 40, 0));
    assert_eq!(c.differed_total, 0);
    let ttft = c.classes[0]
        .metrics
        .iter()
        .find(|d| d.metric == "ttft")
        .unwrap();
    assert_eq!(ttft.n, 40);
    assert!((ttft.mean_delta - 10.0).abs() < 0.01, "{ttft:?}");
    assert!(ttft.ci.0 > 9.9 && ttft.ci.1 < 10.1, "{ttft:?}");
    assert_eq!(ttft.reading, Reading::Higher);
    // The spread between requests (±225 ms) hides 10 ms from an unpaired comparison.
    assert!(!ttft.unpaired_shows(), "{ttft:?}");
    assert!(ttft.narrower > 100.0, "{ttft:?}");
    // ITL and output tokens did not change.
    for m in ["itl", "output_tokens"] {
        let d = c.classes[0].metrics.iter().find(|d| d.metric == m).unwrap();
        assert_eq!(d.reading, Reading::NoDifference, "{d:?}");
    }
    let text = rep.to_string();
    assert!(
        text.contains("TTFT") && text.contains("HIGHER on the candidate"),
        "{text}"
    );
    assert!(text.contains("VERDICT cand: PASS"), "{text}");
}

#[test]
fn outcomes_are_paired_and_the_clients_failures_are_not_the_candidates() {
    let mut rows = Vec::new();
    // 10 served on both sides.
    for i in 0..10 {
        let p = row(&format!("ok{i}"), i * 10, 100.0, 10.0, 10);
        rows.push(shadow_of(&p, "cand", 110.0, 10.0, 10));
        rows.push(p);
    }
    // A 4xx (a bad body): answered 400 by both.
    let mut bad = row("bad", 200, 1.0, 0.0, 0);
    (bad.status, bad.outcome, bad.stream) = (Some(400), Outcome::HttpError, false);
    let mut bad_s = shadow_of(&bad, "cand", 1.0, 0.0, 0);
    (bad_s.status, bad_s.outcome, bad_s.stream) = (Some(400), Outcome::HttpError, false);
    // The client cancelled: the shadow was cancelled at the same point.
    let mut gone = row("gone", 300, 100.0, 10.0, 3);
    gone.outcome = Outcome::ClientCancelled;
    let mut gone_s = shadow_of(&gone, "cand", 110.0, 10.0, 3);
    gone_s.outcome = Outcome::ClientCancelled;
    // Served by production, failed by the candidate.
    let fail = row("fail", 400, 100.0, 10.0, 10);
    let mut fail_s = shadow_of(&fail, "cand", 0.0, 0.0, 0);
    (fail_s.status, fail_s.outcome) = (Some(503), Outcome::HttpError);
    fail_s.error = Some("overloaded".into());
    // Served by production, cut by capture's shutdown before the candidate finished.
    let late = row("late", 500, 100.0, 10.0, 10);
    let mut late_s = shadow_of(&late, "cand", 110.0, 10.0, 4);
    late_s.outcome = Outcome::ClientCancelled;
    late_s.error = Some("cut by the proxy's shutdown after the drain timeout".into());
    rows.extend([bad, bad_s, gone, gone_s, fail, fail_s, late, late_s]);
    let rep = assess(&rows, &[], 95.0).unwrap();
    let c = &rep.candidates[0];
    assert_eq!(c.paired, 14);
    let count = |p: Outcome, k: Outcome| {
        c.outcomes
            .iter()
            .find(|o| o.production == p && o.candidate == k)
            .map_or(0, |o| o.requests)
    };
    assert_eq!(count(Outcome::Ok, Outcome::Ok), 10);
    assert_eq!(count(Outcome::HttpError, Outcome::HttpError), 1);
    assert_eq!(count(Outcome::ClientCancelled, Outcome::ClientCancelled), 1);
    assert_eq!(count(Outcome::Ok, Outcome::HttpError), 1);
    assert_eq!(count(Outcome::Ok, Outcome::ClientCancelled), 1);
    assert_eq!(c.differed_total, 2);
    assert_eq!(c.differed[0].request_id, "fail");
    assert_eq!(c.differed[1].request_id, "late");
    assert_eq!(c.differed[0].candidate, (Outcome::HttpError, Some(503)));
    // The candidate failed 1 of the 11 it was asked to serve (the 4xx and the cancellations,
    // the client's and capture's, are not its doing): over the budget. Production failed none.
    assert!(!c.verdict.pass, "{:?}", c.verdict);
    assert!(
        c.verdict.reason.contains("1 of 11 failed by the server"),
        "{}",
        c.verdict.reason
    );
    assert!(c.production_verdict.pass, "{:?}", c.production_verdict);
    let text = rep.to_string();
    assert!(
        text.contains("fail: production ok 200, candidate http_error 503 (overloaded)"),
        "{text}"
    );
}

#[test]
fn the_slo_verdict_names_the_candidates_slower_ttft() {
    let mut rows = Vec::new();
    for i in 0..50 {
        let p = row(
            &format!("r{i}"),
            i * 10,
            80.0 + 10.0 * u(i as u64),
            10.0,
            10,
        );
        rows.push(shadow_of(
            &p,
            "slow",
            2.0 * p.ttft_us.unwrap() as f64 / 1000.0,
            10.0,
            10,
        ));
        rows.push(p);
    }
    let slos: Vec<Slo> = vec!["ttft:120".parse().unwrap()];
    let rep = assess(&rows, &slos, 95.0).unwrap();
    let c = &rep.candidates[0];
    assert!(c.production_verdict.pass, "{:?}", c.production_verdict);
    assert!(!c.verdict.pass);
    assert!(c.verdict.reason.contains("TTFT"), "{}", c.verdict.reason);
    let ttft = &c.classes[0].metrics[0];
    assert_eq!(ttft.metric, "ttft");
    let r = ttft.ratio.unwrap();
    assert!((r.ratio - 2.0).abs() < 0.01, "{r:?}");
}

#[test]
fn unpaired_and_orphaned_rows_are_counted_and_nothing_to_pair_is_an_error() {
    let a = row("a", 0, 100.0, 10.0, 5);
    let b = row("b", 10, 100.0, 10.0, 5);
    let a_s = shadow_of(&a, "cand", 100.0, 10.0, 5);
    let mut lost = shadow_of(&row("gone", 0, 1.0, 1.0, 2), "cand", 1.0, 1.0, 2);
    lost.pair_request_id = Some("not-in-input".into());
    let rep = assess(&[a.clone(), b.clone(), a_s, lost.clone()], &[], 95.0).unwrap();
    assert_eq!(rep.orphans, 1);
    assert_eq!(
        (rep.candidates[0].paired, rep.candidates[0].unpaired),
        (1, 1)
    );
    let e = assess(&[a, b], &[], 95.0).unwrap_err().to_string();
    assert!(e.contains("no shadow rows among the 2 rows"), "{e}");
    let e = assess(&[lost], &[], 95.0).unwrap_err().to_string();
    assert!(e.contains("none of the production rows"), "{e}");
}

/// A candidate 10% slower, requests as varied as production's (TTFT from 40 to 400 ms) with
/// ±5% run-to-run noise per request: the paired interval shows the difference with far fewer
/// requests than an unpaired comparison of the same samples.
#[test]
fn pairing_detects_a_ten_percent_slower_candidate_with_fewer_requests() {
    let first_shown = |paired: bool| {
        (3..2000)
            .find(|&n| {
                let pairs: Vec<(f64, f64)> = (0..n as u64)
                    .map(|i| {
                        let base = 40.0 * 10f64.powf(u(i));
                        let noise = 1.0 + 0.1 * (u(i + 10_000) - 0.5);
                        (base, base * 1.1 * noise)
                    })
                    .collect();
                let d = Delta::of("ttft", &pairs).unwrap();
                if paired {
                    d.reading == Reading::Higher
                } else {
                    d.unpaired_shows()
                }
            })
            .unwrap_or(usize::MAX)
    };
    let (paired, unpaired) = (first_shown(true), first_shown(false));
    eprintln!("10% slower shown after {paired} paired requests, {unpaired} unpaired");
    assert!(paired <= 10, "{paired}");
    assert!(
        unpaired > 10 * paired,
        "paired {paired}, unpaired {unpaired}"
    );
}

#[test]
fn the_html_plots_each_latency_paired() {
    let mut rows = Vec::new();
    for i in 0..5 {
        let p = row(&format!("r{i}"), i * 10, 100.0 + i as f64, 10.0, 10);
        rows.push(shadow_of(&p, "cand", 120.0, 11.0, 10));
        rows.push(p);
    }
    let rep = assess(&rows, &[], 95.0).unwrap();
    let html = rep.render_html(&rows, "shadow");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("cand − production per request"), "{html}");
    assert_eq!(html.matches("<svg").count(), 8, "TTFT, TPOT, ITL, E2EL × 2");
}
