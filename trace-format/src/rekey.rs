//! Re-keying a trace (`llmreplay rekey`): its content hashes as another key makes them, so a
//! trace can go to someone holding a different key (a vendor, another team) or a fleet's
//! captures made under several keys can be compared.
//!
//! Who can do it ([`Plan::of`]): the holder of the trace's key, for any grade (a keyed value is
//! a keyed permutation of the unkeyed hash, [`crate::keyed`], so the old key inverts it); the
//! holder of a `full` trace without its key, by deriving the hashes again from the bodies
//! (the caller supplies the derivation: the prompt's blocks as capture makes them); anyone, for
//! a capture from before keyed hashes (its values are the unkeyed hashes). Nobody else: a
//! `hashes` trace never held its unkeyed values, and a trace made by 2026-12's first keyed
//! hash (`v1`, a PRF) cannot be re-keyed by anyone.

use crate::keyed::{keyed_name, Domain, HashKey};
use crate::privacy::{Grade, Manifest};
use crate::schema::TraceRecord;

/// Why a trace cannot be re-keyed as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RekeyError {
    /// The trace holds no content hash.
    #[error("the trace holds no content hashes (grade {grade}): there is nothing to re-key")]
    NothingToRekey {
        /// The trace's grade.
        grade: String,
    },
    /// A `hashes` trace and no old key: its unkeyed values were never written.
    #[error(
        "the trace's hashes were made under key id {key_id} and it holds no prompts: only the \
         holder of that key can re-key it (--old-key-file); its unkeyed values were never \
         written, by design"
    )]
    NeedsOldKey {
        /// The trace's key id.
        key_id: String,
    },
    /// The old key given is not the trace's.
    #[error("the old key file holds key id {given}, but the trace's hashes were made under key id {key_id}")]
    WrongKey {
        /// The given key's id.
        given: String,
        /// The trace's.
        key_id: String,
    },
    /// The trace was hashed by the first keyed hash, which has no inverse.
    #[error(
        "the trace's hashes (key id {key_id}) were made by an earlier build's keyed hash (a \
         PRF with no inverse), which nobody can re-key; re-capture, or re-key a `full` \
         trace of the same traffic"
    )]
    NotInvertible {
        /// The trace's key id (under the old label).
        key_id: String,
    },
    /// A `full` trace's row whose hashes cannot be derived again from its body.
    #[error(
        "row {request_id}: {why}; re-derive with the capture's tokenizer ({tokenizer}), or \
         give the trace's key (--old-key-file)"
    )]
    Underivable {
        /// The row.
        request_id: String,
        /// Why.
        why: String,
        /// The tokenizer the trace's manifest names.
        tokenizer: String,
    },
}

/// How a trace's values are made again under the new key.
#[derive(Debug)]
pub enum Source {
    /// Inverting the old key's permutation.
    OldKey(HashKey),
    /// The values are the unkeyed hashes (a capture before keyed hashing).
    Unkeyed,
    /// Deriving the prefix hashes again from each row's body (a `full` trace).
    Bodies,
}

/// A re-keying: from what, to which key, the grade the output keeps.
#[derive(Debug)]
pub struct Plan {
    /// Where the unkeyed values come from.
    pub source: Source,
    /// The grade of the trace (and of its output).
    pub grade: Grade,
    /// The new key.
    pub to: HashKey,
}

impl Plan {
    /// How the trace with `manifest` (None: a capture before manifests, whose prefix hashes
    /// are unkeyed) is re-keyed to `to`, given the `old` key if the caller holds one.
    pub fn of(
        manifest: Option<&Manifest>,
        old: Option<HashKey>,
        to: HashKey,
    ) -> Result<Plan, RekeyError> {
        let Some(m) = manifest else {
            return Ok(Plan {
                source: Source::Unkeyed,
                grade: Grade::Hashes,
                to,
            });
        };
        let Some(key_id) = m.key_id.clone() else {
            return Err(RekeyError::NothingToRekey {
                grade: m.grade.to_string(),
            });
        };
        let source = match old {
            Some(k) if k.id().0 == key_id => Source::OldKey(k),
            Some(k) if k.id_v1().0 == key_id => return Err(RekeyError::NotInvertible { key_id }),
            Some(k) => {
                return Err(RekeyError::WrongKey {
                    given: k.id().0,
                    key_id,
                })
            }
            None if m.grade == Grade::Full => Source::Bodies,
            None => return Err(RekeyError::NeedsOldKey { key_id }),
        };
        Ok(Plan {
            source,
            grade: m.grade,
            to,
        })
    }

    /// The manifest of the output: the trace's, under the new key.
    pub fn manifest(&self, manifest: Option<&Manifest>, block_size: u32) -> Manifest {
        let mut m = manifest
            .cloned()
            .unwrap_or_else(|| Manifest::new(self.grade, None, block_size, "unknown"));
        m.key_id = Some(self.to.id().0);
        m
    }

    /// `r`'s content hashes under the new key. `derive` gives the unkeyed prefix hashes of a
    /// row's body (used only for [`Source::Bodies`]): None when the body holds no prompt it
    /// can read. `tokenizer` names the trace's, for errors.
    pub fn record(
        &self,
        r: &mut TraceRecord,
        derive: &dyn Fn(&TraceRecord) -> Option<Vec<u64>>,
        tokenizer: &str,
    ) -> Result<(), RekeyError> {
        let to = &self.to;
        match &self.source {
            Source::OldKey(k) => {
                let rekey = |v: &mut u64| *v = k.rekey_u64(to, Domain::Block, *v);
                if let Some(h) = &mut r.prefix_hashes {
                    h.iter_mut().for_each(rekey);
                }
                r.link_keys.for_each_value(rekey);
            }
            Source::Unkeyed => {
                if let Some(h) = &mut r.prefix_hashes {
                    h.iter_mut().for_each(|v| *v = to.hash_u64(*v));
                }
            }
            Source::Bodies => {
                // The link keys (`llmreplay link` across captures) hash call ids, responses'
                // ids and who sent a request, which the body does not hold: without the old
                // key they cannot be made again, and keys under two keys would never match.
                // The row's own links (parent, session) are kept.
                r.link_keys = crate::fleet::LinkKeys::default();
                let Some(old) = &r.prefix_hashes else {
                    return Ok(());
                };
                let why = |why: String| RekeyError::Underivable {
                    request_id: r.request_id.clone(),
                    why,
                    tokenizer: tokenizer.to_string(),
                };
                if r.body.is_none() {
                    return Err(why("it has prefix hashes but no body".into()));
                }
                let new = derive(r).ok_or_else(|| why("its body holds no prompt".into()))?;
                if new.len() != old.len() {
                    return Err(why(format!(
                        "its body gives {} blocks where the capture recorded {}",
                        new.len(),
                        old.len()
                    )));
                }
                r.prefix_hashes = Some(new.into_iter().map(|h| to.hash_u64(h)).collect());
            }
        }
        for names in [&mut r.tool_names, &mut r.tool_call_names]
            .into_iter()
            .flatten()
        {
            for n in names.iter_mut() {
                *n = self.tool_name(n);
            }
        }
        Ok(())
    }

    /// A tool name under the new key: a keyed one (`h:` + 16 hex digits) re-keyed; one as
    /// sent kept under `full`, else keyed.
    fn tool_name(&self, n: &str) -> String {
        let keyed = n
            .strip_prefix("h:")
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        match (keyed, &self.source) {
            (Some(v), Source::OldKey(k)) => keyed_name(k.rekey_u64(&self.to, Domain::Bytes, v)),
            _ if self.grade == Grade::Full => n.to_string(),
            _ => keyed_name(self.to.hash_bytes(n.as_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::KeyId;

    fn row(hashes: Vec<u64>, tools: Vec<String>, body: Option<&str>) -> TraceRecord {
        let mut r = TraceRecord::new("r1", 0, "/v1/chat/completions");
        r.prefix_hashes = Some(hashes);
        r.tool_names = Some(tools);
        r.body = body.map(str::to_string);
        r
    }

    fn manifest(grade: Grade, key: &HashKey) -> Manifest {
        Manifest::new(grade, Some(&key.id()), 16, "words")
    }

    const NO_DERIVE: &dyn Fn(&TraceRecord) -> Option<Vec<u64>> = &|_| None;

    /// The holder of the key re-keys a `hashes` trace to exactly what the new key makes of
    /// the same content; without it, it is refused, naming the key id; a wrong key is named.
    #[test]
    fn the_holder_of_the_key_rekeys_a_hashes_trace_and_nobody_else() {
        let (old, new) = (HashKey::random(), HashKey::random());
        let unkeyed = [11u64, 22, 33];
        let mut r = row(
            unkeyed.iter().map(|&h| old.hash_u64(h)).collect(),
            vec![keyed_name(old.hash_bytes(b"read_file"))],
            None,
        );
        // Its fleet link keys (issue 56) too: what `llmreplay link` compares across captures.
        let links = |k: &HashKey| crate::fleet::LinkKeys {
            chat: Some(vec![k.hash_u64(5), k.hash_u64(6)]),
            answer: Some(k.hash_u64(7)),
            client: Some(k.hash_u64(8)),
            previous_response: Some(k.hash_u64(9)),
            ..Default::default()
        };
        r.link_keys = links(&old);
        let m = manifest(Grade::Hashes, &old);
        let p = Plan::of(Some(&m), Some(old.clone()), new.clone()).unwrap();
        p.record(&mut r, NO_DERIVE, "words").unwrap();
        let want: Vec<u64> = unkeyed.iter().map(|&h| new.hash_u64(h)).collect();
        assert_eq!(r.prefix_hashes.as_deref(), Some(&want[..]));
        assert_eq!(r.link_keys, links(&new));
        assert_eq!(
            r.tool_names.unwrap(),
            vec![keyed_name(new.hash_bytes(b"read_file"))]
        );
        assert_eq!(p.manifest(Some(&m), 16).key_id, Some(new.id().0));

        let e = Plan::of(Some(&m), None, new.clone()).unwrap_err();
        assert_eq!(e, RekeyError::NeedsOldKey { key_id: old.id().0 });
        let stranger = HashKey::random();
        let e = Plan::of(Some(&m), Some(stranger.clone()), new.clone()).unwrap_err();
        assert!(matches!(e, RekeyError::WrongKey { .. }), "{e}");
        assert!(e.to_string().contains(&stranger.id().0));
        // A trace of the first keyed hash: its holder is told it cannot be done.
        let v1 = Manifest::new(Grade::Hashes, Some(&old.id_v1()), 16, "words");
        let e = Plan::of(Some(&v1), Some(old), new).unwrap_err();
        assert!(matches!(e, RekeyError::NotInvertible { .. }), "{e}");
    }

    /// A `full` trace without its key: the hashes derived again from the bodies; a row whose
    /// body gives another number of blocks (another tokenizer) is refused, naming the row.
    #[test]
    fn a_full_trace_is_rekeyed_from_its_bodies() {
        let (old, new) = (HashKey::random(), HashKey::random());
        let m = manifest(Grade::Full, &old);
        let p = Plan::of(Some(&m), None, new.clone()).unwrap();
        let derive: &dyn Fn(&TraceRecord) -> Option<Vec<u64>> =
            &|r| Some(vec![r.body.as_ref()?.len() as u64, 7]);
        let mut r = row(
            vec![old.hash_u64(5), old.hash_u64(7)],
            vec!["read_file".into()],
            Some("hello"),
        );
        r.link_keys.client = Some(old.hash_u64(3));
        p.record(&mut r, derive, "words").unwrap();
        assert!(!r.link_keys.any(), "no link key under the old key is left");
        assert_eq!(
            r.prefix_hashes.unwrap(),
            vec![new.hash_u64(5), new.hash_u64(7)]
        );
        assert_eq!(r.tool_names.unwrap(), vec!["read_file".to_string()]);
        let mut short = row(vec![1, 2, 3], vec![], Some("hello"));
        let e = p.record(&mut short, derive, "cl100k_base").unwrap_err();
        assert!(
            e.to_string().contains("row r1")
                && e.to_string()
                    .contains("2 blocks where the capture recorded 3")
                && e.to_string().contains("cl100k_base"),
            "{e}"
        );
        let mut bodiless = row(vec![1, 2], vec![], None);
        assert!(p.record(&mut bodiless, derive, "words").is_err());
    }

    /// A capture from before keyed hashes is keyed by anyone; a perf trace has nothing.
    #[test]
    fn an_unkeyed_trace_is_keyed_and_a_perf_trace_refused() {
        let new = HashKey::random();
        let p = Plan::of(None, None, new.clone()).unwrap();
        let mut r = row(vec![9], vec!["grep".into()], None);
        p.record(&mut r, NO_DERIVE, "words").unwrap();
        assert_eq!(r.prefix_hashes.unwrap(), vec![new.hash_u64(9)]);
        assert_eq!(
            r.tool_names.unwrap(),
            vec![keyed_name(new.hash_bytes(b"grep"))]
        );
        let perf = Manifest::new(Grade::Perf, Some(&KeyId("ab".into())), 16, "words");
        let e = Plan::of(Some(&perf), None, new).unwrap_err();
        assert!(matches!(e, RekeyError::NothingToRekey { .. }));
    }
}
