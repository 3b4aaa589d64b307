//! The kernel's floor under a streaming client, for `bench/run.sh cost`: the least CPU any
//! client that times every SSE event can spend per event on this machine.
//!
//! One thread, one `epoll_wait` per batch of ready sockets, one `recvmsg` with its
//! `SO_TIMESTAMPNS` stamp per read, and nothing else: no HTTP parsing beyond spotting the
//! end of a chunked body, no SSE parsing, no results. It keeps `concurrency` connections
//! busy until `requests` streamed completions are done, then prints its CPU time per event
//! (getrusage) as JSON. With `--batch-us N` it sleeps N µs before each `epoll_wait` that
//! follows a busy one, as llmreplay's client does under load.
//!
//! With `--stamps FILE` it writes one JSON line per request: its `x-request-id` and the
//! kernel receive time of its first event, for comparison with the ground-truth server's
//! log.
//!
//! usage: floor HOST:PORT REQUESTS CONCURRENCY MAX_TOKENS [--batch-us N] [--stamps FILE]

#[cfg(target_os = "linux")]
fn main() {
    if let Err(e) = linux::run() {
        eprintln!("floor: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("floor: Linux only");
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::Write;
    use std::net::TcpStream;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    struct Stream {
        sock: TcpStream,
        tail: Vec<u8>,
        events: u64,
        /// The request's id and the kernel stamp of its first event (ns, CLOCK_REALTIME).
        id: u64,
        first_ns: i64,
    }

    fn realtime_ns() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
    }

    fn cpu_seconds() -> f64 {
        // SAFETY: getrusage writes into the zeroed struct we pass.
        let ru = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut ru);
            ru
        };
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    }

    pub fn run() -> Result<(), String> {
        let args: Vec<String> = std::env::args().collect();
        if args.len() < 5 {
            return Err(
                "usage: floor HOST:PORT REQUESTS CONCURRENCY MAX_TOKENS [--batch-us N] [--stamps FILE]".into(),
            );
        }
        let addr = &args[1];
        let num = |i: usize| -> Result<u64, String> {
            args[i]
                .parse()
                .map_err(|_| format!("not a number: {}", args[i]))
        };
        let (requests, concurrency, max_tokens) = (num(2)?, num(3)?, num(4)?);
        let batch = match args.iter().position(|a| a == "--batch-us") {
            Some(i) => Duration::from_micros(
                args.get(i + 1)
                    .and_then(|v| v.parse().ok())
                    .ok_or("--batch-us needs a number")?,
            ),
            None => Duration::ZERO,
        };
        let mut stamps_out = match args.iter().position(|a| a == "--stamps") {
            Some(i) => Some(std::io::BufWriter::new(
                std::fs::File::create(args.get(i + 1).ok_or("--stamps needs a file")?)
                    .map_err(|e| e.to_string())?,
            )),
            None => None,
        };
        let body = format!(
            r#"{{"model":"ground-truth","prompt":"a b c d e f g h i j k l m n o p","max_tokens":{max_tokens},"stream":true}}"#
        );
        let request = |id: u64| {
            format!(
                "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\nx-request-id: floor-{id}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        // SAFETY: plain syscalls on descriptors this function owns.
        let ep = unsafe { libc::epoll_create1(0) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let mut streams = Vec::new();
        for i in 0..concurrency.min(requests) {
            let sock = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
            sock.set_nodelay(true).map_err(|e| e.to_string())?;
            let on: libc::c_int = 1;
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i,
            };
            // SAFETY: valid socket, option and event struct.
            unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_TIMESTAMPNS,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
                libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, sock.as_raw_fd(), &mut ev);
            }
            streams.push(Stream {
                sock,
                tail: Vec::new(),
                events: 0,
                id: 0,
                first_ns: 0,
            });
        }
        let cpu0 = cpu_seconds();
        let wall0 = Instant::now();
        let mut sent = 0u64;
        for s in &mut streams {
            s.id = sent;
            (&s.sock)
                .write_all(request(sent).as_bytes())
                .map_err(|e| e.to_string())?;
            sent += 1;
        }
        let (mut done, mut events, mut wakeups, mut reads) = (0u64, 0u64, 0u64, 0u64);
        let mut unstamped = 0u64;
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        let mut buf = vec![0u8; 64 * 1024];
        let mut control = [0u64; 8];
        let mut last_stamp = 0i64;
        let mut busy = false;
        while done < requests {
            if busy && !batch.is_zero() {
                std::thread::sleep(batch);
            }
            // SAFETY: evs is a live buffer of evs.len() events.
            let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, 10_000) };
            if n < 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            if n == 0 {
                return Err(format!(
                    "no data for 10 s after {done} of {requests} requests"
                ));
            }
            wakeups += 1;
            busy = n > 1;
            for e in &evs[..n as usize] {
                let key = e.u64;
                let s = &mut streams[key as usize];
                let mut iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                };
                // SAFETY: every pointer in msg refers to a live local buffer of the given
                // length.
                let got = unsafe {
                    let mut msg: libc::msghdr = std::mem::zeroed();
                    msg.msg_iov = &mut iov;
                    msg.msg_iovlen = 1;
                    msg.msg_control = control.as_mut_ptr().cast();
                    msg.msg_controllen = std::mem::size_of_val(&control) as _;
                    let got = libc::recvmsg(s.sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT);
                    let c = libc::CMSG_FIRSTHDR(&msg);
                    last_stamp = 0;
                    if got > 0 && !c.is_null() && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                        let ts: libc::timespec =
                            std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                        last_stamp = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
                    }
                    got
                };
                if got <= 0 {
                    return Err(format!("connection {key} ended early"));
                }
                reads += 1;
                if last_stamp == 0 {
                    // No stamp (the kernel had none for these bytes): the read time.
                    unstamped += 1;
                    last_stamp = realtime_ns();
                }
                let data = &buf[..got as usize];
                let events_here = data.windows(6).filter(|w| w == b"data: ").count() as u64;
                if s.events == 0 && events_here > 0 {
                    s.first_ns = last_stamp;
                }
                s.events += events_here;
                s.tail
                    .extend_from_slice(&data[data.len().saturating_sub(5)..]);
                if s.tail.len() > 5 {
                    s.tail.drain(..s.tail.len() - 5);
                }
                if s.tail == b"0\r\n\r\n" {
                    done += 1;
                    events += s.events.saturating_sub(1); // less [DONE]
                    if let Some(out) = stamps_out.as_mut() {
                        writeln!(
                            out,
                            "{{\"request_id\":\"floor-{}\",\"first_event_ns\":{}}}",
                            s.id, s.first_ns
                        )
                        .map_err(|e| e.to_string())?;
                    }
                    s.events = 0;
                    s.tail.clear();
                    if sent < requests {
                        s.id = sent;
                        (&s.sock)
                            .write_all(request(sent).as_bytes())
                            .map_err(|e| e.to_string())?;
                        sent += 1;
                    }
                }
            }
        }
        let cpu = cpu_seconds() - cpu0;
        if let Some(mut out) = stamps_out {
            out.flush().map_err(|e| e.to_string())?;
        }
        println!(
            "{{\"requests\":{requests},\"concurrency\":{concurrency},\"events\":{events},\"reads\":{reads},\"unstamped_reads\":{unstamped},\"wakeups\":{wakeups},\"cpu_seconds\":{cpu:.4},\"cpu_us_per_event\":{:.3},\"wall_seconds\":{:.3},\"batch_us\":{},\"last_stamp_ns\":{last_stamp}}}",
            cpu * 1e6 / events.max(1) as f64,
            wall0.elapsed().as_secs_f64(),
            batch.as_micros()
        );
        Ok(())
    }
}
