//! Tessera's write-back cache. Writes to the layouts go to a log on the pool's cache disks
//! (kept on two of them whenever there are two, so that losing one loses nothing), are
//! acknowledged once the log holds them, and are destaged to the layouts later: oldest first,
//! widened to the whole stripe rows the log holds dirty, so that a stream of small writes
//! reaches a parity layout as full-stripe writes with no read-modify-write, and a range the
//! host overwrote while it sat in the cache is written once. Reads see cached data. A
//! restart replays the log. Without cache disks, every call goes straight to the layouts.
//!
//! How the cache and the layouts' own crash safety fit together (docs/engine.md): a destage
//! is an ordinary layout write, covered by the layouts' dirty-region records and stripe
//! journal like any other, and the log space of a batch is reused only after its destage was
//! flushed. A crash during a destage leaves the batch in the log: the replay writes it again,
//! whole, and a parity row's new parity is computed from the data columns, never from the old
//! parity, so the row a crash tore is made consistent by the replay.

mod cache;
mod error;
mod format;
mod held;
mod index;
mod log;
mod lost;
mod parked;

pub use cache::{CacheStatus, WriteCache, DEFAULT_VDISK_CACHE};
pub use error::{CacheError, Result};
pub use log::log_disks;
