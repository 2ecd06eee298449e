//! An io_uring for a thread that keeps disk reads in flight while it does other work: a
//! transport's connection thread submits the reads of a request (planned by the engine on
//! descriptors from [`BlockDevice::uring_fd`](crate::BlockDevice::uring_fd)), goes on
//! receiving and sending, and gets the request back, tagged as it was submitted, once all its
//! reads have completed. Unlike [`read_many`](crate::BlockDevice::read_many), nothing here
//! waits unless asked to.
//!
//! A disk with no descriptor may read in the background instead ([`ReadVia::Async`]): its
//! completions are posted to a mailbox whose eventfd the ring polls, so the caller learns of
//! them from the same ring, as of its own reads. Such a disk may take writes the same way
//! ([`start_writes`](ReadRing::start_writes)): a request whose writes are started comes back
//! like one whose reads are.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use io_uring::{opcode, squeue, types, IoUring};
use tracing::warn;

use crate::read_via::{Mailbox, Outcome};
use crate::{AsyncReader, AsyncWriter, DiskIo, DiskOp, ReadVia};

/// One read of a request: `len` bytes at `offset` of the disk `via` reaches, into `at`.
#[derive(Clone)]
pub struct RingRead {
    pub via: ReadVia,
    pub at: *mut u8,
    pub len: u32,
    pub offset: u64,
    /// Where the disk behind `fd` counts its reads ([`BlockDevice::io`](crate::BlockDevice::io)).
    pub io: Option<Arc<DiskIo>>,
}

/// One write of a request: `len` bytes from `at` to `offset` of a disk that writes in the
/// background ([`BlockDevice::write_via`](crate::BlockDevice::write_via)).
#[derive(Clone)]
pub struct RingWrite {
    pub disk: Arc<dyn AsyncWriter>,
    pub at: *const u8,
    pub len: u32,
    pub offset: u64,
    /// Where the disk counts its writes ([`BlockDevice::io`](crate::BlockDevice::io)).
    pub io: Option<Arc<DiskIo>>,
}

/// One disk write planned for a request, before its data is at hand: `len` bytes of the
/// request's data from `buf_off`, to `offset` of a disk that writes in the background.
#[derive(Clone)]
pub struct DirectWrite {
    pub writer: Arc<dyn AsyncWriter>,
    pub offset: u64,
    pub buf_off: usize,
    pub len: usize,
    /// Where the disk counts its writes.
    pub io: Option<Arc<DiskIo>>,
}

impl DirectWrite {
    /// The ring write that puts its part of `data` (the request's data) in place; `data`
    /// must stay where it is, unchanged, until the write has completed.
    pub fn on(&self, data: &[u8]) -> RingWrite {
        RingWrite {
            disk: self.writer.clone(),
            at: data[self.buf_off..self.buf_off + self.len].as_ptr(),
            len: self.len as u32,
            offset: self.offset,
            io: self.io.clone(),
        }
    }
}

/// A request whose reads (or writes) are in flight.
struct OnRing<T> {
    tag: T,
    op: DiskOp,
    /// Bytes each read must return, and where it is counted, by its index in the user data.
    lens: Vec<u32>,
    ios: Vec<Option<Arc<DiskIo>>>,
    /// The disks reading or writing in the background for it, kept until they are done.
    _readers: Vec<Arc<dyn AsyncReader>>,
    _writers: Vec<Arc<dyn AsyncWriter>>,
    started: Instant,
    pending: usize,
    failed: bool,
}

/// Requests with disk reads in flight, each tagged with what its caller needs to answer it
/// (and what keeps its buffers alive).
pub struct ReadRing<T> {
    ring: IoUring,
    /// Requests by slot (the high half of a read's user data); `free` slots.
    slots: Vec<Option<OnRing<T>>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Reads submitted and not yet completed: the ring may not go while any is.
    sqes: usize,
    /// Requests completed while the ring made room for a submission, for the next `reap`.
    ready: Vec<(T, bool)>,
    /// Where background reads post their completions (made by the first), how many of them
    /// are not yet taken, and whether the ring polls the mailbox's eventfd.
    mailbox: Option<Arc<Mailbox>>,
    in_background: usize,
    polling: bool,
    /// The completion queue's entries being taken (kept to reuse its memory).
    completed: Vec<(u64, i32)>,
}

/// The user data of the poll on the mailbox; a read's is its slot and index, below 2^63.
const MAILBOX: u64 = u64::MAX;

impl<T> ReadRing<T> {
    /// A ring with `entries` submission queue entries; Err where io_uring is unavailable (an
    /// old kernel, `kernel.io_uring_disabled`, a seccomp filter).
    pub fn new(entries: u32) -> io::Result<ReadRing<T>> {
        Ok(ReadRing {
            ring: IoUring::new(entries)?,
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            sqes: 0,
            ready: Vec::new(),
            mailbox: None,
            in_background: 0,
            polling: false,
            completed: Vec::new(),
        })
    }

    /// The descriptor to poll for completions.
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Requests submitted and not yet given back by [`reap`](Self::reap).
    pub fn in_flight(&self) -> usize {
        self.in_flight + self.ready.len()
    }

    /// Queues the reads of one request; [`submit`](Self::submit) hands them to the kernel (a
    /// full queue is submitted on the way). A request with no reads comes back from the next
    /// reap.
    ///
    /// # Safety
    /// Every read must target memory that `tag` keeps valid, and that nothing else reads or
    /// writes, until `tag` comes back from [`reap`](Self::reap) or the ring is dropped (drop
    /// waits for the reads in flight).
    pub unsafe fn start(&mut self, tag: T, reads: &[RingRead]) {
        if reads.is_empty() {
            self.ready.push((tag, true));
            return;
        }
        let slot = self.occupy(OnRing {
            tag,
            op: DiskOp::Read,
            lens: reads.iter().map(|r| r.len).collect(),
            ios: reads.iter().map(|r| r.io.clone()).collect(),
            _readers: reads
                .iter()
                .filter_map(|r| match &r.via {
                    ReadVia::Async(d) => Some(d.clone()),
                    ReadVia::Uring(_) => None,
                })
                .collect(),
            _writers: Vec::new(),
            started: Instant::now(),
            pending: reads.len(),
            failed: false,
        });
        for (i, r) in reads.iter().enumerate() {
            let ud = ((slot as u64) << 32) | i as u64;
            match &r.via {
                ReadVia::Uring(fd) => {
                    let e = opcode::Read::new(types::Fd(*fd), r.at, r.len)
                        .offset(r.offset)
                        .build()
                        .user_data(ud);
                    self.push(e);
                }
                ReadVia::Async(disk) => match self.mailbox() {
                    Some(m) => {
                        self.in_background += 1;
                        // SAFETY: the caller keeps the target valid until the request comes
                        // back, which waits for this completion (drop waits for it too).
                        unsafe { disk.start_read(r.at, r.len, r.offset, m.done(ud)) };
                    }
                    // No eventfd to be told on: the read fails, and is done another way.
                    None => {
                        let mut done = std::mem::take(&mut self.ready);
                        self.ready_one(ud, Outcome::Declined, &mut done);
                        self.ready = done;
                    }
                },
            }
        }
        if self.in_background > 0 && !self.polling {
            self.poll_mailbox();
        }
    }

    /// The mailbox, made on first use; None if no eventfd can be had.
    fn mailbox(&mut self) -> Option<Arc<Mailbox>> {
        if self.mailbox.is_none() {
            match Mailbox::new() {
                Ok(m) => self.mailbox = Some(m),
                Err(e) => warn!(error = %e, "no eventfd for background disk reads"),
            }
        }
        self.mailbox.clone()
    }

    /// Polls the mailbox's eventfd once, submitted at once: the caller may poll the ring's
    /// descriptor next without submitting.
    fn poll_mailbox(&mut self) {
        let Some(fd) = self.mailbox.as_ref().map(|m| m.fd()) else {
            return;
        };
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(MAILBOX);
        self.polling = true;
        self.push(e);
        self.sqes -= 1; // `push` counted it as a read
        let _ = self.ring.submit();
    }

    /// Queues a submission. When the queue is full, submits what it holds first, and takes
    /// completions if the kernel has no room for more.
    fn push(&mut self, e: squeue::Entry) {
        loop {
            // SAFETY: the caller of `start` keeps the target memory valid until completion.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                self.sqes += 1;
                return;
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                    let mut done = std::mem::take(&mut self.ready);
                    if !self.take_completions(&mut done) {
                        let _ = self.ring.submit_and_wait(1);
                    }
                    self.ready = done;
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => {
                    warn!(error = %err, "io_uring submit failed");
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Puts a request in a free slot (its index is the high half of its operations' user
    /// data) and counts it in flight.
    fn occupy(&mut self, r: OnRing<T>) -> usize {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.slots[slot] = Some(r);
        self.in_flight += 1;
        slot
    }

    /// Starts the writes of one request on the disks that write in the background; the
    /// request comes back from [`reap`](Self::reap) as a read's does, true if every write
    /// was done whole (false: write it again the synchronous way, which tells why).
    ///
    /// # Safety
    /// Every write must read memory that `tag` keeps valid and unchanged until `tag` comes
    /// back from [`reap`](Self::reap) or the ring is dropped (drop waits for the writes).
    pub unsafe fn start_writes(&mut self, tag: T, writes: &[RingWrite]) {
        if writes.is_empty() {
            self.ready.push((tag, true));
            return;
        }
        let Some(m) = self.mailbox() else {
            // No eventfd to be told on: written another way.
            self.ready.push((tag, false));
            return;
        };
        let slot = self.occupy(OnRing {
            tag,
            op: DiskOp::Write,
            lens: writes.iter().map(|w| w.len).collect(),
            ios: writes.iter().map(|w| w.io.clone()).collect(),
            _readers: Vec::new(),
            _writers: writes.iter().map(|w| w.disk.clone()).collect(),
            started: Instant::now(),
            pending: writes.len(),
            failed: false,
        });
        for (i, w) in writes.iter().enumerate() {
            let ud = ((slot as u64) << 32) | i as u64;
            self.in_background += 1;
            // SAFETY: the caller keeps the source valid until the request comes back, which
            // waits for this completion (drop waits for it too).
            unsafe { w.disk.start_write(w.at, w.len, w.offset, m.done(ud)) };
        }
        if !self.polling {
            self.poll_mailbox();
        }
    }

    /// Hands the queued reads to the kernel; true if there were any.
    pub fn submit(&mut self) -> bool {
        if self.ring.submission().is_empty() {
            return false;
        }
        match self.ring.submit() {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted || e.raw_os_error() == Some(libc::EBUSY) => false,
            Err(e) => {
                warn!(error = %e, "io_uring submit failed");
                false
            }
        }
    }

    /// Appends the requests whose reads have all completed to `done`, each with true if
    /// every read returned all its bytes (false: read it again another way). True if any.
    pub fn reap(&mut self, done: &mut Vec<(T, bool)>) -> bool {
        let before = done.len();
        done.append(&mut self.ready);
        if !self.take_completions(done) && (self.sqes > 0 || self.polling) && self.ring.submission().cq_overflow() {
            // More reads completed than the completion queue holds: the kernel keeps the rest
            // back, and the ring's descriptor polls readable, until the ring is entered again.
            // Without this, a caller that polls would spin with nothing to reap.
            let _ = self.ring.submitter().submit();
            self.take_completions(done);
        }
        done.len() > before
    }

    fn take_completions(&mut self, done: &mut Vec<(T, bool)>) -> bool {
        let before = done.len();
        let mut mail = false;
        let mut completed = std::mem::take(&mut self.completed);
        completed.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(ud, res) in &completed {
            if ud == MAILBOX {
                self.polling = false;
                mail = true;
                continue;
            }
            self.sqes -= 1;
            let (slot, i) = ((ud >> 32) as usize, (ud & 0xffff_ffff) as usize);
            let len = self.slots[slot]
                .as_ref()
                .expect("a completion for a request in flight")
                .lens[i];
            let whole = res >= 0 && res as u32 == len;
            self.ready_one(ud, if whole { Outcome::Whole } else { Outcome::Failed }, done);
        }
        completed.clear();
        self.completed = completed;
        if mail {
            // The eventfd is cleared before the list is taken, and a poll armed on a readable
            // eventfd fires at once: no completion posted meanwhile is left waiting.
            let mut posted = Vec::new();
            if let Some(m) = &self.mailbox {
                m.take(&mut posted);
            }
            self.in_background -= posted.len();
            for (ud, outcome) in posted {
                self.ready_one(ud, outcome, done);
            }
            if self.in_background > 0 && !self.polling {
                self.poll_mailbox();
            }
        }
        mail || done.len() > before
    }

    /// Counts operation `ud` done; its request goes to `done` once all its operations are,
    /// as failed if one was not whole. One the disk declined is not counted as its I/O.
    fn ready_one(&mut self, ud: u64, outcome: Outcome, done: &mut Vec<(T, bool)>) {
        let (slot, i) = ((ud >> 32) as usize, (ud & 0xffff_ffff) as usize);
        let r = self.slots[slot].as_mut().expect("a completion for a request in flight");
        if outcome != Outcome::Whole {
            r.failed = true;
        }
        if let (Some(io), false) = (&r.ios[i], outcome == Outcome::Declined) {
            io.record(r.op, r.lens[i] as u64, r.started.elapsed(), outcome == Outcome::Whole);
        }
        r.pending -= 1;
        if r.pending == 0 {
            let r = self.slots[slot].take().expect("checked above");
            self.free.push(slot);
            self.in_flight -= 1;
            done.push((r.tag, !r.failed));
        }
    }

    /// Submits what is queued and reaps; sleeps until a read completes if none had. True if
    /// any request was appended to `done`.
    pub fn reap_or_wait(&mut self, done: &mut Vec<(T, bool)>) -> bool {
        self.submit();
        if self.reap(done) {
            return true;
        }
        self.wait();
        false
    }

    /// Waits for every request in flight, appending each to `done` as [`ReadRing::reap`] does.
    pub fn drain(&mut self, done: &mut Vec<(T, bool)>) {
        while self.in_flight() > 0 {
            self.reap_or_wait(done);
        }
    }

    /// Submits what is queued and sleeps until at least one read completes (at once if none
    /// is in flight).
    pub fn wait(&mut self) {
        if self.sqes == 0 && self.in_background == 0 {
            return;
        }
        match self.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted || e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => warn!(error = %e, "io_uring wait failed"),
        }
    }
}

impl<T> Drop for ReadRing<T> {
    /// The kernel may still be reading into buffers the tags own (their owner stopped early,
    /// or is unwinding): the tags may not be dropped before it is done.
    fn drop(&mut self) {
        while self.sqes > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                // EBUSY: the completion queue is full; taking its entries below makes room.
                Err(e) if e.kind() == io::ErrorKind::Interrupted || e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    // Not waiting could let the kernel write into freed memory: leak instead.
                    warn!(error = %e, "cannot wait for disk reads in flight; their buffers are kept");
                    std::mem::forget(std::mem::take(&mut self.slots));
                    return;
                }
            }
            self.sqes -= self.ring.completion().filter(|c| c.user_data() != MAILBOX).count();
        }
        // Background reads write into the tags' buffers until they post their completion.
        if let Some(m) = self.mailbox.clone() {
            let mut posted = Vec::new();
            while self.in_background > 0 {
                let mut pfd = libc::pollfd {
                    fd: m.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 100) };
                m.take(&mut posted);
                self.in_background -= posted.len();
                posted.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn file_of(bytes: &[u8]) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn requests_come_back_with_their_data_once_all_their_reads_are_done() {
        let data: Vec<u8> = (0..64 << 10).map(|i| (i * 7 % 251) as u8).collect();
        let f = file_of(&data);
        let Ok(mut ring) = ReadRing::<(usize, AlignedBuf)>::new(4) else {
            crate::skip(
                "read_ring::tests::requests_come_back_with_their_data_once_all_their_reads_are_done",
                "io_uring unavailable",
            );
            return;
        };
        let io = DiskIo::new();
        // More reads than the ring has entries: a full queue is submitted on the way.
        for req in 0..4usize {
            let mut buf = AlignedBuf::zeroed(16 << 10);
            let reads: Vec<RingRead> = (0..4)
                .map(|i| RingRead {
                    via: ReadVia::Uring(f.as_raw_fd()),
                    // SAFETY: inside the 16 KiB buffer.
                    at: unsafe { buf.as_mut_ptr().add(i * 4096) },
                    len: 4096,
                    offset: (req * 16384 + (3 - i) * 4096) as u64,
                    io: Some(io.clone()),
                })
                .collect();
            // SAFETY: the buffer moves into the tag; its heap memory stays put.
            unsafe { ring.start((req, buf), &reads) };
        }
        unsafe { ring.start((99, AlignedBuf::zeroed(0)), &[]) };
        let mut done = Vec::new();
        ring.drain(&mut done);
        done.sort_by_key(|((req, _), _)| *req);
        assert_eq!(done.len(), 5);
        for ((req, buf), ok) in &done[..4] {
            assert!(ok);
            for i in 0..4 {
                let from = req * 16384 + (3 - i) * 4096;
                assert_eq!(
                    &buf[i * 4096..(i + 1) * 4096],
                    &data[from..from + 4096],
                    "request {req}"
                );
            }
        }
        assert!(matches!(&done[4], ((99, _), true)));
        let counted = io.figures(DiskOp::Read);
        assert_eq!((counted.ops, counted.bytes, counted.errors), (16, 16 * 4096, 0));
    }

    #[test]
    fn more_reads_than_the_completion_queue_holds_come_back_to_a_caller_that_polls() {
        let data: Vec<u8> = (0..256 << 10).map(|i| (i * 13 % 251) as u8).collect();
        let f = file_of(&data);
        let Ok(mut ring) = ReadRing::<(usize, AlignedBuf)>::new(4) else {
            crate::skip(
                "read_ring::tests::more_reads_than_the_completion_queue_holds_come_back_to_a_caller_that_polls",
                "io_uring unavailable",
            );
            return;
        };
        // 8 requests of 64 reads each: far more than the 8 completions the queue holds.
        for req in 0..8usize {
            let mut buf = AlignedBuf::zeroed(64 * 4096);
            let reads: Vec<RingRead> = (0..64)
                .map(|i| RingRead {
                    via: ReadVia::Uring(f.as_raw_fd()),
                    // SAFETY: inside the buffer.
                    at: unsafe { buf.as_mut_ptr().add(i * 4096) },
                    len: 4096,
                    offset: (((req * 64 + i) * 4096) % (256 << 10)) as u64,
                    io: None,
                })
                .collect();
            // SAFETY: the buffer moves into the tag; its heap memory stays put.
            unsafe { ring.start((req, buf), &reads) };
        }
        ring.submit();
        // As a connection loop does: poll the ring's descriptor, reap, never wait on the ring.
        let mut done = Vec::new();
        let mut rounds = 0;
        while ring.in_flight() > 0 {
            rounds += 1;
            assert!(rounds < 10_000, "the ring polls ready with nothing to reap");
            let mut pfd = libc::pollfd {
                fd: ring.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 100) };
            ring.reap(&mut done);
        }
        assert_eq!(done.len(), 8);
        for ((req, buf), ok) in &done {
            assert!(ok, "request {req}");
            for i in 0..64 {
                let from = ((req * 64 + i) * 4096) % (256 << 10);
                assert_eq!(&buf[i * 4096..(i + 1) * 4096], &data[from..from + 4096]);
            }
        }
    }

    #[test]
    fn a_short_or_failed_read_marks_its_request_failed() {
        let f = file_of(&[7u8; 4096]);
        let Ok(mut ring) = ReadRing::<AlignedBuf>::new(4) else {
            crate::skip(
                "read_ring::tests::a_short_or_failed_read_marks_its_request_failed",
                "io_uring unavailable",
            );
            return;
        };
        let mut past_end = AlignedBuf::zeroed(4096);
        let mut bad_fd = AlignedBuf::zeroed(4096);
        let short = RingRead {
            via: ReadVia::Uring(f.as_raw_fd()),
            at: past_end.as_mut_ptr(),
            len: 4096,
            offset: 4096,
            io: None,
        };
        let failing = RingRead {
            via: ReadVia::Uring(-1),
            at: bad_fd.as_mut_ptr(),
            len: 4096,
            offset: 0,
            io: None,
        };
        unsafe {
            ring.start(past_end, &[short]);
            ring.start(bad_fd, &[failing]);
        }
        let mut done = Vec::new();
        ring.drain(&mut done);
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|(_, ok)| !ok));
    }

    #[test]
    fn dropping_a_ring_waits_for_its_reads() {
        /// A read's buffer that counts, when it is dropped, whether the read had filled it.
        struct Observed {
            buf: AlignedBuf,
            filled: Arc<AtomicUsize>,
        }
        impl Drop for Observed {
            fn drop(&mut self) {
                if self.buf.iter().all(|&b| b == 3) {
                    self.filled.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let f = file_of(&vec![3u8; 1 << 20]);
        let Ok(mut ring) = ReadRing::<Observed>::new(8) else {
            crate::skip(
                "read_ring::tests::dropping_a_ring_waits_for_its_reads",
                "io_uring unavailable",
            );
            return;
        };
        let filled = Arc::new(AtomicUsize::new(0));
        for _ in 0..8 {
            let mut buf = AlignedBuf::zeroed(1 << 20);
            let r = RingRead {
                via: ReadVia::Uring(f.as_raw_fd()),
                at: buf.as_mut_ptr(),
                len: 1 << 20,
                offset: 0,
                io: None,
            };
            let tag = Observed {
                buf,
                filled: filled.clone(),
            };
            unsafe { ring.start(tag, &[r]) };
        }
        ring.submit();
        // Dropped with 8 MiB in flight: the buffers go only after the kernel is done with
        // them, so every one is full when it is dropped (a ring that did not wait would drop
        // some half read, or be a use after free under a sanitizer).
        drop(ring);
        assert_eq!(filled.load(Ordering::SeqCst), 8);
    }

    /// Dropped with far more reads in flight than its completion queue holds, none reaped:
    /// the ring takes the completions as it waits, and lets every request go once its reads
    /// are done, rather than keep them (and what their plans hold) for ever.
    #[test]
    fn dropping_a_ring_with_its_completion_queue_overflowing_lets_every_request_go() {
        struct Counted(#[allow(dead_code)] AlignedBuf, Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.1.fetch_add(1, Ordering::SeqCst);
            }
        }
        let f = file_of(&vec![5u8; 256 << 10]);
        let Ok(mut ring) = ReadRing::<Counted>::new(4) else {
            crate::skip(
                "read_ring::tests::dropping_a_ring_with_its_completion_queue_overflowing_lets_every_request_go",
                "io_uring unavailable",
            );
            return;
        };
        let dropped = Arc::new(AtomicUsize::new(0));
        for _ in 0..8 {
            let mut buf = AlignedBuf::zeroed(64 * 4096);
            let reads: Vec<RingRead> = (0..64)
                .map(|i| RingRead {
                    via: ReadVia::Uring(f.as_raw_fd()),
                    // SAFETY: inside the buffer.
                    at: unsafe { buf.as_mut_ptr().add(i * 4096) },
                    len: 4096,
                    offset: (i * 4096) as u64,
                    io: None,
                })
                .collect();
            // SAFETY: the buffer moves into the tag; its heap memory stays put.
            unsafe { ring.start(Counted(buf, dropped.clone()), &reads) };
        }
        ring.submit();
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(ring);
        assert_eq!(dropped.load(Ordering::SeqCst), 8);
    }

    /// A disk that reads in the background, as a disk on RADOS does: each read is filled with
    /// its offset's byte by a thread of its own after a delay, then completed from there; a
    /// read at `FAIL_AT` is dropped uncompleted (the disk lost it), one at `REFUSE_AT`
    /// completed as failed.
    struct Background;
    const FAIL_AT: u64 = 1 << 30;
    const REFUSE_AT: u64 = 2 << 30;

    struct Target(*mut u8);
    // SAFETY: the test keeps the memory valid until the read completes.
    unsafe impl Send for Target {}

    impl AsyncReader for Background {
        unsafe fn start_read(&self, at: *mut u8, len: u32, offset: u64, done: crate::ReadDone) {
            let target = Target(at);
            std::thread::spawn(move || {
                let target = target;
                std::thread::sleep(std::time::Duration::from_millis(1 + offset % 7));
                match offset {
                    FAIL_AT => drop(done),
                    REFUSE_AT => done.complete(false),
                    _ => {
                        // SAFETY: the caller's memory until `done` is completed.
                        unsafe { std::ptr::write_bytes(target.0, (offset >> 12) as u8, len as usize) };
                        done.complete(true);
                    }
                }
            });
        }
    }

    #[test]
    fn reads_completed_elsewhere_come_back_through_the_ring_with_its_own() {
        let data: Vec<u8> = (0..256 << 10).map(|i| (i * 7 % 251) as u8).collect();
        let f = file_of(&data);
        let Ok(mut ring) = ReadRing::<(usize, AlignedBuf)>::new(4) else {
            crate::skip(
                "read_ring::tests::reads_completed_elsewhere_come_back_through_the_ring_with_its_own",
                "io_uring unavailable",
            );
            return;
        };
        let bg: Arc<dyn AsyncReader> = Arc::new(Background);
        let io = DiskIo::new();
        // Each request: a read from the file and three from the background disk.
        for req in 0..16usize {
            let mut buf = AlignedBuf::zeroed(4 * 4096);
            let reads: Vec<RingRead> = (0..4)
                .map(|i| RingRead {
                    via: if i == 0 {
                        ReadVia::Uring(f.as_raw_fd())
                    } else {
                        ReadVia::Async(bg.clone())
                    },
                    // SAFETY: inside the buffer.
                    at: unsafe { buf.as_mut_ptr().add(i * 4096) },
                    len: 4096,
                    offset: match (req, i) {
                        (5, 2) => FAIL_AT,
                        (9, 3) => REFUSE_AT,
                        _ => (req * 16384 + i * 4096) as u64,
                    },
                    io: Some(io.clone()),
                })
                .collect();
            // SAFETY: the buffer moves into the tag; its heap memory stays put.
            unsafe { ring.start((req, buf), &reads) };
        }
        // As a connection loop does: poll the ring's descriptor, reap.
        let mut done = Vec::new();
        let t0 = Instant::now();
        while ring.in_flight() > 0 {
            let waited = t0.elapsed();
            assert!(waited.as_secs() < 10, "the ring never told of the background reads");
            ring.submit();
            let mut pfd = libc::pollfd {
                fd: ring.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 100) };
            ring.reap(&mut done);
        }
        done.sort_by_key(|((req, _), _)| *req);
        assert_eq!(done.len(), 16);
        for ((req, buf), ok) in &done {
            assert_eq!(*ok, !matches!(req, 5 | 9), "request {req}");
            if !ok {
                continue;
            }
            let from = req * 16384;
            assert_eq!(&buf[..4096], &data[from..from + 4096], "request {req}");
            for i in 1..4 {
                let want = ((req * 16384 + i * 4096) >> 12) as u8;
                assert!(
                    buf[i * 4096..(i + 1) * 4096].iter().all(|&b| b == want),
                    "request {req}, read {i}"
                );
            }
        }
        let counted = io.figures(DiskOp::Read);
        assert_eq!((counted.ops, counted.errors), (64, 2));
        // Dropped with background reads in flight: the drop waits for them to complete.
        let filled = Arc::new(AtomicUsize::new(0));
        struct Watched(AlignedBuf, Arc<AtomicUsize>);
        impl Drop for Watched {
            fn drop(&mut self) {
                if self.0.iter().all(|&b| b == 3) {
                    self.1.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let Ok(mut ring) = ReadRing::<Watched>::new(4) else {
            return;
        };
        for _ in 0..8 {
            let mut buf = AlignedBuf::zeroed(4096);
            let r = RingRead {
                via: ReadVia::Async(bg.clone()),
                at: buf.as_mut_ptr(),
                len: 4096,
                offset: 3 << 12,
                io: None,
            };
            // SAFETY: as above.
            unsafe { ring.start(Watched(buf, filled.clone()), &[r]) };
        }
        drop(ring);
        assert_eq!(filled.load(Ordering::SeqCst), 8);
    }
}
