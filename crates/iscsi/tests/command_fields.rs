//! A SCSI Command PDU's R and W bits, its length and its immediate data must agree with one
//! another and with the CDB. A command that says it moves no data, or moves it the other
//! way, is rejected rather than answered GOOD having written nothing; a read the host takes
//! no data from (no R, or no length) returns none, all of it counted as residual. Write data
//! comes in order: a Data-Out anywhere but at the next offset fails its command. CmdSN may
//! have a gap, which the initiator fills by sending the missing command again, or closes by
//! aborting it.

mod raw;

use std::sync::Arc;
use std::time::Duration;

use raw::{command, command_with, data_out, r2t, read10, read_pdu, write10, R, W};
use tessera_iscsi::pdu::Pdu;
use tessera_iscsi::{Access, Registry, Target};
use tessera_scsi::{Lun, RamBackend};
use tokio::net::{TcpListener, TcpStream};

const TARGET: &str = "iqn.2026-12.io.tessera:fields";
const HOST: &str = "iqn.2026-12.io.example:host";

async fn rig() -> TcpStream {
    let reg = Registry::new();
    let t = reg.add_target(Target::new(TARGET));
    t.set_access(Access::open());
    t.luns.write().insert(
        0,
        Arc::new(Lun::new(Arc::new(RamBackend::new("ram", 1 << 20, 512)), 0x51, false)),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(tessera_iscsi::serve(listener, reg));
    raw::login(&addr, TARGET, HOST, 1).await
}

async fn send(s: &mut TcpStream, mut p: Pdu) -> Pdu {
    p.write(s, false, false).await.unwrap();
    read_pdu(s, Duration::from_secs(5)).await.expect("an answer")
}

/// Block `lba` as a READ with R gives it.
async fn block(s: &mut TcpStream, itt: u32, lba: u32) -> Vec<u8> {
    let p = send(s, command(itt, 0, &read10(lba, 1), false, 512, vec![])).await;
    assert_eq!((p.opcode() & 0x3F, p.bhs[3]), (0x25, 0), "Data-In with GOOD");
    p.data
}

fn residual(p: &Pdu) -> (u8, u32) {
    (p.bhs[1] & 0x06, u32::from_be_bytes(p.bhs[44..48].try_into().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_bits_do_not_carry_its_data_is_rejected_and_writes_nothing() {
    let mut s = rig().await;
    let data = vec![0x5Au8; 512];
    let cases: [(&str, u8, u32, Vec<u8>); 4] = [
        ("a length with neither R nor W", 0, 512, vec![]),
        ("a WRITE with R", R, 512, vec![]),
        ("immediate data with R", R, 512, data.clone()),
        ("R and W", R | W, 512, data.clone()),
    ];
    for (itt, (what, flags, edtl, imm)) in (1..).zip(cases) {
        let p = send(&mut s, command_with(itt, 0, &write10(3, 1), flags, edtl, imm)).await;
        assert_eq!(
            (p.opcode() & 0x3F, p.bhs[2]),
            (0x3F, 0x09),
            "{what}: Reject, invalid PDU field"
        );
        assert_eq!(
            &p.data[16..20],
            &itt.to_be_bytes(),
            "{what}: the rejected command's header"
        );
        assert_eq!(
            block(&mut s, 100 + itt, 3).await,
            vec![0u8; 512],
            "{what}: nothing written"
        );
    }
    let p = send(&mut s, command(10, 0, &write10(3, 1), true, 512, data.clone())).await;
    assert_eq!(
        (p.opcode() & 0x3F, p.bhs[3], residual(&p)),
        (0x21, 0, (0, 0)),
        "a good WRITE"
    );
    assert_eq!(block(&mut s, 11, 3).await, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_with_no_length_move_no_data_and_count_it_all_as_residual() {
    let mut s = rig().await;
    let data = vec![0xC3u8; 512];
    let p = send(&mut s, command(1, 0, &write10(5, 1), true, 512, data.clone())).await;
    assert_eq!((p.opcode() & 0x3F, p.bhs[3]), (0x21, 0));
    // A READ of a block the host takes nothing of (EDTL 0, with R or without): a SCSI
    // Response, GOOD, overflowing by the block, and no Data-In before it.
    for (itt, flags) in [(2, 0), (3, R)] {
        let p = send(&mut s, command_with(itt, 0, &read10(5, 1), flags, 0, vec![])).await;
        assert_eq!(
            (p.opcode() & 0x3F, p.itt(), p.bhs[3]),
            (0x21, itt, 0),
            "flags {flags:#x}: a response and no data"
        );
        assert_eq!(residual(&p), (0x04, 512), "flags {flags:#x}: overflow by a block");
    }
    // A READ flagged as a write, with a block of data: it runs, and sends none of what it
    // read (libiscsi's Read10Invalid takes GOOD).
    let p = send(&mut s, command_with(6, 0, &read10(5, 1), W, 512, vec![0u8; 512])).await;
    assert_eq!(
        (p.opcode() & 0x3F, p.bhs[3], residual(&p)),
        (0x21, 0, (0x04, 512)),
        "a READ with W"
    );
    // A WRITE of a block with EDTL 0 writes nothing and says so in its residual.
    let p = send(&mut s, command_with(4, 0, &write10(5, 1), W, 0, vec![])).await;
    assert_eq!((p.opcode() & 0x3F, p.bhs[3], residual(&p)), (0x21, 0, (0x04, 512)));
    assert_eq!(block(&mut s, 5, 5).await, data, "the block is as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_data_sent_twice_to_one_offset_fails_the_write_rather_than_leave_zeros() {
    let mut s = rig().await;
    // Eight blocks, all solicited (InitialR2T): one R2T for the 4 KiB.
    let p = send(&mut s, command(1, 0, &write10(16, 8), true, 4096, vec![])).await;
    let (ttt, offset, len) = r2t(&p);
    assert_eq!((offset, len), (0, 4096));
    // The first half, then the first half again, numbered as if it were the second.
    for (sn, last) in [(0, false), (1, true)] {
        data_out(1, 0, ttt, sn, 0, vec![0x77; 2048], last)
            .write(&mut s, false, false)
            .await
            .unwrap();
    }
    let p = read_pdu(&mut s, Duration::from_secs(5)).await.expect("an answer");
    assert_eq!(
        (p.opcode() & 0x3F, p.itt(), p.bhs[3]),
        (0x21, 1, 0x02),
        "CHECK CONDITION"
    );
    assert_eq!(
        (p.data[4] & 0x0F, p.data[14], p.data[15]),
        (0x0B, 0x4B, 0x05),
        "ABORTED COMMAND, DATA OFFSET ERROR"
    );
    assert_eq!(block(&mut s, 2, 16).await, vec![0u8; 512], "nothing written");
    // Data that arrives in order is written.
    let p = send(&mut s, command(3, 0, &write10(16, 8), true, 4096, vec![])).await;
    let (ttt, _, _) = r2t(&p);
    data_out(3, 0, ttt, 0, 0, vec![0x77; 2048], false)
        .write(&mut s, false, false)
        .await
        .unwrap();
    let p = send(&mut s, data_out(3, 0, ttt, 1, 2048, vec![0x78; 2048], true)).await;
    assert_eq!((p.opcode() & 0x3F, p.itt(), p.bhs[3]), (0x21, 3, 0), "GOOD");
    assert_eq!(block(&mut s, 4, 23).await, vec![0x78u8; 512]);
}

/// A LUN field of two levels, or of another bus, names no logical unit here, not the one its
/// first bytes would: INQUIRY says none is there, a WRITE fails and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_field_beyond_the_first_level_names_no_lun() {
    let mut s = rig().await;
    for (itt, (at, byte)) in (1..).zip([(10, 1u8), (15, 1), (8, 0x01)]) {
        let mut inquiry = command(itt, 0, &[0x12, 0, 0, 0, 36, 0], false, 36, vec![]);
        inquiry.bhs[at] = byte;
        let p = send(&mut s, inquiry).await;
        assert_eq!((p.opcode() & 0x3F, p.bhs[3]), (0x25, 0), "byte {at}: INQUIRY answers");
        assert_eq!(p.data[0], 0x7F, "byte {at}: no logical unit there");
        let mut write = command(100 + itt, 0, &write10(7, 1), true, 512, vec![0xEE; 512]);
        write.bhs[at] = byte;
        let p = send(&mut s, write).await;
        assert_eq!(
            (p.opcode() & 0x3F, p.bhs[3]),
            (0x21, 0x02),
            "byte {at}: CHECK CONDITION"
        );
        assert_eq!((p.data[14], p.data[15]), (0x25, 0x00), "LOGICAL UNIT NOT SUPPORTED");
        assert_eq!(
            block(&mut s, 200 + itt, 7).await,
            vec![0u8; 512],
            "byte {at}: LUN 0 untouched"
        );
    }
}

/// A command lost on its way (discarded for a data digest error, RFC 7143 7.8) leaves a gap
/// in CmdSN that the initiator fills by sending it again: ExpCmdSN then moves past it and
/// past every command received meanwhile, and the session goes on. A command received once
/// already is not run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exp_cmd_sn_moves_past_a_gap_once_it_is_filled() {
    let mut s = rig().await;
    let exp_cmd_sn = |p: &Pdu| u32::from_be_bytes(p.bhs[28..32].try_into().unwrap());
    // TEST UNIT READY, not immediate, numbered `sn`.
    let numbered = |itt: u32, sn: u32| {
        let mut p = command_with(itt, 0, &[0; 6], 0, 0, vec![]);
        p.bhs[0] = 0x01;
        p.set(24, sn);
        p
    };
    let first = send(&mut s, command(1, 0, &[0; 6], false, 0, vec![])).await;
    let exp = exp_cmd_sn(&first);
    // exp + 1 comes before exp, which was lost: it runs, and ExpCmdSN waits for exp.
    let p = send(&mut s, numbered(2, exp.wrapping_add(1))).await;
    assert_eq!((p.opcode() & 0x3F, p.itt()), (0x21, 2));
    assert_eq!(exp_cmd_sn(&p), exp, "the gap is still open");
    // The same command again is not run again.
    numbered(3, exp.wrapping_add(1))
        .write(&mut s, false, false)
        .await
        .unwrap();
    assert!(
        read_pdu(&mut s, Duration::from_millis(500)).await.is_none(),
        "a command received once already was run again"
    );
    // exp, sent again, fills the gap: ExpCmdSN moves past both.
    let p = send(&mut s, numbered(4, exp)).await;
    assert_eq!((p.opcode() & 0x3F, p.itt()), (0x21, 4));
    assert_eq!(exp_cmd_sn(&p), exp.wrapping_add(2), "ExpCmdSN moved past the gap");
    let p = send(&mut s, numbered(5, exp.wrapping_add(2))).await;
    assert_eq!((p.opcode() & 0x3F, p.itt()), (0x21, 5));
    assert_eq!(exp_cmd_sn(&p), exp.wrapping_add(3));
    // A numbered request other than a command, sent again (its CmdSN behind ExpCmdSN), is
    // ignored as well: a NOP-Out is not answered twice.
    let mut nop = Pdu::new(0x00);
    nop.bhs[1] = 0x80;
    nop.set(16, 6).set(20, 0xFFFF_FFFF).set(24, exp.wrapping_add(2));
    nop.write(&mut s, false, false).await.unwrap();
    assert!(
        read_pdu(&mut s, Duration::from_millis(500)).await.is_none(),
        "a NOP-Out received once already was answered again"
    );
    nop.set(24, exp.wrapping_add(3));
    let p = send(&mut s, nop).await;
    assert_eq!((p.opcode() & 0x3F, p.itt()), (0x20, 6), "NOP-In");
}

/// ABORT TASK of a command the target never received (lost to a digest error), its CmdSN in
/// the window and before the request's own, counts that CmdSN as received: the gap closes and
/// the function is complete. Of a command answered already, or of a CmdSN outside the window,
/// the task does not exist (RFC 7143 11.6.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_of_a_command_never_received_closes_its_gap() {
    let mut s = rig().await;
    let exp_cmd_sn = |p: &Pdu| u32::from_be_bytes(p.bhs[28..32].try_into().unwrap());
    let first = send(&mut s, command(1, 0, &[0; 6], false, 0, vec![])).await;
    let exp = exp_cmd_sn(&first);
    let mut p = command_with(2, 0, &[0; 6], 0, 0, vec![]);
    p.bhs[0] = 0x01;
    p.set(24, exp.wrapping_add(1));
    assert_eq!(exp_cmd_sn(&send(&mut s, p).await), exp, "the gap is open");
    // ABORT TASK (immediate, numbered with the next CmdSN) of task 77 at RefCmdSN `referenced`.
    let abort = |itt: u32, referenced: u32| {
        let mut p = Pdu::new(0x42);
        p.bhs[1] = 0x80 | 1;
        p.set(16, itt)
            .set(20, 77)
            .set(24, exp.wrapping_add(2))
            .set(32, referenced);
        p
    };
    let r = send(&mut s, abort(3, exp)).await;
    assert_eq!(
        (r.opcode() & 0x3F, r.itt(), r.bhs[2]),
        (0x22, 3, 0),
        "function complete"
    );
    assert_eq!(exp_cmd_sn(&r), exp.wrapping_add(2), "the gap closed");
    for referenced in [exp.wrapping_add(1), exp.wrapping_add(1000)] {
        let r = send(&mut s, abort(4, referenced)).await;
        assert_eq!(
            (r.opcode() & 0x3F, r.bhs[2]),
            (0x22, 1),
            "{referenced}: task does not exist"
        );
    }
}
