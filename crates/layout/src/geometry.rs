//! Where a logical byte of a slab set lives: stripe row, data column, member and member offset.
//! Pure arithmetic, shared by I/O, journal replay and rebuild.

use crate::spec::{LayoutKind, LayoutSpec};

/// A contiguous part of a request that falls in one stripe unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub row: u64,
    pub data_col: usize,
    /// Offset inside the stripe unit.
    pub in_unit: u64,
    pub len: usize,
    /// Offset of this piece inside the caller's buffer.
    pub buf_off: usize,
}

impl Piece {
    /// Offset of the piece inside a member slab.
    pub fn member_offset(&self, spec: &LayoutSpec) -> u64 {
        self.row * spec.interleave + self.in_unit
    }
}

/// Splits [offset, offset + len) of a slab set's logical space into stripe-unit pieces, in order.
pub fn split(spec: &LayoutSpec, offset: u64, len: usize) -> Vec<Piece> {
    let il = spec.interleave;
    let dc = spec.data_columns() as u64;
    let mut out = Vec::with_capacity(1 + len / il as usize);
    let mut pos = offset;
    let end = offset + len as u64;
    while pos < end {
        let unit = pos / il;
        let in_unit = pos % il;
        let n = (il - in_unit).min(end - pos);
        out.push(Piece {
            row: unit / dc,
            data_col: (unit % dc) as usize,
            in_unit,
            len: n as usize,
            buf_off: (pos - offset) as usize,
        });
        pos += n;
    }
    out
}

/// Members holding a data column in a given row: one for simple and parity layouts, `copies`
/// for a mirror. Parity rotates (left-symmetric) so that parity writes spread over all disks.
pub fn data_members(spec: &LayoutSpec, row: u64, data_col: usize) -> Vec<usize> {
    let w = spec.width();
    match spec.kind {
        LayoutKind::Simple => vec![data_col],
        LayoutKind::Mirror => (0..spec.copies as usize)
            .map(|c| c * spec.columns as usize + data_col)
            .collect(),
        LayoutKind::Parity => vec![(parity_start(spec, row) + 1 + data_col) % w],
        LayoutKind::DualParity => vec![(parity_start(spec, row) + 2 + data_col) % w],
    }
}

/// The members holding a data column, in the order a read tries them: mirrors start at a
/// copy chosen by the row, so that reads spread over the copies.
pub fn read_order(spec: &LayoutSpec, row: u64, data_col: usize) -> Vec<usize> {
    let mut cands = data_members(spec, row, data_col);
    let n = cands.len();
    cands.rotate_left(row as usize % n);
    cands
}

fn parity_start(spec: &LayoutSpec, row: u64) -> usize {
    let w = spec.width();
    w - 1 - (row % w as u64) as usize
}

/// Members holding the parity of a row: P, then Q for dual parity. Empty for other layouts.
pub fn parity_members(spec: &LayoutSpec, row: u64) -> Vec<usize> {
    let w = spec.width();
    let p = parity_start(spec, row);
    (0..spec.parity_columns()).map(|i| (p + i) % w).collect()
}

/// What a member holds in a row: which data column (and copy), or which parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Data(usize),
    Parity(usize),
}

pub fn role_of(spec: &LayoutSpec, row: u64, member: usize) -> Role {
    match spec.kind {
        LayoutKind::Simple => Role::Data(member),
        LayoutKind::Mirror => Role::Data(member % spec.columns as usize),
        LayoutKind::Parity | LayoutKind::DualParity => {
            let w = spec.width();
            let p = parity_start(spec, row);
            let rel = (member + w - p) % w;
            if rel < spec.parity_columns() {
                Role::Parity(rel)
            } else {
                Role::Data(rel - spec.parity_columns())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: LayoutKind, copies: u8, columns: u32) -> LayoutSpec {
        LayoutSpec {
            kind,
            copies,
            columns,
            interleave: 8192,
        }
    }

    #[test]
    fn split_covers_the_request_exactly() {
        let s = spec(LayoutKind::Parity, 1, 4);
        let pieces = split(&s, 4096, 8192 * 4);
        assert_eq!(pieces.iter().map(|p| p.len).sum::<usize>(), 8192 * 4);
        assert_eq!(
            pieces[0],
            Piece {
                row: 0,
                data_col: 0,
                in_unit: 4096,
                len: 4096,
                buf_off: 0
            }
        );
        assert_eq!(pieces[3].row, 1, "three data columns per row");
        assert_eq!(pieces[3].data_col, 0);
        let mut at = 0;
        for p in &pieces {
            assert_eq!(p.buf_off, at);
            at += p.len;
        }
    }

    #[test]
    fn every_member_has_one_role_per_row() {
        for s in [
            spec(LayoutKind::Simple, 1, 3),
            spec(LayoutKind::Mirror, 2, 2),
            spec(LayoutKind::Mirror, 3, 1),
            spec(LayoutKind::Parity, 1, 3),
            spec(LayoutKind::Parity, 1, 5),
            spec(LayoutKind::DualParity, 1, 4),
            spec(LayoutKind::DualParity, 1, 6),
        ] {
            for row in 0..(2 * s.width() as u64) {
                let mut seen = vec![0; s.width()];
                for d in 0..s.data_columns() {
                    for m in data_members(&s, row, d) {
                        seen[m] += 1;
                        assert_eq!(role_of(&s, row, m), Role::Data(d), "{s:?} row {row} member {m}");
                    }
                }
                for (i, m) in parity_members(&s, row).into_iter().enumerate() {
                    seen[m] += 1;
                    assert_eq!(role_of(&s, row, m), Role::Parity(i));
                }
                assert!(seen.iter().all(|&n| n == 1), "{s:?} row {row}: {seen:?}");
            }
        }
    }

    #[test]
    fn parity_rotates_over_all_members() {
        let s = spec(LayoutKind::Parity, 1, 4);
        let mut holders: Vec<usize> = (0..4).map(|r| parity_members(&s, r)[0]).collect();
        holders.sort();
        assert_eq!(holders, vec![0, 1, 2, 3]);
    }
}
