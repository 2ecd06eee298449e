//! Crash test: a child process writes, trims and clones on file-backed vdisks and reports
//! each operation before it starts and once it is durable; the parent kills it with SIGKILL
//! at a random moment, reopens the pool (replaying the stripe journal), and checks that every
//! acknowledged operation is there, that the one in flight left each block either old or new,
//! that the metadata is consistent and that parity agrees with the data. Then it fails a disk
//! and reads everything again, so a parity write hole would show up as wrong data.
//!
//! TESSERA_CRASH_ROUNDS sets the number of kills (default 50).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tessera_disk::{DiskError, DiskRef, FileDisk};
use tessera_volume::{Engine, LayoutKind, Provisioning, VdiskSpec};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 2 * MIB;
const BLOCK: u64 = 4096;
const NAMES: [&str; 3] = ["mirror", "parity", "dual"];

fn opener(path: &str) -> Result<DiskRef, DiskError> {
    Ok(Arc::new(FileDisk::open(path)?) as DiskRef)
}

fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            ((offset + i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93))
                .rotate_right(29) as u8
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Action {
    Write {
        vd: usize,
        off: u64,
        len: u64,
        seed: u64,
    },
    Trim {
        vd: usize,
        off: u64,
        len: u64,
    },
    Clone {
        src: usize,
        so: u64,
        dst: usize,
        d_o: u64,
        len: u64,
    },
}

impl Action {
    fn encode(&self) -> String {
        match self {
            Action::Write { vd, off, len, seed } => format!("W {vd} {off} {len} {seed}"),
            Action::Trim { vd, off, len } => format!("T {vd} {off} {len}"),
            Action::Clone { src, so, dst, d_o, len } => format!("C {src} {so} {dst} {d_o} {len}"),
        }
    }

    fn decode(s: &str) -> Action {
        let f: Vec<u64> = s.split(' ').skip(1).map(|x| x.parse().unwrap()).collect();
        match &s[..1] {
            "W" => Action::Write {
                vd: f[0] as usize,
                off: f[1],
                len: f[2],
                seed: f[3],
            },
            "T" => Action::Trim {
                vd: f[0] as usize,
                off: f[1],
                len: f[2],
            },
            _ => Action::Clone {
                src: f[0] as usize,
                so: f[1],
                dst: f[2] as usize,
                d_o: f[3],
                len: f[4],
            },
        }
    }

    /// The model after this action; the dst/vd range is what it touches.
    fn apply(&self, m: &mut [Vec<u8>]) {
        match *self {
            Action::Write { vd, off, len, seed } => {
                m[vd][off as usize..(off + len) as usize].copy_from_slice(&pattern(seed, off, len as usize))
            }
            Action::Trim { vd, off, len } => m[vd][off as usize..(off + len) as usize].fill(0),
            Action::Clone { src, so, dst, d_o, len } => {
                let c = m[src][so as usize..(so + len) as usize].to_vec();
                m[dst][d_o as usize..(d_o + len) as usize].copy_from_slice(&c);
            }
        }
    }
}

/// The child: runs actions until killed. Every action is durable before "ACK" is printed.
#[test]
#[ignore = "run by crash_recovery as a child process"]
fn crash_child() {
    let Ok(dir) = std::env::var("TESSERA_CRASH_DIR") else {
        return;
    };
    let seed: u64 = std::env::var("TESSERA_CRASH_SEED").unwrap().parse().unwrap();
    let e = Engine::open(&Path::new(&dir).join("pool"), &opener).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let out = std::io::stdout();
    for i in 0.. {
        let blocks = SIZE / BLOCK;
        let vd = rng.random_range(0..3);
        let off = rng.random_range(0..blocks) * BLOCK;
        let len = rng.random_range(1..=(blocks - off / BLOCK).min(48)) * BLOCK;
        let a = match rng.random_range(0..10) {
            0 => Action::Trim { vd, off, len },
            1 => {
                let so = rng.random_range(0..blocks - len / BLOCK + 1) * BLOCK;
                // Only vdisks of one layout can share grains; copies cross layouts.
                Action::Clone {
                    src: rng.random_range(0..3),
                    so,
                    dst: vd,
                    d_o: off,
                    len,
                }
            }
            _ => Action::Write {
                vd,
                off,
                len,
                seed: seed * 1_000_000 + i,
            },
        };
        writeln!(out.lock(), "BEGIN {}", a.encode()).unwrap();
        match &a {
            Action::Write { vd, off, len, seed } => e
                .vdisk(NAMES[*vd])
                .unwrap()
                .write(*off, &pattern(*seed, *off, *len as usize), true)
                .unwrap(),
            Action::Trim { vd, off, len } => {
                let v = e.vdisk(NAMES[*vd]).unwrap();
                v.trim(*off, *len).unwrap();
                v.flush().unwrap();
            }
            Action::Clone { src, so, dst, d_o, len } => {
                let (s, d) = (e.vdisk(NAMES[*src]).unwrap(), e.vdisk(NAMES[*dst]).unwrap());
                e.clone_range(&s, *so, &d, *d_o, *len).unwrap();
                e.flush().unwrap();
            }
        }
        writeln!(out.lock(), "ACK").unwrap();
    }
}

fn setup(dir: &Path) {
    let disks: Vec<DiskRef> = (0..5)
        .map(|i| Arc::new(FileDisk::create_file(dir.join(format!("disk{i}")), 48 * MIB, false).unwrap()) as DiskRef)
        .collect();
    let e = Engine::create_pool(&dir.join("pool"), "crash", disks, MIB).unwrap();
    for (name, kind, cols) in [
        (NAMES[0], LayoutKind::Mirror, 2),
        (NAMES[1], LayoutKind::Parity, 3),
        (NAMES[2], LayoutKind::DualParity, 4),
    ] {
        let mut s = VdiskSpec::new(name, SIZE, kind);
        s.columns = Some(cols);
        s.interleave = Some(16 << 10);
        s.grain_size = Some(64 << 10);
        s.block_size = Some(4096);
        s.provisioning = Provisioning::Thin;
        e.create_vdisk(&s).unwrap();
    }
    e.flush().unwrap();
}

fn read_all(e: &Engine) -> Vec<Vec<u8>> {
    NAMES
        .iter()
        .map(|n| {
            let mut b = vec![0u8; SIZE as usize];
            e.vdisk(n).unwrap().read(0, &mut b).unwrap();
            b
        })
        .collect()
}

#[test]
fn crash_recovery() {
    let rounds: u64 = std::env::var("TESSERA_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let tmp = tempfile::tempdir_in(
        std::env::var("TESSERA_TEST_DIR").unwrap_or_else(|_| std::env::temp_dir().display().to_string()),
    )
    .unwrap();
    let dir = tmp.path();
    setup(dir);
    let mut model = vec![vec![0u8; SIZE as usize]; 3];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7e55e7a);
    let mut acked_total = 0;
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["crash_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("TESSERA_CRASH_DIR", dir)
            .env("TESSERA_CRASH_SEED", (round + 1).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (began_tx, began) = std::sync::mpsc::channel();
        let lines = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if l.contains("BEGIN ") {
                    let _ = began_tx.send(());
                }
                lines.push(l);
            }
            lines
        });
        // Most rounds cut the child while it acts: the time is counted from its first action,
        // so that a machine slow to start it still has it act before the cut. Every fifth
        // round counts from the start, and may cut it while it opens and recovers the pool.
        if round % 5 != 4 {
            let _ = began.recv_timeout(Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(rng.random_range(0..550)));
        } else {
            std::thread::sleep(Duration::from_millis(rng.random_range(150..700)));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let lines = lines.join().unwrap();

        let mut in_flight = None;
        for l in &lines {
            // The harness may print "test crash_child ... " on the same line first.
            if let Some(at) = l.find("BEGIN ") {
                in_flight = Some(Action::decode(&l[at + 6..]));
            } else if l == "ACK" {
                in_flight.take().expect("ACK follows BEGIN").apply(&mut model);
                acked_total += 1;
            }
        }

        let e = Engine::open(&dir.join("pool"), &opener).unwrap();
        let got = read_all(&e);
        // The action in flight may have happened in part: each block is as before or after it.
        let mut after = model.clone();
        if let Some(a) = &in_flight {
            a.apply(&mut after);
        }
        for vd in 0..3 {
            for b in 0..(SIZE / BLOCK) as usize {
                let r = b * BLOCK as usize..(b + 1) * BLOCK as usize;
                let (g, old, new) = (&got[vd][r.clone()], &model[vd][r.clone()], &after[vd][r.clone()]);
                assert!(
                    g == old || g == new,
                    "round {round}: {} block {b} is neither the acknowledged data nor the in-flight write ({in_flight:?})",
                    NAMES[vd]
                );
            }
        }
        model = got;
        let report = e.check().unwrap();
        assert!(report.problems.is_empty(), "round {round}: {:#?}", report.problems);
        for set in e.layouts().sets() {
            let bad = e.layouts().scrub_set(&set).unwrap();
            assert!(
                bad.is_empty(),
                "round {round}: redundancy does not match the data after recovery: {bad:?}"
            );
        }
        drop(e);
    }
    assert!(
        acked_total > rounds,
        "the child acknowledged only {acked_total} actions in {rounds} rounds"
    );

    // Finally lose a disk: every block must still read back, reconstructed where needed.
    let e = Engine::open(&dir.join("pool"), &opener).unwrap();
    e.fail_disk(&dir.join("disk0").display().to_string()).unwrap();
    assert_eq!(
        read_all(&e),
        model,
        "data read degraded differs from the data read healthy"
    );
}
