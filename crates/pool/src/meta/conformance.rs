//! The contract of a metadata backend, as checks any backend can be put through: the RocksDB
//! and memory stores in this crate's tests, and every store added later (one on RADOS) in its
//! own. Each check panics with what the backend got wrong.

use std::sync::Arc;

use crate::meta::{MetaBackend, MetaBatch, MetaStore, CF_GRAINS, CF_POOL, CF_REFCOUNTS};

/// Runs every check on a fresh, empty store made by `make`.
pub fn check_backend<B: MetaBackend + 'static>(make: impl Fn() -> B) {
    records_read_back(&MetaStore::on(make()));
    a_batch_applies_in_order(&MetaStore::on(make()));
    counts_add_up_under_concurrency(Arc::new(MetaStore::on(make())));
    ranges_scans_and_prefixes(&MetaStore::on(make()));
    snapshots_stand_still(&MetaStore::on(make()));
}

fn batch(f: impl FnOnce(&mut MetaBatch)) -> MetaBatch {
    let mut b = MetaBatch::new();
    f(&mut b);
    b
}

fn records_read_back(s: &MetaStore) {
    assert_eq!(s.get(CF_POOL, b"k").unwrap(), None, "a fresh store is empty");
    s.commit(
        batch(|b| {
            b.put(CF_POOL, b"k", b"pool value");
            b.put(CF_GRAINS, b"k", b"grain value");
            b.put(CF_POOL, b"empty", b"");
        }),
        true,
    )
    .unwrap();
    assert_eq!(s.get(CF_POOL, b"k").unwrap().as_deref(), Some(&b"pool value"[..]));
    assert_eq!(
        s.get(CF_GRAINS, b"k").unwrap().as_deref(),
        Some(&b"grain value"[..]),
        "column families are separate"
    );
    assert_eq!(
        s.get(CF_POOL, b"empty").unwrap().as_deref(),
        Some(&b""[..]),
        "an empty value is a value"
    );
    let got = s.multi_get(CF_POOL, &[b"empty", b"none", b"k", b"k"]).unwrap();
    assert_eq!(
        got,
        vec![
            Some(Vec::new()),
            None,
            Some(b"pool value".to_vec()),
            Some(b"pool value".to_vec())
        ],
        "multi_get answers in the order asked, a key asked twice twice"
    );
    s.commit(batch(|b| b.delete(CF_POOL, b"k")), false).unwrap();
    s.sync().unwrap();
    assert_eq!(s.get(CF_POOL, b"k").unwrap(), None);
    assert!(
        s.get(CF_GRAINS, b"k").unwrap().is_some(),
        "a delete touches its own family only"
    );
}

fn a_batch_applies_in_order(s: &MetaStore) {
    s.commit(
        batch(|b| {
            b.put(CF_POOL, b"a", b"1");
            b.delete(CF_POOL, b"a");
            b.delete(CF_POOL, b"b");
            b.put(CF_POOL, b"b", b"2");
            b.put(CF_POOL, b"c", b"old");
            b.put(CF_POOL, b"c", b"new");
            b.count(CF_REFCOUNTS, b"n", 5);
            b.count(CF_REFCOUNTS, b"n", -2);
        }),
        true,
    )
    .unwrap();
    assert_eq!(s.get(CF_POOL, b"a").unwrap(), None, "put then delete: gone");
    assert_eq!(
        s.get(CF_POOL, b"b").unwrap().as_deref(),
        Some(&b"2"[..]),
        "delete then put: there"
    );
    assert_eq!(
        s.get(CF_POOL, b"c").unwrap().as_deref(),
        Some(&b"new"[..]),
        "the last put wins"
    );
    let n = s.get(CF_REFCOUNTS, b"n").unwrap().map(|v| crate::decode_refcount(&v));
    assert_eq!(n, Some(3), "counts of one batch add up");

    // A count whose record cannot be read stays so when moved: read as 0 and moved, it
    // would be a wrong number that looks right.
    s.commit(batch(|b| b.put(CF_REFCOUNTS, b"bad", [1u8, 2, 3])), true)
        .unwrap();
    s.commit(batch(|b| b.count(CF_REFCOUNTS, b"bad", -1)), true).unwrap();
    s.commit(
        batch(|b| {
            b.count(CF_REFCOUNTS, b"bad", 2);
            b.count(CF_REFCOUNTS, b"bad", 5);
        }),
        true,
    )
    .unwrap();
    assert_eq!(
        s.get(CF_REFCOUNTS, b"bad").unwrap().as_deref(),
        Some(&[1u8, 2, 3][..]),
        "an unreadable count is kept as it is"
    );
}

fn counts_add_up_under_concurrency(s: Arc<MetaStore>) {
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..250 {
                    s.commit(
                        batch(|b| {
                            b.count(CF_REFCOUNTS, b"shared", 1);
                            b.count(CF_REFCOUNTS, format!("own{t}"), if i % 2 == 0 { 2 } else { -1 });
                        }),
                        false,
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let count = |k: &[u8]| s.get(CF_REFCOUNTS, k).unwrap().map(|v| crate::decode_refcount(&v));
    assert_eq!(count(b"shared"), Some(1000), "no delta lost between concurrent batches");
    for t in 0..4 {
        assert_eq!(count(format!("own{t}").as_bytes()), Some(125));
    }
    s.commit(batch(|b| b.count(CF_REFCOUNTS, b"neg", -3)), false).unwrap();
    assert_eq!(count(b"neg"), Some(-3), "a count may go below zero (the scan finds it)");
}

fn ranges_scans_and_prefixes(s: &MetaStore) {
    let keys: [&[u8]; 7] = [b"a", b"b\x00", b"b\x01", b"b\x7f", b"b\x80", b"b\xff", b"c"];
    s.commit(
        batch(|b| {
            // Inserted out of order: the store orders them, bytes as unsigned.
            for k in keys.iter().rev() {
                b.put(CF_GRAINS, k, k);
            }
            b.put(CF_POOL, b"b\x01", b"elsewhere");
        }),
        true,
    )
    .unwrap();
    let all: Vec<Vec<u8>> = s
        .range_from(CF_GRAINS, b"", 100)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        all,
        keys.iter().map(|k| k.to_vec()).collect::<Vec<_>>(),
        "key order is byte order"
    );
    let mut under_b = Vec::new();
    s.for_each_prefix(CF_GRAINS, b"b", |k, v| {
        assert_eq!(k, v);
        under_b.push(k.to_vec());
        Ok(())
    })
    .unwrap();
    assert_eq!(under_b.len(), 5, "the prefix's records and none past them");
    let from = s.range_from(CF_GRAINS, b"b\x02", 2).unwrap();
    assert_eq!(
        from.iter().map(|(k, _)| k.as_slice()).collect::<Vec<_>>(),
        vec![&b"b\x7f"[..], &b"b\x80"[..]],
        "a range starts at the first key at or after its start, and stops at its limit"
    );
    s.commit(batch(|b| b.delete_range(CF_GRAINS, b"b\x01", b"b\xff")), true)
        .unwrap();
    let left: Vec<Vec<u8>> = s
        .range_from(CF_GRAINS, b"", 100)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        left,
        vec![b"a".to_vec(), b"b\x00".to_vec(), b"b\xff".to_vec(), b"c".to_vec()],
        "a deleted range includes its start and excludes its end"
    );
    assert!(s.get(CF_POOL, b"b\x01").unwrap().is_some(), "in its own family only");
    // A visitor that commits while it scans (a repair pass does) neither deadlocks nor errs.
    s.for_each_prefix(CF_GRAINS, b"", |k, _| {
        s.commit(batch(|b| b.put(CF_POOL, k, b"seen")), false)
    })
    .unwrap();
    assert_eq!(s.get(CF_POOL, b"c").unwrap().as_deref(), Some(&b"seen"[..]));
}

fn snapshots_stand_still(s: &MetaStore) {
    s.commit(batch(|b| b.put(CF_GRAINS, b"before", b"1")), true).unwrap();
    let snap = s.snapshot();
    s.commit(
        batch(|b| {
            b.put(CF_GRAINS, b"after", b"2");
            b.delete(CF_GRAINS, b"before");
        }),
        true,
    )
    .unwrap();
    let mut seen = Vec::new();
    snap.for_each_prefix(CF_GRAINS, b"", |k, _| {
        seen.push(k.to_vec());
        Ok(())
    })
    .unwrap();
    assert_eq!(
        seen,
        vec![b"before".to_vec()],
        "a snapshot sees what was committed before it only"
    );
    assert_eq!(s.get(CF_GRAINS, b"before").unwrap(), None);
    drop(snap);
    assert!(s.estimate_keys(CF_GRAINS) <= 10, "an estimate, but not a wild one");
}
