//! What the typed-event APIs (Responses, Messages) share: a member read leniently (a string
//! when it is one, skipped otherwise, never an error), and what one event gives the chunk's
//! text.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{ChunkText, StreamEvent};

/// A member that is a string when it is one (borrowed from the payload unless escaped), and
/// `None` for any other value, which is skipped: an event of a kind we do not know, whose
/// member of the same name is an object, is still read.
#[derive(Debug, Default)]
pub(super) struct Str<'a>(pub(super) Option<Cow<'a, str>>);

impl<'a> Str<'a> {
    pub(super) fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
    pub(super) fn is_empty(&self) -> bool {
        self.as_str().is_empty()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrVisitor(std::marker::PhantomData))
    }
}

struct StrVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
    type Value = Str<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Str(Some(Cow::Borrowed(v))))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Str(Some(Cow::Owned(v.to_string()))))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Str(Some(Cow::Owned(v))))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Str(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Str(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Str(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Str(None))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Str(None))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Str(None))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Str(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Str(None))
    }
}

/// What an event carries of the generated output, for [`StreamEvent::Chunk`] and the chunk's
/// text: an answer (text, refusal), reasoning, or a piece of a tool call.
pub(super) enum Piece<'a> {
    /// Nothing generated (an event that opens or closes a part, a signature).
    None,
    /// Answer text.
    Answer(&'a str),
    /// Reasoning text (`None`: reasoning whose text is not given, e.g. redacted).
    Reasoning(Option<&'a str>),
    /// A tool call's piece: its index, and its id, name and arguments as this event has them.
    Call {
        index: Option<u64>,
        id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
}

impl Piece<'_> {
    /// The event as a chunk, its text added to `text` when given. An empty answer or an
    /// empty argument piece (with no id or name) carries no output, as an empty chat delta.
    pub(super) fn chunk(self, text: Option<&mut ChunkText>) -> StreamEvent {
        let (output, answer) = match &self {
            Piece::None => (false, false),
            Piece::Answer(s) => (!s.is_empty(), !s.is_empty()),
            Piece::Reasoning(s) => (s.is_none_or(|s| !s.is_empty()), false),
            Piece::Call {
                id,
                name,
                arguments,
                ..
            } => {
                let any = !(id.is_empty() && name.is_empty() && arguments.is_empty());
                (any, any)
            }
        };
        if let (true, Some(t)) = (output, text) {
            match self {
                Piece::None => {}
                Piece::Answer(s) => {
                    t.output.push_str(s);
                    t.answer.push_str(s);
                }
                Piece::Reasoning(s) => {
                    let s = s.unwrap_or("");
                    t.output.push_str(s);
                    t.reasoning.push_str(s);
                }
                Piece::Call {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    t.output.push_str(name);
                    t.output.push_str(arguments);
                    t.push_call_parts(index, id, name, arguments);
                }
            }
        }
        StreamEvent::Chunk {
            usage: None,
            output,
            answer,
        }
    }
}

/// The message of an `error` event: its `message` member, else its `error` object's message,
/// else "error event".
pub(super) fn error_text(message: &Str<'_>, error: Option<serde_json::Value>) -> String {
    if !message.is_empty() {
        return message.as_str().to_string();
    }
    match error {
        Some(e) if !e.is_null() => super::error_message(&e),
        _ => "error event".to_string(),
    }
}
