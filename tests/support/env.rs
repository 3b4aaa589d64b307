//! What every end-to-end test needs around the binary: a fresh directory, a free loopback
//! port, and a lock that runs the timing-sensitive tests of one file one at a time.
#![allow(dead_code)]

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

/// A loopback address no one listens on (the port the kernel handed out, released).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Tests that start processes which measure time hold this: one test's CPU burst stays out of
/// another's timing on a 2-core machine (a poisoned lock is still a lock).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
