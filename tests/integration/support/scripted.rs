//! A loopback HTTP/1.1 upstream that answers each request with the script its `x-script`
//! header names (`*`'s when it names none): a whole JSON body, or SSE events written one by one after the pause the
//! script gives each (so a test knows when every event left), framed as the servers frame
//! them (`event: <type>` then `data: …`). Every request it read is kept (path, headers,
//! body). Dropping it stops the acceptor (connection threads end with their peer).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the upstream answers one script with.
#[derive(Debug, Clone)]
pub enum Script {
    /// `200` with this JSON body.
    Json(String),
    /// `status` with this JSON body.
    Status(u16, String),
    /// `200 text/event-stream`, each event's data after its pause; `[DONE]`-less (the
    /// events say where the stream ends).
    Events(Vec<(Duration, String)>),
}

/// One request the upstream read.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

pub struct ScriptedUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl ScriptedUpstream {
    pub fn start(scripts: HashMap<String, Script>) -> ScriptedUpstream {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        l.set_nonblocking(true).expect("nonblocking");
        let addr = l.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2, scripts) = (seen.clone(), stop.clone(), Arc::new(scripts));
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let (seen3, scripts) = (seen2.clone(), scripts.clone());
                        std::thread::spawn(move || serve(s, &scripts, &seen3));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        ScriptedUpstream { addr, seen, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(s: TcpStream, scripts: &HashMap<String, Script>, seen: &Mutex<Vec<Seen>>) {
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let len: usize = get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        // A request naming no script (a replayed one) gets the script named `*`, if any.
        let script = match get("x-script") {
            Some(k) => scripts.get(&k).cloned(),
            None => scripts.get("*").cloned(),
        };
        seen.lock().unwrap().push(Seen {
            path,
            headers: headers.clone(),
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        let ok = match script {
            None => whole(&mut w, 404, r#"{"error":{"message":"no such script"}}"#),
            Some(Script::Json(b)) => whole(&mut w, 200, &b),
            Some(Script::Status(code, b)) => whole(&mut w, code, &b),
            Some(Script::Events(events)) => stream(&mut w, &events),
        };
        if ok.is_err() {
            return;
        }
    }
}

fn whole(w: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes())?;
    w.write_all(body.as_bytes())
}

fn stream(w: &mut TcpStream, events: &[(Duration, String)]) -> std::io::Result<()> {
    w.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    for (pause, data) in events {
        std::thread::sleep(*pause);
        let ty = serde_json::from_str::<serde_json::Value>(data)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string));
        let ev = match ty {
            Some(t) => format!("event: {t}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        };
        w.write_all(format!("{:x}\r\n{ev}\r\n", ev.len()).as_bytes())?;
    }
    w.write_all(b"0\r\n\r\n")
}
