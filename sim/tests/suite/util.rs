//! A minimal HTTP/1.1 client over a raw socket, so tests can see exactly what the server
//! sent: status, headers, de-chunked body, SSE events with arrival times, and whether the
//! body ended cleanly.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// SSE events (`data: ...` payloads) with their arrival time.
    pub events: Vec<(Instant, String)>,
    /// True if the body ended as framed (terminating chunk / content-length reached).
    pub complete: bool,
    /// When the request was written.
    pub t0: Instant,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
    /// The JSON of every `data:` event except `[DONE]`.
    pub fn chunks(&self) -> Vec<serde_json::Value> {
        self.events
            .iter()
            .filter(|(_, e)| e != "[DONE]")
            .map(|(_, e)| serde_json::from_str(e).expect("chunk JSON"))
            .collect()
    }
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    tokio::time::timeout(
        Duration::from_secs(10),
        request_inner(addr, method, path, headers, body, None),
    )
    .await
    .expect("request timed out")
}

pub async fn post(addr: SocketAddr, path: &str, body: serde_json::Value) -> Reply {
    request(addr, "POST", path, &[], &body.to_string()).await
}

/// Sends a request; stops reading after `stop_after` (if given) and returns what arrived.
pub async fn request_inner(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    stop_after: Option<Duration>,
) -> Reply {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("content-type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    let t0 = Instant::now();
    s.write_all(req.as_bytes()).await.expect("write");

    let mut raw: Vec<u8> = Vec::new();
    let mut reply = Reply {
        status: 0,
        headers: Vec::new(),
        body: Vec::new(),
        events: Vec::new(),
        complete: false,
        t0,
    };
    let mut head_done = false;
    let mut chunked = false;
    let mut content_length: Option<usize> = None;
    let mut pos = 0usize; // parse position in `raw` (after headers)
    let mut ev_pos = 0usize; // scan position in body for SSE events
    let mut buf = [0u8; 16 * 1024];
    let deadline = stop_after.map(|d| tokio::time::Instant::now() + d);
    loop {
        let n = match deadline {
            Some(d) => match tokio::time::timeout_at(d, s.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => break,
            },
            None => s.read(&mut buf).await,
        };
        let n = match n {
            Ok(0) => break,
            Err(e) => {
                if std::env::var("SIM_DEBUG").is_ok() {
                    eprintln!("read error: {e} after {} bytes", raw.len());
                }
                break;
            }
            Ok(n) => n,
        };
        let now = Instant::now();
        raw.extend_from_slice(&buf[..n]);
        if !head_done {
            let Some(end) = find(&raw, b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&raw[..end]).to_string();
            let mut lines = head.split("\r\n");
            let status_line = lines.next().unwrap_or_default();
            reply.status = status_line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            for l in lines {
                if let Some((k, v)) = l.split_once(':') {
                    reply
                        .headers
                        .push((k.trim().to_string(), v.trim().to_string()));
                }
            }
            chunked = reply
                .header("transfer-encoding")
                .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
            content_length = reply.header("content-length").and_then(|v| v.parse().ok());
            head_done = true;
            pos = end + 4;
        }
        // decode what we can
        if chunked {
            while let Some(le) = find(&raw[pos..], b"\r\n") {
                let size_str = String::from_utf8_lossy(&raw[pos..pos + le]).to_string();
                let size =
                    usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
                        .expect("chunk size");
                let data_start = pos + le + 2;
                if raw.len() < data_start + size + 2 {
                    break;
                }
                if size == 0 {
                    reply.complete = true;
                    pos = data_start + 2;
                    break;
                }
                reply
                    .body
                    .extend_from_slice(&raw[data_start..data_start + size]);
                pos = data_start + size + 2;
            }
        } else if head_done {
            reply.body.extend_from_slice(&raw[pos..]);
            pos = raw.len();
            if content_length.is_some_and(|cl| reply.body.len() >= cl) {
                reply.complete = true;
            }
        }
        while let Some(e) = find(&reply.body[ev_pos..], b"\n\n") {
            let ev = String::from_utf8_lossy(&reply.body[ev_pos..ev_pos + e]).to_string();
            // `data: …`, after an `event: TYPE` line for the typed APIs.
            if let Some(data) = ev.lines().find_map(|l| l.strip_prefix("data: ")) {
                reply.events.push((now, data.to_string()));
            }
            ev_pos += e + 2;
        }
        if reply.complete {
            break;
        }
    }
    if head_done && !chunked && content_length.is_none() {
        reply.complete = true; // close-delimited
    }
    reply
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
