//! Pools wholly in a Ceph cluster, served by one of several gateways.
//!
//! Such a pool keeps nothing on this machine but a note of where it lives (`rados.json` in
//! its directory): its data is one thin disk of 4 MiB objects (`tessera.NAME.data.*`), its
//! metadata the omap of one object (`tessera.NAME.meta`), both in a RADOS pool whose
//! redundancy it uses. Tessera's own block checksums are off for it: BlueStore checks every
//! read, and Tessera's checksum pages live beside one gateway, where another that takes the
//! pool over cannot see them (and would find them stale once it gave the pool back).
//!
//! One gateway owns a pool at a time: the etcd key `PREFIX/owner/pool.NAME` on the gateway's
//! lease, whose creation revision is the epoch that guards every data and metadata write
//! (`tessera_ownership::fence`). A gateway takes a pool only when nobody owns it, after it
//! fenced the previous owner's RADOS client off (blocklist). Each taking connects to the
//! cluster afresh, so that a gateway that lost a pool and takes it again is not at an address
//! it may have been fenced at.
//!
//! Built with the `rados` feature; without it, joining as a gateway fails with a clear error
//! and nothing else here can be reached.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::GatewayConfig;
use crate::data_paths::DataPaths;
use crate::model::RadosPlacement;

/// How often a gateway checks its lease and tries to take the pools nobody owns.
pub const TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// The file in a pool's directory that says the pool is on RADOS, and where.
pub const PLACEMENT_FILE: &str = "rados.json";

pub const DEFAULT_CEPH_CONF: &str = "/etc/ceph/ceph.conf";
pub const DEFAULT_CLIENT: &str = "admin";

/// Why a pool's place among the gateways (the RADOS pool and cluster it lives in, as etcd
/// records it) is not confirmed where it is asked for.
#[derive(Debug)]
pub enum PlaceRefused {
    /// A pool of this name lives elsewhere: another RADOS pool or cluster.
    Elsewhere(String),
    /// The RADOS pool asked for is not in the cluster.
    Invalid(String),
    /// What would say could not be read: etcd or the cluster did not answer (or refused
    /// this gateway's client), or the RADOS pool could not be opened.
    Unknown(String),
}

impl std::fmt::Display for PlaceRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlaceRefused::Elsewhere(m) | PlaceRefused::Invalid(m) | PlaceRefused::Unknown(m) => f.write_str(m),
        }
    }
}

impl From<String> for PlaceRefused {
    fn from(m: String) -> PlaceRefused {
        PlaceRefused::Unknown(m)
    }
}

/// Where a pool on RADOS lives, with the defaults filled in, as `rados.json` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub rados_pool: String,
    pub ceph_conf: String,
    pub client_name: String,
}

impl Placement {
    pub fn new(p: &RadosPlacement) -> Result<Placement, String> {
        let ok = |s: &str| !s.is_empty() && !s.contains('\0') && !s.contains(char::is_whitespace);
        if !ok(&p.pool) {
            return Err(format!("'{}' is not a RADOS pool name", p.pool));
        }
        let ceph_conf = p.ceph_conf.clone().unwrap_or_else(|| DEFAULT_CEPH_CONF.into());
        if !Path::new(&ceph_conf).is_absolute() {
            return Err(format!(
                "the Ceph configuration file '{ceph_conf}' must be an absolute path"
            ));
        }
        let client_name = p.client_name.clone().unwrap_or_else(|| DEFAULT_CLIENT.into());
        if !ok(&client_name) || client_name.starts_with("client.") {
            return Err(format!(
                "'{client_name}' is not a Ceph client name (give it without \"client.\", e.g. admin)"
            ));
        }
        Ok(Placement {
            rados_pool: p.pool.clone(),
            ceph_conf,
            client_name,
        })
    }

    pub fn read(dir: &Path) -> Result<Option<Placement>, String> {
        // Written as every state file is (statefile), with the format it was written in.
        crate::statefile::read_json(
            &dir.join(PLACEMENT_FILE),
            "fix it, or import the pool again with --rados",
        )
    }

    pub fn write(&self, dir: &Path) -> Result<(), String> {
        let p = dir.join(PLACEMENT_FILE);
        crate::statefile::write_json(&p, self).map_err(|e| format!("cannot record {}: {e}", p.display()))
    }

    /// The object names of pool `name`: its data disk's prefix and its metadata object.
    pub fn data_prefix(name: &str) -> String {
        format!("tessera.{name}.data")
    }

    pub fn meta_object(name: &str) -> String {
        format!("tessera.{name}.meta")
    }

    /// The engine's path for the pool's one disk.
    pub fn disk_path(&self, name: &str) -> String {
        format!("rados:{}/{}", self.rados_pool, Self::data_prefix(name))
    }
}

/// Who owns a pool, as a gateway learned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOwner {
    /// The owner as shown (an earlier run of this gateway says so).
    pub gateway: String,
    /// The owner's name among the gateways.
    pub name: String,
    pub epoch: i64,
}

#[cfg(feature = "rados")]
pub use membership::{KeptRunning, Membership, PoolNotices, Taking};
#[cfg(feature = "rados")]
pub use owned::{Owned, Refusals};
#[cfg(feature = "rados")]
pub use reader::Reader;
#[cfg(feature = "rados")]
pub use tessera_ownership::{Ask, AsksComing};

#[cfg(feature = "rados")]
mod cluster;
#[cfg(feature = "rados")]
mod membership;
#[cfg(feature = "rados")]
mod owned;
#[cfg(feature = "rados")]
mod reader;

/// Without the `rados` feature: joining fails and says why, so nothing else is reachable.
#[cfg(not(feature = "rados"))]
pub use absent::{Ask, AsksComing, KeptRunning, Membership, Owned, PoolNotices, Reader, Refusals, Taking};

#[cfg(not(feature = "rados"))]
mod absent;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_is_checked_and_given_its_defaults() {
        let p = |pool: &str, conf: Option<&str>, client: Option<&str>| {
            Placement::new(&RadosPlacement {
                pool: pool.into(),
                ceph_conf: conf.map(String::from),
                client_name: client.map(String::from),
            })
        };
        assert_eq!(
            p("rbd", None, None).unwrap(),
            Placement {
                rados_pool: "rbd".into(),
                ceph_conf: DEFAULT_CEPH_CONF.into(),
                client_name: DEFAULT_CLIENT.into(),
            }
        );
        assert!(p("", None, None).unwrap_err().contains("not a RADOS pool name"));
        assert!(p("a b", None, None).is_err());
        assert!(p("rbd", Some("ceph.conf"), None).unwrap_err().contains("absolute"));
        assert!(p("rbd", None, Some("client.admin")).unwrap_err().contains("without"));
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Placement::read(dir.path()).unwrap(), None);
        let placed = p("rbd", Some("/etc/ceph/c.conf"), Some("gw")).unwrap();
        placed.write(dir.path()).unwrap();
        assert_eq!(Placement::read(dir.path()).unwrap(), Some(placed.clone()));
        assert_eq!(placed.disk_path("tank"), "rados:rbd/tessera.tank.data");
    }

    /// The password file is one line, readable by its owner only.
    #[cfg(feature = "rados")]
    #[test]
    fn an_etcd_password_file_is_one_line_that_only_its_owner_reads() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        let user = |text: &str, mode: u32| {
            std::fs::write(&file, text).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            super::membership::etcd_user(&("gw-a".to_string(), file.clone()))
        };
        let u = user("s3cret\n", 0o600).unwrap();
        assert_eq!((u.name.as_str(), u.password.as_str()), ("gw-a", "s3cret"));
        assert_eq!(user("s3cret", 0o400).unwrap().password, "s3cret");
        assert!(user("s3cret\n", 0o644).unwrap_err().contains("chmod 600"));
        assert!(user("\n", 0o600).unwrap_err().contains("on one line"));
        assert!(user("a\nb\n", 0o600).unwrap_err().contains("on one line"));
        let missing = super::membership::etcd_user(&("gw-a".to_string(), dir.path().join("none")));
        assert!(missing.unwrap_err().contains("cannot read"));
        // A file of another user's (the tests may run as root, which may chown it).
        std::fs::write(&file, "s3cret\n").unwrap();
        if std::os::unix::fs::chown(&file, Some(4242), None).is_ok() {
            let e = super::membership::etcd_user(&("gw-a".to_string(), file.clone())).unwrap_err();
            assert!(e.contains("belongs to user 4242"), "{e}");
        }
    }
}
