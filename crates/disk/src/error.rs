//! Errors of disk I/O. Every variant names the disk's path so that a message alone tells
//! an operator which device misbehaved.

use crate::label::LabelError;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {op} at offset {offset} length {len}: {source}")]
    Io {
        path: String,
        op: &'static str,
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    /// Also returned for zero-length requests, which no caller should issue.
    #[error("{path}: {op} of {len} bytes at offset {offset} is not aligned to {align} bytes")]
    Unaligned {
        path: String,
        op: &'static str,
        offset: u64,
        len: usize,
        align: usize,
    },
    #[error("{path}: {op} of {len} bytes at offset {offset} is beyond the end of the disk ({size} bytes)")]
    OutOfRange {
        path: String,
        op: &'static str,
        offset: u64,
        len: usize,
        size: u64,
    },
    #[error("{path}: cannot open: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Not a regular file or block device, too small, and the like.
    #[error("{path}: {reason}")]
    Unusable { path: String, reason: String },
    /// The storage behind the disk could not serve this request now: a cluster unreachable,
    /// or this client fenced off by another owner. It says nothing of the disk's health (the
    /// storage keeps its own redundancy), so it is never counted against the disk, nor makes
    /// it failed: the request fails, and the next may succeed.
    #[error("{path}: {op} at offset {offset} length {len} could not be served now: {reason}")]
    Unavailable {
        path: String,
        op: &'static str,
        offset: u64,
        len: usize,
        reason: String,
    },
    /// Produced only by the fault-injecting backend.
    #[error("{path}: injected fault: {what}")]
    Injected { path: String, what: String },
    #[error(transparent)]
    Label(#[from] LabelError),
}

impl DiskError {
    /// The path of the disk the error is about.
    pub fn path(&self) -> &str {
        match self {
            DiskError::Io { path, .. }
            | DiskError::Unaligned { path, .. }
            | DiskError::OutOfRange { path, .. }
            | DiskError::Open { path, .. }
            | DiskError::Unusable { path, .. }
            | DiskError::Unavailable { path, .. }
            | DiskError::Injected { path, .. } => path,
            DiskError::Label(e) => e.path(),
        }
    }

    /// Whether the storage behind the disk is full (ENOSPC, or EDQUOT for a quota): the disk
    /// itself is not at fault, and a write refused for it has changed nothing.
    pub fn is_no_space(&self) -> bool {
        matches!(self, DiskError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
    }

    /// Whether the error is the storage's momentary refusal rather than the disk's fault
    /// ([`DiskError::Unavailable`]).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DiskError::Unavailable { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_path_and_request() {
        let e = DiskError::Io {
            path: "/dev/sdb".into(),
            op: "read",
            offset: 8192,
            len: 4096,
            source: std::io::Error::from_raw_os_error(libc::EIO),
        };
        let s = e.to_string();
        assert!(s.starts_with("/dev/sdb: read at offset 8192 length 4096: "), "{s}");
        assert!(std::error::Error::source(&e).is_some());

        let e = DiskError::OutOfRange {
            path: "d".into(),
            op: "write",
            offset: 4096,
            len: 8192,
            size: 8192,
        };
        assert_eq!(
            e.to_string(),
            "d: write of 8192 bytes at offset 4096 is beyond the end of the disk (8192 bytes)"
        );
        assert_eq!(e.path(), "d");
    }

    #[test]
    fn label_errors_pass_through() {
        let e: DiskError = LabelError::Missing { path: "x".into() }.into();
        assert_eq!(e.to_string(), "x: no Tessera label (blank or foreign disk)");
        assert_eq!(e.path(), "x");
    }
}
