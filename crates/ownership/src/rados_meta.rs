//! A pool's metadata store on RADOS ([`MetaBackend`]): every record in the omap of one
//! object, so that any gateway that reaches the cluster can open the pool, and every batch one
//! compound write of that object, applied whole or not at all by its primary OSD.
//!
//! - A record's omap key is its family's name, `/`, and its key in hex: librados takes omap
//!   keys as C strings where a read starts or filters, and the engine's keys are binary.
//!   Hex keeps byte order within a family, at twice the key's length.
//! - The object carries a version (attribute `tessera.meta.version`) that every batch bumps,
//!   guarded by the value it read: a reference count has no merge operator on an OSD, so a
//!   batch that moves counts (or deletes a range) reads what it changes, and a batch that
//!   another gateway's commit overtook is refused (`ECANCELED`) and computed again.
//! - Every batch is also fenced: guarded by "the object's epoch is at most mine" and stamped
//!   with the writer's epoch ([`crate::fence`]; data objects carry it otherwise, as their
//!   writes' sequence), so a gateway that was
//!   replaced as the pool's owner commits nothing more.
//! - Every batch of an owner also says which client wrote it (attribute `tessera.owner`, its
//!   address in the cluster): should etcd lose the fence record, the next owner still finds
//!   whom to fence off ([`last_owner`]).
//! - A snapshot reads the omap whole, between two reads of the version, again if it moved;
//!   after a few tries, with this store's commits held back while it reads.
//!
//! One object serves all metadata, so one placement group does: the price of atomic batches
//! without an intent log, until records move to per-vdisk objects (docs/scale-out.md).

use std::collections::{BTreeMap, HashMap};

use tessera_pool::{counted, hex, unhex, MemoryMeta, MetaBackend, MetaBatch, MetaOp, MetaView, PoolError, Visit};
use tessera_rados::{Pool, RadosError, WriteOp, XattrCmp};

use crate::fence::{epoch_of, epoch_text, EPOCH_ATTR};

/// The attribute every batch bumps.
pub const VERSION_ATTR: &str = "tessera.meta.version";

/// The attribute every batch of an owner sets to its client's address in the cluster.
pub const OWNER_ATTR: &str = "tessera.owner";

/// The client address the last owner to commit to the metadata object `oid` wrote from, if
/// the object and the attribute exist.
pub fn last_owner(pool: &Pool<'_>, oid: &str) -> Result<Option<String>, RadosError> {
    Ok(pool
        .xattr(oid, OWNER_ATTR)?
        .map(|a| String::from_utf8_lossy(&a).into_owned())
        .filter(|a| !a.is_empty()))
}

/// Whether an owner at `epoch` or later has written metadata object `oid`: stamped it at
/// its opening, which comes after its taking fenced the owners before it off. An epoch
/// attribute that is not one is an error, not an answer.
pub fn written_since(pool: &Pool<'_>, oid: &str, epoch: i64) -> Result<bool, RadosError> {
    match pool.xattr(oid, EPOCH_ATTR)? {
        None => Ok(false),
        Some(t) => epoch_of(&t).map(|stamped| stamped >= epoch).ok_or_else(|| {
            RadosError::Invalid(format!(
                "{oid}: unreadable {EPOCH_ATTR} {:?}",
                String::from_utf8_lossy(&t)
            ))
        }),
    }
}

/// Records read per omap page.
const PAGE: u64 = 1000;

/// Times a snapshot reads the records while commits go on, before it holds them back.
const FREE_SNAPSHOT_READS: usize = 3;

/// How long a read of the records may take for a snapshot to hold commits back while it
/// reads again: writes that need metadata wait that long, well within hosts' command
/// timeouts (30 s and more).
const HOLD_COMMITS_AT_MOST: std::time::Duration = std::time::Duration::from_secs(2);

/// Times a batch is computed again after other commits overtook it, before it gives up.
const MAX_TRIES: usize = 10_000;

pub struct RadosMeta {
    pool: Pool<'static>,
    oid: String,
    epoch: i64,
    /// The writer's client address, stamped on every batch (`OWNER_ATTR`).
    owner: Option<String>,
    /// The object was seen (read, or made here): one gone since was removed (by hand, or
    /// with the pool destroyed), and a commit must not make it again, holding that batch's
    /// records alone, which the next opening would read as the whole pool.
    made: std::sync::atomic::AtomicBool,
    /// Held by a commit from its first reading to its outcome: the commits of one owner
    /// (one store per pool) go one after another, rather than overtake each other on the
    /// version guard and compute again, a busy writer's long batch losing every round. The
    /// guard is then overtaken only by another store's commit (another gateway's).
    /// parking_lot's, whose unlock hands over to a waiter now and then: a snapshot that
    /// waits for it is not kept out by a committer that takes it again at once.
    committing: parking_lot::Mutex<()>,
    /// How many times a commit here was overtaken and computed again.
    overtaken: std::sync::atomic::AtomicU64,
    /// Why a commit's outcome is not known (its write failed otherwise than by a guard: it
    /// may be applied, now or later): the commits queued behind it send nothing more, rather
    /// than each wait out the cluster's timeout in turn.
    unknown: std::sync::OnceLock<String>,
    /// How many commits here failed: one queued behind a failure (the metadata's placement
    /// group stalled, say, which may fail its reads as well as its write) is refused rather
    /// than wait out the cluster's timeout in its turn. The store's owner stops it at the
    /// first failure anyway, and opens the pool again.
    failures: std::sync::atomic::AtomicU64,
}

fn family(cf: &str) -> Vec<u8> {
    format!("{cf}/").into_bytes()
}

fn omap_key(cf: &str, key: &[u8]) -> Vec<u8> {
    // A family's name ends at its first '/': one holding one would be read back as strays.
    debug_assert!(!cf.contains('/'), "family {cf:?}");
    format!("{cf}/{}", hex(key)).into_bytes()
}

/// The record key an omap key's part after its family's name stands for, if a commit could
/// have written it: lower-case hex only, so that no other spelling of a key (upper case)
/// reads as a second record of the same key, out of the omap's order.
fn record_key(hexed: &[u8]) -> Option<Vec<u8>> {
    unhex(hexed).filter(|k| hex(k).as_bytes() == hexed)
}

/// The version an attribute holds, if a commit can read it (any spelling of a number: a
/// commit is guarded by the bytes it read, not by the number written again).
pub fn version_of(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}

fn version_text(v: u64) -> Vec<u8> {
    format!("{v:020}").into_bytes()
}

impl RadosMeta {
    /// The store in object `oid` of `pool`, written as the owner at `epoch`. The object is
    /// made by the first batch.
    pub fn new(pool: Pool<'static>, oid: &str, epoch: i64) -> RadosMeta {
        RadosMeta {
            pool,
            oid: oid.to_string(),
            epoch,
            owner: None,
            made: std::sync::atomic::AtomicBool::new(false),
            committing: Default::default(),
            overtaken: Default::default(),
            unknown: Default::default(),
            failures: Default::default(),
        }
    }

    /// Says that the object was seen (its version read by the caller): a commit never makes
    /// it again, should it be removed meanwhile.
    pub fn seen(self) -> RadosMeta {
        self.made.store(true, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// How many times a commit through this store was overtaken by another's and computed
    /// again.
    pub fn overtaken(&self) -> u64 {
        self.overtaken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stamps every batch with `address`, the writer's client address in the cluster: the
    /// next owner fences it off even if the fence record in etcd is lost.
    pub fn owned_by(mut self, address: String) -> RadosMeta {
        self.owner = Some(address);
        self
    }

    /// Removes the metadata object (the pool destroyed), unless a gateway with a later epoch
    /// wrote it: the guard and the removal are one operation on the OSD, so a replaced owner
    /// that resumes with a destroy on its way removes nothing of the pool its successor
    /// serves. Gone already is done.
    pub fn remove(&self) -> Result<(), PoolError> {
        let mine = epoch_text(self.epoch);
        let op = WriteOp::new().guard_xattr(EPOCH_ATTR, XattrCmp::Lte, &mine).remove();
        match self.pool.operate(&self.oid, &op) {
            Ok(()) => Ok(()),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            Err(e) if e.is_guard_failure() => Err(self.replaced_error("; nothing was removed")),
            Err(e) => Err(self.err(e)),
        }
    }

    /// A change refused because a gateway with a later epoch wrote the object, and what
    /// `more` says of it.
    fn replaced_error(&self, more: &str) -> PoolError {
        self.refused(format!(
            "fenced: a gateway with an epoch later than {} owns this pool's metadata{more}",
            self.epoch
        ))
    }

    /// A change refused before any of it was sent to the cluster, or by a guard the OSD
    /// checks in the same operation: nothing of it is applied.
    fn refused(&self, message: String) -> PoolError {
        PoolError::MetaRefused {
            path: self.location(),
            message,
        }
    }

    fn err(&self, e: RadosError) -> PoolError {
        PoolError::Meta {
            path: self.location(),
            message: crate::fenced_disk::describe(&e),
        }
    }

    /// The version the object is at; 0 before the first batch made it.
    fn version(&self) -> Result<u64, PoolError> {
        self.version_read().map(|(v, _)| v)
    }

    /// The version the object is at, and the attribute's bytes as read (None before the first
    /// batch made it): a batch is guarded by those bytes, not by the number written again,
    /// which a value written otherwise ("5" for "000...05") would never equal.
    fn version_read(&self) -> Result<(u64, Option<Vec<u8>>), PoolError> {
        let raw = self.pool.xattr(&self.oid, VERSION_ATTR).map_err(|e| self.err(e))?;
        if raw.is_some() {
            self.made.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        match raw {
            None => Ok((0, None)),
            Some(v) => version_of(&v).map(|n| (n, Some(v.clone()))).ok_or_else(|| {
                self.err(RadosError::Invalid(format!(
                    "unreadable {VERSION_ATTR} {:?}",
                    String::from_utf8_lossy(&v)
                )))
            }),
        }
    }

    /// The records under these omap keys that exist.
    fn read(&self, keys: &[Vec<u8>]) -> Result<HashMap<Vec<u8>, Vec<u8>>, PoolError> {
        let mut out = HashMap::new();
        for chunk in keys.chunks(PAGE as usize) {
            let refs: Vec<&[u8]> = chunk.iter().map(|k| k.as_slice()).collect();
            out.extend(self.pool.omap_get(&self.oid, &refs).map_err(|e| self.err(e))?);
        }
        if !out.is_empty() {
            self.made.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(out)
    }

    /// Visits the records whose omap keys start with `prefix`, from `start` on (inclusive),
    /// in key order, until `visit` says stop.
    fn walk(
        &self,
        prefix: &[u8],
        start: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Result<bool, PoolError>,
    ) -> Result<(), PoolError> {
        // librados pages past a key, never from one: the start itself is read first.
        if start.len() > prefix.len() {
            if let Some(v) = self.read(&[start.to_vec()])?.remove(start) {
                if !visit(start, &v)? {
                    return Ok(());
                }
            }
        }
        let mut after = (start.len() > prefix.len()).then(|| start.to_vec());
        loop {
            let (page, more) = self
                .pool
                .omap_page(&self.oid, after.as_deref(), prefix, PAGE)
                .map_err(|e| self.err(e))?;
            for (k, v) in &page {
                if !visit(k, v)? {
                    return Ok(());
                }
            }
            let Some((last, _)) = page.last().filter(|_| more) else {
                return Ok(());
            };
            match last.iter().position(|&b| b == 0) {
                None => after = Some(last.clone()),
                // librados takes the key to page past as a C string, and no key holding a
                // NUL byte (a stray: a commit writes hex) can be one. Paging past what comes
                // before the NUL would read this page's end again, forever if it is all such
                // keys; paging past that with 0x01 added skips the rest of them, strays too,
                // and only one key that holds no NUL: the resumption itself, read first.
                Some(at) => {
                    tracing::warn!(
                        object = %self.location(),
                        after = %String::from_utf8_lossy(last),
                        "omap keys of the pool's metadata object holding a NUL byte (no record's) are passed over unread"
                    );
                    let mut resume = last[..at].to_vec();
                    resume.push(1);
                    if let Some(v) = self.read(std::slice::from_ref(&resume))?.remove(&resume) {
                        if !visit(&resume, &v)? {
                            return Ok(());
                        }
                    }
                    after = Some(resume);
                }
            }
        }
    }

    /// Visits the records of family `cf` from key `from` on, with their keys as the engine
    /// knows them. An omap key that is not one a commit writes (not lower-case hex after the
    /// family's name: put there by hand or by another program) is no record and is passed
    /// over, as [`snapshot`](MetaBackend::snapshot) passes it over: one stray key must not
    /// hide the family's records, nor the scan and the snapshot disagree.
    fn scan_family(&self, cf: &str, from: &[u8], visit: Visit) -> Result<(), PoolError> {
        let prefix = family(cf);
        self.walk(
            &prefix,
            &omap_key(cf, from),
            &mut |k, v| match record_key(&k[prefix.len()..]) {
                Some(key) => visit(&key, v),
                None => {
                    self.stray(k);
                    Ok(true)
                }
            },
        )
    }

    fn stray(&self, key: &[u8]) {
        tracing::warn!(
            object = %self.location(),
            key = %String::from_utf8_lossy(key),
            "an omap key of the pool's metadata object is not a record's: passed over"
        );
    }

    /// What `batch` leaves in the omap, as of `version`: each omap key it touches, set or
    /// removed, in the order of its ops.
    fn outcome(&self, batch: &MetaBatch) -> Result<BTreeMap<Vec<u8>, Option<Vec<u8>>>, PoolError> {
        let counts: Vec<Vec<u8>> = batch
            .ops()
            .iter()
            .filter_map(|op| match op {
                MetaOp::Count(cf, k, _) => Some(omap_key(cf, k)),
                _ => None,
            })
            .collect();
        let stored = self.read(&counts)?;
        let mut out: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for op in batch.ops() {
            match op {
                MetaOp::Put(cf, k, v) => {
                    out.insert(omap_key(cf, k), Some(v.clone()));
                }
                MetaOp::Delete(cf, k) => {
                    out.insert(omap_key(cf, k), None);
                }
                MetaOp::DeleteRange(cf, from, to) => {
                    if from > to {
                        return Err(self.refused(format!(
                            "a range of {cf} deleted from {} to {}, before its start",
                            hex(from),
                            hex(to)
                        )));
                    }
                    let (from, to) = (omap_key(cf, from), omap_key(cf, to));
                    let mut doomed = Vec::new();
                    self.walk(&family(cf), &from, &mut |k, _| {
                        if k >= to.as_slice() {
                            return Ok(false);
                        }
                        doomed.push(k.to_vec());
                        Ok(true)
                    })?;
                    doomed.extend(out.range(from..to).map(|(k, _)| k.clone()));
                    for k in doomed {
                        out.insert(k, None);
                    }
                }
                MetaOp::Count(cf, k, d) => {
                    let key = omap_key(cf, k);
                    let before = match out.get(&key) {
                        Some(v) => v.clone(),
                        None => stored.get(&key).cloned(),
                    };
                    out.insert(key, Some(counted(before.as_deref(), *d)));
                }
            }
        }
        Ok(out)
    }

    /// One commit of `batch`, computed again as long as other stores' commits overtake it.
    /// The OSDs acknowledge a write once every replica holds it: every commit is durable.
    fn commit_now(&self, batch: &MetaBatch) -> Result<(), PoolError> {
        use std::sync::atomic::Ordering;
        for _ in 0..MAX_TRIES {
            // Whether the object was seen before this reading: a reading that finds it gone
            // must not be taken for one before it was made because another store (the same
            // gateway's readers) saw it made meanwhile.
            let seen = self.made.load(Ordering::Relaxed);
            let (version, read) = self.version_read()?;
            match read {
                Some(_) => {}
                None if seen => {
                    return Err(self.refused(
                        "the metadata object is gone (removed by hand, or the pool destroyed): a commit would make it \
                         again holding this change alone, which the next opening would take for the whole pool"
                            .into(),
                    ))
                }
                None => {}
            }
            let next = version
                .checked_add(1)
                .ok_or_else(|| self.refused(format!("{VERSION_ATTR} is at its largest value")))?;
            let outcome = self.outcome(batch)?;
            let sets: Vec<(&[u8], &[u8])> = outcome
                .iter()
                .filter_map(|(k, v)| v.as_deref().map(|v| (k.as_slice(), v)))
                .collect();
            let removes: Vec<&[u8]> = outcome
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| k.as_slice())
                .collect();
            let mine = epoch_text(self.epoch);
            let mut op = match &read {
                None => WriteOp::new().create(true),
                Some(read) => {
                    WriteOp::new()
                        .guard_xattr_eq(VERSION_ATTR, read)
                        .guard_xattr(EPOCH_ATTR, XattrCmp::Lte, &mine)
                }
            };
            op = op
                .set_xattr(VERSION_ATTR, &version_text(next))
                .set_xattr(EPOCH_ATTR, &mine);
            if let Some(a) = &self.owner {
                op = op.set_xattr(OWNER_ATTR, a.as_bytes());
            }
            if !sets.is_empty() {
                op = op.omap_set(&sets);
            }
            if !removes.is_empty() {
                op = op.omap_remove(&removes);
            }
            match self.pool.operate(&self.oid, &op) {
                Ok(()) => {
                    self.made.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                // Another commit came first (or made the object first): compute again,
                // unless it was a later owner's.
                Err(e) if e.is_guard_failure() || e.errno() == Some(libc::EEXIST) => {
                    if self.replaced()? {
                        return Err(self.replaced_error(""));
                    }
                    self.overtaken.fetch_add(1, Ordering::Relaxed);
                    // Made by another commit since it was read: that one set the version.
                    // An object there without it was made otherwise, and would refuse
                    // every batch.
                    if read.is_none() && self.version_read()?.1.is_none() {
                        return Err(self.refused(format!(
                            "the metadata object exists without its {VERSION_ATTR}: it is not a pool's metadata, or it is damaged"
                        )));
                    }
                }
                Err(e) => {
                    let e = self.err(e);
                    let _ = self.unknown.set(e.to_string());
                    return Err(e);
                }
            }
        }
        Err(self.refused(format!("other commits overtook this one {MAX_TRIES} times in a row")))
    }

    /// Every record, read whole between two reads of the version; None if a commit moved it
    /// meanwhile.
    fn read_whole(&self) -> Result<Option<Box<dyn MetaView + '_>>, PoolError> {
        let before = self.version()?;
        let records = MemoryMeta::new();
        self.walk(b"", b"", &mut |k, v| {
            let at = k.iter().position(|&b| b == b'/');
            match at.map(|at| (std::str::from_utf8(&k[..at]), record_key(&k[at + 1..]))) {
                Some((Ok(cf), Some(key))) => records.load(cf, key, v.to_vec()),
                _ => self.stray(k),
            }
            Ok(true)
        })?;
        if self.version()? != before {
            return Ok(None);
        }
        Ok(Some(records.into_view()))
    }

    /// Whether a gateway with a later epoch has written the object.
    fn replaced(&self) -> Result<bool, PoolError> {
        let theirs = self.pool.xattr(&self.oid, EPOCH_ATTR).map_err(|e| self.err(e))?;
        Ok(theirs.is_some_and(|t| t > epoch_text(self.epoch)))
    }
}

impl MetaBackend for RadosMeta {
    fn location(&self) -> String {
        format!("rados:{}/{}", self.pool.name(), self.oid)
    }

    fn shared(&self) -> bool {
        true
    }

    fn commit(&self, batch: &MetaBatch, _sync: bool) -> Result<(), PoolError> {
        use std::sync::atomic::Ordering;
        let failures = self.failures.load(Ordering::Relaxed);
        let _one_at_a_time = self.committing.lock();
        if let Some(why) = self.unknown.get() {
            return Err(self.refused(format!(
                "an earlier commit through this store may or may not be applied ({why}): nothing more is committed through it"
            )));
        }
        if self.failures.load(Ordering::Relaxed) != failures {
            return Err(self.refused("an earlier commit through this store failed while this one waited for it".into()));
        }
        let done = self.commit_now(batch);
        if done.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        done
    }

    fn sync(&self) -> Result<(), PoolError> {
        Ok(())
    }

    fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>, PoolError> {
        let k = omap_key(cf, key);
        Ok(self.read(std::slice::from_ref(&k))?.remove(&k))
    }

    fn multi_get(&self, cf: &str, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, PoolError> {
        let omap: Vec<Vec<u8>> = keys.iter().map(|k| omap_key(cf, k)).collect();
        let found = self.read(&omap)?;
        Ok(omap.iter().map(|k| found.get(k).cloned()).collect())
    }

    fn scan(&self, cf: &str, from: &[u8], visit: Visit) -> Result<(), PoolError> {
        self.scan_family(cf, from, visit)
    }

    fn snapshot(&self) -> Box<dyn MetaView + '_> {
        // Read whole, between two reads of the version: a commit in between reads again. A
        // busy pool commits more often than a large omap is read, so after a few reads
        // overtaken, one more holds this store's commits back (the owner's: only a replaced
        // owner's could still move the version) for as long as it reads, if the reads before
        // took little enough: every write that needs metadata waits meanwhile.
        let mut took = std::time::Duration::ZERO;
        for held in std::iter::repeat_n(false, FREE_SNAPSHOT_READS).chain([true]) {
            if held && took > HOLD_COMMITS_AT_MOST {
                return Box::new(Unreadable {
                    path: self.location(),
                    why: format!(
                        "commits moved the records during each of {FREE_SNAPSHOT_READS} reads, and one read takes {} ms, longer than the writes needing metadata may be held back ({} ms); try again when the pool is less busy",
                        took.as_millis(),
                        HOLD_COMMITS_AT_MOST.as_millis()
                    ),
                });
            }
            let _held = held.then(|| self.committing.lock());
            let started = std::time::Instant::now();
            let read = self.read_whole();
            took = started.elapsed();
            match read {
                Ok(Some(view)) => {
                    if held {
                        tracing::info!(
                            object = %self.location(),
                            ms = took.as_millis() as u64,
                            "a snapshot of the pool's metadata held its commits back while it read the records"
                        );
                    }
                    return view;
                }
                Ok(None) => {}
                Err(e) => {
                    return Box::new(Unreadable {
                        path: self.location(),
                        why: format!("it could not be read: {e}"),
                    })
                }
            }
        }
        Box::new(Unreadable {
            path: self.location(),
            why: "the records moved while this store's commits were held back (another gateway's commit, or an earlier one of this store's applied late)".into(),
        })
    }

    fn estimate_keys(&self, cf: &str) -> u64 {
        let mut n = 0;
        let _ = self.scan_family(cf, b"", &mut |_, _| {
            n += 1;
            Ok(true)
        });
        n
    }
}

/// The view of a store that could not be read consistently: every scan fails, saying why.
struct Unreadable {
    path: String,
    why: String,
}

impl MetaView for Unreadable {
    fn scan(&self, _cf: &str, _from: &[u8], _visit: Visit) -> Result<(), PoolError> {
        Err(PoolError::Meta {
            path: self.path.clone(),
            message: format!("no consistent snapshot could be read: {}", self.why),
        })
    }

    fn estimate_keys(&self, _cf: &str) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omap_keys_keep_the_order_of_the_records_keys() {
        let keys: [&[u8]; 6] = [b"", b"\x00", b"\x00\x00", b"\x01", b"\x7f\xff", b"\x80"];
        for w in keys.windows(2) {
            assert!(omap_key("grains", w[0]) < omap_key("grains", w[1]), "{w:?}");
        }
        for k in keys {
            assert_eq!(unhex(&omap_key("grains", k)[7..]).as_deref(), Some(k));
        }
        assert!(
            !omap_key("grains", b"\x00").contains(&0),
            "no NUL byte reaches librados"
        );
        assert_eq!(unhex(b"abc"), None);
        assert_eq!(unhex(b"zz"), None);
        assert_eq!(unhex(b"+f"), None, "no sign");
        assert_eq!(record_key(b"0f"), Some(vec![15]));
        assert_eq!(record_key(b"0F"), None, "a commit writes lower case only");
    }
}
