//! Replication of vdisk snapshots to another pool, usually on another machine: each cycle
//! sends what changed between the last snapshot both sides hold and a new one, offered by
//! fingerprint so that the replica asks only for what it lacks, compressed on the wire, and
//! ends with the same snapshot on the replica. This crate is the stream between the two
//! pools; the daemon carries it over authenticated, encrypted connections and schedules it.

mod error;
mod receive;
mod send;
pub mod transport;
pub mod wire;

pub use error::{ReplError, Result};
pub use receive::{
    cycle_cut, forget_cycle, receive, Commit, Joins, ReceiveOptions, ReceiveReport, ReplicaSite, Stream,
};
pub use send::{send, send_streams, send_watched, SendReport, Target};
pub use transport::Transport;
