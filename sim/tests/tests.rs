//! Integration tests of the simulator: the engine model on tokio's paused clock, and the HTTP
//! server on real loopback sockets.

#[path = "suite/apis.rs"]
mod apis;
#[path = "suite/engine_model.rs"]
mod engine_model;
#[path = "suite/http.rs"]
mod http;
#[path = "suite/util.rs"]
mod util;
