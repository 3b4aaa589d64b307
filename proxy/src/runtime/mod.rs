//! The threads capture runs on: the serving threads, each its own runtime ([`threads`]), and
//! the memory a thread faults in before a connection burst ([`heap`]).
//!
//! It calls nothing else of the proxy; every other room may call it.

pub(crate) mod heap;
pub(crate) mod threads;
