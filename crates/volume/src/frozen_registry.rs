//! The frozen images alive in one engine, so that the metadata check can count the grain
//! references they hold. It knows their pieces, not the images, so that what vdisks share
//! (shared.rs) can hold it without holding the images.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::space::Loc;

/// One frozen range of the source: where it sits in the image and in the source, and the
/// location of every grain it touches (0: unmapped, reads as zeros).
#[derive(Debug)]
pub(crate) struct Piece {
    pub at: u64,
    pub src_off: u64,
    pub len: u64,
    pub first_grain: u64,
    pub locs: Vec<Loc>,
}

/// The pieces of every live frozen image, by an id of the registry's.
#[derive(Default)]
pub(crate) struct FrozenRegistry {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Weak<Vec<Piece>>>>,
}

impl FrozenRegistry {
    /// Registers an image's pieces; the id is what [`forget`](Self::forget) takes.
    pub(crate) fn register(&self, pieces: &Arc<Vec<Piece>>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live.lock().insert(id, Arc::downgrade(pieces));
        id
    }

    /// The image is giving its references back.
    pub(crate) fn forget(&self, id: u64) {
        self.live.lock().remove(&id);
    }

    /// Every grain location a live frozen image holds a reference to, with multiplicity.
    pub(crate) fn held(&self) -> Vec<Loc> {
        let live: Vec<Arc<Vec<Piece>>> = self.live.lock().values().filter_map(|w| w.upgrade()).collect();
        live.iter()
            .flat_map(|pieces| pieces.iter().flat_map(|p| p.locs.iter().copied().filter(|&l| l != 0)))
            .collect()
    }
}
