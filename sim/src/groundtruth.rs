//! A ground-truth server: every streamed response follows a fixed script (first chunk at
//! `t0 + ttft`, chunk `i` at `t0 + ttft + i·itl`), and the server logs when it actually
//! wrote each chunk, so a client's measurement error can be told apart from server lateness.
//!
//! Built for precision rather than features: blocking sockets, one reader thread per
//! connection to parse requests, and ONE writer thread that owns every deadline (a binary
//! heap), sleeps with 1 ns timer slack and writes each chunk when due. tokio's 1 ms timer
//! would make the server itself the largest error. HTTP/1.1 with keep-alive and chunked
//! transfer encoding; `/v1/models`, `/v1/completions`, `/v1/chat/completions` (streamed and
//! not, `stream_options.include_usage`), token counts as the sim counts them (one token per
//! prompt word; output = `max_tokens`, as with `ignore_eos`).
//!
//! The one scripted server of the workspace: `llmreplay sim --ground-truth` serves it for
//! `bench/`, and the end-to-end tests (`tests/`, `replay/tests/`) start it in-process.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The script every response follows.
#[derive(Debug, Clone, Copy)]
pub struct GroundTruthConfig {
    /// Time from the request being read to the first chunk.
    pub ttft: Duration,
    /// Time between chunks.
    pub itl: Duration,
    /// Tokens per chunk.
    pub tokens_per_chunk: u32,
    /// Output tokens when the request gives no `max_tokens`.
    pub default_max_tokens: u32,
}

impl Default for GroundTruthConfig {
    fn default() -> Self {
        GroundTruthConfig {
            ttft: Duration::from_millis(50),
            itl: Duration::from_millis(10),
            tokens_per_chunk: 1,
            default_max_tokens: 100,
        }
    }
}

/// What the server did for one request.
#[derive(Debug, Clone, Serialize)]
pub struct RequestLog {
    /// The `x-request-id` header, when sent.
    pub request_id: Option<String>,
    /// When the request had been read completely, µs since the Unix epoch.
    pub received_unix_us: i64,
    /// The same instant on the monotonic clock, for durations between requests (not in the
    /// chunk log).
    #[serde(skip)]
    pub received: Instant,
    /// When each chunk was written, µs after `received`.
    pub chunk_written_us: Vec<i64>,
    /// Nominal times of the chunks, µs after `received`.
    pub chunk_nominal_us: Vec<i64>,
    /// Output tokens sent.
    pub output_tokens: u32,
    /// Whether the response was streamed.
    pub stream: bool,
    /// False when the client went away before the end.
    pub complete: bool,
}

/// A running ground-truth server.
pub struct GroundTruth {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<RequestLog>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

struct Job {
    stream: Arc<TcpStream>,
    received: Instant,
    received_unix_us: i64,
    frames: Vec<Vec<u8>>,
    nominal: Vec<Duration>,
    written: Vec<i64>,
    next: usize,
    request_id: Option<String>,
    output_tokens: u32,
    is_stream: bool,
}

impl GroundTruth {
    /// Binds `addr` and serves until dropped.
    pub fn start(addr: SocketAddr, cfg: GroundTruthConfig) -> std::io::Result<GroundTruth> {
        if cfg.tokens_per_chunk == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "tokens_per_chunk must be >= 1",
            ));
        }
        let listener = TcpListener::bind(addr)?;
        // std listens with a backlog of 128: a burst of 1,000 connections overflows it, and
        // the connections whose handshake was dropped are retransmitted 200 ms+ later,
        // which a client would see as TTFT. Listening again raises the backlog (Linux
        // caps it at net.core.somaxconn).
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: listen(2) on a socket we own, already bound and listening.
            unsafe {
                libc::listen(listener.as_raw_fd(), 4096);
            }
        }
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
        {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::Builder::new()
                .name("gt-writer".into())
                .spawn(move || writer(jobs_rx, log, stop))?;
        }
        let stop2 = stop.clone();
        let acceptor = std::thread::Builder::new()
            .name("gt-accept".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((sock, _)) => {
                            let tx = jobs_tx.clone();
                            let _ = sock.set_nonblocking(false);
                            let _ = sock.set_nodelay(true);
                            unpaced(&sock);
                            let _ = std::thread::Builder::new()
                                .name("gt-conn".into())
                                .stack_size(128 * 1024)
                                .spawn(move || reader(sock, cfg, tx));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            })?;
        Ok(GroundTruth {
            addr,
            log,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything logged so far (completed and abandoned responses).
    pub fn log(&self) -> Vec<RequestLog> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for GroundTruth {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn respond(stream: &TcpStream, status: &str, body: &str) -> bool {
    let resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    (&*stream).write_all(resp.as_bytes()).is_ok()
}

/// Turns off send pacing on `sock`: with BBR (this machine's default congestion control,
/// also on loopback) the kernel paces segments out after write(2) returns, so "written"
/// would not be "sent" and the pacing delay would count as client error. The server asks
/// for CUBIC (no pacing without an fq qdisc), else Reno; if neither is allowed, it keeps
/// the default.
fn unpaced(sock: &TcpStream) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        for cc in [&b"cubic"[..], b"reno"] {
            // SAFETY: setsockopt with a byte string and its length on a socket we own.
            let rc = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_CONGESTION,
                    cc.as_ptr().cast(),
                    cc.len() as libc::socklen_t,
                )
            };
            if rc == 0 {
                return;
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = sock;
}

/// A socket read with `recvmsg`, keeping the kernel's receive timestamp of the last read
/// (`SO_TIMESTAMPNS`, CLOCK_REALTIME, µs). Elsewhere than Linux: a plain read, no stamp.
struct KernelStamped {
    sock: TcpStream,
    stamp_us: Option<i64>,
}

impl KernelStamped {
    fn new(sock: TcpStream) -> KernelStamped {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            wire::rxstamp::enable(sock.as_raw_fd());
        }
        KernelStamped {
            sock,
            stamp_us: None,
        }
    }

    /// The receive time of the last bytes read, once.
    fn take_stamp_us(&mut self) -> Option<i64> {
        self.stamp_us.take()
    }
}

impl Read for KernelStamped {
    #[cfg(target_os = "linux")]
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        // SAFETY: an initialized byte slice viewed as possibly-uninitialized bytes of the
        // same length; recv only writes bytes into it.
        let buf = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
        let (n, stamp_ns) = wire::rxstamp::recv(self.sock.as_raw_fd(), buf, 0)?;
        if n > 0 && stamp_ns != 0 {
            self.stamp_us = Some(stamp_ns / 1_000);
        }
        Ok(n)
    }

    #[cfg(not(target_os = "linux"))]
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&self.sock).read(buf)
    }
}

fn reader(sock: TcpStream, cfg: GroundTruthConfig, jobs: Sender<Job>) {
    let stream = Arc::new(sock);
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut r = BufReader::new(KernelStamped::new(read_half));
    let mut line = String::new();
    loop {
        let mut request_line = String::new();
        let mut content_length = 0usize;
        let mut request_id = None;
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if request_line.is_empty() {
                if line.trim().is_empty() {
                    continue;
                }
                request_line = line.trim_end().to_string();
                continue;
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    content_length = v.trim().parse().unwrap_or(0);
                } else if k.eq_ignore_ascii_case("x-request-id") {
                    request_id = Some(v.trim().to_string());
                }
            }
        }
        let mut body = vec![0u8; content_length.min(64 << 20)];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        // The request's arrival is the kernel's receive time of its last bytes
        // (SO_TIMESTAMPNS), not when this thread got to read them: with hundreds of
        // connections arriving at once, reader-thread scheduling would otherwise count as
        // client error. The script's deadlines start from that arrival too.
        let (now, now_unix_ns) = wire::rxstamp::clock_pair();
        let now_unix_us = now_unix_ns / 1_000;
        let (received, received_unix_us) = match r.get_mut().take_stamp_us() {
            Some(k) if k <= now_unix_us && now_unix_us - k < 1_000_000 => (
                now.checked_sub(Duration::from_micros((now_unix_us - k) as u64))
                    .unwrap_or(now),
                k,
            ),
            _ => (now, now_unix_us),
        };
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        match (method, path) {
            ("GET", "/v1/models") => {
                if !respond(
                    &stream,
                    "200 OK",
                    r#"{"object":"list","data":[{"id":"ground-truth","object":"model","owned_by":"llmreplay"}]}"#,
                ) {
                    return;
                }
                continue;
            }
            ("GET", "/health") => {
                if !respond(&stream, "200 OK", "{}") {
                    return;
                }
                continue;
            }
            ("POST", "/v1/completions") | ("POST", "/v1/chat/completions") => {}
            _ => {
                if !respond(
                    &stream,
                    "404 Not Found",
                    r#"{"error":{"message":"not found","type":"invalid_request_error"}}"#,
                ) {
                    return;
                }
                continue;
            }
        }
        let chat = path.ends_with("chat/completions");
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
            if !respond(
                &stream,
                "400 Bad Request",
                r#"{"error":{"message":"body is not JSON","type":"invalid_request_error"}}"#,
            ) {
                return;
            }
            continue;
        };
        let max_tokens = v
            .get("max_tokens")
            .or_else(|| v.get("max_completion_tokens"))
            .and_then(|m| m.as_u64())
            .map_or(cfg.default_max_tokens, |m| m.clamp(1, 1 << 20) as u32);
        let is_stream = v.get("stream").and_then(|s| s.as_bool()).unwrap_or(false);
        let usage_wanted = v
            .pointer("/stream_options/include_usage")
            .and_then(|s| s.as_bool())
            .unwrap_or(false);
        let prompt_tokens = prompt_words(&v, chat);
        if is_stream {
            let header = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
            if (&*stream).write_all(header).is_err() {
                return;
            }
        }
        let (frames, nominal) = frames(
            &cfg,
            chat,
            is_stream,
            usage_wanted,
            max_tokens,
            prompt_tokens,
        );
        let job = Job {
            stream: stream.clone(),
            received,
            received_unix_us,
            written: Vec::with_capacity(frames.len()),
            frames,
            nominal,
            next: 0,
            request_id,
            output_tokens: max_tokens,
            is_stream,
        };
        if jobs.send(job).is_err() {
            return;
        }
    }
}

/// The response's frames (the streamed chunks, or the whole non-streamed response) and each
/// one's nominal send time after the request's arrival.
fn frames(
    cfg: &GroundTruthConfig,
    chat: bool,
    is_stream: bool,
    usage_wanted: bool,
    max_tokens: u32,
    prompt_tokens: u64,
) -> (Vec<Vec<u8>>, Vec<Duration>) {
    let n_chunks = max_tokens.div_ceil(cfg.tokens_per_chunk) as usize;
    let mut frames = Vec::with_capacity(n_chunks + 2);
    let mut nominal = Vec::with_capacity(n_chunks + 2);
    if is_stream {
        let mut left = max_tokens;
        for i in 0..n_chunks {
            let k = left.min(cfg.tokens_per_chunk);
            left -= k;
            let text = " tok".repeat(k as usize);
            let finish = if left == 0 { "\"length\"" } else { "null" };
            let ev = if chat {
                format!("data: {{\"id\":\"gt\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":{finish}}}]}}\n\n")
            } else {
                format!("data: {{\"id\":\"gt\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"finish_reason\":{finish}}}]}}\n\n")
            };
            frames.push(format!("{:x}\r\n{ev}\r\n", ev.len()).into_bytes());
            nominal.push(cfg.ttft + cfg.itl * i as u32);
        }
        let mut tail = String::new();
        if usage_wanted {
            tail.push_str(&format!(
                "data: {{\"id\":\"gt\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{max_tokens},\"total_tokens\":{}}}}}\n\n",
                prompt_tokens + u64::from(max_tokens)
            ));
        }
        tail.push_str("data: [DONE]\n\n");
        // The tail goes out with the last chunk, as engines send them together.
        if let Some(last) = frames.last_mut() {
            last.extend_from_slice(format!("{:x}\r\n{tail}\r\n0\r\n\r\n", tail.len()).as_bytes());
        }
    } else {
        let text = " tok".repeat(max_tokens as usize);
        let body = if chat {
            format!("{{\"id\":\"gt\",\"object\":\"chat.completion\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{text}\"}},\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{max_tokens},\"total_tokens\":{}}}}}", prompt_tokens + u64::from(max_tokens))
        } else {
            format!("{{\"id\":\"gt\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{max_tokens},\"total_tokens\":{}}}}}", prompt_tokens + u64::from(max_tokens))
        };
        frames.push(format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes());
        nominal.push(cfg.ttft + cfg.itl * (n_chunks.saturating_sub(1)) as u32);
    }
    (frames, nominal)
}

fn prompt_words(v: &serde_json::Value, chat: bool) -> u64 {
    let words = |s: &str| s.split_whitespace().count() as u64;
    if chat {
        v.get("messages")
            .and_then(|m| m.as_array())
            .map_or(0, |ms| {
                ms.iter()
                    .filter_map(|m| m.get("content")?.as_str())
                    .map(words)
                    .sum()
            })
    } else {
        match v.get("prompt") {
            Some(serde_json::Value::String(s)) => words(s),
            Some(serde_json::Value::Array(a)) => {
                a.iter().map(|x| x.as_str().map_or(1, words)).sum()
            }
            _ => 0,
        }
    }
}

fn writer(jobs: Receiver<Job>, log: Arc<Mutex<Vec<RequestLog>>>, stop: Arc<AtomicBool>) {
    wire::clock::fine_timer_slack();
    let mut slab: Vec<Option<Job>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut heap: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    let finish = |job: Job, complete: bool, log: &Mutex<Vec<RequestLog>>| {
        let entry = RequestLog {
            request_id: job.request_id,
            received_unix_us: job.received_unix_us,
            received: job.received,
            chunk_written_us: job.written,
            chunk_nominal_us: job.nominal.iter().map(|d| d.as_micros() as i64).collect(),
            output_tokens: job.output_tokens,
            stream: job.is_stream,
            complete,
        };
        log.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
    };
    loop {
        if stop.load(Ordering::Relaxed) && heap.is_empty() {
            return;
        }
        // Take new jobs: block when idle, otherwise wait until the next deadline at most.
        let next_due = heap.peek().map(|Reverse((t, _))| *t);
        let got = match next_due {
            None => jobs.recv_timeout(Duration::from_millis(100)),
            Some(t) => {
                let now = Instant::now();
                if t > now {
                    jobs.recv_timeout(t - now)
                } else {
                    jobs.try_recv().map_err(|_| RecvTimeoutError::Timeout)
                }
            }
        };
        match got {
            Ok(job) => {
                let due = job.received + job.nominal[0];
                let id = match free.pop() {
                    Some(i) => {
                        slab[i] = Some(job);
                        i
                    }
                    None => {
                        slab.push(Some(job));
                        slab.len() - 1
                    }
                };
                heap.push(Reverse((due, id)));
                continue;
            }
            Err(RecvTimeoutError::Disconnected) if heap.is_empty() => return,
            Err(_) => {}
        }
        let now = Instant::now();
        while let Some(&Reverse((due, id))) = heap.peek() {
            if due > now {
                break;
            }
            heap.pop();
            let Some(job) = slab[id].as_mut() else {
                continue;
            };
            let ok = (&*job.stream).write_all(&job.frames[job.next]).is_ok();
            job.written.push(job.received.elapsed().as_micros() as i64);
            job.next += 1;
            if !ok || job.next == job.frames.len() {
                if let Some(job) = slab[id].take() {
                    free.push(id);
                    finish(job, ok, &log);
                }
            } else {
                heap.push(Reverse((job.received + job.nominal[job.next], id)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post_stream(addr: SocketAddr, body: &str, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\nx-request-id: r-1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.ends_with(b"0\r\n\r\n") {
                        break;
                    }
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn streams_on_schedule_and_logs_write_times() {
        let cfg = GroundTruthConfig {
            ttft: Duration::from_millis(20),
            itl: Duration::from_millis(5),
            tokens_per_chunk: 2,
            default_max_tokens: 4,
        };
        let gt = GroundTruth::start("127.0.0.1:0".parse().unwrap(), cfg).unwrap();
        let resp = post_stream(
            gt.addr(),
            r#"{"prompt":"a b c","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
            "/v1/completions",
        );
        assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
        assert_eq!(
            resp.matches("\"text\":").count(),
            3,
            "5 tokens at 2 per chunk: {resp}"
        );
        assert!(
            resp.contains(r#""usage":{"prompt_tokens":3,"completion_tokens":5"#),
            "{resp}"
        );
        assert!(resp.contains("data: [DONE]"));
        std::thread::sleep(Duration::from_millis(20));
        let log = gt.log();
        assert_eq!(log.len(), 1);
        let l = &log[0];
        assert_eq!(l.request_id.as_deref(), Some("r-1"));
        assert!(l.complete);
        assert_eq!(l.chunk_nominal_us, vec![20_000, 25_000, 30_000]);
        for (w, n) in l.chunk_written_us.iter().zip(&l.chunk_nominal_us) {
            assert!(w >= n, "written {w} before nominal {n}");
            assert!(w - n < 20_000, "written {w} far after nominal {n}");
        }
    }
}
