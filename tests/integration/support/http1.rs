//! Raw HTTP/1.1 for the test servers and clients, written once: finding a head's end,
//! de-chunking a body, and the one [`Response`] type of the two raw clients that drive a
//! proxy — [`raw_exchange`] (one request on a fresh connection, the reply read to EOF and
//! parsed leniently, so a test sees exactly what a client got, including a 200 whose body
//! was cut) and [`Http1Client`] (a blocking keep-alive client that never resends).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The value of header `name` (lowercase) among `headers` (names lowercased).
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A response as a raw client read it.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked (as much as arrived).
    pub body: Vec<u8>,
    /// The body's framing was complete (terminal chunk, or content-length met); always so
    /// from [`Http1Client`], which reads a whole response or fails.
    pub complete: bool,
    /// The request went out on a connection that had carried an earlier one.
    pub reused: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Where a head ends: the index of its blank line and the separator's length.
pub fn find_head_end(buf: &[u8]) -> Option<(usize, usize)> {
    // CRLF CRLF, or LF LF (lenient, as some servers are).
    for i in 0..buf.len() {
        if buf[i..].starts_with(b"\r\n\r\n") {
            return Some((i, 4));
        }
        if buf[i..].starts_with(b"\n\n") {
            return Some((i, 2));
        }
    }
    None
}

/// A chunked body de-chunked, or why not.
pub enum Dechunk {
    /// The body and the bytes it took.
    Done(Vec<u8>, usize),
    Partial,
    Bad,
}

/// De-chunks the chunked body at the start of `buf` (trailers skipped).
pub fn dechunk(buf: &[u8]) -> Dechunk {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(nl) = buf[at..].iter().position(|b| *b == b'\n') else {
            return Dechunk::Partial;
        };
        let line = String::from_utf8_lossy(&buf[at..at + nl]);
        let size_text = line
            .trim()
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let Ok(size) = usize::from_str_radix(&size_text, 16) else {
            return Dechunk::Bad;
        };
        at += nl + 1;
        if size == 0 {
            // Trailer fields up to the empty line.
            loop {
                let Some(nl) = buf[at..].iter().position(|b| *b == b'\n') else {
                    return Dechunk::Partial;
                };
                let empty = buf[at..at + nl].iter().all(|b| *b == b'\r');
                at += nl + 1;
                if empty {
                    return Dechunk::Done(body, at);
                }
            }
        }
        if buf.len() < at + size + 2 {
            return Dechunk::Partial;
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size;
        if buf[at..].starts_with(b"\r\n") {
            at += 2;
        } else if buf[at..].starts_with(b"\n") {
            at += 1;
        } else {
            return Dechunk::Bad;
        }
    }
}

/// What a raw client got back on one connection.
#[derive(Debug, Clone)]
pub struct RawReply {
    /// Every byte read.
    pub bytes: Vec<u8>,
    /// How reading ended: "eof", "reset", "timeout" or another error kind.
    pub end: String,
    /// The responses parsed out of `bytes`.
    pub responses: Vec<Response>,
}

impl RawReply {
    pub fn statuses(&self) -> Vec<u16> {
        self.responses.iter().map(|r| r.status).collect()
    }

    pub fn first(&self) -> &Response {
        self.responses
            .first()
            .unwrap_or_else(|| panic!("no response; got {:?} ({})", self.text(), self.end))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Sends `request` on a new connection to `addr` and reads until EOF, an error, or `within`.
pub fn raw_exchange(addr: SocketAddr, request: &[u8], within: Duration) -> RawReply {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    let writer = {
        let mut w = s.try_clone().unwrap();
        let req = request.to_vec();
        // A thread, so a proxy that answers before reading everything cannot block us.
        std::thread::spawn(move || {
            let _ = w.set_write_timeout(Some(Duration::from_secs(10)));
            let _ = w.write_all(&req);
        })
    };
    let (bytes, end) = read_to_end_bounded(&mut s, within);
    let _ = writer.join();
    let responses = parse_responses(&bytes);
    RawReply {
        bytes,
        end,
        responses,
    }
}

/// Reads until EOF, an error, or `within`.
pub fn read_to_end_bounded(s: &mut TcpStream, within: Duration) -> (Vec<u8>, String) {
    let deadline = Instant::now() + within;
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break "timeout".to_string();
        }
        let _ = s.set_read_timeout(Some(left.min(Duration::from_millis(200))));
        match s.read(&mut buf) {
            Ok(0) => break "eof".into(),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break "reset".into(),
            Err(e) => break format!("{:?}", e.kind()),
        }
    };
    (bytes, end)
}

/// Parses consecutive HTTP/1.1 responses leniently; the last may be incomplete.
pub fn parse_responses(mut buf: &[u8]) -> Vec<Response> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let Some((end, sep)) = find_head_end(buf) else {
            break;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
        let status_line = lines.next().unwrap_or("");
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let rest = &buf[end + sep..];
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let (body, used, complete) = if status / 100 == 1 {
            (Vec::new(), 0, true)
        } else if get("transfer-encoding")
            .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"))
        {
            match dechunk(rest) {
                Dechunk::Done(b, n) => (b, n, true),
                _ => (lenient_dechunk(rest), rest.len(), false),
            }
        } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
            let n2 = n.min(rest.len());
            (rest[..n2].to_vec(), n2, n2 == n)
        } else if status == 204 || status == 304 {
            (Vec::new(), 0, true)
        } else {
            (rest.to_vec(), rest.len(), true)
        };
        out.push(Response {
            status,
            headers,
            body,
            complete,
            reused: !out.is_empty(),
        });
        buf = &rest[used..];
    }
    out
}

/// The data of whatever whole chunks arrived.
fn lenient_dechunk(buf: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut at = 0;
    while let Some(nl) = buf[at..].iter().position(|b| *b == b'\n') {
        let line = String::from_utf8_lossy(&buf[at..at + nl]);
        let Ok(size) = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
        else {
            break;
        };
        at += nl + 1;
        if size == 0 || buf.len() < at + size {
            body.extend_from_slice(&buf[at..buf.len().min(at + size)]);
            break;
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size;
        while at < buf.len() && (buf[at] == b'\r' || buf[at] == b'\n') {
            at += 1;
        }
    }
    body
}

/// A blocking HTTP/1.1 client that keeps one connection alive across requests while the
/// server lets it. It never resends: a request that fails is an error for the caller.
pub struct Http1Client {
    addr: SocketAddr,
    conn: Option<(BufReader<TcpStream>, TcpStream)>,
    /// Read timeout per response.
    pub timeout: Duration,
    /// Connections opened so far.
    pub connections: usize,
}

impl Http1Client {
    pub fn new(addr: SocketAddr) -> Http1Client {
        Http1Client {
            addr,
            conn: None,
            timeout: Duration::from_secs(20),
            connections: 0,
        }
    }

    /// POSTs `body` (JSON) to `path` with the extra `headers`; reads the whole response.
    pub fn post(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> io::Result<Response> {
        self.send("POST", path, headers, Some(body))
    }

    /// Sends `method` to `path` with the extra `headers` and `body` (JSON; `None`: no body
    /// and no content-length); reads the whole response.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> io::Result<Response> {
        let reused = self.conn.is_some();
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr)?;
            s.set_nodelay(true)?;
            let w = s.try_clone()?;
            self.conn = Some((BufReader::new(s), w));
            self.connections += 1;
        }
        let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.addr);
        if let Some(b) = body {
            req.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                b.len()
            ));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body.unwrap_or(""));
        let result = {
            let (r, w) = self.conn.as_mut().unwrap();
            r.get_ref().set_read_timeout(Some(self.timeout))?;
            w.write_all(req.as_bytes()).and_then(|()| read_response(r))
        };
        match result {
            Ok((mut resp, keep)) => {
                resp.reused = reused;
                if !keep {
                    self.conn = None;
                }
                Ok(resp)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }
}

/// Reads one response; also says whether the connection can carry another request.
fn read_response(r: &mut BufReader<TcpStream>) -> io::Result<(Response, bool)> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a response",
        ));
    }
    let mut parts = line.split_whitespace();
    let version = parts.next().unwrap_or("").to_string();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(&format!("status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(bad("connection closed in the response head"));
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.to_string())
    };
    let mut keep = version == "HTTP/1.1"
        && !get("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|t| t.to_ascii_lowercase().ends_with("chunked")) {
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                return Err(bad("connection closed in a chunked body"));
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| bad(&format!("chunk size {line:?}")))?;
            if size == 0 {
                // Trailers, then the empty line.
                loop {
                    line.clear();
                    if r.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                        break;
                    }
                }
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    } else if let Some(n) = get("content-length") {
        let n: usize = n.parse().map_err(|_| bad("content-length"))?;
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else if status == 204 || status == 304 {
    } else {
        r.read_to_end(&mut body)?;
        keep = false;
    }
    Ok((
        Response {
            status,
            headers,
            body,
            complete: true,
            reused: false,
        },
        keep,
    ))
}
