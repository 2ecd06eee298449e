//! A request cut where fixed-size units meet: a vdisk's grains, the objects of a disk on
//! RADOS, the chunks of a disk in memory.

/// The part of a request inside one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitPiece {
    /// The unit's index (the offset divided by the unit's size).
    pub unit: u64,
    /// Where the piece starts in the unit.
    pub off: u64,
    pub len: usize,
    /// Where the piece starts in the request.
    pub buf_off: usize,
}

/// The pieces of `[offset, offset + len)` in units of `unit_size` bytes, in order.
pub fn unit_pieces(unit_size: u64, offset: u64, len: u64) -> impl Iterator<Item = UnitPiece> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let off = pos % unit_size;
        let n = (unit_size - off).min(end - pos);
        let p = UnitPiece {
            unit: pos / unit_size,
            off,
            len: n as usize,
            buf_off: (pos - offset) as usize,
        };
        pos += n;
        Some(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_cut_where_units_meet_and_covered_exactly() {
        let got: Vec<_> = unit_pieces(4096, 4096 - 512, 8192 + 1024).collect();
        let want = [
            (0, 3584, 512, 0),
            (1, 0, 4096, 512),
            (2, 0, 4096, 4608),
            (3, 0, 512, 8704),
        ];
        assert_eq!(got.len(), want.len());
        for (p, &(unit, off, len, buf_off)) in got.iter().zip(&want) {
            assert_eq!(
                *p,
                UnitPiece {
                    unit,
                    off,
                    len,
                    buf_off
                }
            );
        }
        let whole: Vec<_> = unit_pieces(1 << 22, 2 << 22, 1 << 22).collect();
        assert_eq!(
            whole,
            vec![UnitPiece {
                unit: 2,
                off: 0,
                len: 1 << 22,
                buf_off: 0
            }]
        );
        assert_eq!(unit_pieces(4096, 100, 0).count(), 0);
    }
}
