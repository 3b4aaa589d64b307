//! `llmreplay sim` as a child process on a free loopback port, and a client that cancels a
//! stream part-way: what the end-to-end tests of capture, replay, verdicts and fidelity share.
// Each test binary uses its own part of the support modules.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::env::free_addr;

/// `llmreplay sim` on a free port; killed on drop.
pub struct SimProc(Child, SocketAddr);

impl SimProc {
    /// `BIN sim --listen ADDR ARGS…`, once it accepts connections.
    pub fn start(bin: &str, args: &[&str]) -> SimProc {
        let addr = free_addr();
        let child = Command::new(bin)
            .args(["sim", "--listen", &addr.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn llmreplay sim");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "the sim did not start on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        SimProc(child, addr)
    }

    /// A sim with `--fixed-timing TTFT,ITL` (ms).
    pub fn fixed(
        bin: &str,
        ttft_ms: impl std::fmt::Display,
        itl_ms: impl std::fmt::Display,
    ) -> SimProc {
        SimProc::start(bin, &["--fixed-timing", &format!("{ttft_ms},{itl_ms}")])
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.1)
    }

    /// `vllm:generation_tokens_total` from the sim's /metrics: what it generated.
    pub fn generated_tokens(&self) -> f64 {
        let mut s = TcpStream::connect(self.1).expect("connect to the sim");
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n",
            self.1
        )
        .unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.lines()
            .find(|l| l.starts_with("vllm:generation_tokens_total"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }
}

impl Drop for SimProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends a streamed completion through `addr`, reads `chunks` content events and closes the
/// connection (a user who stops the generation).
pub fn cancel_after_chunks(addr: SocketAddr, id: &str, chunks: usize) -> std::io::Result<()> {
    let body = format!(
        r#"{{"model":"m","prompt":"{id} w w w w","max_tokens":200,"ignore_eos":true,"stream":true}}"#
    );
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nx-id: {id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let (mut seen, mut buf) = (Vec::new(), [0u8; 4096]);
    while String::from_utf8_lossy(&seen)
        .matches("\"text\":\"")
        .count()
        < chunks
    {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    Ok(())
}
