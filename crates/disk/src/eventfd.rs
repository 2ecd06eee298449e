//! An eventfd that a loop polls beside its other descriptors (an io_uring's, a socket): made,
//! rung by another thread, and cleared by the loop. One place for the unsafe calls, which the
//! disk reads' mailboxes and the NBD server's connections share.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A new eventfd, non-blocking and closed on exec.
pub fn open() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a descriptor it returns is ours alone.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `fd` poll readable until it is cleared.
pub fn ring(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a u64 we own; the caller keeps `fd` open.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Makes `fd` poll unreadable again until it is rung.
pub fn clear(fd: RawFd) {
    let mut n = 0u64;
    // SAFETY: reads 8 bytes into a u64 we own; the caller keeps `fd` open.
    unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
}
