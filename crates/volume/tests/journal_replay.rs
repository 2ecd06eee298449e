//! Replay of the stripe journal after a crash: a region written when the pool stopped is made
//! consistent row by row. A row that cannot be (a member unreadable there) does not stop the
//! rows after it, and the region stays marked until a later replay finishes it.

mod common;

use common::{pattern, spec, Rig, MIB};
use tessera_disk::{BlockDevice, FaultOp};
use tessera_volume::{Engine, LayoutKind, Provisioning};

const SIZE: u64 = 2 * MIB;
const IL: u64 = 16 << 10;

/// Puts `bytes` straight onto member `m` of the vdisk's only slab set at row `row`, as a write
/// torn by a crash leaves one member changed and the others not.
fn tear(rig: &Rig, m: usize, row: u64, bytes: &[u8]) {
    let set = rig.engine().layouts().sets().pop().unwrap();
    let slab = rig.engine().layouts().health(&set).members[m];
    let at = rig.engine().pool().slab_offset(slab) + row * IL;
    rig.disks[slab.disk as usize].inner().write_at(bytes, at).unwrap();
}

fn mismatched_rows(rig: &Rig) -> Vec<u64> {
    let set = rig.engine().layouts().sets().pop().unwrap();
    let mut rows: Vec<u64> = rig
        .engine()
        .layouts()
        .scrub_set(&set)
        .unwrap()
        .into_iter()
        .map(|m| m.row)
        .collect();
    rows.dedup();
    rows
}

/// A pool of four disks with vdisk `v` of `kind` (a mirror of two columns), written whole with
/// FUA: durable, and the region's Dirty record is left for the next checkpoint, which a
/// "crash" (a reopen) never reaches.
fn written(kind: LayoutKind) -> Rig {
    let rig = Rig::new(4, 64 * MIB, MIB);
    let mut s = spec("v", SIZE, kind, Provisioning::Thin);
    if kind == LayoutKind::Mirror {
        s.columns = Some(2);
    }
    rig.engine().create_vdisk(&s).unwrap();
    rig.engine()
        .vdisk("v")
        .unwrap()
        .write(0, &pattern(1, 0, SIZE as usize), true)
        .unwrap();
    rig
}

#[test]
fn a_row_that_cannot_be_resynced_does_not_stop_the_region_nor_end_its_record() {
    for kind in [LayoutKind::Parity, LayoutKind::Mirror] {
        let mut rig = written(kind);
        // Rows 1 and 5 torn on member 0; row 1 unreadable on every member at restart.
        let garbage = vec![0xA5u8; IL as usize];
        tear(&rig, 0, 1, &garbage);
        tear(&rig, 0, 5, &garbage);
        let set = rig.engine().layouts().sets().pop().unwrap();
        let members = rig.engine().layouts().health(&set).members;
        for m in &members {
            let at = rig.engine().pool().slab_offset(*m) + IL;
            rig.disks[m.disk as usize].faults().fail_range(at, IL, FaultOp::Read);
        }
        rig.reopen();
        let rows = mismatched_rows(&rig);
        assert!(
            !rows.contains(&5),
            "{kind:?}: row 5 comes after the unreadable row 1 and must be resynced anyway: {rows:?}"
        );
        // The disk answers again at the next start: the region's record was kept, so row 1
        // is resynced then.
        for m in &members {
            rig.disks[m.disk as usize].faults().clear();
        }
        rig.reopen();
        assert_eq!(
            mismatched_rows(&rig),
            Vec::<u64>::new(),
            "{kind:?}: the region was forgotten before it was consistent"
        );
        rig.assert_consistent();
    }
}

/// A journal record that points past the end of its set's slabs (damaged, or written by a
/// fault) is not replayed: its bytes would land in the next slab on the disk, another set's
/// or another vdisk's data. It is skipped, and the neighbour is unharmed.
#[test]
fn a_journal_record_past_the_end_of_its_slabs_writes_nothing() {
    let mut rig = written(LayoutKind::Mirror);
    let set = rig.engine().layouts().sets().pop().unwrap();
    let member = rig.engine().layouts().health(&set).members[0];
    let slab_size = rig.engine().pool().slab_size();
    let next = rig.engine().pool().slab_offset(member) + slab_size;
    let mut before = vec![0u8; 8192];
    rig.disks[member.disk as usize]
        .inner()
        .read_at(&mut before, next)
        .unwrap();
    rig.engine()
        .layouts()
        .damage_update_record(set.id, slab_size - 4096, 0, vec![0xAB; 8192])
        .unwrap();
    rig.reopen();
    let mut after = vec![0u8; 8192];
    rig.disks[member.disk as usize]
        .inner()
        .read_at(&mut after, next)
        .unwrap();
    assert!(after == before, "the record's bytes landed in the next slab");
    rig.assert_consistent();
}

/// A region a restart could not make consistent (the disk of one of its members away) is
/// tried again at every checkpoint. Its data's checksums were recorded from what the data held
/// at the first try; rot that comes to that data afterwards must not have its checksums
/// recorded over them at a later try, and then be read back as data.
#[test]
fn rot_in_a_region_waiting_for_a_disk_is_not_vouched_for_by_a_later_try() {
    let mut rig = written(LayoutKind::Parity);
    let set = rig.engine().layouts().sets().pop().unwrap();
    let members = rig.engine().layouts().health(&set).members;
    // Restarted without the disk of member 0: every row of the region waits for it.
    let away = rig.disks[members[0].disk as usize].path().to_string();
    rig.engine = None;
    let reopened = {
        let opener = rig.opener();
        let without = |p: &str| match p == away {
            true => Err(tessera_disk::DiskError::Open {
                path: p.into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }),
            false => opener(p),
        };
        Engine::open(&rig.dir.path().join("pool"), &without).unwrap()
    };
    rig.engine = Some(reopened);
    // The first block of rows 2 and 9 rots on every member still there (of each row, two
    // data members at least), and a checkpoint tries the region again.
    for row in [2, 9] {
        for m in 1..members.len() {
            tear(&rig, m, row, &[0x5A; 4096]);
        }
    }
    rig.engine().checkpoint().unwrap();
    let v = rig.engine().vdisk("v").unwrap();
    let mut refused = 0;
    for off in (0..SIZE).step_by(4096) {
        let mut got = vec![0u8; 4096];
        match v.read(off, &mut got) {
            Ok(()) => assert!(got == pattern(1, off, 4096), "offset {off}: rot read back as data"),
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 0, "no read came to the rotten blocks");
}
