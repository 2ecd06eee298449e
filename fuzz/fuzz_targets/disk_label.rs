//! A disk's label block as read from a disk: anything a failing disk, another program or an
//! attacker with the device may have left there. The fuzzer's bytes are laid over a valid
//! label and, when its first byte says so, the checksum is made right again, so that the
//! fields past it are reached. Nothing may panic, and a label that decodes encodes back to
//! itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_disk::{Label, LABEL_SIZE, MAX_POOL_NAME};

fuzz_target!(|data: &[u8]| {
    let Some((&how, over)) = data.split_first() else { return };
    let valid = Label {
        pool_id: uuid::Uuid::from_u128(1),
        pool_name: "tank".into(),
        disk_id: uuid::Uuid::from_u128(2),
        position: 0,
        generation: 1,
        disk_size: 1 << 30,
        slab_size: 1 << 26,
        exported: false,
        resync_pending: false,
    };
    let mut block = valid.encode().to_vec();
    // Laid over at an offset the first byte picks: the magic and version are usually kept.
    let at = (how as usize >> 1) % 128;
    let n = over.len().min(LABEL_SIZE - at);
    block[at..at + n].copy_from_slice(&over[..n]);
    if how & 1 == 1 {
        let crc = crc32c::crc32c(&block[..LABEL_SIZE - 4]);
        block[LABEL_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    // Short blocks too.
    let _ = Label::decode("fuzz", &block[..over.len().min(LABEL_SIZE)]);
    if let Ok(l) = Label::decode("fuzz", &block) {
        assert!(l.pool_name.len() <= MAX_POOL_NAME);
        assert_eq!(Label::decode("fuzz", &l.encode()).unwrap(), l);
    }
});
