//! What the ownership tests share: the etcd and the Ceph cluster `scripts/test-scale-out.sh`
//! starts. Each test uses a part of it.
#![allow(dead_code)]

/// The endpoints of the etcd to test against, or None (the test then says it was skipped, and
/// why).
pub fn endpoints(test: &str) -> Option<Vec<String>> {
    match std::env::var("TESSERA_ETCD_ENDPOINTS") {
        Ok(e) if !e.is_empty() => Some(e.split(',').map(String::from).collect()),
        _ => {
            tessera_disk::skip(
                test,
                "no etcd (TESSERA_ETCD_ENDPOINTS is empty: scripts/test-scale-out.sh sets it to the etcd it starts)",
            );
            None
        }
    }
}

/// The Ceph cluster's configuration file to test against, or None (the test then says it was
/// skipped, and why).
#[cfg(feature = "fencing")]
pub fn ceph_conf(test: &str) -> Option<String> {
    match std::env::var("TESSERA_CEPH_CONF") {
        Ok(c) if !c.is_empty() => Some(c),
        _ => {
            tessera_disk::skip(
                test,
                "no Ceph cluster (TESSERA_CEPH_CONF is empty: scripts/test-scale-out.sh sets it)",
            );
            None
        }
    }
}

/// The RADOS pool the tests write in.
#[cfg(feature = "fencing")]
pub const TEST_POOL: &str = "tessera-test";

/// A connection to the cluster as the admin client, with timeouts so that a cluster gone away
/// fails a test instead of hanging it, and the test pool made if missing.
#[cfg(feature = "fencing")]
pub fn ceph(conf: &str) -> std::sync::Arc<tessera_rados::Cluster> {
    let c = tessera_rados::Cluster::connect(
        conf,
        "admin",
        &[("rados_osd_op_timeout", "30"), ("rados_mon_op_timeout", "30")],
    )
    .unwrap();
    match c.create_pool(TEST_POOL) {
        Ok(()) => {}
        Err(e) if e.errno() == Some(libc::EEXIST) => {}
        Err(e) => panic!("create the test pool: {e}"),
    }
    std::sync::Arc::new(c)
}

/// The next notices `w` sees, within 5 s.
#[cfg(feature = "etcd")]
pub async fn next(w: &mut tessera_ownership::NoticesComing) -> Vec<(String, Vec<u8>)> {
    tokio::time::timeout(std::time::Duration::from_secs(5), w.next())
        .await
        .expect("a notice comes")
        .expect("the watch goes on")
}

/// Watches `clock` every 20 ms from now on. The task ends the first time the clock stops
/// holding: `is_finished()` says whether it ever did.
#[cfg(feature = "etcd")]
pub fn watch_lease(clock: tessera_ownership::LeaseClock) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while clock.holds() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
}

/// Waits until `g` knows its lease lost (its keeper gave up and its lease clock no longer
/// holds), which must be within `within` of `revoked`; how long it took.
#[cfg(feature = "etcd")]
#[allow(dead_code)]
pub async fn until_lease_lost(
    g: &tessera_ownership::Gateway,
    revoked: std::time::Instant,
    within: std::time::Duration,
) -> std::time::Duration {
    let clock = g.lease_clock();
    while g.alive() || clock.holds() {
        assert!(
            revoked.elapsed() < within,
            "the lease was revoked {:?} ago, and the gateway still holds it",
            revoked.elapsed()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    revoked.elapsed()
}

/// What `g` is told as it follows the ownership keys: one message per change.
#[cfg(feature = "etcd")]
#[allow(dead_code)]
pub async fn told_of_changes(g: &mut tessera_ownership::Gateway) -> tokio::sync::mpsc::UnboundedReceiver<()> {
    let (tx, told) = tokio::sync::mpsc::unbounded_channel();
    g.follow_changes(move || {
        let _ = tx.send(());
    })
    .await;
    told
}
