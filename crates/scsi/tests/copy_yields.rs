//! A long WRITE USING TOKEN gives way to a LUN reset (or a reservation change) at its next
//! chunk: they wait for the commands under way on the LUN, and every command after them waits
//! for them, so a copy of up to a TiB would otherwise hold the LUN for as long as it runs.
//! The copy stops with ABORTED COMMAND, for the initiator to send it again, having moved
//! whole chunks only.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tessera_scsi::{BackendResult, BlockBackend, Extent, FrozenImage, Lun, RamBackend};
use tessera_test_support::cdbs;

const MIB: u64 = 1 << 20;

/// A RAM backend whose pastes (a copy's chunks) wait at a gate, and are counted.
struct Gated {
    ram: RamBackend,
    open: Mutex<bool>,
    opened: Condvar,
    pastes: AtomicUsize,
}

impl BlockBackend for Gated {
    fn name(&self) -> String {
        self.ram.name()
    }
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn physical_block_size(&self) -> u32 {
        self.ram.physical_block_size()
    }
    fn grain_size(&self) -> u64 {
        self.ram.grain_size()
    }
    fn thin(&self) -> bool {
        self.ram.thin()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> BackendResult<()> {
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], durable: bool) -> BackendResult<()> {
        self.ram.write(offset, data, durable)
    }
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool, durable: bool) -> BackendResult<()> {
        self.ram.write_zeroes(offset, len, unmap, durable)
    }
    fn trim(&self, offset: u64, len: u64) -> BackendResult<()> {
        self.ram.trim(offset, len)
    }
    fn flush(&self) -> BackendResult<()> {
        self.ram.flush()
    }
    fn extents(&self, offset: u64, len: u64) -> BackendResult<Vec<Extent>> {
        self.ram.extents(offset, len)
    }
    fn freeze(&self, ranges: &[(u64, u64)]) -> BackendResult<Box<dyn FrozenImage>> {
        self.ram.freeze(ranges)
    }
    fn paste(&self, at: u64, image: &dyn FrozenImage, from: u64, len: u64) -> BackendResult<()> {
        self.pastes.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        drop(open);
        self.ram.paste(at, image, from, len)
    }
}

#[test]
fn a_long_write_using_token_gives_way_to_a_reset_at_its_next_chunk() {
    let size = 256 * MIB;
    let g = Arc::new(Gated {
        ram: RamBackend::new("gated", size, 512),
        open: Mutex::new(true),
        opened: Condvar::new(),
        pastes: AtomicUsize::new(0),
    });
    let lun = Arc::new(Lun::new(g.clone(), 7, false));
    // Past the power-on unit attention.
    let _ = lun.execute(&[0u8; 6], &[]);
    lun.execute(&[0x2A, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[0x5Au8; 4096]);
    // A token of the first 96 MiB (two chunks: 64 MiB and 32), pasted at 128 MiB.
    let blocks = (96 * MIB / 512) as u32;
    let (c, p) = cdbs::populate_token(1, 60, &[(0, blocks)]);
    assert_eq!(lun.execute(&c, &p).status, 0);
    let info = lun.execute(&cdbs::receive_rod_token_information(1), &[]).data.to_vec();
    let token = cdbs::token_of(&info);
    *g.open.lock() = false;
    std::thread::scope(|s| {
        let copy = s.spawn(|| {
            let (c, p) = cdbs::write_using_token(2, &token, 0, false, &[(128 * MIB / 512, blocks)]);
            lun.execute(&c, &p)
        });
        let waited = Instant::now();
        while g.pastes.load(Ordering::SeqCst) == 0 {
            assert!(waited.elapsed() < Duration::from_secs(30), "the copy never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A reset, while the copy's first chunk is under way: it waits for the copy.
        let reset = s.spawn(|| lun.wait_for_commands());
        while !lun.fence_wanted() {
            assert!(waited.elapsed() < Duration::from_secs(30), "the reset never waited");
            std::thread::sleep(Duration::from_millis(5));
        }
        *g.open.lock() = true;
        g.opened.notify_all();
        let r = copy.join().unwrap();
        reset.join().unwrap();
        assert_eq!(r.status, 2, "the copy went on past the reset");
        assert_eq!(
            (r.sense[2] & 0x0F, r.sense[12], r.sense[13]),
            (0x0B, 0, 0),
            "ABORTED COMMAND"
        );
        assert_eq!(g.pastes.load(Ordering::SeqCst), 1, "one chunk, not the whole copy");
    });
    // What it moved is reported, in whole chunks; sent again, the copy completes.
    let info = lun.execute(&cdbs::receive_rod_token_information(2), &[]).data.to_vec();
    let transferred = u64::from_be_bytes(info[16..24].try_into().unwrap());
    assert_eq!(transferred * 512, 64 * MIB, "{info:?}");
    let (c, p) = cdbs::write_using_token(3, &token, 0, false, &[(128 * MIB / 512, blocks)]);
    assert_eq!(lun.execute(&c, &p).status, 0);
    let mut back = vec![0u8; 4096];
    g.ram.read(128 * MIB, &mut back).unwrap();
    assert_eq!(back, vec![0x5Au8; 4096]);
}
