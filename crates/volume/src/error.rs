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
}

impl VolumeError {
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
