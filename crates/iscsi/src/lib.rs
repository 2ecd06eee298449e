//! Tessera's iSCSI target (RFC 7143): PDUs, login and parameter negotiation, sessions, and the
//! full feature phase that carries SCSI commands to the LUNs of `tessera-scsi`.

#[cfg(feature = "target")]
mod accept;
pub mod auth;
#[cfg(feature = "target")]
mod conn;
#[cfg(feature = "target")]
mod inbox;
pub mod initiator;
pub mod limits;
#[cfg(feature = "target")]
pub mod login;
pub mod params;
pub mod pdu;
#[cfg(feature = "target")]
pub mod portal;
#[cfg(feature = "target")]
pub mod target;
pub mod text;

#[cfg(feature = "target")]
pub use accept::{serve, serve_counted};
pub use auth::{Access, Chap};
pub use limits::Limits;
#[cfg(feature = "target")]
pub use portal::SocketBuffers;
#[cfg(feature = "target")]
pub use target::{LoginRefusal, RefusalObserver, Registry, Target};
