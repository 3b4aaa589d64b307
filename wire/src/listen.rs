//! The server side of the wire: listening sockets that survive connection bursts, and a
//! descriptor limit that allows them.

use std::net::SocketAddr;

/// Listen queue asked for; the kernel caps it at `net.core.somaxconn` (4096 by default since
/// Linux 5.4).
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket on `addr` with a listen queue of [`LISTEN_BACKLOG`].
///
/// `tokio::net::TcpListener::bind` listens with std's backlog of 128: when 500 clients
/// connect at once (a deploy, a network blip, `vllm bench serve` at 500 streams), the
/// connections past the queue are dropped by the kernel and their clients send the SYN again
/// one second later, so their first request reads a second slower.
pub fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(not(windows))]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// One listening socket on `addr` (as [`bind`]) for `n` threads that each accept and serve
/// their own connections: the first handle and `n - 1` duplicates of its descriptor, for the
/// threads to register with their own runtimes. They share one listen queue, so a connection
/// waits for whichever thread is free first (with one queue per thread, as `SO_REUSEPORT`
/// gives, it waits for the thread the kernel's hash picked even when the other is idle), and
/// the port stays the server's own: `SO_REUSEPORT` would let another process of the same
/// user bind it too and silently take part of its connections. `n` of 0 or 1 is [`bind`].
pub fn bind_group(addr: SocketAddr, n: usize) -> std::io::Result<Vec<tokio::net::TcpListener>> {
    let first = bind(addr)?;
    let mut all = Vec::with_capacity(n.max(1));
    for _ in 1..n {
        all.push(duplicate(&first)?);
    }
    all.insert(0, first);
    Ok(all)
}

#[cfg(unix)]
fn duplicate(l: &tokio::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    use std::os::fd::AsFd;
    let std = std::net::TcpListener::from(l.as_fd().try_clone_to_owned()?);
    std.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(std)
}

#[cfg(not(unix))]
fn duplicate(_: &tokio::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "several serving threads on one listener need Unix descriptors",
    ))
}

/// Raises the soft limit of open descriptors to the hard limit (often 1,024 soft against
/// 524,288 hard): a server with more connections than the soft limit fails its accepts.
/// Returns the soft limit now in force, when it could be read.
#[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
                return None;
            }
            if l.rlim_cur < l.rlim_max {
                let want = libc::rlimit {
                    rlim_cur: l.rlim_max,
                    rlim_max: l.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                    l = want;
                }
            }
        }
        Some(l.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    None
}

/// Descriptors the table is grown to hold by [`reserve_fd_table`] (or the soft limit, when
/// lower): a proxy with 32,000 connections in (and as many upstream) before it grows again.
pub const FD_TABLE_RESERVE: u64 = 1 << 16;

/// Grows the process's descriptor table to hold `want` descriptors (at most the soft limit),
/// once, while the process has one thread. Returns the size it now holds at least.
///
/// Linux grows a process's table by doubling it when a new descriptor does not fit, and in a
/// process of more than one thread each growth waits for an RCU grace period
/// (`expand_fdtable` calls `synchronize_rcu`), milliseconds on a busy machine, with every
/// other thread's `accept`/`socket`/`open` waiting behind it. A connection burst through a
/// multi-threaded proxy crosses 256, 512 and 1,024 descriptors within milliseconds: in a burst
/// of 500 connections through capture, its two serving threads sat in `synchronize_rcu` under
/// `alloc_fd` (from `accept4` and from the upstream's `socket`) for 17 and 27 ms, and every
/// accept behind them waited (perf sched timehist; the request path took 14–25 ms against
/// nginx's 1–5 ms, whose workers are single-threaded processes and never wait). The table
/// never shrinks, so growing it once at start, before any other thread exists, takes every
/// such wait off the request path. The cost: 8 bytes a slot (512 KiB for 65,536).
pub fn reserve_fd_table(want: u64) -> Option<u64> {
    #[cfg(unix)]
    {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid pointer to a local rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
            return None;
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
        let slots = want.min(l.rlim_cur as u64).min(i32::MAX as u64);
        if slots < 2 {
            return None;
        }
        let probe = std::fs::File::open("/dev/null").ok()?;
        use std::os::fd::AsRawFd;
        // SAFETY: F_DUPFD_CLOEXEC of a descriptor we own onto the lowest free number at or
        // above `slots - 1` (free: nothing opens that high this early); closed right after.
        let high = unsafe {
            libc::fcntl(
                probe.as_raw_fd(),
                libc::F_DUPFD_CLOEXEC,
                (slots - 1) as libc::c_int,
            )
        };
        if high < 0 {
            return None;
        }
        // SAFETY: `high` was just returned to us by fcntl and nothing else holds it.
        unsafe { libc::close(high) };
        Some(slots)
    }
    #[cfg(not(unix))]
    {
        let _ = want;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While nobody accepts, the kernel completes the handshakes of a burst into the listen
    /// queue: 600 clients connect at once and every one is connected at once (with std's
    /// backlog of 128, the 130th and later waited a second for their SYN's retry).
    #[tokio::test]
    async fn a_burst_of_600_connects_completes_without_accepting() {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let threads: Vec<_> = (0..600)
            .map(|_| {
                std::thread::spawn(move || {
                    std::net::TcpStream::connect_timeout(
                        &addr,
                        std::time::Duration::from_millis(700),
                    )
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let failed = results.iter().filter(|r| r.is_err()).count();
        assert_eq!(
            failed, 0,
            "{failed} of 600 connects did not complete in 700 ms"
        );
        drop(l);
    }

    /// Every handle of a group accepts from the one port: 64 connections, each accepted
    /// exactly once, by either handle.
    #[tokio::test]
    async fn a_group_shares_one_port_and_each_listener_gets_connections() {
        let group = bind_group("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = group[0].local_addr().unwrap();
        assert_eq!(group[1].local_addr().unwrap(), addr);
        let clients: Vec<_> = (0..64)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut counts = [0usize; 2];
        loop {
            let mut got = false;
            for (i, l) in group.iter().enumerate() {
                let a = tokio::time::timeout(std::time::Duration::from_millis(50), l.accept());
                if let Ok(Ok(_)) = a.await {
                    counts[i] += 1;
                    got = true;
                }
            }
            if !got {
                break;
            }
        }
        assert_eq!(
            counts.iter().sum::<usize>(),
            64,
            "accepted per listener: {counts:?}"
        );
        assert!(
            counts.iter().all(|&c| c > 0),
            "accepted per listener: {counts:?}"
        );
        drop(clients);
    }

    /// No group sets SO_REUSEPORT: a second server on its port fails to bind rather than
    /// silently taking part of its connections, whatever the number of serving threads
    /// (the first version of the group used SO_REUSEPORT, and a second `bind_group(addr, 2)`
    /// succeeded).
    #[tokio::test]
    async fn a_group_keeps_its_port_to_itself() {
        for n in [1, 2, 4] {
            let group = bind_group("127.0.0.1:0".parse().unwrap(), n).unwrap();
            assert_eq!(group.len(), n);
            let addr = group[0].local_addr().unwrap();
            assert!(bind_group(addr, 2).is_err(), "{n}: a second group bound");
            assert!(bind(addr).is_err(), "{n}: a second listener bound");
            assert!(
                socket_with_reuseport(addr).is_none(),
                "{n}: a SO_REUSEPORT socket joined the port"
            );
        }
    }

    /// A socket with SO_REUSEPORT bound to `addr`, as another process could try.
    fn socket_with_reuseport(addr: SocketAddr) -> Option<tokio::net::TcpListener> {
        let s = tokio::net::TcpSocket::new_v4().ok()?;
        s.set_reuseaddr(true).ok()?;
        #[cfg(unix)]
        s.set_reuseport(true).ok()?;
        s.bind(addr).ok()?;
        s.listen(16).ok()
    }

    fn fd_table_size() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("FDSize in /proc/self/status")
    }

    #[test]
    fn the_fd_table_is_grown_once_and_the_probe_closed() {
        let soft = raise_fd_limit().expect("getrlimit");
        let want = soft.min(8192);
        let got = reserve_fd_table(want).expect("reserved");
        assert_eq!(got, want);
        assert!(fd_table_size() >= want, "FDSize {}", fd_table_size());
        // SAFETY: F_GETFD only asks about a descriptor number.
        let probe = unsafe { libc::fcntl((want - 1) as libc::c_int, libc::F_GETFD) };
        assert_eq!(probe, -1, "descriptor {} left open", want - 1);
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
    fn the_fd_limit_is_raised_to_the_hard_limit() {
        let now = raise_fd_limit().expect("getrlimit");
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
        assert_eq!((now, l.rlim_cur), (l.rlim_max as u64, l.rlim_max));
    }
}
