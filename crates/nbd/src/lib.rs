//! Tessera's NBD server (fixed newstyle, structured replies, `base:allocation`) exporting
//! vdisks, and a client that speaks the same protocol for tests and benchmarks.

pub mod client;
#[cfg(feature = "server")]
mod conn;
#[cfg(feature = "server")]
pub mod export;
#[cfg(feature = "server")]
pub mod handshake;
#[cfg(feature = "server")]
pub mod held;
pub mod proto;
#[cfg(feature = "server")]
mod serial;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod tls;
#[cfg(feature = "server")]
mod transmission;
#[cfg(feature = "server")]
mod workers;

#[cfg(all(test, feature = "server"))]
mod inline_tests;

#[cfg(feature = "server")]
pub use export::{Export, Registry};
#[cfg(feature = "server")]
pub use server::{serve, serve_tcp, serve_unix, Policy};
#[cfg(feature = "server")]
pub use tls::{TlsConfig, TlsServer};
#[cfg(feature = "server")]
pub use transmission::MAX_BLOCK_STATUS_SPAN;
