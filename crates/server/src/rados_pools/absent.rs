//! Without the `rados` feature: joining fails and says why, so nothing else is reachable.

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
    pub fn claim_place(&self, _: &str, _: &Placement) -> Result<bool, super::PlaceRefused> {
        match self.never {}
    }
    pub fn unclaim_place(&self, _: &str, _: &Placement) -> Result<(), String> {
        match self.never {}
    }
    pub fn check_place(&self, _: &str, _: &Placement) -> Result<(), super::PlaceRefused> {
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

#[derive(Clone)]
pub struct Refusals(std::convert::Infallible);

impl Refusals {
    pub fn refused(&self) -> Option<String> {
        match self.0 {}
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
    pub fn refusals(&self) -> Refusals {
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
