//! An etcd of a test's own, on loopback in plain text, with authentication on and users who
//! prove themselves with passwords; its tokens lapse after the TTL the test gives (etcd's
//! `--auth-token-ttl`). Users and roles come from `etcdctl`, as an administrator makes them.

use std::process::{Child, Command};

use crate::tls_etcd::{etcdctl, free_port, need_tools, spawn_etcd_on, until_healthy};

const ROOT_PASSWORD: &str = "root-password";

/// The running etcd; killed when dropped.
pub struct PasswordEtcd {
    pub dir: tempfile::TempDir,
    pub endpoint: String,
    child: Child,
    ports: (u16, u16),
    token_ttl: u32,
}

/// etcd's settings besides where it listens: tokens that lapse after `token_ttl` s; the
/// cheapest cost bcrypt takes (the tests authenticate often); and a snapshot after every
/// change, so that a restart forgets the tokens, as a busy etcd does (it replays its log
/// since its last snapshot as it starts, and with it the authentications logged since,
/// whose tokens it then knows again).
fn settings(token_ttl: u32) -> Vec<String> {
    let ttl = token_ttl.to_string();
    ["--auth-token-ttl", &ttl, "--bcrypt-cost", "4", "--snapshot-count", "1"]
        .map(String::from)
        .to_vec()
}

impl PasswordEtcd {
    /// Starts one whose tokens lapse `token_ttl` seconds after their last use, or None (with
    /// why) when `etcd` or `etcdctl` is missing.
    pub fn start(token_ttl: u32) -> Result<PasswordEtcd, String> {
        need_tools(&["etcd", "etcdctl"])?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let d = dir.path();
        let ports = (free_port()?, free_port()?);
        let extra = settings(token_ttl);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let (endpoint, child) = spawn_etcd_on(d, "http", ports, &extra)?;
        let etcd = PasswordEtcd {
            dir,
            endpoint,
            child,
            ports,
            token_ttl,
        };
        until_healthy(etcd.dir.path(), || etcd.ctl(None, &["endpoint", "health"]).is_ok())?;
        etcd.ctl(None, &["user", "add", &format!("root:{ROOT_PASSWORD}")])?;
        etcd.ctl(None, &["user", "grant-role", "root", "root"])?;
        etcd.ctl(None, &["auth", "enable"])?;
        Ok(etcd)
    }

    /// Kills etcd (SIGKILL) and starts it again on its data and ports, as a restart after a
    /// crash: its keys and leases are kept, its simple tokens are not. Returns once it answers.
    pub fn restart(&mut self) -> Result<(), String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let extra = settings(self.token_ttl);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let (_, child) = spawn_etcd_on(self.dir.path(), "http", self.ports, &extra)?;
        self.child = child;
        // Authentication is on now: a health check of nobody's is refused.
        until_healthy(self.dir.path(), || self.ctl_as_root(&["endpoint", "health"]).is_ok())
    }

    /// Makes etcd user `user` with `password`, allowed to read and write the keys under
    /// `prefix` only.
    pub fn user_for_prefix(&self, user: &str, password: &str, prefix: &str) -> Result<(), String> {
        let role = format!("{user}-role");
        let root = Some(("root", ROOT_PASSWORD));
        self.ctl(root, &["user", "add", &format!("{user}:{password}")])?;
        self.ctl(root, &["role", "add", &role])?;
        self.ctl(
            root,
            &["role", "grant-permission", &role, "readwrite", prefix, "--prefix=true"],
        )?;
        self.ctl(root, &["user", "grant-role", user, &role])?;
        Ok(())
    }

    /// Runs `etcdctl` as etcd's root user.
    pub fn ctl_as_root(&self, args: &[&str]) -> Result<String, String> {
        self.ctl(Some(("root", ROOT_PASSWORD)), args)
    }

    /// Runs `etcdctl` as `user` (name, password), or as nobody.
    fn ctl(&self, user: Option<(&str, &str)>, args: &[&str]) -> Result<String, String> {
        let mut c = Command::new("etcdctl");
        c.args(["--endpoints", &self.endpoint]);
        if let Some((name, password)) = user {
            c.args(["--user", &format!("{name}:{password}")]);
        }
        etcdctl(c, args)
    }
}

impl Drop for PasswordEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
