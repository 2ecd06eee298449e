//! Against an etcd of the test's own that confines each gateway to its keys (authentication
//! on), as docs/security.md tells an administrator to run it: one that serves TLS only and
//! knows its clients by their certificates, and one that knows them by their passwords.
//! Needs Debian's `etcd`, `etcdctl` and `openssl`; without them the test says it was
//! skipped, and why.
#![cfg(feature = "etcd")]

use std::time::Duration;

mod common;

use tessera_ownership::{EtcdTls, EtcdUser, Gateway};
use tessera_test_support::password_etcd::PasswordEtcd;
use tessera_test_support::tls_etcd::{Identity, TlsEtcd};

fn tls(etcd: &TlsEtcd, id: Option<&Identity>) -> EtcdTls {
    EtcdTls {
        ca: std::fs::read(etcd.ca()).unwrap(),
        identity: id.map(|id| (std::fs::read(&id.cert).unwrap(), std::fs::read(&id.key).unwrap())),
    }
}

/// Joins and takes `what`, or says why not.
async fn take(ep: &[String], tls: Option<&EtcdTls>, prefix: &str, name: &str, what: &str) -> Result<(), String> {
    let mut g = Gateway::join_through(ep, tls, prefix, name, 5)
        .await
        .map_err(|e| e.to_string())?;
    let taken = g.acquire(what).await.map_err(|e| e.to_string());
    let _ = g.leave().await;
    taken.map(|o| assert_eq!(o.gateway, name))
}

#[tokio::test]
async fn a_gateway_reaches_an_etcd_that_knows_it_by_its_certificate_and_keeps_to_its_prefix() {
    let t = "a_gateway_reaches_an_etcd_that_knows_it_by_its_certificate_and_keeps_to_its_prefix";
    let etcd = match TlsEtcd::start() {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(t, &why),
    };
    let ep = vec![etcd.endpoint.clone()];
    let gw_a = etcd.user_for_prefix("gw-a", "/tessera/").unwrap();
    let ok = tls(&etcd, Some(&gw_a));
    take(&ep, Some(&ok), "/tessera", "gw-a", "pool.tank").await.unwrap();
    // The endpoint without its scheme is taken as https:// once TLS is set up.
    let bare = vec![etcd.endpoint.trim_start_matches("https://").to_string()];
    take(&bare, Some(&ok), "/tessera", "gw-a", "pool.tank").await.unwrap();

    let owners = |etcd: &TlsEtcd| etcd.ctl("root", &["get", "--prefix", "--keys-only", "/"]).unwrap();
    let refused = [
        // A user whose role covers other keys only.
        (etcd.user_for_prefix("gw-b", "/elsewhere/").unwrap(), "gw-b"),
        // A certificate of the authority, for a name etcd has no user of.
        (etcd.identity("mallory").unwrap(), "mallory"),
    ];
    for (id, name) in &refused {
        let e = take(&ep, Some(&tls(&etcd, Some(id))), "/tessera", name, "pool.other")
            .await
            .expect_err("etcd let a gateway take a key outside its role");
        assert!(e.contains("permission denied"), "{name}: {e}");
    }
    // No certificate, or an authority that did not sign etcd's: refused at the handshake.
    let none = tls(&etcd, None);
    take(&ep, Some(&none), "/tessera", "gw-a", "pool.other")
        .await
        .expect_err("etcd took a client without a certificate");
    let stranger = TlsEtcd::start().unwrap();
    let mut wrong = tls(&stranger, Some(&stranger.identity("gw-a").unwrap()));
    let e = take(&ep, Some(&wrong), "/tessera", "gw-a", "pool.other")
        .await
        .expect_err("a gateway trusted an etcd signed by another authority");
    assert!(e.contains("invalid peer certificate"), "{e}");
    wrong.ca = ok.ca.clone();
    take(&ep, Some(&wrong), "/tessera", "gw-a", "pool.other")
        .await
        .expect_err("etcd took a certificate another authority signed");
    assert!(!owners(&etcd).contains("pool.other"), "{}", owners(&etcd));

    // Plain text where TLS is set up, or the other way: said before anything is sent.
    let plain = vec![etcd.endpoint.replace("https://", "http://")];
    let e = take(&plain, Some(&ok), "/tessera", "gw-a", "pool.tank")
        .await
        .unwrap_err();
    assert!(e.contains("is not https://"), "{e}");
    let e = take(&ep, None, "/tessera", "gw-a", "pool.tank").await.unwrap_err();
    assert!(e.contains("needs TLS"), "{e}");
}

/// A gateway joined as etcd user gw-a (confined to `/tessera/`) with a lease of `ttl` s, to
/// an etcd of its own whose tokens live 300 s; None (the test skipped, and why) without etcd.
async fn gateway_of_user(t: &str, ttl: i64) -> Option<(PasswordEtcd, Vec<String>, Gateway)> {
    let etcd = match PasswordEtcd::start(300) {
        Ok(e) => e,
        Err(why) => {
            tessera_disk::skip(t, &why);
            return None;
        }
    };
    let ep = vec![etcd.endpoint.clone()];
    etcd.user_for_prefix("gw-a", "gw-a-password", "/tessera/").unwrap();
    let user = EtcdUser::new("gw-a", "gw-a-password");
    let g = Gateway::join_as(&ep, None, Some(&user), "/tessera", "gw-a", ttl)
        .await
        .unwrap();
    Some((etcd, ep, g))
}

/// `etcd` killed, and started again on its data.
async fn restarted(etcd: PasswordEtcd) -> PasswordEtcd {
    tokio::task::spawn_blocking(move || {
        let mut etcd = etcd;
        etcd.restart().map(|()| etcd)
    })
    .await
    .unwrap()
    .unwrap()
}

/// An etcd that restarts (killed, and started again on its data) costs a gateway nothing:
/// its lease's renewals go on through a new stream, under a new token bought at once, since
/// etcd forgot the one the gateway had (not at the next period, 30 s on, long after the
/// lease would have lapsed); what the gateway owned it still owns, at the same epoch, and its
/// lease's clock never stopped holding.
#[tokio::test]
async fn a_gateway_keeps_its_lease_through_a_restart_of_etcd() {
    let t = "a_gateway_keeps_its_lease_through_a_restart_of_etcd";
    let Some((etcd, ep, mut g)) = gateway_of_user(t, 8).await else {
        return;
    };
    let before = g.acquire("pool.a").await.unwrap();
    let stopped = common::watch_lease(g.lease_clock());
    // Another client of the same user, with a token bought before the restart.
    let login = etcd_client::ConnectOptions::new().with_user("gw-a", "gw-a-password");
    let mut other = etcd_client::Client::connect(&ep, Some(login)).await.unwrap();
    // etcd replays its log after its backend's last mark of what it applied, as it starts,
    // and gives a token bought in it again. A write moves the mark on (it is committed
    // within 100 ms); so does a snapshot (`--snapshot-count 1`).
    other.put("/tessera/mark", "", None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let etcd = restarted(etcd).await;
    // etcd forgot the tokens it gave: the gateway goes on only if it bought a new one.
    let e = other.get("/tessera/", None).await.unwrap_err().to_string();
    assert!(e.contains("invalid auth token"), "{e}");
    // Longer than the lease: it was renewed since, or it lapsed.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(g.alive(), "the gateway's lease keeper gave up");
    assert!(!stopped.is_finished(), "the lease's clock stopped holding");
    stopped.abort();
    let owner = g.owner("pool.a").await.unwrap().expect("pool.a has an owner");
    assert!(g.holds(&owner), "{owner:?}");
    assert_eq!(owner.epoch, before.epoch);
    g.leave().await.unwrap();
    drop(etcd);
}

/// A gateway that follows the gateways' keys goes on following them through a restart of
/// etcd, which ends its watch: made again from where it stopped, it still wakes the lease's
/// renewal at once when etcd revokes the lease (a 30 s lease, renewed every 10 s: known
/// within 2 s, not at the next renewal). Until 2026-12-06 a watch that ended was not made
/// again until the gateway joined anew, and with it went every change it would have told.
#[tokio::test]
async fn a_gateway_follows_the_keys_through_a_restart_of_etcd() {
    let t = "a_gateway_follows_the_keys_through_a_restart_of_etcd";
    let Some((etcd, ep, mut g)) = gateway_of_user(t, 30).await else {
        return;
    };
    let mut told = common::told_of_changes(&mut g).await;
    g.acquire("pool.a").await.unwrap();
    let etcd = restarted(etcd).await;
    // Watching again, and told of a change made since (once the gateway has a token etcd
    // knows: the watch's end made it buy one).
    tokio::time::sleep(Duration::from_secs(2)).await;
    while told.try_recv().is_ok() {}
    let restarted = std::time::Instant::now();
    while let Err(e) = g.acquire("pool.b").await {
        assert!(restarted.elapsed() < Duration::from_secs(5), "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::timeout(Duration::from_secs(2), told.recv())
        .await
        .expect("a change after etcd's restart was not told")
        .unwrap();
    let login = etcd_client::ConnectOptions::new().with_user("gw-a", "gw-a-password");
    let mut other = etcd_client::Client::connect(&ep, Some(login)).await.unwrap();
    let revoked = std::time::Instant::now();
    other.lease_revoke(g.lease()).await.unwrap();
    let knew = common::until_lease_lost(&g, revoked, Duration::from_secs(2)).await;
    eprintln!("{t}: knew within {knew:?}");
    drop(etcd);
}

/// A gateway that proves itself with a user and password buys its token again before etcd
/// lets it lapse: one that owned its pools quietly for longer than the token lives still
/// takes a pool over, and one whose token lapsed all the same gets a new one. A wrong password is refused, and so is a password to a plain-text etcd
/// that is not on this machine, before anything is sent.
#[tokio::test]
async fn a_gateway_with_a_password_buys_its_token_again_before_it_lapses() {
    let t = "a_gateway_with_a_password_buys_its_token_again_before_it_lapses";
    // Tokens lapse 2 s after their last use.
    let etcd = match PasswordEtcd::start(2) {
        Ok(e) => e,
        Err(why) => return tessera_disk::skip(t, &why),
    };
    let ep = vec![etcd.endpoint.clone()];
    etcd.user_for_prefix("gw-a", "gw-a-password", "/tessera/").unwrap();
    let mut user = EtcdUser::new("gw-a", "gw-a-password");
    user.token_period = Duration::from_secs(1);
    let mut g = Gateway::join_as(&ep, None, Some(&user), "/tessera", "gw-a", 5)
        .await
        .unwrap();
    assert_eq!(g.acquire("pool.a").await.unwrap().gateway, "gw-a");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let o = g.acquire("pool.b").await.expect("the token lapsed");
    assert_eq!(o.gateway, "gw-a");
    g.leave().await.unwrap();
    // A token that lapsed all the same (etcd did not answer for longer than its TTL, or
    // restarted and forgot it) is replaced at the next period: etcd refuses a request that
    // carries it, the asking for a new one included, which is then asked with none.
    let mut late = user.clone();
    late.token_period = Duration::from_millis(3500);
    let mut g = Gateway::join_as(&ep, None, Some(&late), "/tessera", "gw-a", 5)
        .await
        .unwrap();
    g.acquire("pool.c").await.unwrap();
    tokio::time::sleep(Duration::from_millis(4200)).await;
    g.acquire("pool.d").await.expect("the lapsed token was not replaced");
    g.leave().await.unwrap();
    let join = |ep: Vec<String>, user: EtcdUser| async move {
        Gateway::join_as(&ep, None, Some(&user), "/elsewhere", "gw-a", 5)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let e = join(ep.clone(), EtcdUser::new("gw-a", "wrong")).await.unwrap_err();
    assert!(e.contains("authentication failed"), "{e}");
    let e = join(vec!["http://192.0.2.1:2379".into()], user.clone())
        .await
        .unwrap_err();
    assert!(e.contains("through TLS only"), "{e}");
    // Outside its role's prefix, etcd refuses it.
    let mut g = Gateway::join_as(&ep, None, Some(&user), "/elsewhere", "gw-a", 5)
        .await
        .unwrap();
    let e = g
        .acquire("pool.a")
        .await
        .expect_err("etcd let a gateway outside its role");
    assert!(e.to_string().contains("permission denied"), "{e}");
}
