//! Fencing across etcd and RADOS: `scripts/test-scale-out.sh` starts both and runs these with
//! TESSERA_ETCD_ENDPOINTS and TESSERA_CEPH_CONF set. Without them each test says it was
//! skipped, and why.
#![cfg(feature = "fencing")]

use std::time::{Duration, Instant};

use tessera_ownership::fence::{take_over, FencedWriter};
use tessera_ownership::Gateway;
use tessera_rados::{Cluster, Pool};

const POOL: &str = "tessera-test";

/// The bound on each call to etcd of a taking.
const STEP: Duration = Duration::from_secs(10);

fn cluster(test: &str) -> Option<(Vec<String>, String)> {
    let ep = std::env::var("TESSERA_ETCD_ENDPOINTS").unwrap_or_default();
    let conf = std::env::var("TESSERA_CEPH_CONF").unwrap_or_default();
    if ep.is_empty() || conf.is_empty() {
        tessera_disk::skip(
            test,
            "no Ceph cluster and etcd (TESSERA_CEPH_CONF or TESSERA_ETCD_ENDPOINTS is empty: scripts/test-scale-out.sh sets them)",
        );
        return None;
    }
    Some((ep.split(',').map(String::from).collect(), conf))
}

fn connect(conf: &str) -> Cluster {
    Cluster::connect(
        conf,
        "admin",
        &[("rados_osd_op_timeout", "30"), ("rados_mon_op_timeout", "30")],
    )
    .unwrap()
}

fn pool(c: &Cluster) -> Pool<'_> {
    match c.create_pool(POOL) {
        Ok(()) => {}
        Err(e) if e.errno() == Some(libc::EEXIST) => {}
        Err(e) => panic!("create the test pool: {e}"),
    }
    c.pool(POOL).unwrap()
}

fn content(p: &Pool, oid: &str) -> Option<Vec<u8>> {
    p.size(oid).unwrap()?;
    let mut b = vec![0u8; 64];
    let n = p.read(oid, 0, &mut b).unwrap();
    b.truncate(n);
    Some(b)
}

/// The whole protocol: A owns the vdisk and writes; A stalls; B takes the vdisk over once A's
/// lease lapses (a larger epoch, A's client blocklisted), reads and writes; A resumes and
/// writes again: nothing of it lands, on objects B wrote (the epoch guard) or only read (the
/// blocklist, which a placement group applies once an operation of B brought it the map).
#[tokio::test]
async fn a_stalled_owner_that_resumes_writes_nothing() {
    let t = "a_stalled_owner_that_resumes_writes_nothing";
    let Some((ep, conf)) = cluster(t) else { return };
    let prefix = format!("/tessera-test/{t}-{}", std::process::id());
    let (ca, cb) = (connect(&conf), connect(&conf));
    let (pa, pb) = (pool(&ca), pool(&cb));
    let ttl = 3;
    let mut ga = Gateway::join(&ep, &prefix, "gw-a", ttl).await.unwrap();
    let mut gb = Gateway::join(&ep, &prefix, "gw-b", ttl).await.unwrap();
    let v = format!("v{}", std::process::id());
    let (o0, o1, o2) = (format!("{v}.0"), format!("{v}.1"), format!("{v}.2"));

    let a = take_over(&mut ga, &ca, &v, None, STEP).await.unwrap();
    assert_eq!(a.gateway, "gw-a");
    let wa = FencedWriter::new(&pa, a.epoch).unwrap();
    wa.write(&o0, 0, b"A1").unwrap();
    wa.write(&o1, 0, b"A1").unwrap();
    assert_eq!(
        take_over(&mut gb, &cb, &v, None, STEP).await.unwrap(),
        a,
        "B finds it owned"
    );

    ga.stall();
    let stalled = Instant::now();
    let b = loop {
        let o = take_over(&mut gb, &cb, &v, None, STEP).await.unwrap();
        if o.gateway == "gw-b" {
            break o;
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(ttl as u64 + 10),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "taken over, fenced, {:?} after the owner stalled (lease {ttl} s)",
        stalled.elapsed()
    );
    assert!(b.epoch > a.epoch);
    let wb = FencedWriter::new(&pb, b.epoch).unwrap();
    wb.write(&o0, 0, b"B2").unwrap();
    // B opens the rest of the vdisk: its operations bring each object's placement group to
    // the map that blocklists A.
    assert_eq!(content(&pb, &o1).as_deref(), Some(&b"A1"[..]));
    assert_eq!(content(&pb, &o2), None);

    // A resumes, unaware.
    for o in [&o0, &o1, &o2] {
        let e = wa.write(o, 0, b"A3").unwrap_err();
        assert!(e.is_fenced() || e.is_out_of_order(), "{o}: {e}");
    }
    assert_eq!(content(&pb, &o0).as_deref(), Some(&b"B2"[..]));
    assert_eq!(content(&pb, &o1).as_deref(), Some(&b"A1"[..]));
    assert_eq!(content(&pb, &o2), None);
    // B goes on writing, over A's objects too.
    wb.write(&o1, 0, b"B4").unwrap();
    wb.write(&o2, 0, b"B4").unwrap();
    assert_eq!(content(&pb, &o1).as_deref(), Some(&b"B4"[..]));
    for o in [&o0, &o1, &o2] {
        pb.remove(o).unwrap();
    }
    gb.leave().await.unwrap();
}

/// The epoch alone, on one client (no blocklist), each owner through a context of its own:
/// an object written under a later epoch refuses an earlier one; an object nobody later
/// wrote does not, which is why a takeover also blocklists.
#[tokio::test]
async fn the_epoch_refuses_only_what_a_later_owner_wrote() {
    let t = "the_epoch_refuses_only_what_a_later_owner_wrote";
    let Some((_, conf)) = cluster(t) else { return };
    let c = connect(&conf);
    let p = pool(&c);
    let (p7, p9, p99, p100) = (pool(&c), pool(&c), pool(&c), pool(&c));
    let (old, new) = (FencedWriter::new(&p7, 7).unwrap(), FencedWriter::new(&p9, 9).unwrap());
    let (x, y) = (
        format!("guard-x-{}", std::process::id()),
        format!("guard-y-{}", std::process::id()),
    );
    old.write(&x, 0, b"7").unwrap();
    new.write(&x, 0, b"9").unwrap();
    let e = old.write(&x, 0, b"7!").unwrap_err();
    assert!(e.is_out_of_order(), "{e}");
    assert!(e.to_string().contains("EOLDSNAPC"), "{e}");
    assert_eq!(content(&p, &x).as_deref(), Some(&b"9"[..]));
    new.write(&x, 1, b"9").unwrap();
    // A write that carries no order (another tool's) does not lower the object's: the old
    // owner is still refused. Another context at the same epoch (the owner's pool opened
    // again) writes on.
    p.write_full(&x, b"99").unwrap();
    assert!(old.write(&x, 0, b"7!").unwrap_err().is_out_of_order());
    let p9b = pool(&c);
    FencedWriter::new(&p9b, 9).unwrap().write(&x, 0, b"9").unwrap();
    // A context serves one order: another epoch on it is refused, not taken.
    assert!(FencedWriter::new(&p9b, 10).is_err());
    FencedWriter::new(&p9b, 9).unwrap().write(&x, 0, b"9").unwrap();
    // The pool is in the self-managed snapshot mode now: no pool snapshot can be taken,
    // which would make its OSDs ignore the epochs.
    assert!(p.create_pool_snapshot("by-the-administrator").is_err());
    old.write(&y, 0, b"7").unwrap();
    // Epochs compare as numbers.
    let (e99, e100) = (
        FencedWriter::new(&p99, 99).unwrap(),
        FencedWriter::new(&p100, 100).unwrap(),
    );
    e100.write(&y, 0, b"100").unwrap();
    assert!(e99.write(&y, 0, b"99").unwrap_err().is_out_of_order());
    // A pool with pool snapshots would ignore the epochs: it is refused.
    let snapped = format!("{POOL}-snapped-{}", std::process::id());
    c.create_pool(&snapped).unwrap();
    let ps = c.pool(&snapped).unwrap();
    ps.create_pool_snapshot("by-the-administrator").unwrap();
    let e = FencedWriter::new(&ps, 7)
        .err()
        .expect("a pool with pool snapshots was taken");
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    drop(ps);
    c.delete_pool(&snapped).unwrap();
    p.remove(&x).unwrap();
    p.remove(&y).unwrap();
}
