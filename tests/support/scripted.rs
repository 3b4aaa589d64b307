//! A scripted OpenAI-style streaming server with known timing, for end-to-end tests.
//!
//! One OS thread per connection, blocking I/O, timer slack 1 ns, absolute deadlines: chunk
//! `i` of a request is written at `t0 + ttft + i·itl` where t0 is when the request was read.
//! It logs when each request arrived and when each chunk was actually written, so a test can
//! tell server lateness from client error. HTTP/1.1 keep-alive, chunked transfer encoding.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The timing every streamed response follows.
#[derive(Debug, Clone, Copy)]
pub struct Script {
    pub ttft: Duration,
    pub itl: Duration,
    pub chunks: usize,
    pub tokens_per_chunk: usize,
    pub prompt_tokens: usize,
}

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub struct RequestLog {
    pub path: String,
    pub body: String,
    /// When the request had been read completely.
    pub received: Instant,
    /// When each chunk was written.
    pub chunk_written: Vec<Instant>,
}

pub struct ScriptedServer {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<RequestLog>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl ScriptedServer {
    pub fn start(script: Script) -> ScriptedServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l2, s2) = (log.clone(), stop.clone());
        let acceptor = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((sock, _)) => {
                        let _ = sock.set_nonblocking(false);
                        let l3 = l2.clone();
                        std::thread::spawn(move || serve_conn(sock, script, l3));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        ScriptedServer {
            addr,
            log,
            stop,
            acceptor: Some(acceptor),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<RequestLog> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn set_timer_slack() {
    // SAFETY: affects only the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn serve_conn(sock: TcpStream, script: Script, log: Arc<Mutex<Vec<RequestLog>>>) {
    set_timer_slack();
    let _ = sock.set_nodelay(true);
    let mut w = sock.try_clone().expect("clone socket");
    let mut r = BufReader::new(sock);
    loop {
        // Request line and headers.
        let mut line = String::new();
        let mut request_line = String::new();
        let mut content_length = 0usize;
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => {}
                Err(_) => return,
            }
            if request_line.is_empty() {
                request_line = line.trim_end().to_string();
                continue;
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    content_length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; content_length];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let t0 = Instant::now();
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let body = String::from_utf8_lossy(&body).into_owned();
        if method == "GET" {
            let payload = if path == "/v1/models" {
                r#"{"object":"list","data":[{"id":"scripted","object":"model"}]}"#.to_string()
            } else {
                r#"{"error":{"message":"not found"}}"#.to_string()
            };
            let status = if path == "/v1/models" {
                "200 OK"
            } else {
                "404 Not Found"
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{payload}",
                payload.len()
            );
            if w.write_all(resp.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        let chat = path.contains("chat");
        let streamed = body.contains("\"stream\":true");
        let total_tokens = script.chunks * script.tokens_per_chunk;
        let mut written = Vec::with_capacity(script.chunks);
        if !streamed {
            let deadline = t0 + script.ttft + script.itl * (script.chunks.saturating_sub(1) as u32);
            sleep_until(deadline);
            let payload = format!(
                r#"{{"choices":[{{"index":0,"text":"x"}}],"usage":{{"prompt_tokens":{},"completion_tokens":{total_tokens}}}}}"#,
                script.prompt_tokens
            );
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{payload}",
                payload.len()
            );
            if w.write_all(resp.as_bytes()).is_err() {
                return;
            }
            written.push(Instant::now());
        } else {
            if w
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                .is_err()
            {
                return;
            }
            let text = " tok".repeat(script.tokens_per_chunk);
            for i in 0..script.chunks {
                sleep_until(t0 + script.ttft + script.itl * i as u32);
                let ev = if chat {
                    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
                } else {
                    format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{text}\"}}]}}\n\n")
                };
                let frame = format!("{:x}\r\n{ev}\r\n", ev.len());
                if w.write_all(frame.as_bytes()).is_err() {
                    return;
                }
                written.push(Instant::now());
            }
            let tail = format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{total_tokens}}}}}\n\ndata: [DONE]\n\n",
                script.prompt_tokens
            );
            let frame = format!("{:x}\r\n{tail}\r\n0\r\n\r\n", tail.len());
            if w.write_all(frame.as_bytes()).is_err() {
                return;
            }
        }
        log.lock().unwrap().push(RequestLog {
            path,
            body,
            received: t0,
            chunk_written: written,
        });
    }
}
