//! Responses turns linked by the id the server gave: a request with `previous_response_id`
//! continues the conversation the server holds for that response, so its parent is exactly
//! the row whose response carried that id (`parent_link = previous_response`), whatever its
//! prompt says (it carries only the new input items).
//!
//! The writer thread remembers the hashed id of each ok Responses row's response (no id is
//! kept as text), for the last [`DEFAULT_MAX_RESPONSES`] of them, and looks a request's
//! `previous_response_id` (hashed the same way) up among them.

use trace_format::ParentLink;

use crate::linking::bounded::Recent;
use crate::linking::sessions::Parent;
use crate::prefix::{fnv, FNV_OFFSET};

/// Response ids remembered by default (about 100 bytes each).
pub const DEFAULT_MAX_RESPONSES: usize = 200_000;

/// The stable hash of a response id.
pub fn id_hash(id: &str) -> u64 {
    fnv(FNV_OFFSET, id.as_bytes())
}

#[derive(Debug)]
struct Made {
    request_id: String,
    session_id: String,
    end_us: i64,
}

/// The responses whose ids a later turn may name, bounded (the oldest forgotten first).
#[derive(Debug)]
pub struct ResponseIds {
    by_id: Recent<u64, Made>,
}

impl ResponseIds {
    /// Remembers the last `max` responses.
    pub fn new(max: usize) -> ResponseIds {
        ResponseIds {
            by_id: Recent::new(max),
        }
    }

    /// Responses remembered now (at most `max`).
    pub fn remembered(&self) -> usize {
        self.by_id.len()
    }

    /// Remembers that the row `request_id` (in `session_id`, its response ended at
    /// `end_us`) answered with the response whose id hashes to `id`.
    pub fn remember(&mut self, id: u64, request_id: &str, session_id: &str, end_us: i64) {
        let made = Made {
            request_id: request_id.to_string(),
            session_id: session_id.to_string(),
            end_us,
        };
        self.by_id.insert(id, made);
    }

    /// The row whose response's id hashes to `id`, if remembered.
    pub fn parent(&self, id: u64) -> Option<Parent> {
        let m = self.by_id.get(&id)?;
        Some(Parent {
            request_id: m.request_id.clone(),
            session_id: m.session_id.clone(),
            end_us: m.end_us,
            how: ParentLink::PreviousResponse,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_response_is_found_until_it_is_forgotten() {
        let mut r = ResponseIds::new(2);
        r.remember(id_hash("resp_a"), "r1", "s1", 10);
        r.remember(id_hash("resp_b"), "r2", "s1", 20);
        let p = r.parent(id_hash("resp_a")).expect("remembered");
        assert_eq!(
            (
                p.request_id.as_str(),
                p.session_id.as_str(),
                p.end_us,
                p.how
            ),
            ("r1", "s1", 10, ParentLink::PreviousResponse)
        );
        assert!(r.parent(id_hash("resp_x")).is_none());
        r.remember(id_hash("resp_c"), "r3", "s2", 30);
        assert_eq!(r.remembered(), 2);
        assert!(
            r.parent(id_hash("resp_a")).is_none(),
            "the oldest is forgotten"
        );
        assert_eq!(r.parent(id_hash("resp_c")).unwrap().request_id, "r3");
    }
}
