//! Memory for a connection burst, faulted in before the burst.
//!
//! A connection through capture holds about 40 KiB of heap while its request is on the way
//! (hyper's buffers, the request, its record, the upstream connection's buffer): 500
//! connections at once took capture's RSS from 12 to 33 MiB. On a cold process every one of
//! those pages was a page fault (and glibc grows a thread's arena one page and one
//! `mprotect` at a time), on the request path of the burst: page faults were 18% of
//! capture's CPU while it accepted a 500-connection burst, and `malloc` growing its arenas
//! another 10%, on a 2-core machine where that CPU is taken from the server and the clients.
//!
//! So each serving thread faults in [`WARM_BYTES`] of its own arena when it starts (and makes
//! [`RESERVE_BYTES`] more of it writable without touching it), and
//! glibc is asked to keep up to [`KEEP_FREE`] of freed memory per arena (its default trims
//! anything over 128 KiB back to the kernel, so the warmed pages would be returned at once,
//! and after every burst). The cost is that resident memory: about 16 MiB per serving
//! thread from the start, and after a burst what it took, up to 64 MiB per thread.

/// Heap faulted in per serving thread at its start.
pub(crate) const WARM_BYTES: usize = 16 << 20;

/// Arena made writable per serving thread beyond [`WARM_BYTES`], without touching it.
///
/// glibc grows a thread's arena (not the main one) to exactly what each allocation past
/// its end needs, one `mprotect` each, and in a multi-threaded process every `mprotect`
/// takes the address space's lock for writing, with the other threads' page faults
/// waiting. A burst of 1,000 connections (about 20 MiB a serving thread) went past the
/// warmed 16 MiB and made 1,142 `mprotect` calls from `grow_heap`, about one a request.
/// Writable address space costs no memory until it is touched; 16 + 40 MiB stays within
/// the 64 MiB of one arena heap.
pub(crate) const RESERVE_BYTES: usize = 40 << 20;

/// Free memory glibc keeps per arena rather than returning it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP_FREE: usize = 64 << 20;

/// Asks glibc to keep freed memory (once per process).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes glibc's malloc parameters. Setting the trim
            // threshold also stops glibc's dynamic adjustment of it and of the mmap
            // threshold, which stays at its default (128 KiB): large buffers are still
            // mapped and unmapped on their own, never kept.
            unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_FREE as libc::c_int) };
        });
    }
}

/// Faults in `bytes` of the calling thread's malloc arena and frees them, so that the
/// connections this thread serves next allocate from pages already there.
pub(crate) fn warm(bytes: usize) {
    keep_freed_memory();
    // Below glibc's mmap threshold, so the blocks come from the thread's arena.
    const BLOCK: usize = 32 * 1024;
    const PAGE: usize = 4096;
    let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(bytes / BLOCK);
    for _ in 0..bytes / BLOCK {
        let mut b = Vec::<u8>::with_capacity(BLOCK);
        let p = b.as_mut_ptr();
        for off in (0..BLOCK).step_by(PAGE) {
            // SAFETY: `off` is within the block's capacity; a volatile write so the touch
            // is not optimized away (calloc-like zeroing could skip fresh pages).
            unsafe { p.add(off).write_volatile(0) };
        }
        blocks.push(b);
    }
    // Address space made writable but not touched: no resident memory (only the headers
    // malloc writes, a page in 28), and no `mprotect` per page past the warmed memory.
    const WIDE: usize = 112 * 1024;
    let spare: Vec<Vec<u8>> = (0..RESERVE_BYTES / WIDE)
        .map(|_| Vec::<u8>::with_capacity(WIDE))
        .collect();
    drop(spare);
    drop(blocks);
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Minor page faults of the calling thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage fills the struct.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
        u.ru_minflt
    }

    /// Set for the child process of `a_warmed_thread_takes_a_burst_without_page_faults`.
    const FAULTS_CHILD: &str = "LLMREPLAY_HEAP_FAULTS_CHILD";

    /// The child's half (nothing unless run as the child): a burst's page faults on a fresh
    /// thread (a fresh arena, as a serving thread has), then on a thread that warmed first.
    #[test]
    fn burst_faults_cold_then_warm() {
        if std::env::var_os(FAULTS_CHILD).is_none() {
            return;
        }
        let cold = std::thread::spawn(|| burst(256, 24 * 1024)).join().unwrap();
        let warm = std::thread::spawn(|| {
            warm(WARM_BYTES);
            burst(256, 24 * 1024)
        })
        .join()
        .unwrap();
        println!("faults {cold} {warm}");
    }

    /// Allocates and touches `n` blocks of `size` bytes, like connections arriving, and
    /// returns the page faults that took.
    fn burst(n: usize, size: usize) -> i64 {
        let f0 = minor_faults();
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            let mut v = vec![0u8; size];
            v[size - 1] = i as u8;
            for b in v.iter_mut().step_by(4096) {
                *b = 1;
            }
            held.push(v);
        }
        std::hint::black_box(&held);
        drop(held);
        minor_faults() - f0
    }

    /// The mapping of this process that holds `addr`: its size and resident KiB
    /// (/proc/self/smaps).
    fn mapping_of(addr: usize) -> (usize, u64) {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines();
        while let Some(l) = lines.next() {
            let Some((range, _)) = l.split_once(' ') else {
                continue;
            };
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                continue;
            };
            if (a..b).contains(&addr) {
                let rss = lines
                    .find_map(|l| l.strip_prefix("Rss:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
                    .unwrap();
                return (b - a, rss);
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn a_warmed_arena_is_writable_beyond_what_it_touched() {
        let (size, rss_kib) = std::thread::spawn(|| {
            warm(WARM_BYTES);
            // Past tcache's sizes, so from the thread's own arena.
            let probe = Vec::<u8>::with_capacity(32 * 1024);
            mapping_of(probe.as_ptr() as usize)
        })
        .join()
        .unwrap();
        // The thread's arena heap is writable for the warmed and the reserved bytes (before
        // the reserve: 16 MiB and a few pages, grown by one mprotect a page after that)…
        assert!(
            size >= WARM_BYTES + RESERVE_BYTES - (1 << 20),
            "arena writable for {} KiB",
            size >> 10
        );
        // …but the reserve is not resident (malloc's headers aside; an arena another test's
        // thread used before may hold what that thread touched).
        assert!(
            rss_kib <= ((WARM_BYTES + RESERVE_BYTES / 2) >> 10) as u64,
            "{rss_kib} KiB resident"
        );
    }

    #[test]
    fn a_warmed_thread_takes_a_burst_without_page_faults() {
        // Measured in a process of its own: a new thread takes the arena of a thread that
        // has exited before it gets a fresh one, and among parallel tests that arena may be
        // one another test warmed (the cold burst then faulted too little, about one run
        // in three).
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "runtime::heap::tests::burst_faults_cold_then_warm",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(FAULTS_CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split_once("faults ").map(|(_, f)| f))
            .unwrap_or_else(|| panic!("no figures from the child: {text}"));
        let (cold, warm) = line.split_once(' ').unwrap();
        let (cold, warm): (i64, i64) = (cold.parse().unwrap(), warm.parse().unwrap());
        // 6 MiB touched: ~1,500 faults cold; warmed, only the odd page around the blocks.
        assert!(cold > 1000, "a cold arena faulted only {cold} pages");
        assert!(warm < cold / 10, "warmed: {warm} faults, cold: {cold}");
    }
}
