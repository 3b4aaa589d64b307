//! Turns of agent traces linked into chains: each request continues the previous request of
//! its chain (a trajectory, a session), or, opening a chain, the latest earlier request of the
//! chain that spawned it (a subagent's parent trajectory). `parent_request_id` names that
//! request; `think_time_us` is this request's arrival minus that request's end (arrival +
//! `e2el_us`), at least 0 (what capture's session linking records), unless the source gave
//! one. A parent with no recorded duration gives no think time.

use std::collections::HashMap;

use trace_format::TraceRecord;

/// Where one record belongs: its chain and, for a chain's first request, the chain that
/// spawned it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chain {
    /// The chain (trajectory or session); None leaves the record unlinked.
    pub(crate) key: Option<String>,
    /// The chain this one was spawned from (a subagent's parent trajectory).
    pub(crate) spawned_from: Option<String>,
}

/// Links `records` (any order; `chains[i]` is where `records[i]` belongs): in arrival order
/// (file order among equal arrivals), each request's parent is the previous request of its
/// chain, else the latest earlier request of the chain it was spawned from.
pub(crate) fn link(records: &mut [TraceRecord], chains: &[Chain]) {
    debug_assert_eq!(records.len(), chains.len());
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| records[i].arrival_time_us);
    let mut last: HashMap<&str, usize> = HashMap::new();
    for i in order {
        let c = &chains[i];
        let Some(key) = c.key.as_deref() else {
            continue;
        };
        let parent = last
            .get(key)
            .or_else(|| c.spawned_from.as_deref().and_then(|s| last.get(s)))
            .copied();
        if let Some(p) = parent {
            let (id, end) = {
                let p = &records[p];
                (
                    p.request_id.clone(),
                    p.e2el_us.map(|d| p.arrival_time_us.saturating_add(d)),
                )
            };
            let r = &mut records[i];
            r.parent_request_id = Some(id);
            if r.think_time_us.is_none() {
                r.think_time_us = end.map(|e| r.arrival_time_us.saturating_sub(e).max(0));
            }
        }
        last.insert(key, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, at: i64, e2el: Option<i64>) -> TraceRecord {
        let mut r = TraceRecord::new(id, at, "/v1/chat/completions");
        r.e2el_us = e2el;
        r
    }

    fn chain(key: &str, from: Option<&str>) -> Chain {
        Chain {
            key: Some(key.into()),
            spawned_from: from.map(str::to_string),
        }
    }

    #[test]
    fn turns_chain_and_subagents_hang_off_their_parent_trajectory() {
        // Out of arrival order on purpose: linking follows arrivals, not the file.
        let mut rs = vec![
            rec("a2", 5_000, Some(1_000)),
            rec("a1", 0, Some(2_000)),
            rec("s1", 2_500, None),
            rec("s2", 9_000, Some(10)),
            rec("x", 1, None),
        ];
        let cs = vec![
            chain("A", None),
            chain("A", None),
            chain("S", Some("A")),
            chain("S", Some("A")),
            Chain::default(),
        ];
        link(&mut rs, &cs);
        let p: Vec<_> = rs.iter().map(|r| r.parent_request_id.as_deref()).collect();
        assert_eq!(p, vec![Some("a1"), None, Some("a1"), Some("s1"), None]);
        // a2: 5000 - (0 + 2000); s1: 2500 - 2000; s2: its parent has no duration.
        let t: Vec<_> = rs.iter().map(|r| r.think_time_us).collect();
        assert_eq!(t, vec![Some(3_000), None, Some(500), None, None]);
    }

    #[test]
    fn overlapping_turns_think_zero_and_given_think_times_stay() {
        let mut rs = vec![rec("a", 0, Some(5_000)), rec("b", 1_000, None)];
        link(&mut rs, &[chain("A", None), chain("A", None)]);
        assert_eq!(rs[1].think_time_us, Some(0));
        let mut rs = vec![rec("a", 0, Some(5_000)), rec("b", 1_000, None)];
        rs[1].think_time_us = Some(77);
        link(&mut rs, &[chain("A", None), chain("A", None)]);
        assert_eq!(rs[1].think_time_us, Some(77));
        // Ends past the end of time saturate instead of wrapping into a huge think time.
        let mut rs = vec![
            rec("a", i64::MAX - 5, Some(i64::MAX)),
            rec("b", i64::MAX - 1, None),
        ];
        link(&mut rs, &[chain("A", None), chain("A", None)]);
        assert_eq!(rs[1].think_time_us, Some(0));
    }
}
