//! Replication cycles between two pools over a loopback TCP connection: a full cycle, then
//! incremental ones that send only what changed, bit-exact each time; a cycle cut mid-way
//! that carries on where it stopped; a replica pool that fills up; streams that lie.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
mod common;

use common::*;
use tessera_replication::wire::MAGIC;
use tessera_replication::{receive, send, send_streams, ReceiveReport, ReplError, SendReport, Target};
use tessera_volume::{LayoutKind, Provisioning, VdiskSpec};

/// A connection that drops after `budget` bytes were written to it.
struct Cut<'a> {
    inner: &'a TcpStream,
    budget: usize,
}

impl Write for Cut<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.budget == 0 {
            let _ = self.inner.shutdown(Shutdown::Both);
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "link dropped"));
        }
        let n = b.len().min(self.budget);
        self.budget -= n;
        self.inner.write(&b[..n])
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Read for Cut<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.inner.read(b)
    }
}

/// One cycle from `src` to `dst`; `cut_after` drops the sender's side after that many bytes.
fn cycle(
    src: &Site,
    dst: &Site,
    snap: &str,
    base: Option<&str>,
    cut_after: Option<usize>,
) -> (Result<SendReport, ReplError>, Result<ReceiveReport, ReplError>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let (c, _) = listener.accept().unwrap();
            let r = receive(c.try_clone().unwrap(), dst, &options(dst));
            let _ = c.shutdown(Shutdown::Both);
            r
        });
        let c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        let newer = src.engine.vdisk(&format!("vol@{snap}")).unwrap();
        let base_v = base.map(|b| src.engine.vdisk(&format!("vol@{b}")).unwrap());
        let conn = Cut {
            inner: &c,
            budget: cut_after.unwrap_or(usize::MAX),
        };
        let sent = send(conn, &newer, base_v.as_deref().zip(base), "p", "vol", snap);
        let _ = c.shutdown(Shutdown::Both);
        (sent, rx.join().unwrap())
    })
}

#[test]
fn cycles_send_only_what_changed_and_leave_bit_exact_replicas() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 256 * MIB);
    let mut spec = VdiskSpec::new("vol", 64 * MIB, LayoutKind::Mirror);
    spec.provisioning = Provisioning::Thin;
    spec.grain_size = Some(GRAIN);
    let v = src.engine.create_vdisk(&spec).unwrap();
    // 8 MiB written in four places; the rest stays a hole.
    for (k, at) in [0, 10 * MIB, 33 * MIB, 60 * MIB].into_iter().enumerate() {
        v.write(at, &noise(k as u64, (2 * MIB) as usize), false).unwrap();
    }
    let s1 = src.engine.snapshot("vol", "s1").unwrap();

    // The first cycle sends the allocated grains and nothing of the holes.
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    let (sent, got) = (sent.unwrap(), got.unwrap());
    assert!(sent.full);
    assert_eq!(sent.sent_bytes, 8 * MIB, "{sent:?}");
    assert_eq!(sent.sent_grains, 8 * MIB / GRAIN);
    // Fingerprints cost 32 bytes per 4 KiB block (0.8 %).
    assert!((sent.wire_bytes as f64) < 1.02 * (8 * MIB) as f64, "{sent:?}");
    assert!(!got.resumed);
    let r1 = dst.engine.vdisk("vol@s1").unwrap();
    assert_eq!(image(&r1), image(&s1));
    assert_eq!(r1.allocated_bytes(), 8 * MIB, "the replica is as thin as its source");

    // 1 % of the vdisk changes: whole grains, part of a grain, a trim, a grain past the
    // written areas.
    v.write(GRAIN * 3, &noise(10, (4 * GRAIN) as usize), false).unwrap();
    v.write(33 * MIB + 4096, &noise(11, 4096), false).unwrap();
    v.trim(10 * MIB, 2 * GRAIN).unwrap();
    v.write(50 * MIB, &noise(12, GRAIN as usize), false).unwrap();
    let s2 = src.engine.snapshot("vol", "s2").unwrap();
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    let (sent, got) = (sent.unwrap(), got.unwrap());
    assert!(!sent.full);
    // Whole grains go whole; of the grain written in part, only the block written.
    let changed = 5 * GRAIN + 4096;
    assert_eq!((sent.sent_grains, sent.sent_bytes), (6, changed), "{sent:?}");
    assert_eq!(sent.holes, 1);
    assert!(
        (sent.wire_bytes as f64) <= 1.2 * changed as f64,
        "{} bytes on the wire for {changed} changed",
        sent.wire_bytes
    );
    assert_eq!(got.written_blocks, 5 * GRAIN / 4096 + 1);
    assert_eq!(image(&dst.engine.vdisk("vol@s2").unwrap()), image(&s2));
    assert_eq!(image(&dst.engine.vdisk("vol@s1").unwrap()), image(&s1), "s1 kept");

    // Compressible data goes compressed.
    let text: Vec<u8> = b"replicated line of text\n"
        .iter()
        .copied()
        .cycle()
        .take((4 * MIB) as usize)
        .collect();
    v.write(20 * MIB, &text, false).unwrap();
    let s3 = src.engine.snapshot("vol", "s3").unwrap();
    let (sent, _) = cycle(&src, &dst, "s3", Some("s2"), None);
    let sent = sent.unwrap();
    assert_eq!(sent.sent_bytes, 4 * MIB);
    assert!(sent.wire_bytes < MIB / 4, "{sent:?}");
    assert_eq!(image(&dst.engine.vdisk("vol@s3").unwrap()), image(&s3));

    // A base the replica does not hold: everything is offered, and only what differs sent.
    dst.engine.delete_vdisk("vol@s3").unwrap();
    v.write(0, &noise(20, GRAIN as usize), false).unwrap();
    let s4 = src.engine.snapshot("vol", "s4").unwrap();
    let (sent, _) = cycle(&src, &dst, "s4", Some("s3"), None);
    let sent = sent.unwrap();
    assert!(sent.full);
    assert_eq!(sent.sent_grains, 1, "{sent:?}");
    assert_eq!(image(&dst.engine.vdisk("vol@s4").unwrap()), image(&s4));
    let r = dst.engine.check().unwrap();
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
}

/// A source with a thin mirrored vdisk `vol`, its first MiB written and snapshot as `s1`,
/// and a replica that `s1`'s cycle reached: the two sites, the vdisk, and what the replica
/// reported of that cycle.
fn pair_after_first_cycle() -> (Site, Site, std::sync::Arc<tessera_volume::Vdisk>, ReceiveReport) {
    let src = site(2, 128 * MIB);
    let dst = site(2, 128 * MIB);
    let mut spec = VdiskSpec::new("vol", 16 * MIB, LayoutKind::Mirror);
    spec.provisioning = Provisioning::Thin;
    spec.grain_size = Some(GRAIN);
    let v = src.engine.create_vdisk(&spec).unwrap();
    v.write(0, &noise(1, MIB as usize), false).unwrap();
    src.engine.snapshot("vol", "s1").unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    sent.unwrap();
    (src, dst, v, got.unwrap())
}

/// A cycle asked again while its snapshot is still being made here, or was left half made,
/// is not answered done: the sender would make it its base and drop the one before, and a
/// restart here deletes a half-made snapshot. Made whole, the next try is done.
#[test]
fn a_cycle_asked_again_while_its_snapshot_is_half_made_is_not_done() {
    let (src, dst, v, _) = pair_after_first_cycle();
    v.write(MIB, &noise(2, MIB as usize), false).unwrap();
    src.engine.snapshot("vol", "s2").unwrap();
    // The first try's data went in, and its snapshot was left half made.
    let marker = dst.dir.path().join("cycles").join("p").join("vol.cycle");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, br#"{"base":"s1","snapshot":"s2"}"#).unwrap();
    dst.engine.damage_half_made_snapshot("vol", "s2").unwrap();
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    let e = got.unwrap_err().to_string();
    assert!(e.contains("still being made"), "{e}");
    assert!(sent.is_err(), "the sender was told done for a half-made snapshot");
    assert_ne!(
        dst.committed.lock().unwrap().get("p/vol").map(String::as_str),
        Some("s2"),
        "recorded as committed"
    );
    // What a restart does with it; then the cycle goes on.
    dst.engine.delete_vdisk("vol@s2").unwrap();
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    sent.unwrap();
    got.unwrap();
    assert_eq!(
        image(&dst.engine.vdisk("vol@s2").unwrap()),
        image(&src.engine.vdisk("vol@s2").unwrap())
    );
}

#[test]
fn a_cycle_asked_again_is_done_and_a_snapshot_of_its_name_from_elsewhere_is_refused() {
    let (src, dst, v, got) = pair_after_first_cycle();
    assert!(!got.complete);
    // The sender did not hear of the commit and asks again: done, nothing sent.
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    assert_eq!(sent.unwrap().sent_bytes, 0);
    assert!(got.unwrap().complete);
    // Its snapshot taken, its record not made (the site died between): the marker still
    // standing says the cycle was this site's, and the record is made then.
    dst.committed.lock().unwrap().clear();
    let marker = dst.dir.path().join("cycles").join("p").join("vol.cycle");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    let s1 = src.engine.vdisk("vol@s1").unwrap().id();
    std::fs::write(
        &marker,
        format!(r#"{{"base":null,"snapshot":"s1","snapshot_id":{s1}}}"#),
    )
    .unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    assert_eq!(sent.unwrap().sent_bytes, 0);
    assert!(got.unwrap().complete);
    assert_eq!(
        dst.committed.lock().unwrap().get("p/vol").map(String::as_str),
        Some("s1")
    );
    assert!(!marker.exists(), "the marker of a cycle done stays");
    // Its snapshot taken and its record made, the site died before saying the working copy
    // is whole again (another gateway of the pool took it over): asked again, it is said.
    dst.changing.lock().unwrap().insert("p/vol".into(), "s1".into());
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    assert_eq!(sent.unwrap().sent_bytes, 0);
    assert!(got.unwrap().complete);
    assert!(dst.changing.lock().unwrap().is_empty(), "still holding part of a cycle");
    // The replica holds a snapshot of the next cycle's name that no cycle made (an earlier
    // replication under the same name left it): refused, not taken for this cycle's.
    v.write(MIB, &noise(2, MIB as usize), false).unwrap();
    src.engine.snapshot("vol", "s2").unwrap();
    dst.engine.snapshot("vol", "s2").unwrap();
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    let e = got.unwrap_err().to_string();
    assert!(e.contains("no cycle of this replication committed"), "{e}");
    assert!(sent.is_err(), "the sender took a snapshot it never sent for its base");
    // Deleted there, the next cycle goes on.
    dst.engine.delete_vdisk("vol@s2").unwrap();
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    sent.unwrap();
    assert!(!got.unwrap().complete);
    assert_eq!(
        image(&dst.engine.vdisk("vol@s2").unwrap()),
        image(&src.engine.vdisk("vol@s2").unwrap())
    );
}

/// A replication made again under the same name starts its snapshots' names again, and a
/// snapshot deleted at the source and taken again keeps its name: neither is taken for the
/// cycle the replica committed under that name (the sender would make its new snapshot the
/// base of cycles applied on top of other data), whether the replica's record or its marker
/// names it.
#[test]
fn a_cycle_of_a_snapshot_taken_again_under_its_name_is_not_done() {
    let (src, dst, v, _) = pair_after_first_cycle();
    let marker = dst.dir.path().join("cycles").join("p").join("vol.cycle");
    let old = src.engine.vdisk("vol@s1").unwrap().id();
    // The source's s1 goes, the vdisk changes, and s1 is taken again: another snapshot.
    src.engine.delete_vdisk("vol@s1").unwrap();
    v.write(0, &noise(9, MIB as usize), false).unwrap();
    src.engine.snapshot("vol", "s1").unwrap();
    assert_ne!(src.engine.vdisk("vol@s1").unwrap().id(), old);
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    let e = got.unwrap_err().to_string();
    assert!(e.contains("no cycle of this replication committed"), "{e}");
    assert!(sent.is_err(), "the sender was told done for a snapshot it never sent");
    // Nor when only a marker of the old one's cycle says so.
    dst.committed.lock().unwrap().clear();
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(
        &marker,
        format!(r#"{{"base":null,"snapshot":"s1","snapshot_id":{old}}}"#),
    )
    .unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    assert!(got
        .unwrap_err()
        .to_string()
        .contains("no cycle of this replication committed"));
    assert!(sent.is_err());
    // Deleted at the replica as the refusal says, the cycle goes, whole.
    dst.engine.delete_vdisk("vol@s1").unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    sent.unwrap();
    assert!(!got.unwrap().complete);
    assert_eq!(
        image(&dst.engine.vdisk("vol@s1").unwrap()),
        image(&src.engine.vdisk("vol@s1").unwrap())
    );
}

/// One cycle over `streams` connections: a listener takes each on a thread of its own, as
/// the daemon's does, and the extra ones join the first.
fn cycle_streams(
    src: &Site,
    dst: &Site,
    snap: &str,
    base: Option<&str>,
    streams: u32,
) -> (SendReport, Vec<ReceiveReport>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::scope(|s| {
        let receivers = s.spawn(|| {
            let handles: Vec<_> = (0..streams)
                .map(|_| {
                    let (c, _) = listener.accept().unwrap();
                    s.spawn(move || receive(c, dst, &options(dst)).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        let c = TcpStream::connect(addr).unwrap();
        let newer = src.engine.vdisk(&format!("vol@{snap}")).unwrap();
        let base_v = base.map(|b| src.engine.vdisk(&format!("vol@{b}")).unwrap());
        let mut open = || Ok(TcpStream::connect(addr)?);
        let to = Target {
            pool: "p",
            replica: "vol",
            snapshot: snap,
        };
        let sent = send_streams(
            &c,
            streams,
            &mut open,
            &newer,
            base_v.as_deref().zip(base),
            &to,
            &Default::default(),
        )
        .unwrap();
        (sent, receivers.join().unwrap())
    })
}

#[test]
fn a_cycle_over_several_streams_is_exact_and_a_stranger_cannot_join_one() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 256 * MIB);
    let v = source_vdisk(&src, 64 * MIB);
    v.write(0, &noise(1, (24 * MIB) as usize), false).unwrap();
    let s1 = src.engine.snapshot("vol", "s1").unwrap();
    let (sent, got) = cycle_streams(&src, &dst, "s1", None, 4);
    assert_eq!(sent.sent_bytes, 24 * MIB, "{sent:?}");
    let main: Vec<&ReceiveReport> = got.iter().filter(|r| !r.joined).collect();
    assert_eq!(main.len(), 1, "one cycle, three streams joined it: {got:?}");
    assert_eq!(main[0].streams, 4);
    assert_eq!(main[0].written_blocks, 24 * MIB / 4096);
    assert_eq!(image(&dst.engine.vdisk("vol@s1").unwrap()), image(&s1));

    // An incremental cycle over three.
    v.write(5 * MIB + 4096, &noise(2, (3 * MIB) as usize), false).unwrap();
    let s2 = src.engine.snapshot("vol", "s2").unwrap();
    let (sent, _) = cycle_streams(&src, &dst, "s2", Some("s1"), 3);
    assert!(!sent.full);
    assert_eq!(sent.sent_bytes, 3 * MIB, "{sent:?}");
    assert_eq!(image(&dst.engine.vdisk("vol@s2").unwrap()), image(&s2));
    assert_eq!(dst.joins.wanted(), 0, "every block asked for arrived, over any stream");

    // A connection that claims to join a cycle nobody began is refused.
    let join = br#"{"token":"00112233445566778899aabbccddeeff","stream":1}"#;
    let mut bytes = MAGIC.to_vec();
    bytes.push(10);
    bytes.extend_from_slice(&(join.len() as u32).to_be_bytes());
    bytes.extend_from_slice(join);
    let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let conn = Duplex {
        input: io::Cursor::new(bytes),
        output,
    };
    let e = receive(conn, &dst, &options(&dst)).unwrap_err().to_string();
    assert!(e.contains("not waiting"), "{e}");
    let r = dst.engine.check().unwrap();
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
}

#[test]
fn a_cycle_cut_mid_way_carries_on_where_it_stopped() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 256 * MIB);
    let v = source_vdisk(&src, 32 * MIB);
    v.write(0, &noise(1, (16 * MIB) as usize), false).unwrap();
    let s1 = src.engine.snapshot("vol", "s1").unwrap();

    // The link drops after about 10 MiB.
    let (sent, got) = cycle(&src, &dst, "s1", None, Some((10 * MIB) as usize));
    assert!(sent.is_err() && got.is_err(), "{sent:?} {got:?}");
    assert_eq!(dst.joins.wanted(), 0, "a cycle cut short gives back what it waited for");
    assert!(dst.engine.vdisk("vol@s1").is_err(), "no snapshot of a cycle cut short");
    // The site was told the working copy holds part of that cycle, and not told otherwise.
    let changing = |s: &Site| s.changing.lock().unwrap().get("p/vol").cloned();
    assert_eq!(changing(&dst).as_deref(), Some("s1"));

    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    let (sent, got) = (sent.unwrap(), got.unwrap());
    assert!(got.resumed);
    assert!(
        sent.sent_bytes <= 8 * MIB,
        "{} bytes sent again of 16 MiB, after about 10 MiB got through",
        sent.sent_bytes
    );
    assert_eq!(image(&dst.engine.vdisk("vol@s1").unwrap()), image(&s1));
    assert_eq!(changing(&dst), None, "whole again once committed");

    // A cut incremental cycle, then a different cycle: the working copy goes back to its base
    // first, and the replica is still exact.
    v.write(0, &noise(2, (4 * MIB) as usize), false).unwrap();
    src.engine.snapshot("vol", "s2").unwrap();
    let (sent, _) = cycle(&src, &dst, "s2", Some("s1"), Some((2 * MIB) as usize));
    assert!(sent.is_err());
    assert_eq!(changing(&dst).as_deref(), Some("s2"));
    v.write(8 * MIB, &noise(3, (MIB) as usize), false).unwrap();
    let s3 = src.engine.snapshot("vol", "s3").unwrap();
    let (sent, got) = cycle(&src, &dst, "s3", Some("s1"), None);
    sent.unwrap();
    assert!(!got.unwrap().resumed);
    assert_eq!(image(&dst.engine.vdisk("vol@s3").unwrap()), image(&s3));
}

/// A cut cycle's marker names its base and snapshot; a replica deleted since (through
/// another gateway of its pool, its snapshots left) is made anew by that cycle sent again,
/// which must not take the new, empty working copy for the one the cut cycle had half
/// written, nor start it from the snapshots the deleted one left: it is sent whole, and the
/// replica is exact.
#[test]
fn a_working_copy_made_anew_is_not_the_one_a_cut_cycle_left() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 256 * MIB);
    let v = source_vdisk(&src, 32 * MIB);
    v.write(0, &noise(1, (16 * MIB) as usize), false).unwrap();
    src.engine.snapshot("vol", "s1").unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    sent.unwrap();
    got.unwrap();
    v.write(0, &noise(2, (4 * MIB) as usize), false).unwrap();
    let s2 = src.engine.snapshot("vol", "s2").unwrap();
    let (sent, _) = cycle(&src, &dst, "s2", Some("s1"), Some((2 * MIB) as usize));
    assert!(sent.is_err());
    dst.engine.delete_vdisk("vol").unwrap();
    assert!(dst.engine.vdisk("vol@s1").is_ok(), "the base outlived its vdisk");
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    // Nor is it started from a snapshot the deleted vdisk left: those may be another
    // sender's (another key's), whose data a new replica must not hold, nor its blocks be
    // told apart from a guess by the offers. Its first cycle is a full one.
    assert!(
        sent.unwrap().full,
        "a new working copy started from a deleted vdisk's snapshot"
    );
    assert!(!got.unwrap().resumed, "a working copy made now resumed a cut cycle");
    assert_eq!(image(&dst.engine.vdisk("vol@s2").unwrap()), image(&s2));
}

/// A cut cycle's snapshot deleted at the source (to free space during an outage, say), and
/// taken again under its name: the cycle that sends the new one is not the cut one resumed.
/// Its working copy goes back to the base first: a grain the cut cycle wrote there, a hole
/// in the base and in the new snapshot (trimmed again meanwhile), is neither offered nor
/// sent as a hole, and would otherwise stay in the replica for good. Before, the resume was
/// decided by the names alone.
#[test]
fn a_snapshot_taken_again_under_a_cut_cycles_name_is_not_that_cycle_resumed() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 256 * MIB);
    let v = source_vdisk(&src, 32 * MIB);
    v.write(0, &noise(1, (4 * MIB) as usize), false).unwrap();
    src.engine.snapshot("vol", "s1").unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    sent.unwrap();
    got.unwrap();
    // A grain that is a hole in s1, then more after it, cut once the grain got through.
    let grain = v.grain_size();
    v.write(8 * MIB, &noise(2, grain as usize), false).unwrap();
    v.write(16 * MIB, &noise(3, (8 * MIB) as usize), false).unwrap();
    src.engine.snapshot("vol", "s2").unwrap();
    // Cut again a little later (the same cycle, resumed) until the grain is in.
    let mut at = vec![0u8; grain as usize];
    for cut in 1..=6 {
        let (sent, _) = cycle(&src, &dst, "s2", Some("s1"), Some((cut * MIB) as usize));
        assert!(sent.is_err());
        dst.engine.vdisk("vol").unwrap().read(8 * MIB, &mut at).unwrap();
        if at == noise(2, grain as usize) {
            break;
        }
    }
    assert_eq!(at, noise(2, grain as usize), "the cut cycle wrote the grain");
    // s2 deleted at the source, the grain trimmed, s2 taken again.
    src.engine.delete_vdisk("vol@s2").unwrap();
    v.trim(8 * MIB, grain).unwrap();
    let s2 = src.engine.snapshot("vol", "s2").unwrap();
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    sent.unwrap();
    assert!(
        !got.unwrap().resumed,
        "another snapshot of that name resumed the cut cycle"
    );
    assert_eq!(image(&dst.engine.vdisk("vol@s2").unwrap()), image(&s2));
}

#[test]
fn a_full_replica_pool_says_so_and_the_source_is_unharmed() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 24 * MIB);
    let v = source_vdisk(&src, 64 * MIB);
    let data = noise(5, (48 * MIB) as usize);
    v.write(0, &data, false).unwrap();
    let s1 = src.engine.snapshot("vol", "s1").unwrap();
    let before = image(&s1);
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    let err = sent.unwrap_err().to_string();
    assert!(err.contains("refused") && err.to_lowercase().contains("space"), "{err}");
    assert!(got.is_err());
    assert_eq!(image(&s1), before);
    let mut back = vec![0u8; data.len()];
    v.read(0, &mut back).unwrap();
    assert!(back == data);
    assert!(dst.engine.vdisk("vol@s1").is_err());
}

#[test]
fn streams_that_lie_are_refused_with_a_reason() {
    let dst = site(2, 64 * MIB);
    let run = |bytes: Vec<u8>| -> String {
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let conn = Duplex {
            input: io::Cursor::new(bytes),
            output: output.clone(),
        };
        let e = receive(conn, &dst, &options(&dst)).unwrap_err().to_string();
        assert!(
            output.lock().unwrap().windows(e.len().min(20)).count() > 0,
            "the refusal went back"
        );
        e
    };
    assert!(run(b"GET / HTTP/1.1\r\n\r\n".to_vec()).contains("not a Tessera replication stream"));
    let begin = |json: &str| {
        let mut b = tessera_replication::wire::MAGIC.to_vec();
        tessera_replication::wire::write_frame(&mut b, tessera_replication::wire::Kind::Begin, json.as_bytes())
            .unwrap();
        b
    };
    let ok = r#"{"pool":"p","vdisk":"vol","size":1048576,"grain":65536,"block_size":512,"snapshot":"s1","base":null}"#;
    assert!(run(begin(&ok.replace("\"vol\"", "\"../etc\""))).contains("vdisk name"));
    assert!(run(begin(&ok.replace("65536", "65535"))).contains("grains"));
    assert!(run(begin(&ok.replace("\"p\"", "\"q\""))).contains("no pool 'q'"));
    // A replica too large for this site to hold its map (1 PiB in 4 KiB grains): refused
    // before anything is made, and the site is told the replica was not made.
    let huge = ok
        .replace("1048576", &(1u64 << 50).to_string())
        .replace("65536", "4096");
    assert!(run(begin(&huge)).contains("grain map"));
    assert_eq!(*dst.not_made.lock().unwrap(), vec!["p/vol".to_string()]);
    assert!(dst.engine.vdisk("vol").is_err());
    // A peer may not write over a vdisk that is not a replica.
    let mut spec = VdiskSpec::new("precious", MIB, LayoutKind::Mirror);
    spec.grain_size = Some(GRAIN);
    dst.engine.create_vdisk(&spec).unwrap();
    assert!(run(begin(&ok.replace("\"vol\"", "\"precious\""))).contains("not a replica"));
    assert!(run(begin(r#"{"vdisk":"vol"}"#)).contains("Begin"));
    // Data nobody asked for.
    let mut b = begin(ok);
    let data = tessera_replication::wire::encode_data(0, &[1u8; 4096]);
    tessera_replication::wire::write_frame(&mut b, tessera_replication::wire::Kind::Data, &data).unwrap();
    assert!(run(b).contains("not asked for"));
    // Data past the vdisk's end (an offset that would wrap).
    let mut b = begin(ok);
    let data = tessera_replication::wire::encode_data(u64::MAX - 4095, &[1u8; 8192]);
    tessera_replication::wire::write_frame(&mut b, tessera_replication::wire::Kind::Data, &data).unwrap();
    assert!(run(b).contains("range"));
    // Ended before its commit.
    assert!(run(begin(ok)).contains("before its commit"));
    // An offer outside the vdisk.
    let mut b = begin(ok);
    let offer =
        tessera_replication::wire::encode_offer(0, &[tessera_replication::wire::Offered::of(1 << 40, &[0u8; 65536])]);
    tessera_replication::wire::write_frame(&mut b, tessera_replication::wire::Kind::Offer, &offer).unwrap();
    assert!(run(b).contains("range"));
    // The same grain offered again (each offer a read and a hashing of it here).
    let mut b = begin(ok);
    let again = tessera_replication::wire::Offered::of(65536, &[3u8; 65536]);
    for no in 0..2 {
        let offer = tessera_replication::wire::encode_offer(no, std::slice::from_ref(&again));
        tessera_replication::wire::write_frame(&mut b, tessera_replication::wire::Kind::Offer, &offer).unwrap();
    }
    assert!(run(b).contains("offered twice"));
    // Holes are zeroed once each, in order, before the offers: each one zeroes (and walks
    // the grain map of) as much of the replica as it spans, so a hole over the whole replica
    // sent again and again would keep this site at it for the whole cycle.
    let hole = |b: &mut Vec<u8>, offset: u64, len: u64| {
        let h = tessera_replication::wire::encode_hole(offset, len);
        tessera_replication::wire::write_frame(b, tessera_replication::wire::Kind::Hole, &h).unwrap();
    };
    let mut b = begin(ok);
    hole(&mut b, 0, MIB);
    hole(&mut b, 0, MIB);
    assert!(run(b).contains("a hole of 1048576 bytes at 0 after one that ended at 1048576"));
    let mut b = begin(ok);
    hole(&mut b, 2 * GRAIN, GRAIN);
    hole(&mut b, GRAIN, 2 * GRAIN);
    assert!(run(b).contains("a hole of 131072 bytes at 65536 after one that ended at 196608"));
    let mut b = begin(ok);
    let offer = tessera_replication::wire::encode_offer(0, &[tessera_replication::wire::Offered::of(0, &[3u8; 65536])]);
    tessera_replication::wire::write_frame(&mut b, tessera_replication::wire::Kind::Offer, &offer).unwrap();
    hole(&mut b, GRAIN, GRAIN);
    assert!(run(b).contains("a hole of 65536 bytes at 65536 after the offers"));
    // In order, they are zeroed and the cycle goes on (to its end, here without a commit).
    let mut b = begin(ok);
    hole(&mut b, 0, GRAIN);
    hole(&mut b, GRAIN, GRAIN);
    hole(&mut b, 4 * GRAIN, GRAIN);
    assert!(run(b).contains("before its commit"));
    // Offers without end, and never a block of data: the replica stops holding fingerprints.
    let grains = tessera_replication::wire::MAX_WANTED_BLOCKS / 16 + 1;
    let big = ok.replace("1048576", &(grains as u64 * GRAIN).to_string());
    let mut b = begin(&big);
    // The same bytes offered everywhere: each place lacks them all the same.
    let one = tessera_replication::wire::Offered::of(0, &noise(1, GRAIN as usize));
    // An Offer frame of those bytes at each of `grains`.
    let offer = |b: &mut Vec<u8>, no: u64, grains: &[u64]| {
        let offers: Vec<_> = grains
            .iter()
            .map(|&g| tessera_replication::wire::Offered {
                offset: g * GRAIN,
                ..one.clone()
            })
            .collect();
        let frame = tessera_replication::wire::encode_offer(no, &offers);
        tessera_replication::wire::write_frame(b, tessera_replication::wire::Kind::Offer, &frame).unwrap();
    };
    for (no, chunk) in (0..grains as u64).collect::<Vec<_>>().chunks(4096).enumerate() {
        offer(&mut b, no as u64, chunk);
    }
    assert!(run(b).contains("offered and not sent"));
    assert_eq!(dst.joins.wanted(), 0, "the refused cycle gave its fingerprints back");
    // The bound across the site's cycles (of one key's cycles here, half of it): a cycle that
    // would pass it is refused, before the fingerprints that would pass it are held.
    dst.joins.set_wanted_cap(100);
    let mut b = begin(&big);
    offer(&mut b, 0, &(0..64).collect::<Vec<_>>());
    assert!(run(b).contains("as many as the cycles of one key hold at once"));
    assert_eq!(dst.joins.wanted(), 0, "given back");
    dst.joins
        .set_wanted_cap(tessera_replication::wire::MAX_SITE_WANTED_BLOCKS);
}

/// The source vdisk "vol" of `size` bytes: a mirror in `GRAIN` grains.
fn source_vdisk(src: &Site, size: u64) -> std::sync::Arc<tessera_volume::Vdisk> {
    let mut spec = VdiskSpec::new("vol", size, LayoutKind::Mirror);
    spec.grain_size = Some(GRAIN);
    src.engine.create_vdisk(&spec).unwrap()
}

/// A connection made of bytes to read and a buffer that takes what is written.
struct Duplex {
    input: io::Cursor<Vec<u8>>,
    output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Read for Duplex {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.input.read(b)
    }
}

impl Write for Duplex {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.output.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A frame of `kind` carrying `body`, after the magic if it opens a connection (`magic`).
fn framed(kind: tessera_replication::wire::Kind, body: &[u8], magic: bool) -> Vec<u8> {
    let mut b = if magic { MAGIC.to_vec() } else { Vec::new() };
    tessera_replication::wire::write_frame(&mut b, kind, body).unwrap();
    b
}

/// A connection to `l`, whose other end `dst` receives on a thread of the scope `sc`: the
/// client's end (reads time out after `read_timeout`) and that thread, which returns the
/// receiver's outcome. `buffers`: the socket buffers of both ends, pinned to that size
/// (the client's for sending, the receiver's for receiving), whatever the host's tuning.
fn receiving<'s, 'e>(
    sc: &'s std::thread::Scope<'s, 'e>,
    l: &'e TcpListener,
    dst: &'e Site,
    read_timeout: std::time::Duration,
    buffers: Option<usize>,
) -> (
    TcpStream,
    std::thread::ScopedJoinHandle<'s, Result<ReceiveReport, String>>,
) {
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    c.set_read_timeout(Some(read_timeout)).unwrap();
    if let Some(size) = buffers {
        c.set_write_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        socket2::SockRef::from(&c).set_send_buffer_size(size).unwrap();
        socket2::SockRef::from(&s).set_recv_buffer_size(size).unwrap();
    }
    (
        c,
        sc.spawn(move || receive(s, dst, &options(dst)).map_err(|e| e.to_string())),
    )
}

/// A cycle takes no more streams than it said it would open (each is a thread and a frame's
/// buffer here, and a place at the site's listener): of two streams that join a cycle of one
/// extra stream, the second is refused before it is handed over, and the token then admits
/// no other.
#[test]
fn a_cycle_takes_no_more_streams_than_it_said_it_opens() {
    use tessera_replication::wire::Kind;
    let dst = site(2, 64 * MIB);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let token = "00112233445566778899aabbccddeeff";
    let join = format!(r#"{{"token":"{token}","stream":1}}"#);
    std::thread::scope(|sc| {
        let (dst, l) = (&dst, &l);
        let connect = || receiving(sc, l, dst, std::time::Duration::from_secs(10), None);
        let (mut main, cycle) = connect();
        let begin = format!(
            r#"{{"pool":"p","vdisk":"vol","size":1048576,"grain":65536,"block_size":512,"snapshot":"s1","base":null,"streams":2,"token":"{token}"}}"#
        );
        main.write_all(&framed(Kind::Begin, begin.as_bytes(), true)).unwrap();
        let mut ready = [0u8; 64];
        assert!(main.read(&mut ready).unwrap() > 0, "no Ready");
        let mut joined = Vec::new();
        let mut handed = Vec::new();
        for _ in 0..2 {
            let (mut c, h) = connect();
            c.write_all(&framed(Kind::Join, join.as_bytes(), true)).unwrap();
            joined.push(c);
            handed.push(h);
        }
        let outcomes: Vec<Result<bool, String>> = handed
            .into_iter()
            .map(|h| h.join().unwrap().map(|r| r.joined))
            .collect();
        assert_eq!(outcomes.iter().filter(|o| **o == Ok(true)).count(), 1, "{outcomes:?}");
        let refused = outcomes.iter().position(|o| o.is_err()).expect("one refused");
        assert!(
            outcomes[refused].as_ref().unwrap_err().contains("not waiting"),
            "{outcomes:?}"
        );
        // And its token admits no other.
        let (mut late, refused) = connect();
        late.write_all(&framed(Kind::Join, join.as_bytes(), true)).unwrap();
        assert!(refused.join().unwrap().unwrap_err().contains("not waiting"));
        // The sender goes away: the cycle ends, uncommitted, its joined stream with it.
        for c in &joined {
            let _ = c.shutdown(Shutdown::Both);
        }
        main.shutdown(Shutdown::Both).unwrap();
        assert!(cycle.join().unwrap().is_err());
    });
}

/// An extra stream that joins while the cycle waits for a frame on its own connection is
/// read at once: a sender that fills it before it sends anything more on the cycle's
/// connection (as one does whose writers wait on a stream that joined late) is not left
/// waiting until the silence ends the cycle.
#[test]
fn a_stream_that_joins_while_the_cycle_waits_for_its_next_frame_is_read_at_once() {
    use tessera_replication::wire::{self, Kind, Offered};
    let dst = site(2, 64 * MIB);
    let size = 16 * MIB;
    let data = noise(21, size as usize);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let token = "00112233445566778899aabbccddeeff";
    std::thread::scope(|sc| {
        let (dst, l) = (&dst, &l);
        // Buffers far smaller than the data.
        let connect = || receiving(sc, l, dst, std::time::Duration::from_secs(30), Some(256 << 10));
        let (mut main, cycle) = connect();
        let begin = format!(
            r#"{{"pool":"p","vdisk":"vol","size":{size},"grain":{GRAIN},"block_size":512,"snapshot":"s1","base":null,"streams":2,"token":"{token}"}}"#
        );
        main.write_all(&framed(Kind::Begin, begin.as_bytes(), true)).unwrap();
        assert!(matches!(
            wire::read_frame(&mut main).unwrap().unwrap().kind,
            Kind::Ready
        ));
        // Every grain offered and asked for: the cycle waits for its next frame now.
        for (no, batch) in data.chunks(32 * GRAIN as usize).enumerate() {
            let at = no as u64 * 32 * GRAIN;
            let offers: Vec<Offered> = batch
                .chunks(GRAIN as usize)
                .enumerate()
                .map(|(i, g)| Offered::of(at + i as u64 * GRAIN, g))
                .collect();
            main.write_all(&framed(Kind::Offer, &wire::encode_offer(no as u64, &offers), false))
                .unwrap();
            let want = wire::read_frame(&mut main).unwrap().unwrap();
            assert!(
                matches!(want.kind, Kind::Want),
                "{:?}",
                String::from_utf8_lossy(&want.body)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        // The extra stream joins, and carries every grain: far more than the sockets between
        // the two ends hold, so it must be read to be written.
        let (mut extra, handed) = connect();
        extra
            .write_all(&framed(
                Kind::Join,
                format!(r#"{{"token":"{token}","stream":1}}"#).as_bytes(),
                true,
            ))
            .unwrap();
        let t0 = std::time::Instant::now();
        for (i, g) in data.chunks(GRAIN as usize).enumerate() {
            let sent = extra.write_all(&framed(Kind::Data, &wire::encode_data(i as u64 * GRAIN, g), false));
            assert!(
                sent.is_ok(),
                "the joined stream was not read ({} MiB written in {:?}): {sent:?}",
                i as u64 * GRAIN / MIB,
                t0.elapsed()
            );
        }
        extra.write_all(&framed(Kind::End, &[], false)).unwrap();
        assert!(handed.join().unwrap().unwrap().joined);
        main.write_all(&framed(Kind::Commit, &[], false)).unwrap();
        let done = wire::read_frame(&mut main).unwrap().unwrap();
        assert!(
            matches!(done.kind, Kind::Done),
            "{:?}",
            String::from_utf8_lossy(&done.body)
        );
        let got = cycle.join().unwrap().unwrap();
        assert_eq!(got.streams, 2);
    });
    assert_eq!(image(&dst.engine.vdisk("vol@s1").unwrap()), blake3::hash(&data));
}

/// A cycle whose token is that of a cycle still waiting for its streams is refused: taking
/// its place would leave that cycle without its streams, and hand it the other's.
#[test]
fn a_token_already_waiting_is_refused() {
    use tessera_replication::wire::{self, Kind};
    let dst = site(2, 64 * MIB);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let token = "00112233445566778899aabbccddeeff";
    std::thread::scope(|sc| {
        let (dst, l) = (&dst, &l);
        let connect = || receiving(sc, l, dst, std::time::Duration::from_secs(30), None);
        let begin = |vdisk: &str| {
            format!(
                r#"{{"pool":"p","vdisk":"{vdisk}","size":1048576,"grain":65536,"block_size":512,"snapshot":"s1","base":null,"streams":2,"token":"{token}"}}"#
            )
        };
        let (mut first, first_cycle) = connect();
        first
            .write_all(&framed(Kind::Begin, begin("vol").as_bytes(), true))
            .unwrap();
        assert!(matches!(
            wire::read_frame(&mut first).unwrap().unwrap().kind,
            Kind::Ready
        ));
        let (mut second, second_cycle) = connect();
        second
            .write_all(&framed(Kind::Begin, begin("other").as_bytes(), true))
            .unwrap();
        let answer = wire::read_frame(&mut second).unwrap().unwrap();
        let body = String::from_utf8_lossy(&answer.body).into_owned();
        assert!(
            matches!(answer.kind, Kind::Error) && body.contains("already waiting"),
            "{body}"
        );
        second.shutdown(Shutdown::Both).unwrap();
        assert!(second_cycle.join().unwrap().unwrap_err().contains("already waiting"));
        // The first cycle still takes its stream by the token.
        let (mut extra, handed) = connect();
        extra
            .write_all(&framed(
                Kind::Join,
                format!(r#"{{"token":"{token}","stream":1}}"#).as_bytes(),
                true,
            ))
            .unwrap();
        assert!(handed.join().unwrap().unwrap().joined);
        extra.write_all(&framed(Kind::End, &[], false)).unwrap();
        first.write_all(&framed(Kind::Commit, &[], false)).unwrap();
        let done = wire::read_frame(&mut first).unwrap().unwrap();
        assert!(
            matches!(done.kind, Kind::Done),
            "{:?}",
            String::from_utf8_lossy(&done.body)
        );
        assert_eq!(first_cycle.join().unwrap().unwrap().streams, 2);
    });
    assert_eq!(
        dst.failing.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the site was told of a failure: a cycle refused at its Begin, or one that committed"
    );
}

/// An extra stream that claimed its place in a cycle and is then refused by the site (a
/// daemon refuses one whose key was taken out of its file meanwhile) fails its cycle at
/// once, with its reason: the cycle does not wait for it until its commit's deadline. The
/// site is told the cycle failed once under way (for it to shut the cycle's other streams).
#[test]
fn a_stream_refused_as_it_joins_fails_its_cycle_at_once() {
    use tessera_replication::wire::{self, Kind};
    let dst = site(2, 64 * MIB);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let token = "00112233445566778899aabbccddeeff";
    std::thread::scope(|sc| {
        let (dst, l) = (&dst, &l);
        // Answers are awaited half as long as the cycle waits for a stream to join.
        let connect = || receiving(sc, l, dst, std::time::Duration::from_secs(30), None);
        // Three streams: the one refused is not the last the cycle waits for (when the last
        // is gone, nothing else can join, and the cycle fails for that).
        let (mut main, cycle) = connect();
        main.write_all(&opening_of(&format!(r#","streams":3,"token":"{token}""#)))
            .unwrap();
        assert!(matches!(
            wire::read_frame(&mut main).unwrap().unwrap().kind,
            Kind::Ready
        ));
        dst.refuse_joins.store(true, std::sync::atomic::Ordering::SeqCst);
        let (mut extra, handed) = connect();
        extra
            .write_all(&framed(
                Kind::Join,
                format!(r#"{{"token":"{token}","stream":1}}"#).as_bytes(),
                true,
            ))
            .unwrap();
        assert!(handed.join().unwrap().unwrap_err().contains("refuses the stream"));
        main.write_all(&framed(Kind::Commit, &[], false)).unwrap();
        let answer = wire::read_frame(&mut main)
            .expect("the commit was answered at once")
            .unwrap();
        let body = String::from_utf8_lossy(&answer.body).into_owned();
        assert!(
            matches!(answer.kind, Kind::Error)
                && body.contains("a stream could not join the cycle")
                && body.contains("refuses the stream"),
            "{body}"
        );
        main.shutdown(Shutdown::Both).unwrap();
        assert!(cycle.join().unwrap().unwrap_err().contains("could not join"));
    });
    assert_eq!(dst.failing.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A cycle that is not the one a cut cycle left its marker for takes that marker away before
/// it changes the working copy: refused after its reset (a size the replica cannot take), it
/// leaves no marker by which the cut cycle, sent again, would skip its own reset and commit a
/// copy that still holds the other base's data.
#[test]
fn a_cycle_refused_after_resetting_the_copy_leaves_no_marker_behind() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 256 * MIB);
    let v = source_vdisk(&src, 32 * MIB);
    v.write(0, &noise(1, (16 * MIB) as usize), false).unwrap();
    src.engine.snapshot("vol", "s0").unwrap();
    let (sent, got) = cycle(&src, &dst, "s0", None, None);
    (sent.unwrap(), got.unwrap());
    // s1 changes the first 8 MiB; s2 the next 8.
    v.write(0, &noise(2, (8 * MIB) as usize), false).unwrap();
    src.engine.snapshot("vol", "s1").unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", Some("s0"), None);
    (sent.unwrap(), got.unwrap());
    v.write(8 * MIB, &noise(3, (8 * MIB) as usize), false).unwrap();
    let s2 = src.engine.snapshot("vol", "s2").unwrap();
    let (sent, _) = cycle(&src, &dst, "s2", Some("s1"), Some((2 * MIB) as usize));
    assert!(sent.is_err(), "the cycle was to be cut");
    // Another sender's cycle on base s0, refused once it has reset the copy to s0.
    let begin = format!(
        r#"{{"pool":"p","vdisk":"vol","size":{},"grain":65536,"block_size":512,"snapshot":"sx","base":"s0"}}"#,
        32 * MIB + 1
    );
    let mut bytes = MAGIC.to_vec();
    tessera_replication::wire::write_frame(&mut bytes, tessera_replication::wire::Kind::Begin, begin.as_bytes())
        .unwrap();
    let conn = Duplex {
        input: io::Cursor::new(bytes),
        output: Default::default(),
    };
    assert!(receive(conn, &dst, &options(&dst)).is_err());
    // The cut cycle again: it starts over from its base, and the replica is exact.
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    sent.unwrap();
    assert!(!got.unwrap().resumed, "taken for the cut cycle resumed");
    assert_eq!(image(&dst.engine.vdisk("vol@s2").unwrap()), image(&s2));
}

/// A cycle on a base first puts the working copy back to that base, then writes its marker,
/// by which the cycle sent again after a cut knows the copy holds part of it and does not
/// put it back again. The copy is back to the base durably before the marker is written: a
/// power cut between them would leave a copy that lost part of its reset, which the cycle
/// sent again would take for its own. Here the vdisk ends 4 KiB into its last grain, which
/// the reset therefore copies (a whole grain is pointed at the base's instead); the copy
/// holds other data there, on the medium, as a cut cycle leaves it; the next cycle is cut
/// once its marker is written, and the power of the replica's disks with it: their caches
/// must hold nothing of the reset. Sent again, the cycle makes an exact replica. Until
/// 2026-12-07 nothing flushed the reset before the marker; the replica came out exact only
/// because a snapshot copies its vdisk's partial last grain, so that the cycle offers that
/// grain again, and the replica asks for what its copy lacks.
#[test]
fn a_reset_to_the_base_is_durable_before_the_marker_that_skips_it() {
    let size = 8 * MIB + 4096;
    let src = site(2, 256 * MIB);
    let (dst, supply, media) = volatile_site(2, 256 * MIB);
    let v = source_vdisk(&src, size);
    v.write(0, &noise(1, size as usize), false).unwrap();
    src.engine.snapshot("vol", "s1").unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    (sent.unwrap(), got.unwrap());
    let copy = dst.engine.vdisk("vol").unwrap();
    copy.write(8 * MIB, &noise(2, 4096), false).unwrap();
    copy.flush().unwrap();
    drop(copy);
    v.write(0, &noise(3, GRAIN as usize), false).unwrap();
    let s2 = src.engine.snapshot("vol", "s2").unwrap();
    // Cut within the first grain's data, well past the opening: nothing of the cycle is
    // written to the copy but its reset.
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), Some(4096));
    assert!(sent.is_err() && got.is_err(), "{sent:?} {got:?}");
    let cut = supply.cut(1);
    assert!(
        cut.iter().all(|r| *r == Default::default()),
        "writes of the reset were not flushed when the marker was written: {cut:?}"
    );
    let dst = reopened(dst, &media);
    let (sent, got) = cycle(&src, &dst, "s2", Some("s1"), None);
    sent.unwrap();
    assert!(
        got.unwrap().resumed,
        "the cycle sent again is not taken for the one cut"
    );
    assert_eq!(image(&dst.engine.vdisk("vol@s2").unwrap()), image(&s2));
}

/// A peer holding the key that, past the handshake, sends its opening a byte now and then
/// (under the read timeout) is cut off within the silence: it would hold a place at the
/// listener for ever. One that opens in time goes on.
#[test]
fn a_peer_that_trickles_its_opening_is_cut_off_within_the_silence() {
    let keys: std::collections::HashMap<String, Vec<u8>> = [("sites".to_string(), vec![5u8; 32])].into();
    let silence = std::time::Duration::from_secs(2);
    let t = tessera_replication::Transport::with_keys(keys, "cubic", silence).unwrap();
    let dst = site(2, 128 * MIB);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let to = l.local_addr().unwrap().to_string();
    std::thread::scope(|s| {
        let dripping = s.spawn(|| {
            let mut c = t.connect(&to).unwrap();
            c.write_all(MAGIC).unwrap();
            c.flush().unwrap();
            // A Begin frame header, then its body a byte a second.
            c.write_all(&[1, 0, 0, 1, 0]).unwrap();
            for _ in 0..30 {
                if c.write_all(b" ").and_then(|_| c.flush()).is_err() {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            false
        });
        let (c, _) = l.accept().unwrap();
        let started = std::time::Instant::now();
        let (tls, deadline) = t.accept_until_opened(c).unwrap();
        let mut opts = options(&dst);
        opts.opening = std::sync::Mutex::new(Some(deadline));
        assert!(receive(tls, &dst, &opts).is_err());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "the opening went on for {:?}",
            started.elapsed()
        );
        assert!(dripping.join().unwrap(), "the peer was never cut off");
    });
}

/// A Begin of a 1 MiB replica "vol" in 64 KiB grains, after the magic; `extra` joins the JSON.
fn opening_of(extra: &str) -> Vec<u8> {
    let begin = format!(
        r#"{{"pool":"p","vdisk":"vol","size":1048576,"grain":65536,"block_size":512,"snapshot":"s1","base":null{extra}}}"#
    );
    let mut b = MAGIC.to_vec();
    tessera_replication::wire::write_frame(&mut b, tessera_replication::wire::Kind::Begin, begin.as_bytes()).unwrap();
    b
}

/// Once a cycle is under way, a peer sending a frame a byte now and then (each under the
/// read timeout) is cut off when the frame is later than the pace allows: it would hold its
/// connection and its place at the listener for ever.
#[test]
fn a_peer_that_trickles_a_frame_mid_cycle_is_cut_off() {
    let dst = site(2, 64 * MIB);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let to = l.local_addr().unwrap();
    std::thread::scope(|s| {
        let dripping = s.spawn(|| {
            let mut c = TcpStream::connect(to).unwrap();
            c.write_all(&opening_of("")).unwrap();
            let mut ready = [0u8; 64];
            assert!(c.read(&mut ready).unwrap() > 0, "no Ready");
            // An Offer's header announcing 64 KiB, then its body a byte every 200 ms.
            c.write_all(&[3, 0, 1, 0, 0]).unwrap();
            for _ in 0..150 {
                if c.write_all(b" ").and_then(|_| c.flush()).is_err() {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            false
        });
        let (c, _) = l.accept().unwrap();
        let mut opts = options(&dst);
        opts.pace = tessera_replication::wire::Pace {
            silence: std::time::Duration::from_secs(1),
            min_rate: 1 << 20,
        };
        let started = std::time::Instant::now();
        let e = receive(c, &dst, &opts).unwrap_err().to_string();
        assert!(e.contains("slower"), "{e}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "the frame went on for {:?}",
            started.elapsed()
        );
        assert!(dripping.join().unwrap(), "the peer was never cut off");
    });
}

/// A refused peer that goes on sending is read for a bounded while, not without end.
#[test]
fn a_refused_peer_that_goes_on_sending_is_not_read_without_end() {
    let dst = site(2, 64 * MIB);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let to = l.local_addr().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let mut c = TcpStream::connect(to).unwrap();
            // Refused at once (a frame of no known type), then 8 MiB a second for up to 2
            // minutes.
            c.write_all(MAGIC).unwrap();
            c.write_all(b"JUNKJUNK").unwrap();
            let chunk = vec![0u8; 1 << 20];
            for _ in 0..960 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) || c.write_all(&chunk).is_err() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(125));
            }
        });
        let (c, _) = l.accept().unwrap();
        let started = std::time::Instant::now();
        let e = receive(c, &dst, &options(&dst)).unwrap_err().to_string();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(e.contains("frame") || e.contains("type"), "{e}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the refused stream was read for {:?}",
            started.elapsed()
        );
    });
}

/// An extra stream that fails (here: data nobody asked for) ends its cycle at the next frame
/// of the cycle's own connection, with that stream's reason, not at the commit.
#[test]
fn a_failed_extra_stream_ends_its_cycle_with_its_reason() {
    use tessera_replication::wire::{self, Kind};
    let dst = site(2, 64 * MIB);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let token = "00112233445566778899aabbccddeeff";
    std::thread::scope(|sc| {
        let (dst, l) = (&dst, &l);
        let connect = || receiving(sc, l, dst, std::time::Duration::from_secs(10), None);
        let (mut main, cycle) = connect();
        main.write_all(&opening_of(&format!(r#","streams":2,"token":"{token}""#)))
            .unwrap();
        let mut ready = [0u8; 64];
        assert!(main.read(&mut ready).unwrap() > 0, "no Ready");
        let (mut extra, handed) = connect();
        let mut b = MAGIC.to_vec();
        wire::write_frame(
            &mut b,
            Kind::Join,
            format!(r#"{{"token":"{token}","stream":1}}"#).as_bytes(),
        )
        .unwrap();
        wire::write_frame(&mut b, Kind::Data, &wire::encode_data(0, &[7u8; 4096])).unwrap();
        extra.write_all(&b).unwrap();
        assert!(handed.join().unwrap().unwrap().joined);
        // The main connection goes on offering (nothing): the cycle ends at one of its frames.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut no = 0;
        while !cycle.is_finished() && std::time::Instant::now() < deadline {
            let mut f = Vec::new();
            wire::write_frame(&mut f, Kind::Offer, &wire::encode_offer(no, &[])).unwrap();
            if main.write_all(&f).is_err() {
                break;
            }
            no += 1;
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // (A cycle still going on ends with the connection, for another reason.)
        let _ = main.shutdown(Shutdown::Both);
        let e = cycle.join().unwrap().unwrap_err();
        assert!(e.contains("not asked for"), "{e}");
    });
}

/// Nor does a later cycle of the new replica start from such a snapshot: a base is one the
/// replica of that name now took, not one its deleted namesake left (another source's, maybe),
/// which would leave that data wherever the new cycle sends nothing.
#[test]
fn a_base_left_by_a_deleted_replica_of_the_name_is_not_taken() {
    let src = site(2, 256 * MIB);
    let dst = site(2, 256 * MIB);
    let v = source_vdisk(&src, 16 * MIB);
    // The replica site holds "vol@old" from a vdisk "vol" deleted since, with other data.
    let mut spec = VdiskSpec::new("vol", 16 * MIB, LayoutKind::Mirror);
    spec.grain_size = Some(GRAIN);
    let gone = dst.engine.create_vdisk(&spec).unwrap();
    gone.write(0, &noise(9, (16 * MIB) as usize), false).unwrap();
    dst.engine.snapshot("vol", "old").unwrap();
    drop(gone);
    dst.engine.delete_vdisk("vol").unwrap();
    // The source's own "old", then s1 (a full cycle makes the replica anew), then s2.
    v.write(0, &noise(1, (16 * MIB) as usize), false).unwrap();
    src.engine.snapshot("vol", "old").unwrap();
    src.engine.snapshot("vol", "s1").unwrap();
    let (sent, got) = cycle(&src, &dst, "s1", None, None);
    (sent.unwrap(), got.unwrap());
    v.write(0, &noise(2, MIB as usize), false).unwrap();
    let s2 = src.engine.snapshot("vol", "s2").unwrap();
    let (sent, got) = cycle(&src, &dst, "s2", Some("old"), None);
    got.unwrap();
    assert!(
        sent.unwrap().full,
        "the replica started from its deleted namesake's snapshot"
    );
    assert_eq!(image(&dst.engine.vdisk("vol@s2").unwrap()), image(&s2));
}

/// The blocks a site asks for and waits for are bounded for each peer's key apart from the
/// whole: the cycles of one key hold half of what the site holds at most, so a peer that asks
/// and never sends (its connections kept alive) leaves the other peers room.
#[test]
fn the_cycles_of_one_key_hold_half_of_what_the_site_waits_for_at_most() {
    use tessera_replication::wire::{self, Kind};
    let dst = site(2, 64 * MIB);
    dst.joins.set_wanted_cap(4096);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::scope(|sc| {
        let (dst, l) = (&dst, &l);
        // A cycle of the peer holding `key` into `vdisk`, offering `grains` grains (16 blocks
        // each, all lacking): its connection and the answer to the offer.
        let offer = |key: &'static str, vdisk: &str, grains: u64| {
            let mut c = TcpStream::connect(addr).unwrap();
            let (s, _) = l.accept().unwrap();
            let cycle = sc.spawn(move || {
                let mut opts = options(dst);
                opts.identity = key.to_string();
                receive(s, dst, &opts).map_err(|e| e.to_string())
            });
            let begin = format!(
                r#"{{"pool":"p","vdisk":"{vdisk}","size":{},"grain":65536,"block_size":512,"snapshot":"s1","base":null}}"#,
                16 * MIB
            );
            let mut b = MAGIC.to_vec();
            wire::write_frame(&mut b, Kind::Begin, begin.as_bytes()).unwrap();
            c.write_all(&b).unwrap();
            assert_eq!(wire::read_frame(&mut c).unwrap().unwrap().kind, Kind::Ready);
            let offers: Vec<_> = (0..grains)
                .map(|g| wire::Offered::of(g * GRAIN, &noise(g + 1, GRAIN as usize)))
                .collect();
            let mut f = Vec::new();
            wire::write_frame(&mut f, Kind::Offer, &wire::encode_offer(0, &offers)).unwrap();
            c.write_all(&f).unwrap();
            let answer = wire::read_frame(&mut c).unwrap().unwrap();
            (
                c,
                cycle,
                answer.kind,
                String::from_utf8_lossy(&answer.body).into_owned(),
            )
        };
        let (a1, c1, kind, _) = offer("site-a", "v1", 120);
        assert_eq!(kind, Kind::Want);
        let (a2, c2, kind, why) = offer("site-a", "v2", 10);
        assert_eq!(kind, Kind::Error, "a key's cycles held past half the site's bound");
        assert!(why.contains("key 'site-a'"), "{why}");
        let (b1, c3, kind, why) = offer("site-b", "v3", 120);
        assert_eq!(kind, Kind::Want, "another key's cycle was refused: {why}");
        assert_eq!(dst.joins.wanted(), 2 * 120 * 16);
        // And the site's whole bound, which the keys together reach.
        let (c1b, c4, kind, why) = offer("site-c", "v4", 30);
        assert_eq!(kind, Kind::Error);
        assert!(why.contains("as many as it holds at once"), "{why}");
        for c in [a1, a2, b1, c1b] {
            c.shutdown(Shutdown::Both).unwrap();
        }
        for c in [c1, c2, c3, c4] {
            assert!(c.join().unwrap().is_err());
        }
        assert_eq!(dst.joins.wanted(), 0, "given back");
    });
}
