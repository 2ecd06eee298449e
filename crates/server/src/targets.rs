//! iSCSI targets as the daemon keeps them: which vdisk each LUN of each target presents,
//! persisted in `<state dir>/targets.json` and applied to the protocol's registry.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_iscsi::{Registry, Target};
use tessera_scsi::Lun;
use tessera_volume::{Engine, Vdisk};
use tracing::warn;

use crate::error::{ApiError, ApiResult};
use crate::statefile;

/// LUN numbers we hand out: single-level, flat space.
pub const MAX_LUN: u64 = 16383;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetConfig {
    pub iqn: String,
    /// LUN number → "pool/vdisk".
    #[serde(default)]
    pub luns: BTreeMap<u64, String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TargetsFile {
    targets: Vec<TargetConfig>,
}

pub struct Targets {
    file: PathBuf,
    configs: Mutex<BTreeMap<String, TargetConfig>>,
    pub registry: Arc<Registry>,
}

/// A stable per-vdisk identifier for the LUN's NAA id and serial number.
pub fn lun_uid(e: &Engine, v: &Vdisk) -> u128 {
    e.pool().id().as_u128().rotate_left(40) ^ v.id() as u128
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

impl Targets {
    pub fn load(file: PathBuf) -> Result<Targets, String> {
        let list: TargetsFile = statefile::read_json(&file, "fix it or move it away")?;
        let configs = list.targets.into_iter().map(|t| (t.iqn.clone(), t)).collect();
        Ok(Targets {
            file,
            configs: Mutex::new(configs),
            registry: Registry::new(),
        })
    }

    fn save(&self, configs: &BTreeMap<String, TargetConfig>) -> ApiResult<()> {
        let list = TargetsFile {
            targets: configs.values().cloned().collect(),
        };
        statefile::write_json(&self.file, &list)
            .map_err(|e| ApiError::io(format!("cannot save {}: {e}", self.file.display())))
    }

    /// Builds the registry from the configuration; `resolve` finds a vdisk by "pool/name".
    pub fn apply_all(&self, resolve: &dyn Fn(&str) -> Option<(Arc<Engine>, Arc<Vdisk>)>) {
        for cfg in self.configs.lock().values() {
            self.registry.add_target(Target::new(&cfg.iqn));
        }
        self.present_missing(resolve);
    }

    /// Presents every configured LUN that is not presented yet and whose vdisk `resolve` finds:
    /// after a pool is imported, its LUNs come back.
    pub fn present_missing(&self, resolve: &dyn Fn(&str) -> Option<(Arc<Engine>, Arc<Vdisk>)>) {
        for cfg in self.configs.lock().values() {
            let Some(t) = self.registry.target(&cfg.iqn) else {
                continue;
            };
            for (&n, vd) in &cfg.luns {
                if t.lun(n).is_some() {
                    continue;
                }
                match resolve(vd) {
                    Some((e, v)) => {
                        let uid = lun_uid(&e, &v);
                        t.luns.write().insert(n, Arc::new(Lun::new(v, uid, false)));
                    }
                    None => {
                        warn!(target = %cfg.iqn, lun = n, vdisk = %vd, "LUN's vdisk is not available; not presented")
                    }
                }
            }
        }
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

    pub fn create(&self, iqn: &str) -> ApiResult<TargetConfig> {
        validate_iqn(iqn).map_err(ApiError::invalid)?;
        let mut c = self.configs.lock();
        if c.contains_key(iqn) {
            return Err(ApiError::exists(format!("target '{iqn}' already exists")));
        }
        let cfg = TargetConfig {
            iqn: iqn.to_string(),
            luns: BTreeMap::new(),
        };
        c.insert(iqn.to_string(), cfg.clone());
        if let Err(e) = self.save(&c) {
            c.remove(iqn);
            return Err(e);
        }
        self.registry.add_target(Target::new(iqn));
        Ok(cfg)
    }

    pub fn delete(&self, iqn: &str) -> ApiResult<()> {
        let mut c = self.configs.lock();
        let old = c
            .remove(iqn)
            .ok_or_else(|| ApiError::not_found(format!("no target '{iqn}'")))?;
        if let Err(e) = self.save(&c) {
            c.insert(iqn.to_string(), old);
            return Err(e);
        }
        self.registry.remove_target(iqn);
        Ok(())
    }

    /// Presents `vdisk` as LUN `lun` (the lowest free number if None).
    pub fn add_lun(&self, iqn: &str, lun: Option<u64>, name: &str, e: Arc<Engine>, v: Arc<Vdisk>) -> ApiResult<u64> {
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
        cfg.luns.insert(n, name.to_string());
        if let Err(err) = self.save(&c) {
            c.get_mut(iqn).expect("present").luns.remove(&n);
            return Err(err);
        }
        if let Some(t) = self.registry.target(iqn) {
            let uid = lun_uid(&e, &v);
            t.luns.write().insert(n, Arc::new(Lun::new(v, uid, false)));
        }
        Ok(n)
    }

    pub fn remove_lun(&self, iqn: &str, lun: u64) -> ApiResult<()> {
        let mut c = self.configs.lock();
        let cfg = c
            .get_mut(iqn)
            .ok_or_else(|| ApiError::not_found(format!("no target '{iqn}'")))?;
        let old = cfg
            .luns
            .remove(&lun)
            .ok_or_else(|| ApiError::not_found(format!("target '{iqn}' has no LUN {lun}")))?;
        if let Err(e) = self.save(&c) {
            c.get_mut(iqn).expect("present").luns.insert(lun, old);
            return Err(e);
        }
        if let Some(t) = self.registry.target(iqn) {
            t.luns.write().remove(&lun);
        }
        Ok(())
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
