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
    bind_one(addr, false)
}

fn bind_one(addr: SocketAddr, reuseport: bool) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(not(windows))]
    socket.set_reuseaddr(true)?;
    #[cfg(all(unix, not(target_os = "solaris"), not(target_os = "illumos")))]
    if reuseport {
        socket.set_reuseport(true)?;
    }
    #[cfg(not(all(unix, not(target_os = "solaris"), not(target_os = "illumos"))))]
    if reuseport {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "several listeners on one port need SO_REUSEPORT",
        ));
    }
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// `n` listening sockets on one address (as [`bind`] each), for `n` threads that each
/// accept and serve their own connections, as nginx's workers with `reuseport`: with
/// `n > 1` they share the port by `SO_REUSEPORT`, and the kernel spreads new connections
/// over them by a hash of the client's address and port, so no thread hands a connection to
/// another. Port 0 picks one port for all. `n == 1` (or 0) is [`bind`]: no `SO_REUSEPORT`,
/// so a second server on the port fails to bind instead of sharing its connections.
///
/// Each socket has its own listen queue, and a connection waits in the queue of the socket
/// the kernel chose even when another thread is idle.
pub fn bind_group(addr: SocketAddr, n: usize) -> std::io::Result<Vec<tokio::net::TcpListener>> {
    if n <= 1 {
        return Ok(vec![bind(addr)?]);
    }
    let first = bind_one(addr, true)?;
    let addr = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..n {
        all.push(bind_one(addr, true)?);
    }
    Ok(all)
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

    /// Every listener of a group accepts on the one port: 64 connections from different
    /// client ports are spread by the kernel over both (the chance one gets none is 2^-63),
    /// and each is accepted exactly once.
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

    /// A lone listener does not set SO_REUSEPORT: a second server on its port fails to bind
    /// rather than silently taking part of its connections.
    #[tokio::test]
    async fn a_group_of_one_keeps_its_port_to_itself() {
        let one = bind_group("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let addr = one[0].local_addr().unwrap();
        assert!(bind_group(addr, 2).is_err());
        assert!(bind(addr).is_err());
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
