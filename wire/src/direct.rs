//! A connect that does not wait for the reactor when the kernel has already done it.
//!
//! tokio learns that a socket is ready only from the reactor. A connection it accepts is
//! assumed readable and writable, so its first read and write try the socket at once; but a
//! connect waits for the reactor's word that the socket is writable, even when the kernel
//! completed the handshake inside `connect(2)` (on loopback it runs in the call), and a
//! stream made from a `std` socket starts with no readiness at all. On a single-threaded
//! runtime in a connection burst that word comes only after every other ready task has run
//! (or 61 of them): each request waited a whole turn of the burst between its head read
//! and its write upstream, breadth-first. 500 clients at once through capture spent 12 ms
//! p50 between their send and capture's write upstream, against 1.4 ms through nginx,
//! which connects, writes at once, and waits only on `EINPROGRESS` and `EAGAIN`.
//!
//! So, as nginx does, [`connect`] asks the kernel (`poll(2)`, no wait) whether the connect
//! is done before it waits for the reactor, and `Writes` sends a new connection's writes
//! with direct non-blocking calls until one would block, and through the reactor from then
//! on (which has by then seen the socket, so tokio's readiness is right again: a direct call
//! never leaves it claiming more than the socket has).

use std::io;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// A TCP connection to the first of `addrs` that accepts one (the error of the last
/// otherwise). A connect the kernel completes at once returns without a reactor turn.
pub async fn connect(addrs: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = None;
    for &a in addrs {
        match connect_one(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")))
}

#[cfg(target_os = "linux")]
async fn connect_one(addr: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::AsRawFd;
    // socket2 adds SOCK_CLOEXEC.
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    let mut pending = false;
    if let Err(e) = socket.connect(&addr.into()) {
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        let mut p = libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one live pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        pending = n != 1 || p.revents == 0;
    }
    let tcp = TcpStream::from_std(socket.into())?;
    if pending {
        tcp.writable().await?;
    }
    if let Some(e) = tcp.take_error()? {
        return Err(e);
    }
    Ok(tcp)
}

#[cfg(not(target_os = "linux"))]
async fn connect_one(addr: SocketAddr) -> io::Result<TcpStream> {
    TcpStream::connect(addr).await
}

/// One direct non-blocking `send` of `b`.
#[cfg(target_os = "linux")]
fn send(fd: i32, b: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: send reads `b.len()` bytes of a live buffer.
        let n = unsafe {
            libc::send(
                fd,
                b.as_ptr().cast(),
                b.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether a connection's writes still go straight to the socket (see the module).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writes {
    direct: bool,
}

impl Writes {
    /// A new connection's: direct (on Linux).
    pub(crate) const NEW: Writes = Writes {
        direct: cfg!(target_os = "linux"),
    };

    /// A direct write while writes are still direct: `None` when they no longer are (this
    /// one would have blocked), so the caller writes through the reactor.
    #[cfg(target_os = "linux")]
    pub(crate) fn write(&mut self, fd: i32, b: &[u8]) -> Option<io::Result<usize>> {
        if !self.direct {
            return None;
        }
        match send(fd, b) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.direct = false;
                None
            }
            r => Some(r),
        }
    }

    /// Writes still go straight to the socket.
    #[cfg(test)]
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    /// One poll of `f`, with a waker that does nothing: what a task gets before the reactor
    /// has had a turn.
    fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_loopback_connect_completes_on_the_first_poll() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let mut tokio_connect = Box::pin(TcpStream::connect(a));
        assert!(
            poll_once(&mut tokio_connect).is_pending(),
            "tokio waits a turn"
        );
        let addrs = [a];
        let mut ours = Box::pin(connect(&addrs));
        match poll_once(&mut ours) {
            Poll::Ready(Ok(s)) => assert_eq!(s.peer_addr().unwrap(), a),
            other => panic!("first poll: {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_connect_is_an_error_and_the_next_address_is_tried() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = connect(&[closed]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = connect(&[closed, open.local_addr().unwrap()])
            .await
            .unwrap();
        assert_eq!(s.peer_addr().unwrap(), open.local_addr().unwrap());
        let e = connect(&[]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
