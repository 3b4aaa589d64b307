//! Closed mode's graph, in bounded memory: which earlier request each turn waits for
//! ([`Graph`], on the feed's collector as the schedule is assembled), and the ends of the
//! requests that later turns may still wait for ([`Ends`], on the run loop).
//!
//! A row waits for the row its `parent_request_id` names, when that row was assembled earlier
//! in this run (a tool loop's next call, a sub-agent's first request in another session);
//! else for the previous turn of its session; else for nothing (its open offset). Its think
//! time is its recorded arrival minus that row's recorded end (arrival + `e2el_us`).
//!
//! In open mode only a Responses turn chained to its parent (`parent_link` =
//! `previous_response`) waits, for the row its `parent_request_id` names: it needs the id the
//! candidate gave that row; it is sent at its open offset or once its parent answered,
//! whichever is later. (Its parent is never a session's previous turn: the id must be its.)
//!
//! Rows that can be waited for are the *chained* ones: those with a `session_id` or a
//! `parent_request_id`, and every Responses row (a later turn may name its id) (whether a row is named as a parent only shows later, so a row with
//! neither is never remembered: a child naming it falls back to its session, else its open
//! offset). Only the last [`WINDOW`] chained rows can be waited for: the graph remembers
//! their ids, and the run loop the ends of those that finished, so memory is bounded
//! (~90 bytes per row, ~25 MB at most) whatever the trace's length. A turn whose parent
//! or previous turn lies further back (more than [`WINDOW`] chained rows earlier: minutes
//! of a busy trace; capture itself links a chat turn only to the last 200,000 answers) is
//! sent at its open offset instead.
//!
//! The two sides agree without talking: a turn is fed (handed to the pacer, which passes it
//! to the run loop at once) before any row assembled after it can be sent, so when it
//! reaches the loop, fewer than [`WINDOW`] chained rows after its parent can have finished,
//! and the parent's end, if it finished, is still kept.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use trace_format::{ParentLink, TraceRecord};
use wire::api::Api;

use crate::prompt::stable_hash;

/// Chained rows that can be waited for: the last this many assembled.
pub const WINDOW: usize = 1 << 18;

/// A chained row as the graph remembers it.
#[derive(Debug, Clone, Copy)]
struct Node {
    seq: u64,
    /// Its position among the chained rows.
    index: u64,
    /// Its recorded end, µs since the epoch.
    end_us: i64,
}

/// What a turn waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// The row's `seq`.
    pub seq: u64,
    /// That row's recorded end, µs since the epoch.
    pub end_us: i64,
    /// Whether it is the row `parent_request_id` names (else the session's previous turn).
    pub parent: bool,
}

/// Whether `rec` is a Responses turn that continues its parent's response on the server: it
/// waits for that parent, in open mode too, and for no other row.
pub fn needs_parent(rec: &TraceRecord) -> bool {
    rec.parent_link == Some(ParentLink::PreviousResponse)
}

/// The plan's side: the chained rows assembled (the last `window` by id, each session's last).
#[derive(Debug)]
pub struct Graph {
    window: usize,
    /// Chained rows assembled so far.
    chained: u64,
    /// The last `window` chained rows, by the stable hash of their request id.
    by_id: HashMap<u64, Node>,
    /// Their (id hash, seq), oldest first.
    order: VecDeque<(u64, u64)>,
    /// Each session's last turn.
    last_of: HashMap<String, Node>,
}

impl Default for Graph {
    fn default() -> Self {
        Graph::new(WINDOW)
    }
}

impl Graph {
    /// A graph whose rows can wait for the last `window` chained rows.
    pub fn new(window: usize) -> Self {
        Graph {
            window: window.max(1),
            chained: 0,
            by_id: HashMap::new(),
            order: VecDeque::new(),
            last_of: HashMap::new(),
        }
    }

    /// Whether `n` is among the last `window` chained rows.
    fn live(&self, n: &Node) -> bool {
        n.index + self.window as u64 >= self.chained
    }

    /// Row `seq` (`rec`) is assembled in closed mode (`closed`) or open: what it waits for,
    /// and whether later rows may wait for it (it is chained).
    pub fn add(&mut self, seq: u64, rec: &TraceRecord, closed: bool) -> (Option<Wait>, bool) {
        let wait = self.waits(rec, closed);
        (wait, self.remember(seq, rec, closed))
    }

    /// What row `rec` would wait for, assembled now in closed mode (`closed`) or open.
    pub fn waits(&self, rec: &TraceRecord, closed: bool) -> Option<Wait> {
        let by_parent = rec
            .parent_request_id
            .as_deref()
            .and_then(|p| self.by_id.get(&stable_hash(p)))
            .filter(|n| self.live(n))
            .map(|n| (*n, true));
        let by_session = || {
            rec.session_id
                .as_deref()
                .and_then(|s| self.last_of.get(s))
                .filter(|n| self.live(n))
                .map(|n| (*n, false))
        };
        let wait = if needs_parent(rec) {
            by_parent
        } else if closed {
            by_parent.or_else(by_session)
        } else {
            None
        };
        wait.map(|(n, parent)| Wait {
            seq: n.seq,
            end_us: n.end_us,
            parent,
        })
    }

    /// Row `seq` (`rec`) is assembled: remembered when later rows may wait for it (returned:
    /// it is chained).
    pub fn remember(&mut self, seq: u64, rec: &TraceRecord, closed: bool) -> bool {
        let responses = Api::of_endpoint(&rec.endpoint) == Some(Api::Responses);
        let chained =
            responses || (closed && (rec.session_id.is_some() || rec.parent_request_id.is_some()));
        if chained {
            let node = Node {
                seq,
                index: self.chained,
                end_us: rec
                    .arrival_time_us
                    .saturating_add(rec.e2el_us.unwrap_or(0).max(0)),
            };
            self.chained += 1;
            let h = stable_hash(&rec.request_id);
            self.by_id.insert(h, node);
            self.order.push_back((h, seq));
            while self.order.len() > self.window {
                let Some((h, s)) = self.order.pop_front() else {
                    break;
                };
                // A repeated request id maps to its latest row: only that row's own entry goes.
                if self.by_id.get(&h).is_some_and(|n| n.seq == s) {
                    self.by_id.remove(&h);
                }
            }
            if let Some(s) = &rec.session_id {
                match self.last_of.get_mut(s) {
                    Some(n) => *n = node,
                    None => {
                        self.last_of.insert(s.clone(), node);
                    }
                }
            }
        }
        chained
    }
}

/// How a chained row ended, for the turns that wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// When it ended.
    pub at: Instant,
    /// The id the target gave its response (kept only where a later turn may name it).
    pub response_id: Option<Arc<str>>,
    /// Why it failed or was not sent (its request id and what became of it); None: served.
    pub failed: Option<Arc<str>>,
}

/// The run loop's side: turns waiting for a row that has not finished, and how the last
/// `window` chained rows that finished ended (any number of turns may wait for one row).
#[derive(Debug)]
pub struct Ends<T> {
    window: usize,
    ended: BTreeMap<u64, Ended>,
    waiting: HashMap<u64, Vec<T>>,
}

impl<T> Default for Ends<T> {
    fn default() -> Self {
        Ends::new(WINDOW)
    }
}

impl<T> Ends<T> {
    /// Ends kept for the last `window` chained rows that finished (the [`Graph`]'s window).
    pub fn new(window: usize) -> Self {
        Ends {
            window: window.max(1),
            ended: BTreeMap::new(),
            waiting: HashMap::new(),
        }
    }

    /// Chained row `seq` ended so: the turns that waited for it, to release.
    pub fn finished(&mut self, seq: u64, ended: Ended) -> Vec<T> {
        self.ended.insert(seq, ended);
        while self.ended.len() > self.window {
            self.ended.pop_first();
        }
        self.waiting.remove(&seq).unwrap_or_default()
    }

    /// `turn` waits for row `seq`: when that one ended already, how, and the turn back (to
    /// release now); else the turn is kept until it does.
    pub fn wait(&mut self, seq: u64, turn: T) -> Option<(Ended, T)> {
        match self.ended.get(&seq) {
            Some(end) => Some((end.clone(), turn)),
            None => {
                self.waiting.entry(seq).or_default().push(turn);
                None
            }
        }
    }

    /// Drops the turns still waiting (the run is over: they will never be sent).
    pub fn clear_waiting(&mut self) {
        self.waiting.clear();
    }

    /// Turns still waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    impl Graph {
        fn add_closed(&mut self, seq: u64, rec: &TraceRecord) -> (Option<Wait>, bool) {
            self.add(seq, rec, true)
        }
    }

    fn ended(at: Instant) -> Ended {
        Ended {
            at,
            response_id: None,
            failed: None,
        }
    }

    fn rec(id: &str, t_ms: i64, session: Option<&str>, parent: Option<&str>) -> TraceRecord {
        let mut r = TraceRecord::new(id, t_ms * 1000, "/v1/chat/completions");
        r.session_id = session.map(str::to_string);
        r.parent_request_id = parent.map(str::to_string);
        r.e2el_us = Some(100_000);
        r
    }

    #[test]
    fn a_parent_wins_over_the_session_and_a_missing_one_falls_back() {
        let mut g = Graph::new(8);
        assert_eq!(
            g.add_closed(0, &rec("a1", 0, Some("a"), None)),
            (None, true)
        );
        assert_eq!(g.add_closed(1, &rec("x", 10, None, None)), (None, false));
        // A sub-agent in another session waits for its parent.
        let (w, _) = g.add_closed(2, &rec("s1", 500, Some("s"), Some("a1")));
        assert_eq!(
            w,
            Some(Wait {
                seq: 0,
                end_us: 100_000,
                parent: true
            })
        );
        // A parent never assembled (or not chained): the session's previous turn.
        let (w, _) = g.add_closed(3, &rec("s2", 900, Some("s"), Some("nowhere")));
        assert_eq!(w.map(|w| (w.seq, w.parent)), Some((2, false)));
        let (w, _) = g.add_closed(4, &rec("y", 900, None, Some("x")));
        assert_eq!(w, None, "x had no session nor parent: not remembered");
    }

    #[test]
    fn only_the_last_window_chained_rows_can_be_waited_for() {
        let mut g = Graph::new(3);
        g.add_closed(0, &rec("a1", 0, Some("a"), None));
        for i in 1..=3 {
            g.add_closed(i, &rec(&format!("b{i}"), 0, Some("b"), None));
        }
        // a1 is 4 chained rows back: neither by id nor by session.
        assert_eq!(g.add_closed(4, &rec("c", 0, None, Some("a1"))).0, None);
        assert_eq!(g.add_closed(5, &rec("a2", 0, Some("a"), None)).0, None);
        assert!(g.by_id.len() <= 3 && g.order.len() <= 3);
        // A repeated id maps to its latest row, and evicting the older keeps it.
        let mut g = Graph::new(2);
        g.add_closed(0, &rec("r", 0, Some("s"), None));
        g.add_closed(1, &rec("r", 0, Some("t"), None));
        g.add_closed(2, &rec("q", 0, Some("u"), None));
        assert_eq!(
            g.add_closed(3, &rec("k", 0, None, Some("r")))
                .0
                .map(|w| w.seq),
            Some(1)
        );
    }

    #[test]
    fn ends_release_every_waiting_turn_and_stay_bounded() {
        let t0 = Instant::now();
        let mut e: Ends<&str> = Ends::new(2);
        assert_eq!(e.wait(0, "c1"), None);
        assert_eq!(e.wait(0, "c2"), None);
        assert_eq!(e.waiting(), 2);
        assert_eq!(e.finished(0, ended(t0)), vec!["c1", "c2"]);
        // A third child fed after its parent ended is released at once.
        assert_eq!(e.wait(0, "c3"), Some((ended(t0), "c3")));
        let t1 = t0 + Duration::from_millis(5);
        e.finished(1, ended(t1));
        e.finished(2, ended(t1));
        assert_eq!(e.ended.len(), 2, "only the last window's ends are kept");
        assert_eq!(e.wait(2, "d"), Some((ended(t1), "d")));
        assert_eq!(e.waiting(), 0);
    }
}
