use thiserror::Error;

#[derive(Debug, Error)]
pub enum ReplError {
    #[error("replication stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("replication protocol: {0}")]
    Protocol(String),
    /// The peer refused, and said why.
    #[error("the replica refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Volume(#[from] tessera_volume::VolumeError),
    #[error("{0}")]
    Invalid(String),
    #[error("cancelled; the next attempt goes on from what the replica holds")]
    Cancelled,
}

pub type Result<T> = std::result::Result<T, ReplError>;
