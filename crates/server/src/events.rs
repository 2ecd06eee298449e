//! The event log: what happened that an administrator should know about (a disk failed, a
//! pool went degraded, a repair finished, a login was refused), each event once, numbered.
//!
//! An event is
//! - kept in memory (the newest [`KEEP_IN_MEMORY`]) for `tessera events` and the API;
//! - handed at once to every follower (`tessera events --follow`, `GET /api/events/stream`);
//! - written to the daemon's log, so to the journal under systemd;
//! - appended to `<state dir>/events.jsonl` by a writer thread that syncs what it wrote, so
//!   that recording never waits for a disk; the file keeps its newest half when it passes
//!   [`MAX_FILE_BYTES`], and a torn last line (a crash in the middle of a write) is skipped
//!   when it is read back;
//! - handed to the hook (a command, or a webhook URL), from a thread of its own, when it is at
//!   least as severe as the hook asks.
//!
//! The same event again (same kind, pool, subject and message) within [`REPEAT_WINDOW`] is
//! folded into the next one that passes the window, which carries how many it stands for: an
//! initiator that retries a refused login every second makes one event a minute, not sixty.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

/// Events kept in memory for the API; older ones are only in the file.
pub const KEEP_IN_MEMORY: usize = 10_000;
/// Size of `events.jsonl` past which it is cut to its newest half.
pub const MAX_FILE_BYTES: u64 = 8 << 20;
/// The same event again within this window is folded into the next one.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);
/// How long a hook command or webhook may take before it is abandoned.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(30);
/// Refusals of peers nobody authenticated (a refused iSCSI login, a replication handshake
/// without the key) recorded one by one within a [`REPEAT_WINDOW`], per kind from one source,
/// and per kind in all: past them they are counted, and said in one event when the window
/// ends, so that a flood of them (new names, new addresses) cannot push the other events out
/// of the log, nor fill the hook's queue.
pub const REFUSALS_PER_SOURCE: u64 = 10;
pub const REFUSALS_PER_KIND: u64 = 100;

pub use tessera_admission::source_of;

/// Events waiting for the hook beyond this are dropped (and counted): a hook that hangs must
/// not hold the daemon's memory.
const HOOK_QUEUE: usize = 1024;
/// Events below `error` are dropped once this many wait, so that the last quarter of the
/// queue is kept for errors and critical events, which a hook that falls behind under a burst
/// of warnings must still be handed.
const HOOK_QUEUE_BELOW_ERROR: usize = HOOK_QUEUE * 3 / 4;
const WRITER_QUEUE: usize = 4096;
/// Distinct recent events remembered for folding repeats.
const MAX_FOLDED: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
    Critical,
}

impl Severity {
    pub const ALL: [Severity; 4] = [Severity::Info, Severity::Warning, Severity::Error, Severity::Critical];

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Critical => "critical",
        }
    }

    pub fn parse(s: &str) -> Result<Severity, String> {
        Severity::ALL
            .into_iter()
            .find(|v| v.as_str() == s.to_ascii_lowercase())
            .ok_or_else(|| format!("'{s}' is not a severity: write info, warning, error or critical"))
    }
}

/// One event, as the API, the file and the hook show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Event {
    /// Its number: each event has the next one, across restarts.
    pub seq: u64,
    /// When it happened, in seconds since the Unix epoch.
    pub time: f64,
    pub severity: Severity,
    /// What happened, a stable name: `disk.failed`, `pool.degraded`, `repair.finished`,
    /// `iscsi.login_refused`, ... (docs/events.md lists them).
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// What it happened to: a disk's path, POOL/VDISK, a target's IQN, an initiator's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub message: String,
    /// How many events like this one, within the minute before it, it stands for.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An event about to be recorded.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub severity: Severity,
    pub kind: String,
    pub pool: Option<String>,
    pub subject: Option<String>,
    pub message: String,
}

impl NewEvent {
    pub fn new(severity: Severity, kind: &str, message: impl Into<String>) -> NewEvent {
        NewEvent {
            severity,
            kind: kind.to_string(),
            pool: None,
            subject: None,
            message: message.into(),
        }
    }

    pub fn pool(mut self, pool: &str) -> NewEvent {
        self.pool = Some(pool.to_string());
        self
    }

    pub fn subject(mut self, subject: impl Into<String>) -> NewEvent {
        self.subject = Some(subject.into());
        self
    }

    /// The event with its text made safe to print: names in it (an initiator's, from a login
    /// nobody authenticated yet) must not carry terminal escapes or line breaks to whoever runs
    /// `tessera events` or reads the journal, nor grow without bound.
    fn printable(self) -> NewEvent {
        NewEvent {
            severity: self.severity,
            kind: printable(&self.kind),
            pool: self.pool.as_deref().map(printable),
            subject: self.subject.as_deref().map(printable),
            message: printable(&self.message),
        }
    }
}

/// Longest text field an event keeps, in characters.
const MAX_FIELD_CHARS: usize = 1024;

/// `text` with each control character replaced by U+FFFD and cut to `MAX_FIELD_CHARS`.
fn printable(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(MAX_FIELD_CHARS)
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    if text.chars().nth(MAX_FIELD_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// Which events a reader wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only events numbered after this one.
    pub after: Option<u64>,
    pub min_severity: Option<Severity>,
    pub pool: Option<String>,
}

impl Filter {
    pub fn admits(&self, e: &Event) -> bool {
        self.after.is_none_or(|a| e.seq > a)
            && self.min_severity.is_none_or(|s| e.severity >= s)
            && self.pool.as_ref().is_none_or(|p| e.pool.as_ref() == Some(p))
    }
}

/// Where events go beyond the log: a command run per event, and a URL posted to.
#[derive(Debug, Clone, PartialEq)]
pub struct HookConfig {
    /// Run with the event's JSON on its standard input and TESSERA_EVENT_* in its environment.
    pub command: Option<PathBuf>,
    /// `http://HOST[:PORT]/PATH`, sent the event's JSON in a POST.
    pub webhook: Option<Webhook>,
    /// The least severity handed to them.
    pub min_severity: Severity,
}

impl Default for HookConfig {
    fn default() -> HookConfig {
        HookConfig {
            command: None,
            webhook: None,
            min_severity: Severity::Warning,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    pub authority: String,
    pub path: String,
}

impl Webhook {
    /// Plain HTTP only: HTTPS needs a client certificate store the daemon does not have; a
    /// hook command (`curl`) reaches HTTPS endpoints.
    pub fn parse(url: &str) -> Result<Webhook, String> {
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(format!(
                "event_webhook '{url}': only http:// URLs are posted to; for HTTPS, set event_hook to a command (curl) instead"
            ));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() || authority.contains(['@', ' ']) {
            return Err(format!("event_webhook '{url}' has no host"));
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Webhook {
            authority,
            path: path.to_string(),
        })
    }
}

/// The refusals recorded in the current window, and those past the budget.
#[derive(Default)]
struct Refusals {
    since: Option<Instant>,
    /// Recorded, per (kind, source), and per kind; a source is counted only while its kind
    /// is within its budget, so the map holds at most that many sources per kind.
    by_source: HashMap<(String, String), u64>,
    by_kind: HashMap<String, u64>,
    /// Not recorded one by one, per kind and severity.
    held_back: HashMap<String, (Severity, u64)>,
}

struct Memory {
    recent: VecDeque<Event>,
    next_seq: u64,
    /// Per (kind, pool, subject, message): when it was last recorded, and how many like it
    /// have been folded since.
    folded: HashMap<(String, Option<String>, Option<String>, String), (Instant, u64)>,
}

pub struct EventLog {
    memory: Mutex<Memory>,
    refusals: Mutex<Refusals>,
    followers: tokio::sync::broadcast::Sender<Event>,
    /// Set when the daemon stops: followers' streams end.
    closing: tokio::sync::watch::Sender<bool>,
    writer: Option<SyncSender<Event>>,
    /// The least severity handed to the hook, its queue, and how many wait in it.
    hook: Option<(Severity, SyncSender<Event>, Arc<AtomicUsize>)>,
    counts: [AtomicU64; 4],
    /// Events the writer could not keep up with or could not write.
    pub unwritten: Arc<AtomicU64>,
    /// Hook runs that failed, timed out, or were dropped for a full queue.
    pub hook_failures: Arc<AtomicU64>,
}

impl EventLog {
    /// An event log that keeps nothing on disk (for tests).
    pub fn in_memory() -> EventLog {
        EventLog::with(Vec::new(), None, &HookConfig::default())
    }

    /// Opens (or starts) the event log in `path`. Lines that cannot be read back are skipped
    /// and said so; a file that cannot be opened is an error.
    pub fn open(path: &Path, hook: &HookConfig) -> Result<EventLog, String> {
        let old = read_file(path)?;
        let cannot = |e: std::io::Error| format!("cannot open the event log {}: {e}", path.display());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(cannot)?;
        // A line torn by a crash is cut off, so that the next event starts a line of its own;
        // a whole event that only lacks its line's end (written by hand, or by another tool)
        // is kept, and its line ended.
        let text = std::fs::read(path).map_err(cannot)?;
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i as u64 + 1);
        let tail = &text[whole as usize..];
        let size = if !tail.is_empty() && serde_json::from_slice::<Event>(tail).is_ok() {
            (&file).write_all(b"\n").map_err(cannot)?;
            text.len() as u64 + 1
        } else {
            file.set_len(whole).map_err(cannot)?;
            whole
        };
        Ok(EventLog::with(old, Some((path.to_path_buf(), file, size)), hook))
    }

    fn with(old: Vec<Event>, file: Option<(PathBuf, std::fs::File, u64)>, hook: &HookConfig) -> EventLog {
        let next_seq = old.last().map(|e| e.seq + 1).unwrap_or(1);
        let skip = old.len().saturating_sub(KEEP_IN_MEMORY);
        let recent: VecDeque<Event> = old.into_iter().skip(skip).collect();
        let unwritten: Arc<AtomicU64> = Default::default();
        let hook_failures: Arc<AtomicU64> = Default::default();
        let writer = file.map(|(path, file, size)| {
            let (tx, rx) = sync_channel(WRITER_QUEUE);
            let unwritten = unwritten.clone();
            std::thread::Builder::new()
                .name("event-writer".into())
                .spawn(move || write_events(rx, path, file, size, &unwritten))
                .expect("spawn the event writer");
            tx
        });
        let hook = (hook.command.is_some() || hook.webhook.is_some()).then(|| {
            let (tx, rx) = sync_channel(HOOK_QUEUE);
            let waiting: Arc<AtomicUsize> = Default::default();
            let (cfg, failures, left) = (hook.clone(), hook_failures.clone(), waiting.clone());
            std::thread::Builder::new()
                .name("event-hook".into())
                .spawn(move || run_hooks(rx, cfg, &failures, &left))
                .expect("spawn the event hook thread");
            (hook.min_severity, tx, waiting)
        });
        EventLog {
            refusals: Default::default(),
            memory: Mutex::new(Memory {
                recent,
                next_seq,
                folded: HashMap::new(),
            }),
            followers: tokio::sync::broadcast::channel(1024).0,
            closing: tokio::sync::watch::channel(false).0,
            writer,
            hook,
            counts: Default::default(),
            unwritten,
            hook_failures,
        }
    }

    /// Records an event (unless it repeats one of the last minute) and returns it.
    pub fn record(&self, new: NewEvent) -> Option<Event> {
        self.record_at(new, Instant::now())
    }

    /// Records the refusal of a peer nobody authenticated, from `from` (counted against its
    /// [`source_of`]), within the budget of such events ([`REFUSALS_PER_SOURCE`],
    /// [`REFUSALS_PER_KIND`]); past it, the refusal is counted, and the count said in one event
    /// when the minute ends.
    pub fn record_refusal(&self, new: NewEvent, from: IpAddr) -> Option<Event> {
        self.record_refusal_at(new, &source_of(from).to_string(), Instant::now())
    }

    fn record_refusal_at(&self, new: NewEvent, source: &str, now: Instant) -> Option<Event> {
        self.end_refusal_window(now);
        let key = (new.kind.clone(), source.to_string());
        {
            let mut r = self.refusals.lock();
            r.since.get_or_insert(now);
            let in_kind = r.by_kind.get(&new.kind).copied().unwrap_or(0);
            let from_source = r.by_source.get(&key).copied().unwrap_or(0);
            if in_kind >= REFUSALS_PER_KIND || from_source >= REFUSALS_PER_SOURCE {
                self.counts[new.severity as usize].fetch_add(1, Ordering::Relaxed);
                let held = r.held_back.entry(new.kind).or_insert((new.severity, 0));
                held.0 = held.0.max(new.severity);
                held.1 += 1;
                return None;
            }
        }
        // Only what is recorded counts against the budget: a repeat folded into an event
        // costs nothing.
        let recorded = self.record_at(new, now)?;
        let mut r = self.refusals.lock();
        *r.by_kind.entry(key.0.clone()).or_default() += 1;
        *r.by_source.entry(key).or_default() += 1;
        Some(recorded)
    }

    /// Called every few seconds: says what a window of refusals that is over held back,
    /// even when nothing else happens after it.
    pub fn tick(&self) {
        self.end_refusal_window(Instant::now());
    }

    /// Once a window of refusals is over: a new one begins, and what the last held back is
    /// said, an event per kind.
    fn end_refusal_window(&self, now: Instant) {
        let (since, held_back) = {
            let mut r = self.refusals.lock();
            match r.since {
                Some(since) if now.duration_since(since) >= REPEAT_WINDOW => {
                    let held = std::mem::take(&mut r.held_back);
                    *r = Refusals::default();
                    (since, held)
                }
                _ => return,
            }
        };
        let secs = now.duration_since(since).as_secs();
        for (kind, (severity, n)) in held_back {
            self.record_at(
                NewEvent::new(
                    severity,
                    &kind,
                    format!(
                        "{n} more refusals of this kind in the {secs} s before this event were not recorded \
                         one by one (past {REFUSALS_PER_SOURCE} from one address, {REFUSALS_PER_KIND} in all, \
                         a minute)"
                    ),
                ),
                now,
            );
        }
    }

    fn record_at(&self, new: NewEvent, now: Instant) -> Option<Event> {
        self.end_refusal_window(now);
        let new = new.printable();
        self.counts[new.severity as usize].fetch_add(1, Ordering::Relaxed);
        let mut m = self.memory.lock();
        let key = (
            new.kind.clone(),
            new.pool.clone(),
            new.subject.clone(),
            new.message.clone(),
        );
        let mut repeats = 0;
        if let Some((last, folded)) = m.folded.get_mut(&key) {
            if now.duration_since(*last) < REPEAT_WINDOW {
                *folded += 1;
                return None;
            }
            repeats = std::mem::take(folded);
        }
        m.folded.insert(key, (now, 0));
        // Bounded: names in the key (an initiator's) come from whoever connects.
        if m.folded.len() > MAX_FOLDED {
            m.folded.retain(|_, (at, _)| now.duration_since(*at) < REPEAT_WINDOW);
            if m.folded.len() > MAX_FOLDED / 2 {
                m.folded.clear();
            }
        }
        let e = Event {
            seq: m.next_seq,
            time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| (d.as_millis() as f64) / 1000.0)
                .unwrap_or(0.0),
            severity: new.severity,
            kind: new.kind,
            pool: new.pool,
            subject: new.subject,
            message: new.message,
            repeats,
        };
        m.next_seq += 1;
        m.recent.push_back(e.clone());
        if m.recent.len() > KEEP_IN_MEMORY {
            m.recent.pop_front();
        }
        // Under the lock, so that followers and the file see events in their order.
        let _ = self.followers.send(e.clone());
        if let Some(w) = &self.writer {
            if w.try_send(e.clone()).is_err() {
                self.unwritten.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(m);
        log(&e);
        if let Some((min, tx, waiting)) = &self.hook {
            if e.severity >= *min {
                let room = e.severity >= Severity::Error || waiting.load(Ordering::Relaxed) < HOOK_QUEUE_BELOW_ERROR;
                // Counted before it is sent: the hook thread may take it at once.
                waiting.fetch_add(1, Ordering::Relaxed);
                let sent = room && tx.try_send(e.clone()).is_ok();
                if !sent {
                    waiting.fetch_sub(1, Ordering::Relaxed);
                    self.hook_failures.fetch_add(1, Ordering::Relaxed);
                    warn!(seq = e.seq, "event hook queue full: event not handed to the hook");
                }
            }
        }
        Some(e)
    }

    /// The events `f` admits: with `f.after`, the oldest `limit` after it; otherwise the
    /// newest `limit`. Oldest first either way.
    pub fn list(&self, f: &Filter, limit: usize) -> Vec<Event> {
        let m = self.memory.lock();
        let admitted = m.recent.iter().filter(|e| f.admits(e));
        if f.after.is_some() {
            admitted.take(limit).cloned().collect()
        } else {
            let mut v: Vec<Event> = admitted.rev().take(limit).cloned().collect();
            v.reverse();
            v
        }
    }

    /// The number the next event will have.
    pub fn next_seq(&self) -> u64 {
        self.memory.lock().next_seq
    }

    /// Every event recorded from now on.
    pub fn follow(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.followers.subscribe()
    }

    /// Ends every follower's stream (the daemon stops).
    pub fn close_followers(&self) {
        self.closing.send_replace(true);
    }

    /// Becomes true when the daemon stops.
    pub fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Events recorded since the daemon started (folded ones included), per severity.
    pub fn counts(&self) -> [(Severity, u64); 4] {
        Severity::ALL.map(|s| (s, self.counts[s as usize].load(Ordering::Relaxed)))
    }
}

/// Writes the event to the daemon's log at its severity.
fn log(e: &Event) {
    let pool = e.pool.as_deref().unwrap_or("");
    let subject = e.subject.as_deref().unwrap_or("");
    match e.severity {
        Severity::Info => info!(event = %e.kind, seq = e.seq, pool, subject, repeats = e.repeats, "{}", e.message),
        Severity::Warning => warn!(event = %e.kind, seq = e.seq, pool, subject, repeats = e.repeats, "{}", e.message),
        Severity::Error | Severity::Critical => {
            error!(event = %e.kind, seq = e.seq, severity = e.severity.as_str(), pool, subject, repeats = e.repeats, "{}", e.message)
        }
    }
}

/// The largest event number read back from the file: 2^53.
const MAX_SEQ: u64 = 1 << 53;

/// Reads the events in `path`, skipping lines that do not parse (a torn last line).
fn read_file(path: &Path) -> Result<Vec<Event>, String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read the event log {}: {e}", path.display())),
    };
    let mut events: Vec<Event> = Vec::new();
    let mut skipped = 0;
    for line in std::io::BufReader::new(f).split(b'\n') {
        let line = line.map_err(|e| format!("cannot read the event log {}: {e}", path.display()))?;
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Event>(&line) {
            // Numbers only go up: a line out of order is not trusted either, nor one whose
            // number no log reaches (past what a web page's numbers hold exactly).
            Ok(e) if e.seq <= MAX_SEQ && events.last().is_none_or(|l| e.seq > l.seq) => events.push(e),
            _ => skipped += 1,
        }
    }
    if skipped > 0 {
        warn!(file = %path.display(), skipped, "event log lines that could not be read were skipped");
    }
    Ok(events)
}

/// The writer thread: appends what arrives, syncs once per batch, and cuts the file to its
/// newest half when it passes MAX_FILE_BYTES.
fn write_events(rx: Receiver<Event>, path: PathBuf, mut file: std::fs::File, mut size: u64, unwritten: &AtomicU64) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let mut buf = Vec::new();
        for e in &batch {
            serde_json::to_writer(&mut buf, e).expect("serializable");
            buf.push(b'\n');
        }
        match file.write_all(&buf).and_then(|()| file.sync_data()) {
            Ok(()) => size += buf.len() as u64,
            Err(e) => {
                // What a failed write left (ENOSPC half way) goes, so the next batch starts a
                // line of its own.
                let _ = file.set_len(size);
                unwritten.fetch_add(batch.len() as u64, Ordering::Relaxed);
                error!(file = %path.display(), error = %e, "cannot write to the event log");
                continue;
            }
        }
        if size > MAX_FILE_BYTES {
            match cut_to_newest_half(&path) {
                Ok((f, s)) => (file, size) = (f, s),
                Err(e) => error!(file = %path.display(), error = %e, "cannot cut the event log"),
            }
        }
    }
}

/// Rewrites `path` with the newer half of its lines, crash-safely (temporary file, sync,
/// rename, directory sync), and returns it opened for appending.
fn cut_to_newest_half(path: &Path) -> std::io::Result<(std::fs::File, u64)> {
    let text = std::fs::read(path)?;
    let mut at = (text.len() / 2).max(1);
    while at < text.len() && text[at - 1] != b'\n' {
        at += 1;
    }
    let kept = &text[at.min(text.len())..];
    let tmp = path.with_extension("jsonl.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(kept)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    let f = std::fs::OpenOptions::new().append(true).open(path)?;
    Ok((f, kept.len() as u64))
}

/// The hook thread: runs the command and posts to the webhook for each event, in order.
fn run_hooks(rx: Receiver<Event>, cfg: HookConfig, failures: &AtomicU64, waiting: &AtomicUsize) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
    while let Ok(e) = rx.recv() {
        waiting.fetch_sub(1, Ordering::Relaxed);
        let json = serde_json::to_vec(&e).expect("serializable");
        if let Some(cmd) = &cfg.command {
            if let Err(why) = run_command(cmd, &e, &json) {
                failures.fetch_add(1, Ordering::Relaxed);
                warn!(seq = e.seq, hook = %cmd.display(), error = %why, "event hook failed");
            }
        }
        if let Some(w) = &cfg.webhook {
            let r = match &rt {
                Ok(rt) => rt.block_on(async {
                    tokio::time::timeout(HOOK_TIMEOUT, post(w, json))
                        .await
                        .unwrap_or_else(|_| Err(format!("no answer within {} s", HOOK_TIMEOUT.as_secs())))
                }),
                Err(err) => Err(format!("no runtime for the webhook: {err}")),
            };
            if let Err(why) = r {
                failures.fetch_add(1, Ordering::Relaxed);
                warn!(seq = e.seq, webhook = %w.authority, error = %why, "event webhook failed");
            }
        }
    }
}

fn run_command(cmd: &Path, e: &Event, json: &[u8]) -> Result<(), String> {
    let mut child = std::process::Command::new(cmd)
        .env("TESSERA_EVENT_SEQ", e.seq.to_string())
        .env("TESSERA_EVENT_KIND", &e.kind)
        .env("TESSERA_EVENT_SEVERITY", e.severity.as_str())
        .env("TESSERA_EVENT_POOL", e.pool.as_deref().unwrap_or(""))
        .env("TESSERA_EVENT_SUBJECT", e.subject.as_deref().unwrap_or(""))
        .env("TESSERA_EVENT_MESSAGE", &e.message)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|err| format!("cannot run it: {err}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input is not an error.
        let _ = stdin.write_all(json).and_then(|()| stdin.write_all(b"\n"));
    }
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("it ended with {status}")),
            Ok(None) if start.elapsed() > HOOK_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("killed after {} s", HOOK_TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(err) => return Err(err.to_string()),
        }
    }
}

async fn post(w: &Webhook, json: Vec<u8>) -> Result<(), String> {
    use http_body_util::{BodyExt, Full};
    let sock = tokio::net::TcpStream::connect(&w.authority)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::post(&w.path)
        .header("host", &w.authority)
        .header("content-type", "application/json")
        .body(Full::new(hyper::body::Bytes::from(json)))
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, msg: &str) -> NewEvent {
        NewEvent::new(Severity::Warning, kind, msg).pool("p")
    }

    fn wait_for(mut f: impl FnMut() -> bool) {
        for _ in 0..3000 {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("timed out");
    }

    #[test]
    fn control_characters_and_long_names_are_made_printable() {
        let log = EventLog::in_memory();
        let hostile = format!("iqn.x\x1b]0;owned\x07\nfake line\r{}", "a".repeat(5000));
        let e = log
            .record(
                NewEvent::new(Severity::Warning, "iscsi.login_refused", format!("refused {hostile}"))
                    .subject(hostile.clone()),
            )
            .unwrap();
        for text in [e.subject.as_deref().unwrap(), e.message.as_str()] {
            assert!(!text.chars().any(char::is_control), "{text:?}");
            assert!(text.chars().count() <= MAX_FIELD_CHARS + 1);
            assert!(text.ends_with('…'));
        }
        assert!(e
            .subject
            .as_deref()
            .unwrap()
            .starts_with("iqn.x\u{fffd}]0;owned\u{fffd}\u{fffd}fake line\u{fffd}a"));
        // Plain names pass untouched.
        let plain = log
            .record(NewEvent::new(Severity::Info, "vdisk.created", "vdisk vm1 created").subject("p/vm1 é"))
            .unwrap();
        assert_eq!(
            (plain.subject.as_deref(), plain.message.as_str()),
            (Some("p/vm1 é"), "vdisk vm1 created")
        );
    }

    #[test]
    fn events_are_numbered_kept_filtered_and_survive_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("events.jsonl");
        let log = EventLog::open(&path, &HookConfig::default()).unwrap();
        let a = log.record(ev("disk.failed", "disk /d1 failed")).unwrap();
        let b = log
            .record(NewEvent::new(Severity::Info, "pool.created", "made").pool("q"))
            .unwrap();
        assert_eq!((a.seq, b.seq), (1, 2));
        let all = log.list(&Filter::default(), 10);
        assert_eq!(all, vec![a.clone(), b.clone()]);
        let warn_up = Filter {
            min_severity: Some(Severity::Warning),
            ..Default::default()
        };
        assert_eq!(log.list(&warn_up, 10), vec![a.clone()]);
        let in_q = Filter {
            pool: Some("q".into()),
            ..Default::default()
        };
        assert_eq!(log.list(&in_q, 10), vec![b.clone()]);
        let after_a = Filter {
            after: Some(1),
            ..Default::default()
        };
        assert_eq!(log.list(&after_a, 10), vec![b.clone()]);
        assert_eq!(log.list(&Filter::default(), 1), vec![b.clone()], "the newest");
        wait_for(|| std::fs::read_to_string(&path).unwrap().lines().count() == 2);
        drop(log);

        // A crash in the middle of a line: the torn line is skipped, numbering goes on.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"seq\":3,\"time\":1.0,\"sev").unwrap();
        drop(f);
        let log = EventLog::open(&path, &HookConfig::default()).unwrap();
        assert_eq!(log.list(&Filter::default(), 10), vec![a, b]);
        let c = log.record(ev("pool.degraded", "degraded")).unwrap();
        assert_eq!(c.seq, 3);
        wait_for(|| {
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("\"kind\":\"pool.degraded\"")
        });
        drop(log);
        let log = EventLog::open(&path, &HookConfig::default()).unwrap();
        assert_eq!(log.list(&Filter::default(), 10).last().unwrap().seq, 3);
        assert_eq!(log.next_seq(), 4);
        drop(log);

        // A whole event whose line lacks its end is kept, and the next one starts a line of
        // its own; one numbered past what a log reaches is not read.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"seq\":4,\"time\":1.0,\"severity\":\"info\",\"kind\":\"x.y\",\"message\":\"m\"}")
            .unwrap();
        drop(f);
        let log = EventLog::open(&path, &HookConfig::default()).unwrap();
        assert_eq!(log.list(&Filter::default(), 10).last().unwrap().seq, 4);
        log.record(ev("pool.healthy", "healthy")).unwrap();
        wait_for(|| std::fs::read_to_string(&path).unwrap().contains("pool.healthy"));
        drop(log);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(
            b"{\"seq\":18446744073709551615,\"time\":1.0,\"severity\":\"info\",\"kind\":\"x.y\",\"message\":\"m\"}\n",
        )
        .unwrap();
        drop(f);
        let log = EventLog::open(&path, &HookConfig::default()).unwrap();
        assert_eq!(log.next_seq(), 6);
        let lines: Vec<Event> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert_eq!(
            lines.iter().map(|e| e.seq).take(5).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn a_repeated_event_is_folded_into_the_next_one_past_the_window() {
        let log = EventLog::in_memory();
        let t0 = Instant::now();
        assert!(log.record_at(ev("iscsi.login_refused", "x"), t0).is_some());
        for s in 1..30 {
            assert!(log
                .record_at(ev("iscsi.login_refused", "x"), t0 + Duration::from_secs(s))
                .is_none());
        }
        // Another message is another event.
        assert!(log
            .record_at(ev("iscsi.login_refused", "y"), t0 + Duration::from_secs(1))
            .is_some());
        let next = log
            .record_at(
                ev("iscsi.login_refused", "x"),
                t0 + REPEAT_WINDOW + Duration::from_secs(1),
            )
            .unwrap();
        assert_eq!(next.repeats, 29);
        assert_eq!(log.list(&Filter::default(), 100).len(), 3);
        assert_eq!(log.counts()[1], (Severity::Warning, 32), "counted, folded or not");
        // Names chosen by whoever connects cannot grow the map without bound.
        for i in 0..MAX_FOLDED * 2 {
            log.record_at(ev("iscsi.login_refused", &format!("name {i}")), t0);
            log.record_at(ev("iscsi.login_refused", &format!("name {i}")), t0);
        }
        assert!(log.memory.lock().folded.len() <= MAX_FOLDED + 1);
    }

    /// A flood of refusals from peers nobody authenticated, each with a name of its own (so
    /// that nothing folds), from one address and from many: at most the budget is recorded
    /// one by one, the rest said in one event when the minute ends, and the events recorded
    /// before are still in memory.
    #[test]
    fn a_flood_of_refusals_is_held_to_its_budget() {
        let log = EventLog::in_memory();
        let t0 = Instant::now();
        let before = log.record_at(ev("disk.failed", "the disk that matters"), t0).unwrap();
        let refused = |i: usize| ev("iscsi.login_refused", &format!("login of iqn.x:{i} refused"));
        let mut recorded = 0;
        for i in 0..1000 {
            recorded += log.record_refusal_at(refused(i), "192.0.2.1", t0).is_some() as u64;
        }
        assert_eq!(recorded, REFUSALS_PER_SOURCE, "one address");
        for i in 0..KEEP_IN_MEMORY * 2 {
            let from = format!("2001:db8:{:x}::", i);
            recorded += log.record_refusal_at(refused(1000 + i), &from, t0).is_some() as u64;
        }
        assert_eq!(recorded, REFUSALS_PER_KIND, "every address");
        // Other kinds have budgets of their own.
        assert!(log
            .record_refusal_at(ev("replica.peer_refused", "no key"), "192.0.2.1", t0)
            .is_some());
        assert!(log.list(&Filter::default(), KEEP_IN_MEMORY).contains(&before));
        // The minute over, the next event (of whatever kind), or the daemon's tick, comes after
        // one that says how many were held back; then the budgets start again.
        let later = t0 + REPEAT_WINDOW;
        log.end_refusal_window(later - Duration::from_secs(1));
        assert_eq!(
            log.list(&Filter::default(), 1)[0].kind,
            "replica.peer_refused",
            "not yet"
        );
        log.end_refusal_window(later);
        let said = log.list(&Filter::default(), 1).remove(0);
        assert_eq!(said.kind, "iscsi.login_refused");
        let held = (1000 + KEEP_IN_MEMORY * 2) as u64 - REFUSALS_PER_KIND;
        assert!(
            said.message
                .starts_with(&format!("{held} more refusals of this kind in the 60 s")),
            "{}",
            said.message
        );
        assert!(log.record_refusal_at(refused(0), "192.0.2.1", later).is_some());
        let total = (1000 + KEEP_IN_MEMORY * 2 + 1 + 1 + 1 + 1) as u64;
        assert_eq!(
            log.counts().iter().map(|(_, n)| n).sum::<u64>(),
            total,
            "every one counted"
        );
    }

    #[test]
    fn followers_see_every_event_in_order() {
        let log = EventLog::in_memory();
        let mut rx = log.follow();
        for i in 0..5 {
            log.record(ev("job.finished", &format!("job {i}")));
        }
        let seqs: Vec<u64> = (0..5).map(|_| rx.try_recv().unwrap().seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_file_is_cut_to_its_newest_half_and_stays_readable() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("events.jsonl");
        let mut text = String::new();
        for seq in 1..=1000u64 {
            let e = Event {
                seq,
                time: seq as f64,
                severity: Severity::Info,
                kind: "t".into(),
                pool: None,
                subject: None,
                message: "m".repeat(50),
                repeats: 0,
            };
            text.push_str(&serde_json::to_string(&e).unwrap());
            text.push('\n');
        }
        std::fs::write(&path, &text).unwrap();
        std::fs::write(&path, b"x").unwrap();
        assert_eq!(cut_to_newest_half(&path).unwrap().1, 0, "a file shrunk from outside");
        std::fs::write(&path, &text).unwrap();
        let (_, size) = cut_to_newest_half(&path).unwrap();
        let kept = read_file(&path).unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        assert!(kept.len() >= 499 && kept.len() <= 501, "{}", kept.len());
        assert_eq!(kept.last().unwrap().seq, 1000);
        assert_eq!(kept[0].seq, 1001 - kept.len() as u64, "whole lines, no gap");
    }

    /// A hook that falls behind under a burst of warnings drops warnings past three quarters
    /// of its queue, and is still handed the error that comes after them.
    #[test]
    fn a_hook_that_falls_behind_drops_warnings_before_errors() {
        let d = tempfile::tempdir().unwrap();
        let script = d.path().join("hook.sh");
        // Held while the gate is there; every waiting run passes at once after.
        let gate = d.path().join("gate");
        std::fs::write(&gate, "").unwrap();
        std::fs::write(
            &script,
            format!("#!/bin/sh\nwhile [ -e {} ]; do sleep 0.05; done\n", gate.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let hook = HookConfig {
            command: Some(script),
            webhook: None,
            min_severity: Severity::Info,
        };
        let log = EventLog::with(Vec::new(), None, &hook);
        for i in 0..HOOK_QUEUE {
            log.record(ev("pool.degraded", &format!("warning {i}")));
        }
        let dropped = log.hook_failures.load(Ordering::Relaxed);
        assert!(
            dropped as usize >= HOOK_QUEUE - HOOK_QUEUE_BELOW_ERROR - 1,
            "{dropped} warnings dropped"
        );
        log.record(NewEvent::new(
            Severity::Critical,
            "disk.failed",
            "the disk that matters",
        ));
        assert_eq!(
            log.hook_failures.load(Ordering::Relaxed),
            dropped,
            "the critical event was dropped"
        );
        std::fs::remove_file(&gate).unwrap();
    }

    #[test]
    fn the_hook_command_gets_the_event_as_json_and_in_its_environment() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("hook.out");
        let script = d.path().join("hook.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n{{ cat; echo \"$TESSERA_EVENT_KIND $TESSERA_EVENT_SEVERITY $TESSERA_EVENT_POOL\"; }} >> {}\n",
                out.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let hook = HookConfig {
            command: Some(script),
            webhook: None,
            min_severity: Severity::Warning,
        };
        let log = EventLog::with(Vec::new(), None, &hook);
        log.record(NewEvent::new(
            Severity::Info,
            "pool.created",
            "below the hook's severity",
        ));
        log.record(NewEvent::new(Severity::Error, "disk.failed", "disk /d2 failed").pool("tank"));
        wait_for(|| std::fs::read_to_string(&out).is_ok_and(|s| s.lines().count() == 2));
        let text = std::fs::read_to_string(&out).unwrap();
        let mut lines = text.lines();
        let json: Event = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!((json.kind.as_str(), json.seq), ("disk.failed", 2));
        assert_eq!(lines.next().unwrap(), "disk.failed error tank");
        assert_eq!(log.hook_failures.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_webhook_is_posted_the_event_and_a_refusal_counts_as_a_failure() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (n, sock) in listener.incoming().enumerate() {
                let mut sock = sock.unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !String::from_utf8_lossy(&got).contains("}") {
                    let k = sock.read(&mut buf).unwrap();
                    if k == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..k]);
                }
                let status = if n == 0 {
                    "204 No Content"
                } else {
                    "500 Internal Server Error"
                };
                let _ = sock.write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes());
                tx.send(String::from_utf8_lossy(&got).to_string()).unwrap();
            }
        });
        let hook = HookConfig {
            command: None,
            webhook: Some(Webhook::parse(&format!("http://{addr}/alerts")).unwrap()),
            min_severity: Severity::Info,
        };
        let log = EventLog::with(Vec::new(), None, &hook);
        log.record(NewEvent::new(Severity::Critical, "pool.failed", "pool p failed").pool("p"));
        let req = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(req.starts_with("POST /alerts HTTP/1.1"), "{req}");
        assert!(req.contains("\"kind\":\"pool.failed\""), "{req}");
        assert!(req.to_ascii_lowercase().contains("content-type: application/json"));
        log.record(NewEvent::new(Severity::Info, "pool.created", "again"));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        wait_for(|| log.hook_failures.load(Ordering::Relaxed) == 1);
    }

    #[test]
    fn webhook_urls_are_checked() {
        assert_eq!(
            Webhook::parse("http://alerts:9000/tessera").unwrap(),
            Webhook {
                authority: "alerts:9000".into(),
                path: "/tessera".into()
            }
        );
        assert_eq!(Webhook::parse("http://alerts").unwrap().authority, "alerts:80");
        assert!(Webhook::parse("https://alerts/x").unwrap_err().contains("event_hook"));
        assert!(Webhook::parse("http:///x").is_err());
        assert_eq!(Severity::parse("Error").unwrap(), Severity::Error);
        assert!(Severity::parse("loud").is_err());
    }
}
