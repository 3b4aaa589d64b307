//! What an origin does with a connection after a response, learned as the pool goes.
//!
//! Some servers close a connection after every streamed response while advertising
//! keep-alive (llama.cpp's server: `Keep-Alive: timeout=5, max=100`, no `Connection: close`,
//! and a FIN microseconds after the last chunk). The liveness check before reuse cannot win
//! a race against such a close: a request that checks the connection out in between is
//! written, the server closes, and the request fails (capture's 502, replay's
//! `upstream_error`) — it cannot be sent again, since the server may have read it.
//!
//! So the pool learns, per origin and per kind of response (streamed, i.e. chunked, or
//! sized), whether the server keeps the connection open after it:
//! - **unknown** (the start): a connection is reused after such a response only once it has
//!   been idle [`SETTLE`], long enough for a close that follows the response to have arrived
//!   and be seen by the liveness check; until then a request takes another connection;
//! - **keeps**: a request on a connection reused after such a response got its answer: reuse
//!   at once (a well-behaved server never waits and never opens a connection per request);
//! - **closes**: [`STRIKES`] connections in a row were found closed within [`RIGHT_AFTER`]
//!   the first such response they carried (at the liveness check, or when their next request
//!   got no answer) with no successful reuse in between: a connection is no longer reused
//!   after such a response, and the pool opens a spare in its place ahead of the next
//!   request. One in [`PROBE_EVERY`] is kept anyway (and settles first) to notice a server
//!   that changed its mind.
//!
//! A server that closes after N > 1 requests, or when idle, never counts: its connections
//! carried more than one response, or were idle longer than [`RIGHT_AFTER`]. The state is a
//! few atomics per origin, shared by all the pools of that origin (capture's serving threads).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Duration;

use crate::framing::Framing;

/// Connections in a row found closed right after their first response of a kind, with no
/// successful reuse after that kind in between, that make the habit.
pub const STRIKES: u32 = 2;
/// How soon after a response a connection found closed counts as closed "right after" it.
pub const RIGHT_AFTER: Duration = Duration::from_secs(1);
/// How long a connection waits idle before it is reused after a response of a kind the
/// origin has not been seen to keep connections open after.
pub const SETTLE: Duration = Duration::from_millis(20);
/// While the origin closes after a kind of response, one connection in this many is kept
/// for reuse anyway (after [`SETTLE`]), to see whether it still does.
pub const PROBE_EVERY: u64 = 64;

/// A kind of response, as far as connection reuse after it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `content-length` (or close-delimited, which is never reused anyway).
    Sized = 0,
    /// Chunked: a streamed response.
    Streamed = 1,
}

impl Kind {
    pub(crate) fn of(f: Framing) -> Kind {
        if f == Framing::Chunked {
            Kind::Streamed
        } else {
            Kind::Sized
        }
    }
}

/// What the origin does after a kind of response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Not seen yet: reuse after [`SETTLE`].
    Unknown,
    /// Keeps the connection open: reuse at once.
    Keeps,
    /// Closes it without saying so: do not reuse.
    Closes,
}

/// What to do with a connection given back after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checkin {
    /// Keep it for reuse.
    Keep,
    /// Keep it, for reuse once it has settled (a probe while the origin closes).
    Probe,
    /// Let it go: the origin closes it.
    Retire,
}

#[derive(Debug, Default)]
struct PerKind {
    state: AtomicU8,
    strikes: AtomicU32,
    retired: AtomicU64,
}

/// What one origin does with a connection after each kind of response; shared by the pools
/// of that origin.
#[derive(Debug, Default)]
pub struct Habit {
    kinds: [PerKind; 2],
}

const UNKNOWN: u8 = 0;
const KEEPS: u8 = 1;
const CLOSES: u8 = 2;

impl Habit {
    /// Nothing learned yet.
    pub fn new() -> Habit {
        Habit::default()
    }

    /// What the origin does after a streamed (chunked) response.
    pub fn after_streamed(&self) -> After {
        self.after(Kind::Streamed)
    }

    /// What the origin does after a sized (`content-length`) response.
    pub fn after_sized(&self) -> After {
        self.after(Kind::Sized)
    }

    pub(crate) fn after(&self, k: Kind) -> After {
        match self.kinds[k as usize].state.load(Relaxed) {
            UNKNOWN => After::Unknown,
            KEEPS => After::Keeps,
            _ => After::Closes,
        }
    }

    /// A request on a connection reused after a `k` response got its answer.
    pub(crate) fn kept(&self, k: Kind) {
        let s = &self.kinds[k as usize];
        s.strikes.store(0, Relaxed);
        s.state.store(KEEPS, Relaxed);
    }

    /// A connection was found closed right after its first `k` response.
    pub(crate) fn closed(&self, k: Kind) {
        let s = &self.kinds[k as usize];
        if s.strikes.fetch_add(1, Relaxed) + 1 >= STRIKES {
            s.state.store(CLOSES, Relaxed);
        }
    }

    /// A connection comes back after a `k` response.
    pub(crate) fn checkin(&self, k: Kind) -> Checkin {
        let s = &self.kinds[k as usize];
        if s.state.load(Relaxed) != CLOSES {
            return Checkin::Keep;
        }
        if s.retired.fetch_add(1, Relaxed) % PROBE_EVERY == PROBE_EVERY - 1 {
            Checkin::Probe
        } else {
            Checkin::Retire
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_closes_in_a_row_make_the_habit_and_a_kept_connection_undoes_it() {
        let h = Habit::new();
        assert_eq!(h.after_streamed(), After::Unknown);
        h.closed(Kind::Streamed);
        assert_eq!(h.after_streamed(), After::Unknown, "one close is no habit");
        h.kept(Kind::Streamed);
        h.closed(Kind::Streamed);
        assert_eq!(
            h.after_streamed(),
            After::Keeps,
            "a reuse in between resets"
        );
        h.closed(Kind::Streamed);
        assert_eq!(h.after_streamed(), After::Closes);
        assert_eq!(h.after_sized(), After::Unknown, "per kind");
        let probes = (0..2 * PROBE_EVERY)
            .filter(|_| h.checkin(Kind::Streamed) == Checkin::Probe)
            .count();
        assert_eq!(probes, 2);
        assert_eq!(h.checkin(Kind::Sized), Checkin::Keep);
        h.kept(Kind::Streamed);
        assert_eq!(h.after_streamed(), After::Keeps);
        assert_eq!(h.checkin(Kind::Streamed), Checkin::Keep);
    }
}
