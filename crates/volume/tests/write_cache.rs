//! The write-back cache against an attacker's and an operator's cases: a cache disk pulled
//! or failed under load, the cache full under a sustained load, stripe rows gathered whole,
//! overwrites merged, a vdisk's cache switched off with data still in the log, cache disks
//! retired, and restarts with data in the log.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{pattern, spec, Rig, MIB};
use std::sync::Arc;

use tessera_disk::BlockDevice;
use tessera_pool::{MetaBatch, CF_POOL};
use tessera_volume::{DiskState, LayoutKind, Provisioning, Vdisk};

const DATA_DISKS: usize = 5;

fn rig(cache: usize) -> Rig {
    Rig::with_cache(DATA_DISKS, 64 * MIB, MIB, cache)
}

/// Two data disks and one cache disk whose data waits in the log (none destaged for its age),
/// and a 4 MiB vdisk "v" of one column, which that one log takes: where the tests of a lost or
/// stuck log start.
fn one_log_disk() -> (Rig, Arc<Vdisk>) {
    let rig = Rig::with_cache(2, 64 * MIB, MIB, 1);
    // Held: a log of one copy is otherwise destaged at once.
    rig.engine().cache().hold_destage(true);
    let mut s = spec("v", 4 * MIB, LayoutKind::Simple, Provisioning::Thin);
    s.columns = Some(1);
    let v = rig.engine().create_vdisk(&s).unwrap();
    (rig, v)
}

/// A log of one copy is destaged at once, unless the destager is held; then its data waits
/// until the destager is let go again (what the tests built on `one_log_disk` rely on).
#[test]
fn a_held_destager_leaves_a_log_of_one_copy_alone_until_let_go() {
    let (rig, v) = one_log_disk();
    let e = rig.engine();
    v.write(0, &pattern(1, 0, 256 << 10), true).unwrap();
    // Several of the destager's 100 ms ticks.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(e.cache_status().dirty_bytes, 256 << 10, "destaged while held");
    e.cache().hold_destage(false);
    let t = std::time::Instant::now();
    while e.cache_status().dirty_bytes > 0 {
        assert!(t.elapsed() < Duration::from_secs(30), "not destaged once let go");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut got = vec![0u8; 256 << 10];
    v.read(0, &mut got).unwrap();
    assert_same(&got, &pattern(1, 0, 256 << 10), "after the destage");
}

/// Two data disks and two cache disks whose data waits in the log (none destaged for its age;
/// with two log disks nothing else forces it out), and a 4 MiB simple vdisk "v" of one column.
fn two_data_disks_two_log_disks() -> (Rig, Arc<Vdisk>) {
    let rig = Rig::with_cache(2, 64 * MIB, MIB, 2);
    rig.engine().cache().set_destage_delay(Duration::from_secs(3600));
    let mut s = spec("v", 4 * MIB, LayoutKind::Simple, Provisioning::Thin);
    s.columns = Some(1);
    let v = rig.engine().create_vdisk(&s).unwrap();
    (rig, v)
}

/// The path of the one data disk that holds slabs.
fn only_data_disk_in_use(e: &tessera_volume::Engine) -> String {
    let used: Vec<String> = e
        .pool()
        .disks()
        .iter()
        .filter(|d| d.used_bytes > 0 && d.info.usage == tessera_volume::DiskUsage::Data)
        .map(|d| d.info.path.clone())
        .collect();
    assert_eq!(used.len(), 1, "{used:?}");
    used.into_iter().next().expect("one")
}

fn read_all(rig: &Rig, name: &str, size: usize) -> Vec<u8> {
    let mut got = vec![0u8; size];
    rig.engine().vdisk(name).unwrap().read(0, &mut got).unwrap();
    got
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {at}");
    }
}

/// Four writers fill a parity vdisk while a disk of the log is pulled, then another is failed
/// by the administrator: every acknowledged write reads back, before and after a restart, and
/// the log is on two disks again after each loss (the third cache disk, then a new one added).
#[test]
fn losing_cache_disks_under_load_loses_nothing() {
    let mut rig = rig(3);
    let size = 4 * MIB as usize;
    rig.engine()
        .create_vdisk(&spec("v", size as u64, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let model = parking_lot::Mutex::new(vec![0u8; size]);
    let pulled = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (rig, model, rounds) = (&rig, &model, &rounds);
            s.spawn(move || {
                let v = rig.engine().vdisk("v").unwrap();
                // Each writer has its own quarter, so the model needs no ordering between them.
                let base = t * size as u64 / 4;
                for i in 0..400u64 {
                    let off = base + (i * 7 % 256) * 4096;
                    let data = pattern(t * 1000 + i, off, 4096);
                    v.write(off, &data, i % 50 == 0).unwrap();
                    model.lock()[off as usize..off as usize + 4096].copy_from_slice(&data);
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // The puller: once the writers are well under way.
        let (rig, pulled, rounds) = (&rig, &pulled, &rounds);
        s.spawn(move || {
            while rounds.load(Ordering::Relaxed) < 400 {
                std::thread::yield_now();
            }
            rig.disks[DATA_DISKS].faults().pull();
            pulled.store(true, Ordering::Release);
        });
    });
    assert!(pulled.load(Ordering::Acquire));
    // Noticed at the latest by a flush.
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    let st = rig.engine().cache_status();
    assert_eq!(
        st.devices.len(),
        2,
        "the log was not rebuilt onto the third cache disk: {st:?}"
    );
    assert!(!st.devices.contains(&(DATA_DISKS as u32)), "{st:?}");
    assert_eq!(rig.engine().pool().disk_state(DATA_DISKS as u32), DiskState::Failed);
    let want = model.into_inner();
    assert_same(&read_all(&rig, "v", size), &want, "after the pull");

    // A second loss, by the administrator, with data still in the log: no third disk left to
    // take its place, so the log runs on one copy and a parity vdisk writes through.
    let before = rig.engine().cache_status();
    assert!(before.dirty_bytes > 0 || before.destaged_bytes > 0, "{before:?}");
    rig.engine().fail_disk("cache1").unwrap();
    let st = rig.engine().cache_status();
    assert_eq!(st.devices, vec![DATA_DISKS as u32 + 2], "{st:?}");
    assert!(!st.redundant);
    // (A range the log still holds goes through it all the same, so a fresh vdisk shows it.)
    rig.engine()
        .create_vdisk(&spec("w", MIB, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let through = st.write_through_writes;
    let w = rig.engine().vdisk("w").unwrap();
    w.write(0, &pattern(77, 0, 65536), false).unwrap();
    assert!(
        rig.engine().cache_status().write_through_writes > through,
        "a resilient vdisk kept caching on a single copy of the log"
    );
    assert_same(&read_all(&rig, "w", 65536), &pattern(77, 0, 65536), "written through");
    drop(w);
    let v = rig.engine().vdisk("v").unwrap();
    let mut want = want;
    assert_same(&read_all(&rig, "v", size), &want, "after the second loss");

    // A new cache disk restores the second copy; a restart replays whatever is left.
    let d = tessera_disk::FaultyDisk::new(std::sync::Arc::new(tessera_disk::MemDisk::new("cache9", 66 * MIB)) as _);
    rig.engine().add_cache_disk(d.clone() as _).unwrap();
    rig.disks.push(d);
    assert!(rig.engine().cache_status().redundant);
    v.write(0, &pattern(78, 0, 8192), false).unwrap();
    want[..8192].copy_from_slice(&pattern(78, 0, 8192));
    drop(v);
    rig.reopen();
    assert_same(&read_all(&rig, "v", size), &want, "after the restart");
    rig.assert_consistent();
}

/// A vdisk with a small budget under a sustained load: writes wait for the destager and never
/// fail, its dirty data stays within the budget, and everything reads back.
#[test]
fn a_full_cache_slows_writes_to_the_destage_rate() {
    let rig = rig(2);
    let size = 32 * MIB as usize;
    let mut s = spec("v", size as u64, LayoutKind::Parity, Provisioning::Thin);
    s.write_cache_size = Some(2 * MIB);
    rig.engine().create_vdisk(&s).unwrap();
    let v = rig.engine().vdisk("v").unwrap();
    let id = v.id();
    let mut want = vec![0u8; size];
    let (mut most, mut slowest) = (0u64, Duration::ZERO);
    for i in 0..(size / 65536) as u64 {
        let off = (i * 37 % (size as u64 / 65536)) * 65536;
        let data = pattern(i, off, 65536);
        let t = Instant::now();
        v.write(off, &data, false).unwrap();
        slowest = slowest.max(t.elapsed());
        want[off as usize..off as usize + 65536].copy_from_slice(&data);
        most = most.max(rig.engine().cache().dirty_bytes(id));
    }
    let st = rig.engine().cache_status();
    eprintln!("slowest write {slowest:?}; most dirty {most} bytes; {st:?}");
    assert!(st.throttled_writes > 0, "no write waited for the destager: {st:?}");
    // One write past the budget at most: a write waits only while the budget is spent.
    assert!(most <= 2 * MIB + 65536 + 16384, "{most} dirty bytes for a 2 MiB budget");
    assert_same(&read_all(&rig, "v", size), &want, "after a sustained load");
    rig.assert_consistent();
}

/// 4 KiB writes that together cover whole stripe rows reach a parity layout as full-stripe
/// writes: destaging them reads nothing from the data disks.
#[test]
fn small_writes_are_destaged_as_full_stripes_without_reads() {
    let rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    // 3 data columns of 16 KiB: a row is 48 KiB; 16 KiB grains, so 3 grains a row.
    let size = 480 << 10;
    e.create_vdisk(&spec("v", size, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let v = e.vdisk("v").unwrap();
    let mut want = vec![0u8; size as usize];
    // Every 4 KiB block once, in a scattered order.
    let blocks = size / 4096;
    for i in 0..blocks {
        let off = (i * 53 % blocks) * 4096;
        let data = pattern(i, off, 4096);
        v.write(off, &data, false).unwrap();
        want[off as usize..off as usize + 4096].copy_from_slice(&data);
    }
    let st = e.cache_status();
    assert!(st.dirty_bytes >= size, "the writes were not held by the cache: {st:?}");
    assert_same(&read_all(&rig, "v", size as usize), &want, "served from the cache");
    for d in &rig.disks[..DATA_DISKS] {
        d.faults().reset_counters();
    }
    e.cache().drain().unwrap();
    let reads: u64 = rig.disks[..DATA_DISKS].iter().map(|d| d.faults().reads()).sum();
    assert_eq!(reads, 0, "destaging whole rows read from the data disks");
    assert_eq!(e.cache_status().dirty_bytes, 0);
    assert_same(&read_all(&rig, "v", size as usize), &want, "after the destage");
    for set in e.layouts().sets() {
        assert!(e.layouts().scrub_set(&set).unwrap().is_empty(), "parity out of step");
    }
}

/// A range written again while it waits in the cache is destaged once, with its last data.
#[test]
fn overwrites_in_the_cache_are_merged() {
    let rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    e.create_vdisk(&spec("v", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let v = e.vdisk("v").unwrap();
    for round in 0..10 {
        v.write(0, &pattern(round, 0, 65536), false).unwrap();
    }
    let st = e.cache_status();
    assert!(st.overwritten_bytes >= 9 * 65536, "{st:?}");
    e.cache().drain().unwrap();
    let st = e.cache_status();
    assert!(
        st.destaged_bytes <= 65536,
        "destaged {} bytes for one 64 KiB range",
        st.destaged_bytes
    );
    assert_same(&read_all(&rig, "v", 65536), &pattern(9, 0, 65536), "merged");
}

/// A vdisk whose cache is switched off while the log still holds some of its writes: later
/// writes to those ranges still go through the log (else a restart would replay the older
/// copy over them), writes elsewhere go straight to the layout, and a restart reads the last
/// data everywhere.
#[test]
fn switching_a_vdisk_cache_off_never_brings_old_data_back() {
    let mut rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    e.create_vdisk(&spec("v", 4 * MIB, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let v = e.vdisk("v").unwrap();
    v.write(0, &pattern(1, 0, 65536), false).unwrap();
    v.write(MIB, &pattern(2, MIB, 65536), false).unwrap();
    e.set_write_cache("v", 0).unwrap();
    let through = e.cache_status().write_through_writes;
    v.write(0, &pattern(3, 0, 16384), true).unwrap();
    v.write(2 * MIB, &pattern(4, 2 * MIB, 65536), true).unwrap();
    assert!(e.cache_status().write_through_writes > through);
    drop(v);
    rig.reopen();
    let got = read_all(&rig, "v", 4 * MIB as usize);
    let mut want = vec![0u8; 4 * MIB as usize];
    want[..65536].copy_from_slice(&pattern(1, 0, 65536));
    want[..16384].copy_from_slice(&pattern(3, 0, 16384));
    want[MIB as usize..MIB as usize + 65536].copy_from_slice(&pattern(2, MIB, 65536));
    want[2 * MIB as usize..2 * MIB as usize + 65536].copy_from_slice(&pattern(4, 2 * MIB, 65536));
    assert_same(&got, &want, "after the restart");
    assert_eq!(rig.engine().vdisk("v").unwrap().config().write_cache_size, Some(0));
    rig.assert_consistent();
}

/// Retiring the cache disks one by one: the first leaves the log at once (the other holds a
/// copy), the last only after the log was destaged; nothing is lost and the pool goes on
/// without a cache.
#[test]
fn retiring_cache_disks_destages_before_the_last_copy_goes() {
    let mut rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    e.create_vdisk(&spec("v", 4 * MIB, LayoutKind::Simple, Provisioning::Thin))
        .unwrap();
    let v = e.vdisk("v").unwrap();
    v.write(0, &pattern(5, 0, MIB as usize), false).unwrap();
    e.retire_disk("cache0").unwrap();
    let st = e.cache_status();
    assert_eq!(st.devices, vec![DATA_DISKS as u32 + 1]);
    assert!(st.dirty_bytes > 0, "{st:?}");
    e.retire_disk("cache1").unwrap();
    let st = e.cache_status();
    assert!(st.devices.is_empty() && st.dirty_bytes == 0, "{st:?}");
    v.write(MIB, &pattern(6, MIB, 65536), true).unwrap();
    drop(v);
    rig.reopen();
    let got = read_all(&rig, "v", 2 * MIB as usize);
    let mut want = vec![0u8; 2 * MIB as usize];
    want[..MIB as usize].copy_from_slice(&pattern(5, 0, MIB as usize));
    want[MIB as usize..MIB as usize + 65536].copy_from_slice(&pattern(6, MIB, 65536));
    assert_same(&got, &want, "after retiring the cache");
    rig.assert_consistent();
}

/// Without a cache disk left to hold a second copy, a mirror's writes do not wait in a
/// single copy of the log; a simple vdisk, which tolerates no loss anyway, still caches.
#[test]
fn one_cache_disk_caches_only_what_tolerates_no_failure() {
    let rig = rig(1);
    let e = rig.engine();
    e.create_vdisk(&spec("m", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    e.create_vdisk(&spec("s", 4 * MIB, LayoutKind::Simple, Provisioning::Thin))
        .unwrap();
    e.vdisk("m").unwrap().write(0, &pattern(1, 0, 65536), false).unwrap();
    let st = e.cache_status();
    assert_eq!((st.cached_writes, st.write_through_writes > 0), (0, true), "{st:?}");
    e.vdisk("s").unwrap().write(0, &pattern(2, 0, 65536), false).unwrap();
    assert_eq!(e.cache_status().cached_writes, 1);
    assert_same(&read_all(&rig, "m", 65536), &pattern(1, 0, 65536), "mirror");
    assert_same(&read_all(&rig, "s", 65536), &pattern(2, 0, 65536), "simple");
}

/// Two vdisks of one layout share slab sets, so their grains share stripe rows: one caches,
/// the other bypasses the cache. The destager writes rows whole (reading their clean parts
/// from the layout) while the second writes straight to those rows: neither loses a write.
#[test]
fn whole_row_destages_never_undo_writes_that_bypass_the_cache() {
    let rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::ZERO);
    let size = 4 * MIB;
    e.create_vdisk(&spec("a", size, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let mut b = spec("b", size, LayoutKind::Parity, Provisioning::Thin);
    b.write_cache_size = Some(0);
    e.create_vdisk(&b).unwrap();
    let grain = 16384u64;
    let models: Vec<parking_lot::Mutex<Vec<u8>>> = (0..2)
        .map(|_| parking_lot::Mutex::new(vec![0u8; size as usize]))
        .collect();
    std::thread::scope(|s| {
        for (t, name) in ["a", "b"].into_iter().enumerate() {
            let (e, models) = (e, &models);
            s.spawn(move || {
                let v = e.vdisk(name).unwrap();
                for round in 0..6u64 {
                    // Grain by grain, so both vdisks take slots in turn in the same rows; then
                    // 4 KiB writes all over.
                    for g in 0..size / grain {
                        let len = if round == 0 { grain } else { 4096 };
                        let off = if round == 0 {
                            g * grain
                        } else {
                            (g * 7 + round) % (size / 4096) * 4096
                        };
                        let data = pattern(round * 100 + t as u64, off, len as usize);
                        v.write(off, &data, false).unwrap();
                        models[t].lock()[off as usize..(off + len) as usize].copy_from_slice(&data);
                    }
                }
            });
        }
    });
    let st = e.cache_status();
    assert!(st.write_through_writes > 0 && st.cached_writes > 0, "{st:?}");
    for (t, name) in ["a", "b"].into_iter().enumerate() {
        let want = models[t].lock().clone();
        assert_same(&read_all(&rig, name, size as usize), &want, name);
    }
    e.cache().drain().unwrap();
    for (t, name) in ["a", "b"].into_iter().enumerate() {
        let want = models[t].lock().clone();
        assert_same(&read_all(&rig, name, size as usize), &want, name);
    }
    for set in e.layouts().sets() {
        assert!(e.layouts().scrub_set(&set).unwrap().is_empty(), "parity out of step");
    }
}

/// The front ends' fast read path submits disk reads itself: it must never be planned over
/// data the log holds, which is not on the disks yet. (Plans need file disks.)
#[test]
fn read_plans_are_refused_over_cached_data() {
    use std::sync::Arc;
    use tessera_disk::{DiskRef, FileDisk};
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, size: u64| -> DiskRef {
        Arc::new(FileDisk::create_file(dir.path().join(name), size, false).unwrap())
    };
    let disks: Vec<DiskRef> = (0..3).map(|i| file(&format!("d{i}"), 64 * MIB)).collect();
    let e = tessera_volume::Engine::create_pool(&dir.path().join("pool"), "p", disks, MIB).unwrap();
    for i in 0..2 {
        e.add_cache_disk(file(&format!("c{i}"), 66 * MIB)).unwrap();
    }
    e.cache().set_destage_delay(Duration::from_secs(3600));
    let mut s = spec("v", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin);
    s.block_size = Some(4096);
    e.create_vdisk(&s).unwrap();
    let v = e.vdisk("v").unwrap();
    v.write(0, &pattern(1, 0, 65536), false).unwrap();
    e.cache().drain().unwrap();
    if !tessera_disk::io_uring_available() {
        eprintln!("io_uring is not available here: no read plans to test");
        return;
    }
    assert!(v.try_plan_read(0, 65536).is_some(), "a destaged range can be planned");
    v.write(16384, &pattern(2, 16384, 4096), false).unwrap();
    assert!(v.try_plan_read(0, 65536).is_none(), "a plan over data still in the log");
    assert!(v.try_plan_read(0, 16384).is_some(), "the clean part before it");
    e.cache().drain().unwrap();
    assert!(v.try_plan_read(0, 65536).is_some(), "destaged now");
}

/// The log's only disk is pulled while writers keep several batches in flight: the batches
/// that fail take those behind them along (a replay could not reach them), nobody hangs, the
/// writers' flush says that cached data was lost, and from then on writes go straight to the
/// layouts and read back, before and after a restart.
#[test]
fn losing_the_logs_only_disk_with_batches_in_flight_fails_them_in_order() {
    let mut rig = Rig::with_cache(2, 64 * MIB, MIB, 1);
    let log = rig.disks.len() - 1;
    let size = 4 * MIB as usize;
    let mut s = spec("v", size as u64, LayoutKind::Simple, Provisioning::Thin);
    s.columns = Some(1);
    rig.engine().create_vdisk(&s).unwrap();
    rig.disks[log].faults().set_latency(Duration::from_millis(2));
    let rounds = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..8u64 {
            let (rig, rounds, failed) = (&rig, &rounds, &failed);
            sc.spawn(move || {
                let v = rig.engine().vdisk("v").unwrap();
                let base = t * size as u64 / 8;
                for i in 0..120u64 {
                    let off = base + (i % 128) * 4096;
                    if v.write(off, &pattern(t * 1000 + i, off, 4096), false).is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let (rig, rounds) = (&rig, &rounds);
        sc.spawn(move || {
            while rounds.load(Ordering::Relaxed) < 300 {
                std::thread::yield_now();
            }
            rig.disks[log].faults().pull();
        });
    });
    assert!(rig.engine().cache_status().devices.is_empty());
    let v = rig.engine().vdisk("v").unwrap();
    assert!(v.flush().is_err(), "cached writes were lost with the log's only disk");
    // Said once; what follows goes straight to the layouts.
    let want = pattern(9, 0, size);
    v.write(0, &want, false).unwrap();
    v.flush().unwrap();
    assert_same(&read_all(&rig, "v", size), &want, "after the loss");
    drop(v);
    rig.reopen();
    assert_same(&read_all(&rig, "v", size), &want, "after a restart");
    rig.assert_consistent();
}

/// A destage round stays within its bounds (the oldest batches' data, pieces written alone,
/// whole rows), however many half-dirty rows the cache holds: a writer waiting for room waits
/// for one bounded round, not for every row the log's oldest pieces touch.
#[test]
fn destage_rounds_stay_within_their_bounds() {
    let rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    let size = 24 * MIB as usize;
    let vspec = spec("v", size as u64, LayoutKind::Parity, Provisioning::Thin);
    e.create_vdisk(&vspec).unwrap();
    let v = e.vdisk("v").unwrap();
    // Before any write: the log half full starts a destage while the writes go on.
    let (oldest, pieces, rows) = (MIB, 64, 2 * MIB);
    e.cache().set_round_bounds(oldest, pieces, rows);
    // Scattered 4 KiB writes over three quarters of the vdisk's blocks: most rows end up at
    // least half dirty, so the oldest pieces touch rows worth writing whole everywhere.
    let blocks = size / 4096;
    let mut want = vec![0u8; size];
    for i in 0..blocks * 3 / 4 {
        let off = (i * 7919 % blocks) * 4096;
        let data = pattern(i as u64, off as u64, 4096);
        v.write(off as u64, &data, false).unwrap();
        want[off..off + 4096].copy_from_slice(&data);
    }
    let dirty = e.cache_status().dirty_bytes + e.cache_status().destaged_bytes;
    assert!(dirty >= 16 * MIB, "{dirty} bytes dirty");
    e.cache().drain().unwrap();
    let st = e.cache_status();
    let row = e.layouts().sets().iter().map(|s| s.spec.row_bytes()).max().unwrap();
    // Whole rows up to the bound and the one that crossed it, and the pieces alone: a piece
    // is at most a grain, as the first write into a grain writes it whole (its 4 KiB and the
    // zeros around them), and what later writes leave of it may go alone.
    let grain = vspec.grain_size.unwrap();
    let bound = rows + row + pieces as u64 * grain;
    assert!(
        st.largest_destage_round_bytes <= bound,
        "a round wrote {} bytes, more than {bound}: {st:?}",
        st.largest_destage_round_bytes
    );
    assert!(st.destage_rounds as u64 >= dirty / bound, "{st:?}");
    assert_eq!(st.dirty_bytes, 0, "{st:?}");
    assert_same(&read_all(&rig, "v", size), &want, "after bounded rounds");
    rig.assert_consistent();
}

/// The destager reads each piece from the first disk of the log that holds it intact: where
/// the first copy is rotten, every piece comes from the other copy, and the layout gets the
/// data the host wrote.
#[test]
fn destaging_reads_around_a_rotten_log_copy() {
    let mut rig = rig(2);
    let size = 4 * MIB as usize;
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    e.create_vdisk(&spec("v", size as u64, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let v = e.vdisk("v").unwrap();
    let mut model = vec![0u8; size];
    for i in 0..300u64 {
        let off = (i * 37 % (size as u64 / 4096)) * 4096;
        let data = pattern(500 + i, off, 4096);
        v.write(off, &data, false).unwrap();
        model[off as usize..off as usize + 4096].copy_from_slice(&data);
    }
    let first = e.cache_status().devices[0] as usize;
    // A bit of every 4 KiB block of the first copy's ring, wherever the batches went.
    let ring = 4 * MIB.max(e.cache_status().log_used_bytes);
    for at in (0..ring).step_by(4096) {
        rig.disks[first]
            .faults()
            .flip_bit(tessera_disk::DATA_OFFSET + at + 100, 3)
            .unwrap();
    }
    e.cache().drain().unwrap();
    assert_eq!(e.cache_status().dirty_bytes, 0);
    drop(v);
    // After a restart nothing is left in the log: every read comes from the layout.
    rig.reopen();
    assert_same(
        &read_all(&rig, "v", size),
        &model,
        "after the destage from the other copy",
    );
    rig.assert_consistent();
}

/// Data the write-back log held, flushed (so durable there, with the grain maps pointing at
/// it committed) and not destaged, when the log lost its only disk: it never reads as what the
/// pool's disks held before, neither before a restart nor after one (the ranges lost are kept
/// in the pool's metadata); a write over part of it makes that part readable, durably; once
/// all of it is written again, nothing is refused. The destager does not retry data that is
/// gone. (That a planned write never goes around this: crates/volume/tests/write_plans.rs.)
#[test]
fn data_lost_with_the_logs_only_disk_stays_refused_across_restarts_until_written_again() {
    const G: u64 = 64 << 10;
    let (mut rig, v) = one_log_disk();
    let log = rig.disks.len() - 1;
    // On the pool's disks: the first four grains.
    v.write(0, &pattern(1, 0, 4 * G as usize), true).unwrap();
    rig.engine().cache().drain().unwrap();
    // In the log only: an overwrite of the first grain, and a grain not written before.
    v.write(0, &pattern(2, 0, G as usize), true).unwrap();
    v.write(MIB, &pattern(3, MIB, G as usize), true).unwrap();
    assert_eq!(rig.engine().cache_status().dirty_bytes, 2 * G);
    rig.disks[log].faults().pull();
    assert!(
        rig.engine().flush().is_err(),
        "the flush that found the log gone says so"
    );
    assert!(rig.engine().cache_status().devices.is_empty());
    drop(v);

    let refused = |rig: &Rig, at: u64, len: u64, when: &str| {
        let v = rig.engine().vdisk("v").unwrap();
        let mut buf = vec![0u8; len as usize];
        match v.read(at, &mut buf) {
            Ok(()) => panic!("{when}: {len} bytes at {at}, lost with the log, were read"),
            Err(e) => assert!(e.to_string().contains("is lost:"), "{when}: {e}"),
        }
    };
    let reads = |rig: &Rig, at: u64, want: &[u8], when: &str| {
        let mut got = vec![0u8; want.len()];
        rig.engine().vdisk("v").unwrap().read(at, &mut got).unwrap();
        assert_same(&got, want, when);
    };
    for when in ["after the loss", "after a restart"] {
        refused(&rig, 0, 4096, when);
        refused(&rig, G - 512, 1024, when);
        refused(&rig, MIB + G / 2, 4096, when);
        reads(&rig, G, &pattern(1, G, 3 * G as usize), when);
        assert_eq!(rig.engine().cache_status().lost_bytes, 2 * G, "{when}");
        if when == "after the loss" {
            let errors = rig.engine().cache_status().destage_errors;
            std::thread::sleep(Duration::from_millis(600));
            assert_eq!(
                rig.engine().cache_status().destage_errors,
                errors,
                "the destager retries lost data"
            );
            rig.reopen();
        }
    }
    let v = rig.engine().vdisk("v").unwrap();
    // Part of the first grain written again, and flushed: it reads, the rest stays refused.
    v.write(4096, &pattern(4, 4096, 8192), false).unwrap();
    reads(&rig, 4096, &pattern(4, 4096, 8192), "written again");
    refused(&rig, 0, 4096, "beside what was written again");
    v.flush().unwrap();
    drop(v);
    rig.reopen();
    reads(&rig, 4096, &pattern(4, 4096, 8192), "written again, after a restart");
    refused(&rig, 0, 512, "beside what was written again, after a restart");
    refused(&rig, 12288, 4096, "after what was written again, after a restart");
    assert_eq!(rig.engine().cache_status().lost_bytes, 2 * G - 8192);

    // All of it written again: nothing is refused, before a restart or after.
    let v = rig.engine().vdisk("v").unwrap();
    v.write(0, &pattern(5, 0, G as usize), false).unwrap();
    v.write(MIB, &pattern(6, MIB, G as usize), true).unwrap();
    assert_eq!(rig.engine().cache_status().lost_bytes, 0);
    drop(v);
    rig.reopen();
    assert_eq!(rig.engine().cache_status().lost_bytes, 0);
    reads(&rig, 0, &pattern(5, 0, G as usize), "the first grain");
    reads(&rig, MIB, &pattern(6, MIB, G as usize), "the new grain");
    rig.assert_consistent();
}

/// A write to a grain a snapshot shares, part of whose old content the write-back log lost
/// with its only disk: the copy on write reads the rest of the grain around what was lost,
/// and the new slot has those bytes recorded lost (not written). The write lands; the lost
/// bytes fail to read in the vdisk and in the snapshot, across a restart, until the vdisk
/// writes them again. Before, the copy on write failed on them, and with it every write to
/// the rest of the grain for as long as the snapshot lived.
#[test]
fn a_copy_on_write_of_a_grain_part_of_which_the_log_lost_goes_on_around_it() {
    let (mut rig, v) = one_log_disk();
    let g = v.grain_size() as usize;
    assert!(g >= 4 * 4096, "a grain of {g} bytes");
    let log = rig.disks.len() - 1;
    // On the pool's disks: the first grain.
    v.write(0, &pattern(1, 0, g), true).unwrap();
    rig.engine().cache().drain().unwrap();
    // In the log only: its first 4 KiB written again, then lost with the log's disk.
    v.write(0, &pattern(2, 0, 4096), true).unwrap();
    rig.disks[log].faults().pull();
    assert!(rig.engine().flush().is_err());
    assert_eq!(rig.engine().cache_status().lost_bytes, 4096);
    rig.engine().snapshot("v", "s").unwrap();
    // The same grain, written beside what was lost.
    let data = pattern(3, 2 * 4096, 4096);
    v.write(2 * 4096, &data, true)
        .expect("a write to a snapshot-shared grain part of which the log lost failed");
    let mut want = pattern(1, 0, g);
    let before = want.clone();
    want[2 * 4096..2 * 4096 + 4096].copy_from_slice(&data);
    drop(v);
    let check = |rig: &Rig, what: &str| {
        for (name, want) in [("v", &want), ("v@s", &before)] {
            let d = rig.engine().vdisk(name).unwrap();
            for (at, len) in [(0, 4096), (2048, 512), (0, 4096 + 512)] {
                let mut got = vec![0u8; len];
                let err = d.read(at, &mut got).expect_err("lost bytes were read");
                assert!(err.to_string().contains("lost"), "{what}: {name}: {err}");
            }
            let mut got = vec![0u8; g - 4096];
            d.read(4096, &mut got).unwrap();
            assert_same(&got, &want[4096..], &format!("{what}: {name}"));
        }
    };
    check(&rig, "after the write");
    rig.reopen();
    check(&rig, "after a restart");
    // Written again in the vdisk: they read there, and stay lost in the snapshot.
    let v = rig.engine().vdisk("v").unwrap();
    v.write(0, &pattern(4, 0, 4096), true).unwrap();
    drop(v);
    rig.reopen();
    let mut got = vec![0u8; g];
    rig.engine().vdisk("v").unwrap().read(0, &mut got).unwrap();
    want[..4096].copy_from_slice(&pattern(4, 0, 4096));
    assert_same(&got, &want, "written again");
    let mut got = vec![0u8; 4096];
    let err = rig.engine().vdisk("v@s").unwrap().read(0, &mut got).unwrap_err();
    assert!(err.to_string().contains("is lost:"), "the snapshot: {err}");
    assert_eq!(
        rig.engine().layouts().lost_bytes(),
        0,
        "the new slot's record, written again"
    );
    assert_eq!(rig.engine().cache_status().lost_bytes, 4096, "the snapshot's");
}

/// A log whose disks are all gone at open (found with their ring unreadable, or not found or
/// pulled and given up with `without_log`: without it, that import is refused) cannot be
/// replayed: the writes it held and had not destaged, each recorded in the pool's metadata
/// before a flush answered for it, are refused to readers from then on, across restarts,
/// until written again. What it held and destaged, and what it never held, read as before.
#[test]
fn writes_held_by_a_log_whose_disks_are_all_gone_at_open_are_refused() {
    const G: u64 = 64 << 10;
    for how in ["not found", "pulled", "unreadable"] {
        let (mut rig, v) = two_data_disks_two_log_disks();
        // On the pool's disks: the first four grains, through the log and destaged.
        v.write(0, &pattern(1, 0, 4 * G as usize), true).unwrap();
        rig.engine().cache().drain().unwrap();
        // Through the log again and destaged: its batch is freed, so it is not held.
        v.write(2 * MIB, &pattern(7, 2 * MIB, G as usize), false).unwrap();
        v.flush().unwrap();
        rig.engine().cache().drain().unwrap();
        // In the log only, flushed: an overwrite of the first grain and a new grain.
        v.write(0, &pattern(2, 0, G as usize), false).unwrap();
        v.write(MIB, &pattern(3, MIB, G as usize), false).unwrap();
        v.flush().unwrap();
        assert_eq!(rig.engine().cache_status().dirty_bytes, 2 * G);
        drop(v);
        // A record of a write to a slab set freed since (its delete failed then): the set
        // holds nothing to lose, and a set made later under its number would be refused.
        let freed = rig.engine().layouts().sets().iter().map(|s| s.id).max().unwrap() + 7;
        let mut key = b"write-back-held/".to_vec();
        key.extend_from_slice(&freed.to_be_bytes());
        key.extend_from_slice(&0u64.to_be_bytes());
        key.extend_from_slice(&G.to_be_bytes());
        let mut b = MetaBatch::new();
        b.put(CF_POOL, key, u64::MAX.to_be_bytes());
        rig.engine().pool().meta().commit(b, true).unwrap();
        // A crash, and both disks of the log gone at the next start.
        rig.engine = None;
        let caches = rig.disks.len() - 2;
        match how {
            "not found" => rig.disks.truncate(caches),
            "pulled" => rig.disks[caches..].iter().for_each(|d| d.faults().pull()),
            _ => rig.disks[caches..].iter().for_each(|d| {
                d.faults()
                    .fail_range(tessera_disk::DATA_OFFSET, 64 * MIB, tessera_disk::FaultOp::Read)
            }),
        }
        if how == "unreadable" {
            rig.reopen();
        } else {
            let dir = rig.dir.path().join("pool");
            let err = tessera_volume::Engine::open(&dir, &rig.opener())
                .err()
                .expect("opened without its log");
            assert!(err.to_string().contains("--without-log"), "{how}: {err}");
            let options = tessera_volume::ImportOptions {
                without_log: true,
                ..Default::default()
            };
            let opened = tessera_volume::Engine::open_with_options(&dir, &rig.opener(), options).unwrap();
            rig.engine = Some(opened);
        }

        let refused = |rig: &Rig, at: u64, len: u64, when: &str| {
            let v = rig.engine().vdisk("v").unwrap();
            let mut buf = vec![0u8; len as usize];
            match v.read(at, &mut buf) {
                Ok(()) => panic!("{how}, {when}: {len} bytes at {at}, held by the log only, were read"),
                Err(e) => assert!(e.to_string().contains("is lost:"), "{how}, {when}: {e}"),
            }
        };
        let reads = |rig: &Rig, at: u64, want: &[u8], when: &str| {
            let mut got = vec![0u8; want.len()];
            rig.engine().vdisk("v").unwrap().read(at, &mut got).unwrap();
            assert_same(&got, want, &format!("{how}, {when}"));
        };
        for when in ["at the first open", "after another restart"] {
            refused(&rig, 0, 4096, when);
            refused(&rig, G - 512, 512, when);
            refused(&rig, MIB, 4096, when);
            reads(&rig, G, &pattern(1, G, 3 * G as usize), when);
            reads(&rig, 2 * MIB, &pattern(7, 2 * MIB, G as usize), when);
            assert_eq!(rig.engine().cache_status().lost_bytes, 2 * G, "{how}, {when}");
            rig.reopen();
        }
        // Written again: read again, and nothing is lost any more after a restart.
        let v = rig.engine().vdisk("v").unwrap();
        v.write(0, &pattern(4, 0, G as usize), false).unwrap();
        v.write(MIB, &pattern(5, MIB, G as usize), false).unwrap();
        v.flush().unwrap();
        drop(v);
        rig.reopen();
        assert_eq!(rig.engine().cache_status().lost_bytes, 0, "{how}");
        reads(&rig, 0, &pattern(4, 0, G as usize), "written again");
        reads(&rig, MIB, &pattern(5, MIB, G as usize), "written again");
        rig.assert_consistent();
    }
}

/// A log whose replay reads its first batches and then meets read errors: the writes the
/// metadata says later batches took are lost, though an older batch the replay read took the
/// same range (the same write taken again, or a larger write around it), and whether the
/// next batch would have been at the replay's stop or at the start of the ring, where an older
/// batch lies. What the replayed batches hold alone reads. The same when only one copy cannot
/// be read there and the other's batch is not whole (a double fault): that is no log's end.
/// Where both copies read but hold the batch rotten, and a later batch says a flush had made
/// it durable, that is rot, not a batch a crash tore: what that batch held is lost, and the
/// replay goes on past it (no disk failed).
/// But where one copy cannot be read and the other holds nothing of a next batch, the log
/// ends there: nothing is lost, and no disk is failed (a latent bad sector past the end).
#[test]
fn writes_past_where_the_logs_replay_stops_on_read_errors_are_refused() {
    const K: u64 = 4096;
    for case in [
        "both copies unreadable",
        "one copy unreadable, the other rotten",
        "one copy unreadable, the other's header rotten",
        "both copies rotten, a later batch flushed after it",
        "one copy unreadable at the log's end",
    ] {
        let (mut rig, v) = two_data_disks_two_log_disks();
        // On the pool's disks, past the log: the first grain.
        rig.engine().set_write_cache("v", 0).unwrap();
        v.write(0, &pattern(1, 0, 16 * K as usize), true).unwrap();
        rig.engine().set_write_cache("v", 1 << 30).unwrap();
        // One batch each, from the start of the ring: a header block and the data.
        v.write(0, &pattern(2, 0, K as usize), false).unwrap(); // [0, 8 KiB)
        v.write(4 * K, &pattern(3, 4 * K, 4 * K as usize), false).unwrap(); // [8, 28 KiB)
        v.flush().unwrap();
        v.write(0, &pattern(4, 0, K as usize), false).unwrap(); // [28, 36 KiB): the same write again
        v.flush().unwrap();
        v.write(5 * K, &pattern(5, 5 * K, K as usize), false).unwrap(); // [36, 44 KiB): inside the second
        v.flush().unwrap();
        assert_eq!(
            rig.engine().cache_status().log_used_bytes,
            11 * K,
            "the batches are not where the test reads them"
        );
        drop(v);
        rig.engine = None;
        // The first copy of the log cannot be read from the third batch on; nor the second,
        // or else the third batch's data there has a bit flipped. Or the first cannot be
        // read past the fourth batch, where the second holds nothing of a fifth.
        let (first, second) = (rig.disks.len() - 2, rig.disks.len() - 1);
        let unreadable = |d: usize, from: u64| {
            rig.disks[d]
                .faults()
                .fail_range(tessera_disk::DATA_OFFSET + from, 64 * MIB, tessera_disk::FaultOp::Read)
        };
        match case {
            "both copies unreadable" => {
                unreadable(first, 7 * K);
                unreadable(second, 7 * K);
            }
            "one copy unreadable, the other rotten" => {
                unreadable(first, 7 * K);
                rig.disks[second]
                    .faults()
                    .flip_bit(tessera_disk::DATA_OFFSET + 8 * K + 100, 3)
                    .unwrap();
            }
            "one copy unreadable, the other's header rotten" => {
                unreadable(first, 7 * K);
                rig.disks[second]
                    .faults()
                    .flip_bit(tessera_disk::DATA_OFFSET + 7 * K + 100, 3)
                    .unwrap();
            }
            "both copies rotten, a later batch flushed after it" => {
                for d in [first, second] {
                    rig.disks[d]
                        .faults()
                        .flip_bit(tessera_disk::DATA_OFFSET + 8 * K + 100, 3)
                        .unwrap();
                }
            }
            _ => unreadable(first, 11 * K),
        }
        rig.reopen();

        let how = case;
        let v = rig.engine().vdisk("v").unwrap();
        if case == "one copy unreadable at the log's end" {
            // The log's end, as the other copy says: everything reads, nothing is lost and no
            // disk failed.
            for (at, seed) in [(0, 4), (K, 1), (4 * K, 3), (5 * K, 5), (6 * K, 3), (8 * K, 1)] {
                let mut buf = vec![0u8; K as usize];
                v.read(at, &mut buf).unwrap();
                assert_same(
                    &buf,
                    &pattern(seed, at, K as usize),
                    &format!("{how}: {K} bytes at {at}"),
                );
            }
            assert_eq!(rig.engine().cache_status().lost_bytes, 0, "{how}");
            for d in [first, second] {
                assert_ne!(rig.engine().pool().disk_state(d as u32), DiskState::Failed, "{how}");
            }
            continue;
        }
        if case == "both copies rotten, a later batch flushed after it" {
            // The third batch's write is lost; the fourth's, past it, reads.
            drop(v);
            for round in ["", ", after another restart"] {
                let v = rig.engine().vdisk("v").unwrap();
                let mut buf = vec![0u8; K as usize];
                match v.read(0, &mut buf) {
                    Ok(()) => panic!("{how}{round}: the rotten batch's write was read"),
                    Err(e) => assert!(e.to_string().contains("is lost:"), "{how}: {e}"),
                }
                for (at, seed) in [(5 * K, 5), (4 * K, 3), (6 * K, 3), (7 * K, 3), (K, 1), (8 * K, 1)] {
                    v.read(at, &mut buf).unwrap();
                    assert_same(
                        &buf,
                        &pattern(seed, at, K as usize),
                        &format!("{how}{round}: {K} bytes at {at}"),
                    );
                }
                assert_eq!(rig.engine().cache_status().lost_bytes, K, "{how}{round}");
                for d in [first, second] {
                    assert_ne!(rig.engine().pool().disk_state(d as u32), DiskState::Failed, "{how}");
                }
                drop(v);
                rig.reopen();
            }
            rig.assert_consistent();
            continue;
        }
        let mut buf = vec![0u8; K as usize];
        for at in [0, 5 * K] {
            match v.read(at, &mut buf) {
                Ok(()) => panic!("{how}: {K} bytes at {at}, written by a batch past the replay's reach, were read"),
                Err(e) => assert!(e.to_string().contains("is lost:"), "{how}: {e}"),
            }
        }
        for (at, seed) in [(4 * K, 3), (6 * K, 3), (7 * K, 3), (K, 1), (8 * K, 1)] {
            v.read(at, &mut buf).unwrap();
            assert_same(
                &buf,
                &pattern(seed, at, K as usize),
                &format!("{how}: {K} bytes at {at}"),
            );
        }
        assert_eq!(rig.engine().cache_status().lost_bytes, 2 * K, "{how}");
        // A disk whose reads failed is failed; a copy that read is not.
        let state = |d: usize| rig.engine().pool().disk_state(d as u32);
        assert_eq!(state(first), DiskState::Failed, "{how}");
        assert_eq!(
            state(second) == DiskState::Failed,
            case == "both copies unreadable",
            "{how}"
        );
        drop(v);
        rig.reopen();
        assert_eq!(
            rig.engine().cache_status().lost_bytes,
            2 * K,
            "{how}, after another restart"
        );
        rig.assert_consistent();
    }
}

/// A vdisk without redundancy loses its disk while the log holds its writes: they can never
/// be destaged. The log must still go round for the pool's other vdisks: their writers are
/// neither held up nor failed, however much they write through it.
#[test]
fn a_vdisk_that_lost_its_disk_does_not_hold_the_log_up_for_the_others() {
    let (rig, v) = two_data_disks_two_log_disks();
    let e = rig.engine();
    v.write(0, &pattern(1, 0, MIB as usize), false).unwrap();
    v.flush().unwrap();
    let used = only_data_disk_in_use(e);
    e.fail_disk(&used).unwrap();
    // The log takes nothing more for it: it could never destage it.
    assert!(v.write(0, &pattern(3, 0, 4096), false).is_err());
    e.cache().set_destage_delay(Duration::from_millis(10));
    e.cache().set_stall_limit(Duration::from_secs(3));
    let mut s = spec("w", 40 * MIB, LayoutKind::Simple, Provisioning::Thin);
    s.columns = Some(1);
    let w = e.create_vdisk(&s).unwrap();
    let log = e.cache_status().log_bytes;
    let (tx, rx) = std::sync::mpsc::channel();
    let w2 = w.clone();
    std::thread::spawn(move || {
        let chunk = pattern(2, 0, MIB as usize);
        let mut written = 0;
        let r = (|| {
            while written < 3 * log {
                w2.write(written % (40 * MIB), &chunk, false)?;
                written += MIB;
            }
            w2.flush()
        })();
        let _ = tx.send(r.map(|()| written));
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(Ok(n)) => assert!(n >= 3 * log),
        Ok(Err(err)) => panic!("a writer of another vdisk failed: {err}"),
        Err(_) => panic!("a writer of another vdisk is held up"),
    }
    let mut got = vec![0u8; MIB as usize];
    w.read(0, &mut got).unwrap();
    assert_same(&got, &pattern(2, 0, MIB as usize), "the other vdisk");
    // What the log held for the lost vdisk is lost with it, and said so.
    assert_eq!(e.cache_status().lost_bytes, MIB);
    assert!(v.read(0, &mut got).is_err());
}

/// A striped mirror short of one copy in every column still takes writes, so the log goes
/// on taking them for it and destages what it holds to the copies left (before, the layout
/// counted its losses over all members, refused writes past one, and the log kept what it
/// held for the set until a repair, while the ring filled).
#[test]
fn a_striped_mirror_short_of_a_copy_in_every_column_is_destaged() {
    let mut rig = Rig::with_cache(4, 64 * MIB, MIB, 2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    let mut s = spec("v", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin);
    (s.copies, s.columns) = (Some(2), Some(2));
    let v = e.create_vdisk(&s).unwrap();
    let half = 2 * MIB as usize;
    let mut want = pattern(1, 0, half);
    v.write(0, &want, false).unwrap();
    v.flush().unwrap();
    assert!(e.cache_status().dirty_bytes > 0, "{:?}", e.cache_status());
    let sets = e.layouts().sets();
    assert_eq!(sets.len(), 1);
    // Member c * columns + d holds copy c of column d.
    let members: Vec<u32> = sets[0].desc().members.iter().map(|m| m.disk).collect();
    e.fail_disk(&format!("mem{}", members[0])).unwrap();
    e.fail_disk(&format!("mem{}", members[3])).unwrap();
    let more = pattern(2, 4096, half - 8192);
    v.write(4096, &more, false).unwrap();
    v.flush().unwrap();
    want[4096..half - 4096].copy_from_slice(&more);
    e.cache().set_destage_delay(Duration::from_millis(10));
    let t = std::time::Instant::now();
    while e.cache_status().dirty_bytes > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "not destaged: {:?}",
            e.cache_status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(e.cache_status().lost_bytes, 0);
    assert_same(&read_all(&rig, "v", half), &want, "destaged to the copies left");
    drop(v);
    rig.reopen();
    assert_same(&read_all(&rig, "v", half), &want, "after a restart");
}

/// The log holds writes for a vdisk without redundancy and one with, and the pool stops with
/// them there; `v`'s disk is missing at the restart. The pool opens and the mirror reads what
/// the log held for it; what the new log cannot carry for `v` is parked, neither read as the
/// disk held it before nor lost: refused until the disk is back. So is what it held for `w`,
/// striped over both disks: half of it lies on the disk that is there, and a read planned
/// straight to the disks must not find it there either.
fn parked_for_a_missing_disk() -> (Rig, Arc<tessera_disk::FaultyDisk>) {
    let (mut rig, v) = two_data_disks_two_log_disks();
    let e = rig.engine();
    let m = e
        .create_vdisk(&spec("m", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    v.write(0, &pattern(1, 0, MIB as usize), false).unwrap();
    e.cache().drain().unwrap();
    let used = only_data_disk_in_use(e);
    let mut s = spec("w", 4 * MIB, LayoutKind::Simple, Provisioning::Thin);
    s.columns = Some(2);
    let w = e.create_vdisk(&s).unwrap();
    w.write(0, &pattern(5, 0, MIB as usize), false).unwrap();
    e.cache().drain().unwrap();
    // In the log only: a write for each simple vdisk and one for the mirror.
    v.write(0, &pattern(2, 0, 64 << 10), false).unwrap();
    w.write(0, &pattern(6, 0, MIB as usize), false).unwrap();
    m.write(0, &pattern(3, 0, MIB as usize), false).unwrap();
    v.flush().unwrap();
    m.flush().unwrap();
    w.flush().unwrap();
    assert_eq!(e.cache_status().dirty_bytes, 2 * MIB + (64 << 10), "not all in the log");
    drop((v, m, w));
    let at = rig.disks.iter().position(|d| d.path() == used).unwrap();
    rig.engine = None;
    let away = rig.disks.remove(at);
    rig.reopen();
    let status = rig.engine().cache_status();
    assert_eq!(
        (status.lost_bytes, status.parked_bytes),
        (0, MIB + (64 << 10)),
        "{status:?}"
    );
    let mut got = vec![0u8; MIB as usize];
    rig.engine().vdisk("m").unwrap().read(0, &mut got).unwrap();
    assert_same(&got, &pattern(3, 0, MIB as usize), "the mirror, one copy missing");
    let v = rig.engine().vdisk("v").unwrap();
    let err = v.read(0, &mut got[..4096]).unwrap_err().to_string();
    assert!(err.contains("disk online"), "{err}");
    let w = rig.engine().vdisk("w").unwrap();
    for at in (0..MIB).step_by(64 << 10) {
        assert!(
            w.read(at, &mut got[..64 << 10]).is_err(),
            "parked data at {at} was read"
        );
    }
    (rig, away)
}

/// `v` as it was written, and `w`.
fn written() -> (Vec<u8>, Vec<u8>) {
    let mut v = pattern(1, 0, MIB as usize);
    v[..64 << 10].copy_from_slice(&pattern(2, 0, 64 << 10));
    (v, pattern(6, 0, MIB as usize))
}

/// ... and stays parked across restarts without the disk; `disk online` writes it to `v`.
#[test]
fn writes_the_log_held_for_a_disk_missing_at_the_restart_wait_for_it() {
    let (mut rig, away) = parked_for_a_missing_disk();
    rig.reopen();
    assert_eq!(
        rig.engine().cache_status().parked_bytes,
        MIB + (64 << 10),
        "after another restart"
    );
    assert_eq!(rig.engine().cache_status().lost_bytes, 0);
    rig.engine()
        .bring_back_disk(away.path(), away.clone() as tessera_disk::DiskRef)
        .unwrap();
    rig.disks.push(away);
    assert_eq!(rig.engine().cache_status().parked_bytes, 0);
    let (mut want, want_w) = written();
    assert_same(
        &read_all(&rig, "v", MIB as usize),
        &want,
        "the parked write, once the disk is back",
    );
    assert_same(
        &read_all(&rig, "w", MIB as usize),
        &want_w,
        "the striped vdisk, once the disk is back",
    );
    // Writes go on over it, and a restart keeps them.
    let v = rig.engine().vdisk("v").unwrap();
    v.write(4096, &pattern(4, 0, 4096), true).unwrap();
    want[4096..8192].copy_from_slice(&pattern(4, 0, 4096));
    drop(v);
    rig.reopen();
    assert_eq!(rig.engine().cache_status().parked_bytes, 0);
    assert_same(&read_all(&rig, "v", MIB as usize), &want, "after a restart");
    rig.assert_consistent();
}

/// ... a restart with the disk back writes it at the open; a disk failed instead loses it,
/// said so and refused, as the log's data would have been.
#[test]
fn writes_parked_for_a_missing_disk_go_to_it_at_the_next_import_or_are_lost_with_it() {
    let (mut rig, away) = parked_for_a_missing_disk();
    rig.disks.push(away.clone());
    rig.reopen();
    assert_eq!(rig.engine().cache_status().parked_bytes, 0);
    let (want, want_w) = written();
    assert_same(
        &read_all(&rig, "v", MIB as usize),
        &want,
        "written at the import with the disk",
    );
    assert_same(&read_all(&rig, "w", MIB as usize), &want_w, "the striped vdisk");
    rig.assert_consistent();

    let (mut rig, away) = parked_for_a_missing_disk();
    rig.engine().fail_disk(away.path()).unwrap();
    for restarted in [false, true] {
        let status = rig.engine().cache_status();
        assert_eq!(
            (status.lost_bytes, status.parked_bytes),
            (MIB + (64 << 10), 0),
            "restarted: {restarted}, {status:?}"
        );
        // Refused as lost now, not read as the disk that is there holds it.
        let w = rig.engine().vdisk("w").unwrap();
        let mut got = vec![0u8; 64 << 10];
        for at in (0..MIB).step_by(64 << 10) {
            let err = w.read(at, &mut got).unwrap_err().to_string();
            assert!(err.contains("lost"), "{err}");
        }
        drop(w);
        rig.reopen();
    }
}

/// Once the log is down to one disk, a vdisk that tolerates a failure writes past it; but a
/// write over a range the log still holds must go through the log (a replay would otherwise
/// bring the older copy back). Answered with that one copy alone, it would be lost with the
/// next cache disk: it goes to the layouts as well, and survives the log's last disk.
#[test]
fn a_write_forced_into_a_log_of_one_copy_survives_that_copy() {
    let rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    let v = e
        .create_vdisk(&spec("v", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let (first, second) = (DATA_DISKS, DATA_DISKS + 1);
    let want = pattern(2, 0, 4096);
    // The destager, woken by the loss, writes the older copy slowly: the range stays in the
    // log while the next write comes. Tried again should the destager win the race anyway.
    let mut forced = false;
    for round in 0..5u64 {
        v.write(0, &pattern(1 + round * 10, 0, 64 << 10), true).unwrap();
        if round == 0 {
            for d in &rig.disks[..DATA_DISKS] {
                d.faults().set_latency(Duration::from_millis(300));
            }
            rig.disks[first].faults().pull();
            e.flush().unwrap();
            assert_eq!(e.cache_status().devices.len(), 1, "the log is down to one disk");
        }
        let cached = e.cache_status().cached_writes;
        v.write(0, &want, true).unwrap();
        if e.cache_status().cached_writes > cached {
            forced = true;
            break;
        }
    }
    assert!(forced, "no write was ever forced into the log of one copy");
    for d in &rig.disks[..DATA_DISKS] {
        d.faults().set_latency(Duration::ZERO);
    }
    rig.disks[second].faults().pull();
    assert!(e.flush().is_err(), "the log's last disk is gone");
    let mut got = vec![0u8; 4096];
    v.read(0, &mut got).unwrap_or_else(|e| {
        panic!("a write answered durable on a vdisk that tolerates a failure was lost with one cache disk: {e}")
    });
    assert_same(&got, &want, "the write forced into the log");
}

/// A block of the log that no copy holds intact (bits flipped on the only cache disk) does not
/// keep the destager from the rest: the round goes on, that block is lost (its reads fail
/// until it is written again, after a restart too), and every other block reads as written.
#[test]
fn a_log_block_rotten_on_every_copy_is_lost_alone() {
    let (mut rig, v) = one_log_disk();
    let log = rig.disks.len() - 1;
    let size = MIB as usize;
    let model = pattern(7, 0, size);
    v.write(0, &model, false).unwrap();
    drop(v);
    // Every other 4 KiB block of the ring: headers and data alike.
    let used = rig.engine().cache_status().log_used_bytes;
    for at in (0..used).step_by(8192) {
        rig.disks[log]
            .faults()
            .flip_bit(tessera_disk::DATA_OFFSET + at + 100, 3)
            .unwrap();
    }
    rig.engine().cache().drain().unwrap();
    assert_eq!(rig.engine().cache_status().dirty_bytes, 0);
    let lost = rig.engine().cache_status().lost_bytes;
    let check = |rig: &Rig, when: &str| {
        let v = rig.engine().vdisk("v").unwrap();
        let mut refused = 0;
        for at in (0..size).step_by(4096) {
            let mut got = vec![0u8; 4096];
            match v.read(at as u64, &mut got) {
                Ok(()) => assert_same(&got, &model[at..at + 4096], &format!("{when}: block at {at}")),
                Err(e) => {
                    assert!(e.to_string().contains("is lost:"), "{when}: {e}");
                    refused += 1;
                }
            }
        }
        assert_eq!(refused * 4096, lost, "{when}: the blocks refused are the blocks lost");
        assert!(
            refused > 0 && refused < size as u64 / 4096,
            "{when}: {refused} blocks refused"
        );
    };
    check(&rig, "after the destage");
    rig.reopen();
    check(&rig, "after a restart");
    let v = rig.engine().vdisk("v").unwrap();
    let again = pattern(8, 0, size);
    v.write(0, &again, true).unwrap();
    drop(v);
    rig.reopen();
    assert_eq!(rig.engine().cache_status().lost_bytes, 0);
    let mut got = vec![0u8; size];
    rig.engine().vdisk("v").unwrap().read(0, &mut got).unwrap();
    assert_same(&got, &again, "written again");
    rig.assert_consistent();
}

/// Slab sets that refuse every write (their storage fenced off, say) keep their data in the
/// log. A writer over its budget, which waits for the destager, is failed once the destager
/// has failed for longer than the stall limit, instead of waiting for ever; once the disks
/// take writes again, everything is destaged and reads back.
#[test]
fn a_writer_waiting_for_a_destager_that_cannot_write_is_failed_after_the_stall_limit() {
    let (mut rig, v) = one_log_disk();
    let e = rig.engine();
    e.cache().set_stall_limit(Duration::from_secs(1));
    // Grains allocated first, so that the writes below change no metadata.
    v.write(0, &pattern(1, 0, 512 << 10), true).unwrap();
    e.cache().drain().unwrap();
    e.set_write_cache("v", 256 << 10).unwrap();
    let first = pattern(2, 0, 256 << 10);
    v.write(0, &first, true).unwrap();
    for d in &rig.disks[..2] {
        d.faults().refuse(true);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let v = v.clone();
        std::thread::spawn(move || {
            let _ = tx.send(v.write(256 << 10, &pattern(3, 256 << 10, 64 << 10), false));
        })
    };
    let r = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the writer still waits for a destager that cannot write");
    writer.join().unwrap();
    let err = r.expect_err("a write over the budget went on while nothing could be destaged");
    assert!(err.to_string().contains("the destager cannot make it"), "{err}");
    for d in &rig.disks[..2] {
        d.faults().refuse(false);
    }
    let last = pattern(4, 256 << 10, 64 << 10);
    v.write(256 << 10, &last, true).unwrap();
    e.cache().drain().unwrap();
    drop(v);
    rig.reopen();
    let mut got = vec![0u8; 320 << 10];
    rig.engine().vdisk("v").unwrap().read(0, &mut got).unwrap();
    assert_same(&got[..256 << 10], &first, "the data the log kept");
    assert_same(&got[256 << 10..], &last, "the write after");
}

/// Lost data written again into a new log (a cache disk added after the loss), flushed, and
/// lost again with that log's only disk: refused again, after a restart too; what was never
/// lost reads.
#[test]
fn data_written_again_into_a_new_log_and_lost_again_stays_refused() {
    const G: u64 = 64 << 10;
    let (mut rig, v) = one_log_disk();
    v.write(0, &pattern(1, 0, 2 * G as usize), true).unwrap();
    rig.engine().cache().drain().unwrap();
    v.write(0, &pattern(2, 0, G as usize), true).unwrap();
    let first = rig.disks.len() - 1;
    rig.disks[first].faults().pull();
    assert!(rig.engine().flush().is_err());
    assert_eq!(rig.engine().cache_status().lost_bytes, G);
    let next = tessera_disk::FaultyDisk::new(
        std::sync::Arc::new(tessera_disk::MemDisk::new("cache9", 66 * MIB)) as tessera_disk::DiskRef
    );
    rig.engine()
        .add_cache_disk(next.clone() as tessera_disk::DiskRef)
        .unwrap();
    rig.disks.push(next.clone());
    assert_eq!(rig.engine().cache_status().devices.len(), 1, "a new log");
    v.write(0, &pattern(3, 0, G as usize), true).unwrap();
    assert_eq!(
        rig.engine().cache_status().lost_bytes,
        0,
        "written again, into the new log"
    );
    next.faults().pull();
    assert!(rig.engine().flush().is_err());
    assert_eq!(rig.engine().cache_status().lost_bytes, G, "lost again with the new log");
    drop(v);
    for when in ["after the second loss", "after a restart"] {
        let v = rig.engine().vdisk("v").unwrap();
        let mut buf = vec![0u8; 4096];
        let e = v.read(0, &mut buf).expect_err(when);
        assert!(e.to_string().contains("is lost:"), "{when}: {e}");
        let mut rest = vec![0u8; G as usize];
        v.read(G, &mut rest).unwrap();
        assert_same(&rest, &pattern(1, G, G as usize), when);
        drop(v);
        if when == "after the second loss" {
            rig.reopen();
        }
    }
}

/// The log's only disk fails its flush when the destager moves the log's start: the disk
/// leaves the log (which took the lock the move holds, and hung the destager and every
/// writer after it), the data already destaged is not lost, and writes go on.
#[test]
fn a_log_disk_failing_its_flush_as_the_logs_start_moves_hangs_nothing() {
    // Kept for the process's life: a drain that hangs must not keep the test from failing.
    let (rig, v) = one_log_disk();
    let rig: &'static Rig = Box::leak(Box::new(rig));
    let log = rig.disks.len() - 1;
    let e = rig.engine();
    let want = pattern(5, 0, 256 << 10);
    v.write(0, &want, true).unwrap();
    rig.disks[log].faults().fail_flushes(true);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(e.cache().drain());
    });
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the destage hung on the log disk it lost");
    assert!(r.is_err(), "the drain whose log flush failed says so");
    assert!(e.cache_status().devices.is_empty());
    assert_eq!(
        e.cache_status().lost_bytes,
        0,
        "everything was destaged before the flush"
    );
    let mut got = vec![0u8; want.len()];
    v.read(0, &mut got).unwrap();
    assert_same(&got, &want, "destaged data");
    v.write(0, &pattern(6, 0, 4096), true).unwrap();
}

/// The disk is back, and what waited for it not written yet (the layouts took the disk back,
/// the cache has not settled): what is parked stays refused to readers and writers (the sets
/// would take them now), writes beside it are taken, and the settle writes it, under what
/// was written beside it; or the pool stops first, with the write beside in the log, and the
/// next open writes both.
#[test]
fn parked_writes_stay_refused_until_settled_though_their_disk_is_back() {
    for stop_first in [false, true] {
        let (mut rig, away) = parked_for_a_missing_disk();
        let e = rig.engine();
        let pos = e.pool().find_disk(away.path()).unwrap();
        e.layouts()
            .bring_back_disk(pos, away.clone() as tessera_disk::DiskRef)
            .unwrap();
        assert_eq!(e.cache_status().parked_bytes, MIB + (64 << 10));
        let w = e.vdisk("w").unwrap();
        let mut got = vec![0u8; 4096];
        let err = w.read(4096, &mut got).unwrap_err().to_string();
        assert!(err.contains("disk online"), "{err}");
        let err = w.write(4096, &pattern(7, 0, 4096), false).unwrap_err().to_string();
        assert!(err.contains("disk online"), "{err}");
        // Beside it.
        w.write(MIB, &pattern(8, 0, 4096), false).unwrap();
        w.flush().unwrap();
        drop(w);
        rig.disks.push(away);
        if stop_first {
            assert!(rig.engine().cache_status().dirty_bytes > 0);
            rig.reopen();
            assert_eq!(rig.engine().cache_status().parked_bytes, 0);
        } else {
            assert_eq!(rig.engine().cache().settle_parked(), 0);
        }
        let (want_v, mut want_w) = written();
        // Never written past its first MiB before.
        want_w.resize(2 * MIB as usize, 0);
        want_w[MIB as usize..MIB as usize + 4096].copy_from_slice(&pattern(8, 0, 4096));
        for when in ["settled", "after a restart"] {
            assert_same(
                &read_all(&rig, "v", MIB as usize),
                &want_v,
                &format!("v, {when}, {stop_first}"),
            );
            assert_same(
                &read_all(&rig, "w", 2 * MIB as usize),
                &want_w,
                &format!("w, {when}, {stop_first}"),
            );
            rig.assert_consistent();
            rig.reopen();
        }
    }
}

/// A vdisk without redundancy whose disk an I/O error takes out while the log holds writes for
/// it: they were answered as durable (the log was flushed), and the disk can come back (`disk
/// online`), so they are parked rather than lost, refused meanwhile, kept across a restart,
/// and written to the vdisk once the disk is back. Before, only an open parked: while the
/// pool ran, a disk was never missing, only failed for good, and the log's data for it lost.
#[test]
fn writes_the_log_held_for_a_disk_an_error_took_out_wait_for_it() {
    for restart in [false, true] {
        let (mut rig, v) = two_data_disks_two_log_disks();
        let first = pattern(1, 0, MIB as usize);
        v.write(0, &first, false).unwrap();
        rig.engine().cache().drain().unwrap();
        let used = only_data_disk_in_use(rig.engine());
        let at = rig.disks.iter().position(|d| d.path() == used).unwrap();
        let (mut want, new) = (first, pattern(2, 0, 256 << 10));
        v.write(64 << 10, &new, false).unwrap();
        v.flush().unwrap();
        want[64 << 10..320 << 10].copy_from_slice(&new);
        // The destage meets the error.
        rig.disks[at].faults().pull();
        rig.engine().cache().drain().unwrap();
        assert_eq!(rig.engine().pool().disks()[at].info.state, DiskState::Failed);
        let status = rig.engine().cache_status();
        assert_eq!(
            (status.lost_bytes, status.parked_bytes, status.dirty_bytes),
            (0, 256 << 10, 0),
            "restart: {restart}, {status:?}"
        );
        let mut got = vec![0u8; 4096];
        assert!(v.read(64 << 10, &mut got).is_err(), "parked data was read");
        drop(v);
        if restart {
            rig.reopen();
            assert_eq!(rig.engine().cache_status().parked_bytes, 256 << 10);
            assert_eq!(rig.engine().pool().disks()[at].info.state, DiskState::Failed);
        }
        rig.disks[at].faults().reinsert();
        rig.engine()
            .bring_back_disk(&used, rig.disks[at].clone() as tessera_disk::DiskRef)
            .unwrap();
        let status = rig.engine().cache_status();
        assert_eq!((status.lost_bytes, status.parked_bytes), (0, 0), "{status:?}");
        assert_same(&read_all(&rig, "v", MIB as usize), &want, "once the disk is back");
        // Writes go on over it through the log, and destage to it.
        let more = pattern(3, 0, 128 << 10);
        rig.engine().vdisk("v").unwrap().write(128 << 10, &more, false).unwrap();
        want[128 << 10..256 << 10].copy_from_slice(&more);
        rig.engine().cache().drain().unwrap();
        assert_eq!(rig.engine().cache_status().parked_bytes, 0);
        rig.reopen();
        assert_same(&read_all(&rig, "v", MIB as usize), &want, "after a restart");
        rig.assert_consistent();
    }
}

/// ... and given up with `disk fail` instead, what was parked for it is lost with it: said so,
/// and refused to readers, not read as the disk held it before.
#[test]
fn writes_the_log_parked_for_a_disk_an_error_took_out_are_lost_with_it_when_it_is_failed() {
    let (mut rig, v) = two_data_disks_two_log_disks();
    v.write(0, &pattern(1, 0, MIB as usize), false).unwrap();
    rig.engine().cache().drain().unwrap();
    let used = only_data_disk_in_use(rig.engine());
    let at = rig.disks.iter().position(|d| d.path() == used).unwrap();
    v.write(64 << 10, &pattern(2, 0, 256 << 10), false).unwrap();
    v.flush().unwrap();
    rig.disks[at].faults().pull();
    rig.engine().cache().drain().unwrap();
    assert_eq!(rig.engine().cache_status().parked_bytes, 256 << 10);
    rig.engine().fail_disk(&used).unwrap();
    drop(v);
    for restarted in [false, true] {
        let status = rig.engine().cache_status();
        assert_eq!(
            (status.lost_bytes, status.parked_bytes),
            (256 << 10, 0),
            "restarted: {restarted}, {status:?}"
        );
        let mut got = vec![0u8; 4096];
        let err = rig
            .engine()
            .vdisk("v")
            .unwrap()
            .read(64 << 10, &mut got)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lost"), "{err}");
        rig.reopen();
    }
}

/// A destage round meets a disk an I/O error takes out, judges that the set's writes wait
/// for it, and parks them only after the administrator has brought the disk back or given it
/// up: the settle that command makes waits for the round, so the writes are written to the
/// disk (or lost with it) at once. Listed before the round parked them, they stayed parked
/// and refused to readers until the next try, 30 s later.
#[test]
fn a_disk_back_or_given_up_while_a_destage_round_parks_its_writes_settles_them_at_once() {
    for give_up in [false, true] {
        let (mut rig, v) = two_data_disks_two_log_disks();
        let mut want = pattern(1, 0, MIB as usize);
        v.write(0, &want, false).unwrap();
        rig.engine().cache().drain().unwrap();
        let used = only_data_disk_in_use(rig.engine());
        let at = rig.disks.iter().position(|d| d.path() == used).unwrap();
        let new = pattern(2, 0, 256 << 10);
        v.write(64 << 10, &new, false).unwrap();
        v.flush().unwrap();
        want[64 << 10..320 << 10].copy_from_slice(&new);
        drop(v);
        rig.disks[at].faults().pull();
        // The log's disks slow: the round reads the writes from them to write them, and again
        // to park them, each read a while after the last.
        let slow = Duration::from_millis(1000);
        let log: Vec<usize> = (0..rig.disks.len())
            .filter(|&i| rig.engine().pool().disks()[i].info.usage == tessera_volume::DiskUsage::Cache)
            .collect();
        assert_eq!(log.len(), 2);
        for &i in &log {
            rig.disks[i].faults().set_latency(slow);
        }
        std::thread::scope(|sc| {
            let round = sc.spawn(|| rig.engine().cache().drain());
            // The round's write took the disk out; it now reads the writes again to park them.
            let deadline = Instant::now() + Duration::from_secs(30);
            while rig.engine().pool().disk_state(at as u32) != DiskState::Failed {
                assert!(Instant::now() < deadline, "the round never met the pulled disk");
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(slow / 4);
            assert!(
                !round.is_finished(),
                "the round parked before the disk came back or was given up"
            );
            if give_up {
                rig.engine().fail_disk(&used).unwrap();
            } else {
                rig.disks[at].faults().reinsert();
                rig.engine()
                    .bring_back_disk(&used, rig.disks[at].clone() as tessera_disk::DiskRef)
                    .unwrap();
            }
            round.join().expect("the round").unwrap();
        });
        for &i in &log {
            rig.disks[i].faults().set_latency(Duration::ZERO);
        }
        let status = rig.engine().cache_status();
        let how = if give_up { "given up" } else { "back" };
        if give_up {
            assert_eq!(
                (status.lost_bytes, status.parked_bytes),
                (256 << 10, 0),
                "{how}: {status:?}"
            );
            let mut got = vec![0u8; 4096];
            let v = rig.engine().vdisk("v").unwrap();
            let err = v.read(64 << 10, &mut got).unwrap_err().to_string();
            assert!(err.contains("lost"), "{how}: {err}");
        } else {
            assert_eq!((status.lost_bytes, status.parked_bytes), (0, 0), "{how}: {status:?}");
            assert_same(&read_all(&rig, "v", MIB as usize), &want, how);
            rig.reopen();
            assert_same(&read_all(&rig, "v", MIB as usize), &want, "after a restart");
        }
    }
}

/// A mirror whose two copies an I/O error takes out together (an enclosure's blink) while the
/// log holds writes for it: the set is beyond its tolerance, but both disks can come back and
/// neither copy can be resynced from the other (each may lack what was written since the
/// last flush), so the first back is taken as its disk holds it. The writes are parked, not
/// lost, and written to the mirror once a copy is back; the other copy, back, is resynced.
/// Before, a stale copy of a set with redundancy counted as gone for good, and the log's
/// writes were recorded lost at once.
#[test]
fn writes_the_log_held_for_a_mirror_whose_copies_an_error_took_out_wait_for_them() {
    let rig = Rig::with_cache(2, 64 * MIB, MIB, 2);
    rig.engine().cache().set_destage_delay(Duration::from_secs(3600));
    let v = rig
        .engine()
        .create_vdisk(&spec("v", MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let mut want = pattern(1, 0, MIB as usize);
    v.write(0, &want, false).unwrap();
    rig.engine().cache().drain().unwrap();
    let data: Vec<usize> = (0..rig.disks.len())
        .filter(|&i| rig.engine().pool().disks()[i].info.usage == tessera_volume::DiskUsage::Data)
        .collect();
    assert_eq!(data.len(), 2);
    let new = pattern(2, 0, 256 << 10);
    v.write(64 << 10, &new, false).unwrap();
    v.flush().unwrap();
    want[64 << 10..320 << 10].copy_from_slice(&new);
    for &i in &data {
        rig.disks[i].faults().pull();
    }
    rig.engine().cache().drain().unwrap();
    for &i in &data {
        assert_eq!(rig.engine().pool().disks()[i].info.state, DiskState::Failed);
    }
    let status = rig.engine().cache_status();
    assert_eq!(
        (status.lost_bytes, status.parked_bytes, status.dirty_bytes),
        (0, 256 << 10, 0),
        "{status:?}"
    );
    drop(v);
    for (k, &i) in data.iter().enumerate() {
        rig.disks[i].faults().reinsert();
        let path = rig.disks[i].path().to_string();
        rig.engine()
            .bring_back_disk(&path, rig.disks[i].clone() as tessera_disk::DiskRef)
            .unwrap();
        let status = rig.engine().cache_status();
        assert_eq!(
            (status.lost_bytes, status.parked_bytes),
            (0, 0),
            "disk {k} back: {status:?}"
        );
        assert_same(&read_all(&rig, "v", MIB as usize), &want, "once a copy is back");
    }
    assert_eq!(rig.engine().layouts().stale_members(), 1, "the copy back second");
    rig.repair();
    // The copy back first alone reads everything, then the other alone.
    let mut rig = rig;
    let second = rig.disks[data[1]].path().to_string();
    rig.engine().fail_disk(&second).unwrap();
    assert_same(&read_all(&rig, "v", MIB as usize), &want, "the first copy alone");
    rig.reopen();
    assert_same(&read_all(&rig, "v", MIB as usize), &want, "after a restart");
    rig.assert_consistent();
}

/// Two data disks and `cache` cache disks, and a mirror vdisk "v" of 1 MiB written whole and
/// flushed, in the log only (destaged in an hour); what it holds.
fn mirror_in_the_log(cache: usize) -> (Rig, Vec<u8>) {
    let rig = Rig::with_cache(2, 64 * MIB, MIB, cache);
    rig.engine().cache().set_destage_delay(Duration::from_secs(3600));
    let v = rig
        .engine()
        .create_vdisk(&spec("v", MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap();
    let want = pattern(1, 0, MIB as usize);
    v.write(0, &want, false).unwrap();
    v.flush().unwrap();
    assert!(rig.engine().cache_status().dirty_bytes > 0, "in the log only");
    (rig, want)
}

/// An import that finds none of the pool's write-back cache disks (an enclosure of SSDs
/// still off when the daemon starts) is refused, and loses nothing: before, the pool opened
/// without its log, recorded the writes the log held as lost, and failed the cache disks
/// for good when they were back. `without_log` gives them up, for
/// disks that are gone for good: the writes the log held are then lost, and said so.
#[test]
fn an_import_that_finds_none_of_the_cache_disks_is_refused_and_loses_nothing() {
    let (mut rig, want) = mirror_in_the_log(2);
    rig.engine = None;
    let cache: Vec<_> = rig.disks.drain(2..).collect();
    let dir = rig.dir.path().join("pool");
    let err = tessera_volume::Engine::open(&dir, &rig.opener())
        .err()
        .expect("opened without its log")
        .to_string();
    assert!(
        err.contains("cache0") && err.contains("cache1") && err.contains("--without-log"),
        "{err}"
    );
    rig.disks.extend(cache);
    rig.reopen();
    assert_same(&read_all(&rig, "v", MIB as usize), &want, "both back");
    // Gone for good: given up, and what the log held is lost, and said so.
    rig.engine().cache().set_destage_delay(Duration::from_secs(3600));
    let more = pattern(2, 0, 64 << 10);
    rig.engine().vdisk("v").unwrap().write(0, &more, false).unwrap();
    rig.engine().vdisk("v").unwrap().flush().unwrap();
    let status = rig.engine().cache_status();
    assert!(status.dirty_bytes > 0, "{status:?}");
    rig.engine = None;
    rig.disks.truncate(2);
    let options = tessera_volume::ImportOptions {
        without_log: true,
        ..Default::default()
    };
    let opened = tessera_volume::Engine::open_with_options(&dir, &rig.opener(), options).unwrap();
    rig.engine = Some(opened);
    for i in 2..4 {
        assert_eq!(rig.engine().pool().disks()[i].info.state, DiskState::Failed);
    }
    let status = rig.engine().cache_status();
    assert!(status.lost_bytes > 0, "{status:?}");
    let mut got = vec![0u8; 4096];
    assert!(
        rig.engine().vdisk("v").unwrap().read(0, &mut got).is_err(),
        "lost, refused"
    );
    // Later imports do not ask again.
    rig.reopen();
    assert!(
        rig.engine().vdisk("v").unwrap().read(0, &mut got).is_err(),
        "lost, refused"
    );
    rig.assert_consistent();
}

/// The disks an import must find are those the log is on, not any cache disk: one outside
/// the log (a third cache disk, idle) found alone does not let the pool open without its
/// log; and cache disks that hold no log any more (retired, the log destaged) are not
/// waited for.
#[test]
fn an_import_waits_for_the_disks_the_log_is_on_and_no_other() {
    let (mut rig, want) = mirror_in_the_log(3);
    let on: Vec<usize> = rig
        .engine()
        .cache_status()
        .devices
        .iter()
        .map(|&p| p as usize)
        .collect();
    assert_eq!(on.len(), 2);
    let dir = rig.dir.path().join("pool");
    rig.engine = None;
    let all = rig.disks.clone();
    rig.disks = (0..all.len())
        .filter(|i| !on.contains(i))
        .map(|i| all[i].clone())
        .collect();
    let err = tessera_volume::Engine::open(&dir, &rig.opener())
        .err()
        .expect("opened without its log")
        .to_string();
    assert!(err.contains("--without-log"), "{err}");
    rig.disks = all.clone();
    rig.reopen();
    assert_same(&read_all(&rig, "v", MIB as usize), &want, "the log whole");
    // Retired, every cache disk leaves the log (destaged first); gone, none is waited for.
    for i in 2..5 {
        let path = rig.disks[i].path().to_string();
        rig.engine().retire_disk(&path).unwrap();
    }
    assert!(rig.engine().cache_status().devices.is_empty());
    rig.engine = None;
    rig.disks.truncate(2);
    rig.reopen();
    assert_same(&read_all(&rig, "v", MIB as usize), &want, "destaged");
}

/// A parity vdisk "v" of 480 KiB behind the log (whose data waits there), written whole and
/// destaged, with its first block beyond repair: rot on its member and on the parity at the
/// same place. With what was written, and each 4 KiB block of the first block's row as
/// (vdisk offset, its member's offset in its slab), and the disk of the lost block's member.
struct LostInARow {
    rig: Rig,
    v: Arc<Vdisk>,
    old: Vec<u8>,
    in_row: Vec<(u64, u64)>,
    holder: usize,
}

const LOST_IN_A_ROW_SIZE: u64 = 480 << 10;

fn lost_in_a_row() -> LostInARow {
    let rig = rig(2);
    let e = rig.engine();
    e.cache().set_destage_delay(Duration::from_secs(3600));
    let size = LOST_IN_A_ROW_SIZE;
    let v = e
        .create_vdisk(&spec("v", size, LayoutKind::Parity, Provisioning::Thin))
        .unwrap();
    let old = pattern(41, 0, size as usize);
    v.write(0, &old, true).unwrap();
    e.cache().drain().unwrap();
    let set = e.layouts().sets()[0].clone();
    let il = set.spec.interleave;
    let placed = common::placed_blocks(e, |i| rig.disks[i].inner().clone(), &old, 4096);
    let first = *placed.iter().find(|p| p.at == 0).expect("the vdisk's first block");
    let (holder, mo) = (first.slab, first.mo);
    let row = mo / il * il..mo / il * il + il;
    let in_row: Vec<(u64, u64)> = placed
        .iter()
        .filter(|p| row.contains(&p.mo))
        .map(|p| (p.at, p.mo))
        .collect();
    assert_eq!(
        in_row.len() as u64,
        set.spec.data_columns() as u64 * il / 4096,
        "a row of the vdisk's data alone: {:?}",
        set.spec
    );
    let parity = set
        .desc()
        .members
        .into_iter()
        .find(|s| !placed.iter().any(|p| p.slab == *s && row.contains(&p.mo)))
        .expect("the row's parity member");
    for slab in [holder, parity] {
        rig.disks[slab.disk as usize]
            .faults()
            .flip_bit(e.pool().slab_offset(slab) + mo + 100, 5)
            .unwrap();
    }
    let mut got = vec![0u8; 4096];
    assert!(v.read(0, &mut got).is_err(), "a block beyond repair was read");
    LostInARow {
        rig,
        v,
        old,
        in_row,
        holder: holder.disk as usize,
    }
}

/// A parity row the log holds mostly dirty is destaged whole, its clean parts read from the
/// layout first. A block of it beyond repair (rot on its member and on the parity at the same
/// place) that a piece replaces does not keep the row from going: the gaps are read alone.
/// Before, the row's read failed at every round, the log's start stayed where it was, and
/// the drain, as the open that replays a log, failed for good.
#[test]
fn a_row_destaged_whole_over_a_block_beyond_repair_reads_only_its_gaps() {
    let LostInARow {
        rig, v, old, in_row, ..
    } = lost_in_a_row();
    let e = rig.engine();
    let size = LOST_IN_A_ROW_SIZE;
    let in_row: Vec<u64> = in_row.into_iter().map(|(at, _)| at).collect();
    // Every block of the row but one other than the lost one, through the log.
    let gap = *in_row.iter().find(|&&at| at != 0).unwrap();
    let mut want = old.clone();
    for &at in in_row.iter().filter(|&&at| at != gap) {
        let data = pattern(42, at, 4096);
        v.write(at, &data, false).unwrap();
        want[at as usize..at as usize + 4096].copy_from_slice(&data);
    }
    assert!(
        e.cache_status().dirty_bytes > 0,
        "the writes were not held by the cache"
    );
    e.cache()
        .drain()
        .expect("a row over a block beyond repair was not destaged");
    assert_eq!(e.cache_status().dirty_bytes, 0);
    assert_same(&read_all(&rig, "v", size as usize), &want, "after the destage");
    assert_in_step_and_healthy(&rig);
}

/// The same row destaged whole, every block of it in the log but the one beyond repair: that
/// gap reads from nowhere, so the row's pieces go alone, and the layout's writes record the
/// block lost and write zeros there with the parity in step. Before, the job failed at every
/// round, as above.
#[test]
fn a_row_destaged_whole_around_a_block_beyond_repair_goes_piece_by_piece() {
    let LostInARow {
        rig, v, old, in_row, ..
    } = lost_in_a_row();
    let e = rig.engine();
    let size = LOST_IN_A_ROW_SIZE;
    let mut want = old.clone();
    for &(at, _) in in_row.iter().filter(|&&(at, _)| at != 0) {
        let data = pattern(47, at, 4096);
        v.write(at, &data, false).unwrap();
        want[at as usize..at as usize + 4096].copy_from_slice(&data);
    }
    e.cache()
        .drain()
        .expect("a row around a block beyond repair was not destaged");
    assert_eq!(e.cache_status().dirty_bytes, 0);
    assert_eq!(e.layouts().lost_bytes(), 4096);
    let mut got = vec![0u8; 4096];
    assert!(v.read(0, &mut got).is_err(), "the lost block was read");
    let mut got = vec![0u8; (size - 4096) as usize];
    v.read(4096, &mut got).unwrap();
    assert_same(&got, &want[4096..], "after the destage");
    assert_in_step_and_healthy(&rig);
}

/// The lost-in-a-row vdisk's slab set scrubs clean (its parity in step with its data) and no
/// disk was failed on the way.
fn assert_in_step_and_healthy(rig: &Rig) {
    let e = rig.engine();
    assert!(
        e.layouts().scrub_set(&e.layouts().sets()[0]).unwrap().is_empty(),
        "the row's parity is out of step"
    );
    assert!(
        (0..rig.disks.len() as u32).all(|d| e.pool().disk_state(d) == DiskState::Healthy),
        "a disk was failed"
    );
}

/// A piece the log holds in a parity row whose block beyond repair it does not cover: the
/// piece's write computes the row's parity from that block, which does not read. The layout
/// records the block lost (in its set's descriptor, not in the log's record of what it lost:
/// reads of it fail, after a restart too, until it is written again) and writes zeros there
/// with the row. Before, the job failed at every round, the log's start stayed where it was,
/// and the drain, as the open that replays a log, failed for good.
#[test]
fn a_piece_beside_a_block_beyond_repair_is_destaged_and_the_block_stays_lost() {
    let LostInARow {
        mut rig,
        v,
        old,
        in_row,
        ..
    } = lost_in_a_row();
    let e = rig.engine();
    let size = LOST_IN_A_ROW_SIZE;
    // The block at the lost one's offset in another column: its parity is the lost block's.
    let lost_mo = in_row.iter().find(|b| b.0 == 0).unwrap().1;
    let beside = in_row.iter().find(|b| b.1 == lost_mo && b.0 != 0).unwrap().0;
    let new = pattern(43, beside, 4096);
    v.write(beside, &new, false).unwrap();
    assert!(e.cache_status().dirty_bytes > 0, "the write was not held by the cache");
    e.cache()
        .drain()
        .expect("a piece beside a block beyond repair was not destaged");
    assert_eq!(e.cache_status().dirty_bytes, 0);
    let mut want = old.clone();
    want[beside as usize..beside as usize + 4096].copy_from_slice(&new);
    let check = |e: &tessera_volume::Engine, what: &str| {
        assert_eq!(e.layouts().lost_bytes(), 4096, "{what}: the lost block alone");
        assert_eq!(e.cache_status().lost_bytes, 0, "{what}: the log lost nothing");
        let v = e.vdisk("v").unwrap();
        let mut got = vec![0u8; 4096];
        let err = v.read(0, &mut got).expect_err("the lost block was read");
        assert!(err.to_string().contains("lost beyond repair"), "{what}: {err}");
        let mut got = vec![0u8; (size - 4096) as usize];
        v.read(4096, &mut got).unwrap();
        assert_same(&got, &want[4096..], what);
    };
    check(e, "after the destage");
    assert_in_step_and_healthy(&rig);
    drop(v);
    rig.reopen();
    check(rig.engine(), "after a restart");
    // Written again: readable.
    let again = pattern(44, 0, 4096);
    let v = rig.engine().vdisk("v").unwrap();
    v.write(0, &again, true).unwrap();
    want[..4096].copy_from_slice(&again);
    rig.engine().cache().drain().unwrap();
    assert_same(
        &read_all(&rig, "v", size as usize),
        &want,
        "after the block is written again",
    );
    assert_eq!(rig.engine().layouts().lost_bytes(), 0);
}

/// A block lost beyond repair is a finding of the metadata scan, naming the vdisk, its
/// grain and the bytes of the vdisk lost (where an administrator restores from a backup);
/// spot-fix cannot repair it and says so; written again, it is no longer found.
#[test]
fn a_block_lost_beyond_repair_is_a_scan_finding_naming_the_vdisk_and_its_bytes() {
    use tessera_volume::{FindingKind, FindingStatus, Progress, Repair};
    let LostInARow { rig, v, in_row, .. } = lost_in_a_row();
    let e = rig.engine();
    let lost_mo = in_row.iter().find(|b| b.0 == 0).unwrap().1;
    let beside = in_row.iter().find(|b| b.1 == lost_mo && b.0 != 0).unwrap().0;
    v.write(beside, &pattern(48, beside, 4096), false).unwrap();
    e.cache().drain().unwrap();
    assert_eq!(e.layouts().lost_bytes(), 4096);
    let report = e.scan(&Progress::default()).unwrap();
    assert_eq!(report.by_kind.get(&FindingKind::DataLost), Some(&1), "{report:?}");
    let found = e.findings(0, 100).unwrap();
    let lost: Vec<_> = found.iter().filter(|f| f.kind == FindingKind::DataLost).collect();
    assert_eq!(lost.len(), 1, "{found:?}");
    match &lost[0].action {
        Repair::Restore { grain, bytes, .. } => {
            assert_eq!((*grain, bytes.as_slice()), (0, &[(0, 4096)][..]), "{:?}", lost[0]);
        }
        other => panic!("{other:?}"),
    }
    assert!(lost[0].object.contains("grain 0"), "{:?}", lost[0]);
    assert!(lost[0].problem.contains("bytes 0..4096"), "{:?}", lost[0]);
    e.spotfix(&Progress::default()).unwrap();
    let after = e.findings(0, 100).unwrap();
    let lost = after.iter().find(|f| f.kind == FindingKind::DataLost).unwrap();
    assert_eq!(lost.status, FindingStatus::Failed);
    assert!(lost.note.as_deref().unwrap_or("").contains("backup"), "{lost:?}");
    // Written again (through the log, destaged): nothing lost, nothing found.
    v.write(0, &pattern(49, 0, 4096), false).unwrap();
    e.cache().drain().unwrap();
    assert_eq!(e.layouts().lost_bytes(), 0);
    let report = e.scan(&Progress::default()).unwrap();
    assert_eq!(report.by_kind.get(&FindingKind::DataLost), None, "{report:?}");
}

/// A write to a grain a snapshot shares, whose old content holds a block lost beyond repair:
/// the copy on write reads the rest of the grain around it, and the new slot has the block
/// recorded lost too (not written). The write lands; the block fails to read in the vdisk
/// and in the snapshot, across a restart, until the vdisk writes it again. Before, the copy
/// on write failed on the lost block, and with it every write to the rest of the grain.
#[test]
fn a_copy_on_write_of_a_grain_with_a_lost_block_keeps_it_lost_and_goes_on() {
    use tessera_volume::{FindingKind, Progress};
    let LostInARow {
        mut rig,
        v,
        old,
        in_row,
        ..
    } = lost_in_a_row();
    let size = LOST_IN_A_ROW_SIZE as usize;
    let lost_mo = in_row.iter().find(|b| b.0 == 0).unwrap().1;
    let beside = in_row.iter().find(|b| b.1 == lost_mo && b.0 != 0).unwrap().0;
    let mut want = old.clone();
    let data = pattern(50, beside, 4096);
    v.write(beside, &data, false).unwrap();
    want[beside as usize..beside as usize + 4096].copy_from_slice(&data);
    rig.engine().cache().drain().unwrap();
    assert_eq!(rig.engine().layouts().lost_bytes(), 4096);
    let snap = rig.engine().snapshot("v", "s").unwrap();
    let before = want.clone();
    // The lost block's grain, written beside it.
    let data = pattern(51, 8192, 4096);
    v.write(8192, &data, false)
        .expect("a write to a grain holding a lost block failed");
    want[8192..8192 + 4096].copy_from_slice(&data);
    drop(snap);
    let check = |rig: &Rig, what: &str| {
        let e = rig.engine();
        assert_eq!(
            e.layouts().lost_bytes(),
            8192,
            "{what}: the old slot's and the new one's"
        );
        for (name, want) in [("v", &want), ("v@s", &before)] {
            let d = e.vdisk(name).unwrap();
            let mut got = vec![0u8; 4096];
            let err = d.read(0, &mut got).expect_err("a lost block was read");
            assert!(err.to_string().contains("lost beyond repair"), "{what}: {name}: {err}");
            let mut got = vec![0u8; size - 4096];
            d.read(4096, &mut got).unwrap();
            assert_same(&got, &want[4096..], &format!("{what}: {name}"));
        }
    };
    check(&rig, "after the write");
    rig.engine().cache().drain().unwrap();
    check(&rig, "destaged");
    drop(v);
    rig.reopen();
    check(&rig, "after a restart");
    let report = rig.engine().scan(&Progress::default()).unwrap();
    assert_eq!(report.by_kind.get(&FindingKind::DataLost), Some(&2), "{report:?}");
    // Written again in the vdisk: lost in the snapshot alone.
    let again = pattern(52, 0, 4096);
    let v = rig.engine().vdisk("v").unwrap();
    v.write(0, &again, true).unwrap();
    rig.engine().cache().drain().unwrap();
    let mut got = vec![0u8; 4096];
    v.read(0, &mut got).unwrap();
    assert_same(&got, &again, "written again");
    assert_eq!(rig.engine().layouts().lost_bytes(), 4096);
    assert_eq!(rig.engine().lost_bytes(), 4096, "the snapshot's");
    // The snapshot deleted: its slot is free, and what it recorded lost is nobody's data.
    rig.engine().delete_vdisk("v@s").unwrap();
    assert_eq!(rig.engine().lost_bytes(), 0);
}

/// The same piece while the lost block's disk answers no I/O (pulled, its link down): the
/// block may read again once it answers (its member may be the intact copy), so nothing is
/// given up: the piece stays in the log and reads from it, nothing is recorded lost, and no
/// zeros are written there with the parity in step. Once the disk answers again, the block
/// is found rotten there too: the piece goes, and the block is recorded lost.
#[test]
fn a_piece_beside_a_block_unreadable_while_its_disk_is_away_waits_for_the_disk() {
    let LostInARow {
        rig, v, in_row, holder, ..
    } = lost_in_a_row();
    let e = rig.engine();
    let lost_mo = in_row.iter().find(|b| b.0 == 0).unwrap().1;
    let beside = in_row.iter().find(|b| b.1 == lost_mo && b.0 != 0).unwrap().0;
    let new = pattern(46, beside, 4096);
    v.write(beside, &new, false).unwrap();
    rig.disks[holder].faults().pull();
    assert!(
        e.cache().drain().is_err(),
        "destaged around a block that may read again"
    );
    let status = e.cache_status();
    assert_eq!(e.layouts().lost_bytes() + status.lost_bytes, 0, "given up");
    assert!(status.dirty_bytes > 0, "the piece left the log");
    let mut got = vec![0u8; 4096];
    v.read(beside, &mut got).unwrap();
    assert_same(&got, &new, "the piece, from the log");
    rig.disks[holder].faults().reinsert();
    assert!(v.read(0, &mut got).is_err(), "zeros were written over the rotten block");
    e.cache().drain().unwrap();
    assert_eq!(e.cache_status().dirty_bytes, 0);
    assert_eq!(e.layouts().lost_bytes(), 4096);
    v.read(beside, &mut got).unwrap();
    assert_same(&got, &new, "the piece, destaged");
}

/// Lost ranges of a slab set that no longer exists (freed while the record of lost ranges
/// could not be rewritten) are forgotten at the next open, and the record rewritten: a set
/// made later under its number would otherwise have its reads refused there. Those of a set
/// that exists stay.
#[test]
fn lost_ranges_of_a_set_freed_since_are_forgotten_at_the_open() {
    let LostInARow { mut rig, v, in_row, .. } = lost_in_a_row();
    let lost_mo = in_row.iter().find(|b| b.0 == 0).unwrap().1;
    let beside = in_row.iter().find(|b| b.1 == lost_mo && b.0 != 0).unwrap().0;
    v.write(beside, &pattern(45, beside, 4096), false).unwrap();
    rig.engine().cache().drain().unwrap();
    // Where the vdisk's first block lies in its set: the layout recorded it lost. The vdisk
    // lies in its set's first grain, in order.
    let set = rig.engine().layouts().sets()[0].clone();
    let (at, _) = set.lost_within(0, u64::MAX)[0];
    drop(v);
    // A record of what the log lost: a block of the vdisk that reads, and a freed set's.
    let lost = 4096;
    let meta = rig.engine().pool().meta();
    let key: &[u8] = b"write-back-lost";
    let freed = set.id + 7;
    let record = serde_json::json!({"sets": {
        set.id.to_string(): {(at + beside).to_string(): at + beside + lost},
        freed.to_string(): {"0": 1 << 20},
    }});
    let mut b = MetaBatch::new();
    b.put(CF_POOL, key, serde_json::to_vec(&record).unwrap());
    meta.commit(b, true).unwrap();
    drop(set);
    rig.reopen();
    assert_eq!(rig.engine().cache_status().lost_bytes, lost);
    let record: serde_json::Value =
        serde_json::from_slice(&rig.engine().pool().meta().get(CF_POOL, key).unwrap().unwrap()).unwrap();
    assert!(record["sets"].get(freed.to_string()).is_none(), "{record}");
    let mut got = vec![0u8; 4096];
    let v = rig.engine().vdisk("v").unwrap();
    let err = v.read(beside, &mut got).expect_err("a lost block was read");
    assert!(err.to_string().contains("write-back log lost it"), "{err}");
    v.read(beside + 4096, &mut got).unwrap();
}
