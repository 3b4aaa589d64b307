//! What every end-to-end test needs around the binary: a fresh directory, a free loopback
//! port, and [`serial`], which runs a timing-sensitive test alone although every module's
//! tests run in one process.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static DIRS: AtomicUsize = AtomicUsize::new(0);

/// A path under the temp dir, unique to this process and call, with nothing at it (removed if
/// a previous run left it): for a directory the tool itself must create.
pub fn fresh_path(name: &str) -> PathBuf {
    share();
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
/// Taken outside the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by
/// default), never from it: a port the kernel hands out for `bind(0)` and the test releases
/// goes back to the pool every outgoing connection draws its local port from, so a client of
/// a test running beside it could hold it by the time the process binds ("cannot bind
/// 127.0.0.1:35265: Address already in use", seen in CI). Ports outside the range are never
/// handed out by the kernel. The range is read, not assumed: a machine whose range starts
/// low (`1024 65535`, `10000 65535`) once made the fallback below 32768 ephemeral too
/// ("cannot bind 127.0.0.1:18630", seen in CI), so the larger gap outside it is used, and
/// each call tries the next port of it (from an offset by process id, so two test processes
/// rarely meet) until one binds.
pub fn free_addr() -> SocketAddr {
    share();
    let (first, end) = port_gap(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .as_deref(),
    );
    let span = end - first;
    let start = std::process::id() as usize * 97;
    for _ in 0..span {
        let port = first + (start + PORTS.fetch_add(1, Ordering::Relaxed)) % span;
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port in {first}..{end}");
}

/// The ports `first..end` outside the ephemeral range `range` (`/proc`'s "low\thigh"): the
/// larger of the gaps below and above it. Below it, from 10000 (ports under it are the
/// well-known services' on many machines) unless the range starts under 11000, then from
/// 1024. When neither gap is 1,000 ports wide (or the range cannot be read), 10000..32768,
/// below Linux's default range.
fn port_gap(range: Option<&str>) -> (usize, usize) {
    const FIRST: usize = 10_000;
    const FALLBACK: (usize, usize) = (FIRST, 32_768);
    let Some((low, high)) = range.and_then(|r| {
        let mut it = r.split_whitespace().map(|n| n.parse::<usize>().ok());
        Some((it.next()??, it.next()??))
    }) else {
        return FALLBACK;
    };
    let below = if low >= FIRST + 1_000 {
        (FIRST, low)
    } else {
        (1_024, low.max(1_024))
    };
    let above = ((high + 1).max(1_024), 65_536);
    let width = |(a, b): (usize, usize)| b.saturating_sub(a);
    let best = if width(below) >= width(above) {
        below
    } else {
        above
    };
    if width(best) >= 1_000 {
        best
    } else {
        FALLBACK
    }
}

#[test]
fn ports_are_taken_outside_the_ephemeral_range_whatever_it_is() {
    assert_eq!(port_gap(Some("32768\t60999\n")), (10_000, 32_768));
    assert_eq!(port_gap(Some("10000 65535")), (1_024, 10_000));
    assert_eq!(port_gap(Some("1024\t50000")), (50_001, 65_536));
    assert_eq!(port_gap(Some("40000 65535")), (10_000, 40_000));
    assert_eq!(port_gap(Some("1024 65535")), (10_000, 32_768));
    assert_eq!(port_gap(None), (10_000, 32_768));
    assert_eq!(port_gap(Some("junk")), (10_000, 32_768));
}

/// Held exclusively by a test in [`serial`], shared by every other test from its first
/// [`fresh_path`], [`tmpdir`] or [`free_addr`] (that is, before it starts anything) to its end.
static ALONE: RwLock<()> = RwLock::new(());

thread_local! {
    /// This test thread's shared hold of [`ALONE`], dropped when the thread ends: libtest runs
    /// each test on a thread of its own, named after the test (`module::name`).
    static SHARED: RefCell<Option<RwLockReadGuard<'static, ()>>> = const { RefCell::new(None) };
    /// This thread holds [`ALONE`] exclusively.
    static EXCLUSIVE: Cell<bool> = const { Cell::new(false) };
}

/// Takes this test's shared hold of [`ALONE`] unless it has one (or the exclusive one): it waits
/// while a [`serial`] test runs. Only on a test's own thread (named `module::name`): a thread the
/// test started (a server, a tokio worker) holds nothing, so it never waits for a serial test
/// that is waiting for it.
fn share() {
    let test_thread = std::thread::current()
        .name()
        .is_some_and(|n| n.contains("::"));
    if !test_thread || EXCLUSIVE.get() {
        return;
    }
    SHARED.with(|h| {
        h.borrow_mut()
            .get_or_insert_with(|| ALONE.read().unwrap_or_else(|e| e.into_inner()));
    });
}

/// A test that measures time (or starts processes that do) holds this from its first line: it
/// runs alone, on a 2-core machine, as when each file was a test binary of its own. It waits
/// for the tests running to end, and the others wait for it before they start anything (see
/// [`share`]; a test that uses none of this module's helpers may still run beside it).
pub fn serial() -> Serial {
    SHARED.with(|h| h.borrow_mut().take());
    let guard = ALONE.write().unwrap_or_else(|e| e.into_inner());
    EXCLUSIVE.set(true);
    Serial { _alone: guard }
}

/// The exclusive hold of [`serial`].
pub struct Serial {
    _alone: RwLockWriteGuard<'static, ()>,
}

impl Drop for Serial {
    fn drop(&mut self) {
        EXCLUSIVE.set(false);
    }
}
