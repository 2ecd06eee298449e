//! Block commands (SBC-3): capacity, reads and writes, verify, cache, thin provisioning
//! (WRITE SAME, UNMAP, GET LBA STATUS) and COMPARE AND WRITE.

use tessera_disk::AlignedBuf;

use crate::bytes::{alloc, be16, be32, be64};
use crate::cdb::{block_range, BlockRange};
use crate::commands::Request;
use crate::data::Data;
use crate::lun::{CmdResult, Lun};
use crate::opcodes::*;
use crate::sense::{self, Sense};
use crate::spc::{
    MAX_COMPARE_AND_WRITE_BLOCKS, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BLOCKS,
};

impl Lun {
    /// The blocks a block command names, decoded, and checked against the LUN's size and,
    /// with `transfer`, against the largest transfer.
    pub(crate) fn checked_range(&self, cdb: &[u8], transfer: bool) -> Result<BlockRange, Sense> {
        let r = block_range(cdb)?;
        if transfer {
            self.check_transfer(r.blocks)?;
        }
        self.check_range(r.lba, r.blocks)?;
        Ok(r)
    }

    fn check_range(&self, lba: u64, n: u64) -> Result<(), Sense> {
        match lba.checked_add(n) {
            Some(end) if end <= self.blocks() => Ok(()),
            _ => Err(sense::LBA_OUT_OF_RANGE),
        }
    }

    fn check_writable(&self) -> Result<(), Sense> {
        if self.write_protected() {
            Err(sense::WRITE_PROTECTED)
        } else {
            Ok(())
        }
    }

    pub(crate) fn read_capacity_10(&self) -> CmdResult {
        let last = self.blocks() - 1;
        let mut d = Vec::with_capacity(8);
        d.extend_from_slice(&(last.min(0xFFFF_FFFF) as u32).to_be_bytes());
        d.extend_from_slice(&(self.block_size() as u32).to_be_bytes());
        Ok(d)
    }

    pub(crate) fn read_capacity_16(&self, cdb: &[u8]) -> CmdResult {
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&(self.blocks() - 1).to_be_bytes());
        d[8..12].copy_from_slice(&(self.block_size() as u32).to_be_bytes());
        // Logical blocks per physical block, as a power of two: 4 KiB physical blocks unless
        // the vdisk presents 512-byte ones (512n).
        d[13] = (self.backend.physical_block_size() as u64 / self.block_size()).trailing_zeros() as u8;
        // LBPME: thin provisioning is on (UNMAP works on every vdisk); LBPRZ: unmapped reads zero.
        d[14] = 0x80 | 0x40;
        Ok(alloc(d, be32(&cdb[10..14]) as usize))
    }

    pub(crate) fn get_lba_status(&self, cdb: &[u8]) -> CmdResult {
        let lba = be64(&cdb[2..10]);
        let len = be32(&cdb[10..14]) as usize;
        if lba >= self.blocks() {
            return Err(sense::LBA_OUT_OF_RANGE);
        }
        let bs = self.block_size();
        // Describe up to 1 GiB or 64 extents past the start.
        let span = ((1u64 << 30) / bs).min(self.blocks() - lba);
        let extents = self
            .backend
            .extents(lba * bs, span * bs)
            .map_err(|e| self.io_sense(e, false))?;
        let mut d = vec![0u8; 8];
        for x in extents.iter().take(64) {
            let mut desc = [0u8; 16];
            desc[0..8].copy_from_slice(&(x.offset / bs).to_be_bytes());
            desc[8..12].copy_from_slice(&((x.len / bs).min(u32::MAX as u64) as u32).to_be_bytes());
            desc[12] = if x.mapped { 0 } else { 1 };
            d.extend_from_slice(&desc);
        }
        let n = (d.len() - 4) as u32;
        d[0..4].copy_from_slice(&n.to_be_bytes());
        Ok(alloc(d, len))
    }

    pub(crate) fn read(&self, cdb: &[u8]) -> Result<Data, Sense> {
        match self.plan_read(cdb)? {
            Some((lba, n)) => self.read_blocks(lba, n).map(Data::Blocks),
            None => Ok(Data::default()),
        }
    }

    /// The blocks a READ asks for, checked: None when it asks for none.
    pub(crate) fn plan_read(&self, cdb: &[u8]) -> Result<Option<(u64, u64)>, Sense> {
        let r = self.checked_range(cdb, true)?;
        Ok((r.blocks > 0).then_some((r.lba, r.blocks)))
    }

    /// Reads each `(lba, blocks)` as [`read_blocks`](Self::read_blocks) would, as one batch.
    pub(crate) fn read_blocks_many(&self, reads: &[(u64, u64)]) -> Vec<Result<AlignedBuf, Sense>> {
        let bs = self.block_size();
        let mut bufs: Vec<AlignedBuf> = reads
            .iter()
            .map(|&(_, n)| AlignedBuf::zeroed((n * bs) as usize))
            .collect();
        let mut reqs: Vec<(u64, &mut [u8])> = reads
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(lba, _), b)| (lba * bs, &mut b[..]))
            .collect();
        let done = self.backend.read_many(&mut reqs);
        drop(reqs);
        bufs.into_iter()
            .zip(done)
            .map(|(b, r)| r.map(|()| b).map_err(|e| self.io_sense(e, false)))
            .collect()
    }

    /// Reads `n` blocks at `lba`, with the sense a failed read gets.
    fn read_blocks(&self, lba: u64, n: u64) -> Result<AlignedBuf, Sense> {
        let bs = self.block_size();
        let mut buf = AlignedBuf::zeroed((n * bs) as usize);
        self.backend
            .read(lba * bs, &mut buf)
            .map_err(|e| self.io_sense(e, false))?;
        Ok(buf)
    }

    fn check_transfer(&self, n: u64) -> Result<(), Sense> {
        if n * self.block_size() > MAX_TRANSFER_BYTES {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        Ok(())
    }

    fn data<'a>(&self, d: &'a [u8], n: u64) -> Result<&'a [u8], Sense> {
        d.get(..(n * self.block_size()) as usize)
            .ok_or(sense::PARAMETER_LIST_LENGTH_ERROR)
    }

    /// WRITE and WRITE AND VERIFY, any size.
    pub(crate) fn write(&self, req: &Request, r: BlockRange) -> CmdResult {
        let (cdb, d, lba, n) = (req.cdb, req.data, r.lba, r.blocks);
        self.check_writable()?;
        if n == 0 {
            return Ok(Vec::new());
        }
        // When the transport carried less than the CDB asks (iSCSI EDTL below the transfer
        // length), only the whole blocks that arrived are written; the transport reports the
        // residual.
        let n = n.min(d.len() as u64 / self.block_size());
        if n == 0 {
            return Ok(Vec::new());
        }
        let data = self.data(d, n)?;
        let verify = matches!(cdb[0], WRITE_VERIFY_10 | WRITE_VERIFY_12 | WRITE_VERIFY_16);
        // The cache setting is read under the lock that MODE SELECT takes to turn it off
        // (spc.rs): a write that saw it on has ended before that MODE SELECT's flush.
        let _shared = self.atomic.read();
        let durable = r.fua || verify || !self.mode().wce;
        self.backend
            .write(lba * self.block_size(), data, durable)
            .map_err(|e| self.io_sense(e, true))?;
        Ok(Vec::new())
    }

    pub(crate) fn verify(&self, req: &Request, r: BlockRange) -> CmdResult {
        let (d, lba, n) = (req.data, r.lba, r.blocks);
        let bytchk = (req.cdb[1] >> 1) & 0x03;
        if n == 0 {
            return Ok(Vec::new());
        }
        let buf = self.read_blocks(lba, n)?;
        match bytchk {
            0 => Ok(Vec::new()),
            1 => {
                let want = self.data(d, n)?;
                compare(&buf, want)
            }
            3 => {
                let one = self.data(d, 1)?;
                let pattern: Vec<u8> = one.iter().copied().cycle().take(buf.len()).collect();
                compare(&buf, &pattern)
            }
            _ => Err(sense::INVALID_FIELD_IN_CDB),
        }
    }

    /// SYNCHRONIZE CACHE: the whole LUN, whatever range it names (the range is checked).
    pub(crate) fn synchronize_cache(&self, _: &Request, _: BlockRange) -> CmdResult {
        self.backend.flush().map_err(|e| self.io_sense(e, true))?;
        Ok(Vec::new())
    }

    pub(crate) fn write_same(&self, cdb: &[u8], d: &[u8]) -> CmdResult {
        let BlockRange { lba, blocks: n, .. } = block_range(cdb)?;
        let unmap = cdb[1] & 0x08 != 0;
        let anchor = cdb[1] & 0x10 != 0;
        let ndob = cdb[0] == WRITE_SAME_16 && cdb[1] & 0x01 != 0;
        // ANCHOR: we do not anchor (ANC_SUP is clear), with or without UNMAP.
        if cdb[1] & 0xE0 != 0 || anchor || (cdb[0] == WRITE_SAME_10 && cdb[1] & 0x01 != 0) {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        // WSNZ is clear: zero blocks means from the LBA to the end of the LUN.
        let n = if n == 0 {
            if lba >= self.blocks() {
                return Err(sense::LBA_OUT_OF_RANGE);
            }
            self.blocks() - lba
        } else {
            n
        };
        if n > MAX_WRITE_SAME_BLOCKS {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        // Exactly one block of data-out, or none with NDOB.
        let want = if ndob { 0 } else { self.block_size() as usize };
        if d.len() != want {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        self.check_range(lba, n)?;
        self.check_writable()?;
        let bs = self.block_size();
        let block: Vec<u8> = if ndob {
            vec![0u8; bs as usize]
        } else {
            self.data(d, 1)?.to_vec()
        };
        let _shared = self.atomic.read();
        let durable = !self.mode().wce;
        let (off, len) = (lba * bs, n * bs);
        if unmap || block.iter().all(|&b| b == 0) {
            // UNMAP set: SBC-4 (WRITE SAME, "ANCHOR bit, UNMAP bit and ANC_SUP bit
            // relationships") has the device server deallocate each LBA, whatever the
            // Data-Out buffer holds; they then read as LBPRZ says, zeros. This is what Linux's
            // discard and LIO do too. Zeros without UNMAP are written (kept allocated on a
            // fixed vdisk).
            self.backend
                .write_zeroes(off, len, unmap, durable)
                .map_err(|e| self.io_sense(e, true))?;
            return Ok(Vec::new());
        }
        // A pattern without UNMAP: written.
        let chunk_blocks = (1u64 << 20) / bs;
        let pattern: Vec<u8> = block
            .iter()
            .copied()
            .cycle()
            .take((chunk_blocks * bs) as usize)
            .collect();
        let mut done = 0;
        while done < n {
            let k = chunk_blocks.min(n - done);
            self.backend
                .write(off + done * bs, &pattern[..(k * bs) as usize], durable)
                .map_err(|e| self.io_sense(e, true))?;
            done += k;
        }
        Ok(Vec::new())
    }

    pub(crate) fn unmap(&self, cdb: &[u8], d: &[u8]) -> CmdResult {
        if cdb[1] & 0x01 != 0 {
            return Err(sense::INVALID_FIELD_IN_CDB); // ANCHOR
        }
        let len = be16(&cdb[7..9]) as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        if len < 8 || d.len() < len {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let d = &d[..len];
        let data_len = be16(&d[0..2]) as usize;
        let desc_len = be16(&d[2..4]) as usize;
        if data_len + 2 > len || desc_len + 8 > len || desc_len % 16 != 0 {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let descs: Vec<(u64, u64)> = d[8..8 + desc_len]
            .chunks_exact(16)
            .map(|c| (be64(&c[0..8]), be32(&c[8..12])))
            .collect();
        if descs.len() as u64 > MAX_UNMAP_DESCRIPTORS {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        // Check every range before changing anything.
        let mut total = 0;
        for &(lba, n) in &descs {
            self.check_range(lba, n)?;
            total += n;
        }
        if total > MAX_UNMAP_BLOCKS {
            return Err(sense::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        self.check_writable()?;
        let bs = self.block_size();
        let _shared = self.atomic.read();
        for (lba, n) in descs {
            if n > 0 {
                self.backend
                    .trim(lba * bs, n * bs)
                    .map_err(|e| self.io_sense(e, true))?;
            }
        }
        // Parts of grains are zeroed in place: with the write cache off they read as zeros
        // (LBPRZ) after a power cut too, as a WRITE SAME with UNMAP's would.
        if !self.mode().wce {
            self.backend.flush().map_err(|e| self.io_sense(e, true))?;
        }
        Ok(Vec::new())
    }

    pub(crate) fn compare_and_write(&self, cdb: &[u8], d: &[u8]) -> CmdResult {
        let lba = be64(&cdb[2..10]);
        let n = cdb[13] as u64;
        if cdb[1] & 0xE0 != 0 || n > MAX_COMPARE_AND_WRITE_BLOCKS {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        self.check_range(lba, n)?;
        self.check_writable()?;
        let bs = self.block_size();
        // The data-out is exactly the compare and the write data.
        if d.len() as u64 != 2 * n * bs {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        let both = self.data(d, 2 * n)?;
        let (want, new) = both.split_at((n * bs) as usize);
        // Exclusive against every other write to this LUN, from any session.
        let _exclusive = self.atomic.write();
        let cur = self.read_blocks(lba, n)?;
        compare(&cur, want)?;
        let durable = cdb[1] & 0x08 != 0 || !self.mode().wce;
        self.backend
            .write(lba * bs, new, durable)
            .map_err(|e| self.io_sense(e, true))?;
        Ok(Vec::new())
    }
}

impl Lun {
    /// ORWRITE(16): the data is ORed into the blocks, atomically like COMPARE AND WRITE.
    pub(crate) fn orwrite(&self, req: &Request, r: BlockRange) -> CmdResult {
        let (d, lba, n) = (req.data, r.lba, r.blocks);
        self.check_writable()?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let data = self.data(d, n)?;
        let _exclusive = self.atomic.write();
        let durable = r.fua || !self.mode().wce;
        let mut cur = self.read_blocks(lba, n)?;
        for (c, x) in cur.iter_mut().zip(data) {
            *c |= x;
        }
        self.backend
            .write(lba * self.block_size(), &cur, durable)
            .map_err(|e| self.io_sense(e, true))?;
        Ok(Vec::new())
    }

    /// READ DEFECT DATA (10 and 12): a virtual disk has no defect lists; the header says so.
    pub(crate) fn read_defect_data(&self, cdb: &[u8]) -> CmdResult {
        let (format, alloc_len) = if cdb[0] == READ_DEFECT_DATA_10 {
            (cdb[2] & 0x07, be16(&cdb[7..9]) as usize)
        } else {
            (cdb[1] & 0x07, be32(&cdb[6..10]) as usize)
        };
        // No list is valid (PLISTV = GLISTV = 0); the format echoes the request.
        let header = if cdb[0] == READ_DEFECT_DATA_10 {
            vec![0, format, 0, 0]
        } else {
            vec![0, format, 0, 0, 0, 0, 0, 0]
        };
        Ok(alloc(header, alloc_len))
    }
}

/// MISCOMPARE with the offset of the first differing byte in INFORMATION.
fn compare(have: &[u8], want: &[u8]) -> CmdResult {
    match have.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(Vec::new()),
        Some(i) => Err(sense::MISCOMPARE_DURING_VERIFY.with_info(i as u64)),
    }
}
