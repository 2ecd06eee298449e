//! Token-based copy (what Windows calls ODX): POPULATE TOKEN, WRITE USING TOKEN, RECEIVE ROD
//! TOKEN INFORMATION, REPORT ALL ROD TOKENS and COPY OPERATION ABORT. A token is a frozen
//! image of the ranges it names, so it is point-in-time, and WRITE USING TOKEN pastes it:
//! within one pool whole grains are shared, not copied.
//!
//! Every copy runs to its end inside the command (with IMMED too): a RECEIVE ROD TOKEN
//! INFORMATION that follows always finds the operation finished.

use std::sync::Arc;

use tracing::warn;

use crate::backend::FrozenImage;
use crate::bytes::{alloc, be16, be32, be64};
use crate::commands::COMMANDS;
use crate::lun::{CmdResult, Lun};
use crate::nexus::Nexus;
use crate::opcodes::*;
use crate::sense::{self, Sense};
use crate::tpc::{
    OpResult, TokenRefusal, COPY_COMPLETED, COPY_COMPLETED_WITH_ERRORS, DEFAULT_INACTIVITY_TIMEOUT,
    MAX_INACTIVITY_TIMEOUT, MAX_TOKEN_LIFETIME, ROD_TYPE_BLOCK_ZERO, ROD_TYPE_PIT_DEFAULT, TOKEN_LEN,
};

/// Block device range descriptors one POPULATE TOKEN or WRITE USING TOKEN may carry.
pub const MAX_RANGE_DESCRIPTORS: usize = 64;
/// Most bytes one token may represent (and one WRITE USING TOKEN may write): 1 TiB.
pub const MAX_TOKEN_TRANSFER_BYTES: u64 = 1 << 40;

/// Where WRITE USING TOKEN's fields sit in its parameter list.
const WUT_TOKEN: usize = 16;
const WUT_RANGES_LEN: usize = 534;
const WUT_RANGES: usize = 536;

/// Bytes a copy moves under one hold of its destination's write gate, between its looks at
/// whether a reservation change or a reset waits (a whole number of the largest grains).
const COPY_CHUNK: u64 = 64 << 20;

impl Lun {
    /// Block device range descriptors (16 bytes each: LBA, number of blocks, reserved) as
    /// byte ranges, refusing ranges past the end, too many, or a list of a bad length.
    fn ranges(&self, list: &[u8]) -> Result<Vec<(u64, u64)>, Sense> {
        if list.len() % 16 != 0 || list.is_empty() {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        if list.len() / 16 > MAX_RANGE_DESCRIPTORS {
            return Err(sense::TOO_MANY_SEGMENT_DESCRIPTORS);
        }
        let bs = self.block_size();
        let mut out = Vec::new();
        for d in list.chunks(16) {
            let (lba, n) = (be64(&d[0..8]), be32(&d[8..12]));
            if lba.checked_add(n).is_none_or(|e| e > self.blocks()) {
                return Err(sense::LBA_OUT_OF_RANGE);
            }
            if n > 0 {
                out.push((lba * bs, n * bs));
            }
        }
        Ok(out)
    }

    pub(crate) fn populate_token(&self, nexus: &Nexus, cdb: &[u8], d: &[u8]) -> CmdResult {
        let list_id = be32(&cdb[6..10]) as u32;
        let d = &d[..(be32(&cdb[10..14]) as usize).min(d.len())];
        if d.len() < 16 {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let rtv = d[2] & 0x01 != 0;
        let timeout = match be32(&d[4..8]) as u32 {
            0 => DEFAULT_INACTIVITY_TIMEOUT,
            t if t > MAX_INACTIVITY_TIMEOUT => return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST),
            t => t,
        };
        if rtv && be32(&d[8..12]) as u32 != ROD_TYPE_PIT_DEFAULT {
            // We make point in time tokens only.
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        let rlen = be16(&d[14..16]) as usize;
        if 16 + rlen > d.len() {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let ranges = self.ranges(&d[16..16 + rlen])?;
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if total > MAX_TOKEN_TRANSFER_BYTES {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        if ranges.is_empty() {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        // The budget first: the image takes memory, and the vdisk's writes wait while it is
        // made.
        let claim = self.tpc.claim(nexus, total, self.backend.freeze_footprint(&ranges))?;
        let image = Arc::from(self.backend.freeze(&ranges).map_err(|e| self.io_sense(e, false))?);
        // Asked under the tokens' lock: a LUN taken out of the nexus's target since it was
        // looked up (the command held back its data meanwhile, or waited its turn), or
        // replaced there by another of the same designator (a standby LUN once another
        // gateway took the pool, whose tokens are revoked after), makes no token, and one
        // made before is revoked with the others after the removal.
        let token = self
            .tpc
            .create_token_unless(claim, self.identification_cscd(), nexus, image, timeout, || {
                !nexus.scope.presents(self)
            })?;
        let nexus = nexus.id;
        self.tpc.record(
            nexus,
            list_id,
            OpResult {
                service_action: SA_POPULATE_TOKEN,
                status: COPY_COMPLETED,
                transfer_blocks: total / self.block_size(),
                segments: 0,
                sense: Vec::new(),
                token: Some(token),
            },
        );
        Ok(Vec::new())
    }

    pub(crate) fn write_using_token(&self, user: &Nexus, cdb: &[u8], d: &[u8]) -> CmdResult {
        let nexus = user.id;
        let list_id = be32(&cdb[6..10]) as u32;
        let d = &d[..(be32(&cdb[10..14]) as usize).min(d.len())];
        if self.write_protected() {
            return Err(sense::WRITE_PROTECTED);
        }
        if d.len() < WUT_RANGES {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let del_tkn = d[2] & 0x02 != 0;
        let rlen = be16(&d[WUT_RANGES_LEN..WUT_RANGES]) as usize;
        if WUT_RANGES + rlen > d.len() {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let ranges = self.ranges(&d[WUT_RANGES..WUT_RANGES + rlen])?;
        let token = &d[WUT_TOKEN..WUT_TOKEN + TOKEN_LEN];
        let bs = self.block_size();
        let offset = be64(&d[8..16])
            .checked_mul(bs)
            .ok_or(sense::INVALID_FIELD_IN_PARAMETER_LIST)?;
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if total > MAX_TOKEN_TRANSFER_BYTES {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        let rod_type = be32(&token[0..4]) as u32;
        let r = if rod_type == ROD_TYPE_BLOCK_ZERO {
            self.write_zero_rod(&ranges)
        } else {
            self.tpc.may_use(token, user).map_err(|why| {
                warn!(lun = %self.backend.name(), initiator = %user.initiator, "a ROD token made on a LUN the initiator may not read was refused");
                why.sense()
            })?;
            let image = self.tpc.use_token(token, del_tkn).map_err(TokenRefusal::sense)?;
            if image.block_size() as u64 != bs {
                return Err(TokenRefusal::Unsupported.sense());
            }
            if offset >= image.len() {
                return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
            }
            self.paste_ranges(image.as_ref(), offset, &ranges)
        };
        let (done, mut failure) = match r {
            Ok(done) => (done, None),
            Err((done, s)) => (done, Some(s)),
        };
        // With the write cache off the data is written once flushed (what was pasted before
        // a failure too): a flush that fails leaves nothing transferred that the result
        // could vouch for.
        let done = if self.mode().wce || done == 0 {
            done
        } else {
            match self.backend.flush() {
                Ok(()) => done,
                Err(e) => {
                    failure.get_or_insert(self.io_sense(e, true));
                    0
                }
            }
        };
        self.tpc.record(
            nexus,
            list_id,
            OpResult {
                service_action: SA_WRITE_USING_TOKEN,
                status: if failure.is_some() {
                    COPY_COMPLETED_WITH_ERRORS
                } else {
                    COPY_COMPLETED
                },
                transfer_blocks: done / bs,
                segments: 0,
                sense: failure.map(|s| s.encode(false)).unwrap_or_default(),
                token: None,
            },
        );
        match failure {
            Some(s) => Err(s),
            None => Ok(Vec::new()),
        }
    }

    /// Writes the image from `offset` into the ranges in order, until either runs out. Returns
    /// the bytes written, and with a failure how far it got.
    fn paste_ranges(
        &self,
        image: &dyn FrozenImage,
        mut offset: u64,
        ranges: &[(u64, u64)],
    ) -> Result<u64, (u64, Sense)> {
        let mut done = 0;
        for &(at, len) in ranges {
            let n = len.min(image.len() - offset);
            if n == 0 {
                break;
            }
            done += self
                .paste_chunked(image, at, offset, n, &[])
                .map_err(|(part, s)| (done + part, s))?;
            offset += n;
        }
        Ok(done)
    }

    fn write_zero_rod(&self, ranges: &[(u64, u64)]) -> Result<u64, (u64, Sense)> {
        let mut done = 0;
        let thin = self.thin();
        for &(at, len) in ranges {
            if self.fence_wanted() {
                return Err((done, sense::COPY_STOPPED_FOR_A_RESET_OR_RESERVATION));
            }
            let _writes = self.atomic.read();
            self.backend
                .write_zeroes(at, len, thin, false)
                .map_err(|e| (done, self.io_sense(e, true)))?;
            done += len;
        }
        Ok(done)
    }

    /// Pastes `len` bytes of `image` from `offset` at `at` of this LUN, a chunk at a time:
    /// each chunk under the LUN's write gate (a COMPARE AND WRITE waits for a chunk, not for
    /// the whole copy), and none once a reservation change or a reset waits for the fence of
    /// this LUN or of one in `also` (a copy may move up to a TiB; they, and every command
    /// queued behind them, wait for a chunk at most). Returns the bytes pasted; with a
    /// failure, how far it got.
    pub(crate) fn paste_chunked(
        &self,
        image: &dyn FrozenImage,
        at: u64,
        offset: u64,
        len: u64,
        also: &[&Lun],
    ) -> Result<u64, (u64, Sense)> {
        let mut done = 0;
        while done < len {
            if self.fence_wanted() || also.iter().any(|l| l.fence_wanted()) {
                return Err((done, sense::COPY_STOPPED_FOR_A_RESET_OR_RESERVATION));
            }
            let n = (len - done).min(COPY_CHUNK);
            let _writes = self.atomic.read();
            self.backend
                .paste(at + done, image, offset + done, n)
                .map_err(|e| (done, self.io_sense(e, true)))?;
            done += n;
        }
        Ok(done)
    }

    /// RECEIVE ROD TOKEN INFORMATION: how an operation of this nexus ended, and for POPULATE
    /// TOKEN the token.
    pub(crate) fn receive_rod_token_information(&self, nexus: u64, cdb: &[u8]) -> CmdResult {
        let list_id = be32(&cdb[2..6]) as u32;
        let len = be32(&cdb[10..14]) as usize;
        let r = self
            .tpc
            .result(nexus, list_id)
            .filter(|r| r.service_action != SA_EXTENDED_COPY_LID1)
            .ok_or(sense::INVALID_FIELD_IN_CDB.at_cdb_byte(2))?;
        let mut b = vec![0u8; 32];
        b[4] = r.service_action;
        b[5] = r.status;
        b[12] = 0; // extended copy completion status: GOOD
        b[13] = r.sense.len() as u8;
        b[14] = r.sense.len() as u8;
        b[15] = 0xF1; // transfer count units: logical blocks
        b[16..24].copy_from_slice(&r.transfer_blocks.to_be_bytes());
        b[24..26].copy_from_slice(&r.segments.to_be_bytes());
        b.extend_from_slice(&r.sense);
        match &r.token {
            Some(t) => {
                b.extend_from_slice(&((TOKEN_LEN + 2) as u32).to_be_bytes());
                b.extend_from_slice(&[0, 0]);
                b.extend_from_slice(&t[..]);
            }
            None => b.extend_from_slice(&0u32.to_be_bytes()),
        }
        let avail = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&avail.to_be_bytes());
        Ok(alloc(b, len))
    }

    /// REPORT ALL ROD TOKENS: the tokens this copy manager holds.
    /// REPORT ALL ROD TOKENS: the live tokens this I_T nexus made, and no other's.
    pub(crate) fn report_all_rod_tokens(&self, nexus: u64, cdb: &[u8]) -> CmdResult {
        let len = be32(&cdb[10..14]) as usize;
        let mut b = vec![0u8; 8];
        for (t, _, _) in self.tpc.tokens_of(nexus) {
            b.extend_from_slice(&t[..]);
        }
        let avail = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&avail.to_be_bytes());
        Ok(alloc(b, len))
    }

    /// COPY OPERATION ABORT: copies finish inside their command, so there is never one to
    /// stop; an operation that finished is acknowledged, an unknown one refused.
    pub(crate) fn copy_operation_abort(&self, nexus: u64, cdb: &[u8]) -> CmdResult {
        let list_id = be32(&cdb[2..6]) as u32;
        match self.tpc.result(nexus, list_id) {
            Some(_) => Ok(Vec::new()),
            None => Err(sense::INVALID_FIELD_IN_CDB.at_cdb_byte(2)),
        }
    }

    /// VPD page 0x8F, third-party copy: what Windows reads before it uses ODX.
    pub(crate) fn third_party_copy_vpd(&self) -> Vec<u8> {
        let bs = self.block_size();
        let mut out = Vec::new();
        let mut desc = |kind: u16, body: Vec<u8>| {
            out.extend_from_slice(&kind.to_be_bytes());
            out.extend_from_slice(&(body.len() as u16).to_be_bytes());
            out.extend_from_slice(&body);
        };
        // Block Device ROD Token Limits.
        let mut b = vec![0u8; 32];
        b[6..8].copy_from_slice(&(MAX_RANGE_DESCRIPTORS as u16).to_be_bytes());
        b[8..12].copy_from_slice(&MAX_INACTIVITY_TIMEOUT.to_be_bytes());
        b[12..16].copy_from_slice(&DEFAULT_INACTIVITY_TIMEOUT.to_be_bytes());
        b[16..24].copy_from_slice(&(MAX_TOKEN_TRANSFER_BYTES / bs).to_be_bytes());
        // Optimal transfer count: a whole token costs what a part of one does.
        b[24..32].copy_from_slice(&(MAX_TOKEN_TRANSFER_BYTES / bs).to_be_bytes());
        desc(0x0000, b);
        // Supported Commands: the third-party copy commands of the command table, each
        // operation code with its service actions. The list length excludes the padding.
        let mut list = Vec::new();
        for op in [THIRD_PARTY_COPY_OUT, THIRD_PARTY_COPY_IN] {
            let sas: Vec<u8> = COMMANDS.iter().filter(|c| c.op == op).filter_map(|c| c.sa).collect();
            list.push(op);
            list.push(sas.len() as u8);
            list.extend_from_slice(&sas);
        }
        let mut b = vec![list.len() as u8];
        b.extend_from_slice(&list);
        desc(0x0001, padded(b));
        // Parameter Data: the EXTENDED COPY (LID1) limits.
        let mut b = vec![0u8; 28];
        b[4..6].copy_from_slice(&(crate::xcopy::MAX_CSCD_DESCRIPTORS as u16).to_be_bytes());
        b[6..8].copy_from_slice(&(crate::xcopy::MAX_SEGMENT_DESCRIPTORS as u16).to_be_bytes());
        b[8..12].copy_from_slice(&(crate::xcopy::MAX_DESCRIPTOR_LIST_LENGTH as u32).to_be_bytes());
        desc(0x0004, b);
        // Supported Descriptors, ascending: block-to-block segments, identification CSCDs.
        desc(0x0008, padded(vec![2, 0x02, 0xE4]));
        // Supported CSCD Descriptor IDs: none besides list indexes.
        desc(0x000C, vec![0, 0, 0, 0]);
        // ROD Token Features: remote tokens neither made nor used; tokens end by inactivity
        // or at the end of their lifetime; then the block device's features.
        let mut b = vec![0u8; 92];
        b[12..16].copy_from_slice(&1u32.to_be_bytes()); // minimum token lifetime
        b[16..20].copy_from_slice(&(MAX_TOKEN_LIFETIME.as_secs() as u32).to_be_bytes()); // maximum
        b[20..24].copy_from_slice(&MAX_INACTIVITY_TIMEOUT.to_be_bytes());
        b[42..44].copy_from_slice(&48u16.to_be_bytes());
        let f = &mut b[44..92];
        f[2..4].copy_from_slice(&0x2Cu16.to_be_bytes());
        // Sharing works in whole grains: that is the optimal length granularity.
        f[6..8].copy_from_slice(&((self.backend.grain_size() / bs).min(u16::MAX as u64) as u16).to_be_bytes());
        f[8..16].copy_from_slice(&MAX_TOKEN_TRANSFER_BYTES.to_be_bytes());
        f[16..24].copy_from_slice(&MAX_TOKEN_TRANSFER_BYTES.to_be_bytes());
        f[24..32].copy_from_slice(&u64::MAX.to_be_bytes());
        f[32..40].copy_from_slice(&u64::MAX.to_be_bytes());
        desc(0x0106, b);
        // Supported ROD Types: point in time copy (made and used, also by EXTENDED COPY), and
        // the block device zero token (used).
        let mut b = vec![0u8; 4];
        b[2..4].copy_from_slice(&128u16.to_be_bytes());
        for (kind, flags) in [(ROD_TYPE_PIT_DEFAULT, 0x80 | 0x02 | 0x01), (ROD_TYPE_BLOCK_ZERO, 0x02)] {
            let mut t = vec![0u8; 64];
            t[0..4].copy_from_slice(&kind.to_be_bytes());
            t[4] = flags;
            b.extend_from_slice(&t);
        }
        desc(0x0108, b);
        // General Copy Operations.
        let mut b = vec![0u8; 32];
        b[0..4].copy_from_slice(&1u32.to_be_bytes()); // total concurrent copies
        b[4..8].copy_from_slice(&1u32.to_be_bytes()); // maximum identified concurrent copies
        b[8..12].copy_from_slice(&(crate::xcopy::MAX_SEGMENT_BYTES as u32).to_be_bytes());
        b[12] = 9; // data segment granularity: 512 bytes (log2)
        desc(0x8001, b);
        out
    }
}

/// Pads a descriptor body to a multiple of four bytes.
fn padded(mut b: Vec<u8>) -> Vec<u8> {
    while b.len() % 4 != 0 {
        b.push(0);
    }
    b
}
