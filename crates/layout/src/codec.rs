//! Parity arithmetic. Single parity is XOR; dual parity is a systematic Reed–Solomon code with
//! two recovery shards (reed-solomon-simd), so any two lost members of a row can be rebuilt.
//! Shards are always whole 4 KiB multiples, so a sub-range of a stripe unit encodes to the
//! same sub-range of its parity: partial updates and full encodes agree.

use crate::error::{LayoutError, Result};

pub fn xor_into(acc: &mut [u8], src: &[u8]) {
    debug_assert_eq!(acc.len(), src.len());
    let (a8, a_tail) = acc.split_at_mut(acc.len() / 8 * 8);
    let (s8, s_tail) = src.split_at(src.len() / 8 * 8);
    for (a, s) in a8.chunks_exact_mut(8).zip(s8.chunks_exact(8)) {
        let v = u64::from_ne_bytes(a.try_into().unwrap()) ^ u64::from_ne_bytes(s.try_into().unwrap());
        a.copy_from_slice(&v.to_ne_bytes());
    }
    for (a, s) in a_tail.iter_mut().zip(s_tail) {
        *a ^= s;
    }
}

/// Parity shards (1 or 2) of equally long data shards.
pub fn encode(parity: usize, data: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
    let len = data[0].len();
    match parity {
        1 => {
            let mut p = data[0].to_vec();
            for d in &data[1..] {
                xor_into(&mut p, d);
            }
            Ok(vec![p])
        }
        2 => reed_solomon_simd::encode(data.len(), 2, data.iter().copied()).map_err(|e| LayoutError::Io {
            set: 0,
            detail: format!("reed-solomon encode of {len} byte shards: {e}"),
        }),
        _ => unreachable!("layouts have at most two parity columns"),
    }
}

/// [`encode`], into sector-aligned buffers: what a member write on a file disk opened with
/// O_DIRECT takes without copying through a bounce buffer.
pub fn encode_aligned(parity: usize, data: &[&[u8]]) -> Result<Vec<tessera_disk::AlignedBuf>> {
    if parity == 1 {
        let mut p = tessera_disk::AlignedBuf::from_slice(data[0]);
        for d in &data[1..] {
            xor_into(&mut p, d);
        }
        return Ok(vec![p]);
    }
    Ok(encode(parity, data)?
        .iter()
        .map(|p| tessera_disk::AlignedBuf::from_slice(p))
        .collect())
}

/// Rebuilds the missing data shards. `data[i]` is None where lost; `parity[j]` None where lost
/// or unread. Fails when more shards are missing than there are parity shards available.
pub fn reconstruct(data: &mut [Option<Vec<u8>>], parity: &[Option<Vec<u8>>]) -> Result<()> {
    let missing: Vec<usize> = (0..data.len()).filter(|&i| data[i].is_none()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let have_parity = parity.iter().filter(|p| p.is_some()).count();
    if missing.len() > have_parity {
        return Err(LayoutError::Io {
            set: 0,
            detail: format!(
                "{} data shards lost and only {} parity shards readable",
                missing.len(),
                have_parity
            ),
        });
    }
    if parity.len() == 1 {
        let mut acc = parity[0].clone().expect("checked above");
        for d in data.iter().flatten() {
            xor_into(&mut acc, d);
        }
        data[missing[0]] = Some(acc);
        return Ok(());
    }
    let originals = data
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.as_ref().map(|d| (i, d.as_slice())));
    let recovery = parity
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.as_ref().map(|p| (i, p.as_slice())));
    let restored =
        reed_solomon_simd::decode(data.len(), parity.len(), originals, recovery).map_err(|e| LayoutError::Io {
            set: 0,
            detail: format!("reed-solomon decode: {e}"),
        })?;
    for i in missing {
        data[i] = Some(restored.get(&i).cloned().ok_or_else(|| LayoutError::Io {
            set: 0,
            detail: format!("reed-solomon decode did not restore shard {i}"),
        })?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(n: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                (0..len)
                    .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8 * 7 + seed))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn single_parity_rebuilds_any_one() {
        let d = shards(4, 4096, 1);
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let p = encode(1, &refs).unwrap();
        for lost in 0..4 {
            let mut got: Vec<Option<Vec<u8>>> = d.iter().cloned().map(Some).collect();
            got[lost] = None;
            reconstruct(&mut got, &[Some(p[0].clone())]).unwrap();
            assert_eq!(got[lost].as_ref().unwrap(), &d[lost]);
        }
    }

    #[test]
    fn dual_parity_rebuilds_any_two() {
        let d = shards(4, 8192, 9);
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let p = encode(2, &refs).unwrap();
        for a in 0..4 {
            for b in a + 1..4 {
                let mut got: Vec<Option<Vec<u8>>> = d.iter().cloned().map(Some).collect();
                got[a] = None;
                got[b] = None;
                reconstruct(&mut got, &[Some(p[0].clone()), Some(p[1].clone())]).unwrap();
                assert_eq!(got[a].as_ref().unwrap(), &d[a]);
                assert_eq!(got[b].as_ref().unwrap(), &d[b]);
            }
            // One data shard and one parity shard lost.
            let mut got: Vec<Option<Vec<u8>>> = d.iter().cloned().map(Some).collect();
            got[a] = None;
            reconstruct(&mut got, &[None, Some(p[1].clone())]).unwrap();
            assert_eq!(got[a].as_ref().unwrap(), &d[a]);
        }
        let mut got: Vec<Option<Vec<u8>>> = vec![None, None, None, Some(d[3].clone())];
        assert!(reconstruct(&mut got, &[Some(p[0].clone()), Some(p[1].clone())]).is_err());
    }

    #[test]
    fn sub_ranges_encode_like_the_whole() {
        // Partial-stripe updates encode only the touched 4 KiB range of a unit; the result must
        // equal that range of a whole-unit encode.
        let d = shards(3, 16384, 3);
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        let whole = encode(2, &refs).unwrap();
        let part: Vec<&[u8]> = d.iter().map(|v| &v[4096..12288]).collect();
        let sub = encode(2, &part).unwrap();
        assert_eq!(&whole[0][4096..12288], sub[0].as_slice());
        assert_eq!(&whole[1][4096..12288], sub[1].as_slice());
    }
}
