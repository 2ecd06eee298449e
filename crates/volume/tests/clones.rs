//! Whole-vdisk clones: they read as the source did, share every whole grain, diverge on
//! write in both directions, survive a restart, and can be deleted in either order.

mod common;

use common::{pattern, spec, Rig, MIB};
use tessera_volume::{LayoutKind, Provisioning};

#[test]
fn clones_share_diverge_and_delete_in_any_order() {
    let mut rig = Rig::new(4, 64 * MIB, MIB);
    let size = 8 * MIB + 8192; // a partial last grain
    let data = pattern(1, 0, (4 * MIB) as usize);
    {
        let e = rig.engine();
        let mut s = spec("src", size, LayoutKind::Parity, Provisioning::Fixed);
        s.block_size = Some(4096);
        let src = e.create_vdisk(&s).unwrap();
        src.write(MIB, &data, false).unwrap();
        src.write(size - 8192, &[7u8; 8192], false).unwrap();
        let allocated = e.pool().capacity().used_bytes;
        let (c, stats) = e.clone_vdisk("src", "c1").unwrap();
        assert_eq!(stats.shared_bytes + stats.copied_bytes, size);
        assert_eq!(stats.copied_bytes, 8192, "only the partial last grain is copied");
        let cfg = c.config();
        assert_eq!(
            (cfg.size, cfg.block_size, cfg.layout),
            (size, 4096, src.config().layout)
        );
        assert_eq!(cfg.provisioning, Provisioning::Thin);
        // A copy of 8 MiB in parity would take over 10 MiB of slabs; the clone takes at most
        // the slab set its one copied grain lands in.
        let grew = e.pool().capacity().used_bytes - allocated;
        assert!(grew < 8 * MIB, "the clone took {grew} bytes of slabs");
        let mut back = vec![0u8; data.len()];
        c.read(MIB, &mut back).unwrap();
        assert_eq!(back, data);
        // Copy-on-write both ways.
        c.write(MIB, &[1u8; 4096], false).unwrap();
        src.write(2 * MIB, &[2u8; 4096], false).unwrap();
        src.read(MIB, &mut back[..4096]).unwrap();
        assert_eq!(
            &back[..4096],
            &data[..4096],
            "the source does not see the clone's write"
        );
        c.read(2 * MIB, &mut back[..4096]).unwrap();
        assert_eq!(
            &back[..4096],
            &data[MIB as usize..MIB as usize + 4096],
            "nor the clone the source's"
        );
        // A clone of a clone, and clones that cannot be made.
        e.clone_vdisk("c1", "c2").unwrap();
        assert!(e.clone_vdisk("src", "c1").is_err(), "name taken");
        assert!(e.clone_vdisk("nope", "c3").is_err());
        assert!(e.vdisk("c3").is_err(), "nothing left behind");
    }
    rig.assert_consistent();
    rig.reopen();
    let e = rig.engine();
    e.delete_vdisk("src").unwrap();
    let c1 = e.vdisk("c1").unwrap();
    let mut back = vec![0u8; 8192];
    c1.read(size - 8192, &mut back).unwrap();
    assert_eq!(back, vec![7u8; 8192]);
    e.delete_vdisk("c1").unwrap();
    let c2 = e.vdisk("c2").unwrap();
    let mut b = vec![0u8; 4096];
    c2.read(MIB, &mut b).unwrap();
    assert_eq!(b, vec![1u8; 4096], "c2 was made from c1 after its write");
    rig.assert_consistent();
    e.delete_vdisk("c2").unwrap();
    rig.assert_consistent();
}
