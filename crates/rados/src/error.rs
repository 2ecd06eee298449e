use std::fmt;

/// RADOS' "write older than the object's sequence" (`EOLDSNAPC`), which Linux numbers
/// `ERESTART`.
const EOLDSNAPC: i32 = 85;

/// What a librados call refused, with the call and the object or pool it was about.
#[derive(Debug)]
pub enum RadosError {
    Call {
        op: String,
        on: String,
        errno: i32,
    },
    /// The pool the call went to is gone from the cluster (deleted; one made again under its
    /// name is another pool). librados answers it as it answers a missing object (ENOENT),
    /// which a thin disk reads as zeros: told apart, so that nobody does.
    PoolGone {
        op: String,
        on: String,
        pool_id: i64,
    },
    Invalid(String),
}

impl RadosError {
    /// The error number librados returned, if it was a call that failed.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RadosError::Call { errno, .. } => Some(*errno),
            RadosError::PoolGone { .. } | RadosError::Invalid(_) => None,
        }
    }

    /// The pool the call went to was deleted ([`RadosError::PoolGone`]).
    pub fn is_pool_gone(&self) -> bool {
        matches!(self, RadosError::PoolGone { .. })
    }

    /// A guard of a compound write did not hold (a compared attribute differed): the write
    /// was not applied.
    pub fn is_guard_failure(&self) -> bool {
        self.errno() == Some(libc::ECANCELED)
    }

    /// A write carried a lower sequence than one already applied to the object
    /// ([`Pool::order_writes`](crate::Pool::order_writes)): a newer owner wrote it. RADOS'
    /// `EOLDSNAPC`, which is Linux's `ERESTART` (85).
    pub fn is_out_of_order(&self) -> bool {
        self.errno() == Some(EOLDSNAPC)
    }

    /// This client was fenced off (blocklisted): nothing it sends is applied any more.
    pub fn is_fenced(&self) -> bool {
        // librados reports a blocklisted client's operations as ESHUTDOWN (EBLOCKLISTED).
        self.errno() == Some(libc::ESHUTDOWN)
    }
}

impl fmt::Display for RadosError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RadosError::Call {
                op,
                on,
                errno: EOLDSNAPC,
            } => write!(
                f,
                "RADOS {op} of {on} failed: the object took a write of a later sequence (EOLDSNAPC, errno 85)"
            ),
            RadosError::Call { op, on, errno } => write!(
                f,
                "RADOS {op} of {on} failed: {} (errno {errno})",
                std::io::Error::from_raw_os_error(*errno)
            ),
            RadosError::PoolGone { op, on, pool_id } => write!(
                f,
                "RADOS {op} of {on} failed: its RADOS pool (id {pool_id}) is gone from the cluster (deleted)"
            ),
            RadosError::Invalid(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for RadosError {}

pub type Result<T> = std::result::Result<T, RadosError>;
