//! SCSI block device emulation over a block backend (a Tessera vdisk, or memory): the primary
//! (SPC-4) and block (SBC-3) commands, sense data and VPD pages. Transports (iSCSI) hand a CDB
//! and its data-out buffer to a [`Lun`] and send back the [`Response`].

pub mod alua;
mod backend;
mod bytes;
mod cdb;
mod commands;
mod data;
mod lun;
mod nexus;
mod odx;
mod opcodes;
mod planned;
pub mod pr;
mod ram;
mod sbc;
pub mod sense;
mod spc;
pub mod tpc;
mod xcopy;

pub use alua::{AccessState, PortGroup, PortGroups, SinglePort};
pub use backend::{
    copy_image, BackendError, BackendErrorKind, BackendResult, BlockBackend, DirectRead, DirectWrite, Extent,
    FrozenImage, PlanHold, ReadPlan, WriteHold, WritePlan,
};
pub use cdb::{io_op, transfer_length};
pub use commands::{is_read, lookup, Command, COMMANDS};
pub use data::Data;
pub use lun::{naa_of, Lun, ModeState, ModeStore, OwnerAnswer, OwnerForwarding, PrStore, Response};
pub use nexus::{LunScope, Nexus, Scope};
pub use opcodes::{cdb_len, REPORT_LUNS};
pub use planned::{PlannedRead, PlannedWrite, ReadStart, WriteStart};
pub use pr::PrState;
pub use pr::{is_iscsi_name, Access, PortId};
pub use ram::RamBackend;
pub use sense::Sense;
pub use spc::{decode_lun, encode_lun, report_luns, MAX_TRANSFER_BYTES};
pub use tpc::CopyManager;
