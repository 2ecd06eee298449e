//! Ceph RADOS through librados' C API: a cluster handle, a pool's I/O context, reads and
//! writes of objects, and compound write operations that apply atomically on the object's
//! primary OSD (data, extended attributes and omap keys together, guarded by a compare of an
//! attribute), and writes ordered by a sequence the OSD checks. A pool on RADOS keeps its
//! metadata beside its data this way, and a gateway's epoch (a guard's value, or its writes'
//! sequence) refuses a stale owner's writes; blocklisting the old owner's client address
//! fences it off altogether.
//!
//! Only the calls Tessera uses are bound, by hand: the `ceph` crate on crates.io binds all of
//! librados but pins old dependencies (nom 5, nix 0.18) and is barely kept, and a dozen
//! declarations are easier to audit than a generated binding of the whole header.
//!
//! Built only with the `librados` feature.
#![cfg(feature = "librados")]

mod background;
mod batch;
mod error;
mod ffi;
mod listing;
mod ops;

pub use background::ReadCallback;
pub use batch::ReadExtent;
pub use error::{RadosError, Result};
pub use listing::Objects;
pub use ops::{OmapPage, PendingWrite, WriteCallback, WriteOp, XattrCmp};

use ops::ReadOmap;

use std::collections::BTreeSet;
use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ffi::*;

/// The options of a client's configuration that name files: those it reads (its keys),
/// writes or makes (its log, its admin socket, the file its service thread touches while
/// healthy) and loads code from (plugins); and who else may use its admin socket, which
/// can change any option, these too, once the client runs.
pub const FILE_OPTIONS: &[&str] = &[
    "keyring",
    "keyfile",
    "admin_socket",
    "admin_socket_mode",
    "heartbeat_file",
    "log_file",
    "run_dir",
    "crash_dir",
    "plugin_dir",
    "erasure_code_dir",
];

/// A connection to a Ceph cluster as one client (`client.NAME`).
pub struct Cluster {
    handle: rados_t,
    /// Files options name through their descriptors ([`Vetted`]): open while librados may
    /// read them, so that the number never names another file meanwhile.
    _kept: Vec<OwnedFd>,
}

/// What a vetting of a configuration file's options gives back: values to set instead of
/// those the file gave (a file checked, named `/proc/self/fd/N`), and the descriptors they
/// name, kept open as long as the connection.
#[derive(Debug, Default)]
pub struct Vetted {
    pub instead: Vec<(String, String)>,
    pub keep: Vec<OwnedFd>,
}

// librados' cluster handle is thread-safe once connected.
unsafe impl Send for Cluster {}
unsafe impl Sync for Cluster {}

pub(crate) fn cstr(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| RadosError::Invalid(format!("{what} {s:?} holds a NUL byte")))
}

/// The error of a call on `on` through `io` that failed with `errno`: an `ENOENT` is the
/// pool's ([`RadosError::PoolGone`]) where this client's map of the cluster no longer holds
/// the pool `io` was opened on (pool ids are never reused; librados decided the pool was
/// gone from that very map), the object's where it does. Looked up in the map this client
/// has, without waiting for a newer one: called on librados' completion thread too.
pub(crate) fn io_error(io: rados_ioctx_t, op: &str, on: &str, errno: libc::c_int) -> RadosError {
    if errno == libc::ENOENT {
        let mut aligned: libc::c_int = 0;
        // SAFETY: an open context (the caller's) and an out-pointer we own.
        let rc = unsafe { rados_ioctx_pool_requires_alignment2(io, &mut aligned) };
        match rc {
            0 => {}
            r if r == -libc::ENOENT => {
                return RadosError::PoolGone {
                    op: op.to_string(),
                    on: on.to_string(),
                    // SAFETY: an open context; only reads what it holds.
                    pool_id: unsafe { rados_ioctx_get_id(io) },
                };
            }
            // Not known whether the object or the pool is missing (the client shut down):
            // an error, never an object never written.
            r => {
                return RadosError::Call {
                    op: format!("{op} (missing, and its pool could not be looked up)"),
                    on: on.to_string(),
                    errno: -r,
                }
            }
        }
    }
    RadosError::Call {
        op: op.to_string(),
        on: on.to_string(),
        errno,
    }
}

/// [`check`] for a call on `on` through `io` ([`io_error`]).
pub(crate) fn check_io(io: rados_ioctx_t, rc: libc::c_int, op: &str, on: &str) -> Result<libc::c_int> {
    match rc < 0 {
        true => Err(io_error(io, op, on, -rc)),
        false => Ok(rc),
    }
}

pub(crate) fn check(rc: libc::c_int, op: &str, on: &str) -> Result<libc::c_int> {
    if rc < 0 {
        Err(RadosError::Call {
            op: op.to_string(),
            on: on.to_string(),
            errno: -rc,
        })
    } else {
        Ok(rc)
    }
}

impl Cluster {
    /// Connects as `client.<client>` with the configuration file `conf` (its keyring, monitors
    /// and timeouts), then applies `options` (name, value) over it.
    pub fn connect(conf: &str, client: &str, options: &[(&str, &str)]) -> Result<Cluster> {
        Self::open(
            conf,
            client,
            options,
            None::<fn(&[(&'static str, String)]) -> std::result::Result<Vetted, String>>,
        )
    }

    /// As [`connect`](Self::connect), but `vet` first sees which of [`FILE_OPTIONS`] the file
    /// changed, with the values the client would use (metavariables such as `$name`
    /// expanded), and may refuse them: a configuration file someone else could write must not
    /// lead the client to read, write or load files elsewhere. Every one of them is then set
    /// to the value vetted, or to the one `vet` returns for it instead (a file checked, named
    /// through its descriptor), above what the monitors' configuration database may say at
    /// connection: a file that names a monitor names who configures the client too.
    pub fn connect_vetted(
        conf: &str,
        client: &str,
        options: &[(&str, &str)],
        vet: impl FnOnce(&[(&'static str, String)]) -> std::result::Result<Vetted, String>,
    ) -> Result<Cluster> {
        Self::open(conf, client, options, Some(vet))
    }

    fn open(
        conf: &str,
        client: &str,
        options: &[(&str, &str)],
        vet: Option<impl FnOnce(&[(&'static str, String)]) -> std::result::Result<Vetted, String>>,
    ) -> Result<Cluster> {
        let name = cstr("client name", &format!("client.{client}"))?;
        let cluster = cstr("cluster name", "ceph")?;
        let mut handle: rados_t = ptr::null_mut();
        // SAFETY: out-pointer to a handle we own; the strings live across the call.
        check(
            unsafe { rados_create2(&mut handle, cluster.as_ptr(), name.as_ptr(), 0) },
            "create",
            client,
        )?;
        // From here on the handle is ours to shut down, whatever fails.
        let mut c = Cluster {
            handle,
            _kept: Vec::new(),
        };
        let path = cstr("configuration file", conf)?;
        // An option this librados does not know (ENOENT) names nothing it follows.
        let known = |r: Result<String>| match r {
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(None),
            r => r.map(Some),
        };
        let defaults = FILE_OPTIONS
            .iter()
            .map(|o| known(c.conf_get(o)))
            .collect::<Result<Vec<Option<String>>>>()?;
        // SAFETY: a live handle and a NUL-terminated path.
        check(
            unsafe { rados_conf_read_file(c.handle, path.as_ptr()) },
            "read configuration",
            conf,
        )?;
        let mut changed = Vec::new();
        let mut vetted = Vec::new();
        for (o, default) in FILE_OPTIONS.iter().zip(defaults) {
            if let Some(default) = default {
                let value = c.conf_get(o)?;
                if value != default {
                    changed.push((*o, value.clone()));
                }
                vetted.push((*o, value));
            }
        }
        if let Some(vet) = vet {
            let Vetted { instead, keep } = vet(&changed).map_err(RadosError::Invalid)?;
            c._kept = keep;
            // Options set here rank above the monitors' (which rank above defaults only).
            for (o, value) in &vetted {
                let value = instead.iter().find(|(i, _)| i == o).map_or(value, |(_, v)| v);
                c.conf_set(o, value)?;
            }
        }
        for (k, v) in options {
            c.conf_set(k, v)?;
        }
        // SAFETY: a configured handle.
        check(unsafe { rados_connect(c.handle) }, "connect", conf)?;
        Ok(c)
    }

    /// Sets a configuration option, above what the file and the monitors say.
    fn conf_set(&self, option: &str, value: &str) -> Result<()> {
        let (ck, cv) = (cstr("option", option)?, cstr("option value", value)?);
        // SAFETY: a live handle and NUL-terminated strings.
        check(
            unsafe { rados_conf_set(self.handle, ck.as_ptr(), cv.as_ptr()) },
            "set option",
            option,
        )?;
        Ok(())
    }

    /// The value of a configuration option as the client would use it.
    fn conf_get(&self, option: &str) -> Result<String> {
        let o = cstr("option", option)?;
        let mut len = 4096;
        loop {
            let mut buf = vec![0u8; len];
            // SAFETY: a live handle, a NUL-terminated name and a buffer of `len` bytes.
            let rc = unsafe { rados_conf_get(self.handle, o.as_ptr(), buf.as_mut_ptr().cast(), len) };
            if rc == -libc::ENAMETOOLONG && len < 1 << 20 {
                len *= 4;
                continue;
            }
            check(rc, "get option", option)?;
            let end = buf.iter().position(|&b| b == 0).unwrap_or(len);
            return Ok(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
    }

    /// Creates a replicated pool with the cluster's defaults. An existing pool is an error
    /// (`EEXIST`).
    pub fn create_pool(&self, pool: &str) -> Result<()> {
        let p = cstr("pool", pool)?;
        // SAFETY: a connected handle and a NUL-terminated name.
        check(
            unsafe { rados_pool_create(self.handle, p.as_ptr()) },
            "create pool",
            pool,
        )
        .map(drop)
    }

    pub fn delete_pool(&self, pool: &str) -> Result<()> {
        let p = cstr("pool", pool)?;
        // SAFETY: as above.
        check(
            unsafe { rados_pool_delete(self.handle, p.as_ptr()) },
            "delete pool",
            pool,
        )
        .map(drop)
    }

    /// An I/O context on `pool`.
    pub fn pool(&self, pool: &str) -> Result<Pool<'_>> {
        Ok(Pool {
            io: self.open_io(pool)?,
            order: AtomicU64::new(0),
            name: pool.to_string(),
            _cluster: Holds::Borrowed(self),
        })
    }

    /// An I/O context on `pool` that keeps the cluster handle alive itself, for a user that
    /// must own its context (a disk handed to the engine).
    pub fn shared_pool(cluster: &std::sync::Arc<Cluster>, pool: &str) -> Result<Pool<'static>> {
        Ok(Pool {
            io: cluster.open_io(pool)?,
            order: AtomicU64::new(0),
            name: pool.to_string(),
            _cluster: Holds::Shared(cluster.clone()),
        })
    }

    fn open_io(&self, pool: &str) -> Result<rados_ioctx_t> {
        let p = cstr("pool", pool)?;
        let mut io: rados_ioctx_t = ptr::null_mut();
        // SAFETY: a connected handle, a NUL-terminated name, an out-pointer we own.
        check(
            unsafe { rados_ioctx_create(self.handle, p.as_ptr(), &mut io) },
            "open pool",
            pool,
        )?;
        Ok(io)
    }

    /// This client's address as the monitors know it (what `blocklist` takes).
    pub fn address(&self) -> Result<String> {
        let mut out: *mut libc::c_char = ptr::null_mut();
        // SAFETY: a connected handle; librados allocates the string, which we free.
        check(
            unsafe { rados_getaddrs(self.handle, &mut out) },
            "get address",
            "client",
        )?;
        if out.is_null() {
            return Err(RadosError::Invalid("librados gave no client address".into()));
        }
        // SAFETY: librados returned a NUL-terminated string it allocated with malloc.
        let s = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
        unsafe { libc::free(out as *mut libc::c_void) };
        Ok(s)
    }

    /// Fences the client at `address` off the cluster for `seconds` (0: the cluster's
    /// default). librados waits for the newest OSD map before it returns; each placement
    /// group refuses the fenced client once it holds that map, and an operation of this
    /// client on an object brings the object's placement group to it. So the fenced client
    /// may still write an object only before this client's first operation on it, as if the
    /// write had landed before the fence.
    pub fn blocklist(&self, address: &str, seconds: u32) -> Result<()> {
        let a = cstr("address", address)?;
        // SAFETY: a connected handle; librados only reads the address despite its `char *`.
        check(
            unsafe { rados_blocklist_add(self.handle, a.as_ptr() as *mut libc::c_char, seconds) },
            "blocklist",
            address,
        )
        .map(drop)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and every Pool borrowing it is gone.
        unsafe { rados_shutdown(self.handle) }
    }
}

/// Marks a context's order while librados is being given it (`Pool::order`).
const SETTING: u64 = 1 << 63;

/// An I/O context on one pool.
pub struct Pool<'c> {
    io: rados_ioctx_t,
    /// The sequence its writes are ordered by ([`order_writes`](Pool::order_writes)): 0 for
    /// none, `SETTING | sequence` while librados is being given it (writes are not ordered
    /// yet), the sequence once librados carries it (every compound write is then flagged
    /// `ORDERSNAP`). One value, so that no write is flagged before its context carries the
    /// sequence; a context serves one writer's order, set once.
    order: AtomicU64,
    name: String,
    _cluster: Holds<'c>,
}

/// How a pool keeps its cluster handle alive for as long as it is open.
enum Holds<'c> {
    Borrowed(#[allow(dead_code)] &'c Cluster),
    Shared(#[allow(dead_code)] std::sync::Arc<Cluster>),
}

unsafe impl Send for Pool<'_> {}
unsafe impl Sync for Pool<'_> {}

impl Pool<'_> {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Replaces the object's data with `data` (creating it). A compound write, so that it
    /// is ordered as every other write through this context ([`order_writes`](Self::order_writes)).
    pub fn write_full(&self, oid: &str, data: &[u8]) -> Result<()> {
        self.operate(oid, &WriteOp::new().write_full(data))
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many there were.
    pub fn read(&self, oid: &str, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let o = cstr("object", oid)?;
        // SAFETY: a live context and a buffer of `buf.len()` writable bytes.
        let n = check_io(
            self.io,
            unsafe {
                rados_read(
                    self.io,
                    o.as_ptr(),
                    buf.as_mut_ptr() as *mut libc::c_char,
                    buf.len(),
                    offset,
                )
            },
            "read",
            oid,
        )?;
        Ok(n as usize)
    }

    /// Reads every extent, all of them in flight at once (one compound operation per
    /// object); returns for each how many bytes the object had there, or the error (an
    /// object that does not exist fails each of its extents with `ENOENT`, as
    /// [`read`](Self::read) does).
    pub fn read_extents(&self, extents: &mut [ReadExtent<'_>]) -> Vec<Result<usize>> {
        batch::read_extents(self.io, extents)
    }

    /// Starts reading `len` bytes at `offset` of `oid` into `buf` and returns; `then` gets
    /// how many bytes the object had there, or the error (`ENOENT` for an object that does
    /// not exist), once, from librados' thread (or from this one if the read could not
    /// start). A read sent after writes of this client to the object sees them.
    ///
    /// # Safety
    /// `buf` must be valid for `len` bytes, and nothing else may read or write them, until
    /// `then` is called; the pool must stay open until then.
    pub unsafe fn read_then(&self, oid: &str, offset: u64, buf: *mut u8, len: usize, then: ReadCallback) {
        // SAFETY: passed on to the caller.
        unsafe { background::read_then(self.io, oid, offset, buf, len, then) }
    }

    /// The object's size, or `None` if it does not exist.
    pub fn size(&self, oid: &str) -> Result<Option<u64>> {
        let o = cstr("object", oid)?;
        let (mut size, mut mtime) = (0u64, 0 as libc::time_t);
        // SAFETY: a live context and out-pointers we own.
        match check_io(
            self.io,
            unsafe { rados_stat(self.io, o.as_ptr(), &mut size, &mut mtime) },
            "stat",
            oid,
        ) {
            Ok(_) => Ok(Some(size)),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes the object; ordered as every other write through this context.
    pub fn remove(&self, oid: &str) -> Result<()> {
        self.operate(oid, &WriteOp::new().remove())
    }

    /// An extended attribute's value, or `None` if the object or the attribute is missing.
    pub fn xattr(&self, oid: &str, name: &str) -> Result<Option<Vec<u8>>> {
        let (o, n) = (cstr("object", oid)?, cstr("attribute", name)?);
        let mut buf = vec![0u8; 4096];
        // SAFETY: a live context, NUL-terminated names and a buffer of `buf.len()` bytes.
        let rc = unsafe {
            rados_getxattr(
                self.io,
                o.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        match check_io(self.io, rc, "get attribute", oid) {
            Ok(len) => {
                buf.truncate(len as usize);
                Ok(Some(buf))
            }
            Err(e) if matches!(e.errno(), Some(libc::ENOENT) | Some(libc::ENODATA)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// From now on every compound write through this context carries `sequence`, and an
    /// object refuses it (`RadosError::is_out_of_order`) once a write carrying a higher one
    /// was applied to it: the OSD compares the two in the write itself, at no cost of its
    /// own (the sequence is a snapshot context's, without snapshots, which RADOS keeps per
    /// object and checks for writes flagged `ORDERSNAP`). The pool must use self-managed
    /// snapshots ([`use_self_managed_snapshots`](Self::use_self_managed_snapshots)): in a
    /// pool with pool snapshots the OSDs ignore a client's sequence.
    pub fn order_writes(&self, sequence: u64) -> Result<()> {
        if sequence == 0 || sequence & SETTING != 0 {
            return Err(RadosError::Invalid(format!(
                "a write sequence is from 1 to {}, not {sequence}",
                SETTING - 1
            )));
        }
        loop {
            match self
                .order
                .compare_exchange(0, SETTING | sequence, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(same) if same == sequence => return Ok(()),
                // Another caller is giving librados the same sequence: its outcome is ours.
                Err(setting) if setting == SETTING | sequence => std::thread::yield_now(),
                // Another writer's order on a shared context would be changed under it.
                Err(other) => {
                    return Err(RadosError::Invalid(format!(
                        "the writes through this context of pool {} are ordered by {} already",
                        self.name,
                        other & !SETTING
                    )))
                }
            }
        }
        // SAFETY: a live context; no snapshots, so no array is read.
        let rc = unsafe { rados_ioctx_selfmanaged_snap_set_write_ctx(self.io, sequence, ptr::null_mut(), 0) };
        let set = check(rc, "set the write sequence of", &self.name);
        self.order
            .store(if set.is_ok() { sequence } else { 0 }, Ordering::Release);
        set.map(drop)
    }

    /// The flags a compound write through this context carries: `ORDERSNAP` once its
    /// context carries a sequence.
    fn write_flags(&self) -> libc::c_int {
        match self.order.load(Ordering::Acquire) {
            0 => LIBRADOS_OPERATION_NOFLAG,
            o if o & SETTING != 0 => LIBRADOS_OPERATION_NOFLAG,
            _ => LIBRADOS_OPERATION_ORDERSNAP,
        }
    }

    /// Puts the pool in the self-managed snapshot mode (as librbd does for its images), in
    /// which the OSDs honour a client's write sequence ([`order_writes`](Self::order_writes))
    /// and nobody can take a pool snapshot, which would make them ignore it. Takes (and
    /// keeps) one snapshot id, the first time a process asks for a pool (a pool never leaves
    /// the mode): fails with `EINVAL` for a pool that has (or had) pool snapshots.
    pub fn use_self_managed_snapshots(&self) -> Result<()> {
        // The pools (cluster, pool id: ids are never reused) this process put in the mode.
        static IN_MODE: Mutex<BTreeSet<(String, i64)>> = Mutex::new(BTreeSet::new());
        let key = self.identity()?;
        let mut in_mode = IN_MODE.lock().unwrap_or_else(|e| e.into_inner());
        if in_mode.contains(&key) {
            return Ok(());
        }
        let mut id = 0u64;
        // SAFETY: a live context, an out-pointer we own.
        let rc = unsafe { rados_ioctx_selfmanaged_snap_create(self.io, &mut id) };
        check(rc, "use self-managed snapshots in", &self.name)?;
        in_mode.insert(key);
        Ok(())
    }

    /// The cluster's id and the pool's: which RADOS pool this is, wherever it is named from
    /// (a pool renamed keeps its id).
    pub fn identity(&self) -> Result<(String, i64)> {
        let mut buf = [0u8; 64];
        // SAFETY: a live context; its cluster handle lives as long; a buffer of that size.
        let rc = unsafe {
            rados_cluster_fsid(
                rados_ioctx_get_cluster(self.io),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        let n = check(rc, "read the cluster id of", &self.name)? as usize;
        let fsid = String::from_utf8_lossy(&buf[..n.min(buf.len())])
            .trim_end_matches('\0')
            .to_string();
        // SAFETY: a live context.
        Ok((fsid, unsafe { rados_ioctx_get_id(self.io) }))
    }

    /// Takes a pool snapshot named `name`, as `ceph osd pool mksnap` does: the pool's mode
    /// then refuses self-managed snapshots ([`use_self_managed_snapshots`](Self::use_self_managed_snapshots)).
    pub fn create_pool_snapshot(&self, name: &str) -> Result<()> {
        let n = cstr("snapshot", name)?;
        // SAFETY: a live context, a NUL-terminated name.
        check(
            unsafe { rados_ioctx_snap_create(self.io, n.as_ptr()) },
            "take a pool snapshot of",
            &self.name,
        )
        .map(drop)
    }

    /// Applies a compound write: all of it or nothing.
    pub fn operate(&self, oid: &str, op: &WriteOp) -> Result<()> {
        op.operate(self.io, self.write_flags(), oid)
    }

    /// Sends a compound write and returns without waiting for it; the [`PendingWrite`]
    /// tells how it ended. Writes this client sends to one object are applied in the order
    /// sent, and a read sent after them sees them.
    pub fn operate_async(&self, oid: &str, op: WriteOp) -> Result<PendingWrite> {
        op.operate_async(self.io, self.write_flags(), oid)
    }

    /// Sends a compound write and returns without waiting for it; `then` is called once
    /// with its outcome, from librados' thread (it must not wait for other writes' callbacks,
    /// which run on that thread too). An error means it was not sent, and `then` is not
    /// called. The context must stay open until `then` was called.
    pub fn operate_then(&self, oid: &str, op: WriteOp, then: WriteCallback) -> Result<()> {
        op.operate_then(self.io, self.write_flags(), oid, then)
    }

    /// The object's omap keys and values (all of them, in key order).
    pub fn omap(&self, oid: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        ReadOmap::all(self.io, oid)
    }

    /// Up to `max` omap records of `oid` whose keys start with `prefix`, past the key
    /// `after` (from the first without it), and whether more follow. Keys and prefixes are C
    /// strings to librados: one with a NUL byte is refused.
    pub fn omap_page(&self, oid: &str, after: Option<&[u8]>, prefix: &[u8], max: u64) -> Result<OmapPage> {
        ReadOmap::page(self.io, oid, after, prefix, max)
    }

    /// The omap records of `oid` under `keys` that exist (no NUL bytes in keys).
    pub fn omap_get(&self, oid: &str, keys: &[&[u8]]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        ReadOmap::by_keys(self.io, oid, keys)
    }
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        // SAFETY: the context is ours; its cluster outlives it (borrowed, or held here and
        // dropped after this).
        unsafe { rados_ioctx_destroy(self.io) }
    }
}
