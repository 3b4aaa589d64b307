//! The threads that serve client connections. With one (the default of [`crate::start`]),
//! the proxy serves on the caller's tokio runtime. With `threads > 1`, as nginx's workers:
//! every thread has its own single-threaded runtime and its own handle of the one listening
//! socket ([`wire::listen::bind_group`]), accepts its own connections and serves each
//! to its end, and reaches the upstream through its own connection pool, so no task, socket
//! or pooled connection moves between threads, and a forwarded event wakes no other thread
//! (a work-stealing runtime moves tasks between its workers: futex wake-ups and context
//! switches on every hand-over).

use std::cell::Cell;
use std::future::Future;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The serving thread this code runs on: 0 for the caller's runtime (and anything not on a
/// serving thread), 1.. for the threads [`spawn`] starts.
pub(crate) fn index() -> usize {
    INDEX.with(Cell::get)
}

/// The nice value of the proxy's threads that record rather than serve (the prompt runners,
/// the trace writer): in a burst the kernel gives the serving threads the CPU first, and
/// these still get about a tenth of a contended core (CFS weights 110 against 1,024), so they
/// are never starved; the writer's queue absorbs what they defer.
pub(crate) const BACKGROUND_NICE: i64 = 10;

/// Lowers the calling thread's CPU priority to [`BACKGROUND_NICE`] (on Linux, where a
/// thread's nice value is its own; elsewhere nothing). A failure leaves it as it was.
pub(crate) fn background() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority takes plain integers; `who` 0 is the calling thread on Linux.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, BACKGROUND_NICE as libc::c_int);
    }
}

/// Starts serving thread `i` (named `capture-serve-<i>`): faults in `warm_heap` bytes of its
/// heap ([`crate::heap`]), then a single-threaded runtime runs `work` to its end and drops
/// whatever tasks are left.
pub(crate) fn spawn<F, Fut>(
    i: usize,
    warm_heap: usize,
    work: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("capture-serve-{i}"))
        .spawn(move || {
            INDEX.with(|c| c.set(i));
            if warm_heap > 0 {
                crate::heap::warm(warm_heap);
            }
            rt.block_on(work());
        })
}
