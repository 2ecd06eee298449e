//! Against a real etcd, as etcd.rs, in a test binary of its own: it compacts etcd's history,
//! which would end the watches other tests make at revisions they just read if they ran
//! beside it (test binaries run one after another).
#![cfg(feature = "etcd")]

mod common;

use common::{endpoints, next};
use tessera_ownership::Gateway;

/// The next `n` notices `w` sees, their texts in the order they came.
async fn next_texts(w: &mut tessera_ownership::NoticesComing, n: usize) -> Vec<String> {
    let mut texts = Vec::new();
    while texts.len() < n {
        texts.extend(next(w).await.into_iter().map(|(_, t)| String::from_utf8(t).unwrap()));
    }
    texts
}

/// A gateway whose watch of the notices ended (etcd went away, it rejoined) watches again
/// from where it stopped: the notices sent meanwhile come, once, in order; past a compaction
/// of etcd's history, those still kept come. A watch from now on gets none sent before.
#[tokio::test]
async fn a_gateway_watching_again_gets_the_notices_sent_while_it_did_not() {
    let t = "a_gateway_watching_again_gets_the_notices_sent_while_it_did_not";
    let Some(ep) = endpoints(t) else { return };
    let p = format!("/tessera-test/{t}-{}", std::process::id());
    let owner = Gateway::join(&ep, &p, "gw-a", 5).await.unwrap();
    let b = Gateway::join(&ep, &p, "gw-b", 5).await.unwrap();
    let a = owner.courier();
    a.notify("pool.tank", b"before").await.unwrap();
    let mut at_b = b.courier().watch_notices(None).await.unwrap();
    a.notify("pool.tank", b"one").await.unwrap();
    assert_eq!(next_texts(&mut at_b, 1).await, ["one"], "a new watch starts now");
    let seen = at_b.seen();
    drop(at_b);

    a.notify("pool.tank", b"two").await.unwrap();
    a.notify("pool.other", b"three").await.unwrap();
    let mut at_b = b.courier().watch_notices(Some(seen)).await.unwrap();
    assert_eq!(next_texts(&mut at_b, 2).await, ["two", "three"]);
    let seen = at_b.seen();
    drop(at_b);

    // etcd's history after `seen` compacted away: the notices kept since come instead.
    a.notify("pool.tank", b"four").await.unwrap();
    a.notify("pool.tank", b"five").await.unwrap();
    let mut client = etcd_client::Client::connect(&ep, None).await.unwrap();
    let now = client
        .get("/", Some(etcd_client::GetOptions::new().with_count_only()))
        .await
        .unwrap();
    client.compact(now.header().unwrap().revision(), None).await.unwrap();
    let mut at_b = b.courier().watch_notices(Some(seen)).await.unwrap();
    assert_eq!(next_texts(&mut at_b, 2).await, ["four", "five"]);
    a.notify("pool.tank", b"six").await.unwrap();
    assert_eq!(next_texts(&mut at_b, 1).await, ["six"], "the watch goes on after them");

    owner.leave().await.unwrap();
    b.leave().await.unwrap();
}
