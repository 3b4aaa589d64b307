//! The floor under a streaming client when the kernel is asked through io_uring instead of
//! epoll: `floor.rs`'s load and output, read with one multishot `recvmsg` per connection
//! (kernel receive stamp in each completion) into a ring of provided buffers, so that no
//! read costs a syscall: one `io_uring_enter` reaps every completion ready.
//!
//! The ring runs its task work cooperatively (`COOP_TASKRUN`): each read happens when its
//! data arrives, as with epoll, so each event keeps its own kernel stamp. With
//! `DEFER_TASKRUN` the reads wait for the next `io_uring_enter`; tried with `--batch-us
//! 500` at 1,000 streams, reads lagged arrivals by tens of ms (58k reads for 200k events,
//! first-event error p99 30 ms, 88 ms at 2 ms), so one read took several events under
//! the last one's stamp. The CPU that saved (2.2 and 1.0 µs per event) was that precision.
//!
//! usage: floor_uring HOST:PORT REQUESTS CONCURRENCY MAX_TOKENS [--batch-us N] [--stamps FILE]

#[cfg(target_os = "linux")]
fn main() {
    if let Err(e) = linux::run() {
        eprintln!("floor_uring: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("floor_uring: Linux only");
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
#[allow(dead_code)]
mod floor_common;

#[cfg(target_os = "linux")]
mod linux {
    use super::floor_common::{cpu_seconds, report, Args, Stream, Tally};
    use io_uring::{cqueue, opcode, types, IoUring};
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::time::Instant;

    const BUFS: u16 = 4096;
    const BUF_LEN: usize = 4096;
    const GROUP: u16 = 7;

    /// The provided-buffer ring: `BUFS` entries the kernel takes buffers from, and the
    /// buffers themselves.
    struct BufRing {
        entries: *mut types::BufRingEntry,
        mem: Vec<u8>,
        tail: u16,
    }

    impl BufRing {
        fn new(ring: &IoUring) -> Result<Self, String> {
            let bytes = BUFS as usize * std::mem::size_of::<types::BufRingEntry>();
            // SAFETY: an anonymous private mapping, page-aligned as the kernel requires.
            let entries = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if entries == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error().to_string());
            }
            let mut r = BufRing {
                entries: entries.cast(),
                mem: vec![0u8; BUFS as usize * BUF_LEN],
                tail: 0,
            };
            // SAFETY: the mapping lives as long as the ring (the process).
            unsafe {
                ring.submitter()
                    .register_buf_ring_with_flags(entries as u64, BUFS, GROUP, 0)
                    .map_err(|e| format!("register_buf_ring: {e}"))?;
            }
            for bid in 0..BUFS {
                r.push(bid);
            }
            r.publish();
            Ok(r)
        }

        fn buf(&self, bid: u16, len: usize) -> &[u8] {
            &self.mem[bid as usize * BUF_LEN..][..len]
        }

        fn push(&mut self, bid: u16) {
            // SAFETY: the index is masked into the mapping's BUFS entries.
            let e = unsafe { &mut *self.entries.add((self.tail & (BUFS - 1)) as usize) };
            e.set_addr(self.mem[bid as usize * BUF_LEN..].as_ptr() as u64);
            e.set_len(BUF_LEN as u32);
            e.set_bid(bid);
            self.tail = self.tail.wrapping_add(1);
        }

        fn publish(&self) {
            // SAFETY: the tail field of the first entry, shared with the kernel.
            unsafe {
                let t = types::BufRingEntry::tail(self.entries) as *const AtomicU16;
                (*t).store(self.tail, Ordering::Release);
            }
        }
    }

    pub fn run() -> Result<(), String> {
        let mut args = Args::parse("floor_uring")?;
        let mut ring: IoUring = IoUring::builder()
            .setup_cqsize(16384)
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(4096)
            .map_err(|e| format!("io_uring: {e}"))?;
        let mut bufs = BufRing::new(&ring)?;
        // The template every multishot recvmsg fills: no name, room for one timespec cmsg.
        // SAFETY: a zeroed msghdr is valid; only lengths are set.
        let mut msghdr: libc::msghdr = unsafe { std::mem::zeroed() };
        msghdr.msg_controllen = unsafe { libc::CMSG_SPACE(16) } as _;

        let mut streams = Vec::new();
        for _ in 0..args.concurrency.min(args.requests) {
            streams.push(Stream::connect(&args.addr)?);
        }
        let arm = |ring: &mut IoUring, key: usize, fd: i32| -> Result<(), String> {
            let e = opcode::RecvMsgMulti::new(types::Fd(fd), &msghdr, GROUP)
                .build()
                .user_data(key as u64);
            // SAFETY: msghdr outlives the ring's use of it (this function).
            unsafe {
                if ring.submission().push(&e).is_err() {
                    ring.submit().map_err(|e| e.to_string())?;
                    ring.submission()
                        .push(&e)
                        .map_err(|_| "submission queue full")?;
                }
            }
            Ok(())
        };
        for (key, s) in streams.iter().enumerate() {
            arm(&mut ring, key, s.sock.as_raw_fd())?;
        }
        ring.submit().map_err(|e| e.to_string())?;

        let cpu0 = cpu_seconds();
        let wall0 = Instant::now();
        let mut sent = 0u64;
        for s in &mut streams {
            s.send(&args, sent)?;
            sent += 1;
        }
        let mut t = Tally::default();
        let (mut done, mut rearms) = (0u64, 0u64);
        let mut busy = false;
        let mut completions = Vec::with_capacity(16384);
        while done < args.requests {
            if busy && !args.batch.is_zero() {
                std::thread::sleep(args.batch);
            }
            ring.submit_and_wait(1)
                .map_err(|e| format!("io_uring_enter: {e}"))?;
            t.wakeups += 1;
            completions.clear();
            completions.extend(
                ring.completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            busy = completions.len() > 1;
            for &(key, res, flags) in &completions {
                let key = key as usize;
                if res < 0 {
                    if -res == libc::ENOBUFS {
                        rearms += 1;
                        arm(&mut ring, key, streams[key].sock.as_raw_fd())?;
                        continue;
                    }
                    return Err(format!(
                        "connection {key}: {}",
                        std::io::Error::from_raw_os_error(-res)
                    ));
                }
                let bid = cqueue::buffer_select(flags).ok_or("a completion without a buffer")?;
                let msg = types::RecvMsgOut::parse(bufs.buf(bid, res as usize), &msghdr)
                    .map_err(|_| "a completion too short for its header")?;
                let data = msg.payload_data();
                if data.is_empty() {
                    return Err(format!("connection {key} ended early"));
                }
                t.reads += 1;
                t.last_stamp_ns = 0;
                let c = msg.control_data();
                // cmsghdr (len u64, level i32, type i32), then the timespec.
                if c.len() >= 32
                    && i32::from_ne_bytes(c[12..16].try_into().unwrap()) == libc::SCM_TIMESTAMPNS
                {
                    let sec = i64::from_ne_bytes(c[16..24].try_into().unwrap());
                    let nsec = i64::from_ne_bytes(c[24..32].try_into().unwrap());
                    t.last_stamp_ns = sec * 1_000_000_000 + nsec;
                }
                if t.last_stamp_ns == 0 {
                    t.unstamped += 1;
                }
                let s = &mut streams[key];
                let finished = s.take(data, t.last_stamp_ns, &mut args.stamps)?;
                bufs.push(bid);
                if !cqueue::more(flags) {
                    rearms += 1;
                    arm(&mut ring, key, s.sock.as_raw_fd())?;
                }
                if let Some(events) = finished {
                    done += 1;
                    t.events += events;
                    if sent < args.requests {
                        s.send(&args, sent)?;
                        sent += 1;
                    }
                }
            }
            bufs.publish();
        }
        let cpu = cpu_seconds() - cpu0;
        report(&mut args, &t, cpu, wall0, &format!(",\"rearms\":{rearms}"))
    }
}
