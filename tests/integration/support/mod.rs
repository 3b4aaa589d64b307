//! Helpers shared by the end-to-end tests.
pub mod capture;
pub mod disk;
pub mod env;
pub mod fault_upstream;
pub mod http1;
pub mod misbehaving;
pub mod scripted;
pub mod sim;
