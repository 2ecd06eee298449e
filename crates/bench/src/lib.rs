//! `tessera bench`: a diskspd-class workload generator. Targets are files and block devices, a
//! vdisk in this process, iSCSI LUNs (through this repository's initiator) and NBD exports
//! (through its client); workloads are given in diskspd's terms or by the profiles of the seed
//! documents; results are IOPS, throughput, latency percentiles and CPU, optionally repeated
//! until their spread is small, and optionally verified block by block.

pub mod report;
pub mod run;
pub mod target;
pub mod verify;
pub mod workload;

pub use run::{mean_rsd, run, RunReport};
pub use target::{Connect, Target, TargetSpec};
pub use verify::Verifier;
pub use workload::{Workload, PROFILES};
