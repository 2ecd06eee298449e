//! `tessera copy`: an offloaded-copy initiator over iSCSI, so that ODX (POPULATE TOKEN /
//! WRITE USING TOKEN) and EXTENDED COPY can be driven without Windows or ESXi, and compared
//! with a host copy that reads and writes every block through the initiator.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tessera_bench::target::{iscsi_capacity, rw16, UNIT_ATTENTION_RETRIES};
use tessera_bench::TargetSpec;
use tessera_iscsi::initiator::{LoginConfig, ScsiResult, Session};
use tessera_server::units::format_size;

use crate::{CopyArgs, CopyMethod};

const INITIATOR: &str = "iqn.2026-11.io.tessera:copy";
/// Host copies move this much per command, with this many commands in flight.
const HOST_CHUNK_BYTES: u64 = 1 << 20;
const HOST_IN_FLIGHT: usize = 16;

/// One end of the copy: a logged-in session's LUN.
#[derive(Clone)]
struct End {
    session: Arc<Session>,
    lun: u64,
    block: u64,
    blocks: u64,
}

/// SCSI payload bytes that crossed the network, both ways.
#[derive(Default)]
struct Wire {
    bytes: AtomicU64,
}

impl Wire {
    async fn run(&self, e: &End, cdb: &[u8], out: Vec<u8>, read_len: usize) -> Result<ScsiResult, String> {
        let sent = out.len();
        let r = e
            .session
            .command(e.lun, cdb, out, read_len)
            .await
            .map_err(|err| format!("command {:#04x}: {err}", cdb[0]))?;
        self.bytes.fetch_add((sent + r.data.len()) as u64, Ordering::Relaxed);
        Ok(r)
    }

    /// Runs a command that must succeed; asks again past unit attentions.
    async fn good(&self, e: &End, what: &str, cdb: &[u8], out: Vec<u8>, read_len: usize) -> Result<Vec<u8>, String> {
        for _ in 0..UNIT_ATTENTION_RETRIES {
            let r = self.run(e, cdb, out.clone(), read_len).await?;
            if r.status == 0 {
                return Ok(r.data);
            }
            if r.sense_key().map(|k| k.0) == Some(0x6) {
                continue;
            }
            return Err(format!("{what} failed: {}", describe(&r)));
        }
        Err(format!("{what} keeps meeting unit attentions"))
    }
}

fn describe(r: &ScsiResult) -> String {
    match r.sense_key() {
        Some((k, asc, ascq)) => {
            let what = match (k, asc, ascq) {
                (5, 0x20, 0) => " (the target does not implement the command)",
                (5, 0x23, _) => " (the token was refused)",
                (5, 0x21, 0) => " (range past the end)",
                (7, 0x27, _) => " (write protected)",
                (0xA, 0x0D, 2) => " (copy target not reachable)",
                (0xA, 0x08, 4) => {
                    " (unreachable copy target: EXTENDED COPY may name only LUNs of the target it is \
                     sent to, which the initiator may read or write; across targets, use --method odx)"
                }
                _ => "",
            };
            format!("sense key {k:#x}, ASC/ASCQ {asc:#04x}/{ascq:#04x}{what}")
        }
        None => format!("status {:#04x}", r.status),
    }
}

async fn open(spec: &str, args: &CopyArgs, sessions: &mut Vec<(String, Arc<Session>)>) -> Result<End, String> {
    let TargetSpec::Iscsi { addr, iqn, lun } = TargetSpec::parse(spec)? else {
        return Err(format!("'{spec}': write iscsi://HOST[:PORT]/IQN/LUN"));
    };
    let key = format!("{addr}/{iqn}");
    let session = match sessions.iter().find(|(k, _)| *k == key) {
        Some((_, s)) => s.clone(),
        None => {
            let mut cfg = LoginConfig::new(args.initiator.as_deref().unwrap_or(INITIATOR), Some(&iqn));
            cfg.isid[5] = sessions.len() as u8;
            if let (Some(u), Some(s)) = (&args.chap_user, &args.chap_secret) {
                cfg.chap = Some((u.clone(), s.clone()));
            }
            let s = Arc::new(
                Session::login(&addr, &cfg)
                    .await
                    .map_err(|e| format!("{spec}: login: {e}"))?,
            );
            sessions.push((key, s.clone()));
            s
        }
    };
    let (size, block) = iscsi_capacity(&session, lun)
        .await
        .map_err(|e| format!("{spec}: {e}"))?;
    let block = block as u64;
    Ok(End {
        session,
        lun,
        block,
        blocks: size / block,
    })
}

pub fn copy(args: CopyArgs, json_out: bool) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let report = rt.block_on(run(&args))?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report).expect("serializable"));
    } else {
        let CopyReport {
            method,
            blocks,
            bytes,
            seconds,
            commands,
            payload_bytes,
        } = report;
        println!(
            "copied {} ({blocks} blocks) by {method} in {seconds:.3} s ({}/s); {} of SCSI payload on the network in {commands} command(s)",
            format_size(bytes),
            format_size((bytes as f64 / seconds.max(1e-9)) as u64),
            format_size(payload_bytes),
        );
    }
    Ok(())
}

/// What `tessera copy` did, as `--json` writes it.
#[derive(serde::Serialize)]
struct CopyReport {
    method: &'static str,
    blocks: u64,
    bytes: u64,
    seconds: f64,
    commands: u64,
    payload_bytes: u64,
}

async fn run(args: &CopyArgs) -> Result<CopyReport, String> {
    let wire = Arc::new(Wire::default());
    let mut sessions = Vec::new();
    let src = open(&args.source, args, &mut sessions).await?;
    let dst = open(&args.destination, args, &mut sessions).await?;
    if src.block != dst.block {
        return Err(format!(
            "the source has {} byte blocks and the destination {}: an offloaded copy needs the same",
            src.block, dst.block
        ));
    }
    let n = args.count;
    if n == 0 {
        return Err("COUNT must be at least one block".into());
    }
    for (end, lba, what) in [
        (&src, args.source_lba, "source"),
        (&dst, args.destination_lba, "destination"),
    ] {
        if lba.checked_add(n).is_none_or(|e| e > end.blocks) {
            return Err(format!(
                "the {what} range {lba}+{n} goes past its end ({} blocks)",
                end.blocks
            ));
        }
    }
    let started = Instant::now();
    let commands = match args.method {
        CopyMethod::Odx => odx(&wire, &src, args.source_lba, &dst, args.destination_lba, n).await?,
        CopyMethod::Xcopy => xcopy(&wire, &src, args.source_lba, &dst, args.destination_lba, n).await?,
        CopyMethod::Host => host(&wire, &src, args.source_lba, &dst, args.destination_lba, n).await?,
    };
    let seconds = started.elapsed().as_secs_f64();
    for (_, s) in sessions {
        if let Ok(s) = Arc::try_unwrap(s) {
            let _ = s.logout().await;
        }
    }
    Ok(CopyReport {
        method: match args.method {
            CopyMethod::Odx => "odx",
            CopyMethod::Xcopy => "xcopy",
            CopyMethod::Host => "host",
        },
        blocks: n,
        bytes: n * src.block,
        seconds,
        commands,
        payload_bytes: wire.bytes.load(Ordering::Relaxed),
    })
}

fn tpc_out(sa: u8, list_id: u32, len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[1] = sa;
    c[6..10].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn rrti_cdb(list_id: u32, len: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&len.to_be_bytes());
    c
}

/// Range descriptors covering `n` blocks from `lba`, each at most u32::MAX blocks.
fn range_descriptors(lba: u64, n: u64) -> Vec<u8> {
    let mut b = Vec::new();
    let mut at = 0;
    while at < n {
        let k = (n - at).min(u32::MAX as u64);
        b.extend_from_slice(&(lba + at).to_be_bytes());
        b.extend_from_slice(&(k as u32).to_be_bytes());
        b.extend_from_slice(&[0; 4]);
        at += k;
    }
    b
}

/// The most blocks one token may represent, from VPD page 0x8F (Block Device ROD Token
/// Limits), and the most range descriptors.
async fn token_limits(wire: &Wire, e: &End) -> Result<(u64, usize), String> {
    let d = wire
        .good(
            e,
            "INQUIRY (third-party copy VPD page)",
            &[0x12, 1, 0x8F, 0x10, 0, 0],
            Vec::new(),
            4096,
        )
        .await
        .map_err(|err| format!("{err}: the target does not offer token copy"))?;
    let mut at = 4;
    while at + 4 <= d.len() {
        let t = u16::from_be_bytes([d[at], d[at + 1]]);
        let len = u16::from_be_bytes([d[at + 2], d[at + 3]]) as usize;
        let body = &d[at + 4..(at + 4 + len).min(d.len())];
        if t == 0 && body.len() >= 24 {
            let ranges = u16::from_be_bytes([body[6], body[7]]).max(1) as usize;
            let max = u64::from_be_bytes(body[16..24].try_into().expect("8 bytes"));
            return Ok((if max == 0 { u64::MAX } else { max }, ranges));
        }
        at += 4 + len;
    }
    Err("the target's VPD page 0x8F has no ROD token limits: it does not offer token copy".into())
}

async fn odx(wire: &Wire, src: &End, slba: u64, dst: &End, dlba: u64, n: u64) -> Result<u64, String> {
    let (max_blocks, max_ranges) = token_limits(wire, src).await?;
    let per_token = max_blocks.min(max_ranges as u64 * u32::MAX as u64);
    let mut commands = 0;
    let mut done = 0;
    let mut list_id = 0x5445_0000u32;
    while done < n {
        let k = per_token.min(n - done);
        list_id += 1;
        // POPULATE TOKEN over the source range.
        let ranges = range_descriptors(slba + done, k);
        let mut p = vec![0u8; 16];
        p[0..2].copy_from_slice(&((14 + ranges.len()) as u16).to_be_bytes());
        p[14..16].copy_from_slice(&(ranges.len() as u16).to_be_bytes());
        p.extend_from_slice(&ranges);
        wire.good(src, "POPULATE TOKEN", &tpc_out(0x10, list_id, p.len()), p, 0)
            .await?;
        let info = wire
            .good(
                src,
                "RECEIVE ROD TOKEN INFORMATION",
                &rrti_cdb(list_id, 1024),
                Vec::new(),
                1024,
            )
            .await?;
        let token = token_from(&info)?;
        // WRITE USING TOKEN into the destination; the token is deleted once used.
        let ranges = range_descriptors(dlba + done, k);
        let mut p = vec![0u8; 536];
        p[0..2].copy_from_slice(&((534 + ranges.len()) as u16).to_be_bytes());
        p[2] = 0x02; // DEL_TKN
        p[16..528].copy_from_slice(&token);
        p[534..536].copy_from_slice(&(ranges.len() as u16).to_be_bytes());
        p.extend_from_slice(&ranges);
        list_id += 1;
        wire.good(dst, "WRITE USING TOKEN", &tpc_out(0x11, list_id, p.len()), p, 0)
            .await?;
        let info = wire
            .good(
                dst,
                "RECEIVE ROD TOKEN INFORMATION",
                &rrti_cdb(list_id, 1024),
                Vec::new(),
                1024,
            )
            .await?;
        let moved = info
            .get(16..24)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
            .unwrap_or(0);
        if info.get(5) != Some(&0x01) || moved != k {
            return Err(format!(
                "WRITE USING TOKEN wrote {moved} of {k} blocks (copy status {:#04x})",
                info.get(5).copied().unwrap_or(0)
            ));
        }
        commands += 4;
        done += k;
    }
    Ok(commands)
}

/// The token in a RECEIVE ROD TOKEN INFORMATION answer to POPULATE TOKEN.
fn token_from(info: &[u8]) -> Result<Vec<u8>, String> {
    if info.len() < 32 || info[5] != 0x01 {
        return Err(format!(
            "POPULATE TOKEN did not complete (copy status {:#04x})",
            info.get(5).copied().unwrap_or(0)
        ));
    }
    let at = 32 + info[13] as usize;
    let len = info
        .get(at..at + 4)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
        .unwrap_or(0);
    match info.get(at + 6..at + 6 + 512) {
        Some(t) if len >= 514 => Ok(t.to_vec()),
        _ => Err("RECEIVE ROD TOKEN INFORMATION returned no token".into()),
    }
}

/// An identification CSCD descriptor for a LUN, from its NAA designator in VPD page 0x83.
async fn cscd(wire: &Wire, e: &End) -> Result<Vec<u8>, String> {
    let id = wire
        .good(
            e,
            "INQUIRY (device identification)",
            &[0x12, 1, 0x83, 0x01, 0, 0],
            Vec::new(),
            256,
        )
        .await?;
    let mut at = 4;
    while at + 4 <= id.len() {
        let len = id[at + 3] as usize;
        if id[at + 1] & 0x0F == 3 && id[at + 1] & 0x30 == 0 && len <= 20 && at + 4 + len <= id.len() {
            let mut d = vec![0u8; 32];
            d[0] = 0xE4;
            d[4] = id[at] & 0x0F;
            d[5] = id[at + 1] & 0x3F;
            d[7] = len as u8;
            d[8..8 + len].copy_from_slice(&id[at + 4..at + 4 + len]);
            d[29..32].copy_from_slice(&(e.block as u32).to_be_bytes()[1..4]);
            return Ok(d);
        }
        at += 4 + len;
    }
    Err("the LUN has no NAA designator for EXTENDED COPY to name it by".into())
}

async fn xcopy(wire: &Wire, src: &End, slba: u64, dst: &End, dlba: u64, n: u64) -> Result<u64, String> {
    let targets = [cscd(wire, src).await?, cscd(wire, dst).await?].concat();
    // Block-to-block segments carry a 16-bit block count. Each ends on a MiB boundary of the
    // source (but the last), so that a target that copies whole allocation units by reference
    // does not have to copy by data the unit that a segment boundary would cut in two.
    let per_mib = ((1u64 << 20) / src.block).clamp(1, u16::MAX as u64);
    let segment = (u16::MAX as u64 / per_mib) * per_mib;
    const PER_COMMAND: u64 = 64;
    let mut commands = 0;
    let mut done = 0;
    let mut list_id = 0u8;
    while done < n {
        let mut segs = Vec::new();
        let mut k = 0;
        while done + k < n && (segs.len() as u64 / 28) < PER_COMMAND {
            let m = (segment - (slba + done + k) % per_mib).min(n - done - k);
            let mut s = vec![0u8; 28];
            s[0] = 0x02;
            s[2..4].copy_from_slice(&0x18u16.to_be_bytes());
            s[6..8].copy_from_slice(&1u16.to_be_bytes());
            s[10..12].copy_from_slice(&(m as u16).to_be_bytes());
            s[12..20].copy_from_slice(&(slba + done + k).to_be_bytes());
            s[20..28].copy_from_slice(&(dlba + done + k).to_be_bytes());
            segs.extend_from_slice(&s);
            k += m;
        }
        let mut p = vec![0u8; 16];
        list_id = list_id.wrapping_add(1);
        p[0] = list_id;
        p[2..4].copy_from_slice(&(targets.len() as u16).to_be_bytes());
        p[8..12].copy_from_slice(&(segs.len() as u32).to_be_bytes());
        p.extend_from_slice(&targets);
        p.extend_from_slice(&segs);
        let mut c = [0u8; 16];
        c[0] = 0x83;
        c[10..14].copy_from_slice(&(p.len() as u32).to_be_bytes());
        wire.good(src, "EXTENDED COPY", &c, p, 0).await?;
        commands += 1;
        done += k;
    }
    Ok(commands)
}

async fn host(wire: &Arc<Wire>, src: &End, slba: u64, dst: &End, dlba: u64, n: u64) -> Result<u64, String> {
    let chunk = (HOST_CHUNK_BYTES / src.block).max(1);
    let next = Arc::new(AtomicU64::new(0));
    let commands = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..HOST_IN_FLIGHT {
        let (wire, src, dst, next, commands) = (wire.clone(), src.clone(), dst.clone(), next.clone(), commands.clone());
        workers.spawn(async move {
            loop {
                let at = next.fetch_add(chunk, Ordering::Relaxed);
                if at >= n {
                    return Ok::<(), String>(());
                }
                let k = chunk.min(n - at);
                let len = (k * src.block) as usize;
                let r = wire
                    .good(
                        &src,
                        "READ(16)",
                        &rw16(false, (slba + at) * src.block, len, src.block as u32),
                        Vec::new(),
                        len,
                    )
                    .await?;
                let cdb = rw16(true, (dlba + at) * dst.block, len, dst.block as u32);
                wire.good(&dst, "WRITE(16)", &cdb, r, 0).await?;
                commands.fetch_add(2, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        r.map_err(|e| format!("a copy task failed: {e}"))??;
    }
    // The copy is done when it is durable, as the offloaded ones are.
    let mut sync = [0u8; 10];
    sync[0] = 0x35;
    wire.good(dst, "SYNCHRONIZE CACHE", &sync, Vec::new(), 0).await?;
    Ok(commands.load(Ordering::Relaxed) + 1)
}
