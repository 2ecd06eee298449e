//! Tessera's NBD server (fixed newstyle, structured replies, `base:allocation`) exporting
//! vdisks, and a client that speaks the same protocol for tests and benchmarks.

pub mod client;
pub mod export;
pub mod handshake;
pub mod proto;
pub mod server;
mod transmission;

pub use export::{Export, Registry};
pub use server::serve;
