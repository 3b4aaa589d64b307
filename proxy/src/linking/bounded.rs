//! The linkers' memory, bounded: what they remember is forgotten oldest first, so the writer
//! thread's memory does not grow with the traffic. One mechanism for every linker:
//! [`Candidates`] (several entries under one key, each key's list bounded too: chat chains,
//! completions turns) and [`Recent`] (one entry per key: tool calls made, Responses ids).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Entries remembered under keys, at most `max` in all and `per_key` under one key; the
/// oldest entry goes first. Each entry has a sequence number, in the order remembered.
#[derive(Debug)]
pub struct Candidates<K, V> {
    index: HashMap<K, Vec<(u64, V)>>,
    order: VecDeque<(K, u64)>,
    max: usize,
    per_key: usize,
    seq: u64,
}

impl<K: Hash + Eq + Copy, V> Candidates<K, V> {
    /// Remembers at most `max` entries in all and `per_key` under one key.
    pub fn new(max: usize, per_key: usize) -> Self {
        Candidates {
            index: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
            per_key: per_key.max(1),
            seq: 0,
        }
    }

    /// Entries remembered now (at most `max`; a key's entries pushed out by `per_key` count
    /// until they would have been forgotten anyway).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The entries under `key`, oldest first, with their sequence numbers.
    pub fn get(&self, key: &K) -> Option<&Vec<(u64, V)>> {
        self.index.get(key)
    }

    /// Entries held now, under every key (at most [`Candidates::len`]).
    pub fn held(&self) -> usize {
        self.index.values().map(Vec::len).sum()
    }

    /// The entries under `key`, oldest first, with their sequence numbers, to change.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut Vec<(u64, V)>> {
        self.index.get_mut(key)
    }

    /// The next entry's sequence number.
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// Remembers `v` under `key`; `forgot` is called with the key of each entry forgotten to
    /// make room (under `key` by `per_key`, or the oldest of all by `max`).
    pub fn insert(&mut self, key: K, v: V, mut forgot: impl FnMut(K)) {
        self.seq += 1;
        self.order.push_back((key, self.seq));
        let list = self.index.entry(key).or_default();
        list.push((self.seq, v));
        if list.len() > self.per_key {
            list.remove(0);
            forgot(key);
        }
        while self.order.len() > self.max {
            let Some((old, seq)) = self.order.pop_front() else {
                break;
            };
            if let Some(list) = self.index.get_mut(&old) {
                // Entries are in the order remembered; one already pushed out by the per-key
                // bound is gone.
                if list.first().is_some_and(|(s, _)| *s == seq) {
                    list.remove(0);
                    forgot(old);
                }
                if list.is_empty() {
                    self.index.remove(&old);
                }
            }
        }
    }
}

/// One entry per key, at most `max`; the oldest key goes first (an entry remembered again
/// under its key keeps its place).
#[derive(Debug)]
pub struct Recent<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
    max: usize,
}

impl<K: Hash + Eq + Copy, V> Recent<K, V> {
    /// Remembers at most `max` entries.
    pub fn new(max: usize) -> Self {
        Recent {
            map: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
        }
    }

    /// Entries remembered now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The entry under `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }

    /// The entry under `key`, to change.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.map.get_mut(key)
    }

    /// Remembers `v` under `key`; the entries forgotten to make room, oldest first.
    pub fn insert(&mut self, key: K, v: V) -> Vec<(K, V)> {
        if self.map.insert(key, v).is_none() {
            self.order.push_back(key);
        }
        let mut forgotten = Vec::new();
        while self.order.len() > self.max {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(v) = self.map.remove(&old) {
                forgotten.push((old, v));
            }
        }
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_forget_the_oldest_in_all_and_per_key() {
        let mut c: Candidates<u8, &str> = Candidates::new(3, 2);
        let mut forgot = Vec::new();
        c.insert(1, "a", |k| forgot.push(k));
        c.insert(1, "b", |k| forgot.push(k));
        c.insert(1, "c", |k| forgot.push(k));
        // Key 1 keeps its last two; "a" is gone by the per-key bound.
        assert_eq!(forgot, vec![1]);
        let got: Vec<_> = c.get_mut(&1).unwrap().iter().map(|e| e.1).collect();
        assert_eq!(got, ["b", "c"]);
        c.insert(2, "x", |k| forgot.push(k));
        // 4 remembered past 3: the oldest ("a", already gone) leaves the order, nothing more.
        assert_eq!((c.len(), forgot.len()), (3, 1));
        c.insert(2, "y", |k| forgot.push(k));
        // Now "b" is the oldest: forgotten.
        assert_eq!(forgot, vec![1, 1]);
        let got: Vec<_> = c.get_mut(&1).unwrap().iter().map(|e| e.1).collect();
        assert_eq!(got, ["c"]);
        assert_eq!(c.next_seq(), 6);
        c.insert(3, "z", |k| forgot.push(k));
        assert!(c.get_mut(&1).is_none(), "key 1's last entry forgotten");
    }

    #[test]
    fn recent_keeps_the_last_max_keys() {
        let mut r: Recent<u8, u32> = Recent::new(2);
        assert!(r.insert(1, 10).is_empty());
        assert!(r.insert(2, 20).is_empty());
        // Again under key 1: replaced, keeps its place.
        assert!(r.insert(1, 11).is_empty());
        assert_eq!(r.insert(3, 30), vec![(1, 11)]);
        assert_eq!((r.get(&1), r.get(&2), r.len()), (None, Some(&20), 2));
        *r.get_mut(&3).unwrap() += 1;
        assert_eq!(r.get(&3), Some(&31));
    }
}
