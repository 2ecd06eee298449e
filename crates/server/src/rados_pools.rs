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
pub use real::{KeptRunning, Membership, Owned, PoolNotices, Reader, Taking};
#[cfg(feature = "rados")]
pub use tessera_ownership::{Ask, AsksComing};

#[cfg(feature = "rados")]
mod real {
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use tessera_disk::DiskRef;
    use tessera_ownership::fence::take_over;
    use tessera_ownership::fenced_disk::FencedDisk;
    use tessera_ownership::rados_meta::{last_owner, RadosMeta, VERSION_ATTR};
    use tessera_ownership::{Ask, AsksComing, Courier, Gateway, Lasting, NoticesComing};
    use tessera_pool::{MetaStore, Pool};
    use tessera_rados::Cluster;
    use tessera_volume::Engine;
    use tokio::runtime::Handle;

    use super::*;
    use crate::data_paths::{through, DataUse};
    use crate::standby::StandbyUnit;
    use crate::targets::lun_uid_of;

    /// Whether the metadata object of pool `name` is in `pool`: one a first batch made
    /// carries its version.
    fn metadata_is_there(pool: &tessera_rados::Pool<'_>, name: &str) -> Result<bool, String> {
        let version = pool
            .xattr(&Placement::meta_object(name), VERSION_ATTR)
            .map_err(|e| format!("cannot read the metadata of pool {name}: {e}"))?;
        Ok(version.is_some())
    }

    /// Fails, saying why, if the opening of pool `name` would refuse its records or its
    /// label as the cluster holds them (its configuration record missing or unreadable, or
    /// naming no disk where `placement` says; its label wiped, or another pool's), or cannot
    /// read them now (a timeout). Checked before a
    /// taking, which fences the previous owner's connection off (a blocklist entry that
    /// lasts 30 days, and a new map for every OSD and client): a damaged pool tried again
    /// every 30 s would otherwise add thousands of entries a day, each for an opening that
    /// fails.
    fn openable_records(cluster: &Arc<Cluster>, name: &str, placement: &Placement) -> Result<(), String> {
        let pool = records_pool(cluster, placement)?;
        // An opening refuses a disk without the pool's label too: wiped by a destruction
        // that has not removed the records yet, say. Read here, through the handle the
        // records are then read through, and judged after them.
        let label = label_in(&pool, placement, name);
        // Read only: the epoch is never written.
        let records = MetaStore::on(RadosMeta::new(pool, &Placement::meta_object(name), 0));
        let not_taken =
            "it is not taken until that is put right (each taking would fence a connection off for nothing)";
        let config = Pool::recorded_config(&records)
            .map_err(|e| format!("the records of pool {name} cannot be read: {e}; {not_taken}"))?;
        let path = placement.disk_path(name);
        if !config.disks.iter().any(|d| d.path == path) {
            return Err(format!(
                "the records of pool {name} name no disk {path} (they name {}): they are another pool's, or damaged; {not_taken}",
                config.disks.iter().map(|d| d.path.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        match label.map_err(|e| format!("{e}; {not_taken}"))? {
            Ok(l) if l.pool_id == config.id => Ok(()),
            Ok(l) => Err(format!(
                "the disk of pool {name} carries the label of another pool, '{}' ({}); {not_taken}",
                l.pool_name, l.pool_id
            )),
            Err(tessera_disk::LabelError::Missing { .. }) => Err(format!(
                "the label of pool {name} is gone: the pool was destroyed, or is being destroyed, at a gateway \
                 (which wipes the label before it removes the rest); {not_taken} ('tessera pool export {name}' \
                 forgets it here)"
            )),
            Err(e) => Err(format!("the label of pool {name} cannot be read ({e}); {not_taken}")),
        }
    }

    /// The RADOS pool that `placement` puts pools in, through `cluster`.
    fn records_pool(cluster: &Arc<Cluster>, placement: &Placement) -> Result<tessera_rados::Pool<'static>, String> {
        Cluster::shared_pool(cluster, &placement.rados_pool).map_err(|e| e.to_string())
    }

    /// The label of pool `name` as `pool` holds it (that of its disk), read without owning
    /// the pool: nothing is written. Err: the cluster did not answer.
    fn label_in(
        pool: &tessera_rados::Pool<'_>,
        placement: &Placement,
        name: &str,
    ) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
        let oid = tessera_ownership::fenced_disk::object_name(&Placement::data_prefix(name), 0);
        let mut block = vec![0u8; tessera_disk::LABEL_SIZE];
        match pool.read(&oid, 0, &mut block) {
            // Read as the disk reads it: what an object does not hold is zeros.
            Ok(_) => {}
            Err(e) if e.errno() == Some(libc::ENOENT) => {}
            Err(e) => return Err(format!("cannot read the label of pool {name}: {e}")),
        }
        Ok(tessera_disk::Label::decode(&placement.disk_path(name), &block))
    }

    /// The certificates `[gateway]` names for TLS to etcd, read.
    fn etcd_tls(files: &crate::config::EtcdTlsFiles) -> Result<tessera_ownership::EtcdTls, String> {
        let read = |field: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("cannot read [gateway] {field} '{}': {e}", path.display()))
        };
        Ok(tessera_ownership::EtcdTls {
            ca: read("etcd_ca_file", &files.ca)?,
            identity: match &files.identity {
                Some((cert, key)) => Some((read("etcd_cert_file", cert)?, read("etcd_key_file", key)?)),
                None => None,
            },
        })
    }

    /// The etcd user `[gateway]` names, with its password read from its file (one line; a
    /// file others may read, or that another user owns, is refused, as ssh refuses such a
    /// key). The file is opened once, and what is checked is what is read.
    pub(super) fn etcd_user((name, file): &(String, PathBuf)) -> Result<tessera_ownership::EtcdUser, String> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let shown = file.display();
        let unreadable = |e: std::io::Error| format!("cannot read [gateway] etcd_password_file '{shown}': {e}");
        let mut f = std::fs::File::open(file).map_err(unreadable)?;
        let meta = f.metadata().map_err(unreadable)?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "[gateway] etcd_password_file '{shown}' may be read by others: chmod 600 it"
            ));
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me && meta.uid() != 0 {
            return Err(format!(
                "[gateway] etcd_password_file '{shown}' belongs to user {}, not to this daemon's ({me}) nor root",
                meta.uid()
            ));
        }
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(unreadable)?;
        let password = text.strip_suffix('\n').unwrap_or(&text);
        let password = password.strip_suffix('\r').unwrap_or(password);
        if password.is_empty() || password.contains('\n') {
            return Err(format!(
                "[gateway] etcd_password_file '{shown}' must hold the password on one line"
            ));
        }
        Ok(tessera_ownership::EtcdUser::new(name.clone(), password))
    }

    /// The ownership key of pool `name` among the gateways.
    fn owner_key(name: &str) -> String {
        format!("pool.{name}")
    }

    /// The notices other gateways send about pools ([`Membership::watch_notices`]).
    pub struct PoolNotices(NoticesComing);

    impl PoolNotices {
        /// The next notices, as (pool, notice); None once the watch ended.
        pub async fn next(&mut self) -> Option<Vec<(String, Vec<u8>)>> {
            let got = self.0.next().await?;
            Some(
                got.into_iter()
                    .filter_map(|(what, n)| Some((what.strip_prefix("pool.")?.to_string(), n)))
                    .collect(),
            )
        }

        /// Where a watch made again after this one ended goes on ([`Membership::watch_notices`]).
        pub fn seen(&self) -> i64 {
            self.0.seen()
        }
    }

    /// Seconds a call to the cluster may take before it fails instead of hanging (an OSD or
    /// monitor gone away).
    const CLUSTER_TIMEOUT: &str = "30";

    /// How long a call on the membership may take, a taking with its fence (a monitor
    /// command, `CLUSTER_TIMEOUT` at most) included.
    const MEMBERSHIP_AT_MOST: Duration = Duration::from_secs(45);

    /// How long the owner's taking or answering of forwarded commands may take: a request
    /// that went to an etcd member that stalls would otherwise hold every later command up
    /// for as long as it stalls. A taking cut short runs the asks it took until then (each
    /// call bounded, [`Courier::take_asks`]), and loses at most the one it was taking; an
    /// answer cut short may still land, or not, and then the asker tells its host to try
    /// again a command that ran (what a stalled etcd costs).
    const COURIER_AT_MOST: Duration = Duration::from_secs(5);

    async fn within_courier_time<T>(
        f: impl std::future::Future<Output = tessera_ownership::Result<T>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(COURIER_AT_MOST, f).await {
            Ok(done) => done.map_err(|e| e.to_string()),
            Err(_) => Err(format!("etcd did not answer within {} s", COURIER_AT_MOST.as_secs())),
        }
    }

    /// How long an owner tries to answer a command it ran, while etcd fails it.
    const ANSWER_TRIED_FOR: Duration = Duration::from_secs(10);

    /// An ask kept alive while it runs here ([`Membership::keep_running`]), until dropped.
    pub struct KeptRunning(tokio::task::JoinHandle<()>);

    impl Drop for KeptRunning {
        fn drop(&mut self) {
            self.0.abort();
        }
    }

    /// A connection to a pool's cluster made when first needed, and only once.
    #[derive(Default)]
    struct Link(Option<Arc<Cluster>>);

    impl Link {
        fn cluster(&mut self, placement: &Placement, paths: &DataPaths) -> Result<Arc<Cluster>, String> {
            if let Some(c) = &self.0 {
                return Ok(c.clone());
            }
            let c = connect(placement, paths)?;
            self.0 = Some(c.clone());
            Ok(c)
        }
    }

    /// Connects to the cluster of `placement`. A configuration file other than the system's
    /// was named through the API: it is read through the file `paths` found and checked (no
    /// link swapped in between leads elsewhere), at every connection, so that a change of
    /// `data_paths` counts for pools made before it, and the files it names are vetted
    /// ([`DataPaths::vet_ceph_options`]) and kept so, whatever its monitors say.
    fn connect(placement: &Placement, paths: &DataPaths) -> Result<Arc<Cluster>, String> {
        let named = placement.ceph_conf != DEFAULT_CEPH_CONF;
        let found = match named {
            true => Some(paths.locate(Path::new(&placement.ceph_conf), DataUse::CephConf)?),
            false => None,
        };
        let conf = match &found {
            Some(f) => through(f).display().to_string(),
            None => placement.ceph_conf.clone(),
        };
        // The connection too: Ceph's default has it wait 300 s for monitors that do not
        // answer, and it is made in the tick, which would keep every other pool waiting.
        let options = [
            ("rados_osd_op_timeout", CLUSTER_TIMEOUT),
            ("rados_mon_op_timeout", CLUSTER_TIMEOUT),
            ("client_mount_timeout", CLUSTER_TIMEOUT),
        ];
        let client = &placement.client_name;
        match named {
            true => Cluster::connect_vetted(&conf, client, &options, |changed| {
                let mut vetted = tessera_rados::Vetted::default();
                for pin in paths.vet_ceph_options(&placement.ceph_conf, changed)? {
                    vetted.instead.push((pin.option.clone(), pin.value()));
                    vetted.keep.extend(pin.file);
                }
                Ok(vetted)
            }),
            false => Cluster::connect(&conf, client, &options),
        }
        .map_err(|e| {
            format!(
                "cannot connect to the Ceph cluster of {} as client.{}: {e}",
                placement.ceph_conf, placement.client_name
            )
        })
        .map(Arc::new)
    }

    /// A connection that only reads a pool's metadata, at a gateway that does not own the
    /// pool: what it presents of it as standby LUNs. It never writes, so its being fenced
    /// off (or not) changes nothing; the owner's connection is another.
    pub struct Reader {
        cluster: Arc<Cluster>,
        placement: Placement,
    }

    /// The label on `disk`, pool `name`'s; Err if the cluster did not answer.
    fn label_of(
        name: &str,
        disk: &dyn tessera_disk::BlockDevice,
    ) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
        match tessera_disk::read_label(disk) {
            Err(tessera_disk::LabelError::Disk(e)) => Err(format!("cannot read the label of pool {name}: {e}")),
            found => Ok(found),
        }
    }

    impl Reader {
        pub fn connect(placement: &Placement, paths: &DataPaths) -> Result<Reader, String> {
            Ok(Reader {
                cluster: connect(placement, paths)?,
                placement: placement.clone(),
            })
        }

        /// Whether an owner of pool `name` at `epoch` or later has opened it (and so fenced
        /// the owners before it off).
        pub fn opened_since(&self, name: &str, epoch: i64) -> Result<bool, String> {
            let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
            tessera_ownership::rados_meta::written_since(&pool, &Placement::meta_object(name), epoch)
                .map_err(|e| format!("cannot learn who last opened pool {name}: {e}"))
        }

        /// [`Owned::label`], read without owning the pool (nothing is written through it).
        pub fn label(&self, name: &str) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
            label_in(&records_pool(&self.cluster, &self.placement)?, &self.placement, name)
        }

        /// What the metadata of pool `name` records of the vdisks `wanted` ("pool/vdisk"):
        /// those it holds, each with its logical unit's id and mode settings.
        pub fn units(&self, name: &str, wanted: &[String]) -> Result<Vec<(String, StandbyUnit)>, String> {
            let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
            // Epoch 0: nothing is written through it.
            let meta = MetaStore::on(RadosMeta::new(pool, &Placement::meta_object(name), 0));
            let id = Pool::recorded_config(&meta).map_err(|e| e.to_string())?.id.as_u128();
            let mut out = Vec::new();
            for config in Engine::recorded_vdisks(&meta).map_err(|e| e.to_string())? {
                let full = format!("{name}/{}", config.name);
                if !wanted.contains(&full) {
                    continue;
                }
                let mode = Engine::recorded_lun_state(&meta, config.id, crate::targets::MODE_RECORD)
                    .map_err(|e| e.to_string())?
                    .and_then(|b| serde_json::from_slice(&b).ok());
                let unit = StandbyUnit {
                    uid: lun_uid_of(id, config.id),
                    config,
                    mode,
                };
                out.push((full, unit));
            }
            Ok(out)
        }
    }

    /// This daemon's membership among the gateways: its etcd lease, renewed in the
    /// background. Its methods block; call them from blocking threads.
    pub struct Membership {
        cfg: GatewayConfig,
        rt: Handle,
        /// None while this gateway has not joined: etcd did not answer when the daemon
        /// started. The daemon serves its local pools meanwhile and tries again every tick.
        gateway: tokio::sync::Mutex<Option<Gateway>>,
        /// Notified when a gateway's key changes in etcd (see [`changes`](Self::changes)).
        changes: Arc<tokio::sync::Notify>,
        /// What [`alive`](Self::alive) last found, for readers that must not wait for a
        /// taking under way (which holds the gateway for as long as the cluster takes).
        seen_alive: std::sync::atomic::AtomicBool,
        /// The place of each pool this gateway looked for ([`place_of`](Self::place_of)), by
        /// its name, configuration file and RADOS pool.
        places: std::sync::Mutex<std::collections::HashMap<(String, String, String), String>>,
        /// Where the API may point the daemon: the Ceph configuration files of pools.
        paths: DataPaths,
        /// This run's end of the channel between the gateways, once joined: reached
        /// without waiting for `gateway`, which a taking holds for as long as it takes.
        courier: std::sync::Mutex<Option<Courier>>,
        /// Why the last attempt to join failed, for what waits on the joining to say.
        join_failed: std::sync::Mutex<Option<String>>,
        /// The notices to send, in the order they were raised, to the task that sends them
        /// one after another ([`notify`](Self::notify)).
        notices_out: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<(Courier, String, Vec<u8>)>>,
    }

    /// The outcome of an attempt to take a pool.
    pub enum Taking {
        /// This gateway owns it now, and may serve it at this epoch.
        Mine(Owned),
        /// Another gateway owns it.
        Elsewhere(PoolOwner),
        /// This gateway took it, could not fence the previous owner off (this gateway's
        /// Ceph client may not blocklist, the monitors did not answer), and gave it back:
        /// why, and whether the refusal lasts (a permission) or may pass by itself (a
        /// timeout). Trying again at once would keep it from the gateways that could serve it.
        GaveBack { why: String, lasting: bool },
    }

    /// A pool this gateway took: its own connection to the cluster and its epoch.
    pub struct Owned {
        cluster: Arc<Cluster>,
        placement: Placement,
        pub epoch: i64,
        /// The lease it was taken under: it is this gateway's only while that lease is.
        pub lease: i64,
        /// Until when that lease surely holds: its disks serve nothing past it.
        lease_clock: tessera_ownership::LeaseClock,
        /// The disks opened through it, to learn whether the OSDs refused a write.
        disks: Arc<parking_lot::Mutex<Vec<std::sync::Weak<FencedDisk>>>>,
        /// A change of the metadata through it whose outcome is not known, described: its
        /// disks vouch for nothing from then on (`RadosMeta::on_unknown`).
        meta_unknown: Arc<parking_lot::Mutex<Option<String>>>,
    }

    /// Another gateway's ownership as this one reports it; an earlier run of this very
    /// gateway (restarted before its lease lapsed) says so.
    fn elsewhere(o: tessera_ownership::Owner, me: &str) -> PoolOwner {
        PoolOwner {
            name: o.gateway.clone(),
            gateway: if o.gateway == me {
                format!("{me} (an earlier run, until its lease lapses)")
            } else {
                o.gateway
            },
            epoch: o.epoch,
        }
    }

    impl Membership {
        /// Joins the gateways as `cfg.name`, with a lease of `cfg.lease_seconds`; if etcd
        /// does not answer, the membership waits to join (see [`rejoin`](Self::rejoin)), so
        /// that the daemon still starts and serves its local pools.
        pub fn join(cfg: &GatewayConfig, paths: DataPaths, rt: Handle) -> Result<Membership, String> {
            let m = Membership {
                paths,
                cfg: cfg.clone(),
                rt,
                gateway: tokio::sync::Mutex::new(None),
                changes: Arc::default(),
                seen_alive: Default::default(),
                places: Default::default(),
                courier: Default::default(),
                join_failed: Default::default(),
                notices_out: Default::default(),
            };
            if let Err(e) = m.rejoin() {
                tracing::warn!(
                    gateway = %cfg.name,
                    error = %e,
                    "cannot join the gateways at start; serving local pools and trying again every second"
                );
            }
            Ok(m)
        }

        pub fn name(&self) -> &str {
            &self.cfg.name
        }

        /// What a call that needs the membership says before this gateway has joined.
        fn not_joined(&self) -> String {
            let why = self.join_failed.lock().expect("not poisoned").clone();
            format!(
                "this gateway has not joined the gateways yet: {} (it is tried again every second)",
                why.unwrap_or_else(|| format!("etcd at {} does not answer", self.cfg.etcd.join(", ")))
            )
        }

        /// Runs `f` on this gateway's membership, once joined (blocking), for `MEMBERSHIP_AT_MOST`
        /// at most, waiting for the membership included: a request sent to an etcd member
        /// that stalls (stopped, frozen, cut off without a reset) gets no answer and no error,
        /// and would hold the tick, and every command that needs the membership, until the
        /// member resumes. Given up, it is as if etcd had not answered: what it changed, if
        /// anything, is found at the next look, as after a crash.
        fn with_gateway<T>(&self, f: impl AsyncFnOnce(&mut Gateway) -> Result<T, String>) -> Result<T, String> {
            let late = || {
                format!(
                    "etcd did not answer within {} s (a member stalled, or is cut off?)",
                    MEMBERSHIP_AT_MOST.as_secs()
                )
            };
            self.rt.block_on(async {
                tokio::time::timeout(MEMBERSHIP_AT_MOST, async {
                    match self.gateway.lock().await.as_mut() {
                        Some(g) => f(g).await,
                        None => Err(self.not_joined()),
                    }
                })
                .await
                .unwrap_or_else(|_| Err(late()))
            })
        }

        /// Whether this gateway has joined and its lease is still renewed; once false,
        /// whatever it owned may be another's already.
        pub fn alive(&self) -> bool {
            let alive = self
                .rt
                .block_on(async { self.gateway.lock().await.as_ref().is_some_and(|g| g.alive()) });
            self.seen_alive.store(alive, std::sync::atomic::Ordering::Relaxed);
            alive
        }

        /// What [`alive`](Self::alive) found last (the tick asks every second), without
        /// waiting.
        pub fn seen_alive(&self) -> bool {
            self.seen_alive.load(std::sync::atomic::Ordering::Relaxed)
        }

        /// Whether this gateway ever joined since the daemon started.
        pub fn joined(&self) -> bool {
            self.rt.block_on(async { self.gateway.lock().await.is_some() })
        }

        /// A new lease: at start, or after the last one was lost (the gateway stalled, or
        /// etcd went away).
        pub fn rejoin(&self) -> Result<(), String> {
            let fresh = self.join_anew();
            *self.join_failed.lock().expect("not poisoned") = fresh.as_ref().err().cloned();
            let fresh = fresh?;
            self.rt.block_on(async {
                let mut fresh = fresh;
                let changes = self.changes.clone();
                fresh.follow_changes(move || changes.notify_one()).await;
                *self.courier.lock().expect("not poisoned") = Some(fresh.courier());
                *self.gateway.lock().await = Some(fresh)
            });
            Ok(())
        }

        /// A new lease in etcd, through TLS when the configuration sets it up, as the etcd
        /// user it names (its files read now, so that a certificate renewed in place, or a
        /// password changed, counts from the next joining).
        fn join_anew(&self) -> Result<Gateway, String> {
            let etcd = self.cfg.etcd.join(", ");
            let tls = self.cfg.etcd_tls.as_ref().map(etcd_tls).transpose()?;
            let user = self.cfg.etcd_user.as_ref().map(etcd_user).transpose()?;
            self.rt
                .block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(10),
                        Gateway::join_as(
                            &self.cfg.etcd,
                            tls.as_ref(),
                            user.as_ref(),
                            &self.cfg.prefix,
                            &self.cfg.name,
                            self.cfg.lease_seconds,
                        ),
                    )
                    .await
                })
                .map_err(|_| format!("etcd at {etcd} did not answer within 10 s"))?
                .map_err(|e| format!("cannot join the gateways through etcd at {etcd}: {e}"))
        }

        fn courier(&self) -> Option<Courier> {
            self.courier.lock().expect("not poisoned").clone()
        }

        /// Has the owner of pool `name` run `request` (a command a standby port here
        /// received), and waits up to `wait` for its answer: None when none came (nobody
        /// owns the pool, the owner stalled, etcd does not answer). Blocks; callable from
        /// any thread outside the runtime's workers.
        pub fn ask_owner(&self, name: &str, request: Vec<u8>, wait: Duration) -> Option<Vec<u8>> {
            let courier = self.courier()?;
            let (tx, rx) = std::sync::mpsc::channel();
            let what = owner_key(name);
            self.rt.spawn(async move {
                let _ = tx.send(courier.ask(&what, &request, wait).await);
            });
            // An ask the owner took is waited for as long again, and on while the owner keeps
            // it alive; past that and the steps around it, its keys are gone, and no owner
            // runs it any more.
            let at_most = tessera_ownership::courier::ask_lifetime(wait)
                + 2 * tessera_ownership::courier::ASKING_AT_MOST
                + tessera_ownership::courier::RUN_KEPT_AT_MOST;
            match rx.recv_timeout(at_most + Duration::from_secs(1)) {
                Ok(Ok(answer)) => answer,
                Ok(Err(e)) => {
                    tracing::warn!(pool = %name, error = %e, "cannot ask the pool's owner through etcd");
                    None
                }
                Err(_) => None,
            }
        }

        /// A watch of the asks to the owners, made before they are looked at
        /// ([`Courier::watch_asks`]); None before this gateway joined, or if etcd does not
        /// answer.
        pub async fn watch_asks(&self) -> Option<AsksComing> {
            self.courier()?.watch_asks().await.ok()
        }

        /// The asks waiting now for the pools among `owned` (owned here), each taken (it runs
        /// here, once), as (pool, ask), in one read of etcd.
        pub fn take_asks(&self, owned: &[String]) -> Result<Vec<(String, Ask)>, String> {
            let courier = self.courier().ok_or_else(|| self.not_joined())?;
            let keys: HashMap<String, &String> = owned.iter().map(|n| (owner_key(n), n)).collect();
            let asks = self
                .rt
                .block_on(courier.take_asks(|what| keys.contains_key(what), COURIER_AT_MOST))
                .map_err(|e| e.to_string())?;
            Ok(asks.into_iter().map(|a| (keys[a.what.as_str()].clone(), a)).collect())
        }

        /// Answers `ask`, one [`take_asks`](Self::take_asks) returned; false when the asker no
        /// longer waits. Tried again for [`ANSWER_TRIED_FOR`] while etcd fails it (a member
        /// restarting, a leader changing): the command ran, and an asker that heard nothing
        /// would have its host send it again. The answer is the same each time, and lands
        /// only into the asker's waiting key.
        pub fn answer(&self, ask: &Ask, answer: &[u8]) -> Result<bool, String> {
            let courier = self.courier().ok_or_else(|| self.not_joined())?;
            let until = std::time::Instant::now() + ANSWER_TRIED_FOR;
            loop {
                match self.rt.block_on(within_courier_time(courier.answer(ask, answer))) {
                    Err(e) if std::time::Instant::now() < until => {
                        tracing::debug!(error = %e, "cannot answer a forwarded command yet: trying again");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    answered => return answered,
                }
            }
        }

        /// Keeps `ask` alive while it runs here ([`Courier::keep_running`]), until the guard
        /// returned is dropped; None before this gateway joined.
        pub fn keep_running(&self, ask: &Ask) -> Option<KeptRunning> {
            let courier = self.courier()?;
            let ask = ask.clone();
            Some(KeptRunning(
                self.rt.spawn(async move { courier.keep_running(&ask).await }),
            ))
        }

        /// Tells the other gateways `notice` about pool `name` (owned here: the unit
        /// attentions its logical units raised), without waiting: a notice that etcd does not
        /// take (within 5 s) is lost, as one a gateway not watching misses. Notices reach
        /// etcd in the order they were raised (REGISTRATIONS PREEMPTED for some ports, then
        /// RESERVATIONS RELEASED for others, say).
        pub fn notify(&self, name: &str, notice: Vec<u8>) {
            let Some(courier) = self.courier() else { return };
            let out = self.notices_out.get_or_init(|| {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Courier, String, Vec<u8>)>();
                self.rt.spawn(async move {
                    while let Some((courier, pool, notice)) = rx.recv().await {
                        if let Err(e) = within_courier_time(courier.notify(&owner_key(&pool), &notice)).await {
                            tracing::warn!(pool = %pool, error = %e, "cannot tell the other gateways of unit attentions raised here");
                        }
                    }
                });
                tx
            });
            let _ = out.send((courier, name.to_string(), notice));
        }

        /// A watch of the notices other gateways send about pools after revision `after`
        /// (where an earlier watch stopped: [`PoolNotices::seen`]), or from now on; None before
        /// this gateway joined, or if etcd does not answer.
        pub async fn watch_notices(&self, after: Option<i64>) -> Option<PoolNotices> {
            Some(PoolNotices(self.courier()?.watch_notices(after).await.ok()?))
        }

        /// Notified when any gateway takes or gives up a pool (or its lease lapses), asks
        /// for one or says it presents one, so that the daemon acts on it at once rather
        /// than at its next tick. Notifications come together: one wakes a waiter once,
        /// however many changes came since.
        pub fn changes(&self) -> Arc<tokio::sync::Notify> {
            self.changes.clone()
        }

        /// Where pool `name` lives, as the gateways record it: the cluster's id and the RADOS
        /// pool's (`FSID/ID`), learned once.
        fn place_of(&self, name: &str, placement: &Placement, link: &mut Link) -> Result<String, String> {
            // By where it is looked for: a name asked for in one RADOS pool, then another
            // (refused there), is in the one asked now.
            let looked_in = (
                name.to_string(),
                placement.ceph_conf.clone(),
                placement.rados_pool.clone(),
            );
            if let Some(p) = self.places.lock().expect("not poisoned").get(&looked_in) {
                return Ok(p.clone());
            }
            let cluster = link.cluster(placement, &self.paths)?;
            let (fsid, id) = Cluster::shared_pool(&cluster, &placement.rados_pool)
                .and_then(|p| p.identity())
                .map_err(|e| format!("cannot open the RADOS pool '{}': {e}", placement.rados_pool))?;
            let place = format!("{fsid}/{id}");
            self.places
                .lock()
                .expect("not poisoned")
                .insert(looked_in, place.clone());
            Ok(place)
        }

        /// Whether the metadata of a pool `name` is where `placement` says.
        fn pool_is_at(&self, name: &str, placement: &Placement, link: &mut Link) -> Result<bool, String> {
            let cluster = link.cluster(placement, &self.paths)?;
            let pool = Cluster::shared_pool(&cluster, &placement.rados_pool)
                .map_err(|e| format!("cannot open the RADOS pool '{}': {e}", placement.rados_pool))?;
            metadata_is_there(&pool, name)
        }

        /// Checks that pool `name` is recorded among the gateways (in etcd) as living where
        /// `placement` says: a pool of that name in another RADOS pool or cluster has the
        /// same ownership and fence record, and a gateway serving either would fence the
        /// other's owners off instead of its own. A pool recorded elsewhere is refused, and
        /// this gateway serves nothing of it. Recorded nowhere yet (a pool made before the
        /// record was kept), it is recorded as here once its metadata is found here: a create
        /// that failed, or an import of a place that holds no such pool, claims nothing. Read
        /// afresh at every attempt, never from memory: a record removed and claimed by
        /// another place since is seen.
        pub fn check_place(&self, name: &str, placement: &Placement) -> Result<(), String> {
            self.check_place_through(name, placement, &mut Link::default())
        }

        /// [`check_place`](Self::check_place), through `link`'s connection to the cluster if
        /// one is needed.
        fn check_place_through(&self, name: &str, placement: &Placement, link: &mut Link) -> Result<(), String> {
            let place = self.place_of(name, placement, link)?;
            let key = owner_key(name);
            let recorded = match self.with_gateway(async |g| {
                g.place(&key)
                    .await
                    .map_err(|e| format!("cannot learn where pool {name} lives: {e}"))
            })? {
                Some(r) => r,
                None if !self.pool_is_at(name, placement, link)? => return Ok(()),
                None => self.with_gateway(async |g| {
                    g.claim_place(&key, &place)
                        .await
                        .map(|(recorded, _)| recorded)
                        .map_err(|e| format!("cannot record where pool {name} lives: {e}"))
                })?,
            };
            self.same_place(name, placement, &place, &recorded)
        }

        /// Records that pool `name`, about to be made where `placement` says, lives there:
        /// refused if a pool of that name is recorded elsewhere. True if this call recorded
        /// it: a create that fails then takes the record back (`forget_place`).
        pub fn claim_place(&self, name: &str, placement: &Placement) -> Result<bool, String> {
            let place = self.place_of(name, placement, &mut Link::default())?;
            let (recorded, now) = self.with_gateway(async |g| {
                g.claim_place(&owner_key(name), &place)
                    .await
                    .map_err(|e| format!("cannot record where pool {name} lives: {e}"))
            })?;
            self.same_place(name, placement, &place, &recorded).map(|()| now)
        }

        /// Ok if `recorded`, where the gateways record pool `name` lives, is `place`.
        fn same_place(&self, name: &str, placement: &Placement, place: &str, recorded: &str) -> Result<(), String> {
            if recorded == place {
                return Ok(());
            }
            let (their_fsid, their_id) = recorded.split_once('/').unwrap_or((recorded, "?"));
            let (fsid, id) = place.split_once('/').unwrap_or((place, "?"));
            Err(format!(
                "another pool named {name} is served by these gateways, in RADOS pool id {their_id} of cluster {their_fsid}; this gateway has it in RADOS pool '{}' (id {id}) of cluster {fsid}: a name is one pool among the gateways of one etcd prefix (export this one here; if no pool of that name is left there, remove the record, etcdctl del {}/place/{})",
                placement.rados_pool,
                self.cfg.prefix,
                owner_key(name)
            ))
        }

        /// Forgets where pool `name`, at `placement`, lived among the gateways, and its fence
        /// record, once it is destroyed while owned here at epoch `destroyed_at`; or only this
        /// gateway's notes of it, once it is exported (`destroyed_at` None). Records that
        /// name another place, or a pool no longer owned here at that epoch, stay.
        pub fn forget_place(&self, name: &str, placement: &Placement, destroyed_at: Option<i64>) -> Result<(), String> {
            let place = destroyed_at.map(|epoch| (self.place_of(name, placement, &mut Link::default()), epoch));
            self.places
                .lock()
                .expect("not poisoned")
                .retain(|(n, _, _), _| n != name);
            let Some((place, epoch)) = place else {
                return Ok(());
            };
            let place = place?;
            let forgot = self.with_gateway(async |g| {
                g.forget_place(&owner_key(name), &place, epoch)
                    .await
                    .map_err(|e| format!("cannot forget where pool {name} lived: {e}"))
            })?;
            if !forgot {
                tracing::debug!(pool = %name, epoch, "the gateways' record of where the pool lived is not this gateway's to forget (another place's, gone already, or the pool is no longer owned here)");
            }
            Ok(())
        }

        /// Takes back the place `claim_place` recorded for pool `name` at `placement`, when the
        /// pool was not made there after all (it could not be taken); its fence record stays.
        pub fn unclaim_place(&self, name: &str, placement: &Placement) -> Result<(), String> {
            let place = self.place_of(name, placement, &mut Link::default())?;
            self.places
                .lock()
                .expect("not poisoned")
                .retain(|(n, _, _), _| n != name);
            self.with_gateway(async |g| {
                g.unclaim_place(&owner_key(name), &place)
                    .await
                    .map_err(|e| format!("cannot take back where pool {name} was to live: {e}"))
            })
        }

        /// Takes pool `name`, to be made, if nobody owns it, fencing its previous owner off the
        /// cluster first.
        pub fn take(&self, name: &str, placement: &Placement) -> Result<Taking, String> {
            self.take_if(name, placement, false)
        }

        /// Takes pool `name`, made before, like [`take`](Self::take); but not if the cluster
        /// holds no pool of that name where `placement` says (destroyed at another gateway, a
        /// name or RADOS pool mistyped at its import): the opening would fail, and each try
        /// would blocklist the connection of the one before, a monitor command and a new map of
        /// the cluster for every OSD and client, for nothing.
        pub fn take_made(&self, name: &str, placement: &Placement) -> Result<Taking, String> {
            self.take_if(name, placement, true)
        }

        fn take_if(&self, name: &str, placement: &Placement, made: bool) -> Result<Taking, String> {
            // Cheap first: while another gateway holds the pool, nothing is asked of the
            // cluster. (The taking below is one etcd transaction all the same.)
            if let Some(o) = self.other_owner(name)? {
                return Ok(Taking::Elsewhere(o));
            }
            // Handed over to another gateway by one that may take it back (`release_to`).
            let handed = self.with_gateway(async |g| {
                g.handed_to(&owner_key(name))
                    .await
                    .map_err(|e| format!("cannot learn whether pool {name} is handed over: {e}"))
            })?;
            if let Some(o) = handed {
                return Ok(Taking::Elsewhere(elsewhere(o, &self.cfg.name)));
            }
            let started = std::time::Instant::now();
            // One connection for the place's check (the first time) and the taking.
            let mut link = Link::default();
            self.check_place_through(name, placement, &mut link)?;
            let cluster = link.cluster(placement, &self.paths)?;
            // The RADOS pool must exist before anyone takes anything in it.
            let pool = Cluster::shared_pool(&cluster, &placement.rados_pool)
                .map_err(|e| format!("cannot open the RADOS pool '{}': {e}", placement.rados_pool))?;
            if made && !metadata_is_there(&pool, name)? {
                return Err(format!(
                    "the cluster holds no pool {name} in RADOS pool '{}' (destroyed at another gateway, or never made there): 'tessera pool export {name}' forgets it here",
                    placement.rados_pool
                ));
            }
            if made {
                openable_records(&cluster, name, placement)?;
            }
            // Whom the pool's metadata says its last owner wrote from: fenced off too, should
            // etcd have lost the fence record (restored from an older snapshot, keys deleted).
            let last_writer = last_owner(&pool, &Placement::meta_object(name))
                .map_err(|e| format!("cannot read the last owner of pool {name}: {e}"))?;
            drop(pool);
            let connected = started.elapsed();
            let taken = self.with_gateway(async |g| {
                let o = take_over(g, &cluster, &owner_key(name), last_writer.as_deref()).await;
                Ok(match o {
                    Ok(o) => {
                        let mine = g.holds(&o);
                        Ok((o, mine, g.lease_clock()))
                    }
                    Err(e) => match e.gave_back() {
                        Some(lasting) => Err((format!("cannot take pool {name}: {e}"), lasting == Lasting::Lasts)),
                        None => return Err(format!("cannot take pool {name}: {e}")),
                    },
                })
            })?;
            let (owner, mine, lease_clock) = match taken {
                Ok(t) => t,
                Err((why, lasting)) => return Ok(Taking::GaveBack { why, lasting }),
            };
            if !mine {
                return Ok(Taking::Elsewhere(elsewhere(owner, &self.cfg.name)));
            }
            tracing::info!(
                pool = name,
                connect_seconds = connected.as_secs_f64(),
                take_and_fence_seconds = (started.elapsed() - connected).as_secs_f64(),
                "pool taken"
            );
            Ok(Taking::Mine(Owned {
                cluster,
                placement: placement.clone(),
                epoch: owner.epoch,
                lease: owner.lease,
                lease_clock,
                disks: Default::default(),
                meta_unknown: Default::default(),
            }))
        }

        /// This run's lease, once joined: what an announcement was made under.
        pub fn lease(&self) -> Option<i64> {
            self.rt
                .block_on(async { self.gateway.lock().await.as_ref().map(|g| g.lease()) })
        }

        /// Says in etcd, on this gateway's lease, that it presents LUNs of pool `name`, so
        /// that the owner lists this gateway's target port group too.
        pub fn announce(&self, name: &str) -> Result<(), String> {
            self.with_gateway(async |g| g.announce(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// Takes back [`announce`](Self::announce).
        pub fn unannounce(&self, name: &str) -> Result<(), String> {
            self.with_gateway(async |g| g.unannounce(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// The gateways that present LUNs of pool `name` now.
        pub fn presenting(&self, name: &str) -> Result<Vec<String>, String> {
            self.with_gateway(async |g| g.presenting(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// Says that this gateway exports vdisks of pool `name` over NBD.
        pub fn announce_exports(&self, name: &str) -> Result<(), String> {
            self.with_gateway(async |g| g.announce_exports(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// Takes back [`announce_exports`](Self::announce_exports).
        pub fn unannounce_exports(&self, name: &str) -> Result<(), String> {
            self.with_gateway(async |g| g.unannounce_exports(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// The gateways that could serve pool `name`'s hosts now: those that present LUNs of
        /// it, and those that export vdisks of it over NBD, in name order.
        pub fn serving(&self, name: &str) -> Result<Vec<String>, String> {
            self.with_gateway(async |g| {
                let mut all = g.presenting(&owner_key(name)).await.map_err(|e| e.to_string())?;
                all.extend(g.exporting(&owner_key(name)).await.map_err(|e| e.to_string())?);
                all.sort();
                all.dedup();
                Ok(all)
            })
        }

        /// The gateway that owns pool `name` now, if another does (None: nobody, or this
        /// run of this gateway). Asks etcd only, never the cluster.
        pub fn other_owner(&self, name: &str) -> Result<Option<PoolOwner>, String> {
            let o = self.with_gateway(async |g| {
                let o = g.owner(&owner_key(name)).await;
                o.map(|o| o.filter(|o| !g.holds(o)))
                    .map_err(|e| format!("cannot learn the owner of pool {name}: {e}"))
            })?;
            Ok(o.map(|o| elsewhere(o, &self.cfg.name)))
        }

        /// Asks the owner of pool `name` to hand it over: hosts send their I/O here.
        pub fn ask_for(&self, name: &str) -> Result<(), String> {
            self.with_gateway(async |g| g.ask_for(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// Takes back [`ask_for`](Self::ask_for).
        pub fn stop_asking(&self, name: &str) -> Result<(), String> {
            self.with_gateway(async |g| g.stop_asking(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// Every pool some gateway asks for now, with the gateways that do, in one request.
        pub fn asked_for(&self) -> Result<std::collections::HashMap<String, Vec<String>>, String> {
            self.with_gateway(async |g| g.asked_for().await.map_err(|e| e.to_string()))
                .map(|asked| {
                    asked
                        .into_iter()
                        .filter_map(|(what, gateways)| Some((what.strip_prefix("pool.")?.to_string(), gateways)))
                        .collect()
                })
        }

        /// Asks, for an administrator, that pool `name` move to gateway `to` (see
        /// [`Gateway::move_to`]).
        pub fn move_to(&self, name: &str, to: &str) -> Result<(), String> {
            self.with_gateway(async |g| g.move_to(&owner_key(name), to).await.map_err(|e| e.to_string()))
        }

        /// The gateway pool `name` is to move to, if a move was asked for, with the revision
        /// that asked it.
        pub fn moving(&self, name: &str) -> Result<Option<(String, i64)>, String> {
            self.with_gateway(async |g| g.moving(&owner_key(name)).await.map_err(|e| e.to_string()))
        }

        /// Every pool an administrator moves and to which gateway, with the revision that
        /// asked it, in one request.
        pub fn moves(&self) -> Result<std::collections::HashMap<String, (String, i64)>, String> {
            self.with_gateway(async |g| g.moves().await.map_err(|e| e.to_string()))
                .map(|moves| {
                    moves
                        .into_iter()
                        .filter_map(|(what, to, revision)| {
                            Some((what.strip_prefix("pool.")?.to_string(), (to, revision)))
                        })
                        .collect()
                })
        }

        /// Ends the move of pool `name` asked at `revision`, unless one was asked since (or
        /// another gateway ended it first): false then.
        pub fn end_move(&self, name: &str, revision: i64) -> Result<bool, String> {
            self.with_gateway(async |g| g.end_move(&owner_key(name), revision).await.map_err(|e| e.to_string()))
        }

        /// Gives pool `name` up, if this gateway owns it at `epoch`, for gateway `to` alone to
        /// take until this one takes it back, or for `bar` at most.
        /// True if it was handed over (false: not owned here at that epoch).
        pub fn release_to(&self, name: &str, epoch: i64, to: &str, bar: Duration) -> Result<bool, String> {
            self.with_gateway(async |g| {
                g.release_to(&owner_key(name), epoch, to, bar)
                    .await
                    .map_err(|e| e.to_string())
            })
        }

        /// Gives pool `name` up, if this gateway owns it at `epoch`.
        pub fn release(&self, name: &str, epoch: i64) -> Result<(), String> {
            self.with_gateway(async |g| {
                g.release(&owner_key(name), epoch)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
        }
    }

    impl Owned {
        /// The metadata of pool `name` as this connection writes it: at its epoch, each
        /// batch stamped with its address.
        fn rados_meta(&self, name: &str) -> Result<RadosMeta, String> {
            let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
            let address = self
                .cluster
                .address()
                .map_err(|e| format!("cannot learn this client's address: {e}"))?;
            Ok(RadosMeta::new(pool, &Placement::meta_object(name), self.epoch).owned_by(address))
        }

        fn meta(&self, name: &str) -> Result<MetaStore, String> {
            let (disks, unknown) = (self.disks.clone(), self.meta_unknown.clone());
            let meta = MetaStore::on(self.rados_meta(name)?).on_unknown(move |why| {
                // What this gateway holds may differ from the cluster's records: no flush
                // through this connection says "durable" again, and the pool is opened anew.
                tracing::warn!(error = why, "a metadata change failed; the pool is opened again");
                unknown.lock().get_or_insert_with(|| why.to_string());
                for d in disks.lock().iter().filter_map(|d| d.upgrade()) {
                    d.refuse(why);
                }
            });
            Ok(meta)
        }

        /// Says in the metadata object of pool `name` that this connection owns it now, at
        /// its epoch (`tessera.owner`, in a batch of no records), before the opening writes
        /// anything else of the pool: should etcd lose the fence record, the next owner finds
        /// this connection there to fence off, whatever it wrote since.
        fn stamp(&self, name: &str) -> Result<(), String> {
            // A batch at version 0 would make the object: one gone since its records were
            // read (removed by hand) is not made again, bare.
            let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
            if !metadata_is_there(&pool, name)? {
                return Err(format!("the metadata object of pool {name} is gone"));
            }
            let meta = self.rados_meta(name)?;
            tessera_pool::MetaBackend::commit(&meta, &tessera_pool::MetaBatch::new(), true)
                .map_err(|e| format!("cannot say in the metadata of pool {name} that this gateway owns it: {e}"))
        }

        fn disk(&self, name: &str, size: u64) -> Result<Arc<FencedDisk>, String> {
            let pool = Cluster::shared_pool(&self.cluster, &self.placement.rados_pool).map_err(|e| e.to_string())?;
            let disk = FencedDisk::new(pool, &Placement::data_prefix(name), size, self.epoch)
                .map(|d| Arc::new(d.under_lease(self.lease_clock.clone())))
                .map_err(|e| e.to_string())?;
            let mut disks = self.disks.lock();
            if let Some(why) = &*self.meta_unknown.lock() {
                disk.refuse(why);
            }
            disks.push(Arc::downgrade(&disk));
            Ok(disk)
        }

        /// Whether the lease the pool was taken under surely holds still: past it, another
        /// gateway may own the pool.
        pub fn lease_holds(&self) -> bool {
            self.lease_clock.holds()
        }

        /// [`lease_holds`](Self::lease_holds), for the pool's ports to ask at every command.
        pub fn lease_check(&self) -> crate::standby::LeaseCheck {
            let clock = self.lease_clock.clone();
            Arc::new(move || clock.holds())
        }

        /// The first write the OSDs refused on a disk opened through this connection, or a
        /// change of the metadata whose outcome is not known, if any: no flush there can say
        /// "durable" again.
        pub fn refused(&self) -> Option<String> {
            let disks = self.disks.lock();
            let on_disk = disks.iter().filter_map(|d| d.upgrade()?.refused()).next();
            on_disk.or_else(|| self.meta_unknown.lock().clone())
        }

        /// This connection's address in the cluster (what a newer owner blocklists).
        pub fn client_address(&self) -> Option<String> {
            self.cluster.address().ok()
        }

        /// Makes pool `name` of `capacity` bytes in the cluster (refused if the cluster holds
        /// one of that name already) and opens an engine on it, with `dir` for what stays
        /// local.
        pub fn create(&self, dir: &Path, name: &str, capacity: u64, slab_size: u64) -> Result<Engine, String> {
            let disk: DiskRef = self.disk(name, capacity)?;
            Engine::create_pool_with_meta(dir, name, vec![disk], slab_size, self.meta(name)?, false)
                .map_err(|e| e.to_string())
        }

        /// Opens the pool `name` as the cluster holds it.
        pub fn open(&self, dir: &Path, name: &str) -> Result<Engine, String> {
            let meta = self.meta(name)?;
            let recorded = Pool::recorded_config(&meta).map_err(|e| {
                format!(
                    "the cluster holds no readable pool {name} in RADOS pool '{}': {e}",
                    self.placement.rados_pool
                )
            })?;
            self.stamp(name)?;
            let path = self.placement.disk_path(name);
            let opener = |p: &str| -> Result<DiskRef, tessera_disk::DiskError> {
                let info = recorded
                    .disks
                    .iter()
                    .find(|d| d.path == p && p == path)
                    .ok_or_else(|| tessera_disk::DiskError::Unusable {
                        path: p.to_string(),
                        reason: format!("not the disk of pool {name} on RADOS ({path})"),
                    })?;
                self.disk(name, info.size)
                    .map(|d| d as DiskRef)
                    .map_err(|reason| tessera_disk::DiskError::Unusable {
                        path: p.to_string(),
                        reason,
                    })
            };
            Engine::open_with_meta(dir, &opener, meta).map_err(|e| e.to_string())
        }

        /// The label of pool `name`'s disk of `capacity` bytes as the cluster holds it now
        /// (`Missing` once wiped, or once its first object is gone). Err: the cluster did not
        /// answer.
        pub fn label(
            &self,
            name: &str,
            capacity: u64,
        ) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
            label_of(name, &*self.disk(name, capacity)?)
        }

        /// Removes the objects of the destroyed pool `name` of `capacity` bytes: its metadata
        /// first, so that a removal that stops halfway leaves objects nobody reads, never a
        /// pool another gateway would open with part of its data gone (read as zeros).
        /// Only while this gateway owns the pool: the removal of the metadata object is
        /// guarded by the epoch, and each data object's by its lease and its epoch.
        pub fn remove_objects(&self, name: &str, capacity: u64) -> Result<(), String> {
            let disk = self.disk(name, capacity)?;
            if !self.lease_clock.holds() {
                return Err(format!(
                    "this gateway's lease on pool {name} may have lapsed (it stalled, or lost etcd): another gateway \
                     may own it now, and nothing of it was removed"
                ));
            }
            if let Err(e) = self.rados_meta(name)?.remove() {
                return Err(format!(
                    "its metadata object {} could not be removed ({e}); it and the data objects {}.* stay \
                     in RADOS pool '{}'",
                    Placement::meta_object(name),
                    Placement::data_prefix(name),
                    self.placement.rados_pool
                ));
            }
            disk.remove_objects()
                .map_err(|e| {
                    format!(
                        "its metadata is gone, but data objects {}.* stay in RADOS pool '{}' ('rados rm' removes them): {e}",
                        Placement::data_prefix(name),
                        self.placement.rados_pool
                    )
                })
        }
    }
}

/// Without the `rados` feature: joining fails and says why, so nothing else is reachable.
#[cfg(not(feature = "rados"))]
pub use absent::{Ask, AsksComing, KeptRunning, Membership, Owned, PoolNotices, Reader, Taking};

#[cfg(not(feature = "rados"))]
mod absent {
    use tessera_volume::Engine;
    use tokio::runtime::Handle;

    use super::*;

    pub struct Membership {
        never: std::convert::Infallible,
    }

    pub enum Taking {
        Mine(Owned),
        Elsewhere(PoolOwner),
        GaveBack { why: String, lasting: bool },
    }

    pub struct Owned {
        never: std::convert::Infallible,
        pub epoch: i64,
        pub lease: i64,
    }

    pub struct Reader {
        never: std::convert::Infallible,
    }

    impl Reader {
        pub fn connect(_: &Placement, _: &DataPaths) -> Result<Reader, String> {
            Err(ABSENT.into())
        }
        pub fn units(&self, _: &str, _: &[String]) -> Result<Vec<(String, crate::standby::StandbyUnit)>, String> {
            match self.never {}
        }
        pub fn opened_since(&self, _: &str, _: i64) -> Result<bool, String> {
            match self.never {}
        }
        pub fn label(&self, _: &str) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
            match self.never {}
        }
    }

    const ABSENT: &str = "this tessera was built without pools on Ceph RADOS: build it with `cargo build --features tessera-cli/rados` (needs librados-dev and protobuf-compiler)";

    impl Membership {
        pub fn join(_: &GatewayConfig, _: DataPaths, _: Handle) -> Result<Membership, String> {
            Err(ABSENT.into())
        }
        pub fn name(&self) -> &str {
            match self.never {}
        }
        pub fn alive(&self) -> bool {
            match self.never {}
        }
        pub fn seen_alive(&self) -> bool {
            match self.never {}
        }
        pub fn changes(&self) -> std::sync::Arc<tokio::sync::Notify> {
            match self.never {}
        }
        pub fn joined(&self) -> bool {
            match self.never {}
        }
        pub fn rejoin(&self) -> Result<(), String> {
            match self.never {}
        }
        pub fn take(&self, _: &str, _: &Placement) -> Result<Taking, String> {
            match self.never {}
        }
        pub fn take_made(&self, _: &str, _: &Placement) -> Result<Taking, String> {
            match self.never {}
        }
        pub fn release(&self, _: &str, _: i64) -> Result<(), String> {
            match self.never {}
        }
        pub fn release_to(&self, _: &str, _: i64, _: &str, _: std::time::Duration) -> Result<bool, String> {
            match self.never {}
        }
        pub fn forget_place(&self, _: &str, _: &Placement, _: Option<i64>) -> Result<(), String> {
            match self.never {}
        }
        pub fn claim_place(&self, _: &str, _: &Placement) -> Result<bool, String> {
            match self.never {}
        }
        pub fn unclaim_place(&self, _: &str, _: &Placement) -> Result<(), String> {
            match self.never {}
        }
        pub fn check_place(&self, _: &str, _: &Placement) -> Result<(), String> {
            match self.never {}
        }
        pub fn lease(&self) -> Option<i64> {
            match self.never {}
        }
        pub fn announce(&self, _: &str) -> Result<(), String> {
            match self.never {}
        }
        pub fn unannounce(&self, _: &str) -> Result<(), String> {
            match self.never {}
        }
        pub fn presenting(&self, _: &str) -> Result<Vec<String>, String> {
            match self.never {}
        }
        pub fn announce_exports(&self, _: &str) -> Result<(), String> {
            match self.never {}
        }
        pub fn unannounce_exports(&self, _: &str) -> Result<(), String> {
            match self.never {}
        }
        pub fn serving(&self, _: &str) -> Result<Vec<String>, String> {
            match self.never {}
        }
        pub fn other_owner(&self, _: &str) -> Result<Option<PoolOwner>, String> {
            match self.never {}
        }
        pub fn ask_for(&self, _: &str) -> Result<(), String> {
            match self.never {}
        }
        pub fn stop_asking(&self, _: &str) -> Result<(), String> {
            match self.never {}
        }
        pub fn move_to(&self, _: &str, _: &str) -> Result<(), String> {
            match self.never {}
        }
        pub fn moving(&self, _: &str) -> Result<Option<(String, i64)>, String> {
            match self.never {}
        }
        pub fn moves(&self) -> Result<std::collections::HashMap<String, (String, i64)>, String> {
            match self.never {}
        }
        pub fn asked_for(&self) -> Result<std::collections::HashMap<String, Vec<String>>, String> {
            match self.never {}
        }
        pub fn end_move(&self, _: &str, _: i64) -> Result<bool, String> {
            match self.never {}
        }
        pub fn ask_owner(&self, _: &str, _: Vec<u8>, _: std::time::Duration) -> Option<Vec<u8>> {
            match self.never {}
        }
        pub async fn watch_asks(&self) -> Option<AsksComing> {
            match self.never {}
        }
        pub fn take_asks(&self, _: &[String]) -> Result<Vec<(String, Ask)>, String> {
            match self.never {}
        }
        pub fn answer(&self, _: &Ask, _: &[u8]) -> Result<bool, String> {
            match self.never {}
        }
        pub fn keep_running(&self, _: &Ask) -> Option<KeptRunning> {
            match self.never {}
        }
        pub fn notify(&self, _: &str, _: Vec<u8>) {
            match self.never {}
        }
        pub async fn watch_notices(&self, _: Option<i64>) -> Option<PoolNotices> {
            match self.never {}
        }
    }

    pub struct PoolNotices {
        never: std::convert::Infallible,
    }

    pub struct KeptRunning;

    impl PoolNotices {
        pub async fn next(&mut self) -> Option<Vec<(String, Vec<u8>)>> {
            match self.never {}
        }
        pub fn seen(&self) -> i64 {
            match self.never {}
        }
    }

    impl Owned {
        pub fn create(&self, _: &Path, _: &str, _: u64, _: u64) -> Result<Engine, String> {
            match self.never {}
        }
        pub fn open(&self, _: &Path, _: &str) -> Result<Engine, String> {
            match self.never {}
        }
        pub fn remove_objects(&self, _: &str, _: u64) -> Result<(), String> {
            match self.never {}
        }
        pub fn label(&self, _: &str, _: u64) -> Result<Result<tessera_disk::Label, tessera_disk::LabelError>, String> {
            match self.never {}
        }
        pub fn lease_holds(&self) -> bool {
            match self.never {}
        }
        pub fn lease_check(&self) -> crate::standby::LeaseCheck {
            match self.never {}
        }
        pub fn refused(&self) -> Option<String> {
            match self.never {}
        }
        pub fn client_address(&self) -> Option<String> {
            match self.never {}
        }
    }

    /// An ask taken from another gateway (never, without pools on RADOS).
    #[allow(dead_code)]
    pub struct Ask {
        never: std::convert::Infallible,
        pub request: Vec<u8>,
    }

    impl Ask {
        pub fn lasts_for(&self) -> std::time::Duration {
            match self.never {}
        }
    }

    pub struct AsksComing {
        never: std::convert::Infallible,
    }

    impl AsksComing {
        pub async fn wait(&mut self, _: std::time::Duration) -> bool {
            match self.never {}
        }
    }
}

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
            super::real::etcd_user(&("gw-a".to_string(), file.clone()))
        };
        let u = user("s3cret\n", 0o600).unwrap();
        assert_eq!((u.name.as_str(), u.password.as_str()), ("gw-a", "s3cret"));
        assert_eq!(user("s3cret", 0o400).unwrap().password, "s3cret");
        assert!(user("s3cret\n", 0o644).unwrap_err().contains("chmod 600"));
        assert!(user("\n", 0o600).unwrap_err().contains("on one line"));
        assert!(user("a\nb\n", 0o600).unwrap_err().contains("on one line"));
        let missing = super::real::etcd_user(&("gw-a".to_string(), dir.path().join("none")));
        assert!(missing.unwrap_err().contains("cannot read"));
        // A file of another user's (the tests may run as root, which may chown it).
        std::fs::write(&file, "s3cret\n").unwrap();
        if std::os::unix::fs::chown(&file, Some(4242), None).is_ok() {
            let e = super::real::etcd_user(&("gw-a".to_string(), file.clone())).unwrap_err();
            assert!(e.contains("belongs to user 4242"), "{e}");
        }
    }
}
