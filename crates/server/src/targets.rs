//! iSCSI targets as the daemon keeps them: which vdisk each LUN of each target presents,
//! persisted in `<state dir>/targets.json` and applied to the protocol's registry.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_iscsi::{auth, Access, Chap, Registry, Target};
use tessera_scsi::{CopyManager, Lun, ModeState, ModeStore, PrState, PrStore};
use tessera_volume::{Engine, Vdisk};
use tracing::warn;

use crate::error::{ApiError, ApiResult};
use crate::metrics::IoMetrics;
use crate::model::SetChap;
use crate::standby::{is_standby, refresh_standby, standby_lun, PoolPorts, StandbyUnit};
use crate::statefile::{self, change_saved};

/// LUN numbers we hand out: single-level, flat space.
pub const MAX_LUN: u64 = 16383;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetConfig {
    pub iqn: String,
    /// LUN number → "pool/vdisk".
    #[serde(default)]
    pub luns: BTreeMap<u64, String>,
    /// Initiator names allowed to log in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acl: Vec<String>,
    /// Any initiator may log in, the ACL notwithstanding; off unless asked for, so a target
    /// with no ACL admits nobody.
    #[serde(default)]
    pub allow_any_initiator: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<SetChap>,
    /// CHAP credentials of single initiators (their names in lower case), which they log in
    /// with in place of `chap`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub initiator_chap: BTreeMap<String, SetChap>,
}

impl TargetConfig {
    /// The protocol's view of who may log in.
    pub fn access(&self) -> Access {
        Access {
            acl: self.acl.clone(),
            allow_any: self.allow_any_initiator,
            chap: self.chap.as_ref().map(chap_of),
            initiator_chap: self
                .initiator_chap
                .iter()
                .map(|(i, c)| (i.clone(), chap_of(c)))
                .collect(),
        }
    }
}

fn chap_of(c: &SetChap) -> Chap {
    Chap {
        user: c.user.clone(),
        secret: c.secret.clone(),
        mutual: c.mutual_user.clone().zip(c.mutual_secret.clone()),
    }
}

/// Checks CHAP credentials before they are stored.
pub fn validate_chap(c: &SetChap) -> Result<(), String> {
    auth::validate_user("CHAP user", &c.user)?;
    auth::validate_secret("CHAP secret", &c.secret)?;
    match (&c.mutual_user, &c.mutual_secret) {
        (None, None) => Ok(()),
        (Some(u), Some(s)) => {
            auth::validate_user("mutual CHAP user", u)?;
            auth::validate_secret("mutual CHAP secret", s)?;
            // RFC 7143 12.1.3: the same secret must not serve both directions.
            if *s == c.secret {
                return Err("the mutual CHAP secret must differ from the CHAP secret".into());
            }
            Ok(())
        }
        _ => Err("mutual CHAP needs both a user and a secret".into()),
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TargetsFile {
    targets: Vec<TargetConfig>,
}

pub struct Targets {
    file: PathBuf,
    configs: Mutex<BTreeMap<String, TargetConfig>>,
    pub registry: Arc<Registry>,
    /// One copy manager for every LUN: a token made through one target can be written
    /// through another, and EXTENDED COPY reaches every presented LUN.
    pub copy: Arc<CopyManager>,
    /// Where the LUNs report the commands they answer.
    meters: Arc<IoMetrics>,
    /// The target port groups of each pool on RADOS, shared by its LUNs here.
    pool_ports: Mutex<BTreeMap<String, Arc<PoolPorts>>>,
}

/// A stable per-vdisk identifier for the LUN's NAA id and serial number.
/// The records of a LUN kept in its pool's metadata.
const RESERVATIONS_RECORD: &str = "reservations";
pub(crate) const MODE_RECORD: &str = "mode";

/// A LUN of a pool that several gateways serve in turn (a pool on RADOS) keeps its state in
/// the pool's metadata, beside its vdisk: the gateway that takes the pool over presents its
/// LUNs with the reservations and mode settings the last owner left, and a replaced owner
/// cannot change them (its metadata writes are fenced). Every change of the reservations is
/// kept, with or without APTPL: a gateway's end is not a power loss of the logical unit.
/// Each host's first command finds POWER ON OCCURRED, which tells it to read them again.
fn kept_in_pool(lun: Lun, e: &Arc<Engine>, v: &Arc<Vdisk>) -> Result<Lun, String> {
    let read = |kind: &str| {
        e.lun_state(v, kind)
            .map_err(|err| format!("cannot read the {kind} of LUN {} from its pool: {err}", v.name()))
    };
    let undecodable = |kind: &str, err: serde_json::Error| {
        format!(
            "the {kind} of LUN {} kept in its pool cannot be read ({err}): the LUN is not presented rather than presented without them (a newer Tessera may have written them)",
            v.name()
        )
    };
    let saved: PrState = match read(RESERVATIONS_RECORD)? {
        Some(b) => serde_json::from_slice(&b).map_err(|err| undecodable("persistent reservations", err))?,
        None => PrState::default(),
    };
    saved.check().map_err(|err| {
        format!(
            "the persistent reservations of LUN {} kept in its pool hold {err}: the LUN is not presented rather than presented with reservations no host made",
            v.name()
        )
    })?;
    let saved_mode: Option<ModeState> = match read(MODE_RECORD)? {
        Some(b) => Some(serde_json::from_slice(&b).map_err(|err| undecodable("mode settings", err))?),
        None => None,
    };
    // Weak: a LUN must not keep a pool open that was exported or given up.
    let save = |kind: &'static str| {
        let (e, v) = (Arc::downgrade(e), v.clone());
        move |bytes: Option<Vec<u8>>| -> Result<(), String> {
            let e = e
                .upgrade()
                .ok_or_else(|| format!("pool of {} is no longer open here", v.name()))?;
            e.set_lun_state(&v, kind, bytes.as_deref())
                .map_err(|err| format!("cannot keep the {kind} of LUN {} in its pool: {err}", v.name()))
        }
    };
    let pr = save(RESERVATIONS_RECORD);
    let store: PrStore = Box::new(move |state| pr(state.map(|s| serde_json::to_vec(s).expect("serialisable"))));
    let mode = save(MODE_RECORD);
    let mode_store: ModeStore = Box::new(move |m| mode(Some(serde_json::to_vec(m).expect("serialisable"))));
    Ok(lun
        .with_shared_reservations(saved, store)
        .with_saved_mode(saved_mode, mode_store)
        .with_first_contact_attention(tessera_scsi::sense::POWER_ON_OCCURRED))
}

pub fn lun_uid(e: &Engine, v: &Vdisk) -> u128 {
    lun_uid_of(e.pool().id().as_u128(), v.id())
}

/// The id of the logical unit of vdisk `vdisk` of pool `pool`: the same at every gateway.
pub fn lun_uid_of(pool: u128, vdisk: u64) -> u128 {
    pool.rotate_left(40) ^ vdisk as u128
}

/// iSCSI names (RFC 3720 3.2.6): iqn.YYYY-MM.reversed.domain[:anything], eui.<16 hex>, naa.<16 or 32 hex>.
pub fn validate_iqn(s: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "'{s}' is not an iSCSI name: {why} (e.g. iqn.2026-11.com.example:storage)"
        ))
    };
    if s.is_empty() || s.len() > 223 {
        return bad("it must be 1 to 223 characters");
    }
    if s != s.to_lowercase() {
        return bad("it must be lower case");
    }
    if let Some(rest) = s.strip_prefix("iqn.") {
        let date_ok = rest.len() > 8
            && rest.as_bytes()[..4].iter().all(u8::is_ascii_digit)
            && rest.as_bytes()[4] == b'-'
            && rest.as_bytes()[5..7].iter().all(u8::is_ascii_digit)
            && rest.as_bytes()[7] == b'.';
        if !date_ok {
            return bad("an iqn name starts iqn.YYYY-MM. followed by a reversed domain");
        }
        if !rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'))
        {
            return bad("only letters, digits, '-', '.' and ':' are allowed");
        }
        return Ok(());
    }
    for (prefix, lens) in [("eui.", &[16usize][..]), ("naa.", &[16, 32][..])] {
        if let Some(hex) = s.strip_prefix(prefix) {
            if lens.contains(&hex.len()) && hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return Ok(());
            }
            return bad("wrong number of hex digits");
        }
    }
    bad("it must start with iqn., eui. or naa.")
}

/// Whether some target lets `initiator` in and presents the LUN of identification CSCD
/// descriptor `lun`.
fn reaches(registry: &Registry, initiator: &str, lun: &[u8; 32]) -> bool {
    registry
        .targets()
        .iter()
        .any(|t| t.access().admits(initiator) && t.luns.read().values().any(|l| l.identification_cscd() == *lun))
}

impl Targets {
    pub fn load(file: PathBuf, meters: Arc<IoMetrics>) -> Result<Targets, String> {
        let list: TargetsFile = statefile::read_json(&file, "fix it or move it away")?;
        // Checked as the API checks what it takes, so that a file edited by hand is refused
        // with why, rather than served in part and then saved without what was wrong in it.
        let mut configs = BTreeMap::new();
        for t in list.targets {
            let bad = |why: String| {
                format!(
                    "{}: target '{}': {why}; fix it or move the file away",
                    file.display(),
                    t.iqn
                )
            };
            validate_iqn(&t.iqn).map_err(bad)?;
            if let Some(n) = t.luns.keys().find(|n| **n > MAX_LUN) {
                return Err(bad(format!("LUN {n} is above the highest, {MAX_LUN}")));
            }
            for name in t.acl.iter().chain(t.initiator_chap.keys()) {
                validate_iqn(name).map_err(bad)?;
            }
            for c in t.chap.iter().chain(t.initiator_chap.values()) {
                validate_chap(c).map_err(bad)?;
            }
            if configs.contains_key(&t.iqn) {
                return Err(bad("it is listed twice".into()));
            }
            configs.insert(t.iqn.clone(), t);
        }
        let registry = Registry::new();
        let copy = Arc::new(CopyManager::new());
        // Weak: the registry's LUNs hold the copy manager.
        let targets = Arc::downgrade(&registry);
        copy.set_reach(Arc::new(move |initiator: &str, lun: &[u8; 32]| {
            targets.upgrade().is_none_or(|r| reaches(&r, initiator, lun))
        }));
        Ok(Targets {
            file,
            configs: Mutex::new(configs),
            registry,
            copy,
            meters,
            pool_ports: Mutex::new(BTreeMap::new()),
        })
    }

    /// The target port groups the LUNs of pool `pool` (on RADOS) report here; None forgets
    /// them.
    pub fn set_pool_ports(&self, pool: &str, ports: Option<Arc<PoolPorts>>) {
        match ports {
            Some(p) => self.pool_ports.lock().insert(pool.to_string(), p),
            None => self.pool_ports.lock().remove(pool),
        };
    }

    fn save(&self, configs: &BTreeMap<String, TargetConfig>) -> ApiResult<()> {
        let list = TargetsFile {
            targets: configs.values().cloned().collect(),
        };
        // Format 1: per-initiator CHAP, which a daemon that does not know it would drop.
        statefile::write_json_as(&self.file, &list, 1)
            .map_err(|e| ApiError::io(format!("cannot save {}: {e}", self.file.display())))
    }

    /// Builds the registry from the configuration; `resolve` finds a vdisk by "pool/name".
    pub fn apply_all(&self, resolve: &dyn Fn(&str) -> Option<(Arc<Engine>, Arc<Vdisk>)>) {
        for cfg in self.configs.lock().values() {
            if cfg.acl.is_empty() && !cfg.allow_any_initiator {
                warn!(
                    target = %cfg.iqn,
                    "the target admits no initiator: add one with 'tessera target acl add', or admit any with 'tessera target acl allow-any'"
                );
            }
            self.registry.add_target(Target::new(&cfg.iqn)).set_access(cfg.access());
        }
        self.present_missing(resolve);
    }

    /// Presents every configured LUN that is not presented yet and whose vdisk `resolve` finds:
    /// after a pool is imported, its LUNs come back.
    pub fn present_missing(&self, resolve: &dyn Fn(&str) -> Option<(Arc<Engine>, Arc<Vdisk>)>) {
        let configs = self.configs.lock();
        for cfg in configs.values() {
            let Some(t) = self.registry.target(&cfg.iqn) else {
                continue;
            };
            for (&n, vd) in &cfg.luns {
                if t.lun(n).is_some() {
                    continue;
                }
                let Some((e, v)) = resolve(vd) else {
                    warn!(target = %cfg.iqn, lun = n, vdisk = %vd, "LUN's vdisk is not available; not presented");
                    continue;
                };
                match self.logical_unit(&configs, vd, &e, v) {
                    Ok(l) => {
                        t.luns.write().insert(n, l);
                    }
                    Err(err) => warn!(target = %cfg.iqn, lun = n, vdisk = %vd, error = %err, "LUN not presented"),
                }
            }
        }
    }

    /// The logical unit of vdisk `name`: the one already presented by another target if there
    /// is one (a vdisk is one device, whatever the path: reservations, unit attentions and
    /// COMPARE AND WRITE are shared), else a new one with its saved persistent reservations
    /// and mode settings.
    fn logical_unit(
        &self,
        configs: &BTreeMap<String, TargetConfig>,
        name: &str,
        e: &Arc<Engine>,
        v: Arc<Vdisk>,
    ) -> Result<Arc<Lun>, String> {
        if let Some(l) = self.presented(configs, name) {
            return Ok(l);
        }
        self.new_logical_unit(name, e, v)
    }

    /// A new logical unit for vdisk `name`, with its saved persistent reservations and mode
    /// settings.
    fn new_logical_unit(&self, name: &str, e: &Arc<Engine>, v: Arc<Vdisk>) -> Result<Arc<Lun>, String> {
        let uid = lun_uid(e, &v);
        // A snapshot is presented write-protected.
        let read_only = v.is_snapshot();
        let (pool, vdisk) = name.split_once('/').unwrap_or(("", name));
        let lun = tessera_vdisk_lun::vdisk_lun(v.clone(), uid, read_only)
            .with_meter(self.meters.meter("iscsi", pool, vdisk))
            .with_copy_manager(self.copy.clone());
        let lun = if e.metadata_shared() {
            let lun = kept_in_pool(lun, e, &v)?;
            match self.pool_ports.lock().get(pool) {
                Some(p) => lun.with_port_groups(p.clone()),
                None => lun,
            }
        } else {
            self.kept_here(lun, uid)?
        };
        Ok(Arc::new(lun))
    }

    /// A LUN of a pool on this daemon alone keeps its state in files of the state directory:
    /// its persistent reservations while an initiator asked for APTPL (a restart of the
    /// daemon is a power loss of its LUNs), its MODE SELECT settings always.
    fn kept_here(&self, lun: Lun, uid: u128) -> Result<Lun, String> {
        let dir = self.file.with_file_name("reservations");
        let path = dir.join(format!("{uid:032x}.json"));
        let saved: PrState = statefile::read_json(
            &path,
            "it holds the LUN's persistent reservations (APTPL); fix it, or remove it to drop them",
        )?;
        saved.check().map_err(|err| {
            format!(
                "{} holds {err}; fix it, or remove it to drop the LUN's persistent reservations",
                path.display()
            )
        })?;
        let store: PrStore = Box::new(move |state| match state {
            Some(s) => {
                std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                statefile::write_json(&path, s).map_err(|e| format!("cannot save {}: {e}", path.display()))
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(format!("cannot remove {}: {e}", path.display()))
                }
                _ => Ok(()),
            },
        });
        // MODE SELECT settings (the write cache above all) are the LUN's too, saved beside.
        let mode_dir = self.file.with_file_name("modes");
        let mode_path = mode_dir.join(format!("{uid:032x}.json"));
        let saved_mode: Option<ModeState> = statefile::read_json(
            &mode_path,
            "it holds the LUN's mode settings (write cache, sense format, write protect); fix it, or remove it to go back to the defaults",
        )?;
        let mode_store: ModeStore = Box::new(move |m| {
            std::fs::create_dir_all(&mode_dir).map_err(|e| format!("cannot create {}: {e}", mode_dir.display()))?;
            statefile::write_json(&mode_path, m).map_err(|e| format!("cannot save {}: {e}", mode_path.display()))
        });
        Ok(lun
            .with_persistent_reservations(saved, store)
            .with_saved_mode(saved_mode, mode_store))
    }

    /// Stops presenting the LUNs of pool `pool`, keeping their configuration: the pool is no
    /// longer served here (another gateway took it), and comes back with `present_missing`.
    pub fn withdraw_pool(&self, pool: &str) {
        self.withdraw(pool, &|_| true);
    }

    /// Stops presenting the LUNs that serve pool `pool` here, keeping their configuration and
    /// any standby LUN that took a real one's place already (a pool handed over).
    pub fn withdraw_served(&self, pool: &str) {
        self.withdraw(pool, &|l| !is_standby(l));
    }

    fn withdraw(&self, pool: &str, which: &dyn Fn(&Lun) -> bool) {
        self.for_luns_of_pool(&self.configs.lock(), pool, |_, t, n, _| {
            if t.lun(n).is_some_and(|l| which(&l)) {
                t.luns.write().remove(&n);
            }
        });
    }

    /// Calls `f` with each configured LUN of pool `pool` whose target is registered: the
    /// target's configuration, the target, the LUN's number and its vdisk ("pool/name").
    fn for_luns_of_pool<'c>(
        &self,
        configs: &'c BTreeMap<String, TargetConfig>,
        pool: &str,
        mut f: impl FnMut(&'c TargetConfig, &Target, u64, &'c str),
    ) {
        for cfg in configs.values() {
            let Some(t) = self.registry.target(&cfg.iqn) else {
                continue;
            };
            for (&n, vd) in &cfg.luns {
                if vd.split_once('/').is_some_and(|(p, _)| p == pool) {
                    f(cfg, &t, n, vd);
                }
            }
        }
    }

    /// Presents the configured LUNs of pool `pool` from its vdisks (`resolve`), now served
    /// here, in place of whatever presented them (the standby LUNs while another gateway
    /// owned the pool): each LUN changes what answers behind it in one step, so that a host
    /// retrying on this path finds it in standby or served, never missing. A LUN whose vdisk
    /// `resolve` does not find, or that cannot be made, is withdrawn.
    pub fn serve_pool(&self, pool: &str, resolve: &dyn Fn(&str) -> Option<(Arc<Engine>, Arc<Vdisk>)>) {
        let configs = self.configs.lock();
        // One logical unit per vdisk, whatever the target.
        let mut made: BTreeMap<&str, Option<Arc<Lun>>> = BTreeMap::new();
        self.for_luns_of_pool(&configs, pool, |cfg, t, n, vd| {
            let lun = made.entry(vd).or_insert_with(|| {
                let Some((e, v)) = resolve(vd) else {
                    warn!(target = %cfg.iqn, lun = n, vdisk = %vd, "LUN's vdisk is not available; not presented");
                    return None;
                };
                self.new_logical_unit(vd, &e, v)
                    .map_err(|err| warn!(target = %cfg.iqn, lun = n, vdisk = %vd, error = %err, "LUN not presented"))
                    .ok()
            });
            match lun {
                Some(l) => t.luns.write().insert(n, l.clone()),
                None => t.luns.write().remove(&n),
            };
        });
    }

    /// The vdisks of pool `pool` that configured LUNs present ("pool/name"), once each.
    pub fn vdisks_of_pool(&self, pool: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for cfg in self.configs.lock().values() {
            for vd in cfg.luns.values() {
                if vd.split_once('/').is_some_and(|(p, _)| p == pool) && !out.contains(vd) {
                    out.push(vd.clone());
                }
            }
        }
        out
    }

    /// Presents the configured LUNs of pool `pool` (on RADOS, owned by another gateway) as
    /// standby ports behind `ports`; `unit` finds what the pool's metadata records of a vdisk
    /// ("pool/name"). A standby LUN presented already is brought up to date; any other LUN
    /// (none yet, or the real one of a pool being handed over) is replaced in one step, so
    /// that a host never finds it missing in between. A vdisk is one logical unit whatever
    /// the target, as for LUNs served here. A LUN whose vdisk `unit` does not find (deleted
    /// at the owner, or not made yet) is not presented, as at the owner; any other LUN there
    /// is left as it is.
    pub fn present_standby(&self, pool: &str, ports: &Arc<PoolPorts>, unit: &dyn Fn(&str) -> Option<StandbyUnit>) {
        let configs = self.configs.lock();
        let mut made: BTreeMap<&str, Option<Arc<Lun>>> = BTreeMap::new();
        self.for_luns_of_pool(&configs, pool, |_, t, n, vd| {
            let standby = made.entry(vd).or_insert_with(|| {
                let u = unit(vd)?;
                match self.presented(&configs, vd) {
                    Some(l) if refresh_standby(&l, &u) => Some(l),
                    // In a real LUN's place (the pool handed over, or opened again): its hosts
                    // find at their next command that the unit changed under them, as at a new
                    // owner. It stands for the unit attentions the real LUN had queued (a
                    // REGISTRATIONS PREEMPTED), which go with it, and has them read the
                    // reservations and the port states again.
                    Some(_) => Some(Arc::new(
                        standby_lun(&u, ports.clone())
                            .with_first_contact_attention(tessera_scsi::sense::POWER_ON_OCCURRED),
                    )),
                    None => Some(Arc::new(standby_lun(&u, ports.clone()))),
                }
            });
            match standby {
                Some(l) => {
                    if !t.lun(n).is_some_and(|c| Arc::ptr_eq(&c, l)) {
                        t.luns.write().insert(n, l.clone());
                    }
                }
                None => {
                    if t.lun(n).is_some_and(|c| is_standby(&c)) {
                        t.luns.write().remove(&n);
                    }
                }
            }
        });
    }

    /// The logical unit already presented for vdisk `name` by some target, if any.
    fn presented(&self, configs: &BTreeMap<String, TargetConfig>, name: &str) -> Option<Arc<Lun>> {
        configs.values().find_map(|cfg| {
            let t = self.registry.target(&cfg.iqn)?;
            cfg.luns
                .iter()
                .filter(|(_, vd)| *vd == name)
                .find_map(|(&n, _)| t.lun(n))
        })
    }

    /// Whether a target here that presents `lun` lets `initiator` log in (its ACL): what the
    /// owner of a pool checks before it runs a command that a standby port of another gateway
    /// forwarded for that initiator, so that a gateway whose ACL admits more than this one's
    /// cannot have this one act for an initiator it would refuse.
    pub fn admits(&self, lun: &Lun, initiator: &str) -> bool {
        self.configs.lock().values().any(|cfg| {
            cfg.access().admits(initiator)
                && self.registry.target(&cfg.iqn).is_some_and(|t| {
                    cfg.luns
                        .keys()
                        .any(|&n| t.lun(n).is_some_and(|l| std::ptr::eq(Arc::as_ptr(&l), lun)))
                })
        })
    }

    /// The LUNs presented from vdisks of pool `pool`, once each.
    pub fn luns_of_pool(&self, pool: &str) -> Vec<Arc<Lun>> {
        let mut out: Vec<Arc<Lun>> = Vec::new();
        self.for_luns_of_pool(&self.configs.lock(), pool, |_, t, n, _| {
            if let Some(l) = t.lun(n) {
                if !out.iter().any(|o| Arc::ptr_eq(o, &l)) {
                    out.push(l);
                }
            }
        });
        out
    }

    pub fn list(&self) -> Vec<TargetConfig> {
        self.configs.lock().values().cloned().collect()
    }

    pub fn get(&self, iqn: &str) -> ApiResult<TargetConfig> {
        self.configs
            .lock()
            .get(iqn)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no target '{iqn}'; 'tessera target list' shows them")))
    }

    pub fn create(&self, iqn: &str, allow_any_initiator: bool) -> ApiResult<TargetConfig> {
        validate_iqn(iqn).map_err(ApiError::invalid)?;
        let mut c = self.configs.lock();
        if c.contains_key(iqn) {
            return Err(ApiError::exists(format!("target '{iqn}' already exists")));
        }
        let cfg = TargetConfig {
            iqn: iqn.to_string(),
            allow_any_initiator,
            ..Default::default()
        };
        change_saved(
            &mut *c,
            |c| {
                c.insert(iqn.to_string(), cfg.clone());
                Ok(())
            },
            |c| self.save(c),
        )?;
        self.registry.add_target(Target::new(iqn)).set_access(cfg.access());
        Ok(cfg)
    }

    /// Admits any initiator, or again only those of the ACL.
    pub fn set_allow_any(&self, iqn: &str, allow: bool) -> ApiResult<()> {
        self.update_access(iqn, |cfg| {
            cfg.allow_any_initiator = allow;
            Ok(())
        })
    }

    pub fn delete(&self, iqn: &str) -> ApiResult<()> {
        let mut c = self.configs.lock();
        change_saved(
            &mut *c,
            |c| {
                c.remove(iqn)
                    .map(drop)
                    .ok_or_else(|| ApiError::not_found(format!("no target '{iqn}'")))
            },
            |c| self.save(c),
        )?;
        if let Some(t) = self.registry.remove_target(iqn) {
            let luns: Vec<[u8; 32]> = t.luns.read().values().map(|l| l.identification_cscd()).collect();
            self.revoke_unreachable(&luns);
        }
        Ok(())
    }

    /// Presents `vdisk` as LUN `lun` (the lowest free number if None). Without the vdisk
    /// (`served` None: its pool on RADOS is served by another gateway), the LUN is only
    /// recorded, and presented by `present_missing` once this gateway takes the pool.
    pub fn add_lun(
        &self,
        iqn: &str,
        lun: Option<u64>,
        name: &str,
        served: Option<(Arc<Engine>, Arc<Vdisk>)>,
    ) -> ApiResult<u64> {
        let mut c = self.configs.lock();
        let cfg = c
            .get_mut(iqn)
            .ok_or_else(|| ApiError::not_found(format!("no target '{iqn}'")))?;
        let n = match lun {
            Some(n) if n > MAX_LUN => {
                return Err(ApiError::invalid(format!("LUN {n} is above the highest, {MAX_LUN}")))
            }
            Some(n) if cfg.luns.contains_key(&n) => {
                return Err(ApiError::exists(format!(
                    "target '{iqn}' already has LUN {n} ({})",
                    cfg.luns[&n]
                )))
            }
            Some(n) => n,
            None => (0..=MAX_LUN)
                .find(|n| !cfg.luns.contains_key(n))
                .ok_or_else(|| ApiError::invalid("no free LUN"))?,
        };
        if let Some((m, _)) = cfg.luns.iter().find(|(_, v)| v.as_str() == name) {
            return Err(ApiError::exists(format!(
                "'{name}' is already LUN {m} of target '{iqn}'"
            )));
        }
        let lun = match served {
            Some((e, v)) => Some(self.logical_unit(&c, name, &e, v).map_err(ApiError::io)?),
            None => None,
        };
        change_saved(
            &mut *c,
            |c| {
                c.get_mut(iqn).expect("present").luns.insert(n, name.to_string());
                Ok(())
            },
            |c| self.save(c),
        )?;
        if let (Some(t), Some(lun)) = (self.registry.target(iqn), lun) {
            t.luns.write().insert(n, lun);
        }
        Ok(n)
    }

    pub fn remove_lun(&self, iqn: &str, lun: u64) -> ApiResult<()> {
        let mut c = self.configs.lock();
        change_saved(
            &mut *c,
            |c| {
                let cfg = c
                    .get_mut(iqn)
                    .ok_or_else(|| ApiError::not_found(format!("no target '{iqn}'")))?;
                cfg.luns
                    .remove(&lun)
                    .map(drop)
                    .ok_or_else(|| ApiError::not_found(format!("target '{iqn}' has no LUN {lun}")))
            },
            |c| self.save(c),
        )?;
        let removed = self.registry.target(iqn).and_then(|t| t.luns.write().remove(&lun));
        if let Some(l) = removed {
            // Its sessions cannot address it any more, nor release what they hold of it
            // (another target may present it still).
            for nexus in self.registry.nexuses_of(iqn) {
                l.unreachable_from(nexus);
            }
            self.revoke_unreachable(&[l.identification_cscd()]);
        }
        Ok(())
    }

    /// Changes a target's configuration with `change`, saves it (or undoes the change when the
    /// save fails) and applies the access rules: to the next logins, and to the sessions
    /// logged in, which end if the initiator is no longer admitted, and so do the ROD tokens
    /// it made on the target's LUNs.
    fn update_access(&self, iqn: &str, change: impl FnOnce(&mut TargetConfig) -> ApiResult<()>) -> ApiResult<()> {
        let mut c = self.configs.lock();
        let access = change_saved(
            &mut *c,
            |c| {
                let cfg = c
                    .get_mut(iqn)
                    .ok_or_else(|| ApiError::not_found(format!("no target '{iqn}'")))?;
                change(cfg)?;
                Ok(cfg.access())
            },
            |c| self.save(c),
        )?;
        self.registry.set_access(iqn, access);
        if let Some(t) = self.registry.target(iqn) {
            let luns: Vec<[u8; 32]> = t.luns.read().values().map(|l| l.identification_cscd()).collect();
            self.revoke_unreachable(&luns);
        }
        Ok(())
    }

    /// Ends the ROD tokens made on `luns` by initiators that no target lets reach them any
    /// more (its ACL changed, the LUN was taken out of it, the target deleted): what a host
    /// populated while it had access is not written anywhere after it lost it. A LUN can be
    /// presented by several targets: an initiator keeps its tokens on one that another target
    /// still lets it reach.
    fn revoke_unreachable(&self, luns: &[[u8; 32]]) {
        if luns.is_empty() {
            return;
        }
        self.copy
            .revoke_made_on(luns, |initiator, lun| !reaches(&self.registry, initiator, lun));
    }

    pub fn acl_add(&self, iqn: &str, initiator: &str) -> ApiResult<()> {
        validate_iqn(initiator).map_err(ApiError::invalid)?;
        self.update_access(iqn, |cfg| {
            if cfg.acl.iter().any(|a| a == initiator) {
                return Err(ApiError::exists(format!(
                    "'{initiator}' is already in the ACL of '{iqn}'"
                )));
            }
            cfg.acl.push(initiator.to_string());
            Ok(())
        })
    }

    pub fn acl_remove(&self, iqn: &str, initiator: &str) -> ApiResult<()> {
        self.update_access(iqn, |cfg| {
            let before = cfg.acl.len();
            cfg.acl.retain(|a| a != initiator);
            if cfg.acl.len() == before {
                return Err(ApiError::not_found(format!(
                    "'{initiator}' is not in the ACL of '{iqn}'"
                )));
            }
            Ok(())
        })
    }

    /// Sets the CHAP credentials of the target, or with `initiator` those that initiator alone
    /// logs in with (for the next logins).
    pub fn chap_set(&self, iqn: &str, initiator: Option<&str>, chap: SetChap) -> ApiResult<()> {
        validate_chap(&chap).map_err(ApiError::invalid)?;
        // iSCSI names compare case-insensitively (RFC 3722): kept in lower case.
        let initiator = initiator.map(str::to_ascii_lowercase);
        if let Some(i) = &initiator {
            validate_iqn(i).map_err(ApiError::invalid)?;
        }
        self.update_access(iqn, |cfg| {
            match initiator {
                Some(i) => {
                    cfg.initiator_chap.insert(i, chap);
                }
                None => cfg.chap = Some(chap),
            }
            Ok(())
        })
    }

    pub fn chap_clear(&self, iqn: &str, initiator: Option<&str>) -> ApiResult<()> {
        self.update_access(iqn, |cfg| {
            let had = match initiator {
                Some(i) => cfg.initiator_chap.remove(&i.to_ascii_lowercase()).is_some(),
                None => cfg.chap.take().is_some(),
            };
            if !had {
                return Err(ApiError::not_found(match initiator {
                    Some(i) => format!("target '{iqn}' has no CHAP secret of its own for '{i}'"),
                    None => format!("target '{iqn}' has no CHAP secret"),
                }));
            }
            Ok(())
        })
    }

    /// The presented LUNs of a vdisk ("pool/name").
    pub fn luns_of(&self, name: &str) -> Vec<Arc<Lun>> {
        let mut out = Vec::new();
        for cfg in self.configs.lock().values() {
            for (&n, v) in &cfg.luns {
                if v == name {
                    out.extend(self.registry.target(&cfg.iqn).and_then(|t| t.lun(n)));
                }
            }
        }
        out
    }

    /// Where a vdisk (or, with a trailing '/', any vdisk of a pool) is presented.
    pub fn users_of(&self, prefix_or_name: &str) -> Vec<String> {
        let mut out = Vec::new();
        for cfg in self.configs.lock().values() {
            for (n, v) in &cfg.luns {
                let hit = if prefix_or_name.ends_with('/') {
                    v.starts_with(prefix_or_name)
                } else {
                    v == prefix_or_name
                };
                if hit {
                    out.push(format!("LUN {n} of target {}", cfg.iqn));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taking a pool over: each of its LUNs is served by its vdisk in place of the standby
    /// LUN, in one step (a host polling the LUN never finds it missing); one vdisk behind two
    /// targets stays one logical unit; a LUN whose vdisk is gone is withdrawn, and LUNs of
    /// other pools are left as they were. Handing it over swaps them back the same way.
    #[test]
    fn serving_a_pool_and_handing_it_over_swap_its_luns_in_one_step() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tessera_scsi::AccessState;
        use tessera_volume::{LayoutKind, VdiskSpec};
        const MIB: u64 = 1 << 20;
        let (a, b) = ("iqn.2026-11.io.tessera:a", "iqn.2026-11.io.tessera:b");
        let dir = tempfile::tempdir().unwrap();
        let targets = Targets::load(dir.path().join("targets.json"), Arc::new(IoMetrics::default())).unwrap();
        let disk: tessera_disk::DiskRef = Arc::new(tessera_disk::MemDisk::new("m0", 64 * MIB));
        let engine = Arc::new(Engine::create_pool(&dir.path().join("pool"), "p", vec![disk], 16 * MIB).unwrap());
        let vm = engine
            .create_vdisk(&VdiskSpec::new("vm", 8 * MIB, LayoutKind::Simple))
            .unwrap();
        for iqn in [a, b] {
            targets.create(iqn, true).unwrap();
        }
        targets.add_lun(a, Some(0), "p/vm", None).unwrap();
        targets.add_lun(a, Some(1), "p/gone", None).unwrap();
        targets.add_lun(b, Some(3), "p/vm", None).unwrap();
        targets.add_lun(b, Some(0), "q/elsewhere", None).unwrap();

        // Another gateway owns pool p: its LUNs are standby ones.
        let ports = PoolPorts::new("gw-b", AccessState::Standby, Some("gw-a".into()), Default::default());
        let unit = |vd: &str| {
            (vd == "p/vm" || vd == "p/gone").then(|| StandbyUnit {
                uid: 0x1234,
                config: vm.config(),
                mode: None,
            })
        };
        targets.present_standby("p", &ports, &unit);
        let lun = |iqn: &str, n: u64| targets.registry.target(iqn).unwrap().lun(n);
        let standby = lun(a, 0).unwrap();
        assert!(refresh_standby(&standby, &unit("p/vm").unwrap()));
        assert!(Arc::ptr_eq(&standby, &lun(b, 3).unwrap()), "one logical unit");
        assert!(lun(a, 1).is_some() && lun(b, 0).is_none());

        // This gateway takes the pool, while a host keeps asking for LUN 0.
        let resolve = |vd: &str| (vd == "p/vm").then(|| (engine.clone(), vm.clone()));
        // `watching` runs `look` until `change` is done, from before it starts.
        let watching = |look: &(dyn Fn() + Sync), change: &dyn Fn()| {
            let (started, done) = (AtomicBool::new(false), AtomicBool::new(false));
            std::thread::scope(|s| {
                let watcher = s.spawn(|| {
                    while !done.load(Ordering::Acquire) {
                        look();
                        started.store(true, Ordering::Release);
                    }
                });
                while !started.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                change();
                done.store(true, Ordering::Release);
                watcher.join().unwrap();
            });
        };
        watching(
            &|| assert!(lun(a, 0).is_some(), "LUN 0 went missing while the pool was taken"),
            &|| targets.serve_pool("p", &resolve),
        );
        let served = lun(a, 0).unwrap();
        assert!(!Arc::ptr_eq(&served, &standby));
        assert!(
            !refresh_standby(&served, &unit("p/vm").unwrap()),
            "the real LUN, not a standby one"
        );
        assert_eq!(served.backend().size(), 8 * MIB);
        assert!(Arc::ptr_eq(&served, &lun(b, 3).unwrap()), "still one logical unit");
        assert!(lun(a, 1).is_none(), "the LUN of a vdisk that is gone is withdrawn");
        assert!(lun(b, 0).is_none(), "another pool's LUN is left as it was");
        assert_eq!(targets.get(a).unwrap().luns.len(), 2, "the configuration stays");

        // Handed over to another gateway: standby LUNs in the real ones' places, in one step
        // again; withdrawing what served the pool leaves them.
        watching(
            &|| assert!(lun(b, 3).is_some(), "LUN 3 went missing while the pool was handed over"),
            &|| {
                targets.present_standby("p", &ports, &unit);
                targets.withdraw_served("p");
            },
        );
        let standby = lun(b, 3).unwrap();
        assert!(refresh_standby(&standby, &unit("p/vm").unwrap()), "a standby LUN again");
        assert!(Arc::ptr_eq(&standby, &lun(a, 0).unwrap()), "one logical unit");
        assert!(
            lun(a, 1).is_some(),
            "the vdisk the records have gets its standby LUN again"
        );
        // The owner deletes vm and makes another vdisk under its name: another logical unit,
        // whose standby LUN replaces the first in one step; deleted for good, none is left.
        let remade = |vd: &str| {
            (vd == "p/vm").then(|| StandbyUnit {
                uid: 0x5678,
                config: vm.config(),
                mode: None,
            })
        };
        let before = lun(a, 0).unwrap();
        targets.present_standby("p", &ports, &remade);
        let after = lun(a, 0).unwrap();
        assert!(!Arc::ptr_eq(&before, &after), "the old vdisk's LUN stayed");
        assert_ne!(before.naa(), after.naa());
        assert!(Arc::ptr_eq(&after, &lun(b, 3).unwrap()), "one logical unit");
        assert!(
            lun(a, 1).is_none(),
            "the LUN of a vdisk the records no longer have is withdrawn"
        );
        targets.present_standby("p", &ports, &|_| None);
        assert!(lun(a, 0).is_none() && lun(b, 3).is_none());
        assert_eq!(targets.get(a).unwrap().luns.len(), 2, "the configuration stays");
        targets.withdraw_pool("p");
        assert!(lun(a, 0).is_none() && lun(b, 3).is_none());
    }

    /// A targets file edited by hand is checked as the API checks what it takes: a target
    /// listed twice, a name that is not an iSCSI name, a LUN number past the highest or a CHAP
    /// secret the API refuses stop the daemon with why, rather than being served in part and
    /// then saved without the rest.
    #[test]
    fn a_targets_file_edited_by_hand_is_checked_as_the_api_checks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("targets.json");
        let load = |json: &str| {
            std::fs::write(&file, json).unwrap();
            Targets::load(file.clone(), Arc::new(IoMetrics::default())).map(|_| ())
        };
        let t = |iqn: &str, extra: &str| format!(r#"{{"iqn":"{iqn}"{extra}}}"#);
        let ok = t("iqn.2026-12.io.example:a", "");
        assert!(load(&format!(r#"{{"targets":[{ok}]}}"#)).is_ok());
        for (bad, why) in [
            (format!("{ok},{ok}"), "listed twice"),
            (t("not a name", ""), "not an iSCSI name"),
            (
                t("iqn.2026-12.io.example:b", r#","luns":{"99999":"p/v"}"#),
                "above the highest",
            ),
            (
                t("iqn.2026-12.io.example:c", r#","acl":["bad name"]"#),
                "not an iSCSI name",
            ),
            (
                t("iqn.2026-12.io.example:d", r#","chap":{"user":"u","secret":"short"}"#),
                "secret",
            ),
        ] {
            let e = load(&format!(r#"{{"targets":[{bad}]}}"#)).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn chap_rules() {
        let good = SetChap {
            user: "host1".into(),
            secret: "0123456789abcdef".into(),
            mutual_user: None,
            mutual_secret: None,
        };
        validate_chap(&good).unwrap();
        let short = SetChap {
            secret: "short".into(),
            ..good.clone()
        };
        assert!(validate_chap(&short).unwrap_err().contains("12 to 255"));
        let half = SetChap {
            mutual_user: Some("tgt".into()),
            ..good.clone()
        };
        assert!(validate_chap(&half).unwrap_err().contains("both"));
        let same = SetChap {
            mutual_user: Some("tgt".into()),
            mutual_secret: Some(good.secret.clone()),
            ..good.clone()
        };
        assert!(validate_chap(&same).unwrap_err().contains("differ"));
        let mutual = SetChap {
            mutual_user: Some("tgt".into()),
            mutual_secret: Some("fedcba9876543210".into()),
            ..good
        };
        validate_chap(&mutual).unwrap();
        let cfg = TargetConfig {
            chap: Some(mutual),
            ..Default::default()
        };
        assert_eq!(cfg.access().chap.unwrap().mutual.unwrap().0, "tgt");
    }

    #[test]
    fn iscsi_names() {
        for ok in [
            "iqn.2026-11.io.tessera:demo",
            "iqn.1998-01.com.vmware:esx-1",
            "eui.02004567a425678d",
            "naa.52004567ba64678d",
        ] {
            validate_iqn(ok).unwrap();
        }
        for bad in [
            "",
            "iqn.2026.io.x",
            "IQN.2026-11.io.x",
            "iqn.2026-11.io x",
            "eui.123",
            "target1",
        ] {
            assert!(validate_iqn(bad).is_err(), "{bad}");
        }
    }
}
