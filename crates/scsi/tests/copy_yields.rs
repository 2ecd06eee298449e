//! A long WRITE USING TOKEN gives way to a LUN reset (or a reservation change) at its next
//! chunk: they wait for the commands under way on the LUN, and every command after them waits
//! for them, so a copy of up to a TiB would otherwise hold the LUN for as long as it runs.
//! The copy stops with ABORTED COMMAND, for the initiator to send it again, having moved
//! whole chunks only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_scsi::{BlockBackend, Lun};
use tessera_test_support::cdbs;
use tessera_test_support::gated_ram::{Gated, GatedRam};

const MIB: u64 = 1 << 20;

#[test]
fn a_long_write_using_token_gives_way_to_a_reset_at_its_next_chunk() {
    let size = 256 * MIB;
    // Its pastes (a copy's chunks) wait at the gate, and are counted.
    let g = Arc::new(GatedRam::new("gated", size, 512, Gated::Pastes));
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
    g.close();
    std::thread::scope(|s| {
        let copy = s.spawn(|| {
            let (c, p) = cdbs::write_using_token(2, &token, 0, false, &[(128 * MIB / 512, blocks)]);
            lun.execute(&c, &p)
        });
        let waited = Instant::now();
        while g.reached() == 0 {
            assert!(waited.elapsed() < Duration::from_secs(30), "the copy never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A reset, while the copy's first chunk is under way: it waits for the copy.
        let reset = s.spawn(|| lun.wait_for_commands());
        while !lun.fence_wanted() {
            assert!(waited.elapsed() < Duration::from_secs(30), "the reset never waited");
            std::thread::sleep(Duration::from_millis(5));
        }
        g.open();
        let r = copy.join().unwrap();
        reset.join().unwrap();
        assert_eq!(r.status, 2, "the copy went on past the reset");
        assert_eq!(
            (r.sense[2] & 0x0F, r.sense[12], r.sense[13]),
            (0x0B, 0, 0),
            "ABORTED COMMAND"
        );
        assert_eq!(g.reached(), 1, "one chunk, not the whole copy");
    });
    // What it moved is reported, in whole chunks; sent again, the copy completes.
    let info = lun.execute(&cdbs::receive_rod_token_information(2), &[]).data.to_vec();
    let transferred = u64::from_be_bytes(info[16..24].try_into().unwrap());
    assert_eq!(transferred * 512, 64 * MIB, "{info:?}");
    let (c, p) = cdbs::write_using_token(3, &token, 0, false, &[(128 * MIB / 512, blocks)]);
    assert_eq!(lun.execute(&c, &p).status, 0);
    let mut back = vec![0u8; 4096];
    g.ram().read(128 * MIB, &mut back).unwrap();
    assert_eq!(back, vec![0x5Au8; 4096]);
}
