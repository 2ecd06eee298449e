//! An etcd cluster of a test's own: three members on loopback in plain text, as an
//! installation that must survive the loss of one runs it. A member can be killed and started
//! again on its data, as after a crash.

use std::process::{Child, Command, Stdio};

use crate::tls_etcd::{etcdctl, free_port, log, need_tools, until_healthy};

/// How many members.
pub const MEMBERS: usize = 3;

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// The running members; killed when dropped.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    /// Every member's client endpoint, `http://127.0.0.1:PORT`.
    pub endpoints: Vec<String>,
}

impl EtcdCluster {
    /// Starts the members and waits until the cluster answers, or says why it did not (`etcd`
    /// or `etcdctl` missing, or a member that did not start).
    pub fn start() -> Result<EtcdCluster, String> {
        need_tools(&["etcd", "etcdctl"])?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut members = Vec::new();
        for k in 0..MEMBERS {
            members.push(Member {
                name: format!("m{k}"),
                client: free_port()?,
                peer: free_port()?,
                child: None,
            });
        }
        let endpoints = members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect();
        let mut cluster = EtcdCluster {
            dir,
            members,
            endpoints,
        };
        for k in 0..MEMBERS {
            cluster.spawn(k)?;
        }
        cluster.until_healthy()?;
        Ok(cluster)
    }

    fn spawn(&mut self, k: usize) -> Result<(), String> {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let m = &self.members[k];
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let dir = self.dir.path().join(&m.name);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let child = Command::new("etcd")
            .current_dir(&dir)
            .args(["--name", &m.name, "--data-dir", "data"])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args([
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-state",
                "new",
            ])
            .stdout(Stdio::null())
            .stderr(log(&dir)?)
            .spawn()
            .map_err(|e| format!("cannot start etcd: {e}"))?;
        self.members[k].child = Some(child);
        Ok(())
    }

    /// Kills member `k` (SIGKILL).
    pub fn kill(&mut self, k: usize) {
        if let Some(mut c) = self.members[k].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends member `k` signal `sig` (SIGSTOP, SIGCONT).
    pub fn signal(&self, k: usize, sig: i32) {
        let child = self.members[k].child.as_ref().expect("member running");
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    }

    /// Starts member `k` again on its data, and waits until the whole cluster answers.
    pub fn start_again(&mut self, k: usize) -> Result<(), String> {
        self.spawn(k)?;
        self.until_healthy()
    }

    /// Waits until every member answers; if they do not in time, says why with the end of
    /// each member's log (any of them may be the one that failed).
    pub fn until_healthy(&self) -> Result<(), String> {
        let d = self.dir.path().join("m0");
        until_healthy(&d, || self.ctl(&["endpoint", "health", "--cluster"]).is_ok()).map_err(|_| {
            let mut why = String::from("the etcd cluster did not answer within 20 s");
            for m in &self.members {
                let log = std::fs::read_to_string(self.dir.path().join(&m.name).join("etcd.log")).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                why += &format!(
                    "\n--- {} ---\n{}",
                    m.name,
                    lines[lines.len().saturating_sub(15)..].join("\n")
                );
            }
            why
        })
    }

    /// The member that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..MEMBERS).find(|&k| {
            let mut c = Command::new("etcdctl");
            c.args(["--endpoints", &self.endpoints[k]]);
            self.members[k].child.is_some()
                && etcdctl(c, &["endpoint", "status", "-w", "fields"]).is_ok_and(|out| {
                    let field = |name: &str| {
                        out.lines()
                            .find_map(|l| l.strip_prefix(&format!("\"{name}\" : ")))
                            .map(str::trim)
                            .map(String::from)
                    };
                    field("Leader").is_some_and(|l| Some(l) == field("MemberID"))
                })
        })
    }

    /// Runs `etcdctl` against every member.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let mut c = Command::new("etcdctl");
        c.args(["--endpoints", &self.endpoints.join(",")]);
        etcdctl(c, args)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for k in 0..MEMBERS {
            self.kill(k);
        }
    }
}
