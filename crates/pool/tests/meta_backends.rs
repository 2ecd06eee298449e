//! Every metadata backend of this crate held to the same contract (`conformance`): the one
//! pools on local disks use, and the one in memory that states the contract plainly.

use tessera_pool::{conformance, MemoryMeta, MetaBatch, MetaStore, RocksMeta, CF_POOL};

#[test]
fn rocksdb_keeps_the_contract() {
    let dirs = std::sync::Mutex::new(Vec::new());
    conformance::check_backend(|| {
        let d = tempfile::tempdir().unwrap();
        let m = RocksMeta::create(&d.path().join("meta")).unwrap();
        dirs.lock().unwrap().push(d);
        m
    });
}

#[test]
fn memory_keeps_the_contract() {
    conformance::check_backend(MemoryMeta::new);
}

#[test]
fn rocksdb_keeps_what_was_committed_across_a_reopen() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("meta");
    {
        let s = MetaStore::create(&path).unwrap();
        let mut b = MetaBatch::new();
        b.put(CF_POOL, b"k", b"v");
        b.count(tessera_pool::CF_REFCOUNTS, b"n", 7);
        s.commit(b, true).unwrap();
        assert!(
            MetaStore::create(&path).is_err(),
            "a second store over the first is refused"
        );
    }
    let s = MetaStore::open(&path).unwrap();
    assert_eq!(s.get(CF_POOL, b"k").unwrap().as_deref(), Some(&b"v"[..]));
    let n = s.get(tessera_pool::CF_REFCOUNTS, b"n").unwrap();
    assert_eq!(n.map(|v| tessera_pool::decode_refcount(&v)), Some(7));
    let missing = MetaStore::open(&d.path().join("nothing"))
        .err()
        .expect("no store there");
    assert!(missing.to_string().contains("no pool metadata here"), "{missing}");
}
