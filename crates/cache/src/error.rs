use tessera_layout::LayoutError;
use tessera_pool::PoolError;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("write-back cache: {0}")]
    Log(String),
    /// The range read was lost with the write-back log's last disk, before it was destaged.
    #[error("{0}")]
    Lost(String),
    /// The range holds writes parked for disks that can come back (parked.rs).
    #[error("{0}")]
    Waiting(String),
}

pub type Result<T, E = CacheError> = std::result::Result<T, E>;
