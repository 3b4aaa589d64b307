//! The client's own timing error, measured while the run goes (issue 53): what the run's
//! validity stamp (`results::validity`) judges.
//!
//! A stream reader timestamps a chunk when its task is polled, not when the bytes arrived:
//! every delay between a wake-up and the poll (a worker thread the OS runs late, a runtime
//! busy with other tasks) is added to the TTFT or chunk gap it measures. The [`Probe`]
//! measures that delay directly, as the run goes: a thread of its own (`llmreplay-probe`,
//! fine timer slack, like the pacer) wakes at a deadline every [`PERIOD`], notes how late it
//! woke (the OS's scheduling delay of the client's threads, what makes the pacer late), and
//! wakes a task on the client runtime, which notes how long after the deadline it was polled:
//! what a reader waits between its socket's event and its poll, the OS's delay of a woken
//! thread and the runtime's hop both in it. Both go into bounded [`Quantiles`].
//!
//! Why the deadline and not the hop alone: on a core shared with a CPU hog, a thread woken
//! by a timer or a socket waits for the hog's slice (8 ms p99 measured, bench/validity.sh),
//! while the hop from the running probe thread to a worker is fast (0.14 ms p99, the woken
//! worker preempting the hog): the hop alone read a starved client as on time.
//! Beside them, the host: the CPU steal over the run (`/proc/stat`) and the CPU frequency
//! governors (`/sys/devices/system/cpu/*/cpufreq/scaling_governor`), Linux only (absent
//! elsewhere: not measured).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use trace_format::quantiles::Quantiles;
use trace_format::stats::Summary;

/// How often the probe wakes.
pub const PERIOD: Duration = Duration::from_millis(2);

/// Percentiles the probe's summaries report.
const PERCENTILES: [f64; 3] = [50.0, 99.0, 99.9];

/// What the probe measured over a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientTiming {
    /// How long after its deadline a task on the client runtime was polled, ms (the probe
    /// thread's wake and the runtime's hop): the delay a stream reader adds to each time it
    /// takes.
    pub reader_lateness: Summary,
    /// How late the probe's thread woke against its deadline, ms: the OS's scheduling delay
    /// of the client's threads (the pacer's among them).
    pub thread_lateness: Summary,
    /// CPU steal over the run, as a share of the host's CPU time (0–1); None where
    /// `/proc/stat` cannot be read.
    pub steal: Option<f64>,
    /// The CPU frequency governors in use (each once, sorted); empty where not readable.
    pub governors: Vec<String>,
}

/// The probe of a run: started with the clock, finished with the run.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Quantiles>>,
    task: tokio::task::JoinHandle<Quantiles>,
    cpu0: Option<CpuTimes>,
}

impl Probe {
    /// Starts probing the runtime of `handle`. None when the probe's thread cannot start
    /// (the run goes on, its timing not measured).
    pub fn start(handle: &tokio::runtime::Handle) -> Option<Probe> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("llmreplay-probe".into())
            .spawn(move || {
                wire::clock::fine_timer_slack();
                let mut late = Quantiles::new();
                let mut next = Instant::now() + PERIOD;
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    let woke = Instant::now();
                    late.add(ms(woke.saturating_duration_since(next)));
                    if tx.send(next).is_err() {
                        break;
                    }
                    // Deadlines on a grid, except after a wake later than a period: the next
                    // is a period after it (a starved thread is not asked to catch up).
                    next += PERIOD;
                    if next <= woke {
                        next = woke + PERIOD;
                    }
                }
                late
            })
            .ok()?;
        let task = handle.spawn(async move {
            let mut q = Quantiles::new();
            while let Some(deadline) = rx.recv().await {
                q.add(ms(deadline.elapsed()));
            }
            q
        });
        Some(Probe {
            stop,
            thread: Some(thread),
            task,
            cpu0: CpuTimes::read(),
        })
    }

    /// Stops the probe and returns what it measured (`rt`: the runtime it probed).
    pub fn finish(mut self, rt: &tokio::runtime::Runtime) -> ClientTiming {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        // The thread's sender is gone: the task ends once it took what was sent.
        let reader = rt.block_on(&mut self.task).unwrap_or_default();
        ClientTiming {
            reader_lateness: Summary::from_quantiles(&reader, &PERCENTILES),
            thread_lateness: Summary::from_quantiles(&thread, &PERCENTILES),
            steal: self
                .cpu0
                .zip(CpuTimes::read())
                .and_then(|(a, b)| b.steal_since(&a)),
            governors: governors(),
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The host's CPU time from `/proc/stat`'s `cpu` line, in ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuTimes {
    /// user + nice + system + idle + iowait + irq + softirq + steal.
    total: u64,
    steal: u64,
}

impl CpuTimes {
    fn read() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The `cpu` line of `/proc/stat`'s text: `cpu user nice system idle iowait irq softirq
    /// steal guest guest_nice` (guest time is counted in user already).
    fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        (v.len() == 8).then(|| CpuTimes {
            total: v.iter().sum(),
            steal: v[7],
        })
    }

    /// The share of the CPU time since `earlier` that was stolen; None when no time passed.
    fn steal_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        (total > 0).then(|| steal as f64 / total as f64)
    }
}

/// The CPU frequency governors of this host's CPUs, each once.
fn governors() -> Vec<String> {
    let mut g: Vec<String> = std::fs::read_dir("/sys/devices/system/cpu")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("cpu") && n[3..].parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("cpufreq/scaling_governor")).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    g.sort();
    g.dedup();
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A runtime whose only worker is kept busy reads its readers late by as much: the
    /// probe's wakes wait for the worker (here 3 × 40 ms of blocking), and the lateness it
    /// reports covers them.
    #[test]
    fn a_blocked_runtime_reads_late() {
        let rt = runtime();
        let probe = Probe::start(rt.handle()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..3 {
            rt.block_on(async {
                tokio::spawn(async { std::thread::sleep(Duration::from_millis(40)) })
                    .await
                    .unwrap()
            });
            std::thread::sleep(Duration::from_millis(10));
        }
        let t = probe.finish(&rt);
        assert!(t.reader_lateness.count >= 10, "{t:?}");
        assert!(t.reader_lateness.max >= 30.0, "{t:?}");
        // The probe's own thread was not held up: what it saw late was the runtime.
        assert!(t.reader_lateness.max > t.thread_lateness.max, "{t:?}");
    }

    /// An idle runtime answers its probe well within the blocked one's lateness, and the
    /// probe stops when asked (no hang on finish).
    #[test]
    fn an_idle_runtime_reads_on_time() {
        let rt = runtime();
        let probe = Probe::start(rt.handle()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let t = probe.finish(&rt);
        assert!(t.reader_lateness.count >= 10, "{t:?}");
        assert!(t.reader_lateness.median < 30.0, "{t:?}");
    }

    #[test]
    fn steal_is_read_from_proc_stat() {
        let a =
            CpuTimes::parse("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n").unwrap();
        assert_eq!(
            a,
            CpuTimes {
                total: 1000,
                steal: 40
            }
        );
        let b = CpuTimes::parse("cpu  200 0 100 1500 20 0 0 180 0 0\n").unwrap();
        // 140 of the 1,000 ticks between them were stolen.
        assert_eq!(b.steal_since(&a), Some(0.14));
        assert_eq!(a.steal_since(&a), None);
        assert_eq!(CpuTimes::parse("intr 1 2 3\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 x\n"), None);
    }
}
