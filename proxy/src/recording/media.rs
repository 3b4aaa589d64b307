//! Images and audio in a prompt, read on the prompt runner: how many, their bytes, and each
//! image's pixel size where its header gives it cheaply.
//!
//! Found wherever they sit in the request (a message's parts, a tool result's content):
//! - images: chat's `{"type":"image_url","image_url":{"url":…}}`, Responses'
//!   `{"type":"input_image","image_url":…}`, Anthropic's `{"type":"image","source":…}`
//!   (`base64` `data`, or a `url`);
//! - audio: chat's `{"type":"input_audio","input_audio":{"data":…}}`.
//!
//! An inline image (a `data:` URL, a base64 source) counts its decoded bytes, computed from
//! the base64 length; its size is read from the first bytes of a PNG, GIF or WebP, and from
//! the frame header a JPEG's segments lead to (only the bytes of a few segment heads are
//! decoded). An image by URL (or file id) counts no bytes and has no size (`""`). Prompt
//! tokens stay the server's (a client cannot count vision tokens).

use serde_json::{Map, Value};

/// What a prompt carries besides text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Media {
    /// Images.
    pub(crate) images: usize,
    /// Decoded bytes of the inline images.
    pub(crate) image_bytes: u64,
    /// `WxH` of each image, `""` where unknown.
    pub(crate) image_dims: Vec<String>,
    /// Audio inputs.
    pub(crate) audio: usize,
    /// Their decoded bytes.
    pub(crate) audio_bytes: u64,
}

/// Images and audio past this many are counted without their sizes read.
const MAX_DIMS: usize = 256;
/// JPEG segments walked looking for the frame header.
const MAX_JPEG_SEGMENTS: usize = 64;

/// The images and audio of a request body.
pub(crate) fn media(body: &Map<String, Value>) -> Media {
    let mut m = Media::default();
    body.values().for_each(|v| walk(v, &mut m, 0));
    m
}

fn walk(v: &Value, m: &mut Media, depth: usize) {
    // Deeper than any API nests its parts: not looked into (no unbounded recursion).
    if depth > 64 {
        return;
    }
    match v {
        Value::Array(a) => a.iter().for_each(|x| walk(x, m, depth + 1)),
        Value::Object(o) => {
            let kind = o.get("type").and_then(Value::as_str);
            let inline = match kind {
                Some("image_url") => Some(image_url(o.get("image_url"))),
                Some("input_image") => Some(image_url(o.get("image_url"))),
                Some("image") => Some(match o.get("source") {
                    Some(s) if s.get("type").and_then(Value::as_str) == Some("base64") => {
                        s.get("data").and_then(Value::as_str)
                    }
                    _ => None,
                }),
                Some("input_audio") => {
                    let data = v.pointer("/input_audio/data").and_then(Value::as_str);
                    m.audio += 1;
                    m.audio_bytes += data.map_or(0, |d| decoded_len(d.as_bytes()));
                    return;
                }
                _ => None,
            };
            match inline {
                Some(data) => {
                    m.images += 1;
                    m.image_bytes += data.map_or(0, |d| decoded_len(d.as_bytes()));
                    if m.image_dims.len() < MAX_DIMS {
                        let dims = data.and_then(|d| dims(d.as_bytes()));
                        m.image_dims
                            .push(dims.map_or_else(String::new, |(w, h)| format!("{w}x{h}")));
                    }
                }
                None => o.values().for_each(|x| walk(x, m, depth + 1)),
            }
        }
        _ => {}
    }
}

/// The base64 data of an image URL (a string, or an object with `url`) when it is a
/// `data:` URL; None for a remote one.
fn image_url(v: Option<&Value>) -> Option<&str> {
    let url = match v? {
        Value::String(s) => s.as_str(),
        o => o.get("url")?.as_str()?,
    };
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    meta.ends_with(";base64").then_some(data)
}

/// Bytes that `b64` (standard or URL-safe, padded or not) decodes to (looks at its end
/// only).
fn decoded_len(b64: &[u8]) -> u64 {
    let mut n = b64.len();
    while n > 0 && (b64[n - 1] == b'=' || b64[n - 1].is_ascii_whitespace()) {
        n -= 1;
    }
    (n as u64 * 3) / 4
}

fn sextet(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' | b'-' => 62,
        b'/' | b'_' => 63,
        // Padding: the bytes it stands for are past the data's end, which the caller bounds.
        b'=' => 0,
        _ => return None,
    } as u32)
}

/// `len` decoded bytes of `b64` from decoded offset `start` (None past its end or at a
/// character that is not base64).
fn bytes_at(b64: &[u8], start: usize, len: usize) -> Option<Vec<u8>> {
    let group = start / 3;
    let skip = start % 3;
    let groups = (skip + len).div_ceil(3);
    // Unpadded base64 ends in a partial group: pad it as if the `=` were there.
    let end = ((group + groups) * 4).min(b64.len());
    let mut chars = b64.get(group * 4..end)?.to_vec();
    chars.resize((groups * 4).max(chars.len().next_multiple_of(4)), b'=');
    if (start + len) as u64 > decoded_len(b64) {
        return None;
    }
    let mut out = Vec::with_capacity(groups * 3);
    for q in chars.chunks(4) {
        let mut n = 0u32;
        for &c in q {
            n = (n << 6) | sextet(c)?;
        }
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
    }
    Some(out[skip..skip + len].to_vec())
}

/// Width and height from an image's header, when it is a PNG, GIF, WebP or JPEG.
fn dims(b64: &[u8]) -> Option<(u32, u32)> {
    let head = bytes_at(b64, 0, decoded_len(b64).min(30) as usize)?;
    if head.len() < 30 && !head.starts_with(b"\xff\xd8") {
        return None;
    }
    let be16 = |b: &[u8]| u32::from(u16::from_be_bytes([b[0], b[1]]));
    let le16 = |b: &[u8]| u32::from(u16::from_le_bytes([b[0], b[1]]));
    let le24 = |b: &[u8]| u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
    if head.starts_with(b"\x89PNG\r\n\x1a\n") && &head[12..16] == b"IHDR" {
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        return Some((be32(&head[16..20]), be32(&head[20..24])));
    }
    if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        return Some((le16(&head[6..8]), le16(&head[8..10])));
    }
    if head.starts_with(b"RIFF") && &head[8..12] == b"WEBP" {
        return match &head[12..16] {
            b"VP8 " => Some((le16(&head[26..28]) & 0x3fff, le16(&head[28..30]) & 0x3fff)),
            b"VP8L" => {
                let b = u32::from_le_bytes([head[21], head[22], head[23], head[24]]);
                Some(((b & 0x3fff) + 1, ((b >> 14) & 0x3fff) + 1))
            }
            b"VP8X" => Some((le24(&head[24..27]) + 1, le24(&head[27..30]) + 1)),
            _ => None,
        };
    }
    if head.starts_with(b"\xff\xd8") {
        // Segments from offset 2: marker, length; the frame header (SOF0..SOF15 but DHT,
        // JPG, DAC) holds the height then the width.
        let mut at = 2;
        for _ in 0..MAX_JPEG_SEGMENTS {
            let seg = bytes_at(b64, at, 9)?;
            if seg[0] != 0xff {
                return None;
            }
            let marker = seg[1];
            if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
                return Some((be16(&seg[7..9]), be16(&seg[5..7])));
            }
            at += 2 + be16(&seg[2..4]) as usize;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in bytes.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend_from_slice(&w.to_be_bytes());
        b.extend_from_slice(&h.to_be_bytes());
        b.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        b
    }

    /// A JPEG whose frame header follows an APP1 segment of `app1` bytes.
    fn jpeg(w: u16, h: u16, app1: usize) -> Vec<u8> {
        let mut b = vec![0xff, 0xd8, 0xff, 0xe1];
        b.extend_from_slice(&((app1 + 2) as u16).to_be_bytes());
        b.extend(std::iter::repeat_n(0x55, app1));
        b.extend_from_slice(&[0xff, 0xc0, 0, 17, 8]);
        b.extend_from_slice(&h.to_be_bytes());
        b.extend_from_slice(&w.to_be_bytes());
        b.extend(std::iter::repeat_n(0, 12));
        b
    }

    #[test]
    fn image_sizes_from_their_headers() {
        assert_eq!(dims(b64(&png(640, 480)).as_bytes()), Some((640, 480)));
        let mut gif = b"GIF89a".to_vec();
        gif.extend_from_slice(&[0x20, 0x03, 0x58, 0x02]);
        gif.extend(std::iter::repeat_n(0, 24));
        assert_eq!(dims(b64(&gif).as_bytes()), Some((800, 600)));
        for app1 in [0, 1, 2, 3, 1000, 4097] {
            assert_eq!(
                dims(b64(&jpeg(1920, 1080, app1)).as_bytes()),
                Some((1920, 1080)),
                "{app1}"
            );
        }
        let mut vp8x = b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0".to_vec();
        vp8x.extend_from_slice(&[0x7f, 0x02, 0x00, 0xdf, 0x01, 0x00]);
        assert_eq!(dims(b64(&vp8x).as_bytes()), Some((640, 480)));
        assert_eq!(
            dims(b64(b"not an image at all, just text ok").as_bytes()),
            None
        );
        assert_eq!(dims(b"%%%%"), None);
    }

    /// Every API's image and audio parts, inline and by URL, wherever they sit.
    #[test]
    fn images_and_audio_of_every_api() {
        let p = b64(&png(2, 3));
        let j = b64(&jpeg(4, 5, 10));
        let body = json!({
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{p}")}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                    {"type": "input_audio", "input_audio": {"data": "AAAAAAAA", "format": "wav"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": j}}
                    ]},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
                ]}
            ]
        });
        let m = media(body.as_object().unwrap());
        assert_eq!(m.images, 4);
        assert_eq!(m.audio, 1);
        assert_eq!(m.audio_bytes, 6);
        assert_eq!(
            m.image_bytes,
            png(2, 3).len() as u64 + jpeg(4, 5, 10).len() as u64
        );
        assert_eq!(m.image_dims, ["2x3", "", "4x5", ""]);
        let responses = json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": format!("data:image/png;base64,{p}")},
            {"type": "input_image", "file_id": "file-1"}
        ]}]});
        let m = media(responses.as_object().unwrap());
        assert_eq!(
            (m.images, m.image_dims),
            (2, vec!["2x3".into(), String::new()])
        );
        let text = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(media(text.as_object().unwrap()), Media::default());
    }
}
