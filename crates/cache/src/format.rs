//! The log's on-disk format. The log is a ring over each cache device's data area, written
//! identically on every device of the log. It is a sequence of batches: one 4 KiB header
//! block that lists the batch's entries, followed by their data, each entry a whole number of
//! 4 KiB blocks. A batch is one device write, so a crash leaves at most the batch in flight
//! torn, and the header's and the entries' checksums tell a torn batch from a whole one.

use tessera_disk::SECTOR;

/// Size of a batch header, and the unit of every entry.
pub const BLOCK: usize = SECTOR;
const MAGIC: [u8; 8] = *b"TSWBLOG1";
const FIXED: usize = 48;
const ENTRY: usize = 32;
/// Entries one header can list.
pub const MAX_ENTRIES: usize = (BLOCK - 4 - FIXED) / ENTRY;
/// Where `flushed_below` lies: in the bytes past the last entry a header can list, which
/// headers written before it existed leave zero.
const FLUSHED_BELOW: usize = BLOCK - 12;
const _: () = assert!(FIXED + MAX_ENTRIES * ENTRY <= FLUSHED_BELOW);

/// One write held by the log: `len` bytes at `offset` of slab set `set`, for vdisk `vdisk`
/// (whose cache budget it counts against). `crc` covers the checksums of its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub set: u32,
    pub offset: u64,
    pub len: u32,
    pub vdisk: u64,
    pub crc: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The pool the log belongs to: a device moved from another pool never replays into this one.
    pub pool: [u8; 16],
    /// Raised at every open: a batch left from before the last open is never taken for a new one.
    pub generation: u64,
    /// Consecutive within a generation: the replay follows them and stops at the first gap.
    pub seq: u64,
    pub data_len: u32,
    pub entries: Vec<Entry>,
    /// Every batch of this generation with a lower sequence number was made durable by a
    /// flush that completed before this batch was made (0: no claim). A batch this vouches
    /// for that the replay finds not whole was acknowledged, so rotten since, not torn by a
    /// crash: what it held is lost, not a clean end of the log.
    pub flushed_below: u64,
}

impl Header {
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= BLOCK && self.entries.len() <= MAX_ENTRIES);
        let out = &mut out[..BLOCK];
        out.fill(0);
        out[0..8].copy_from_slice(&MAGIC);
        out[8..24].copy_from_slice(&self.pool);
        out[24..32].copy_from_slice(&self.generation.to_le_bytes());
        out[32..40].copy_from_slice(&self.seq.to_le_bytes());
        out[40..44].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out[44..48].copy_from_slice(&self.data_len.to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let b = &mut out[FIXED + i * ENTRY..FIXED + (i + 1) * ENTRY];
            b[0..4].copy_from_slice(&e.set.to_le_bytes());
            b[4..8].copy_from_slice(&e.len.to_le_bytes());
            b[8..16].copy_from_slice(&e.offset.to_le_bytes());
            b[16..24].copy_from_slice(&e.vdisk.to_le_bytes());
            b[24..28].copy_from_slice(&e.crc.to_le_bytes());
        }
        out[FLUSHED_BELOW..FLUSHED_BELOW + 8].copy_from_slice(&self.flushed_below.to_le_bytes());
        let crc = crc32c::crc32c(&out[..BLOCK - 4]);
        out[BLOCK - 4..].copy_from_slice(&crc.to_le_bytes());
    }

    /// Whether `b` begins as a batch header does (whether or not the rest of it is whole).
    pub fn looks_like(b: &[u8]) -> bool {
        b.len() >= 8 && b[0..8] == MAGIC
    }

    /// The header in `b`, if `b` holds a whole, consistent one.
    pub fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < BLOCK || b[0..8] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(b[BLOCK - 4..BLOCK].try_into().ok()?);
        if crc32c::crc32c(&b[..BLOCK - 4]) != crc {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let n = u32_at(40) as usize;
        if n > MAX_ENTRIES {
            return None;
        }
        let entries: Vec<Entry> = (0..n)
            .map(|i| {
                let at = FIXED + i * ENTRY;
                Entry {
                    set: u32_at(at),
                    len: u32_at(at + 4),
                    offset: u64_at(at + 8),
                    vdisk: u64_at(at + 16),
                    crc: u32_at(at + 24),
                }
            })
            .collect();
        let data_len = u32_at(44);
        let sum: u64 = entries.iter().map(|e| e.len as u64).sum();
        if sum != data_len as u64 || entries.iter().any(|e| e.len == 0 || e.len as usize % BLOCK != 0) {
            return None;
        }
        Some(Header {
            pool: b[8..24].try_into().unwrap(),
            generation: u64_at(24),
            seq: u64_at(32),
            data_len,
            entries,
            flushed_below: u64_at(FLUSHED_BELOW),
        })
    }
}

/// The checksum of every block of `data`.
pub fn block_crcs(data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK).map(crc32c::crc32c).collect()
}

/// An entry's checksum, from its blocks' checksums.
pub fn entry_crc(blocks: &[u32]) -> u32 {
    let bytes: Vec<u8> = blocks.iter().flat_map(|c| c.to_le_bytes()).collect();
    crc32c::crc32c(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            pool: [7; 16],
            generation: 3,
            seq: 99,
            data_len: 3 * BLOCK as u32,
            entries: vec![
                Entry {
                    set: 1,
                    offset: 8192,
                    len: BLOCK as u32,
                    vdisk: 4,
                    crc: 11,
                },
                Entry {
                    set: 2,
                    offset: 1 << 30,
                    len: 2 * BLOCK as u32,
                    vdisk: 5,
                    crc: 12,
                },
            ],
            flushed_below: 97,
        }
    }

    #[test]
    fn a_header_reads_back_as_written() {
        let mut b = vec![0u8; BLOCK];
        sample().encode(&mut b);
        assert_eq!(Header::decode(&b), Some(sample()));
    }

    #[test]
    fn any_flipped_bit_makes_the_header_unreadable() {
        let mut b = vec![0u8; BLOCK];
        sample().encode(&mut b);
        for bit in (0..BLOCK * 8).step_by(61) {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Header::decode(&c), None, "bit {bit}");
        }
        assert_eq!(Header::decode(&vec![0u8; BLOCK]), None);
    }

    /// A header written before `flushed_below` existed (those bytes zero) reads as one that
    /// vouches for no batch.
    #[test]
    fn a_header_without_a_flush_claim_reads_as_claiming_nothing() {
        let mut h = sample();
        h.flushed_below = 0;
        let mut b = vec![0u8; BLOCK];
        h.encode(&mut b);
        assert!(b[BLOCK - 12..BLOCK - 4].iter().all(|&x| x == 0));
        assert_eq!(Header::decode(&b).map(|h| h.flushed_below), Some(0));
    }

    #[test]
    fn a_full_header_fits_its_block() {
        let mut h = sample();
        h.entries = (0..MAX_ENTRIES as u32)
            .map(|i| Entry {
                set: i,
                offset: i as u64 * 4096,
                len: BLOCK as u32,
                vdisk: 1,
                crc: i,
            })
            .collect();
        h.data_len = (MAX_ENTRIES * BLOCK) as u32;
        let mut b = vec![0u8; BLOCK];
        h.encode(&mut b);
        assert_eq!(Header::decode(&b), Some(h));
    }
}
