//! Running libiscsi's conformance suite (`iscsi-test-cu`, a CUnit program) and reading its
//! output.

/// Runs every test of the suite, data loss allowed, against the LUN at `url` (an
/// `iscsi://HOST:PORT/IQN/LUN` URL; the suite's second session goes to the same LUN), as
/// libiscsi's two test initiators. Returns its stdout and stderr together.
pub fn run_suite(url: &str) -> String {
    let o = std::process::Command::new("iscsi-test-cu")
        .args([
            "--test=ALL",
            "--dataloss",
            "-i",
            "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test",
            "-I",
            "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2",
            url,
            url,
        ])
        .output()
        .unwrap_or_else(|e| {
            panic!("iscsi-test-cu: {e} (Debian's libiscsi-bin; scripts/install-deps.sh test installs it)")
        });
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The tests CUnit's output `out` says failed. A verdict ends a test: "passed" or "FAILED",
/// after the "..." of its line or at the start of a later one. libiscsi's own "[FAILED]" log
/// lines are not verdicts: a test may retry a command that met a unit attention and pass.
pub fn failures(out: &str) -> Vec<String> {
    let mut failed: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    for line in out.lines() {
        let rest = match line.trim_start().strip_prefix("Test: ") {
            Some(r) => {
                let (name, rest) = r.split_once(" ...").unwrap_or((r, ""));
                current = Some(name.to_string());
                rest
            }
            None => line,
        };
        if rest.starts_with("FAILED") {
            failed.extend(current.take());
        } else if rest.starts_with("passed") {
            current = None;
        }
    }
    failed
}

/// How many tests ran, counted from their own lines: CUnit's summary is lost if the tool dies
/// at exit.
pub fn tests_ran(out: &str) -> usize {
    out.lines().filter(|l| l.trim_start().starts_with("Test: ")).count()
}

/// The commands the suite skipped as not implemented by the target, each once, sorted.
pub fn not_implemented(out: &str) -> Vec<&str> {
    let mut missing: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split("[SKIPPED] ").nth(1))
        .filter_map(|l| {
            l.strip_suffix(" is not implemented.")
                .or_else(|| l.strip_suffix(" does not support 0-blocks."))
        })
        .collect();
    missing.sort();
    missing.dedup();
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_from_the_test_lines_not_from_log_lines() {
        let out = "Suite: A\n  Test: One ...passed\n  Test: Two ...    [FAILED] retried\npassed\n  \
                   Test: Three ...FAILED\n  Test: Four ...\n    [SKIPPED] WRITEATOMIC16 is not implemented.\nFAILED\n";
        assert_eq!(failures(out), vec!["Three".to_string(), "Four".to_string()]);
        assert_eq!(tests_ran(out), 4);
        assert_eq!(not_implemented(out), vec!["WRITEATOMIC16"]);
    }
}
