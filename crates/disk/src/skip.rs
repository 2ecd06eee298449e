//! Tests that cannot run on this machine (no io_uring, say) say so instead of passing:
//! `skip` writes a line that scripts/summarize-tests.sh counts as skipped, not passed.

use std::io::Write;

/// Reports the calling test as skipped, with the reason. The line goes straight to the
/// process's stderr, past the test harness's output capture, so that it is seen whether the
/// test passes or not; the test then returns.
pub fn skip(test: &str, why: &str) {
    let line = format!("\ntest {test} ... skipped at run time: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Whether this process may use io_uring (a kernel setting or a seccomp filter can refuse it).
pub fn io_uring_available() -> bool {
    crate::ReadRing::<()>::new(2).is_ok()
}
