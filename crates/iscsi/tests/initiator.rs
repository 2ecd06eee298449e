//! The initiator against a target that breaks the protocol: what it receives is checked
//! against what it asked for, and a command answered wrongly fails alone, with a clear error.

use tessera_iscsi::initiator::{InitiatorError, LoginConfig, Session};
use tessera_iscsi::pdu::{at, op, Pdu};
use tessera_iscsi::text;
use tokio::net::TcpListener;

/// A target that logs any initiator in (no authentication, one exchange per stage), then
/// answers every SCSI command with one Data-In of `answer` bytes at offset `offset`, with
/// status.
async fn scripted_target(offset: u32, answer: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        let (mut r, mut w) = sock.into_split();
        let mut stat_sn = 1u32;
        loop {
            let Ok(req) = Pdu::read(&mut r, false, false, 1 << 20).await else {
                return;
            };
            let mut resp = match req.opcode() {
                op::LOGIN_REQ => {
                    let mut p = Pdu::new(op::LOGIN_RESP);
                    // The stages the initiator asks for, granted as asked.
                    p.bhs[1] = req.bhs[1] & 0x8F;
                    p.bhs[8..14].copy_from_slice(&req.bhs[8..14]);
                    if req.bhs[1] & 0x83 == 0x83 {
                        p.bhs[14..16].copy_from_slice(&7u16.to_be_bytes());
                    }
                    let csg = (req.bhs[1] >> 2) & 3;
                    let keys: Vec<(String, String)> = if csg == 0 {
                        vec![("AuthMethod".into(), "None".into())]
                    } else {
                        vec![
                            ("HeaderDigest".into(), "None".into()),
                            ("DataDigest".into(), "None".into()),
                            ("MaxRecvDataSegmentLength".into(), "262144".into()),
                        ]
                    };
                    p.data = text::encode(&keys);
                    p
                }
                op::SCSI_CMD => {
                    let mut p = Pdu::new(op::DATA_IN);
                    // Final, with status (GOOD).
                    p.bhs[1] = 0x81;
                    p.set(at::BUFFER_OFFSET, offset);
                    p.data = vec![0x5A; answer];
                    p
                }
                _ => return,
            };
            resp.set(at::ITT, req.itt());
            resp.set(at::STAT_SN, stat_sn);
            resp.set(at::EXP_CMD_SN, 1);
            resp.set(at::MAX_CMD_SN, 64);
            stat_sn += 1;
            if resp.write(&mut w, false, false).await.is_err() {
                return;
            }
        }
    });
    addr
}

fn read10(blocks: u16) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = 0x28;
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

async fn session(addr: &str) -> Session {
    let cfg = LoginConfig::new("iqn.2026-11.io.example:host", Some("iqn.2026-11.io.example:scripted"));
    Session::login(addr, &cfg).await.expect("login to the scripted target")
}

#[tokio::test]
async fn a_data_in_past_what_the_command_reads_fails_the_command() {
    // One block asked for; the target sends two, or one at an offset past it.
    for (offset, answer) in [(0u32, 1024usize), (512, 512), (u32::MAX - 100, 512)] {
        let addr = scripted_target(offset, answer).await;
        let s = session(&addr).await;
        match s.command(0, &read10(1), Vec::new(), 512).await {
            Err(InitiatorError::Protocol(why)) => assert!(why.contains("Data-In"), "{why}"),
            Ok(r) => panic!("accepted {} bytes for a read of 512 (offset {offset})", r.data.len()),
            Err(e) => panic!("failed otherwise: {e}"),
        }
    }
}

#[tokio::test]
async fn a_data_in_that_is_the_whole_answer_is_the_data() {
    let addr = scripted_target(0, 512).await;
    let s = session(&addr).await;
    let r = s.command(0, &read10(1), Vec::new(), 512).await.expect("the read");
    assert_eq!(r.status, 0);
    assert_eq!(r.data, vec![0x5A; 512]);
}
