//! Compound operations. A `WriteOp` is built in Rust and handed to librados whole at
//! `operate`, so that nothing it points at has to outlive a half-built librados operation.

use std::ffi::{c_void, CString};
use std::ptr;

use libc::{c_char, c_int, c_uchar};

use crate::error::{RadosError, Result};
use crate::ffi::*;
use crate::{check, check_io, cstr};

#[derive(Debug, Clone)]
enum Step {
    Create { exclusive: bool },
    AssertExists,
    Write { offset: u64, data: Vec<u8> },
    WriteFull(Vec<u8>),
    SetXattr(String, Vec<u8>),
    GuardXattr(String, XattrCmp, Vec<u8>),
    OmapSet(Vec<(Vec<u8>, Vec<u8>)>),
    OmapRemove(Vec<Vec<u8>>),
    Remove,
}

/// How a guard compares an object's attribute with a value: `Lte` holds when the attribute is
/// at most the value (byte-wise, as strings: fixed-width numbers compare as numbers). A
/// missing attribute compares as empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrCmp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl XattrCmp {
    /// librados' operator: it compares the value given with the attribute, so each is the
    /// mirror of ours.
    fn librados(self) -> u8 {
        match self {
            XattrCmp::Eq => LIBRADOS_CMPXATTR_OP_EQ,
            XattrCmp::Ne => LIBRADOS_CMPXATTR_OP_NE,
            XattrCmp::Gt => LIBRADOS_CMPXATTR_OP_LT,
            XattrCmp::Gte => LIBRADOS_CMPXATTR_OP_LTE,
            XattrCmp::Lt => LIBRADOS_CMPXATTR_OP_GT,
            XattrCmp::Lte => LIBRADOS_CMPXATTR_OP_GTE,
        }
    }
}

/// A write of one object that the object's primary OSD applies all at once or not at all,
/// its steps in the order given: a guard that fails, wherever it stands, refuses the whole
/// operation with `ECANCELED` (the OSD builds the transaction first and drops it on any
/// error).
#[derive(Debug, Clone, Default)]
pub struct WriteOp {
    steps: Vec<Step>,
}

impl WriteOp {
    pub fn new() -> WriteOp {
        WriteOp::default()
    }

    /// Creates the object; with `exclusive`, fails (`EEXIST`) if it exists.
    pub fn create(mut self, exclusive: bool) -> Self {
        self.steps.push(Step::Create { exclusive });
        self
    }

    /// Fails the operation with `ENOENT` if the object does not exist (a write alone would
    /// make it).
    pub fn assert_exists(mut self) -> Self {
        self.steps.push(Step::AssertExists);
        self
    }

    /// Removes the object; fails with `ENOENT` if there is none.
    pub fn remove(mut self) -> Self {
        self.steps.push(Step::Remove);
        self
    }

    pub fn write(mut self, offset: u64, data: &[u8]) -> Self {
        self.steps.push(Step::Write {
            offset,
            data: data.to_vec(),
        });
        self
    }

    /// As [`write`](Self::write), with data the operation takes (no copy).
    pub fn write_owned(mut self, offset: u64, data: Vec<u8>) -> Self {
        self.steps.push(Step::Write { offset, data });
        self
    }

    pub fn write_full(mut self, data: &[u8]) -> Self {
        self.steps.push(Step::WriteFull(data.to_vec()));
        self
    }

    pub fn set_xattr(mut self, name: &str, value: &[u8]) -> Self {
        self.steps.push(Step::SetXattr(name.to_string(), value.to_vec()));
        self
    }

    /// Applies the operation only if attribute `name` equals `value` (an object that is
    /// missing fails with `ENOENT`).
    pub fn guard_xattr_eq(self, name: &str, value: &[u8]) -> Self {
        self.guard_xattr(name, XattrCmp::Eq, value)
    }

    /// Applies the operation only if attribute `name` compares with `value` as `cmp` says
    /// (an object that is missing fails with `ENOENT`).
    pub fn guard_xattr(mut self, name: &str, cmp: XattrCmp, value: &[u8]) -> Self {
        self.steps.push(Step::GuardXattr(name.to_string(), cmp, value.to_vec()));
        self
    }

    pub fn omap_set(mut self, pairs: &[(&[u8], &[u8])]) -> Self {
        self.steps.push(Step::OmapSet(
            pairs.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(),
        ));
        self
    }

    pub fn omap_remove(mut self, keys: &[&[u8]]) -> Self {
        self.steps
            .push(Step::OmapRemove(keys.iter().map(|k| k.to_vec()).collect()));
        self
    }

    pub(crate) fn operate(&self, io: rados_ioctx_t, flags: c_int, oid: &str) -> Result<()> {
        let o = cstr("object", oid)?;
        // Every string handed over lives here until the operation has run.
        let mut names: Vec<CString> = Vec::new();
        let op = new_write_op()?;
        let built = self.build(op, &mut names).and_then(|()| {
            // SAFETY: a built operation, a live context, a NUL-terminated object name.
            let rc = unsafe { rados_write_op_operate(op, io, o.as_ptr(), ptr::null_mut(), flags) };
            check(rc, "compound write", oid).map(drop)
        });
        // SAFETY: ours, and not used after this.
        unsafe { rados_release_write_op(op) };
        built
    }

    /// Sends the operation and returns at once; [`PendingWrite::wait`] tells how it ended.
    pub(crate) fn operate_async(self, io: rados_ioctx_t, flags: c_int, oid: &str) -> Result<PendingWrite> {
        let (op, names) = self.prepare()?;
        // SAFETY: no callback; the completion is released by the PendingWrite, or by `send`.
        let completion = unsafe { send(io, flags, oid, op, ptr::null_mut(), None) }.inspect_err(|_| {
            // SAFETY: ours, never sent.
            unsafe { rados_release_write_op(op) };
        })?;
        // What the operation points at (the steps' data and names) moves into the
        // PendingWrite, which keeps it until the operation completed; heap buffers do not
        // move with their owners.
        Ok(PendingWrite {
            op,
            completion,
            oid: oid.to_string(),
            _keep: (self, names),
            waited: false,
        })
    }

    /// Sends the operation and returns at once; `then` is called once with its outcome, from
    /// librados' thread, when the OSDs applied it (on every replica) or refused it. An error
    /// here means it was not sent, and `then` is never called.
    pub(crate) fn operate_then(self, io: rados_ioctx_t, flags: c_int, oid: &str, then: WriteCallback) -> Result<()> {
        let (op, names) = self.prepare()?;
        // Everything the callback needs, set before the operation is sent.
        let sent = Box::into_raw(Box::new(SentWrite {
            op,
            oid: oid.to_string(),
            _keep: (self, names),
            then,
        }));
        // SAFETY: the callback takes `sent` back once the operation completed; until then
        // librados reads the steps' buffers, which `sent` keeps.
        match unsafe { send(io, flags, oid, op, sent as *mut c_void, Some(write_completed)) } {
            Ok(_) => Ok(()),
            Err(e) => {
                // SAFETY: not sent: the callback will not run, `sent` is ours again.
                unsafe {
                    drop(Box::from_raw(sent));
                    rados_release_write_op(op);
                }
                Err(e)
            }
        }
    }

    /// A librados operation with the steps added (and the names they point at).
    fn prepare(&self) -> Result<(rados_write_op_t, Vec<CString>)> {
        let mut names: Vec<CString> = Vec::new();
        let op = new_write_op()?;
        if let Err(e) = self.build(op, &mut names) {
            // SAFETY: ours, never sent.
            unsafe { rados_release_write_op(op) };
            return Err(e);
        }
        Ok((op, names))
    }

    /// Adds the steps to `op`; the attribute names handed over are kept in `names`.
    fn build(&self, op: rados_write_op_t, names: &mut Vec<CString>) -> Result<()> {
        for step in &self.steps {
            // SAFETY (each call): a live operation; pointers into buffers and strings that
            // outlive the operation (kept by the caller until it ran); lengths that match them.
            match step {
                Step::Create { exclusive } => unsafe { rados_write_op_create(op, *exclusive as c_int, ptr::null()) },
                Step::AssertExists => unsafe { rados_write_op_assert_exists(op) },
                Step::Remove => unsafe { rados_write_op_remove(op) },
                Step::Write { offset, data } => unsafe {
                    rados_write_op_write(op, data.as_ptr() as *const c_char, data.len(), *offset)
                },
                Step::WriteFull(data) => unsafe {
                    rados_write_op_write_full(op, data.as_ptr() as *const c_char, data.len())
                },
                Step::SetXattr(name, value) => {
                    names.push(cstr("attribute", name)?);
                    let n = names.last().expect("pushed").as_ptr();
                    unsafe { rados_write_op_setxattr(op, n, value.as_ptr() as *const c_char, value.len()) }
                }
                Step::GuardXattr(name, cmp, value) => {
                    names.push(cstr("attribute", name)?);
                    let n = names.last().expect("pushed").as_ptr();
                    unsafe {
                        rados_write_op_cmpxattr(op, n, cmp.librados(), value.as_ptr() as *const c_char, value.len())
                    }
                }
                Step::OmapSet(pairs) => {
                    let keys: Vec<*const c_char> = pairs.iter().map(|(k, _)| k.as_ptr() as *const c_char).collect();
                    let vals: Vec<*const c_char> = pairs.iter().map(|(_, v)| v.as_ptr() as *const c_char).collect();
                    let klens: Vec<usize> = pairs.iter().map(|(k, _)| k.len()).collect();
                    let vlens: Vec<usize> = pairs.iter().map(|(_, v)| v.len()).collect();
                    // librados copies the keys and values into the operation.
                    unsafe {
                        rados_write_op_omap_set2(
                            op,
                            keys.as_ptr(),
                            vals.as_ptr(),
                            klens.as_ptr(),
                            vlens.as_ptr(),
                            pairs.len(),
                        )
                    }
                }
                Step::OmapRemove(keys) => {
                    let ks: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr() as *const c_char).collect();
                    let lens: Vec<usize> = keys.iter().map(|k| k.len()).collect();
                    unsafe { rados_write_op_omap_rm_keys2(op, ks.as_ptr(), lens.as_ptr(), keys.len()) }
                }
            }
        }
        Ok(())
    }
}

/// Sends a built operation with a new completion, which calls `callback` with `arg` (if
/// any) once done. On an error nothing was sent and the completion is released; the
/// operation is the caller's to release either way once done.
///
/// # Safety
/// A live context and built operation; whatever the operation points at stays valid, and
/// `arg` stays what `callback` expects, until the completion is done.
unsafe fn send(
    io: rados_ioctx_t,
    flags: c_int,
    oid: &str,
    op: rados_write_op_t,
    arg: *mut c_void,
    callback: rados_callback_t,
) -> Result<rados_completion_t> {
    let o = cstr("object", oid)?;
    let failed = |rc: c_int| RadosError::Call {
        op: "compound write".into(),
        on: oid.to_string(),
        errno: -rc,
    };
    let mut completion: rados_completion_t = ptr::null_mut();
    // SAFETY: an out-pointer we own; `arg` as the caller promises.
    let rc = unsafe { rados_aio_create_completion2(arg, callback, &mut completion) };
    if rc < 0 {
        return Err(failed(rc));
    }
    // SAFETY: a built operation, a live context and completion, a NUL-terminated name.
    let rc = unsafe { rados_aio_write_op_operate(op, io, completion, o.as_ptr(), ptr::null_mut(), flags) };
    if rc < 0 {
        // Refused before it was sent: nothing will complete.
        // SAFETY: ours, never sent.
        unsafe { rados_aio_release(completion) };
        return Err(failed(rc));
    }
    Ok(completion)
}

/// What a write's callback is given: the outcome, as [`PendingWrite::wait`] would return it.
pub type WriteCallback = Box<dyn FnOnce(Result<()>) + Send>;

/// A write sent with a callback: what librados reads until it completed, and what to call.
struct SentWrite {
    op: rados_write_op_t,
    oid: String,
    _keep: (WriteOp, Vec<CString>),
    then: WriteCallback,
}

/// Called by librados once a write sent by [`WriteOp::operate_then`] completed, on its
/// finisher thread.
unsafe extern "C" fn write_completed(c: rados_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the SentWrite boxed for this completion, taken once; librados keeps
    // its own reference to the completion while it calls back, so releasing ours is allowed,
    // and the operation is done with.
    let (sent, rc) = unsafe {
        let sent = Box::from_raw(arg as *mut SentWrite);
        let rc = rados_aio_get_return_value(c);
        rados_aio_release(c);
        rados_release_write_op(sent.op);
        (sent, rc)
    };
    let SentWrite { oid, then, .. } = *sent;
    // A panic may not unwind into librados.
    let run = std::panic::AssertUnwindSafe(move || then(check(rc, "compound write", &oid).map(drop)));
    if std::panic::catch_unwind(run).is_err() {
        tracing::error!("a write's callback panicked");
    }
}

fn new_write_op() -> Result<rados_write_op_t> {
    // SAFETY: creates an operation the caller releases.
    let op = unsafe { rados_create_write_op() };
    if op.is_null() {
        return Err(RadosError::Invalid(
            "librados could not allocate a write operation".into(),
        ));
    }
    Ok(op)
}

/// A compound write sent and not waited for yet ([`Pool::operate_async`](crate::Pool::operate_async)).
/// Dropping it waits for it: librados may use what it points at until it completed.
pub struct PendingWrite {
    op: rados_write_op_t,
    completion: rados_completion_t,
    oid: String,
    /// The operation's data and names, for as long as librados may read them.
    _keep: (WriteOp, Vec<CString>),
    waited: bool,
}

// librados' completions may be waited for from any thread.
unsafe impl Send for PendingWrite {}

impl PendingWrite {
    /// Whether the OSDs have answered (a wait would return at once).
    pub fn is_complete(&self) -> bool {
        // SAFETY: a live completion.
        unsafe { rados_aio_is_complete(self.completion) != 0 }
    }

    /// Waits until the OSDs have applied the write (on every replica) or refused it.
    pub fn wait(mut self) -> Result<()> {
        let rc = self.finish();
        check(rc, "compound write", &self.oid).map(drop)
    }

    fn finish(&mut self) -> c_int {
        self.waited = true;
        // SAFETY: a completion and an operation of ours, released once, after completion.
        unsafe {
            rados_aio_wait_for_complete(self.completion);
            let rc = rados_aio_get_return_value(self.completion);
            rados_aio_release(self.completion);
            rados_release_write_op(self.op);
            rc
        }
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.waited {
            self.finish();
        }
    }
}

/// Reads an object's omap.
pub(crate) struct ReadOmap;

/// One page of an omap: its records in key order, and whether more follow.
pub type OmapPage = (Vec<(Vec<u8>, Vec<u8>)>, bool);

impl ReadOmap {
    /// Every key and value, in key order, read a thousand at a time.
    pub(crate) fn all(io: rados_ioctx_t, oid: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let (page, more) = Self::page(io, oid, after.as_deref(), b"", 1000)?;
            let last = page.last().map(|(k, _)| k.clone());
            out.extend(page);
            match last {
                Some(k) if more => after = Some(k),
                _ => return Ok(out),
            }
        }
    }

    /// Up to `max` records whose keys start with `prefix`, from the first key past `after`
    /// (from the first, without it). An object that does not exist has none. librados takes
    /// both as C strings: a key or prefix with a NUL byte is refused.
    pub(crate) fn page(
        io: rados_ioctx_t,
        oid: &str,
        after: Option<&[u8]>,
        prefix: &[u8],
        max: u64,
    ) -> Result<OmapPage> {
        let nul = |what: &str| RadosError::Invalid(format!("an omap {what} of {oid} holds a NUL byte"));
        let after = after
            .map(|a| CString::new(a).map_err(|_| nul("key to page past")))
            .transpose()?;
        let prefix = CString::new(prefix).map_err(|_| nul("prefix"))?;
        let start = after.as_ref().map(|c| c.as_ptr()).unwrap_or(ptr::null());
        let mut more: c_uchar = 0;
        let records = Self::read(oid, io, |op, iter, prval| {
            // SAFETY: a live operation; strings and out-pointers that live until it has run.
            unsafe { rados_read_op_omap_get_vals2(op, start, prefix.as_ptr(), max, iter, &mut more, prval) }
        })?;
        Ok((records, more != 0))
    }

    /// The records of `keys` that exist, in key order. Keys are C strings here too.
    pub(crate) fn by_keys(io: rados_ioctx_t, oid: &str, keys: &[&[u8]]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let owned: Vec<CString> = keys
            .iter()
            .map(|k| CString::new(*k))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| RadosError::Invalid(format!("an omap key of {oid} holds a NUL byte")))?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        Self::read(oid, io, |op, iter, prval| {
            // SAFETY: a live operation; the key array and its strings outlive it.
            unsafe { rados_read_op_omap_get_vals_by_keys(op, ptrs.as_ptr(), ptrs.len(), iter, prval) }
        })
    }

    /// Runs a read operation that `add` fills with one omap read, and collects what it
    /// returned. A missing object reads as no records.
    fn read(
        oid: &str,
        io: rados_ioctx_t,
        add: impl FnOnce(rados_read_op_t, *mut rados_omap_iter_t, *mut c_int),
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let o = cstr("object", oid)?;
        // SAFETY: an operation we release below on every path.
        let op = unsafe { rados_create_read_op() };
        if op.is_null() {
            return Err(RadosError::Invalid(
                "librados could not allocate a read operation".into(),
            ));
        }
        let mut iter: rados_omap_iter_t = ptr::null_mut();
        let mut prval: c_int = 0;
        add(op, &mut iter, &mut prval);
        // SAFETY: a live operation and context, a NUL-terminated name.
        let rc = unsafe { rados_read_op_operate(op, io, o.as_ptr(), LIBRADOS_OPERATION_NOFLAG) };
        let r = check_io(io, rc, "read omap", oid).and_then(|_| check_io(io, prval, "read omap", oid));
        let mut records = Vec::new();
        if r.is_ok() && !iter.is_null() {
            loop {
                let (mut k, mut v): (*mut c_char, *mut c_char) = (ptr::null_mut(), ptr::null_mut());
                let (mut kl, mut vl) = (0usize, 0usize);
                // SAFETY: a live iterator; the key and value stay valid until the next call.
                let rc = unsafe { rados_omap_get_next2(iter, &mut k, &mut v, &mut kl, &mut vl) };
                if rc < 0 || k.is_null() {
                    break;
                }
                let key = unsafe { std::slice::from_raw_parts(k as *const u8, kl) }.to_vec();
                let val = if v.is_null() {
                    Vec::new()
                } else {
                    unsafe { std::slice::from_raw_parts(v as *const u8, vl) }.to_vec()
                };
                records.push((key, val));
            }
        }
        if !iter.is_null() {
            // SAFETY: the iterator is ours and not used after this.
            unsafe { rados_omap_get_end(iter) };
        }
        // SAFETY: ours, and not used after this.
        unsafe { rados_release_read_op(op) };
        match r {
            Ok(_) => Ok(records),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}
