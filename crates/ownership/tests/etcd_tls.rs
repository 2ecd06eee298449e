//! Against an etcd of the test's own that serves TLS only, knows its clients by their
//! certificates and confines each to its keys (authentication on), as docs/security.md tells
//! an administrator to run it. Needs Debian's `etcd`, `etcdctl` and `openssl`; without them
//! the test says it was skipped, and why.
#![cfg(feature = "etcd")]

use tessera_ownership::{EtcdTls, Gateway};
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
