//! CPU time of the client's own threads, from /proc (Linux), so a run can tell a saturated
//! client apart from a slow server even when an in-process sim shares the process.

use std::time::Duration;

/// CPU time (user + system) of this process's threads whose name starts with `prefix`.
/// None where /proc is not available.
pub fn threads_cpu(prefix: &str) -> Option<Duration> {
    let tick = clock_ticks()?;
    let mut total: u64 = 0;
    let dir = std::fs::read_dir("/proc/self/task").ok()?;
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ... ; comm may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // After the comm: state is field 3; utime and stime are fields 14 and 15.
        let utime: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
        let stime: u64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        total += utime + stime;
    }
    Some(Duration::from_secs_f64(total as f64 / tick as f64))
}

fn clock_ticks() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (t > 0).then_some(t as u64)
}

/// Number of CPUs this process may use.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_busy_named_thread() {
        let h = std::thread::Builder::new()
            .name("cputest-busy".into())
            .spawn(|| {
                // Spin until this thread has had 120 ms of CPU by its own clock (a busy
                // machine may give it less than that in 120 ms of wall time), at most 20 s.
                let own = || {
                    let mut ts = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    // SAFETY: ts is a valid timespec to write into.
                    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
                };
                let t = std::time::Instant::now();
                let mut x = 0u64;
                while own() < Duration::from_millis(120) && t.elapsed() < Duration::from_secs(20) {
                    x = x.wrapping_add(1);
                    std::hint::black_box(x);
                }
                threads_cpu("cputest-busy").unwrap()
            })
            .unwrap();
        let used = h.join().unwrap();
        assert!(used >= Duration::from_millis(50), "{used:?}");
        assert_eq!(threads_cpu("no-such-thread-name"), Some(Duration::ZERO));
    }
}
