//! Against a real etcd: `scripts/test-scale-out.sh` starts one (with the Ceph cluster) and runs
//! these with TESSERA_ETCD_ENDPOINTS set. Without it each test says it was skipped, and why.
#![cfg(feature = "etcd")]

mod common;

use std::time::{Duration, Instant};

use common::{endpoints, next, told_of_changes};
use tessera_ownership::{FenceError, Gateway, Lasting, Owner};

/// The bound on each call to etcd of a taking.
const STEP: Duration = Duration::from_secs(10);

/// A key space of this test's own.
fn prefix(test: &str) -> String {
    format!("/tessera-test/{test}-{}", std::process::id())
}

#[tokio::test]
async fn one_gateway_owns_a_vdisk_at_a_time() {
    let t = "one_gateway_owns_a_vdisk_at_a_time";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let mut a = Gateway::join(&ep, &p, "gw-a", 5).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 5).await.unwrap();
    let owned = a.acquire("pool/v1").await.unwrap();
    assert_eq!(owned.gateway, "gw-a");
    // B finds it taken, at the same epoch; asking again changes nothing.
    assert_eq!(b.acquire("pool/v1").await.unwrap(), owned);
    assert_eq!(a.acquire("pool/v1").await.unwrap(), owned);
    assert_eq!(b.owner("pool/v1").await.unwrap(), Some(owned.clone()));
    // Another vdisk is free for B, at a later epoch.
    let other = b.acquire("pool/v2").await.unwrap();
    assert_eq!(other.gateway, "gw-b");
    assert!(other.epoch > owned.epoch);
    // Only the owner at its epoch can release.
    assert!(
        !b.release("pool/v1", owned.epoch).await.unwrap(),
        "B released A's vdisk"
    );
    assert!(!a.release("pool/v1", owned.epoch - 1).await.unwrap());
    assert!(a.release("pool/v1", owned.epoch).await.unwrap());
    let again = b.acquire("pool/v1").await.unwrap();
    assert_eq!(again.gateway, "gw-b");
    assert!(
        again.epoch > other.epoch,
        "every taking has a larger epoch than the ones before"
    );
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}

/// The owner stalls (its lease is no longer renewed, as when it is stopped or killed): once
/// the lease expires another gateway takes its vdisks, with a larger epoch, within the lease
/// time and a little; the old owner, asking again, finds the new one.
#[tokio::test]
async fn a_stalled_owner_loses_its_vdisks_to_a_larger_epoch() {
    let t = "a_stalled_owner_loses_its_vdisks_to_a_larger_epoch";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let ttl = 3;
    let mut a = Gateway::join(&ep, &p, "gw-a", ttl).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", ttl).await.unwrap();
    let first = a.acquire("pool/v").await.unwrap();
    // Renewed: still A's after more than a lease's time.
    tokio::time::sleep(Duration::from_secs(ttl as u64 + 1)).await;
    assert!(a.alive());
    assert_eq!(b.acquire("pool/v").await.unwrap(), first);

    a.stall();
    let stalled = Instant::now();
    let taken: Owner = loop {
        let o = b.acquire("pool/v").await.unwrap();
        if o.gateway == "gw-b" {
            break o;
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(ttl as u64 + 30),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = stalled.elapsed();
    eprintln!("taken over {took:?} after the owner stalled (lease {ttl} s)");
    assert!(taken.epoch > first.epoch);
    // Within the lease and a margin for a busy machine (the failover target is 15 s).
    assert!(took <= Duration::from_secs(ttl as u64 + 10), "{took:?}");
    assert_eq!(a.acquire("pool/v").await.unwrap(), taken);
    b.leave().await.unwrap();
}

/// A gateway that leaves gives up everything at once, and its lease's clock, which its disks
/// serve under, holds no longer.
#[tokio::test]
async fn leaving_gives_every_vdisk_up() {
    let t = "leaving_gives_every_vdisk_up";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let mut a = Gateway::join(&ep, &p, "gw-a", 30).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 30).await.unwrap();
    for v in ["x", "y", "z"] {
        assert_eq!(a.acquire(v).await.unwrap().gateway, "gw-a");
    }
    let clock = a.lease_clock();
    assert!(clock.holds());
    a.leave().await.unwrap();
    assert!(!clock.holds(), "the disks of a gateway that left still served");
    for v in ["x", "y", "z"] {
        assert_eq!(b.acquire(v).await.unwrap().gateway, "gw-b", "{v}");
    }
    b.leave().await.unwrap();
    assert!(
        Gateway::join(&[], &p, "gw-c", 1).await.is_err(),
        "a lease of 1 s is refused"
    );
}

#[tokio::test]
async fn gateways_announce_what_they_present_until_their_lease_goes() {
    let t = "gateways_announce_what_they_present_until_their_lease_goes";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let mut a = Gateway::join(&ep, &p, "gw-a", 3).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 3).await.unwrap();
    assert!(a.presenting("pool.tank").await.unwrap().is_empty());
    b.announce("pool.tank").await.unwrap();
    a.announce("pool.tank").await.unwrap();
    a.announce("pool.tank").await.unwrap();
    a.announce("pool.other").await.unwrap();
    assert_eq!(b.presenting("pool.tank").await.unwrap(), ["gw-a", "gw-b"]);
    assert_eq!(b.presenting("pool.other").await.unwrap(), ["gw-a"]);
    assert!(
        b.presenting("pool.tan").await.unwrap().is_empty(),
        "a prefix of a name is another name"
    );
    a.unannounce("pool.other").await.unwrap();
    assert!(b.presenting("pool.other").await.unwrap().is_empty());
    // Asking for a pool is a word of its own, beside presenting it.
    assert!(a.asking("pool.tank").await.unwrap().is_empty());
    b.ask_for("pool.tank").await.unwrap();
    assert_eq!(a.asking("pool.tank").await.unwrap(), ["gw-b"]);
    assert_eq!(a.presenting("pool.tank").await.unwrap(), ["gw-a", "gw-b"]);
    // Everything asked for, in one request, as a gateway's tick reads it.
    a.ask_for("pool.other").await.unwrap();
    b.ask_for("pool.other").await.unwrap();
    let asked = a.asked_for().await.unwrap();
    let asked: Vec<(&str, &[String])> = asked.iter().map(|(w, g)| (w.as_str(), g.as_slice())).collect();
    assert_eq!(
        asked,
        [
            ("pool.other", &["gw-a".to_string(), "gw-b".to_string()][..]),
            ("pool.tank", &["gw-b".to_string()][..])
        ]
    );
    a.stop_asking("pool.other").await.unwrap();
    b.stop_asking("pool.other").await.unwrap();
    b.stop_asking("pool.tank").await.unwrap();
    assert!(a.asking("pool.tank").await.unwrap().is_empty());
    b.ask_for("pool.tank").await.unwrap();
    // B stalls: its word goes with its lease.
    b.stall();
    let t0 = Instant::now();
    while a.presenting("pool.tank").await.unwrap() != ["gw-a"] || !a.asking("pool.tank").await.unwrap().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "B's presence outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.leave().await.unwrap();
}

#[tokio::test]
async fn a_gateway_following_changes_is_told_of_takings_asks_and_lapsed_leases_only() {
    let t = "a_gateway_following_changes_is_told_of_takings_asks_and_lapsed_leases_only";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let mut a = Gateway::join(&ep, &p, "gw-a", 3).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 3).await.unwrap();
    // Another installation whose prefix begins with this one's.
    let mut elsewhere = Gateway::join(&ep, &format!("{p}-other"), "gw-a", 3).await.unwrap();
    let mut told = told_of_changes(&mut b).await;
    let wait = Duration::from_secs(10);
    let quiet = Duration::from_millis(500);
    async fn drain(told: &mut tokio::sync::mpsc::UnboundedReceiver<()>) {
        while tokio::time::timeout(Duration::from_millis(200), told.recv())
            .await
            .is_ok()
        {}
    }
    // Nothing changes: nothing is told (renewing leases changes no key).
    assert!(tokio::time::timeout(quiet, told.recv()).await.is_err());
    a.acquire("pool.tank").await.unwrap();
    assert_eq!(tokio::time::timeout(wait, told.recv()).await.unwrap(), Some(()));
    drain(&mut told).await;
    elsewhere.acquire("pool.tank").await.unwrap();
    elsewhere.ask_for("pool.tank").await.unwrap();
    assert!(
        tokio::time::timeout(quiet, told.recv()).await.is_err(),
        "told of another installation's keys"
    );
    a.ask_for("pool.other").await.unwrap();
    assert_eq!(tokio::time::timeout(wait, told.recv()).await.unwrap(), Some(()));
    drain(&mut told).await;
    // A stalls: when its lease lapses its keys go, and B is told without asking.
    a.stall();
    assert_eq!(tokio::time::timeout(wait, told.recv()).await.unwrap(), Some(()));
    assert_eq!(b.owner("pool.tank").await.unwrap(), None);
    // Dropped, B follows nothing more.
    drop(b);
    assert_eq!(tokio::time::timeout(wait, told.recv()).await.unwrap(), None);
    elsewhere.leave().await.unwrap();
}

#[tokio::test]
async fn a_fence_record_keeps_every_owner_until_one_taking_fenced_them_all() {
    let t = "a_fence_record_keeps_every_owner_until_one_taking_fenced_them_all";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let v = "pool.tank";
    let fenced = std::sync::Mutex::new(Vec::<Vec<String>>::new());
    let record = |list: &[String]| -> Result<(), FenceError> {
        fenced.lock().unwrap().push(list.to_vec());
        Ok(())
    };
    let mut a = Gateway::join(&ep, &p, "gw-a", 2).await.unwrap();
    let first = a.take_fenced(v, "addr-a1", STEP, record).await.unwrap();
    assert!(a.holds(&first));
    // A still holds the key but took it again with another connection (its release failed,
    // say): it is taken afresh, at a larger epoch, and its first connection fenced off.
    let again = a.take_fenced(v, "addr-a2", STEP, record).await.unwrap();
    assert!(
        a.holds(&again) && again.epoch > first.epoch,
        "{again:?} after {first:?}"
    );
    assert_eq!(*fenced.lock().unwrap(), vec![vec![], vec!["addr-a1".to_string()]]);
    // A stalls; B's fencing fails: B gives the vdisk up, and A's address stays on record
    // (alone: B's connection never wrote, and a gateway that keeps failing would otherwise
    // leave an address at every try).
    a.stall();
    let mut b = Gateway::join(&ep, &p, "gw-b", 2).await.unwrap();
    let t0 = Instant::now();
    loop {
        match b
            .take_fenced(v, "addr-b", STEP, |_| {
                Err(FenceError::passing("the monitors did not answer"))
            })
            .await
        {
            Err(e) => {
                assert!(e.to_string().contains("addr-a2"), "{e}");
                assert_eq!(e.gave_back(), Some(Lasting::MayPass), "{e}");
                break;
            }
            Ok(o) => {
                assert_eq!(o.gateway, "gw-a");
                assert!(t0.elapsed() < Duration::from_secs(10), "A's lease never lapsed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(b.owner(v).await.unwrap(), None, "given up when the fence failed");
    let again = b
        .take_fenced(v, "addr-b-again", STEP, |_| {
            Err(FenceError::lasting("permission denied"))
        })
        .await
        .unwrap_err();
    assert_eq!(again.gave_back(), Some(Lasting::Lasts), "{again}");
    assert!(
        again.to_string().contains("(addr-a2)"),
        "B's first try left its address: {again}"
    );
    // C takes it and fences A's connection off.
    let mut c = Gateway::join(&ep, &p, "gw-c", 2).await.unwrap();
    fenced.lock().unwrap().clear();
    let by_c = c.take_fenced(v, "addr-c", STEP, record).await.unwrap();
    assert!(c.holds(&by_c));
    assert_eq!(*fenced.lock().unwrap(), vec![vec!["addr-a2".to_string()]]);
    // Those are fenced: the next taker has C's address alone to fence off.
    c.release(v, by_c.epoch).await.unwrap();
    fenced.lock().unwrap().clear();
    let by_b = b.take_fenced(v, "addr-b2", STEP, record).await.unwrap();
    assert!(b.holds(&by_b));
    assert_eq!(*fenced.lock().unwrap(), vec![vec!["addr-c".to_string()]]);
    b.leave().await.unwrap();
    c.leave().await.unwrap();
}

/// Keys under the gateways' prefix written without a lease (by hand, say) are no gateway's:
/// nothing would renew them or ever take them back. An owner key of that kind owns nothing:
/// a taking deletes it and fences off what the record holds, as from an owner gone; a mark
/// of that kind neither asks for a vdisk nor presents it.
#[tokio::test]
async fn keys_without_a_lease_own_nothing_and_ask_for_nothing() {
    let t = "keys_without_a_lease_own_nothing_and_ask_for_nothing";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let v = "pool.tank";
    let mut etcd = etcd_client::Client::connect(&ep, None).await.unwrap();
    for (key, value) in [
        (format!("{p}/owner/{v}"), "gw-ghost"),
        (format!("{p}/fence/{v}"), "10.0.0.9:6800/42"),
        (format!("{p}/wants/{v}/gw-ghost"), ""),
        (format!("{p}/presents/{v}/gw-ghost"), ""),
    ] {
        etcd.put(key, value, None).await.unwrap();
    }
    let mut a = Gateway::join(&ep, &p, "gw-a", 5).await.unwrap();
    assert_eq!(a.owner(v).await.unwrap(), None);
    assert!(a.asking(v).await.unwrap().is_empty());
    assert!(a.asked_for().await.unwrap().is_empty());
    assert!(a.presenting(v).await.unwrap().is_empty());
    let fenced = std::sync::Mutex::new(Vec::<Vec<String>>::new());
    let owner = a
        .take_fenced(v, "addr-a", STEP, |list: &[String]| -> Result<(), FenceError> {
            fenced.lock().unwrap().push(list.to_vec());
            Ok(())
        })
        .await
        .unwrap();
    assert!(a.holds(&owner), "{owner:?}");
    assert_eq!(*fenced.lock().unwrap(), vec![vec!["10.0.0.9:6800/42".to_string()]]);
    // The plain taking too.
    etcd.put(format!("{p}/owner/pool.other"), "gw-ghost", None)
        .await
        .unwrap();
    let other = a.acquire("pool.other").await.unwrap();
    assert!(a.holds(&other), "{other:?}");
    a.leave().await.unwrap();
    etcd.delete(format!("{p}/"), Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
}

/// A taking bounds each of its calls to etcd on its own, not the taking as a whole: a
/// fence that outlasts the bound (monitors slow to blocklist) still ends with the vdisk
/// taken and its fence record tidied, naming only the taker's connection, rather than cut
/// short after its transaction with the vdisk held unserved and the addresses it fenced
/// still on record for every next taker to fence again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_that_outlasts_the_bound_on_etcd_still_ends_in_a_tidy_taking() {
    let t = "a_fence_that_outlasts_the_bound_on_etcd_still_ends_in_a_tidy_taking";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let v = "pool.tank";
    // The fence holds a thread for longer than the bound, not than the leases.
    let mut a = Gateway::join(&ep, &p, "gw-a", 20).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 20).await.unwrap();
    let mut c = Gateway::join(&ep, &p, "gw-c", 20).await.unwrap();
    let first = c.take_fenced(v, "addr-c", STEP, |_| Ok(())).await.unwrap();
    assert!(c.release(v, first.epoch).await.unwrap());
    // Ample for each call to etcd on a loaded machine; the fence takes twice as long.
    let bound = Duration::from_secs(2);
    let fenced = std::sync::Mutex::new(Vec::new());
    let taken = a
        .take_fenced(v, "addr-a", bound, |list| {
            // As a blocklist waits on the monitors: the thread is held.
            std::thread::sleep(bound * 2);
            fenced.lock().unwrap().extend_from_slice(list);
            Ok(())
        })
        .await
        .unwrap();
    assert!(a.holds(&taken), "{taken:?}");
    assert_eq!(*fenced.lock().unwrap(), vec!["addr-c".to_string()]);
    assert!(a.release(v, taken.epoch).await.unwrap());
    let fenced = std::sync::Mutex::new(Vec::new());
    b.take_fenced(v, "addr-b", STEP, |list| {
        fenced.lock().unwrap().extend_from_slice(list);
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(
        *fenced.lock().unwrap(),
        vec!["addr-a".to_string()],
        "the record was not tidied after a fence longer than the bound"
    );
    for g in [a, b, c] {
        g.leave().await.unwrap();
    }
}

/// A place claimed for a making that failed is taken back only if no gateway took the name
/// since: the same making sent to two gateways may have been taken and made by the other,
/// whose record it is then. An owner from before the claim (a pool of the name made
/// elsewhere before places were recorded) does not keep it. A handoff put without a lease
/// (by hand) bars nobody, and the next taking deletes it.
#[tokio::test]
async fn a_place_is_not_taken_back_from_under_an_owner_nor_a_pool_barred_for_good() {
    let t = "a_place_is_not_taken_back_from_under_an_owner_nor_a_pool_barred_for_good";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let v = "pool.tank";
    let mut a = Gateway::join(&ep, &p, "gw-a", 5).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 5).await.unwrap();
    assert_eq!(a.claim_place(v, "fsid-1/3").await.unwrap(), ("fsid-1/3".into(), true));
    assert_eq!(b.claim_place(v, "fsid-1/3").await.unwrap(), ("fsid-1/3".into(), false));
    let owner = b.take_fenced(v, "addr-b", STEP, |_| Ok(())).await.unwrap();
    a.unclaim_place(v, "fsid-1/3").await.unwrap();
    assert_eq!(
        a.claim_place(v, "fsid-1/4").await.unwrap(),
        ("fsid-1/3".into(), false),
        "the place of a pool owned there was taken back"
    );
    // Handed over since (no owner key while the handoff lasts): kept too.
    assert!(b
        .release_to(v, owner.epoch, "gw-c", Duration::from_secs(1))
        .await
        .unwrap());
    a.unclaim_place(v, "fsid-1/3").await.unwrap();
    assert_eq!(
        a.claim_place(v, "fsid-1/4").await.unwrap(),
        ("fsid-1/3".into(), false),
        "the place of a pool handed over there was taken back"
    );
    // The handoff's lease runs out: B owns the pool again, then lets it go.
    let owner = loop {
        let o = b.take_fenced(v, "addr-b", STEP, |_| Ok(())).await.unwrap();
        if b.holds(&o) {
            break o;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(b.release(v, owner.epoch).await.unwrap());
    a.unclaim_place(v, "fsid-1/3").await.unwrap();
    assert_eq!(a.claim_place(v, "fsid-1/4").await.unwrap(), ("fsid-1/4".into(), true));
    // B owns the name from before A's claim: A's claim goes back.
    a.unclaim_place(v, "fsid-1/4").await.unwrap();
    let owner = b.take_fenced(v, "addr-b", STEP, |_| Ok(())).await.unwrap();
    assert_eq!(a.claim_place(v, "fsid-1/5").await.unwrap(), ("fsid-1/5".into(), true));
    a.unclaim_place(v, "fsid-1/5").await.unwrap();
    assert_eq!(
        a.claim_place(v, "fsid-1/6").await.unwrap(),
        ("fsid-1/6".into(), true),
        "a claim was kept for an owner from before it"
    );
    a.unclaim_place(v, "fsid-1/6").await.unwrap();
    assert!(b.release(v, owner.epoch).await.unwrap());

    let mut raw = etcd_client::Client::connect(&ep, None).await.unwrap();
    raw.put(format!("{p}/handoff/{v}"), "gw-c", None).await.unwrap();
    assert_eq!(a.handed_to(v).await.unwrap(), None, "a handoff without a lease bars");
    let taken = a.take_fenced(v, "addr-a", STEP, |_| Ok(())).await.unwrap();
    assert!(a.holds(&taken), "{taken:?}");
    let left = raw.get(format!("{p}/handoff/{v}"), None).await.unwrap();
    assert!(left.kvs().is_empty(), "the taking left the handoff without a lease");
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}

/// A name is claimed by the first place that records it; another place of that name is told
/// the first's, until the first forgets it (destroyed), which takes the fence record along.
#[tokio::test]
async fn a_name_has_one_place_until_that_place_forgets_it() {
    let t = "a_name_has_one_place_until_that_place_forgets_it";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let v = "pool.tank";
    let mut a = Gateway::join(&ep, &p, "gw-a", 2).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 2).await.unwrap();
    assert_eq!(a.claim_place(v, "fsid-1/3").await.unwrap(), ("fsid-1/3".into(), true));
    assert_eq!(b.claim_place(v, "fsid-1/4").await.unwrap(), ("fsid-1/3".into(), false));
    assert_eq!(b.claim_place(v, "fsid-1/3").await.unwrap(), ("fsid-1/3".into(), false));
    let owner = a.take_fenced(v, "addr-a", STEP, |_| Ok(())).await.unwrap();
    // Another place cannot forget the name's record, nor its fence record; nor a gateway
    // that does not own the pool at that epoch, nor one owning it at another epoch.
    assert!(!b.forget_place(v, "fsid-1/4", owner.epoch).await.unwrap());
    assert!(!b.forget_place(v, "fsid-1/3", owner.epoch).await.unwrap());
    assert!(!a.forget_place(v, "fsid-1/3", owner.epoch - 1).await.unwrap());
    assert_eq!(b.claim_place(v, "fsid-1/4").await.unwrap(), ("fsid-1/3".into(), false));
    assert!(a.forget_place(v, "fsid-1/3", owner.epoch).await.unwrap());
    a.release(v, owner.epoch).await.unwrap();
    assert_eq!(b.claim_place(v, "fsid-1/4").await.unwrap(), ("fsid-1/4".into(), true));
    let fenced = std::sync::Mutex::new(None);
    b.take_fenced(v, "addr-b", STEP, |list| {
        *fenced.lock().unwrap() = Some(list.to_vec());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(
        *fenced.lock().unwrap(),
        Some(vec![]),
        "the destroyed pool's owners are not the new one's"
    );
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}

/// A vdisk handed over to one gateway is that gateway's to take: a third gateway that looks
/// first finds it handed over (to that one, at epoch 0) and fences nothing, while the gateway
/// that handed it over may take it back; once it is taken, or the handoff's own time has
/// passed, any gateway may take it as before. (Until 2026-12-06 a handover was a plain release, and of three
/// gateways whichever etcd told first took the pool, fenced its owner and opened it, to hand
/// it over again.)
#[tokio::test]
async fn a_vdisk_handed_over_is_taken_by_the_gateway_it_is_handed_to() {
    let t = "a_vdisk_handed_over_is_taken_by_the_gateway_it_is_handed_to";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let v = "pool.tank";
    let mut a = Gateway::join(&ep, &p, "gw-a", 5).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 5).await.unwrap();
    let mut c = Gateway::join(&ep, &p, "gw-c", 5).await.unwrap();
    let first = a.take_fenced(v, "addr-a", STEP, |_| Ok(())).await.unwrap();
    let bar = Duration::from_secs(20);
    assert!(a.release_to(v, first.epoch, "gw-b", bar).await.unwrap());
    let fenced = std::sync::Mutex::new(Vec::new());
    let seen = c
        .take_fenced(v, "addr-c", STEP, |l| {
            fenced.lock().unwrap().extend_from_slice(l);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!((seen.gateway.as_str(), seen.epoch), ("gw-b", 0), "{seen:?}");
    assert!(fenced.lock().unwrap().is_empty(), "C fenced A off");
    assert_eq!(
        c.handed_to(v).await.unwrap().map(|o| o.gateway).as_deref(),
        Some("gw-b")
    );
    assert!(
        b.handed_to(v).await.unwrap().is_none(),
        "barred from what is handed to it"
    );
    let taken = b
        .take_fenced(v, "addr-b", STEP, |l| {
            fenced.lock().unwrap().extend_from_slice(l);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(taken.gateway, "gw-b");
    assert_eq!(*fenced.lock().unwrap(), ["addr-a"]);
    assert!(
        c.handed_to(v).await.unwrap().is_none(),
        "the handoff outlived its taking"
    );

    // Handed to C, it is taken back by B, which handed it: A, looking first, is barred.
    assert!(b.release_to(v, taken.epoch, "gw-c", bar).await.unwrap());
    assert_eq!(a.take_fenced(v, "addr-a", STEP, |_| Ok(())).await.unwrap().epoch, 0);
    let back = b.take_fenced(v, "addr-b", STEP, |_| Ok(())).await.unwrap();
    assert_eq!(back.gateway, "gw-b");
    assert!(back.epoch > taken.epoch);
    assert!(a.handed_to(v).await.unwrap().is_none());

    // Handed to C, which never takes it, by a gateway that stays and never takes it back:
    // the bar lasts its own while, then any may take it.
    assert!(b
        .release_to(v, back.epoch, "gw-c", Duration::from_secs(2))
        .await
        .unwrap());
    assert_eq!(a.take_fenced(v, "addr-a", STEP, |_| Ok(())).await.unwrap().epoch, 0);
    let t0 = Instant::now();
    loop {
        let o = a.take_fenced(v, "addr-a", STEP, |_| Ok(())).await.unwrap();
        if o.gateway == "gw-a" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the bar outlived its time: {o:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    b.leave().await.unwrap();
    a.leave().await.unwrap();
    c.leave().await.unwrap();
}

/// How many keys etcd at `ep` holds under `prefix`.
async fn keys_under(ep: &[String], prefix: &str) -> i64 {
    let mut client = etcd_client::Client::connect(ep, None).await.unwrap();
    count_under(&mut client, prefix).await
}

/// The asks for `what` that `courier` takes, once there are some.
async fn taken_once_asked(courier: &tessera_ownership::Courier, what: &str) -> Vec<tessera_ownership::Ask> {
    loop {
        let t = courier.take_asks(|w| w == what, Duration::from_secs(5)).await.unwrap();
        if !t.is_empty() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A standby gateway asks the owner to run a request and gets its answer; each ask is taken
/// by one gateway once, however many look; an ask nobody answers in time is given up and
/// taken back, so that an owner that comes later does not run it; a gateway following the
/// ownership keys is not woken by asks and answers; an ask goes with its gateway's lease.
#[tokio::test]
async fn a_gateway_asks_the_owner_through_etcd_and_each_ask_runs_once() {
    let t = "a_gateway_asks_the_owner_through_etcd_and_each_ask_runs_once";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let mut owner = Gateway::join(&ep, &p, "gw-a", 3).await.unwrap();
    let other = Gateway::join(&ep, &p, "gw-c", 3).await.unwrap();
    let standby = Gateway::join(&ep, &p, "gw-b", 3).await.unwrap();
    let mut told = told_of_changes(&mut owner).await;
    let (a, b, c) = (owner.courier(), standby.courier(), other.courier());

    // The owner (and another gateway, racing it) take what comes and answer it.
    let serving = {
        let (a, c) = (a.clone(), c.clone());
        tokio::spawn(async move {
            let mut ran = Vec::new();
            while ran.len() < 2 {
                let mut coming = a.watch_asks().await.unwrap();
                for (who, courier) in [("a", &a), ("c", &c)] {
                    for ask in courier
                        .take_asks(|w| w == "pool.tank", Duration::from_secs(5))
                        .await
                        .unwrap()
                    {
                        let mut answer = ask.request.clone();
                        answer.extend_from_slice(b" done");
                        assert!(courier.answer(&ask, &answer).await.unwrap());
                        ran.push((who, ask.request));
                    }
                }
                coming.wait(Duration::from_secs(1)).await;
            }
            ran
        })
    };
    let wait = Duration::from_secs(5);
    assert_eq!(
        b.ask("pool.tank", b"register", wait).await.unwrap().as_deref(),
        Some(&b"register done"[..])
    );
    assert_eq!(
        b.ask("pool.tank", b"reserve", wait).await.unwrap().as_deref(),
        Some(&b"reserve done"[..])
    );
    let ran = serving.await.unwrap();
    let requests: Vec<&[u8]> = ran.iter().map(|(_, r)| r.as_slice()).collect();
    assert_eq!(
        requests,
        [&b"register"[..], &b"reserve"[..]],
        "each ask ran once: {ran:?}"
    );

    // One read takes the asks of every pool a gateway owns, each with what it is for; those
    // of a pool owned elsewhere are left to its owner.
    let asking = ["pool.tank", "pool.other", "pool.elsewhere"].map(|what| {
        let b = b.clone();
        tokio::spawn(async move { b.ask(what, what.as_bytes(), Duration::from_secs(5)).await })
    });
    let mut taken = Vec::new();
    while taken.len() < 2 {
        taken.extend(
            a.take_asks(|w| w == "pool.tank" || w == "pool.other", Duration::from_secs(5))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut whats: Vec<&str> = taken.iter().map(|ask| ask.what.as_str()).collect();
    whats.sort();
    assert_eq!(whats, ["pool.other", "pool.tank"]);
    let elsewhere = taken_once_asked(&c, "pool.elsewhere").await;
    for (courier, ask) in taken.iter().map(|t| (&a, t)).chain(elsewhere.iter().map(|t| (&c, t))) {
        assert_eq!(ask.what.as_bytes(), ask.request, "an ask came with what another is for");
        let mut answer = ask.request.clone();
        answer.extend_from_slice(b" done");
        assert!(courier.answer(ask, &answer).await.unwrap());
    }
    for (what, asked) in ["pool.tank", "pool.other", "pool.elsewhere"].iter().zip(asking) {
        assert_eq!(asked.await.unwrap().unwrap(), Some(format!("{what} done").into_bytes()));
    }

    // Nobody answers: given up after the wait, and taken back.
    let started = Instant::now();
    assert_eq!(
        b.ask("pool.tank", b"late", Duration::from_millis(500)).await.unwrap(),
        None
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        a.take_asks(|w| w == "pool.tank", Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty(),
        "a given-up ask was left to run"
    );
    // Taken, then given up before the answer came: the late answer leaves nothing behind.
    let asking = tokio::spawn({
        let b = b.clone();
        async move { b.ask("pool.tank", b"slow", Duration::from_millis(500)).await }
    });
    let taken = taken_once_asked(&a, "pool.tank").await;
    assert_eq!(asking.await.unwrap().unwrap(), None, "given up");
    assert!(!a.answer(&taken[0], b"slow done").await.unwrap());
    assert_eq!(
        keys_under(&ep, &format!("{p}/answer/")).await,
        0,
        "an answer outlived its ask"
    );

    // Taken, and answered after the first wait (a commit held up by a slow OSD): the asker
    // waits as long again, since the command runs at the owner. Until 2026-12-06 it gave up,
    // and its host, told to try again, found its command applied.
    let asking = tokio::spawn({
        let b = b.clone();
        async move { b.ask("pool.tank", b"held up", Duration::from_secs(2)).await }
    });
    let taken = taken_once_asked(&a, "pool.tank").await;
    // Past the first wait, well within the second (a second either way, for a loaded etcd).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.answer(&taken[0], b"held up done").await.unwrap(), "the asker gave up");
    assert_eq!(asking.await.unwrap().unwrap().as_deref(), Some(&b"held up done"[..]));
    // An ask whose asker no longer waits for it (its answer's key gone: a put that reached
    // etcd after the asker gave up and cleared its keys) is not taken, and is removed.
    let late = format!("{p}/ask/pool.tank/gw-b.{:x}.late", standby.lease());
    let mut raw = etcd_client::Client::connect(&ep, None).await.unwrap();
    let on_lease = etcd_client::PutOptions::new().with_lease(standby.lease());
    raw.put(late.as_str(), "late", Some(on_lease)).await.unwrap();
    assert!(
        a.take_asks(|w| w == "pool.tank", Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty(),
        "an ask nobody waits for was taken"
    );
    assert_eq!(keys_under(&ep, &format!("{p}/ask/")).await, 0, "the orphan ask stayed");
    assert_eq!(
        keys_under(&ep, &format!("{p}/answer/")).await,
        0,
        "an answer outlived its ask"
    );

    // None of it woke the owner's follower of the ownership keys.
    assert!(told.try_recv().is_err(), "asks and answers woke the ticks");

    // An ask goes once its asker stops waiting, whatever became of the asker: here its
    // task ends (its gateway died) before anyone takes it, and nothing cleans up after it.
    let wait = Duration::from_secs(1);
    let asking = tokio::spawn({
        let b = b.clone();
        async move { b.ask("pool.tank", b"orphan", wait).await }
    });
    let made = Instant::now();
    while keys_under(&ep, &format!("{p}/ask/")).await == 0 {
        assert!(made.elapsed() < Duration::from_secs(10), "the ask was not made");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    asking.abort();
    tokio::time::sleep(tessera_ownership::courier::ask_lifetime(wait) + Duration::from_secs(2)).await;
    assert!(
        a.take_asks(|w| w == "pool.tank", Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty(),
        "an ask outlived its asker's waits"
    );
    assert_eq!(
        keys_under(&ep, &format!("{p}/answer/")).await,
        0,
        "an answer outlived its ask"
    );
    standby.leave().await.unwrap();
    owner.leave().await.unwrap();
    other.leave().await.unwrap();
}

/// An ask the owner runs for long (a commit held up by a slow OSD) is waited for for as long
/// as the owner keeps it alive, past the lifetime its asker gave it: told to try again while
/// it still ran, the host would find its command applied. An owner that stops keeping it
/// (it died) is given up on once the lease runs out. An ask answered already is not taken
/// again, should its key be put again.
#[tokio::test]
async fn an_ask_the_owner_runs_long_is_waited_for_while_the_owner_keeps_it_alive() {
    let t = "an_ask_the_owner_runs_long_is_waited_for_while_the_owner_keeps_it_alive";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let owner = Gateway::join(&ep, &p, "gw-a", 3).await.unwrap();
    let standby = Gateway::join(&ep, &p, "gw-b", 3).await.unwrap();
    let (a, b) = (owner.courier(), standby.courier());
    // Long enough for a loaded machine: the owner renews four times a lease, and the asker
    // looks once the lease would have lapsed unrenewed.
    let wait = Duration::from_secs(4);
    let lifetime = tessera_ownership::courier::ask_lifetime(wait);
    let asked = |what: &'static [u8]| {
        let b = b.clone();
        tokio::spawn(async move { b.ask("pool.tank", what, wait).await })
    };
    let keep = |ask: &tessera_ownership::Ask| {
        let (a, ask) = (a.clone(), ask.clone());
        tokio::spawn(async move { a.keep_running(&ask).await })
    };

    let asking = asked(b"slow commit");
    let taken = taken_once_asked(&a, "pool.tank").await;
    let keeping = keep(&taken[0]);
    tokio::time::sleep(lifetime + Duration::from_secs(4)).await;
    assert!(
        !asking.is_finished(),
        "the asker gave up while the owner still ran its ask: {:?}",
        asking.await
    );
    assert!(
        a.answer(&taken[0], b"slow commit done").await.unwrap(),
        "the asker gave up"
    );
    keeping.abort();
    assert_eq!(
        asking.await.unwrap().unwrap().as_deref(),
        Some(&b"slow commit done"[..])
    );

    // The owner stops keeping it (it died): given up once the lease runs out.
    let asking = asked(b"owner dies");
    let taken = taken_once_asked(&a, "pool.tank").await;
    let keeping = keep(&taken[0]);
    tokio::time::sleep(lifetime).await;
    keeping.abort();
    let stopped = Instant::now();
    assert_eq!(asking.await.unwrap().unwrap(), None);
    assert!(
        stopped.elapsed() < lifetime + Duration::from_secs(2),
        "waited {:?} for an owner that stopped keeping its ask",
        stopped.elapsed()
    );

    // Answered already (its answer's key holds the answer), an ask put again is not run
    // again.
    let mut raw = etcd_client::Client::connect(&ep, None).await.unwrap();
    let lease = raw.lease_grant(30, None).await.unwrap().id();
    let on_lease = || Some(etcd_client::PutOptions::new().with_lease(lease));
    raw.put(format!("{p}/answer/pool.tank/gw-b.0.again"), "done", on_lease())
        .await
        .unwrap();
    raw.put(format!("{p}/ask/pool.tank/gw-b.0.again"), "again", on_lease())
        .await
        .unwrap();
    assert!(
        a.take_asks(|w| w == "pool.tank", Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty(),
        "an ask answered already was taken again"
    );
    raw.lease_revoke(lease).await.unwrap();
    standby.leave().await.unwrap();
    owner.leave().await.unwrap();
}

/// A taking that runs out of time returns the asks it took until then, to be run and
/// answered: they are gone from etcd for anyone else, and their askers would otherwise wait
/// their lifetime out. At most the one being taken when time ran out is lost, and none
/// runs twice.
#[tokio::test]
async fn a_taking_cut_short_returns_the_asks_it_took() {
    let t = "a_taking_cut_short_returns_the_asks_it_took";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let owner = Gateway::join(&ep, &p, "gw-a", 3).await.unwrap();
    let standby = Gateway::join(&ep, &p, "gw-b", 3).await.unwrap();
    let (a, b) = (owner.courier(), standby.courier());
    let mut etcd = etcd_client::Client::connect(&ep, None).await.unwrap();
    const ASKS: usize = 60;
    // Askers that wait long: however slow etcd is here, none gives up during the test.
    let asking: Vec<_> = (0..ASKS)
        .map(|i| {
            let b = b.clone();
            tokio::spawn(async move {
                b.ask("pool.tank", format!("ask {i}").as_bytes(), Duration::from_secs(60))
                    .await
            })
        })
        .collect();
    let waiting = format!("{p}/ask/");
    let placed_by = Instant::now() + Duration::from_secs(30);
    while count_under(&mut etcd, &waiting).await < ASKS as i64 {
        assert!(Instant::now() < placed_by, "the asks were not all placed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Takings given little time, a little more each: some run out partway.
    let (mut ran, mut cut, mut cut_after_taking) = (Vec::new(), 0, 0);
    let mut within = Duration::from_millis(2);
    let mut takings = 0;
    let mut left = count_under(&mut etcd, &waiting).await;
    while left > 0 {
        let before = left;
        let taking = a.take_asks(|w| w == "pool.tank", within).await;
        left = count_under(&mut etcd, &waiting).await;
        let returned = taking.as_ref().map_or(0, |t| t.len());
        let gone = (before - left) as usize;
        assert!(
            gone <= returned + 1,
            "a taking cut short lost {} asks: those taken before the time ran out were dropped",
            gone - returned
        );
        if taking.is_err() || left > 0 || gone > returned {
            cut += 1;
        }
        for ask in taking.unwrap_or_default() {
            if left > 0 {
                cut_after_taking += 1;
            }
            assert!(a.answer(&ask, &ask.request).await.unwrap(), "an asker gave up");
            ran.push(ask.request);
        }
        within += Duration::from_millis(2);
        takings += 1;
        assert!(takings < 2000, "the asks were never all taken");
    }
    eprintln!(
        "{} asks taken in {takings} takings, {cut} cut short ({cut_after_taking} asks taken by those), {} lost",
        ran.len(),
        ASKS - ran.len()
    );
    let mut once = ran.clone();
    once.sort();
    once.dedup();
    assert_eq!(once.len(), ran.len(), "an ask ran twice");
    // Those taken have their answers; those lost would wait their minute out.
    for (i, asked) in asking.into_iter().enumerate() {
        let request = format!("ask {i}").into_bytes();
        if ran.contains(&request) {
            assert_eq!(asked.await.unwrap().unwrap(), Some(request));
        } else {
            asked.abort();
        }
    }
    assert!(
        ASKS - ran.len() <= cut,
        "{} asks lost in {cut} takings cut short",
        ASKS - ran.len()
    );
    assert!(
        cut_after_taking > 0,
        "no taking ran out of time after taking some asks: the test did not test"
    );
    standby.leave().await.unwrap();
    owner.leave().await.unwrap();
}

/// How many keys `etcd` holds under `prefix`.
async fn count_under(etcd: &mut etcd_client::Client, prefix: &str) -> i64 {
    let options = etcd_client::GetOptions::new().with_prefix().with_count_only();
    etcd.get(prefix, Some(options)).await.unwrap().count()
}

/// The owner's notices reach every other gateway watching, not itself; they take at most
/// 64 keys per gateway however many it sends, wake no follower of the ownership keys, and
/// go with the gateway's lease.
#[tokio::test]
async fn an_owners_notices_reach_the_other_gateways_watching() {
    let t = "an_owners_notices_reach_the_other_gateways_watching";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let mut owner = Gateway::join(&ep, &p, "gw-a", 3).await.unwrap();
    let b = Gateway::join(&ep, &p, "gw-b", 3).await.unwrap();
    // A name that begins with another's and a dot is another gateway all the same.
    let c = Gateway::join(&ep, &p, "gw-a.2", 3).await.unwrap();
    let mut told = told_of_changes(&mut owner).await;
    let a = owner.courier();
    let mut at_a = a.watch_notices(None).await.unwrap();
    let mut at_b = b.courier().watch_notices(None).await.unwrap();
    let mut at_c = c.courier().watch_notices(None).await.unwrap();

    a.notify("pool.tank", b"preempted").await.unwrap();
    let want = vec![("pool.tank".to_string(), b"preempted".to_vec())];
    assert_eq!(next(&mut at_b).await, want);
    assert_eq!(next(&mut at_c).await, want);
    // b's own notice reaches a and c; a never sees its own.
    b.courier().notify("pool.other", b"from b").await.unwrap();
    let from_b = vec![("pool.other".to_string(), b"from b".to_vec())];
    assert_eq!(next(&mut at_a).await, from_b);
    assert_eq!(next(&mut at_c).await, from_b);
    c.courier().notify("pool.other", b"from gw-a.2").await.unwrap();
    assert_eq!(
        next(&mut at_a).await,
        vec![("pool.other".to_string(), b"from gw-a.2".to_vec())],
        "gw-a takes gw-a.2's notices for no notices of its own"
    );

    // However many the owner sends, they take at most 64 keys.
    for i in 0..100u32 {
        a.notify("pool.tank", &i.to_be_bytes()).await.unwrap();
    }
    let mut seen = 0;
    while seen < 100 {
        seen += next(&mut at_b).await.len();
    }
    let notices = format!("{p}/notice/pool.tank/");
    assert_eq!(keys_under(&ep, &notices).await, 64);
    assert!(told.try_recv().is_err(), "notices woke the ticks");

    // They go with the owner's lease.
    owner.leave().await.unwrap();
    assert_eq!(keys_under(&ep, &notices).await, 0);
    b.leave().await.unwrap();
    c.leave().await.unwrap();
}

/// An administrator's move outlives the gateway that asked for it (it is on no lease), is
/// ended only at the revision that asked it (a move asked since stays), and a later move
/// replaces an earlier one.
#[tokio::test]
async fn a_move_holds_until_ended_at_its_revision() {
    let t = "a_move_holds_until_ended_at_its_revision";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    let mut a = Gateway::join(&ep, &p, "gw-a", 5).await.unwrap();
    let mut b = Gateway::join(&ep, &p, "gw-b", 5).await.unwrap();
    assert_eq!(a.moving("pool.tank").await.unwrap(), None);
    a.move_to("pool.tank", "gw-b").await.unwrap();
    a.leave().await.unwrap();
    let (to, first) = b.moving("pool.tank").await.unwrap().expect("the move outlives A");
    assert_eq!(to, "gw-b");
    // Asked again (for another gateway) before B ended the first: B's end changes nothing.
    let mut c = Gateway::join(&ep, &p, "gw-c", 5).await.unwrap();
    c.move_to("pool.tank", "gw-c").await.unwrap();
    assert!(!b.end_move("pool.tank", first).await.unwrap());
    let (to, second) = c.moving("pool.tank").await.unwrap().unwrap();
    assert_eq!(to, "gw-c");
    assert!(second > first);
    // Every move at once, as a gateway's tick reads them.
    b.move_to("pool.other", "gw-b").await.unwrap();
    let (_, other) = b.moving("pool.other").await.unwrap().unwrap();
    let mut moves = b.moves().await.unwrap();
    moves.sort();
    assert_eq!(
        moves,
        [
            ("pool.other".to_string(), "gw-b".to_string(), other),
            ("pool.tank".to_string(), "gw-c".to_string(), second)
        ]
    );
    assert!(c.end_move("pool.tank", second).await.unwrap());
    assert_eq!(b.moving("pool.tank").await.unwrap(), None);
    assert!(b.end_move("pool.other", other).await.unwrap());
    assert_eq!(b.moves().await.unwrap(), []);
    b.leave().await.unwrap();
    c.leave().await.unwrap();
}

/// etcd may revoke a gateway's lease whatever it renewed: an administrator with `etcdctl
/// lease revoke`, or etcd's leader on its own word once it resumes from a stall (etcd issue
/// 15247). A gateway that follows the keys knows within a round trip, not at its next
/// renewal a third of the lease later: its lease clock stops holding, and with it every disk
/// of what it owned, well before another gateway, which must take it in etcd and fence this
/// one off first, writes to any of it. A release of its own,
/// which deletes a key on its lease too, costs it a renewal, not the lease.
#[tokio::test]
async fn a_gateway_whose_lease_etcd_revokes_knows_at_once() {
    let t = "a_gateway_whose_lease_etcd_revokes_knows_at_once";
    let Some(ep) = endpoints(t) else { return };
    let p = prefix(t);
    // Renewed every 10 s.
    let mut g = Gateway::join(&ep, &p, "gw-a", 30).await.unwrap();
    let clock = g.lease_clock();
    let _told = told_of_changes(&mut g).await;
    g.acquire("pool/v1").await.unwrap();
    let v2 = g.acquire("pool/v2").await.unwrap();
    assert!(g.release("pool/v2", v2.epoch).await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        g.alive() && clock.holds(),
        "a release of its own cost the gateway its lease"
    );
    let mut admin = etcd_client::Client::connect(&ep, None).await.unwrap();
    let revoked = Instant::now();
    admin.lease_revoke(g.lease()).await.unwrap();
    let knew = common::until_lease_lost(&g, revoked, Duration::from_secs(2)).await;
    eprintln!("{t}: knew within {knew:?}");
    assert_eq!(g.owner("pool/v1").await.unwrap(), None);
}
