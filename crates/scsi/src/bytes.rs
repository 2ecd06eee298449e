//! Big-endian fields of CDBs and parameter lists, and the allocation-length cut every data-in
//! answer gets.

/// Truncates data to the allocation length.
pub(crate) fn alloc(mut data: Vec<u8>, len: usize) -> Vec<u8> {
    data.truncate(len);
    data
}

pub(crate) fn be16(b: &[u8]) -> u64 {
    u16::from_be_bytes([b[0], b[1]]) as u64
}

pub(crate) fn be32(b: &[u8]) -> u64 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64
}

pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}
