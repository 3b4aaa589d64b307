//! The responses the sim keeps for later `previous_response_id`s (OpenAI Responses with
//! `store`, the default): each response's conversation (its prompt's tokens and its output's),
//! so a turn that names it is prefilled on the whole conversation, as a server holding the
//! conversation does. Bounded: at most [`MAX_RESPONSES`] responses and [`MAX_TOKENS`] tokens,
//! the oldest forgotten first (a turn naming a forgotten one is answered 404, as a server
//! that expired it answers).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Responses kept at most.
pub const MAX_RESPONSES: usize = 100_000;
/// Tokens of the conversations kept at most (8 bytes each: 128 MiB).
pub const MAX_TOKENS: usize = 16 << 20;

/// The responses kept, by id.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    limits: (usize, usize),
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, Arc<[u64]>>,
    order: VecDeque<String>,
    tokens: usize,
}

impl Store {
    /// A store of at most `responses` responses and `tokens` tokens.
    pub(crate) fn new(responses: usize, tokens: usize) -> Store {
        Store {
            inner: Mutex::default(),
            limits: (responses.max(1), tokens),
        }
    }

    /// Keeps the conversation of response `id`.
    pub(crate) fn put(&self, id: &str, conversation: Vec<u64>) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.tokens += conversation.len();
        if let Some(old) = s.by_id.insert(id.to_string(), conversation.into()) {
            s.tokens -= old.len();
        } else {
            s.order.push_back(id.to_string());
        }
        while s.order.len() > self.limits.0 || (s.tokens > self.limits.1 && s.order.len() > 1) {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            if let Some(c) = s.by_id.remove(&old) {
                s.tokens -= c.len();
            }
        }
    }

    /// The conversation of response `id`, if kept.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<[u64]>> {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.by_id.get(id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_responses_are_forgotten_past_either_bound() {
        let s = Store::new(3, 10);
        for i in 0..4u64 {
            s.put(&format!("r{i}"), vec![i; 2]);
        }
        assert!(s.get("r0").is_none(), "past 3 responses");
        assert_eq!(s.get("r3").as_deref(), Some(&[3u64, 3][..]));
        s.put("big", vec![9; 7]);
        // 2 + 2 + 7 > 10 tokens: the oldest go until it fits.
        assert!(s.get("r1").is_none() && s.get("r2").is_none());
        assert!(s.get("r3").is_some() && s.get("big").is_some());
        // One response larger than the bound is kept on its own.
        s.put("huge", vec![1; 50]);
        assert!(s.get("huge").is_some() && s.get("big").is_none());
    }
}
