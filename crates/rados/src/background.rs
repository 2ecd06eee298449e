//! A read that returns at once and calls back when the OSD has answered, from librados' own
//! thread: a caller with an event loop learns of it there, with no thread of its own blocked
//! on it.

use std::ffi::c_void;
use std::ptr;

use libc::c_char;

use crate::cstr;
use crate::error::Result;
use crate::ffi::*;

/// What to do with a read's outcome: the bytes the object had there, or the error (`ENOENT`
/// for an object that does not exist).
pub type ReadCallback = Box<dyn FnOnce(Result<usize>) + Send>;

struct Pending {
    /// The context read through, open until the read completed (`read_then`'s caller's
    /// promise), to tell a missing pool from a missing object.
    io: rados_ioctx_t,
    oid: String,
    then: ReadCallback,
}

fn outcome(io: rados_ioctx_t, oid: &str, rc: libc::c_int) -> Result<usize> {
    crate::check_io(io, rc, "read", oid).map(|n| n as usize)
}

/// Called by librados once the read completed, on its finisher thread.
unsafe extern "C" fn completed(c: rados_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Pending boxed by `read_then` for this completion, taken once.
    let p = unsafe { Box::from_raw(arg as *mut Pending) };
    // SAFETY: our completion, complete; librados keeps its own reference while it calls
    // back, so releasing ours here is allowed.
    let rc = unsafe {
        let rc = rados_aio_get_return_value(c);
        rados_aio_release(c);
        rc
    };
    // A panic may not unwind into librados.
    let run = std::panic::AssertUnwindSafe(move || (p.then)(outcome(p.io, &p.oid, rc)));
    if std::panic::catch_unwind(run).is_err() {
        tracing::error!("a read's callback panicked");
    }
}

/// Starts reading `len` bytes at `offset` of `oid` into `buf`; `then` is called exactly once
/// with the outcome, from librados' thread, or from this one if the read could not start.
///
/// # Safety
/// `buf` must be valid for `len` bytes, and nothing else may read or write them, until
/// `then` is called; `io` must stay open until then.
pub(crate) unsafe fn read_then(
    io: rados_ioctx_t,
    oid: &str,
    offset: u64,
    buf: *mut u8,
    len: usize,
    then: ReadCallback,
) {
    let o = match cstr("object", oid) {
        Ok(o) => o,
        Err(e) => return then(Err(e)),
    };
    let arg = Box::into_raw(Box::new(Pending {
        io,
        oid: oid.to_string(),
        then,
    }));
    let mut c: rados_completion_t = ptr::null_mut();
    // SAFETY: the callback takes `arg` back once the read completed.
    let rc = unsafe { rados_aio_create_completion2(arg as *mut c_void, Some(completed), &mut c) };
    if rc < 0 {
        // SAFETY: never handed to librados.
        let p = unsafe { Box::from_raw(arg) };
        return (p.then)(outcome(p.io, &p.oid, rc));
    }
    // SAFETY: a live context and completion; librados copies the name before it returns;
    // the caller keeps the buffer valid until the callback.
    let rc = unsafe { rados_aio_read(io, o.as_ptr(), c, buf as *mut c_char, len, offset) };
    if rc < 0 {
        // SAFETY: refused at once: the callback will not run, so `arg` is ours again.
        let p = unsafe {
            rados_aio_release(c);
            Box::from_raw(arg)
        };
        (p.then)(outcome(p.io, &p.oid, rc));
    }
}
