//! Starts the real daemon (`tessera serve`) in a temporary state directory and drives it with
//! the real CLI and with raw HTTP.

#![allow(dead_code)]

pub mod browser;
pub mod verifying_load;

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tessera");

pub struct Daemon {
    pub child: Option<Child>,
    pub state: PathBuf,
    pub sock: PathBuf,
    pub log: PathBuf,
    pub out: PathBuf,
}

impl Daemon {
    /// Starts a daemon on `state` with the TCP listener off, and waits until it answers.
    pub fn start(state: &Path) -> Daemon {
        Self::start_with(state, &["--api-listen", "none"]).expect("daemon starts")
    }

    /// Starts a daemon with this configuration file (written next to the state directory) and
    /// no TCP API listener.
    pub fn start_configured(state: &Path, config: &str) -> Daemon {
        let cfg = state.with_extension("toml");
        std::fs::write(&cfg, config).unwrap();
        Daemon::start_with(state, &["--config", cfg.to_str().unwrap(), "--api-listen", "none"]).unwrap()
    }

    /// Starts a daemon with this configuration file and the API on a loopback TCP port, behind
    /// `token` (the address is in the banner).
    pub fn start_on_tcp(state: &Path, config: &str, token: &str) -> Daemon {
        let cfg = state.with_extension("toml");
        std::fs::write(&cfg, config).unwrap();
        let args = [
            "--config",
            cfg.to_str().unwrap(),
            "--api-listen",
            "127.0.0.1:0",
            "--api-token",
            token,
        ];
        Daemon::start_with(state, &args).unwrap()
    }

    /// Starts a daemon with extra `serve` arguments; Err(stderr) if it exits instead.
    pub fn start_with(state: &Path, args: &[&str]) -> Result<Daemon, String> {
        Daemon::start_wrapped(&[], state, args)
    }

    /// Starts a daemon inside the network namespace `netns` (its API socket is reached from
    /// here as any other's), with this configuration file.
    pub fn start_in_netns(netns: &str, state: &Path, config: &str) -> Daemon {
        let cfg = state.with_extension("toml");
        std::fs::write(&cfg, config).unwrap();
        let args = ["--config", cfg.to_str().unwrap(), "--api-listen", "none"];
        Daemon::start_wrapped(&["ip", "netns", "exec", netns], state, &args).unwrap()
    }

    /// `wrapper` (a command that runs the one after it), then `tessera serve`.
    pub fn start_wrapped(wrapper: &[&str], state: &Path, args: &[&str]) -> Result<Daemon, String> {
        std::fs::create_dir_all(state).unwrap();
        let n = std::fs::read_dir(state).map(|d| d.count()).unwrap_or(0);
        let log = state.with_extension(format!("log{n}"));
        let out = state.with_extension(format!("out{n}"));
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .arg("serve")
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .args(default_portal(args))
            .env("TESSERA_LOG", "info")
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("spawn tessera serve");
        let mut d = Daemon {
            child: Some(child),
            state: state.to_path_buf(),
            sock: state.join("api.sock"),
            log,
            out,
        };
        let t = Instant::now();
        loop {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                return Err(format!(
                    "daemon exited with {st}: {}",
                    std::fs::read_to_string(&d.log).unwrap_or_default()
                ));
            }
            if let Ok(r) = http(&d.sock, "GET", "/api/health", None) {
                if r.status == 200 {
                    return Ok(d);
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "daemon did not come up: {}",
                d.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `tessera serve` expecting it to refuse to start; returns its stderr.
    pub fn refused(state: &Path, args: &[&str]) -> String {
        let mut c = Command::new(BIN)
            .arg("serve")
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .args(default_portal(args))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tessera serve");
        let t = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                let mut e = String::new();
                c.stderr.take().unwrap().read_to_string(&mut e).unwrap();
                assert!(!st.success(), "serve exited 0: {e}");
                return e;
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = c.kill();
                panic!("serve {args:?} did not refuse to start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The NBD server's address from the banner.
    pub fn nbd_address(&self) -> String {
        let out = self.stdout();
        out.lines()
            .find_map(|l| l.trim().strip_prefix("NBD server: "))
            .unwrap_or_else(|| panic!("no NBD server in the banner: {out}"))
            .to_string()
    }

    /// The iSCSI portal address from the banner.
    pub fn iscsi_portal(&self) -> String {
        let out = self.stdout();
        out.lines()
            .find_map(|l| l.trim().strip_prefix("iSCSI portal: "))
            .unwrap_or_else(|| panic!("no iSCSI portal in the banner: {out}"))
            .to_string()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn cli(&self, args: &[&str]) -> Out {
        let o = Command::new(BIN)
            .arg("--api")
            .arg(format!("unix:{}", self.sock.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run tessera");
        Out::from(o)
    }

    /// Runs the CLI against an API address, with an optional token.
    pub fn cli_at(api: &str, token: Option<&str>, args: &[&str]) -> Out {
        let mut c = Command::new(BIN);
        c.arg("--api")
            .arg(api)
            .args(args)
            .stdin(Stdio::null())
            .env_remove("TESSERA_TOKEN");
        if let Some(t) = token {
            c.env("TESSERA_TOKEN", t);
        }
        Out::from(c.output().expect("run tessera"))
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.cli(args);
        assert!(
            o.success,
            "tessera {args:?} failed:\n{}\n--- daemon log ---\n{}",
            o.stderr,
            self.logs()
        );
        o.stdout
    }

    /// Runs a command that must succeed and print JSON.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = self.ok(&a);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("tessera {args:?} printed no JSON ({e}): {out}"))
    }

    /// Polls the scrub view of `pool show POOL` until `f` holds of it, and returns it; after
    /// `limit`, fails with `what`, the view and the daemon's log.
    pub fn wait_for_scrub(
        &self,
        pool: &str,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let t = Instant::now();
        loop {
            let s = self.json(&["pool", "show", pool])["scrub"].clone();
            if f(&s) {
                return s;
            }
            assert!(t.elapsed() < limit, "{what}: {s}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs a command that must fail; returns its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.cli(args);
        assert!(
            !o.success,
            "tessera {args:?} succeeded but should have failed:\n{}",
            o.stdout
        );
        assert!(
            o.stderr.starts_with("error: "),
            "no error line for {args:?}: {}",
            o.stderr
        );
        o.stderr
    }

    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> Resp {
        http(&self.sock, method, path, body).expect("API reachable")
    }

    /// SIGTERM and wait: a clean stop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    assert!(st.success(), "daemon exited with {st} on SIGTERM: {}", self.logs());
                    return;
                }
                assert!(t.elapsed() < Duration::from_secs(60), "daemon ignored SIGTERM");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Tests run side by side: unless a test chooses, the iSCSI portal and the NBD server take
/// any free port.
fn default_portal(args: &[&str]) -> Vec<&'static str> {
    let mut v = Vec::new();
    if !args.contains(&"--iscsi-listen") {
        v.extend(["--iscsi-listen", "127.0.0.1:0"]);
    }
    if !args.contains(&"--nbd-listen") {
        // Plain NBD on loopback, so that tests of the protocol use nbd:// URIs; the tests of
        // NBD's access control choose their own listener.
        v.extend(["--nbd-listen", "127.0.0.1:0", "--nbd-insecure"]);
    }
    v
}

#[derive(Debug)]
pub struct Out {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Out {
    fn from(o: Output) -> Out {
        Out {
            success: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).to_string(),
        }
    }
}

pub struct Resp {
    pub status: u16,
    pub body: String,
    /// The status line and headers, as received.
    pub head: String,
}

impl Resp {
    /// The first header `name` (any case), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// The stable error code of an error response.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code in {}", self.body))
            .to_string()
    }
}

/// One HTTP/1.1 request on a fresh connection (unix socket), `Connection: close`.
pub fn http(sock: &Path, method: &str, path: &str, body: Option<&str>) -> std::io::Result<Resp> {
    let s = UnixStream::connect(sock)?;
    exchange(s, method, path, body, &[("Host", "localhost")])
}

pub fn http_tcp(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> std::io::Result<Resp> {
    let s = std::net::TcpStream::connect(addr)?;
    // The address is the Host, as a client that connects to it by address sends, unless the
    // caller sends another.
    let mut all = headers.to_vec();
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        all.push(("Host", addr));
    }
    exchange(s, method, path, body, &all)
}

fn exchange<S: Read + Write>(
    mut s: S,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> std::io::Result<Resp> {
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req += "Content-Type: application/json\r\n";
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok(Resp {
        status,
        body: body.to_string(),
        head: head.to_string(),
    })
}

/// Sparse files to serve as disks.
pub fn disks(dir: &Path, n: usize, size: u64) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|i| {
            let p = dir.join(format!("d{i}.img"));
            File::create(&p).unwrap().set_len(size).unwrap();
            p.display().to_string()
        })
        .collect()
}

/// `pool create NAME --disk A --disk B ... --slab-size 64M`.
/// Pool "s" on three 256 MiB file disks under `dir`, holding `img` imported as the 2-way
/// mirror vdisk "s/m". Returns the disks.
pub fn mirror_pool_with(d: &Daemon, dir: &Path, img: &Path) -> Vec<String> {
    let disks = disks(dir, 3, 256 << 20);
    create_pool(d, "s", &disks);
    d.ok(&[
        "vdisk",
        "import",
        "s/m",
        img.to_str().unwrap(),
        "--layout",
        "mirror",
        "--columns",
        "1",
    ]);
    disks
}

pub fn create_pool(d: &Daemon, name: &str, disks: &[String]) {
    let mut args = vec!["pool", "create", name, "--slab-size", "64M"];
    for p in disks {
        args.push("--disk");
        args.push(p);
    }
    d.ok(&args);
}

/// A raw image of `size` bytes: random data with zero runs and a hole in it.
pub fn random_image(path: &Path, size: u64, seed: u64) {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut f = File::create(path).unwrap();
    let chunk = 1 << 20;
    let mut buf = vec![0u8; chunk];
    let mut pos = 0u64;
    while pos < size {
        let n = (chunk as u64).min(size - pos) as usize;
        let mb = pos >> 20;
        if mb % 16 == 3 {
            buf[..n].fill(0); // zero run, written
        } else if mb % 16 == 9 {
            // a hole: skip ahead
            pos += n as u64;
            continue;
        } else {
            rng.fill_bytes(&mut buf[..n]);
            // and some zero blocks inside data
            if n >= 8192 {
                buf[4096..8192].fill(0);
            }
        }
        use std::os::unix::fs::FileExt;
        f.write_all_at(&buf[..n], pos).unwrap();
        pos += n as u64;
    }
    f.set_len(size).unwrap();
    f.flush().unwrap();
}

/// True when `back` (a whole vdisk read back into a file), cut to the length of `img`, equals
/// `img`.
pub fn read_back_matches(img: &Path, back: &Path) -> bool {
    let len = std::fs::metadata(img).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(back)
        .unwrap()
        .set_len(len)
        .unwrap();
    same_file(img, back)
}

pub fn same_file(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// Bytes a file occupies on disk.
pub fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// Runs a tool nobody here wrote: (success, stdout and stderr). Panics if it cannot be
/// started.
pub fn run(cmd: &str, args: &[&str]) -> (bool, String) {
    run_env(cmd, args, &[])
}

pub fn run_env(cmd: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    started(cmd, args, env).unwrap_or_else(|e| panic!("{cmd}: {e} (scripts/install-deps.sh test installs it)"))
}

/// As [`run`], but never panics, for what runs while a failed test unwinds: a tool that
/// cannot be started failed, and says why.
pub fn try_run(cmd: &str, args: &[&str]) -> (bool, String) {
    started(cmd, args, &[]).unwrap_or_else(|e| (false, format!("{cmd}: {e}")))
}

fn started(cmd: &str, args: &[&str], env: &[(&str, &str)]) -> std::io::Result<(bool, String)> {
    let o = Command::new(cmd).args(args).envs(env.iter().copied()).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok((o.status.success(), text))
}

/// Runs a tool that must succeed; its output.
pub fn ok(cmd: &str, args: &[&str]) -> String {
    let (success, out) = run(cmd, args);
    assert!(success, "{cmd} {args:?} failed:\n{out}");
    out
}

/// The pool's entry in `pool list --json` at daemon `d`.
pub fn pool_entry(d: &Daemon, pool: &str) -> serde_json::Value {
    let list = d.json(&["pool", "list"]);
    list.as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == pool)
        .cloned()
        .unwrap_or_else(|| panic!("no pool {pool} in {list}"))
}

/// Waits until daemon `d` serves `pool` (it took it over), up to `limit`; returns how long.
pub fn until_served(d: &Daemon, pool: &str, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        let p = pool_entry(d, pool);
        if p["health"] != "unavailable" {
            assert_eq!(p["rados"]["here"], true, "{p}");
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "not taken over after {limit:?}: {p}\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The member disk holding the most data, among the healthy ones.
pub fn busiest_disk(d: &Daemon, pool: &str) -> String {
    d.json(&["disk", "list", pool])
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["state"] == "healthy")
        .max_by_key(|x| x["used_bytes"].as_u64())
        .unwrap()["path"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The address a banner line starting with `prefix` gives (`http://ADDR...`).
pub fn banner_addr(d: &Daemon, prefix: &str) -> String {
    let out = d.stdout();
    out.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .and_then(|l| l.split("http://").nth(1))
        .and_then(|s| s.split(['/', ' ']).next())
        .unwrap_or_else(|| panic!("no '{prefix}' address in the banner: {out}"))
        .to_string()
}

/// Fails unless `promtool check metrics` (Debian's prometheus) accepts `text`.
pub fn promtool_accepts(text: &str) {
    let mut c = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian prometheus) is installed by scripts/install-deps.sh test");
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The values of the samples of `name` whose labels include every pair of `labels`.
pub fn samples<'a>(text: &'a str, name: &'a str, labels: &'a [(&str, &str)]) -> impl Iterator<Item = f64> + 'a {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(move |l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        (n == name && all).then(|| value.parse().ok())?
    })
}

/// The value of the first sample of `name` whose labels include every pair of `labels`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(text, name, labels).next()
}

/// The sum of every sample of `name` whose labels include every pair of `labels`.
pub fn total(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, name, labels).sum()
}

/// A host's iSCSI session to target `iqn` at `portal` as `initiator`, with the runtime it
/// runs on.
pub fn iscsi_host(
    portal: &str,
    iqn: &str,
    initiator: &str,
) -> (tokio::runtime::Runtime, tessera_iscsi::initiator::Session) {
    use tessera_iscsi::initiator::{LoginConfig, Session};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt
        .block_on(Session::login(portal, &LoginConfig::new(initiator, Some(iqn))))
        .unwrap();
    (rt, s)
}

/// The configuration of gateway `name` on the etcd at `etcd`, under `prefix`, with a lease of
/// 3 s.
pub fn gateway_config(name: &str, etcd: &str, prefix: &str) -> String {
    format!("[gateway]\nname = \"{name}\"\netcd = [\"{etcd}\"]\nlease_seconds = 3\nprefix = \"{prefix}\"\n")
}

/// The CLI's arguments to make pool `pool` of 4 GiB in 64 MiB slabs in RADOS pool
/// `rados_pool` of the Ceph cluster that `conf` names.
pub fn rados_pool_args<'a>(pool: &'a str, rados_pool: &'a str, conf: &'a str) -> [&'a str; 11] {
    [
        "pool",
        "create",
        pool,
        "--rados",
        rados_pool,
        "--ceph-conf",
        conf,
        "--capacity",
        "4G",
        "--slab-size",
        "64M",
    ]
}
