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
#[allow(dead_code)]
mod floor_common;

#[cfg(target_os = "linux")]
mod linux {
    use super::floor_common::{cpu_seconds, report, Args, Stream, Tally};
    use std::os::fd::AsRawFd;
    use std::time::Instant;

    pub fn run() -> Result<(), String> {
        let mut args = Args::parse("floor")?;
        // SAFETY: plain syscalls on descriptors this function owns.
        let ep = unsafe { libc::epoll_create1(0) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let mut streams = Vec::new();
        for i in 0..args.concurrency.min(args.requests) {
            let s = Stream::connect(&args.addr)?;
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i,
            };
            // SAFETY: a valid socket and event struct.
            unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.sock.as_raw_fd(), &mut ev) };
            streams.push(s);
        }
        let cpu0 = cpu_seconds();
        let wall0 = Instant::now();
        let mut sent = 0u64;
        for s in &mut streams {
            s.send(&args, sent)?;
            sent += 1;
        }
        let mut t = Tally::default();
        let mut done = 0u64;
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut busy = false;
        while done < args.requests {
            if busy && !args.batch.is_zero() {
                std::thread::sleep(args.batch);
            }
            // SAFETY: evs is a live buffer of evs.len() events.
            let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, 10_000) };
            if n < 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            if n == 0 {
                return Err(format!(
                    "no data for 10 s after {done} of {} requests",
                    args.requests
                ));
            }
            t.wakeups += 1;
            busy = n > 1;
            for e in &evs[..n as usize] {
                let key = e.u64 as usize;
                let s = &mut streams[key];
                let (got, stamp) =
                    wire::rxstamp::recv(s.sock.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT)
                        .map_err(|e| format!("connection {key}: {e}"))?;
                if got == 0 {
                    return Err(format!("connection {key} ended early"));
                }
                t.reads += 1;
                t.last_stamp_ns = stamp;
                if stamp == 0 {
                    // No stamp (the kernel had none for these bytes): the read time.
                    t.unstamped += 1;
                    t.last_stamp_ns = wire::clock::epoch_ns();
                }
                // SAFETY: recv initialized the first `got` bytes.
                let data = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), got) };
                if let Some(events) = s.take(data, t.last_stamp_ns, &mut args.stamps)? {
                    done += 1;
                    t.events += events;
                    if sent < args.requests {
                        s.send(&args, sent)?;
                        sent += 1;
                    }
                }
            }
        }
        let cpu = cpu_seconds() - cpu0;
        report(&mut args, &t, cpu, wall0, "")
    }
}
