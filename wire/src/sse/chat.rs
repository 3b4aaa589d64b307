//! OpenAI chunks (completions and chat) read in one pass without building a tree: whether a
//! chunk carries output and answer output, its usage, an error object, and (when asked) its
//! text and tool-call pieces, borrowed from the payload where it can be.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::tools::CallPiece;
use super::{error_message, ChunkText, StreamEvent, Usage};

pub(super) fn parse_event(data: &[u8], text: Option<&mut ChunkText>) -> StreamEvent {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return StreamEvent::Done;
    }
    let mut de = serde_json::Deserializer::from_slice(trimmed);
    let parsed = EventSeed { text }
        .deserialize(&mut de)
        .and_then(|ev| de.end().map(|()| ev));
    match parsed {
        Err(_) => StreamEvent::Invalid,
        Ok(RawEvent { error: Some(e), .. }) => StreamEvent::Error(error_message(&e)),
        Ok(RawEvent {
            choices: Some(c),
            usage,
            ..
        }) if c.count > 0 => StreamEvent::Chunk {
            usage,
            output: c.output,
            answer: c.answer,
        },
        Ok(RawEvent { usage: Some(u), .. }) => StreamEvent::Usage(u),
        Ok(_) => StreamEvent::Other,
    }
}

#[derive(Default)]
struct RawEvent {
    choices: Option<Choices>,
    usage: Option<Usage>,
    error: Option<serde_json::Value>,
}

/// What a `choices` array holds: how many, and whether any carries output, and answer
/// output.
#[derive(Debug, Clone, Copy, Default)]
struct Choices {
    count: usize,
    output: bool,
    answer: bool,
}

/// A key of an object, as its position in `names` (None: another key); escaped keys too.
struct Field(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Field {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Field {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|n| *n == v))
    }
}

/// Fails on a key seen twice, as a derived `Deserialize` does (the payload is then not an
/// event we read: [`StreamEvent::Invalid`]).
fn once<E: serde::de::Error>(seen: &mut u8, i: usize, names: &[&'static str]) -> Result<(), E> {
    if *seen & (1 << i) != 0 {
        return Err(E::duplicate_field(names[i]));
    }
    *seen |= 1 << i;
    Ok(())
}

struct EventSeed<'t> {
    text: Option<&'t mut ChunkText>,
}

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = RawEvent;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = RawEvent;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        const NAMES: &[&str] = &["choices", "usage", "error"];
        let mut ev = RawEvent::default();
        let mut text = self.text;
        let mut seen = 0u8;
        while let Some(key) = map.next_key_seed(Field(NAMES))? {
            match key {
                Some(i) => once(&mut seen, i, NAMES)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            }
            match key {
                Some(0) => {
                    ev.choices = map.next_value_seed(ChoicesSeed {
                        text: text.as_deref_mut(),
                    })?
                }
                Some(1) => ev.usage = map.next_value()?,
                _ => ev.error = map.next_value()?,
            }
        }
        Ok(ev)
    }
}

struct ChoicesSeed<'t> {
    text: Option<&'t mut ChunkText>,
}

impl<'de> DeserializeSeed<'de> for ChoicesSeed<'_> {
    type Value = Option<Choices>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ChoicesSeed<'_> {
    type Value = Option<Choices>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array or null")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut c = Choices::default();
        let mut text = self.text;
        while let Some((output, answer)) = seq.next_element_seed(ChoiceSeed {
            text: text.as_deref_mut(),
        })? {
            c.count += 1;
            c.output |= output;
            c.answer |= answer;
        }
        Ok(Some(c))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// One choice: says whether it carries output and answer output, and adds its text to
/// `text`.
struct ChoiceSeed<'t> {
    text: Option<&'t mut ChunkText>,
}

impl<'de> DeserializeSeed<'de> for ChoiceSeed<'_> {
    type Value = (bool, bool);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ChoiceSeed<'_> {
    type Value = (bool, bool);
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a choice object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(bool, bool), A::Error> {
        const NAMES: &[&str] = &["text", "delta", "message", "index"];
        let collect = self.text.is_some();
        let mut seen = 0u8;
        let mut text = LenientVal::default();
        let mut delta: Option<Delta<'de>> = None;
        let mut message: Option<Cow<'de, str>> = None;
        let mut index = 0u64;
        while let Some(key) = map.next_key_seed(Field(NAMES))? {
            match key {
                Some(0) => {
                    once(&mut seen, 0, NAMES)?;
                    text = map.next_value_seed(Lenient::Text(collect))?;
                }
                Some(1) => {
                    once(&mut seen, 1, NAMES)?;
                    delta = map.next_value_seed(DeltaSeed(collect))?;
                }
                // Read leniently, as a JSON pointer would: anything else is no text.
                Some(2) => message = map.next_value_seed(Lenient::Content(collect))?.text,
                Some(_) => index = map.next_value_seed(Lenient::Index)?.index,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let output = text.non_empty || delta.as_ref().is_some_and(|d| d.output);
        let answer = text.non_empty || delta.as_ref().is_some_and(|d| d.answer);
        if let Some(t) = self.text {
            // A chunk without output keeps none of this (see read_event).
            let out = &mut t.output;
            out.extend(text.text.as_deref());
            if let Some(d) = &delta {
                out.extend(
                    [&d.reasoning_content, &d.reasoning, &d.content]
                        .into_iter()
                        .flatten()
                        .chain(
                            d.calls
                                .iter()
                                .flat_map(|c| [&c.name, &c.arguments])
                                .flatten(),
                        )
                        .chain(d.function_call.iter().flatten())
                        .map(|t| &**t),
                );
                t.reasoning.extend(
                    [&d.reasoning_content, &d.reasoning]
                        .into_iter()
                        .flatten()
                        .map(|t| &**t),
                );
            }
            if index == 0 {
                let answer = &mut t.answer;
                answer.extend(delta.as_ref().and_then(|d| d.content.as_deref()));
                answer.extend(message.as_deref());
                answer.extend(text.text.as_deref());
                for c in delta.iter().flat_map(|d| &d.calls) {
                    t.push_call(c);
                }
            }
        }
        Ok((output, answer))
    }
}

/// A choice's `delta`: whether it carries output, and answer output (content or a call),
/// and its texts.
#[derive(Default)]
struct Delta<'de> {
    output: bool,
    answer: bool,
    content: Option<Cow<'de, str>>,
    reasoning_content: Option<Cow<'de, str>>,
    reasoning: Option<Cow<'de, str>>,
    /// The `tool_calls` elements (when collected): names and arguments, in order.
    calls: Vec<CallPiece<'de>>,
    /// The function call's name and arguments (when collected).
    function_call: [Option<Cow<'de, str>>; 2],
}

struct DeltaSeed(bool);

impl<'de> DeserializeSeed<'de> for DeltaSeed {
    type Value = Option<Delta<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for DeltaSeed {
    type Value = Option<Delta<'de>>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a delta object or null")
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        const NAMES: &[&str] = &[
            "content",
            "reasoning_content",
            "reasoning",
            "tool_calls",
            "function_call",
        ];
        let collect = self.0;
        let mut d = Delta::default();
        let mut seen = 0u8;
        while let Some(key) = map.next_key_seed(Field(NAMES))? {
            let Some(i) = key else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            once(&mut seen, i, NAMES)?;
            let v = match i {
                0..=2 => {
                    let v = map.next_value_seed(Lenient::Text(collect))?;
                    match i {
                        0 => {
                            d.content = v.text;
                            d.answer |= v.non_empty;
                        }
                        1 => d.reasoning_content = v.text,
                        _ => d.reasoning = v.text,
                    }
                    v.non_empty
                }
                3 => {
                    let v = map.next_value_seed(Lenient::ToolCalls(collect))?;
                    d.calls = v.call.map(|c| c.calls).unwrap_or_default();
                    d.answer |= v.non_empty;
                    v.non_empty
                }
                _ => {
                    let v = map.next_value_seed(Lenient::FunctionCall(collect))?;
                    let non_empty = v.non_empty;
                    d.function_call = v.name_and_arguments();
                    d.answer |= non_empty;
                    non_empty
                }
            };
            d.output |= v;
        }
        Ok(Some(d))
    }
}

/// Values read as a JSON pointer into a tree would read them: the wanted member when the
/// value has the expected shape, nothing otherwise (never an error), and whether the value
/// is "present and not empty" (a non-empty string or array, an object, a number or `true`;
/// `null`, `""`, `[]` and `false` are empty).
#[derive(Clone, Copy)]
enum Lenient {
    /// A string: its text when collected.
    Text(bool),
    /// A choice's `index`: a u64, else 0.
    Index,
    /// `message`: its `content` string.
    Content(bool),
    /// `tool_calls`: every element's `function.name` and `function.arguments` (and, when
    /// collected, each element as a [`CallPiece`]).
    ToolCalls(bool),
    /// A tool call: its `function`'s `name` and `arguments`, its `index` and `id`.
    ToolCall(bool),
    /// `function_call` (or a tool call's `function`): its `name` and `arguments`.
    FunctionCall(bool),
}

#[derive(Default)]
struct LenientVal<'de> {
    non_empty: bool,
    index: u64,
    text: Option<Cow<'de, str>>,
    /// A tool call's `index` was given (`index` holds it).
    indexed: bool,
    /// A tool call's (or a function call's) pieces, and `tool_calls`' elements, when
    /// collected: boxed, so the value every member of every chunk is read into stays small
    /// (it is moved once a member; calls are rare).
    call: Option<Box<CallVal<'de>>>,
}

/// The parts of [`LenientVal`] only tool and function calls have.
#[derive(Default)]
struct CallVal<'de> {
    name: Option<Cow<'de, str>>,
    arguments: Option<Cow<'de, str>>,
    calls: Vec<CallPiece<'de>>,
}

impl<'de> LenientVal<'de> {
    /// The call's parts, made when first needed.
    fn call(&mut self) -> &mut CallVal<'de> {
        self.call.get_or_insert_with(Default::default)
    }

    /// (name, arguments) of a tool or function call.
    fn name_and_arguments(self) -> [Option<Cow<'de, str>>; 2] {
        self.call.map_or([None, None], |c| [c.name, c.arguments])
    }
}

impl LenientVal<'_> {
    fn flag(non_empty: bool) -> Self {
        LenientVal {
            non_empty,
            ..Default::default()
        }
    }
}

impl<'de> DeserializeSeed<'de> for Lenient {
    type Value = LenientVal<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Lenient {
    type Value = LenientVal<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(LenientVal {
            text: matches!(self, Lenient::Text(true)).then_some(Cow::Borrowed(v)),
            ..LenientVal::flag(!v.is_empty())
        })
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LenientVal {
            text: matches!(self, Lenient::Text(true)).then(|| Cow::Owned(v.to_owned())),
            ..LenientVal::flag(!v.is_empty())
        })
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(v))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(true))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(LenientVal {
            index: v,
            ..LenientVal::flag(true)
        })
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(true))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(false))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(LenientVal::flag(false))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut v = LenientVal::default();
        match self {
            Lenient::ToolCalls(collect) => {
                while let Some(mut call) = seq.next_element_seed(Lenient::ToolCall(collect))? {
                    v.non_empty = true;
                    if collect {
                        let index = call.indexed.then_some(call.index);
                        let id = call.text.take();
                        let [name, arguments] = call.name_and_arguments();
                        v.call().calls.push(CallPiece {
                            index,
                            id,
                            name,
                            arguments,
                        });
                    }
                }
            }
            _ => {
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    v.non_empty = true;
                }
            }
        }
        Ok(v)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut v = LenientVal::flag(true);
        let (names, collect): (&'static [&'static str], bool) = match self {
            Lenient::Content(c) => (&["content"], c),
            Lenient::ToolCall(c) => (&["function", "index", "id"], c),
            Lenient::FunctionCall(c) => (&["name", "arguments"], c),
            Lenient::Text(_) | Lenient::Index | Lenient::ToolCalls(_) => (&[], false),
        };
        // The last of a repeated key counts, as in a tree.
        let mut name = None;
        let mut arguments = None;
        while let Some(key) = map.next_key_seed(Field(names))? {
            match (self, key) {
                (Lenient::Content(_), Some(_)) => {
                    v.text = map.next_value_seed(Lenient::Text(collect))?.text
                }
                (Lenient::ToolCall(_), Some(0)) => {
                    let f = map.next_value_seed(Lenient::FunctionCall(collect))?;
                    let [name, arguments] = f.name_and_arguments();
                    if name.is_some() || arguments.is_some() {
                        let c = v.call();
                        (c.name, c.arguments) = (name, arguments);
                    } else if let Some(c) = v.call.as_mut() {
                        (c.name, c.arguments) = (None, None);
                    }
                }
                (Lenient::ToolCall(_), Some(1)) => {
                    v.index = map.next_value_seed(Lenient::Index)?.index;
                    v.indexed = true;
                }
                (Lenient::ToolCall(_), Some(_)) => {
                    v.text = map.next_value_seed(Lenient::Text(collect))?.text
                }
                (Lenient::FunctionCall(_), Some(0)) => {
                    name = map.next_value_seed(Lenient::Text(collect))?.text
                }
                (Lenient::FunctionCall(_), Some(_)) => {
                    arguments = map.next_value_seed(Lenient::Text(collect))?.text
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if matches!(self, Lenient::FunctionCall(_)) && (name.is_some() || arguments.is_some()) {
            let c = v.call();
            (c.name, c.arguments) = (name, arguments);
        }
        Ok(v)
    }
}
