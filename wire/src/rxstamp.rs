//! Kernel receive timestamps of socket reads, for the two programs that time bytes on the
//! wire: replay's client (when each chunk arrived) and the sim's ground-truth server (when
//! each request arrived). On Linux a socket with `SO_TIMESTAMPNS` on reports, with every
//! `recvmsg`, the CLOCK_REALTIME time its (last) segment was received; elsewhere reads
//! carry no stamp and callers use the time of the read.

use std::time::Instant;

use crate::clock::epoch_ns;

/// Asks the kernel to stamp every read of `fd` (`SO_TIMESTAMPNS`). No-op elsewhere than
/// Linux.
#[cfg(unix)]
pub fn enable(fd: std::os::fd::RawFd) {
    #[cfg(target_os = "linux")]
    {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with a valid int option; a bad descriptor only makes it fail.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = fd;
}

/// One `recvmsg` into `buf` with `flags` (e.g. `libc::MSG_DONTWAIT`): the bytes read and
/// the kernel's receive stamp of them, ns since the epoch (0 when the kernel gave none).
#[cfg(target_os = "linux")]
pub fn recv(
    fd: std::os::fd::RawFd,
    buf: &mut [std::mem::MaybeUninit<u8>],
    flags: libc::c_int,
) -> std::io::Result<(usize, i64)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    let mut stamp = 0;
    // SAFETY: every pointer in the msghdr refers to a live local buffer of the length
    // given; recvmsg writes only within those lengths (the data buffer may be
    // uninitialized: recvmsg only writes to it).
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = libc::recvmsg(fd, &mut msg, flags);
        if n > 0 {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    stamp = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        n
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((n as usize, stamp))
}

/// The monotonic and the wall clock (ns since the epoch) read at one instant, to convert a
/// kernel stamp to an `Instant`: the wall clock is read before and after the monotonic one,
/// and the pair is read again when the thread was preempted in between (over 20 µs apart),
/// which would otherwise shift a converted stamp by the whole preemption.
pub fn clock_pair() -> (Instant, i64) {
    let mut best = None;
    for _ in 0..8 {
        let a = epoch_ns();
        let mono = Instant::now();
        let b = epoch_ns();
        let pair = (mono, a + (b - a) / 2, b - a);
        if pair.2 <= 20_000 {
            return (pair.0, pair.1);
        }
        if best.is_none_or(|(_, _, w)| pair.2 < w) {
            best = Some(pair);
        }
    }
    best.map_or_else(|| (Instant::now(), epoch_ns()), |(m, r, _)| (m, r))
}

/// Tests: the kernel turns receive stamping on for the whole system through deferred work
/// when a first socket asks for it, and until that work has run (under load, tens of ms) a
/// read is stamped with its own time. Returns a stamping socket to hold open (stamping stays
/// on while one exists) once a datagram that waited 20 ms reads as having waited.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn kernel_stamps_on() -> std::net::UdpSocket {
    use std::os::fd::AsRawFd;
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    enable(rx.as_raw_fd());
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4];
    for _ in 0..100 {
        tx.send_to(b"x", rx.local_addr().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (_, stamp) = recv(rx.as_raw_fd(), &mut buf, 0).unwrap();
        if stamp != 0 && epoch_ns() - stamp >= 15_000_000 {
            return rx;
        }
    }
    panic!("the kernel never stamped a receive at its arrival");
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_read_carries_the_kernel_stamp_of_its_bytes() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let _on = kernel_stamps_on();
        enable(rx.as_raw_fd());
        let before = epoch_ns();
        tx.write_all(b"hello").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 16];
        let (n, stamp) = recv(rx.as_raw_fd(), &mut buf, 0).unwrap();
        let after = epoch_ns();
        assert_eq!(n, 5);
        // Stamped at arrival, not at the read 20 ms later.
        assert!(
            stamp >= before - 1_000_000 && stamp < after - 10_000_000,
            "{before} {stamp} {after}"
        );
        // Without SO_TIMESTAMPNS: no stamp.
        let mut tx2 = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx2, _) = l.accept().unwrap();
        tx2.write_all(b"x").unwrap();
        assert_eq!(recv(rx2.as_raw_fd(), &mut buf, 0).unwrap(), (1, 0));
    }

    #[test]
    fn the_clock_pair_agrees_with_the_wall_clock() {
        let (mono, rt) = clock_pair();
        let now = epoch_ns();
        let carried = rt + mono.elapsed().as_nanos() as i64;
        assert!((now - carried).abs() < 5_000_000, "{now} {carried}");
    }
}
