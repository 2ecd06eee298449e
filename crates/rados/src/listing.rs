//! What a pool holds: the names of its objects (a walk over every placement group), and how
//! many there are as the placement groups last reported.

use std::ptr;

use crate::ffi::*;
use crate::{check, Pool, Result};

/// `num_objects` in `struct rados_pool_stat_t`.
const NUM_OBJECTS: usize = 2;
/// Room for the statistics: more fields than Ceph 16 fills, in case a later one adds some.
const STAT_WORDS: usize = 64;

impl Pool<'_> {
    /// How many objects the pool holds, as its placement groups last reported them to the
    /// monitors (seconds old: an estimate, for choosing how to walk the pool).
    pub fn object_count(&self) -> Result<u64> {
        let mut stats = [0u64; STAT_WORDS];
        // SAFETY: a live context and room for the whole structure (and more).
        check(
            unsafe { rados_ioctx_pool_stat(self.io, stats.as_mut_ptr()) },
            "pool statistics",
            &self.name,
        )?;
        Ok(stats[NUM_OBJECTS])
    }

    /// The names of the objects in the pool's default namespace (bytes: RADOS does not ask
    /// for UTF-8), in no particular order (a name may come twice if placement groups split
    /// meanwhile). It reads every placement group, whoever's objects they hold.
    pub fn objects(&self) -> Result<Objects<'_>> {
        let mut ctx: rados_list_ctx_t = ptr::null_mut();
        // SAFETY: a live context and an out-pointer we own.
        check(
            unsafe { rados_nobjects_list_open(self.io, &mut ctx) },
            "list objects",
            &self.name,
        )?;
        Ok(Objects {
            ctx,
            pool: &self.name,
            done: false,
        })
    }
}

/// The walk over a pool's objects ([`Pool::objects`]); ends at the first error.
pub struct Objects<'p> {
    ctx: rados_list_ctx_t,
    pool: &'p str,
    done: bool,
}

impl Iterator for Objects<'_> {
    type Item = Result<Vec<u8>>;

    fn next(&mut self) -> Option<Result<Vec<u8>>> {
        if self.done {
            return None;
        }
        let (mut entry, mut len): (*const libc::c_char, libc::size_t) = (ptr::null(), 0);
        // SAFETY: an open listing; out-pointers we own (the others may be null).
        let rc = unsafe {
            rados_nobjects_list_next2(
                self.ctx,
                &mut entry,
                ptr::null_mut(),
                ptr::null_mut(),
                &mut len,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        // The end of the listing (also what a pool deleted meanwhile answers: nothing is
        // left in it either way).
        if rc == -libc::ENOENT {
            self.done = true;
            return None;
        }
        if let Err(e) = check(rc, "list objects", self.pool) {
            self.done = true;
            return Some(Err(e));
        }
        // SAFETY: librados keeps the name's `len` bytes until the next call on the listing.
        Some(Ok(
            unsafe { std::slice::from_raw_parts(entry as *const u8, len) }.to_vec()
        ))
    }
}

impl Drop for Objects<'_> {
    fn drop(&mut self) {
        // SAFETY: the listing is ours, closed once.
        unsafe { rados_nobjects_list_close(self.ctx) }
    }
}
