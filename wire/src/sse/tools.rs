//! The tool call pieces of a chunk ([`ChunkText::tool_calls`]), kept in the reused buffer
//! as ranges of one string, so reading them allocates nothing once the buffer has grown.

use std::borrow::Cow;

use super::ChunkText;

/// Where one tool call piece's strings are in [`ChunkText`]'s `tool_text`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct CallRanges {
    index: Option<u64>,
    id: std::ops::Range<usize>,
    name: std::ops::Range<usize>,
    arguments: std::ops::Range<usize>,
}

/// One piece of a streamed tool call (an element of the first choice's `delta.tool_calls`):
/// the call's `index` (None when the server sent none), and what this piece carries of its
/// `id`, `function.name` and `function.arguments` (empty when absent). The id and name
/// arrive in the first piece of each call, the arguments in pieces after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolCallPiece<'a> {
    /// The call's `index` in the response.
    pub index: Option<u64>,
    /// Its `id`, in the piece that carries it.
    pub id: &'a str,
    /// Its `function.name`, in the piece that carries it.
    pub name: &'a str,
    /// This piece of its `function.arguments` (JSON text, in pieces).
    pub arguments: &'a str,
}

impl ChunkText {
    /// The tool call pieces of the first choice in this chunk, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = ToolCallPiece<'_>> {
        self.calls.iter().map(|c| ToolCallPiece {
            index: c.index,
            id: &self.tool_text[c.id.clone()],
            name: &self.tool_text[c.name.clone()],
            arguments: &self.tool_text[c.arguments.clone()],
        })
    }

    pub(super) fn clear(&mut self) {
        self.output.clear();
        self.answer.clear();
        self.reasoning.clear();
        self.calls.clear();
        self.tool_text.clear();
    }

    pub(super) fn push_call(&mut self, c: &CallPiece<'_>) {
        fn s<'a>(s: &'a Option<Cow<'_, str>>) -> &'a str {
            s.as_deref().unwrap_or("")
        }
        self.push_call_parts(c.index, s(&c.id), s(&c.name), s(&c.arguments));
    }

    /// A tool call's piece: its index, and its id, name and arguments as this chunk has them
    /// (empty when absent).
    pub(super) fn push_call_parts(
        &mut self,
        index: Option<u64>,
        id: &str,
        name: &str,
        arguments: &str,
    ) {
        let mut put = |s: &str| {
            let start = self.tool_text.len();
            self.tool_text.push_str(s);
            start..self.tool_text.len()
        };
        let r = CallRanges {
            index,
            id: put(id),
            name: put(name),
            arguments: put(arguments),
        };
        self.calls.push(r);
    }
}

/// One element of a `delta.tool_calls` array, borrowed from the payload where it can be.
#[derive(Debug, Default)]
pub(super) struct CallPiece<'de> {
    pub(super) index: Option<u64>,
    pub(super) id: Option<Cow<'de, str>>,
    pub(super) name: Option<Cow<'de, str>>,
    pub(super) arguments: Option<Cow<'de, str>>,
}
