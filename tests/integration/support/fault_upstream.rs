//! A loopback upstream for the fault and attack suite (`capture_faults.rs`) that counts
//! every request it receives and misbehaves on demand.
//!
//! It reads raw TCP: one reader thread per connection parses every request out of the byte
//! stream as soon as its bytes arrive (request line, header fields with any obs-fold lines,
//! a chunked or content-length body), so a second request smuggled inside the first one's
//! body is counted as a request of its own, and bytes that do not parse are logged as an
//! `<unparsable>` request rather than ignored. A writer thread per connection answers the
//! parsed requests in order with what the test's [`Act`] function says: a normal stream or
//! JSON answer, an error status with headers, a reset or close before or in the body, a stall
//! before the head or mid-body, or exact bytes.
//!
//! Everything is bounded: dropping the server stops the acceptor and every connection within
//! ~100 ms (a stall ends then too), and writes to a peer that does not read give up after 5 s.
//!
//! The raw client that drives it ([`super::http1::raw_exchange`]) is in `http1.rs`.

use std::io::{self, Read, Write};

use super::http1::{dechunk, find_head_end, Dechunk};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the upstream does with one request.
#[derive(Debug, Clone)]
pub enum Act {
    /// A streamed SSE answer (chunked): `events` content events `gap` apart, a usage event,
    /// `[DONE]`. Chat or completions by the path.
    Stream { events: usize, gap: Duration },
    /// A whole JSON answer with usage (content-length).
    Json,
    /// A JSON error body with this status and extra header lines (`"retry-after: 7"`).
    Status { code: u16, headers: Vec<String> },
    /// The head and `events` content events, then a TCP reset.
    ResetAfter { events: usize },
    /// Close (FIN) without writing a byte.
    CloseBeforeHead,
    /// Reset (RST) without writing a byte.
    ResetBeforeHead,
    /// Say nothing until the server is stopped or the peer closes.
    StallBeforeHead,
    /// The head and `events` content events, then nothing until stopped or the peer closes.
    StallAfter { events: usize },
    /// Write these bytes (a whole response, framing included) and keep the connection.
    Raw(Vec<u8>),
    /// Write these bytes, then close.
    RawThenClose(Vec<u8>),
}

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// Connection number, 0-based in accept order.
    pub conn: usize,
    /// Index of the request on its connection.
    pub index: usize,
    /// `<unparsable>` for bytes that are not a request.
    pub method: String,
    pub target: String,
    /// Header fields in order: name lowercased, value as sent (lossy UTF-8, obs-fold lines
    /// kept with their CRLF).
    pub headers: Vec<(String, String)>,
    /// The raw head (or the unparsable bytes).
    pub head: Vec<u8>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        super::http1::header(&self.headers, name)
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What the upstream's writer did with a request.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// Content events written (streams).
    pub events_written: usize,
    /// Every byte of the act was written.
    pub finished: bool,
    /// A write failed: the peer had gone (a client's disconnect passed on).
    pub write_failed: bool,
    /// The writer saw the peer close while stalling or streaming.
    pub peer_closed: bool,
}

#[derive(Default)]
struct Log {
    received: Mutex<Vec<Received>>,
    /// By (conn, index).
    answers: Mutex<Vec<((usize, usize), Answer)>>,
    accepted: AtomicUsize,
}

type ActFn = dyn Fn(&Received) -> Act + Send + Sync;

pub struct FaultUpstream {
    pub addr: SocketAddr,
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl FaultUpstream {
    /// Serves every request with `act(request)`.
    pub fn start(act: impl Fn(&Received) -> Act + Send + Sync + 'static) -> FaultUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let log = Arc::new(Log::default());
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let act: Arc<ActFn> = Arc::new(act);
        let (l2, s2, t2) = (log.clone(), stop.clone(), threads.clone());
        let acceptor = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((sock, _)) => {
                        let n = l2.accepted.fetch_add(1, Ordering::Relaxed);
                        let hs = serve_conn(sock, n, l2.clone(), s2.clone(), act.clone());
                        t2.lock().unwrap().extend(hs);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        FaultUpstream {
            addr,
            log,
            stop,
            acceptor: Some(acceptor),
            threads,
        }
    }

    /// Every request the same way.
    pub fn always(act: Act) -> FaultUpstream {
        Self::start(move |_| act.clone())
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received (and unparsable bytes), in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.log.received.lock().unwrap().clone()
    }

    /// Requests received whose head or body contains `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| contains(&r.head, needle) || contains(&r.body, needle))
            .count()
    }

    /// Connections accepted.
    pub fn connections(&self) -> usize {
        self.log.accepted.load(Ordering::Relaxed)
    }

    /// What the writer did with request `index` of connection `conn`.
    pub fn answer(&self, conn: usize, index: usize) -> Option<Answer> {
        self.log
            .answers
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| *k == (conn, index))
            .map(|(_, a)| a.clone())
    }

    /// Waits (bounded) until `f` holds for the answer to the first request containing
    /// `needle`; returns that answer.
    pub fn wait_answer(
        &self,
        needle: &str,
        within: Duration,
        f: impl Fn(&Answer) -> bool,
    ) -> Option<Answer> {
        let deadline = Instant::now() + within;
        loop {
            let r = self
                .received()
                .into_iter()
                .find(|r| contains(&r.head, needle) || contains(&r.body, needle));
            if let Some(r) = r {
                if let Some(a) = self.answer(r.conn, r.index) {
                    if f(&a) {
                        return Some(a);
                    }
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let hs: Vec<_> = self.threads.lock().unwrap().drain(..).collect();
        for h in hs {
            let _ = h.join();
        }
    }
}

impl Drop for FaultUpstream {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn contains(hay: &[u8], needle: &str) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A request parsed off the stream, or why not.
enum Parsed {
    /// A request and how many bytes it took.
    Request(Box<Received>, usize),
    /// More bytes needed.
    Partial,
    /// Not a request: the bytes are logged as unparsable and the connection is read no more.
    Bad,
}

fn parse_request(buf: &[u8], conn: usize, index: usize) -> Parsed {
    // Stray CRLFs between requests are allowed (RFC 9112 §2.2).
    let lead = buf
        .iter()
        .take_while(|b| **b == b'\r' || **b == b'\n')
        .count();
    let buf2 = &buf[lead..];
    if buf2.is_empty() {
        return Parsed::Partial;
    }
    let Some((end, sep)) = find_head_end(buf2) else {
        return if buf2.len() > 4 << 20 {
            Parsed::Bad
        } else {
            Parsed::Partial
        };
    };
    let head = &buf2[..end];
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    if method.is_empty() || target.is_empty() || !version.starts_with("HTTP/") {
        return Parsed::Bad;
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    for l in lines {
        if l.starts_with(' ') || l.starts_with('\t') {
            // obs-fold: part of the previous field's value.
            if let Some(last) = headers.last_mut() {
                last.1.push_str("\r\n");
                last.1.push_str(l);
                continue;
            }
            return Parsed::Bad;
        }
        let Some((k, v)) = l.split_once(':') else {
            return Parsed::Bad;
        };
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let body_start = lead + end + sep;
    let rest = &buf[body_start..];
    let chunked = headers
        .iter()
        .rfind(|(k, _)| k == "transfer-encoding")
        .is_some_and(|(_, v)| v.to_ascii_lowercase().trim_end().ends_with("chunked"));
    let (body, used) = if chunked {
        match dechunk(rest) {
            Dechunk::Done(b, n) => (b, n),
            Dechunk::Partial => return Parsed::Partial,
            Dechunk::Bad => return Parsed::Bad,
        }
    } else if let Some((_, v)) = headers.iter().find(|(k, _)| k == "content-length") {
        let Ok(n) = v.trim().parse::<usize>() else {
            return Parsed::Bad;
        };
        if rest.len() < n {
            return Parsed::Partial;
        }
        (rest[..n].to_vec(), n)
    } else {
        (Vec::new(), 0)
    };
    Parsed::Request(
        Box::new(Received {
            conn,
            index,
            method,
            target,
            headers,
            head: head.to_vec(),
            body,
        }),
        body_start + used,
    )
}

/// Starts the reader and writer threads of one connection.
fn serve_conn(
    sock: TcpStream,
    conn: usize,
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
    act: Arc<ActFn>,
) -> Vec<JoinHandle<()>> {
    let _ = sock.set_nonblocking(false);
    let _ = sock.set_nodelay(true);
    let _ = sock.set_write_timeout(Some(Duration::from_secs(5)));
    let Ok(w) = sock.try_clone() else {
        return Vec::new();
    };
    let (tx, rx) = mpsc::channel::<Received>();
    let peer_gone = Arc::new(AtomicBool::new(false));
    let (l2, s2, g2) = (log.clone(), stop.clone(), peer_gone.clone());
    let reader = std::thread::spawn(move || {
        read_loop(sock, conn, &l2, &s2, tx);
        g2.store(true, Ordering::Relaxed);
    });
    let writer = std::thread::spawn(move || write_loop(w, &log, &stop, &peer_gone, rx, &*act));
    vec![reader, writer]
}

fn read_loop(
    mut sock: TcpStream,
    conn: usize,
    log: &Log,
    stop: &AtomicBool,
    tx: mpsc::Sender<Received>,
) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf: Vec<u8> = Vec::new();
    let mut index = 0;
    let mut bad = false;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match sock.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        while !bad {
            match parse_request(&buf, conn, index) {
                Parsed::Partial => break,
                Parsed::Request(r, used) => {
                    buf.drain(..used);
                    index += 1;
                    log.received.lock().unwrap().push((*r).clone());
                    let _ = tx.send(*r);
                }
                Parsed::Bad => bad = true,
            }
        }
        if bad && !buf.is_empty() {
            log_unparsable(log, conn, index, std::mem::take(&mut buf));
            index += 1;
        }
    }
    // What is left at EOF and is not a whole request is counted too.
    if buf.iter().any(|b| !b.is_ascii_whitespace()) {
        log_unparsable(log, conn, index, buf);
    }
}

fn log_unparsable(log: &Log, conn: usize, index: usize, bytes: Vec<u8>) {
    log.received.lock().unwrap().push(Received {
        conn,
        index,
        method: "<unparsable>".into(),
        target: String::new(),
        headers: Vec::new(),
        head: bytes,
        body: Vec::new(),
    });
}

fn record_answer(log: &Log, key: (usize, usize), a: &Answer) {
    let mut v = log.answers.lock().unwrap();
    match v.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = a.clone(),
        None => v.push((key, a.clone())),
    }
}

/// Sleeps in 10 ms steps until `d` passed, the server stops or the peer has gone; true if
/// the peer went.
fn hold(d: Duration, stop: &AtomicBool, peer_gone: &AtomicBool) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        if peer_gone.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10).min(until - Instant::now()));
    }
    peer_gone.load(Ordering::Relaxed)
}

fn reset(w: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized linger struct.
    unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            w.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = w.shutdown(Shutdown::Both);
}

const STREAM_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";

fn content_event(chat: bool) -> String {
    if chat {
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" x\"}}]}\n\n".into()
    } else {
        "data: {\"choices\":[{\"index\":0,\"text\":\" x\"}]}\n\n".into()
    }
}

/// One HTTP chunk holding `ev`.
pub fn chunk(ev: &[u8]) -> Vec<u8> {
    let mut v = format!("{:x}\r\n", ev.len()).into_bytes();
    v.extend_from_slice(ev);
    v.extend_from_slice(b"\r\n");
    v
}

/// The end of a chunked SSE body of `events` content events: the usage event, `[DONE]`
/// and the terminal chunk.
fn sse_tail(events: usize) -> Vec<u8> {
    let mut v = chunk(
        format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":4,\"completion_tokens\":{events}}}}}\n\n")
            .as_bytes(),
    );
    v.extend(chunk(b"data: [DONE]\n\n"));
    v.extend_from_slice(b"0\r\n\r\n");
    v
}

fn write_loop(
    mut w: TcpStream,
    log: &Log,
    stop: &AtomicBool,
    peer_gone: &AtomicBool,
    rx: mpsc::Receiver<Received>,
    act: &ActFn,
) {
    loop {
        let req = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let key = (req.conn, req.index);
        let mut a = Answer::default();
        record_answer(log, key, &a);
        if req.method == "<unparsable>" {
            continue;
        }
        let chat = req.target.contains("chat");
        let keep = match act(&req) {
            Act::Stream { events, gap } => {
                if w.write_all(STREAM_HEAD).is_err() {
                    a.write_failed = true;
                } else {
                    for i in 0..events {
                        if i > 0 && hold(gap, stop, peer_gone) {
                            a.peer_closed = true;
                        }
                        if w.write_all(&chunk(content_event(chat).as_bytes())).is_err() {
                            a.write_failed = true;
                            break;
                        }
                        a.events_written += 1;
                        record_answer(log, key, &a);
                    }
                    if !a.write_failed {
                        if w.write_all(&sse_tail(events)).is_err() {
                            a.write_failed = true;
                        } else {
                            a.finished = true;
                        }
                    }
                }
                !a.write_failed
            }
            Act::Json => {
                let body = if chat {
                    r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"x x x"},"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":3}}"#
                } else {
                    r#"{"choices":[{"index":0,"text":"x x x","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":3}}"#
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                a.finished = w.write_all(resp.as_bytes()).is_ok();
                a.write_failed = !a.finished;
                a.finished
            }
            Act::Status { code, headers } => {
                let body = format!(
                    r#"{{"error":{{"message":"upstream says {code}","type":"fault","code":{code}}}}}"#
                );
                let mut resp = format!(
                    "HTTP/1.1 {code} Fault\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                    body.len()
                );
                for h in &headers {
                    resp.push_str(h);
                    resp.push_str("\r\n");
                }
                resp.push_str("\r\n");
                resp.push_str(&body);
                a.finished = w.write_all(resp.as_bytes()).is_ok();
                a.write_failed = !a.finished;
                a.finished
            }
            Act::ResetAfter { events } => {
                let mut bytes = STREAM_HEAD.to_vec();
                for _ in 0..events {
                    bytes.extend(chunk(content_event(chat).as_bytes()));
                }
                if w.write_all(&bytes).is_ok() {
                    a.events_written = events;
                }
                // Let the bytes leave before the reset discards anything unsent.
                std::thread::sleep(Duration::from_millis(50));
                reset(&w);
                a.finished = true;
                false
            }
            Act::CloseBeforeHead => {
                let _ = w.shutdown(Shutdown::Both);
                a.finished = true;
                false
            }
            Act::ResetBeforeHead => {
                reset(&w);
                a.finished = true;
                false
            }
            Act::StallBeforeHead => {
                a.peer_closed = hold(Duration::from_secs(3600), stop, peer_gone);
                false
            }
            Act::StallAfter { events } => {
                let mut bytes = STREAM_HEAD.to_vec();
                for _ in 0..events {
                    bytes.extend(chunk(content_event(chat).as_bytes()));
                }
                if w.write_all(&bytes).is_ok() {
                    a.events_written = events;
                }
                record_answer(log, key, &a);
                a.peer_closed = hold(Duration::from_secs(3600), stop, peer_gone);
                false
            }
            Act::Raw(bytes) => {
                a.finished = w.write_all(&bytes).is_ok();
                a.write_failed = !a.finished;
                a.finished
            }
            Act::RawThenClose(bytes) => {
                a.finished = w.write_all(&bytes).is_ok();
                a.write_failed = !a.finished;
                let _ = w.shutdown(Shutdown::Write);
                false
            }
        };
        record_answer(log, key, &a);
        if !keep {
            let _ = w.shutdown(Shutdown::Write);
            // Keep reading (the reader thread does) until the peer closes or we stop, so
            // anything sent after is still counted.
            while !stop.load(Ordering::Relaxed) && !peer_gone.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
            return;
        }
    }
}
