//! NBD exports as the daemon keeps them: which vdisk each export name serves and whether it is
//! read-only, persisted in `<state dir>/nbd.json` and applied to the NBD server's registry.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_nbd::{Export, Registry};
use tessera_volume::{Engine, Vdisk};
use tracing::warn;

use crate::error::{ApiError, ApiResult};
use crate::metrics::IoMetrics;
use crate::statefile::{self, change_saved};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdExportConfig {
    pub name: String,
    /// "pool/vdisk".
    pub vdisk: String,
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct ExportsFile {
    exports: Vec<NbdExportConfig>,
}

/// Export names: what fits in an `nbd://host/NAME` URI without escaping.
pub fn validate_export_name(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 128 {
        return Err(format!("export name '{s}' must be 1 to 128 characters"));
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '@'))
    {
        return Err(format!(
            "export name '{s}' may hold only letters, digits, '-', '_', '.', ':' and '@' (a snapshot's default name is VDISK@NAME)"
        ));
    }
    Ok(())
}

pub struct NbdExports {
    file: PathBuf,
    configs: Mutex<BTreeMap<String, NbdExportConfig>>,
    pub registry: Arc<Registry>,
    /// Where the exports report their requests.
    meters: Arc<IoMetrics>,
}

type Resolve<'a> = &'a dyn Fn(&str) -> Option<(Arc<Engine>, Arc<Vdisk>)>;

impl NbdExports {
    pub fn load(file: PathBuf, meters: Arc<IoMetrics>) -> Result<NbdExports, String> {
        let list: ExportsFile = statefile::read_json(&file, "fix it or move it away")?;
        let mut configs = BTreeMap::new();
        for c in list.exports {
            validate_export_name(&c.name).map_err(|e| format!("{}: {e}", file.display()))?;
            if configs.contains_key(&c.name) {
                return Err(format!(
                    "{}: export '{}' is listed twice; fix it or move the file away",
                    file.display(),
                    c.name
                ));
            }
            configs.insert(c.name.clone(), c);
        }
        Ok(NbdExports {
            file,
            configs: Mutex::new(configs),
            registry: Registry::new(),
            meters,
        })
    }

    fn save(&self, configs: &BTreeMap<String, NbdExportConfig>) -> ApiResult<()> {
        let list = ExportsFile {
            exports: configs.values().cloned().collect(),
        };
        statefile::write_json(&self.file, &list)
            .map_err(|e| ApiError::io(format!("cannot save {}: {e}", self.file.display())))
    }

    fn export(&self, c: &NbdExportConfig, v: Arc<Vdisk>) -> Export {
        // A snapshot is always offered read-only.
        let read_only = c.read_only || v.is_snapshot();
        let (pool, vdisk) = c.vdisk.split_once('/').unwrap_or(("", &c.vdisk));
        let meter = self.meters.meter("nbd", pool, vdisk);
        Export::new(&c.name, &c.vdisk, v, read_only).metered(meter)
    }

    /// Offers every configured export that is not offered yet and whose vdisk `resolve` finds:
    /// after a pool is imported, its exports come back; a writable one only if `writable`
    /// admits its vdisk (not a replica's working copy, which another gateway of the pool may
    /// have marked so since the export was made).
    pub fn present_missing(&self, resolve: Resolve, writable: &dyn Fn(&str) -> Result<(), String>) {
        for c in self.configs.lock().values() {
            if self.registry.get(&c.name).is_some() {
                continue;
            }
            if !c.read_only {
                if let Err(why) = writable(&c.vdisk) {
                    warn!(export = %c.name, vdisk = %c.vdisk, reason = %why, "NBD export not offered");
                    continue;
                }
            }
            match resolve(&c.vdisk) {
                Some((_, v)) => {
                    self.registry.add(self.export(c, v));
                }
                None => warn!(export = %c.name, vdisk = %c.vdisk, "NBD export's vdisk is not available; not offered"),
            }
        }
    }

    pub fn list(&self) -> Vec<NbdExportConfig> {
        self.configs.lock().values().cloned().collect()
    }

    pub fn get(&self, name: &str) -> ApiResult<NbdExportConfig> {
        self.configs
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no NBD export '{name}'; 'tessera nbd list' shows them")))
    }

    pub fn add(&self, mut cfg: NbdExportConfig, v: Arc<Vdisk>) -> ApiResult<()> {
        cfg.read_only |= v.is_snapshot();
        self.record(&cfg, || {
            self.registry.add(self.export(&cfg, v));
        })
    }

    /// Records an export of a vdisk that is not served here yet (its pool on RADOS owned by
    /// another gateway): `present_missing` offers it once this gateway takes the pool.
    pub fn add_waiting(&self, cfg: NbdExportConfig) -> ApiResult<()> {
        self.record(&cfg, || {})
    }

    /// Saves `cfg` and, still under the configurations' lock, runs `then` (which offers it):
    /// a `present_missing` or a `remove` meanwhile finds both or neither.
    fn record(&self, cfg: &NbdExportConfig, then: impl FnOnce()) -> ApiResult<()> {
        validate_export_name(&cfg.name).map_err(ApiError::invalid)?;
        let mut c = self.configs.lock();
        if let Some(old) = c.get(&cfg.name) {
            return Err(ApiError::exists(format!(
                "NBD export '{}' already exists (it serves {}); choose another with --name",
                cfg.name, old.vdisk
            )));
        }
        change_saved(
            &mut *c,
            |c| {
                c.insert(cfg.name.clone(), cfg.clone());
                Ok(())
            },
            |c| self.save(c),
        )?;
        then();
        Ok(())
    }

    /// Stops offering an export; the connections open to it end (their next request is
    /// refused with ESHUTDOWN).
    pub fn remove(&self, name: &str) -> ApiResult<()> {
        let mut c = self.configs.lock();
        change_saved(
            &mut *c,
            |c| {
                c.remove(name)
                    .map(drop)
                    .ok_or_else(|| ApiError::not_found(format!("no NBD export '{name}'")))
            },
            |c| self.save(c),
        )?;
        self.registry.remove(name);
        Ok(())
    }

    /// Stops offering the exports of pool `pool`, keeping their configuration: the pool is no
    /// longer served here (their connections end), and they come back with `present_missing`.
    pub fn withdraw_pool(&self, pool: &str) {
        for c in self.configs.lock().values() {
            if c.vdisk.split_once('/').is_some_and(|(p, _)| p == pool) {
                self.registry.remove(&c.name);
            }
        }
    }

    /// Open connections to an export.
    pub fn connections(&self, name: &str) -> usize {
        self.registry.get(name).map(|e| e.connections()).unwrap_or(0)
    }

    /// Where a vdisk (or, with a trailing '/', any vdisk of a pool) is exported.
    pub fn users_of(&self, prefix_or_name: &str) -> Vec<String> {
        self.configs
            .lock()
            .values()
            .filter(|c| {
                if prefix_or_name.ends_with('/') {
                    c.vdisk.starts_with(prefix_or_name)
                } else {
                    c.vdisk == prefix_or_name
                }
            })
            .map(|c| format!("NBD export {}", c.name))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_names() {
        for ok in ["vol1", "demo:vol1", "a.b-c_d"] {
            validate_export_name(ok).unwrap();
        }
        for bad in ["", "a/b", "a b", "é", &"x".repeat(129)] {
            assert!(validate_export_name(bad).is_err(), "{bad}");
        }
    }
}
