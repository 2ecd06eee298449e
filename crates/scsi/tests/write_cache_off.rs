//! MODE SELECT that turns the write cache off answers only once the writes that saw it on
//! have ended, and its flush covers them: a host that then stops sending SYNCHRONIZE CACHE
//! loses nothing such a write was answered for. (Before 2026-12-04 the flush could run while
//! such a write was still on its way, which then ended without ever being flushed.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_scsi::Lun;
use tessera_test_support::gated_ram::{Gated, GatedRam};

const MIB: u64 = 1 << 20;

#[test]
fn turning_the_write_cache_off_waits_for_the_writes_that_saw_it_on_and_flushes_them() {
    // Its writes wait at the gate; it records its writes and flushes in order.
    let gated = Arc::new(GatedRam::new("gated", 4 * MIB, 512, Gated::Writes));
    gated.close();
    let lun = Arc::new(Lun::new(gated.clone(), 9, false));
    // The caching page as it is (write cache on, the default), then with WCE cleared.
    let sensed = lun.execute(&[0x1A, 0x08, 0x08, 0, 255, 0], &[]);
    assert_eq!(sensed.status, 0);
    assert_ne!(sensed.data[4 + 2] & 0x04, 0, "the write cache is on");
    let mut select = vec![0u8; 4];
    select.extend_from_slice(&sensed.data[4..]);
    select[4 + 2] &= !0x04;
    let write = {
        let lun = lun.clone();
        std::thread::spawn(move || lun.execute(&[0x2A, 0, 0, 0, 0, 8, 0, 0, 1, 0], &[0x5A; 512]))
    };
    let start = Instant::now();
    while gated.reached() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the write never reached the backend"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let off = {
        let lun = lun.clone();
        let cdb = [0x15, 0x10, 0, 0, select.len() as u8, 0];
        std::thread::spawn(move || lun.execute(&cdb, &select))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !off.is_finished(),
        "MODE SELECT answered while a write that saw the cache on was still on its way"
    );
    gated.open();
    assert_eq!(write.join().unwrap().status, 0);
    assert_eq!(off.join().unwrap().status, 0);
    assert_eq!(
        gated.events(),
        vec!["write", "flush"],
        "the flush of MODE SELECT covers the write"
    );
    // Writes from now on are durable when answered.
    gated.forget_events();
    assert_eq!(lun.execute(&[0x2A, 0, 0, 0, 0, 9, 0, 0, 1, 0], &[0x5A; 512]).status, 0);
    assert_eq!(gated.events(), vec!["durable write"]);
}
