//! What a benchmark runs against: a file or block device, a vdisk in this process, an iSCSI
//! LUN through this repository's initiator, or an NBD export through its client.

use std::path::PathBuf;
use std::sync::Arc;

use tessera_disk::{BlockDevice, FileDisk};
use tessera_iscsi::initiator::{InitiatorError, LoginConfig, Session};
use tessera_nbd::client::Client;
use tessera_volume::Vdisk;

/// Parsed from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    File(PathBuf),
    Vdisk { pool: String, name: String },
    Iscsi { addr: String, iqn: String, lun: u64 },
    Nbd { addr: String, export: String },
}

/// `host[:port]` with a default port; IPv6 literals in brackets.
fn with_port(hostport: &str, default: u16) -> String {
    let has_port = match hostport.rfind(']') {
        Some(i) => hostport[i..].contains(':'),
        None => hostport.contains(':'),
    };
    if has_port {
        hostport.to_string()
    } else {
        format!("{hostport}:{default}")
    }
}

impl TargetSpec {
    pub fn parse(s: &str) -> Result<TargetSpec, String> {
        if let Some(rest) = s.strip_prefix("vdisk:") {
            let (pool, name) = rest
                .split_once('/')
                .filter(|(p, n)| !p.is_empty() && !n.is_empty())
                .ok_or_else(|| format!("'{s}': write vdisk:POOL/NAME"))?;
            return Ok(TargetSpec::Vdisk {
                pool: pool.into(),
                name: name.into(),
            });
        }
        if let Some(rest) = s.strip_prefix("iscsi://") {
            let parts: Vec<&str> = rest.splitn(3, '/').collect();
            let [host, iqn, lun] = parts[..] else {
                return Err(format!("'{s}': write iscsi://HOST[:PORT]/IQN/LUN"));
            };
            let lun = lun.parse().map_err(|_| format!("'{s}': '{lun}' is not a LUN number"))?;
            if host.is_empty() || iqn.is_empty() {
                return Err(format!("'{s}': write iscsi://HOST[:PORT]/IQN/LUN"));
            }
            return Ok(TargetSpec::Iscsi {
                addr: with_port(host, 3260),
                iqn: iqn.into(),
                lun,
            });
        }
        if let Some(rest) = s.strip_prefix("nbd://") {
            let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                return Err(format!("'{s}': write nbd://HOST[:PORT]/EXPORT"));
            }
            return Ok(TargetSpec::Nbd {
                addr: with_port(host, 10809),
                export: export.into(),
            });
        }
        if s.contains("://") {
            return Err(format!(
                "'{s}': a target is vdisk:POOL/NAME, iscsi://HOST[:PORT]/IQN/LUN, nbd://HOST[:PORT]/EXPORT, or a file"
            ));
        }
        let path = s.strip_prefix("file:").unwrap_or(s);
        if path.is_empty() {
            return Err("an empty file name".into());
        }
        Ok(TargetSpec::File(PathBuf::from(path)))
    }
}

impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::File(p) => write!(f, "{}", p.display()),
            TargetSpec::Vdisk { pool, name } => write!(f, "vdisk:{pool}/{name}"),
            TargetSpec::Iscsi { addr, iqn, lun } => write!(f, "iscsi://{addr}/{iqn}/{lun}"),
            TargetSpec::Nbd { addr, export } => write!(f, "nbd://{addr}/{export}"),
        }
    }
}

/// Blocking I/O on a target served in this process.
pub trait SyncIo: Send + Sync {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String>;
    /// With `through`, the data is on stable media when this returns.
    fn write(&self, offset: u64, data: &[u8], through: bool) -> Result<(), String>;
    fn flush(&self) -> Result<(), String>;
}

impl SyncIo for Vdisk {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        Vdisk::read(self, offset, buf).map_err(|e| e.to_string())
    }
    fn write(&self, offset: u64, data: &[u8], through: bool) -> Result<(), String> {
        Vdisk::write(self, offset, data, through).map_err(|e| e.to_string())
    }
    fn flush(&self) -> Result<(), String> {
        Vdisk::flush(self).map_err(|e| e.to_string())
    }
}

impl SyncIo for FileDisk {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.read_at(buf, offset).map_err(|e| e.to_string())
    }
    fn write(&self, offset: u64, data: &[u8], through: bool) -> Result<(), String> {
        self.write_at(data, offset).map_err(|e| e.to_string())?;
        if through {
            // Direct I/O skips the page cache, not the device's: what O_DSYNC would do.
            BlockDevice::flush(self).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), String> {
        BlockDevice::flush(self).map_err(|e| e.to_string())
    }
}

/// A target ready for I/O: per thread, its own connection for network targets (over iSCSI,
/// threads share sessions round-robin when the target takes fewer sessions than threads).
pub enum Opened {
    Sync(Arc<dyn SyncIo>),
    Iscsi { sessions: Vec<Arc<Session>>, lun: u64 },
    Nbd(Vec<Arc<Client>>),
}

pub struct Target {
    pub name: String,
    pub size: u64,
    /// Logical block size: I/O sizes and offsets are multiples of it.
    pub block: u32,
    pub io: Opened,
    /// What the run should know about how the target was opened (sessions shared).
    pub notes: Vec<String>,
}

/// Options for opening network targets.
#[derive(Debug, Clone, Default)]
pub struct Connect {
    pub initiator: Option<String>,
    pub chap: Option<(String, String)>,
    pub digests: bool,
}

pub const BENCH_INITIATOR: &str = "iqn.2026-11.io.tessera:bench";

impl Target {
    pub fn sync(name: &str, io: Arc<dyn SyncIo>, size: u64, block: u32) -> Target {
        Target {
            name: name.into(),
            size,
            block,
            io: Opened::Sync(io),
            notes: Vec::new(),
        }
    }

    /// A vdisk opened in this process; `name` is how reports call it ("vdisk:POOL/NAME").
    pub fn vdisk(name: &str, v: Arc<Vdisk>) -> Target {
        let (size, block) = (v.size(), v.block_size());
        Target::sync(name, v, size, block)
    }

    /// Opens a file or block device with direct I/O.
    pub fn file(path: &std::path::Path) -> Result<Target, String> {
        let f = FileDisk::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let size = f.size();
        Ok(Target::sync(
            &path.display().to_string(),
            Arc::new(f),
            size,
            tessera_disk::SECTOR as u32,
        ))
    }

    /// Connects `threads` times to a network target.
    pub async fn connect(spec: &TargetSpec, threads: u32, opts: &Connect) -> Result<Target, String> {
        match spec {
            TargetSpec::Nbd { addr, export } => {
                let mut clients = Vec::new();
                for _ in 0..threads {
                    let c = Client::connect(addr, export)
                        .await
                        .map_err(|e| format!("{spec}: {e}"))?;
                    clients.push(Arc::new(c));
                }
                let info = &clients[0].info;
                let (size, block) = (info.size, info.min_block.max(1));
                Ok(Target {
                    name: spec.to_string(),
                    size,
                    block,
                    io: Opened::Nbd(clients),
                    notes: Vec::new(),
                })
            }
            TargetSpec::Iscsi { addr, iqn, lun } => {
                let mut sessions = Vec::new();
                let mut notes = Vec::new();
                for t in 0..threads {
                    let mut cfg = LoginConfig::new(opts.initiator.as_deref().unwrap_or(BENCH_INITIATOR), Some(iqn));
                    cfg.isid[4] = (t >> 8) as u8;
                    cfg.isid[5] = t as u8;
                    cfg.chap = opts.chap.clone();
                    cfg.header_digest = opts.digests;
                    cfg.data_digest = opts.digests;
                    match Session::login(addr, &cfg).await {
                        Ok(s) => sessions.push(Arc::new(s)),
                        // The target takes no more sessions from this initiator (out of
                        // resources: a per-initiator limit, as Tessera's and LIO's): the
                        // threads share those it took, each with its own commands in flight.
                        Err(InitiatorError::LoginRefused { class: 3, detail: 2 }) if !sessions.is_empty() => {
                            notes.push(format!(
                                "{spec}: the target took {} sessions from this initiator; the {threads} threads share them",
                                sessions.len()
                            ));
                            break;
                        }
                        Err(e) => return Err(format!("{spec}: login: {e}")),
                    }
                }
                let (size, block) = iscsi_capacity(&sessions[0], *lun)
                    .await
                    .map_err(|e| format!("{spec}: {e}"))?;
                Ok(Target {
                    name: spec.to_string(),
                    size,
                    block,
                    io: Opened::Iscsi { sessions, lun: *lun },
                    notes,
                })
            }
            TargetSpec::File(p) => Target::file(p),
            TargetSpec::Vdisk { .. } => Err(format!("{spec}: a vdisk is opened by the caller")),
        }
    }

    /// Ends network sessions politely.
    pub async fn close(self) {
        match self.io {
            Opened::Iscsi { sessions, .. } => {
                for s in sessions {
                    if let Ok(s) = Arc::try_unwrap(s) {
                        let _ = s.logout().await;
                    }
                }
            }
            Opened::Nbd(clients) => {
                for c in clients {
                    if let Ok(c) = Arc::try_unwrap(c) {
                        let _ = c.disconnect().await;
                    }
                }
            }
            Opened::Sync(io) => {
                let _ = io.flush();
            }
        }
    }
}

/// Unit attentions a first command may meet before its answer: more than a target queues.
pub const UNIT_ATTENTION_RETRIES: usize = 16;

/// (bytes, logical block size) from READ CAPACITY(16).
pub async fn iscsi_capacity(s: &Session, lun: u64) -> Result<(u64, u32), String> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9E;
    cdb[1] = 0x10;
    cdb[13] = 32;
    // The first commands may meet unit attentions (power on, a nexus loss, a capacity
    // change...), one reported per command; ask again while they last.
    for _ in 0..UNIT_ATTENTION_RETRIES {
        let r = s.command(lun, &cdb, Vec::new(), 32).await.map_err(|e| e.to_string())?;
        if r.status == 0 && r.data.len() >= 12 {
            let last = u64::from_be_bytes(r.data[0..8].try_into().unwrap());
            let block = u32::from_be_bytes(r.data[8..12].try_into().unwrap());
            return Ok(((last + 1) * block as u64, block));
        }
        if r.sense_key().map(|k| k.0) != Some(0x6) {
            return Err(format!(
                "READ CAPACITY failed: status {:#x}, sense {:?}",
                r.status,
                r.sense_key()
            ));
        }
    }
    Err("READ CAPACITY keeps reporting unit attentions".into())
}

/// READ(16) or WRITE(16) of `len` bytes at byte `offset`.
/// With FUA set on a WRITE(16): the data on stable media before the command completes.
pub const FUA: u8 = 0x08;

pub fn rw16(write: bool, offset: u64, len: usize, block: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { 0x8A } else { 0x88 };
    c[2..10].copy_from_slice(&(offset / block as u64).to_be_bytes());
    c[10..14].copy_from_slice(&((len / block as usize) as u32).to_be_bytes());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_specs() {
        assert_eq!(
            TargetSpec::parse("iscsi://10.0.0.1/iqn.2026-11.io.tessera:demo/0").unwrap(),
            TargetSpec::Iscsi {
                addr: "10.0.0.1:3260".into(),
                iqn: "iqn.2026-11.io.tessera:demo".into(),
                lun: 0
            }
        );
        assert_eq!(
            TargetSpec::parse("nbd://[::1]:10900/vol1").unwrap(),
            TargetSpec::Nbd {
                addr: "[::1]:10900".into(),
                export: "vol1".into()
            }
        );
        assert_eq!(
            TargetSpec::parse("nbd://h").unwrap(),
            TargetSpec::Nbd {
                addr: "h:10809".into(),
                export: "".into()
            }
        );
        assert_eq!(
            TargetSpec::parse("vdisk:demo/vol1").unwrap(),
            TargetSpec::Vdisk {
                pool: "demo".into(),
                name: "vol1".into()
            }
        );
        assert_eq!(
            TargetSpec::parse("/dev/sdb").unwrap(),
            TargetSpec::File("/dev/sdb".into())
        );
        for bad in ["vdisk:demo", "iscsi://h/iqn", "iscsi://h/iqn/x", "http://x", "file:"] {
            assert!(TargetSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
