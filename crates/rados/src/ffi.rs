//! The librados C declarations used here, as in Ceph's `rados/librados.h`.
#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_uchar, c_void, size_t, time_t};

pub type rados_t = *mut c_void;
pub type rados_ioctx_t = *mut c_void;
pub type rados_write_op_t = *mut c_void;
pub type rados_read_op_t = *mut c_void;
pub type rados_omap_iter_t = *mut c_void;
pub type rados_completion_t = *mut c_void;
pub type rados_list_ctx_t = *mut c_void;
pub type rados_callback_t = Option<unsafe extern "C" fn(cb: rados_completion_t, arg: *mut c_void)>;

pub const LIBRADOS_CMPXATTR_OP_EQ: u8 = 1;
pub const LIBRADOS_CMPXATTR_OP_NE: u8 = 2;
pub const LIBRADOS_CMPXATTR_OP_GT: u8 = 3;
pub const LIBRADOS_CMPXATTR_OP_GTE: u8 = 4;
pub const LIBRADOS_CMPXATTR_OP_LT: u8 = 5;
pub const LIBRADOS_CMPXATTR_OP_LTE: u8 = 6;
pub const LIBRADOS_OPERATION_NOFLAG: c_int = 0;
pub const LIBRADOS_OPERATION_ORDERSNAP: c_int = 512;

#[link(name = "rados")]
extern "C" {
    pub fn rados_create2(cluster: *mut rados_t, clustername: *const c_char, name: *const c_char, flags: u64) -> c_int;
    pub fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
    pub fn rados_conf_set(cluster: rados_t, option: *const c_char, value: *const c_char) -> c_int;
    pub fn rados_conf_get(cluster: rados_t, option: *const c_char, buf: *mut c_char, len: usize) -> c_int;
    pub fn rados_connect(cluster: rados_t) -> c_int;
    pub fn rados_shutdown(cluster: rados_t);
    pub fn rados_pool_create(cluster: rados_t, pool_name: *const c_char) -> c_int;
    pub fn rados_pool_delete(cluster: rados_t, pool_name: *const c_char) -> c_int;
    pub fn rados_getaddrs(cluster: rados_t, addrs: *mut *mut c_char) -> c_int;
    pub fn rados_blocklist_add(cluster: rados_t, client_address: *mut c_char, expire_seconds: u32) -> c_int;

    pub fn rados_ioctx_create(cluster: rados_t, pool_name: *const c_char, ioctx: *mut rados_ioctx_t) -> c_int;
    pub fn rados_ioctx_destroy(io: rados_ioctx_t);
    pub fn rados_ioctx_pool_requires_alignment2(io: rados_ioctx_t, req: *mut c_int) -> c_int;
    pub fn rados_read(io: rados_ioctx_t, oid: *const c_char, buf: *mut c_char, len: size_t, off: u64) -> c_int;
    pub fn rados_stat(io: rados_ioctx_t, oid: *const c_char, psize: *mut u64, pmtime: *mut time_t) -> c_int;
    pub fn rados_getxattr(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        buf: *mut c_char,
        len: size_t,
    ) -> c_int;

    pub fn rados_create_write_op() -> rados_write_op_t;
    pub fn rados_release_write_op(op: rados_write_op_t);
    pub fn rados_write_op_create(op: rados_write_op_t, exclusive: c_int, category: *const c_char);
    pub fn rados_write_op_assert_exists(op: rados_write_op_t);
    pub fn rados_write_op_remove(op: rados_write_op_t);
    pub fn rados_write_op_write(op: rados_write_op_t, buffer: *const c_char, len: size_t, offset: u64);
    pub fn rados_write_op_write_full(op: rados_write_op_t, buffer: *const c_char, len: size_t);
    pub fn rados_write_op_setxattr(op: rados_write_op_t, name: *const c_char, value: *const c_char, value_len: size_t);
    pub fn rados_write_op_cmpxattr(
        op: rados_write_op_t,
        name: *const c_char,
        comparison_operator: u8,
        value: *const c_char,
        value_len: size_t,
    );
    pub fn rados_write_op_omap_set2(
        op: rados_write_op_t,
        keys: *const *const c_char,
        vals: *const *const c_char,
        key_lens: *const size_t,
        val_lens: *const size_t,
        num: size_t,
    );
    pub fn rados_write_op_omap_rm_keys2(
        op: rados_write_op_t,
        keys: *const *const c_char,
        key_lens: *const size_t,
        keys_len: size_t,
    );
    pub fn rados_write_op_operate(
        op: rados_write_op_t,
        io: rados_ioctx_t,
        oid: *const c_char,
        mtime: *mut time_t,
        flags: c_int,
    ) -> c_int;

    pub fn rados_create_read_op() -> rados_read_op_t;
    pub fn rados_release_read_op(op: rados_read_op_t);
    pub fn rados_read_op_omap_get_vals2(
        op: rados_read_op_t,
        start_after: *const c_char,
        filter_prefix: *const c_char,
        max_return: u64,
        iter: *mut rados_omap_iter_t,
        pmore: *mut c_uchar,
        prval: *mut c_int,
    );
    pub fn rados_read_op_omap_get_vals_by_keys(
        op: rados_read_op_t,
        keys: *const *const c_char,
        keys_len: size_t,
        iter: *mut rados_omap_iter_t,
        prval: *mut c_int,
    );
    pub fn rados_read_op_operate(op: rados_read_op_t, io: rados_ioctx_t, oid: *const c_char, flags: c_int) -> c_int;
    pub fn rados_read_op_read(
        op: rados_read_op_t,
        offset: u64,
        len: size_t,
        buffer: *mut c_char,
        bytes_read: *mut size_t,
        prval: *mut c_int,
    );
    pub fn rados_aio_read_op_operate(
        op: rados_read_op_t,
        io: rados_ioctx_t,
        completion: rados_completion_t,
        oid: *const c_char,
        flags: c_int,
    ) -> c_int;
    pub fn rados_aio_create_completion2(
        cb_arg: *mut c_void,
        cb_complete: rados_callback_t,
        pc: *mut rados_completion_t,
    ) -> c_int;
    pub fn rados_aio_read(
        io: rados_ioctx_t,
        oid: *const c_char,
        completion: rados_completion_t,
        buf: *mut c_char,
        len: size_t,
        off: u64,
    ) -> c_int;
    pub fn rados_aio_wait_for_complete(c: rados_completion_t) -> c_int;
    pub fn rados_aio_is_complete(c: rados_completion_t) -> c_int;
    pub fn rados_aio_write_op_operate(
        op: rados_write_op_t,
        io: rados_ioctx_t,
        completion: rados_completion_t,
        oid: *const c_char,
        mtime: *mut time_t,
        flags: c_int,
    ) -> c_int;
    pub fn rados_aio_get_return_value(c: rados_completion_t) -> c_int;
    pub fn rados_aio_release(c: rados_completion_t);
    pub fn rados_omap_get_next2(
        iter: rados_omap_iter_t,
        key: *mut *mut c_char,
        val: *mut *mut c_char,
        key_len: *mut size_t,
        val_len: *mut size_t,
    ) -> c_int;
    pub fn rados_omap_get_end(iter: rados_omap_iter_t);
    pub fn rados_nobjects_list_open(io: rados_ioctx_t, ctx: *mut rados_list_ctx_t) -> c_int;
    pub fn rados_nobjects_list_next2(
        ctx: rados_list_ctx_t,
        entry: *mut *const c_char,
        key: *mut *const c_char,
        nspace: *mut *const c_char,
        entry_size: *mut size_t,
        key_size: *mut size_t,
        nspace_size: *mut size_t,
    ) -> c_int;
    pub fn rados_nobjects_list_close(ctx: rados_list_ctx_t);
    pub fn rados_ioctx_snap_create(io: rados_ioctx_t, snapname: *const c_char) -> c_int;
    pub fn rados_ioctx_get_id(io: rados_ioctx_t) -> i64;
    pub fn rados_ioctx_get_cluster(io: rados_ioctx_t) -> rados_t;
    pub fn rados_cluster_fsid(cluster: rados_t, buf: *mut c_char, len: size_t) -> c_int;
    pub fn rados_ioctx_selfmanaged_snap_create(io: rados_ioctx_t, snapid: *mut u64) -> c_int;
    pub fn rados_ioctx_selfmanaged_snap_set_write_ctx(
        io: rados_ioctx_t,
        seq: u64,
        snaps: *mut u64,
        num_snaps: c_int,
    ) -> c_int;
    /// `stats` points at a `struct rados_pool_stat_t` (sixteen u64 fields in Ceph 16; the
    /// caller gives room for more).
    pub fn rados_ioctx_pool_stat(io: rados_ioctx_t, stats: *mut u64) -> c_int;
}
