//! What a replication peer sends once past the handshake: a stream of frames (header, then a
//! body of the length it states), each body decoded by its kind. A peer holding the key may
//! still be buggy or hostile. Nothing may panic or allocate past the frame bound, and what
//! decodes encodes back to the same meaning.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_replication::wire::{self, Begin, Done, Join, Kind, Ready, Refusal};

fuzz_target!(|data: &[u8]| {
    let mut r = std::io::Cursor::new(data);
    while let Ok(Some(f)) = wire::read_frame(&mut r) {
        assert!(f.body.len() <= wire::MAX_FRAME);
        match f.kind {
            Kind::Offer => {
                if let Ok((batch, grains)) = wire::decode_offer(&f.body) {
                    assert_eq!(wire::encode_offer(batch, &grains), f.body);
                }
            }
            Kind::Want => {
                if let Ok((batch, wanted)) = wire::decode_want(&f.body) {
                    assert_eq!(wire::encode_want(batch, &wanted), f.body);
                }
            }
            Kind::Data => {
                if let Ok((offset, bytes)) = wire::decode_data(&f.body) {
                    assert!(bytes.len() <= wire::MAX_FRAME);
                    let again = wire::decode_data(&wire::encode_data(offset, &bytes)).unwrap();
                    assert_eq!(again, (offset, bytes));
                }
            }
            Kind::Hole => {
                if let Ok((offset, len)) = wire::decode_hole(&f.body) {
                    assert_eq!(wire::encode_hole(offset, len), f.body);
                }
            }
            Kind::Begin => drop(f.json::<Begin>(Kind::Begin)),
            Kind::Join => drop(f.json::<Join>(Kind::Join)),
            Kind::Ready => drop(f.json::<Ready>(Kind::Ready)),
            Kind::Done => drop(f.json::<Done>(Kind::Done)),
            Kind::Error => {
                // A refusal's text is cut to a bound, its control characters escaped, before
                // it is kept or shown.
                if let Err(tessera_replication::ReplError::Refused(m)) = f.expect(Kind::Done) {
                    assert!(m.chars().count() <= 10 * wire::MAX_PEER_TEXT + 1);
                    assert!(!m.chars().any(char::is_control), "{m:?}");
                }
                drop(f.json::<Refusal>(Kind::Error));
            }
            Kind::Commit | Kind::End => {}
        }
    }
});
