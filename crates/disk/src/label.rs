//! The on-disk label: one [`LABEL_SIZE`]-byte block at offset 0 that names the pool a disk
//! belongs to and the disk's identity within it.
//!
//! Layout (version 1, all integers little endian):
//!
//! | offset | size | field                                                   |
//! |-------:|-----:|---------------------------------------------------------|
//! |      0 |   16 | magic `b"TESSERA-DISKLBL\0"`                            |
//! |     16 |    4 | format version (1)                                      |
//! |     20 |    4 | header length: bytes in use from offset 0 (154)         |
//! |     24 |   16 | pool id (UUID bytes)                                    |
//! |     40 |   16 | disk id (UUID bytes)                                    |
//! |     56 |    4 | position of the disk in the pool                        |
//! |     60 |    8 | generation, bumped at import, export and clean stop     |
//! |     68 |    8 | disk size in bytes when labelled                        |
//! |     76 |    8 | slab size in bytes (power of two, at least 1 MiB)       |
//! |     84 |    4 | flags: bit 0 = pool cleanly exported, bit 1 = members   |
//! |        |      | stale until resynced; others must be 0                  |
//! |     88 |    2 | pool name length (at most 64)                           |
//! |     90 |   64 | pool name, UTF-8, zero padded                           |
//! |    154 | 3938 | zero                                                    |
//! |   4092 |    4 | crc32c of bytes [0, 4092)                               |
//!
//! A block without the magic is treated as blank or belonging to something else (Missing);
//! a block with the magic but a bad checksum or impossible fields is Corrupt, and is never
//! overwritten, so that a damaged label can still be examined and repaired by hand.

use uuid::Uuid;

use crate::{AlignedBuf, BlockDevice, DiskError, LABEL_SIZE};

/// The label format this build reads and writes.
pub const LABEL_VERSION: u32 = 1;
/// Longest pool name a label can hold, in bytes.
pub const MAX_POOL_NAME: usize = 64;

const MAGIC: &[u8; 16] = b"TESSERA-DISKLBL\0";
const HEADER_LEN: usize = 154;
const CRC_AT: usize = LABEL_SIZE - 4;
const FLAG_EXPORTED: u32 = 1;
/// Some member of the pool missed writes while its disk was away and is not resynced yet:
/// only the slab sets' records say which, and a daemon that does not know them would read
/// those members as current. Such a daemon finds an unknown flag and refuses the label.
const FLAG_RESYNC_PENDING: u32 = 2;
const MIN_SLAB_SIZE: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub pool_id: Uuid,
    /// At most [`MAX_POOL_NAME`] bytes of UTF-8.
    pub pool_name: String,
    pub disk_id: Uuid,
    /// The disk's index in the pool.
    pub position: u32,
    /// Bumped at every import, export and clean stop (a flag changed meanwhile keeps it).
    pub generation: u64,
    /// Bytes, as seen when labelled.
    pub disk_size: u64,
    pub slab_size: u64,
    /// The pool was cleanly exported.
    pub exported: bool,
    /// Members of the pool are stale until resynced (see `FLAG_RESYNC_PENDING`).
    pub resync_pending: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    #[error("{path}: no Tessera label (blank or foreign disk)")]
    Missing { path: String },
    #[error("{path}: Tessera label is corrupt ({reason}); refusing to use or overwrite it")]
    Corrupt { path: String, reason: String },
    #[error("{path}: Tessera label format version {found} is not supported (this build reads version {supported})")]
    Version { path: String, found: u32, supported: u32 },
    #[error("{path}: disk belongs to pool '{found_name}' ({found}), not to pool {expected}")]
    ForeignPool {
        path: String,
        found: Uuid,
        found_name: String,
        expected: Uuid,
    },
    #[error("{path}: disk id is {found}, expected {expected} (the path now points at a different disk of this pool)")]
    WrongDisk { path: String, found: Uuid, expected: Uuid },
    #[error(
        "{path}: already carries a label of pool '{pool_name}' ({pool_id}); wipe it first if the disk is really free"
    )]
    InUse {
        path: String,
        pool_id: Uuid,
        pool_name: String,
    },
    #[error(transparent)]
    Disk(Box<DiskError>),
}

impl LabelError {
    /// The path of the disk the error is about.
    pub fn path(&self) -> &str {
        match self {
            LabelError::Missing { path }
            | LabelError::Corrupt { path, .. }
            | LabelError::Version { path, .. }
            | LabelError::ForeignPool { path, .. }
            | LabelError::WrongDisk { path, .. }
            | LabelError::InUse { path, .. } => path,
            LabelError::Disk(e) => e.path(),
        }
    }
}

impl From<DiskError> for LabelError {
    fn from(e: DiskError) -> LabelError {
        match e {
            // Do not nest a label error inside a disk error inside a label error.
            DiskError::Label(inner) => inner,
            other => LabelError::Disk(Box::new(other)),
        }
    }
}

impl Label {
    /// The label as one [`LABEL_SIZE`]-byte block.
    ///
    /// Panics if `pool_name` is longer than [`MAX_POOL_NAME`] bytes; pool names are
    /// validated long before a label is written.
    pub fn encode(&self) -> AlignedBuf {
        let name = self.pool_name.as_bytes();
        assert!(
            name.len() <= MAX_POOL_NAME,
            "pool name '{}' is {} bytes, a label holds at most {MAX_POOL_NAME}",
            self.pool_name,
            name.len()
        );
        let mut b = AlignedBuf::zeroed(LABEL_SIZE);
        b[0..16].copy_from_slice(MAGIC);
        b[16..20].copy_from_slice(&LABEL_VERSION.to_le_bytes());
        b[20..24].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[24..40].copy_from_slice(self.pool_id.as_bytes());
        b[40..56].copy_from_slice(self.disk_id.as_bytes());
        b[56..60].copy_from_slice(&self.position.to_le_bytes());
        b[60..68].copy_from_slice(&self.generation.to_le_bytes());
        b[68..76].copy_from_slice(&self.disk_size.to_le_bytes());
        b[76..84].copy_from_slice(&self.slab_size.to_le_bytes());
        let flags =
            if self.exported { FLAG_EXPORTED } else { 0 } | if self.resync_pending { FLAG_RESYNC_PENDING } else { 0 };
        b[84..88].copy_from_slice(&flags.to_le_bytes());
        b[88..90].copy_from_slice(&(name.len() as u16).to_le_bytes());
        b[90..90 + name.len()].copy_from_slice(name);
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses a label block read from the disk at `path` (used in error messages).
    pub fn decode(path: &str, buf: &[u8]) -> Result<Label, LabelError> {
        let corrupt = |reason: String| LabelError::Corrupt {
            path: path.to_string(),
            reason,
        };
        if buf.len() < LABEL_SIZE || buf[..MAGIC.len()] != MAGIC[..] {
            // Blank, or written by something else: not ours to judge.
            return Err(LabelError::Missing { path: path.to_string() });
        }
        let u16_at = |at: usize| u16::from_le_bytes(buf[at..at + 2].try_into().unwrap());
        let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().unwrap());
        let uuid_at = |at: usize| Uuid::from_bytes(buf[at..at + 16].try_into().unwrap());

        // Another version may lay out everything after the version field differently,
        // checksum included, so the version is judged first.
        let version = u32_at(16);
        if version != LABEL_VERSION {
            return Err(LabelError::Version {
                path: path.to_string(),
                found: version,
                supported: LABEL_VERSION,
            });
        }
        let stored = u32_at(CRC_AT);
        let computed = crc32c::crc32c(&buf[..CRC_AT]);
        if stored != computed {
            return Err(corrupt(format!(
                "checksum {stored:#010x} does not match contents {computed:#010x}"
            )));
        }
        let header_len = u32_at(20) as usize;
        if !(HEADER_LEN..=CRC_AT).contains(&header_len) {
            return Err(corrupt(format!(
                "header length {header_len} is outside {HEADER_LEN}..={CRC_AT}"
            )));
        }
        let flags = u32_at(84);
        if flags & !(FLAG_EXPORTED | FLAG_RESYNC_PENDING) != 0 {
            return Err(corrupt(format!(
                "unknown flag bits {flags:#x} (a newer release of Tessera may have written them)"
            )));
        }
        let name_len = u16_at(88) as usize;
        if name_len > MAX_POOL_NAME {
            return Err(corrupt(format!("pool name length {name_len} exceeds {MAX_POOL_NAME}")));
        }
        let pool_name = std::str::from_utf8(&buf[90..90 + name_len])
            .map_err(|_| corrupt("pool name is not valid UTF-8".to_string()))?
            .to_string();
        let slab_size = u64_at(76);
        if slab_size < MIN_SLAB_SIZE || !slab_size.is_power_of_two() {
            return Err(corrupt(format!(
                "slab size {slab_size} is not a power of two of at least {MIN_SLAB_SIZE}"
            )));
        }
        Ok(Label {
            pool_id: uuid_at(24),
            pool_name,
            disk_id: uuid_at(40),
            position: u32_at(56),
            generation: u64_at(60),
            disk_size: u64_at(68),
            slab_size,
            exported: flags & FLAG_EXPORTED != 0,
            resync_pending: flags & FLAG_RESYNC_PENDING != 0,
        })
    }
}

/// Reads and validates the label. Blank (no magic) -> Missing; bad checksum or impossible
/// fields after the magic -> Corrupt.
pub fn read_label(dev: &dyn BlockDevice) -> Result<Label, LabelError> {
    let mut buf = AlignedBuf::zeroed(LABEL_SIZE);
    dev.read_at(&mut buf, 0)?;
    Label::decode(dev.path(), &buf)
}

/// Writes a new label on a disk that must be blank (Missing). A valid label of any pool ->
/// InUse; a corrupt or unsupported one -> that error. Never overwrites either. Flushes.
pub fn write_new_label(dev: &dyn BlockDevice, label: &Label) -> Result<(), LabelError> {
    match read_label(dev) {
        Err(LabelError::Missing { .. }) => write_and_check(dev, label),
        Ok(found) => Err(LabelError::InUse {
            path: dev.path().to_string(),
            pool_id: found.pool_id,
            pool_name: found.pool_name,
        }),
        Err(e) => Err(e),
    }
}

/// Rewrites the label of a disk that already carries a valid label of the same pool and
/// disk id (generation bumps, export flag). Flushes.
pub fn rewrite_label(dev: &dyn BlockDevice, label: &Label) -> Result<(), LabelError> {
    verify_label(dev, label.pool_id, label.disk_id)?;
    write_and_check(dev, label)
}

/// Reads the label and checks that it belongs to (`pool_id`, `disk_id`).
pub fn verify_label(dev: &dyn BlockDevice, pool_id: Uuid, disk_id: Uuid) -> Result<Label, LabelError> {
    let found = check_pool(dev, pool_id)?;
    if found.disk_id != disk_id {
        return Err(LabelError::WrongDisk {
            path: dev.path().to_string(),
            found: found.disk_id,
            expected: disk_id,
        });
    }
    Ok(found)
}

/// Zeroes the label block (pool destroy), only if it is a valid label of `pool_id`. Flushes.
pub fn wipe_label(dev: &dyn BlockDevice, pool_id: Uuid) -> Result<(), LabelError> {
    check_pool(dev, pool_id)?;
    dev.write_at(&AlignedBuf::zeroed(LABEL_SIZE), 0)?;
    dev.flush()?;
    Ok(())
}

fn check_pool(dev: &dyn BlockDevice, pool_id: Uuid) -> Result<Label, LabelError> {
    let found = read_label(dev)?;
    if found.pool_id != pool_id {
        return Err(LabelError::ForeignPool {
            path: dev.path().to_string(),
            found: found.pool_id,
            found_name: found.pool_name,
            expected: pool_id,
        });
    }
    Ok(found)
}

/// Writes the label, flushes, and reads it back: a label that does not survive the round
/// trip must not be trusted to identify the disk later.
fn write_and_check(dev: &dyn BlockDevice, label: &Label) -> Result<(), LabelError> {
    dev.write_at(&label.encode(), 0)?;
    dev.flush()?;
    let back = read_label(dev)?;
    if back != *label {
        return Err(LabelError::Corrupt {
            path: dev.path().to_string(),
            reason: "label read back after writing differs from what was written".to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;

    const MIB: u64 = 1 << 20;

    fn sample() -> Label {
        Label {
            pool_id: Uuid::new_v4(),
            pool_name: "tank-01".to_string(),
            disk_id: Uuid::new_v4(),
            position: 3,
            generation: 42,
            disk_size: 64 * MIB,
            slab_size: 4 * MIB,
            exported: true,
            resync_pending: false,
        }
    }

    fn disk() -> MemDisk {
        MemDisk::new("mem0", 64 * MIB)
    }

    fn raw_block(d: &MemDisk) -> Vec<u8> {
        let mut b = vec![0u8; LABEL_SIZE];
        d.read_at(&mut b, 0).unwrap();
        b
    }

    /// Re-seals a hand-edited block so that only the edited field is wrong.
    fn reseal(b: &mut [u8]) {
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn encode_decode_round_trip() {
        let l = sample();
        let b = l.encode();
        assert_eq!(b.len(), LABEL_SIZE);
        assert_eq!(&b[..16], MAGIC);
        assert_eq!(Label::decode("d", &b).unwrap(), l);

        let mut other = sample();
        other.exported = false;
        other.pool_name = "x".repeat(MAX_POOL_NAME);
        other.generation = u64::MAX;
        assert_eq!(Label::decode("d", &other.encode()).unwrap(), other);

        // Members stale until resynced: bit 1, which a daemon that knows only bit 0 refuses.
        other.resync_pending = true;
        let b = other.encode();
        assert_eq!(u32::from_le_bytes(b[84..88].try_into().unwrap()), 2);
        assert_eq!(Label::decode("d", &b).unwrap(), other);
    }

    #[test]
    fn layout_matches_the_documented_table() {
        let l = sample();
        let b = l.encode();
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 154);
        assert_eq!(&b[24..40], l.pool_id.as_bytes());
        assert_eq!(&b[40..56], l.disk_id.as_bytes());
        assert_eq!(u32::from_le_bytes(b[56..60].try_into().unwrap()), 3);
        assert_eq!(u64::from_le_bytes(b[60..68].try_into().unwrap()), 42);
        assert_eq!(u64::from_le_bytes(b[68..76].try_into().unwrap()), 64 * MIB);
        assert_eq!(u64::from_le_bytes(b[76..84].try_into().unwrap()), 4 * MIB);
        assert_eq!(u32::from_le_bytes(b[84..88].try_into().unwrap()), 1);
        assert_eq!(u16::from_le_bytes(b[88..90].try_into().unwrap()), 7);
        assert_eq!(&b[90..97], b"tank-01");
        assert!(b[97..CRC_AT].iter().all(|&x| x == 0));
        assert_eq!(
            u32::from_le_bytes(b[CRC_AT..].try_into().unwrap()),
            crc32c::crc32c(&b[..CRC_AT])
        );
    }

    #[test]
    fn blank_and_foreign_blocks_are_missing() {
        assert!(matches!(
            Label::decode("d", &[0u8; LABEL_SIZE]),
            Err(LabelError::Missing { .. })
        ));
        let mut foreign = vec![0u8; LABEL_SIZE];
        foreign[..8].copy_from_slice(b"LABELONE");
        assert!(matches!(Label::decode("d", &foreign), Err(LabelError::Missing { .. })));
        assert!(matches!(read_label(&disk()), Err(LabelError::Missing { path }) if path == "mem0"));
    }

    #[test]
    fn any_flipped_bit_is_corrupt() {
        let good = sample().encode();
        // Every byte after the magic and version, including the checksum itself.
        for at in [20, 24, 57, 70, 89, 95, 2000, CRC_AT - 1, CRC_AT, LABEL_SIZE - 1] {
            let mut b = good.to_vec();
            b[at] ^= 0x10;
            match Label::decode("d", &b) {
                Err(LabelError::Corrupt { reason, .. }) => {
                    assert!(reason.contains("checksum"), "{reason}")
                }
                other => panic!("byte {at}: expected Corrupt, got {other:?}"),
            }
        }
    }

    #[test]
    fn unsupported_version() {
        let mut b = sample().encode().to_vec();
        b[16..20].copy_from_slice(&2u32.to_le_bytes());
        reseal(&mut b);
        match Label::decode("d", &b) {
            Err(LabelError::Version {
                found: 2, supported: 1, ..
            }) => {}
            other => panic!("expected Version, got {other:?}"),
        }
    }

    #[test]
    fn impossible_fields_are_corrupt_even_with_a_good_checksum() {
        type Edit = Box<dyn Fn(&mut [u8])>;
        let edits: Vec<(&str, Edit)> = vec![
            (
                "name length",
                Box::new(|b| b[88..90].copy_from_slice(&65u16.to_le_bytes())),
            ),
            ("UTF-8", Box::new(|b| b[90] = 0xFF)),
            (
                "slab size",
                Box::new(|b| b[76..84].copy_from_slice(&(3 * MIB).to_le_bytes())),
            ),
            (
                "slab size",
                Box::new(|b| b[76..84].copy_from_slice(&(MIB / 2).to_le_bytes())),
            ),
            ("flag", Box::new(|b| b[84..88].copy_from_slice(&0x5u32.to_le_bytes()))),
            (
                "header length",
                Box::new(|b| b[20..24].copy_from_slice(&10u32.to_le_bytes())),
            ),
        ];
        for (what, edit) in edits {
            let mut b = sample().encode().to_vec();
            edit(&mut b);
            reseal(&mut b);
            match Label::decode("d", &b) {
                Err(LabelError::Corrupt { reason, .. }) => {
                    assert!(reason.contains(what), "{what}: {reason}")
                }
                other => panic!("{what}: expected Corrupt, got {other:?}"),
            }
        }
    }

    #[test]
    #[should_panic(expected = "at most 64")]
    fn encode_refuses_overlong_name() {
        let mut l = sample();
        l.pool_name = "y".repeat(65);
        l.encode();
    }

    #[test]
    fn write_new_label_on_blank_disk_flushes_and_reads_back() {
        let d = disk();
        let l = sample();
        write_new_label(&d, &l).unwrap();
        assert_eq!(d.flush_count(), 1);
        assert_eq!(read_label(&d).unwrap(), l);
        // Nothing beyond the label block was touched.
        let mut next = vec![1u8; 4096];
        d.read_at(&mut next, LABEL_SIZE as u64).unwrap();
        assert!(next.iter().all(|&b| b == 0));
    }

    #[test]
    fn write_new_label_refuses_a_valid_label() {
        let d = disk();
        let first = sample();
        write_new_label(&d, &first).unwrap();
        let before = raw_block(&d);
        match write_new_label(&d, &sample()) {
            Err(LabelError::InUse { pool_id, pool_name, .. }) => {
                assert_eq!((pool_id, pool_name.as_str()), (first.pool_id, "tank-01"));
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        assert_eq!(raw_block(&d), before);
        // Not even a label of the same pool and disk may be written as new.
        assert!(matches!(write_new_label(&d, &first), Err(LabelError::InUse { .. })));
    }

    #[test]
    fn write_new_label_refuses_a_corrupt_label() {
        let d = disk();
        let mut b = sample().encode();
        b[100] ^= 1;
        d.write_at(&b, 0).unwrap();
        let before = raw_block(&d);
        assert!(matches!(
            write_new_label(&d, &sample()),
            Err(LabelError::Corrupt { .. })
        ));
        assert_eq!(raw_block(&d), before);
        assert_eq!(d.flush_count(), 0);
    }

    #[test]
    fn rewrite_label_updates_own_label_only() {
        let d = disk();
        let mut l = sample();
        write_new_label(&d, &l).unwrap();
        l.generation += 1;
        l.exported = false;
        rewrite_label(&d, &l).unwrap();
        assert_eq!(read_label(&d).unwrap(), l);
        assert_eq!(d.flush_count(), 2);

        let before = raw_block(&d);
        let mut foreign = l.clone();
        foreign.pool_id = Uuid::new_v4();
        assert!(matches!(
            rewrite_label(&d, &foreign),
            Err(LabelError::ForeignPool { .. })
        ));
        let mut other_disk = l.clone();
        other_disk.disk_id = Uuid::new_v4();
        assert!(matches!(
            rewrite_label(&d, &other_disk),
            Err(LabelError::WrongDisk { .. })
        ));
        assert_eq!(raw_block(&d), before);

        assert!(matches!(rewrite_label(&disk(), &l), Err(LabelError::Missing { .. })));
    }

    #[test]
    fn verify_label_checks_pool_then_disk() {
        let d = disk();
        let l = sample();
        write_new_label(&d, &l).unwrap();
        assert_eq!(verify_label(&d, l.pool_id, l.disk_id).unwrap(), l);

        let other_pool = Uuid::new_v4();
        match verify_label(&d, other_pool, l.disk_id) {
            Err(e @ LabelError::ForeignPool { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("'tank-01'") && msg.contains(&other_pool.to_string()),
                    "{msg}"
                );
            }
            other => panic!("expected ForeignPool, got {other:?}"),
        }
        let other_disk = Uuid::new_v4();
        match verify_label(&d, l.pool_id, other_disk) {
            Err(LabelError::WrongDisk { found, expected, .. }) => {
                assert_eq!((found, expected), (l.disk_id, other_disk))
            }
            other => panic!("expected WrongDisk, got {other:?}"),
        }
        assert!(matches!(
            verify_label(&disk(), l.pool_id, l.disk_id),
            Err(LabelError::Missing { .. })
        ));
    }

    #[test]
    fn wipe_label_only_for_its_own_pool() {
        let d = disk();
        let l = sample();
        write_new_label(&d, &l).unwrap();
        let before = raw_block(&d);
        assert!(matches!(
            wipe_label(&d, Uuid::new_v4()),
            Err(LabelError::ForeignPool { .. })
        ));
        assert_eq!(raw_block(&d), before);

        wipe_label(&d, l.pool_id).unwrap();
        assert!(raw_block(&d).iter().all(|&b| b == 0));
        assert!(matches!(read_label(&d), Err(LabelError::Missing { .. })));
        assert!(matches!(wipe_label(&d, l.pool_id), Err(LabelError::Missing { .. })));
        // A wiped disk is blank again and can join a pool.
        write_new_label(&d, &sample()).unwrap();
    }

    #[test]
    fn disk_errors_are_wrapped_once() {
        let tiny = MemDisk::new("tiny", 0);
        match read_label(&tiny) {
            Err(LabelError::Disk(e)) => assert!(matches!(*e, DiskError::OutOfRange { .. })),
            other => panic!("expected Disk error, got {other:?}"),
        }
        let e: LabelError = DiskError::Label(LabelError::Missing { path: "p".into() }).into();
        assert!(matches!(e, LabelError::Missing { .. }));
        assert_eq!(e.path(), "p");
    }
}
