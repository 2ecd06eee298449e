//! Against a real Ceph cluster: `scripts/test-scale-out.sh` starts one with `scripts/ceph-dev.sh`
//! and runs these with TESSERA_CEPH_CONF set to its configuration. Without it each test says
//! it was skipped, and why.
#![cfg(feature = "librados")]

use rand::Rng;
use tessera_rados::{Cluster, Pool, WriteOp, XattrCmp};

const POOL: &str = "tessera-test";

fn conf(test: &str) -> Option<String> {
    match std::env::var("TESSERA_CEPH_CONF") {
        Ok(c) if !c.is_empty() => Some(c),
        _ => {
            tessera_disk::skip(
                test,
                "no Ceph cluster (TESSERA_CEPH_CONF is empty: scripts/test-scale-out.sh sets it to the cluster it starts, and says why when none starts)",
            );
            None
        }
    }
}

/// A client whose calls fail after 30 s instead of hanging on a cluster that went away.
fn connect(conf: &str) -> Cluster {
    Cluster::connect(
        conf,
        "admin",
        &[("rados_osd_op_timeout", "30"), ("rados_mon_op_timeout", "30")],
    )
    .expect("connect to the test cluster")
}

fn pool(c: &Cluster) -> Pool<'_> {
    match c.create_pool(POOL) {
        Ok(()) => {}
        Err(e) if e.errno() == Some(libc::EEXIST) => {}
        Err(e) => panic!("create the test pool: {e}"),
    }
    c.pool(POOL).expect("open the test pool")
}

/// An object name of this test's own.
fn oid(what: &str) -> String {
    format!("{what}-{:016x}", rand::rng().random::<u64>())
}

#[test]
fn objects_round_trip() {
    let Some(conf) = conf("objects_round_trip") else { return };
    let c = connect(&conf);
    let p = pool(&c);
    let o = oid("round-trip");
    assert_eq!(p.size(&o).unwrap(), None);
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    p.write_full(&o, &data).unwrap();
    assert_eq!(p.size(&o).unwrap(), Some(data.len() as u64));
    let mut back = vec![0u8; 4096];
    assert_eq!(p.read(&o, 12345, &mut back).unwrap(), 4096);
    assert_eq!(back, data[12345..12345 + 4096]);
    // Past the end: what there is.
    assert_eq!(p.read(&o, data.len() as u64 - 100, &mut back).unwrap(), 100);
    p.remove(&o).unwrap();
    assert_eq!(p.size(&o).unwrap(), None);
    let e = p.remove(&o).unwrap_err();
    assert!(e.to_string().contains(&o), "{e}");
}

#[test]
fn a_listing_names_every_object_of_the_pool() {
    let Some(conf) = conf("a_listing_names_every_object_of_the_pool") else {
        return;
    };
    let c = connect(&conf);
    let p = pool(&c);
    let mine: Vec<String> = (0..5).map(|i| oid(&format!("listed-{i}"))).collect();
    for o in &mine {
        p.write_full(o, b"x").unwrap();
    }
    let listed: std::collections::HashSet<Vec<u8>> = p.objects().unwrap().map(|n| n.unwrap()).collect();
    for o in &mine {
        assert!(listed.contains(o.as_bytes()), "{o} not listed");
    }
    // The count is as the placement groups last reported it: seconds old. It must come to
    // count these, and be a count of objects (not of bytes or kilobytes: they are larger).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let n = p.object_count().unwrap();
        let listed = p.objects().unwrap().count() as u64;
        if n >= mine.len() as u64 {
            assert!(n <= 2 * listed + 16, "{n} objects counted, {listed} listed");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the count stays at {n}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    for o in &mine {
        p.remove(o).unwrap();
    }
    let listed: std::collections::HashSet<Vec<u8>> = p.objects().unwrap().map(|n| n.unwrap()).collect();
    assert!(
        mine.iter().all(|o| !listed.contains(o.as_bytes())),
        "a removed object is listed"
    );
}

#[test]
fn a_compound_write_applies_data_attributes_and_omap_together_or_not_at_all() {
    let Some(conf) = conf("a_compound_write_applies_data_attributes_and_omap_together_or_not_at_all") else {
        return;
    };
    let c = connect(&conf);
    let p = pool(&c);
    let o = oid("compound");
    p.operate(
        &o,
        &WriteOp::new()
            .create(true)
            .write_full(b"grain data")
            .set_xattr("epoch", b"1")
            .omap_set(&[(b"grain/0", b"slot 7"), (b"grain/1", b"slot 9")]),
    )
    .unwrap();
    let mut buf = [0u8; 64];
    let n = p.read(&o, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"grain data");
    assert_eq!(p.xattr(&o, "epoch").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(
        p.omap(&o).unwrap(),
        vec![
            (b"grain/0".to_vec(), b"slot 7".to_vec()),
            (b"grain/1".to_vec(), b"slot 9".to_vec())
        ]
    );
    // An exclusive create of an object that exists changes nothing.
    let e = p
        .operate(&o, &WriteOp::new().create(true).write_full(b"other"))
        .unwrap_err();
    assert_eq!(e.errno(), Some(libc::EEXIST), "{e}");

    // A guard that fails refuses the data, the attribute and the omap change alike.
    let e = p
        .operate(
            &o,
            &WriteOp::new()
                .guard_xattr_eq("epoch", b"2")
                .write(0, b"GRAIN")
                .set_xattr("epoch", b"3")
                .omap_set(&[(b"grain/2", b"slot 11")])
                .omap_remove(&[b"grain/0"]),
        )
        .unwrap_err();
    assert!(e.is_guard_failure(), "{e}");
    let n = p.read(&o, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"grain data");
    assert_eq!(p.xattr(&o, "epoch").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(p.omap(&o).unwrap().len(), 2);
    // So does one standing after the data (as a fenced write orders them).
    let e = p
        .operate(
            &o,
            &WriteOp::new()
                .assert_exists()
                .write(0, b"GRAIN")
                .guard_xattr_eq("epoch", b"2")
                .set_xattr("epoch", b"3"),
        )
        .unwrap_err();
    assert!(e.is_guard_failure(), "{e}");
    let n = p.read(&o, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"grain data");
    assert_eq!(p.xattr(&o, "epoch").unwrap().as_deref(), Some(&b"1"[..]));
    // A write asserting that its object exists makes none.
    let missing = oid("compound-missing");
    let e = p
        .operate(&missing, &WriteOp::new().assert_exists().write(0, b"GRAIN"))
        .unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
    let e = p.read(&missing, 0, &mut buf).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");

    // The same with the guard holding: all of it.
    p.operate(
        &o,
        &WriteOp::new()
            .guard_xattr_eq("epoch", b"1")
            .write(0, b"GRAIN")
            .omap_set(&[(b"grain/2", b"slot 11")])
            .omap_remove(&[b"grain/0"]),
    )
    .unwrap();
    let n = p.read(&o, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"GRAIN data");
    let keys: Vec<Vec<u8>> = p.omap(&o).unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![b"grain/1".to_vec(), b"grain/2".to_vec()]);
    p.remove(&o).unwrap();
}

#[test]
fn an_omap_larger_than_one_page_is_read_whole() {
    let Some(conf) = conf("an_omap_larger_than_one_page_is_read_whole") else {
        return;
    };
    let c = connect(&conf);
    let p = pool(&c);
    let o = oid("omap-pages");
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..2500u32)
        .map(|i| (format!("k{i:06}").into_bytes(), i.to_le_bytes().to_vec()))
        .collect();
    let refs: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    p.operate(&o, &WriteOp::new().create(false).omap_set(&refs)).unwrap();
    assert_eq!(p.omap(&o).unwrap(), pairs);
    p.remove(&o).unwrap();
}

/// A gateway that took a vdisk over raises the epoch its writes are guarded by: a write the
/// old owner had in flight, or sends after a stall, is refused.
#[test]
fn an_epoch_guard_refuses_the_writes_of_an_owner_that_was_replaced() {
    let Some(conf) = conf("an_epoch_guard_refuses_the_writes_of_an_owner_that_was_replaced") else {
        return;
    };
    let (old, new) = (connect(&conf), connect(&conf));
    let (po, pn) = (pool(&old), pool(&new));
    let o = oid("epoch");
    po.operate(
        &o,
        &WriteOp::new()
            .create(true)
            .set_xattr("owner-epoch", b"00000041")
            .write_full(b"A"),
    )
    .unwrap();
    po.operate(
        &o,
        &WriteOp::new()
            .guard_xattr_eq("owner-epoch", b"00000041")
            .write_full(b"A2"),
    )
    .unwrap();
    // The takeover, guarded by the epoch it replaces.
    pn.operate(
        &o,
        &WriteOp::new()
            .guard_xattr_eq("owner-epoch", b"00000041")
            .set_xattr("owner-epoch", b"00000042"),
    )
    .unwrap();
    let e = po
        .operate(
            &o,
            &WriteOp::new()
                .guard_xattr_eq("owner-epoch", b"00000041")
                .write_full(b"stale"),
        )
        .unwrap_err();
    assert!(e.is_guard_failure(), "{e}");
    pn.operate(
        &o,
        &WriteOp::new()
            .guard_xattr_eq("owner-epoch", b"00000042")
            .write_full(b"B"),
    )
    .unwrap();
    let mut buf = [0u8; 16];
    let n = pn.read(&o, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"B");
    pn.remove(&o).unwrap();
}

/// Fencing: once a client is blocklisted, nothing it sends is applied, guarded or not.
/// Writes through a context ordered by a sequence: an object that took a higher one refuses
/// a lower one (synchronous, in the background, a removal), whatever comes between without an
/// order; the same sequence through another context goes on; a context keeps its order.
#[test]
fn writes_ordered_by_a_sequence_refuse_a_lower_one_where_a_higher_one_wrote() {
    let Some(conf) = conf("writes_ordered_by_a_sequence_refuse_a_lower_one_where_a_higher_one_wrote") else {
        return;
    };
    let c = connect(&conf);
    let (plain, low, high, high_again) = (pool(&c), pool(&c), pool(&c), pool(&c));
    plain.use_self_managed_snapshots().unwrap();
    // Taken once per process and pool: asking again costs nothing and fails nothing.
    plain.use_self_managed_snapshots().unwrap();
    low.order_writes(10).unwrap();
    high.order_writes(20).unwrap();
    high_again.order_writes(20).unwrap();
    let (x, y) = (oid("ordered-x"), oid("ordered-y"));
    low.operate(&x, &WriteOp::new().write(0, b"low")).unwrap();
    high.operate(&x, &WriteOp::new().write(0, b"HIGH")).unwrap();
    let e = low.operate(&x, &WriteOp::new().write(0, b"low")).unwrap_err();
    assert!(e.is_out_of_order() && !e.is_guard_failure(), "{e}");
    assert!(e.to_string().contains("EOLDSNAPC"), "{e}");
    let e = low
        .operate_async(&x, WriteOp::new().write(0, b"low"))
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(e.is_out_of_order(), "{e}");
    // A write without an order does not lower the object's.
    plain.write_full(&x, b"plain").unwrap();
    assert!(low.write_full(&x, b"low").unwrap_err().is_out_of_order());
    assert!(low.remove(&x).unwrap_err().is_out_of_order());
    high_again.operate(&x, &WriteOp::new().write(0, b"AGAIN")).unwrap();
    let mut buf = [0u8; 8];
    let n = plain.read(&x, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"AGAIN");
    // An object the higher sequence never wrote takes the lower one.
    low.operate(&y, &WriteOp::new().write(0, b"low")).unwrap();
    // One order per context; none at 0.
    assert!(low.order_writes(30).is_err());
    low.order_writes(10).unwrap();
    assert!(pool(&c).order_writes(0).is_err());
    high.remove(&x).unwrap();
    low.remove(&y).unwrap();
}

#[test]
fn a_blocklisted_client_writes_nothing() {
    let Some(conf) = conf("a_blocklisted_client_writes_nothing") else {
        return;
    };
    let (fencer, fenced) = (connect(&conf), connect(&conf));
    let (pf, pd) = (pool(&fencer), pool(&fenced));
    let o = oid("fenced");
    pd.write_full(&o, b"before").unwrap();
    let addr = fenced.address().unwrap();
    assert_ne!(addr, fencer.address().unwrap(), "two clients, two addresses");
    fencer.blocklist(&addr, 600).unwrap();
    // The object's placement group refuses the fenced client once it holds the new map; an
    // operation of the fencer, which holds that map, brings it there.
    assert_eq!(pf.size(&o).unwrap(), Some(6));
    let e = pd.write_full(&o, b"after").unwrap_err();
    assert!(e.is_fenced(), "{e}");
    let mut buf = [0u8; 16];
    let n = pf.read(&o, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"before");
    pf.remove(&o).unwrap();
}

/// The order guards compare in: the object's attribute against the value given, byte-wise.
#[test]
fn ordered_guards_compare_the_attribute_with_the_value() {
    let Some(conf) = conf("ordered_guards_compare_the_attribute_with_the_value") else {
        return;
    };
    let c = connect(&conf);
    let p = pool(&c);
    let o = oid("ordered");
    p.operate(&o, &WriteOp::new().create(true).set_xattr("epoch", b"00000005"))
        .unwrap();
    let holds = |cmp: XattrCmp, v: &[u8]| match p.operate(&o, &WriteOp::new().guard_xattr("epoch", cmp, v)) {
        Ok(()) => true,
        Err(e) if e.is_guard_failure() => false,
        Err(e) => panic!("{cmp:?} {v:?}: {e}"),
    };
    // The attribute (5) against 4, 5 and 6.
    assert!(holds(XattrCmp::Lte, b"00000005") && holds(XattrCmp::Lte, b"00000006"));
    assert!(!holds(XattrCmp::Lte, b"00000004"));
    assert!(holds(XattrCmp::Lt, b"00000006") && !holds(XattrCmp::Lt, b"00000005"));
    assert!(holds(XattrCmp::Gte, b"00000004") && holds(XattrCmp::Gte, b"00000005"));
    assert!(!holds(XattrCmp::Gte, b"00000006"));
    assert!(holds(XattrCmp::Gt, b"00000004") && !holds(XattrCmp::Gt, b"00000005"));
    assert!(holds(XattrCmp::Ne, b"00000004") && !holds(XattrCmp::Ne, b"00000005"));
    // A missing object fails as missing, whatever the guard.
    let e = p
        .operate(
            &oid("missing"),
            &WriteOp::new().guard_xattr("epoch", XattrCmp::Lte, b"9"),
        )
        .unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
    // A missing attribute compares as empty: below any value.
    let bare = oid("bare");
    p.write_full(&bare, b"x").unwrap();
    p.operate(&bare, &WriteOp::new().guard_xattr("epoch", XattrCmp::Lte, b"00000001"))
        .unwrap();
    let e = p
        .operate(&bare, &WriteOp::new().guard_xattr("epoch", XattrCmp::Gt, b"00000001"))
        .unwrap_err();
    assert!(e.is_guard_failure(), "{e}");
    p.remove(&o).unwrap();
    p.remove(&bare).unwrap();
}
