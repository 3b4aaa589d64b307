//! A loopback HTTP/1.1 server that speaks just enough OpenAI and misbehaves the way real
//! servers do with keep-alive connections: it closes idle connections (uvicorn's
//! `timeout_keep_alive`), closes after N requests with or without `Connection: close`
//! (nginx's `keepalive_requests`), reads a request on a reused connection and then dies
//! without answering (a crashed or restarting worker), answers everything with
//! `Connection: close`, answers HTTP/1.0 with a body delimited by the close, or closes right
//! after every streamed response while advertising keep-alive (llama.cpp's server).
//!
//! Blocking std I/O, one thread per connection. Every request it has read completely is
//! logged (method, `x-request-id`, connection number, index on the connection, body, and
//! what the server did with it), and so are the connection's ends, so a test can tell a request
//! the server never saw from one it saw twice. Dropping the server stops it: the acceptor and
//! every connection thread notice within 100 ms (a thread blocked writing to a peer that does
//! not read gives up after 5 s).
//!
//! The keep-alive client that drives a proxy in front of it ([`super::http1::Http1Client`])
//! is in `http1.rs`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the server treats its connections. `Default` is a well-behaved keep-alive server.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Close a keep-alive connection idle this long after its last response (or after it was
    /// accepted), without sending anything. A request whose bytes are already waiting when
    /// the timer fires is served, so the only race left is the one no client can avoid (its
    /// request crossing the server's FIN on the wire, microseconds wide).
    pub idle_timeout: Option<Duration>,
    /// Close a connection after this many requests.
    pub max_requests_per_conn: Option<usize>,
    /// With `max_requests_per_conn`: the last response says `Connection: close` (nginx) or
    /// the server just closes after writing it.
    pub max_requests_close_header: bool,
    /// On a reused connection (its second request or later), read the request completely,
    /// log it, then close without writing a byte.
    pub read_then_close_without_answer: bool,
    /// Answer every request with `Connection: close` and close.
    pub connection_close_always: bool,
    /// Answer `HTTP/1.0 200 OK` with no content-length (the body ends at the close), streamed
    /// or not, and close.
    pub http10_no_length: bool,
    /// "Generation" time before the response head of a POST.
    pub think: Duration,
    /// Time between two streamed events.
    pub chunk_gap: Duration,
    /// "Generation" time before the response of a POST that is not streamed, instead of
    /// `think` (a whole answer takes as long as its whole generation).
    pub think_not_streamed: Option<Duration>,
    /// For a streamed chat request: write the head and the role-only chunk
    /// (`{"delta":{"role":"assistant","content":""}}`) at once, without `think`, then wait
    /// this long before the first content chunk (a server that announces the role before
    /// queueing and prefill).
    pub role_chunk_first_delay: Option<Duration>,
    /// Send no `usage` at all, streamed or not, whatever `stream_options` asks (servers that
    /// ignore it).
    pub no_usage: bool,
    /// Tokens per streamed chunk, cycled (`[2, 1]`: 30 tokens in 20 chunks); empty: one each.
    /// A chunk of k tokens carries `" x"` k times.
    pub tokens_per_chunk: Vec<usize>,
    /// Close the connection this long after every streamed response, without reading
    /// further, while every response advertises keep-alive (`keep-alive: timeout=5,
    /// max=100`, no `Connection: close`): llama.cpp's server, whose close follows the last
    /// chunk by microseconds.
    pub close_after_stream: Option<Duration>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            idle_timeout: None,
            max_requests_per_conn: None,
            max_requests_close_header: false,
            read_then_close_without_answer: false,
            connection_close_always: false,
            http10_no_length: false,
            think: Duration::from_millis(10),
            chunk_gap: Duration::from_millis(2),
            think_not_streamed: None,
            role_chunk_first_delay: None,
            no_usage: false,
            tokens_per_chunk: Vec::new(),
            close_after_stream: None,
        }
    }
}

impl Behaviour {
    pub fn idle_timeout(t: Duration) -> Behaviour {
        Behaviour {
            idle_timeout: Some(t),
            ..Default::default()
        }
    }

    pub fn max_requests(n: usize, close_header: bool) -> Behaviour {
        Behaviour {
            max_requests_per_conn: Some(n),
            max_requests_close_header: close_header,
            ..Default::default()
        }
    }

    pub fn read_then_close_without_answer() -> Behaviour {
        Behaviour {
            read_then_close_without_answer: true,
            ..Default::default()
        }
    }

    pub fn connection_close_always() -> Behaviour {
        Behaviour {
            connection_close_always: true,
            ..Default::default()
        }
    }

    pub fn http10_no_length() -> Behaviour {
        Behaviour {
            http10_no_length: true,
            ..Default::default()
        }
    }

    /// Closes `linger` after every streamed response while advertising keep-alive.
    pub fn close_after_every_stream(linger: Duration) -> Behaviour {
        Behaviour {
            close_after_stream: Some(linger),
            ..Default::default()
        }
    }

    /// Streamed chat: the role-only chunk at once, the first content chunk `delay` later.
    pub fn role_chunk_first(delay: Duration) -> Behaviour {
        Behaviour {
            role_chunk_first_delay: Some(delay),
            ..Default::default()
        }
    }
}

/// One request the server read completely.
#[derive(Debug, Clone)]
pub struct Served {
    /// Connection number, 0-based in accept order.
    pub conn: usize,
    /// Index of the request on its connection, 0-based.
    pub index: usize,
    pub method: String,
    /// The `x-request-id` header, if any.
    pub request_id: Option<String>,
    /// The `x-forwarded-for` and `x-forwarded-proto` headers, if any.
    pub forwarded_for: Option<String>,
    pub forwarded_proto: Option<String>,
    pub body: String,
    /// Read and then dropped: the connection was closed without a byte of response.
    pub dropped: bool,
    /// The whole response was written.
    pub answered: bool,
}

/// How a connection ended (or began).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnEnd {
    Accepted,
    /// Closed by the idle timeout, nothing sent.
    IdleClosed,
    /// The idle timer fired with a request already waiting; it was served instead.
    LateRequestServed,
    /// Closed after `max_requests_per_conn` requests.
    ClosedAfterMax,
    /// Closed after reading a request, without answering it.
    ClosedWithoutAnswer,
    /// Closed after a `Connection: close` or HTTP/1.0 response.
    ClosedAfterResponse,
    /// Closed after a streamed response that advertised keep-alive.
    ClosedAfterStream,
    /// The peer closed it (EOF while waiting for a request).
    PeerClosed,
    /// A read or write error, or a malformed request.
    Error,
    /// The server was stopped.
    Stopped,
}

#[derive(Debug, Clone)]
pub struct ConnEvent {
    pub what: ConnEnd,
}

#[derive(Default)]
struct Logs {
    served: Mutex<Vec<Served>>,
    events: Mutex<Vec<ConnEvent>>,
}

impl Logs {
    fn event(&self, what: ConnEnd) {
        self.events.lock().unwrap().push(ConnEvent { what });
    }
}

pub struct MisbehavingServer {
    pub addr: SocketAddr,
    logs: Arc<Logs>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl MisbehavingServer {
    pub fn start(behaviour: Behaviour) -> MisbehavingServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let logs = Arc::new(Logs::default());
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (l2, s2, c2, b2) = (logs.clone(), stop.clone(), conns.clone(), behaviour);
        let acceptor = std::thread::spawn(move || {
            let next = AtomicUsize::new(0);
            while !s2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((sock, _)) => {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        l2.event(ConnEnd::Accepted);
                        let (l3, s3, b3) = (l2.clone(), s2.clone(), b2.clone());
                        let h = std::thread::spawn(move || {
                            let what = serve_conn(sock, n, &b3, &l3, &s3);
                            l3.event(what);
                        });
                        c2.lock().unwrap().push(h);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        MisbehavingServer {
            addr,
            logs,
            stop,
            acceptor: Some(acceptor),
            conns,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request read completely, in the order they were read.
    pub fn requests(&self) -> Vec<Served> {
        self.logs.served.lock().unwrap().clone()
    }

    /// The generation requests (POSTs) read completely.
    pub fn posts(&self) -> Vec<Served> {
        self.requests()
            .into_iter()
            .filter(|s| s.method == "POST")
            .collect()
    }

    pub fn events(&self) -> Vec<ConnEvent> {
        self.logs.events.lock().unwrap().clone()
    }

    /// How many connections ended `what`.
    pub fn count(&self, what: ConnEnd) -> usize {
        self.events().iter().filter(|e| e.what == what).count()
    }

    /// Stops accepting and ends every connection (bounded), as dropping does.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let handles: Vec<_> = self.conns.lock().unwrap().drain(..).collect();
        for h in handles {
            let _ = h.join();
        }
    }
}

impl Drop for MisbehavingServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How waiting for the next request on a connection ended.
enum Wait {
    Data,
    Late,
    Eof,
    Idle,
    Stop,
    Error,
}

/// Whether bytes are waiting on `sock` right now (without consuming them).
fn pending(sock: &TcpStream) -> bool {
    if sock.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let got = matches!(sock.peek(&mut b), Ok(n) if n > 0);
    let _ = sock.set_nonblocking(false);
    got
}

/// Waits for the first byte of the next request, for at most the idle timeout after `since`,
/// looking at the stop flag every 100 ms.
fn wait_for_request(
    r: &mut BufReader<TcpStream>,
    idle: Option<Duration>,
    since: Instant,
    stop: &AtomicBool,
) -> Wait {
    if !r.buffer().is_empty() {
        return Wait::Data; // pipelined
    }
    loop {
        if stop.load(Ordering::Relaxed) {
            return Wait::Stop;
        }
        let mut wait = Duration::from_millis(100);
        if let Some(t) = idle {
            let now = Instant::now();
            let deadline = since + t;
            if now >= deadline {
                // The timer fired. A request already waiting was sent before the close:
                // serve it (the read won the race); otherwise close without a word.
                return if pending(r.get_ref()) {
                    Wait::Late
                } else {
                    Wait::Idle
                };
            }
            wait = wait.min(deadline - now);
        }
        let _ = r
            .get_ref()
            .set_read_timeout(Some(wait.max(Duration::from_micros(100))));
        match r.fill_buf() {
            Ok([]) => return Wait::Eof,
            Ok(_) => return Wait::Data,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Wait::Error,
        }
    }
}

/// A request as read off the wire.
struct Request {
    method: String,
    path: String,
    request_id: Option<String>,
    forwarded_for: Option<String>,
    forwarded_proto: Option<String>,
    body: Vec<u8>,
}

fn read_request(r: &mut BufReader<TcpStream>) -> io::Result<Request> {
    let _ = r.get_ref().set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let mut request_line = String::new();
    let mut content_length = 0usize;
    let mut request_id = None;
    let (mut forwarded_for, mut forwarded_proto) = (None, None);
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if request_line.is_empty() {
            if line.trim().is_empty() {
                continue; // stray CRLF between requests
            }
            request_line = line.trim_end().to_string();
            continue;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                content_length = v
                    .parse()
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "content-length"))?;
            } else if k.eq_ignore_ascii_case("x-request-id") {
                request_id = Some(v.to_string());
            } else if k.eq_ignore_ascii_case("x-forwarded-for") {
                forwarded_for = Some(v.to_string());
            } else if k.eq_ignore_ascii_case("x-forwarded-proto") {
                forwarded_proto = Some(v.to_string());
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "chunked requests are not supported here",
                ));
            }
        }
    }
    let mut body = vec![0u8; content_length];
    r.read_exact(&mut body)?;
    let mut parts = request_line.split_whitespace();
    Ok(Request {
        method: parts.next().unwrap_or("").to_string(),
        path: parts.next().unwrap_or("").to_string(),
        request_id,
        forwarded_for,
        forwarded_proto,
        body,
    })
}

fn serve_conn(
    sock: TcpStream,
    conn: usize,
    b: &Behaviour,
    logs: &Logs,
    stop: &AtomicBool,
) -> ConnEnd {
    let _ = sock.set_nonblocking(false);
    let _ = sock.set_nodelay(true);
    let _ = sock.set_write_timeout(Some(Duration::from_secs(5)));
    let Ok(mut w) = sock.try_clone() else {
        return ConnEnd::Error;
    };
    let mut r = BufReader::new(sock);
    let mut since = Instant::now();
    let mut index = 0usize;
    loop {
        match wait_for_request(&mut r, b.idle_timeout, since, stop) {
            Wait::Data => {}
            Wait::Late => logs.event(ConnEnd::LateRequestServed),
            Wait::Eof => return ConnEnd::PeerClosed,
            Wait::Idle => return ConnEnd::IdleClosed,
            Wait::Stop => return ConnEnd::Stopped,
            Wait::Error => return ConnEnd::Error,
        }
        let Ok(req) = read_request(&mut r) else {
            return ConnEnd::Error;
        };
        let dropped = b.read_then_close_without_answer && index > 0;
        let slot = {
            let mut served = logs.served.lock().unwrap();
            served.push(Served {
                conn,
                index,
                method: req.method.clone(),
                request_id: req.request_id.clone(),
                forwarded_for: req.forwarded_for.clone(),
                forwarded_proto: req.forwarded_proto.clone(),
                body: String::from_utf8_lossy(&req.body).into_owned(),
                dropped,
                answered: false,
            });
            served.len() - 1
        };
        index += 1;
        if dropped {
            // A worker that died with the request in hand: the socket closes, no byte sent.
            let _ = w.shutdown(Shutdown::Both);
            return ConnEnd::ClosedWithoutAnswer;
        }
        let last_by_max = b.max_requests_per_conn.is_some_and(|m| index >= m);
        let close_header =
            b.connection_close_always || (last_by_max && b.max_requests_close_header);
        let closes = close_header || last_by_max || b.http10_no_length;
        if respond(&mut w, &req, b, close_header).is_err() {
            return ConnEnd::Error;
        }
        logs.served.lock().unwrap()[slot].answered = true;
        since = Instant::now();
        if let Some(linger) = b.close_after_stream.filter(|_| streamed(&req)) {
            // Whatever the client sent meanwhile is left unread: the close resets.
            std::thread::sleep(linger);
            return ConnEnd::ClosedAfterStream;
        }
        if closes {
            let _ = w.shutdown(Shutdown::Write);
            return if last_by_max {
                ConnEnd::ClosedAfterMax
            } else {
                ConnEnd::ClosedAfterResponse
            };
        }
    }
}

/// A POST asking for a streamed answer.
fn streamed(req: &Request) -> bool {
    req.method == "POST"
        && serde_json::from_slice::<serde_json::Value>(&req.body)
            .is_ok_and(|v| v.get("stream").and_then(|s| s.as_bool()) == Some(true))
}

/// Words in the prompt (or the messages' contents): the server's "prompt tokens".
fn count_prompt(v: &serde_json::Value) -> usize {
    if let Some(p) = v.get("prompt").and_then(|p| p.as_str()) {
        return p.split_whitespace().count();
    }
    v.get("messages")
        .and_then(|m| m.as_array())
        .map_or(0, |msgs| {
            msgs.iter()
                .filter_map(|m| m.get("content")?.as_str())
                .map(|c| c.split_whitespace().count())
                .sum()
        })
}

fn respond(w: &mut TcpStream, req: &Request, b: &Behaviour, close_header: bool) -> io::Result<()> {
    let version = if b.http10_no_length {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    let conn_line = if close_header {
        "connection: close\r\n"
    } else if b.close_after_stream.is_some() {
        "keep-alive: timeout=5, max=100\r\n"
    } else {
        ""
    };
    // A whole body: content-length, or delimited by the close under HTTP/1.0.
    let whole = |w: &mut TcpStream, status: &str, payload: &str| -> io::Result<()> {
        let length = if b.http10_no_length {
            String::new()
        } else {
            format!("content-length: {}\r\n", payload.len())
        };
        let resp = format!(
            "{version} {status}\r\ncontent-type: application/json\r\n{length}{conn_line}\r\n{payload}"
        );
        w.write_all(resp.as_bytes())
    };
    if req.method == "GET" {
        return if req.path == "/v1/models" {
            whole(
                w,
                "200 OK",
                r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#,
            )
        } else {
            whole(w, "404 Not Found", r#"{"error":{"message":"not found"}}"#)
        };
    }
    let chat = req.path == "/v1/chat/completions";
    // `/custom/generate`: a generation endpoint capture does not know (it passes it through).
    let completion = req.path == "/v1/completions" || req.path == "/custom/generate";
    if req.method != "POST" || !(chat || completion) {
        return whole(w, "404 Not Found", r#"{"error":{"message":"not found"}}"#);
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&req.body) else {
        return whole(
            w,
            "400 Bad Request",
            r#"{"error":{"message":"body is not JSON"}}"#,
        );
    };
    let stream = v.get("stream").and_then(|s| s.as_bool()) == Some(true);
    let tokens = v
        .get("max_tokens")
        .and_then(|m| m.as_u64())
        .unwrap_or(3)
        .clamp(1, 32) as usize;
    let usage = format!(
        r#"{{"prompt_tokens":{},"completion_tokens":{tokens},"total_tokens":{}}}"#,
        count_prompt(&v),
        count_prompt(&v) + tokens
    );
    let role_first = if stream && chat {
        b.role_chunk_first_delay
    } else {
        None
    };
    if !stream {
        std::thread::sleep(b.think_not_streamed.unwrap_or(b.think));
    } else if role_first.is_none() {
        std::thread::sleep(b.think);
    }
    if !stream {
        let choice = if chat {
            let text = vec!["x"; tokens].join(" ");
            format!(
                r#"{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"length"}}"#
            )
        } else {
            let text = vec!["x"; tokens].join(" ");
            format!(r#"{{"index":0,"text":"{text}","finish_reason":"length"}}"#)
        };
        let usage = if b.no_usage { "null" } else { usage.as_str() };
        let payload = format!(
            r#"{{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{choice}],"usage":{usage}}}"#
        );
        return whole(w, "200 OK", &payload);
    }
    let chunked = !b.http10_no_length;
    let te = if chunked {
        "transfer-encoding: chunked\r\n"
    } else {
        ""
    };
    w.write_all(
        format!("{version} 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n{te}{conn_line}\r\n").as_bytes(),
    )?;
    let frame = |w: &mut TcpStream, ev: &str| -> io::Result<()> {
        if chunked {
            w.write_all(format!("{:x}\r\n{ev}\r\n", ev.len()).as_bytes())
        } else {
            w.write_all(ev.as_bytes())
        }
    };
    if let Some(delay) = role_first {
        frame(
            w,
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        )?;
        std::thread::sleep(delay);
    }
    let (mut sent, mut i) = (0, 0);
    while sent < tokens {
        if i > 0 {
            std::thread::sleep(b.chunk_gap);
        }
        let k = if b.tokens_per_chunk.is_empty() {
            1
        } else {
            b.tokens_per_chunk[i % b.tokens_per_chunk.len()]
        }
        .clamp(1, tokens - sent);
        let piece = " x".repeat(k);
        let ev = if chat {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{piece}\"}}}}]}}\n\n"
            )
        } else {
            format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{piece}\"}}]}}\n\n")
        };
        frame(w, &ev)?;
        sent += k;
        i += 1;
    }
    if !b.no_usage {
        frame(
            w,
            &format!("data: {{\"choices\":[],\"usage\":{usage}}}\n\n"),
        )?;
    }
    frame(w, "data: [DONE]\n\n")?;
    if chunked {
        w.write_all(b"0\r\n\r\n")?;
    }
    Ok(())
}
