//! Ownership as ALUA reports it, against a real etcd (`scripts/test-scale-out.sh` starts one):
//! the owner's group active/optimized and the other's standby, a request at the standby
//! gateway that never takes the vdisk from a live owner, and one that takes it, fencing the
//! old owner first, once the owner's lease expired.
#![cfg(feature = "etcd")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::endpoints;
use tessera_ownership::alua::VdiskPorts;
use tessera_ownership::Gateway;
use tessera_scsi::{AccessState, PortGroups};

struct Side {
    gateway: Arc<tokio::sync::Mutex<Gateway>>,
    ports: VdiskPorts,
    fenced: Arc<Mutex<Vec<Option<String>>>>,
    changes: Arc<AtomicUsize>,
    /// Each state this gateway was told of, with how many fencings had ended then.
    told: Arc<Mutex<Vec<(AccessState, usize)>>>,
}

fn side(rt: &tokio::runtime::Runtime, ep: &[String], prefix: &str, name: &str, ttl: i64) -> Side {
    let gateway = Arc::new(tokio::sync::Mutex::new(
        rt.block_on(Gateway::join(ep, prefix, name, ttl)).unwrap(),
    ));
    let fenced = Arc::new(Mutex::new(Vec::new()));
    let changes = Arc::new(AtomicUsize::new(0));
    let told = Arc::new(Mutex::new(Vec::new()));
    let (f, c, t, ended) = (fenced.clone(), changes.clone(), told.clone(), fenced.clone());
    let ports = VdiskPorts::start(
        rt.handle().clone(),
        gateway.clone(),
        vec!["gw-a".into(), "gw-b".into()],
        "pool/v",
        &format!("address-of-{name}"),
        // A fencing takes a while (a monitor command): the key is put, and seen, before it ends.
        Box::new(move |previous| {
            std::thread::sleep(Duration::from_millis(300));
            f.lock().unwrap().push(previous.map(String::from));
            true
        }),
        Some(Box::new(move |state| {
            c.fetch_add(1, Ordering::SeqCst);
            t.lock().unwrap().push((state, ended.lock().unwrap().len()));
        })),
    )
    .unwrap();
    Side {
        gateway,
        ports,
        fenced,
        changes,
        told,
    }
}

/// Waits up to `limit` for `f` to hold.
fn eventually(limit: Duration, f: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

#[test]
fn the_owner_is_active_a_live_owner_keeps_its_vdisk_and_a_dead_ones_is_taken_fenced() {
    let t = "the_owner_is_active_a_live_owner_keeps_its_vdisk_and_a_dead_ones_is_taken_fenced";
    let Some(ep) = endpoints(t) else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let prefix = format!("/tessera-test/{t}-{}", std::process::id());
    let ttl = 3;
    let a = side(&rt, &ep, &prefix, "gw-a", ttl);
    let b = side(&rt, &ep, &prefix, "gw-b", ttl);
    assert_eq!(a.ports.local(), (1, 1));
    assert_eq!(b.ports.local(), (2, 2));
    // Nobody owns it yet: both standby; a host's write at A takes it.
    assert_eq!(a.ports.local_state(), AccessState::Standby);
    assert_eq!(a.ports.request_access(), AccessState::ActiveOptimized);
    assert_eq!(
        *a.fenced.lock().unwrap(),
        vec![None],
        "the first owner has nobody to fence"
    );
    // Never active before the fencing ended: transitioning while its key was there and the
    // fencing ran. (Until 2026-12-06 the watch made it active as soon as the key was put.)
    let told = a.told.lock().unwrap().clone();
    assert!(
        !told.contains(&(AccessState::ActiveOptimized, 0)),
        "A was active before it had fenced: {told:?}"
    );
    assert_eq!(told.last(), Some(&(AccessState::ActiveOptimized, 1)), "{told:?}");
    // A gives the vdisk up and takes it again: the address on record is its own, which it
    // does not fence off.
    let first = a.ports.owner().unwrap();
    assert!(rt
        .block_on(async { a.gateway.lock().await.release("pool/v", first.epoch).await })
        .unwrap());
    assert!(
        eventually(Duration::from_secs(30), || a.ports.local_state()
            == AccessState::Standby),
        "A never saw the vdisk free"
    );
    // Four commands at once: the vdisk is taken once, not given up and taken again by each
    // command that waited for the first's taking (until 2026-12-06 each did, and another
    // gateway could take the vdisk in between).
    let answers: Vec<AccessState> = std::thread::scope(|s| {
        let asking: Vec<_> = (0..4).map(|_| s.spawn(|| a.ports.request_access())).collect();
        asking.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(answers.contains(&AccessState::ActiveOptimized), "{answers:?}");
    assert_eq!(a.ports.local_state(), AccessState::ActiveOptimized);
    assert_eq!(
        *a.fenced.lock().unwrap(),
        vec![None, None],
        "A fenced its own address off, or took the vdisk more than once"
    );
    assert!(
        eventually(Duration::from_secs(30), || b
            .ports
            .owner()
            .is_some_and(|o| o.gateway == "gw-a")),
        "B never saw A take the vdisk"
    );
    let groups = b.ports.groups();
    assert_eq!(
        groups.iter().map(|g| (g.id, g.state)).collect::<Vec<_>>(),
        vec![(1, AccessState::ActiveOptimized), (2, AccessState::Standby)]
    );
    assert!(
        b.changes.load(Ordering::SeqCst) >= 1,
        "B was not told its state changed"
    );

    // A host's write at B while A is alive: refused, the vdisk stays A's (no ping-pong).
    let epoch = a.ports.owner().unwrap().epoch;
    assert_eq!(b.ports.request_access(), AccessState::Standby);
    assert!(b.fenced.lock().unwrap().is_empty(), "B fenced a live owner");
    assert_eq!(a.ports.local_state(), AccessState::ActiveOptimized);
    assert_eq!(a.ports.owner().unwrap().epoch, epoch);

    // A stalls: it serves nothing once it knows its lease may be gone, and B takes the
    // vdisk at the first request after the lease expired, fencing A's address first.
    rt.block_on(async { a.gateway.lock().await.stall() });
    assert!(
        eventually(Duration::from_secs(ttl as u64 + 3), || a.ports.local_state()
            != AccessState::ActiveOptimized),
        "a stalled owner still reports itself active"
    );
    let stalled = Instant::now();
    assert!(
        eventually(Duration::from_secs(ttl as u64 + 5), || b.ports.request_access()
            == AccessState::ActiveOptimized),
        "B never took the vdisk over"
    );
    let took = stalled.elapsed();
    assert_eq!(*b.fenced.lock().unwrap(), vec![Some("address-of-gw-a".to_string())]);
    assert!(
        b.ports.owner().unwrap().epoch > epoch,
        "the takeover has a larger epoch"
    );
    eprintln!(
        "{t}: taken over {:.1} s after the owner stalled (lease {ttl} s)",
        took.as_secs_f64()
    );
    drop(a);
    let mut gateway = b.gateway.clone();
    drop(b);
    // The aborted watch lets its handle go once the runtime has dropped the task.
    let start = Instant::now();
    let g = loop {
        match Arc::try_unwrap(gateway) {
            Ok(g) => break g.into_inner(),
            Err(still) if start.elapsed() < Duration::from_secs(5) => {
                gateway = still;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => panic!("the watch of a dropped VdiskPorts still holds its gateway"),
        }
    };
    rt.block_on(g.leave()).unwrap();
}

/// A watch of the owner that ends (etcd restarted) is made again: the owner, transitioning
/// while it knows nothing, reports itself active again once it has read its key anew.
/// Until 2026-12-06 the watch was not made again, and the port stayed transitioning for
/// good: the vdisk was served nowhere while its owner's lease held.
#[test]
fn the_owner_is_followed_again_after_etcd_restarts() {
    use tessera_ownership::EtcdUser;
    use tessera_test_support::password_etcd::PasswordEtcd;
    let t = "the_owner_is_followed_again_after_etcd_restarts";
    let mut etcd = match PasswordEtcd::start(300) {
        Ok(e) => e,
        Err(why) => {
            tessera_disk::skip(t, &why);
            return;
        }
    };
    let ep = vec![etcd.endpoint.clone()];
    etcd.user_for_prefix("gw-a", "gw-a-password", "/tessera/").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let user = EtcdUser::new("gw-a", "gw-a-password");
    let gateway = Arc::new(tokio::sync::Mutex::new(
        rt.block_on(Gateway::join_as(&ep, None, Some(&user), "/tessera", "gw-a", 10))
            .unwrap(),
    ));
    let told = Arc::new(Mutex::new(Vec::new()));
    let t2 = told.clone();
    let ports = VdiskPorts::start(
        rt.handle().clone(),
        gateway.clone(),
        vec!["gw-a".into(), "gw-b".into()],
        "pool/v",
        "address-of-gw-a",
        Box::new(|_| true),
        Some(Box::new(move |state| t2.lock().unwrap().push(state))),
    )
    .unwrap();
    assert_eq!(ports.request_access(), AccessState::ActiveOptimized);
    told.lock().unwrap().clear();
    etcd.restart().unwrap();
    let restarted = Instant::now();
    assert!(
        eventually(Duration::from_secs(20), || {
            let told = told.lock().unwrap();
            told.contains(&AccessState::Transitioning) && told.last() == Some(&AccessState::ActiveOptimized)
        }),
        "the owner did not follow its key again: told {:?}, now {:?}",
        told.lock().unwrap(),
        ports.local_state()
    );
    eprintln!("{t}: active again {:?} after the restart", restarted.elapsed());
    assert_eq!(ports.owner().map(|o| o.gateway).as_deref(), Some("gw-a"));
}
