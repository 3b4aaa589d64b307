//! The client side: what a client's connection meets, from its accept to the last byte of
//! its response.
//!
//! - [`state`]: what every connection of a running proxy shares;
//! - [`handler`]: one request once its head is read (refused, passed through, or read whole,
//!   forwarded and recorded);
//! - [`lean`]: the lean HTTP/1.1 server path for plain-http generation requests (hyper's
//!   server serves the rest, from [`crate::lifecycle`]);
//! - [`limits`]: time limits on what clients send; [`accept`]: accept failures and back-off;
//!   [`cut`]: the last stage of a shutdown.
//!
//! It may call: `upstream`, `recording`, `linking` (the client's key), `shadow`, `config`,
//! `metrics`, `phases`, `runtime`.
//! Only [`crate::lifecycle`] and [`crate::admin`] call it.

pub(crate) mod accept;
pub(crate) mod cut;
pub(crate) mod handler;
pub(crate) mod lean;
pub(crate) mod limits;
pub(crate) mod state;
