//! A disk on RADOS, against the cluster `scripts/test-scale-out.sh` starts (TESSERA_CEPH_CONF):
//! it reads back what was written across object boundaries and zeros where nothing was (one
//! read at a time or a batch in flight together), it refuses bad requests, writes held back
//! for an object go together in their order, and a disk of a replaced owner cannot write
//! where the new owner wrote.
#![cfg(feature = "fencing")]

mod common;

use std::sync::Arc;

use common::{ceph, ceph_conf, TEST_POOL};

use rand::{Rng, SeedableRng};
use tessera_disk::{AlignedBuf, BlockDevice, DiskError, ReadReq, ReadRing, ReadVia, RingRead, RingWrite};
use tessera_ownership::fenced_disk::{FencedDisk, Walk, OBJECT_BYTES};
use tessera_rados::Cluster;

const MIB: u64 = 1 << 20;

/// A ring of `entries` for test `t`, or None (the test then says it was skipped: io_uring is
/// not available here).
fn ring_or_skip(t: &str, entries: u32) -> Option<ReadRing<(usize, AlignedBuf)>> {
    match ReadRing::new(entries) {
        Ok(ring) => Some(ring),
        Err(_) => {
            tessera_disk::skip(t, "io_uring unavailable");
            None
        }
    }
}

fn disk(c: &Arc<Cluster>, prefix: &str, size: u64, epoch: i64) -> FencedDisk {
    FencedDisk::new(Cluster::shared_pool(c, TEST_POOL).unwrap(), prefix, size, epoch).unwrap()
}

fn random(seed: u64, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut b[..]);
    b
}

#[test]
fn a_disk_on_rados_reads_back_what_was_written_and_zeros_elsewhere() {
    let t = "a_disk_on_rados_reads_back_what_was_written_and_zeros_elsewhere";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let prefix = format!("{t}-{}", std::process::id());
    let d = disk(&c, &prefix, 64 * MIB, 1);
    // Across the boundary of the first two objects.
    let at = OBJECT_BYTES - 8192;
    let data = random(1, 16384);
    d.write_at(&data, at).unwrap();
    let mut back = AlignedBuf::zeroed(16384);
    d.read_at(&mut back, at).unwrap();
    assert!(back[..] == data[..], "read back differs");
    // Never written, and past what was written in a written object: zeros.
    let mut far = AlignedBuf::zeroed(8192);
    far.fill(0xAA);
    d.read_at(&mut far, 40 * MIB).unwrap();
    assert!(far.iter().all(|&b| b == 0));
    far.fill(0xAA);
    d.read_at(&mut far, OBJECT_BYTES + 65536).unwrap();
    assert!(far.iter().all(|&b| b == 0));
    // Bad requests are refused, naming the disk.
    let mut odd = AlignedBuf::zeroed(4096);
    assert!(matches!(d.read_at(&mut odd, 100), Err(DiskError::Unaligned { .. })));
    assert!(matches!(d.write_at(&odd, 64 * MIB), Err(DiskError::OutOfRange { .. })));
    assert!(FencedDisk::new(Cluster::shared_pool(&c, TEST_POOL).unwrap(), &prefix, 1000, 1).is_err());
    // A RADOS pool with pool snapshots, whose OSDs would not order writes by epoch.
    let snapped = format!("{TEST_POOL}-snapped-{}", std::process::id());
    c.create_pool(&snapped).unwrap();
    c.pool(&snapped)
        .unwrap()
        .create_pool_snapshot("by-the-administrator")
        .unwrap();
    let e = FencedDisk::new(Cluster::shared_pool(&c, &snapped).unwrap(), &prefix, 64 * MIB, 1)
        .err()
        .expect("a disk in a pool with pool snapshots was opened");
    assert!(e.to_string().contains("pool snapshots"), "{e}");
    c.delete_pool(&snapped).unwrap();
    // Removed, every object goes: the written range reads as zeros again.
    let pool = c.pool(TEST_POOL).unwrap();
    assert!(pool.size(&format!("{prefix}.{:016x}", 1)).unwrap().is_some());
    d.remove_objects().unwrap();
    assert!(pool.size(&format!("{prefix}.{:016x}", 0)).unwrap().is_none());
    assert!(pool.size(&format!("{prefix}.{:016x}", 1)).unwrap().is_none());
    d.read_at(&mut back, at).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

/// A disk's objects are removed, wherever they are, and nothing of another disk whose
/// objects' names look alike, whichever way they are found: by listing the pool (a large thin
/// disk mostly unwritten, where the pool holds fewer objects than the disk spans) or by every
/// index the disk spans.
#[test]
fn removing_a_disk_removes_its_objects_and_no_others() {
    let t = "removing_a_disk_removes_its_objects_and_no_others";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    // 1 TiB (262,144 indexes) listed; 64 MiB (16) walked index by index.
    for (size, walk) in [(1u64 << 40, Walk::Listing), (64 * MIB, Walk::Indexes)] {
        remove_and_check(&c, &format!("{t}-{}-{walk:?}", std::process::id()), size, walk);
    }
}

fn remove_and_check(c: &Arc<Cluster>, prefix: &str, size: u64, walk: Walk) {
    let d = disk(c, prefix, size, 1);
    let block = random(3, 4096);
    let written = [0, (size / OBJECT_BYTES / 3) * OBJECT_BYTES, size - OBJECT_BYTES];
    for &at in &written {
        d.write_at(&block, at).unwrap();
    }
    d.flush().unwrap();
    let pool = c.pool(TEST_POOL).unwrap();
    let others = [
        format!("{prefix}x.{:016x}", 1),
        format!("{prefix}.{:016x}", size / OBJECT_BYTES),
        format!("{prefix}.data.{:016x}", 2),
        format!("{prefix}.{:x}", 5),
    ];
    for o in &others {
        pool.write_full(o, b"not the disk's").unwrap();
    }
    d.remove_objects_by(walk).unwrap();
    for &at in &written {
        let o = format!("{prefix}.{:016x}", at / OBJECT_BYTES);
        assert!(pool.size(&o).unwrap().is_none(), "{o} stays");
    }
    for o in &others {
        assert!(pool.size(o).unwrap().is_some(), "{o} was removed");
        pool.remove(o).unwrap();
    }
    let mut back = AlignedBuf::zeroed(4096);
    d.read_at(&mut back, written[1]).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

/// A batch of reads (one operation per object, all in flight) returns what reads one at a
/// time return: neighbouring pieces of one object, a read across objects, an object never
/// written, a read past what an object holds; a bad request fails alone.
#[test]
fn a_batch_of_reads_matches_reads_one_at_a_time() {
    let t = "a_batch_of_reads_matches_reads_one_at_a_time";
    let Some(conf) = ceph_conf(t) else { return };
    let c = ceph(&conf);
    let prefix = format!("{t}-{}", std::process::id());
    let d = disk(&c, &prefix, 64 * MIB, 1);
    d.write_at(&random(10, 256 * 1024), 0).unwrap();
    d.write_at(&random(11, 16384), OBJECT_BYTES - 8192).unwrap();
    d.write_at(&random(12, 8192), 3 * OBJECT_BYTES + 4096).unwrap();
    // (offset, length): neighbours in object 0 (read as one extent), across objects 0 and
    // 1, neighbours in object 2 never written, neighbours that run past what object 3 holds,
    // a piece of object 3 read again, out of range, unaligned.
    let asked: [(u64, usize); 11] = [
        (0, 65536),
        (65536, 65536),
        (131072, 4096),
        (OBJECT_BYTES - 12288, 24576),
        (2 * OBJECT_BYTES + 8192, 8192),
        (2 * OBJECT_BYTES + 16384, 4096),
        (3 * OBJECT_BYTES, 65536),
        (3 * OBJECT_BYTES + 65536, 4096),
        (3 * OBJECT_BYTES + 8192, 4096),
        (64 * MIB, 4096),
        (4096 + 100, 4096),
    ];
    let mut bufs: Vec<AlignedBuf> = asked
        .iter()
        .map(|&(_, len)| {
            let mut b = AlignedBuf::zeroed(len);
            b.fill(0xAA);
            b
        })
        .collect();
    let mut reqs: Vec<ReadReq> = bufs
        .iter_mut()
        .zip(&asked)
        .map(|(b, &(offset, _))| ReadReq {
            buf: &mut b[..],
            offset,
        })
        .collect();
    let results = d.read_many(&mut reqs);
    assert_eq!(results.len(), asked.len());
    for (i, (&(offset, len), r)) in asked.iter().zip(&results).enumerate() {
        let mut alone = AlignedBuf::zeroed(len);
        match d.read_at(&mut alone, offset) {
            Ok(()) => {
                assert!(r.is_ok(), "request {i}: {r:?}");
                assert!(bufs[i][..] == alone[..], "request {i} differs from a read of its own");
            }
            Err(e) => assert_eq!(
                r.as_ref().map_err(|e| std::mem::discriminant(e)),
                Err(std::mem::discriminant(&e)),
                "request {i}"
            ),
        }
    }
    assert!(results[9].is_err() && results[10].is_err());
    assert!(
        bufs[4].iter().chain(bufs[5].iter()).all(|&b| b == 0),
        "an object never written reads as zeros"
    );
    assert!(
        bufs[6][12288..].iter().chain(bufs[7].iter()).all(|&b| b == 0),
        "past an object's end reads as zeros"
    );
    assert!(bufs[8][..] == bufs[6][8192..12288], "a piece read twice reads the same");
    d.remove_objects().unwrap();
}

/// Reads started on a connection's ring (completed from librados' thread, no worker between)
/// return what reads one at a time return, while writes are on their way and held back for
/// the objects read: across objects, never written, past an object's end; a bad request
/// fails alone. Dropping the ring with reads in flight waits for them.
#[test]
fn reads_on_a_ring_match_reads_one_at_a_time() {
    let t = "reads_on_a_ring_match_reads_one_at_a_time";
    let Some(conf) = ceph_conf(t) else { return };
    let Some(mut ring) = ring_or_skip(t, 8) else { return };
    let c = ceph(&conf);
    let prefix = format!("{t}-{}", std::process::id());
    let d = disk(&c, &prefix, 64 * MIB, 1);
    let via = d.read_via().expect("a disk on RADOS reads in the background");
    assert!(matches!(via, ReadVia::Async(_)));
    // Made, then written again and again without a flush.
    d.write_at(&random(20, 256 * 1024), 0).unwrap();
    d.write_at(&random(21, 16384), OBJECT_BYTES - 8192).unwrap();
    for i in 0..16u64 {
        d.write_at(&random(30 + i, 8192), i * 16384).unwrap();
        d.write_at(&random(50 + i, 4096), OBJECT_BYTES + i * 8192).unwrap();
    }
    let asked: [(u64, usize); 7] = [
        (0, 65536),
        (4096, 4096),
        (OBJECT_BYTES - 12288, 24576),
        (2 * OBJECT_BYTES + 8192, 8192),
        (OBJECT_BYTES + 65536, 8192),
        (64 * MIB, 4096),
        (4096 + 100, 4096),
    ];
    for (i, &(offset, len)) in asked.iter().enumerate() {
        let mut buf = AlignedBuf::zeroed(len);
        buf.fill(0xAA);
        let read = RingRead {
            via: via.clone(),
            at: buf.as_mut_ptr(),
            len: len as u32,
            offset,
            io: None,
        };
        // SAFETY: the buffer moves into the tag; its heap memory stays put.
        unsafe { ring.start((i, buf), &[read]) };
    }
    let mut done = Vec::new();
    ring.drain(&mut done);
    assert_eq!(done.len(), asked.len());
    for ((i, buf), ok) in done {
        let (offset, len) = asked[i];
        let mut alone = AlignedBuf::zeroed(len);
        match d.read_at(&mut alone, offset) {
            Ok(()) => {
                assert!(ok, "request {i} failed on the ring");
                assert!(buf[..] == alone[..], "request {i} differs from a read of its own");
            }
            Err(_) => assert!(!ok, "request {i} passed on the ring"),
        }
        if i == 3 {
            assert!(buf.iter().all(|&b| b == 0), "an object never written reads as zeros");
        }
    }
    // Dropped with reads in flight: the drop waits for them.
    for i in 0..32usize {
        let mut buf = AlignedBuf::zeroed(65536);
        let read = RingRead {
            via: via.clone(),
            at: buf.as_mut_ptr(),
            len: 65536,
            offset: (i as u64 % 4) * OBJECT_BYTES,
            io: None,
        };
        // SAFETY: as above.
        unsafe { ring.start((i, buf), &[read]) };
    }
    drop(ring);
    d.flush().unwrap();
    d.remove_objects().unwrap();
}

/// Writes started on a ring complete there once the OSDs applied them: many at once, to
/// objects that exist, some crossing from one object into the next and many to one object
/// (held and sent together), read back through another connection before any flush. A
/// write that makes an object goes the same way; a write a newer owner's epoch refuses
/// completes as failed, the flushes fail, and
/// the writes after it are not started.
#[test]
fn writes_on_a_ring_complete_once_the_cluster_applied_them() {
    let t = "writes_on_a_ring_complete_once_the_cluster_applied_them";
    let Some(conf) = ceph_conf(t) else { return };
    let Some(mut ring) = ring_or_skip(t, 8) else { return };
    let c = ceph(&conf);
    let prefix = format!("{t}-{}", std::process::id());
    let d = disk(&c, &prefix, 64 * MIB, 1);
    let writer = d.write_via().expect("a disk on RADOS writes in the background");
    for object in 0..4 {
        d.write_at(&random(1, 4096), object * OBJECT_BYTES).unwrap();
    }
    let sent_before = d.writes_sent();
    // 4 KiB writes all over the four objects, and 64 KiB ones across each boundary, none
    // over another.
    let mut asked: Vec<(u64, usize)> = (0..96u64)
        .map(|i| (65536 + (i % 4) * OBJECT_BYTES + (i / 4) * 8192, 4096))
        .collect();
    asked.extend((1..4u64).map(|o| (o * OBJECT_BYTES - 32768, 65536)));
    for (i, &(offset, len)) in asked.iter().enumerate() {
        let buf = random(100 + i as u64, len);
        let w = RingWrite {
            disk: writer.clone(),
            at: buf.as_ptr(),
            len: len as u32,
            offset,
            io: None,
        };
        // SAFETY: the buffer moves into the tag; its heap memory stays put.
        unsafe { ring.start_writes((i, buf), &[w]) };
    }
    let mut done = Vec::new();
    ring.drain(&mut done);
    assert_eq!(done.len(), asked.len());
    assert!(done.iter().all(|(_, ok)| *ok), "a write on the ring failed");
    let ops = d.writes_sent() - sent_before;
    assert!(
        ops < asked.len() as u64,
        "{} writes took {ops} operations: none went together",
        asked.len()
    );
    // Before any flush, through another connection, as a gateway taking the pool over.
    let other = disk(&ceph(&conf), &prefix, 64 * MIB, 1);
    for ((i, buf), _) in &done {
        let (offset, len) = asked[*i];
        let mut back = AlignedBuf::zeroed(len);
        other.read_at(&mut back, offset).unwrap();
        assert!(
            back[..] == buf[..],
            "write {i} ({len} bytes at {offset}) is not in the cluster"
        );
    }
    // An object never written: made by the write, on the ring like any other.
    let io = tessera_disk::DiskIo::new();
    let buf = random(7, 4096);
    let made = buf.to_vec();
    let w = RingWrite {
        disk: writer.clone(),
        at: buf.as_ptr(),
        len: 4096,
        offset: 10 * OBJECT_BYTES,
        io: Some(io.clone()),
    };
    // SAFETY: as above.
    unsafe { ring.start_writes((0, buf), &[w]) };
    let mut done = Vec::new();
    ring.drain(&mut done);
    assert!(done[0].1, "a write that makes an object failed on the ring");
    assert_eq!(io.figures(tessera_disk::DiskOp::Write).ops, 1);
    let mut back = AlignedBuf::zeroed(4096);
    other.read_at(&mut back, 10 * OBJECT_BYTES).unwrap();
    assert!(
        back[..] == made[..],
        "the write that made an object is not in the cluster"
    );
    d.flush().unwrap();
    // Dropped with writes in flight: the drop waits for them, and they landed.
    for i in 0..16usize {
        let buf = random(300 + i as u64, 4096);
        let w = RingWrite {
            disk: writer.clone(),
            at: buf.as_ptr(),
            len: 4096,
            offset: 2 * OBJECT_BYTES + 4096 * (64 + i as u64),
            io: None,
        };
        // SAFETY: as above.
        unsafe { ring.start_writes((i, buf), &[w]) };
    }
    drop(ring);
    for i in 0..16u64 {
        let mut back = AlignedBuf::zeroed(4096);
        other.read_at(&mut back, 2 * OBJECT_BYTES + 4096 * (64 + i)).unwrap();
        assert!(
            back[..] == random(300 + i, 4096)[..],
            "write {i} started before the drop was lost"
        );
    }
    // A newer owner writes the first object: this disk's write there is refused.
    let newer = disk(&ceph(&conf), &prefix, 64 * MIB, 2);
    let theirs = random(8, 4096);
    newer.write_at(&theirs, 0).unwrap();
    let mut ring = ReadRing::<(usize, AlignedBuf)>::new(8).unwrap();
    let io = tessera_disk::DiskIo::new();
    let buf = random(9, 4096);
    let w = RingWrite {
        disk: writer.clone(),
        at: buf.as_ptr(),
        len: 4096,
        offset: 0,
        io: Some(io.clone()),
    };
    // SAFETY: as above.
    unsafe { ring.start_writes((0, buf), &[w]) };
    let mut done = Vec::new();
    ring.drain(&mut done);
    assert!(!done[0].1, "a write the newer owner's epoch refused completed whole");
    let counted = io.figures(tessera_disk::DiskOp::Write);
    assert_eq!(
        (counted.ops, counted.errors),
        (1, 1),
        "a refused write is counted, as failed"
    );
    assert!(d.flush().is_err(), "a flush forgot the refused write");
    other.read_at(&mut back, 0).unwrap();
    assert!(back[..] == theirs[..], "the refused write changed the block");
    // From then on the disk vouches for nothing: a write to an object it wrote before (and
    // the newer owner did not) is declined, not started, for the synchronous way and its
    // failing flush to answer (a FUA write must not be answered durable by the ring).
    let buf = random(10, 4096);
    let w = RingWrite {
        disk: writer.clone(),
        at: buf.as_ptr(),
        len: 4096,
        offset: OBJECT_BYTES,
        io: Some(io.clone()),
    };
    // SAFETY: as above.
    unsafe { ring.start_writes((0, buf), &[w]) };
    let mut done = Vec::new();
    ring.drain(&mut done);
    assert!(!done[0].1, "a write after a refusal completed on the ring");
    assert_eq!(
        io.figures(tessera_disk::DiskOp::Write).ops,
        1,
        "a write after a refusal was started"
    );
    drop(writer);
    drop(d);
    newer.remove_objects().unwrap();
}

#[test]
fn a_replaced_owners_disk_cannot_write_where_the_new_owner_wrote() {
    let t = "a_replaced_owners_disk_cannot_write_where_the_new_owner_wrote";
    let Some(conf) = ceph_conf(t) else { return };
    let prefix = format!("{t}-{}", std::process::id());
    let (ca, cb) = (ceph(&conf), ceph(&conf));
    let old = disk(&ca, &prefix, 16 * MIB, 5);
    let new = disk(&cb, &prefix, 16 * MIB, 7);
    old.write_at(&random(2, 4096), 0).unwrap();
    old.flush().unwrap();
    let theirs = random(3, 4096);
    new.write_at(&theirs, 0).unwrap();
    new.flush().unwrap();
    // The old owner's write to an object it made: refused by the OSD, the write itself
    // fails (it returns only once applied), and so does every flush after it.
    let e = old
        .write_at(&random(4, 4096), 0)
        .expect_err("the old owner's write returned before the OSD refused it");
    assert!(e.to_string().contains("rados:"), "{e}");
    // Refused for now, not a fault of the disk: the engine does not fail it for that.
    assert!(
        e.is_unavailable() && e.to_string().contains("a newer owner wrote here"),
        "{e}"
    );
    assert!(old.flush().is_err(), "a flush forgot the refused write");
    assert!(old.flush().is_err(), "a later flush forgot the refused write");
    let refused = old.refused().expect("the disk says a write was refused");
    assert!(
        refused.contains("4096 bytes at byte 0") && refused.contains("a newer owner wrote here"),
        "{refused}"
    );
    assert_eq!(new.refused(), None);
    // From then on its writes are refused at once, even to an object the new owner never
    // touched, which would take them (there is no blocklist in this test; in a takeover, its
    // placement group may not have heard of the fence yet).
    let e = old
        .write_at(&random(9, 4096), 12 * MIB)
        .expect_err("a replaced owner's disk went on writing");
    assert!(e.to_string().contains("a newer owner wrote here"), "{e}");
    let mut back = AlignedBuf::zeroed(4096);
    new.read_at(&mut back, 12 * MIB).unwrap();
    assert!(back.iter().all(|&b| b == 0), "a replaced owner's write landed");
    // To an object it never wrote, which the new owner made: refused too (by the disk itself,
    // told already; the OSD's refusal of such a write is the stale disk's, below).
    new.write_at(&theirs, 8 * MIB).unwrap();
    new.flush().unwrap();
    let e = old
        .write_at(&random(5, 4096), 8 * MIB)
        .expect_err("the old owner wrote over the new one");
    assert!(e.to_string().contains("a newer owner wrote here"), "{e}");
    // A disk of the old owner that wrote nothing yet: its first write, to an object the new
    // owner made, is refused, and from then on its flushes fail too.
    let stale = disk(&ca, &prefix, 16 * MIB, 5);
    let e = stale
        .write_at(&random(6, 4096), 8 * MIB)
        .expect_err("the old owner wrote over the new one");
    assert!(e.to_string().contains("a newer owner wrote here"), "{e}");
    assert!(
        stale.flush().is_err(),
        "a flush forgot a refused write that was to make its object"
    );
    assert!(stale.refused().is_some_and(|r| r.contains("a newer owner wrote here")));
    drop(stale);
    // Nor can it remove the objects the new owner wrote.
    let e = old
        .remove_objects()
        .expect_err("the old owner removed the new owner's objects");
    assert!(e.is_out_of_order(), "{e}");
    let mut back = AlignedBuf::zeroed(4096);
    for at in [0, 8 * MIB] {
        new.read_at(&mut back, at).unwrap();
        assert!(back[..] == theirs[..], "a refused write changed the block at {at}");
    }
}

/// A gateway fenced off by a newer owner (its client blocklisted) whose hosts only read: the
/// OSDs refuse its reads, and its disk says so as it does of a refused write, for a read of
/// its own and a read on a connection's ring alike, so that the gateway opens the pool again
/// and finds it owned elsewhere. Until 2026-12-06 a refused read failed the host's request
/// and nothing more: a gateway whose hosts only read went on failing them as the owner.
/// Any other failure of a read says nothing of who owns the pool.
#[test]
fn a_fenced_owners_disk_says_its_reads_were_refused() {
    let t = "a_fenced_owners_disk_says_its_reads_were_refused";
    let Some(conf) = ceph_conf(t) else { return };
    let Some(mut ring) = ring_or_skip(t, 8) else { return };
    let prefix = format!("{t}-{}", std::process::id());
    let (ca, cb) = (ceph(&conf), ceph(&conf));
    let old = disk(&ca, &prefix, 16 * MIB, 5);
    let ringed = disk(&ca, &prefix, 16 * MIB, 5);
    old.write_at(&random(1, 4096), 0).unwrap();
    old.write_at(&random(2, 4096), OBJECT_BYTES).unwrap();
    old.flush().unwrap();
    let mut b = AlignedBuf::zeroed(4096);
    old.read_at(&mut b, 0).unwrap();
    // Reads that fail for another reason refuse nothing: past the end, a bad length.
    assert!(old.read_at(&mut b, 16 * MIB).is_err());
    assert_eq!(old.refused(), None);

    cb.blocklist(&ca.address().unwrap(), 3600).unwrap();
    // The newer owner reads both objects: its operations bring their placement groups the
    // map that blocklists the old one.
    let new = disk(&cb, &prefix, 16 * MIB, 7);
    new.read_at(&mut b, 0).unwrap();
    new.read_at(&mut b, OBJECT_BYTES).unwrap();

    let e = old.read_at(&mut b, 0).expect_err("a fenced owner's read was served");
    assert!(e.is_unavailable() && e.to_string().contains("fenced off"), "{e}");
    let refused = old.refused().expect("the disk says a read was refused");
    assert!(
        refused.contains("a read of 4096 bytes at byte 0") && refused.contains("fenced off"),
        "{refused}"
    );
    assert!(old.flush().is_err(), "a fenced owner's disk vouched for its writes");

    let via = ringed.read_via().expect("a disk on RADOS reads in the background");
    let mut buf = AlignedBuf::zeroed(8192);
    let read = RingRead {
        via,
        at: buf.as_mut_ptr(),
        len: 8192,
        offset: OBJECT_BYTES,
        io: None,
    };
    // SAFETY: the buffer moves into the tag; its heap memory stays put.
    unsafe { ring.start((0, buf), &[read]) };
    let mut done = Vec::new();
    ring.drain(&mut done);
    assert!(!done[0].1, "a fenced owner's read was served on the ring");
    let refused = ringed.refused().expect("the disk says a read on the ring was refused");
    assert!(
        refused.contains(&format!("a read of 8192 bytes at byte {OBJECT_BYTES}")) && refused.contains("fenced off"),
        "{refused}"
    );
    drop((old, ringed));
    new.remove_objects().unwrap();
}

/// A write returns once the OSDs applied it: thousands of small writes to objects that exist,
/// from four threads at once, read back through another connection before any flush (as the
/// gateway that takes the pool over would read them had this one died), and through the
/// writing disk; a flush then has nothing to wait for and succeeds.
#[test]
fn writes_are_in_the_cluster_when_they_return_without_a_flush() {
    let t = "writes_are_in_the_cluster_when_they_return_without_a_flush";
    let Some(conf) = ceph_conf(t) else { return };
    let prefix = format!("{t}-{}", std::process::id());
    let (ca, cb) = (ceph(&conf), ceph(&conf));
    let d = disk(&ca, &prefix, 16 * MIB, 1);
    let size = 16 * MIB as usize;
    // Made (and waited for) by a first write of each object.
    let mut model = random(20, size);
    d.write_at(&model, 0).unwrap();
    // Then overwritten many times over from four threads, each its own quarter, in blocks of
    // 4 KiB to 256 KiB: 64 MiB sent in all.
    let quarter = size / 4;
    std::thread::scope(|s| {
        for (q, part) in model.chunks_mut(quarter).enumerate() {
            let d = &d;
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(30 + q as u64);
                let mut sent = 0;
                while sent < 16 * MIB as usize {
                    let len = 4096 << rng.random_range(0..7u32);
                    let at = rng.random_range(0..(quarter - len) / 4096) * 4096;
                    rng.fill(&mut part[at..at + len]);
                    let buf = AlignedBuf::from_slice(&part[at..at + len]);
                    d.write_at(&buf, (q * quarter + at) as u64).unwrap();
                    sent += len;
                }
            });
        }
    });
    let mut back = AlignedBuf::zeroed(size);
    let other = disk(&cb, &prefix, 16 * MIB, 1);
    other.read_at(&mut back, 0).unwrap();
    assert!(
        back[..] == model[..],
        "a write that returned is not in the cluster before a flush"
    );
    back.fill(0);
    d.read_at(&mut back, 0).unwrap();
    assert!(back[..] == model[..], "a read missed a write before it");
    d.flush().unwrap();
    d.remove_objects().unwrap();
}

/// Writes to an object that has writes on their way are held and go together, and each
/// returns once the operation that carried it was applied: eight threads write again and
/// again over their own 16 blocks of one object (overlapping writes of 4 to 16 KiB, every
/// tenth a run that starts near the object's end and goes on into the next); every block
/// then reads back as its thread's last write left it, through the writing disk and
/// through another connection (before any flush), in far fewer operations than writes.
#[test]
fn writes_held_for_an_object_go_together_and_return_once_applied() {
    let t = "writes_held_for_an_object_go_together_and_return_once_applied";
    let Some(conf) = ceph_conf(t) else { return };
    let prefix = format!("{t}-{}", std::process::id());
    let (ca, cb) = (ceph(&conf), ceph(&conf));
    let size = 2 * OBJECT_BYTES as usize;
    let d = disk(&ca, &prefix, size as u64, 1);
    let mut model = random(40, size);
    d.write_at(&model, 0).unwrap();
    d.flush().unwrap();
    let before = d.writes_sent();
    let threads = 8usize;
    // Thread q's own: blocks 16q..16q+16 of the first object, and a run of 32 KiB at 4 MiB -
    // 240 KiB + 32 KiB q (the last thread's runs cross into the second object).
    let region = |q: usize| (q * 16 * 4096, 16 * 4096);
    let run_at = |q: usize| OBJECT_BYTES as usize - 256 * 1024 + q * 32768 + 16384;
    let writes = 150;
    let models: Vec<AlignedBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|q| {
                let (d, mut mine) = (&d, model.clone());
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(41 + q as u64);
                    let (start, len) = region(q);
                    for i in 0..writes {
                        let (at, n) = if i % 10 == 9 {
                            (run_at(q), 32768)
                        } else {
                            let n = 4096 << rng.random_range(0..3u32);
                            (start + rng.random_range(0..(len - n) / 4096 + 1) * 4096, n)
                        };
                        rng.fill(&mut mine[at..at + n]);
                        d.write_at(&AlignedBuf::from_slice(&mine[at..at + n]), at as u64)
                            .unwrap();
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (q, mine) in models.iter().enumerate() {
        let (start, len) = region(q);
        model[start..start + len].copy_from_slice(&mine[start..start + len]);
        let at = run_at(q);
        model[at..at + 32768].copy_from_slice(&mine[at..at + 32768]);
    }
    assert!(run_at(threads - 1) + 32768 > OBJECT_BYTES as usize);
    let check = |d: &FencedDisk, what: &str| {
        let mut back = AlignedBuf::zeroed(size);
        d.read_at(&mut back, 0).unwrap();
        assert!(back[..] == model[..], "{what}");
    };
    check(
        &disk(&cb, &prefix, size as u64, 1),
        "a write that returned is not in the cluster",
    );
    check(&d, "a read missed a write");
    d.flush().unwrap();
    let sent = d.writes_sent() - before;
    let pieces = threads * writes + writes / 10;
    assert!(
        (sent as usize) < pieces * 3 / 4,
        "{pieces} object writes went as {sent} operations: few were held together"
    );
    eprintln!("{t}: {pieces} object writes from {threads} threads went as {sent} operations");
    d.remove_objects().unwrap();
}

/// Writes held back behind writes on their way to the same object are not sent once the
/// lease may have lapsed: they waited, and are refused when their turn comes, as a write
/// started then would be. (Until 2026-12-06 they went out whenever their turn came.) The
/// lease lapses just after sixteen writes to one object were started on a ring, two on their
/// way and the rest held; the OSDs take longer than that to answer the two, but a thread
/// put off the processors in between could let the held ones go first, so up to five tries.
#[test]
fn writes_held_behind_others_are_not_sent_past_the_lease() {
    use std::time::Duration;
    use tessera_ownership::lease_clock::Stamp;
    use tessera_ownership::LeaseClock;

    let t = "writes_held_behind_others_are_not_sent_past_the_lease";
    let Some(conf) = ceph_conf(t) else { return };
    let Some(mut ring) = ring_or_skip(t, 32) else { return };
    let c = ceph(&conf);
    let prefix = format!("{t}-{}", std::process::id());
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let clock = LeaseClock::granted(Stamp::now(), Duration::from_secs(30));
        let d = disk(&c, &prefix, 8 * MIB, 1).under_lease(clock.clone());
        let writer = d.write_via().expect("a disk on RADOS writes in the background");
        for i in 0..16usize {
            let buf = random(50 + i as u64, 4096);
            let w = RingWrite {
                disk: writer.clone(),
                at: buf.as_ptr(),
                len: 4096,
                offset: i as u64 * 4096,
                io: None,
            };
            // SAFETY: the buffer moves into the tag; its heap memory stays put.
            unsafe { ring.start_writes((i, buf), &[w]) };
        }
        clock.lapsed();
        let mut done = Vec::new();
        ring.drain(&mut done);
        assert_eq!(done.len(), 16);
        done.sort_by_key(|((i, _), _)| *i);
        // The two sent before the lease lapsed were applied: refusals are for the held.
        assert!(done[0].1 && done[1].1, "a write sent while the lease held failed");
        let refused = done.iter().filter(|(_, ok)| !ok).count();
        outcomes.push(refused);
        if refused > 0 {
            // Past its lease this disk removes nothing: another connection does.
            disk(&c, &prefix, 8 * MIB, 1).remove_objects().unwrap();
            return;
        }
    }
    panic!("every held write was sent past the lease, in each of five tries: {outcomes:?}");
}

/// The engine unchanged on a disk on RADOS: a pool with the `simple` layout (redundancy is
/// the RADOS pool's), a vdisk written, the pool exported, then opened again through another
/// cluster connection, as another gateway would: every block reads back, the check is clean.
#[test]
fn the_engine_runs_a_pool_on_a_disk_on_rados_and_another_connection_opens_it() {
    use tessera_volume::{Engine, LayoutKind, VdiskSpec};
    let t = "the_engine_runs_a_pool_on_a_disk_on_rados_and_another_connection_opens_it";
    let Some(conf) = ceph_conf(t) else { return };
    let prefix = format!("{t}-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let pool_dir = dir.path().join("p");
    let size = 48 * MIB;
    let data = random(5, 6 * MIB as usize);
    {
        let c = ceph(&conf);
        let d: tessera_disk::DiskRef = Arc::new(disk(&c, &prefix, size, 1));
        let e = Engine::create_pool(&pool_dir, "p", vec![d], MIB).unwrap();
        let v = e
            .create_vdisk(&VdiskSpec::new("v", 16 * MIB, LayoutKind::Simple))
            .unwrap();
        // Across object boundaries: the data starts 1 MiB past a 4 MiB object's start.
        v.write(MIB, &data, false).unwrap();
        v.flush().unwrap();
        e.export().unwrap();
    }
    let c = ceph(&conf);
    let opener = |path: &str| -> Result<tessera_disk::DiskRef, DiskError> {
        assert_eq!(
            path,
            format!("rados:{TEST_POOL}/{prefix}"),
            "the pool names its disk by pool and prefix"
        );
        Ok(Arc::new(disk(&c, &prefix, size, 2)))
    };
    let e = Engine::open(&pool_dir, &opener).unwrap();
    let v = e.vdisk("v").unwrap();
    let mut back = vec![0u8; data.len()];
    v.read(MIB, &mut back).unwrap();
    assert!(
        back[..] == data[..],
        "the vdisk reads back wrong from the other connection"
    );
    let mut head = vec![0xAAu8; MIB as usize];
    v.read(0, &mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0), "what was never written reads as zeros");
    let check = e.check().unwrap();
    assert!(check.problems.is_empty(), "{:?}", check.problems);
}

/// A disk opened under a lease serves reads and writes, one at a time, in a batch and on a
/// ring, while the lease holds, and refuses every one of them (as a momentary refusal, not
/// the disk's fault) once it may have lapsed: a gateway that stalled past its lease serves
/// nothing when it runs again, before its renewal task has noticed and before the cluster's
/// blocklist has reached every OSD.
#[test]
fn a_disk_past_its_lease_serves_nothing() {
    use std::time::Duration;
    use tessera_ownership::lease_clock::Stamp;
    use tessera_ownership::LeaseClock;

    let t = "a_disk_past_its_lease_serves_nothing";
    let Some(conf) = ceph_conf(t) else { return };
    let Some(mut ring) = ring_or_skip(t, 8) else { return };
    let c = ceph(&conf);
    let prefix = format!("{t}-{}", std::process::id());
    let clock = LeaseClock::granted(Stamp::now(), Duration::from_secs(30));
    let d = disk(&c, &prefix, 64 * MIB, 1).under_lease(clock.clone());
    let via = d.read_via().expect("a disk on RADOS reads in the background");
    let writer = d.write_via().expect("a disk on RADOS writes in the background");
    let data = random(7, 8192);
    // Every way of reading and writing, each one's success told by `ok`.
    let every_way = |ring: &mut ReadRing<(usize, AlignedBuf)>| -> [bool; 5] {
        let wrote = d.write_at(&data, 0);
        let mut back = AlignedBuf::zeroed(8192);
        let read = d.read_at(&mut back, 0);
        let mut batch = AlignedBuf::zeroed(4096);
        let batched = d
            .read_many(&mut [ReadReq {
                offset: 4096,
                buf: &mut batch,
            }])
            .pop()
            .unwrap();
        for r in [&wrote, &read, &batched] {
            if let Err(e) = r {
                assert!(e.is_unavailable(), "refused as the disk's fault: {e}");
            }
        }
        if read.is_ok() {
            assert!(back[..] == data[..], "read back differs");
        }
        let mut buf = AlignedBuf::zeroed(4096);
        let r = RingRead {
            via: via.clone(),
            at: buf.as_mut_ptr(),
            len: 4096,
            offset: 0,
            io: None,
        };
        // SAFETY: the buffer moves into the tag; its heap memory stays put.
        unsafe { ring.start((0, buf), &[r]) };
        let w_buf = random(8, 4096);
        let w = RingWrite {
            disk: writer.clone(),
            at: w_buf.as_ptr(),
            len: 4096,
            offset: 65536,
            io: None,
        };
        // SAFETY: likewise.
        unsafe { ring.start_writes((1, w_buf), &[w]) };
        let mut done = Vec::new();
        ring.drain(&mut done);
        done.sort_by_key(|((i, _), _)| *i);
        [wrote.is_ok(), read.is_ok(), batched.is_ok(), done[0].1, done[1].1]
    };
    assert_eq!(every_way(&mut ring), [true; 5], "while the lease holds");
    clock.lapsed();
    assert_eq!(every_way(&mut ring), [false; 5], "once the lease may have lapsed");
    // Nor does it remove its objects (a destroy on its way): they may be another owner's.
    let pool = Cluster::shared_pool(&c, TEST_POOL).unwrap();
    let first = format!("{prefix}.{:016x}", 0);
    for walk in [Walk::Listing, Walk::Indexes] {
        let e = d.remove_objects_by(walk).expect_err("objects removed past the lease");
        assert!(e.to_string().contains("lease"), "{e}");
        assert!(
            pool.size(&first).unwrap().is_some(),
            "{first} was removed past the lease"
        );
    }
    // Past its time to live, as after a stall, without the renewal task saying so.
    let stalled = LeaseClock::granted(Stamp::now(), Duration::from_millis(200));
    let d = disk(&c, &format!("{prefix}-stalled"), 64 * MIB, 1).under_lease(stalled);
    d.write_at(&data, 0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut back = AlignedBuf::zeroed(8192);
    assert!(d.read_at(&mut back, 0).unwrap_err().is_unavailable());
    assert!(d.write_at(&data, 0).unwrap_err().is_unavailable());
}

/// A RADOS pool deleted under a disk: librados answers every operation on it as it answers
/// an object never written (ENOENT), and the disk must not read it as zeros. Every read
/// fails, one at a time, in a batch and on a ring, saying the pool is gone; the disk says
/// so, and no flush vouches for the writes that went with it. The pool's other readers
/// (its metadata's) are told the same.
#[test]
fn a_disk_whose_rados_pool_was_deleted_reads_nothing_as_zeros() {
    let t = "a_disk_whose_rados_pool_was_deleted_reads_nothing_as_zeros";
    let Some(conf) = ceph_conf(t) else { return };
    let Some(mut ring) = ring_or_skip(t, 8) else { return };
    let c = ceph(&conf);
    let doomed = format!("{TEST_POOL}-deleted-{}", std::process::id());
    c.create_pool(&doomed).unwrap();
    let on_doomed = || FencedDisk::new(Cluster::shared_pool(&c, &doomed).unwrap(), "disk", 16 * MIB, 1).unwrap();
    let (d, ringed) = (on_doomed(), on_doomed());
    let pool = Cluster::shared_pool(&c, &doomed).unwrap();
    d.write_at(&random(1, 8192), 0).unwrap();
    d.write_at(&random(2, 8192), OBJECT_BYTES).unwrap();
    d.flush().unwrap();
    pool.operate(
        "meta",
        &tessera_rados::WriteOp::new()
            .create(false)
            .omap_set(&[(&b"k"[..], &b"v"[..])]),
    )
    .unwrap();
    // While the pool is there, an object never written reads as zeros, and a missing one
    // as missing.
    let mut b = AlignedBuf::zeroed(8192);
    b.fill(0xAA);
    d.read_at(&mut b, 8 * MIB).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(pool.size("never").unwrap(), None);
    assert_eq!(pool.xattr("never", "a").unwrap(), None);
    assert!(pool.omap("never").unwrap().is_empty());

    c.delete_pool(&doomed).unwrap();
    for offset in [0, 8 * MIB] {
        let e = d
            .read_at(&mut b, offset)
            .expect_err("a read of a deleted pool was served");
        assert!(
            e.is_unavailable() && e.to_string().contains("is gone from the cluster"),
            "{e}"
        );
    }
    let mut reqs = [(0u64, 4096usize), (OBJECT_BYTES, 4096), (8 * MIB, 4096)]
        .map(|(offset, len)| (offset, AlignedBuf::zeroed(len)));
    let mut batch: Vec<ReadReq<'_>> = reqs
        .iter_mut()
        .map(|(offset, buf)| ReadReq {
            buf: &mut buf[..],
            offset: *offset,
        })
        .collect();
    for (i, r) in d.read_many(&mut batch).into_iter().enumerate() {
        let e = r.expect_err("a read of a deleted pool was served in a batch");
        assert!(e.to_string().contains("is gone from the cluster"), "{i}: {e}");
    }
    let refused = d.refused().expect("the disk says its pool is gone");
    assert!(refused.contains("is gone from the cluster"), "{refused}");
    assert!(
        d.flush().is_err(),
        "a disk whose pool was deleted vouched for its writes"
    );
    assert!(d.write_at(&random(3, 4096), 0).is_err());

    let via = ringed.read_via().expect("a disk on RADOS reads in the background");
    for (i, offset) in [0, 8 * MIB].into_iter().enumerate() {
        let mut buf = AlignedBuf::zeroed(4096);
        buf.fill(0xAA);
        let read = RingRead {
            via: via.clone(),
            at: buf.as_mut_ptr(),
            len: 4096,
            offset,
            io: None,
        };
        // SAFETY: the buffer moves into the tag; its heap memory stays put.
        unsafe { ring.start((i, buf), &[read]) };
    }
    let mut done = Vec::new();
    ring.drain(&mut done);
    assert_eq!(done.len(), 2);
    for ((i, _), ok) in done {
        assert!(!ok, "read {i} of a deleted pool was served on the ring");
    }
    let refused = ringed.refused().expect("the disk says its pool is gone");
    assert!(refused.contains("is gone from the cluster"), "{refused}");
    assert!(ringed.flush().is_err());

    for e in [
        pool.size("meta").map(drop).unwrap_err(),
        pool.xattr("meta", "a").map(drop).unwrap_err(),
        pool.omap("meta").map(drop).unwrap_err(),
        pool.read("meta", 0, &mut b).map(drop).unwrap_err(),
    ] {
        assert!(e.is_pool_gone() && e.errno().is_none(), "{e}");
    }
}
