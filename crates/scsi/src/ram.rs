//! A block backend in memory: grains allocated on first write and given back by UNMAP, so
//! that thin provisioning answers (GET LBA STATUS) mean something. For tests and fuzzing of
//! the SCSI emulation without the engine.

use std::any::Any;
use std::collections::BTreeMap;

use parking_lot::RwLock;

use crate::backend::{BackendError, BackendErrorKind, BackendResult, BlockBackend, Extent, FrozenImage};

pub struct RamBackend {
    name: String,
    size: u64,
    block_size: u32,
    grain: u64,
    thin: bool,
    /// Grains written, by index; the others read as zeros.
    grains: RwLock<BTreeMap<u64, Box<[u8]>>>,
}

impl RamBackend {
    /// A thin backend of `size` bytes (a multiple of `block_size`) with 64 KiB grains.
    pub fn new(name: &str, size: u64, block_size: u32) -> RamBackend {
        assert!(
            block_size >= 512 && block_size.is_power_of_two() && size % block_size as u64 == 0,
            "a RAM backend has whole blocks of a power-of-two size"
        );
        RamBackend {
            name: name.to_string(),
            size,
            block_size,
            grain: (64 << 10).max(block_size as u64),
            thin: true,
            grains: RwLock::new(BTreeMap::new()),
        }
    }

    /// Fully provisioned: every grain is mapped, and UNMAP only zeroes.
    pub fn fixed(mut self) -> RamBackend {
        self.thin = false;
        let n = self.size.div_ceil(self.grain);
        let g = self.grain as usize;
        *self.grains.get_mut() = (0..n).map(|i| (i, vec![0u8; g].into_boxed_slice())).collect();
        self
    }

    fn check(&self, offset: u64, len: u64) -> BackendResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(BackendError::new(
                BackendErrorKind::Internal,
                format!(
                    "{}: {len} bytes at {offset} lie past the end ({})",
                    self.name, self.size
                ),
            )),
        }
    }

    /// Runs `f` on each (grain index, offset in grain, offset in the request, length).
    fn pieces(&self, offset: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        for p in tessera_disk::unit_pieces(self.grain, offset, len) {
            f(p.unit, p.off as usize, p.buf_off, p.len);
        }
    }

    /// Zeroes the range; whole grains are unmapped when `unmap` and the backend is thin.
    fn zero(&self, offset: u64, len: u64, unmap: bool) -> BackendResult<()> {
        self.check(offset, len)?;
        let mut grains = self.grains.write();
        let grain = self.grain as usize;
        self.pieces(offset, len, |g, in_g, _, n| {
            if unmap && self.thin && n == grain {
                grains.remove(&g);
            } else if let Some(data) = grains.get_mut(&g) {
                data[in_g..in_g + n].fill(0);
            }
        });
        Ok(())
    }
}

impl BlockBackend for RamBackend {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn physical_block_size(&self) -> u32 {
        self.block_size.max(4096)
    }
    fn grain_size(&self) -> u64 {
        self.grain
    }
    fn thin(&self) -> bool {
        self.thin
    }
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> BackendResult<()> {
        self.check(offset, buf.len() as u64)?;
        let grains = self.grains.read();
        self.pieces(offset, buf.len() as u64, |g, in_g, at, n| match grains.get(&g) {
            Some(data) => buf[at..at + n].copy_from_slice(&data[in_g..in_g + n]),
            None => buf[at..at + n].fill(0),
        });
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _durable: bool) -> BackendResult<()> {
        self.check(offset, data.len() as u64)?;
        let mut grains = self.grains.write();
        let grain = self.grain as usize;
        self.pieces(offset, data.len() as u64, |g, in_g, at, n| {
            let slot = grains.entry(g).or_insert_with(|| vec![0u8; grain].into_boxed_slice());
            slot[in_g..in_g + n].copy_from_slice(&data[at..at + n]);
        });
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool, _durable: bool) -> BackendResult<()> {
        self.zero(offset, len, unmap)
    }

    fn trim(&self, offset: u64, len: u64) -> BackendResult<()> {
        self.zero(offset, len, true)
    }

    fn flush(&self) -> BackendResult<()> {
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> BackendResult<Vec<Extent>> {
        self.check(offset, len)?;
        let grains = self.grains.read();
        let mut out: Vec<Extent> = Vec::new();
        self.pieces(offset, len, |g, _, at, n| {
            let mapped = grains.contains_key(&g);
            match out.last_mut() {
                Some(last) if last.mapped == mapped => last.len += n as u64,
                _ => out.push(Extent {
                    offset: offset + at as u64,
                    len: n as u64,
                    mapped,
                }),
            }
        });
        Ok(out)
    }

    fn freeze(&self, ranges: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let mut data = vec![0u8; total as usize];
        let mut at = 0usize;
        for &(offset, len) in ranges {
            self.read(offset, &mut data[at..at + len as usize])?;
            at += len as usize;
        }
        Ok(Box::new(RamImage {
            data,
            block_size: self.block_size,
        }))
    }
}

/// A copy of ranges of a RAM backend.
#[derive(Debug)]
struct RamImage {
    data: Vec<u8>,
    block_size: u32,
}

impl FrozenImage for RamImage {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> BackendResult<()> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|o| self.data.get(o..o.checked_add(out.len())?))
            .ok_or_else(|| BackendError::new(BackendErrorKind::Internal, "a read past the end of an image"))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_read_back_and_unmap_gives_grains_back() {
        let b = RamBackend::new("ram", 1 << 20, 512);
        assert_eq!(
            b.extents(0, 1 << 20).unwrap(),
            vec![Extent {
                offset: 0,
                len: 1 << 20,
                mapped: false
            }]
        );
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        b.write(1000, &data, false).unwrap();
        let mut back = vec![0u8; data.len()];
        b.read(1000, &mut back).unwrap();
        assert_eq!(back, data);
        // Two grains touched.
        let mapped: u64 = b
            .extents(0, 1 << 20)
            .unwrap()
            .iter()
            .filter(|e| e.mapped)
            .map(|e| e.len)
            .sum();
        assert_eq!(mapped, 128 << 10);
        b.trim(0, 64 << 10).unwrap();
        let mapped: u64 = b
            .extents(0, 1 << 20)
            .unwrap()
            .iter()
            .filter(|e| e.mapped)
            .map(|e| e.len)
            .sum();
        assert_eq!(mapped, 64 << 10, "the whole first grain was given back");
        b.read(1000, &mut back).unwrap();
        assert!(back[..64 * 1024 - 1000].iter().all(|&x| x == 0));
        assert_eq!(back[64 * 1024 - 1000..], data[64 * 1024 - 1000..]);
        assert!(b.read((1 << 20) - 1, &mut [0u8; 2]).is_err(), "past the end");
    }

    #[test]
    fn a_fixed_backend_stays_mapped_and_images_paste() {
        let b = RamBackend::new("ram", 1 << 20, 4096).fixed();
        b.write(0, &[7u8; 8192], true).unwrap();
        b.trim(0, 1 << 20).unwrap();
        assert!(b.extents(0, 1 << 20).unwrap().iter().all(|e| e.mapped));
        b.write(4096, &[9u8; 4096], false).unwrap();
        let img = b.freeze(&[(4096, 4096), (0, 4096)]).unwrap();
        assert_eq!(img.len(), 8192);
        b.paste(65536, img.as_ref(), 0, 8192).unwrap();
        let mut got = vec![0u8; 8192];
        b.read(65536, &mut got).unwrap();
        assert!(got[..4096].iter().all(|&x| x == 9) && got[4096..].iter().all(|&x| x == 0));
    }
}
