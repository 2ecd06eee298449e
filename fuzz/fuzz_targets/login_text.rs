//! Login text as a hostile initiator sends it before it has authenticated: pieces with and
//! without the C bit, of any bytes, negotiated key by key. Nothing may panic, and what is held
//! waiting for the rest of the text never exceeds the bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_iscsi::limits::MAX_LOGIN_TEXT;
use tessera_iscsi::params::Params;
use tessera_iscsi::text::Accumulator;

fuzz_target!(|data: &[u8]| {
    let mut acc = Accumulator::new(MAX_LOGIN_TEXT);
    let mut params = Params::default();
    let mut rest = data;
    // Each piece: a length byte (scaled, so that pieces can pass the bound), a flags byte,
    // then that many bytes of text.
    while rest.len() >= 2 {
        let (len, flags) = (rest[0] as usize * 512, rest[1]);
        rest = &rest[2..];
        let piece = &rest[..len.min(rest.len())];
        rest = &rest[piece.len()..];
        let piece: Vec<u8> = if flags & 2 != 0 {
            // Repeat a short piece to reach large sizes cheaply.
            piece.iter().copied().cycle().take(len).collect()
        } else {
            piece.to_vec()
        };
        match acc.push(&piece, flags & 1 != 0) {
            Ok(Some(pairs)) => {
                for (k, v) in &pairs {
                    let _ = params.negotiate(k, v);
                }
            }
            Ok(None) => {}
            Err(_) => return,
        }
        assert!(acc.held() <= MAX_LOGIN_TEXT, "held {} bytes", acc.held());
    }
});
