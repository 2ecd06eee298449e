//! What a benchmark does, in diskspd's terms, and the named profiles of the seed documents.

use std::time::Duration;

use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Workload {
    /// Bytes per I/O (diskspd -b).
    pub block_size: u32,
    /// Independent streams (diskspd -t): each has its own connection to a network target.
    pub threads: u32,
    /// I/Os in flight per thread (diskspd -o).
    pub outstanding: u32,
    /// Share of writes, 0 to 100 (diskspd -w).
    pub write_percent: u8,
    /// Random offsets (diskspd -r) or sequential ones (-s; each thread its own stretch).
    pub random: bool,
    #[serde(with = "secs")]
    pub duration: Duration,
    /// Run, but not measured, before the measurement (diskspd -W).
    #[serde(with = "secs")]
    pub warmup: Duration,
    /// Where the I/O goes: from `offset`, `size` bytes (None: to the end of the target).
    pub offset: u64,
    pub size: Option<u64>,
    /// Write self-describing blocks and check every read.
    pub verify: bool,
    /// Every write on stable media before it completes, as diskspd's -Sh (-h) asks with
    /// write-through: FUA over iSCSI and NBD, a write and a flush in this process.
    pub write_through: bool,
}

mod secs {
    use serde::Serializer;
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            block_size: 4096,
            threads: 1,
            outstanding: 32,
            write_percent: 0,
            random: true,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(0),
            offset: 0,
            size: None,
            verify: false,
            write_through: false,
        }
    }
}

/// The profiles named after the seed documents' workloads.
pub const PROFILES: &[(&str, &str)] = &[
    (
        "4k-read",
        "4K random, 100% read, 32 threads x 16 outstanding (diskspd -b4K -t32 -o16 -r -h)",
    ),
    (
        "4k-90-10",
        "4K random, 90% read, 32 threads x 16 outstanding, writes through (-Sh)",
    ),
    (
        "4k-70-30",
        "4K random, 70% read, 32 threads x 16 outstanding, writes through (-Sh)",
    ),
    (
        "oltp-8k",
        "8K random, 67% read (vdbench OLTP), 8 threads x 8 outstanding",
    ),
    ("seq-256k-read", "256K sequential read, 4 threads x 8 outstanding"),
    ("seq-256k-write", "256K sequential write, 4 threads x 8 outstanding"),
];

impl Workload {
    pub fn profile(name: &str) -> Result<Workload, String> {
        let d = Workload::default();
        let w = match name {
            "4k-read" | "4k-90-10" | "4k-70-30" => Workload {
                block_size: 4096,
                threads: 32,
                outstanding: 16,
                write_percent: match name {
                    "4k-read" => 0,
                    "4k-90-10" => 10,
                    _ => 30,
                },
                random: true,
                // The seeds ran them with -h (-Sh): no cache between the writes and media.
                write_through: true,
                ..d
            },
            "oltp-8k" => Workload {
                block_size: 8192,
                threads: 8,
                outstanding: 8,
                write_percent: 33,
                random: true,
                ..d
            },
            "seq-256k-read" | "seq-256k-write" => Workload {
                block_size: 256 << 10,
                threads: 4,
                outstanding: 8,
                write_percent: if name.ends_with("write") { 100 } else { 0 },
                random: false,
                ..d
            },
            _ => {
                let names: Vec<&str> = PROFILES.iter().map(|p| p.0).collect();
                return Err(format!("no profile '{name}'; there are {}", names.join(", ")));
            }
        };
        Ok(w)
    }

    /// Checks the workload against a target of `size` bytes with `block`-byte logical blocks;
    /// returns the region's (offset, length).
    pub fn region(&self, size: u64, block: u32) -> Result<(u64, u64), String> {
        let bs = self.block_size as u64;
        if bs == 0 || bs % block as u64 != 0 {
            return Err(format!(
                "the I/O size ({bs} bytes) must be a multiple of the target's {block}-byte block"
            ));
        }
        if bs > 32 << 20 {
            return Err(format!("the I/O size ({bs} bytes) is above 32 MiB"));
        }
        if self.offset % block as u64 != 0 {
            return Err(format!("the offset {} is not a multiple of {block}", self.offset));
        }
        if self.threads == 0 || self.outstanding == 0 {
            return Err("threads and outstanding I/Os must be at least 1".into());
        }
        if self.threads * self.outstanding > 4096 {
            return Err("at most 4096 I/Os in flight (threads x outstanding)".into());
        }
        if self.write_percent > 100 {
            return Err("the write percentage is 0 to 100".into());
        }
        if self.offset >= size {
            return Err(format!(
                "the offset {} is beyond the target's {size} bytes",
                self.offset
            ));
        }
        let len = self.size.unwrap_or(size - self.offset).min(size - self.offset);
        let len = len - len % bs;
        if len < bs {
            return Err(format!("the target region holds no {bs}-byte I/O"));
        }
        if self.verify && self.block_size < 64 {
            return Err("--verify needs I/Os of at least 64 bytes".into());
        }
        Ok((self.offset, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_regions() {
        for (p, _) in PROFILES {
            let w = Workload::profile(p).unwrap();
            assert!(w.region(1 << 30, 512).is_ok(), "{p}");
        }
        assert!(Workload::profile("nope").unwrap_err().contains("4k-read"));
        let w = Workload::profile("4k-70-30").unwrap();
        assert_eq!((w.threads, w.outstanding, w.write_percent), (32, 16, 30));
        let w = Workload {
            block_size: 4096,
            offset: 4096,
            size: Some(10_000),
            ..Default::default()
        };
        assert_eq!(w.region(1 << 20, 512).unwrap(), (4096, 8192));
        assert!(w.region(1 << 20, 8192).is_err(), "4K I/O on 8K blocks");
        let w = Workload {
            block_size: 1000,
            ..Default::default()
        };
        assert!(w.region(1 << 20, 512).is_err());
    }
}
