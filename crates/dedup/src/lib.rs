//! Deduplication by content: the fingerprints that find candidate grains, the fingerprint
//! index in the pool's metadata store, the settings an operator gives, the savings report and
//! the pace of a background run. What needs a vdisk's internals (its grain map, locks and the
//! sharing itself) is in the volume layer, which uses this crate (docs/dedup.md).

mod compress;
mod fingerprint;
mod index;
mod report;
mod settings;

pub use compress::{decompress, Compression};
pub use fingerprint::{Fingerprint, Fingerprinter, HashTail};
pub use index::{class_tag, key as index_key, FingerprintIndex, IndexEntry, IndexKey, IndexStats, Vouch};
pub use report::{DedupStatus, GcReport, PassReport, VdiskSavings};
pub use settings::{DedupMode, DedupSettings, PassOptions, DEFAULT_HOT_COPY_REFS};
