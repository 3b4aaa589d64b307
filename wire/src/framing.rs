//! HTTP/1.1 response framing shared by capture's lean upstream path and replay's client:
//! how a response body is delimited (RFC 9112 §6.3), whether its connection may be reused,
//! and an incremental `transfer-encoding: chunked` decoder that works on whatever a read
//! delivered, in place.
//!
//! Both sides read their responses straight from a socket buffer, one frame per read, so the
//! rules live here once: a response both read must be framed the same way by both.

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `content-length` bytes (0: no body).
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Until the server closes the connection.
    Eof,
}

/// What a final response's head says about its body and connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseFraming {
    /// How the body is delimited.
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Largest chunk-size line (with extensions) or trailer line accepted, bytes.
pub const MAX_CHUNK_LINE: usize = 16 * 1024;
/// Most trailer bytes kept.
pub const MAX_TRAILERS: usize = 64 * 1024;

/// The framing of a final response to a request that is not HEAD or CONNECT (RFC 9112 §6.3,
/// as hyper's client decides it): 101, 204 and 304 have no body; a `transfer-encoding`
/// whose last coding is `chunked` is chunked, any other is read to EOF (and is an error in
/// HTTP/1.0); else `content-length` (a list of equal values is one value; different values
/// are an error); else to EOF. The connection is kept alive unless the body is read to EOF,
/// the status is 101, or `connection` says `close` (HTTP/1.1) or lacks `keep-alive`
/// (HTTP/1.0).
pub fn response_framing(
    status: u16,
    http10: bool,
    headers: &[httparse::Header<'_>],
) -> Result<ResponseFraming, String> {
    let mut transfer_encoding: Option<&[u8]> = None;
    let mut length: Option<u64> = None;
    let (mut close, mut keep_alive_token) = (false, false);
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).map_err(|_| bad_length(h.value))?;
            for part in v.split(',') {
                let p = part.trim();
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad_length(h.value));
                }
                let n: u64 = p.parse().map_err(|_| bad_length(h.value))?;
                if length.is_some_and(|l| l != n) {
                    return Err("conflicting content-length values".into());
                }
                length = Some(n);
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in String::from_utf8_lossy(h.value).split(',') {
                let t = token.trim();
                close |= t.eq_ignore_ascii_case("close");
                keep_alive_token |= t.eq_ignore_ascii_case("keep-alive");
            }
        }
    }
    let framing = if matches!(status, 101 | 204 | 304) {
        Framing::Length(0)
    } else if let Some(te) = transfer_encoding {
        if http10 {
            return Err("transfer-encoding in an HTTP/1.0 response".into());
        }
        let last = String::from_utf8_lossy(te);
        match last.rsplit(',').next().map(str::trim) {
            Some(l) if l.eq_ignore_ascii_case("chunked") => Framing::Chunked,
            _ => Framing::Eof,
        }
    } else {
        length.map_or(Framing::Eof, Framing::Length)
    };
    let keep_alive =
        framing != Framing::Eof && status != 101 && if http10 { keep_alive_token } else { !close };
    Ok(ResponseFraming {
        framing,
        keep_alive,
    })
}

fn bad_length(v: &[u8]) -> String {
    format!(
        "invalid content-length {:?}",
        String::from_utf8_lossy(&v[..v.len().min(40)])
    )
}

/// Incremental decoder of a chunked body (RFC 9112 §7.1), in place: the data of a buffer is
/// moved to its front (data never moves forward, so unread bytes are never overwritten).
/// Chunk extensions are skipped; a bare LF ends a line as CRLF does; trailer fields are kept
/// (raw, each line ending in CRLF).
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    /// Data bytes left in the current chunk.
    left: u64,
    /// The line in progress (chunk size, the CRLF after data, or a trailer field), when a
    /// read ended inside it.
    line: Vec<u8>,
    /// Raw trailer field lines, each ending in CRLF.
    trailers: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data,
    DataEnd,
    Trailers,
    Done,
}

impl ChunkedDecoder {
    /// Decodes `input` in place: returns `(data, used)`, the data now in `input[..data]`
    /// and the bytes of `input` consumed (all of them unless the body ended inside it).
    pub fn decode(&mut self, input: &mut [u8]) -> Result<(usize, usize), String> {
        let mut i = 0;
        let mut w = 0;
        while i < input.len() {
            match self.state {
                ChunkState::Done => return Ok((w, i)),
                ChunkState::Data => {
                    let n = (input.len() - i).min(usize::try_from(self.left).unwrap_or(usize::MAX));
                    input.copy_within(i..i + n, w);
                    w += n;
                    self.left -= n as u64;
                    i += n;
                    if self.left == 0 {
                        self.state = ChunkState::DataEnd;
                    }
                }
                ChunkState::Size | ChunkState::DataEnd | ChunkState::Trailers => {
                    let Some(j) = memchr::memchr(b'\n', &input[i..]) else {
                        self.line.extend_from_slice(&input[i..]);
                        if self.line.len() > MAX_CHUNK_LINE {
                            return Err("chunk line too long".into());
                        }
                        return Ok((w, input.len()));
                    };
                    if self.line.len() + j > MAX_CHUNK_LINE {
                        return Err("chunk line too long".into());
                    }
                    let line: &[u8] = if self.line.is_empty() {
                        &input[i..i + j]
                    } else {
                        self.line.extend_from_slice(&input[i..i + j]);
                        &self.line
                    };
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    match self.state {
                        ChunkState::Size => match chunk_size(line)? {
                            0 => self.state = ChunkState::Trailers,
                            size => {
                                self.left = size;
                                self.state = ChunkState::Data;
                            }
                        },
                        ChunkState::DataEnd => {
                            if !line.is_empty() {
                                return Err("chunk data longer than its size".into());
                            }
                            self.state = ChunkState::Size;
                        }
                        _ if line.is_empty() => self.state = ChunkState::Done,
                        _ => {
                            if self.trailers.len() + line.len() > MAX_TRAILERS {
                                return Err("trailers too large".into());
                            }
                            self.trailers.extend_from_slice(line);
                            self.trailers.extend_from_slice(b"\r\n");
                        }
                    }
                    self.line.clear();
                    i += j + 1;
                }
            }
        }
        Ok((w, i))
    }

    /// The terminating chunk and trailer section have been read.
    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// The raw trailer field lines read so far (each ending in CRLF), taken out.
    pub fn take_trailers(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.trailers)
    }
}

/// The size of a chunk-size line (hex digits, optional whitespace and `;extensions`).
fn chunk_size(line: &[u8]) -> Result<u64, String> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(format!(
            "invalid chunk size line {:?}",
            String::from_utf8_lossy(&line[..line.len().min(40)])
        ));
    }
    let rest = line[digits..].trim_ascii_start();
    if !(rest.is_empty() || rest[0] == b';') {
        return Err("invalid chunk size line".into());
    }
    let hex = std::str::from_utf8(&line[..digits]).map_err(|e| e.to_string())?;
    u64::from_str_radix(hex, 16).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `pieces` as successive reads (each decoded in a copy, in place): the data,
    /// the decoder, and the bytes of the last piece consumed.
    fn decode_all(pieces: &[&[u8]]) -> Result<(Vec<u8>, ChunkedDecoder, usize), String> {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut used = 0;
        for p in pieces {
            let mut read = p.to_vec();
            let (n, u) = d.decode(&mut read)?;
            out.extend_from_slice(&read[..n]);
            used = u;
            if d.done() {
                break;
            }
        }
        Ok((out, d, used))
    }

    const BODY: &[u8] = b"6\r\ndata: \r\n1a;ext=1\r\n{\"choices\":[{\"text\":\"a\"}]}\r\nA\r\n\n\ndata: [D\r\n5  \r\nONE]\n\r\n0\r\n\r\n";
    const DECODED: &[u8] = b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n";

    #[test]
    fn chunked_decodes_at_every_split_and_bytewise() {
        let (out, d, used) = decode_all(&[BODY]).unwrap();
        assert_eq!(out, DECODED);
        assert!(d.done());
        assert_eq!(used, BODY.len());
        for cut in 0..=BODY.len() {
            let (a, b) = BODY.split_at(cut);
            let (out, d, _) = decode_all(&[a, b]).unwrap();
            assert_eq!(out, DECODED, "cut at {cut}");
            assert!(d.done(), "cut at {cut}");
        }
        for piece in 1..BODY.len() {
            let reads: Vec<&[u8]> = BODY.chunks(piece).collect();
            let (out, d, _) = decode_all(&reads).unwrap();
            assert_eq!(out, DECODED, "reads of {piece}");
            assert!(d.done(), "reads of {piece}");
        }
    }

    #[test]
    fn bare_lf_line_ends_are_tolerated_and_bytes_after_the_end_are_left() {
        let mut input = b"3\nabc\n0\n\nEXTRA".to_vec();
        let mut d = ChunkedDecoder::default();
        let (n, used) = d.decode(&mut input).unwrap();
        assert_eq!((&input[..n], used, d.done()), (&b"abc"[..], 9, true));
    }

    #[test]
    fn chunked_stops_at_the_end_and_keeps_trailers() {
        let mut d = ChunkedDecoder::default();
        let mut input = b"3\r\nabc\r\n0\r\nx-a: 1\r\nx-b: two\r\n\r\nHTTP/1.1 200 OK".to_vec();
        let (n, used) = d.decode(&mut input).unwrap();
        assert_eq!(&input[..n], b"abc");
        assert!(d.done());
        assert_eq!(&input[used..], b"HTTP/1.1 200 OK");
        assert_eq!(d.take_trailers(), b"x-a: 1\r\nx-b: two\r\n");
        assert!(d.take_trailers().is_empty());
    }

    #[test]
    fn chunked_rejects_garbage() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"3\r\nabcX\r\n",
            b"3\r\nabcd\r\n",
            b"1234567890abcdef0\r\n",
            b"3 x\r\n",
        ] {
            assert!(decode_all(&[bad]).is_err(), "{bad:?}");
        }
        let mut ext = b"1;".to_vec();
        ext.extend(std::iter::repeat_n(b'x', MAX_CHUNK_LINE + 1));
        assert!(decode_all(&[&ext]).is_err());
        // The same line, over many reads.
        let reads: Vec<&[u8]> = ext.chunks(1000).collect();
        assert!(decode_all(&reads).is_err());
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..(MAX_TRAILERS / 100 + 1) {
            trailers.extend(std::iter::repeat_n(b'x', 100));
            trailers.extend_from_slice(b": 1\r\n");
        }
        assert!(decode_all(&[&trailers]).is_err());
    }

    fn framing(raw: &str) -> Result<ResponseFraming, String> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut headers);
        assert!(r.parse(raw.as_bytes()).unwrap().is_complete(), "{raw}");
        response_framing(r.code.unwrap(), r.version == Some(0), r.headers)
    }

    fn rf(framing: Framing, keep_alive: bool) -> Result<ResponseFraming, String> {
        Ok(ResponseFraming {
            framing,
            keep_alive,
        })
    }

    #[test]
    fn framing_and_keep_alive_follow_rfc_9112() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
                rf(Framing::Chunked, true),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\n",
                rf(Framing::Length(12), false),
            ),
            // A transfer-encoding that does not end in chunked is read to EOF, and overrides
            // content-length.
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ncontent-length: 3\r\n\r\n",
                rf(Framing::Eof, false),
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                rf(Framing::Chunked, true),
            ),
            ("HTTP/1.1 500 Internal Server Error\r\n\r\n", rf(Framing::Eof, false)),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n",
                rf(Framing::Length(2), true),
            ),
            ("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n", rf(Framing::Length(2), false)),
            (
                "HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n",
                rf(Framing::Eof, false),
            ),
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n",
                rf(Framing::Length(0), true),
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
                rf(Framing::Length(0), false),
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
                rf(Framing::Length(5), true),
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(framing(raw), want, "{raw}");
        }
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert!(framing(bad).is_err(), "{bad}");
        }
    }
}
