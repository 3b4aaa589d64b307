//! Replay over HTTPS (rustls): a TLS terminator on loopback, with a private CA given by
//! `--ca-cert`, in front of the sim. Without the CA the handshake must fail as an error.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use replay::config::Target;
use replay::ReplayConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use trace_format::TraceRecord;

fn data(name: &str) -> PathBuf {
    // Test-only certificates (CN=localhost, IP 127.0.0.1) shared with the proxy's tests.
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../proxy/tests/data")
        .join(name)
}

/// Accepts TLS on a loopback port and pipes each connection to `upstream`.
async fn tls_terminator(upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(data("server.pem"))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(data("server.key")).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    addr
}

fn trace(n: usize) -> Vec<TraceRecord> {
    crate::rows("tls", n, 2000, (8, 5), true)
}

#[test]
fn replays_over_https_with_a_private_ca() {
    let _turn = crate::turn(module_path!());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(sim::start(
            "127.0.0.1:0".parse().unwrap(),
            sim::SimConfig {
                timing: sim::Timing::Fixed {
                    ttft: Duration::from_millis(5),
                    itl: Duration::from_millis(1),
                },
                ..Default::default()
            },
        ))
        .unwrap();
    let tls_addr = rt.block_on(tls_terminator(sim.addr()));
    let url = format!("https://127.0.0.1:{}", tls_addr.port());

    let mut cfg = ReplayConfig::new(vec![Target {
        name: "tls".into(),
        url: url.clone(),
    }]);
    cfg.request.ca_cert = Some(data("ca.pem"));
    let runs = replay::replay(
        &cfg.validate().unwrap(),
        &trace(10),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .expect("replay over https");
    let (run, m) = &runs[0];
    assert_eq!(m.completed, 10, "{:?}", m.outcomes);
    assert!(run
        .records
        .iter()
        .all(|r| r.output_tokens == Some(5) && r.chunk_times_us.len() == 5));

    // The web PKI does not know the private CA: the target is unreachable, said plainly.
    let cfg = ReplayConfig::new(vec![Target {
        name: "tls".into(),
        url,
    }]);
    let err = replay::replay(
        &cfg.validate().unwrap(),
        &trace(2),
        None,
        &|_, _| {},
        &mut replay::sink::NoSink,
        &replay::Stop::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("unreachable") && err.contains("TLS"), "{err}");
    rt.block_on(sim.shutdown());
}
