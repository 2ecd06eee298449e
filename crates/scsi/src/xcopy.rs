//! EXTENDED COPY (LID1), as VMware's VAAI uses it, and RECEIVE COPY RESULTS. The copy targets
//! are named by identification descriptors (0xE4) holding the NAA designator of VPD page
//! 0x83; each block-to-block segment freezes its source range and pastes it into the
//! destination, so that within one pool whole grains are shared, not copied, and no data
//! leaves the daemon between pools.

use std::sync::Arc;

use crate::bytes::{alloc, be16, be32, be64};
use crate::lun::{CmdResult, Lun};
use crate::nexus::Nexus;
use crate::opcodes::SA_EXTENDED_COPY_LID1;
use crate::sense::{self, Sense};
use crate::tpc::{OpResult, COPY_COMPLETED, COPY_COMPLETED_WITH_ERRORS};

/// Limits, as RECEIVE COPY OPERATING PARAMETERS and VPD page 0x8F report them.
pub const MAX_CSCD_DESCRIPTORS: usize = 16;
pub const MAX_SEGMENT_DESCRIPTORS: usize = 64;
pub const MAX_DESCRIPTOR_LIST_LENGTH: usize = MAX_CSCD_DESCRIPTORS * 32 + MAX_SEGMENT_DESCRIPTORS * 28;
/// A block-to-block segment moves at most 65535 blocks: its count field has 16 bits.
pub const MAX_SEGMENT_BYTES: u64 = 65_535 * 4096;

const CSCD_IDENTIFICATION: u8 = 0xE4;
const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;
/// The LIST ID USAGE value that says the list identifier means nothing and no results are
/// kept.
const LIST_ID_UNUSED: u8 = 0x03;

/// One block-to-block segment, resolved.
struct Segment {
    src: usize,
    dst: usize,
    blocks: u64,
    src_lba: u64,
    dst_lba: u64,
}

impl Lun {
    /// This LUN as an identification CSCD descriptor: what EXTENDED COPY parameter lists and
    /// our ROD tokens name it by.
    pub fn identification_cscd(&self) -> [u8; 32] {
        let mut d = [0u8; 32];
        d[0] = CSCD_IDENTIFICATION;
        d[1] = 0x00; // direct access block device
        d[4] = 0x01; // binary
        d[5] = 0x03; // associated with the logical unit, NAA
        d[7] = 16;
        d[8..24].copy_from_slice(&self.naa);
        let bs = self.block_size() as u32;
        d[29..32].copy_from_slice(&bs.to_be_bytes()[1..4]);
        d
    }

    pub(crate) fn extended_copy(&self, nexus: &Nexus, cdb: &[u8], d: &[u8]) -> CmdResult {
        let plen = be32(&cdb[10..14]) as usize;
        if plen == 0 {
            return Ok(Vec::new());
        }
        let d = &d[..plen.min(d.len())];
        if d.len() < 16 {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let list_id = d[0] as u32;
        let usage = (d[1] >> 3) & 0x03;
        let cscd_len = be16(&d[2..4]) as usize;
        let seg_len = be32(&d[8..12]) as usize;
        let inline = be32(&d[12..16]) as usize;
        if inline != 0 {
            return Err(sense::INLINE_DATA_LENGTH_EXCEEDED);
        }
        if 16 + cscd_len + seg_len > d.len() || cscd_len + seg_len > MAX_DESCRIPTOR_LIST_LENGTH {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        if cscd_len % 32 != 0 {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        if cscd_len / 32 > MAX_CSCD_DESCRIPTORS {
            return Err(sense::TOO_MANY_TARGET_DESCRIPTORS);
        }
        let luns = d[16..16 + cscd_len]
            .chunks(32)
            .map(|c| self.resolve_cscd(nexus, c))
            .collect::<Result<Vec<_>, Sense>>()?;
        let segments = parse_segments(&d[16 + cscd_len..16 + cscd_len + seg_len], luns.len())?;
        // Every LUN a segment reads or writes must let this nexus read or write it, checked
        // for the whole list before anything moves.
        for s in &segments {
            for (i, write) in [(s.src, false), (s.dst, true)] {
                if let Some(l) = &luns[i] {
                    if !l.copy_allowed(nexus, write) {
                        return Err(sense::UNREACHABLE_COPY_TARGET);
                    }
                }
            }
        }

        let (done_segments, blocks, failure) = self.run_segments(nexus, &luns, &segments);
        if usage != LIST_ID_UNUSED {
            self.tpc.record(
                nexus.id,
                list_id,
                OpResult {
                    service_action: SA_EXTENDED_COPY_LID1,
                    status: if failure.is_some() {
                        COPY_COMPLETED_WITH_ERRORS
                    } else {
                        COPY_COMPLETED
                    },
                    transfer_blocks: blocks,
                    segments: done_segments as u16,
                    sense: failure.map(|s| s.encode(false)).unwrap_or_default(),
                    token: None,
                },
            );
        }
        match failure {
            Some(s) => Err(s),
            None => Ok(Vec::new()),
        }
    }

    /// The LUN an identification descriptor names: this one (None) or another LUN the nexus
    /// can address through its own target. A LUN anywhere else in the daemon is unreachable,
    /// exactly as one that does not exist.
    fn resolve_cscd(&self, nexus: &Nexus, c: &[u8]) -> Result<Option<Arc<Lun>>, Sense> {
        if c[0] != CSCD_IDENTIFICATION {
            return Err(sense::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE);
        }
        // LU ID TYPE is not looked at: the designator says which LUN is meant (libiscsi
        // expects a reserved LU ID TYPE to be ignored).
        // NUL: a null device, which a block-to-block copy cannot read or write; nor can it
        // reach a device of another type.
        if c[1] & 0x20 != 0 || c[1] & 0x1F != 0 {
            return Err(sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        }
        let len = c[7] as usize;
        let designator_type = c[5] & 0x0F;
        if designator_type != 0x03 || len != 16 {
            return Err(sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        }
        let naa: [u8; 16] = c[8..24].try_into().expect("16 bytes");
        let lun = if naa == self.naa {
            None
        } else {
            Some(
                nexus
                    .scope
                    .lun_by_naa(&naa)
                    .filter(|l| l.naa == naa)
                    .ok_or(sense::UNREACHABLE_COPY_TARGET)?,
            )
        };
        let bs = u32::from_be_bytes([0, c[29], c[30], c[31]]) as u64;
        let own = lun.as_deref().map_or(self.block_size(), |l| l.block_size());
        if bs != 0 && bs != own {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        Ok(lun)
    }

    /// Runs the segments in order: (segments done, blocks written, the failure that stopped
    /// them). A destination whose write cache is off is flushed before its segment counts as
    /// done, as a WRITE to it would be.
    fn run_segments(&self, nexus: &Nexus, luns: &[Option<Arc<Lun>>], segs: &[Segment]) -> (usize, u64, Option<Sense>) {
        let mut blocks = 0;
        for (i, s) in segs.iter().enumerate() {
            let src: &Lun = luns[s.src].as_deref().unwrap_or(self);
            let dst: &Lun = luns[s.dst].as_deref().unwrap_or(self);
            let r = (|| {
                let (src_at, bytes, dst_at) = segment_bytes(s, src.block_size(), dst.block_size())
                    .ok_or(sense::COPY_ABORTED_SEGMENT_OUT_OF_RANGE)?;
                if src_at + bytes > src.backend.size() || dst_at + bytes > dst.backend.size() {
                    return Err(sense::COPY_ABORTED_SEGMENT_OUT_OF_RANGE);
                }
                if dst.write_protected() {
                    return Err(sense::WRITE_PROTECTED);
                }
                if bytes == 0 {
                    return Ok(());
                }
                // The session ended from outside (its access taken away), or a LUN taken out
                // of its target, since the list was checked: the rest is not copied.
                if nexus.ended() || !nexus.scope.presents(src) || !nexus.scope.presents(dst) {
                    return Err(sense::UNREACHABLE_COPY_TARGET);
                }
                // A reservation change or a reset waits for one of the LUNs: it goes first.
                if [self, src, dst].iter().any(|l| l.fence_wanted()) {
                    return Err(sense::COPY_STOPPED_FOR_A_RESET_OR_RESERVATION);
                }
                // The other LUNs' fences, as their own commands hold them, so that a PREEMPT
                // AND ABORT there waits for this copy; recursive, so that two copies in
                // opposite directions cannot wait for each other behind a queued writer.
                let _src_fence = (!std::ptr::eq(src, self)).then(|| src.fence.read_recursive());
                let _dst_fence = (!std::ptr::eq(dst, self)).then(|| dst.fence.read_recursive());
                // Reservations may have changed since the list was checked.
                if !src.copy_allowed(nexus, false) || !dst.copy_allowed(nexus, true) {
                    return Err(sense::UNREACHABLE_COPY_TARGET);
                }
                let image = src
                    .backend
                    .freeze(&[(src_at, bytes)])
                    .map_err(|e| src.io_sense(e, false))?;
                dst.paste_chunked(image.as_ref(), dst_at, 0, bytes, &[self, src])
                    .map_err(|(_, s)| s)?;
                if !dst.mode().wce {
                    dst.backend.flush().map_err(|e| dst.io_sense(e, true))?;
                }
                Ok(())
            })();
            match r {
                Ok(()) => blocks += s.blocks,
                Err(e) => return (i, blocks, Some(e)),
            }
        }
        (segs.len(), blocks, None)
    }

    /// RECEIVE COPY STATUS (LID1).
    pub(crate) fn receive_copy_status(&self, nexus: u64, cdb: &[u8]) -> CmdResult {
        let r = self.lid1_result(nexus, cdb)?;
        let mut b = vec![0u8; 12];
        b[0..4].copy_from_slice(&8u32.to_be_bytes());
        b[4] = r.status; // copy manager status, HDD clear
        b[5..7].copy_from_slice(&r.segments.to_be_bytes());
        let (units, count) = scaled_bytes(r.transfer_blocks * self.block_size());
        b[7] = units;
        b[8..12].copy_from_slice(&count.to_be_bytes());
        Ok(alloc(b, be32(&cdb[10..14]) as usize))
    }

    /// RECEIVE COPY FAILURE DETAILS (LID1): the sense of a copy that failed.
    pub(crate) fn receive_copy_failure_details(&self, nexus: u64, cdb: &[u8]) -> CmdResult {
        let r = self.lid1_result(nexus, cdb)?;
        let mut b = vec![0u8; 64];
        if !r.sense.is_empty() {
            b[60] = sense::CHECK_CONDITION;
            b[62..64].copy_from_slice(&(r.sense.len() as u16).to_be_bytes());
            b.extend_from_slice(&r.sense);
        }
        let avail = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&avail.to_be_bytes());
        Ok(alloc(b, be32(&cdb[10..14]) as usize))
    }

    fn lid1_result(&self, nexus: u64, cdb: &[u8]) -> Result<OpResult, Sense> {
        self.tpc
            .result(nexus, cdb[2] as u32)
            .filter(|r| r.service_action == SA_EXTENDED_COPY_LID1)
            .ok_or(sense::INVALID_FIELD_IN_CDB.at_cdb_byte(2))
    }

    /// RECEIVE COPY OPERATING PARAMETERS.
    pub(crate) fn receive_copy_operating_parameters(&self, cdb: &[u8]) -> CmdResult {
        let implemented = [SEGMENT_BLOCK_TO_BLOCK, CSCD_IDENTIFICATION];
        let mut b = vec![0u8; 44];
        b[4] = 0x01; // SNLID: list identifiers are supported
        b[8..10].copy_from_slice(&(MAX_CSCD_DESCRIPTORS as u16).to_be_bytes());
        b[10..12].copy_from_slice(&(MAX_SEGMENT_DESCRIPTORS as u16).to_be_bytes());
        b[12..16].copy_from_slice(&(MAX_DESCRIPTOR_LIST_LENGTH as u32).to_be_bytes());
        b[16..20].copy_from_slice(&(MAX_SEGMENT_BYTES as u32).to_be_bytes());
        // No inline data, no held data, no stream devices.
        b[34..36].copy_from_slice(&1u16.to_be_bytes()); // total concurrent copies
        b[36] = 1; // maximum concurrent copies
        b[37] = 9; // data segment granularity: 512 bytes (log2)
        b[38] = 9;
        b[39] = 9;
        b[43] = implemented.len() as u8;
        b.extend_from_slice(&implemented);
        let avail = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&avail.to_be_bytes());
        Ok(alloc(b, be32(&cdb[10..14]) as usize))
    }
}

/// A segment in bytes, (source offset, length, destination offset), or None if any of them
/// does not fit in 64 bits or the length is not whole destination blocks. A huge LBA must
/// never wrap around to the start of the LUN.
fn segment_bytes(s: &Segment, src_bs: u64, dst_bs: u64) -> Option<(u64, u64, u64)> {
    let bytes = s.blocks.checked_mul(src_bs)?;
    let src_at = s.src_lba.checked_mul(src_bs)?;
    let dst_at = s.dst_lba.checked_mul(dst_bs)?;
    src_at.checked_add(bytes)?;
    dst_at.checked_add(bytes)?;
    (bytes % dst_bs == 0).then_some((src_at, bytes, dst_at))
}

fn parse_segments(list: &[u8], targets: usize) -> Result<Vec<Segment>, Sense> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < list.len() {
        if at + 4 > list.len() {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let s = &list[at..];
        if s[0] != SEGMENT_BLOCK_TO_BLOCK {
            return Err(sense::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE);
        }
        let len = be16(&s[2..4]) as usize;
        if len != 0x18 || at + 4 + len > list.len() {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        if out.len() == MAX_SEGMENT_DESCRIPTORS {
            return Err(sense::TOO_MANY_SEGMENT_DESCRIPTORS);
        }
        let (src, dst) = (be16(&s[4..6]) as usize, be16(&s[6..8]) as usize);
        if src >= targets || dst >= targets {
            return Err(sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        }
        out.push(Segment {
            src,
            dst,
            blocks: be16(&s[10..12]),
            src_lba: be64(&s[12..20]),
            dst_lba: be64(&s[20..28]),
        });
        at += 4 + len;
    }
    Ok(out)
}

/// A byte count in the largest unit that keeps it exact in 32 bits (TRANSFER COUNT UNITS:
/// 0 bytes, 1 KiB, 2 MiB, ...).
fn scaled_bytes(mut n: u64) -> (u8, u32) {
    let mut unit = 0;
    while n > u32::MAX as u64 {
        n >>= 10;
        unit += 1;
    }
    (unit, n as u32)
}
