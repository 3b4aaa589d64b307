//! Linking: which earlier row a request continues, decided on the writer thread from hashes
//! only.
//!
//! - [`sessions`]: chat turns by their hashed message chains;
//! - [`completions`]: `/v1/completions` turns, a prompt that carries an earlier answer;
//! - [`agents`]: tool results to the response that made the call, sub-agents to the pending
//!   call whose prompt they open with, and the tool columns;
//! - [`responses`]: Responses turns to the response their `previous_response_id` names;
//! - [`bounded`]: the memory they all keep, forgotten oldest first;
//! - [`fleet`]: the same linkers over the rows of several captures, from the link keys
//!   every row carries (`llmreplay link`).
//!
//! It may call: `prefix` (the content hashes). The recording side calls it.

pub mod agents;
pub mod bounded;
pub mod completions;
pub mod fleet;
pub mod responses;
pub mod sessions;
