//! A verifying write load for the failure tests: 4 KiB blocks stamped with their number and a
//! sequence number, written at random through NBD while a test kills what it kills, with a
//! record of what the host was told (acknowledged, or outcome unknown) to check every block
//! against at the end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::Daemon;

pub const BLOCK: usize = 4096;
pub const BLOCKS: u64 = 4096;

/// Checks that block `n`, read as `got`, holds what was acknowledged last (or, for the
/// block of a write whose outcome is unknown, that write).
pub fn check(n: u64, got: &[u8], acked: &Acked) {
    let want = acked.seq[n as usize];
    let maybe = acked.unknown[n as usize];
    let ok = |s: u64| {
        if s == 0 {
            got.iter().all(|&b| b == 0)
        } else {
            got == block(n, s)
        }
    };
    let seq = u64::from_le_bytes(got[8..16].try_into().unwrap());
    assert!(
        ok(want) || (maybe != 0 && ok(maybe)),
        "block {n}: acknowledged sequence {want} (outcome unknown: {maybe}), read sequence {seq}"
    );
}

pub fn block(n: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![(seq % 251) as u8; BLOCK];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b
}

/// What the host was told: the last acknowledged sequence number of every block (0:
/// never written), and per block the write whose outcome it never learnt (its gateway
/// failed it), if no acknowledged write came after: the block may hold either.
#[derive(Default)]
pub struct Acked {
    pub seq: Vec<u64>,
    pub unknown: Vec<u64>,
    pub next: u64,
    pub writes: u64,
}

impl Acked {
    /// Nothing written yet.
    pub fn new() -> Acked {
        Acked {
            seq: vec![0; BLOCKS as usize],
            unknown: vec![0; BLOCKS as usize],
            ..Default::default()
        }
    }
}

/// Writes through `addr` until its gateway fails a request or `stop` is set.
pub fn run(addr: String, acked: Arc<Mutex<Acked>>, stop: Arc<AtomicBool>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let Ok(c) = tessera_nbd::client::Client::connect(&addr, "v").await else {
            return;
        };
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ acked.lock().unwrap().next;
        while !stop.load(Ordering::Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = x % BLOCKS;
            let seq = {
                let mut a = acked.lock().unwrap();
                a.next += 1;
                a.next
            };
            let r = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                c.write(n * BLOCK as u64, &block(n, seq), seq % 2 == 0),
            )
            .await;
            let mut a = acked.lock().unwrap();
            if !matches!(r, Ok(Ok(()))) {
                a.unknown[n as usize] = seq;
                return;
            }
            a.seq[n as usize] = seq;
            a.unknown[n as usize] = 0;
            a.writes += 1;
        }
    });
}

/// Reads every block through `addr` and checks it holds what was acknowledged last (or,
/// for the block of a write whose outcome is unknown, that write).
pub fn verify(addr: &str, acked: &Acked) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = tessera_nbd::client::Client::connect(addr, "v").await.unwrap();
        for n in 0..BLOCKS {
            let got = c.read(n * BLOCK as u64, BLOCK as u32).await.unwrap();
            check(n, &got, acked);
        }
    });
}

/// Creates the load's vdisk ("pool/v") in pool `pool` through `d`; its name.
pub fn create_vdisk(d: &Daemon, pool: &str) -> String {
    let vdisk = format!("{pool}/v");
    let size = (BLOCKS * BLOCK as u64).to_string();
    let args = [
        "vdisk",
        "create",
        &vdisk,
        "--size",
        &size,
        "--layout",
        "simple",
        "--block-size",
        "4096",
    ];
    d.ok(&args);
    vdisk
}
