//! What the NBD server offers: named exports, each a vdisk, read-write or read-only.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use tessera_disk::{eventfd, IoMeter};

use crate::held::HeldBudget;
use tessera_volume::{Vdisk, Writer};

/// Largest READ or WRITE payload we accept (the protocol's portable maximum).
pub const MAX_PAYLOAD: u32 = 32 << 20;

pub struct Export {
    pub name: String,
    pub description: String,
    pub vdisk: Arc<Vdisk>,
    pub read_only: bool,
    /// Open connections to this export.
    pub(crate) connections: AtomicUsize,
    /// No longer offered: its connections' requests are refused from now on.
    withdrawn: AtomicBool,
    /// Readable once the export is withdrawn (an eventfd): its idle connections sleep on it
    /// too, and end then rather than at their client's next request. None if the system
    /// gave no eventfd; those connections end at their next request.
    withdrawal: Option<OwnedFd>,
    /// Bytes of request data its connections hold now: READ buffers and WRITE payloads of
    /// requests not yet answered, and replies not yet sent.
    pub(crate) held: AtomicUsize,
    /// What the connections of every export of its registry hold together (the registry's,
    /// once added to one).
    pub(crate) all_held: Arc<HeldBudget>,
    /// Where each request answered is reported, if anywhere.
    pub meter: Option<Arc<dyn IoMeter>>,
    /// Whose writes its connections' are, all of them together: NBD names no host, and a
    /// client of several connections (multi-conn) may flush on one what it wrote on another,
    /// so data written and lost before a flush is reported at the next flush on any of them.
    /// Its name's: an export offered again (its pool served again, say) is the same writer,
    /// and a client that connects again is told at its next flush of what it lost before.
    pub(crate) writer: Writer,
}

impl Export {
    pub fn new(name: &str, description: &str, vdisk: Arc<Vdisk>, read_only: bool) -> Export {
        Export {
            name: name.into(),
            description: description.into(),
            vdisk,
            read_only,
            connections: AtomicUsize::new(0),
            withdrawn: AtomicBool::new(false),
            withdrawal: eventfd::open().ok(),
            held: AtomicUsize::new(0),
            all_held: Arc::default(),
            meter: None,
            writer: Writer::named(&format!("nbd:{name}")),
        }
    }

    /// Whose writes its connections' are (see the field).
    pub fn writer(&self) -> Writer {
        self.writer
    }

    /// The export with each request it answers reported to `meter`.
    pub fn metered(mut self, meter: Arc<dyn IoMeter>) -> Export {
        self.meter = Some(meter);
        self
    }

    /// Bytes of request data its connections hold now (see `held`).
    pub fn held_bytes(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Whether it was removed from the exports offered (see [`Registry::remove`]).
    pub fn withdrawn(&self) -> bool {
        self.withdrawn.load(Ordering::Acquire)
    }

    /// A descriptor that polls readable once the export is withdrawn, if there is one.
    pub(crate) fn withdrawal_fd(&self) -> Option<RawFd> {
        self.withdrawal.as_ref().map(|f| f.as_raw_fd())
    }

    /// Marks it withdrawn, and wakes the connections that sleep on it.
    fn withdraw(&self) {
        self.withdrawn.store(true, Ordering::Release);
        if let Some(fd) = &self.withdrawal {
            eventfd::ring(fd.as_raw_fd());
        }
    }

    /// Minimum block size: the vdisk's logical block; smaller or unaligned requests are refused
    /// with EINVAL rather than read-modify-written.
    pub fn min_block(&self) -> u32 {
        self.vdisk.block_size()
    }

    /// Preferred block size: the vdisk's physical block size, as iSCSI initiators are told
    /// (4096 unless the vdisk was made to present 512-byte physical blocks).
    pub fn preferred_block(&self) -> u32 {
        self.vdisk.physical_block_size()
    }

    pub fn transmission_flags(&self) -> u16 {
        use crate::proto::tflag::*;
        let mut f = HAS_FLAGS | SEND_FLUSH | SEND_FUA | SEND_DF | CAN_MULTI_CONN;
        if self.read_only {
            f |= READ_ONLY;
        } else {
            f |= SEND_TRIM | SEND_WRITE_ZEROES | SEND_FAST_ZERO;
        }
        f
    }
}

/// The exports, by name. Shared by the listener and whoever configures it.
#[derive(Default)]
pub struct Registry {
    exports: RwLock<BTreeMap<String, Arc<Export>>>,
    /// What the connections to its exports hold together.
    held: Arc<HeldBudget>,
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    /// Offers `e`. One offered under its name before is withdrawn, as [`remove`](Self::remove)
    /// does: left to its connections, it would be written through while no registry lists it
    /// (a later removal would not reach it).
    pub fn add(&self, mut e: Export) -> Arc<Export> {
        e.all_held = self.held.clone();
        let e = Arc::new(e);
        let replaced = self.exports.write().insert(e.name.clone(), e.clone());
        if let Some(old) = replaced {
            old.withdraw();
        }
        e
    }

    /// Stops offering an export, and ends its use by the connections open to it: a request
    /// they send from now on is refused with ESHUTDOWN and the connection closes once the
    /// requests it had sent before are answered. An export taken away (or made read-only by
    /// adding it again) is not written through a connection made before.
    pub fn remove(&self, name: &str) -> Option<Arc<Export>> {
        let e = self.exports.write().remove(name);
        if let Some(e) = &e {
            e.withdraw();
        }
        e
    }

    pub fn get(&self, name: &str) -> Option<Arc<Export>> {
        self.exports.read().get(name).cloned()
    }

    /// The export a client means by `name`: the empty name is the default export, which is the
    /// only one when there is exactly one.
    pub fn resolve(&self, name: &str) -> Option<Arc<Export>> {
        let map = self.exports.read();
        if let Some(e) = map.get(name) {
            return Some(e.clone());
        }
        if name.is_empty() && map.len() == 1 {
            return map.values().next().cloned();
        }
        None
    }

    pub fn list(&self) -> Vec<Arc<Export>> {
        self.exports.read().values().cloned().collect()
    }

    /// What the connections to its exports hold together, and the bound on it.
    pub fn held(&self) -> &HeldBudget {
        &self.held
    }
}
