//! Synthetic images for rows recorded without their bodies (`--privacy hashes`/`perf`): the row
//! says how many images its prompt carried, their decoded bytes and each one's `WxH`
//! (trace_format's `images`, `image_bytes`, `image_dims`); replay sends, per image, a PNG of
//! those dimensions and of its share of the bytes, as a `data:` URL in the API's image part.
//!
//! - **Dimensions** are what a vision encoder's cost follows (the tokens an image becomes), so
//!   they are exact; an image recorded without them (a URL, an unread header) is
//!   [`DEFAULT_SIDE`] square.
//! - **Bytes**: the row's `image_bytes` split evenly over its images (the last takes the
//!   rest); a PNG smaller than its share is padded to it with a private ancillary chunk
//!   (`llRp`, which decoders skip), so what the server receives and decodes weighs what
//!   production's did.
//! - **Pixels**: grey, but the first scanline holds a seed — the row's session (else request
//!   id) and the image's position — so images differ as production's did between sessions,
//!   and an agent re-sending its screenshots turn after turn re-sends the same ones (an
//!   engine's multimodal cache sees the hits it saw): an approximation, since a hashes trace
//!   records no image's identity.
//!
//! The grey rows are deflated once per size ([`Grey`], cached); each image adds its seeded
//! first row as a stored block, the Adler-32 combined, so building one costs a copy and a
//! base64 encoding, not a compression.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine;

/// The side of an image recorded without its dimensions.
pub const DEFAULT_SIDE: u32 = 512;
/// The largest side sent (larger recorded sides are clamped).
const MAX_SIDE: u32 = 16_384;
/// Sizes whose grey rows are kept deflated.
const CACHED_SIZES: usize = 64;
/// The grey level.
const GREY: u8 = 128;

/// `WxH` (as `image_dims` records it) as a size, [`DEFAULT_SIDE`] square when unknown.
pub fn dims(s: &str) -> (u32, u32) {
    let parse = |t: &str| t.trim().parse::<u32>().ok().filter(|&n| n > 0);
    s.split_once('x')
        .and_then(|(w, h)| Some((parse(w)?, parse(h)?)))
        .map_or((DEFAULT_SIDE, DEFAULT_SIDE), |(w, h)| {
            (w.min(MAX_SIDE), h.min(MAX_SIDE))
        })
}

/// The prompt tokens an image of `w`×`h` is estimated to become: one per 28×28 pixels
/// (Qwen2-VL's 14-pixel patches merged 2×2, sides rounded up), at least one. Replay takes them
/// off the text it synthesizes, as the row's recorded `prompt_tokens` counted them.
pub fn estimated_tokens((w, h): (u32, u32)) -> u64 {
    (u64::from(w.div_ceil(28)) * u64::from(h.div_ceil(28))).max(1)
}

/// A row's images as `data:` URLs: one per recorded image, of its dimensions and its share of
/// `image_bytes` (an even split, the last taking the rest), seeded by `seed` and the image's position.
pub fn row_images(images: usize, image_bytes: u64, image_dims: &[String], seed: u64) -> Vec<Png> {
    let share = image_bytes / images.max(1) as u64;
    (0..images)
        .map(|i| {
            let d = image_dims
                .get(i)
                .map_or((DEFAULT_SIDE, DEFAULT_SIDE), |s| dims(s));
            // The last takes what the even split leaves.
            let bytes = if i + 1 == images {
                image_bytes - share * i as u64
            } else {
                share
            };
            png(
                d,
                bytes,
                seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            )
        })
        .collect()
}

/// A synthetic image.
#[derive(Debug, Clone)]
pub struct Png {
    /// Its size.
    pub dims: (u32, u32),
    /// Its bytes as a `data:image/png;base64,` URL.
    pub data_url: String,
}

impl Png {
    /// The base64 data alone (Anthropic's `source.data`).
    pub fn base64(&self) -> &str {
        self.data_url
            .strip_prefix("data:image/png;base64,")
            .unwrap_or_default()
    }
}

/// The grey rows (all but the first) of a size, deflated, with their Adler-32 and length.
struct Grey {
    deflated: Vec<u8>,
    adler: u32,
    len: u64,
}

/// The deflated grey rows of each size made so far.
type GreyCache = Mutex<HashMap<(u32, u32), Arc<Grey>>>;

fn grey((w, h): (u32, u32)) -> Arc<Grey> {
    static CACHE: OnceLock<GreyCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(g) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&(w, h)) {
        return g.clone();
    }
    let mut row = vec![GREY; w as usize + 1];
    row[0] = 0; // filter: none
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut adler = 1u32;
    for _ in 1..h {
        // Writing into a Vec cannot fail.
        let _ = z.write_all(&row);
        adler = adler32(adler, &row);
    }
    let g = Arc::new(Grey {
        deflated: z.finish().unwrap_or_default(),
        adler,
        len: u64::from(h - 1) * row.len() as u64,
    });
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if c.len() >= CACHED_SIZES {
        c.clear();
    }
    c.insert((w, h), g.clone());
    g
}

/// A `w`×`h` 8-bit grey PNG, at least `bytes` long, its first row drawn from `seed`.
pub fn png((w, h): (u32, u32), bytes: u64, seed: u64) -> Png {
    let (w, h) = (w.clamp(1, MAX_SIDE), h.clamp(1, MAX_SIDE));
    let rest = grey((w, h));
    let mut first = vec![GREY; w as usize + 1];
    first[0] = 0;
    let mut s = seed;
    for px in first[1..].iter_mut().take(64) {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        *px = (s >> 56) as u8;
    }
    // zlib: header, the first row as a stored block (not final), the grey rows' deflate
    // (ending with the final block), the Adler-32 of all the rows.
    let mut idat = vec![0x78, 0x01, 0x00];
    let n = first.len() as u16;
    idat.extend_from_slice(&n.to_le_bytes());
    idat.extend_from_slice(&(!n).to_le_bytes());
    idat.extend_from_slice(&first);
    if h > 1 {
        idat.extend_from_slice(&rest.deflated);
    } else {
        idat.extend_from_slice(&[0x03, 0x00]); // an empty final fixed block
    }
    let a = adler32_combine(adler32(1, &first), rest.adler, rest.len);
    idat.extend_from_slice(&a.to_be_bytes());

    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // 8-bit grey, deflate, no filter, no interlace
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &idat);
    // Padding to the recorded size: a chunk costs 12 bytes of framing.
    let end = 12;
    let short = bytes.saturating_sub((out.len() + end) as u64);
    if short >= 12 {
        chunk(&mut out, b"llRp", &vec![0u8; (short - 12) as usize]);
    }
    chunk(&mut out, b"IEND", &[]);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&out);
    Png {
        dims: (w, h),
        data_url: format!("data:image/png;base64,{b64}"),
    }
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = crc32fast::Hasher::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.finalize().to_be_bytes());
}

const ADLER_BASE: u32 = 65_521;

fn adler32(adler: u32, data: &[u8]) -> u32 {
    let (mut a, mut b) = (adler & 0xffff, adler >> 16);
    for piece in data.chunks(5552) {
        for &x in piece {
            a += u32::from(x);
            b += a;
        }
        a %= ADLER_BASE;
        b %= ADLER_BASE;
    }
    b << 16 | a
}

/// The Adler-32 of two byte strings joined, from each one's and the second's length (zlib's
/// `adler32_combine`).
fn adler32_combine(a1: u32, a2: u32, len2: u64) -> u32 {
    let base = u64::from(ADLER_BASE);
    let rem = len2 % base;
    let (a1, a2) = (u64::from(a1), u64::from(a2));
    let mut sum1 = a1 & 0xffff;
    let mut sum2 = (rem * sum1) % base;
    sum1 += (a2 & 0xffff) + base - 1;
    sum2 += ((a1 >> 16) & 0xffff) + ((a2 >> 16) & 0xffff) + base - rem;
    if sum1 >= base {
        sum1 -= base;
    }
    if sum1 >= base {
        sum1 -= base;
    }
    if sum2 >= base << 1 {
        sum2 -= base << 1;
    }
    if sum2 >= base {
        sum2 -= base;
    }
    (sum1 | sum2 << 16) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Decodes a PNG's chunks (checking each CRC) and inflates its IDAT (zlib checks the
    /// Adler-32): its size and its rows.
    fn decode(png: &[u8]) -> ((u32, u32), Vec<u8>, Vec<[u8; 4]>) {
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let (mut at, mut kinds, mut idat, mut size) = (8, Vec::new(), Vec::new(), (0, 0));
        while at < png.len() {
            let n = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
            let kind: [u8; 4] = png[at + 4..at + 8].try_into().unwrap();
            let data = &png[at + 8..at + 8 + n];
            let crc = u32::from_be_bytes(png[at + 8 + n..at + 12 + n].try_into().unwrap());
            let mut h = crc32fast::Hasher::new();
            h.update(&kind);
            h.update(data);
            assert_eq!(h.finalize(), crc, "{:?}", kind);
            match &kind {
                b"IHDR" => {
                    size = (
                        u32::from_be_bytes(data[0..4].try_into().unwrap()),
                        u32::from_be_bytes(data[4..8].try_into().unwrap()),
                    )
                }
                b"IDAT" => idat.extend_from_slice(data),
                _ => {}
            }
            kinds.push(kind);
            at += 12 + n;
        }
        let mut rows = Vec::new();
        flate2::read::ZlibDecoder::new(&idat[..])
            .read_to_end(&mut rows)
            .expect("a valid zlib stream, its Adler-32 right");
        (size, rows, kinds)
    }

    fn bytes(p: &Png) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(p.base64())
            .unwrap()
    }

    /// A valid PNG of the recorded size, padded to the recorded bytes; seeds make different
    /// pixels, the same seed the same image.
    #[test]
    fn a_synthetic_png_has_the_recorded_size_and_bytes() {
        for (d, want_bytes) in [((1280, 720), 300_000u64), ((1, 1), 0), ((3000, 17), 10)] {
            let p = png(d, want_bytes, 42);
            let b = bytes(&p);
            let ((w, h), rows, kinds) = decode(&b);
            assert_eq!((w, h), d);
            assert_eq!(rows.len(), h as usize * (w as usize + 1));
            assert!(
                rows.chunks(w as usize + 1).all(|r| r[0] == 0),
                "filter none"
            );
            assert_eq!(kinds.first(), Some(b"IHDR"));
            assert_eq!(kinds.last(), Some(b"IEND"));
            assert!(b.len() as u64 >= want_bytes, "{} < {want_bytes}", b.len());
            if want_bytes > 1000 {
                assert!(b.len() as u64 <= want_bytes + 12, "{}", b.len());
            }
        }
        let (a, b, a2) = (
            bytes(&png((640, 480), 0, 1)),
            bytes(&png((640, 480), 0, 2)),
            bytes(&png((640, 480), 0, 1)),
        );
        assert_eq!(a, a2);
        assert_ne!(decode(&a).1, decode(&b).1, "other pixels");
    }

    /// A row's images: one per recorded image, each its own size, the bytes split evenly,
    /// unknown sizes the default square; tokens by 28-pixel tiles.
    #[test]
    fn a_rows_images_follow_its_record() {
        let dims_rec = vec!["1024x768".to_string(), String::new()];
        let imgs = row_images(2, 200_000, &dims_rec, 9);
        assert_eq!(imgs.len(), 2);
        assert_eq!(imgs[0].dims, (1024, 768));
        assert_eq!(imgs[1].dims, (DEFAULT_SIDE, DEFAULT_SIDE));
        for i in &imgs {
            let n = bytes(i).len() as u64;
            assert!((100_000..=100_012).contains(&n), "{n}");
        }
        assert_ne!(
            decode(&bytes(&imgs[0])).1[..65],
            decode(&bytes(&imgs[1])).1[..65]
        );
        assert_eq!(estimated_tokens((1024, 768)), 37 * 28);
        assert_eq!(estimated_tokens((1, 1)), 1);
        assert_eq!(dims("bogus"), (DEFAULT_SIDE, DEFAULT_SIDE));
        assert_eq!(dims("0x5"), (DEFAULT_SIDE, DEFAULT_SIDE));
    }
}
