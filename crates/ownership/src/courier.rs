//! Requests passed between the gateways of a pool through etcd: a gateway that presents the
//! pool's logical units as standby ports asks, and the owner runs the request and answers
//! (the persistent reservation commands a standby port receives: the owner holds the
//! reservations and enforces them).
//!
//! - An ask is `<prefix>/ask/<what>/<id>`, on a lease of its own that lasts both of its
//!   asker's waits and a little more ([`ask_lifetime`]), so that it goes when its asker stops
//!   waiting, whatever became of the asker or of etcd meanwhile; `<id>` names the gateway,
//!   its lease and a sequence number, unique across runs.
//! - The owner takes an ask by deleting it in a transaction guarded by its revision: each ask
//!   runs once, at one gateway, however many look.
//! - The answer is `<prefix>/answer/<what>/<id>`, on the ask's lease too. The asker makes
//!   that key empty before it asks and watches it from then on, so that no answer comes
//!   unseen, and revokes the lease (both keys go) once answered or given up. The owner takes
//!   an ask only while that key is there (its asker waits), and answers only into it, so
//!   that an ask given up is not run and an answer to it leaves nothing behind. An answer
//!   is never empty.
//! - An asker that waited in vain takes its ask back, trying until etcd answers; if the
//!   owner took it already, the command runs there, and the answer is waited for as long
//!   again rather than the host told to try again a command that is being applied. The
//!   owner learns how long the ask's lease still lives when it takes it
//!   ([`Ask::lasts_for`]), and starts nothing it could not answer in that time; while it
//!   runs one, it keeps the ask's lease alive ([`Courier::keep_running`]), and its asker
//!   waits for as long as it does (a commit held up by a slow OSD may take tens of seconds).
//!
//! - A notice is `<prefix>/notice/<what>/<id>`, on the telling gateway's lease, for every
//!   other gateway watching: the owner tells the standby gateways of unit attentions its
//!   logical units raised. Nobody takes a notice; each gateway writes its notices in turn
//!   to one of 64 keys of its own for the thing each is about, so that they take no more
//!   room however many it sends, and go with its lease. A gateway whose watch ended (etcd
//!   went away, or it rejoined) watches again from the last revision it saw, so that it
//!   misses none that
//!   etcd still has the history of; past a compaction, it reads those still kept (the
//!   latest in each of those keys of each gateway alive).
//!
//! etcd is the gateways' trusted channel already (whoever may write there may take a pool):
//! an ask is run as from the initiator port it names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};

use crate::watching::{Patience, Watch, FOLLOWING};
use crate::Result;

/// Numbers the asks of one process.
static NEXT_ASK: AtomicU64 = AtomicU64::new(1);

/// Numbers the notices of one process; each gateway keeps this many keys of notices.
static NEXT_NOTICE: AtomicU64 = AtomicU64::new(0);
const NOTICE_KEYS: u64 = 64;

/// One gateway's end of the channel: a handle on its etcd client, usable while another task
/// holds the gateway (a takeover under way).
#[derive(Clone)]
pub struct Courier {
    pub(crate) client: Client,
    pub(crate) prefix: String,
    pub(crate) name: String,
    pub(crate) lease: i64,
}

/// An ask an owner took, to run and answer.
#[derive(Debug, Clone)]
pub struct Ask {
    /// What it is for: the key of the thing owned (`pool.NAME`).
    pub what: String,
    pub id: String,
    pub request: Vec<u8>,
    /// The asker's lease, which the answer goes on.
    lease: i64,
    /// What that lease was granted for: the owner renews it well within that while it runs
    /// the ask.
    granted: Duration,
    /// How long that lease still lived when the ask was taken, as etcd said (zero when it
    /// did not say): the asker waits for the answer until a second before it lapses.
    lasts_for: Duration,
}

impl Ask {
    /// How long the ask's lease still lived in etcd when it was taken: the asker stops
    /// waiting for its answer a second or more before it lapses (it counts from before etcd
    /// granted it, up to [`ASKING_AT_MOST`] sooner). An owner that could not answer before
    /// then answers without running the request: its asker, having told its host to try
    /// again, must not find it applied. (A leader elected meanwhile gives every lease its
    /// whole time again, and the ask may last longer than its asker waits; the asker
    /// takes its ask back at the end of its first wait, which leaves an owner only asks
    /// taken before then.)
    pub fn lasts_for(&self) -> Duration {
        self.lasts_for
    }
}

/// Whether an etcd key is an ask's or an answer's (under `prefix`): changes a gateway's
/// watch of the ownership keys passes over.
pub(crate) fn is_courier_key(prefix: &str, key: &[u8]) -> bool {
    let key = String::from_utf8_lossy(key);
    key.strip_prefix(prefix)
        .and_then(|k| k.strip_prefix('/'))
        .is_some_and(|k| k.starts_with("ask/") || k.starts_with("answer/") || k.starts_with("notice/"))
}

impl Courier {
    fn key(&self, kind: &str, what: &str, id: &str) -> String {
        format!("{}/{kind}/{what}/{id}", self.prefix)
    }

    /// Asks the owner of `what` to run `request`, and waits up to `wait` for its answer:
    /// None when none came (no owner, or one that stalled), and the request will not run.
    /// An ask still waiting to be taken then is taken back, so that an owner that comes later
    /// does not run it; one the owner took already is running there, and its answer is
    /// waited for as long again: told to try again while it still ran, the host would find
    /// its command applied (a REGISTER sent again meets a RESERVATION CONFLICT).
    ///
    /// The ask's keys live on a lease of their own, of [`ask_lifetime`]: nothing of the ask
    /// outlives it, however it ends (etcd gone when it is taken back, this task dropped),
    /// so that no owner runs it after its asker stopped waiting. Returns within twice
    /// [`ASKING_AT_MOST`] more than the lifetime, and [`RUN_KEPT_AT_MOST`] more while the
    /// owner runs it.
    pub async fn ask(&self, what: &str, request: &[u8], wait: Duration) -> Result<Option<Vec<u8>>> {
        let id = format!(
            "{}.{:x}.{}",
            self.name,
            self.lease,
            NEXT_ASK.fetch_add(1, Ordering::Relaxed)
        );
        let (ask, answer) = (self.key("ask", what, &id), self.key("answer", what, &id));
        let mut client = self.client.clone();
        let ttl = ask_lifetime(wait).as_secs_f64().ceil() as i64;
        // The lease counts from its granting, at the latest now.
        let granted_by = tokio::time::Instant::now();
        let lease = match tokio::time::timeout(ASKING_AT_MOST, client.lease_grant(ttl, None)).await {
            Ok(granted) => granted?.id(),
            Err(_) => {
                return Err(crate::OwnershipError::new(format!(
                    "etcd did not grant the ask a lease within {} s",
                    ASKING_AT_MOST.as_secs()
                )))
            }
        };
        // The last wait ends a second before the lease may lapse, whatever the steps before
        // it took: an owner that took the ask can answer for as long as its asker waits.
        let lapses = granted_by + ask_lifetime(wait);
        let answered = tokio::time::timeout_at(
            lapses + RUN_KEPT_AT_MOST,
            ask_and_wait(&mut client, lease, &ask, &answer, request, wait, lapses),
        )
        .await
        .unwrap_or(Ok(None));
        // Both keys go with it; should etcd not answer, they go when it lapses.
        let _ = tokio::time::timeout(ASKING_AT_MOST, client.lease_revoke(lease)).await;
        answered
    }

    /// The asks waiting now for whatever `of` accepts (the things this gateway owns), oldest
    /// first, each taken as it is returned: deleted in etcd, so that it runs once, here. One
    /// read finds them all, however many things are owned. An ask without a lease (written
    /// by hand) is no gateway's and is left alone.
    ///
    /// Each call to etcd ends `within` from now: the asks taken until then are returned, not
    /// lost with a whole taking cut short (their askers would wait their lifetime out).
    pub async fn take_asks(&self, of: impl Fn(&str) -> bool, within: Duration) -> Result<Vec<Ask>> {
        let until = tokio::time::Instant::now() + within;
        let late = || crate::OwnershipError::new(format!("etcd did not answer within {} ms", within.as_millis()));
        let from = format!("{}/ask/", self.prefix);
        let mut client = self.client.clone();
        let finding = client.get(
            from.as_str(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(etcd_client::SortTarget::Create, etcd_client::SortOrder::Ascend),
            ),
        );
        let found = tokio::time::timeout_at(until, finding).await.map_err(|_| late())??;
        let mut taken = Vec::new();
        for kv in found.kvs().iter().filter(|kv| kv.lease() != 0) {
            // None started once the time is out: a call is sent before its bound is looked
            // at, and a taking that lands after it was given up is an ask lost.
            if tokio::time::Instant::now() >= until {
                if taken.is_empty() {
                    return Err(late());
                }
                break;
            }
            let Some((what, id)) = kv
                .key_str()
                .ok()
                .and_then(|k| k.strip_prefix(from.as_str()))
                .and_then(|k| k.rsplit_once('/'))
            else {
                continue;
            };
            if !of(what) {
                continue;
            }
            // Only while its asker waits (its answer's key is there, and empty): an ask whose
            // answer's key is gone is no asker's, and is not run; nor is one answered already
            // (put again after its taking), which ran.
            let answer = self.key("answer", what, id);
            let take = Txn::new()
                .when([
                    Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision()),
                    Compare::version(answer.as_str(), CompareOp::Greater, 0),
                    Compare::value(answer.as_str(), CompareOp::Equal, Vec::<u8>::new()),
                ])
                .and_then([TxnOp::delete(kv.key(), None)]);
            // The asks taken so far are returned whatever becomes of this one: they are no
            // longer in etcd for anyone else to run, and their askers wait.
            // One cut short may have landed: that ask is then lost (its asker waits its
            // lifetime out), never run twice.
            let took = match tokio::time::timeout_at(until, client.txn(take)).await {
                Ok(Ok(r)) => r.succeeded(),
                Ok(Err(e)) if taken.is_empty() => return Err(e.into()),
                Err(_) if taken.is_empty() => return Err(late()),
                Ok(Err(_)) | Err(_) => break,
            };
            if took {
                // After the taking: the time left is what the owner has from now on. Unknown,
                // it is none, and the ask is answered "not run" (its host tries again).
                let reading = client.lease_time_to_live(kv.lease(), None);
                let (lasts_for, granted) = match tokio::time::timeout_at(until, reading).await {
                    Ok(Ok(t)) => (
                        Duration::from_secs(t.ttl().max(0) as u64),
                        Duration::from_secs(t.granted_ttl().max(0) as u64),
                    ),
                    Ok(Err(_)) | Err(_) => (Duration::ZERO, Duration::ZERO),
                };
                taken.push(Ask {
                    what: what.to_string(),
                    id: id.to_string(),
                    request: kv.value().to_vec(),
                    lease: kv.lease(),
                    granted,
                    lasts_for,
                });
            } else {
                // An ask without its answer's key (made otherwise, or by a gateway that
                // kept asks on its own lease) would stay as long as its lease, looked at
                // each time.
                let orphan = Txn::new()
                    .when([
                        Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision()),
                        Compare::version(answer.as_str(), CompareOp::Equal, 0),
                    ])
                    .and_then([TxnOp::delete(kv.key(), None)]);
                // Best effort: the asks taken so far are returned whatever becomes of it.
                if tokio::time::timeout_at(until, client.txn(orphan)).await.is_err() {
                    break;
                }
            }
        }
        Ok(taken)
    }

    /// Answers `ask` (one [`take_asks`](Self::take_asks) returned) with `answer`, which is not
    /// empty. False when the asker no longer waits (it gave up, or its lease is gone):
    /// nothing is left.
    pub async fn answer(&self, ask: &Ask, answer: &[u8]) -> Result<bool> {
        let key = self.key("answer", &ask.what, &ask.id);
        let put = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Greater, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                answer,
                Some(PutOptions::new().with_lease(ask.lease)),
            )]);
        Ok(self.client.clone().txn(put).await?.succeeded())
    }

    /// Keeps the lease of `ask` (one [`take_asks`](Self::take_asks) returned) alive while the
    /// owner runs it, renewing it four times a lease: its asker, finding its lease renewed
    /// at the end of its wait, waits on for the answer rather than tell its host to try
    /// again a command that is being applied. Returns after [`RUN_KEPT_AT_MOST`], or once
    /// etcd says the lease is gone; dropped (the command answered), it renews no more, and
    /// the lease goes as its asker revokes it.
    pub async fn keep_running(&self, ask: &Ask) {
        let until = tokio::time::Instant::now() + RUN_KEPT_AT_MOST;
        let every = (ask.granted / 4).max(Duration::from_millis(250));
        let mut client = self.client.clone();
        let mut stream = None;
        while tokio::time::Instant::now() < until {
            // Opening the stream renews the lease once.
            let renewed = match stream.as_mut() {
                None => match tokio::time::timeout(ASKING_AT_MOST, client.lease_keep_alive(ask.lease)).await {
                    Ok(Ok(s)) => {
                        stream = Some(s);
                        true
                    }
                    Ok(Err(e)) if e.to_string().contains("lease not found") => return,
                    _ => false,
                },
                Some((keeper, answers)) => {
                    let renewal = async {
                        keeper.keep_alive().await?;
                        answers.message().await
                    };
                    match tokio::time::timeout(ASKING_AT_MOST, renewal).await {
                        Ok(Ok(Some(a))) if a.ttl() <= 0 => return,
                        Ok(Ok(Some(_))) => true,
                        _ => {
                            stream = None;
                            false
                        }
                    }
                }
            };
            // A renewal that failed is tried again soon (through another member), not a
            // quarter lease later: the asker looks once its lease would have lapsed.
            tokio::time::sleep(match renewed {
                true => every,
                false => Duration::from_millis(250),
            })
            .await;
        }
    }

    /// Tells every other gateway watching ([`watch_notices`](Self::watch_notices)) `notice`
    /// about `what`.
    pub async fn notify(&self, what: &str, notice: &[u8]) -> Result<()> {
        let slot = NEXT_NOTICE.fetch_add(1, Ordering::Relaxed) % NOTICE_KEYS;
        let id = format!("{}.{:x}.{slot}", self.name, self.lease);
        self.client
            .clone()
            .put(
                self.key("notice", what, &id),
                notice,
                Some(PutOptions::new().with_lease(self.lease)),
            )
            .await?;
        Ok(())
    }

    /// A watch of the notices other gateways send after revision `after` (the last a watch
    /// before this one saw, [`NoticesComing::seen`]), or from now on.
    pub async fn watch_notices(&self, after: Option<i64>) -> Result<NoticesComing> {
        let mut coming = NoticesComing {
            client: self.client.clone(),
            watch: None,
            from: format!("{}/notice/", self.prefix),
            mine: self.name.clone(),
            seen: 0,
            watched_after: 0,
        };
        match after {
            Some(after) => {
                coming.seen = after;
                coming.watch_after_seen().await?;
            }
            None => {
                coming.read_kept().await?;
            }
        }
        Ok(coming)
    }

    /// Waits until an ask for anything comes, or `max` passes: true if one came. The watch
    /// is made before the caller looks at the asks, so that one that comes in between is
    /// not missed: `watch_asks` then `take_asks` then `AsksComing::wait`.
    pub async fn watch_asks(&self) -> Result<AsksComing> {
        let under = format!("{}/ask/", self.prefix);
        let watch = crate::watching::watch(
            &mut self.client.clone(),
            &under,
            Some(WatchOptions::new().with_prefix()),
        )
        .await?;
        Ok(AsksComing { watch })
    }
}

/// How long the keys of an ask with a wait of `wait` live: both waits, and a few seconds for
/// the steps between them.
pub fn ask_lifetime(wait: Duration) -> Duration {
    2 * wait + Duration::from_secs(3)
}

/// How long granting an ask's lease, or revoking it, may take.
pub const ASKING_AT_MOST: Duration = Duration::from_secs(2);

/// How long an owner keeps an ask it runs alive at most ([`Courier::keep_running`]), and so
/// how much longer than its lifetime its asker may wait: a persistent reservation command
/// waits for the commands in flight on its logical unit (each bounded by the cluster's 30 s
/// operation timeout), then for its commit to the pool's metadata (as long again).
pub const RUN_KEPT_AT_MOST: Duration = Duration::from_secs(75);

/// The steps of [`Courier::ask`] on the ask's `lease`, which lapses at `lapses` unless the
/// owner keeps it alive: the first wait lasts `wait`, the second (for an ask the owner took)
/// until a second before the lease lapses, and on for as long as the owner keeps it alive.
/// Once the ask may be in etcd, a failed step means "no answer yet", never an early return:
/// an owner may have taken the ask, and telling the host to try again while it runs would
/// have the command applied twice.
async fn ask_and_wait(
    client: &mut Client,
    lease: i64,
    ask: &str,
    answer: &str,
    request: &[u8],
    wait: Duration,
    lapses: tokio::time::Instant,
) -> Result<Option<Vec<u8>>> {
    let last = lapses - Duration::from_secs(1);
    let on_lease = || Some(PutOptions::new().with_lease(lease));
    // The steps before the waits end with the lease too (a stalled member): an ask put
    // that late finds too little of its lease left to be run (`Ask::lasts_for`).
    let placing = async {
        // The answer's key first: an owner takes only an ask whose asker still waits.
        let placed = client.put(answer, Vec::new(), on_lease()).await?;
        // From the revision after that put: ahead of etcd's newest only until the ask's put
        // below, which writes it (see `NoticesComing::watch_after_seen`; an ask whose put
        // failed gets no answer, and its watch ends for the reads below). A watch from a
        // revision written would start behind, and hear an answer only at etcd's next
        // catching up of such watches (every 100 ms).
        let after = placed.header().map(|h| h.revision() + 1).unwrap_or(0);
        let events =
            crate::watching::watch(client, answer, Some(WatchOptions::new().with_start_revision(after))).await?;
        // Refused or not, the put may have been applied.
        let _ = client.put(ask, request, on_lease()).await;
        Ok::<_, crate::OwnershipError>(events)
    };
    let mut events = match tokio::time::timeout_at(last, placing).await {
        Ok(placed) => Some(placed?),
        Err(_) => return Ok(None),
    };
    let first = tokio::time::Instant::now() + wait;
    if let Some(a) = answer_within(client, answer, &mut events, first.min(last)).await {
        return Ok(Some(a));
    }
    // Taken back, or found taken: asked until etcd says which. A delete that failed may have
    // left the ask there, for an owner to take and run after this asker gave up; meanwhile
    // an answer to an ask taken is listened for.
    loop {
        let now = tokio::time::Instant::now();
        if now >= last {
            // Not known: the ask may still be taken until its lease lapses, and an owner
            // that takes it then finds too little of it left to run it (`Ask::lasts_for`);
            // one that took it and runs it keeps its lease alive, as below.
            break;
        }
        match tokio::time::timeout_at(last.min(now + WITHDRAWING), client.delete(ask, None)).await {
            Ok(Ok(d)) if d.deleted() > 0 => return Ok(None),
            // Taken: it may run at the owner.
            Ok(Ok(_)) => break,
            _ => {
                let pause = last.min(tokio::time::Instant::now() + Duration::from_millis(200));
                if let Some(a) = answer_within(client, answer, &mut events, pause).await {
                    return Ok(Some(a));
                }
            }
        }
    }
    // Taken: it runs at the owner, which keeps the ask's lease alive while it does. Waited
    // for until the lease is no longer renewed: a lease that lives longer than this asker's
    // clock says has been renewed (by the owner, or given its whole time again by a newly
    // elected leader: then waited for until it lapses all the same).
    let (mut last, mut lapses) = (last, lapses);
    loop {
        if let Some(a) = answer_within(client, answer, &mut events, last).await {
            return Ok(Some(a));
        }
        // How long the lease lives, as etcd says: asked again while etcd fails (a leader
        // being elected), the answer listened for meanwhile, until the lease surely lapsed
        // unrenewed (up to `ASKING_AT_MOST` and a second of rounding past `lapses`).
        let surely_lapsed = lapses + ASKING_AT_MOST + Duration::from_secs(1);
        let left = loop {
            match tokio::time::timeout(ASKING_AT_MOST, client.lease_time_to_live(lease, None)).await {
                Ok(Ok(t)) => break Duration::from_secs(t.ttl().max(0) as u64),
                _ if tokio::time::Instant::now() < surely_lapsed => {
                    let pause = tokio::time::Instant::now() + Duration::from_millis(200);
                    if let Some(a) = answer_within(client, answer, &mut events, pause).await {
                        return Ok(Some(a));
                    }
                }
                _ => break Duration::ZERO,
            }
        };
        let now = tokio::time::Instant::now();
        if left <= surely_lapsed.saturating_duration_since(now) {
            return Ok(None);
        }
        (last, lapses) = (now + left - Duration::from_secs(1), now + left);
    }
}

/// How long one try at taking an ask back may take: one that went to a member that
/// stalls is tried again, through the others.
const WITHDRAWING: Duration = Duration::from_secs(1);

/// How long the watch of an answer may be quiet before it asks its member, and how long
/// the member may take: an answer missed on a stalled member would have the host told to
/// try again a command that ran.
const ANSWERING: Patience = Patience {
    quiet: Duration::from_millis(500),
    answer: Duration::from_millis(500),
};

/// The first answer (a put that is not empty) to the ask whose answer's key is `answer`
/// until `until`, as its watch `events` tells; once that watch has ended or its member
/// stalled (and then `events` is None), as the key read every 200 ms tells (a read that
/// fails is tried again; reads go to the members that serve).
async fn answer_within(
    client: &mut Client,
    answer: &str,
    events: &mut Option<Watch>,
    until: tokio::time::Instant,
) -> Option<Vec<u8>> {
    while let Some(watch) = events.as_mut() {
        match tokio::time::timeout_at(until, watch.next(ANSWERING)).await {
            Err(_) => return None,
            Ok(Some(r)) if !r.canceled() => {
                let put = r
                    .events()
                    .iter()
                    .filter(|e| e.event_type() == EventType::Put)
                    .filter_map(|e| e.kv())
                    .find(|kv| !kv.value().is_empty());
                if let Some(kv) = put {
                    return Some(kv.value().to_vec());
                }
            }
            _ => *events = None,
        }
    }
    loop {
        if let Ok(Ok(now)) = tokio::time::timeout_at(until, client.get(answer, None)).await {
            if let Some(kv) = now.kvs().first().filter(|kv| !kv.value().is_empty()) {
                return Some(kv.value().to_vec());
            }
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep_until(until.min(tokio::time::Instant::now() + Duration::from_millis(200))).await;
    }
}

/// A watch of the asks ([`Courier::watch_asks`]).
pub struct AsksComing {
    watch: Watch,
}

impl AsksComing {
    /// Waits until an ask comes, or `max` passes: true if one came. A watch that ended
    /// waits out `max`, so that a caller looping on it does not spin.
    pub async fn wait(&mut self, max: Duration) -> bool {
        tokio::time::timeout(max, async {
            loop {
                match self.watch.next(FOLLOWING).await {
                    Some(r) if r.events().iter().any(|e| e.event_type() == EventType::Put) => return true,
                    Some(r) if !r.canceled() => continue,
                    _ => {
                        tokio::time::sleep(max).await;
                        return false;
                    }
                }
            }
        })
        .await
        .unwrap_or(false)
    }
}

/// A watch of the other gateways' notices ([`Courier::watch_notices`]).
pub struct NoticesComing {
    client: Client,
    watch: Option<Watch>,
    /// The notices' keys start with this, then `<what>/<id>`.
    from: String,
    /// This gateway's name: its own notices' ids are `<name>.<lease>.<slot>`.
    mine: String,
    /// The revision of the last change to the notices seen: a watch made again goes on after it.
    seen: i64,
    /// `seen` when the watch was made: its events up to that revision were seen before.
    watched_after: i64,
}

impl NoticesComing {
    /// The revision of the last change to the notices this watch saw.
    pub fn seen(&self) -> i64 {
        self.seen
    }

    /// Watches from the last revision seen, and passes over its events up to it. Not from
    /// the one after: that may be ahead of etcd's newest revision while nothing is written,
    /// and etcd (since its pull request 20229, backported to 3.4) then answers no progress
    /// request on the watch, which would be taken for a stalled member (watching.rs).
    async fn watch_after_seen(&mut self) -> Result<()> {
        let options = WatchOptions::new().with_prefix().with_start_revision(self.seen.max(1));
        self.watch = Some(crate::watching::watch(&mut self.client, &self.from, Some(options)).await?);
        self.watched_after = self.seen;
        Ok(())
    }

    /// The notices kept now that changed after the last seen (all of them, from a fresh
    /// watch: none is delivered, only the revision learned), then a watch after them.
    async fn read_kept(&mut self) -> Result<Vec<(String, Vec<u8>)>> {
        let fresh = self.seen == 0;
        let options = match fresh {
            true => GetOptions::new().with_prefix().with_count_only(),
            false => GetOptions::new().with_prefix().with_min_mod_revision(self.seen + 1),
        };
        let kept = self.client.get(self.from.as_str(), Some(options)).await?;
        let got = if fresh {
            Vec::new()
        } else {
            let mut kvs: Vec<_> = kept.kvs().iter().collect();
            kvs.sort_by_key(|kv| kv.mod_revision());
            kvs.into_iter().filter_map(|kv| self.others(kv)).collect()
        };
        self.seen = kept.header().map(|h| h.revision()).unwrap_or(self.seen);
        let watched = self.watch_after_seen().await;
        if got.is_empty() {
            watched?;
        } else if watched.is_err() {
            // What was read is delivered all the same (`seen` is past it): the next call
            // finds no watch, and its caller watches again after `seen`.
            self.watch = None;
        }
        Ok(got)
    }

    /// `kv` as (what, notice), if another gateway sent it.
    fn others(&self, kv: &etcd_client::KeyValue) -> Option<(String, Vec<u8>)> {
        let (what, id) = kv.key_str().ok()?.strip_prefix(self.from.as_str())?.rsplit_once('/')?;
        let teller = id.rsplitn(3, '.').nth(2)?;
        (teller != self.mine).then(|| (what.to_string(), kv.value().to_vec()))
    }

    /// The next notices other gateways sent, as (what, notice), waiting as long as it takes;
    /// None once the watch ended (etcd went away, or its member stalled: watch again after
    /// [`seen`](Self::seen)).
    /// When the history after the last seen was compacted away, the notices still kept that
    /// changed since are read instead.
    pub async fn next(&mut self) -> Option<Vec<(String, Vec<u8>)>> {
        loop {
            let r = self.watch.as_mut()?.next(FOLLOWING).await?;
            if r.compact_revision() > 0 {
                let got = self.read_kept().await.ok()?;
                if !got.is_empty() {
                    return Some(got);
                }
                continue;
            }
            if r.canceled() {
                return None;
            }
            let mut got = Vec::new();
            let after = self.watched_after;
            let events = r.events().iter().filter_map(|e| e.kv().map(|kv| (e.event_type(), kv)));
            for kv in events.filter(|(_, kv)| kv.mod_revision() > after) {
                self.seen = self.seen.max(kv.1.mod_revision());
                if kv.0 == EventType::Put {
                    got.extend(self.others(kv.1));
                }
            }
            if !got.is_empty() {
                return Some(got);
            }
        }
    }
}
