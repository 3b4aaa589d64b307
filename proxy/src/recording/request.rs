//! Reading what the trace needs from a generation request body (model, stream, max_tokens,
//! whether it asked for usage) and rewriting the body to ask for usage.
//!
//! The body is read once per request (never per chunk), on the serving thread, without
//! building a tree of it: [`RequestInfo::parse`] walks the top-level object with serde_json's
//! streaming deserializer, keeps the few members it needs and skips the rest (the messages and
//! prompt, most of the bytes, are checked and skipped without an allocation). The prompt is
//! parsed into a tree on the prompt runner's thread ([`crate::recording::prompts`]), off the request path.
//! A body that is not a JSON object is forwarded untouched and recorded with what is known.

use std::fmt;

use serde::de::{self, Deserializer as _, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::config::UsageMode;
use crate::recording::observe::Strip;

/// What a request body said about `stream_options`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum StreamOptions {
    /// No `stream_options` member.
    #[default]
    Absent,
    /// `"stream_options": null`.
    Null,
    /// An object, with the two flags the proxy may add (`true` only when they are `true`).
    Object {
        /// `include_usage`.
        include_usage: bool,
        /// `continuous_usage_stats` (vLLM).
        continuous_usage_stats: bool,
    },
    /// Anything else (malformed: the upstream answers it as it would).
    Other,
}

impl StreamOptions {
    /// What a `stream_options` member's value (`None`: no member) says.
    fn of(v: Option<&Value>) -> StreamOptions {
        match v {
            None => StreamOptions::Absent,
            Some(Value::Null) => StreamOptions::Null,
            Some(Value::Object(so)) => {
                let flag = |k: &str| so.get(k).and_then(Value::as_bool).unwrap_or(false);
                StreamOptions::Object {
                    include_usage: flag("include_usage"),
                    continuous_usage_stats: flag("continuous_usage_stats"),
                }
            }
            Some(_) => StreamOptions::Other,
        }
    }
}

/// What the trace needs from one request body.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// `model`.
    pub model: Option<String>,
    /// `stream`.
    pub stream: bool,
    /// `max_tokens` (chat, completions, Messages), else `max_completion_tokens`, else
    /// `max_output_tokens` (Responses).
    pub max_tokens: Option<i64>,
    /// Whether the body is one JSON object (when not, nothing else here is known).
    pub object: bool,
    /// Its `stream_options`.
    pub stream_options: StreamOptions,
}

/// The members [`RequestInfo`] reads; values of the others are skipped.
enum Key {
    Model,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    StreamOptions,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<Key, E> {
                Ok(match k {
                    "model" => Key::Model,
                    "stream" => Key::Stream,
                    "max_tokens" => Key::MaxTokens,
                    "max_completion_tokens" => Key::MaxCompletionTokens,
                    "max_output_tokens" => Key::MaxOutputTokens,
                    "stream_options" => Key::StreamOptions,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// Reads a top-level object's members. A member given twice counts as its last value, as in
/// a parsed `serde_json::Map`.
struct InfoVisitor;

impl<'de> Visitor<'de> for InfoVisitor {
    type Value = RequestInfo;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RequestInfo, A::Error> {
        let (mut model, mut stream, mut max_tokens, mut max_completion, mut options) =
            (None, None, None, None, None);
        let mut max_output = None;
        while let Some(k) = map.next_key::<Key>()? {
            match k {
                Key::Model => model = Some(map.next_value::<Value>()?),
                Key::Stream => stream = Some(map.next_value::<Value>()?),
                Key::MaxTokens => max_tokens = Some(map.next_value::<Value>()?),
                Key::MaxCompletionTokens => max_completion = Some(map.next_value::<Value>()?),
                Key::MaxOutputTokens => max_output = Some(map.next_value::<Value>()?),
                Key::StreamOptions => options = Some(map.next_value::<Value>()?),
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let int = |v: &Option<Value>| v.as_ref().and_then(Value::as_i64);
        let stream_options = StreamOptions::of(options.as_ref());
        Ok(RequestInfo {
            model: match model {
                Some(Value::String(s)) => Some(s),
                _ => None,
            },
            stream: stream.as_ref().and_then(Value::as_bool).unwrap_or(false),
            max_tokens: int(&max_tokens)
                .or_else(|| int(&max_completion))
                .or_else(|| int(&max_output)),
            object: true,
            stream_options,
        })
    }
}

impl RequestInfo {
    /// Reads a request body; never fails (a body that is not one JSON object in UTF-8 gives
    /// an empty info).
    pub fn parse(body: &[u8]) -> RequestInfo {
        // Skipped strings are not checked for UTF-8 by the deserializer: the whole body is,
        // first.
        let Ok(text) = std::str::from_utf8(body) else {
            return RequestInfo::default();
        };
        let mut de = serde_json::Deserializer::from_str(text);
        match de.deserialize_map(InfoVisitor) {
            Ok(info) if de.end().is_ok() => info,
            _ => RequestInfo::default(),
        }
    }
}

/// Rewrites a streaming request to ask for usage (`stream_options.include_usage`, plus
/// `continuous_usage_stats` in [`UsageMode::Vllm`]) when it did not ask itself. Returns the
/// new body and what to strip from the response, or `None` when nothing was injected (not a
/// streaming JSON object, injection off, or the client asked for everything itself).
///
/// When the body has no `stream_options`, the member is inserted after the opening `{` and
/// the rest of the body is left byte for byte; otherwise the body is parsed, `stream_options`
/// updated, and the body re-serialised.
pub fn inject_usage(body: &[u8], info: &RequestInfo, mode: UsageMode) -> Option<(Vec<u8>, Strip)> {
    if mode == UsageMode::Off || !info.stream || !info.object {
        return None;
    }
    let want_continuous = mode == UsageMode::Vllm;
    let (has_include, has_continuous) = match info.stream_options {
        StreamOptions::Absent | StreamOptions::Null => (false, false),
        StreamOptions::Object {
            include_usage,
            continuous_usage_stats,
        } => (include_usage, continuous_usage_stats),
        StreamOptions::Other => return None,
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
    let new_body = if info.stream_options == StreamOptions::Absent {
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
        let mut obj: Map<String, Value> = serde_json::from_slice(body).ok()?;
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
        assert!(i.stream && i.object);
        assert_eq!(i.max_tokens, Some(7));
        let n = RequestInfo::parse(b"not json");
        assert!(!n.object && !n.stream);
    }

    /// What the parse before this one (a `serde_json::Value` tree of the whole body) read:
    /// the streaming parse must read the same from every body.
    fn by_tree(body: &[u8]) -> RequestInfo {
        let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
            return RequestInfo::default();
        };
        let int = |k: &str| obj.get(k).and_then(Value::as_i64);
        RequestInfo {
            model: obj.get("model").and_then(Value::as_str).map(str::to_string),
            stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
            max_tokens: int("max_tokens")
                .or_else(|| int("max_completion_tokens"))
                .or_else(|| int("max_output_tokens")),
            object: true,
            stream_options: StreamOptions::of(obj.get("stream_options")),
        }
    }

    #[test]
    fn the_streaming_parse_reads_what_a_tree_reads() {
        let bodies: &[&[u8]] = &[
            br#"{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
            br#"  {"model":"a","model":"b","stream":false,"stream":true}  "#,
            br#"{"m\u006fdel":"escaped key","str\u0065am":true}"#,
            br#"{"model":7,"stream":"true","max_tokens":1.5,"max_completion_tokens":9}"#,
            br#"{"max_tokens":-3,"max_completion_tokens":9}"#,
            br#"{"stream":true,"stream_options":null}"#,
            br#"{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":"yes"}}"#,
            br#"{"stream":true,"stream_options":[1]}"#,
            br#"{"stream":true,"stream_options":{"include_usage":true},"stream_options":{}}"#,
            br#"{"prompt":[[1,2],[3]],"nested":{"model":"inner","a":[{"b":[]}]},"model":"outer"}"#,
            br#"{"model":"m"} trailing"#,
            br#"{"model":"m",}"#,
            br#"{"model":"m""#,
            br#"[{"model":"m"}]"#,
            br#""model""#,
            b"",
            b"null",
            br#"{"model":"caf\u00e9 \ud83d\ude00","stream":true}"#,
            b"{\"model\":\"\xff\"}",
            b"{\"model\":\"m\",\"messages\":\"\xff\"}",
            br#"{}"#,
            br#"{"stream":true,"max_tokens":18446744073709551615}"#,
            br#"{"model":"m","input":"hi","max_output_tokens":64,"stream":true}"#,
            br#"{"max_output_tokens":64,"max_completion_tokens":9}"#,
        ];
        for b in bodies {
            assert_eq!(
                RequestInfo::parse(b),
                by_tree(b),
                "{:?}",
                String::from_utf8_lossy(b)
            );
        }
        // The two differences, both in skipped members, where a tree gives up and the body is
        // still JSON (RFC 8259): a lone surrogate escape (Python's json module, which vLLM's
        // server uses, reads it), and nesting deeper than serde_json's recursion limit of 128.
        // Here they are objects (the model is read, usage asked for); the prompt runner's tree
        // reads no prompt from them.
        let lone = br#"{"model":"m","messages":"\ud800"}"#;
        assert!(RequestInfo::parse(lone).object && !by_tree(lone).object);
        assert_eq!(RequestInfo::parse(lone).model.as_deref(), Some("m"));
        let deep = format!(
            "{{\"a\":{}1{},\"model\":\"m\"}}",
            "[".repeat(200),
            "]".repeat(200)
        );
        assert!(RequestInfo::parse(deep.as_bytes()).object && !by_tree(deep.as_bytes()).object);
        assert_eq!(
            RequestInfo::parse(deep.as_bytes()).model.as_deref(),
            Some("m")
        );
        // Skipping does not recurse: a million levels cannot overflow the serving thread's
        // stack.
        let deeper = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(1_000_000),
            "]".repeat(1_000_000)
        );
        assert!(RequestInfo::parse(deeper.as_bytes()).object);
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
        assert_eq!(v["stream_options"]["include_usage"], true);
        let null = br#"{"stream":true,"stream_options":null,"model":"m"}"#;
        let (b, s) = inject_usage(null, &RequestInfo::parse(null), UsageMode::Standard).unwrap();
        assert!(s.usage_events);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        let plain = br#"{"stream":false}"#;
        assert!(inject_usage(plain, &RequestInfo::parse(plain), UsageMode::Vllm).is_none());
        let other = br#"{"stream":true,"stream_options":"x"}"#;
        assert!(inject_usage(other, &RequestInfo::parse(other), UsageMode::Vllm).is_none());
        let not_json = br#"{"stream":true"#;
        assert!(inject_usage(not_json, &RequestInfo::parse(not_json), UsageMode::Vllm).is_none());
    }
}
