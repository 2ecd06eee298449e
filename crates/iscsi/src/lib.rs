//! Tessera's iSCSI target (RFC 7143): PDUs, login and parameter negotiation, sessions, and the
//! full feature phase that carries SCSI commands to the LUNs of `tessera-scsi`.

pub mod auth;
mod conn;
pub mod initiator;
pub mod login;
pub mod params;
pub mod pdu;
pub mod target;
pub mod text;

pub use auth::{Access, Chap};
pub use target::{serve, Registry, Target};
