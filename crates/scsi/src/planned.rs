//! READs and WRITEs for a transport that starts disk I/O on an io_uring of its own (the iSCSI
//! connection's reader): the command is admitted as [`Lun::execute_for`] would admit it, then
//! the backend plans its disk reads ([`BlockBackend::try_plan_read`](crate::BlockBackend::try_plan_read))
//! or writes ([`BlockBackend::try_plan_write`](crate::BlockBackend::try_plan_write)). The
//! transport starts them, goes on with other commands, and answers once they have completed.
//! Nothing here blocks: whatever would wait (a unit attention to report, a reservation change
//! under way, a grain in use, a COMPARE AND WRITE holding the LUN) sends the command down the
//! ordinary path instead.

use parking_lot::{ArcRwLockReadGuard, RawRwLock};
use tessera_disk::{AlignedBuf, RingRead, RingWrite};

use crate::backend::{ReadPlan, WritePlan};
use crate::data::Data;
use crate::lun::{Lun, Response};
use crate::nexus::Nexus;
use crate::opcodes::{WRITE_10, WRITE_12, WRITE_16};

type FenceGuard = ArcRwLockReadGuard<RawRwLock, ()>;

/// How a READ starts.
pub enum ReadStart {
    /// Submit its disk reads, then answer with [`PlannedRead::into_response`].
    Planned(PlannedRead),
    /// Its answer, with nothing to read: a malformed CDB, a range past the end, a
    /// reservation conflict, a READ of no blocks, or blocks that are all unmapped.
    Answer(Response),
    /// Run it with [`Lun::execute_for`].
    Execute,
}

/// A READ admitted and planned: its buffer, the disk reads that fill it, and what keeps
/// those reads valid (the plan's grain and set locks, the LUN's fence) until it is dropped.
pub struct PlannedRead {
    buf: AlignedBuf,
    plan: ReadPlan,
    _fence: FenceGuard,
}

impl PlannedRead {
    /// The disk reads to submit. Their targets stay valid while the PlannedRead lives, moved
    /// or not (the buffer is on the heap); it may not be dropped while a read is in flight.
    pub fn submissions(&mut self) -> Vec<RingRead> {
        let base = self.buf.as_mut_ptr();
        let scratch = self.plan.hold.scratch();
        self.plan
            .reads
            .iter()
            .map(|r| RingRead {
                via: r.via.clone(),
                // SAFETY: start_read checked that the plan's reads lie inside the buffer;
                // the plan made its scratch buffer for the reads marked so.
                at: unsafe { (if r.scratch { scratch } else { base }).add(r.buf_off) },
                len: r.len as u32,
                offset: r.offset,
                io: r.io.clone(),
            })
            .collect()
    }

    /// True if the data read is what was written, made ready (see
    /// [`PlanHold::finish`](crate::backend::PlanHold::finish)): call it once every submission
    /// has completed; if false, run the command the ordinary way.
    pub fn verified(&mut self) -> bool {
        self.plan.hold.finish(&mut self.buf)
    }

    /// GOOD with the data read, once every submission has completed in full.
    pub fn into_response(self) -> Response {
        Response {
            status: crate::sense::GOOD,
            data: Data::Blocks(self.buf),
            sense: Vec::new(),
        }
    }
}

impl Lun {
    /// Admits and plans a READ for `nexus` without blocking.
    pub fn start_read(&self, nexus: &Nexus, cdb: &[u8]) -> ReadStart {
        // A reservation change waiting for running commands: let it go first.
        let Some(fence) = self.fence.try_read_arc() else {
            return ReadStart::Execute;
        };
        let (lba, blocks) = match self.admit_read(nexus, cdb) {
            None => return ReadStart::Execute,
            Some(Err(answer)) => return ReadStart::Answer(answer),
            Some(Ok(None)) => return ReadStart::Answer(self.respond(Ok(Vec::new()))),
            Some(Ok(Some(range))) => range,
        };
        let bs = self.block_size();
        let len = (blocks * bs) as usize;
        let Some(plan) = self.backend.try_plan_read(lba * bs, len) else {
            return ReadStart::Execute;
        };
        // The submissions write into the buffer: a plan that strays outside it is not used.
        if plan
            .reads
            .iter()
            .any(|r| !r.scratch && r.buf_off.checked_add(r.len).is_none_or(|end| end > len))
        {
            return ReadStart::Execute;
        }
        // Zeroed: the parts no read covers (unmapped grains) need nothing more.
        let buf = AlignedBuf::zeroed(len);
        if plan.reads.is_empty() {
            return ReadStart::Answer(self.respond_data(Ok(Data::Blocks(buf))));
        }
        ReadStart::Planned(PlannedRead {
            buf,
            plan,
            _fence: fence,
        })
    }
}

/// How a WRITE starts.
pub enum WriteStart {
    /// Start its disk writes, then answer with [`PlannedWrite::into_response`] once they all
    /// completed whole; if one did not, drop it and run the command the ordinary way (which
    /// writes it again, and reports why it fails if it does).
    Planned(PlannedWrite),
    /// Run it with [`Lun::execute_for`].
    Execute,
}

/// A WRITE admitted and planned: the disk writes that put its data in place, and what keeps
/// them valid (the plan's grain and set locks, the LUN's fence, and the hold that COMPARE AND
/// WRITE waits for) until it is dropped.
pub struct PlannedWrite {
    plan: WritePlan,
    _atomic: FenceGuard,
    _fence: FenceGuard,
}

impl PlannedWrite {
    /// The disk writes to start, reading `data`, the command's data that the plan was made
    /// for: it must stay where it is, unchanged, until they have completed.
    pub fn submissions(&self, data: &[u8]) -> Vec<RingWrite> {
        self.plan.writes.iter().map(|w| w.on(data)).collect()
    }

    /// GOOD, once every submission has completed whole: the data is where a flush puts it.
    pub fn into_response(self) -> Response {
        self.plan.hold.finish();
        Response {
            status: crate::sense::GOOD,
            data: Data::default(),
            sense: Vec::new(),
        }
    }
}

impl Lun {
    /// Admits and plans a WRITE of `data` for `nexus` without blocking.
    pub fn start_write(&self, nexus: &Nexus, cdb: &[u8], data: &[u8]) -> WriteStart {
        if !matches!(cdb.first(), Some(&(WRITE_10 | WRITE_12 | WRITE_16))) {
            return WriteStart::Execute;
        }
        let Some(fence) = self.fence.try_read_arc() else {
            return WriteStart::Execute;
        };
        let Some((lba, blocks)) = self.admit_write(nexus, cdb) else {
            return WriteStart::Execute;
        };
        let bs = self.block_size();
        let len = (blocks * bs) as usize;
        // Less data than the CDB asks: the ordinary path writes what came and reports the
        // residual.
        if data.len() != len {
            return WriteStart::Execute;
        }
        let Some(atomic) = self.atomic.try_read_arc() else {
            return WriteStart::Execute;
        };
        // The plan finishes on the transport's ring, but notes the host it was made for.
        let mut plan = None;
        self.backend.as_writer(&nexus.initiator, &mut || {
            plan = self.backend.try_plan_write(lba * bs, len)
        });
        let Some(plan) = plan else {
            return WriteStart::Execute;
        };
        // The submissions read the data: a plan that strays outside it is not used.
        if plan
            .writes
            .iter()
            .any(|w| w.buf_off.checked_add(w.len).is_none_or(|end| end > len))
        {
            return WriteStart::Execute;
        }
        WriteStart::Planned(PlannedWrite {
            plan,
            _atomic: atomic,
            _fence: fence,
        })
    }
}
