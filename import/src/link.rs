//! Turns of agent traces linked into chains. Each request continues the previous request of
//! its chain (a trajectory, a session), or, opening a chain, a request of the chain that
//! spawned it (a sub-agent's parent): with [`Links::subagent_from_ended`], the latest of that
//! chain's requests that had ended when the sub-agent's first request arrived (what Dynamo
//! links a sub-agent to), else the latest to have arrived. With [`Links::join_children`], a
//! request whose chain spawned sub-agents waits on one of them when the times say it did (a
//! join): when a sub-agent chain's last request to end ended after the previous request of this
//! chain ended, and before this request arrived, that last request is the parent (the latest
//! such; each sub-agent joins once; one launched in the background, never). `parent_request_id` names the parent and `parent_link`
//! says `subagent` for a sub-agent's first request, `recorded` otherwise; `think_time_us` is
//! this request's arrival minus the parent's end (arrival + `e2el_us`), at least 0 (what
//! capture's session linking records), unless the source gave one for a request whose parent
//! is the previous request of its own chain. A parent with no recorded duration gives no
//! think time.

use std::collections::{HashMap, HashSet};

use trace_format::{ParentLink, TraceRecord};

/// Where one record belongs: its chain and, for a chain's first request, the chain that
/// spawned it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chain {
    /// The chain (trajectory or session); None leaves the record unlinked.
    pub(crate) key: Option<String>,
    /// The chain this one was spawned from (a sub-agent's parent trajectory).
    pub(crate) spawned_from: Option<String>,
    /// A sub-agent its parent does not wait for (launched in the background): never joined.
    pub(crate) detached: bool,
}

/// How sub-agents link to their parents' chains.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Links {
    /// A sub-agent's first request continues the latest request of the spawning chain that
    /// had ended when it arrived (else the latest to have arrived).
    pub(crate) subagent_from_ended: bool,
    /// A parent's request waits on a sub-agent that finished between its chain's previous
    /// request's end and its own arrival.
    pub(crate) join_children: bool,
}

/// When the chain of `requests` (in arrival order) finished: the latest end of its requests
/// and the request that ended then (not always the last to arrive); None when its last
/// request's end is unknown.
fn finished(requests: &[usize], records: &[TraceRecord]) -> Option<(i64, usize)> {
    end(&records[*requests.last()?])?;
    requests
        .iter()
        .filter_map(|&j| end(&records[j]).map(|e| (e, j)))
        .max_by_key(|&(e, _)| e)
}

/// When a request ended (arrival + `e2el_us`), if its duration is known.
fn end(r: &TraceRecord) -> Option<i64> {
    r.e2el_us.map(|d| r.arrival_time_us.saturating_add(d))
}

/// Links requests as they are read, a row at a time (a file too large to hold): each request
/// with a session continues the previous request of its session in file order, with the think
/// time after that one's end (as [`link`] reckons it). Memory holds one request per session. A
/// request arriving before the previous one of its session (a file not in arrival order
/// within its sessions) is left unlinked and counted in `out_of_order`.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// Each session's latest request: its id, arrival and end.
    last: HashMap<String, (String, i64, Option<i64>)>,
    /// Requests left unlinked because they arrive before the previous one of their session.
    pub(crate) out_of_order: usize,
}

impl Sessions {
    /// Links `r` to the previous request of its session (none for a session's first).
    pub(crate) fn link(&mut self, r: &mut TraceRecord) {
        let Some(session) = r.session_id.as_deref() else {
            return;
        };
        let at = r.arrival_time_us;
        match self.last.get(session) {
            Some((_, prev_at, _)) if *prev_at > at => {
                self.out_of_order += 1;
                return;
            }
            Some((id, _, prev_end)) => {
                r.parent_request_id = Some(id.clone());
                r.parent_link = Some(ParentLink::Recorded);
                r.think_time_us = prev_end.map(|e| at.saturating_sub(e).max(0));
            }
            None => {}
        }
        let this = (r.request_id.clone(), at, end(r));
        self.last.insert(session.to_string(), this);
    }

    /// The note for the requests left unlinked, if any.
    pub(crate) fn note(&self) -> Option<String> {
        (self.out_of_order > 0).then(|| {
            format!(
                "{} rows arrive before an earlier row of their session: not linked to it",
                self.out_of_order
            )
        })
    }
}

/// Links `records` (any order; `chains[i]` is where `records[i]` belongs), in arrival order
/// (file order among equal arrivals).
pub(crate) fn link(records: &mut [TraceRecord], chains: &[Chain], how: Links) {
    debug_assert_eq!(records.len(), chains.len());
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| records[i].arrival_time_us);
    // Each chain's requests in arrival order, and which chains each chain spawned.
    let mut of_chain: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
    for &i in &order {
        let Some(key) = chains[i].key.as_deref() else {
            continue;
        };
        let seen = of_chain.entry(key).or_default();
        if seen.is_empty() {
            if let Some(from) = chains[i].spawned_from.as_deref() {
                if !chains[i].detached {
                    children.entry(from).or_default().push(key);
                }
            }
        }
        seen.push(i);
    }
    let mut position: HashMap<&str, usize> = HashMap::new();
    let mut joined: HashSet<&str> = HashSet::new();
    for &i in &order {
        let Some(key) = chains[i].key.as_deref() else {
            continue;
        };
        let at = records[i].arrival_time_us;
        let n = position.entry(key).or_insert(0);
        let own = &of_chain[key];
        let prev = (*n > 0).then(|| own[*n - 1]);
        *n += 1;
        let (parent, link, given_applies) = match prev {
            Some(p) => {
                let mut best = (p, end(&records[p]));
                if how.join_children {
                    for &c in children.get(key).map(Vec::as_slice).unwrap_or(&[]) {
                        let Some((e, last)) = finished(&of_chain[c], records) else {
                            continue;
                        };
                        let later = best.1.is_none_or(|b| e > b);
                        if !joined.contains(c) && e <= at && later {
                            best = (last, Some(e));
                        }
                    }
                }
                if best.0 != p {
                    joined.insert(chains[best.0].key.as_deref().expect("keyed"));
                }
                (best.0, ParentLink::Recorded, best.0 == p)
            }
            None => {
                let Some(from) = chains[i].spawned_from.as_deref() else {
                    continue;
                };
                let Some(spawner) = of_chain.get(from) else {
                    continue;
                };
                let arrived = spawner
                    .iter()
                    .filter(|&&j| records[j].arrival_time_us <= at && j != i);
                let ended = arrived
                    .clone()
                    .filter_map(|&j| end(&records[j]).filter(|&e| e <= at).map(|e| (e, j)))
                    .max_by_key(|&(e, _)| e)
                    .map(|(_, j)| j);
                let latest = arrived.clone().next_back().copied();
                let chosen = if how.subagent_from_ended {
                    ended.or(latest)
                } else {
                    latest
                };
                let Some(p) = chosen else {
                    continue;
                };
                (p, ParentLink::Subagent, false)
            }
        };
        let (id, parent_end) = (records[parent].request_id.clone(), end(&records[parent]));
        let r = &mut records[i];
        r.parent_request_id = Some(id);
        r.parent_link = Some(link);
        if !given_applies || r.think_time_us.is_none() {
            r.think_time_us = parent_end.map(|e| r.arrival_time_us.saturating_sub(e).max(0));
        }
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
            detached: false,
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
        link(&mut rs, &cs, Links::default());
        let p: Vec<_> = rs.iter().map(|r| r.parent_request_id.as_deref()).collect();
        assert_eq!(p, vec![Some("a1"), None, Some("a1"), Some("s1"), None]);
        // a2: 5000 - (0 + 2000); s1: 2500 - 2000; s2: its parent has no duration.
        let t: Vec<_> = rs.iter().map(|r| r.think_time_us).collect();
        assert_eq!(t, vec![Some(3_000), None, Some(500), None, None]);
        let l: Vec<_> = rs.iter().map(|r| r.parent_link).collect();
        use ParentLink::*;
        assert_eq!(
            l,
            vec![Some(Recorded), None, Some(Subagent), Some(Recorded), None]
        );
    }

    /// Row by row: each continues its session's previous row; a row arriving before it is
    /// left unlinked and counted.
    #[test]
    fn sessions_link_row_by_row_and_count_rows_out_of_order() {
        let mut s = Sessions::default();
        let mut rs = [
            rec("a1", 1_000, Some(800)),
            rec("b1", 1_500, None),
            rec("a2", 3_000, Some(700)),
            rec("b2", 9_000, None),
            rec("a0", 2_000, None),
            rec("x", 0, None),
        ];
        for (r, sid) in rs.iter_mut().zip(["A", "B", "A", "B", "A", ""]) {
            r.session_id = (!sid.is_empty()).then(|| sid.to_string());
            s.link(r);
        }
        let p: Vec<_> = rs.iter().map(|r| r.parent_request_id.as_deref()).collect();
        assert_eq!(p, vec![None, None, Some("a1"), Some("b1"), None, None]);
        let t: Vec<_> = rs.iter().map(|r| r.think_time_us).collect();
        assert_eq!(t, vec![None, None, Some(1_200), None, None, None]);
        assert_eq!(s.out_of_order, 1);
        assert!(s.note().unwrap().starts_with("1 rows arrive before"));
    }

    #[test]
    fn overlapping_turns_think_zero_and_given_think_times_stay() {
        let mut rs = vec![rec("a", 0, Some(5_000)), rec("b", 1_000, None)];
        link(
            &mut rs,
            &[chain("A", None), chain("A", None)],
            Links::default(),
        );
        assert_eq!(rs[1].think_time_us, Some(0));
        let mut rs = vec![rec("a", 0, Some(5_000)), rec("b", 1_000, None)];
        rs[1].think_time_us = Some(77);
        link(
            &mut rs,
            &[chain("A", None), chain("A", None)],
            Links::default(),
        );
        assert_eq!(rs[1].think_time_us, Some(77));
        // Ends past the end of time saturate instead of wrapping into a huge think time.
        let mut rs = vec![
            rec("a", i64::MAX - 5, Some(i64::MAX)),
            rec("b", i64::MAX - 1, None),
        ];
        link(
            &mut rs,
            &[chain("A", None), chain("A", None)],
            Links::default(),
        );
        assert_eq!(rs[1].think_time_us, Some(0));
    }

    /// A sub-agent continues the parent request that had ended before it (not one still
    /// running), and the parent's next request waits on the sub-agent that finished last
    /// before it, once; a sub-agent still running when the parent resumes joins nothing.
    #[test]
    fn subagents_link_to_an_ended_request_and_the_parent_joins_them() {
        let mut rs = vec![
            rec("p1", 0, Some(1_000)),
            rec("p2", 1_500, Some(10_000)), // still running when s1 spawns
            rec("s1", 2_000, Some(500)),
            rec("s1b", 3_000, Some(1_000)), // s1 ends at 4_000
            rec("t1", 2_100, Some(50_000)), // t runs past p3
            rec("p3", 13_000, Some(100)),   // p2 ended at 11_500: no join (s1 ended before)
            rec("p4", 20_000, Some(100)),
            rec("u1", 14_000, Some(2_000)), // spawned after p3; ends 16_000, before p4
        ];
        rs[5].think_time_us = Some(9); // given: kept (its parent is its own previous)
        rs[6].think_time_us = Some(9); // given, but p4 waits on u: replaced
        let cs = vec![
            chain("P", None),
            chain("P", None),
            chain("S", Some("P")),
            chain("S", Some("P")),
            chain("T", Some("P")),
            chain("P", None),
            chain("P", None),
            chain("U", Some("P")),
        ];
        let how = Links {
            subagent_from_ended: true,
            join_children: true,
        };
        let before = rs.clone();
        link(&mut rs, &cs, how);
        let p = |rs: &[TraceRecord], i: usize| rs[i].parent_request_id.clone();
        let s = |x: &str| Some(x.to_string());
        assert_eq!(
            (p(&rs, 2), p(&rs, 4), p(&rs, 7)),
            (s("p1"), s("p1"), s("p3"))
        );
        assert_eq!(p(&rs, 5), s("p2"));
        assert_eq!(rs[5].think_time_us, Some(9));
        assert_eq!(p(&rs, 6), s("u1"));
        assert_eq!(rs[6].think_time_us, Some(20_000 - 16_000));
        assert_eq!(rs[6].parent_link, Some(ParentLink::Recorded));
        // Without the options: the latest arrived request, no join.
        let mut rs = before;
        link(&mut rs, &cs, Links::default());
        assert_eq!((p(&rs, 2), p(&rs, 6)), (s("p2"), s("p3")));
    }
}
