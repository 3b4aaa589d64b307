//! What every end-to-end test needs around the binary: a fresh directory, a free loopback
//! port, and a lock that runs the timing-sensitive tests one at a time (all modules' tests run
//! in one process).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

static DIRS: AtomicUsize = AtomicUsize::new(0);
static SERIAL: Mutex<()> = Mutex::new(());

/// A path under the temp dir, unique to this process and call, with nothing at it (removed if
/// a previous run left it): for a directory the tool itself must create.
pub fn fresh_path(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "llmreplay-test-{}-{}-{name}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A new, empty directory under the temp dir, unique to this process and call.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = fresh_path(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

static PORTS: AtomicUsize = AtomicUsize::new(0);

/// A loopback address no one listens on, for a process the test starts to bind.
///
/// Taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by
/// default), never from it: a port the kernel hands out for `bind(0)` and the test releases
/// goes back to the pool every outgoing connection draws its local port from, so a client of
/// a test running beside it could hold it by the time the process binds ("cannot bind
/// 127.0.0.1:35265: Address already in use", seen in CI). Ports below the range are never
/// handed out by the kernel; each call tries the next one (from an offset by process id, so
/// two test processes rarely meet) until one binds.
pub fn free_addr() -> SocketAddr {
    const FIRST: usize = 10_000;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<usize>().ok())
        .filter(|&low| low > FIRST + 1_000)
        .unwrap_or(32_768);
    let span = low - FIRST;
    let start = std::process::id() as usize * 97;
    for _ in 0..span {
        let port = FIRST + (start + PORTS.fetch_add(1, Ordering::Relaxed)) % span;
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port in {FIRST}..{low}");
}

/// Tests that start processes which measure time hold this: one test's CPU burst stays out of
/// another's timing on a 2-core machine (a poisoned lock is still a lock).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
