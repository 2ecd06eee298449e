//! The data a command returns to the initiator.

use std::fmt;
use std::ops::Deref;

use tessera_disk::AlignedBuf;

/// Data-In of a command: bytes the command built, or blocks read from the vdisk.
///
/// Blocks come in a buffer aligned for direct I/O, so that the disk reads straight into it and
/// the transport sends straight from it. An unaligned buffer costs a file disk a second,
/// aligned buffer, its zeroing and a copy on every READ.
#[derive(Clone)]
pub enum Data {
    Bytes(Vec<u8>),
    Blocks(AlignedBuf),
}

impl Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Bytes(b) => b,
            Data::Blocks(b) => b,
        }
    }
}

impl Default for Data {
    fn default() -> Data {
        Data::Bytes(Vec::new())
    }
}

impl From<Vec<u8>> for Data {
    fn from(b: Vec<u8>) -> Data {
        Data::Bytes(b)
    }
}

impl From<AlignedBuf> for Data {
    fn from(b: AlignedBuf) -> Data {
        Data::Blocks(b)
    }
}

/// Equal when the bytes are, whichever buffer holds them.
impl PartialEq for Data {
    fn eq(&self, other: &Data) -> bool {
        **self == **other
    }
}

impl Eq for Data {}

impl fmt::Debug for Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Data::Bytes(b) => f.debug_tuple("Bytes").field(b).finish(),
            // Blocks can be megabytes.
            Data::Blocks(b) => f.debug_tuple("Blocks").field(&b.len()).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_by_bytes_whatever_the_buffer() {
        let bytes = Data::from(vec![1u8, 2, 3]);
        let blocks = Data::from(AlignedBuf::from_slice(&[1, 2, 3]));
        assert_eq!(bytes, blocks);
        assert_ne!(bytes, Data::from(vec![1u8, 2]));
        assert_eq!(&blocks[..], &[1, 2, 3]);
        assert!(Data::default().is_empty());
        assert_eq!(format!("{blocks:?}"), "Blocks(3)");
    }
}
