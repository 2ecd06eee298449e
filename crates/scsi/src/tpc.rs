//! The copy manager: what third-party copy commands share across the LUNs of one daemon. ROD
//! tokens (each a frozen image of the ranges it represents, so a token is point-in-time at no
//! cost in data) and the results of finished copy operations for RECEIVE ROD TOKEN
//! INFORMATION and RECEIVE COPY RESULTS. The LUNs an EXTENDED COPY can name are not here: they
//! are those its nexus can address ([`crate::LunScope`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::Rng;

use crate::backend::FrozenImage;
use crate::nexus::Nexus;
use crate::sense::{self, Sense};

/// Copy operation status values of RECEIVE COPY STATUS and RECEIVE ROD TOKEN INFORMATION.
pub const COPY_COMPLETED: u8 = 0x01;
pub const COPY_COMPLETED_WITH_ERRORS: u8 = 0x02;

/// A ROD token's size, as Windows and SPC-4 use it.
pub const TOKEN_LEN: usize = 512;
/// ROD type of the tokens we make: point in time copy, default.
pub const ROD_TYPE_PIT_DEFAULT: u32 = 0x0080_0000;
/// The block device zero ROD token: reads as zeros, needs no POPULATE TOKEN.
pub const ROD_TYPE_BLOCK_ZERO: u32 = 0xFFFF_0001;

/// Inactivity timeouts, in seconds: when POPULATE TOKEN asks for none, and the most it may.
pub const DEFAULT_INACTIVITY_TIMEOUT: u32 = 30;
pub const MAX_INACTIVITY_TIMEOUT: u32 = 600;
/// Tokens alive at once, daemon-wide, the bytes they may represent together, and the memory
/// their images may hold together (a vdisk's image keeps one grain location, 8 bytes, per
/// grain it covers: 4 TiB of 64 KiB grains is 512 MiB, of 4 KiB grains 8 GiB, so memory
/// bounds tokens of small grains first). POPULATE TOKEN beyond any of them is refused before
/// its image is made ([`claim`](CopyManager::claim)).
pub const MAX_TOKENS: usize = 4096;
pub const MAX_LIVE_TOKEN_BYTES: u64 = 4 << 40;
pub const MAX_LIVE_TOKEN_MEMORY: u64 = 512 << 20;
/// What one initiator may hold of those, through all its sessions together (a session
/// logged in again, or several at once, gets no more): a quarter, so that one initiator
/// cannot take the whole budget from the others (nor pin more of a pool's space with tokens
/// of data it then overwrites than a quarter of it).
pub const MAX_TOKENS_PER_INITIATOR: usize = MAX_TOKENS / 4;
pub const MAX_LIVE_TOKEN_BYTES_PER_INITIATOR: u64 = MAX_LIVE_TOKEN_BYTES / 4;
pub const MAX_LIVE_TOKEN_MEMORY_PER_INITIATOR: u64 = MAX_LIVE_TOKEN_MEMORY / 4;
/// How long a token lives at most, used or not (VPD page 0x8F says so): a token kept alive by
/// use would otherwise hold the grains of data overwritten since for as long as its holder
/// likes. Windows uses a token within seconds of making it.
pub const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// Results kept per I_T nexus for RECEIVE ROD TOKEN INFORMATION / COPY RESULTS.
const MAX_RESULTS_PER_NEXUS: usize = 64;
/// How long a token that ended (expired, deleted) is remembered, to say why it is refused,
/// and how many such are remembered at most (the oldest forgotten first: a refusal then says
/// "unknown" rather than why).
const TOMBSTONE_TIME: Duration = Duration::from_secs(3600);
const MAX_TOMBSTONES: usize = 4 * MAX_TOKENS;

// Token layout (SPC-4 ROD token format, with the body ours).
const T_TYPE: usize = 0; // 4 bytes, ROD type
const T_LEN: usize = 6; // 2 bytes, ROD token length: 0x01F8
const T_ID: usize = 8; // 8 bytes, copy manager ROD token identifier
const T_CREATOR: usize = 16; // 32 bytes, creator logical unit (identification CSCD descriptor)
const T_BYTES: usize = 48; // 16 bytes, number of bytes represented
const T_BLOCK: usize = 96; // 4 bytes, block size of the represented data
const T_INSTANCE: usize = 128; // 16 bytes, the daemon instance that made it
const T_SECRET: usize = 144; // 32 bytes, random: the token cannot be guessed
const T_END: usize = T_SECRET + 32;

/// Why a token is refused: the ASCQ of INVALID TOKEN OPERATION (ASC 0x23).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    Unsupported = 0x01,
    RemoteUsage = 0x02,
    Unknown = 0x04,
    Corrupt = 0x05,
    Revoked = 0x06,
    Expired = 0x07,
    Cancelled = 0x08,
    Deleted = 0x09,
    InvalidLength = 0x0A,
    /// The user may not read what the token represents (INVALID TOKEN OPERATION, CAUSE NOT
    /// REPORTABLE: a token made on another tenant's LUN is not told apart from a guess).
    NotReachable = 0x00,
}

impl TokenRefusal {
    pub fn sense(self) -> Sense {
        Sense::new(sense::key::ILLEGAL_REQUEST, 0x23, self as u8)
    }
}

struct Token {
    bytes: Box<[u8; TOKEN_LEN]>,
    /// The I_T nexus that made it: the only one REPORT ALL ROD TOKENS shows it to. A token is
    /// a bearer secret; whoever holds it may write its data.
    creator: u64,
    /// The name of the initiator that made it, lower case (iSCSI names compare so).
    made_by: String,
    /// The host it was made from, if known: the budget is kept per host too.
    host: Option<std::net::IpAddr>,
    image: Arc<dyn FrozenImage>,
    /// Memory its image holds, as its claim counted it.
    memory: u64,
    timeout: Duration,
    last_used: Instant,
    made: Instant,
}

/// A share of the tokens' budget taken by a POPULATE TOKEN before it makes its image
/// ([`CopyManager::claim`]): counted with the live tokens until the token is made from it
/// ([`CopyManager::create_token_unless`]) or it is dropped. Many POPULATE TOKENs at once
/// (a session runs dozens of commands) then cannot each make an image the budget would
/// have refused: the images would be made, and memory taken, before any was refused.
pub struct TokenClaim<'a> {
    cm: &'a CopyManager,
    id: u64,
    share: Share,
}

/// What a token, or a claim for one, takes of the budget.
#[derive(Clone)]
struct Share {
    /// The initiator's name, lower case.
    made_by: String,
    /// The host it came from, if known ([`Nexus::host`]).
    host: Option<std::net::IpAddr>,
    bytes: u64,
    memory: u64,
}

impl Drop for TokenClaim<'_> {
    fn drop(&mut self) {
        self.cm.claims.lock().remove(&self.id);
    }
}

/// Tokens that ended, with why and when, oldest first: bounded in number and in time, and
/// forgotten from the front, so that no command scans them all.
#[derive(Default)]
struct Ended {
    why: HashMap<[u8; 32], (TokenRefusal, Instant)>,
    order: VecDeque<([u8; 32], Instant)>,
}

impl Ended {
    fn insert(&mut self, secret: [u8; 32], why: TokenRefusal, at: Instant) {
        self.why.insert(secret, (why, at));
        self.order.push_back((secret, at));
        while self.order.len() > MAX_TOMBSTONES {
            self.pop_oldest();
        }
    }

    fn forget_before(&mut self, now: Instant) {
        while self
            .order
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= TOMBSTONE_TIME)
        {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((k, at)) = self.order.pop_front() {
            if self.why.get(&k).is_some_and(|(_, when)| *when == at) {
                self.why.remove(&k);
            }
        }
    }

    fn get(&self, secret: &[u8; 32]) -> Option<TokenRefusal> {
        self.why.get(secret).map(|(why, _)| *why)
    }
}

/// What a finished copy operation leaves for the initiator to read.
#[derive(Debug, Clone)]
pub struct OpResult {
    /// The service action it answered (0x00 EXTENDED COPY, 0x10 POPULATE TOKEN, 0x11 WRITE
    /// USING TOKEN).
    pub service_action: u8,
    /// Copy operation status: 0x01 completed without errors, 0x02 completed with errors.
    pub status: u8,
    /// Blocks transferred (or represented, for POPULATE TOKEN).
    pub transfer_blocks: u64,
    pub segments: u16,
    /// Sense of a failure, in fixed format.
    pub sense: Vec<u8>,
    /// The token made by POPULATE TOKEN.
    pub token: Option<Box<[u8; TOKEN_LEN]>>,
}

pub struct CopyManager {
    instance: [u8; 16],
    tokens: Mutex<HashMap<[u8; 32], Token>>,
    /// Claims of the budget for tokens whose images are being made, by claim number. Taken
    /// after `tokens` when both are.
    claims: Mutex<HashMap<u64, Share>>,
    /// Tokens that ended, with why and when.
    ended: Mutex<Ended>,
    next_id: AtomicU64,
    /// (nexus, list identifier) → result, oldest first per nexus.
    results: Mutex<HashMap<u64, VecDeque<(u32, OpResult)>>>,
    /// Whether an initiator (by name) may read the LUN a token was made on (its
    /// identification CSCD descriptor); None: any may.
    reach: parking_lot::RwLock<Option<Reach>>,
}

/// See [`CopyManager::set_reach`].
pub type Reach = Arc<dyn Fn(&str, &[u8; 32]) -> bool + Send + Sync>;

impl Default for CopyManager {
    fn default() -> Self {
        Self::new()
    }
}

impl CopyManager {
    pub fn new() -> CopyManager {
        let mut instance = [0u8; 16];
        rand::rng().fill(&mut instance[..]);
        CopyManager {
            instance,
            tokens: Mutex::new(HashMap::new()),
            claims: Mutex::new(HashMap::new()),
            ended: Mutex::new(Ended::default()),
            next_id: AtomicU64::new(1),
            results: Mutex::new(HashMap::new()),
            reach: parking_lot::RwLock::new(None),
        }
    }

    /// Says which LUNs an initiator may read: a token is written only by a user that may read
    /// the LUN it was made on (by any target it logs in to), so that its 512 bytes, seen on
    /// the wire or kept by a host that lost its access, do not carry that LUN's data to
    /// another tenant's LUN.
    pub fn set_reach(&self, reach: Reach) {
        *self.reach.write() = Some(reach);
    }

    /// Refuses `user` a token made on a LUN it may not read ([`set_reach`](Self::set_reach));
    /// a token this manager does not hold is left to [`use_token`](Self::use_token) to refuse.
    pub fn may_use(&self, t: &[u8], user: &Nexus) -> Result<(), TokenRefusal> {
        let Some(reach) = self.reach.read().clone() else {
            return Ok(());
        };
        if t.len() < TOKEN_LEN || user.initiator.is_empty() {
            return Ok(());
        }
        let secret: [u8; 32] = t[T_SECRET..T_SECRET + 32].try_into().expect("32 bytes");
        let creator: Option<[u8; 32]> = self
            .tokens
            .lock()
            .get(&secret)
            .map(|tok| tok.bytes[T_CREATOR..T_CREATOR + 32].try_into().expect("32 bytes"));
        match creator {
            Some(c) if !reach(&user.initiator.to_ascii_lowercase(), &c) => Err(TokenRefusal::NotReachable),
            _ => Ok(()),
        }
    }

    /// [`create_token_unless`](Self::create_token_unless) for a LUN that stays presented.
    #[cfg(test)]
    pub(crate) fn create_token(
        &self,
        creator: [u8; 32],
        by: &Nexus,
        image: Arc<dyn FrozenImage>,
        timeout_s: u32,
    ) -> Result<Box<[u8; TOKEN_LEN]>, Sense> {
        let claim = self.claim(by, image.len(), 0)?;
        self.create_token_unless(claim, creator, by, image, timeout_s, || false)
    }

    /// Takes for a token of `bytes` of data, whose image will hold `memory` bytes of memory,
    /// its share of the budget, before the image is made: refused (INSUFFICIENT RESOURCES TO
    /// CREATE ROD TOKEN) when the live tokens and the claims still being made, daemon-wide
    /// or of `by`'s initiator, or of its host (whatever names it logs in with), leave too
    /// little of it.
    pub fn claim(&self, by: &Nexus, bytes: u64, memory: u64) -> Result<TokenClaim<'_>, Sense> {
        self.expire();
        let tokens = self.tokens.lock();
        let mut claims = self.claims.lock();
        let share = Share {
            made_by: by.initiator.to_ascii_lowercase(),
            host: by.host,
            bytes,
            memory,
        };
        let taken = tokens
            .values()
            .map(|t| (&t.made_by, t.host, t.image.len(), t.memory))
            .chain(claims.values().map(|c| (&c.made_by, c.host, c.bytes, c.memory)));
        let add = |sum: &mut (usize, u64, u64), bytes, memory| *sum = (sum.0 + 1, sum.1 + bytes, sum.2 + memory);
        let (mut all, mut initiator, mut host) = Default::default();
        for (made_by, from, bytes, memory) in taken {
            add(&mut all, bytes, memory);
            if *made_by == share.made_by {
                add(&mut initiator, bytes, memory);
            }
            if from.is_some() && from == share.host {
                add(&mut host, bytes, memory);
            }
        }
        let over_a_quarter = |mine: (usize, u64, u64)| {
            mine.0 >= MAX_TOKENS_PER_INITIATOR
                || mine.1 + bytes > MAX_LIVE_TOKEN_BYTES_PER_INITIATOR
                || mine.2 + memory > MAX_LIVE_TOKEN_MEMORY_PER_INITIATOR
        };
        if all.0 >= MAX_TOKENS
            || all.1 + bytes > MAX_LIVE_TOKEN_BYTES
            || all.2 + memory > MAX_LIVE_TOKEN_MEMORY
            || over_a_quarter(initiator)
            || over_a_quarter(host)
        {
            return Err(sense::INSUFFICIENT_RESOURCES_TO_CREATE_ROD_TOKEN);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        claims.insert(id, share.clone());
        Ok(TokenClaim { cm: self, id, share })
    }

    /// Makes, from its `claim` of the budget, a token representing `image`, created by the
    /// I_T nexus `by` on the LUN that `creator` (its identification CSCD descriptor) names.
    /// Refused (COPY ABORTED, copy target device not reachable) once the session of `by` was
    /// ended from outside, or when `withdrawn()` says the LUN is no longer one its target
    /// presents (asked under the tokens' lock).
    pub fn create_token_unless(
        &self,
        claim: TokenClaim<'_>,
        creator: [u8; 32],
        by: &Nexus,
        image: Arc<dyn FrozenImage>,
        timeout_s: u32,
        withdrawn: impl Fn() -> bool,
    ) -> Result<Box<[u8; TOKEN_LEN]>, Sense> {
        let nexus = by.id;
        let mut tokens = self.tokens.lock();
        // Under the lock: whoever ends a session from outside closes it (takes a LUN out of
        // the target) before revoking what it made, so a POPULATE TOKEN that was running
        // meanwhile either finds it ended (the LUN gone) here or made its token before the
        // revocation, which then ends it.
        if by.ended() || withdrawn() {
            return Err(sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        }
        let made_by = claim.share.made_by.clone();
        let host = claim.share.host;
        let memory = claim.share.memory;
        let mut b = Box::new([0u8; TOKEN_LEN]);
        rand::rng().fill(&mut b[T_END..]);
        b[T_TYPE..T_TYPE + 4].copy_from_slice(&ROD_TYPE_PIT_DEFAULT.to_be_bytes());
        b[T_LEN..T_LEN + 2].copy_from_slice(&((TOKEN_LEN - 8) as u16).to_be_bytes());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        b[T_ID..T_ID + 8].copy_from_slice(&id.to_be_bytes());
        b[T_CREATOR..T_CREATOR + 32].copy_from_slice(&creator);
        b[T_BYTES + 8..T_BYTES + 16].copy_from_slice(&image.len().to_be_bytes());
        b[T_BLOCK..T_BLOCK + 4].copy_from_slice(&image.block_size().to_be_bytes());
        b[T_INSTANCE..T_INSTANCE + 16].copy_from_slice(&self.instance);
        let mut secret = [0u8; 32];
        rand::rng().fill(&mut secret[..]);
        b[T_SECRET..T_SECRET + 32].copy_from_slice(&secret);
        tokens.insert(
            secret,
            Token {
                bytes: b.clone(),
                creator: nexus,
                made_by,
                host,
                image,
                memory,
                timeout: Duration::from_secs(timeout_s as u64),
                last_used: Instant::now(),
                made: Instant::now(),
            },
        );
        Ok(b)
    }

    /// The image a token represents; using it restarts its inactivity timer. `delete` ends
    /// the token (WRITE USING TOKEN with DEL_TKN) once looked up.
    pub fn use_token(&self, t: &[u8], delete: bool) -> Result<Arc<dyn FrozenImage>, TokenRefusal> {
        if t.len() < TOKEN_LEN {
            return Err(TokenRefusal::InvalidLength);
        }
        let rod_type = u32::from_be_bytes(t[..4].try_into().expect("4 bytes"));
        if rod_type != ROD_TYPE_PIT_DEFAULT {
            return Err(TokenRefusal::Unsupported);
        }
        if u16::from_be_bytes([t[T_LEN], t[T_LEN + 1]]) as usize != TOKEN_LEN - 8 {
            return Err(TokenRefusal::InvalidLength);
        }
        self.expire();
        let secret: [u8; 32] = t[T_SECRET..T_SECRET + 32].try_into().expect("32 bytes");
        let mut tokens = self.tokens.lock();
        let Some(tok) = tokens.get_mut(&secret) else {
            if let Some(why) = self.ended.lock().get(&secret) {
                return Err(why);
            }
            if t[T_INSTANCE..T_INSTANCE + 16] != self.instance {
                // Made by another copy manager (or this daemon before a restart).
                return Err(TokenRefusal::RemoteUsage);
            }
            return Err(TokenRefusal::Unknown);
        };
        if tok.bytes[..] != t[..TOKEN_LEN] {
            return Err(TokenRefusal::Corrupt);
        }
        tok.last_used = Instant::now();
        let image = tok.image.clone();
        if delete {
            tokens.remove(&secret);
            self.ended.lock().insert(secret, TokenRefusal::Deleted, Instant::now());
        }
        Ok(image)
    }

    /// Ends tokens whose inactivity timeout or lifetime has passed; forgets old tombstones.
    /// Called by every token command, and by the daemon now and then: tokens no command
    /// comes for again would otherwise keep the grains they hold taken (the source
    /// overwritten since, the space stays used) until their vdisk or pool goes.
    pub fn expire(&self) {
        self.expire_at(Instant::now())
    }

    fn expire_at(&self, now: Instant) {
        let mut gone = Vec::new();
        self.tokens.lock().retain(|k, t| {
            let live = now.saturating_duration_since(t.last_used) < t.timeout
                && now.saturating_duration_since(t.made) < MAX_TOKEN_LIFETIME;
            if !live {
                gone.push(*k);
            }
            live
        });
        let mut ended = self.ended.lock();
        ended.forget_before(now);
        for k in gone {
            ended.insert(k, TokenRefusal::Expired, now);
        }
    }

    /// Ends every token whose image comes from pool `pool` (it is being exported): a token
    /// holds its grains, and the pool cannot close while it does.
    pub fn revoke_pool(&self, pool: &str) {
        self.revoke_where(|t| t.image.pool() == pool);
    }

    /// Ends every token whose image comes from vdisk `vdisk` of pool `pool` (it is being
    /// deleted): its blocks must not outlive it in another vdisk a token is written to, and
    /// its grains return to the pool.
    pub fn revoke_vdisk(&self, pool: &str, vdisk: &str) {
        self.revoke_where(|t| t.image.pool() == pool && t.image.vdisk() == vdisk);
    }

    /// Ends every token made on one of the LUNs `luns` (identification CSCD descriptors) by
    /// an initiator that `lost(initiator, lun)` says lost its access to that LUN, through any
    /// of its sessions, those ended and those still going: what a host populated while it
    /// had access is not written anywhere after it lost it, by that host or by whoever it
    /// gave the token to.
    pub fn revoke_made_on(&self, luns: &[[u8; 32]], lost: impl Fn(&str, &[u8; 32]) -> bool) {
        self.revoke_where(|t| {
            let on: &[u8; 32] = t.bytes[T_CREATOR..T_CREATOR + 32].try_into().expect("32 bytes");
            luns.contains(on) && lost(&t.made_by, on)
        });
    }

    fn revoke_where(&self, ends: impl Fn(&Token) -> bool) {
        let now = Instant::now();
        let mut revoked = Vec::new();
        self.tokens.lock().retain(|k, t| {
            let keep = !ends(t);
            if !keep {
                revoked.push(*k);
            }
            keep
        });
        let mut ended = self.ended.lock();
        for k in revoked {
            ended.insert(k, TokenRefusal::Revoked, now);
        }
    }

    /// The live tokens made by the I_T nexus `nexus`, for its REPORT ALL ROD TOKENS: (token
    /// bytes, bytes represented, seconds left before expiry). Never another nexus's: each
    /// token's bytes are the secret that lets its holder write the data it represents.
    pub fn tokens_of(&self, nexus: u64) -> Vec<(Box<[u8; TOKEN_LEN]>, u64, u64)> {
        self.expire();
        let now = Instant::now();
        self.tokens
            .lock()
            .values()
            .filter(|t| t.creator == nexus)
            .map(|t| {
                let idle = t.timeout.saturating_sub(now.saturating_duration_since(t.last_used));
                let left = idle.min(MAX_TOKEN_LIFETIME.saturating_sub(now.saturating_duration_since(t.made)));
                (t.bytes.clone(), t.image.len(), left.as_secs())
            })
            .collect()
    }

    pub fn record(&self, nexus: u64, list_id: u32, r: OpResult) {
        let mut all = self.results.lock();
        let q = all.entry(nexus).or_default();
        q.retain(|(id, _)| *id != list_id);
        if q.len() >= MAX_RESULTS_PER_NEXUS {
            q.pop_front();
        }
        q.push_back((list_id, r));
    }

    /// The result of the operation `list_id` of a nexus, if it finished and was kept.
    pub fn result(&self, nexus: u64, list_id: u32) -> Option<OpResult> {
        self.results
            .lock()
            .get(&nexus)
            .and_then(|q| q.iter().rev().find(|(id, _)| *id == list_id).map(|(_, r)| r.clone()))
    }

    /// Forgets the results of a nexus that went away.
    pub fn forget_nexus(&self, nexus: u64) {
        self.results.lock().remove(&nexus);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendResult;
    use std::any::Any;

    #[test]
    fn refusals_are_invalid_token_operation() {
        let s = TokenRefusal::Expired.sense();
        assert_eq!((s.key, s.asc, s.ascq), (sense::key::ILLEGAL_REQUEST, 0x23, 0x07));
        assert_eq!(TokenRefusal::InvalidLength.sense().ascq, 0x0A);
    }

    /// An image of `len` bytes frozen from vdisk `vdisk` of pool `pool`.
    #[derive(Debug)]
    struct Image {
        pool: &'static str,
        vdisk: &'static str,
        len: u64,
    }

    impl FrozenImage for Image {
        fn len(&self) -> u64 {
            self.len
        }
        fn block_size(&self) -> u32 {
            512
        }
        fn pool(&self) -> &str {
            self.pool
        }
        fn vdisk(&self) -> &str {
            self.vdisk
        }
        fn read(&self, _: u64, out: &mut [u8]) -> BackendResult<()> {
            out.fill(0);
            Ok(())
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    fn image(pool: &'static str, vdisk: &'static str, len: u64) -> Arc<dyn FrozenImage> {
        Arc::new(Image { pool, vdisk, len })
    }

    #[test]
    fn a_deleted_vdisks_tokens_end_with_it_and_no_other() {
        let cm = CopyManager::new();
        let of_vm = cm.create_token([1; 32], &nx(7), image("p", "vm", 4096), 30).unwrap();
        let of_vm_snap = cm.create_token([1; 32], &nx(7), image("p", "vm@s1", 4096), 30).unwrap();
        let of_other_pool = cm.create_token([1; 32], &nx(7), image("q", "vm", 4096), 30).unwrap();
        cm.revoke_vdisk("p", "vm");
        assert_eq!(cm.use_token(&of_vm[..], false).unwrap_err(), TokenRefusal::Revoked);
        assert!(cm.use_token(&of_vm_snap[..], false).is_ok(), "its snapshot lives on");
        assert!(cm.use_token(&of_other_pool[..], false).is_ok());
        cm.revoke_pool("q");
        assert_eq!(
            cm.use_token(&of_other_pool[..], false).unwrap_err(),
            TokenRefusal::Revoked
        );
        assert!(cm.use_token(&of_vm_snap[..], false).is_ok());
    }

    fn nx(id: u64) -> Nexus {
        Nexus::new(id, "iqn.2026-11.test:host", [0, 2, 0, 0, 0, id as u8])
    }

    /// An initiator that lost access to some LUNs loses the tokens it made on them, through
    /// every one of its sessions (case aside), and keeps those made on LUNs it still reaches;
    /// another initiator's tokens on the same LUNs are kept.
    #[test]
    fn the_tokens_an_initiator_made_on_luns_it_lost_end_and_no_others() {
        let cm = CopyManager::new();
        let (a, b, c) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let host = |id, name: &str| Nexus::new(id, name, [0; 6]);
        let on_a = cm
            .create_token(a, &host(2, "iqn.2026-11.test:X"), image("p", "vm", 4096), 30)
            .unwrap();
        let on_b = cm
            .create_token(b, &host(3, "iqn.2026-11.test:x"), image("p", "vm", 4096), 30)
            .unwrap();
        let on_c = cm
            .create_token(c, &host(4, "iqn.2026-11.test:x"), image("p", "vm", 4096), 30)
            .unwrap();
        let other = cm
            .create_token(a, &host(5, "iqn.2026-11.test:y"), image("p", "vm", 4096), 30)
            .unwrap();
        // Still reaching LUN a another way: only the token on b ends.
        cm.revoke_made_on(&[a, b], |i, lun| i == "iqn.2026-11.test:x" && *lun != [1u8; 32]);
        assert!(cm.use_token(&on_a[..], false).is_ok(), "a LUN it still reaches");
        assert_eq!(cm.use_token(&on_b[..], false).unwrap_err(), TokenRefusal::Revoked);
        cm.revoke_made_on(&[a, b], |i, _| i == "iqn.2026-11.test:x");
        assert_eq!(cm.use_token(&on_a[..], false).unwrap_err(), TokenRefusal::Revoked);
        assert_eq!(cm.use_token(&on_b[..], false).unwrap_err(), TokenRefusal::Revoked);
        assert!(cm.use_token(&on_c[..], false).is_ok(), "a LUN it did not lose");
        assert!(cm.use_token(&other[..], false).is_ok(), "another initiator's token");
        assert!(cm.tokens_of(2).is_empty());
        assert_eq!(cm.tokens_of(5).len(), 1);
    }

    /// A POPULATE TOKEN that finishes after its session was ended from outside (its host
    /// taken out of the ACL) makes no token: no session could ask for it, and the revocation
    /// that followed the end has already run.
    #[test]
    fn a_session_ended_from_outside_makes_no_more_tokens() {
        let cm = CopyManager::new();
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let n = nx(9).ended_by(ended.clone());
        assert!(!n.ended());
        cm.create_token([1; 32], &n, image("p", "vm", 4096), 30).unwrap();
        ended.store(true, Ordering::SeqCst);
        assert!(n.clone().ended(), "its clones share the flag");
        let refused = cm.create_token([1; 32], &n, image("p", "vm", 4096), 30).unwrap_err();
        assert_eq!(refused, sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        assert_eq!(
            cm.tokens_of(9).len(),
            1,
            "the token made before is revoked or kept by its own rules"
        );
        assert!(cm.create_token([1; 32], &nx(10), image("p", "vm", 4096), 30).is_ok());
    }

    /// The budget is the initiator's, over all its sessions: sessions of one host, at once or
    /// one after the other (a new login is a new nexus), share one quarter of it.
    #[test]
    fn one_initiator_cannot_take_the_whole_token_budget() {
        let cm = CopyManager::new();
        let host = |id, name: &str| Nexus::new(id, name, [0, 2, 0, 0, 0, id as u8]);
        for n in 0..MAX_TOKENS_PER_INITIATOR {
            let session = host(1 + (n % 4) as u64, "iqn.2026-11.test:a");
            cm.create_token([1; 32], &session, image("p", "vm", 512), 30).unwrap();
        }
        for session in [host(1, "iqn.2026-11.test:a"), host(99, "IQN.2026-11.TEST:A")] {
            let refused = cm
                .create_token([1; 32], &session, image("p", "vm", 512), 30)
                .unwrap_err();
            assert_eq!(refused.asc, sense::INSUFFICIENT_RESOURCES_TO_CREATE_ROD_TOKEN.asc);
        }
        // Another initiator still gets its own, and bytes are bounded the same way.
        cm.create_token([1; 32], &host(5, "iqn.2026-11.test:b"), image("p", "vm", 512), 30)
            .unwrap();
        let c = |id| host(id, "iqn.2026-11.test:c");
        cm.create_token([1; 32], &c(6), image("p", "vm", MAX_LIVE_TOKEN_BYTES_PER_INITIATOR), 30)
            .unwrap();
        assert!(cm.create_token([1; 32], &c(7), image("p", "vm", 512), 30).is_err());
        cm.create_token([1; 32], &host(8, "iqn.2026-11.test:d"), image("p", "vm", 512), 30)
            .unwrap();
    }

    /// An initiator chooses its own name: one host that logs in under several names shares
    /// one quarter of the budget among them, while another host has its own.
    #[test]
    fn one_host_cannot_take_the_whole_token_budget_under_many_names() {
        let cm = CopyManager::new();
        let at = |id: u64, host: &str| {
            Nexus::new(id, &format!("iqn.2026-12.test:name{id}"), [0, 2, 0, 0, 0, id as u8])
                .from_host(host.parse().unwrap())
        };
        let quarter = MAX_LIVE_TOKEN_MEMORY_PER_INITIATOR;
        let first = cm.claim(&at(1, "192.0.2.1"), 1 << 20, quarter / 2).unwrap();
        let second = cm.claim(&at(2, "192.0.2.1"), 1 << 20, quarter / 2).unwrap();
        let refused = cm
            .claim(&at(3, "192.0.2.1"), 1 << 20, 1)
            .err()
            .expect("the host's quarter is taken");
        assert_eq!(refused.asc, sense::INSUFFICIENT_RESOURCES_TO_CREATE_ROD_TOKEN.asc);
        // Another address of the same IPv6 /64 is the same host; another /64 is not.
        let v6 = cm.claim(&at(4, "2001:db8:1:2::10"), 1 << 20, quarter).unwrap();
        assert!(cm.claim(&at(5, "2001:db8:1:2::11"), 1 << 20, 1).is_err());
        let other = cm.claim(&at(6, "2001:db8:1:3::10"), 1 << 20, quarter / 2).unwrap();
        // Nexuses of no known host (local callers) are held to their name's share alone.
        let local = cm
            .claim(&Nexus::new(7, "iqn.2026-12.test:local", [0; 6]), 1 << 20, 1)
            .unwrap();
        drop((first, second, v6, other, local));
        assert!(cm.claim(&at(3, "192.0.2.1"), 1 << 20, quarter).is_ok());
    }

    /// A token kept in use ends all the same once its lifetime is over: it cannot hold the
    /// grains of overwritten data for as long as its holder likes.
    #[test]
    fn a_token_in_use_ends_at_its_lifetime() {
        let cm = CopyManager::new();
        let t = cm.create_token([1; 32], &nx(1), image("p", "vm", 4096), 600).unwrap();
        assert!(cm.tokens_of(1)[0].2 <= 600);
        // As if used all along: its inactivity never ends it.
        for tok in cm.tokens.lock().values_mut() {
            tok.timeout = 2 * MAX_TOKEN_LIFETIME;
        }
        cm.expire_at(Instant::now() + MAX_TOKEN_LIFETIME / 2);
        assert!(cm.use_token(&t[..], false).is_ok(), "used within its lifetime");
        let left = cm.tokens_of(1)[0].2;
        assert!(left <= MAX_TOKEN_LIFETIME.as_secs(), "{left} s left");
        cm.expire_at(Instant::now() + MAX_TOKEN_LIFETIME);
        assert_eq!(cm.use_token(&t[..], false).unwrap_err(), TokenRefusal::Expired);
        assert!(cm.tokens_of(1).is_empty());
    }

    /// Ended tokens are remembered in bounded number, the oldest forgotten first.
    #[test]
    fn the_record_of_ended_tokens_is_bounded() {
        let cm = CopyManager::new();
        let first = cm.create_token([1; 32], &nx(1), image("p", "vm", 512), 30).unwrap();
        cm.use_token(&first[..], true).unwrap();
        assert_eq!(cm.use_token(&first[..], false).unwrap_err(), TokenRefusal::Deleted);
        for _ in 0..MAX_TOMBSTONES {
            let t = cm.create_token([1; 32], &nx(1), image("p", "vm", 512), 30).unwrap();
            cm.use_token(&t[..], true).unwrap();
        }
        let ended = cm.ended.lock();
        assert_eq!((ended.why.len(), ended.order.len()), (MAX_TOMBSTONES, MAX_TOMBSTONES));
        drop(ended);
        assert_eq!(cm.use_token(&first[..], false).unwrap_err(), TokenRefusal::Unknown);
        cm.ended.lock().forget_before(Instant::now() + TOMBSTONE_TIME);
        assert!(cm.ended.lock().why.is_empty());
    }

    /// A POPULATE TOKEN on a LUN taken out of a target while it ran makes no token: the
    /// revocation that followed the removal has already run.
    #[test]
    fn a_lun_withdrawn_meanwhile_makes_no_token() {
        let cm = CopyManager::new();
        let claim = cm.claim(&nx(1), 4096, 64).unwrap();
        let refused = cm
            .create_token_unless(claim, [1; 32], &nx(1), image("p", "vm", 4096), 30, || true)
            .unwrap_err();
        assert_eq!(refused, sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        assert!(cm.tokens_of(1).is_empty());
        assert!(cm.claims.lock().is_empty(), "its claim is given back");
        let claim = cm.claim(&nx(1), 4096, 64).unwrap();
        cm.create_token_unless(claim, [1; 32], &nx(1), image("p", "vm", 4096), 30, || false)
            .unwrap();
        assert!(cm.claims.lock().is_empty(), "the token counts in its place");
    }

    /// The budget is taken before the images are made: claims still being made count as
    /// tokens, so that dozens of POPULATE TOKENs at once (one session runs as many) cannot
    /// each make an image, and take its memory, that the budget then refuses. Memory bounds
    /// the images of small grains, whose bytes the byte budget would still let through.
    #[test]
    fn the_token_budget_is_claimed_before_the_image_is_made() {
        let cm = CopyManager::new();
        let a = Nexus::new(1, "iqn.2026-12.test:a", [0, 2, 0, 0, 0, 1]);
        let half = MAX_LIVE_TOKEN_MEMORY_PER_INITIATOR / 2;
        let first = cm.claim(&a, 1 << 30, half).unwrap();
        let second = cm.claim(&a, 1 << 30, half).unwrap();
        let refused = cm.claim(&a, 1 << 30, 1).err().expect("over the initiator's memory");
        assert_eq!(refused.asc, sense::INSUFFICIENT_RESOURCES_TO_CREATE_ROD_TOKEN.asc);
        // A claim given back (its image could not be made) frees its share; one made into a
        // token keeps it.
        drop(second);
        let token = cm
            .create_token_unless(first, [1; 32], &a, image("p", "vm", 1 << 30), 30, || false)
            .unwrap();
        let again = cm.claim(&a, 1 << 30, half).unwrap();
        assert!(cm.claim(&a, 1 << 30, 1).is_err(), "the token holds the other half");
        drop(again);
        // Bytes bound a claim as they bound tokens, and another initiator has its own share.
        assert!(cm.claim(&a, MAX_LIVE_TOKEN_BYTES_PER_INITIATOR, 0).is_err());
        let b = Nexus::new(2, "iqn.2026-12.test:b", [0, 2, 0, 0, 0, 2]);
        let theirs = cm.claim(&b, 1 << 30, MAX_LIVE_TOKEN_MEMORY_PER_INITIATOR).unwrap();
        // Ended, the token gives its share back.
        assert!(cm.use_token(&token[..], true).is_ok());
        cm.claim(&a, 1 << 30, MAX_LIVE_TOKEN_MEMORY_PER_INITIATOR).unwrap();
        drop(theirs);
        // Daemon-wide: every initiator's claims together.
        let hosts: Vec<Nexus> = (0..4)
            .map(|i| Nexus::new(10 + i, &format!("iqn.2026-12.test:h{i}"), [0, 2, 0, 0, 0, 9]))
            .collect();
        let held: Vec<TokenClaim> = hosts
            .iter()
            .map(|h| cm.claim(h, 1 << 20, MAX_LIVE_TOKEN_MEMORY / 4).unwrap())
            .collect();
        let c = Nexus::new(20, "iqn.2026-12.test:c", [0, 2, 0, 0, 0, 3]);
        assert!(cm.claim(&c, 1 << 20, 1).is_err(), "the daemon's memory is all claimed");
        drop(held);
        assert!(cm.claim(&c, 1 << 20, 1).is_ok());
    }

    #[test]
    fn malformed_tokens_are_refused_before_lookup() {
        let cm = CopyManager::new();
        assert_eq!(
            cm.use_token(&[0u8; 100], false).unwrap_err(),
            TokenRefusal::InvalidLength
        );
        let mut t = [0u8; TOKEN_LEN];
        t[..4].copy_from_slice(&0x0001_0000u32.to_be_bytes());
        assert_eq!(cm.use_token(&t, false).unwrap_err(), TokenRefusal::Unsupported);
        t[..4].copy_from_slice(&ROD_TYPE_PIT_DEFAULT.to_be_bytes());
        assert_eq!(cm.use_token(&t, false).unwrap_err(), TokenRefusal::InvalidLength);
        t[T_LEN..T_LEN + 2].copy_from_slice(&0x01F8u16.to_be_bytes());
        assert_eq!(
            cm.use_token(&t, false).unwrap_err(),
            TokenRefusal::RemoteUsage,
            "not made by this copy manager"
        );
        t[T_INSTANCE..T_INSTANCE + 16].copy_from_slice(&cm.instance);
        assert_eq!(cm.use_token(&t, false).unwrap_err(), TokenRefusal::Unknown);
    }
}
