//! Moving a capture's finished files from its local spool directory to an object store,
//! into Hive partitions (see the crate documentation): a store that is down delays files,
//! it never loses them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Error, ObjectLocation};

/// The Hive partition of a trace file, from the UTC start stamp in its name
/// (`capture-20261129T183000Z-000001.parquet` → `date=2026-11-29/hour=18`), or from `now`
/// when the name has none.
pub fn hive_partition(file_name: &str, now: chrono::DateTime<chrono::Utc>) -> String {
    let stamp = file_name.split(['-', '.']).find(|t| {
        let b = t.as_bytes();
        b.len() == 16
            && b[8] == b'T'
            && b[15] == b'Z'
            && b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit)
    });
    match stamp {
        Some(t) => format!(
            "date={}-{}-{}/hour={}",
            &t[0..4],
            &t[4..6],
            &t[6..8],
            &t[9..11]
        ),
        None => now.format("date=%Y-%m-%d/hour=%H").to_string(),
    }
}

/// What a [`SpoolUploader`] did.
#[derive(Debug, Clone, Default)]
pub struct UploadReport {
    /// URLs of the objects written, in order.
    pub uploaded: Vec<String>,
    /// Finished files still in the spool directory (their uploads failed); the next
    /// capture with the same spool directory uploads them.
    pub left: Vec<PathBuf>,
    /// Failed upload attempts.
    pub failures: u64,
    /// The last upload error.
    pub last_error: Option<String>,
}

struct UpState {
    stop: bool,
    report: UploadReport,
}

/// Moves finished `*.parquet` files from a spool directory to an object store, into Hive
/// partitions (see the module documentation), on a thread of its own.
pub struct SpoolUploader {
    shared: Arc<(Mutex<UpState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    dest: ObjectLocation,
    spool: PathBuf,
}

impl std::fmt::Debug for SpoolUploader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpoolUploader")
            .field("dest", &self.dest.url)
            .field("spool", &self.spool)
            .finish()
    }
}

impl SpoolUploader {
    /// Starts uploading: a pass now (files a previous run left) and one every `interval`.
    pub fn spawn(dest: ObjectLocation, spool: PathBuf, interval: Duration) -> SpoolUploader {
        let shared = Arc::new((
            Mutex::new(UpState {
                stop: false,
                report: UploadReport::default(),
            }),
            Condvar::new(),
        ));
        let (s, d, sp) = (shared.clone(), dest.clone(), spool.clone());
        let thread = std::thread::Builder::new()
            .name("llmreplay-upload".into())
            .spawn(move || loop {
                upload_pass(&d, &sp, &s);
                let (lock, cv) = &*s;
                let Ok(guard) = lock.lock() else { return };
                if guard.stop {
                    return;
                }
                let Ok((guard, _)) = cv.wait_timeout(guard, interval) else {
                    return;
                };
                if guard.stop {
                    return;
                }
            })
            .ok();
        SpoolUploader {
            shared,
            thread,
            dest,
            spool,
        }
    }

    /// Stops the periodic passes and uploads what is left (the writer has closed by now),
    /// retrying for up to `patience`. Files that still fail stay in the spool directory
    /// and are listed in [`UploadReport::left`].
    pub fn finish(mut self, patience: Duration) -> UploadReport {
        {
            let (lock, cv) = &*self.shared;
            if let Ok(mut s) = lock.lock() {
                s.stop = true;
            }
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let deadline = Instant::now() + patience;
        let mut delay = Duration::from_millis(200);
        loop {
            upload_pass(&self.dest, &self.spool, &self.shared);
            let left = spooled(&self.spool);
            if left.is_empty() || Instant::now() + delay > deadline {
                let mut report = self
                    .shared
                    .0
                    .lock()
                    .map(|s| s.report.clone())
                    .unwrap_or_default();
                report.left = left;
                return report;
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}

/// Finished trace files waiting in the spool directory, oldest name first.
fn spooled(spool: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(spool)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet") && p.is_file())
        .collect();
    out.sort();
    out
}

fn upload_pass(dest: &ObjectLocation, spool: &Path, shared: &(Mutex<UpState>, Condvar)) {
    for file in spooled(spool) {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let result = dest
            .child(&format!(
                "{}/{name}",
                hive_partition(&name, chrono::Utc::now())
            ))
            .and_then(|key| dest.put_file(&key, &file))
            .and_then(|url| {
                std::fs::remove_file(&file).map_err(|e| Error::io(&file, e))?;
                Ok(url)
            });
        let Ok(mut s) = shared.0.lock() else { return };
        match result {
            Ok(url) => s.report.uploaded.push(url),
            Err(e) => {
                s.report.failures += 1;
                s.report.last_error = Some(e.to_string());
                // The store is likely down: leave the rest for the next pass.
                return;
            }
        }
    }
}
