//! The Tessera daemon: its configuration and state directory, the pools it owns, long-running
//! jobs, and the management API. The `tessera` binary (crates/cli) runs it with `tessera serve`
//! and is also its client.

pub mod api;
pub mod auto_repair;
pub mod config;
pub mod daemon;
pub mod data_paths;
pub mod dedup;
pub mod demo;
pub mod error;
pub mod events;
pub mod forwarding;
pub mod health_events;
pub mod image;
pub mod io_history;
pub mod jobs;
pub mod lock;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod nbd_exports;
pub mod networks;
pub mod origin;
pub mod portals;
pub mod rados_pools;
pub mod replication;
pub mod scans;
pub mod scrubs;
pub mod serve;
pub mod staged_file;
pub mod standby;
pub mod statefile;
pub mod targets;
pub mod units;

pub use config::{Overrides, ServerConfig};
pub use daemon::Daemon;
pub use error::{ApiError, ApiResult, ErrorBody};
