//! Bytes from an initiator: PDUs (with or without digests), their text segments, and the
//! operational keys negotiated from them. Nothing may panic, and a PDU that parses must
//! survive a round trip through the encoder.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tessera_iscsi::params::Params;
use tessera_iscsi::pdu::Pdu;
use tessera_iscsi::{auth, text};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let (hd, dd) = (flags & 1 != 0, flags & 2 != 0);
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let rt = RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap());
    let mut params = Params::default();
    // Several PDUs back to back, as a connection delivers them.
    for _ in 0..8 {
        let before = rest;
        let Ok(mut p) = rt.block_on(Pdu::read(&mut rest, hd, dd, 8192)) else {
            break;
        };
        let bytes = p.encode(hd, dd);
        assert_eq!(
            bytes.len(),
            before.len() - rest.len(),
            "the encoding has the length read"
        );
        let mut again = &bytes[..];
        let q = rt
            .block_on(Pdu::read(&mut again, hd, dd, 8192))
            .expect("what we encode parses");
        assert_eq!((q.bhs, &q.ahs, &q.data), (p.bhs, &p.ahs, &p.data));
        if let Ok(pairs) = text::parse(&p.data) {
            for (k, v) in &pairs {
                let _ = params.negotiate(k, v);
                let _ = auth::decode_binary(v);
            }
            let _ = text::parse(&text::encode(&pairs));
        }
    }
    params.finish();
});
