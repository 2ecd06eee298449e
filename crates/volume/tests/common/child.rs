//! One test of the running test binary run as a child process: what a power cut ends with the
//! process (it exits at the cut), so that the next child finds what a restart would.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the ignored test `name` of this test binary with `envs` set, and returns the lines it
/// printed. Panics, saying `what` and with what the child printed on stderr, when it fails
/// or has not ended after two minutes.
pub fn run_test_child(name: &str, envs: &[(&str, String)], what: &str) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let lines = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{what}: the child never ended");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let (lines, errors) = (lines.join().unwrap(), errors.join().unwrap());
    assert!(status.success(), "{what}: the child failed ({status}):\n{errors}");
    lines
}
