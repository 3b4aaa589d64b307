//! `llmreplay capture` run as a child process, for the end-to-end tests.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// A `llmreplay capture` child process whose stderr lines arrive on a channel.
pub struct CaptureProc {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    log: Vec<String>,
    /// How long [`CaptureProc::wait_for`] waits for its line.
    pub wait: Duration,
    /// How long [`CaptureProc::terminate`] waits for the exit.
    pub exit_wait: Duration,
}

impl CaptureProc {
    pub fn spawn(listen: SocketAddr, upstream: &str, out: &Path, extra: &[&str]) -> CaptureProc {
        Self::spawn_bin(
            env!("CARGO_BIN_EXE_llmreplay"),
            listen,
            upstream,
            out,
            extra,
        )
    }

    /// [`CaptureProc::spawn`] with another `llmreplay` binary (to run a test against an
    /// older build).
    pub fn spawn_bin(
        bin: &str,
        listen: SocketAddr,
        upstream: &str,
        out: &Path,
        extra: &[&str],
    ) -> CaptureProc {
        Self::spawn_full(bin, listen, None, upstream, out, extra)
    }

    /// [`CaptureProc::spawn_bin`] with the admin listener (/metrics) on `admin`.
    pub fn spawn_admin(
        bin: &str,
        listen: SocketAddr,
        admin: SocketAddr,
        upstream: &str,
        out: &Path,
        extra: &[&str],
    ) -> CaptureProc {
        Self::spawn_full(bin, listen, Some(admin), upstream, out, extra)
    }

    fn spawn_full(
        bin: &str,
        listen: SocketAddr,
        admin: Option<SocketAddr>,
        upstream: &str,
        out: &Path,
        extra: &[&str],
    ) -> CaptureProc {
        use std::io::BufRead;
        let admin = match admin {
            Some(a) => vec!["--admin".to_string(), a.to_string()],
            None => vec!["--no-admin".to_string()],
        };
        let mut child = std::process::Command::new(bin)
            .arg("capture")
            .args(admin)
            .args(["--listen", &listen.to_string()])
            .args(["--upstream", upstream])
            .arg("--out")
            .arg(out)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn llmreplay capture");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stderr).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        CaptureProc {
            child,
            lines,
            log: Vec::new(),
            wait: Duration::from_secs(20),
            exit_wait: Duration::from_secs(20),
        }
    }

    /// Waits (bounded) for a stderr line containing `needle`; returns it.
    pub fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + self.wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.log.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(e) => panic!(
                    "no {needle:?} from llmreplay capture ({e}); stderr: {:#?}",
                    self.log
                ),
            }
        }
    }

    /// The stderr lines read so far (and any waiting now).
    pub fn log(&mut self) -> &[String] {
        while let Ok(l) = self.lines.try_recv() {
            self.log.push(l);
        }
        &self.log
    }

    /// SIGTERM, then the exit status (bounded wait).
    pub fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        // SAFETY: sending a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + self.exit_wait;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "llmreplay capture did not exit on SIGTERM; stderr: {:#?}",
                    self.log
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.log.push(l);
        }
        (status, std::mem::take(&mut self.log))
    }
}

impl Drop for CaptureProc {
    /// A test that fails part way leaves no capture process behind.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
