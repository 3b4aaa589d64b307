//! The pacer's outlet on the client runtime: released requests become request tasks, the
//! releases at one instant are numbered as a burst, and a burst is spawned by one task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::feed::{Fed, FeedMsg};
use crate::pacer::{Outlet, PacerEnd};
use crate::task::{one_request, RunMsg, Shared};

/// The pacer's outlet: spawns each released request as a task, numbering bursts (the runs
/// of releases at one µs instant) and closing each when the pacer moves past it. The requests
/// released together are spawned by one task on the client runtime ([`spawn_all`]), not one
/// by one from the pacer's thread: each spawn from outside the runtime may wake a worker, and
/// where the pacer shares a core with the workers the woken worker took the core from the
/// pacer in the middle of a burst (1,000 due at once: the rest of the burst waited ~100 ms
/// on a busy machine), while a task's allocation on the pacer's own malloc arena grew it page
/// by page.
pub(crate) struct Dispatch {
    handle: tokio::runtime::Handle,
    sh: Arc<Shared>,
    gid: u64,
    instant_us: Option<i64>,
    members: usize,
    /// Released and not yet spawned: (request, burst, scheduled instant).
    batch: Vec<(Box<Fed>, u64, Instant)>,
}

impl Dispatch {
    /// An outlet that spawns onto `handle` the requests of the run `sh`.
    pub(crate) fn new(handle: tokio::runtime::Handle, sh: Arc<Shared>) -> Dispatch {
        Dispatch {
            handle,
            sh,
            gid: 0,
            instant_us: None,
            members: 0,
            batch: Vec::new(),
        }
    }

    fn close(&mut self) {
        if self.members > 0 {
            let _ = self.sh.results.send(RunMsg::Closed {
                gid: self.gid,
                members: self.members,
            });
        }
    }
}

impl Outlet<Box<Fed>, FeedMsg> for Dispatch {
    fn dispatch(&mut self, mut item: Box<Fed>, offset: Duration, scheduled: Instant) {
        item.released();
        let us = offset.as_micros() as i64;
        if self.instant_us != Some(us) {
            self.close();
            self.gid += 1;
            self.members = 0;
            self.instant_us = Some(us);
        }
        self.members += 1;
        self.batch.push((item, self.gid, scheduled));
    }

    fn flush(&mut self) {
        match self.batch.len() {
            0 => {}
            1 => {
                let (item, gid, scheduled) = self.batch.pop().expect("one released");
                self.handle
                    .spawn(one_request(self.sh.clone(), item, gid, scheduled));
            }
            _ => {
                let batch = std::mem::take(&mut self.batch);
                self.handle.spawn(spawn_all(self.sh.clone(), batch));
            }
        }
    }

    fn pass(&mut self, msg: FeedMsg) {
        let _ = self.sh.results.send(RunMsg::Feed(msg));
    }

    fn end(&mut self, end: PacerEnd) {
        self.flush();
        self.close();
        let _ = self.sh.results.send(RunMsg::PacerEnd(end));
    }
}

/// Spawns the requests released together, from a task on the client runtime (see
/// [`Dispatch`]), letting the first ones start every [`SPAWN_RUN`] spawns.
async fn spawn_all(sh: Arc<Shared>, batch: Vec<(Box<Fed>, u64, Instant)>) {
    for (i, (item, gid, scheduled)) in batch.into_iter().enumerate() {
        tokio::spawn(one_request(sh.clone(), item, gid, scheduled));
        if i % SPAWN_RUN == SPAWN_RUN - 1 {
            tokio::task::yield_now().await;
        }
    }
}

/// Requests [`spawn_all`] spawns before it lets them run.
const SPAWN_RUN: usize = 128;
