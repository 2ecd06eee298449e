use tessera_pool::PoolError;

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("invalid layout: {0}")]
    Invalid(String),
    #[error("slab set {set}: {unavailable} of its {width} disks are unavailable and the layout tolerates {tolerance}; the data cannot be read or written until a disk comes back")]
    TooManyFailures {
        set: u32,
        unavailable: usize,
        width: usize,
        tolerance: usize,
    },
    #[error("slab set {set}: a disk's cache flush failed and {unavailable} of its {width} disks are now unavailable (the layout tolerates {tolerance}): data written since the last flush may be lost")]
    FlushFailed {
        set: u32,
        unavailable: usize,
        width: usize,
        tolerance: usize,
    },
    #[error("slab set {set}: I/O failed on every copy: {detail}")]
    Io { set: u32, detail: String },
    /// The storage behind every copy refused the request for now (this gateway fenced off
    /// by a newer owner, its cluster unreachable): nothing was written.
    #[error("slab set {set}: the storage refused the request for now, nothing was written: {detail}")]
    Refused { set: u32, detail: String },
    #[error("stripe journal: {0}")]
    Journal(String),
    #[error("no slab set {0}")]
    NoSuchSet(u32),
    #[error("cancelled")]
    Cancelled,
}

pub type Result<T, E = LayoutError> = std::result::Result<T, E>;
