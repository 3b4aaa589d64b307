//! What the two bare readers (`floor.rs` over epoll, `floor_uring.rs` over io_uring) share:
//! their arguments, connections, requests, the per-read bookkeeping (SSE events counted by
//! their `data: ` prefix, the end of a chunked body spotted by its last five bytes) and the
//! JSON line they print. Only how they ask the kernel for bytes differs.

use std::io::{BufWriter, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The command line: `NAME HOST:PORT REQUESTS CONCURRENCY MAX_TOKENS [--batch-us N] [--stamps FILE]`.
pub struct Args {
    pub addr: String,
    pub requests: u64,
    pub concurrency: u64,
    pub max_tokens: u64,
    /// Sleep this long before a wait that follows a busy one (0: never).
    pub batch: Duration,
    /// One JSON line per request: its id and the kernel stamp of its first event.
    pub stamps: Option<BufWriter<std::fs::File>>,
}

impl Args {
    pub fn parse(name: &str) -> Result<Args, String> {
        let args: Vec<String> = std::env::args().collect();
        if args.len() < 5 {
            return Err(format!(
                "usage: {name} HOST:PORT REQUESTS CONCURRENCY MAX_TOKENS [--batch-us N] [--stamps FILE]"
            ));
        }
        let num = |i: usize| -> Result<u64, String> {
            args[i]
                .parse()
                .map_err(|_| format!("not a number: {}", args[i]))
        };
        let flag = |f: &str| args.iter().position(|a| a == f).map(|i| args.get(i + 1));
        let batch = match flag("--batch-us") {
            Some(v) => Duration::from_micros(
                v.and_then(|v| v.parse().ok())
                    .ok_or("--batch-us needs a number")?,
            ),
            None => Duration::ZERO,
        };
        let stamps = match flag("--stamps") {
            Some(v) => Some(BufWriter::new(
                std::fs::File::create(v.ok_or("--stamps needs a file")?)
                    .map_err(|e| e.to_string())?,
            )),
            None => None,
        };
        Ok(Args {
            addr: args[1].clone(),
            requests: num(2)?,
            concurrency: num(3)?,
            max_tokens: num(4)?,
            batch,
            stamps,
        })
    }
}

/// Process CPU time (user + system), seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// One keep-alive connection and the response streaming on it.
pub struct Stream {
    pub sock: TcpStream,
    tail: Vec<u8>,
    events: u64,
    id: u64,
    /// The kernel stamp of the current response's first event (ns, CLOCK_REALTIME).
    first_ns: i64,
}

impl Stream {
    /// Connects with `TCP_NODELAY` and kernel receive stamps on.
    pub fn connect(addr: &str) -> Result<Stream, String> {
        use std::os::fd::AsRawFd;
        let sock = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        sock.set_nodelay(true).map_err(|e| e.to_string())?;
        wire::rxstamp::enable(sock.as_raw_fd());
        Ok(Stream {
            sock,
            tail: Vec::new(),
            events: 0,
            id: 0,
            first_ns: 0,
        })
    }

    /// Sends request `id`: a streamed completion of `max_tokens` from the ground truth.
    pub fn send(&mut self, args: &Args, id: u64) -> Result<(), String> {
        let body = format!(
            r#"{{"model":"ground-truth","prompt":"a b c d e f g h i j k l m n o p","max_tokens":{},"stream":true}}"#,
            args.max_tokens
        );
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {}\r\nx-request-id: floor-{id}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            args.addr,
            body.len()
        );
        self.id = id;
        (&self.sock)
            .write_all(req.as_bytes())
            .map_err(|e| e.to_string())
    }

    /// Takes one read's bytes and their stamp. When they end the response, writes its
    /// stamp line and returns its events (less `[DONE]`), ready for the next request.
    pub fn take(
        &mut self,
        data: &[u8],
        stamp_ns: i64,
        stamps: &mut Option<BufWriter<std::fs::File>>,
    ) -> Result<Option<u64>, String> {
        let here = data.windows(6).filter(|w| w == b"data: ").count() as u64;
        if self.events == 0 && here > 0 {
            self.first_ns = stamp_ns;
        }
        self.events += here;
        self.tail
            .extend_from_slice(&data[data.len().saturating_sub(5)..]);
        if self.tail.len() > 5 {
            self.tail.drain(..self.tail.len() - 5);
        }
        if self.tail != b"0\r\n\r\n" {
            return Ok(None);
        }
        if let Some(out) = stamps.as_mut() {
            writeln!(
                out,
                "{{\"request_id\":\"floor-{}\",\"first_event_ns\":{}}}",
                self.id, self.first_ns
            )
            .map_err(|e| e.to_string())?;
        }
        let events = self.events.saturating_sub(1);
        self.events = 0;
        self.tail.clear();
        Ok(Some(events))
    }
}

/// What a run counted, printed as one JSON line.
#[derive(Default)]
pub struct Tally {
    pub events: u64,
    pub reads: u64,
    pub unstamped: u64,
    pub wakeups: u64,
    pub last_stamp_ns: i64,
}

/// Flushes the stamps and prints the run's JSON line; `extra` is `,"key":value` pairs.
pub fn report(
    args: &mut Args,
    t: &Tally,
    cpu: f64,
    wall0: Instant,
    extra: &str,
) -> Result<(), String> {
    if let Some(out) = args.stamps.as_mut() {
        out.flush().map_err(|e| e.to_string())?;
    }
    println!(
        "{{\"requests\":{},\"concurrency\":{},\"events\":{},\"reads\":{},\"unstamped_reads\":{},\"wakeups\":{}{extra},\"cpu_seconds\":{cpu:.4},\"cpu_us_per_event\":{:.3},\"wall_seconds\":{:.3},\"batch_us\":{},\"last_stamp_ns\":{}}}",
        args.requests,
        args.concurrency,
        t.events,
        t.reads,
        t.unstamped,
        t.wakeups,
        cpu * 1e6 / t.events.max(1) as f64,
        wall0.elapsed().as_secs_f64(),
        args.batch.as_micros(),
        t.last_stamp_ns
    );
    Ok(())
}
