//! The parameter lists an initiator sends after login, into a real logical unit on a pool of
//! memory disks: PERSISTENT RESERVE OUT, EXTENDED COPY, POPULATE TOKEN, WRITE USING TOKEN,
//! UNMAP, MODE SELECT(6/10) and WRITE SAME. The CDB is well formed, its parameter list
//! length is the data's, and the data is anything. Nothing may panic, every answer is a
//! well-formed SCSI status, and the engine's metadata stays consistent.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tessera_disk::{DiskRef, MemDisk};
use tessera_scsi::{sense, CopyManager, Lun, LunScope, Nexus, Scope};
use tessera_vdisk_lun::vdisk_lun;
use tessera_volume::{Engine, LayoutKind, VdiskSpec};

const MIB: u64 = 1 << 20;

/// Two LUNs of one target, which EXTENDED COPY may name by their NAA designators.
struct Rig {
    engine: Engine,
    luns: Vec<Arc<Lun>>,
    target: Arc<Target>,
    runs: std::sync::atomic::AtomicU64,
}

struct Target(Vec<Arc<Lun>>);

impl LunScope for Target {
    fn lun_by_naa(&self, naa: &[u8; 16]) -> Option<Arc<Lun>> {
        self.0.iter().find(|l| l.naa() == naa).cloned()
    }
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tessera-fuzz-scsi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let disks: Vec<DiskRef> = (0..3)
            .map(|i| Arc::new(MemDisk::new(&format!("m{i}"), 64 * MIB)) as DiskRef)
            .collect();
        let engine = Engine::create_pool(&dir.join("p"), "p", disks, MIB).unwrap();
        let cm = Arc::new(CopyManager::new());
        let luns: Vec<Arc<Lun>> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut s = VdiskSpec::new(n, 8 * MIB, LayoutKind::Mirror);
                s.grain_size = Some(64 << 10);
                let v = engine.create_vdisk(&s).unwrap();
                Arc::new(vdisk_lun(v, 0x100 + i as u128, false).with_copy_manager(cm.clone()))
            })
            .collect();
        let target = Arc::new(Target(luns.clone()));
        Rig {
            engine,
            luns,
            target,
            runs: Default::default(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, params)) = data.split_first() else {
        return;
    };
    let r = rig();
    let lun = &r.luns[(pick >> 7) as usize];
    let nexus = Nexus::new(1 + (pick as u64 >> 5 & 3), "iqn.2026-11.io.example:fuzz", [0x40, 0, 0, 0, 0, pick >> 5 & 3])
        .with_scope(Scope::of(&r.target));
    let len = params.len();
    let cdb: Vec<u8> = match pick & 0x0F {
        // PERSISTENT RESERVE OUT, every service action and type.
        0 => vec![0x5F, params.first().map_or(0, |b| b & 0x1F), params.get(1).map_or(0, |b| b & 0x0F), 0, 0, (len >> 24) as u8, (len >> 16) as u8, (len >> 8) as u8, len as u8, 0],
        // EXTENDED COPY (LID1).
        1 => tpc(0x83, 0x00, len),
        // POPULATE TOKEN, WRITE USING TOKEN.
        2 => tpc(0x83, 0x10, len),
        3 => tpc(0x83, 0x11, len),
        // UNMAP.
        4 => vec![0x42, 0, 0, 0, 0, 0, 0, (len >> 8) as u8, len as u8, 0],
        // MODE SELECT(6) and (10), with PF, with and without SP.
        5 => vec![0x15, 0x10 | (pick >> 4 & 1), 0, 0, len.min(255) as u8, 0],
        6 => vec![0x55, 0x10 | (pick >> 4 & 1), 0, 0, 0, 0, 0, (len >> 8) as u8, len as u8, 0],
        // WRITE SAME(16) of one block, UNMAP or not, at an LBA from the data.
        7 => {
            let mut c = vec![0x93, if pick & 0x10 != 0 { 0x08 } else { 0 }, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
            if let Some(l) = params.get(..8) {
                c[2..10].copy_from_slice(l);
            }
            c
        }
        // RECEIVE COPY RESULTS / ROD TOKEN INFORMATION and REPORT ALL ROD TOKENS after the
        // above, with an allocation length from the data.
        8 => {
            let mut c = vec![0x84, params.first().map_or(0, |b| b & 0x1F), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            if let Some(x) = params.get(1..6) {
                c[2..6].copy_from_slice(&x[..4]);
                c[13] = x[4];
            }
            c
        }
        _ => return,
    };
    let data_out = if pick & 0x0F == 7 { vec![0u8; 512] } else { params.to_vec() };
    let resp = lun.execute_for(&nexus, &cdb, &data_out);
    match resp.status {
        sense::GOOD | sense::RESERVATION_CONFLICT => {}
        sense::CHECK_CONDITION => assert!(resp.sense.len() >= 8, "CHECK CONDITION without sense"),
        s => panic!("status {s:#x}"),
    }
    // Now and then: the metadata still agrees with itself.
    if r.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 4096 == 0 {
        let report = r.engine.check().unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
});

fn tpc(op: u8, sa: u8, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[1] = sa;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}
