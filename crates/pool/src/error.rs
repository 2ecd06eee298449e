use tessera_disk::{DiskError, LabelError};

/// Errors of pool operations. Every message says what was wrong and, where it helps, what to do.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error(transparent)]
    Label(#[from] LabelError),
    #[error("metadata store at {path}: {message}")]
    Meta { path: String, message: String },
    /// A change the metadata store refused before applying any of it (a gateway with a
    /// later epoch holds the records, or they are not as a commit must find them): the
    /// records are as they were.
    #[error("metadata store at {path}: {message}")]
    MetaRefused { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
    #[error("pool '{pool}' has no disk '{disk}'")]
    NoSuchDisk { pool: String, disk: String },
    /// No slab can be placed: out of space, or too few disks outside those excluded (a
    /// set's own members, for a repair); `detail` says which, and what to do.
    #[error("pool '{pool}' {detail}")]
    NoSpace { pool: String, detail: String },
    #[error("{0} already exists")]
    Exists(String),
}

impl From<rocksdb::Error> for PoolError {
    fn from(e: rocksdb::Error) -> Self {
        PoolError::Meta {
            path: String::new(),
            message: e.to_string(),
        }
    }
}

pub type Result<T, E = PoolError> = std::result::Result<T, E>;
