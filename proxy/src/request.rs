//! Reading what the trace needs from a generation request body (model, stream, max_tokens,
//! the prompt for prefix hashes) and rewriting the body to ask for usage.
//!
//! The body is parsed once per request (never per chunk). A body that is not a JSON object is
//! forwarded untouched and recorded with what is known.

use serde_json::{Map, Value};

use crate::config::UsageMode;
use crate::observe::Strip;

/// What the trace needs from one request body.
#[derive(Debug, Default)]
pub struct RequestInfo {
    /// `model`.
    pub model: Option<String>,
    /// `stream`.
    pub stream: bool,
    /// `max_tokens`, else `max_completion_tokens`.
    pub max_tokens: Option<i64>,
    /// The parsed body, when it is a JSON object.
    pub json: Option<Map<String, Value>>,
}

impl RequestInfo {
    /// Reads a request body; never fails (non-JSON gives an empty info).
    pub fn parse(body: &[u8]) -> RequestInfo {
        let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
            return RequestInfo::default();
        };
        let int = |k: &str| obj.get(k).and_then(Value::as_i64);
        RequestInfo {
            model: obj.get("model").and_then(Value::as_str).map(str::to_string),
            stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
            max_tokens: int("max_tokens").or_else(|| int("max_completion_tokens")),
            json: Some(obj),
        }
    }
}

/// Rewrites a streaming request to ask for usage (`stream_options.include_usage`, plus
/// `continuous_usage_stats` in [`UsageMode::Vllm`]) when it did not ask itself. Returns the
/// new body and what to strip from the response, or `None` when nothing was injected (not a
/// streaming JSON object, injection off, or the client asked for everything itself).
///
/// When the body has no `stream_options`, the member is inserted after the opening `{` and
/// the rest of the body is left byte for byte; otherwise `stream_options` is updated in the
/// parsed object and the body re-serialised.
pub fn inject_usage(body: &[u8], info: &RequestInfo, mode: UsageMode) -> Option<(Vec<u8>, Strip)> {
    if mode == UsageMode::Off || !info.stream {
        return None;
    }
    let obj = info.json.as_ref()?;
    let want_continuous = mode == UsageMode::Vllm;
    let (has_include, has_continuous) = match obj.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(so)) => {
            let flag = |k: &str| so.get(k).and_then(Value::as_bool).unwrap_or(false);
            (flag("include_usage"), flag("continuous_usage_stats"))
        }
        Some(_) => return None, // malformed: let the upstream answer it as it would
    };
    let add_include = !has_include;
    let add_continuous = want_continuous && !has_continuous;
    if !add_include && !add_continuous {
        return None;
    }
    let strip = Strip {
        usage_events: add_include,
        chunk_usage: true,
    };
    let new_body = if obj.get("stream_options").is_none() {
        let open = body.iter().position(|&b| b == b'{')?;
        let member: &[u8] = if want_continuous {
            br#""stream_options":{"include_usage":true,"continuous_usage_stats":true},"#
        } else {
            br#""stream_options":{"include_usage":true},"#
        };
        let mut out = Vec::with_capacity(body.len() + member.len());
        out.extend_from_slice(&body[..=open]);
        out.extend_from_slice(member);
        out.extend_from_slice(&body[open + 1..]);
        out
    } else {
        let mut obj = obj.clone();
        let mut so = match obj.remove("stream_options") {
            Some(Value::Object(so)) => so,
            _ => Map::new(),
        };
        so.insert("include_usage".into(), Value::Bool(true));
        if want_continuous {
            so.insert("continuous_usage_stats".into(), Value::Bool(true));
        }
        obj.insert("stream_options".into(), Value::Object(so));
        serde_json::to_vec(&obj).ok()?
    };
    Some((new_body, strip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields() {
        let i = RequestInfo::parse(
            br#"{"model":"m","stream":true,"max_completion_tokens":7,"messages":[]}"#,
        );
        assert_eq!(i.model.as_deref(), Some("m"));
        assert!(i.stream);
        assert_eq!(i.max_tokens, Some(7));
        let n = RequestInfo::parse(b"not json");
        assert!(n.json.is_none() && !n.stream);
    }

    #[test]
    fn injects_only_what_is_missing() {
        let body = br#"{"model":"m","stream":true}"#;
        let info = RequestInfo::parse(body);
        let (b, s) = inject_usage(body, &info, UsageMode::Standard).unwrap();
        assert_eq!(
            b,
            br#"{"stream_options":{"include_usage":true},"model":"m","stream":true}"#
        );
        assert!(s.usage_events && s.chunk_usage);
        let asked = br#"{"stream":true,"stream_options":{"include_usage":true}}"#;
        assert!(inject_usage(asked, &RequestInfo::parse(asked), UsageMode::Standard).is_none());
        let (b, s) = inject_usage(asked, &RequestInfo::parse(asked), UsageMode::Vllm).unwrap();
        assert!(!s.usage_events && s.chunk_usage);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["stream_options"]["continuous_usage_stats"], true);
        let plain = br#"{"stream":false}"#;
        assert!(inject_usage(plain, &RequestInfo::parse(plain), UsageMode::Vllm).is_none());
    }
}
