//! Property tests ("fuzzing") of the HTTP/1.1 framing both capture and replay read servers'
//! bytes with: the response-head rules and the in-place chunked decoder. Each runs a bounded
//! number of cases in CI; `LLMREPLAY_FUZZ_CASES=N` runs `N` per property (`bench/fuzz.sh`).
//! Failing cases proptest finds are kept in `proptest-regressions/fuzz_framing.txt`.

use proptest::prelude::*;
use wire::framing::{response_framing, ChunkedDecoder, Framing, MAX_CHUNK_LINE};

/// What decoding `input` as successive reads cut at `cuts` gave: the data, whether the body
/// ended, the trailers, the bytes of `input` consumed in all, or the error.
type Decoded = Result<(Vec<u8>, bool, Vec<u8>, usize), String>;

fn decode(input: &[u8], cuts: &[usize]) -> Decoded {
    let mut d = ChunkedDecoder::default();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut consumed = 0;
    let mut prev = 0;
    for cut in points.into_iter().chain([input.len()]) {
        if cut < prev {
            continue;
        }
        let mut read = input[prev..cut].to_vec();
        let (n, used) = d.decode(&mut read)?;
        assert!(
            n <= read.len() && used <= read.len(),
            "{n} {used} {}",
            read.len()
        );
        assert!(n <= used, "data beyond the bytes consumed");
        out.extend_from_slice(&read[..n]);
        consumed += used;
        prev = cut;
        if d.done() {
            break;
        }
        assert_eq!(used, read.len(), "bytes left before the end");
    }
    Ok((out, d.done(), d.take_trailers(), consumed))
}

/// A chunked encoding of `data`: chunk sizes in upper or lower case hex with leading zeros,
/// extensions, CRLF or bare LF line ends, trailer fields, and bytes after the end.
fn encoding() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, Vec<u8>)> {
    let chunk = (
        prop::collection::vec(any::<u8>(), 1..64),
        any::<bool>(),
        prop::option::of("[a-z]{1,5}(=[a-z0-9]{0,5})?"),
        any::<bool>(),
        0usize..3,
    );
    (
        prop::collection::vec(chunk, 0..8),
        prop::collection::vec("[A-Za-z-]{1,8}: [ -~]{0,12}", 0..3),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(|(chunks, trailers, lf_only, after)| {
            let eol: &[u8] = if lf_only { b"\n" } else { b"\r\n" };
            let mut wire = Vec::new();
            let mut data = Vec::new();
            for (bytes, upper, ext, lf, zeros) in chunks {
                let mut size = format!("{}{:x}", "0".repeat(zeros), bytes.len());
                if upper {
                    size = size.to_uppercase();
                }
                wire.extend_from_slice(size.as_bytes());
                if let Some(e) = ext {
                    wire.extend_from_slice(format!(";{e}").as_bytes());
                }
                let eol2: &[u8] = if lf { b"\n" } else { eol };
                wire.extend_from_slice(eol2);
                wire.extend_from_slice(&bytes);
                wire.extend_from_slice(eol2);
                data.extend_from_slice(&bytes);
            }
            wire.extend_from_slice(b"0");
            wire.extend_from_slice(eol);
            let mut want_trailers = Vec::new();
            for t in trailers {
                wire.extend_from_slice(t.as_bytes());
                wire.extend_from_slice(eol);
                want_trailers.extend_from_slice(t.as_bytes());
                want_trailers.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(eol);
            let body_len = wire.len();
            wire.extend_from_slice(&after);
            (
                wire,
                data,
                [want_trailers, body_len.to_le_bytes().to_vec()].concat(),
            )
        })
}

/// Bytes near a chunked body: valid pieces, damaged sizes, stray line ends, noise.
fn chunked_like() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        "[0-9a-fA-F]{1,17}".prop_map(String::into_bytes),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b";ext=1".to_vec()),
        Just(b" ".to_vec()),
        Just(b"0\r\n\r\n".to_vec()),
        Just(b"X-T: v\r\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ];
    prop::collection::vec(piece, 0..32).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(512)))]

    /// A valid encoding decodes to its data and trailers at any cutting into reads, stops
    /// exactly at its end, and leaves the bytes after it.
    #[test]
    fn valid_chunked_bodies_decode_at_any_cuts(
        (wire, data, extra) in encoding(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let (trailers, len) = extra.split_at(extra.len() - 8);
        let body_len = usize::from_le_bytes(len.try_into().unwrap());
        for cuts in [&[][..], &cuts[..]] {
            let (got, done, got_trailers, consumed) = decode(&wire, cuts).expect("valid body");
            prop_assert_eq!(&got, &data);
            prop_assert!(done);
            prop_assert_eq!(&got_trailers[..], trailers);
            prop_assert_eq!(consumed, body_len);
        }
    }

    /// Any bytes: the decoder never panics, never reports data beyond what it consumed, and
    /// its result does not depend on how the bytes were cut into reads.
    #[test]
    fn any_bytes_decode_the_same_at_any_cuts(
        input in prop_oneof![chunked_like(), prop::collection::vec(any::<u8>(), 0..256)],
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = decode(&input, &[]);
        let cut = decode(&input, &cuts);
        match (&whole, &cut) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "whole {:?} vs cut {:?}", whole, cut),
        }
    }

    /// A chunk-size line longer than the limit is an error, not unbounded memory.
    #[test]
    fn overlong_lines_are_refused(extra in 1usize..64, cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        let input = vec![b'1'; MAX_CHUNK_LINE + extra];
        prop_assert!(decode(&input, &cuts).is_err());
    }

    /// Any response head httparse accepts gets a framing or an error, never a panic; a single
    /// valid `content-length` is the body length.
    #[test]
    fn any_response_head_is_framed_or_refused(
        status in prop_oneof![Just(200u16), Just(204), Just(304), Just(101), 100u16..600],
        http10 in any::<bool>(),
        headers in prop::collection::vec(
            (
                prop_oneof![
                    Just("content-length".to_string()),
                    Just("Content-Length".to_string()),
                    Just("transfer-encoding".to_string()),
                    Just("connection".to_string()),
                    "[A-Za-z-]{1,12}",
                ],
                prop_oneof![
                    "[0-9]{1,25}".prop_map(String::into_bytes),
                    "[0-9]{1,4}, ?[0-9]{1,4}".prop_map(String::into_bytes),
                    Just(b"chunked".to_vec()),
                    Just(b"gzip, chunked".to_vec()),
                    Just(b"chunked, gzip".to_vec()),
                    Just(b"close".to_vec()),
                    Just(b"keep-alive, Upgrade".to_vec()),
                    prop::collection::vec(any::<u8>(), 0..16),
                ],
            ),
            0..6,
        ),
        raw in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        let hs: Vec<httparse::Header<'_>> = headers
            .iter()
            .map(|(n, v)| httparse::Header { name: n, value: v })
            .collect();
        let got = response_framing(status, http10, &hs);
        let lengths: Vec<&Vec<u8>> = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v)
            .collect();
        let te = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"));
        if let (Ok(f), [one]) = (&got, &lengths[..]) {
            let n = std::str::from_utf8(one).ok().and_then(|v| v.parse::<u64>().ok());
            if let (Some(n), false, false) = (n, te, matches!(status, 101 | 204 | 304)) {
                prop_assert_eq!(f.framing, Framing::Length(n));
            }
        }
        if let Ok(f) = &got {
            prop_assert!(!(f.framing == Framing::Eof && f.keep_alive));
        }
        // Raw bytes through httparse, as the connection layer reads a head.
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        head.extend_from_slice(&raw);
        head.extend_from_slice(b"\r\n\r\n");
        let mut buf = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut buf);
        if let Ok(httparse::Status::Complete(_)) = resp.parse(&head) {
            let _ = response_framing(resp.code.unwrap_or(200), resp.version == Some(0), resp.headers);
        }
    }
}
