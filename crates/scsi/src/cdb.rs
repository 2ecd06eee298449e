//! Decoding of the block commands' CDBs, once, before their handler runs (as LIO's
//! `sbc_parse_cdb` does): the LBA, the number of blocks and FUA, whatever the CDB's size.

use crate::bytes::{be16, be32, be64};
use crate::opcodes::*;
use crate::sense::{self, Sense};
use tessera_disk::IoOp;

/// The blocks a read, write, verify, pre-fetch or cache command names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockRange {
    pub lba: u64,
    pub blocks: u64,
    /// Force unit access: durable before the command completes.
    pub fua: bool,
}

/// Decodes a read/write-family CDB whose length `check_cdb` accepted.
pub(crate) fn block_range(cdb: &[u8]) -> Result<BlockRange, Sense> {
    let (lba, blocks) = match cdb[0] {
        READ_6 | WRITE_6 => {
            let lba = (((cdb[1] & 0x1F) as u64) << 16) | be16(&cdb[2..4]);
            // A zero length means 256 blocks in the 6-byte commands.
            let blocks = if cdb[4] == 0 { 256 } else { cdb[4] as u64 };
            return Ok(BlockRange {
                lba,
                blocks,
                fua: false,
            });
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
        // RDPROTECT / WRPROTECT / VRPROTECT / ORPROTECT: we keep no protection information.
        return Err(sense::INVALID_FIELD_IN_CDB);
    }
    Ok(BlockRange {
        lba,
        blocks,
        fua: cdb[1] & 0x08 != 0,
    })
}

/// What a CDB is, as metrics count it.
pub fn io_op(cdb: &[u8]) -> IoOp {
    match cdb.first() {
        Some(&(READ_6 | READ_10 | READ_12 | READ_16)) => IoOp::Read,
        Some(
            &(WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 | WRITE_VERIFY_10 | WRITE_VERIFY_12 | WRITE_VERIFY_16
            | ORWRITE_16 | COMPARE_AND_WRITE),
        ) => IoOp::Write,
        Some(&(SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16)) => IoOp::Flush,
        Some(&UNMAP) => IoOp::Unmap,
        Some(&(WRITE_SAME_10 | WRITE_SAME_16)) => IoOp::Zero,
        _ => IoOp::Other,
    }
}

/// The data-out a read/write CDB asks for, in bytes, for the transport's residual count.
pub fn transfer_length(cdb: &[u8], block_size: u64) -> Option<u64> {
    match cdb.first()? {
        &(READ_6 | READ_10 | READ_12 | READ_16 | WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 | WRITE_VERIFY_10
        | WRITE_VERIFY_12 | WRITE_VERIFY_16 | ORWRITE_16) => {
            if cdb.len() < cdb_len(cdb[0])? {
                return None;
            }
            block_range(cdb).ok().map(|r| r.blocks * block_size)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_decodes_to_one_range() {
        assert_eq!(
            block_range(&[READ_6, 0x01, 0x02, 0x03, 0, 0]).unwrap(),
            BlockRange {
                lba: 0x010203,
                blocks: 256,
                fua: false
            }
        );
        let mut c10 = [WRITE_10, 0x08, 0, 0, 0x10, 0, 0, 0, 8, 0];
        assert_eq!(
            block_range(&c10).unwrap(),
            BlockRange {
                lba: 0x1000,
                blocks: 8,
                fua: true
            }
        );
        c10[1] = 0x20;
        assert_eq!(block_range(&c10), Err(sense::INVALID_FIELD_IN_CDB), "WRPROTECT");
        let mut c16 = [0u8; 16];
        c16[0] = READ_16;
        c16[2..10].copy_from_slice(&u64::MAX.to_be_bytes());
        c16[10..14].copy_from_slice(&7u32.to_be_bytes());
        assert_eq!(block_range(&c16).unwrap().lba, u64::MAX);
        assert_eq!(transfer_length(&c16, 512), Some(7 * 512));
        assert_eq!(transfer_length(&c16[..10], 512), None, "short CDB");
    }
}
