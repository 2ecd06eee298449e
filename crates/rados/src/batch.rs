//! Reads of many extents at once. The extents of one object go in one compound read
//! operation, and every object's operation is in flight together (librados' asynchronous
//! calls): a request that spans several grains of an object, or a queue of small reads, costs
//! one operation per object at the OSDs and one round trip in all, instead of one of each
//! per extent, one after the other.

use std::collections::HashMap;
use std::ffi::CString;
use std::ptr;

use libc::{c_char, c_int, size_t};

use crate::cstr;
use crate::error::{RadosError, Result};
use crate::ffi::*;

/// One extent of [`Pool::read_extents`](crate::Pool::read_extents): `buf.len()` bytes at
/// `offset` of object `oid`.
pub struct ReadExtent<'a> {
    pub oid: String,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// One object's read operation in flight, and the extents it fills.
struct Issued {
    op: rados_read_op_t,
    completion: rados_completion_t,
    oid: String,
    extents: Vec<usize>,
}

/// The operations in flight. Nothing returns before every one of them has completed (librados
/// writes into the callers' buffers and into the counts until then), not even a panic.
struct InFlight(Vec<Issued>);

impl InFlight {
    /// Waits for operation `i` and takes it out; returns it with librados' result for the
    /// whole of it.
    fn finish(&mut self, i: usize) -> (Issued, c_int) {
        let it = self.0.swap_remove(i);
        // SAFETY: a completion we created and have not released; the operation it names is
        // released only once it completed.
        let rc = unsafe {
            rados_aio_wait_for_complete(it.completion);
            let rc = rados_aio_get_return_value(it.completion);
            rados_aio_release(it.completion);
            rados_release_read_op(it.op);
            rc
        };
        (it, rc)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        while !self.0.is_empty() {
            self.finish(self.0.len() - 1);
        }
    }
}

fn call_error(io: rados_ioctx_t, oid: &str, errno: c_int) -> RadosError {
    crate::io_error(io, "read", oid, errno)
}

/// Reads every extent (see [`Pool::read_extents`](crate::Pool::read_extents)).
pub(crate) fn read_extents(io: rados_ioctx_t, extents: &mut [ReadExtent<'_>]) -> Vec<Result<usize>> {
    let n = extents.len();
    let mut results: Vec<Result<usize>> = (0..n).map(|_| Ok(0)).collect();
    // Where librados puts each extent's byte count and its own result: allocated once, so
    // that the pointers handed over stay valid until every operation completed.
    let mut counts: Vec<size_t> = vec![0; n];
    let mut rvals: Vec<c_int> = vec![0; n];
    let mut objects: Vec<(String, Vec<usize>)> = Vec::new();
    let mut by_oid: HashMap<&str, usize> = HashMap::new();
    for (i, e) in extents.iter().enumerate() {
        match by_oid.get(e.oid.as_str()) {
            Some(&o) => objects[o].1.push(i),
            None => {
                by_oid.insert(&e.oid, objects.len());
                objects.push((e.oid.clone(), vec![i]));
            }
        }
    }
    drop(by_oid);
    let (counts_at, rvals_at) = (counts.as_mut_ptr(), rvals.as_mut_ptr());
    let mut in_flight = InFlight(Vec::with_capacity(objects.len()));
    for (oid, members) in objects {
        let o: CString = match cstr("object", &oid) {
            Ok(o) => o,
            Err(e) => {
                let text = e.to_string();
                for m in members {
                    results[m] = Err(RadosError::Invalid(text.clone()));
                }
                continue;
            }
        };
        // SAFETY: creates an operation released in `InFlight::finish`, or below if it is
        // never sent.
        let op = unsafe { rados_create_read_op() };
        if op.is_null() {
            for m in members {
                results[m] = Err(RadosError::Invalid(
                    "librados could not allocate a read operation".into(),
                ));
            }
            continue;
        }
        for &m in &members {
            let e = &mut extents[m];
            // SAFETY: a live operation; the buffer, the count and the result outlive it
            // (`extents` is borrowed for this whole call, `counts` and `rvals` are not
            // reallocated, and `in_flight` waits for the operation before either goes).
            unsafe {
                rados_read_op_read(
                    op,
                    e.offset,
                    e.buf.len(),
                    e.buf.as_mut_ptr() as *mut c_char,
                    counts_at.add(m),
                    rvals_at.add(m),
                )
            };
        }
        let mut completion: rados_completion_t = ptr::null_mut();
        // SAFETY: no callback; the completion is released in `InFlight::finish` or below.
        let rc = unsafe { rados_aio_create_completion2(ptr::null_mut(), None, &mut completion) };
        if rc < 0 {
            // SAFETY: the operation was never sent.
            unsafe { rados_release_read_op(op) };
            for m in members {
                results[m] = Err(call_error(io, &oid, -rc));
            }
            continue;
        }
        // SAFETY: a live operation, context and completion, and a NUL-terminated name (copied
        // by librados before it returns).
        let rc = unsafe { rados_aio_read_op_operate(op, io, completion, o.as_ptr(), LIBRADOS_OPERATION_NOFLAG) };
        if rc < 0 {
            // SAFETY: refused at once: nothing of it is in flight.
            unsafe {
                rados_aio_release(completion);
                rados_release_read_op(op);
            }
            for m in members {
                results[m] = Err(call_error(io, &oid, -rc));
            }
            continue;
        }
        in_flight.0.push(Issued {
            op,
            completion,
            oid,
            extents: members,
        });
    }
    while !in_flight.0.is_empty() {
        let (it, rc) = in_flight.finish(0);
        for m in it.extents {
            results[m] = if rc < 0 {
                Err(call_error(io, &it.oid, -rc))
            } else if rvals[m] < 0 {
                Err(call_error(io, &it.oid, -rvals[m]))
            } else {
                Ok(counts[m])
            };
        }
    }
    results
}
