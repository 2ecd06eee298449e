//! How a caller with a [`ReadRing`](crate::ReadRing) of its own reads a disk: on the ring
//! through the disk's descriptor, or, for a disk whose reads are not plain I/O on a
//! descriptor (a disk on RADOS), by starting the read with the disk and being told on the
//! ring when it is done. Either way the caller's thread does not wait, and no worker thread
//! stands between it and the disk.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::eventfd;

/// A disk that reads in the background and says when it is done.
pub trait AsyncReader: Send + Sync {
    /// Starts a read of `len` bytes at `offset` into `at`, with the rules of
    /// [`BlockDevice::read_at`](crate::BlockDevice::read_at), and returns without waiting;
    /// `done` is completed exactly once, from any thread, when the bytes are in place (or the
    /// read failed). A read of a range that is checked out is completed as failed.
    ///
    /// # Safety
    /// `at` must be valid for `len` bytes, and nothing else may read or write them, until
    /// `done` is completed; the reader must stay alive until then.
    unsafe fn start_read(&self, at: *mut u8, len: u32, offset: u64, done: ReadDone);
}

/// A disk that writes in the background and says when it is done.
pub trait AsyncWriter: Send + Sync {
    /// Starts a write of the `len` bytes at `at` to `offset`, with the rules of
    /// [`BlockDevice::write_at`](crate::BlockDevice::write_at), and returns without waiting;
    /// `done` is completed exactly once, from any thread: whole once the bytes are as durable
    /// as a flush would make them, failed if the write failed, or declined if the disk did
    /// not start it (either way the caller then writes the synchronous way, which tells why).
    ///
    /// # Safety
    /// `at` must be valid for `len` bytes, unchanged, until `done` is completed; the writer
    /// must stay alive until then.
    unsafe fn start_write(&self, at: *const u8, len: u32, offset: u64, done: ReadDone);
}

/// Where the reads of a planned request go.
#[derive(Clone)]
pub enum ReadVia {
    /// An io_uring read on this descriptor ([`BlockDevice::uring_fd`](crate::BlockDevice::uring_fd)).
    Uring(RawFd),
    /// A read started with the disk, which completes it on its own.
    Async(Arc<dyn AsyncReader>),
}

impl ReadVia {
    /// True if both go to the same disk the same way: reads of neighbouring ranges may join.
    pub fn same(&self, other: &ReadVia) -> bool {
        match (self, other) {
            (ReadVia::Uring(a), ReadVia::Uring(b)) => a == b,
            (ReadVia::Async(a), ReadVia::Async(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl std::fmt::Debug for ReadVia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadVia::Uring(fd) => write!(f, "Uring({fd})"),
            ReadVia::Async(_) => f.write_str("Async"),
        }
    }
}

/// The completion of one read started with [`AsyncReader::start_read`] (or write started with
/// [`AsyncWriter::start_write`]): dropping it unused completes it as failed, so that a ring
/// never waits for an operation nobody will finish.
pub struct ReadDone {
    mailbox: Option<Arc<Mailbox>>,
    tag: u64,
}

impl ReadDone {
    /// Says the read is done: `whole` if every byte asked for is in place.
    pub fn complete(mut self, whole: bool) {
        if let Some(m) = self.mailbox.take() {
            m.post(self.tag, if whole { Outcome::Whole } else { Outcome::Failed });
        }
    }

    /// Says the operation was not started: the disk declines it (the caller does it another
    /// way), which is not a failure of the disk and is not counted as one.
    pub fn decline(mut self) {
        if let Some(m) = self.mailbox.take() {
            m.post(self.tag, Outcome::Declined);
        }
    }
}

impl Drop for ReadDone {
    fn drop(&mut self) {
        if let Some(m) = self.mailbox.take() {
            m.post(self.tag, Outcome::Failed);
        }
    }
}

/// How an operation started in the background ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Whole,
    Failed,
    /// Not started: done another way by the caller.
    Declined,
}

/// Completions posted from other threads for one ring, and an eventfd that polls readable
/// while any wait to be taken. The descriptor lives as long as the last completion that may
/// post to it, not only as long as the ring.
pub(crate) struct Mailbox {
    posted: Mutex<Vec<(u64, Outcome)>>,
    ready: OwnedFd,
}

impl Mailbox {
    pub(crate) fn new() -> std::io::Result<Arc<Mailbox>> {
        Ok(Arc::new(Mailbox {
            posted: Mutex::new(Vec::new()),
            ready: eventfd::open()?,
        }))
    }

    pub(crate) fn done(self: &Arc<Self>, tag: u64) -> ReadDone {
        ReadDone {
            mailbox: Some(self.clone()),
            tag,
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }

    /// Posts a completion. The eventfd is written only when the list was empty: the ring
    /// clears the eventfd before it takes the list, so a completion that finds the list
    /// non-empty is taken with the ones before it.
    fn post(&self, tag: u64, outcome: Outcome) {
        let was_empty = {
            let mut p = self.posted.lock();
            p.push((tag, outcome));
            p.len() == 1
        };
        if was_empty {
            // It cannot fail but by overflowing the counter, which a ring that clears it
            // never lets happen.
            eventfd::ring(self.fd());
        }
    }

    /// Clears the eventfd, then takes what was posted (in that order: see `post`).
    pub(crate) fn take(&self, into: &mut Vec<(u64, Outcome)>) {
        eventfd::clear(self.fd());
        into.append(&mut self.posted.lock());
    }
}
