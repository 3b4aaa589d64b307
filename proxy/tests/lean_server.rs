//! The lean HTTP/1.1 server path (`proxy/src/serving/lean.rs`) against a real client socket: one
//! connection carrying pipelined generation requests, a pass-through request that hands the
//! connection to hyper with the bytes already read, and a generation request hyper then
//! serves. Every response comes back whole and in order, and every generation has its row.

use std::io::{Read, Write};
use std::time::Duration;

fn gen(marker: &str, stream: bool, close: bool) -> String {
    let body = format!(
        r#"{{"model":"{marker}","prompt":"a b c","max_tokens":4,"ignore_eos":true,"stream":{stream}}}"#
    );
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: capture\r\ncontent-type: application/json\r\n{}content-length: {}\r\n\r\n{body}",
        if close { "connection: close\r\n" } else { "" },
        body.len()
    )
}

/// One response off `raw` (head, then a chunked or sized body): (head, body), or None.
fn next_response(raw: &mut &[u8]) -> Option<(String, Vec<u8>)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8(raw[..end].to_vec()).unwrap();
    *raw = &raw[end..];
    let lower = head.to_ascii_lowercase();
    let mut body = Vec::new();
    if lower.contains("transfer-encoding: chunked") {
        loop {
            let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
            let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap(), 16)
                .expect("chunk size");
            *raw = &raw[line_end + 2..];
            if size == 0 {
                assert_eq!(&raw[..2], b"\r\n", "no trailers");
                *raw = &raw[2..];
                break;
            }
            body.extend_from_slice(&raw[..size]);
            assert_eq!(&raw[size..size + 2], b"\r\n");
            *raw = &raw[size + 2..];
        }
    } else {
        let n: usize = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("a length")
            .trim()
            .parse()
            .unwrap();
        body.extend_from_slice(&raw[..n]);
        *raw = &raw[n..];
    }
    Some((head, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_and_a_handoff_to_hyper_on_one_connection() {
    let sim = sim::start(
        "127.0.0.1:0".parse().unwrap(),
        sim::SimConfig {
            timing: sim::Timing::Fixed {
                ttft: Duration::from_millis(5),
                itl: Duration::from_millis(1),
            },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = proxy::ProxyConfig::new("127.0.0.1:0".parse().unwrap(), sim.url(), dir.path());
    let p = proxy::start(cfg.validate().expect("config"))
        .await
        .expect("proxy");
    let addr = p.addr();
    let raw = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // All in one write: the first request is served while the rest wait in the lean
        // path's buffer; the GET hands them to hyper.
        let all = [
            gen("one", true, false),
            gen("two", false, false),
            "GET /v1/models HTTP/1.1\r\nhost: capture\r\n\r\n".to_string(),
            gen("three", true, true),
        ]
        .concat();
        s.write_all(all.as_bytes()).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got)
            .expect("the proxy closes after connection: close");
        got
    })
    .await
    .unwrap();
    let mut rest = &raw[..];
    let mut responses = Vec::new();
    while let Some(r) = next_response(&mut rest) {
        responses.push(r);
    }
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(rest));
    assert_eq!(responses.len(), 4, "{:?}", String::from_utf8_lossy(&raw));
    for (head, _) in &responses {
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains("\r\ndate: "), "{head}");
    }
    let text = |i: usize| String::from_utf8_lossy(&responses[i].1).into_owned();
    assert!(
        responses[0].0.contains("transfer-encoding: chunked"),
        "{}",
        responses[0].0
    );
    assert_eq!(text(0).matches("data: ").count(), 5, "{}", text(0));
    assert!(text(0).ends_with("data: [DONE]\n\n"), "{}", text(0));
    assert!(
        !text(0).contains("usage"),
        "injected usage leaked: {}",
        text(0)
    );
    assert!(text(1).contains(r#""usage""#), "{}", text(1));
    assert!(text(2).contains(r#""object":"list""#), "{}", text(2));
    assert!(text(3).ends_with("data: [DONE]\n\n"), "{}", text(3));
    assert!(
        responses[3]
            .0
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{}",
        responses[3].0
    );

    let report = p.shutdown(Duration::from_secs(2)).await.unwrap();
    sim.shutdown().await;
    assert_eq!(report.records_written, 3);
    let t = trace_format::read_traces(&[dir.path().to_str().unwrap()]).unwrap();
    let mut rows: Vec<_> = t
        .records
        .iter()
        .map(|r| {
            (
                r.model.clone().unwrap_or_default(),
                r.outcome,
                r.stream,
                r.output_tokens,
            )
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    use trace_format::Outcome::Ok;
    assert_eq!(
        rows,
        vec![
            ("one".into(), Ok, true, Some(4)),
            ("three".into(), Ok, true, Some(4)),
            ("two".into(), Ok, false, Some(4)),
        ]
    );
}

/// A client that goes away while its request waits for the upstream's response head ends
/// it there, as hyper's server does: the upstream sees its connection closed (the
/// generation stops), and the row says the client disconnected before the headers. The
/// lean path first waited for the head, however long the upstream took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_the_response_head_cancels_the_request() {
    use tokio::io::AsyncReadExt;
    let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up_addr = up.local_addr().unwrap();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = up.accept().await.unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        // Read the request, never answer, and report when the proxy closes.
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
        let _ = closed_tx.send(got);
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = proxy::ProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        format!("http://{up_addr}"),
        dir.path(),
    );
    let p = proxy::start(cfg.validate().expect("config"))
        .await
        .expect("proxy");
    let addr = p.addr();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(gen("gone", true, false).as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        drop(s);
    })
    .await
    .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), closed_rx)
        .await
        .expect("the upstream connection was closed after the client left")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&got).contains(r#""model":"gone""#),
        "the request reached the upstream once"
    );
    let report = p.shutdown(Duration::from_secs(2)).await.unwrap();
    assert_eq!(report.records_written, 1);
    let t = trace_format::read_traces(&[dir.path().to_str().unwrap()]).unwrap();
    let r = &t.records[0];
    assert_eq!(r.outcome, trace_format::Outcome::ClientCancelled, "{r:?}");
    assert_eq!(
        r.error.as_deref(),
        Some("client disconnected before the response headers")
    );
}
