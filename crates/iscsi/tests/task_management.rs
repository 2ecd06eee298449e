//! Task management functions answer only once the commands they abort have ended: a host
//! told FUNCTION COMPLETE sends the write again, or newer data to the same blocks (perhaps
//! down another path), so an aborted write still running must not land after the answer.
//! The aborted command itself is never answered. A logical unit whose writes wait at a gate
//! the test opens stands for a disk that stalls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_iscsi::pdu::Pdu;
use tessera_iscsi::{Access, Registry, Target};
use tessera_scsi::{Lun, RamBackend};
use tessera_test_support::gated_ram::{Gated, GatedRam};
use tokio::net::{TcpListener, TcpStream};

mod raw;

use raw::{command, data_out, r2t, read_pdu, write10};

const TARGET: &str = "iqn.2026-12.io.tessera:tmf";
const HOST: &str = "iqn.2026-12.io.example:host";
const MIB: u64 = 1 << 20;

/// An open target with LUN 0 on a gated backend, and another LUN 1 on plain RAM.
async fn rig() -> (String, Arc<GatedRam>, Arc<Registry>) {
    // Its writes wait until the gate opens.
    let gated = Arc::new(GatedRam::new("gated", 16 * MIB, 512, Gated::Writes));
    gated.close();
    let reg = Registry::new();
    let t = reg.add_target(Target::new(TARGET));
    t.set_access(Access::open());
    t.luns.write().insert(0, Arc::new(Lun::new(gated.clone(), 0x51, false)));
    t.luns.write().insert(
        1,
        Arc::new(Lun::new(Arc::new(RamBackend::new("ram", 16 * MIB, 512)), 0x52, false)),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(tessera_iscsi::serve(listener, reg.clone()));
    (addr, gated, reg)
}

/// Logs in with immediate data, so that a 4 KiB write needs no R2T.
async fn login(addr: &str) -> TcpStream {
    login_port(addr, 1).await
}

/// [`login`] from the host's initiator port `port`: another session, another I_T nexus.
async fn login_port(addr: &str, port: u8) -> TcpStream {
    raw::login(addr, TARGET, HOST, port).await
}

/// A task management request of `function` for `lun` (and, for ABORT TASK, task `referenced`).
fn tmf(itt: u32, function: u8, lun: u8, referenced: u32) -> Pdu {
    let mut p = Pdu::new(0x42); // immediate | TASK_MGMT_REQ
    p.bhs[1] = 0x80 | function;
    p.bhs[9] = lun;
    p.set(16, itt).set(20, referenced);
    p
}

/// Returns once a write waits at the gate.
async fn until_a_write_waits(gated: &GatedRam) {
    let start = Instant::now();
    while gated.reached() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the write never reached the backend"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn the_answer_waits_for_the_aborted_write(function: u8) {
    let (addr, gated, _reg) = rig().await;
    let mut s = login(&addr).await;
    let data = vec![0xA5u8; 4096];
    command(1, 0, &write10(8, 8), true, 4096, data.clone())
        .write(&mut s, false, false)
        .await
        .unwrap();
    until_a_write_waits(&gated).await;
    tmf(2, function, 0, 1).write(&mut s, false, false).await.unwrap();
    // A command to another LUN is served meanwhile: the reader goes on.
    command(3, 1, &write10(0, 8), true, 4096, data.clone())
        .write(&mut s, false, false)
        .await
        .unwrap();
    let p = read_pdu(&mut s, Duration::from_secs(5))
        .await
        .expect("the other LUN's write is answered");
    assert_eq!(
        (p.opcode() & 0x3F, p.itt(), p.bhs[3]),
        (0x21, 3, 0),
        "the other LUN's write, GOOD, and not the function's answer while the aborted write waits"
    );
    assert!(
        read_pdu(&mut s, Duration::from_millis(300)).await.is_none(),
        "the function was answered while the write it aborted still ran"
    );
    gated.open();
    let p = read_pdu(&mut s, Duration::from_secs(5))
        .await
        .expect("the function is answered once the write ended");
    assert!((gated.passed() > 0), "answered before the aborted write landed");
    assert_eq!(
        (p.opcode() & 0x3F, p.itt()),
        (0x22, 2),
        "the function's answer, not the write's"
    );
    assert_eq!(p.bhs[2], 0, "FUNCTION COMPLETE");
    assert!(
        read_pdu(&mut s, Duration::from_millis(300)).await.is_none(),
        "the aborted write was answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_is_answered_once_the_write_it_aborts_has_ended() {
    the_answer_waits_for_the_aborted_write(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_reset_is_answered_once_the_writes_it_aborts_have_ended() {
    the_answer_waits_for_the_aborted_write(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_of_a_task_not_running_is_answered_at_once() {
    let (addr, _gated, _reg) = rig().await;
    let mut s = login(&addr).await;
    tmf(2, 1, 0, 99).write(&mut s, false, false).await.unwrap();
    let p = read_pdu(&mut s, Duration::from_secs(5)).await.expect("an answer");
    assert_eq!(
        (p.opcode() & 0x3F, p.itt(), p.bhs[2]),
        (0x22, 2, 1),
        "TASK DOES NOT EXIST"
    );
}

/// A LUN RESET from one nexus is answered only once the commands another nexus had running on
/// the logical unit have ended: a cluster node that takes a disk over resets it so that no
/// write of the node it fences can land after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_reset_is_answered_once_other_nexuses_commands_have_ended() {
    let (addr, gated, _reg) = rig().await;
    let mut a = login_port(&addr, 1).await;
    let mut b = login_port(&addr, 2).await;
    command(1, 0, &write10(8, 8), true, 4096, vec![0xA5u8; 4096])
        .write(&mut a, false, false)
        .await
        .unwrap();
    until_a_write_waits(&gated).await;
    tmf(7, 5, 0, 0).write(&mut b, false, false).await.unwrap();
    assert!(
        read_pdu(&mut b, Duration::from_millis(500)).await.is_none(),
        "the reset was answered while another nexus's write to the unit still ran"
    );
    gated.open();
    let p = read_pdu(&mut b, Duration::from_secs(5))
        .await
        .expect("the reset is answered once the write ended");
    assert!(gated.passed() > 0, "answered before the write landed");
    assert_eq!(
        (p.opcode() & 0x3F, p.itt(), p.bhs[2]),
        (0x22, 7, 0),
        "FUNCTION COMPLETE"
    );
    // The other nexus's write is answered, as the unit ran it.
    let p = read_pdu(&mut a, Duration::from_secs(5))
        .await
        .expect("the write is answered");
    assert_eq!((p.opcode() & 0x3F, p.itt()), (0x21, 1));
}

/// ABORT TASK SET, CLEAR TASK SET and LUN RESET end the commands of their logical unit: a
/// write to another one, waiting for its solicited data, goes on and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_for_one_lun_leaves_the_writes_waiting_for_data_on_another() {
    let (addr, _gated, _reg) = rig().await;
    let mut s = login(&addr).await;
    for (i, function) in (0u32..).zip([2u8, 4, 5]) {
        let itt = 10 * (i + 1);
        // Half its data immediate, the rest solicited (InitialR2T).
        command(itt, 1, &write10(0, 16), true, 8192, vec![0x3C; 4096])
            .write(&mut s, false, false)
            .await
            .unwrap();
        let p = read_pdu(&mut s, Duration::from_secs(5)).await.expect("an R2T");
        let (ttt, offset, len) = r2t(&p);
        assert_eq!((offset, len), (4096, 4096));
        tmf(itt + 1, function, 0, 0).write(&mut s, false, false).await.unwrap();
        let p = read_pdu(&mut s, Duration::from_secs(5))
            .await
            .expect("the function's answer");
        assert_eq!(
            (p.opcode() & 0x3F, p.itt(), p.bhs[2]),
            (0x22, itt + 1, 0),
            "function {function}"
        );
        data_out(itt, 1, ttt, 0, 4096, vec![0x3D; 4096], true)
            .write(&mut s, false, false)
            .await
            .unwrap();
        let p = read_pdu(&mut s, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("function {function} dropped the other LUN's write"));
        assert_eq!(
            (p.opcode() & 0x3F, p.itt(), p.bhs[3]),
            (0x21, itt, 0),
            "function {function}: GOOD"
        );
    }
}

/// A command under the tag of a task in progress (waiting for data, or running) is rejected:
/// taking its place, it would leave the first never answered, and an ABORT TASK of the tag
/// answered before the first ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_under_the_tag_of_a_task_in_progress_is_rejected() {
    let (addr, gated, _reg) = rig().await;
    let mut s = login(&addr).await;
    let tur = [0u8; 6];
    let rejected = |p: Option<Pdu>, what: &str| {
        let p = p.unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(
            (p.opcode() & 0x3F, p.bhs[2]),
            (0x3F, 0x07),
            "{what}: Reject, task in progress"
        );
    };
    // Waiting for its solicited data.
    command(7, 1, &write10(0, 16), true, 8192, vec![0x3C; 4096])
        .write(&mut s, false, false)
        .await
        .unwrap();
    let (ttt, _, _) = r2t(&read_pdu(&mut s, Duration::from_secs(5)).await.expect("an R2T"));
    command(7, 1, &tur, false, 0, vec![])
        .write(&mut s, false, false)
        .await
        .unwrap();
    rejected(read_pdu(&mut s, Duration::from_secs(5)).await, "waiting for data");
    let mut p = data_out(7, 1, ttt, 0, 4096, vec![0x3D; 4096], true);
    p.write(&mut s, false, false).await.unwrap();
    let p = read_pdu(&mut s, Duration::from_secs(5))
        .await
        .expect("the write's answer");
    assert_eq!(
        (p.opcode() & 0x3F, p.itt(), p.bhs[3]),
        (0x21, 7, 0),
        "the first write, GOOD"
    );
    // Running, at the gate.
    command(8, 0, &write10(8, 8), true, 4096, vec![0xA5; 4096])
        .write(&mut s, false, false)
        .await
        .unwrap();
    until_a_write_waits(&gated).await;
    command(8, 1, &tur, false, 0, vec![])
        .write(&mut s, false, false)
        .await
        .unwrap();
    rejected(read_pdu(&mut s, Duration::from_secs(5)).await, "running");
    gated.open();
    let p = read_pdu(&mut s, Duration::from_secs(5))
        .await
        .expect("the write's answer");
    assert_eq!(
        (p.opcode() & 0x3F, p.itt(), p.bhs[3]),
        (0x21, 8, 0),
        "the running write, GOOD"
    );
    // Once answered, the tag is free again.
    command(8, 1, &tur, false, 0, vec![])
        .write(&mut s, false, false)
        .await
        .unwrap();
    let p = read_pdu(&mut s, Duration::from_secs(5)).await.expect("an answer");
    assert_eq!((p.opcode() & 0x3F, p.itt(), p.bhs[3]), (0x21, 8, 0));
}

/// While a gap in CmdSN holds ExpCmdSN, the commands received past it still running do not
/// lower MaxCmdSN below what the initiator was told: it keeps the highest it heard (RFC 7143
/// 4.2.2.1) and may send up to it, and such a command is run, not dropped as outside the
/// window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_cmd_sn_does_not_shrink_the_window_the_initiator_was_told() {
    let (addr, gated, _reg) = rig().await;
    let mut s = login(&addr).await;
    let sn_at = |p: &Pdu, at: usize| u32::from_be_bytes(p.bhs[at..at + 4].try_into().unwrap());
    // TEST UNIT READY to LUN 1, immediate: ExpCmdSN and MaxCmdSN as told.
    command(1, 1, &[0; 6], false, 0, vec![])
        .write(&mut s, false, false)
        .await
        .unwrap();
    let p = read_pdu(&mut s, Duration::from_secs(5)).await.expect("an answer");
    let (exp, max) = (sn_at(&p, 28), sn_at(&p, 32));
    // A write past a gap at `exp`, left running at the gate.
    let mut w = command(2, 0, &write10(8, 8), true, 4096, vec![0x5Au8; 4096]);
    w.bhs[0] = 0x01;
    w.set(24, exp.wrapping_add(1));
    w.write(&mut s, false, false).await.unwrap();
    until_a_write_waits(&gated).await;
    // The last CmdSN the initiator was told it may send.
    let mut last = command(3, 1, &[0; 6], false, 0, vec![]);
    last.bhs[0] = 0x01;
    last.set(24, max);
    last.write(&mut s, false, false).await.unwrap();
    let p = read_pdu(&mut s, Duration::from_secs(2))
        .await
        .expect("a command inside the window told was dropped");
    assert_eq!((p.opcode() & 0x3F, p.itt()), (0x21, 3));
    assert!(
        sn_at(&p, 32).wrapping_sub(max) < 1 << 31,
        "MaxCmdSN went down from {max} to {}",
        sn_at(&p, 32)
    );
    gated.open();
    let p = read_pdu(&mut s, Duration::from_secs(5))
        .await
        .expect("the write's answer");
    assert_eq!((p.opcode() & 0x3F, p.itt(), p.bhs[3]), (0x21, 2, 0));
}
