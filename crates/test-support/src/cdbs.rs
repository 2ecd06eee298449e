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

/// A block device range descriptor list (SBC-4 5.5): (LBA, blocks) each.
pub fn block_ranges(list: &[(u64, u32)]) -> Vec<u8> {
    let mut b = Vec::new();
    for &(lba, n) in list {
        b.extend_from_slice(&lba.to_be_bytes());
        b.extend_from_slice(&n.to_be_bytes());
        b.extend_from_slice(&[0; 4]);
    }
    b
}

/// THIRD-PARTY COPY OUT with service action `sa`, list identifier `list_id`, for a
/// parameter list of `len` bytes.
pub fn tpc_out(sa: u8, list_id: u32, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[1] = sa;
    c[6..10].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

/// POPULATE TOKEN of the ranges `list`, with inactivity timeout `timeout` (seconds).
pub fn populate_token(list_id: u32, timeout: u32, list: &[(u64, u32)]) -> (Vec<u8>, Vec<u8>) {
    let r = block_ranges(list);
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&((14 + r.len()) as u16).to_be_bytes());
    p[4..8].copy_from_slice(&timeout.to_be_bytes());
    p[14..16].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend_from_slice(&r);
    (tpc_out(0x10, list_id, p.len()), p)
}

/// WRITE USING TOKEN's parameter list: `token` from byte `offset` of what it represents,
/// to the ranges `list`; `delete` ends the token once used.
pub fn write_using_token_params(token: &[u8], offset: u64, delete: bool, list: &[(u64, u32)]) -> Vec<u8> {
    let r = block_ranges(list);
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&((534 + r.len()) as u16).to_be_bytes());
    p[2] = if delete { 0x02 } else { 0 };
    p[8..16].copy_from_slice(&offset.to_be_bytes());
    p[16..16 + token.len().min(512)].copy_from_slice(&token[..token.len().min(512)]);
    p[534..536].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend_from_slice(&r);
    p
}

/// WRITE USING TOKEN (see [`write_using_token_params`]).
pub fn write_using_token(
    list_id: u32,
    token: &[u8],
    offset: u64,
    delete: bool,
    list: &[(u64, u32)],
) -> (Vec<u8>, Vec<u8>) {
    let p = write_using_token_params(token, offset, delete, list);
    (tpc_out(0x11, list_id, p.len()), p)
}

/// RECEIVE ROD TOKEN INFORMATION of the operation `list_id`, up to 4 KiB of it.
pub fn receive_rod_token_information(list_id: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&4096u32.to_be_bytes());
    c
}

/// The ROD token in RECEIVE ROD TOKEN INFORMATION's answer to a POPULATE TOKEN that
/// completed without errors; panics on any other answer.
pub fn token_of(info: &[u8]) -> Vec<u8> {
    assert_eq!(info[4] & 0x1F, 0x10, "answers POPULATE TOKEN");
    assert_eq!(info[5], 0x01, "completed without errors");
    let at = 32 + info[13] as usize;
    let tlen = u32::from_be_bytes(info[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(tlen, 514);
    let t = info[at + 6..at + 6 + 512].to_vec();
    assert_eq!(u32::from_be_bytes(t[0..4].try_into().unwrap()), 0x0080_0000);
    t
}
