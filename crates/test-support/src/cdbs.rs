//! SCSI commands the front ends' tests send, built one way.

/// PERSISTENT RESERVE OUT with a basic parameter list: service action `sa`, type `kind`,
/// reservation key `key`, service action key `sa_key`, and APTPL.
pub fn pr_out(sa: u8, kind: u8, key: u64, sa_key: u64, aptpl: bool) -> (Vec<u8>, Vec<u8>) {
    let cdb = vec![0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut d = vec![0u8; 24];
    d[0..8].copy_from_slice(&key.to_be_bytes());
    d[8..16].copy_from_slice(&sa_key.to_be_bytes());
    d[20] = aptpl as u8;
    (cdb, d)
}
