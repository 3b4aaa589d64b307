//! TLS on both sides: client —TLS (h2 by ALPN)→ capture A —https with a private CA
//! (`upstream_ca`)→ capture B (TLS listener) —http→ sim. The test certificates under
//! `tests/data/` (CA and `localhost`/127.0.0.1 server cert, 100-year validity) are for tests only.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use proxy::{ProxyConfig, TlsFiles};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn tls_files() -> TlsFiles {
    TlsFiles {
        cert: data("server.pem"),
        key: data("server.key"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_and_private_ca_upstream_with_h2() {
    let sim = sim::start(
        "127.0.0.1:0".parse().unwrap(),
        sim::SimConfig {
            timing: sim::Timing::Fixed {
                ttft: Duration::from_millis(2),
                itl: Duration::from_millis(1),
            },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut b = ProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        sim.url(),
        dir.path().join("b"),
    );
    b.tls = Some(tls_files());
    let b = proxy::start(b.validate().expect("config"))
        .await
        .expect("proxy b");
    let mut a = ProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        format!("https://localhost:{}", b.addr().port()),
        dir.path().join("a"),
    );
    a.tls = Some(tls_files());
    a.upstream_ca = Some(data("ca.pem"));
    let a = proxy::start(a.validate().expect("config"))
        .await
        .expect("proxy a");

    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(data("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let conn = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(conn);
    let body = r#"{"model":"m","prompt":"a b c","max_tokens":5,"ignore_eos":true,"stream":true}"#;
    let req = hyper::Request::post(format!(
        "https://localhost:{}/v1/completions",
        a.addr().port()
    ))
    .body(Full::new(Bytes::from(body)))
    .unwrap();
    let resp = client.request(req).await.expect("request over TLS");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_2, "h2 by ALPN");
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&got);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("usage"), "injected usage leaked: {text}");

    let ra = a.shutdown(Duration::from_secs(2)).await.unwrap();
    let rb = b.shutdown(Duration::from_secs(2)).await.unwrap();
    sim.shutdown().await;
    for (r, name) in [(ra, "a"), (rb, "b")] {
        assert_eq!(r.records_written, 1, "{name}");
        let t = trace_format::read_traces(&[dir.path().join(name).to_str().unwrap()]).unwrap();
        assert_eq!(t.records[0].outcome, trace_format::Outcome::Ok, "{name}");
        assert_eq!(t.records[0].output_tokens, Some(5), "{name}");
    }
}
