//! Block commands (SBC-3): capacity, reads and writes, verify, cache, thin provisioning
//! (WRITE SAME, UNMAP, GET LBA STATUS) and COMPARE AND WRITE.

use tessera_disk::AlignedBuf;

use crate::data::Data;
use crate::lun::{alloc, be16, be32, be64, CmdResult, Lun};
use crate::opcodes::*;
use crate::sense::{self, Sense};
use crate::spc::{
    MAX_COMPARE_AND_WRITE_BLOCKS, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BLOCKS,
};

/// LBA, number of blocks and FUA of a read, write or verify CDB.
fn rw_fields(cdb: &[u8]) -> Result<(u64, u64, bool), Sense> {
    let (lba, n) = match cdb[0] {
        READ_6 | WRITE_6 => {
            let lba = (((cdb[1] & 0x1F) as u64) << 16) | be16(&cdb[2..4]);
            // A zero length means 256 blocks in the 6-byte commands.
            let n = if cdb[4] == 0 { 256 } else { cdb[4] as u64 };
            return Ok((lba, n, false));
        }
        READ_10 | WRITE_10 | WRITE_VERIFY_10 | VERIFY_10 | PRE_FETCH_10 | SYNCHRONIZE_CACHE_10 | WRITE_SAME_10 => {
            (be32(&cdb[2..6]), be16(&cdb[7..9]))
        }
        READ_12 | WRITE_12 | WRITE_VERIFY_12 | VERIFY_12 => (be32(&cdb[2..6]), be32(&cdb[6..10])),
        _ => (be64(&cdb[2..10]), be32(&cdb[10..14])),
    };
    if cdb[1] & 0xE0 != 0
        && !matches!(
            cdb[0],
            SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 | PRE_FETCH_10 | PRE_FETCH_16
        )
    {
        // RDPROTECT / WRPROTECT / VRPROTECT: we keep no protection information.
        return Err(sense::INVALID_FIELD_IN_CDB);
    }
    Ok((lba, n, cdb[1] & 0x08 != 0))
}

impl Lun {
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
        let (lba, n, _) = rw_fields(cdb)?;
        self.check_transfer(n)?;
        self.check_range(lba, n)?;
        Ok((n > 0).then_some((lba, n)))
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

    pub(crate) fn write(&self, cdb: &[u8], d: &[u8]) -> CmdResult {
        let (lba, n, fua) = rw_fields(cdb)?;
        self.check_transfer(n)?;
        self.check_range(lba, n)?;
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
        let durable = fua || verify || !self.mode().wce;
        let _shared = self.atomic.read();
        self.backend
            .write(lba * self.block_size(), data, durable)
            .map_err(|e| self.io_sense(e, true))?;
        Ok(Vec::new())
    }

    pub(crate) fn verify(&self, cdb: &[u8], d: &[u8]) -> CmdResult {
        let (lba, n, _) = rw_fields(cdb)?;
        let bytchk = (cdb[1] >> 1) & 0x03;
        self.check_transfer(n)?;
        self.check_range(lba, n)?;
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

    pub(crate) fn pre_fetch(&self, cdb: &[u8]) -> CmdResult {
        let (lba, n, _) = rw_fields(cdb)?;
        self.check_range(lba, n)?;
        Ok(Vec::new())
    }

    pub(crate) fn synchronize_cache(&self, cdb: &[u8]) -> CmdResult {
        let (lba, n, _) = rw_fields(cdb)?;
        self.check_range(lba, n)?;
        self.backend.flush().map_err(|e| self.io_sense(e, true))?;
        Ok(Vec::new())
    }

    pub(crate) fn write_same(&self, cdb: &[u8], d: &[u8]) -> CmdResult {
        let (lba, n, _) = rw_fields(cdb)?;
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
        let durable = !self.mode().wce;
        let _shared = self.atomic.read();
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
                self.backend.trim(lba * bs, n * bs).map_err(|e| self.io_sense(e, true))?;
            }
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
    pub(crate) fn orwrite(&self, cdb: &[u8], d: &[u8]) -> CmdResult {
        // ORPROTECT needs protection information, which we do not keep.
        if cdb[1] & 0xE0 != 0 {
            return Err(sense::INVALID_FIELD_IN_CDB);
        }
        let lba = be64(&cdb[2..10]);
        let n = be32(&cdb[10..14]);
        self.check_transfer(n)?;
        self.check_range(lba, n)?;
        self.check_writable()?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let data = self.data(d, n)?;
        let durable = cdb[1] & 0x08 != 0 || !self.mode().wce;
        let _exclusive = self.atomic.write();
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

/// The data-out a read/write CDB asks for, in bytes, for the transport's residual count.
pub fn transfer_length(cdb: &[u8], block_size: u64) -> Option<u64> {
    match cdb.first()? {
        &(READ_6 | READ_10 | READ_12 | READ_16 | WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 | WRITE_VERIFY_10
        | WRITE_VERIFY_12 | WRITE_VERIFY_16) => {
            if cdb.len() < cdb_len(cdb[0])? {
                return None;
            }
            rw_fields(cdb).ok().map(|(_, n, _)| n * block_size)
        }
        &ORWRITE_16 if cdb.len() >= 16 => Some(be32(&cdb[10..14]) * block_size),
        _ => None,
    }
}
