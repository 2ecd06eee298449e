//! An etcd of a test's own that serves TLS only and knows its clients by their certificates
//! (`--client-cert-auth`), with authentication on: the certificate's common name is the etcd
//! user. Certificates come from the `openssl` command, the server from Debian's `etcd`, users
//! and roles from `etcdctl`, as an administrator would set them up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The running etcd; killed when dropped.
pub struct TlsEtcd {
    pub dir: tempfile::TempDir,
    pub endpoint: String,
    child: Child,
}

/// A certificate and its key, as files.
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsEtcd {
    /// Starts one, or None (with why) when `etcd`, `etcdctl` or `openssl` is missing.
    pub fn start() -> Result<TlsEtcd, String> {
        need_tools(&["etcd", "etcdctl", "openssl"])?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let d = dir.path();
        new_key(d, "ca.key", "ca.pem", "tessera-test-ca", &["-x509", "-days", "2"])?;
        sign(
            d,
            "server",
            "etcd",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )?;
        let (endpoint, child) = spawn_etcd(
            d,
            "https",
            &[
                "--cert-file",
                "server.pem",
                "--key-file",
                "server.key",
                "--trusted-ca-file",
                "ca.pem",
                "--client-cert-auth",
            ],
        )?;
        let etcd = TlsEtcd { dir, endpoint, child };
        etcd.identity("root")?;
        until_healthy(etcd.dir.path(), || etcd.ctl("root", &["endpoint", "health"]).is_ok())?;
        etcd.ctl("root", &["user", "add", "root", "--no-password"])?;
        etcd.ctl("root", &["user", "grant-role", "root", "root"])?;
        etcd.ctl("root", &["auth", "enable"])?;
        Ok(etcd)
    }

    /// The certificate authority's certificate (PEM), which signed etcd's.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A client certificate whose common name (etcd user) is `user`, signed by the authority.
    pub fn identity(&self, user: &str) -> Result<Identity, String> {
        let d = self.dir.path();
        let name = format!("client-{user}");
        if !d.join(format!("{name}.pem")).exists() {
            sign(d, &name, user, "extendedKeyUsage=clientAuth\n")?;
        }
        Ok(Identity {
            cert: d.join(format!("{name}.pem")),
            key: d.join(format!("{name}.key")),
        })
    }

    /// Makes etcd user `user` (known by its certificate), allowed to read and write the keys
    /// under `prefix` only.
    pub fn user_for_prefix(&self, user: &str, prefix: &str) -> Result<Identity, String> {
        let role = format!("{user}-role");
        self.ctl("root", &["user", "add", user, "--no-password"])?;
        self.ctl("root", &["role", "add", &role])?;
        self.ctl(
            "root",
            &["role", "grant-permission", &role, "readwrite", prefix, "--prefix=true"],
        )?;
        self.ctl("root", &["user", "grant-role", user, &role])?;
        self.identity(user)
    }

    /// Runs `etcdctl` as `user`.
    pub fn ctl(&self, user: &str, args: &[&str]) -> Result<String, String> {
        let id = self.identity(user)?;
        let mut c = Command::new("etcdctl");
        c.args(["--endpoints", &self.endpoint, "--cacert"])
            .arg(self.ca())
            .arg("--cert")
            .arg(&id.cert)
            .arg("--key")
            .arg(&id.key);
        etcdctl(c, args)
    }
}

/// Runs `c` (`etcdctl` with the endpoints and credentials to use), with `args` after them:
/// its output, or why it failed.
pub(crate) fn etcdctl(mut c: Command, args: &[&str]) -> Result<String, String> {
    let out = c
        .env("ETCDCTL_API", "3")
        .args(["--dial-timeout", "2s"])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run etcdctl: {e}"))?;
    if !out.status.success() {
        return Err(format!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Signs `<name>.pem` (with its new key `<name>.key`) for common name `cn` with the authority.
fn sign(d: &Path, name: &str, cn: &str, extensions: &str) -> Result<(), String> {
    let (key, csr, ext) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.ext"));
    new_key(d, &key, &csr, cn, &[])?;
    std::fs::write(d.join(&ext), extensions).map_err(|e| e.to_string())?;
    run(
        d,
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    )
}

/// A new P-256 key `key` and, for common name `cn`, `out`: a certificate request, or with
/// `extra` `-x509` a certificate the key signs itself.
fn new_key(d: &Path, key: &str, out: &str, cn: &str, extra: &[&str]) -> Result<(), String> {
    let subject = format!("/CN={cn}");
    let mut args = vec!["req"];
    args.extend_from_slice(extra);
    args.extend([
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        key,
        "-out",
        out,
        "-subj",
        &subject,
    ]);
    run(d, "openssl", &args)
}

fn run(d: &Path, program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .current_dir(d)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Starts a one-member etcd in `d` (its data and its log there), serving `scheme` on a free
/// loopback port, with `extra` arguments; its client endpoint, and the process.
pub(crate) fn spawn_etcd(d: &Path, scheme: &str, extra: &[&str]) -> Result<(String, Child), String> {
    spawn_etcd_on(d, scheme, (free_port()?, free_port()?), extra)
}

/// [`spawn_etcd`] on these client and peer ports (an etcd started again where it was).
pub(crate) fn spawn_etcd_on(
    d: &Path,
    scheme: &str,
    (client, peer): (u16, u16),
    extra: &[&str],
) -> Result<(String, Child), String> {
    let endpoint = format!("{scheme}://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .current_dir(d)
        .args(["--name", "t", "--data-dir", "data"])
        .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("t={peer_url}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log(d)?)
        .spawn()
        .map_err(|e| format!("cannot start etcd: {e}"))?;
    Ok((endpoint, child))
}

/// etcd's log in `d`, appended to (by each start of the same etcd).
pub(crate) fn log(d: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.join("etcd.log"))
        .map_err(|e| e.to_string())
}

/// Waits up to 20 s for `healthy`; the etcd's log in `d` if it never is.
pub(crate) fn until_healthy(d: &Path, healthy: impl Fn() -> bool) -> Result<(), String> {
    let started = Instant::now();
    while !healthy() {
        if started.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "etcd did not start: {}",
                std::fs::read_to_string(d.join("etcd.log")).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Says which of `tools` is missing, if one is.
pub(crate) fn need_tools(tools: &[&str]) -> Result<(), String> {
    for tool in tools {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            return Err(format!("no '{tool}' (scripts/install-deps.sh test installs it)"));
        }
    }
    Ok(())
}

/// A TCP port nobody listens on now, and one this process has not handed out before. The
/// tests of a binary run side by side, each starting its etcd members on ports from here,
/// and a port let go of is free again for the next caller until etcd binds it: two members
/// of different tests given the same port would leave one unstarted, while the health check
/// (which asks whichever member answers for the cluster's members) could pass on the other
/// test's cluster, whose members that test may stop under this one. A gateway of
/// `a_gateway_whose_etcd_stalls_takes_its_lease_for_lost_in_time` once found its healthy
/// cluster refusing connections as it joined.
pub(crate) fn free_port() -> Result<u16, String> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..100 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    Err("no TCP port that this process has not handed out already".to_string())
}
