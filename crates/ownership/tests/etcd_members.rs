//! Against an etcd cluster of three members of the test's own, as an installation that must
//! survive the loss of one runs it. Needs Debian's `etcd` and `etcdctl`; without them the
//! test says it was skipped, and why.
#![cfg(feature = "etcd")]

use std::time::Duration;

mod common;

use tessera_ownership::Gateway;
use tessera_test_support::etcd_cluster::{EtcdCluster, MEMBERS};

/// A gateway given every member of the cluster keeps its lease, and what it owns at the same
/// epoch, while each member in turn (the leader first) is killed and, once the lease's time (8 s)
/// has passed, started again, and while two followers and then the leader stall (SIGSTOP)
/// as long: its renewals and its requests go on through the others. Until
/// 2026-12-06 the first member to die under the lease's renewals made the gateway take its
/// lease for lost.
///
/// The leader stalls last. Resumed, it may still take itself for the leader long enough to
/// revoke every lease whose time ran out on its own clock, stopped with it, and the new leader
/// applies the revocation (etcd issue 15247; fixed by etcd's pull request 16822, which Debian
/// 12's etcd 3.4.23 predates): that lease is then gone whatever its holder did. The gateway
/// cannot prevent it; following the keys, it must know within 2 s (its renewals go every
/// 2.7 s), and own nothing from then on. When etcd did not revoke it so, the test revokes
/// it, and the gateway must know as soon. Until 2026-12-06 this test stalled the leader
/// first, and failed whenever etcd revoked the lease so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_keeps_its_lease_while_the_members_of_its_etcd_fail_in_turn() {
    let t = "a_gateway_keeps_its_lease_while_the_members_of_its_etcd_fail_in_turn";
    let mut etcd = match tokio::task::spawn_blocking(EtcdCluster::start).await.unwrap() {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(t, &why),
    };
    let ttl = 8;
    let mut g = Gateway::join(&etcd.endpoints, "/tessera", "gw-a", ttl).await.unwrap();
    g.follow_changes(|| {}).await;
    let before = g.acquire("pool.a").await.unwrap();
    let stopped = common::watch_lease(g.lease_clock());
    let leader = etcd.leader().expect("a leader");
    for k in (0..MEMBERS).map(|i| (leader + i) % MEMBERS) {
        etcd = tokio::task::spawn_blocking(move || {
            etcd.kill(k);
            etcd
        })
        .await
        .unwrap();
        // Longer than the lease: renewed since, or lapsed.
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(g.alive(), "the lease keeper gave up once member {k} died");
        assert!(
            !stopped.is_finished(),
            "the lease's clock stopped holding once member {k} died"
        );
        let owner = g.owner("pool.a").await.unwrap().expect("pool.a has an owner");
        assert!(g.holds(&owner), "{owner:?}");
        assert_eq!(owner.epoch, before.epoch);
        // Another vdisk can be taken with one member down.
        g.acquire(&format!("pool.{k}")).await.unwrap();
        etcd = tokio::task::spawn_blocking(move || {
            etcd.start_again(k).unwrap();
            etcd
        })
        .await
        .unwrap();
    }
    // A follower, another, then whichever member leads then, stalls (SIGSTOP) for longer than
    // the lease, and goes on: one of them holds the stream the lease's renewals go through.
    // (A follower resumed may start an election, and another member lead after it.)
    let mut stalled = Vec::new();
    for round in 0..MEMBERS {
        let leader = etcd.leader().expect("a leader");
        let k = match round + 1 < MEMBERS {
            true => (0..MEMBERS)
                .find(|k| *k != leader && !stalled.contains(k))
                .unwrap_or((leader + 1) % MEMBERS),
            false => leader,
        };
        stalled.push(k);
        etcd.signal(k, libc::SIGSTOP);
        tokio::time::sleep(Duration::from_secs(9)).await;
        let owner = tokio::time::timeout(Duration::from_secs(10), g.owner("pool.a"))
            .await
            .expect("a request hung while a member stalled");
        etcd.signal(k, libc::SIGCONT);
        let owner = owner.unwrap().expect("pool.a has an owner");
        assert!(g.alive(), "the lease keeper gave up once member {k} stalled");
        assert!(
            !stopped.is_finished(),
            "the lease's clock stopped holding once member {k} stalled"
        );
        assert_eq!((owner.epoch, g.holds(&owner)), (before.epoch, true), "{owner:?}");
        // Back in the cluster before the next one stalls.
        etcd = tokio::task::spawn_blocking(move || {
            etcd.until_healthy().unwrap();
            etcd
        })
        .await
        .unwrap();
    }
    // The leader resumed a while ago: a revocation on its word is applied by now. Without
    // one, the lease is revoked here, as an administrator may (`etcdctl lease revoke`): the
    // gateway learns either the same way.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let on_its_word = g.owner("pool.a").await.unwrap().is_none();
    if !on_its_word {
        assert!(g.alive() && !stopped.is_finished());
        let id = format!("{:x}", g.lease());
        etcd = tokio::task::spawn_blocking(move || {
            // etcd may have revoked it on the leader's word just before.
            if let Err(e) = etcd.ctl(&["lease", "revoke", &id]) {
                assert!(e.contains("lease not found"), "{e}");
            }
            etcd
        })
        .await
        .unwrap();
        assert!(g.owner("pool.a").await.unwrap().is_none());
    }
    // The gateway follows the keys, and the lease's keys deleted wake its renewal: well
    // within the period of its renewals (2.7 s), through a watch made again after each
    // member's death.
    let knew = common::until_lease_lost(&g, std::time::Instant::now(), Duration::from_secs(2)).await;
    stopped.abort();
    eprintln!(
        "{t}: etcd revoked the lease {}; the gateway knew within {knew:?}",
        if on_its_word {
            "on the word of its resumed leader"
        } else {
            "when told to"
        },
    );
    drop(etcd);
}

/// A gateway whose etcd stalls whole (every member stopped) takes its lease for lost no later
/// than etcd may let it lapse: the lease's time from the last renewal sent before the stall,
/// and no sooner than that time from a period before it (renewals go every third of the
/// lease), whatever the lease keeper is waiting for meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_etcd_stalls_takes_its_lease_for_lost_in_time() {
    let t = "a_gateway_whose_etcd_stalls_takes_its_lease_for_lost_in_time";
    let etcd = match tokio::task::spawn_blocking(EtcdCluster::start).await.unwrap() {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(t, &why),
    };
    let (ttl, every) = (Duration::from_secs(3), Duration::from_secs(1));
    let g = Gateway::join(&etcd.endpoints, "/tessera", "gw-a", 3).await.unwrap();
    let clock = g.lease_clock();
    // Several renewals first, through the stream and the spread as they stand in use.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(clock.holds());
    let stalled = std::time::Instant::now();
    for k in 0..MEMBERS {
        etcd.signal(k, libc::SIGSTOP);
    }
    while clock.holds() {
        assert!(
            stalled.elapsed() < ttl + Duration::from_secs(2),
            "the lease still holds"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lost = stalled.elapsed();
    for k in 0..MEMBERS {
        etcd.signal(k, libc::SIGCONT);
    }
    assert!(lost <= ttl + Duration::from_millis(50), "held {lost:?} into the stall");
    // No sooner than a period and a margin before the lease's end: the last renewal answered
    // was sent at most a period before the next, unanswered, which a busy machine may send
    // late.
    assert!(
        lost >= ttl - every - Duration::from_millis(300),
        "lost after only {lost:?}"
    );
    // The keeper gives up too, and the gateway knows it.
    tokio::time::sleep(every).await;
    assert!(!g.alive());
}

/// A watch on a member that serves goes on however long it is quiet (the member answers
/// each progress request); one on a member that stalls (SIGSTOP) ends within its patience,
/// for its holder to make again through a member that serves. Until 2026-12-06 a watch on a
/// stalled member waited until the member went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_member_stalls_and_not_while_it_is_quiet() {
    use tessera_ownership::watching::{Patience, Watch};
    let t = "a_watch_ends_when_its_member_stalls_and_not_while_it_is_quiet";
    let etcd = match tokio::task::spawn_blocking(EtcdCluster::start).await.unwrap() {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(t, &why),
    };
    let p = Patience {
        quiet: Duration::from_millis(300),
        answer: Duration::from_secs(1),
    };
    let mut client = etcd_client::Client::connect([etcd.endpoints[1].clone()], None)
        .await
        .unwrap();
    let mut watch = Watch::from(client.watch("/quiet", None).await.unwrap());
    let t0 = std::time::Instant::now();
    let mut answers = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        let r = tokio::time::timeout(Duration::from_secs(5), watch.next(p))
            .await
            .expect("a member that serves answers a quiet watch's progress requests")
            .expect("a quiet watch on a member that serves goes on");
        assert!(r.events().is_empty(), "nothing was written under /quiet");
        answers += 1;
    }
    assert!(answers >= 3, "{answers} progress answers in 3 s");
    // Written to: told.
    let mut writer = etcd_client::Client::connect([etcd.endpoints[0].clone()], None)
        .await
        .unwrap();
    writer.put("/quiet", "now", None).await.unwrap();
    let told = loop {
        let r = tokio::time::timeout(Duration::from_secs(5), watch.next(p))
            .await
            .expect("the write is told")
            .expect("the watch goes on");
        if !r.events().is_empty() {
            break r;
        }
    };
    assert_eq!(told.events()[0].kv().unwrap().value(), b"now");

    etcd.signal(1, libc::SIGSTOP);
    let stalled = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        // An answer already on its way may still come.
        while watch.next(p).await.is_some() {}
    })
    .await;
    let took = stalled.elapsed();
    etcd.signal(1, libc::SIGCONT);
    assert!(ended.is_ok(), "the watch on the stalled member did not end");
    assert!(took < p.quiet + p.answer + Duration::from_millis(700), "{took:?}");
    eprintln!("{t}: {answers} progress answers in 3 s; the stall was noticed after {took:?}");
}

/// The notices an owner sends reach a gateway watching them while each member of its etcd
/// in turn stalls (SIGSTOP): the one its watch is on among them. The watch ends once its
/// member answers nothing, and is made again from the last notice seen through the members
/// that serve, as the daemon makes it. Until 2026-12-06 the notices sent while that member
/// stalled came only once it went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_come_while_the_member_watched_stalls() {
    let t = "notices_come_while_the_member_watched_stalls";
    let mut etcd = match tokio::task::spawn_blocking(EtcdCluster::start).await.unwrap() {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(t, &why),
    };
    let owner = Gateway::join(&etcd.endpoints, "/tessera", "gw-a", 8).await.unwrap();
    let standby = Gateway::join(&etcd.endpoints, "/tessera", "gw-b", 8).await.unwrap();
    let courier = standby.courier();
    let mut notices = courier.watch_notices(None).await.unwrap();
    for k in 0..MEMBERS {
        etcd.signal(k, libc::SIGSTOP);
        // The gateways' requests go to the other members once they have found it stalled
        // (members.rs asks every member each second).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let sent = format!("while m{k} stalls");
        let told = tokio::time::timeout(
            Duration::from_secs(10),
            owner.courier().notify("pool.tank", sent.as_bytes()),
        )
        .await;
        let came = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match notices.next().await {
                    Some(got) => {
                        if got.iter().any(|(_, n)| n == sent.as_bytes()) {
                            return;
                        }
                    }
                    None => {
                        let seen = notices.seen();
                        loop {
                            match courier.watch_notices(Some(seen)).await {
                                Ok(w) => break notices = w,
                                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                            }
                        }
                    }
                }
            }
        })
        .await;
        etcd.signal(k, libc::SIGCONT);
        told.expect("the notice was sent in time").unwrap();
        assert!(came.is_ok(), "the notice sent while m{k} stalled did not come");
        etcd = tokio::task::spawn_blocking(move || {
            etcd.until_healthy().unwrap();
            etcd
        })
        .await
        .unwrap();
    }
    drop(etcd);
}
