//! What a protocol front end (NBD, iSCSI) reports of each block request it answers, for metrics:
//! the operation, its bytes, how long it took from arrival to answer, and whether it
//! succeeded. The daemon implements it; the front ends only call it.

use std::time::Duration;

/// A request's kind, as metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read = 0,
    Write = 1,
    Flush = 2,
    /// Unmap / trim.
    Unmap = 3,
    /// Write zeroes / write same.
    Zero = 4,
    /// Anything else that reaches the vdisk (block status, copy offload, ...).
    Other = 5,
}

impl IoOp {
    pub const COUNT: usize = 6;
    pub const ALL: [IoOp; IoOp::COUNT] = [
        IoOp::Read,
        IoOp::Write,
        IoOp::Flush,
        IoOp::Unmap,
        IoOp::Zero,
        IoOp::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Flush => "flush",
            IoOp::Unmap => "unmap",
            IoOp::Zero => "zero",
            IoOp::Other => "other",
        }
    }
}

/// Receives one call per request answered. Called on the I/O path: it must be cheap.
pub trait IoMeter: Send + Sync {
    fn done(&self, op: IoOp, bytes: u64, latency: Duration, ok: bool);
}
