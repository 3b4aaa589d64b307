//! W3C Trace Context (`traceparent`, <https://www.w3.org/TR/trace-context/>): the one place
//! the project parses, makes and prints it. Replay sends one with every request and capture
//! forwards the client's (or starts one); the row keeps its ids (`trace_id`, `span_id`,
//! schema 1.3), so a server's own spans for a request (vLLM's `--otlp-traces-endpoint`) join
//! the row on the trace id.

use std::fmt;

use crate::fnv::{fnv1a, OFFSET};

/// The header's name.
pub const TRACEPARENT: &str = "traceparent";

/// The length of a version-`00` header value.
pub const VALUE_LEN: usize = 55;

/// A trace id and the parent id sent with it (the span the server's span is a child of).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, never all zero.
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

/// splitmix64's finalizer: spreads an FNV hash over all 64 bits.
use crate::fnv::finalize as mix;

fn hash(scope: &str, id: &str, salt: u8) -> u64 {
    let h = fnv1a(fnv1a(fnv1a(OFFSET, &[salt]), scope.as_bytes()), &[0xff]);
    // Zero is not a valid id; a hash of zero (one in 2^64) becomes one.
    mix(fnv1a(h, id.as_bytes())).max(1)
}

impl TraceContext {
    /// The context of request `id` in `scope` (replay: the run id; capture: the capture's
    /// id prefix): a pure function of the two, so the ids can be recomputed from a row, and
    /// unique as long as (scope, id) is (a run id carries its start time). Sampled.
    pub fn derive(scope: &str, id: &str) -> TraceContext {
        let (a, b, s) = (hash(scope, id, 1), hash(scope, id, 2), hash(scope, id, 3));
        let mut trace_id = [0; 16];
        trace_id[..8].copy_from_slice(&a.to_be_bytes());
        trace_id[8..].copy_from_slice(&b.to_be_bytes());
        TraceContext {
            trace_id,
            span_id: s.to_be_bytes(),
            flags: 1,
        }
    }

    /// A `traceparent` header value of version `00` (or a later version, read by its first
    /// four fields as the spec asks); `None` when it is not valid (then it is not used).
    pub fn parse(value: &str) -> Option<TraceContext> {
        let v = value.trim_matches([' ', '\t']);
        let b = v.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex::<1>(&v[..2])?[0];
        if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        let trace_id = hex::<16>(&v[3..35])?;
        let span_id = hex::<8>(&v[36..52])?;
        let flags = hex::<1>(&v[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id as 32 lowercase hex digits (the `trace_id` column).
    pub fn trace_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The parent id as 16 lowercase hex digits (the `span_id` column).
    pub fn span_hex(&self) -> String {
        to_hex(&self.span_id)
    }

    /// The `traceparent` header value (version `00`), as [`fmt::Display`] prints it, in a
    /// buffer of its own: replay writes it into every request, and so without an allocation.
    pub fn value(&self) -> [u8; VALUE_LEN] {
        let mut v = [b'-'; VALUE_LEN];
        v[..2].copy_from_slice(b"00");
        hex_into(&self.trace_id, &mut v[3..35]);
        hex_into(&self.span_id, &mut v[36..52]);
        hex_into(&[self.flags], &mut v[53..]);
        v
    }

    /// Sets the row's `trace_id` and `span_id`.
    pub fn fill(&self, row: &mut crate::TraceRecord) {
        row.trace_id = Some(self.trace_hex());
        row.span_id = Some(self.span_hex());
    }
}

/// The `traceparent` header value: `00-<trace id>-<parent id>-<flags>`.
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.value()).map_err(|_| fmt::Error)?)
    }
}

/// Writes the lowercase hex of `bytes` into `out` (two digits a byte; `out` is that long).
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const D: &[u8; 16] = b"0123456789abcdef";
    for (b, o) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        o[0] = D[usize::from(b >> 4)];
        o[1] = D[usize::from(b & 15)];
    }
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut v = vec![0; bytes.len() * 2];
    hex_into(bytes, &mut v);
    String::from_utf8(v).unwrap_or_default()
}

/// `N` bytes from `2N` lowercase hex digits (the spec forbids uppercase).
pub fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (d(b[2 * i])? << 4) | d(b[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// The spec's example reads and prints back byte for byte.
    #[test]
    fn the_specs_example_round_trips() {
        let c = TraceContext::parse(EXAMPLE).unwrap();
        assert_eq!(c.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.span_hex(), "00f067aa0ba902b7");
        assert_eq!(c.flags, 1);
        assert_eq!(c.to_string(), EXAMPLE);
        assert_eq!(&c.value(), EXAMPLE.as_bytes());
        let flags = TraceContext { flags: 0xa0, ..c };
        assert_eq!(TraceContext::parse(&flags.to_string()), Some(flags));
        assert!(flags.to_string().ends_with("-a0"));
        // A later version may append fields; its first four are read.
        let v2 = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert_eq!(TraceContext::parse(v2).unwrap().trace_id, c.trace_id);
    }

    /// What the spec calls invalid is not used (capture then starts its own).
    #[test]
    fn invalid_headers_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47☃-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }

    /// Derived ids are valid, stable, and differ per request and per run.
    #[test]
    fn derived_ids_are_stable_valid_and_distinct() {
        let a = TraceContext::derive("run-1", "r0");
        assert_eq!(a, TraceContext::derive("run-1", "r0"));
        assert_eq!(TraceContext::parse(&a.to_string()), Some(a));
        let mut seen = std::collections::HashSet::new();
        for run in ["run-1", "run-2"] {
            for i in 0..5_000 {
                let c = TraceContext::derive(run, &format!("r{i}"));
                assert!(seen.insert(c.trace_id), "{run} r{i}");
                assert_ne!(c.span_id, [0; 8]);
            }
        }
        // Scope and id are not merely concatenated.
        assert_ne!(
            TraceContext::derive("ab", "c").trace_id,
            TraceContext::derive("a", "bc").trace_id
        );
    }
}
