//! Verify mode: every written block describes itself (magic, block number, generation,
//! checksum over the whole block) and every read of a block written in this session is checked
//! against the generation last acknowledged for it. A block has at most one I/O in flight, so
//! the expected content is always known exactly.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

const MAGIC: &[u8; 8] = b"TSRBENCH";
/// magic, block number, generation, checksum.
const HEADER: usize = 28;
/// Mismatches described in the report, at most.
const KEEP_ERRORS: usize = 16;

pub struct Verifier {
    block_size: usize,
    /// Generation last acknowledged per block; 0: not written by us.
    gens: Vec<AtomicU64>,
    busy: Vec<AtomicBool>,
    next_gen: AtomicU64,
    checked: AtomicU64,
    unverified: AtomicU64,
    corrupt: AtomicU64,
    errors: Mutex<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VerifyStats {
    /// Reads checked against a known generation.
    pub checked: u64,
    /// Reads of blocks not written in this session: their content is not known.
    pub unverified: u64,
    /// Reads whose content was not what was last written.
    pub corrupt: u64,
    /// The first mismatches, described.
    pub errors: Vec<String>,
}

fn fill(block: u64, gen: u64, out: &mut [u8]) {
    // xorshift64* from the block and generation: cheap, and different for every write.
    let mut x = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ gen.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    for chunk in out[HEADER..].chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&block.to_le_bytes());
    out[16..24].copy_from_slice(&gen.to_le_bytes());
    out[24..28].fill(0);
    let crc = crc32c::crc32c(out);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
}

impl Verifier {
    /// For a region of `blocks` I/O-sized blocks.
    pub fn new(blocks: u64, block_size: usize) -> Verifier {
        Verifier {
            block_size,
            gens: (0..blocks).map(|_| AtomicU64::new(0)).collect(),
            busy: (0..blocks).map(|_| AtomicBool::new(false)).collect(),
            next_gen: AtomicU64::new(1),
            checked: AtomicU64::new(0),
            unverified: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
        }
    }

    pub fn blocks(&self) -> u64 {
        self.gens.len() as u64
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Claims a block for one I/O; false if another I/O has it.
    pub fn claim(&self, block: u64) -> bool {
        !self.busy[block as usize].swap(true, Ordering::AcqRel)
    }

    pub fn release(&self, block: u64) {
        self.busy[block as usize].store(false, Ordering::Release);
    }

    /// Fills `out` with a new generation of `block`; returns the generation, to acknowledge
    /// once the write completes.
    pub fn prepare_write(&self, block: u64, out: &mut [u8]) -> u64 {
        let gen = self.next_gen.fetch_add(1, Ordering::Relaxed);
        fill(block, gen, out);
        gen
    }

    pub fn written(&self, block: u64, gen: u64) {
        self.gens[block as usize].store(gen, Ordering::Release);
    }

    /// How many blocks no write has been acknowledged for (what a read cannot verify yet).
    pub fn unwritten(&self) -> u64 {
        self.gens.iter().filter(|g| g.load(Ordering::Acquire) == 0).count() as u64
    }

    /// A write that failed leaves the block's content unknown.
    pub fn write_failed(&self, block: u64) {
        self.gens[block as usize].store(0, Ordering::Release);
    }

    /// Checks what a read of `block` returned; false on a mismatch.
    pub fn check(&self, block: u64, data: &[u8]) -> bool {
        let want = self.gens[block as usize].load(Ordering::Acquire);
        if want == 0 {
            self.unverified.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.checked.fetch_add(1, Ordering::Relaxed);
        let mut expect = vec![0u8; data.len()];
        fill(block, want, &mut expect);
        if expect == data {
            return true;
        }
        self.corrupt.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.errors.lock();
        if errors.len() < KEEP_ERRORS {
            errors.push(describe(block, want, data));
        }
        false
    }

    pub fn stats(&self) -> VerifyStats {
        VerifyStats {
            checked: self.checked.load(Ordering::Relaxed),
            unverified: self.unverified.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
            errors: self.errors.lock().clone(),
        }
    }
}

/// What was found instead of generation `want` of `block`.
fn describe(block: u64, want: u64, data: &[u8]) -> String {
    let at = |r: std::ops::Range<usize>| u64::from_le_bytes(data[r].try_into().unwrap());
    if &data[..8] != MAGIC {
        let zero = data.iter().all(|&b| b == 0);
        return format!(
            "block {block}: expected generation {want}, found {}",
            if zero {
                "zeros"
            } else {
                "no block header (foreign data)"
            }
        );
    }
    let (b, g) = (at(8..16), at(16..24));
    let stored = u32::from_le_bytes(data[24..28].try_into().unwrap());
    let mut copy = data.to_vec();
    copy[24..28].fill(0);
    let crc_ok = crc32c::crc32c(&copy) == stored;
    match (b == block, g == want, crc_ok) {
        (false, _, _) => format!("block {block}: expected generation {want}, found block {b} (misdirected I/O)"),
        (true, false, true) => format!("block {block}: expected generation {want}, found older or lost write {g}"),
        _ => format!("block {block}: generation {g} fails its checksum (damaged data)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catches_each_kind_of_damage() {
        let v = Verifier::new(4, 512);
        let mut b = vec![0u8; 512];
        assert!(v.check(0, &b), "an unwritten block is not known");
        let g1 = v.prepare_write(1, &mut b);
        v.written(1, g1);
        assert!(v.check(1, &b));
        let old = b.clone();
        let g2 = v.prepare_write(1, &mut b);
        v.written(1, g2);
        assert!(!v.check(1, &old), "a lost write");
        let mut flipped = b.clone();
        flipped[300] ^= 4;
        assert!(!v.check(1, &flipped), "a flipped bit");
        let mut other = vec![0u8; 512];
        let g = v.prepare_write(2, &mut other);
        v.written(2, g);
        assert!(!v.check(1, &other), "misdirected");
        assert!(!v.check(1, &vec![0u8; 512]), "zeros");
        let s = v.stats();
        assert_eq!((s.checked, s.unverified, s.corrupt), (5, 1, 4));
        assert!(s.errors[0].contains("lost write"), "{:?}", s.errors);
        assert!(s.errors[1].contains("checksum"), "{:?}", s.errors);
        assert!(s.errors[2].contains("misdirected"), "{:?}", s.errors);
        assert!(s.errors[3].contains("zeros"), "{:?}", s.errors);
        assert!(v.claim(3) && !v.claim(3));
        v.release(3);
        assert!(v.claim(3));
    }
}
