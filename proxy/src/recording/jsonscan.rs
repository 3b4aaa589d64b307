//! A byte-level scanner that finds one top-level member of a JSON object without parsing it
//! into a tree, so the proxy can cut an injected `"usage": {...}` out of an SSE chunk and
//! leave every other byte exactly as the upstream sent it (no re-serialisation).
//!
//! It never allocates and never panics on any input: malformed or unexpected input (a line
//! break outside a string, input ending early) gives `None`, and the caller then forwards the
//! bytes untouched.

/// The byte range to delete from `buf` so that the top-level member `key` of the JSON object
/// starting at `buf[start]` is gone and the rest is still valid JSON with its original
/// formatting: `,"usage":{...}` (from the end of the previous value) when the member is not
/// the first, `"usage":{...},` plus following whitespace when it is the first, and just the
/// member when it is the only one. `None` when the member is absent or the object cannot be
/// scanned (including a CR or LF outside a string: the object spans several SSE lines).
///
/// `key` is compared with the raw key bytes, so it must not need escaping.
pub fn member_removal_range(buf: &[u8], start: usize, key: &[u8]) -> Option<(usize, usize)> {
    let mut s = Scanner { buf, i: start };
    s.expect(b'{')?;
    let mut prev_value_end: Option<usize> = None;
    loop {
        s.skip_ws()?;
        if s.peek()? == b'}' {
            return None;
        }
        let member_start = s.i;
        let (ks, ke) = s.string()?;
        s.skip_ws()?;
        s.expect(b':')?;
        s.skip_ws()?;
        s.value()?;
        let value_end = s.i;
        s.skip_ws()?;
        let next = s.peek()?;
        let matched = buf.get(ks..ke)? == key;
        if matched {
            return match (prev_value_end, next) {
                (Some(p), _) => Some((p, value_end)),
                (None, b',') => {
                    s.i += 1;
                    s.skip_ws()?;
                    Some((member_start, s.i))
                }
                (None, _) => Some((member_start, value_end)),
            };
        }
        match next {
            b',' => {
                s.i += 1;
                prev_value_end = Some(value_end);
            }
            _ => return None,
        }
    }
}

struct Scanner<'a> {
    buf: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.buf.get(self.i).copied()
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        if self.peek()? == b {
            self.i += 1;
            Some(())
        } else {
            None
        }
    }

    /// Skips spaces and tabs; a CR or LF means the JSON spans lines: give up.
    fn skip_ws(&mut self) -> Option<()> {
        loop {
            match self.peek()? {
                b' ' | b'\t' => self.i += 1,
                b'\r' | b'\n' => return None,
                _ => return Some(()),
            }
        }
    }

    /// A string starting at `i`; returns the range of its raw contents.
    fn string(&mut self) -> Option<(usize, usize)> {
        self.expect(b'"')?;
        let start = self.i;
        loop {
            let rest = self.buf.get(self.i..)?;
            let j = memchr::memchr3(b'"', b'\\', b'\n', rest)?;
            self.i += j;
            match rest[j] {
                b'"' => {
                    let end = self.i;
                    self.i += 1;
                    return Some((start, end));
                }
                b'\\' => self.i += 2,
                _ => return None,
            }
        }
    }

    /// Skips one value of any kind.
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        b'\r' | b'\n' => return None,
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                let start = self.i;
                while let Some(b) = self.peek() {
                    match b {
                        b',' | b'}' | b']' | b' ' | b'\t' => break,
                        b'\r' | b'\n' => return None,
                        _ => self.i += 1,
                    }
                }
                (self.i > start).then_some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(s: &str) -> Option<String> {
        let (a, b) = member_removal_range(s.as_bytes(), 0, b"usage")?;
        Some(format!("{}{}", &s[..a], &s[b..]))
    }

    #[test]
    fn removes_a_member_keeping_other_bytes() {
        assert_eq!(
            cut(r#"{"id":"x","choices":[{"t":"}"}],"usage":{"a":1,"b":[2]}}"#).as_deref(),
            Some(r#"{"id":"x","choices":[{"t":"}"}]}"#)
        );
        assert_eq!(
            cut(r#"{"usage":null, "choices":[]}"#).as_deref(),
            Some(r#"{"choices":[]}"#)
        );
        assert_eq!(cut(r#"{ "usage" : 5 }"#).as_deref(), Some(r#"{  }"#));
        assert_eq!(
            cut(r#"{"a":"\"usage\"", "usage": {"x":"\\"}, "b":1}"#).as_deref(),
            Some(r#"{"a":"\"usage\"", "b":1}"#)
        );
        assert_eq!(cut(r#"{"a":{"usage":1}}"#), None);
        assert_eq!(cut("{\"a\":1,\n\"usage\":1}"), None);
        assert_eq!(cut(r#"{"a":1,"usage":"#), None);
        assert_eq!(cut(""), None);
    }
}
