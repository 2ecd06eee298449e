use tessera_cache::CacheError;
use tessera_layout::LayoutError;
use tessera_pool::PoolError;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("{0}")]
    Invalid(String),
    #[error("no virtual disk '{0}'")]
    NoSuchVdisk(String),
    #[error("virtual disk '{0}' already exists")]
    Exists(String),
    #[error("out of space: {0}")]
    NoSpace(String),
    #[error("'{0}' is a snapshot and cannot be changed")]
    ReadOnly(String),
    #[error("virtual disk '{0}' was deleted")]
    Deleted(String),
    /// The write-back log failed (every cache disk lost), or a writer waited for room in it
    /// that the destager cannot make.
    #[error("{0}")]
    Cache(String),
    /// A flush found that data written since the caller's last flush may be gone: disks of
    /// a slab set it wrote were lost, beyond what the set tolerates, before they flushed it.
    /// Or a read of data lost in the write-back log before it was destaged, or found beyond
    /// repair on the pool's disks when the log's data beside it was destaged.
    #[error("{0}")]
    Lost(String),
    /// Stored data that passed its checksums and still cannot be what it claims (a
    /// compressed grain that does not decompress).
    #[error("{0}")]
    Corrupt(String),
}

impl From<CacheError> for VolumeError {
    fn from(e: CacheError) -> VolumeError {
        match e {
            CacheError::Layout(l) => VolumeError::Layout(l),
            CacheError::Pool(p) => VolumeError::Pool(p),
            e @ CacheError::Log(_) => VolumeError::Cache(e.to_string()),
            CacheError::Lost(why) => VolumeError::Lost(why),
            CacheError::Waiting(why) => VolumeError::Cache(why),
        }
    }
}

impl VolumeError {
    /// True when the storage refused a write for now and nothing was written: a host may
    /// send it again (SCSI reports it as NOT READY, ASYMMETRIC ACCESS STATE TRANSITION).
    pub fn is_refused(&self) -> bool {
        matches!(self, VolumeError::Layout(LayoutError::Refused { .. }))
    }

    /// True when the failure is a lack of pool space (SCSI reports it as SPACE ALLOCATION
    /// FAILED WRITE PROTECT).
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            VolumeError::NoSpace(_) | VolumeError::Pool(PoolError::NoSpace { .. })
        ) || matches!(self, VolumeError::Layout(LayoutError::Pool(PoolError::NoSpace { .. })))
    }
}

pub type Result<T, E = VolumeError> = std::result::Result<T, E>;
