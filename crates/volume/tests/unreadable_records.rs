//! Records of the grain map, the reference counts and the slab sets that cannot be read (a
//! damaged store): never taken for "nothing". The check names them, the scan finds them
//! without taking the grains they concern for dangling, spot-fix mends them from what the
//! running pool holds, and an import counts again or infers what it cannot read before it
//! hands out a slot or frees a set.

mod common;

use std::collections::BTreeMap;

use common::{contents, enable_dedup, pattern, populated, run_dedup, spec, Rig, MIB};
use tessera_pool::{MetaBatch, CF_POOL, CF_SLABSETS, CF_VDISKS};
use tessera_volume::{
    Compression, Engine, FindingKind, LayoutKind, Progress, Provisioning, Repair, Unreadable, VdiskSpec, HOT_REFS,
};

const GRAIN: u64 = 16 << 10;

fn assert_same(got: &BTreeMap<String, Vec<u8>>, want: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in want {
        let at = got[name].iter().zip(data).position(|(x, y)| x != y);
        assert!(at.is_none(), "{name} differs at byte {at:?}");
    }
}

/// New vdisks `c` (mirror) and `d` (parity) written whole, which takes the pool's free slots
/// of both classes.
fn fill_free_space(e: &Engine) {
    for (name, kind, seed) in [("c", LayoutKind::Mirror, 7), ("d", LayoutKind::Parity, 8)] {
        e.create_vdisk(&spec(name, 16 * MIB, kind, Provisioning::Thin))
            .unwrap()
            .write(0, &pattern(seed, 0, (16 * MIB) as usize), false)
            .unwrap();
    }
}

fn kinds(e: &Engine) -> BTreeMap<FindingKind, u64> {
    e.scan(&Progress::default()).unwrap().by_kind
}

#[test]
fn unreadable_records_under_a_running_pool_are_found_and_mended_from_memory() {
    let mut rig = populated();
    let before = {
        let e = rig.engine();
        e.damage_unreadable("a", 3, Unreadable::Count).unwrap(); // shared with a@s1
                                                                 // A change of the damaged count (a's copy on write drops a reference) keeps it
                                                                 // unreadable: read as 0 and moved, it would be a wrong number that looks right.
        e.vdisk("a")
            .unwrap()
            .write(3 * GRAIN, &pattern(4, 3 * GRAIN, GRAIN as usize), false)
            .unwrap();
        let before = contents(e);
        e.damage_unreadable("a", 0, Unreadable::GrainSize).unwrap();
        e.damage_unreadable("b", 0, Unreadable::SetDescriptor).unwrap();
        e.damage_unreadable("b", 5, Unreadable::GrainEntry).unwrap();
        e.damage_unreadable("a", 10, Unreadable::GrainKey).unwrap();
        e.damage_unreadable("a", 10, Unreadable::CountKey).unwrap();
        let problems = e.check().unwrap().problems;
        for named in [
            "the count record of slot",
            "the grain size record",
            "the slab set descriptor",
            "b: 1 grain map record(s) cannot be read",
            "a grain map record under a key of 12 bytes",
            "a count record under a key of 5 bytes",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(named)),
                "{named:?} is not among {problems:#?}"
            );
        }

        // Nothing else: the grains of the sets whose records cannot be read are judged by
        // what memory holds, not unmapped as pointing nowhere.
        assert_eq!(kinds(e), [(FindingKind::RecordMalformed, 6)].into_iter().collect());
        let fixed = e.spotfix(&Progress::default()).unwrap();
        // All but the count, which waits for the next import (memory holds it right).
        assert_eq!((fixed.fixed, fixed.changed, fixed.failed), (5, 0, 1));
        let left = e.check().unwrap().problems;
        assert!(
            left.len() == 2 && left.iter().all(|p| p.contains("slot 0x100000003")),
            "{left:#?}"
        );
        assert_same(&contents(e), &before);
        before
    };
    rig.reopen();
    rig.assert_consistent();
    assert!(kinds(rig.engine()).is_empty());
    assert_same(&contents(rig.engine()), &before);
}

#[test]
fn an_import_counts_again_and_infers_what_it_cannot_read_before_it_hands_out_a_slot() {
    let mut rig = populated();
    let mut want = {
        let e = rig.engine();
        e.damage_unreadable("a", 3, Unreadable::Count).unwrap();
        // Moved while unreadable: a's copy on write leaves a@s1 its only referrer.
        e.vdisk("a")
            .unwrap()
            .write(3 * GRAIN, &pattern(4, 3 * GRAIN, GRAIN as usize), false)
            .unwrap();
        e.damage_unreadable("b", 0, Unreadable::GrainSize).unwrap();
        e.damage_unreadable("b", 5, Unreadable::GrainEntry).unwrap();
        contents(e)
    };
    // Its place in the map is lost with the record: the grain reads as zeros.
    want.get_mut("b").unwrap()[(5 * GRAIN) as usize..(6 * GRAIN) as usize].fill(0);
    rig.reopen();
    let e = rig.engine();
    assert_same(&contents(e), &want);

    // New writes take the pool's free slots; none may be one that a grain still uses.
    fill_free_space(e);
    assert_same(&contents(e), &want);

    // What is left: b's unreadable entry, and the count its slot kept.
    assert_eq!(
        kinds(e),
        [(FindingKind::OrphanSlot, 1), (FindingKind::RecordMalformed, 1)]
            .into_iter()
            .collect()
    );
    let fixed = e.spotfix(&Progress::default()).unwrap();
    assert_eq!((fixed.fixed, fixed.changed, fixed.failed), (2, 0, 0));
    rig.assert_consistent();
    rig.reopen();
    rig.assert_consistent();
    assert_same(&contents(rig.engine()), &want);
}

/// A slab set descriptor that reads but that no set can have (an interleave or a column count
/// of 0, fewer members than its layout's width, under another set's key, a lost range that
/// ends before it starts) stops the import
/// with the set named, as an unreadable one does, rather than divide by zero or index past
/// its members at the first I/O; put back, the pool opens whole.
#[test]
fn a_slab_set_descriptor_no_set_can_have_stops_the_import_with_why() {
    let mut rig = populated();
    let (want, key, record) = {
        let e = rig.engine();
        let mut first = None;
        e.pool()
            .meta()
            .for_each_prefix(CF_SLABSETS, &[], |k, v| {
                first.get_or_insert((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
        let (key, record) = first.expect("a slab set");
        (contents(e), key, record)
    };
    let set: serde_json::Value = serde_json::from_slice(&record).unwrap();
    let id = set["id"].as_u64().unwrap() as u32;
    let mut cases: Vec<(serde_json::Value, Vec<u8>, &str)> = Vec::new();
    let mut bad = set.clone();
    bad["spec"]["interleave"] = 0.into();
    cases.push((bad, key.clone(), "interleave 0"));
    let mut bad = set.clone();
    bad["spec"]["columns"] = 0.into();
    cases.push((bad, key.clone(), "not 0"));
    let mut bad = set.clone();
    bad["members"].as_array_mut().unwrap().pop();
    cases.push((bad, key.clone(), "members and it lists"));
    cases.push((set.clone(), (id + 1000).to_be_bytes().to_vec(), "not its own"));
    let mut bad = set.clone();
    bad["lost"] = serde_json::json!({"8192": 4096});
    cases.push((bad, key.clone(), "a lost range ends at 4096, before it starts at 8192"));
    for (bad, at, why) in cases {
        let e = rig.engine.take().unwrap();
        let mut b = MetaBatch::new();
        b.delete(CF_SLABSETS, &key);
        b.put(CF_SLABSETS, at.clone(), serde_json::to_vec(&bad).unwrap());
        e.pool().meta().commit(b, true).unwrap();
        drop(e);
        let err = rig.open_error().unwrap_or_else(|| panic!("{why}: opened"));
        assert!(
            err.contains("unreadable slab set descriptor") && err.contains(why),
            "{why}: {err}"
        );
        // Put back, through the store alone.
        let meta = tessera_pool::MetaStore::open(&rig.dir.path().join("pool").join("meta")).unwrap();
        let mut b = MetaBatch::new();
        b.delete(CF_SLABSETS, &at);
        b.put(CF_SLABSETS, key.clone(), record.clone());
        meta.commit(b, true).unwrap();
        drop(meta);
        rig.reopen();
    }
    assert_same(&contents(rig.engine()), &want);
    rig.assert_consistent();
}

/// A pool configuration record that reads but that no pool can have (a disk listed out of its
/// position, more slabs than its disk holds, a slab size no pool is made with) stops the
/// import with why, rather than index past the disks or allocate a mark per impossible slab;
/// put back, the pool opens whole.
#[test]
fn a_pool_configuration_no_pool_can_have_stops_the_import_with_why() {
    let mut rig = populated();
    let want = contents(rig.engine());
    let record = rig
        .engine()
        .pool()
        .meta()
        .get(tessera_pool::CF_POOL, b"config")
        .unwrap()
        .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&record).unwrap();
    let mut cases: Vec<(serde_json::Value, &str)> = Vec::new();
    let mut bad = config.clone();
    bad["disks"][1]["position"] = 0.into();
    cases.push((bad, "at position 0, in place 1 of the list"));
    let mut bad = config.clone();
    bad["disks"][0]["slabs"] = u32::MAX.into();
    cases.push((bad, "slabs on disk"));
    let mut bad = config.clone();
    bad["slab_size"] = 3_000_000.into();
    cases.push((bad, "a slab size of 3000000 bytes"));
    rig.engine = None;
    let meta_dir = rig.dir.path().join("pool").join("meta");
    let put = |v: &[u8]| {
        let meta = tessera_pool::MetaStore::open(&meta_dir).unwrap();
        let mut b = MetaBatch::new();
        b.put(tessera_pool::CF_POOL, &b"config"[..], v);
        meta.commit(b, true).unwrap();
    };
    for (bad, why) in cases {
        put(&serde_json::to_vec(&bad).unwrap());
        let err = rig.open_error().unwrap_or_else(|| panic!("{why}: opened"));
        assert!(
            err.contains("pool configuration record holds") && err.contains(why),
            "{why}: {err}"
        );
    }
    put(&record);
    rig.reopen();
    assert_same(&contents(rig.engine()), &want);
    rig.assert_consistent();
}

/// A count that reads and cannot be (below zero, past 32 bits) is counted again at import like
/// one that cannot be read: taken as it is, either left a slot that grains use free, and the
/// next write there overwrote them.
#[test]
fn an_import_counts_again_a_count_no_slot_can_have() {
    let mut rig = populated();
    let want = {
        let e = rig.engine();
        e.damage_unreadable("a", 3, Unreadable::NegativeCount).unwrap();
        e.damage_unreadable("b", 2, Unreadable::HugeCount).unwrap();
        contents(e)
    };
    rig.reopen();
    let e = rig.engine();
    fill_free_space(e);
    assert_same(&contents(e), &want);
    assert!(kinds(e).is_empty(), "{:?}", kinds(e));
    rig.assert_consistent();
}

#[test]
fn a_set_whose_grain_size_cannot_be_read_and_in_which_nothing_lies_is_freed() {
    let mut rig = Rig::new(3, 64 * MIB, MIB);
    {
        let e = rig.engine();
        let x = e
            .create_vdisk(&spec("x", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
        x.write(0, &pattern(1, 0, GRAIN as usize), false).unwrap();
        // The only grain in the set loses its entry, and the set its grain size; its slot
        // stays counted, by nothing (only grains and hot copies hold references).
        e.damage_unreadable("x", 0, Unreadable::GrainSize).unwrap();
        e.damage_unreadable("x", 0, Unreadable::GrainEntry).unwrap();
    }
    let sets = rig.engine().layouts().sets().len();
    rig.reopen();
    let e = rig.engine();
    assert_eq!(e.layouts().sets().len(), sets - 1, "the set is freed");
    // The unreadable entry is left for the scan to name (it may be all an operator has).
    assert_eq!(kinds(e), [(FindingKind::RecordMalformed, 1)].into_iter().collect());
    assert_eq!(e.spotfix(&Progress::default()).unwrap().fixed, 1);
    rig.assert_consistent();
    let x = e.vdisk("x").unwrap();
    x.write(GRAIN, &pattern(2, GRAIN, GRAIN as usize), false).unwrap();
    let mut got = vec![0u8; 2 * GRAIN as usize];
    x.read(0, &mut got).unwrap();
    assert!(got[..GRAIN as usize].iter().all(|&b| b == 0));
    assert!(got[GRAIN as usize..] == pattern(2, GRAIN, GRAIN as usize));
    rig.assert_consistent();
}

/// Which grains of which vdisk may read as zeros: those whose map entry was made unreadable
/// before an import (its place is lost with it).
type Lost = BTreeMap<String, std::collections::BTreeSet<u64>>;

/// Every grain reads as the model has it, or (a lost one) as zeros; never another's data.
fn assert_model(e: &Engine, want: &BTreeMap<String, Vec<u8>>, lost: &Lost, case: u64) {
    let got = contents(e);
    for (name, data) in want {
        for (g, (a, b)) in got[name]
            .chunks(GRAIN as usize)
            .zip(data.chunks(GRAIN as usize))
            .enumerate()
        {
            let zero_ok = lost.get(name).is_some_and(|l| l.contains(&(g as u64)));
            assert!(
                a == b || (zero_ok && a.iter().all(|&x| x == 0)),
                "case {case}: {name} grain {g} reads neither as written{}",
                if zero_ok { " nor as zeros" } else { "" }
            );
        }
    }
}

/// Scans and spot-fixes until the scan finds nothing but counts left to the next import.
fn scan_and_fix(e: &Engine, case: u64) {
    for _ in 0..4 {
        let found = kinds(e);
        let recounts = e
            .findings(0, 10_000)
            .unwrap()
            .iter()
            .filter(|f| matches!(f.action, Repair::Recount { .. }))
            .count() as u64;
        if found.values().sum::<u64>() == recounts {
            return;
        }
        let r = e.spotfix(&Progress::default()).unwrap();
        assert_eq!(r.changed, 0, "case {case}: nothing changed meanwhile");
    }
    panic!("case {case}: the scan still finds {:?}", kinds(e));
}

/// Damage at random, under a running pool and then across an import, with writes between:
/// whatever records are unreadable, no grain ever reads another's data, no slot a grain
/// holds is handed out again, and scan, spot-fix and an import leave the pool consistent.
#[test]
fn random_unreadable_records_never_cost_another_grains_data() {
    use rand::{Rng, SeedableRng};
    let kinds_all = [
        Unreadable::GrainEntry,
        Unreadable::GrainKey,
        Unreadable::Count,
        Unreadable::CountKey,
        Unreadable::GrainSize,
        Unreadable::SetDescriptor,
        Unreadable::WrongGrainSize,
    ];
    let cases: u64 = std::env::var("TESSERA_DAMAGE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    for case in 0..cases {
        let mut rng = rand::rngs::StdRng::seed_from_u64(case);
        let mut rig = populated();
        let across_import = case % 2 == 1;
        let mut lost = Lost::new();
        let want = {
            let e = rig.engine();
            for _ in 0..rng.random_range(1..6) {
                let (name, grains) = [("a", 128), ("b", 192), ("a@s1", 128)][rng.random_range(0..3)];
                let g = rng.random_range(0..grains);
                let what = kinds_all[rng.random_range(0..kinds_all.len())];
                // An unreadable slab set descriptor stops an import (it alone says where the
                // set's members are), and a grain size that is wrong but one a set can have is
                // believed by one: only the running pool's spot-fix mends them.
                if across_import && matches!(what, Unreadable::SetDescriptor | Unreadable::WrongGrainSize) {
                    continue;
                }
                e.damage_unreadable(name, g, what).unwrap();
                if across_import && what == Unreadable::GrainEntry {
                    lost.entry(name.to_string()).or_default().insert(g);
                }
            }
            // Writes after the damage: in place, and copies on write of grains shared with
            // the snapshot, which move the counts damaged.
            for _ in 0..rng.random_range(0..8) {
                let (name, grains) = [("a", 256), ("b", 256)][rng.random_range(0..2)];
                let g = rng.random_range(0..grains);
                let seed = rng.random_range(10..1000);
                e.vdisk(name)
                    .unwrap()
                    .write(g * GRAIN, &pattern(seed, g * GRAIN, GRAIN as usize), false)
                    .unwrap();
            }
            contents(e)
        };
        if across_import {
            rig.reopen();
        }
        assert_model(rig.engine(), &want, &lost, case);
        scan_and_fix(rig.engine(), case);
        assert_model(rig.engine(), &want, &lost, case);
        // New data takes the free slots: none may be one a grain still holds.
        fill_free_space(rig.engine());
        assert_model(rig.engine(), &want, &lost, case);
        rig.reopen();
        scan_and_fix(rig.engine(), case);
        rig.assert_consistent();
        assert_model(rig.engine(), &want, &lost, case);
    }
}

/// A set that holds nothing but a hot copy takes its grain size from the copy's primary,
/// whose own size the import learns from its grains.
#[test]
fn an_import_learns_a_hot_copys_set_from_its_primary() {
    let mut rig = Rig::new(3, 64 * MIB, MIB);
    let (blocks, hot, block) = (256u64, HOT_REFS as u64 + 20, 4096u64);
    let want: Vec<u8> = (0..blocks)
        .flat_map(|b| {
            if b < hot {
                pattern(1, 0, block as usize)
            } else {
                pattern(2, b * block, block as usize)
            }
        })
        .collect();
    let pairs = {
        let e = rig.engine();
        enable_dedup(e, Compression::Off);
        let mut s = VdiskSpec::new("v", blocks * block, LayoutKind::Simple);
        s.block_size = Some(4096);
        s.columns = Some(1);
        e.create_vdisk(&s).unwrap();
        e.vdisk("v").unwrap().write(0, &want, true).unwrap();
        assert_eq!(run_dedup(e).hot_copies_made, 1);
        e.damage_unreadable("v", 0, Unreadable::GrainSize).unwrap();
        e.damage_unreadable("v", 0, Unreadable::HotCopyGrainSize).unwrap();
        e.hot_copies()
    };
    rig.reopen();
    let e = rig.engine();
    assert_eq!(e.hot_copies(), pairs, "the copy is kept");
    // The check compares the copy with its slot, and every count with its references.
    rig.assert_consistent();
    let mut got = vec![0u8; want.len()];
    e.vdisk("v").unwrap().read(0, &mut got).unwrap();
    assert!(got == want);
}

/// A vdisk record that cannot be read leaves that vdisk out, not the pool: the rest is
/// served, its grains and their space are kept (never dangling, never handed out), and the
/// record put back brings it back whole.
/// Makes vdisk b's record unreadable (cut short); returns b's id and the record as it was.
fn break_record_of_b(e: &Engine) -> (u64, Vec<u8>) {
    let id = e.vdisk("b").unwrap().config().id;
    let record = e.pool().meta().get(CF_VDISKS, &id.to_be_bytes()).unwrap().unwrap();
    let mut b = MetaBatch::new();
    b.put(CF_VDISKS, id.to_be_bytes(), &b"{\"name\": \"b\""[..]);
    e.pool().meta().commit(b, true).unwrap();
    (id, record)
}

#[test]
fn a_vdisk_whose_record_cannot_be_read_is_left_out_and_its_data_kept() {
    let mut rig = populated();
    let (want, id, record) = {
        let e = rig.engine();
        let (id, record) = break_record_of_b(e);
        (contents(e), id, record)
    };
    rig.reopen();
    {
        let e = rig.engine();
        assert!(e.vdisk("b").is_err(), "left out");
        assert_eq!(e.unreadable_vdisks().iter().map(|u| u.id).collect::<Vec<_>>(), [id]);
        let mut rest = want.clone();
        rest.remove("b");
        assert_same(&contents(e), &rest);
        let problems = e.check().unwrap().problems;
        assert!(
            problems.len() == 1
                && problems[0].starts_with(&format!("vdisk id {id} is left out: its record cannot be read")),
            "its grains are counted as any others: {problems:#?}"
        );
        // Named, not taken for entries of no vdisk; spot-fix leaves its grains alone.
        assert_eq!(kinds(e), [(FindingKind::RecordMalformed, 1)].into_iter().collect());
        let found = e.findings(0, 10).unwrap();
        assert!(matches!(found[0].action, Repair::VdiskRecord { vdisk, grains: 192 } if vdisk == id));
        let r = e.spotfix(&Progress::default()).unwrap();
        assert_eq!((r.fixed, r.changed, r.failed), (0, 0, 1));
        // A new vdisk takes neither its id nor its slots.
        let c = e
            .create_vdisk(&spec("c", 16 * MIB, LayoutKind::Parity, Provisioning::Thin))
            .unwrap();
        assert!(c.config().id > id);
        c.write(0, &pattern(7, 0, (16 * MIB) as usize), false).unwrap();
        assert_same(&contents(e), &rest);
        drop(c);
        let mut b = MetaBatch::new();
        b.put(CF_VDISKS, id.to_be_bytes(), record);
        e.pool().meta().commit(b, true).unwrap();
    }
    rig.reopen();
    assert!(rig.engine().unreadable_vdisks().is_empty());
    assert_same(&contents(rig.engine()), &want);
    rig.assert_consistent();
}

/// A vdisk record that reads as JSON but holds values no vdisk is made with (a grain of 0
/// bytes, a block of 0, a physical block smaller than the logical one) leaves that vdisk out
/// as an unreadable one is: the import does not divide by its grain, and the rest is served.
#[test]
fn a_vdisk_record_with_impossible_values_is_left_out_and_the_pool_imported() {
    let mut rig = populated();
    let (want, id, record) = {
        let e = rig.engine();
        let id = e.vdisk("b").unwrap().config().id;
        let record = e.pool().meta().get(CF_VDISKS, &id.to_be_bytes()).unwrap().unwrap();
        (contents(e), id, record)
    };
    let mut rest = want.clone();
    rest.remove("b");
    for (field, value) in [
        ("grain_size", 0u64),
        ("block_size", 0),
        ("physical_block_size", 512),
        ("size", 0),
    ] {
        {
            let e = rig.engine();
            let mut bad: serde_json::Value = serde_json::from_slice(&record).unwrap();
            bad[field] = value.into();
            if field == "physical_block_size" {
                bad["block_size"] = 4096.into();
            }
            let mut b = MetaBatch::new();
            b.put(CF_VDISKS, id.to_be_bytes(), serde_json::to_vec(&bad).unwrap());
            e.pool().meta().commit(b, true).unwrap();
        }
        rig.reopen();
        let e = rig.engine();
        assert!(e.vdisk("b").is_err(), "{field}: left out");
        let unreadable = e.unreadable_vdisks();
        assert!(
            unreadable.len() == 1 && unreadable[0].id == id && unreadable[0].error.contains("values no vdisk has"),
            "{field}: {unreadable:?}"
        );
        assert_same(&contents(e), &rest);
        // The scan reads the record as the import does: named, its grains kept.
        assert_eq!(
            kinds(e),
            [(FindingKind::RecordMalformed, 1)].into_iter().collect(),
            "{field}"
        );
    }
    {
        let mut b = MetaBatch::new();
        b.put(CF_VDISKS, id.to_be_bytes(), record);
        rig.engine().pool().meta().commit(b, true).unwrap();
    }
    rig.reopen();
    assert!(rig.engine().unreadable_vdisks().is_empty());
    assert_same(&contents(rig.engine()), &want);
    rig.assert_consistent();
}

/// A dedup settings record that cannot be read holds a policy, not data: the pool is
/// imported all the same, with dedup off, and says why (the check, the status) until
/// settings are written again. The vdisks, deduplicated before, read the same.
#[test]
fn a_dedup_settings_record_that_cannot_be_read_turns_dedup_off_and_says_so() {
    let mut rig = populated();
    let want = {
        let e = rig.engine();
        enable_dedup(e, Compression::Zstd);
        run_dedup(e);
        let mut b = MetaBatch::new();
        b.put(CF_POOL, b"dedup", b"{\"enabled\": tru");
        e.pool().meta().commit(b, true).unwrap();
        contents(e)
    };
    rig.reopen();
    {
        let e = rig.engine();
        assert!(!e.dedup_settings().enabled);
        let why = e.dedup_settings_unreadable().expect("the import says why dedup is off");
        assert!(why.contains("dedup settings record cannot be read"), "{why}");
        assert_eq!(e.dedup_status().settings_unreadable.as_deref(), Some(why.as_str()));
        let problems = e.check().unwrap().problems;
        assert!(problems.contains(&why), "{problems:#?}");
        assert_same(&contents(e), &want);
        enable_dedup(e, Compression::Zstd);
        assert_eq!(e.dedup_settings_unreadable(), None);
    }
    rig.reopen();
    let e = rig.engine();
    assert!(e.dedup_settings().enabled && e.dedup_settings_unreadable().is_none());
    assert!(e.check().unwrap().problems.is_empty());
    rig.assert_consistent();
}

/// A next vdisk id at the top of its range (a damaged record) neither wraps around to ids in
/// use nor stops the import: the pool serves its vdisks, and a new one is refused with why.
#[test]
fn a_pool_whose_vdisk_ids_ran_out_refuses_new_vdisks_and_serves_the_rest() {
    let mut rig = populated();
    let want = {
        let e = rig.engine();
        let mut b = MetaBatch::new();
        b.put(CF_POOL, b"next_vdisk_id", u64::MAX.to_le_bytes());
        e.pool().meta().commit(b, true).unwrap();
        contents(e)
    };
    rig.reopen();
    let e = rig.engine();
    let refused = e
        .create_vdisk(&spec("new", 16 * MIB, LayoutKind::Mirror, Provisioning::Thin))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("every vdisk id"), "{refused}");
    assert_same(&contents(e), &want);
    rig.assert_consistent();
}

/// A write-back log record that reads but holds what no log has (a tail outside its ring, a
/// ring larger than its disk, a sequence number at the end of its range) stops the import
/// with why, rather than replay the log from where it is not or take its writes for lost;
/// put right, the writes the log held are all there.
#[test]
fn a_write_back_log_record_no_log_has_stops_the_import_with_why() {
    let mut rig = Rig::with_cache(2, 64 * MIB, MIB, 1);
    // A log of one copy is otherwise destaged at once.
    rig.engine().cache().hold_destage(true);
    let mut s = spec("a", 16 * MIB, LayoutKind::Simple, Provisioning::Thin);
    s.columns = Some(1);
    let a = rig.engine().create_vdisk(&s).unwrap();
    let data = pattern(5, 0, 64 << 10);
    a.write(0, &data, true).unwrap();
    assert!(rig.engine().cache_status().dirty_bytes > 0, "the log holds the write");
    drop(a);
    let record = rig
        .engine()
        .pool()
        .meta()
        .get(CF_POOL, b"write-cache")
        .unwrap()
        .unwrap();
    let good: serde_json::Value = serde_json::from_slice(&record).unwrap();
    for (field, value, says) in [
        ("tail", good["area"].as_u64().unwrap() + 4096, "a tail at"),
        ("area", 1u64 << 40, "more than its disk"),
        ("seq", u64::MAX - 1, "sequence number"),
    ] {
        let mut bad = good.clone();
        bad[field] = value.into();
        let mut b = MetaBatch::new();
        b.put(CF_POOL, b"write-cache", serde_json::to_vec(&bad).unwrap());
        rig.engine().pool().meta().commit(b, true).unwrap();
        rig.engine = None;
        let e = rig.open_error().expect("the import is refused");
        assert!(e.contains(says) && e.contains("damaged"), "{field}: {e}");
        {
            let meta = tessera_pool::MetaStore::open(&rig.dir.path().join("pool").join("meta")).unwrap();
            let mut b = MetaBatch::new();
            b.put(CF_POOL, b"write-cache", record.clone());
            meta.commit(b, true).unwrap();
        }
        rig.reopen();
        let mut back = vec![0; data.len()];
        rig.engine().vdisk("a").unwrap().read(0, &mut back).unwrap();
        assert!(back == data, "{field}: the log's writes are there");
    }
}

/// A vdisk made under the name of one left out for its unreadable record, and the record put
/// back: the one made last keeps the name (the hosts used it meanwhile), the other is left
/// out as before, its data kept, and named; once the newer one is deleted, it is back whole.
#[test]
fn a_record_put_back_under_a_name_taken_meanwhile_leaves_the_older_vdisk_out() {
    let mut rig = populated();
    let (want, id, record) = {
        let e = rig.engine();
        let (id, record) = break_record_of_b(e);
        (contents(e), id, record)
    };
    rig.reopen();
    let newer = {
        let e = rig.engine();
        let b = e
            .create_vdisk(&spec("b", 4 * MIB, LayoutKind::Mirror, Provisioning::Thin))
            .unwrap();
        b.write(0, &pattern(9, 0, (4 * MIB) as usize), false).unwrap();
        b.flush().unwrap();
        let mut batch = MetaBatch::new();
        batch.put(CF_VDISKS, id.to_be_bytes(), record);
        e.pool().meta().commit(batch, true).unwrap();
        b.config().id
    };
    rig.reopen();
    {
        let e = rig.engine();
        assert_eq!(
            e.vdisk("b").unwrap().config().id,
            newer,
            "the one made last keeps the name"
        );
        // And what a gateway that does not own the pool presents of it.
        let recorded: Vec<u64> = Engine::recorded_vdisks(e.pool().meta())
            .unwrap()
            .iter()
            .filter(|c| c.name == "b")
            .map(|c| c.id)
            .collect();
        assert_eq!(recorded, [newer]);
        let mut now = want.clone();
        now.insert("b".into(), pattern(9, 0, (4 * MIB) as usize));
        assert_same(&contents(e), &now);
        let left: Vec<_> = e.unreadable_vdisks().iter().map(|u| (u.id, u.error.clone())).collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].0, id);
        assert!(left[0].1.contains(&format!("vdisk id {newer}")), "{left:?}");
        let problems = e.check().unwrap().problems;
        assert!(
            problems.len() == 1 && problems[0].starts_with(&format!("vdisk id {id} is left out: its name 'b'")),
            "{problems:#?}"
        );
        // Its grains are counted, never spot-fixed away.
        assert!(kinds(e).is_empty(), "{:?}", kinds(e));
        let r = e.spotfix(&Progress::default()).unwrap();
        assert_eq!(r.changed, 0);
        e.delete_vdisk("b").unwrap();
    }
    rig.reopen();
    assert!(rig.engine().unreadable_vdisks().is_empty());
    assert_same(&contents(rig.engine()), &want);
    rig.assert_consistent();
}

/// Two records that cannot be read: a vdisk's, and the grain size of a slab set in which only
/// that vdisk's grains lie. Nothing says the set holds data but those grains: the import
/// refuses rather than free the set (its slots would go to other vdisks, under the grains of
/// the vdisk once its record is put right).
#[test]
fn a_set_of_unknown_size_that_only_a_left_out_vdisk_uses_is_never_freed() {
    let mut rig = populated();
    {
        let e = rig.engine();
        e.damage_unreadable("b", 0, Unreadable::GrainSize).unwrap();
        break_record_of_b(e);
    }
    rig.engine = None;
    let err = Engine::open(&rig.dir.path().join("pool"), &rig.opener())
        .err()
        .expect("the pool opened, with a set it cannot size")
        .to_string();
    assert!(
        err.contains("only grains of vdisks whose records cannot be read"),
        "{err}"
    );
}
