//! An initiator at the PDU level, for tests that send what a well-behaved one never would.

#![allow(dead_code)]

use std::time::Duration;

use tessera_iscsi::pdu::Pdu;
use tokio::net::TcpStream;

/// The next PDU, or None if none came `within`.
pub async fn read_pdu(s: &mut TcpStream, within: Duration) -> Option<Pdu> {
    match tokio::time::timeout(within, Pdu::read(s, false, false, 1 << 20)).await {
        Ok(Ok(p)) => Some(p),
        _ => None,
    }
}

/// Logs `host` in to `target` with immediate data, so that a 4 KiB write needs no R2T, from
/// the host's initiator port `port` (the last byte of its ISID; another port is another
/// I_T nexus).
pub async fn login(addr: &str, target: &str, host: &str, port: u8) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let text = format!(
        "InitiatorName={host}\0TargetName={target}\0SessionType=Normal\0ImmediateData=Yes\0\
         MaxRecvDataSegmentLength=262144\0"
    );
    let mut p = Pdu::new(0x43); // immediate | LOGIN_REQ
    p.bhs[1] = 0x87; // T, CSG 1 (operational), NSG 3 (full feature)
    p.bhs[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0x12, port]);
    p.data = text.into_bytes();
    p.write(&mut s, false, false).await.unwrap();
    let r = read_pdu(&mut s, Duration::from_secs(5))
        .await
        .expect("a login response");
    assert_eq!((r.bhs[36], r.bhs[37]), (0, 0), "logged in");
    s
}

/// The R bit of a SCSI Command PDU.
pub const R: u8 = 0x40;
/// The W bit.
pub const W: u8 = 0x20;

/// An immediate SCSI command with `flags` (R, W, both or neither) and `data` as its
/// immediate data.
pub fn command_with(itt: u32, lun: u8, cdb: &[u8], flags: u8, edtl: u32, data: Vec<u8>) -> Pdu {
    let mut p = Pdu::new(0x41); // immediate | SCSI_CMD
    p.bhs[1] = 0x80 | flags | 0x01; // F, simple task
    p.bhs[9] = lun;
    p.set(16, itt).set(20, edtl);
    p.bhs[32..32 + cdb.len()].copy_from_slice(cdb);
    p.data = data;
    p
}

/// An immediate SCSI command that writes (W) or reads (R).
pub fn command(itt: u32, lun: u8, cdb: &[u8], write: bool, edtl: u32, data: Vec<u8>) -> Pdu {
    command_with(itt, lun, cdb, if write { W } else { R }, edtl, data)
}

pub fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x2A, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

/// A Data-Out PDU of task `itt` (`ttt` 0xFFFFFFFF for unsolicited data).
pub fn data_out(itt: u32, lun: u8, ttt: u32, data_sn: u32, offset: u32, data: Vec<u8>, last: bool) -> Pdu {
    let mut p = Pdu::new(0x05);
    p.bhs[1] = if last { 0x80 } else { 0 };
    p.bhs[9] = lun;
    p.set(16, itt).set(20, ttt).set(36, data_sn).set(40, offset);
    p.data = data;
    p
}

/// An R2T's target transfer tag, offset and length.
pub fn r2t(p: &Pdu) -> (u32, u32, u32) {
    assert_eq!(p.opcode() & 0x3F, 0x31, "an R2T");
    let at = |i: usize| u32::from_be_bytes(p.bhs[i..i + 4].try_into().unwrap());
    (at(20), at(40), at(44))
}
