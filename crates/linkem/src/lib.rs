//! A WAN on one machine, for tests and benchmarks: two network namespaces joined through TUN
//! devices by this process, which forwards each packet with a set bandwidth, delay, jitter,
//! random loss and reordering (what `tc netem` does, for machines without its module).
//!
//! Daemons run one per side (`ip netns exec NAME ...`, or [`Netns::command`]); a plain TCP
//! copy across the same link ([`transfer::measure`]) is the peer replication is compared with.

pub mod link;
pub mod netns;
pub mod shape;
pub mod transfer;
mod tun;

pub use link::{DirStats, Link, A_ADDR, B_ADDR};
pub use netns::Netns;
pub use shape::{parse_duration, parse_fraction, parse_rate, Shape};
pub use transfer::{measure, Transfer, TransferReport};

/// Why links cannot be made here (not root, no /dev/net/tun, no `ip`), or None if they can.
pub fn unavailable() -> Option<String> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces and TUN devices)".into());
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun") {
        return Some(format!("/dev/net/tun: {e}"));
    }
    match std::process::Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("no 'ip' command (Debian iproute2)".into()),
    }
}
